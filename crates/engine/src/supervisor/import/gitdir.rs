//! Where a work tree's git directory really is, checked before any git runs on it.
//!
//! Git follows pointers a repository holds: a `.git` *file* (`gitdir: PATH`, linked worktrees
//! and submodules), a `commondir` file in that git directory, `objects/info/alternates` and
//! `objects/info/http-alternates`, and any symlink inside the git directory. Each could make an
//! import read (and export to the guest) a repository outside the project, the user's home
//! included. So before git runs, every git directory the import uses must lie beneath the
//! project root, reached with no symlink, hold no symlink, and name no alternates; otherwise
//! the import refuses, naming the file and where it points.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat};

use super::beneath::{self, Kind, Probe, Resolver};
use super::{join, ImportError};

/// A pointer file larger than this is not one git would write; refused unread.
const MAX_POINTER_FILE: u64 = 4096;

/// The files naming other object stores: git has no switch to ignore them, so they refuse.
const ALTERNATES: [&[u8]; 2] = [b"objects/info/alternates", b"objects/info/http-alternates"];

/// Checks the git directory of the work tree at `dir` (relative to the root; empty for the
/// root), whose `.git` is a directory or a regular file. `root` is the root's path, for
/// messages and for absolute `gitdir:` paths.
pub(super) fn check(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    dir: &[u8],
    resolver: Resolver,
) -> Result<(), ImportError> {
    let dot_git = join(dir, b".git");
    let probe =
        Probe::new(root_fd, &dot_git, resolver).map_err(|err| read_error(root, &dot_git, err))?;
    let git_dir = match probe.kind() {
        Kind::Dir => dot_git,
        Kind::File { .. } => {
            let text = read_pointer(root_fd, root, &dot_git, resolver)?;
            let Some(target) = text.strip_prefix(b"gitdir: ") else {
                // Not a gitdir file: git refuses it itself, reading nothing through it.
                return Ok(());
            };
            resolve(root_fd, root, dir, target, resolver)
                .ok_or_else(|| outside(root, &dot_git, target))?
        }
        // A symlinked `.git` is never taken for a repository (see `Lister::git_dir_of`).
        _ => return Ok(()),
    };
    let mut stores = vec![git_dir.clone()];
    let commondir = join(&git_dir, b"commondir");
    match Probe::new(root_fd, &commondir, resolver) {
        Ok(probe) if matches!(probe.kind(), Kind::File { .. }) => {
            let target = read_pointer(root_fd, root, &commondir, resolver)?;
            let common = resolve(root_fd, root, &git_dir, &target, resolver)
                .ok_or_else(|| outside(root, &commondir, &target))?;
            stores.push(common);
        }
        Ok(_) => {
            return Err(ImportError::GitLayout {
                path: root.join(OsStr::from_bytes(&commondir)),
                why: "is not a regular file".into(),
            })
        }
        Err(Errno::ENOENT) => {}
        Err(err) => return Err(read_error(root, &commondir, err)),
    }
    for store in &stores {
        // Symlinks first: with none, the probes below cannot be redirected.
        no_symlinks(root_fd, root, store, resolver)?;
        for name in ALTERNATES {
            let file = join(store, name);
            match Probe::new(root_fd, &file, resolver) {
                Err(Errno::ENOENT | Errno::ENOTDIR) => {}
                Ok(_) => return Err(ImportError::Alternates(root.join(OsStr::from_bytes(&file)))),
                Err(err) => return Err(read_error(root, &file, err)),
            }
        }
    }
    Ok(())
}

/// The first line of a small pointer file, without its line end.
fn read_pointer(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    rel: &[u8],
    resolver: Resolver,
) -> Result<Vec<u8>, ImportError> {
    let layout = |why: &str| ImportError::GitLayout {
        path: root.join(OsStr::from_bytes(rel)),
        why: why.into(),
    };
    let (file, size, _) = beneath::open_regular(root_fd, rel, resolver)
        .map_err(|_| layout("cannot be opened as a regular file beneath the project"))?;
    if size > MAX_POINTER_FILE {
        return Err(layout("is too large for a git pointer file"));
    }
    let mut text = Vec::new();
    file.take(MAX_POINTER_FILE)
        .read_to_end(&mut text)
        .map_err(|source| ImportError::Read {
            path: root.join(OsStr::from_bytes(rel)),
            source,
        })?;
    let line = text.split(|b| *b == b'\n').next().unwrap_or_default();
    Ok(line.strip_suffix(b"\r").unwrap_or(line).to_vec())
}

/// `target` (absolute, or relative to `base`) as a plain path beneath the root, when the
/// kernel resolving it the way git will ends there: every directory it passes, and the
/// directory it names, are real directories beneath the root (no symlink), and an absolute
/// path starts with the root's own path. `None` otherwise.
fn resolve(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    base: &[u8],
    target: &[u8],
    resolver: Resolver,
) -> Option<Vec<u8>> {
    let relative: Vec<u8> = if target.starts_with(b"/") {
        let root = root.as_os_str().as_bytes();
        let rest = target.strip_prefix(root)?;
        if rest.is_empty() {
            Vec::new()
        } else {
            rest.strip_prefix(b"/")?.to_vec()
        }
    } else {
        join(base, target)
    };
    let is_dir = |rel: &[u8]| {
        beneath::open(root_fd, rel, OFlag::O_PATH | OFlag::O_DIRECTORY, resolver).is_ok()
    };
    // `..` is resolved by the kernel from the directory before it: only plain directories
    // beneath the root make that the lexical parent, so each is checked before climbing.
    let mut parts: Vec<&[u8]> = Vec::new();
    for component in relative.split(|b| *b == b'/') {
        match component {
            b"" | b"." => {}
            b".." => {
                if !is_dir(&parts.join(&b'/')) {
                    return None;
                }
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    let resolved = parts.join(&b'/');
    is_dir(&resolved).then_some(resolved)
}

/// Fails if the git directory `store` holds a symlink anywhere: git would follow it, maybe
/// out of the project.
fn no_symlinks(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    store: &[u8],
    resolver: Resolver,
) -> Result<(), ImportError> {
    let mut visited = HashSet::new();
    let mut pending = vec![store.to_vec()];
    while let Some(dir_path) = pending.pop() {
        let dir = beneath::open(
            root_fd,
            &dir_path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            resolver,
        )
        .map_err(|err| read_error(root, &dir_path, err))?;
        let stat = fstat(&dir).map_err(|err| read_error(root, &dir_path, err))?;
        if !visited.insert((stat.st_dev, stat.st_ino)) {
            continue;
        }
        for name in beneath::read_dir_names(&dir).map_err(|err| read_error(root, &dir_path, err))? {
            let path = join(&dir_path, &name);
            let stat = match fstatat(&dir, name.as_slice(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                // Git removes lock files and temporary objects as it works.
                Err(Errno::ENOENT) => continue,
                Err(err) => return Err(read_error(root, &path, err)),
            };
            match beneath::kind_of(&stat) {
                Kind::Dir => pending.push(path),
                Kind::Symlink => {
                    return Err(ImportError::GitLayout {
                        path: root.join(OsStr::from_bytes(&path)),
                        why: "is a symlink inside the git directory (git would follow it, \
                              maybe out of the project)"
                            .into(),
                    })
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn outside(root: &Path, file: &[u8], target: &[u8]) -> ImportError {
    ImportError::GitOutside {
        file: root.join(OsStr::from_bytes(file)),
        target: String::from_utf8_lossy(target).escape_default().to_string(),
        root: root.to_path_buf(),
    }
}

fn read_error(root: &Path, rel: &[u8], err: Errno) -> ImportError {
    ImportError::Read {
        path: root.join(OsStr::from_bytes(rel)),
        source: err.into(),
    }
}
