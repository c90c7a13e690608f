//! A `nat` guest's network namespace (the one QEMU runs in) bound to a file in the VM's
//! directory, for as long as the supervisor attaches user networking to it.
//!
//! Why a file: pasta drops its capabilities before it opens the namespace, and without
//! `CAP_SYS_PTRACE` the kernel lets it open `/proc/PID/ns/net` of a process in the initial
//! user namespace only if pasta holds every capability that process has. A bind mount of the
//! namespace is an ordinary file to open, as `ip netns` makes them. The binding is removed as
//! soon as pasta has joined ([`NetnsFile`]'s drop); a supervisor killed meanwhile leaves it
//! for [`crate::cleanup_leftovers`].

use std::fs;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::error::{Result, VmError};

/// The namespace of process `pid` bound at `path`; unbound and removed on drop.
#[derive(Debug)]
pub struct NetnsFile {
    path: PathBuf,
}

impl NetnsFile {
    /// Binds `/proc/<pid>/ns/net` onto `path` (created empty).
    pub fn bind(pid: i32, path: &Path) -> Result<NetnsFile> {
        // Whatever an earlier boot left there goes first.
        unbind(path);
        fs::File::create(path).map_err(|err| VmError::io("creating", path, err))?;
        let guard = NetnsFile {
            path: path.to_path_buf(),
        };
        let source = format!("/proc/{pid}/ns/net");
        mount(
            Some(source.as_str()),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|err| {
            VmError::Unavailable(format!(
                "binding QEMU's network namespace ({source}) to {}: {err}",
                path.display()
            ))
        })?;
        Ok(guard)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for NetnsFile {
    fn drop(&mut self) {
        unbind(&self.path);
    }
}

/// Unmounts and removes `path`; nothing there is fine.
pub(crate) fn unbind(path: &Path) {
    // Detached: a process that opened the file keeps its descriptor, nothing else stays.
    let _ = umount2(path, MntFlags::MNT_DETACH);
    let _ = fs::remove_file(path);
}
