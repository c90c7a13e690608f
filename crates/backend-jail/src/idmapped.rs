//! A built image's tree shown through the guest's id map, as the overlay's lower layer; and
//! a fork's disk shown through the map from the ids it was written under to the jail's own,
//! as the overlay's upper layer ([`layer_disk`]).
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

/// A detached, read-write (nosuid, nodev) idmapped clone of the mount holding a kept
/// writable layer (`disk`: the sandbox's disk, with `upper/` and `work/`) whose files were
/// written under `written`'s host ids, showing them as `ids`' (see [`IdMap::between`]): a
/// fork's disk, cloned from another sandbox's, is its guest's own without a chown of every
/// file, and what the guest writes lands on the disk under `written`'s ids, so the disk keeps
/// one id range whatever sandbox boots it.
pub(crate) fn layer_disk(disk: &Path, written: &IdMap, ids: &IdMap) -> Result<OwnedFd, JailError> {
    let map = IdMap::between(written, ids).ok_or_else(|| {
        JailError::InvalidSpec(format!(
            "the kept layer's files were written under host ids {}..+{} and this jail's are \
             {}..+{}: only two root-mode ranges of the same size can be mapped onto each other",
            written.uids.host, written.uids.count, ids.uids.host, ids.uids.count
        ))
    })?;
    let what = || format!("idmapping the kept layer's disk {}", disk.display());
    let userns = userns_with(&map)?;
    let dir = open(
        disk,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| JailError::sys(what(), e))?;
    let tree = newmount::clone_tree(dir.as_fd(), false).map_err(|e| JailError::sys(what(), e))?;
    newmount::set_idmap(tree.as_fd(), userns.as_fd(), NOSUID | NODEV).map_err(|e| {
        JailError::sys(what(), e).hint(
            "idmapped mounts need Linux 5.12+ and a filesystem that supports them (ext4, xfs, \
             btrfs)",
        )
    })?;
    Ok(tree)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{lchown, MetadataExt, PermissionsExt};

    /// As root: through the idmapped clone, entries written under one range show as the same
    /// guest ids of another (a set-uid file keeps its bit), an entry of an id outside the
    /// range shows as unmapped, and a file the new range's user creates lands on the disk
    /// under the old range's id: nothing on the disk changes owner.
    #[test]
    fn a_layer_written_under_one_range_shows_as_anothers() {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var_os("CI").is_none(), "needs root");
            eprintln!("SKIPPED a_layer_written_under_one_range_shows_as_anothers: needs root");
            return;
        }
        let (written, ids) = (
            IdMap::root_mode_at(1).expect("range 1"),
            IdMap::root_mode_at(2).expect("range 2"),
        );
        let host = |map: &IdMap, guest: u32| map.to_host(guest).expect("mapped");
        let tmp = tempfile::tempdir().expect("tempdir");
        let disk = tmp.path().join("disk");
        let home = disk.join("upper/home/sandbox");
        fs::create_dir_all(&home).expect("dirs");
        fs::write(home.join("file"), b"x").expect("file");
        fs::write(disk.join("upper/suid"), b"x").expect("suid");
        fs::write(disk.join("foreign"), b"x").expect("foreign");
        let own = |path: &Path, uid: u32| lchown(path, Some(uid), Some(uid)).expect("chown");
        for path in [home.clone(), home.join("file")] {
            own(&path, host(&written, 1000));
        }
        own(&disk.join("upper/suid"), host(&written, 0));
        fs::set_permissions(disk.join("upper/suid"), fs::Permissions::from_mode(0o4755))
            .expect("chmod");
        own(&disk.join("foreign"), 4242);

        let tree = layer_disk(&disk, &written, &ids).expect("idmapped clone");
        let seen = |rel: &str| {
            let st = nix::sys::stat::fstatat(
                tree.as_fd(),
                rel,
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .expect("stat through the clone");
            (st.st_uid, st.st_gid, st.st_mode & 0o7777)
        };
        let user = host(&ids, 1000);
        assert_eq!(seen("upper/home/sandbox/file"), (user, user, 0o644));
        let root = host(&ids, 0);
        assert_eq!(
            seen("upper/suid"),
            (root, root, 0o4755),
            "the set-uid bit shows"
        );
        let (foreign_uid, _, _) = seen("foreign");
        assert_ne!(foreign_uid, 4242, "an id outside the range is not mapped");

        // A thread whose filesystem ids are the new range's user creates a file through the
        // clone (setfsuid is per thread).
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: setfsgid/setfsuid change only this thread's filesystem ids, which
                    // it drops with itself; they touch no memory.
                    unsafe {
                        libc::setfsgid(user);
                        libc::setfsuid(user);
                    }
                    nix::fcntl::openat(
                        tree.as_fd(),
                        "upper/home/sandbox/new",
                        OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                        Mode::from_bits_truncate(0o600),
                    )
                    .expect("create as the sandbox user through the clone");
                })
                .join()
                .expect("thread");
        });
        let on_disk = fs::metadata(home.join("new")).expect("created");
        assert_eq!(
            (on_disk.uid(), on_disk.gid()),
            (host(&written, 1000), host(&written, 1000)),
            "written under the disk's own ids"
        );
        let file = fs::metadata(home.join("file")).expect("file");
        assert_eq!(file.uid(), host(&written, 1000), "nothing was chowned");
    }
}
