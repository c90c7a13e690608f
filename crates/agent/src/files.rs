//! The file operations of [`dynocap_proto::files`], done as the sandbox user.
//!
//! When the sandbox user is not the agent's own user, each request runs in a helper process
//! of its own (the agent's binary as `dynocap-agent file-op UID:GID`, the request on its
//! stdin, the answer on its stdout), which first takes that user's filesystem identity
//! (`setfsuid`/`setfsgid` and its groups) and empties its capability sets, so every open,
//! create and permission check is the guest kernel's for that user, exactly as for its
//! commands: a symlink to `/etc/shadow` fails to open as it would for `cat`.
//!
//! A process, not a thread of the agent: the kernel lets a thread into its own process's
//! `/proc` entries whatever its credentials (`/proc/1/fd`, `/proc/1/root`, `/proc/1/maps` of
//! the agent, PID 1, pass the ptrace check for "same thread group"), and through the agent's
//! descriptors that would reach what the sandbox user's commands cannot (the agent's cgroup
//! directory, outside the guest's tree). The helper is another thread group, so those checks
//! are made against the sandbox user's identity as for any command, and its own `/proc/self`
//! is its own, as `cat`'s is.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, FileExt as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt};
use std::path::{Path, PathBuf};

use dynocap_proto::files::{
    FileEntry, FileOp, FileRequest, FileResult, HelperAnswer, PutItem, MAX_EDIT_FILE,
    MAX_LIST_DEPTH, MAX_LIST_ENTRIES, MAX_PATH, MAX_READ, MAX_WRITE,
};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::memfd::MFdFlags;
use nix::sys::stat::{Mode, SFlag};
use std::os::fd::OwnedFd;

use crate::config::Config;
use crate::spawn::{ChildSpec, ExecUser};

/// Entries a listing looks at, listed or counted, before it stops counting.
const MAX_VISITED: u64 = 200_000;

/// Why a file operation was refused; the message goes to the caller as it is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FileError(String);

fn fail<T>(message: impl Into<String>) -> Result<T, FileError> {
    Err(FileError(message.into()))
}

fn io_fail<T>(what: &str, path: &Path, err: std::io::Error) -> Result<T, FileError> {
    fail(format!("{what} {}: {err}", path.display()))
}

/// The agent's first argument that makes it the helper of one file operation.
pub const HELPER_ARG: &str = "file-op";

/// Most bytes of a request the helper reads: a write's or a put's content in base64 inside
/// JSON, with its paths.
const MAX_REQUEST: u64 = 4 * 1024 * 1024;

/// Most bytes of an answer the agent takes from the helper: a listing of
/// [`MAX_LIST_ENTRIES`] entries whose names and targets are as long as paths may be, with
/// JSON's escapes.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// Performs `request` as the sandbox user: in a helper process when that user is not the
/// agent's own, else on a thread of the agent's.
pub async fn serve(request: FileRequest, config: &Config) -> Result<FileResult, FileError> {
    let user = config
        .exec_user
        .filter(|user| user.uid != nix::unistd::geteuid().as_raw());
    match user {
        Some(user) => in_helper(&request, user).await,
        None => on_thread(request).await,
    }
}

/// The agent's own identity: the operation needs no change of user.
async fn on_thread(request: FileRequest) -> Result<FileResult, FileError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("file-op".into())
        .spawn(move || {
            let _ = tx.send(perform(&request));
        })
        .map_err(|err| FileError(format!("cannot start the file operation: {err}")))?;
    rx.await
        .unwrap_or_else(|_| fail("the file operation stopped without an answer"))
}

/// Runs `request` in a helper process that acts as `user` (see the module's doc), through
/// the agent's own spawn path and reaper.
async fn in_helper(request: &FileRequest, user: ExecUser) -> Result<FileResult, FileError> {
    let started =
        |err: &dyn std::fmt::Display| FileError(format!("cannot start the file operation: {err}"));
    let input = request.to_json().map_err(|err| started(&err))?;
    let stdin = nix::sys::memfd::memfd_create(c"dynocap-file-op", MFdFlags::MFD_CLOEXEC)
        .map_err(|err| started(&err))?;
    let mut file = File::from(stdin);
    file.write_all(&input)
        .and_then(|()| file.seek(std::io::SeekFrom::Start(0)).map(|_| ()))
        .map_err(|err| started(&err))?;
    let spec = ChildSpec {
        // The child's own link to the agent's binary: it works whatever path the binary has
        // in the guest's tree, or if that path is gone.
        program: c"/proc/self/exe".to_owned(),
        argv: vec![
            c"dynocap-agent".to_owned(),
            CString::new(HELPER_ARG).map_err(|err| started(&err))?,
            CString::new(format!("{}:{}", user.uid, user.gid)).map_err(|err| started(&err))?,
        ],
        env: crate::command::env_list([("PATH", crate::spawn::BASE_PATH)])
            .map_err(|err| started(&err))?,
        cwd: c"/".to_owned(),
        terminal: false,
        // The helper starts as the agent and gives itself the user's identity (see
        // `become_user`), as a thread of the agent did: the same checks, in another process.
        user: None,
        stdin: Some(OwnedFd::from(file)),
        cgroup: None,
        extra_group: None,
        stdio: None,
    };
    // Nothing stops a file operation but its own end (or the request being dropped, which
    // kills the helper).
    let (_keep, mut stop) = tokio::sync::mpsc::channel(1);
    let (out, finished) = crate::command::run(&spec, MAX_ANSWER, &mut stop)
        .await
        .map_err(|err| FileError(format!("the file operation failed: {err}")))?;
    if !finished.success() {
        return fail(format!(
            "the file operation failed: {}",
            finished.describe()
        ));
    }
    match HelperAnswer::from_json(&out) {
        Ok(HelperAnswer::Done(result)) => Ok(result),
        Ok(HelperAnswer::Refused(message)) => Err(FileError(message)),
        Err(err) => fail(format!(
            "the file operation answered what is not an answer: {err}"
        )),
    }
}

/// `dynocap-agent file-op UID:GID`: reads one request on stdin, performs it as `UID:GID`
/// and prints the answer on stdout. Run by the agent only (see [`in_helper`]).
pub fn helper_main(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    let user = match args {
        [user] => user.to_str().and_then(|text| {
            let (uid, gid) = text.split_once(':')?;
            Some(ExecUser {
                uid: uid.parse().ok()?,
                gid: gid.parse().ok()?,
            })
        }),
        _ => None,
    };
    let Some(user) = user else {
        let _ = writeln!(
            std::io::stderr(),
            "usage: dynocap-agent {HELPER_ARG} UID:GID (the agent runs it, a request on stdin)"
        );
        return std::process::ExitCode::from(2);
    };
    let mut input = Vec::new();
    let answer = match std::io::stdin()
        .lock()
        .take(MAX_REQUEST + 1)
        .read_to_end(&mut input)
    {
        Err(err) => HelperAnswer::Refused(format!("cannot read the file operation: {err}")),
        Ok(_) if input.len() as u64 > MAX_REQUEST => HelperAnswer::Refused(format!(
            "the file operation is larger than {MAX_REQUEST} bytes"
        )),
        Ok(_) => answer(&input, user),
    };
    let written = answer
        .to_json()
        .map_err(std::io::Error::other)
        .and_then(|bytes| {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes).and_then(|()| out.flush())
        });
    match written {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "cannot write the answer: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The helper's work, from the request's bytes to its answer: on the calling thread, whose
/// identity becomes `user`'s.
fn answer(input: &[u8], user: ExecUser) -> HelperAnswer {
    let request = match FileRequest::from_json(input) {
        Ok(request) => request,
        Err(err) => return HelperAnswer::Refused(format!("the file operation is garbled: {err}")),
    };
    match become_user(user).and_then(|()| perform(&request)) {
        Ok(result) => HelperAnswer::Done(result),
        Err(FileError(message)) => HelperAnswer::Refused(message),
    }
}

/// Gives the calling thread (the helper's only one) `user`'s filesystem identity, or
/// refuses: an operation never runs as the agent's own user when the sandbox has another.
fn become_user(user: ExecUser) -> Result<(), FileError> {
    let groups = [user.gid as libc::gid_t];
    // SAFETY: raw system calls with valid arguments (a one-element array that outlives the
    // call, plain ids); the raw calls change this thread's credentials only (libc's wrappers
    // would change every thread of the process: the helper has one, a unit test's has many).
    let (set_groups, _, _) = unsafe {
        (
            libc::syscall(libc::SYS_setgroups, 1 as libc::c_long, groups.as_ptr()),
            libc::syscall(libc::SYS_setfsgid, user.gid as libc::c_long),
            libc::syscall(libc::SYS_setfsuid, user.uid as libc::c_long),
        )
    };
    // setfsuid answers the previous id and never an error: asking with an invalid id (-1)
    // reads the current ones back.
    // SAFETY: as above; -1 changes nothing.
    let (fsuid, fsgid) = unsafe {
        (
            libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long),
            libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long),
        )
    };
    if set_groups != 0 || fsuid != user.uid as libc::c_long || fsgid != user.gid as libc::c_long {
        return fail(format!(
            "cannot act as the sandbox user {}:{} for file operations",
            user.uid, user.gid
        ));
    }
    drop_capabilities()
}

/// The v3 layout of capset(2)'s arguments.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Empties this thread's capability sets. The change of fsuid already took the file
/// capabilities (`CAP_DAC_OVERRIDE` and the like) out of the effective set; the others (a
/// `CAP_SYS_RESOURCE` that would write past a full disk's reserve, say) go too, so the
/// operation has exactly what the sandbox user's commands have.
fn drop_capabilities() -> Result<(), FileError> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a version-3 header and two CapData structs (the v3 layout), both
    // on this stack for the duration of the call; pid 0 is the calling thread only.
    let ret =
        unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if ret != 0 {
        return fail(format!(
            "cannot drop capabilities for file operations: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn perform(request: &FileRequest) -> Result<FileResult, FileError> {
    let path = resolve(&request.cwd, request.op.path())?;
    match &request.op {
        FileOp::Read { offset, length, .. } => read(&path, *offset, *length),
        FileOp::Write {
            content,
            mode,
            create_dirs,
            ..
        } => write(&path, content, *mode, *create_dirs),
        FileOp::Edit {
            old_text,
            new_text,
            replace_all,
            ..
        } => edit(&path, old_text, new_text, *replace_all),
        FileOp::List { depth, offset, .. } => list(&path, *depth, *offset),
        FileOp::Put { rel, item, .. } => put(&path, rel, item),
    }
}

fn errno_fail<T>(what: &str, path: &Path, errno: Errno) -> Result<T, FileError> {
    let why = match errno {
        Errno::ELOOP => "it is a symlink, which a copy never follows".to_owned(),
        errno => errno.desc().to_owned(),
    };
    fail(format!("{what} {}: {why}", path.display()))
}

fn is_type(mode: u32, kind: SFlag) -> bool {
    mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// One entry of a copy in: `root` (named by the user) is opened as any path is; each
/// component of `rel` below it is opened without following a symlink, so nothing the copy
/// makes lands outside `root`.
fn put(root: &Path, rel: &str, item: &PutItem) -> Result<FileResult, FileError> {
    let parts: Vec<&str> = rel.split('/').collect();
    if rel.len() > MAX_PATH
        || parts
            .iter()
            .any(|part| part.is_empty() || *part == "." || *part == ".." || part.contains('\0'))
    {
        return fail(format!("{rel:?} is not a relative path of plain names"));
    }
    let full = root.join(rel);
    let mut dir = match nix::fcntl::open(
        root,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(errno) => return errno_fail("cannot open the directory", root, errno),
    };
    let (last, walk) = match parts.split_last() {
        Some(split) => split,
        None => return fail("the path is empty"),
    };
    for part in walk {
        dir = match open_dir_nofollow(&dir, part) {
            Ok(fd) => fd,
            Err(errno) => return errno_fail("cannot enter", &full, errno),
        };
    }
    let last = *last;
    match item {
        PutItem::Dir { mode } => {
            let created = match nix::sys::stat::mkdirat(&dir, last, Mode::from_bits_truncate(0o700))
            {
                Ok(()) => true,
                Err(Errno::EEXIST) => false,
                Err(errno) => return errno_fail("cannot create the directory", &full, errno),
            };
            let fd = match open_dir_nofollow(&dir, last) {
                Ok(fd) => fd,
                Err(Errno::ENOTDIR | Errno::ELOOP) => {
                    return fail(format!(
                        "{} exists and is not a directory (or is a symlink)",
                        full.display()
                    ))
                }
                Err(errno) => return errno_fail("cannot open", &full, errno),
            };
            if let Some(mode) = mode {
                if let Err(errno) =
                    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode & 0o1777))
                {
                    return errno_fail("cannot set the mode of", &full, errno);
                }
            }
            Ok(FileResult::Written {
                path: text(&full),
                bytes: 0,
                created,
                mode: mode_of(&fd),
            })
        }
        PutItem::File {
            content,
            offset,
            mode,
        } => {
            if content.len() > MAX_WRITE {
                return fail(format!("a piece carries at most {MAX_WRITE} bytes"));
            }
            let mut created = false;
            let mut flags =
                OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
            if *offset == 0 {
                // Only a plain file is replaced: never a FIFO, a device or what a symlink
                // points at.
                match nix::sys::stat::fstatat(&dir, last, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) if !is_type(st.st_mode, SFlag::S_IFREG) => {
                        return fail(format!(
                            "{} exists and is not a plain file (a symlink, directory or \
                             device); a copy does not write through or over it",
                            full.display()
                        ))
                    }
                    Ok(_) => {}
                    Err(Errno::ENOENT) => created = true,
                    Err(errno) => return errno_fail("cannot look at", &full, errno),
                }
                flags |= OFlag::O_CREAT;
            }
            let fd = match nix::fcntl::openat(&dir, last, flags, Mode::from_bits_truncate(0o600)) {
                Ok(fd) => fd,
                Err(errno) => return errno_fail("cannot open", &full, errno),
            };
            let file = File::from(fd);
            match file.metadata() {
                Ok(meta) if meta.is_file() => {}
                Ok(_) => return fail(format!("{} is not a plain file", full.display())),
                Err(err) => return io_fail("cannot stat", &full, err),
            }
            if *offset == 0 {
                if let Err(err) = file.set_len(0) {
                    return io_fail("cannot truncate", &full, err);
                }
            }
            if let Err(err) = file.write_all_at(content, *offset) {
                return io_fail("cannot write", &full, err);
            }
            if let Some(mode) = mode {
                if let Err(err) =
                    file.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))
                {
                    return io_fail("cannot set the mode of", &full, err);
                }
            }
            Ok(FileResult::Written {
                path: text(&full),
                bytes: content.len() as u64,
                created,
                mode: mode_of(&file),
            })
        }
        PutItem::Symlink { target } => {
            if target.is_empty() || target.len() > MAX_PATH || target.contains('\0') {
                return fail("a symlink's target is 1 to 4096 bytes without NUL");
            }
            if let Err(errno) = nix::unistd::symlinkat(target.as_str(), &dir, last) {
                return errno_fail("cannot create the symlink", &full, errno);
            }
            Ok(FileResult::Written {
                path: text(&full),
                bytes: 0,
                created: true,
                mode: 0o777,
            })
        }
    }
}

fn open_dir_nofollow(dir: &OwnedFd, name: &str) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn mode_of(fd: &impl std::os::fd::AsFd) -> u32 {
    nix::sys::stat::fstat(fd.as_fd())
        .map(|st| st.st_mode & 0o7777)
        .unwrap_or(0)
}

fn resolve(cwd: &str, path: &str) -> Result<PathBuf, FileError> {
    if path.is_empty() {
        return fail("the path is empty");
    }
    if path.len() > MAX_PATH || cwd.len() > MAX_PATH || path.contains('\0') || cwd.contains('\0') {
        return fail("the path is too long or holds a NUL byte");
    }
    if !cwd.starts_with('/') {
        return fail(format!("the working directory {cwd:?} is not absolute"));
    }
    Ok(Path::new(cwd).join(path))
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Opens `path` for reading without waiting on a FIFO, and refuses anything but a file.
fn open_regular(path: &Path, write: bool) -> Result<(File, std::fs::Metadata), FileError> {
    let file = match OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(err) => return io_fail("cannot open", path, err),
    };
    let meta = match file.metadata() {
        Ok(meta) => meta,
        Err(err) => return io_fail("cannot stat", path, err),
    };
    if meta.is_dir() {
        return fail(format!(
            "{} is a directory (list it with dynocap_list_files)",
            path.display()
        ));
    }
    if !meta.is_file() {
        return fail(format!("{} is not a regular file", path.display()));
    }
    Ok((file, meta))
}

/// The most of a file a read looks through when the file's size is not known until it is
/// read (`/proc` says 0): enough for any of the kernel's own files, and a bound on one call.
const MAX_STREAMED: u64 = 64 * 1024 * 1024;

fn read(path: &Path, offset: u64, length: u64) -> Result<FileResult, FileError> {
    let (file, meta) = open_regular(path, false)?;
    if meta.len() == 0 {
        return read_streamed(path, &file, offset, length);
    }
    let mut total_size = meta.len();
    let want = length.min(MAX_READ).min(total_size.saturating_sub(offset));
    let mut data = vec![0u8; usize::try_from(want).unwrap_or(0)];
    let got = read_at_most(path, &file, &mut data, offset)?;
    if got < data.len() {
        // The file ended before the size it said (it shrank, or sysfs's page-sized files):
        // its end is here, so a caller paging on `more` is not sent back for bytes that are
        // not there.
        total_size = offset + got as u64;
    }
    data.truncate(got);
    Ok(FileResult::Read {
        path: text(path),
        data,
        offset,
        total_size,
    })
}

/// Fills `buf` from `offset` on, short only at the file's end; the bytes read.
fn read_at_most(path: &Path, file: &File, buf: &mut [u8], offset: u64) -> Result<usize, FileError> {
    let mut got = 0usize;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return io_fail("cannot read", path, err),
        }
    }
    Ok(got)
}

/// A file that says it is empty may not be (`/proc/meminfo`, `/proc/self/status`: the
/// kernel makes their text as they are read): it is read from its start to its end (at most
/// [`MAX_STREAMED`]), keeping the window asked for, so the answer holds what `cat` would
/// show and `total_size` says how much there is.
fn read_streamed(
    path: &Path,
    file: &File,
    offset: u64,
    length: u64,
) -> Result<FileResult, FileError> {
    let end = offset.saturating_add(length.min(MAX_READ));
    let mut data = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut at = 0u64;
    while at < MAX_STREAMED {
        let got = read_at_most(path, file, &mut chunk, at)?;
        if got == 0 {
            break;
        }
        let (from, to) = (at, at + got as u64);
        if to > offset && from < end {
            let lo = usize::try_from(offset.saturating_sub(from)).unwrap_or(0);
            let hi = usize::try_from(end.min(to) - from).unwrap_or(got);
            data.extend_from_slice(&chunk[lo..hi]);
        }
        at = to;
        if got < chunk.len() {
            break;
        }
    }
    Ok(FileResult::Read {
        path: text(path),
        data,
        offset,
        total_size: at,
    })
}

fn write(
    path: &Path,
    content: &[u8],
    mode: Option<u32>,
    create_dirs: bool,
) -> Result<FileResult, FileError> {
    if content.len() > MAX_WRITE {
        return fail(format!("a write carries at most {MAX_WRITE} bytes"));
    }
    if let Some(mode) = mode.filter(|mode| *mode > 0o7777) {
        return fail(format!(
            "mode {mode:o} is not a permission mode (0 to 7777)"
        ));
    }
    if create_dirs {
        if let Some(parent) = path.parent() {
            if let Err(err) = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
            {
                return io_fail("cannot create the directories of", path, err);
            }
        }
    }
    let new_mode = mode.unwrap_or(0o644);
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(new_mode)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    let (mut file, created) = match created {
        Ok(file) => (file, true),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            let (file, _) = match mode {
                Some(_) => open_to_set_mode(path)?,
                None => open_regular(path, true)?,
            };
            (file, false)
        }
        Err(err)
            if err.kind() == std::io::ErrorKind::NotFound
                && !create_dirs
                && path.parent().is_some_and(|parent| !parent.exists()) =>
        {
            return fail(format!(
                "cannot create {}: its directory does not exist; set createDirs to create it",
                path.display()
            ))
        }
        Err(err) => return io_fail("cannot create", path, err),
    };
    // Room for the content is taken before the file changes: on a full disk the write is
    // refused with a file that was there as it was, and a new one not left behind.
    if let Err(errno) = take_room(&file, content.len()) {
        if created {
            let _ = std::fs::remove_file(path);
        }
        return errno_fail("cannot make room for the content of", path, errno);
    }
    // The umask does not decide a mode that was asked for (or the default of a new file). It
    // is set before the file is cut, so a mode the user may not set (a file of another user)
    // leaves the file as it was.
    let wanted = if created { Some(new_mode) } else { mode };
    if let Some(wanted) = wanted {
        if let Err(err) = file.set_permissions(std::fs::Permissions::from_mode(wanted)) {
            return io_fail("cannot set the mode of", path, err);
        }
    }
    if !created {
        if let Err(err) = file.set_len(0) {
            return io_fail("cannot truncate", path, err);
        }
    }
    if let Err(err) = file.write_all(content) {
        return io_fail("cannot write", path, err);
    }
    // A write clears the set-id bits (the kernel's rule for a writer without CAP_FSETID):
    // those asked for are set again, as `chmod` after the write would.
    if let Some(wanted) = wanted.filter(|mode| mode & 0o6000 != 0) {
        if let Err(err) = file.set_permissions(std::fs::Permissions::from_mode(wanted)) {
            return io_fail("cannot set the mode of", path, err);
        }
    }
    let mode = match file.metadata() {
        Ok(meta) => meta.mode() & 0o7777,
        Err(err) => return io_fail("cannot stat", path, err),
    };
    Ok(FileResult::Written {
        path: text(path),
        bytes: content.len() as u64,
        created,
        mode,
    })
}

/// Opens an existing `path` for a write that sets a mode. A mode is set before the file is
/// cut, so the file's current mode must not stop the write when the user may change it: a
/// file of theirs they made read-only (or 000) is opened by giving the owner read and write
/// for the moment (the write then sets the mode asked for on the open file). A user who may
/// not change the mode gets `cannot set the mode of`, the file as it was.
fn open_to_set_mode(path: &Path) -> Result<(File, std::fs::Metadata), FileError> {
    let denied = match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(_) => return open_regular(path, true),
        Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => err,
        Err(_) => return open_regular(path, true),
    };
    let before = match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => meta.mode() & 0o7777,
        _ => return io_fail("cannot open", path, denied),
    };
    if let Err(err) = std::fs::set_permissions(path, PermissionsExt::from_mode(before | 0o600)) {
        return io_fail("cannot set the mode of", path, err);
    }
    let opened = open_regular(path, true);
    if opened.is_err() {
        // Whatever failed, the file keeps the mode it had.
        let _ = std::fs::set_permissions(path, PermissionsExt::from_mode(before));
    }
    opened
}

/// Gives `file` the disk blocks for `length` bytes without changing its size or content
/// (`fallocate` with `FALLOC_FL_KEEP_SIZE`), so that writing that much cannot stop part-way
/// on a full disk. A filesystem without `fallocate` is not refused: its writes are left to
/// fail as they would.
fn take_room(file: &File, length: usize) -> Result<(), Errno> {
    if length == 0 {
        return Ok(());
    }
    let length = libc::off_t::try_from(length).unwrap_or(libc::off_t::MAX);
    match nix::fcntl::fallocate(
        file,
        nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
        0,
        length,
    ) {
        Ok(()) | Err(Errno::EOPNOTSUPP) => Ok(()),
        Err(errno) => Err(errno),
    }
}

/// Where `needle` starts in `haystack`, without overlaps, in order.
fn occurrences(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    let mut found = Vec::new();
    let mut at = 0;
    while at + needle.len() <= haystack.len() {
        match haystack[at..]
            .windows(needle.len())
            .position(|window| window == needle)
        {
            Some(pos) => {
                found.push(at + pos);
                at += pos + needle.len();
            }
            None => break,
        }
    }
    found
}

fn edit(
    path: &Path,
    old_text: &str,
    new_text: &str,
    replace_all: bool,
) -> Result<FileResult, FileError> {
    if old_text.is_empty() {
        return fail("oldText is empty; to write a whole file use dynocap_write_file");
    }
    if old_text.len() > MAX_WRITE || new_text.len() > MAX_WRITE {
        return fail(format!(
            "oldText and newText are at most {MAX_WRITE} bytes each"
        ));
    }
    let (mut file, meta) = open_regular(path, true)?;
    if meta.len() > MAX_EDIT_FILE {
        return fail(format!(
            "{} is {} bytes; edits are for files of at most {MAX_EDIT_FILE} bytes",
            path.display(),
            meta.len()
        ));
    }
    let mut content = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    if let Err(err) = (&mut file)
        .take(MAX_EDIT_FILE + 1)
        .read_to_end(&mut content)
    {
        return io_fail("cannot read", path, err);
    }
    let found = occurrences(&content, old_text.as_bytes());
    match (found.len(), replace_all) {
        (0, _) => {
            return fail(format!(
                "oldText was not found in {}; read the file and give its exact text, \
                 whitespace included",
                path.display()
            ))
        }
        (n, false) if n > 1 => {
            return fail(format!(
                "oldText occurs {n} times in {}; give more surrounding text so that it occurs \
                 once, or set replaceAll",
                path.display()
            ))
        }
        _ => {}
    }
    let mut edited = Vec::with_capacity(content.len());
    let mut from = 0;
    for &at in &found {
        edited.extend_from_slice(&content[from..at]);
        edited.extend_from_slice(new_text.as_bytes());
        from = at + old_text.len();
    }
    edited.extend_from_slice(&content[from..]);
    // A longer text takes its room first: on a full disk the edit is refused before a byte
    // changes.
    if let Err(errno) = take_room(&file, edited.len()) {
        return errno_fail("cannot make room for the edit in", path, errno);
    }
    // Written over the old bytes, then cut to length: a failed write never leaves the file
    // emptied first, and one that stops part-way puts the old bytes back (they fit in the
    // room they had), so a refused edit leaves the file as it was.
    if let Err(err) = file
        .write_all_at(&edited, 0)
        .and_then(|()| file.set_len(edited.len() as u64))
    {
        let _ = file
            .write_all_at(&content, 0)
            .and_then(|()| file.set_len(content.len() as u64));
        return io_fail("cannot write", path, err);
    }
    Ok(FileResult::Edited {
        path: text(path),
        replacements: found.len() as u64,
        size: edited.len() as u64,
    })
}

fn list(path: &Path, depth: u32, offset: u64) -> Result<FileResult, FileError> {
    let depth = depth.clamp(1, MAX_LIST_DEPTH);
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return fail(format!("{} is not a directory", path.display())),
        Err(err) => return io_fail("cannot list", path, err),
    }
    let mut listing = Listing {
        entries: Vec::new(),
        left_off: 0,
        visited: 0,
        skip: offset,
    };
    if let Err(err) = std::fs::read_dir(path) {
        return io_fail("cannot list", path, err);
    }
    listing.walk(path, "", false, depth);
    Ok(FileResult::Listed {
        path: text(path),
        entries: listing.entries,
        left_off: listing.left_off,
    })
}

/// `text` as UTF-8, and whether it had to be changed to be: each byte that is not UTF-8 shows
/// as U+FFFD (three bytes), cut to [`MAX_PATH`] bytes so that a name or target of bytes that
/// are not text is still a listing's entry the host accepts.
fn lossy(text: &std::ffi::OsStr) -> (String, bool) {
    match text.to_str() {
        Some(text) => (text.to_owned(), false),
        None => {
            let mut shown = text.to_string_lossy().into_owned();
            cut_to_path(&mut shown);
            (shown, true)
        }
    }
}

/// Cuts `text` to at most [`MAX_PATH`] bytes, at a character's start.
fn cut_to_path(text: &mut String) {
    let mut end = text.len().min(MAX_PATH);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
}

struct Listing {
    entries: Vec<FileEntry>,
    left_off: u64,
    visited: u64,
    /// Entries before the page asked for, still to pass.
    skip: u64,
}

impl Listing {
    /// Lists `dir`'s entries (names under `prefix`, which `lossy_prefix` says is not the
    /// real one), then descends into its directories, never through a symlink. Returns why
    /// `dir` could not be read.
    fn walk(&mut self, dir: &Path, prefix: &str, lossy_prefix: bool, depth: u32) -> Option<String> {
        let reader = match std::fs::read_dir(dir) {
            Ok(reader) => reader,
            Err(err) => return Some(err.to_string()),
        };
        let mut names: Vec<_> = reader
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for name in names {
            if self.skip > 0 && depth == 1 {
                // Before the page and not to be descended into: not even looked at.
                self.skip -= 1;
                continue;
            }
            if self.visited >= MAX_VISITED {
                return None;
            }
            self.visited += 1;
            let full = dir.join(&name);
            let (own, lossy_name) = lossy(&name);
            let mut shown = format!("{prefix}{own}");
            // Only names shown with U+FFFD grow past a path's length (8 levels of 255 bytes
            // that are not text): cut, as `lossy` cuts one.
            cut_to_path(&mut shown);
            let Ok(meta) = std::fs::symlink_metadata(&full) else {
                continue;
            };
            let file_type = meta.file_type();
            let kind = if file_type.is_symlink() {
                "symlink"
            } else if file_type.is_dir() {
                "dir"
            } else if file_type.is_file() {
                "file"
            } else {
                "other"
            };
            let index = if self.skip > 0 {
                self.skip -= 1;
                None
            } else if self.entries.len() < MAX_LIST_ENTRIES as usize {
                let target = file_type
                    .is_symlink()
                    .then(|| std::fs::read_link(&full).ok())
                    .flatten();
                let target = target.map(|target| lossy(target.as_os_str()));
                let not_utf8 =
                    lossy_prefix || lossy_name || target.as_ref().is_some_and(|(_, lossy)| *lossy);
                self.entries.push(FileEntry {
                    name: shown.clone(),
                    kind: kind.into(),
                    size: meta.len(),
                    mode: meta.mode() & 0o7777,
                    target: target.map(|(target, _)| target),
                    error: None,
                    not_utf8,
                });
                Some(self.entries.len() - 1)
            } else {
                self.left_off += 1;
                None
            };
            if file_type.is_dir() && depth > 1 {
                let error = self.walk(
                    &full,
                    &format!("{shown}/"),
                    lossy_prefix || lossy_name,
                    depth - 1,
                );
                if let (Some(index), Some(error)) = (index, error) {
                    self.entries[index].error = Some(error);
                }
            }
        }
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn request(dir: &Path, op: FileOp) -> FileRequest {
        FileRequest {
            cwd: dir.to_string_lossy().into_owned(),
            op,
        }
    }

    /// `dir` listed `depth` levels deep from entry `offset`: the entries and how many were
    /// left off.
    fn list(dir: &Path, depth: u32, offset: u64) -> (Vec<FileEntry>, u64) {
        let listed = perform(&request(
            dir,
            FileOp::List {
                path: ".".into(),
                depth,
                offset,
            },
        ))
        .unwrap();
        let FileResult::Listed {
            entries, left_off, ..
        } = listed
        else {
            panic!("{listed:?}")
        };
        (entries, left_off)
    }

    /// `op` in `dir` done as the helper does it for a sandbox whose user is `nobody`
    /// (65534:65534): from the request's bytes to its answer, on a thread of its own (whose
    /// identity becomes that user's, as the helper's does). The helper's start is the agent's
    /// spawn path, which the e2e tests (tests/mcp/test_files.py) drive.
    fn serve_as_nobody(dir: &Path, op: FileOp) -> Result<FileResult, FileError> {
        let input = request(dir, op).to_json().unwrap();
        let user = ExecUser {
            uid: 65534,
            gid: 65534,
        };
        match std::thread::spawn(move || answer(&input, user))
            .join()
            .unwrap()
        {
            HelperAnswer::Done(result) => Ok(result),
            HelperAnswer::Refused(message) => Err(FileError(message)),
        }
    }

    /// As root (the agent in a guest), a request for another user runs with that user's
    /// identity: a root-only file is refused, a created file is that user's.
    #[test]
    fn a_request_runs_as_the_sandbox_user() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "root only").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::symlink(&secret, open.join("link")).unwrap();
        let run = |op| serve_as_nobody(&open, op);
        let read = |path: &str| FileOp::Read {
            path: path.into(),
            offset: 0,
            length: 100,
        };
        let refused = run(read("link")).unwrap_err();
        assert!(refused.0.contains("Permission denied"), "{refused}");
        let written = run(FileOp::Write {
            path: "mine".into(),
            content: b"x".to_vec(),
            mode: None,
            create_dirs: false,
        })
        .unwrap();
        assert!(matches!(written, FileResult::Written { created: true, .. }));
        let meta = std::fs::metadata(open.join("mine")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        // Not the caller's: root's own reads still work, on other threads.
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only");
        let refused = run(FileOp::Write {
            path: "../secret".into(),
            content: b"y".to_vec(),
            mode: None,
            create_dirs: false,
        })
        .unwrap_err();
        assert!(refused.0.contains("Permission denied"), "{refused}");
    }

    /// As the sandbox user: set-id bits asked for survive the write (which clears them), and
    /// a mode that user may not set (another user's file) refuses the write before the file
    /// is cut.
    #[test]
    fn a_write_keeps_the_set_id_bits_asked_for_and_a_refused_mode_cuts_nothing() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::write(&theirs, "kept").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o666)).unwrap();
        let run = |op| serve_as_nobody(dir.path(), op);
        let write = |path: &str, mode| FileOp::Write {
            path: path.into(),
            content: b"#!/bin/sh\n".to_vec(),
            mode,
            create_dirs: false,
        };
        for (mode, created) in [(0o4755, true), (0o2750, false), (0o755, false)] {
            let written = run(write("tool", Some(mode))).unwrap();
            assert!(
                matches!(written, FileResult::Written { mode: m, created: c, .. } if m == mode && c == created),
                "{mode:o}: {written:?}"
            );
            let meta = std::fs::metadata(dir.path().join("tool")).unwrap();
            assert_eq!(meta.mode() & 0o7777, mode);
        }
        let refused = run(write("theirs", Some(0o600))).unwrap_err();
        assert!(refused.0.contains("cannot set the mode"), "{refused}");
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "kept");
    }

    /// A file of the user's own that its mode makes read-only (or 000) is written when a
    /// mode is asked for, as `chmod` then a write would; without a mode it is refused as a
    /// shell's `>` would be, and a mode another user's file refuses leaves it as it was.
    #[test]
    fn a_mode_asked_for_is_set_before_the_files_own_mode_stops_the_write() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let run = |op| serve_as_nobody(dir.path(), op);
        let write = |path: &str, content: &str, mode| FileOp::Write {
            path: path.into(),
            content: content.as_bytes().to_vec(),
            mode,
            create_dirs: false,
        };
        let mode_of =
            |name: &str| std::fs::metadata(dir.path().join(name)).unwrap().mode() & 0o7777;
        run(write("f", "one", Some(0o000))).unwrap();
        assert_eq!(mode_of("f"), 0o000);
        let refused = run(write("f", "two", None)).unwrap_err();
        assert!(refused.0.contains("Permission denied"), "{refused}");
        assert_eq!(mode_of("f"), 0o000);
        for (content, mode) in [("three", 0o644), ("four", 0o444), ("five", 0o4555)] {
            let written = run(write("f", content, Some(mode))).unwrap();
            assert!(
                matches!(written, FileResult::Written { mode: m, created: false, .. } if m == mode),
                "{mode:o}: {written:?}"
            );
            assert_eq!(mode_of("f"), mode);
            assert_eq!(
                std::fs::read_to_string(dir.path().join("f")).unwrap(),
                content
            );
        }
        let theirs = dir.path().join("theirs");
        std::fs::write(&theirs, "kept").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o444)).unwrap();
        let refused = run(write("theirs", "x", Some(0o666))).unwrap_err();
        assert!(refused.0.contains("cannot set the mode"), "{refused}");
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "kept");
        assert_eq!(mode_of("theirs"), 0o444);
    }

    /// A file that says it is empty until read (`/proc`) reads as `cat` shows it, whole or
    /// in windows, with its real size.
    #[test]
    fn a_proc_file_reads_whole_and_in_windows() {
        let path = "/proc/version";
        let read = |offset, length| {
            let result = perform(&request(
                Path::new("/"),
                FileOp::Read {
                    path: path.into(),
                    offset,
                    length,
                },
            ))
            .unwrap();
            let FileResult::Read {
                data, total_size, ..
            } = result
            else {
                panic!("{result:?}")
            };
            (data, total_size)
        };
        let (whole, size) = read(0, MAX_READ);
        assert!(!whole.is_empty());
        assert_eq!(size, whole.len() as u64);
        assert!(String::from_utf8_lossy(&whole).starts_with("Linux version"));
        let (window, size) = read(3, 10);
        assert_eq!(window, whole[3..13]);
        assert_eq!(size, whole.len() as u64);
        let (past, _) = read(size + 5, 10);
        assert!(past.is_empty());
    }

    #[test]
    fn write_read_edit_list_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let content = vec![0u8, 1, 255, b'"', b'\\', b'\n'];
        let written = perform(&request(
            dir.path(),
            FileOp::Write {
                path: "sub/a.bin".into(),
                content: content.clone(),
                mode: Some(0o600),
                create_dirs: true,
            },
        ))
        .unwrap();
        assert!(
            matches!(
                written,
                FileResult::Written {
                    created: true,
                    mode: 0o600,
                    bytes: 6,
                    ..
                }
            ),
            "{written:?}"
        );
        let read = perform(&request(
            dir.path(),
            FileOp::Read {
                path: "sub/a.bin".into(),
                offset: 2,
                length: 100,
            },
        ))
        .unwrap();
        assert!(
            matches!(&read, FileResult::Read { data, total_size: 6, .. } if data[..] == content[2..]),
            "{read:?}"
        );
        std::fs::write(dir.path().join("t.txt"), "a b a\n").unwrap();
        let edit = |old: &str, all| {
            perform(&request(
                dir.path(),
                FileOp::Edit {
                    path: "t.txt".into(),
                    old_text: old.into(),
                    new_text: "x".into(),
                    replace_all: all,
                },
            ))
        };
        assert!(edit("zz", false).unwrap_err().0.contains("not found"));
        assert!(edit("a", false).unwrap_err().0.contains("occurs 2 times"));
        assert!(matches!(
            edit("b", false).unwrap(),
            FileResult::Edited {
                replacements: 1,
                ..
            }
        ));
        assert!(matches!(
            edit("a", true).unwrap(),
            FileResult::Edited {
                replacements: 2,
                ..
            }
        ));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("t.txt")).unwrap(),
            "x x x\n"
        );
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let (entries, left_off) = list(dir.path(), 2, 0);
        assert_eq!(left_off, 0);
        let names: Vec<_> = entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("link", "symlink"),
                ("sub", "dir"),
                ("sub/a.bin", "file"),
                ("t.txt", "file")
            ]
        );
        assert_eq!(entries[0].target.as_deref(), Some("/etc/passwd"));
    }

    /// A write under a missing directory says how to have it made; a dangling symlink where
    /// the file would be is not taken for a missing directory.
    #[test]
    fn a_write_under_a_missing_directory_says_to_set_create_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let write = |path: &str| {
            perform(&request(
                dir.path(),
                FileOp::Write {
                    path: path.into(),
                    content: b"x".to_vec(),
                    mode: None,
                    create_dirs: false,
                },
            ))
        };
        let err = write("no/such/f").unwrap_err();
        assert!(
            err.0
                .ends_with("no/such/f: its directory does not exist; set createDirs to create it"),
            "{err}"
        );
        std::os::unix::fs::symlink("gone/x", dir.path().join("dangling")).unwrap();
        let err = write("dangling").unwrap_err();
        assert!(err.0.contains("No such file or directory"), "{err}");
    }

    /// A name or a symlink target that is not UTF-8 is listed with U+FFFD and flagged, so
    /// that a copy knows the name listed reaches nothing.
    #[test]
    fn names_and_targets_that_are_not_utf8_are_flagged() {
        use std::os::unix::ffi::OsStrExt as _;
        let dir = tempfile::tempdir().unwrap();
        let odd = std::ffi::OsStr::from_bytes(b"caf\xe9");
        std::fs::write(dir.path().join(odd), b"").unwrap();
        std::os::unix::fs::symlink(odd, dir.path().join("link")).unwrap();
        std::fs::write(dir.path().join("plain"), b"").unwrap();
        // A target of 3000 bytes that are not text: listed, cut to a path's length.
        std::os::unix::fs::symlink(
            std::ffi::OsStr::from_bytes(&[0xff; 3000]),
            dir.path().join("long"),
        )
        .unwrap();
        let (entries, _) = list(dir.path(), 1, 0);
        let long = entries.iter().find(|e| e.name == "long").unwrap();
        assert!(long.not_utf8 && long.target.as_ref().unwrap().len() <= MAX_PATH);
        let entries: Vec<_> = entries.into_iter().filter(|e| e.name != "long").collect();
        let flags: Vec<_> = entries
            .iter()
            .map(|e| (e.name.as_str(), e.target.as_deref(), e.not_utf8))
            .collect();
        assert_eq!(
            flags,
            [
                ("caf\u{fffd}", None, true),
                ("link", Some("caf\u{fffd}"), true),
                ("plain", None, false)
            ]
        );
        // Below a directory whose name is not UTF-8, no name listed is a real one.
        std::fs::create_dir(dir.path().join(std::ffi::OsStr::from_bytes(b"d\xff"))).unwrap();
        std::fs::write(
            dir.path().join(std::ffi::OsStr::from_bytes(b"d\xff/in")),
            b"",
        )
        .unwrap();
        let (entries, _) = list(dir.path(), 2, 0);
        let inner = entries.iter().find(|e| e.name == "d\u{fffd}/in").unwrap();
        assert!(inner.not_utf8);
    }

    #[test]
    fn a_long_listing_is_read_page_by_page_from_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let total = MAX_LIST_ENTRIES as usize + 5;
        for n in 0..total {
            std::fs::write(dir.path().join(format!("f{n:05}")), b"").unwrap();
        }
        let page = |depth: u32, offset: u64| {
            let (entries, left_off) = list(dir.path(), depth, offset);
            let names: Vec<String> = entries.into_iter().map(|e| e.name).collect();
            (names, left_off)
        };
        let (first, left_off) = page(1, 0);
        assert_eq!((first.len(), left_off), (MAX_LIST_ENTRIES as usize, 5));
        assert_eq!(first[0], "f00000");
        let (rest, left_off) = page(1, u64::from(MAX_LIST_ENTRIES));
        assert_eq!(left_off, 0);
        let wanted: Vec<String> = (MAX_LIST_ENTRIES as usize..total)
            .map(|n| format!("f{n:05}"))
            .collect();
        assert_eq!(rest, wanted);
        // Deeper listings page the same order.
        std::fs::create_dir(dir.path().join("f00001.d")).unwrap();
        std::fs::write(dir.path().join("f00001.d/in"), b"").unwrap();
        let (deep, _) = page(2, 2);
        assert_eq!(deep[..3], ["f00001.d", "f00001.d/in", "f00002"]);
        assert!(page(1, 1_000_000).0.is_empty());
    }
}
