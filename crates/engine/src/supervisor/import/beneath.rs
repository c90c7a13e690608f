//! Opening paths beneath the project root without ever following a symlink.
//!
//! Every path the import touches is a relative path of plain components, resolved from a
//! descriptor of the project root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: a
//! symlink anywhere in the path — a directory in the middle, or the last component — is never
//! resolved. Where `openat2` is missing (Linux < 5.6) or filtered by seccomp, the same
//! guarantee comes from walking the path one `openat(O_NOFOLLOW)` at a time.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{fcntl, openat, openat2, readlinkat, FcntlArg, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};

use crate::model::import_notes::Special;

/// What a path names, as `lstat` would say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    File { executable: bool, size: u64 },
    Symlink,
    Dir,
    Special(Special),
}

pub(super) fn kind_of(stat: &FileStat) -> Kind {
    let format = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
    match format {
        SFlag::S_IFREG => Kind::File {
            executable: stat.st_mode & 0o100 != 0,
            size: u64::try_from(stat.st_size).unwrap_or(0),
        },
        SFlag::S_IFLNK => Kind::Symlink,
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFIFO => Kind::Special(Special::Fifo),
        SFlag::S_IFSOCK => Kind::Special(Special::Socket),
        SFlag::S_IFCHR => Kind::Special(Special::CharDevice),
        SFlag::S_IFBLK => Kind::Special(Special::BlockDevice),
        _ => Kind::Special(Special::Unknown),
    }
}

/// True for a non-empty relative path of plain components: no leading or doubled `/`, no
/// `.` or `..`, no NUL. The empty path (the root itself) is accepted by [`open`] separately.
pub(super) fn is_plain_relative(path: &[u8]) -> bool {
    !path.is_empty()
        && !path.contains(&0)
        && path
            .split(|b| *b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

const UNKNOWN: u8 = 0;
const AVAILABLE: u8 = 1;
const UNAVAILABLE: u8 = 2;
static OPENAT2: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Whether `openat2` works here, probed once on `dir`.
fn openat2_available(dir: BorrowedFd<'_>) -> bool {
    match OPENAT2.load(Ordering::Relaxed) {
        AVAILABLE => true,
        UNAVAILABLE => false,
        _ => {
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
            // ENOSYS: kernel too old; EPERM: a seccomp filter that does not know the call.
            // Any other answer (even an error) means the call itself exists.
            let works = !matches!(openat2(dir, ".", how), Err(Errno::ENOSYS | Errno::EPERM));
            OPENAT2.store(
                if works { AVAILABLE } else { UNAVAILABLE },
                Ordering::Relaxed,
            );
            works
        }
    }
}

/// How [`open`] resolves paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resolver {
    /// `openat2` where the kernel has it, else the walk.
    Auto,
    /// Always the component-by-component walk (tests use it to cover the fallback).
    #[cfg_attr(not(test), allow(dead_code))]
    Walk,
}

/// Opens `rel` beneath `root` with `flags` (plus `O_NOFOLLOW | O_CLOEXEC`, and `O_NOCTTY`),
/// never resolving a symlink. A symlink in the middle fails with `ELOOP`; a symlink as the
/// last component fails with `ELOOP` too, unless `flags` has `O_PATH`, which yields a
/// descriptor of the link itself. `rel` must be plain (see [`is_plain_relative`]) or empty
/// (the root itself); anything else is `EINVAL`.
pub(super) fn open(
    root: BorrowedFd<'_>,
    rel: &[u8],
    flags: OFlag,
    resolver: Resolver,
) -> Result<OwnedFd, Errno> {
    let mut flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    // openat2 refuses (EINVAL) any flag beside O_DIRECTORY/O_NOFOLLOW/O_CLOEXEC with O_PATH.
    if !flags.contains(OFlag::O_PATH) {
        flags |= OFlag::O_NOCTTY;
    }
    let rel: &[u8] = if rel.is_empty() {
        b"."
    } else if is_plain_relative(rel) {
        rel
    } else {
        return Err(Errno::EINVAL);
    };
    if resolver == Resolver::Auto && openat2_available(root) {
        let how = OpenHow::new().flags(flags).resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        let mut attempts = 0;
        loop {
            match openat2(root, rel, how) {
                // EAGAIN: a concurrent rename made the kernel unsure the lookup stayed beneath.
                Err(Errno::EAGAIN) if attempts < 8 => attempts += 1,
                result => return result,
            }
        }
    }
    open_by_walk(root, rel, flags)
}

/// The fallback: each directory component opened `O_PATH | O_DIRECTORY | O_NOFOLLOW` from the
/// previous one. Components are plain names, so the walk can neither climb out nor follow a
/// link; a symlinked directory is reported as `ELOOP` like `openat2` does.
fn open_by_walk(root: BorrowedFd<'_>, rel: &[u8], flags: OFlag) -> Result<OwnedFd, Errno> {
    let mut components = rel.split(|b| *b == b'/').peekable();
    let mut current: Option<OwnedFd> = None;
    while let Some(component) = components.next() {
        let dir = current.as_ref().map_or(root, AsFd::as_fd);
        if components.peek().is_none() {
            return openat(dir, component, flags, Mode::empty());
        }
        let step = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match openat(dir, component, step, Mode::empty()) {
            Ok(next) => current = Some(next),
            Err(Errno::ENOTDIR) => {
                let is_link = fstatat(dir, component, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| kind_of(&st) == Kind::Symlink);
                return Err(if is_link {
                    Errno::ELOOP
                } else {
                    Errno::ENOTDIR
                });
            }
            Err(err) => return Err(err),
        }
    }
    // `rel` is never empty, so the loop always returns.
    Err(Errno::EINVAL)
}

/// A path beneath the root, opened `O_PATH` without following it, and what it is.
pub(super) struct Probe {
    fd: OwnedFd,
    stat: FileStat,
}

impl Probe {
    pub(super) fn new(root: BorrowedFd<'_>, rel: &[u8], resolver: Resolver) -> Result<Self, Errno> {
        let fd = open(root, rel, OFlag::O_PATH, resolver)?;
        let stat = fstat(&fd)?;
        Ok(Self { fd, stat })
    }

    pub(super) fn kind(&self) -> Kind {
        kind_of(&self.stat)
    }

    pub(super) fn stat(&self) -> &FileStat {
        &self.stat
    }

    /// The target of the symlink this probe holds, byte for byte.
    pub(super) fn read_link(&self) -> Result<Vec<u8>, Errno> {
        use std::os::unix::ffi::OsStringExt;
        // An empty path reads the link an `O_PATH | O_NOFOLLOW` descriptor refers to.
        readlinkat(&self.fd, "").map(OsStringExt::into_vec)
    }
}

/// Why a regular file could not be opened for reading.
#[derive(Debug)]
pub(super) enum OpenFileError {
    /// The path now names something else, or was swapped between probing and opening.
    NotRegular,
    Errno(Errno),
}

/// Opens the regular file at `rel` for reading: probes it first (no open of a device or fifo
/// ever happens through a path that was one when probed), then opens it `O_RDONLY |
/// O_NONBLOCK` (a fifo swapped in meanwhile cannot block us) and checks it is still the very
/// inode probed.
pub(super) fn open_regular(
    root: BorrowedFd<'_>,
    rel: &[u8],
    resolver: Resolver,
) -> Result<(File, u64, bool), OpenFileError> {
    let probe = Probe::new(root, rel, resolver).map_err(OpenFileError::Errno)?;
    if !matches!(probe.kind(), Kind::File { .. }) {
        return Err(OpenFileError::NotRegular);
    }
    let fd = open(root, rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, resolver).map_err(
        |err| match err {
            // The last component became a symlink after the probe.
            Errno::ELOOP => OpenFileError::NotRegular,
            err => OpenFileError::Errno(err),
        },
    )?;
    let stat = fstat(&fd).map_err(OpenFileError::Errno)?;
    let same = stat.st_dev == probe.stat().st_dev && stat.st_ino == probe.stat().st_ino;
    match kind_of(&stat) {
        Kind::File { executable, size } if same => {
            // Regular files ignore O_NONBLOCK, but some filesystems (FUSE) do not: clear it.
            fcntl(&fd, FcntlArg::F_SETFL(OFlag::empty())).map_err(OpenFileError::Errno)?;
            Ok((File::from(fd), size, executable))
        }
        _ => Err(OpenFileError::NotRegular),
    }
}

/// The names in the directory `dir` (an `O_RDONLY | O_DIRECTORY` descriptor), `.` and `..`
/// left out. Reads through a duplicate, so `dir` stays usable (for `fstatat`) afterwards.
pub(super) fn read_dir_names(dir: &OwnedFd) -> Result<Vec<Vec<u8>>, Errno> {
    let raw = dir
        .try_clone()
        .map_err(|err| Errno::from_raw(err.raw_os_error().unwrap_or(libc::EIO)))?
        .into_raw_fd();
    // SAFETY: `raw` is an open descriptor this function owns (just duplicated, not shared with
    // any `OwnedFd`); on success the returned stream owns it and `closedir` below closes it.
    let stream = unsafe { libc::fdopendir(raw) };
    if stream.is_null() {
        let err = Errno::last();
        // SAFETY: fdopendir failed, so `raw` is still ours alone; this closes it exactly once.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        return Err(err);
    }
    let mut names = Vec::new();
    let result = loop {
        Errno::clear();
        // SAFETY: `stream` is a live stream from fdopendir, closed only after this loop, and
        // used by this thread alone.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            // NULL with errno unchanged is the end of the directory.
            break match Errno::last_raw() {
                0 => Ok(()),
                raw => Err(Errno::from_raw(raw)),
            };
        }
        // SAFETY: a non-NULL `entry` points to a dirent valid until the next readdir/closedir on
        // `stream`, and its `d_name` is NUL-terminated; the bytes are copied out right away.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    };
    // SAFETY: `stream` came from fdopendir and is closed exactly once, here; this also closes
    // `raw`. Its result is irrelevant for a descriptor only read from.
    unsafe { libc::closedir(stream) };
    result.map(|()| names)
}
