//! [`probe`]: what this machine supports, for `dynocap doctor`. Every check is a real attempt
//! where one is cheap (a user namespace is created, an overlay is mounted in one), each with
//! a hint on how to enable what is missing. Safe to call from a multi-threaded process: the
//! probe children only make raw syscalls.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{access, pipe2, AccessFlags};

use crate::cgroup::{CgroupLayoutKind, CgroupVersion, Controller, Layout, PARENT};
use crate::error::HINT_PRIVILEGE;
use crate::idmap::IdMap;
use crate::newmount;
use crate::remove::remove_tree;
use crate::sys::{self, CloneResult};

/// One capability of the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Usable as the jail needs it.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// How to enable it, when it is not ok.
    pub hint: Option<String>,
}

impl Check {
    fn ok(detail: impl Into<String>) -> Check {
        Check {
            ok: true,
            detail: detail.into(),
            hint: None,
        }
    }

    fn missing(detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            ok: false,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }
}

/// Where one controller is and whether the supervisor can create cgroups there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerProbe {
    /// The controller.
    pub controller: Controller,
    /// Version of the hierarchy managing it, if any does.
    pub version: Option<CgroupVersion>,
    /// Mount point of that hierarchy.
    pub hierarchy: Option<PathBuf>,
    /// The supervisor can create `dynocap/<name>` there.
    pub writable: bool,
}

/// The cgroup setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupProbe {
    /// v1, v2, hybrid or none.
    pub layout: CgroupLayoutKind,
    /// cpu, memory, pids.
    pub controllers: Vec<ControllerProbe>,
    /// All three located and writable.
    pub check: Check,
}

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

fn probe_cgroups() -> CgroupProbe {
    let layout = match Layout::discover() {
        Ok(layout) => layout,
        Err(e) => {
            return CgroupProbe {
                layout: CgroupLayoutKind::None,
                controllers: Vec::new(),
                check: Check::missing(e.to_string(), "mount /proc"),
            }
        }
    };
    let controllers: Vec<ControllerProbe> = Controller::ALL
        .iter()
        .map(|&controller| {
            let hierarchy = layout.locate(controller);
            let writable = hierarchy.is_some_and(|h| {
                let parent = h.mount_point.join(PARENT);
                let dir = if parent.is_dir() {
                    parent
                } else {
                    h.mount_point.clone()
                };
                access(&dir, AccessFlags::W_OK).is_ok()
            });
            ControllerProbe {
                controller,
                version: hierarchy.map(|h| h.version),
                hierarchy: hierarchy.map(|h| h.mount_point.clone()),
                writable,
            }
        })
        .collect();
    let missing: Vec<&str> = controllers
        .iter()
        .filter(|c| c.version.is_none())
        .map(|c| c.controller.name())
        .collect();
    let readonly: Vec<&str> = controllers
        .iter()
        .filter(|c| c.version.is_some() && !c.writable)
        .map(|c| c.controller.name())
        .collect();
    let describe = controllers
        .iter()
        .map(|c| match (&c.version, &c.hierarchy) {
            (Some(v), Some(path)) => format!(
                "{} on {v:?} at {}{}",
                c.controller.name(),
                path.display(),
                if c.writable { "" } else { " (not writable)" }
            ),
            _ => format!("{} not found", c.controller.name()),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let detail = format!("{:?} layout: {describe}", layout.kind());
    let check = if !missing.is_empty() {
        Check::missing(
            detail,
            format!(
                "make {} available: mount it as cgroup v1, or list it in the v2 root's cgroup.controllers",
                missing.join(", ")
            ),
        )
    } else if !readonly.is_empty() {
        Check::missing(detail, HINT_PRIVILEGE)
    } else {
        Check::ok(detail)
    };
    CgroupProbe {
        layout: layout.kind(),
        controllers,
        check,
    }
}
