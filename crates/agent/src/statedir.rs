//! The agent's private state directory (`/var/lib/dynocap` by default): owned by the agent,
//! never readable or writable by the sandbox user. It holds the files the host sends with
//! `ReceiveFile` (the history bundle) and the private baseline repository. A root agent gives
//! it mode 0710 and group [`GIT_GROUP`], so that the guarded git runs (and nothing else) can
//! pass it to the private repository; see `gitguard`. Every file in it is 0600.
//!
//! Received files are written under a temporary name and renamed into place once complete, so
//! a cancelled or oversized transfer never leaves a partial file under the requested name.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use dynocap_proto::{ReceiveFileRequest, Response};
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmod, fstat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::fsutil;
use crate::gitguard::GIT_GROUP;
use crate::input::InputReader;

/// Where the agent keeps its state unless configured otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/dynocap";

/// Names inside the state directory the agent uses itself; `ReceiveFile` may not take them.
/// The directory of the private repository (owned by the sandbox user, reached by git only
/// through a descriptor: see `gitguard`).
pub const BASELINE_DIR: &CStr = c"private";
/// Inside [`BASELINE_DIR`]: the private baseline repository (a bare git directory).
pub const BASELINE_REPO: &CStr = c"baseline.git";
/// Inside [`BASELINE_DIR`]: its index (outside the git directory, given as `GIT_INDEX_FILE`).
pub const BASELINE_INDEX: &CStr = c"index";
pub const BASELINE_INDEX_LOCK: &CStr = c"index.lock";
/// The workspace path the baseline was taken of.
pub const BASELINE_WORKSPACE: &CStr = c"baseline-workspace";
/// The baseline commit id, kept where only the agent can write it.
pub const BASELINE_COMMIT: &CStr = c"baseline-commit";
/// The size of the baseline's largest file, as its index records it.
pub const BASELINE_LARGEST: &CStr = c"baseline-largest";
/// Every name the agent keeps in the state directory, for cleanup (the repository, index and
/// lock names are also reserved: they were in the state directory itself before).
pub const BASELINE_FILES: [&CStr; 7] = [
    BASELINE_DIR,
    BASELINE_WORKSPACE,
    BASELINE_COMMIT,
    BASELINE_LARGEST,
    BASELINE_REPO,
    BASELINE_INDEX,
    BASELINE_INDEX_LOCK,
];

/// Longest file name accepted (Linux's NAME_MAX).
const NAME_MAX: usize = 255;

/// Why a name the host gave is not one the state directory takes.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    #[error("file name {0:?} must be a plain name: non-empty, no '/', not '.' or '..'")]
    NotPlain(String),
    #[error("file name {0:?} may not start with '.' (reserved for the agent's temporary files)")]
    Hidden(String),
    #[error("file name is {0} bytes long; the limit is {NAME_MAX}")]
    TooLong(usize),
    #[error("file name {0:?} is reserved for the agent's own state")]
    Reserved(String),
    #[error("file name {0:?} contains a NUL byte")]
    Nul(String),
}

/// Why the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("the state directory {} must be an absolute path below /", .0.display())]
    NotBelowRoot(PathBuf),
    #[error("the state directory {} must be an absolute path", .0.display())]
    Relative(PathBuf),
    /// A step that failed in the standard library (making the parents, naming it).
    #[error("cannot {what} the state directory {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A step that failed in a system call.
    #[error("cannot {what} the state directory {}: {source}", path.display())]
    Sys {
        what: &'static str,
        path: PathBuf,
        source: Errno,
    },
    #[error("the state directory {} is not a directory (or is a symlink)", .0.display())]
    NotADirectory(PathBuf),
    #[error("the state directory {} belongs to uid {owner}, not to the agent (uid {agent})", path.display())]
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        agent: u32,
    },
}

/// Why a file received earlier cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum ReceivedError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("no file named {0:?} was received")]
    Missing(String),
    #[error("cannot open the received file {name:?}: {source}")]
    Open { name: String, source: Errno },
    #[error("cannot inspect {name:?}: {source}")]
    Inspect { name: String, source: Errno },
    #[error("the received file {0:?} is not a regular file")]
    NotRegular(String),
}

/// Why a `ReceiveFile` failed; nothing is kept under the name then.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    StateDir(#[from] StateDirError),
    #[error("cannot clear a stale temporary file: {0}")]
    ClearStale(#[source] Errno),
    #[error("cannot create {name:?} in the state directory: {source}")]
    Create { name: String, source: Errno },
    #[error("cannot move {name:?} into place: {source}")]
    Rename { name: String, source: Errno },
    #[error("{name:?} is over {max} bytes; nothing was kept")]
    TooBig { name: String, max: u64 },
    #[error("receiving {0:?} was cancelled; nothing was kept")]
    Cancelled(String),
    #[error("reading {name:?} failed: {source}")]
    Read { name: String, source: io::Error },
    #[error("writing {name:?} failed: {source}")]
    Write { name: String, source: io::Error },
}

/// Checks that `name` is a plain file name the host may use in the state directory.
pub fn validate_name(name: &str) -> Result<CString, NameError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(NameError::NotPlain(name.to_owned()));
    }
    if name.starts_with('.') {
        return Err(NameError::Hidden(name.to_owned()));
    }
    if name.len() > NAME_MAX {
        return Err(NameError::TooLong(name.len()));
    }
    if BASELINE_FILES
        .iter()
        .any(|r| r.to_bytes() == name.as_bytes())
    {
        return Err(NameError::Reserved(name.to_owned()));
    }
    CString::new(name).map_err(|_| NameError::Nul(name.to_owned()))
}

/// The state directory's mode: passable by [`GIT_GROUP`] when the agent can give it that group.
pub fn state_dir_mode() -> Mode {
    if nix::unistd::geteuid().is_root() {
        Mode::S_IRWXU | Mode::S_IXGRP
    } else {
        Mode::S_IRWXU
    }
}

/// Opens the state directory, creating it (and its parents) when missing. It must be a real
/// directory owned by the agent; its group and mode are forced to [`GIT_GROUP`] and
/// [`state_dir_mode`] (0700 for an unprivileged agent, whose git runs as itself anyway).
pub fn open_state_dir(path: &Path) -> Result<OwnedFd, StateDirError> {
    let io_fail = |what: &'static str| {
        move |source| StateDirError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    let fail = |what: &'static str| {
        move |source| StateDirError::Sys {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(StateDirError::NotBelowRoot(path.to_path_buf()));
    };
    if !path.is_absolute() {
        return Err(StateDirError::Relative(path.to_path_buf()));
    }
    std::fs::create_dir_all(parent).map_err(io_fail("create the parent of"))?;
    let name = fsutil::cstring(name).map_err(io_fail("name"))?;
    // Parents are system directories (root's); only the last component is ours to check.
    let parent_fd = openat(
        AT_FDCWD,
        parent,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail("open the parent of"))?;
    match nix::sys::stat::mkdirat(parent_fd.as_fd(), name.as_c_str(), Mode::S_IRWXU) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(err) => return Err(fail("create")(err)),
    }
    let dir = fsutil::open_dir_at(parent_fd.as_fd(), &name).map_err(|err| match err {
        Errno::ELOOP | Errno::ENOTDIR => StateDirError::NotADirectory(path.to_path_buf()),
        err => fail("open")(err),
    })?;
    let stat = fstat(dir.as_fd()).map_err(fail("inspect"))?;
    let euid = nix::unistd::geteuid().as_raw();
    if stat.st_uid != euid {
        return Err(StateDirError::ForeignOwner {
            path: path.to_path_buf(),
            owner: stat.st_uid,
            agent: euid,
        });
    }
    if nix::unistd::geteuid().is_root() && stat.st_gid != GIT_GROUP {
        nix::unistd::fchown(
            dir.as_fd(),
            None,
            Some(nix::unistd::Gid::from_raw(GIT_GROUP)),
        )
        .map_err(fail("give the git group"))?;
    }
    fchmod(dir.as_fd(), state_dir_mode()).map_err(fail("protect"))?;
    Ok(dir)
}

/// Opens a file received earlier, read-only, refusing anything but a regular file.
pub fn open_received(dir: BorrowedFd<'_>, name: &str) -> Result<File, ReceivedError> {
    let cname = validate_name(name)?;
    let fd = openat(
        dir,
        cname.as_c_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|err| match err {
        Errno::ENOENT => ReceivedError::Missing(name.to_owned()),
        source => ReceivedError::Open {
            name: name.to_owned(),
            source,
        },
    })?;
    let stat = fstat(fd.as_fd()).map_err(|source| ReceivedError::Inspect {
        name: name.to_owned(),
        source,
    })?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(ReceivedError::NotRegular(name.to_owned()));
    }
    Ok(File::from(fd))
}

/// Handles `ReceiveFile` on a blocking thread: the input stream goes to
/// `<state dir>/<name>`, at most `max_bytes` of it.
pub fn receive_file(
    state_dir: &Path,
    req: &ReceiveFileRequest,
    mut input: InputReader,
) -> Result<Response, ReceiveError> {
    let name = validate_name(&req.name)?;
    let dir = open_state_dir(state_dir)?;
    // A valid name has no NUL, so neither has the temporary one.
    let temp = CString::new(format!(".receiving-{}", req.name))
        .map_err(|_| NameError::Nul(req.name.clone()))?;
    match unlinkat(dir.as_fd(), temp.as_c_str(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(err) => return Err(ReceiveError::ClearStale(err)),
    }
    let fd = openat(
        dir.as_fd(),
        temp.as_c_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::S_IRUSR | Mode::S_IWUSR,
    )
    .map_err(|source| ReceiveError::Create {
        name: req.name.clone(),
        source,
    })?;
    let mut file = File::from(fd);
    let outcome = copy_bounded(&mut input, &mut file, req.max_bytes);
    drop(file);
    let result = match outcome {
        Ok(bytes) => renameat(dir.as_fd(), temp.as_c_str(), dir.as_fd(), name.as_c_str())
            .map(|()| bytes)
            .map_err(|source| ReceiveError::Rename {
                name: req.name.clone(),
                source,
            }),
        Err(CopyError::TooBig) => Err(ReceiveError::TooBig {
            name: req.name.clone(),
            max: req.max_bytes,
        }),
        Err(CopyError::Read(_)) if input.aborted() => {
            Err(ReceiveError::Cancelled(req.name.clone()))
        }
        Err(CopyError::Read(source)) => Err(ReceiveError::Read {
            name: req.name.clone(),
            source,
        }),
        Err(CopyError::Write(source)) => Err(ReceiveError::Write {
            name: req.name.clone(),
            source,
        }),
    };
    // Closing the queue lets the frame reader drop what the host still sends.
    drop(input);
    match result {
        Ok(bytes) => Ok(Response::Received { bytes }),
        Err(err) => {
            let _ = unlinkat(dir.as_fd(), temp.as_c_str(), UnlinkatFlags::NoRemoveDir);
            Err(err)
        }
    }
}

/// Why [`copy_bounded`] stopped.
pub enum CopyError {
    TooBig,
    Read(io::Error),
    Write(io::Error),
}

/// Copies `from` to its end into `to`, failing as soon as more than `max` bytes came.
pub fn copy_bounded(from: &mut impl Read, to: &mut impl Write, max: u64) -> Result<u64, CopyError> {
    let mut buf = vec![0_u8; 64 * 1024];
    let mut total: u64 = 0;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(CopyError::Read(err)),
        };
        total = total.saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
        if total > max {
            return Err(CopyError::TooBig);
        }
        to.write_all(&buf[..n]).map_err(CopyError::Write)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn names_are_plain() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/abs",
            ".hidden",
            "index",
            "baseline.git",
            "private",
            "baseline-commit",
            "a\0b",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_name(&"x".repeat(256)).is_err());
        assert!(validate_name("history.bundle").is_ok());
    }

    #[test]
    fn the_state_dir_is_private_and_must_be_ours() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("a/b/state");
        open_state_dir(&dir).expect("created");
        let meta = std::fs::metadata(&dir).expect("exists");
        let mode = state_dir_mode().bits();
        assert_eq!(meta.permissions().mode() & 0o7777, mode);
        if nix::unistd::geteuid().is_root() {
            assert_eq!((mode, meta.gid()), (0o710, GIT_GROUP));
        }
        assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
        // A loose mode is tightened.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        open_state_dir(&dir).expect("reopened");
        assert_eq!(
            std::fs::metadata(&dir)
                .expect("exists")
                .permissions()
                .mode()
                & 0o7777,
            mode
        );
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        assert!(open_state_dir(&link).is_err());
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&dir, Some(1000), Some(1000)).expect("chown");
            assert!(open_state_dir(&dir)
                .expect_err("foreign")
                .to_string()
                .contains("belongs to uid 1000"));
        }
    }

    /// The host receives each error's text as it was before the errors were typed; the cause
    /// stays reachable as the error's source.
    #[test]
    fn errors_read_as_the_host_has_always_seen_them() {
        let text = |name: &str| validate_name(name).expect_err(name).to_string();
        assert_eq!(
            text("a/b"),
            r#"file name "a/b" must be a plain name: non-empty, no '/', not '.' or '..'"#
        );
        assert_eq!(
            text(".x"),
            r#"file name ".x" may not start with '.' (reserved for the agent's temporary files)"#
        );
        assert_eq!(
            text(&"n".repeat(256)),
            "file name is 256 bytes long; the limit is 255"
        );
        assert_eq!(
            text("baseline-commit"),
            r#"file name "baseline-commit" is reserved for the agent's own state"#
        );
        assert_eq!(text("a\0b"), r#"file name "a\0b" contains a NUL byte"#);

        assert_eq!(
            open_state_dir(Path::new("state"))
                .expect_err("relative")
                .to_string(),
            "the state directory state must be an absolute path"
        );
        let err = StateDirError::Sys {
            what: "open",
            path: PathBuf::from("/var/lib/dynocap"),
            source: Errno::EACCES,
        };
        assert_eq!(
            err.to_string(),
            "cannot open the state directory /var/lib/dynocap: EACCES: Permission denied"
        );
        let source = std::error::Error::source(&err).expect("a cause");
        assert_eq!(source.to_string(), Errno::EACCES.to_string());

        let base = tempfile::tempdir().expect("tempdir");
        let state = open_state_dir(base.path()).expect("state dir");
        let err = open_received(state.as_fd(), "history.bundle").expect_err("missing");
        assert!(matches!(err, ReceivedError::Missing(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            r#"no file named "history.bundle" was received"#
        );
        let err = open_received(state.as_fd(), "..").expect_err("not plain");
        assert!(
            matches!(err, ReceivedError::Name(NameError::NotPlain(_))),
            "{err:?}"
        );
    }
}
