//! The reflink pool: for a home on a filesystem that cannot share extents (ext4, the common
//! case), an XFS with reflink in one image file of the home, loop-mounted on the home's
//! `sandboxes/`, so that the sandboxes' disk images, and their checkpoints and forks, live on
//! a filesystem where a duplicate is a clone (see `checkpoint`). Like LXD's default
//! loop-backed storage pool.
//!
//! This module formats the pool's image and mounts it; the engine decides when (it is
//! opt-in: `DYNOCAP_JAIL_POOL_MB`), reserves the image's room and holds the lock under which
//! the first process that needs the pool mounts it. The mount is made in the caller's mount
//! namespace, the host's (a process of the CLI or a server, before any supervisor of the home
//! enters a namespace of its own), so every later supervisor's private namespace inherits it;
//! the loop device is `LO_FLAGS_AUTOCLEAR`, freed when the mount goes (an unmount, a reboot),
//! after which the next process that needs the pool mounts it again. It is mounted on a shared
//! bind mount of `sandboxes/` on itself, so that an unmount here takes the copies the
//! supervisors' namespaces made of it with it.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};

use crate::error::JailError;

/// `XFS_SUPER_MAGIC` of `<linux/magic.h>`.
const XFS_MAGIC: i64 = 0x5846_5342;

/// Whether an XFS is mounted on `mountpoint` (a directory of `parent`, on another device).
pub fn pool_mounted(mountpoint: &Path, parent: &Path) -> Result<bool, JailError> {
    let dev = |path: &Path| {
        fs::metadata(path)
            .map(|meta| meta.dev())
            .map_err(|e| JailError::io("stat", path, e))
    };
    if dev(mountpoint)? == dev(parent)? {
        return Ok(false);
    }
    let fs = nix::sys::statfs::statfs(mountpoint)
        .map_err(|e| JailError::sys(format!("statfs {}", mountpoint.display()), e))?;
    #[allow(clippy::useless_conversion)] // the field's type differs between libcs
    let kind = i64::from(fs.filesystem_type().0);
    if kind == XFS_MAGIC {
        Ok(true)
    } else {
        Err(JailError::InvalidSpec(format!(
            "{} is a mount of another filesystem, not the home's reflink pool (an XFS); \
             unmount it, or unset DYNOCAP_JAIL_POOL_MB",
            mountpoint.display()
        )))
    }
}

/// Formats `image` (its room already reserved) as XFS with reflink.
pub fn format_pool(image: &Path) -> Result<(), JailError> {
    let output = Command::new("mkfs.xfs")
        .args(["-q", "-f", "-m", "reflink=1"])
        .arg(image)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .map_err(|e| {
            JailError::io("run mkfs.xfs for the reflink pool", image, e).hint(
                "DYNOCAP_JAIL_POOL_MB needs mkfs.xfs: install xfsprogs (apt-get install xfsprogs)",
            )
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(JailError::InvalidSpec(format!(
            "mkfs.xfs {} failed ({}): {}",
            image.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Refuses a `mountpoint` that is not empty: the sandboxes on the home's own filesystem there
/// would be hidden under the pool.
pub fn check_pool_mountpoint(mountpoint: &Path) -> Result<(), JailError> {
    let empty = fs::read_dir(mountpoint)
        .map_err(|e| JailError::io("read", mountpoint, e))?
        .next()
        .is_none();
    if !empty {
        return Err(JailError::InvalidSpec(format!(
            "{} holds sandboxes on the home's own filesystem: the reflink pool \
             (DYNOCAP_JAIL_POOL_MB) is mounted there only while it is empty; remove them \
             (dynocap rm --purge), or unset DYNOCAP_JAIL_POOL_MB",
            mountpoint.display()
        )));
    }
    Ok(())
}

/// Mounts the pool's `image` on `mountpoint` (an empty directory) in this process's mount
/// namespace, through a loop device that clears itself when the mount goes.
pub fn mount_pool(image: &Path, mountpoint: &Path) -> Result<(), JailError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(
            JailError::sys("mounting the reflink pool", Errno::EPERM).hint(
                "the reflink pool (DYNOCAP_JAIL_POOL_MB) is a loop-mounted filesystem: run \
                 dynocap as root, or unset DYNOCAP_JAIL_POOL_MB",
            ),
        );
    }
    check_pool_mountpoint(mountpoint)?;
    share_mountpoint(mountpoint)?;
    // A device still bound to the image (supervisors' namespaces keep a mount of the pool
    // that was unmounted here) is mounted again: a second device would be a second mount of
    // the same XFS, which it refuses.
    let (device, _loop_fd) = match crate::disk::loop_device_of(image) {
        Some(name) => (Path::new("/dev").join(name), None),
        None => {
            let file: File = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(image)
                .map_err(|e| JailError::io("open the reflink pool", image, e))?;
            // The loop fd only has to live until the mount holds the device.
            let (device, fd) = crate::disk::attach_loop(&file)?;
            (device, Some(fd))
        }
    };
    mount(
        Some(&device),
        mountpoint,
        Some("xfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| {
        JailError::sys(
            format!(
                "mounting the reflink pool {} on {}",
                image.display(),
                mountpoint.display()
            ),
            e,
        )
        .hint(MOUNT_FAILED)
    })
}

/// Makes `mountpoint` a shared bind mount of itself, the pool's parent mount. Mounts and
/// unmounts propagate through the parent's peer group: a private namespace copies every mount
/// there is, the pool's too, and every supervisor's (of any home, see
/// `disk::enter_private_mount_namespace`) is a slave of the host's; with a shared parent, an
/// unmount of the pool here takes their copies with it, instead of each holding the pool's
/// filesystem, and its image's blocks, until it ends.
fn share_mountpoint(mountpoint: &Path) -> Result<(), JailError> {
    if !is_mount_point(mountpoint) {
        mount(
            Some(mountpoint),
            mountpoint,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| {
            JailError::sys(
                format!("bind-mounting {} on itself", mountpoint.display()),
                e,
            )
        })?;
    }
    mount(
        None::<&str>,
        mountpoint,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .map_err(|e| JailError::sys(format!("making {} shared", mountpoint.display()), e))
}

/// Whether `path` is a mount point in this process's mount namespace (mountinfo(5)'s fifth
/// field, with its octal escapes).
fn is_mount_point(path: &Path) -> bool {
    let Ok(path) = fs::canonicalize(path) else {
        return false;
    };
    let escaped = path
        .to_string_lossy()
        .replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012");
    fs::read_to_string("/proc/self/mountinfo").is_ok_and(|mounts| {
        mounts
            .lines()
            .any(|line| line.split(' ').nth(4) == Some(escaped.as_str()))
    })
}

/// What to do when the pool's image does not mount: the kernel's log says why.
const MOUNT_FAILED: &str = "see the kernel's log (dmesg) for why: a kernel without XFS needs \
    it (modprobe xfs), a damaged image can be checked with xfs_repair -n on it; or remove the \
    pool (dynocap jail-pool rm: it is made anew at the next start), or unset \
    DYNOCAP_JAIL_POOL_MB";

/// A process that has the pool mounted in a mount namespace other than this process's (one
/// per namespace): a supervisor, whose private namespace took a copy of the pool's mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolHolder {
    pub pid: i32,
    /// Its command line, as `ps` shows it.
    pub command: String,
}

/// The processes that hold the pool's `image` mounted in mount namespaces other than this
/// process's, one per namespace: while any does, its filesystem stays whole (its loop device
/// bound, the image's blocks in use) whatever this namespace unmounts or deletes.
pub fn pool_holders(image: &Path) -> Vec<PoolHolder> {
    let Some(device) = crate::disk::loop_device_of(image)
        .and_then(|name| fs::read_to_string(Path::new("/sys/block").join(name).join("dev")).ok())
    else {
        return Vec::new();
    };
    let device = device.trim().to_owned();
    let namespace = |pid: &str| fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let ours = namespace("self");
    let mut seen = std::collections::HashSet::new();
    let mut holders = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return holders;
    };
    for entry in procs.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Some(ns) = namespace(&pid.to_string()) else {
            continue;
        };
        if Some(&ns) == ours.as_ref() || seen.contains(&ns) {
            continue;
        }
        let Ok(mounts) = fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        // mountinfo(5): the third field is the mounted filesystem's device, major:minor.
        let holds = mounts
            .lines()
            .any(|line| line.split(' ').nth(2) == Some(device.as_str()));
        if holds {
            seen.insert(ns);
            let command = fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    String::from_utf8_lossy(&raw)
                        .split('\0')
                        .filter(|arg| !arg.is_empty())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            holders.push(PoolHolder { pid, command });
        }
    }
    holders
}

/// Unmounts the pool from `mountpoint` in this process's mount namespace, and from the
/// namespaces whose copies are slaves of it (see [`share_mountpoint`]), then the shared bind
/// mount under it; its loop device clears itself once no namespace has it mounted.
pub fn unmount_pool(mountpoint: &Path) -> Result<(), JailError> {
    umount(mountpoint)?;
    // The bind mount the pool was on, if it was (a pool mounted before there was one is not).
    if is_mount_point(mountpoint) {
        umount(mountpoint)?;
    }
    Ok(())
}

fn umount(mountpoint: &Path) -> Result<(), JailError> {
    nix::mount::umount2(mountpoint, nix::mount::MntFlags::empty()).map_err(|e| {
        let err = JailError::sys(
            format!("unmounting the reflink pool from {}", mountpoint.display()),
            e,
        );
        if e == Errno::EBUSY {
            err.hint(
                "a process has a file open or its working directory in the pool (`fuser -vm` \
                 on the mount point names it): end it, then run this again",
            )
        } else {
            err
        }
    })
}
