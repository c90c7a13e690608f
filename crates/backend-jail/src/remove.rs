//! Deleting a directory tree the guest wrote (the overlay's upper and work dirs) without
//! trusting it: symlinks are removed, never followed; depth costs memory for names, not file
//! descriptors or stack (the guest can nest directories without bound); directories the
//! guest made unreadable (mode 000, which matters to an unprivileged supervisor) are chmod'ed
//! before descending.
//!
//! The walk goes back up through `..`, which is only sound while nothing renames directories
//! under it: callers first make sure no guest process is left. Each step up is still checked
//! (device and inode of the parent must be the ones we came from) and fails otherwise.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmod, fchmodat, fstat, fstatat, FchmodatFlags, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// A directory being emptied: its name in its parent, its identity, and the subdirectories
/// still to visit.
struct Level {
    name: OsString,
    id: (u64, u64),
    pending: Vec<OsString>,
}

/// Removes `path` and everything below it. A missing `path` is not an error.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to remove a root",
        ));
    };
    // The caller's path (not guest data) may legitimately contain symlinks: follow it.
    let parent = match openat(AT_FDCWD, parent, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let top = match open_subdir(parent.as_fd(), name) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::ENOTDIR | Errno::ELOOP) => return unlink_entry(parent.as_fd(), name, false),
        Err(e) => return Err(e.into()),
    };
    let mut current = top;
    let mut stack = vec![Level {
        name: name.to_owned(),
        id: identity(current.as_fd())?,
        pending: scan(current.as_fd())?,
    }];
    loop {
        let Some(level) = stack.last_mut() else {
            return Ok(());
        };
        if let Some(sub) = level.pending.pop() {
            match open_subdir(current.as_fd(), &sub) {
                Ok(child) => {
                    let pending = scan(child.as_fd())?;
                    stack.push(Level {
                        name: sub,
                        id: identity(child.as_fd())?,
                        pending,
                    });
                    current = child;
                }
                Err(Errno::ENOENT) => {}
                // Turned into a non-directory since the scan.
                Err(Errno::ENOTDIR | Errno::ELOOP) => unlink_entry(current.as_fd(), &sub, false)?,
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        // All known subdirectories are gone; look once more before removing this one.
        let again = scan(current.as_fd())?;
        if !again.is_empty() {
            level.pending = again;
            continue;
        }
        let done_name = level.name.clone();
        stack.pop();
        let up = match stack.last() {
            Some(parent_level) => {
                let up = openat(
                    current.as_fd(),
                    "..",
                    dir_flags() | OFlag::O_NOFOLLOW,
                    Mode::empty(),
                )?;
                if identity(up.as_fd())? != parent_level.id {
                    return Err(io::Error::other(format!(
                        "{} changed while it was being removed",
                        path.display()
                    )));
                }
                up
            }
            None => openat(parent.as_fd(), ".", dir_flags(), Mode::empty())?,
        };
        drop(std::mem::replace(&mut current, up));
        unlink_entry(current.as_fd(), &done_name, true)?;
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// Opens the subdirectory `name` of `dir` without following a symlink, making it searchable
/// first if its mode forbids that.
fn open_subdir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    let flags = dir_flags() | OFlag::O_NOFOLLOW;
    match openat(dir, name, flags, Mode::empty()) {
        Err(Errno::EACCES) => {
            fchmodat(
                dir,
                name,
                Mode::from_bits_truncate(0o700),
                FchmodatFlags::NoFollowSymlink,
            )
            .or_else(|e| match e {
                // Linux has no lchmod; the entry is a directory (we just failed to enter
                // it), so following is harmless.
                Errno::EOPNOTSUPP => fchmodat(
                    dir,
                    name,
                    Mode::from_bits_truncate(0o700),
                    FchmodatFlags::FollowSymlink,
                ),
                e => Err(e),
            })?;
            openat(dir, name, flags, Mode::empty())
        }
        other => other,
    }
}

/// Unlinks every non-directory in `dir` and returns the names of its subdirectories.
fn scan(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    // A fresh open file description, so each scan reads from the start.
    let mut stream = Dir::openat(dir, ".", dir_flags(), Mode::empty())?;
    let mut files = Vec::new();
    let mut subdirs = Vec::new();
    for entry in stream.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            Some(Type::Directory) => true,
            Some(_) => false,
            None => {
                let st = fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)?;
                SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
            }
        };
        if is_dir {
            subdirs.push(name.to_owned());
        } else {
            files.push(name.to_owned());
        }
    }
    drop(stream);
    for name in files {
        unlink_entry(dir, &name, false)?;
    }
    Ok(subdirs)
}

/// Unlinks `name` from `dir`, making `dir` writable first if its mode forbids that.
fn unlink_entry(dir: BorrowedFd<'_>, name: &OsStr, is_dir: bool) -> io::Result<()> {
    let flag = if is_dir {
        UnlinkatFlags::RemoveDir
    } else {
        UnlinkatFlags::NoRemoveDir
    };
    match unlinkat(dir, name, flag) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::EACCES) => {
            fchmod(dir, Mode::from_bits_truncate(0o700))?;
            match unlinkat(dir, name, flag) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn removes_deep_trees_without_following_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), b"x").expect("write");

        let tree = dir.path().join("tree");
        let mut deep = tree.clone();
        for i in 0..300 {
            deep.push(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).expect("mkdir deep");
        std::fs::write(deep.join("file"), b"x").expect("write");
        symlink(&outside, tree.join("link-to-outside")).expect("symlink");
        symlink(&outside, deep.join("link-to-outside")).expect("symlink");
        symlink("/nowhere", tree.join("d0/dangling")).expect("symlink");
        nix::unistd::mkfifo(&tree.join("fifo"), Mode::from_bits_truncate(0o600)).expect("fifo");
        let locked = tree.join("locked");
        std::fs::create_dir_all(locked.join("inner")).expect("mkdir");
        std::fs::write(locked.join("inner/f"), b"x").expect("write");
        std::fs::set_permissions(locked.join("inner"), std::fs::Permissions::from_mode(0o000))
            .expect("chmod");
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).expect("chmod");

        remove_tree(&tree).expect("remove");
        assert!(!tree.exists());
        assert!(outside.join("keep").exists(), "symlink target was touched");
        // Removing what is not there is fine.
        remove_tree(&tree).expect("idempotent");
    }

    #[test]
    fn removes_a_file_or_symlink_at_the_top() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        let link = dir.path().join("link");
        symlink(&target, &link).expect("symlink");
        remove_tree(&link).expect("remove link");
        assert!(!link.exists() && target.exists());
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        remove_tree(&file).expect("remove file");
        assert!(!file.exists());
    }
}
