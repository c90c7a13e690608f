//! The guest kernel an image carries: `<rootfs>/boot/vmlinuz-<version>` with its modules in
//! `<rootfs>/lib/modules/<version>/`, and the modules the agent needs that the kernel has as
//! loadable modules rather than built in, with their dependencies, in load order.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::elf;
use crate::error::{Result, VmError};
use crate::qemu::Machine;

/// Drivers the guest cannot boot without: the root disk, the agent's channel, the root
/// filesystem and the NIC of a `nat` guest (one initramfs serves every network mode; a guest
/// without a NIC never loads more than the module), plus the virtio transport of the machine
/// it boots on ([`transport`]).
const REQUIRED: &[&str] = &["virtio_blk", "virtio_console", "ext4", "virtio_net"];

/// The one virtio transport `machine` has devices on: microvm's are virtio-mmio, q35's
/// virtio-pci. Only that one goes into the initramfs: every module is relocated, verified and
/// initialised by the guest before the agent can start (slow under TCG), and virtio_pci
/// brings two more modules of its own that a microvm guest would load for nothing.
fn transport(machine: Machine) -> &'static str {
    match machine {
        Machine::Microvm => "virtio_mmio",
        Machine::Q35 => "virtio_pci",
    }
}

#[derive(Debug, Clone)]
pub struct Kernel {
    pub version: String,
    pub image: PathBuf,
    pub modules_dir: PathBuf,
}

/// A module to put into the initramfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    pub name: String,
    pub path: PathBuf,
}

/// Finds the newest kernel in `rootfs` that has a modules directory.
pub fn find(rootfs: &Path) -> Result<Kernel> {
    let boot = rootfs.join("boot");
    let entries = fs::read_dir(&boot).map_err(|err| {
        VmError::Image(format!(
            "the image at {} has no kernel ({}: {err}); the vm backend needs an image built with \
             a kernel: run `dynocap image build debian` (its kernel also boots images that \
             carry none, such as imported container images)",
            rootfs.display(),
            boot.display()
        ))
    })?;
    let mut found: Vec<Kernel> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(version) = name.strip_prefix("vmlinuz-") else {
            continue;
        };
        if let Some(modules_dir) = modules_dir(rootfs, version) {
            found.push(Kernel {
                version: version.to_owned(),
                image: entry.path(),
                modules_dir,
            });
        }
    }
    found.sort_by(|a, b| version_cmp(&a.version, &b.version));
    found.pop().ok_or_else(|| {
        VmError::Image(format!(
            "the image at {} has no boot/vmlinuz-<version> with a matching lib/modules/<version>; \
             the vm backend needs an image built with a kernel: run `dynocap image build debian`",
            rootfs.display()
        ))
    })
}

/// `usr/lib/modules/<v>` or `lib/modules/<v>`, only if it stays inside the rootfs (a link to
/// an absolute `/lib` would point at the host's).
fn modules_dir(rootfs: &Path, version: &str) -> Option<PathBuf> {
    let root = rootfs.canonicalize().ok()?;
    ["usr/lib/modules", "lib/modules"].iter().find_map(|rel| {
        let dir = rootfs.join(rel).join(version).canonicalize().ok()?;
        (dir.starts_with(&root) && dir.is_dir()).then_some(dir)
    })
}

/// Compares version strings by their runs of digits as numbers (`6.10` after `6.9`).
fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(s: &str) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let (num, tail) = rest.split_at(digits);
            let text = tail.len() - tail.trim_start_matches(|c: char| !c.is_ascii_digit()).len();
            let (word, tail) = tail.split_at(text);
            out.push((num.parse().unwrap_or(0), word.to_owned()));
            rest = tail;
        }
        out
    }
    parts(a).cmp(&parts(b))
}

/// The modules a guest on `machine` loads, dependencies first, skipping what
/// `modules.builtin` lists.
pub fn needed_modules(kernel: &Kernel, machine: Machine) -> Result<Vec<Module>> {
    let builtin = builtin_names(&kernel.modules_dir)?;
    let available = module_files(&kernel.modules_dir)?;
    let transport = transport(machine);
    if !builtin.contains(transport) && !available.contains_key(transport) {
        return Err(VmError::Image(format!(
            "kernel {} has no {transport}, which the {machine:?} machine's devices need; build \
             the image with a kernel made for virtual machines (Debian's linux-image-cloud-amd64)",
            kernel.version
        )));
    }
    let mut wanted: Vec<&str> = REQUIRED.to_vec();
    wanted.push(transport);
    let mut order = Vec::new();
    let mut done = HashSet::new();
    for name in wanted {
        visit(name, &builtin, &available, &mut done, &mut order, 0)
            .map_err(|msg| VmError::Image(format!("kernel {}: {msg}", kernel.version)))?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    builtin: &HashSet<String>,
    available: &BTreeMap<String, PathBuf>,
    done: &mut HashSet<String>,
    order: &mut Vec<Module>,
    depth: usize,
) -> Result<(), String> {
    if depth > 32 {
        return Err(format!("module dependencies loop through {name}"));
    }
    if builtin.contains(name) || done.contains(name) {
        return Ok(());
    }
    let path = available.get(name).ok_or_else(|| {
        format!("the module {name} is neither built in nor present under lib/modules")
    })?;
    let bytes = fs::read(path).map_err(|err| format!("reading {}: {err}", path.display()))?;
    let deps = elf::depends(&bytes).map_err(|err| format!("{}: {err}", path.display()))?;
    for dep in deps {
        visit(&dep, builtin, available, done, order, depth + 1)?;
    }
    done.insert(name.to_owned());
    order.push(Module {
        name: name.to_owned(),
        path: path.clone(),
    });
    Ok(())
}

/// Names in `modules.builtin` (`kernel/fs/ext4/ext4.ko` gives `ext4`).
fn builtin_names(dir: &Path) -> Result<HashSet<String>> {
    let path = dir.join("modules.builtin");
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(err) => return Err(VmError::io("reading", &path, err)),
    };
    Ok(text.lines().filter_map(module_name).collect())
}

fn module_name(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    Some(elf::normalize_name(file.strip_suffix(".ko")?))
}

/// Every `.ko` under the modules directory, by name.
fn module_files(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|err| VmError::io("listing", &dir, err))?;
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                if let Some(name) = path.to_str().and_then(module_name) {
                    out.insert(name, path);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::tests::fake_module;

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn newest_kernel_with_modules_is_chosen() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for v in ["6.9.0", "6.10.0", "7.0.0"] {
            write(&r.join(format!("boot/vmlinuz-{v}")), b"k");
        }
        // 7.0.0 has no modules directory, so it cannot serve.
        fs::create_dir_all(r.join("lib/modules/6.9.0")).unwrap();
        fs::create_dir_all(r.join("usr/lib/modules/6.10.0")).unwrap();
        let kernel = find(r).unwrap();
        assert_eq!(kernel.version, "6.10.0");
        assert!(find(&r.join("boot")).is_err());
    }

    #[test]
    fn modules_come_in_dependency_order_without_builtins() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("lib/modules/1.0");
        write(
            &dir.join("modules.builtin"),
            b"kernel/fs/ext4/ext4.ko\nkernel/drivers/virtio/virtio_pci.ko\n",
        );
        let k = |rel: &str, deps: &str| {
            write(
                &dir.join(rel),
                &fake_module(format!("depends={deps}\0").as_bytes()),
            );
        };
        k("kernel/drivers/virtio/virtio_ring.ko", "");
        k("kernel/drivers/virtio/virtio.ko", "virtio_ring");
        k("kernel/drivers/virtio/virtio_mmio.ko", "virtio,virtio_ring");
        k("kernel/drivers/block/virtio_blk.ko", "virtio,virtio-ring");
        k(
            "kernel/drivers/char/virtio_console.ko",
            "virtio,virtio_ring",
        );
        k("kernel/net/core/failover.ko", "");
        k("kernel/drivers/net/net_failover.ko", "failover");
        k(
            "kernel/drivers/net/virtio_net.ko",
            "net_failover,virtio,virtio_ring",
        );
        let kernel = Kernel {
            version: "1.0".into(),
            image: PathBuf::new(),
            modules_dir: dir,
        };
        let names = |machine| -> Vec<String> {
            needed_modules(&kernel, machine)
                .unwrap()
                .into_iter()
                .map(|m| m.name)
                .collect()
        };
        let common = [
            "virtio_ring",
            "virtio",
            "virtio_blk",
            "virtio_console",
            "failover",
            "net_failover",
            "virtio_net",
        ];
        assert_eq!(names(Machine::Microvm)[..common.len()], common);
        assert_eq!(names(Machine::Microvm)[common.len()..], ["virtio_mmio"]);
        // q35's transport is built into this kernel: nothing more to load, and no mmio.
        assert_eq!(names(Machine::Q35), common);
    }

    #[test]
    fn a_missing_driver_is_named() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("lib/modules/1.0");
        write(
            &dir.join("modules.builtin"),
            b"kernel/drivers/virtio/virtio_pci.ko\n",
        );
        let kernel = Kernel {
            version: "1.0".into(),
            image: PathBuf::new(),
            modules_dir: dir,
        };
        let err = needed_modules(&kernel, Machine::Q35)
            .unwrap_err()
            .to_string();
        assert!(err.contains("virtio_blk"), "{err}");
        // A microvm guest needs virtio_mmio, which this kernel lacks: said by name.
        let err = needed_modules(&kernel, Machine::Microvm)
            .unwrap_err()
            .to_string();
        assert!(err.contains("virtio_mmio"), "{err}");
    }
}
