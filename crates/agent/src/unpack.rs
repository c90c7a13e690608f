//! `Unpack`: the host's tar stream becomes the workspace, on a blocking thread reading the
//! stream's input queue.
//!
//! The tar crate is used for what it is good at, decoding headers (checksums, GNU numeric
//! fields), in raw mode: GNU long-name records are handled here, with a size bound, because the
//! crate's own handling reads them into memory whatever their size. Nothing of the crate's
//! `unpack` is used: every file is created here, relative to a directory descriptor, with
//! `O_NOFOLLOW | O_EXCL`, so no entry can land outside the destination or through a symlink,
//! whatever the archive says.
//!
//! While unpacking, the destination is owned by the agent with mode 0700, so the sandbox user
//! cannot touch the half-made tree; it is handed to the owner (0755) only when complete. Any
//! failure, cancel included, removes what was unpacked.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};

use dynocap_proto::{Response, UnpackRequest};
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{fchown, fchownat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};
use tar::EntryType;

use crate::fsutil;
use crate::input::{InputReader, InputState};

/// Longest path (and symlink target) accepted, in bytes: Linux's PATH_MAX less the NUL.
pub const MAX_PATH_BYTES: usize = 4095;
/// Most components a path may have, so that cleanup can always remove the tree.
pub const MAX_DEPTH: usize = fsutil::MAX_REMOVE_DEPTH;
/// Longest path component (NAME_MAX).
const MAX_NAME: usize = 255;
/// Zero bytes accepted after the end-of-archive marker (tar pads to its record size).
const MAX_TRAILER: u64 = 1024 * 1024;
const BLOCK: u64 = 512;

/// Why an unpack stopped.
#[derive(Debug)]
enum Failure {
    /// The archive holds something that is refused.
    Refused(Refusal),
    /// Reading or decoding the stream failed.
    Stream(io::Error),
    /// The stream ended before the end-of-archive blocks.
    Truncated,
    TooBig,
    Cancelled,
}

/// Why an `Unpack` failed; nothing of the archive is left behind then.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("destination {0:?} must be an absolute path")]
    RelativeDest(String),
    #[error("destination {0:?} has a '..' component")]
    DotDotInDest(String),
    #[error("destination {0:?} cannot be /")]
    RootDest(String),
    #[error("cannot open the parent of {dest}: {source}")]
    OpenParent { dest: String, source: io::Error },
    #[error("{0}")]
    DestName(#[source] io::Error),
    #[error("cannot create {dest}: {source}")]
    CreateDest { dest: String, source: Errno },
    #[error("destination {0} exists and is not a directory")]
    DestNotADirectory(String),
    #[error("cannot open {dest}: {source}")]
    OpenDest { dest: String, source: Errno },
    #[error("cannot inspect {dest}: {source}")]
    InspectDest { dest: String, source: Errno },
    #[error("cannot list {dest}: {source}")]
    ListDest { dest: String, source: Errno },
    #[error("destination {0} exists and is not empty")]
    DestNotEmpty(String),
    #[error("cannot take hold of {dest}: {source}")]
    TakeHold { dest: String, source: Errno },
    #[error("{0}")]
    DupDest(#[source] io::Error),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("the archive holds more than {0} bytes")]
    TooBig(u64),
    #[error("the import stream ended early")]
    Truncated,
    #[error("the import was cancelled")]
    Cancelled,
    #[error("the import stream is not a valid tar archive: {0}")]
    NotTar(#[source] io::Error),
    #[error("cannot hand {dest} to its owner: {source}")]
    HandOver { dest: String, source: Errno },
}

/// What in the archive is refused, and why; entries are named by their path in it.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the import stream has data after the end of the archive")]
    DataAfterEnd,
    #[error("the import stream has more than {MAX_TRAILER} bytes after the end of the archive")]
    LongTrailer,
    #[error("the archive has two long-name records for one entry")]
    TwoLongNames,
    #[error("the archive ends with a long-name record that describes no entry")]
    DanglingLongName,
    #[error("the archive has a long name of {0} bytes; the limit is {MAX_PATH_BYTES}")]
    LongNameTooLong(u64),
    #[error("the archive has a long name with a NUL byte inside")]
    NulInLongName,
    /// An entry of a kind the unpacker does not make (`what` says which, and why).
    #[error("{} is {what}", shown(path))]
    Kind { path: Vec<u8>, what: &'static str },
    #[error("{} is of unsupported type {kind:?}", shown(path))]
    UnsupportedType { path: Vec<u8>, kind: char },
    #[error("{} contains a NUL byte", shown(.0))]
    NulInPath(Vec<u8>),
    #[error("{} is an absolute path", shown(.0))]
    Absolute(Vec<u8>),
    #[error("{} is longer than {MAX_PATH_BYTES} bytes", shown(.0))]
    PathTooLong(Vec<u8>),
    #[error("{} has a '..' component", shown(.0))]
    DotDot(Vec<u8>),
    #[error("{} has a component longer than {MAX_NAME} bytes", shown(.0))]
    NameTooLong(Vec<u8>),
    #[error("{} is nested deeper than {MAX_DEPTH} directories", shown(.0))]
    TooDeep(Vec<u8>),
    #[error("{} lies beneath {}, which is {what}", shown(path), shown(prefix))]
    BeneathNonDirectory {
        path: Vec<u8>,
        prefix: Vec<u8>,
        what: &'static str,
    },
    #[error("internal error: no parent")]
    NoParent,
    #[error("{} clashes with an entry that is not a directory", shown(.0))]
    Clash(Vec<u8>),
    #[error("{} appears twice in the archive", shown(.0))]
    Twice(Vec<u8>),
    #[error("symlink {} has no target", shown(.0))]
    NoTarget(Vec<u8>),
    #[error("symlink {} has a target longer than {MAX_PATH_BYTES} bytes", shown(.0))]
    TargetTooLong(Vec<u8>),
    #[error("symlink {} has a NUL byte in its target", shown(.0))]
    NulInTarget(Vec<u8>),
    #[error("cannot write {}: {source}", shown(path))]
    Write { path: Vec<u8>, source: io::Error },
    /// A system call making an entry failed.
    #[error("cannot unpack {}: {source}", shown(path))]
    Io { path: Vec<u8>, source: io::Error },
}

/// Handles `Unpack` (blocking). `cancelled` is raised by the stream's task on `Cancel`.
pub fn unpack(
    req: &UnpackRequest,
    input: InputReader,
    cancelled: &AtomicBool,
) -> Result<Response, UnpackError> {
    let dest = Path::new(&req.dest);
    if !dest.is_absolute() {
        return Err(UnpackError::RelativeDest(req.dest.clone()));
    }
    if dest.components().any(|c| c == Component::ParentDir) {
        return Err(UnpackError::DotDotInDest(req.dest.clone()));
    }
    let (Some(parent), Some(name)) = (dest.parent(), dest.file_name()) else {
        return Err(UnpackError::RootDest(req.dest.clone()));
    };
    let parent = fsutil::open_dir_nofollow(parent).map_err(|source| UnpackError::OpenParent {
        dest: req.dest.clone(),
        source,
    })?;
    let name = fsutil::cstring(name).map_err(UnpackError::DestName)?;
    let created = match mkdirat(parent.as_fd(), name.as_c_str(), Mode::S_IRWXU) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(source) => {
            return Err(UnpackError::CreateDest {
                dest: req.dest.clone(),
                source,
            })
        }
    };
    let root = fsutil::open_dir_at(parent.as_fd(), &name).map_err(|err| match err {
        Errno::ELOOP | Errno::ENOTDIR => UnpackError::DestNotADirectory(req.dest.clone()),
        source => UnpackError::OpenDest {
            dest: req.dest.clone(),
            source,
        },
    })?;
    let original = fstat(root.as_fd()).map_err(|source| UnpackError::InspectDest {
        dest: req.dest.clone(),
        source,
    })?;
    if !created {
        let names = fsutil::list_dir(root.as_fd()).map_err(|source| UnpackError::ListDest {
            dest: req.dest.clone(),
            source,
        })?;
        if !names.is_empty() {
            return Err(UnpackError::DestNotEmpty(req.dest.clone()));
        }
    }
    // Keep everyone else out of the half-made tree.
    let locked = fchown(
        root.as_fd(),
        Some(nix::unistd::geteuid()),
        Some(nix::unistd::getegid()),
    )
    .and_then(|()| fchmod(root.as_fd(), Mode::S_IRWXU));
    if let Err(source) = locked {
        if created {
            let _ = unlinkat(parent.as_fd(), name.as_c_str(), UnlinkatFlags::RemoveDir);
        }
        return Err(UnpackError::TakeHold {
            dest: req.dest.clone(),
            source,
        });
    }

    let mut unpacker = Unpacker {
        root: root.try_clone().map_err(UnpackError::DupDest)?,
        owner: (Uid::from_raw(req.owner_uid), Gid::from_raw(req.owner_gid)),
        max_bytes: req.max_bytes,
        files: 0,
        bytes: 0,
        cancelled,
        cache: None,
        buf: vec![0; 64 * 1024],
    };
    let mut archive = tar::Archive::new(input);
    let outcome = unpacker.run(&mut archive);
    let mut input = archive.into_inner();
    let outcome = outcome.and_then(|()| finish_stream(&mut input));
    let failed = outcome.err().map(|failure| {
        if input.aborted() || cancelled.load(Ordering::Relaxed) {
            return UnpackError::Cancelled;
        }
        match failure {
            Failure::Refused(refusal) => UnpackError::Refused(refusal),
            Failure::TooBig => UnpackError::TooBig(req.max_bytes),
            Failure::Truncated => UnpackError::Truncated,
            Failure::Cancelled => UnpackError::Cancelled,
            Failure::Stream(_) if input.state() == InputState::Ended => UnpackError::Truncated,
            Failure::Stream(err) => UnpackError::NotTar(err),
        }
    });
    // Closing the queue lets the frame reader drop what the host still sends.
    drop(input);
    let (files, bytes) = (unpacker.files, unpacker.bytes);
    drop(unpacker);

    if let Some(failed) = failed {
        let removed = fsutil::remove_contents(root.as_fd());
        let restored = if created {
            drop(root);
            unlinkat(parent.as_fd(), name.as_c_str(), UnlinkatFlags::RemoveDir)
        } else {
            fchown(
                root.as_fd(),
                Some(Uid::from_raw(original.st_uid)),
                Some(Gid::from_raw(original.st_gid)),
            )
            .and_then(|()| {
                fchmod(
                    root.as_fd(),
                    Mode::from_bits_truncate(original.st_mode & 0o7777),
                )
            })
        };
        if let Err(err) = removed {
            log!(
                "cleaning up the failed unpack into {} failed: {err}",
                req.dest
            );
        }
        if let Err(err) = restored {
            log!("restoring {} after a failed unpack failed: {err}", req.dest);
        }
        return Err(failed);
    }
    let (uid, gid) = (Uid::from_raw(req.owner_uid), Gid::from_raw(req.owner_gid));
    fchown(root.as_fd(), Some(uid), Some(gid))
        .and_then(|()| fchmod(root.as_fd(), dir_mode()))
        .map_err(|source| UnpackError::HandOver {
            dest: req.dest.clone(),
            source,
        })?;
    Ok(Response::Unpacked { files, bytes })
}

fn dir_mode() -> Mode {
    Mode::from_bits_truncate(0o755)
}

/// Reads what follows the first end-of-archive block: it must be zeros, at least one more
/// block of them, then the host's `Eof`.
fn finish_stream(input: &mut InputReader) -> Result<(), Failure> {
    if input.state() == InputState::Ended {
        // The archive reader met the end of the stream where a header should have been.
        return Err(Failure::Truncated);
    }
    let mut buf = [0_u8; 8192];
    let mut trailing: u64 = 0;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(Failure::Stream(err)),
        };
        if buf[..n].iter().any(|&b| b != 0) {
            return Err(Failure::Refused(Refusal::DataAfterEnd));
        }
        trailing += u64::try_from(n).unwrap_or(u64::MAX);
        if trailing > MAX_TRAILER {
            return Err(Failure::Refused(Refusal::LongTrailer));
        }
    }
    if trailing < BLOCK {
        return Err(Failure::Truncated);
    }
    Ok(())
}

struct Unpacker<'a> {
    root: OwnedFd,
    owner: (Uid, Gid),
    max_bytes: u64,
    files: u64,
    bytes: u64,
    cancelled: &'a AtomicBool,
    /// The directory the previous entry went into, by its relative path.
    cache: Option<(Vec<u8>, OwnedFd)>,
    buf: Vec<u8>,
}

/// An entry's path for messages.
fn shown(path: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(path))
}

impl Unpacker<'_> {
    fn check_cancel(&self) -> Result<(), Failure> {
        if self.cancelled.load(Ordering::Relaxed) {
            Err(Failure::Cancelled)
        } else {
            Ok(())
        }
    }

    fn run<R: Read>(&mut self, archive: &mut tar::Archive<R>) -> Result<(), Failure> {
        let entries = archive.entries().map_err(Failure::Stream)?.raw(true);
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        for entry in entries {
            self.check_cancel()?;
            let mut entry = entry.map_err(Failure::Stream)?;
            let kind = entry.header().entry_type();
            match kind {
                EntryType::GNULongName | EntryType::GNULongLink => {
                    let slot = if kind == EntryType::GNULongName {
                        &mut long_name
                    } else {
                        &mut long_link
                    };
                    if slot.is_some() {
                        return Err(Failure::Refused(Refusal::TwoLongNames));
                    }
                    *slot = Some(read_long_name(&mut entry)?);
                    continue;
                }
                _ => {}
            }
            let path = match long_name.take() {
                Some(path) => path,
                None => entry.path_bytes().into_owned(),
            };
            let link = match long_link.take() {
                Some(link) => Some(link),
                None => entry.link_name_bytes().map(|l| l.into_owned()),
            };
            self.entry(&mut entry, kind, &path, link)?;
        }
        if long_name.is_some() || long_link.is_some() {
            return Err(Failure::Refused(Refusal::DanglingLongName));
        }
        Ok(())
    }

    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        kind: EntryType,
        path: &[u8],
        link: Option<Vec<u8>>,
    ) -> Result<(), Failure> {
        let refuse = |what: &'static str| {
            Err(Failure::Refused(Refusal::Kind {
                path: path.to_vec(),
                what,
            }))
        };
        match kind {
            EntryType::Directory | EntryType::Regular | EntryType::Symlink => {}
            EntryType::Link => return refuse("a hard link, which is not supported"),
            EntryType::Char | EntryType::Block => return refuse("a device, which is refused"),
            EntryType::Fifo => return refuse("a FIFO, which is refused"),
            EntryType::GNUSparse => return refuse("a sparse file, which is not supported"),
            EntryType::XHeader | EntryType::XGlobalHeader => {
                return refuse("a pax header; pax archives are not supported")
            }
            other => {
                return Err(Failure::Refused(Refusal::UnsupportedType {
                    path: path.to_vec(),
                    kind: char::from(other.as_byte()),
                }))
            }
        }
        let parts = split_path(path)?;
        let Some((last, dirs)) = parts.split_last() else {
            // `./`: the destination itself.
            return if kind == EntryType::Directory {
                Ok(())
            } else {
                refuse("an entry with an empty path")
            };
        };
        let name =
            CString::new(*last).map_err(|_| Failure::Refused(Refusal::NulInPath(path.to_vec())))?;
        match kind {
            EntryType::Directory => self.make_dir(path, dirs, &parts, &name),
            EntryType::Regular => self.make_file(entry, path, dirs, &name),
            _ => self.make_symlink(path, dirs, &name, link),
        }
    }

    fn count(&mut self, bytes: u64) -> Result<(), Failure> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.max_bytes {
            return Err(Failure::TooBig);
        }
        Ok(())
    }

    fn chown(&self, fd: &OwnedFd) -> nix::Result<()> {
        fchown(fd.as_fd(), Some(self.owner.0), Some(self.owner.1))
    }

    /// The directory holding an entry, found (or created, 0755, owned) one component at a
    /// time from the destination without following any symlink.
    fn parent(&mut self, path: &[u8], dirs: &[&[u8]]) -> Result<&OwnedFd, Failure> {
        if dirs.is_empty() {
            return Ok(&self.root);
        }
        let key = dirs.join(&b'/');
        if !matches!(&self.cache, Some((cached, _)) if *cached == key) {
            let mut current = self.root.try_clone().map_err(io_refused(path))?;
            for (depth, dir) in dirs.iter().enumerate() {
                let name = CString::new(*dir)
                    .map_err(|_| Failure::Refused(Refusal::NulInPath(path.to_vec())))?;
                current = match fsutil::open_dir_at(current.as_fd(), &name) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT) => self.create_dir(&current, &name, path)?,
                    Err(Errno::ELOOP | Errno::ENOTDIR) => {
                        let prefix = dirs[..=depth].join(&b'/');
                        let is_link = fstatat(
                            current.as_fd(),
                            name.as_c_str(),
                            AtFlags::AT_SYMLINK_NOFOLLOW,
                        )
                        .is_ok_and(|st| {
                            SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK
                        });
                        let what = if is_link {
                            "a symlink"
                        } else {
                            "not a directory"
                        };
                        return Err(Failure::Refused(Refusal::BeneathNonDirectory {
                            path: path.to_vec(),
                            prefix,
                            what,
                        }));
                    }
                    Err(err) => return Err(io_refused(path)(err.into())),
                };
            }
            self.cache = Some((key, current));
        }
        match &self.cache {
            Some((_, fd)) => Ok(fd),
            None => Err(Failure::Refused(Refusal::NoParent)),
        }
    }

    fn create_dir(&self, parent: &OwnedFd, name: &CStr, path: &[u8]) -> Result<OwnedFd, Failure> {
        match mkdirat(parent.as_fd(), name, Mode::S_IRWXU) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(err) => return Err(io_refused(path)(err.into())),
        }
        let fd = fsutil::open_dir_at(parent.as_fd(), name).map_err(|err| match err {
            Errno::ELOOP | Errno::ENOTDIR => Failure::Refused(Refusal::Clash(path.to_vec())),
            err => io_refused(path)(err.into()),
        })?;
        self.chown(&fd)
            .and_then(|()| fchmod(fd.as_fd(), dir_mode()))
            .map_err(|err| io_refused(path)(err.into()))?;
        Ok(fd)
    }

    fn make_dir(
        &mut self,
        path: &[u8],
        dirs: &[&[u8]],
        parts: &[&[u8]],
        name: &CStr,
    ) -> Result<(), Failure> {
        let parent = self
            .parent(path, dirs)?
            .try_clone()
            .map_err(io_refused(path))?;
        let fd = self.create_dir(&parent, name, path)?;
        // Entries come directory first, then what it holds.
        self.cache = Some((parts.join(&b'/'), fd));
        Ok(())
    }

    fn make_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        path: &[u8],
        dirs: &[&[u8]],
        name: &CStr,
    ) -> Result<(), Failure> {
        let size = entry.size();
        self.count(size)?;
        let mode = entry.header().mode().map_err(Failure::Stream)?;
        let mode = Mode::from_bits_truncate(if mode & 0o111 != 0 { 0o755 } else { 0o644 });
        let parent = self.parent(path, dirs)?;
        let fd = openat(
            parent.as_fd(),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(|err| match err {
            Errno::EEXIST => Failure::Refused(Refusal::Twice(path.to_vec())),
            err => io_refused(path)(err.into()),
        })?;
        let mut file = File::from(fd);
        let mut copied: u64 = 0;
        loop {
            self.check_cancel()?;
            let n = match entry.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(Failure::Stream(err)),
            };
            file.write_all(&self.buf[..n]).map_err(|source| {
                Failure::Refused(Refusal::Write {
                    path: path.to_vec(),
                    source,
                })
            })?;
            copied += u64::try_from(n).unwrap_or(u64::MAX);
        }
        if copied != size {
            return Err(Failure::Truncated);
        }
        let fd = OwnedFd::from(file);
        self.chown(&fd)
            .and_then(|()| fchmod(fd.as_fd(), mode))
            .map_err(|err| io_refused(path)(err.into()))?;
        self.files += 1;
        Ok(())
    }

    fn make_symlink(
        &mut self,
        path: &[u8],
        dirs: &[&[u8]],
        name: &CStr,
        link: Option<Vec<u8>>,
    ) -> Result<(), Failure> {
        let target = link
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Failure::Refused(Refusal::NoTarget(path.to_vec())))?;
        if target.len() > MAX_PATH_BYTES {
            return Err(Failure::Refused(Refusal::TargetTooLong(path.to_vec())));
        }
        let target = CString::new(target)
            .map_err(|_| Failure::Refused(Refusal::NulInTarget(path.to_vec())))?;
        self.count(u64::try_from(target.as_bytes().len()).unwrap_or(u64::MAX))?;
        let owner = self.owner;
        let parent = self.parent(path, dirs)?;
        symlinkat(target.as_c_str(), parent.as_fd(), name).map_err(|err| match err {
            Errno::EEXIST => Failure::Refused(Refusal::Twice(path.to_vec())),
            err => io_refused(path)(err.into()),
        })?;
        fchownat(
            parent.as_fd(),
            name,
            Some(owner.0),
            Some(owner.1),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|err| io_refused(path)(err.into()))?;
        self.files += 1;
        Ok(())
    }
}

fn io_refused(path: &[u8]) -> impl Fn(io::Error) -> Failure + '_ {
    move |source| {
        Failure::Refused(Refusal::Io {
            path: path.to_vec(),
            source,
        })
    }
}

/// Reads a GNU long-name record's data: a path or link target, NUL-terminated, bounded.
fn read_long_name<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<Vec<u8>, Failure> {
    let size = entry.size();
    if size > u64::try_from(MAX_PATH_BYTES + 1).unwrap_or(u64::MAX) {
        return Err(Failure::Refused(Refusal::LongNameTooLong(size)));
    }
    let mut data = Vec::new();
    entry.read_to_end(&mut data).map_err(Failure::Stream)?;
    if u64::try_from(data.len()).unwrap_or(u64::MAX) != size {
        return Err(Failure::Truncated);
    }
    while data.last() == Some(&0) {
        data.pop();
    }
    if data.contains(&0) {
        return Err(Failure::Refused(Refusal::NulInLongName));
    }
    Ok(data)
}

/// Splits an entry's path into its components, refusing what could leave the destination.
fn split_path(path: &[u8]) -> Result<Vec<&[u8]>, Failure> {
    let refuse = |why: fn(Vec<u8>) -> Refusal| Err(Failure::Refused(why(path.to_vec())));
    if path.first() == Some(&b'/') {
        return refuse(Refusal::Absolute);
    }
    if path.len() > MAX_PATH_BYTES {
        return refuse(Refusal::PathTooLong);
    }
    let mut parts = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return refuse(Refusal::DotDot),
            part if part.len() > MAX_NAME => return refuse(Refusal::NameTooLong),
            part => parts.push(part),
        }
    }
    if parts.len() > MAX_DEPTH {
        return refuse(Refusal::TooDeep);
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_split_and_checked() {
        let ok = |p: &str| {
            split_path(p.as_bytes())
                .map(|v| {
                    v.iter()
                        .map(|c| String::from_utf8_lossy(c).into_owned())
                        .collect::<Vec<_>>()
                })
                .map_err(|err| match err {
                    Failure::Refused(refusal) => refusal.to_string(),
                    other => panic!("{other:?}"),
                })
        };
        assert_eq!(ok("a/b/c"), Ok(vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(ok("./a//b/"), Ok(vec!["a".into(), "b".into()]));
        assert_eq!(ok("./"), Ok(vec![]));
        assert_eq!(
            ok("/etc/passwd"),
            Err("\"/etc/passwd\" is an absolute path".into())
        );
        assert_eq!(
            ok("a/../../b"),
            Err("\"a/../../b\" has a '..' component".into())
        );
        assert!(ok("..").is_err());
        assert!(ok(&"x".repeat(256)).is_err());
        assert!(
            ok(&"a/".repeat(MAX_DEPTH + 1)).is_err_and(
                |e| e.ends_with(&format!("is nested deeper than {MAX_DEPTH} directories"))
            )
        );
        assert!(ok(&"a/".repeat(MAX_DEPTH)).is_ok());
    }
}
