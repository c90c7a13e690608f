//! `Baseline`: the user's repository made, then the private repository made afresh and the
//! whole work tree committed in it as the baseline every diff starts from. A failed baseline
//! removes what it made.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use dynocap_proto::{BaselineRequest, Response, NEUTRAL_ATTRIBUTES};
use nix::sys::stat::{fstatat, Mode};
use tokio::sync::{mpsc, Mutex};

use super::attributes::{write_attributes, write_info};
use super::error::RepoError;
use super::index::{add_all, Storage};
use super::private::{hand_over, write_note, Private};
use super::request::{blocking, lock, open_workspace};
use super::user_repo::{bundle_for, parse_head, user_repository, Head};
use crate::config::Config;
use crate::fsutil;
use crate::git::{self, first_line, is_object_id, Git, Run};
use crate::index_memo::Memo as IndexMemo;
use crate::journal::Tracker;
use crate::process_group::Stop;
use crate::spawn::ExecUser;
use crate::statedir::{
    self, BASELINE_COMMIT, BASELINE_DIR, BASELINE_FILES, BASELINE_LARGEST, BASELINE_REPO,
    BASELINE_WORKSPACE,
};

/// Fixed date of the baseline commit, so the same tree always gives the same commit.
pub(super) const BASELINE_DATE: &str = "@0 +0000";

/// Handles `Baseline`.
pub async fn baseline(
    req: BaselineRequest,
    config: &Config,
    repo_lock: &Mutex<Tracker>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Response, RepoError> {
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
        .map_err(|err| err.of("the baseline"))?;
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
        .map_err(|err| RepoError::from(err).of("the baseline"))?;
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
        *tracker = journal.await.map_err(RepoError::Worker)?;
        let exclude = req.exclude.as_deref().map(str::as_bytes);
        let (commit, largest) =
            record_baseline(git, &private, &workspace, user, exclude, stop).await?;
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
        Ok::<_, RepoError>(commit)
    }
    .await;
    match outcome {
        Ok(commit) => Ok(Response::Baseline { commit }),
        Err(err) => {
            let err = err.of("the baseline");
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
            Err(err)
        }
    }
}

/// Makes the private repository afresh, owned by `owner` (the sandbox user; `None` when that
/// is the agent itself), with `exclude` (the project's own `info/exclude`, from the host) as
/// its `info/exclude`, so that its diffs leave out what the project ignores there as the
/// import did, and commits the whole work tree as the baseline. Returns the commit,
/// and the size of its largest file as the index records it (`None`, logged, if the index
/// cannot be read: diffs then size their files with git).
pub(super) async fn record_baseline(
    git: &Git,
    private: &Private,
    workspace: &Path,
    owner: Option<ExecUser>,
    exclude: Option<&[u8]>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(String, Option<u64>), RepoError> {
    let state_dir = private.state_dir.clone();
    let exclude = exclude.map(<[u8]>::to_vec);
    blocking(move || {
        let fd = statedir::open_state_dir(&state_dir)?;
        for name in BASELINE_FILES {
            fsutil::remove_at(fd.as_fd(), name).map_err(RepoError::RemovePreviousBaseline)?;
        }
        nix::sys::stat::mkdirat(fd.as_fd(), BASELINE_DIR, Mode::S_IRWXU)
            .map_err(RepoError::CreatePrivate)?;
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
        let dir =
            fsutil::open_dir_at(state.as_fd(), BASELINE_DIR).map_err(RepoError::OpenPrivate)?;
        // Before the baseline is added: its blobs are the files' bytes, as the diffs' are.
        write_attributes(dir.as_fd(), NEUTRAL_ATTRIBUTES.as_bytes())?;
        if let Some(exclude) = &exclude {
            write_info(dir.as_fd(), c"exclude", exclude)?;
        }
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
            return Err(RepoError::EmptyTree(first_line(&out)));
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
        return Err(RepoError::NotACommit(commit));
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
            let why = err.of("reading the private index");
            log!("cannot size the baseline's files: {why}");
            None
        }
    };
    Ok((commit, largest))
}
