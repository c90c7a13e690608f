//! A built image's tree shown through the guest's id map, as the overlay's lower layer.
//!
//! A built image (a Debian rootfs) is a whole filesystem owned by host root. Host root is
//! unmapped in the guest, so without help every image file would show as `nobody` and the
//! guest's root could change none of them: copy-up keeps a file's owner, and an unmapped
//! owner cannot be written (so `apt-get install` fails on /var/lib/dpkg). An idmapped mount
//! (Linux 5.12+, `mount_setattr(MOUNT_ATTR_IDMAP)`) of the image shows its files through the
//! sandbox's own user namespace mapping: on-disk uid 0 appears as the guest's root (that is,
//! as the sandbox's unprivileged host uid), uid 1000 as the sandbox user. Nothing on disk
//! changes: one image serves many sandboxes, each through its own id range.
//!
//! Creating the idmapped mount needs host `CAP_SYS_ADMIN` (the image's filesystem belongs to
//! the initial user namespace), so the supervisor makes it before the clone, detached and
//! read-only; the guest init inherits the fd and attaches it in its own mount namespace
//! (see `rootfs::open_host`), where the host never sees it. The mapping is taken from a
//! throwaway user namespace with the jail's exact id map: a mount keeps the mapping it was
//! given, not the namespace.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;
use nix::sys::wait::waitpid;
use nix::unistd::pipe2;

use crate::error::JailError;
use crate::newmount::{self, NODEV, NOSUID, RDONLY};
use crate::sys::{self, CloneResult};
use dynocap_host::IdMap;

const HINT_ROOT: &str = "a built image (e.g. debian) needs an idmapped mount, which only a \
    supervisor running as root can make; run DynoCap as root or use the host image";

/// A detached, read-only, idmapped clone of `image_root`.
pub(crate) fn image_tree(image_root: &Path, ids: &IdMap) -> Result<OwnedFd, JailError> {
    if ids.is_rootless() {
        return Err(JailError::InvalidSpec(HINT_ROOT.to_owned()));
    }
    let userns = userns_with(ids)?;
    let source = open(
        image_root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| JailError::sys(format!("opening the image {}", image_root.display()), e))?;
    let tree = newmount::clone_tree(source.as_fd(), false).map_err(|e| {
        JailError::sys(
            format!("cloning the image mount {}", image_root.display()),
            e,
        )
        .hint(HINT_ROOT)
    })?;
    newmount::set_idmap(tree.as_fd(), userns.as_fd(), RDONLY | NOSUID | NODEV).map_err(|e| {
        JailError::sys(
            format!("idmapping the image mount {}", image_root.display()),
            e,
        )
        .hint("idmapped mounts need Linux 5.12+ and a filesystem that supports them (ext4, xfs, btrfs)")
    })?;
    Ok(tree)
}

/// Detached, read-write (nosuid, nodev) idmapped clones of the directories `sources`, for
/// [`crate::JailSpec::rw_binds`]: on-disk guest ids show as the guest's own, so the guest's
/// user owns what it wrote there in an earlier sandbox, whatever host ids that one had.
pub(crate) fn read_write_trees(sources: &[&Path], ids: &IdMap) -> Result<Vec<OwnedFd>, JailError> {
    if sources.is_empty() {
        return Ok(Vec::new());
    }
    if ids.is_rootless() {
        return Err(JailError::InvalidSpec(
            "read-write binds need an idmapped mount, which only a supervisor running as root \
             can make"
                .to_owned(),
        ));
    }
    let userns = userns_with(ids)?;
    sources
        .iter()
        .map(|source| {
            let what = || format!("idmapping {} for a read-write bind", source.display());
            let dir = open(
                *source,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
                Mode::empty(),
            )
            .map_err(|e| JailError::sys(what(), e))?;
            let tree =
                newmount::clone_tree(dir.as_fd(), false).map_err(|e| JailError::sys(what(), e))?;
            newmount::set_idmap(tree.as_fd(), userns.as_fd(), NOSUID | NODEV)
                .map_err(|e| JailError::sys(what(), e))?;
            Ok(tree)
        })
        .collect()
}

/// A user namespace fd carrying `ids`' mapping: a child that only waits is cloned into a new
/// user namespace, mapped, its namespace opened, and then let go.
fn userns_with(ids: &IdMap) -> Result<OwnedFd, JailError> {
    let (wait_read, wait_write) =
        pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::sys("creating a pipe", e))?;
    // SAFETY: the child only reads a pipe and _exits (raw syscalls, async-signal-safe), so
    // this is sound whatever threads the process has.
    let cloned = unsafe { sys::clone_fork(nix::sched::CloneFlags::CLONE_NEWUSER) };
    match cloned {
        Ok(CloneResult::Child) => {
            drop(wait_write);
            let mut byte = [0u8; 1];
            let _ = nix::unistd::read(&wait_read, &mut byte);
            sys::exit_now(0)
        }
        Ok(CloneResult::Parent { pid, pidfd: _pidfd }) => {
            drop(wait_read);
            let opened = ids.write_for(pid).map_err(JailError::from).and_then(|()| {
                open(
                    format!("/proc/{pid}/ns/user").as_str(),
                    OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| JailError::sys("opening the id-map namespace", e))
            });
            // EOF on the pipe lets the child exit.
            drop(wait_write);
            let _ = waitpid(pid, None);
            opened
        }
        Err(e) => Err(JailError::sys(
            "creating a user namespace for the image's id map",
            e,
        )),
    }
}
