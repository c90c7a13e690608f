//! Safe wrappers over the fd-based mount API (Linux >= 5.12): `fsopen`/`fsconfig`/`fsmount`
//! to create a filesystem instance, `open_tree` to clone a bind, `mount_setattr` to make it
//! read-only, `move_mount` to attach it.
//!
//! Why not mount(2): every mount here ends up addressed by a file descriptor, never by a path
//! string. Host sources are opened once (see `rootfs`), targets are resolved inside the new
//! root with `openat2(RESOLVE_IN_ROOT)`, and the overlay root is the fd `fsmount` returns, so
//! no path is looked up twice and no symlink in the image can redirect a mount onto the host.
//! A bind is made read-only (recursively, `AT_RECURSIVE`) while still detached, so it is
//! never visible writable.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

// From linux/mount.h; libc does not export these yet.
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;

/// Mount attributes (`MOUNT_ATTR_*`).
pub(crate) const RDONLY: u64 = libc::MOUNT_ATTR_RDONLY;
pub(crate) const NOSUID: u64 = libc::MOUNT_ATTR_NOSUID;
pub(crate) const NODEV: u64 = libc::MOUNT_ATTR_NODEV;
pub(crate) const NOEXEC: u64 = libc::MOUNT_ATTR_NOEXEC;

fn fd_from(ret: libc::c_long) -> Result<OwnedFd, Errno> {
    if ret < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(ret).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel just returned this new fd; we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ok_from(ret: libc::c_long) -> Result<(), Errno> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

fn cstring(s: &str) -> Result<CString, Errno> {
    CString::new(s).map_err(|_| Errno::EINVAL)
}

/// A filesystem context being configured (`fsopen`).
pub(crate) struct FsContext(OwnedFd);

impl FsContext {
    /// Starts configuring a new instance of `fstype` (`overlay`, `proc`, `tmpfs`, `devpts`).
    pub fn new(fstype: &str) -> Result<FsContext, Errno> {
        let name = cstring(fstype)?;
        // SAFETY: name is a valid NUL-terminated string for the duration of the call.
        let ret = unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) };
        fd_from(ret).map(FsContext)
    }

    /// Sets a string option (`key=value`).
    pub fn set(&self, key: &str, value: &str) -> Result<(), Errno> {
        let (key, value) = (cstring(key)?, cstring(value)?);
        // SAFETY: the fd is ours; key and value are NUL-terminated and outlive the call; aux 0.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        ok_from(ret)
    }

    /// Sets a flag option (`key`).
    pub fn flag(&self, key: &str) -> Result<(), Errno> {
        let key = cstring(key)?;
        // SAFETY: as in `set`; value must be NULL for a flag.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                FSCONFIG_SET_FLAG,
                key.as_ptr(),
                std::ptr::null::<libc::c_char>(),
                0,
            )
        };
        ok_from(ret)
    }

    /// Creates the superblock and returns a detached mount of it with `attrs`
    /// (`MOUNT_ATTR_*`). On failure the error carries the kernel's own explanation, if any.
    pub fn mount(self, attrs: u64) -> Result<OwnedFd, (Errno, String)> {
        // SAFETY: FSCONFIG_CMD_CREATE takes no key/value.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_char>(),
                0,
            )
        };
        ok_from(ret).map_err(|e| (e, self.kernel_log()))?;
        let attrs = libc::c_uint::try_from(attrs).map_err(|_| (Errno::EINVAL, String::new()))?;
        // SAFETY: the fd is ours and configured; flags and attrs are plain integers.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                self.0.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                attrs,
            )
        };
        fd_from(ret).map_err(|e| (e, self.kernel_log()))
    }

    /// Messages the filesystem logged into the context ("e overlay: ..."), joined.
    fn kernel_log(&self) -> String {
        let mut lines = Vec::new();
        let mut buf = [0u8; 1024];
        // Each read returns one message; ENODATA once drained. Bounded against surprises.
        for _ in 0..16 {
            match nix::unistd::read(&self.0, &mut buf) {
                Ok(n) if n > 0 => {
                    lines.push(String::from_utf8_lossy(&buf[..n]).trim_end().to_owned());
                }
                _ => break,
            }
        }
        lines.join("; ")
    }
}

/// Clones the mount at `source` (and, with `recursive`, everything mounted below it) into a
/// new detached tree (`open_tree(OPEN_TREE_CLONE)`): the fd-based form of a bind mount.
pub(crate) fn clone_tree(source: BorrowedFd<'_>, recursive: bool) -> Result<OwnedFd, Errno> {
    let empty = c"";
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    flags |= libc::c_uint::try_from(libc::AT_EMPTY_PATH).map_err(|_| Errno::EINVAL)?;
    if recursive {
        flags |= libc::c_uint::try_from(libc::AT_RECURSIVE).map_err(|_| Errno::EINVAL)?;
    }
    // SAFETY: source is a valid fd, the path is the empty C string (AT_EMPTY_PATH).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            source.as_raw_fd(),
            empty.as_ptr(),
            flags,
        )
    };
    fd_from(ret)
}

/// Sets mount attributes on the mount `mount` refers to (and, with `recursive`, every mount
/// below it). Only ever adds restrictions, so it also works on mounts whose flags the kernel
/// locked when they were copied into this user namespace.
pub(crate) fn set_attrs(mount: BorrowedFd<'_>, attrs: u64, recursive: bool) -> Result<(), Errno> {
    let attr = libc::mount_attr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH;
    if recursive {
        flags |= libc::AT_RECURSIVE;
    }
    mount_setattr(mount, flags, attr)
}

/// Makes the detached mount `mount` show its files through `userns`'s id mapping
/// (`MOUNT_ATTR_IDMAP`), with `attrs` added. Only a detached mount can be idmapped.
pub(crate) fn set_idmap(
    mount: BorrowedFd<'_>,
    userns: BorrowedFd<'_>,
    attrs: u64,
) -> Result<(), Errno> {
    let attr = libc::mount_attr {
        attr_set: attrs | libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: u64::try_from(userns.as_raw_fd()).map_err(|_| Errno::EBADF)?,
    };
    mount_setattr(mount, libc::AT_EMPTY_PATH, attr)
}

/// `mount_setattr(2)` on the mount `mount` refers to (the path is empty: `flags` must hold
/// `AT_EMPTY_PATH`).
fn mount_setattr(
    mount: BorrowedFd<'_>,
    flags: libc::c_int,
    mut attr: libc::mount_attr,
) -> Result<(), Errno> {
    let empty = c"";
    // SAFETY: mount is a valid fd; attr is a live, initialised mount_attr whose size we pass.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            empty.as_ptr(),
            flags,
            &mut attr as *mut libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    ok_from(ret)
}

/// Attaches the detached mount `mount` on top of the file or directory `target` refers to.
pub(crate) fn attach(mount: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), Errno> {
    let empty = c"";
    let flags = libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: both fds are valid; both paths are the empty C string (EMPTY_PATH flags).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            flags,
        )
    };
    ok_from(ret)
}

/// True if this kernel has `mount_setattr` (and so the whole API used here).
pub(crate) fn available() -> bool {
    // An invalid fd: a kernel with the syscall answers EBADF/EINVAL, one without ENOSYS.
    // SAFETY: no memory is passed (NULL attr, size 0); the call fails before using anything.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1,
            std::ptr::null::<libc::c_char>(),
            0,
            std::ptr::null::<libc::mount_attr>(),
            0usize,
        )
    };
    !(ret < 0 && Errno::last() == Errno::ENOSYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_present_on_test_kernel() {
        assert!(available());
    }

    #[test]
    fn bad_fstype_is_reported() {
        assert!(FsContext::new("no-such-filesystem").is_err());
    }
}
