//! Choosing between KVM and TCG. `DYNOCAP_VM_ACCEL=kvm|tcg` decides; without it KVM is used
//! only where a recorded probe says KVM boots this kernel with this QEMU (on some machines
//! `/dev/kvm` exists but stock kernels hang or fault on it), and otherwise the backend refuses
//! rather than silently running a hundred times slower under TCG.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::cache::Key;
use crate::error::{Result, VmError};
use crate::qemu::{Accel, QEMU};

pub const ENV: &str = "DYNOCAP_VM_ACCEL";

/// What the probe found, as recorded in the cache.
const BOOTS: &str = "boots";
const FAILS: &str = "fails";

/// The accelerator to use for `kernel`.
pub fn choose(cache_dir: &Path, kernel: &Path) -> Result<Accel> {
    match std::env::var(ENV).ok().as_deref() {
        Some("tcg") => Ok(Accel::Tcg),
        Some("kvm") => kvm_present().map(|()| Accel::Kvm),
        None | Some("") | Some("auto") => match recorded(cache_dir, kernel)? {
            Some(true) => kvm_present().map(|()| Accel::Kvm),
            Some(false) => Err(VmError::Unavailable(format!(
                "KVM does not boot this guest kernel on this machine (a probe found so); set \
                 {ENV}=tcg to use software emulation (slow) or use the jail backend"
            ))),
            None => Err(VmError::Unavailable(format!(
                "nobody has checked that KVM boots a guest on this machine; set {ENV}=tcg to use \
                 software emulation (slow), or {ENV}=kvm to use KVM unchecked"
            ))),
        },
        Some(other) => Err(VmError::Unavailable(format!(
            "{ENV}={other} is not valid; use kvm, tcg or auto"
        ))),
    }
}

fn kvm_present() -> Result<()> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|err| {
            VmError::Unavailable(format!(
                "cannot open /dev/kvm ({err}); set {ENV}=tcg to use software emulation"
            ))
        })
}

/// Records whether KVM booted a guest of `kernel` (the caller ran the probe).
pub fn record(cache_dir: &Path, kernel: &Path, boots: bool) -> Result<()> {
    let path = probe_path(cache_dir, kernel)?;
    fs::create_dir_all(cache_dir).map_err(|err| VmError::io("creating", cache_dir, err))?;
    fs::write(&path, if boots { BOOTS } else { FAILS })
        .map_err(|err| VmError::io("writing", &path, err))
}

fn recorded(cache_dir: &Path, kernel: &Path) -> Result<Option<bool>> {
    let path = probe_path(cache_dir, kernel)?;
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text.trim() == BOOTS)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(VmError::io("reading", &path, err)),
    }
}

/// The probe's answer holds for one kernel, one QEMU and one host kernel: any of them changing
/// gives a new key.
fn probe_path(cache_dir: &Path, kernel: &Path) -> Result<PathBuf> {
    let mut key = Key::new("dynocap-kvm-probe-1");
    for file in [kernel.to_owned(), qemu_path()?] {
        let meta = fs::metadata(&file).map_err(|err| VmError::io("reading", &file, err))?;
        key.add(file.as_os_str().as_encoded_bytes())
            .add(&meta.size().to_le_bytes())
            .add(&meta.mtime().to_le_bytes());
    }
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    key.add(release.as_bytes());
    Ok(cache_dir.join(format!("kvm-probe-{}", key.hex())))
}

/// QEMU's path on `PATH`.
pub fn qemu_path() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(QEMU))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            VmError::Unavailable(format!(
                "{QEMU} is not installed; install it with `apt-get install qemu-system-x86`"
            ))
        })
}
