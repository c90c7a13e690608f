//! Choosing between KVM and TCG. The setting (`DYNOCAP_VM_ACCEL=kvm|tcg`, read by the binary
//! and handed down as an [`AccelChoice`]) decides; without it KVM is used
//! only where the probe ([`crate::probe`]) found that KVM boots this kernel with this QEMU (on
//! some machines `/dev/kvm` exists but stock kernels hang or fault on it), and otherwise the
//! backend refuses rather than silently running a hundred times slower under TCG. The probe
//! runs once per guest kernel, QEMU and host kernel; its answer is recorded in the cache.

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

/// What the user asked for: [`ENV`] as given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AccelChoice {
    /// KVM where the probe found it boots the kernel; otherwise a refusal.
    #[default]
    Auto,
    Kvm,
    Tcg,
}

impl AccelChoice {
    /// The choice a value of [`ENV`] names (unset, empty and `auto` are [`AccelChoice::Auto`]).
    pub fn parse(setting: Option<&str>) -> Result<AccelChoice> {
        match setting {
            None | Some("") | Some("auto") => Ok(AccelChoice::Auto),
            Some("kvm") => Ok(AccelChoice::Kvm),
            Some("tcg") => Ok(AccelChoice::Tcg),
            Some(other) => Err(VmError::Unavailable(format!(
                "{ENV}={other} is not valid; use kvm, tcg or auto"
            ))),
        }
    }
}

/// The accelerator to use for `kernel`.
pub fn choose(choice: AccelChoice, cache_dir: &Path, kernel: &Path) -> Result<Accel> {
    match choice {
        AccelChoice::Tcg => Ok(Accel::Tcg),
        AccelChoice::Kvm => kvm_device().map(|()| Accel::Kvm).map_err(|why| {
            VmError::Unavailable(format!("{why}; set {ENV}=tcg to use software emulation"))
        }),
        AccelChoice::Auto => match kvm_verdict(cache_dir, kernel)? {
            Kvm::Boots { .. } => Ok(Accel::Kvm),
            Kvm::Fails { .. } => Err(VmError::Unavailable(format!(
                "KVM does not boot this guest kernel on this machine (a probe found so); set \
                 {ENV}=tcg to use software emulation (slow), or use the jail backend \
                 (`--backend jail`, DYNOCAP_BACKEND=jail)"
            ))),
            Kvm::Absent(why) => Err(VmError::Unavailable(format!(
                "{why}; set {ENV}=tcg to use software emulation (slow), or use the jail backend \
                 (`--backend jail`, DYNOCAP_BACKEND=jail)"
            ))),
        },
    }
}

/// Whether KVM boots a kernel here, and how that is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kvm {
    /// The probe booted it; `cached`: the answer was recorded before this call.
    Boots { cached: bool },
    /// The probe saw it hang or fail.
    Fails { cached: bool },
    /// No usable `/dev/kvm` (the reason); nothing was probed.
    Absent(String),
}

/// Whether KVM boots `kernel` here: the recorded answer, else the probe's (then recorded).
/// Takes up to [`crate::probe::TIMEOUT`] the first time on a machine where KVM hangs.
pub fn kvm_verdict(cache_dir: &Path, kernel: &Path) -> Result<Kvm> {
    if let Err(why) = kvm_device() {
        return Ok(Kvm::Absent(why));
    }
    if let Some(boots) = recorded(cache_dir, kernel)? {
        return Ok(if boots {
            Kvm::Boots { cached: true }
        } else {
            Kvm::Fails { cached: true }
        });
    }
    let boots = crate::probe::kvm_boots(kernel, crate::probe::TIMEOUT, cache_dir)?;
    record(cache_dir, kernel, boots)?;
    Ok(if boots {
        Kvm::Boots { cached: false }
    } else {
        Kvm::Fails { cached: false }
    })
}

/// Where the answer for `kernel` is (or would be) recorded.
pub fn record_path(cache_dir: &Path, kernel: &Path) -> Result<PathBuf> {
    probe_path(cache_dir, kernel)
}

/// Opens `/dev/kvm` as QEMU will; the reason it cannot, as a sentence.
fn kvm_device() -> std::result::Result<(), String> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|err| format!("cannot open /dev/kvm ({err})"))
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
/// gives a new key. Revision 2: the probe boots what a sandbox boots (the kernel's PVH ELF on
/// microvm where it has one), so an answer from booting the bzImage is not reused.
fn probe_path(cache_dir: &Path, kernel: &Path) -> Result<PathBuf> {
    let mut key = Key::new("dynocap-kvm-probe-2");
    add_file(&mut key, kernel)?;
    add_file(&mut key, &qemu_path()?)?;
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    key.add(release.as_bytes());
    Ok(cache_dir.join(format!("kvm-probe-{}", key.hex())))
}

/// QEMU's path on `PATH`.
/// Adds `file`'s identity (path, size, modification time) to `key`: an upgraded QEMU or a
/// rebuilt kernel gets a new key, without reading either.
pub fn add_file(key: &mut Key, file: &Path) -> Result<()> {
    let meta = fs::metadata(file).map_err(|err| VmError::io("reading", file, err))?;
    key.add(file.as_os_str().as_encoded_bytes())
        .add(&meta.size().to_le_bytes())
        .add(&meta.mtime().to_le_bytes());
    Ok(())
}

pub fn qemu_path() -> Result<PathBuf> {
    // env-read-ok: where host tools are, as a shell would look them up (not a setting).
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
