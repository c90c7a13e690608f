//! Resolving mount targets inside the new root: `openat2(RESOLVE_IN_ROOT)` treats the root fd
//! as `/`, so an absolute symlink or `..` in the image cannot lead a mount outside it.
//! Missing mountpoints are created (in the overlay, so in the upper layer).

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{mkdirat, Mode};

/// What to create when a mountpoint is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A directory (0755).
    Dir,
    /// An empty regular file (0644), the mountpoint for a file bind.
    File,
}

fn how(flags: OFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS)
}

/// Opens `rel` (relative to `root`, which acts as `/`) as an `O_PATH` fd.
pub(crate) fn open_in_root(root: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, Errno> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    openat2(root, rel, how(OFlag::O_PATH))
}

/// Opens the mountpoint `rel` inside `root`, creating it (and missing parent directories,
/// 0755) when absent. `rel` must be made of plain names (see `spec::guest_relative`).
pub(crate) fn mountpoint(root: BorrowedFd<'_>, rel: &Path, kind: Kind) -> Result<OwnedFd, Errno> {
    match open_in_root(root, rel) {
        Err(Errno::ENOENT) => {}
        other => return other,
    }
    let names: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = names.split_last() else {
        return Err(Errno::EINVAL);
    };
    // Walk down from the root, each prefix resolved afresh inside the root so that symlinked
    // directories in the image are followed the way the guest will see them.
    let mut prefix = PathBuf::new();
    let mut parent = open_in_root(root, Path::new("."))?;
    for name in parents {
        prefix.push(name);
        parent = match openat2(root, &prefix, how(OFlag::O_PATH | OFlag::O_DIRECTORY)) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                create(parent.as_fd(), name, Kind::Dir)?;
                openat2(root, &prefix, how(OFlag::O_PATH | OFlag::O_DIRECTORY))?
            }
            Err(e) => return Err(e),
        };
    }
    create(parent.as_fd(), last, kind)?;
    open_in_root(root, rel)
}

/// Creates `name` in `dir`; an entry that already exists (a race, or a dangling symlink the
/// caller's next lookup will report) is left alone.
fn create(dir: BorrowedFd<'_>, name: &OsStr, kind: Kind) -> Result<(), Errno> {
    let created = match kind {
        Kind::Dir => mkdirat(dir, name, Mode::from_bits_truncate(0o755)),
        Kind::File => openat(
            dir,
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map(drop),
    };
    match created {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::{open, readlink};
    use std::os::unix::fs::symlink;

    fn fd_path(fd: &OwnedFd) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(
            readlink(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str()).expect("readlink"),
        )
    }

    #[test]
    fn creates_missing_and_stays_inside_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root_path = dir.path().join("root");
        std::fs::create_dir_all(root_path.join("usr/bin")).expect("mkdir");
        std::fs::create_dir_all(root_path.join("etc")).expect("mkdir");
        // An absolute symlink must resolve inside the root, not on the host.
        symlink("/usr/bin", root_path.join("bin")).expect("symlink");
        symlink("/etc", root_path.join("escape")).expect("symlink");
        let root = open(
            &root_path,
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .expect("open root");

        let bin = mountpoint(root.as_fd(), Path::new("bin"), Kind::Dir).expect("bin");
        assert_eq!(fd_path(&bin), root_path.join("usr/bin"));

        let made = mountpoint(root.as_fd(), Path::new("a/b/c"), Kind::File).expect("a/b/c");
        assert_eq!(fd_path(&made), root_path.join("a/b/c"));
        assert!(root_path.join("a/b/c").is_file());

        let escaped =
            mountpoint(root.as_fd(), Path::new("escape/passwd"), Kind::File).expect("escape");
        assert_eq!(fd_path(&escaped), root_path.join("etc/passwd"));
        assert!(root_path.join("etc/passwd").is_file());

        // Nothing is created through a dangling symlink.
        symlink("/nowhere", root_path.join("dangling")).expect("symlink");
        assert_eq!(
            mountpoint(root.as_fd(), Path::new("dangling/x"), Kind::Dir).err(),
            Some(Errno::ENOENT)
        );
        assert!(!root_path.join("nowhere").exists());
    }
}
