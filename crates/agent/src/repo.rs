//! `Baseline` and `Diff`: the user's repository in the workspace, and the agent's private
//! record of the imported state.
//!
//! Two repositories are involved:
//!
//! - the **user's** (`<workspace>/.git`), made by git running *as the sandbox user* (the
//!   request's owner), so the user owns it and nothing the agent does there runs with more
//!   privilege than the user has. It gets the imported history and HEAD, and an index equal to
//!   HEAD, so `git status` in the guest shows the uncommitted changes the project had on the
//!   host. What the user does with it later does not matter to the agent.
//! - the **private** one (`<state dir>/private/baseline.git`, with its index
//!   `<state dir>/private/index`). The baseline is a commit of the whole work tree there; every
//!   diff is baseline → work tree, computed there, with `--git-dir`/`--work-tree` given on
//!   every call so that the workspace's own `.git` (config, hooks, attributes filters) is never
//!   read. The private repository's `info/attributes` holds
//!   [`dynocap_proto::NEUTRAL_ATTRIBUTES`], which outranks the work tree's `.gitattributes`,
//!   so that they cannot change content either, with any git; where git supports it (2.40+),
//!   `GIT_ATTR_SOURCE` also points at the empty tree.
//!
//! Every git run that reads the workspace runs as the sandbox user, never as the agent: the
//! user can swap a directory for a symlink while git walks the tree, and git then reads what
//! the symlink points to. As the sandbox user, that can only be what the user could read
//! anyway. [`gitguard`] explains how those runs reach the private repository (a descriptor,
//! below the agent's 0700 state directory) while no other process of that user can reach it
//! or them. The baseline commit id is kept in the state directory and named explicitly.
//!
//! Both requests hold the server's repository lock, so they never race on the private index.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use dynocap_proto::{
    channel, BaselineRequest, DiffRequest, Frame, FrameKind, Response, DATA_CHUNK,
    NEUTRAL_ATTRIBUTES,
};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, fstatat, Mode};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};
use tokio::sync::{mpsc, Mutex};

use crate::bigfiles;
use crate::command::{stop_requested, Child, RunError};
use crate::config::Config;
use crate::diff_split;
use crate::fsutil;
use crate::git::{self, first_line, is_object_id, Git, Run};
use crate::gitguard;
use crate::index_memo::{self, Memo as IndexMemo, Seen};
use crate::journal::{Changed, Tracker};
use crate::outbox::Outbox;
use crate::process_group::Stop;
use crate::spawn::{ChildSpec, ExecUser};
use crate::statedir::{
    self, BASELINE_COMMIT, BASELINE_DIR, BASELINE_FILES, BASELINE_INDEX, BASELINE_INDEX_LOCK,
    BASELINE_LARGEST, BASELINE_REPO, BASELINE_WORKSPACE,
};

/// Branch a repository starts on when the host did not name one.
const DEFAULT_BRANCH: &str = "main";
/// Fixed date of the baseline commit, so the same tree always gives the same commit.
const BASELINE_DATE: &str = "@0 +0000";

/// What HEAD was on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Head {
    Branch(String),
    Commit(String),
}

fn parse_head(head: &str) -> Result<Head, String> {
    if let Some(branch) = head.strip_prefix("refs/heads/") {
        // git check-ref-format runs later; these keep the name from ever looking like an
        // option or a path.
        if branch.is_empty()
            || branch.starts_with('-')
            || branch.contains("..")
            || branch.bytes().any(|b| b.is_ascii_control() || b == b' ')
        {
            return Err(format!("head {head:?} is not a valid branch name"));
        }
        return Ok(Head::Branch(branch.to_owned()));
    }
    let lower = head.to_ascii_lowercase();
    if is_object_id(&lower) {
        return Ok(Head::Commit(lower));
    }
    Err(format!(
        "head {head:?} is neither refs/heads/NAME nor a full commit id"
    ))
}

/// Checks a workspace path and opens it without following symlinks.
fn open_workspace(workspace: &str) -> Result<(PathBuf, OwnedFd), String> {
    let path = PathBuf::from(workspace);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "workspace {workspace:?} must be an absolute path without '..'"
        ));
    }
    // `/workspace/` and `/workspace/.` are `/workspace`: the baseline records one spelling.
    let path: PathBuf = path.components().collect();
    let fd = fsutil::open_dir_nofollow(&path)
        .map_err(|err| format!("cannot open the workspace {workspace}: {err}"))?;
    Ok((path, fd))
}

fn cancelled_or(err: RunError, what: &str) -> String {
    match err {
        RunError::Cancelled => format!("{what} was cancelled"),
        RunError::Failed(message) => message,
    }
}

/// Takes the repository lock, unless a stop comes first.
async fn lock<'a, T>(
    lock: &'a Mutex<T>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<tokio::sync::MutexGuard<'a, T>, RunError> {
    tokio::select! {
        biased;
        () = stop_requested(stop) => Err(RunError::Cancelled),
        guard = lock.lock() => Ok(guard),
    }
}

/// Runs a blocking closure on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|err| format!("internal error: {err}"))?
}

/// Where the private repository is.
struct Private {
    state_dir: PathBuf,
    /// `<state dir>/private`
    dir: PathBuf,
}

impl Private {
    fn new(state_dir: &Path) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            dir: state_dir.join(OsStr::from_bytes(BASELINE_DIR.to_bytes())),
        }
    }

    /// Opens the private directory for git runs, which run as its owner.
    fn open(&self, program: &std::ffi::CStr, attr_source: bool) -> Result<Opened, String> {
        let state = statedir::open_state_dir(&self.state_dir)?;
        let dir = fsutil::open_dir_at(state.as_fd(), BASELINE_DIR).map_err(|err| match err {
            Errno::ENOENT => "there is no baseline: send Baseline before Diff".to_owned(),
            err => format!("cannot open the private repository: {err}"),
        })?;
        let stat = nix::sys::stat::fstat(dir.as_fd())
            .map_err(|err| format!("cannot inspect the private repository: {err}"))?;
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
struct Opened {
    /// For the agent's own steps in the directory (it belongs to the sandbox user).
    dir: OwnedFd,
    /// The execute-only git (see [`gitguard`]).
    exe: std::ffi::CString,
    /// The directory's owner, unless that is the agent.
    user: Option<ExecUser>,
    attr_source: bool,
    git_dir: PathBuf,
    index: PathBuf,
}

impl Opened {
    /// A guarded run in the private repository (see [`gitguard`]): as its owner, with the git
    /// group, from the execute-only git, with the private index and (when supported)
    /// attributes read from the empty tree. The working directory is `/`, outside the work
    /// tree, as the previous location (the state directory) is closed to the user.
    fn run(&self) -> Run<'static> {
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
    async fn in_dir<T: Send + 'static>(
        &self,
        f: impl FnOnce(BorrowedFd<'_>) -> Result<T, String> + Send + 'static,
    ) -> Result<T, RunError> {
        let dir = self.dir.try_clone().map_err(|err| {
            RunError::Failed(format!("cannot reach the private repository: {err}"))
        })?;
        blocking(move || f(dir.as_fd()))
            .await
            .map_err(RunError::Failed)
    }

    /// `--git-dir=… --work-tree=… rest…`
    fn args<S: AsRef<OsStr>>(&self, work_tree: &Path, rest: &[S]) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            arg_with("--git-dir=", &self.git_dir),
            arg_with("--work-tree=", work_tree),
        ];
        args.extend(rest.iter().map(|arg| arg.as_ref().to_owned()));
        args
    }
}

fn arg_with(prefix: &str, path: &Path) -> OsString {
    let mut arg = OsString::from(prefix);
    arg.push(path.as_os_str());
    arg
}

/// Handles `Baseline`.
pub async fn baseline(
    req: BaselineRequest,
    config: &Config,
    repo_lock: &Mutex<Tracker>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Response, String> {
    let (workspace, ws_fd) = open_workspace(&req.workspace)?;
    let head = match (&req.bundle, &req.head) {
        (Some(_), Some(head)) => Some(parse_head(head)?),
        // Without history the head only names the branch to start on, when it is one.
        (None, Some(head)) => parse_head(head)
            .ok()
            .filter(|h| matches!(h, Head::Branch(_))),
        (_, None) => None,
    };
    let owner = ExecUser {
        uid: req.owner_uid,
        gid: req.owner_gid,
    };
    let user = (owner.uid != nix::unistd::geteuid().as_raw()).then_some(owner);

    let mut tracker = lock(repo_lock, stop)
        .await
        .map_err(|err| cancelled_or(err, "the baseline"))?;
    // The previous journal is of the previous baseline.
    *tracker = Tracker::Idle;
    let state_dir = config.state_dir.clone();
    let bundle_name = req.bundle.clone();
    // Opening the state directory and copying the bundle are blocking file work.
    let (state_fd, bundle) = blocking(move || {
        let state_fd = statedir::open_state_dir(&state_dir)?;
        let bundle = match bundle_name {
            None => None,
            Some(name) => Some(bundle_for(state_fd.as_fd(), &name, user)?),
        };
        Ok((state_fd, bundle))
    })
    .await?;
    let git = git::git(stop)
        .await
        .map_err(|err| cancelled_or(err, "the baseline"))?;
    let had_git_dir = fstatat(
        ws_fd.as_fd(),
        c".git",
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .is_ok();
    let private = Private::new(&config.state_dir);

    // Until the user's repository is done, the previous baseline (if any) is untouched.
    let mut replacing = false;
    // The journal starts watching while the user's repository is made (which changes only its
    // `.git`), and before the baseline is read: a change from then on is in the first diff.
    let watched = workspace.clone();
    let journal = tokio::task::spawn_blocking(move || Tracker::started(&watched));
    let outcome = async {
        user_repository(git, &workspace, user, head.as_ref(), bundle, stop).await?;
        replacing = true;
        *tracker = journal
            .await
            .map_err(|err| RunError::Failed(format!("internal error: {err}")))?;
        let (commit, largest) = record_baseline(git, &private, &workspace, user, stop).await?;
        write_note(&state_fd, BASELINE_COMMIT, commit.as_bytes())?;
        // Without the note, every diff sizes its changed files with git.
        if let Some(largest) = largest {
            write_note(&state_fd, BASELINE_LARGEST, largest.to_string().as_bytes())?;
        }
        write_note(
            &state_fd,
            BASELINE_WORKSPACE,
            workspace.as_os_str().as_bytes(),
        )?;
        Ok::<_, RunError>(commit)
    }
    .await;
    match outcome {
        Ok(commit) => Ok(Response::Baseline { commit }),
        Err(err) => {
            let message = cancelled_or(err, "the baseline");
            let state = state_fd;
            blocking(move || {
                // What this request made is removed: the half-made private repository (the
                // previous one is gone once it was being replaced), and the user's .git when
                // it did not exist before.
                for name in BASELINE_FILES.iter().filter(|_| replacing) {
                    if let Err(err) = fsutil::remove_at(state.as_fd(), name) {
                        log!("cleaning up the failed baseline: {err}");
                    }
                }
                if !had_git_dir {
                    if let Err(err) = fsutil::remove_at(ws_fd.as_fd(), c".git") {
                        log!("cleaning up the workspace's .git after a failed baseline: {err}");
                    }
                }
                Ok(())
            })
            .await?;
            Err(message)
        }
    }
}

/// Writes one of the baseline's records (its workspace, so a diff of another path is
/// refused; its commit id) into the state directory.
fn write_note(state_fd: &OwnedFd, name: &std::ffi::CStr, content: &[u8]) -> Result<(), String> {
    let what = name.to_string_lossy();
    let _ = unlinkat(state_fd.as_fd(), name, UnlinkatFlags::NoRemoveDir);
    let fd = openat(
        state_fd.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::S_IRUSR | Mode::S_IWUSR,
    )
    .map_err(|err| format!("cannot record the {what}: {err}"))?;
    File::from(fd)
        .write_all(content)
        .map_err(|err| format!("cannot record the {what}: {err}"))
}

/// Reads a record written by [`write_note`]; a missing one means there is no baseline.
fn read_note(state_fd: BorrowedFd<'_>, name: &std::ffi::CStr) -> Result<Vec<u8>, String> {
    let what = name.to_string_lossy();
    let note = openat(
        state_fd,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|err| match err {
        Errno::ENOENT => "there is no baseline: send Baseline before Diff".to_owned(),
        err => format!("cannot read the {what}: {err}"),
    })?;
    let mut content = Vec::new();
    File::from(note)
        .read_to_end(&mut content)
        .map_err(|err| format!("cannot read the {what}: {err}"))?;
    Ok(content)
}

/// Gives the freshly made private directory (nobody else has reached it yet) to `user`,
/// recursively, following no symlink.
fn hand_over(dir: BorrowedFd<'_>, user: ExecUser, depth: usize) -> Result<(), String> {
    const MAX_DEPTH: usize = 8;
    let fail = |err: Errno| {
        format!(
            "cannot hand the private repository to uid {}: {err}",
            user.uid
        )
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

/// A descriptor of the bundle the sandbox user's git can read: the file itself when git runs
/// as the agent, else a copy owned by that user whose name is removed at once (git opens it
/// as `/proc/self/fd/0`, which re-checks the file's own permissions but not the 0700 state
/// directory's).
fn bundle_for(
    state_fd: std::os::fd::BorrowedFd<'_>,
    name: &str,
    user: Option<ExecUser>,
) -> Result<OwnedFd, String> {
    let mut original = statedir::open_received(state_fd, name)?;
    let Some(user) = user else {
        return Ok(OwnedFd::from(original));
    };
    let temp = c".bundle-for-fetch";
    let _ = unlinkat(state_fd, temp, UnlinkatFlags::NoRemoveDir);
    let fd = openat(
        state_fd,
        temp,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::S_IRUSR | Mode::S_IWUSR,
    )
    .map_err(|err| format!("cannot copy the bundle: {err}"))?;
    let _ = unlinkat(state_fd, temp, UnlinkatFlags::NoRemoveDir);
    fchown(
        fd.as_fd(),
        Some(Uid::from_raw(user.uid)),
        Some(Gid::from_raw(user.gid)),
    )
    .and_then(|()| fchmod(fd.as_fd(), Mode::S_IRUSR | Mode::S_IWUSR))
    .map_err(|err| format!("cannot hand the bundle copy to uid {}: {err}", user.uid))?;
    let mut copy = File::from(fd);
    std::io::copy(&mut original, &mut copy)
        .map_err(|err| format!("cannot copy the bundle: {err}"))?;
    Ok(OwnedFd::from(copy))
}

/// The path the bundle has in git's eyes: its standard input, reopened.
const BUNDLE_PATH: &str = "/proc/self/fd/0";

/// Makes the user's repository: init, history, HEAD, index = HEAD. Runs as `user`.
async fn user_repository(
    git: &Git,
    workspace: &Path,
    user: Option<ExecUser>,
    head: Option<&Head>,
    bundle: Option<OwnedFd>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RunError> {
    let dup = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|err| RunError::Failed(format!("cannot pass the bundle to git: {err}")))
    };
    let as_user = || Run::new(workspace).user(user);
    let git_dir = arg_with("--git-dir=", &workspace.join(".git"));
    let work_tree = arg_with("--work-tree=", workspace);
    let in_repo = |rest: &[&str]| -> Vec<OsString> {
        let mut args = vec![git_dir.clone(), work_tree.clone()];
        args.extend(rest.iter().map(Into::into));
        args
    };

    // What the bundle holds decides the object format and whether HEAD is in it.
    let mut refs: Vec<(String, String)> = Vec::new();
    if let Some(bundle) = &bundle {
        let out = git
            .run(
                &["bundle", "list-heads", BUNDLE_PATH],
                Run::new(Path::new("/")).user(user).stdin(dup(bundle)?),
                stop,
            )
            .await?;
        refs = String::from_utf8_lossy(&out)
            .lines()
            .filter_map(|line| {
                let (oid, name) = line.split_once(' ')?;
                Some((oid.to_owned(), name.to_owned()))
            })
            .collect();
        if let Some(Head::Branch(branch)) = head {
            let wanted = format!("refs/heads/{branch}");
            if !refs.iter().any(|(_, name)| *name == wanted) {
                return Err(RunError::Failed(format!(
                    "the history bundle has no branch {branch}"
                )));
            }
        }
    }
    let sha256 = match head {
        Some(Head::Commit(id)) => id.len() == 64,
        _ => refs.first().is_some_and(|(oid, _)| oid.len() == 64),
    };

    let branch = match head {
        Some(Head::Branch(branch)) => branch.as_str(),
        _ => DEFAULT_BRANCH,
    };
    git.run(
        &["check-ref-format", &format!("refs/heads/{branch}")],
        Run::new(Path::new("/")),
        stop,
    )
    .await
    .map_err(|_| RunError::Failed(format!("{branch:?} is not a valid branch name")))?;
    let initial = format!("--initial-branch={branch}");
    let mut init = vec!["init", "-q", initial.as_str()];
    if sha256 {
        init.push("--object-format=sha256");
    }
    git.run(&init, as_user(), stop).await?;

    let Some(bundle) = bundle else {
        return Ok(());
    };
    let mut fetch = vec![
        "fetch",
        "-q",
        "--update-head-ok",
        "--no-tags",
        BUNDLE_PATH,
        "refs/heads/*:refs/heads/*",
    ];
    // A detached HEAD's history may be in the bundle only under HEAD.
    if matches!(head, Some(Head::Commit(_))) && refs.iter().any(|(_, name)| name == "HEAD") {
        fetch.push("HEAD");
    }
    git.run(
        &in_repo(&fetch),
        as_user()
            .config("protocol.file.allow=always")
            .stdin(dup(&bundle)?),
        stop,
    )
    .await?;
    drop(bundle);

    match head {
        Some(Head::Branch(branch)) => {
            let target = format!("refs/heads/{branch}");
            git.run(
                &in_repo(&["symbolic-ref", "HEAD", &target]),
                as_user(),
                stop,
            )
            .await?;
        }
        Some(Head::Commit(id)) => {
            let commit = format!("{id}^{{commit}}");
            let found = git
                .run(
                    &in_repo(&["rev-parse", "-q", "--verify", &commit]),
                    as_user(),
                    stop,
                )
                .await
                .map_err(|_| RunError::Failed(format!("the history bundle has no commit {id}")))?;
            let found = first_line(&found);
            git.run(
                &in_repo(&["update-ref", "--no-deref", "HEAD", &found]),
                as_user(),
                stop,
            )
            .await?;
        }
        None => {}
    }
    // HEAD may be unborn (no head given and no `main` in the bundle): then there is nothing
    // to reset to, and every file shows as untracked.
    let (_, has_head) = git
        .run_status(
            &in_repo(&["rev-parse", "-q", "--verify", "HEAD^{commit}"]),
            as_user(),
            stop,
        )
        .await?;
    if has_head.success() {
        git.run(&in_repo(&["reset", "-q"]), as_user(), stop).await?;
    }
    Ok(())
}

/// Makes the private repository afresh, owned by `owner` (the sandbox user; `None` when that
/// is the agent itself), and commits the whole work tree as the baseline. Returns the commit,
/// and the size of its largest file as the index records it (`None`, logged, if the index
/// cannot be read: diffs then size their files with git).
async fn record_baseline(
    git: &Git,
    private: &Private,
    workspace: &Path,
    owner: Option<ExecUser>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(String, Option<u64>), RunError> {
    let state_dir = private.state_dir.clone();
    blocking(move || {
        let fd = statedir::open_state_dir(&state_dir)?;
        for name in BASELINE_FILES {
            fsutil::remove_at(fd.as_fd(), name)
                .map_err(|err| format!("cannot remove the previous baseline: {err}"))?;
        }
        nix::sys::stat::mkdirat(fd.as_fd(), BASELINE_DIR, Mode::S_IRWXU)
            .map_err(|err| format!("cannot create the private repository: {err}"))?;
        Ok(())
    })
    .await?;
    // `git init` canonicalizes its target, which a guarded run cannot do (the path leads
    // through the state directory): the agent makes the empty repository, without templates
    // (no sample hooks), and hands it over. It reads nothing of the workspace.
    let init: [&OsStr; 6] = [
        "init".as_ref(),
        "--bare".as_ref(),
        "-q".as_ref(),
        "--template=".as_ref(),
        "--object-format=sha1".as_ref(),
        OsStr::from_bytes(BASELINE_REPO.to_bytes()),
    ];
    git.run(&init, Run::new(&private.dir), stop).await?;
    let state_dir = private.state_dir.clone();
    blocking(move || {
        let state = statedir::open_state_dir(&state_dir)?;
        let dir = fsutil::open_dir_at(state.as_fd(), BASELINE_DIR)
            .map_err(|err| format!("cannot open the private repository: {err}"))?;
        // Before the baseline is added: its blobs are the files' bytes, as the diffs' are.
        write_attributes(dir.as_fd(), NEUTRAL_ATTRIBUTES.as_bytes())?;
        match owner {
            Some(owner) => hand_over(dir.as_fd(), owner, 0),
            None => Ok(()),
        }
    })
    .await?;
    let state_dir = private.state_dir.clone();
    let (program, attr_source) = (git.program.clone(), git.attr_source);
    let private = blocking(move || Private::new(&state_dir).open(&program, attr_source)).await?;
    let private = &private;
    if git.attr_source {
        // GIT_ATTR_SOURCE names the empty tree; make sure the object exists.
        let out = git
            .run(
                &private.args(workspace, &["hash-object", "-w", "-t", "tree", "/dev/null"]),
                private.run(),
                stop,
            )
            .await?;
        if first_line(&out) != git::EMPTY_TREE_SHA1 {
            return Err(RunError::Failed(format!(
                "git hashed the empty tree as {}",
                first_line(&out)
            )));
        }
    }
    // --force: the baseline is the work tree exactly as imported, ignored files included (the
    // host may have sent tracked files that a .gitignore matches).
    add_all(
        git,
        private,
        workspace,
        &Storage::baseline(),
        &["--force"],
        None,
        stop,
    )
    .await?;
    let tree = first_line(
        &git.run(
            &private.args(workspace, &["write-tree"]),
            private.run(),
            stop,
        )
        .await?,
    );
    let commit = first_line(
        &git.run(
            &private.args(workspace, &["commit-tree", &tree, "-m", "dynocap baseline"]),
            private
                .run()
                .env("GIT_AUTHOR_NAME", git::IDENTITY_NAME)
                .env("GIT_AUTHOR_EMAIL", git::IDENTITY_EMAIL)
                .env("GIT_AUTHOR_DATE", BASELINE_DATE)
                .env("GIT_COMMITTER_DATE", BASELINE_DATE),
            stop,
        )
        .await?,
    );
    if !is_object_id(&commit) {
        return Err(RunError::Failed(format!(
            "git commit-tree printed {commit:?}, not a commit id"
        )));
    }
    // For people looking at the repository; diffs use the id the agent keeps.
    git.run(
        &private.args(workspace, &["update-ref", "refs/dynocap/baseline", &commit]),
        private.run(),
        stop,
    )
    .await?;
    // Read once here, the memo also spares the first diff a read of the index.
    let largest = match private.in_dir(IndexMemo::largest_entry).await {
        Ok(largest) => Some(largest),
        Err(err) => {
            let why = cancelled_or(err, "reading the private index");
            log!("cannot size the baseline's files: {why}");
            None
        }
    };
    Ok((commit, largest))
}

/// `git add -A` into the private index. Paths git cannot add are skipped, not fatal: a nested
/// repository without a commit, or a tracked file replaced by a FIFO or socket, must not make
/// every later diff fail. They are logged; a skipped tracked path keeps its previous entry.
///
/// With `within`, NUL-separated workspace-relative paths, only what is at or beneath them.
async fn add_all(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    storage: &Storage,
    extra: &[&str],
    within: Option<Vec<u8>>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RunError> {
    let mut rest = storage.args();
    if within.is_some() {
        // Names, never patterns: a file may be called `*` or `:(exclude)x`.
        rest.insert(0, "--literal-pathspecs");
        rest.extend_from_slice(&["add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"]);
    } else {
        rest.extend_from_slice(&["add", "-A"]);
    }
    rest.push("--ignore-errors");
    rest.extend_from_slice(extra);
    let (_, finished) = match within {
        Some(paths) => run_fed_status(git, private, workspace, &rest, paths, stop).await?,
        None => {
            git.run_status(&private.args(workspace, &rest), private.run(), stop)
                .await?
        }
    };
    match finished.status {
        Some(crate::reaper::ExitStatus::Exited(0)) => Ok(()),
        // --ignore-errors: some paths were skipped, the rest is in the index.
        Some(crate::reaper::ExitStatus::Exited(1)) => {
            log!(
                "git add skipped paths in {}: {}",
                workspace.display(),
                String::from_utf8_lossy(&finished.stderr).trim()
            );
            Ok(())
        }
        _ => Err(RunError::Failed(format!(
            "git add failed ({})",
            finished.describe()
        ))),
    }
}

/// Brings the private index up to date for what the journal saw change, as [`add_all`] would
/// for the whole workspace: the trees through `git add -A` limited to them; the paths
/// through `git update-index`, which reads and hashes those files alone, less the untracked
/// ones that git ignores (`git add -A` leaves those out; a tracked file stays tracked
/// whatever the ignore rules say). A path git refuses fails the whole step, and the caller
/// then scans everything, which skips such paths one by one.
async fn add_changed(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    changed: &Changed,
    storage: &Storage,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RunError> {
    // A pathspec that matches nothing is fatal to `git add`: a directory made and removed
    // between two diffs (a build's scratch) is gone from the work tree and was never in the
    // index. What is gone only leaves the index, which `git rm --cached` does quietly.
    let trees = changed.trees.clone();
    let ws = workspace.to_path_buf();
    let (present, gone): (Vec<Vec<u8>>, Vec<Vec<u8>>) = blocking(move || {
        let root = fsutil::open_dir_nofollow(&ws)
            .map_err(|err| format!("cannot open {}: {err}", ws.display()))?;
        Ok(trees
            .into_iter()
            .partition(|tree| !is_gone(root.as_fd(), tree)))
    })
    .await
    .map_err(RunError::Failed)?;
    if !present.is_empty() {
        let trees = nul_separated(present.iter().map(Vec::as_slice));
        add_all(git, private, workspace, storage, &[], Some(trees), stop).await?;
    }
    if !gone.is_empty() {
        let rm = [
            "--literal-pathspecs",
            "rm",
            "-r",
            "-q",
            "--cached",
            "--ignore-unmatch",
            "--pathspec-from-file=-",
            "--pathspec-file-nul",
        ];
        let gone = nul_separated(gone.iter().map(Vec::as_slice));
        run_fed(git, private, workspace, &rm, gone, stop).await?;
    }
    if changed.paths.is_empty() {
        return Ok(());
    }
    let memo = private.in_dir(IndexMemo::current).await?;
    let tracked = memo.tracked_of(&changed.paths);
    let untracked: std::collections::BTreeSet<Vec<u8>> =
        changed.paths.difference(&tracked).cloned().collect();
    let ignored = if untracked.is_empty() {
        untracked
    } else {
        ignored_of(git, private, workspace, &untracked, stop).await?
    };
    let fed: std::sync::Arc<Vec<Vec<u8>>> = std::sync::Arc::new(
        changed
            .paths
            .iter()
            .filter(|path| !ignored.contains(*path))
            .cloned()
            .collect(),
    );
    let before = look_in(workspace, &fed).await?;
    let mut rest = storage.args();
    rest.extend_from_slice(&["update-index", "-z", "--add", "--remove", "--stdin"]);
    let paths = nul_separated(fed.iter().map(Vec::as_slice));
    run_fed(git, private, workspace, &rest, paths, stop).await?;
    // What git did to each path, for the next diff; without it, that diff reads the index.
    if let Ok(after) = look_in(workspace, &fed).await {
        if let Some(memo) = memo.updated(&fed, &before, &after) {
            private.in_dir(move |dir| memo.keep(dir)).await?;
        }
    }
    Ok(())
}

/// [`index_memo::look`] at `paths` of the workspace at `workspace`, on the blocking pool.
async fn look_in(
    workspace: &Path,
    paths: &std::sync::Arc<Vec<Vec<u8>>>,
) -> Result<Vec<Seen>, RunError> {
    let (workspace, paths) = (workspace.to_path_buf(), std::sync::Arc::clone(paths));
    blocking(move || {
        let root = fsutil::open_dir_nofollow(&workspace)
            .map_err(|err| format!("cannot open {}: {err}", workspace.display()))?;
        Ok(index_memo::look(root.as_fd(), &paths))
    })
    .await
    .map_err(RunError::Failed)
}

/// Whether nothing is at the workspace-relative `path` (as far as the agent can tell without
/// following a symlink: one on the way leaves the path to `git add`, which knows what to do).
fn is_gone(workspace: BorrowedFd<'_>, path: &[u8]) -> bool {
    matches!(
        fsutil::open_beneath(workspace, OsStr::from_bytes(path), OFlag::O_PATH),
        Err(Errno::ENOENT | Errno::ENOTDIR)
    )
}

/// Which of the untracked `paths` git ignores. `--no-index`: they are all untracked, and
/// with the index git would look for each of them through every entry.
async fn ignored_of(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    paths: &std::collections::BTreeSet<Vec<u8>>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<std::collections::BTreeSet<Vec<u8>>, RunError> {
    // check-ignore reads each line as a pathspec, whose magic starts with `:`; behind `./`
    // such a name is a name. Git prints each ignored path as it was given.
    let given: Vec<Vec<u8>> = paths
        .iter()
        .map(|path| {
            if path.starts_with(b":") {
                [b"./", path.as_slice()].concat()
            } else {
                path.clone()
            }
        })
        .collect();
    let (out, finished) = run_fed_status(
        git,
        private,
        workspace,
        &["check-ignore", "--no-index", "-z", "--stdin"],
        nul_separated(given.iter().map(Vec::as_slice)),
        stop,
    )
    .await?;
    // 0: some are ignored; 1: none is.
    if !matches!(
        finished.status,
        Some(crate::reaper::ExitStatus::Exited(0 | 1))
    ) {
        return Err(RunError::Failed(format!(
            "git check-ignore failed ({})",
            finished.describe()
        )));
    }
    let printed: std::collections::BTreeSet<&[u8]> = out
        .split(|&byte| byte == 0)
        .filter(|name| !name.is_empty())
        .collect();
    Ok(paths
        .iter()
        .zip(&given)
        .filter(|(_, given)| printed.contains(given.as_slice()))
        .map(|(path, _)| path.clone())
        .collect())
}

/// `items`, each followed by a NUL: how git's `-z` inputs take names.
fn nul_separated<'a>(items: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut joined = Vec::new();
    for item in items {
        joined.extend_from_slice(item);
        joined.push(0);
    }
    joined
}

/// How the baseline's `git add` stores the whole tree: uncompressed. Deflating every file
/// (zlib level 1 for loose objects, level 6 for the files over [`BIG_FILE_THRESHOLD`], which
/// go to a pack) was the largest single cost of a task's start: 8.2 s of a 20,000-file /
/// 200 MB tree, 3.7 s stored; two 9 MB files, 1.5 s against 0.3 s. The price is disk: the
/// private repository holds the baseline at its full size (level 1 saves a third on text).
const BASELINE_COMPRESSION: [&str; 4] =
    ["-c", "core.looseCompression=0", "-c", "pack.compression=0"];

/// How a diff stores the changed files: stored, like the baseline. Git's default (level 6
/// for big files) made a diff of two changed 9 MB files cost a second; level 1 still took a
/// third of the `update-index` of a 50-file diff from the journal (18–49 ms against 14–18).
/// The price is disk, as for the baseline: each diff's new versions of the changed files at
/// their full size, in the task's scratch repository.
const DIFF_COMPRESSION: [&str; 4] = BASELINE_COMPRESSION;

/// How a `git add` or `git update-index` stores what it writes: its compression, and the
/// size over which a file is streamed into a pack rather than read whole.
///
/// Git reads a file under `core.bigFileThreshold` whole (mapped, so from the page cache, and
/// copied only when an attribute converts its line endings) and writes it as a loose object.
/// Above it, git streams the file into a new pack, which costs two more passes over the bytes
/// (the pack's checksum and CRC beside the object's id) and a sync of the pack. With two
/// 9 MB files changed among 29, the diff's `git add` took 106–120 ms read whole against
/// 230–270 ms streamed, and the whole `task diff` 379–438 ms against 417–535 (7 runs each).
struct Storage {
    threshold: String,
    compression: [&'static str; 4],
}

impl Storage {
    /// The smallest size a diff streams rather than reads whole.
    const FLOOR: u64 = 8 << 20;
    /// Git's own `core.bigFileThreshold`.
    const CEILING: u64 = 512 << 20;

    /// The baseline's: [`BASELINE_COMPRESSION`], the files over [`BIG_FILE_THRESHOLD`]
    /// streamed.
    fn baseline() -> Self {
        Self {
            threshold: BIG_FILE_THRESHOLD.to_owned(),
            compression: BASELINE_COMPRESSION,
        }
    }

    /// A diff's: [`DIFF_COMPRESSION`], and a file read whole up to half the diff's line
    /// budget. The budget is a quarter of the sandbox's memory and bounds what the diff itself
    /// holds of one file; half of it bounds what the add may map of one, between the
    /// baseline's 8 MiB (the smallest sandbox) and git's own default of 512 MiB.
    fn for_diff(line_diff_budget: u64) -> Self {
        let bytes = (line_diff_budget / 2).clamp(Self::FLOOR, Self::CEILING);
        Self {
            threshold: format!("core.bigFileThreshold={bytes}"),
            compression: DIFF_COMPRESSION,
        }
    }

    /// The `-c` options for git.
    fn args(&self) -> Vec<&str> {
        let mut args = vec!["-c", self.threshold.as_str()];
        args.extend_from_slice(&self.compression);
        args
    }
}

/// Git streams files above this size into the object store instead of reading them whole
/// (`git add`), and stores them without delta search; [`bigfiles`] makes the diff carry them
/// as binary.
const BIG_FILE_THRESHOLD: &str = "core.bigFileThreshold=8m";

/// The exact diff invocation: every option that changes the patch's shape is pinned.
const DIFF_ARGS: &[&str] = &[
    "-c",
    BIG_FILE_THRESHOLD,
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "diff.suppressBlankEmpty=false",
    "-c",
    "diff.relative=false",
    "-c",
    "color.ui=never",
    "-c",
    "core.quotePath=true",
    "diff",
    "--cached",
    "--binary",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--submodule=short",
    // A guest-written .gitmodules with `ignore = all` must not hide a submodule change.
    "--ignore-submodules=none",
    "--full-index",
];

/// The diff of the private index against `baseline`, limited to `paths` (taken literally)
/// when there are any: one part of a split diff (see [`diff_split`]).
fn diff_args(baseline: &str, paths: &[Vec<u8>]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["--literal-pathspecs".into()];
    args.extend(DIFF_ARGS.iter().map(OsString::from));
    args.push(baseline.into());
    if !paths.is_empty() {
        args.push("--".into());
        args.extend(paths.iter().map(|path| OsStr::from_bytes(path).to_owned()));
    }
    args
}

/// Handles `Diff`: streams the patch baseline → work tree on STDOUT.
pub async fn diff(
    req: DiffRequest,
    config: &Config,
    repo_lock: &Mutex<Tracker>,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Response, String> {
    let (workspace, _ws_fd) = open_workspace(&req.workspace)?;
    let line_diff_budget = req
        .line_diff_budget
        .unwrap_or(bigfiles::DEFAULT_LINE_DIFF_BUDGET);
    let storage = Storage::for_diff(line_diff_budget);
    let mut tracker = lock(repo_lock, stop)
        .await
        .map_err(|err| cancelled_or(err, "the diff"))?;
    let git = git::git(stop)
        .await
        .map_err(|err| cancelled_or(err, "the diff"))?;
    let state_dir = config.state_dir.clone();
    let (recorded, commit, baseline_largest, has_index, private) = blocking(move || {
        let fd = statedir::open_state_dir(&state_dir)?;
        let recorded = read_note(fd.as_fd(), BASELINE_WORKSPACE)?;
        // Written since this note exists; without it, git sizes the changed files.
        let baseline_largest = read_note(fd.as_fd(), BASELINE_LARGEST)
            .ok()
            .and_then(|note| String::from_utf8_lossy(&note).parse::<u64>().ok());
        let commit = String::from_utf8_lossy(&read_note(fd.as_fd(), BASELINE_COMMIT)?).into_owned();
        if !is_object_id(&commit) {
            return Err(format!(
                "the recorded baseline commit {commit:?} is not a commit id; send Baseline again"
            ));
        }
        let private = Private::new(&state_dir).open(&git.program, git.attr_source)?;
        // A stale lock is from a git this agent killed (cancel): nobody else uses the index.
        match unlinkat(
            private.dir.as_fd(),
            BASELINE_INDEX_LOCK,
            UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(err) => return Err(format!("cannot remove a stale index lock: {err}")),
        }
        let has_index = fstatat(
            private.dir.as_fd(),
            BASELINE_INDEX,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok();
        Ok((recorded, commit, baseline_largest, has_index, private))
    })
    .await?;
    if recorded != workspace.as_os_str().as_bytes() {
        return Err(format!(
            "the baseline is of {}, not of {}",
            String::from_utf8_lossy(&recorded),
            workspace.display()
        ));
    }

    let outcome: Result<u64, RunError> = async {
        if !has_index {
            // The index is the baseline's entries plus what earlier diffs added; rebuilt from
            // the baseline, tracked files that are ignored now stay tracked.
            git.run(
                &private.args(&workspace, &["read-tree", &commit]),
                private.run(),
                stop,
            )
            .await?;
        }
        // Without an index every file is looked at anyway.
        let full_scan = req.full_scan || !has_index;
        let (ws, mut held) = (workspace.clone(), std::mem::take(&mut *tracker));
        let (held, changed) = blocking(move || {
            let changed = held.changes(&ws, full_scan);
            Ok((held, changed))
        })
        .await
        .map_err(RunError::Failed)?;
        *tracker = held;
        let updated = match changed {
            Some(changed) => {
                match add_changed(git, &private, &workspace, &changed, &storage, stop).await {
                    Err(RunError::Failed(why)) => {
                        log!("scanning the whole workspace instead: {why}");
                        false
                    }
                    done => done.map(|()| true)?,
                }
            }
            None => false,
        };
        if !updated {
            add_all(git, &private, &workspace, &storage, &[], None, stop).await?;
        }
        // When no file on either side is large enough for its line diff to go over the
        // budget, even a line per byte, no file needs sizing or counting; and when none is
        // large enough for a split over the CPUs to pay, the changes need no listing either.
        let largest = private.in_dir(IndexMemo::largest_entry).await;
        let (sizing, splitting) = match (baseline_largest, largest) {
            (Some(old), Ok(new)) => (
                !bigfiles::none_can_exceed(old, new, line_diff_budget),
                old.max(new) >= diff_split::MIN_LARGEST_FILE,
            ),
            (_, largest) => {
                if let Err(err) = largest {
                    let why = cancelled_or(err, "reading the private index");
                    log!("sizing the changed files with git: {why}");
                }
                (true, true)
            }
        };
        let cpus = diff_split::parallelism();
        let splitting = splitting && cpus > 1;
        let changed = if sizing || splitting {
            Some(changed_files(git, &private, &workspace, &commit, stop).await?)
        } else {
            None
        };
        match changed.as_ref().filter(|_| sizing) {
            Some(changed) => {
                mark_big_files(git, &private, &workspace, changed, line_diff_budget, stop).await?
            }
            None if lists_big_files(&private) => {
                set_attributes(&private, NEUTRAL_ATTRIBUTES.as_bytes().to_vec()).await?
            }
            None => {}
        }
        let parts = changed
            .filter(|_| splitting)
            .and_then(|changed| changed.weighed())
            .and_then(|weighed| diff_split::plan(&weighed, cpus))
            .unwrap_or_else(|| vec![Vec::new()]);
        if parts.len() > 1 {
            log!("the diff runs in {} parts, one git each", parts.len());
        }
        let runs = parts
            .iter()
            .map(|paths| {
                git.spec(
                    &private.args(&workspace, &diff_args(&commit, paths)),
                    private.run(),
                )
            })
            .collect::<Result<Vec<_>, String>>()
            .map_err(RunError::Failed)?;
        stream_git_outputs("diff", &runs, req.max_bytes, stream, outbox, stop).await
    }
    .await;
    if outcome.is_err() {
        // The index may hold part of what was taken from the journal: the next diff scans.
        *tracker = Tracker::Idle;
    }
    match outcome {
        Ok(bytes) => {
            outbox
                .send(Frame::new(stream, FrameKind::Eof, vec![channel::STDOUT]))
                .await;
            Ok(Response::Diff { bytes })
        }
        Err(RunError::Cancelled) => Err("the diff was cancelled".into()),
        Err(RunError::Failed(message)) => Err(message),
    }
}

/// What the private index changes against the baseline: each path in the order the diff
/// prints them, and the sizes of the regular files' blobs on both sides.
struct ChangedFiles {
    changes: Vec<bigfiles::Change>,
    /// Every record of git's list parsed: each changed path is in `changes`.
    complete: bool,
    sizes: std::collections::HashMap<String, u64>,
}

impl ChangedFiles {
    /// What diffing each path costs, for [`diff_split::plan`]; `None` when the list may miss
    /// a path, which a split would then leave out of the patch.
    fn weighed(&self) -> Option<Vec<diff_split::Weighed>> {
        if !self.complete {
            return None;
        }
        let weighed = self.changes.iter().map(|change| {
            let blob_bytes = blobs_of(change)
                .into_iter()
                .flatten()
                .map(|id| self.sizes.get(&id).copied().unwrap_or(0))
                .fold(0_u64, u64::saturating_add);
            diff_split::Weighed {
                path: change.path.clone(),
                bytes: blob_bytes.saturating_add(diff_split::PER_PATH_BYTES),
            }
        });
        Some(weighed.collect())
    }
}

fn blobs_of(change: &bigfiles::Change) -> [Option<String>; 2] {
    [change.old_blob.clone(), change.new_blob.clone()]
}

/// The blobs of `changes`, both sides.
fn blob_ids<'a>(changes: impl IntoIterator<Item = &'a bigfiles::Change>) -> Vec<String> {
    changes.into_iter().flat_map(blobs_of).flatten().collect()
}

/// Lists what the private index changes against `baseline`, with the blobs' sizes.
async fn changed_files(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    baseline: &str,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<ChangedFiles, RunError> {
    let raw = git
        .run(
            &private.args(
                workspace,
                &[
                    "diff",
                    "--cached",
                    "--raw",
                    "-z",
                    "--no-renames",
                    "--no-abbrev",
                    "--ignore-submodules=none",
                    baseline,
                ],
            ),
            private.run(),
            stop,
        )
        .await?;
    let (changes, complete) = bigfiles::parse_raw(&raw);
    let ids = blob_ids(&changes);
    let sizes = bigfiles::parse_sizes(
        &cat_file_batch(
            git,
            private,
            workspace,
            "--batch-check=%(objectname) %(objectsize)",
            &ids,
            stop,
        )
        .await?,
    );
    Ok(ChangedFiles {
        changes,
        complete,
        sizes,
    })
}

/// Lists the changed files whose line diff would take more than `budget` bytes as `binary`
/// in the private repository's `info/attributes`, replacing the previous diff's list (see
/// [`bigfiles`]).
async fn mark_big_files(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    changed: &ChangedFiles,
    budget: u64,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RunError> {
    let ChangedFiles { changes, sizes, .. } = changed;
    let ids = blob_ids(changes);
    let sides = |c: &bigfiles::Change, lines: &std::collections::HashMap<String, u64>| {
        blobs_of(c)
            .into_iter()
            .flatten()
            .map(|id| bigfiles::Side {
                // A blob git cannot size is taken as large: binary is the safe side.
                bytes: sizes.get(&id).copied().unwrap_or(u64::MAX),
                lines: lines.get(&id).copied(),
            })
            .collect::<Vec<_>>()
    };
    // What earlier diffs counted decides first: a 9 MB file changed again has its old
    // version's lines remembered, and with them the new version often needs no count.
    let (remembered, _) = LINE_COUNTS.split(&ids);
    let to_count = blob_ids(
        changes
            .iter()
            .filter(|c| bigfiles::may_exceed(&sides(c, &remembered), budget)),
    );
    let mut lines = count_lines(git, private, workspace, &to_count, stop).await?;
    lines.extend(remembered);
    let mut text = NEUTRAL_ATTRIBUTES.as_bytes().to_vec();
    text.extend(bigfiles::attributes(
        changes
            .iter()
            .filter(|c| bigfiles::line_diff_bytes(&sides(c, &lines)) > budget)
            .map(|c| c.path.as_slice()),
    ));
    set_attributes(private, text).await
}

/// Whether the private repository's `info/attributes` may list a file, or lacks the neutral
/// line (a baseline an older agent recorded): it holds more or less than that line, or
/// cannot be looked at.
fn lists_big_files(private: &Opened) -> bool {
    let path = format!("{}/info/attributes", BASELINE_REPO.to_string_lossy());
    match fstatat(
        private.dir.as_fd(),
        path.as_str(),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(stat) => usize::try_from(stat.st_size).ok() != Some(NEUTRAL_ATTRIBUTES.len()),
        Err(_) => true,
    }
}

/// Replaces the private repository's `info/attributes` with `text`.
async fn set_attributes(private: &Opened, text: Vec<u8>) -> Result<(), RunError> {
    private
        .in_dir(move |dir| write_attributes(dir, &text))
        .await
}

/// `git cat-file BATCH` of the private repository for `ids` (deduplicated); its output.
async fn cat_file_batch(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    batch: &str,
    ids: &[String],
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Vec<u8>, RunError> {
    let Some(input) = batch_input(ids) else {
        return Ok(Vec::new());
    };
    run_fed(git, private, workspace, &["cat-file", batch], input, stop).await
}

/// Line counts of blobs this agent has counted (see [`bigfiles::LineCounts`]).
static LINE_COUNTS: std::sync::LazyLock<bigfiles::LineCounts> =
    std::sync::LazyLock::new(bigfiles::LineCounts::default);

/// The lines of each of the blobs `ids`: remembered from an earlier diff, else counted as
/// `git cat-file --batch` streams them (a blob is never held whole).
async fn count_lines(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    ids: &[String],
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<std::collections::HashMap<String, u64>, RunError> {
    let (mut known, unknown) = LINE_COUNTS.split(ids);
    let counted = count_lines_now(git, private, workspace, &unknown, stop).await?;
    LINE_COUNTS.remember(&counted);
    known.extend(counted);
    Ok(known)
}

/// [`count_lines`] without the memo.
async fn count_lines_now(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    ids: &[String],
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<std::collections::HashMap<String, u64>, RunError> {
    let Some(input) = batch_input(ids) else {
        return Ok(Default::default());
    };
    let (read, feeder) = feed(input)?;
    let spec = git
        .spec(
            &private.args(workspace, &["cat-file", "--batch"]),
            private.run().stdin(read),
        )
        .map_err(RunError::Failed)?;
    let mut counter = bigfiles::BatchLineCounter::default();
    let finished = crate::command::run_streaming(&spec, stop, |chunk| {
        counter.feed(chunk);
        Ok(())
    })
    .await;
    let _ = feeder.await;
    let finished = finished?;
    if !finished.success() {
        return Err(RunError::Failed(format!(
            "git cat-file failed ({})",
            finished.describe()
        )));
    }
    Ok(counter.counts())
}

/// One id per line, each once; `None` for no ids.
fn batch_input(ids: &[String]) -> Option<Vec<u8>> {
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
async fn run_fed_status(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    args: &[&str],
    input: Vec<u8>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(Vec<u8>, crate::command::Finished), RunError> {
    let (read, feeder) = feed(input)?;
    let result = git
        .run_status(
            &private.args(workspace, args),
            private.run().stdin(read),
            stop,
        )
        .await;
    let _ = feeder.await;
    result
}

/// [`run_fed_status`] where anything but success is an error, as [`Git::run`] has it.
async fn run_fed(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    args: &[&str],
    input: Vec<u8>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Vec<u8>, RunError> {
    let (out, finished) = run_fed_status(git, private, workspace, args, input, stop).await?;
    if finished.success() {
        Ok(out)
    } else {
        Err(RunError::Failed(format!(
            "git {} failed ({})",
            git::subcommand(args),
            finished.describe()
        )))
    }
}

/// A pipe whose read end is a child's stdin, fed `input` from the blocking pool while the
/// child reads; the child's exit closes it.
fn feed(
    input: Vec<u8>,
) -> Result<(OwnedFd, tokio::task::JoinHandle<std::io::Result<()>>), RunError> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .map_err(|err| RunError::Failed(format!("cannot create a pipe: {err}")))?;
    let feeder = tokio::task::spawn_blocking(move || File::from(write).write_all(&input));
    Ok((read, feeder))
}

/// Replaces `baseline.git/info/attributes` in the private directory. The directory belongs
/// to the sandbox user, so every step is relative to a descriptor, follows no symlink, and
/// makes a new file rather than writing into whatever has the name.
fn write_attributes(private: BorrowedFd<'_>, text: &[u8]) -> Result<(), String> {
    let fail = |err: Errno| format!("cannot write the private repository's attributes: {err}");
    let repo = fsutil::open_dir_at(private, BASELINE_REPO).map_err(fail)?;
    match nix::sys::stat::mkdirat(repo.as_fd(), c"info", Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(err) => return Err(fail(err)),
    }
    let info = fsutil::open_dir_at(repo.as_fd(), c"info").map_err(fail)?;
    match unlinkat(info.as_fd(), c"attributes", UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(err) => return Err(fail(err)),
    }
    let fd = openat(
        info.as_fd(),
        c"attributes",
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(fail)?;
    File::from(fd)
        .write_all(text)
        .map_err(|err| format!("cannot write the private repository's attributes: {err}"))
}

/// How far each git after the first may run ahead of the reader: the pipe it writes to,
/// read once the gits before it are done. Linux's default `pipe-max-size`.
const AHEAD_PIPE_BYTES: i32 = 1 << 20;

/// Starts every git of `runs` at once and sends their stdout on the stream's STDOUT channel
/// one after the other, in order: at most `max_bytes` of it in all. Each git after the first
/// writes into a pipe read once those before it are done, so it runs ahead by that pipe's
/// size, then waits.
async fn stream_git_outputs(
    what: &str,
    runs: &[ChildSpec],
    max_bytes: u64,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<u64, RunError> {
    let mut children = Vec::with_capacity(runs.len());
    for (index, spec) in runs.iter().enumerate() {
        // On failure the children started so far are dropped, which kills them.
        let child = Child::spawn(spec)
            .map_err(|err| RunError::Failed(format!("cannot start git {what}: {err}")))?;
        if index > 0 {
            child.widen_stdout(AHEAD_PIPE_BYTES);
        }
        children.push(child);
    }
    let mut sent: u64 = 0;
    for index in 0..children.len() {
        let (done, rest) = children.split_at_mut(index + 1);
        let child = &mut done[index];
        let outcome = forward_output(what, child, max_bytes, &mut sent, stream, outbox, stop).await;
        if let Err(err) = outcome {
            child.kill().await;
            for later in rest {
                later.kill().await;
            }
            return Err(err);
        }
    }
    Ok(sent)
}

/// Forwards `child`'s stdout as it comes until it ends, and waits for it: `sent` counts the
/// bytes of every run so far against `max_bytes`. The caller kills the child on an error.
async fn forward_output(
    what: &str,
    child: &mut Child,
    max_bytes: u64,
    sent: &mut u64,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RunError> {
    let mut buf = vec![0_u8; DATA_CHUNK];
    loop {
        let read = tokio::select! {
            biased;
            () = stop_requested(stop) => return Err(RunError::Cancelled),
            read = child.read(&mut buf) => read,
        };
        let n = match read {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) => {
                return Err(RunError::Failed(format!(
                    "cannot read git {what}'s output: {err}"
                )))
            }
        };
        let len = u64::try_from(n).unwrap_or(u64::MAX);
        if sent.saturating_add(len) > max_bytes {
            return Err(RunError::Failed(format!(
                "the {what} is over the {max_bytes} bytes this request allows; it was not sent in \
                 full"
            )));
        }
        let permit = tokio::select! {
            biased;
            () = stop_requested(stop) => return Err(RunError::Cancelled),
            permit = outbox.reserve() => permit,
        };
        // The host is gone: nobody will read the rest.
        let Some(permit) = permit else {
            return Err(RunError::Cancelled);
        };
        let mut payload = Vec::with_capacity(1 + n);
        payload.push(channel::STDOUT);
        payload.extend_from_slice(&buf[..n]);
        permit.send(Frame::new(stream, FrameKind::Data, payload));
        *sent += len;
    }
    let finished = tokio::select! {
        biased;
        () = stop_requested(stop) => return Err(RunError::Cancelled),
        finished = child.wait() => finished,
    };
    if finished.success() {
        Ok(())
    } else {
        Err(RunError::Failed(format!(
            "git {what} failed ({})",
            finished.describe()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spawn::ChildSpec;

    /// The fallback for git older than 2.40 (Debian's 2.39 when present): no
    /// `GIT_ATTR_SOURCE`, same baseline.
    #[tokio::test]
    async fn a_baseline_without_attr_source_support() {
        // Needs both gits of this machine (2.39 in /usr/bin, 2.47 in /usr/local/bin).
        if !Path::new("/usr/bin/git").exists() || !Path::new("/usr/local/bin/git").exists() {
            return;
        }
        crate::init::setup();
        let git = Git {
            program: c"/usr/bin/git".to_owned(),
            attr_source: false,
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).expect("mkdir");
        std::fs::write(ws.join("a.txt"), "a\n").expect("write");
        let state = dir.path().join("state");
        statedir::open_state_dir(&state).expect("state dir");
        let private = Private::new(&state);
        let (_tx, mut stop) = mpsc::channel(1);
        let commit = match record_baseline(&git, &private, &ws, None, &mut stop).await {
            Ok(commit) => commit,
            Err(err) => panic!("{err:?}"),
        };
        // Same tree, fixed identity and date: the commit id is known in advance.
        let expected = match record_baseline(
            &Git {
                program: c"/usr/local/bin/git".to_owned(),
                attr_source: true,
            },
            &private,
            &ws,
            None,
            &mut stop,
        )
        .await
        {
            Ok(commit) => commit,
            Err(err) => panic!("{err:?}"),
        };
        assert_eq!(commit, expected);
    }

    /// What a process of the sandbox user may do to `pid` and to the private repository: one
    /// word per thing that worked.
    async fn reach_as_user(user: ExecUser, pid: i32, state: &Path) -> String {
        let state = state.display();
        let script = format!(
            "ls /proc/{pid}/fd >/dev/null 2>&1 && echo fd; \
             ls /proc/{pid}/cwd/ >/dev/null 2>&1 && echo cwd; \
             cat /proc/{pid}/environ >/dev/null 2>&1 && echo environ; \
             ls {state}/private >/dev/null 2>&1 && echo private; \
             echo 0 2>/dev/null >{state}/private/baseline.git/refs/dynocap/baseline && echo ref; \
             cat {state}/.git-exec >/dev/null 2>&1 && echo exe; \
             echo end"
        );
        let spec = ChildSpec {
            program: c"/bin/sh".to_owned(),
            argv: vec![
                c"sh".to_owned(),
                c"-c".to_owned(),
                std::ffi::CString::new(script).expect("no NUL"),
            ],
            env: crate::command::env_list([("PATH", crate::spawn::BASE_PATH)]).expect("env"),
            cwd: c"/".to_owned(),
            terminal: false,
            user: Some(user),
            stdin: None,
            cgroup: None,
            extra_group: None,
            stdio: None,
        };
        let (_tx, mut stop) = mpsc::channel(1);
        let (out, _) = crate::command::run(&spec, 1 << 20, &mut stop)
            .await
            .expect("the probe runs");
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `/proc/<pid>/status` once the child runs `program_name`.
    fn status_once_running(pid: i32, program_name: &str) -> String {
        for _ in 0..1000 {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
            if status.lines().next() == Some(&format!("Name:\t{program_name}")) {
                return status;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("process {pid} never ran {program_name}");
    }

    fn line<'a>(status: &'a str, key: &str) -> &'a str {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .expect("status line")
            .trim()
    }

    /// The guarded git runs as the sandbox user, with the git group, and neither it nor the
    /// private repository can be reached by another process of that user; an ordinary
    /// process of that user can be (the control, so the probe is known to work).
    #[tokio::test]
    async fn a_guarded_git_is_the_sandbox_user_and_out_of_its_reach() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        crate::init::setup();
        let user = ExecUser {
            uid: 1000,
            gid: 1000,
        };
        let (_tx, mut stop) = mpsc::channel(1);
        let git = git::git(&mut stop).await.expect("git");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).expect("mkdir");
        std::fs::write(ws.join("a.txt"), "a\n").expect("write");
        std::os::unix::fs::chown(&ws, Some(1000), Some(1000)).expect("chown");
        std::os::unix::fs::chown(ws.join("a.txt"), Some(1000), Some(1000)).expect("chown");
        let state = dir.path().join("state");
        let private = Private::new(&state);
        let (commit, _) = record_baseline(git, &private, &ws, Some(user), &mut stop)
            .await
            .expect("baseline");
        let opened = private
            .open(&git.program, git.attr_source)
            .expect("open the private repository");
        assert_eq!(opened.user, Some(user));

        // A git that waits on its standard input, so it can be looked at.
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
        let spec = git
            .spec(
                &opened.args(&ws, &["cat-file", "--batch-check"]),
                opened.run().stdin(read),
            )
            .expect("spec");
        let spawned = crate::spawn::spawn(&spec).expect("spawn git");
        let status = status_once_running(spawned.pid, ".git-exec");
        assert_eq!(line(&status, "Uid:"), "1000\t1000\t1000\t1000", "{status}");
        assert_eq!(line(&status, "Gid:"), "1000\t1000\t1000\t1000", "{status}");
        let groups = line(&status, "Groups:");
        assert!(
            groups
                .split(' ')
                .any(|g| g == gitguard::GIT_GROUP.to_string()),
            "{status}"
        );
        assert_eq!(reach_as_user(user, spawned.pid, &state).await, "end\n");
        drop(write);
        spawned.exit.await.expect("git exits");

        // The control: an ordinary process of the same user is reachable.
        let sleeper = ChildSpec {
            program: c"/bin/sleep".to_owned(),
            argv: vec![c"sleep".to_owned(), c"1000".to_owned()],
            env: Vec::new(),
            cwd: c"/".to_owned(),
            terminal: false,
            user: Some(user),
            stdin: None,
            cgroup: None,
            extra_group: None,
            stdio: None,
        };
        let spawned = crate::spawn::spawn(&sleeper).expect("spawn sleep");
        status_once_running(spawned.pid, "sleep");
        assert_eq!(
            reach_as_user(user, spawned.pid, &state).await,
            "fd\ncwd\nenviron\nend\n"
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(spawned.pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill");
        spawned.exit.await.expect("sleep exits");

        // The probes could not write the baseline's ref.
        let out = git
            .run(
                &[
                    arg_with("--git-dir=", &opened.git_dir),
                    "rev-parse".into(),
                    "refs/dynocap/baseline".into(),
                ],
                Run::new(Path::new("/")),
                &mut stop,
            )
            .await
            .expect("rev-parse");
        assert_eq!(first_line(&out), commit);
    }

    #[test]
    fn heads_parse() {
        assert_eq!(
            parse_head("refs/heads/feature/x"),
            Ok(Head::Branch("feature/x".into()))
        );
        let id = "0123456789abcdef0123456789ABCDEF01234567";
        assert_eq!(parse_head(id), Ok(Head::Commit(id.to_ascii_lowercase())));
        for bad in [
            "refs/heads/",
            "refs/heads/-x",
            "refs/heads/a..b",
            "refs/heads/a b",
            "main",
            "refs/tags/v1",
            "0123",
        ] {
            assert!(parse_head(bad).is_err(), "{bad:?}");
        }
    }
}
