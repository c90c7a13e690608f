//! The guest's initramfs: the static `dynocap-agent` as `/init`, the kernel modules it loads
//! (with `lib/modules/dynocap.order` giving the order), `/dev/console` for its stdio, and the
//! mount points its first stage uses. Cached by the hash of everything in it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::cache::{self, Key};
use crate::cpio::CpioWriter;
use crate::error::{Result, VmError};
use crate::kernel::Module;

/// Bump when the archive's layout changes.
const FORMAT: &str = "dynocap-initramfs-1";

/// Returns the path of the initramfs for this agent and these modules, building it if needed.
pub fn get(cache_dir: &Path, agent: &Path, modules: &[Module]) -> Result<PathBuf> {
    let agent_bytes =
        fs::read(agent).map_err(|err| VmError::io("reading the agent", agent, err))?;
    let mut module_bytes = Vec::with_capacity(modules.len());
    let mut key = Key::new(FORMAT);
    key.add(&agent_bytes);
    for module in modules {
        let bytes = fs::read(&module.path)
            .map_err(|err| VmError::io("reading the kernel module", &module.path, err))?;
        key.add(module.name.as_bytes()).add(&bytes);
        module_bytes.push(bytes);
    }
    let name = format!("initramfs-{}.cpio", key.hex());
    cache::get_or_build(cache_dir, &name, |temp| {
        let archive = archive(&agent_bytes, modules, &module_bytes)
            .map_err(|err| VmError::io("building the initramfs", temp, err))?;
        cache::write_new(temp, &archive)
    })
}

fn archive(agent: &[u8], modules: &[Module], bytes: &[Vec<u8>]) -> std::io::Result<Vec<u8>> {
    let mut cpio = CpioWriter::new(Vec::new());
    for dir in [
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "newroot",
        "lib",
        "lib/modules",
    ] {
        cpio.dir(dir, 0o755)?;
    }
    // The kernel opens it as init's stdin/stdout/stderr before running /init.
    cpio.char_dev("dev/console", 0o600, 5, 1)?;
    cpio.file("init", 0o755, agent)?;
    let mut order = String::new();
    for (module, data) in modules.iter().zip(bytes) {
        let file = format!("{}.ko", module.name);
        cpio.file(&format!("lib/modules/{file}"), 0o644, data)?;
        order.push_str(&file);
        order.push('\n');
    }
    cpio.file("lib/modules/dynocap.order", 0o644, order.as_bytes())?;
    cpio.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_cached_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent");
        fs::write(&agent, b"agent v1").unwrap();
        let ko = dir.path().join("virtio.ko");
        fs::write(&ko, b"module").unwrap();
        let modules = [Module {
            name: "virtio".into(),
            path: ko,
        }];
        let cache = dir.path().join("cache");
        let first = get(&cache, &agent, &modules).unwrap();
        assert_eq!(get(&cache, &agent, &modules).unwrap(), first);
        let entries = crate::cpio::tests::parse(&fs::read(&first).unwrap());
        let find = |name: &str| {
            entries
                .iter()
                .find(|e| e.0 == name)
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        assert_eq!(find("init").4, b"agent v1");
        assert_eq!(find("init").1, 0o100_755);
        assert_eq!(find("lib/modules/virtio.ko").4, b"module");
        assert_eq!(find("lib/modules/dynocap.order").4, b"virtio.ko\n");
        assert_eq!(find("dev/console").3, (5, 1));
        // Parents before children, as the kernel needs.
        let pos = |name: &str| entries.iter().position(|e| e.0 == name).unwrap();
        assert!(
            pos("lib") < pos("lib/modules") && pos("lib/modules") < pos("lib/modules/virtio.ko")
        );
        fs::write(&agent, b"agent v2").unwrap();
        assert_ne!(get(&cache, &agent, &modules).unwrap(), first);
    }
}
