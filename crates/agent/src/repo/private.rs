//! The **private** repository (`<state dir>/private`): where it is, how a guarded git run
//! reaches it (see [`gitguard`]), the notes the baseline leaves beside it (its commit, its
//! workspace, its largest file), and git runs fed on their standard input.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};
use tokio::sync::mpsc;

use super::error::RepoError;
use super::request::{arg_with, blocking};
use crate::command::RunError;
use crate::fsutil;
use crate::git::{self, Git, Run};
use crate::gitguard;
use crate::process_group::Stop;
use crate::spawn::ExecUser;
use crate::statedir::{self, BASELINE_DIR, BASELINE_INDEX, BASELINE_REPO};

/// Where the private repository is.
pub(super) struct Private {
    pub(super) state_dir: PathBuf,
    /// `<state dir>/private`
    pub(super) dir: PathBuf,
}

impl Private {
    pub(super) fn new(state_dir: &Path) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            dir: state_dir.join(OsStr::from_bytes(BASELINE_DIR.to_bytes())),
        }
    }

    /// Opens the private directory for git runs, which run as its owner.
    pub(super) fn open(
        &self,
        program: &std::ffi::CStr,
        attr_source: bool,
    ) -> Result<Opened, RepoError> {
        let state = statedir::open_state_dir(&self.state_dir)?;
        let dir = fsutil::open_dir_at(state.as_fd(), BASELINE_DIR).map_err(|err| match err {
            Errno::ENOENT => RepoError::NoBaseline,
            err => RepoError::OpenPrivate(err),
        })?;
        let stat = nix::sys::stat::fstat(dir.as_fd()).map_err(RepoError::InspectPrivate)?;
        let user = (stat.st_uid != nix::unistd::geteuid().as_raw()).then_some(ExecUser {
            uid: stat.st_uid,
            gid: stat.st_gid,
        });
        let exe = gitguard::executable(&self.state_dir, state.as_fd(), program)?;
        Ok(Opened {
            dir,
            exe,
            user,
            attr_source,
            git_dir: self.dir.join(OsStr::from_bytes(BASELINE_REPO.to_bytes())),
            index: self.dir.join(OsStr::from_bytes(BASELINE_INDEX.to_bytes())),
        })
    }
}

/// The open private directory: what a guarded git run needs.
pub(super) struct Opened {
    /// For the agent's own steps in the directory (it belongs to the sandbox user).
    pub(super) dir: OwnedFd,
    /// The execute-only git (see [`gitguard`]).
    pub(super) exe: std::ffi::CString,
    /// The directory's owner, unless that is the agent.
    pub(super) user: Option<ExecUser>,
    pub(super) attr_source: bool,
    pub(super) git_dir: PathBuf,
    pub(super) index: PathBuf,
}

impl Opened {
    /// A guarded run in the private repository (see [`gitguard`]): as its owner, with the git
    /// group, from the execute-only git, with the private index and (when supported)
    /// attributes read from the empty tree. The working directory is `/`, outside the work
    /// tree, as the previous location (the state directory) is closed to the user.
    pub(super) fn run(&self) -> Run<'static> {
        let mut run = Run::new(Path::new("/"))
            .user(self.user)
            .guarded(self.exe.clone(), self.user.map(|_| gitguard::GIT_GROUP))
            .env("GIT_INDEX_FILE", self.index.to_string_lossy());
        if self.attr_source {
            run = run
                .env("GIT_ATTR_SOURCE", git::EMPTY_TREE_SHA1)
                // The same git (2.40+) writes the index without its trailing SHA-1, which
                // every later run of a diff would otherwise check again: 1.6 MB for 20,000
                // files, through the collision-detecting SHA-1, in each of four runs.
                .config("index.skipHash=true");
        }
        run
    }

    /// Runs the agent's own blocking file work `f` in the private directory, on the
    /// blocking pool.
    pub(super) async fn in_dir<T: Send + 'static, E: Into<RepoError>>(
        &self,
        f: impl FnOnce(BorrowedFd<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, RepoError> {
        let dir = self.dir.try_clone().map_err(RepoError::ReachPrivate)?;
        blocking(move || f(dir.as_fd()).map_err(Into::into)).await
    }

    /// `--git-dir=… --work-tree=… rest…`
    pub(super) fn args<S: AsRef<OsStr>>(&self, work_tree: &Path, rest: &[S]) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            arg_with("--git-dir=", &self.git_dir),
            arg_with("--work-tree=", work_tree),
        ];
        args.extend(rest.iter().map(|arg| arg.as_ref().to_owned()));
        args
    }
}

/// Writes one of the baseline's records (its workspace, so a diff of another path is
/// refused; its commit id) into the state directory.
pub(super) fn write_note(
    state_fd: &OwnedFd,
    name: &std::ffi::CStr,
    content: &[u8],
) -> Result<(), RepoError> {
    let what = || name.to_string_lossy().into_owned();
    let _ = unlinkat(state_fd.as_fd(), name, UnlinkatFlags::NoRemoveDir);
    let fd = openat(
        state_fd.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::S_IRUSR | Mode::S_IWUSR,
    )
    .map_err(|source| RepoError::CreateNote {
        what: what(),
        source,
    })?;
    File::from(fd)
        .write_all(content)
        .map_err(|source| RepoError::WriteNote {
            what: what(),
            source,
        })
}

/// Reads a record written by [`write_note`]; a missing one means there is no baseline.
pub(super) fn read_note(
    state_fd: BorrowedFd<'_>,
    name: &std::ffi::CStr,
) -> Result<Vec<u8>, RepoError> {
    let what = || name.to_string_lossy().into_owned();
    let note = openat(
        state_fd,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|err| match err {
        Errno::ENOENT => RepoError::NoBaseline,
        source => RepoError::OpenNote {
            what: what(),
            source,
        },
    })?;
    let mut content = Vec::new();
    File::from(note)
        .read_to_end(&mut content)
        .map_err(|source| RepoError::ReadNote {
            what: what(),
            source,
        })?;
    Ok(content)
}

/// Gives the freshly made private directory (nobody else has reached it yet) to `user`,
/// recursively, following no symlink.
pub(super) fn hand_over(
    dir: BorrowedFd<'_>,
    user: ExecUser,
    depth: usize,
) -> Result<(), RepoError> {
    const MAX_DEPTH: usize = 8;
    let fail = |source: Errno| RepoError::HandOver {
        uid: user.uid,
        source,
    };
    if depth > MAX_DEPTH {
        return Err(fail(Errno::ELOOP));
    }
    fchown(
        dir,
        Some(Uid::from_raw(user.uid)),
        Some(Gid::from_raw(user.gid)),
    )
    .map_err(fail)?;
    for name in fsutil::list_dir(dir).map_err(fail)? {
        match fsutil::open_dir_at(dir, &name) {
            Ok(sub) => hand_over(sub.as_fd(), user, depth + 1)?,
            Err(Errno::ENOTDIR | Errno::ELOOP) => nix::unistd::fchownat(
                dir,
                name.as_c_str(),
                Some(Uid::from_raw(user.uid)),
                Some(Gid::from_raw(user.gid)),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(fail)?,
            Err(err) => return Err(fail(err)),
        }
    }
    Ok(())
}

/// `git cat-file BATCH` of the private repository for `ids` (deduplicated); its output.
pub(super) async fn cat_file_batch(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    batch: &str,
    ids: &[String],
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Vec<u8>, RepoError> {
    let Some(input) = batch_input(ids) else {
        return Ok(Vec::new());
    };
    run_fed(git, private, workspace, &["cat-file", batch], input, stop).await
}

/// One id per line, each once; `None` for no ids.
pub(super) fn batch_input(ids: &[String]) -> Option<Vec<u8>> {
    let mut ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return None;
    }
    let mut input = ids.join("\n").into_bytes();
    input.push(b'\n');
    Some(input)
}

/// A guarded run in the private repository (see [`Opened::run`]) with `input` on git's stdin,
/// to its end: its output and how it ended, whatever that was.
pub(super) async fn run_fed_status(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    args: &[&str],
    input: Vec<u8>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(Vec<u8>, crate::command::Finished), RepoError> {
    let (read, feeder) = feed(input)?;
    let result = git
        .run_status(
            &private.args(workspace, args),
            private.run().stdin(read),
            stop,
        )
        .await;
    let _ = feeder.await;
    Ok(result?)
}

/// [`run_fed_status`] where anything but success is an error, as [`Git::run`] has it.
pub(super) async fn run_fed(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    args: &[&str],
    input: Vec<u8>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Vec<u8>, RepoError> {
    let (out, finished) = run_fed_status(git, private, workspace, args, input, stop).await?;
    if finished.success() {
        Ok(out)
    } else {
        Err(RunError::GitFailed {
            subcommand: git::subcommand(args),
            outcome: finished.describe(),
        }
        .into())
    }
}

/// A pipe whose read end is a child's stdin, fed `input` from the blocking pool while the
/// child reads; the child's exit closes it.
pub(super) fn feed(
    input: Vec<u8>,
) -> Result<(OwnedFd, tokio::task::JoinHandle<std::io::Result<()>>), RepoError> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(RepoError::Pipe)?;
    let feeder = tokio::task::spawn_blocking(move || File::from(write).write_all(&input));
    Ok((read, feeder))
}
