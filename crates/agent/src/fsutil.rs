//! File-system helpers for trees the sandbox user can write to while the agent (root) works
//! in them: every lookup is relative to a directory descriptor and never follows a symlink,
//! so swapping a directory for a symlink can only make an operation fail, never redirect it.

use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Write as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Deepest directory nesting [`remove_contents`] descends into. Each level holds one
/// descriptor and a stack frame, so a hostile tree cannot exhaust either; deeper trees are
/// left in place with an error. Unpacked paths are bounded well below this.
pub const MAX_REMOVE_DEPTH: usize = 512;

/// Flags for opening a directory without following a symlink in its last component.
pub fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Opens `name` inside `dir` as a directory, refusing a symlink.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> nix::Result<OwnedFd> {
    openat(dir, name, dir_flags(), Mode::empty())
}

/// Opens an absolute directory path one component at a time from `/`, following no symlink
/// at all. `..` components are refused: callers pass normalised paths.
pub fn open_dir_nofollow(path: &Path) -> io::Result<OwnedFd> {
    if !path.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not an absolute path", path.display()),
        ));
    }
    let mut fd = openat(AT_FDCWD, c"/", dir_flags(), Mode::empty())?;
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => {
                let name = cstring(name)?;
                fd = open_dir_at(fd.as_fd(), &name).map_err(|err| match err {
                    Errno::ELOOP | Errno::ENOTDIR => io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{} is not a directory or passes through a symlink",
                            path.display()
                        ),
                    ),
                    err => io::Error::from(err),
                })?;
            }
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} has a '..' component", path.display()),
                ))
            }
        }
    }
    Ok(fd)
}

/// A C string of a path component (which never holds a NUL on Unix, but be sure).
pub fn cstring(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a path component contains a NUL byte",
        )
    })
}

/// Opens the relative path `rel` beneath `dir` with `flags`, following no symlink on the way or
/// at its end and never leaving `dir` (openat2's `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): a
/// symlink anywhere on it is `ELOOP`. An empty `rel` is `dir` itself.
pub fn open_beneath(dir: BorrowedFd<'_>, rel: &OsStr, flags: OFlag) -> nix::Result<OwnedFd> {
    let rel = if rel.is_empty() { OsStr::new(".") } else { rel };
    let how = nix::fcntl::OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(
            nix::fcntl::ResolveFlag::RESOLVE_BENEATH | nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS,
        );
    nix::fcntl::openat2(dir, rel, how)
}

/// Names in a directory, without `.` and `..`.
pub fn list_dir(dir: BorrowedFd<'_>) -> nix::Result<Vec<CString>> {
    Ok(entries(dir)?.into_iter().map(|(name, _)| name).collect())
}

/// Names in a directory, without `.` and `..`, each with its type where the file system gives
/// one (`None` where it does not: ask `fstatat`).
pub fn entries(dir: BorrowedFd<'_>) -> nix::Result<Vec<(CString, Option<nix::dir::Type>)>> {
    let mut handle = nix::dir::Dir::openat(
        dir,
        c".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut found = Vec::new();
    for entry in handle.iter() {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            found.push((name.to_owned(), entry.file_type()));
        }
    }
    Ok(found)
}

/// Removes `name` inside `dir`: a file or symlink is unlinked (never followed), a directory is
/// emptied and removed. A missing entry is not an error.
pub fn remove_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    remove_at_depth(dir, name, 0)
}

/// Removes everything inside `dir`, continuing past failures; returns the first one.
pub fn remove_contents(dir: BorrowedFd<'_>) -> io::Result<()> {
    remove_contents_depth(dir, 0)
}

fn remove_at_depth(dir: BorrowedFd<'_>, name: &CStr, depth: usize) -> io::Result<()> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        // Linux says EISDIR for a directory; POSIX allows EPERM.
        Err(Errno::EISDIR | Errno::EPERM) => {}
        Err(err) => return Err(err.into()),
    }
    if depth >= MAX_REMOVE_DEPTH {
        return Err(io::Error::other(format!(
            "directories nested deeper than {MAX_REMOVE_DEPTH} levels were left in place"
        )));
    }
    let child = match open_dir_at(dir, name) {
        Ok(child) => child,
        Err(Errno::ENOENT) => return Ok(()),
        Err(err) => return Err(err.into()),
    };
    let emptied = remove_contents_depth(child.as_fd(), depth + 1);
    drop(child);
    match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => emptied,
        Err(err) => emptied.and(Err(err.into())),
    }
}

fn remove_contents_depth(dir: BorrowedFd<'_>, depth: usize) -> io::Result<()> {
    let mut first_error = None;
    for name in list_dir(dir)? {
        if let Err(err) = remove_at_depth(dir, &name, depth) {
            first_error.get_or_insert(err);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Removes `path` when it is a regular file (a file the agent wrote earlier); anything else
/// there, a link or a directory, is left alone, and nothing there is no error.
pub fn remove_if_regular(path: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file()) {
        std::fs::remove_file(path)?;
    }
    Ok(())
}

/// Writes `content` to a new file beside `path` (mode 0644, never through a link) and renames
/// it over `path`: a reader sees the old file or the new one whole, never a half-written one.
pub fn replace_file(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.dynocap-{}", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)?;
        file.write_all(content)?;
        // The mode is exact whatever the agent's umask.
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn removal_never_follows_symlinks() {
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("keep"), "x").expect("write");
        let tree = tempfile::tempdir().expect("tempdir");
        let root = tree.path();
        std::fs::create_dir_all(root.join("a/b/c")).expect("mkdir");
        std::fs::write(root.join("a/b/c/f"), "x").expect("write");
        symlink(outside.path(), root.join("a/link")).expect("symlink");
        symlink(outside.path().join("keep"), root.join("file-link")).expect("symlink");

        let fd = open_dir_nofollow(root).expect("open");
        remove_contents(fd.as_fd()).expect("remove");
        assert_eq!(std::fs::read_dir(root).expect("read").count(), 0);
        assert!(outside.path().join("keep").exists());
    }

    #[test]
    fn open_dir_nofollow_refuses_symlinks_and_dotdot() {
        let tree = tempfile::tempdir().expect("tempdir");
        let root = tree.path();
        std::fs::create_dir(root.join("real")).expect("mkdir");
        symlink(root.join("real"), root.join("link")).expect("symlink");
        assert!(open_dir_nofollow(&root.join("real")).is_ok());
        assert!(open_dir_nofollow(&root.join("link")).is_err());
        assert!(open_dir_nofollow(&root.join("link/.")).is_err());
        assert!(open_dir_nofollow(&root.join("real/../real")).is_err());
        assert!(open_dir_nofollow(Path::new("relative")).is_err());
    }

    #[test]
    fn removal_depth_is_bounded() {
        let tree = tempfile::tempdir().expect("tempdir");
        let fd = open_dir_nofollow(tree.path()).expect("open");
        let mut dir = fd.try_clone().expect("dup");
        for _ in 0..MAX_REMOVE_DEPTH + 3 {
            nix::sys::stat::mkdirat(dir.as_fd(), c"d", Mode::from_bits_truncate(0o755))
                .expect("mkdir");
            dir = open_dir_at(dir.as_fd(), c"d").expect("open");
        }
        assert!(remove_contents(fd.as_fd()).is_err());
    }
}
