//! [`probe`]: what this machine supports, for `dynocap doctor`. Every check is a real attempt
//! where one is cheap (a user namespace is created, an overlay is mounted in one), each with
//! a hint on how to enable what is missing. Safe to call from a multi-threaded process: the
//! probe children only make raw syscalls.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::pipe2;

use dynocap_host::cgroup::{probe_cgroups, CgroupProbe};
use dynocap_host::{Check, IdMap};

use crate::newmount;
use crate::remove::remove_tree;
use crate::sys::{self, CloneResult};

/// What the jail backend can use on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// A user namespace can be created by this process.
    pub user_namespaces: Check,
    /// overlayfs can be mounted inside a user namespace (Linux 5.11+, `userxattr`).
    pub overlay_in_userns: Check,
    /// fsopen/open_tree/move_mount/mount_setattr (Linux 5.12+).
    pub mount_api: Check,
    /// seccomp filters with `SECCOMP_RET_KILL_PROCESS`.
    pub seccomp: Check,
    /// cgroup layout and controllers.
    pub cgroups: CgroupProbe,
}

impl Probe {
    /// True when every check passed: `Jail::spawn` can work here.
    pub fn ready(&self) -> bool {
        self.user_namespaces.ok
            && self.overlay_in_userns.ok
            && self.mount_api.ok
            && self.seccomp.ok
            && self.cgroups.check.ok
    }
}

/// Probes the machine.
pub fn probe() -> Probe {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    let user_namespaces = probe_userns();
    let overlay_in_userns = if user_namespaces.ok {
        probe_overlay()
    } else {
        Check::missing(
            "not tried: user namespaces are unusable",
            "fix user namespaces first",
        )
    };
    Probe {
        kernel,
        user_namespaces,
        overlay_in_userns,
        mount_api: probe_mount_api(),
        seccomp: probe_seccomp(),
        cgroups: probe_cgroups(),
    }
}

fn read_sysctl(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn userns_hint() -> String {
    let mut hints = Vec::new();
    if read_sysctl("/proc/sys/user/max_user_namespaces") == Some(0) {
        hints.push("sysctl -w user.max_user_namespaces=15000");
    }
    let root = nix::unistd::geteuid().is_root();
    if !root && read_sysctl("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        hints.push("sysctl -w kernel.unprivileged_userns_clone=1");
    }
    if !root && read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        hints.push("sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile allowing userns for dynocap)");
    }
    if hints.is_empty() {
        "enable CONFIG_USER_NS, or run the supervisor where user namespaces are allowed (some container runtimes forbid them)".to_owned()
    } else {
        hints.join("; ")
    }
}

/// Runs `child` (raw syscalls only) in a fork-style clone with `flags`; when `ids` is given,
/// the parent writes that id map first and the child waits for it. Returns the exit code.
fn in_child(flags: CloneFlags, ids: Option<IdMap>, child: &dyn Fn() -> i32) -> Result<i32, String> {
    let (ready_read, ready_write) = pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the child only closes an fd, reads a pipe, runs `child` (raw syscalls, by
    // contract of this function) and _exits: all async-signal-safe, so sound even if this
    // process has other threads.
    let cloned = unsafe { sys::clone_fork(flags) };
    match cloned {
        Ok(CloneResult::Child) => {
            drop(ready_write);
            let mut byte = [0u8; 1];
            let code = match nix::unistd::read(&ready_read, &mut byte) {
                Ok(1) => child(),
                _ => 125,
            };
            sys::exit_now(code)
        }
        Ok(CloneResult::Parent { pid, pidfd: _pidfd }) => {
            drop(ready_read);
            let mapped = match ids {
                Some(ids) => ids.write_for(pid).map_err(|e| e.to_string()),
                None => Ok(()),
            };
            if mapped.is_ok() {
                let _ = nix::unistd::write(ready_write.as_fd(), b"1");
            }
            drop(ready_write);
            let status = waitpid(pid, None).map_err(|e| format!("waitpid: {e}"))?;
            mapped?;
            match status {
                WaitStatus::Exited(_, code) => Ok(code),
                other => Err(format!("probe child ended with {other:?}")),
            }
        }
        Err(e) => Err(format!("clone: {e}")),
    }
}

fn probe_userns() -> Check {
    match in_child(CloneFlags::CLONE_NEWUSER, None, &|| 0) {
        Ok(0) => Check::ok("a user namespace can be created"),
        Ok(code) => Check::missing(format!("probe exited with {code}"), userns_hint()),
        Err(e) => Check::missing(
            format!("creating a user namespace failed: {e}"),
            userns_hint(),
        ),
    }
}

fn probe_overlay() -> Check {
    let hint = "overlayfs in a user namespace needs Linux 5.11+ and an upper filesystem with \
                user xattrs (ext4, xfs, btrfs, tmpfs 6.6+)";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let base = std::env::temp_dir().join(format!("dynocap-probe-{}-{nanos}", std::process::id()));
    let result = overlay_attempt(&base);
    let _ = remove_tree(&base);
    match result {
        Ok(()) => Check::ok("overlay mounts in a user namespace (userxattr)"),
        Err(e) => Check::missing(
            format!("mounting overlay in a user namespace failed: {e}"),
            hint,
        ),
    }
}

fn overlay_attempt(base: &Path) -> Result<(), String> {
    let ids = IdMap::for_current_process();
    let (uid, gid) = ids.init_host_ids();
    let prepare = || -> std::io::Result<()> {
        std::fs::create_dir(base)?;
        for dir in ["lower", "upper", "work", "merged"] {
            std::fs::create_dir(base.join(dir))?;
        }
        for dir in [
            base.to_path_buf(),
            base.join("upper"),
            base.join("work"),
            base.join("merged"),
        ] {
            std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))?;
        }
        Ok(())
    };
    prepare().map_err(|e| format!("preparing {}: {e}", base.display()))?;
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        base.join("lower").display(),
        base.join("upper").display(),
        base.join("work").display()
    );
    let options = CString::new(options).map_err(|e| e.to_string())?;
    let target = CString::new(base.join("merged").to_string_lossy().into_owned())
        .map_err(|e| e.to_string())?;
    let (guest_uid, guest_gid) = (ids.init_uid(), ids.init_gid());
    let child = || {
        // SAFETY: raw syscalls on C strings prepared before the clone; no allocation.
        unsafe {
            if libc::setresgid(guest_gid, guest_gid, guest_gid) != 0
                || libc::setresuid(guest_uid, guest_uid, guest_uid) != 0
            {
                return 126;
            }
            let ret = libc::mount(
                c"overlay".as_ptr(),
                target.as_ptr(),
                c"overlay".as_ptr(),
                0,
                options.as_ptr().cast(),
            );
            if ret == 0 {
                0
            } else {
                Errno::last_raw()
            }
        }
    };
    match in_child(
        CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS,
        Some(ids),
        &child,
    )? {
        0 => Ok(()),
        126 => Err("could not become the guest's init ids".to_owned()),
        errno => Err(Errno::from_raw(errno).to_string()),
    }
}

fn probe_mount_api() -> Check {
    if newmount::available() {
        Check::ok("fsopen/open_tree/move_mount/mount_setattr available")
    } else {
        Check::missing(
            "mount_setattr(2) is missing",
            "the jail backend needs Linux 5.12 or newer",
        )
    }
}

fn probe_seccomp() -> Check {
    let action = libc::SECCOMP_RET_KILL_PROCESS;
    // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 from the pointer, which is valid.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        )
    };
    if ret == 0 {
        Check::ok("seccomp filters with SECCOMP_RET_KILL_PROCESS available")
    } else {
        Check::missing(
            format!(
                "seccomp(SECCOMP_GET_ACTION_AVAIL) failed: {}",
                Errno::last()
            ),
            "enable CONFIG_SECCOMP_FILTER (Linux 4.14+)",
        )
    }
}
