//! What the agent remembers of the private index between two diffs, so that a diff from the
//! journal reads none of it: which paths the index tracks, and a bound on its largest entry.
//! Reading and parsing the index (1.6 MB for 20,000 files) took 1.3 ms, twice a diff: to know
//! which changed paths are tracked, and after the update for the largest file.
//!
//! A memo holds for one index file: its device, inode, size and times. Git writes the index
//! whole under a new name and renames it into place, so a write by anything but the diff that
//! keeps the memo up to date (a whole-workspace scan, a `read-tree`, a failed diff's part of an
//! update) shows as another file, and the next diff reads the index again.
//!
//! The diff that updates the index with `git update-index` records what git did to each path
//! from what is on disk before and after git ran: a file or symlink is tracked, at its size;
//! nothing there is not. A path that changed while git looked at it (its kind, inode, change
//! time or size differ between the two looks) could have been seen either way by git, and
//! voids the memo: the next diff reads the index.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};

use crate::fsutil;
use crate::git_index::{self, NotAnIndex};
use crate::statedir::BASELINE_INDEX;

/// The largest private index read (about 80 bytes a file): past it, the diff scans.
const MAX_INDEX_BYTES: u64 = 1 << 30;

/// The memos of the last diffs, for the next ones: one per private directory (an agent has
/// one; its tests have many at once).
static REMEMBERED: Mutex<Vec<Memo>> = Mutex::new(Vec::new());
/// The most memos kept: the oldest goes first.
const KEPT: usize = 4;

/// What a diff knows of the private index.
#[derive(Debug)]
pub struct Memo {
    /// The private directory (device, inode) whose index this describes.
    dir: (u64, u64),
    /// The index file this describes.
    file: Stamp,
    /// Every path the index lists.
    tracked: BTreeSet<Vec<u8>>,
    /// No entry is larger: exact when read from the index, an upper bound after updates
    /// (a path updated to a smaller file leaves it where it was).
    largest: u64,
}

/// What tells one index file from another: git never rewrites one in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(stat: &FileStat) -> Stamp {
        Stamp {
            dev: stat.st_dev,
            ino: stat.st_ino,
            size: stat.st_size,
            mtime: (stat.st_mtime, stat.st_mtime_nsec),
            ctime: (stat.st_ctime, stat.st_ctime_nsec),
        }
    }
}

/// What one path of the workspace is, as far as a memo cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Nothing there (or something on the way is not a directory): git removes its entry.
    Gone,
    /// A file or symlink of `size` bytes: git tracks it.
    Entry {
        ino: u64,
        ctime: (i64, i64),
        size: u64,
    },
    /// A directory, or a path the agent cannot look at without following a symlink: git
    /// fails or skips it, and the memo cannot say.
    Other,
}

/// Why the memo of the private index could not be had.
#[derive(Debug, thiserror::Error)]
pub enum MemoError {
    #[error("cannot look at the private directory: {0}")]
    Directory(#[source] Errno),
    #[error("cannot look at the private index: {0}")]
    Stamp(#[source] Errno),
    #[error("cannot read the private index: {0}")]
    Open(#[source] Errno),
    #[error("cannot read the private index: {0}")]
    Read(#[source] std::io::Error),
    #[error(transparent)]
    NotAnIndex(#[from] NotAnIndex),
}

/// The (device, inode) of the directory `private`.
fn dir_of(private: BorrowedFd<'_>) -> Result<(u64, u64), MemoError> {
    let stat = fstat(private).map_err(MemoError::Directory)?;
    Ok((stat.st_dev, stat.st_ino))
}

/// The stamp of the index file in `private` now.
fn index_stamp(private: BorrowedFd<'_>) -> Result<Stamp, MemoError> {
    fstatat(
        private,
        BASELINE_INDEX,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map(|stat| Stamp::of(&stat))
    .map_err(MemoError::Stamp)
}

/// What each of `paths` (workspace-relative) is now.
pub fn look(workspace: BorrowedFd<'_>, paths: &[Vec<u8>]) -> Vec<Seen> {
    paths
        .iter()
        .map(
            |path| match fsutil::open_beneath(workspace, OsStr::from_bytes(path), OFlag::O_PATH) {
                Ok(fd) => match fstat(&fd) {
                    Ok(stat) => {
                        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
                        if kind == SFlag::S_IFREG || kind == SFlag::S_IFLNK {
                            Seen::Entry {
                                ino: stat.st_ino,
                                ctime: (stat.st_ctime, stat.st_ctime_nsec),
                                size: u64::try_from(stat.st_size).unwrap_or(u64::MAX),
                            }
                        } else {
                            Seen::Other
                        }
                    }
                    Err(_) => Seen::Other,
                },
                Err(Errno::ENOENT | Errno::ENOTDIR) => Seen::Gone,
                Err(_) => Seen::Other,
            },
        )
        .collect()
}

impl Memo {
    /// The memo of the private index (in the directory `private`) as the file is now: the
    /// last diff's if the file is the one it kept, else read from the file. Taken out: a diff
    /// that fails before [`Memo::keep`] leaves none, and the next diff reads the index.
    pub fn current(private: BorrowedFd<'_>) -> Result<Memo, MemoError> {
        let dir = dir_of(private)?;
        let remembered = {
            let mut memos = REMEMBERED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            memos
                .iter()
                .position(|memo| memo.dir == dir)
                .map(|at| memos.remove(at))
        };
        let now = index_stamp(private)?;
        match remembered {
            Some(memo) if memo.file == now => Ok(memo),
            _ => Memo::read(private, dir),
        }
    }

    fn read(private: BorrowedFd<'_>, dir: (u64, u64)) -> Result<Memo, MemoError> {
        let fd = openat(
            private,
            BASELINE_INDEX,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(MemoError::Open)?;
        // Stamped from the descriptor read: the bytes and the stamp are of one file.
        let stat = fstat(&fd).map_err(MemoError::Open)?;
        let len = u64::try_from(stat.st_size).unwrap_or(0);
        // Read in one go: growing the buffer as it filled took most of the time.
        let mut bytes =
            Vec::with_capacity(usize::try_from(len.min(MAX_INDEX_BYTES)).unwrap_or(0) + 1);
        File::from(fd)
            .take(MAX_INDEX_BYTES)
            .read_to_end(&mut bytes)
            .map_err(MemoError::Read)?;
        // The private repository is SHA-1 (see `record_baseline`).
        let survey = git_index::every_path(&bytes, 20)?;
        Ok(Memo {
            dir,
            file: Stamp::of(&stat),
            tracked: survey.tracked,
            largest: survey.largest,
        })
    }

    /// Which of `candidates` the index tracks.
    pub fn tracked_of(&self, candidates: &BTreeSet<Vec<u8>>) -> BTreeSet<Vec<u8>> {
        candidates
            .iter()
            .filter(|path| self.tracked.contains(*path))
            .cloned()
            .collect()
    }

    /// No entry of the private index (in the directory `private`) is larger than this; the
    /// memo is kept for the next diff.
    pub fn largest_entry(private: BorrowedFd<'_>) -> Result<u64, MemoError> {
        let memo = Memo::current(private)?;
        let largest = memo.largest;
        memo.keep(private)?;
        Ok(largest)
    }

    /// Records what `git update-index --add --remove` did to `paths`, from what each was
    /// `before` and `after` git ran ([`look`]). `None` when a path changed meanwhile, or is
    /// something git does not track: the memo cannot tell what git saw.
    pub fn updated(mut self, paths: &[Vec<u8>], before: &[Seen], after: &[Seen]) -> Option<Memo> {
        if paths.len() != before.len() || paths.len() != after.len() {
            return None;
        }
        for ((path, before), after) in paths.iter().zip(before).zip(after) {
            match (before, after) {
                (Seen::Gone, Seen::Gone) => {
                    self.tracked.remove(path);
                }
                (Seen::Entry { .. }, Seen::Entry { size, .. }) if before == after => {
                    self.tracked.insert(path.clone());
                    self.largest = self.largest.max(*size);
                }
                _ => return None,
            }
        }
        Some(self)
    }

    /// Keeps this memo for the next diff, as the memo of the index file now in `private`
    /// (the one the update just wrote).
    pub fn keep(mut self, private: BorrowedFd<'_>) -> Result<(), MemoError> {
        self.dir = dir_of(private)?;
        self.file = index_stamp(private)?;
        let mut memos = REMEMBERED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        memos.retain(|memo| memo.dir != self.dir);
        if memos.len() >= KEPT {
            memos.remove(0);
        }
        memos.push(self);
        Ok(())
    }

    /// The paths the memo kept for `private` says its index tracks, if one is kept for the
    /// index file there now.
    #[cfg(test)]
    pub fn remembered_paths(private: BorrowedFd<'_>) -> Option<BTreeSet<Vec<u8>>> {
        let (dir, now) = (dir_of(private).ok()?, index_stamp(private).ok()?);
        REMEMBERED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|memo| memo.dir == dir && memo.file == now)
            .map(|memo| memo.tracked.clone())
    }

    /// Every path the index in `private` lists, read now.
    #[cfg(test)]
    pub fn paths_in_index(private: BorrowedFd<'_>) -> BTreeSet<Vec<u8>> {
        let dir = dir_of(private).expect("the private directory");
        Memo::read(private, dir).expect("the index").tracked
    }
}
