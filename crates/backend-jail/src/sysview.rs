//! What of the kernel's sysfs the guest is shown: an allowlist, not a list of masks.
//!
//! A sysfs instance shows the whole machine: every block device of the host (loop devices
//! included, whose `loop/backing_file` names the disk image of every other sandbox), PCI and
//! NVMe devices with their serials, DMI identifiers, firmware tables, the per-device
//! directories of `/sys/fs/ext4`. Only the network classes are scoped to the guest's network
//! namespace. Masking the known leaks one by one would miss the next kernel's, so every
//! top-level directory of the guest's sysfs is covered by a small tmpfs of its own, and only
//! the subtrees in [`SHOWN`] are bound back into it, read-only, at their usual places:
//!
//! ```text
//! /sys                        the guest network namespace's sysfs (read-only), whose
//!   block bus class dev ...     top-level directories are each covered by a tmpfs
//!   devices/system/cpu          CPU topology and online set (lscpu, nproc --all, getconf,
//!                               glibc's get_nprocs_conf, the JVM, Go, Node)
//!   devices/system/node         NUMA topology (libnuma, the JVM, top)
//!   devices/virtual/net         the guest's own interfaces ...
//!   class/net                   ... and their class links
//!   kernel/mm                   transparent hugepage and hugepage settings (Go, the JVM,
//!                               jemalloc)
//!   block class/block           empty: lsblk and friends find no device, and work
//!   dev/block dev/char
//!   fs/cgroup                   the sandbox's cgroups (see `rootfs::mount_cgroup_views`)
//! ```
//!
//! `/sys` itself stays a sysfs (`statfs` says so to programs that check), but nothing below
//! its top level comes from the host unless listed here, whatever a newer kernel adds. The
//! covers are attached before the guest runs anything and the guest can never remove them:
//! it has no `CAP_SYS_ADMIN` (see `caps`) and `umount2`, `mount` and the fd-based mount calls
//! are outside its seccomp allowlist (see `seccomp`).

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::failure::{Context, Failure};
use crate::newmount::{self, NODEV, NOEXEC, NOSUID, RDONLY};
use crate::resolve::{self, Kind};
use crate::rootfs::{tmpfs, with_log};

/// Subtrees of the guest's sysfs bound back, read-only, where they belong (see the module
/// doc for who reads each). None of them names a host device or a host path: CPU and memory
/// topology and the guest's own network interfaces.
const SHOWN: &[&str] = &[
    "devices/system/cpu",
    "devices/system/node",
    "devices/virtual/net",
    "class/net",
    "kernel/mm",
];

/// Directories that stay, empty, inside the covers: where device-listing tools look (they
/// then list nothing instead of failing on a missing directory), and the mountpoint of the
/// sandbox's cgroup view.
const EMPTY: &[&str] = &["block", "class/block", "dev/block", "dev/char", "fs/cgroup"];

/// Covers every top-level directory of the sysfs mounted at `sys` (attached in the guest's
/// tree, so its subtrees can be cloned) and binds [`SHOWN`] back into the covers.
pub(crate) fn restrict(sys: BorrowedFd<'_>) -> Result<(), Failure> {
    // Clones first: once a directory is covered, what lies below it cannot be reached.
    let mut shown = Vec::new();
    for rel in SHOWN {
        let what = || format!("showing /sys/{rel}");
        let source = match resolve::open_in_root(sys, Path::new(rel)) {
            Ok(fd) => fd,
            // A kernel without NUMA has no devices/system/node, for one.
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => return Err(Failure::new(what(), e)),
        };
        let tree = newmount::clone_tree(source.as_fd(), false).context(what)?;
        newmount::set_attrs(tree.as_fd(), RDONLY | NOSUID | NODEV | NOEXEC, false).context(what)?;
        shown.push((Path::new(rel), tree));
    }

    for top in top_level_dirs(sys)? {
        let top = PathBuf::from(top);
        let inside = |rel: &Path| rel.strip_prefix(&top).ok().map(Path::to_path_buf);
        let empty: Vec<PathBuf> = EMPTY
            .iter()
            .filter_map(|rel| inside(rel.as_ref()))
            .collect();
        let binds: Vec<(PathBuf, &OwnedFd)> = shown
            .iter()
            .filter_map(|(rel, tree)| Some((inside(rel)?, tree)))
            .collect();
        cover(sys, &top, &empty, &binds)?;
    }
    Ok(())
}

/// The names of the directories at the top of the sysfs at `sys`. A sysfs root holds
/// directories only (one per kset or subsystem), so there is nothing else to cover.
fn top_level_dirs(sys: BorrowedFd<'_>) -> Result<Vec<OsString>, Failure> {
    let what = || "listing the top of /sys";
    let mut stream = Dir::openat(
        sys,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .context(what)?;
    let mut names = Vec::new();
    for entry in stream.iter() {
        let entry = entry.context(what)?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." || entry.file_type() != Some(Type::Directory) {
            continue;
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

/// Covers `/sys/<top>` with a tmpfs holding the directories `empty` and the clones `binds`
/// (paths relative to `top`), then makes the tmpfs read-only. The guest never sees it
/// writable: nothing of the guest runs before the whole root is built.
fn cover(
    sys: BorrowedFd<'_>,
    top: &Path,
    empty: &[PathBuf],
    binds: &[(PathBuf, &OwnedFd)],
) -> Result<(), Failure> {
    let name = Path::new("/sys").join(top);
    let what = || format!("covering {}", name.display());
    let target = resolve::open_in_root(sys, top).context(what)?;
    // No size limit: the cover is written here, a few directories, and is read-only before
    // the guest runs. Unlimited, it reports no blocks, so `df` leaves it out as it leaves out
    // /proc's masks, instead of listing a dozen /sys entries.
    let layer = tmpfs(&[("mode", "0755"), ("size", "0")])?
        .mount(NOSUID | NODEV | NOEXEC)
        .map_err(|(errno, log)| with_log(Failure::new(what(), errno), &log))?;
    // Attached first: a mount can only be attached below one in this namespace.
    newmount::attach(layer.as_fd(), target.as_fd()).context(what)?;
    // Every directory before any bind, so none is made inside a bind (read-only) instead of
    // in this tmpfs.
    let mut places = Vec::new();
    for rel in empty.iter().chain(binds.iter().map(|(rel, _)| rel)) {
        let at = resolve::mountpoint(layer.as_fd(), rel, Kind::Dir)
            .context(|| format!("creating {}", name.join(rel).display()))?;
        places.push(at);
    }
    for ((rel, tree), at) in binds.iter().zip(&places[empty.len()..]) {
        newmount::attach(tree.as_fd(), at.as_fd())
            .context(|| format!("showing {}", name.join(rel).display()))?;
    }
    newmount::set_attrs(layer.as_fd(), RDONLY | NOSUID | NODEV | NOEXEC, false).context(what)
}
