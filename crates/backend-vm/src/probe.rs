//! The KVM probe: does KVM boot this guest kernel on this machine? Where `/dev/kvm` is
//! paravirtual (a nested or emulated KVM), stock kernels can hang on it early in boot, so
//! `/dev/kvm` opening says nothing. The probe boots the kernel under KVM with no root and no
//! initramfs: a kernel that runs its whole init panics for want of a root filesystem, and
//! `panic=-1` with `-no-reboot` turns that panic into QEMU's exit. Exiting with the panic on
//! the console within [`TIMEOUT`] means KVM boots it; anything else means it does not.
//!
//! [`crate::accel`] runs it once per (guest kernel, QEMU, host kernel) and records the answer.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Result, VmError};
use crate::qemu::QEMU;

/// Under KVM the kernel reaches its root mount in well under a second; a hanging one never
/// does. A few seconds tell them apart on a loaded machine without making anyone wait long.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// What the console must show: the kernel got as far as mounting its root.
const REACHED_INIT: &str = "Kernel panic";

/// Console bytes kept for the verdict (the panic comes last; the kernel says little before).
const CONSOLE_KEEP: usize = 64 * 1024;

/// The probe's QEMU arguments: the same microvm machine the backend boots under KVM.
fn argv(kernel: &Path) -> Vec<std::ffi::OsString> {
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
    args
}

/// Boots `kernel` under KVM with `timeout`; true when it ran its init and QEMU exited.
pub fn kvm_boots(kernel: &Path, timeout: Duration) -> Result<bool> {
    let mut command = Command::new(QEMU);
    command
        .args(argv(kernel))
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
        let args: Vec<String> = argv(Path::new("/k/vmlinuz"))
            .into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect();
        assert!(!args.iter().any(|a| a == "-initrd" || a == "-drive"));
        let at = |flag: &str| {
            let i = args.iter().position(|a| a == flag).expect(flag);
            args[i + 1].clone()
        };
        assert_eq!(at("-accel"), "kvm");
        assert_eq!(at("-kernel"), "/k/vmlinuz");
        assert!(at("-append").contains("panic=-1"));
        assert!(args.iter().any(|a| a == "-no-reboot"));
    }
}
