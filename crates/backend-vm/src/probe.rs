//! The KVM probe: does KVM boot this guest kernel on this machine? Where `/dev/kvm` is
//! paravirtual (a nested or emulated KVM), stock kernels can hang on it early in boot, so
//! `/dev/kvm` opening says nothing. The probe boots the kernel under KVM with no root and no
//! initramfs: a kernel that runs its whole init panics for want of a root filesystem, and
//! `panic=-1` with `-no-reboot` turns that panic into QEMU's exit. Exiting with the panic on
//! the console within [`TIMEOUT`] means KVM boots it; anything else means it does not.
//!
//! [`crate::accel`] runs it once per (guest kernel, QEMU, host kernel) and records the answer.
//!
//! Started as root, the probe's QEMU is confined as a sandbox's is: its seccomp filter, and
//! once the kernel and `/dev/kvm` are open, [`PROBE_ID`] as its uid and gid in an empty
//! directory as its root. The kernel it boots comes from an image, which is not trusted.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Result, VmError};
use crate::qemu::{confinement_args, Confinement, QEMU};

/// Under KVM the kernel reaches its root mount in well under a second; a hanging one never
/// does. A few seconds tell them apart on a loaded machine without making anyone wait long.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// What the console must show: the kernel got as far as mounting its root.
const REACHED_INIT: &str = "Kernel panic";

/// Console bytes kept for the verdict (the panic comes last; the kernel says little before).
const CONSOLE_KEEP: usize = 64 * 1024;

/// The host uid and gid a root-started probe runs as: the first id past the pool the jail
/// hands its sandboxes (`1_000_000 + 16_384 × 65_536`), so it owns no file and shares its uid
/// with no process of any sandbox or of the host. The engine checks it stays past that pool.
pub const PROBE_ID: u32 = 1_074_741_824;

/// The directory under the cache a root-started probe chroots into.
const PROBE_ROOT: &str = "probe-root";

/// The probe's QEMU arguments: the same microvm machine the backend boots under KVM.
fn argv(kernel: &Path, confine: Option<&Confinement>) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-M",
        "microvm,pic=off,pit=off,rtc=on,isa-serial=on",
        "-accel",
        "kvm",
        "-cpu",
        "host",
        "-smp",
        "1",
        "-m",
        "128M",
        "-serial",
        "stdio",
        "-append",
        "console=ttyS0 panic=-1 reboot=t",
        "-kernel",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(kernel.as_os_str().to_owned());
    args.extend(confinement_args(true, confine));
    args
}

/// How the probe's QEMU is confined when started by `euid_root`: as [`PROBE_ID`] in an
/// empty directory under `cache_dir`; a QEMU started by anyone else runs as its starter.
pub fn confinement(cache_dir: &Path, euid_root: bool) -> Result<Option<Confinement>> {
    if !euid_root {
        return Ok(None);
    }
    std::fs::create_dir_all(cache_dir).map_err(|err| VmError::io("creating", cache_dir, err))?;
    Confinement::in_empty_dir(&cache_dir.join(PROBE_ROOT), PROBE_ID, PROBE_ID).map(Some)
}

/// Boots `kernel` under KVM with `timeout`, confined as [`confinement`] says for this
/// process; true when it ran its init and QEMU exited. It boots the file a microvm sandbox
/// boots ([`crate::vmlinux::boot_file`]: the PVH ELF where the kernel has one), so the
/// verdict is about the same entry path.
pub fn kvm_boots(kernel: &Path, timeout: Duration, cache_dir: &Path) -> Result<bool> {
    let confine = confinement(cache_dir, nix::unistd::geteuid().is_root())?;
    let boot_file = crate::vmlinux::boot_file(cache_dir, kernel)?;
    let mut command = Command::new(QEMU);
    command
        .args(argv(&boot_file, confine.as_ref()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl,
    // which is async-signal-safe; it allocates nothing.
    unsafe {
        // A probe that hangs must not outlive its caller.
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|err| {
        if err.kind() == std::io::ErrorKind::NotFound {
            VmError::Unavailable(format!(
                "{QEMU} is not installed; install it with `apt-get install qemu-system-x86`"
            ))
        } else {
            VmError::Unavailable(format!("starting {QEMU} for the KVM probe: {err}"))
        }
    })?;
    let mut stdout = child.stdout.take().expect("stdout was piped above");
    // The console is read on its own thread: QEMU blocks when the pipe is full.
    let reader = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            kept.extend_from_slice(&buf[..n]);
            if kept.len() > CONSOLE_KEEP {
                kept.drain(..kept.len() - CONSOLE_KEEP);
            }
        }
        kept
    });
    let deadline = Instant::now() + timeout;
    let exited = loop {
        match child.try_wait() {
            Ok(Some(_)) => break true,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(None) => break false,
            Err(err) => {
                return Err(VmError::Unavailable(format!(
                    "waiting for the KVM probe: {err}"
                )))
            }
        }
    };
    if !exited {
        // Hung: kill it; the pipe then closes and the reader ends.
        let _ = child.kill();
        let _ = child.wait();
    }
    let console = reader.join().unwrap_or_default();
    let reached = String::from_utf8_lossy(&console).contains(REACHED_INIT);
    Ok(exited && reached)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_boots_without_root_or_initramfs_and_stops_on_panic() {
        let args = strings(argv(Path::new("/k/vmlinuz"), None));
        assert!(!args.iter().any(|a| a == "-initrd" || a == "-drive"));
        assert_eq!(value(&args, "-accel"), Some("kvm"));
        assert_eq!(value(&args, "-kernel"), Some("/k/vmlinuz"));
        assert!(value(&args, "-append").is_some_and(|line| line.contains("panic=-1")));
        assert!(args.iter().any(|a| a == "-no-reboot"));
        // Its own starter's QEMU: filtered, no privileges to raise.
        assert!(value(&args, "-sandbox").is_some_and(|s| s.contains("elevateprivileges=deny")));
        assert_eq!(value(&args, "-runas"), None);
    }

    #[test]
    fn a_root_started_probe_drops_to_its_own_id_in_an_empty_root() {
        let cache = tempfile::tempdir().expect("tempdir");
        assert!(confinement(cache.path(), false).expect("no-op").is_none());
        let confine = confinement(cache.path(), true)
            .expect("confinement")
            .expect("root confines");
        let root = cache.path().join(PROBE_ROOT);
        assert_eq!(confine.chroot, root);
        assert_eq!(std::fs::read_dir(&root).expect("read").count(), 0);
        let args = strings(argv(Path::new("/k/vmlinuz"), Some(&confine)));
        let ids = format!("{PROBE_ID}:{PROBE_ID}");
        assert_eq!(value(&args, "-runas"), Some(ids.as_str()));
        assert_eq!(value(&args, "-chroot"), root.to_str());
        assert!(value(&args, "-sandbox").is_some_and(|s| s.starts_with("on,")));
    }

    fn strings(args: Vec<std::ffi::OsString>) -> Vec<String> {
        args.into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect()
    }

    fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        let i = args.iter().position(|a| a == flag)?;
        args.get(i + 1).map(String::as_str)
    }
}
