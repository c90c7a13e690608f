//! The **user's** repository (`<workspace>/.git`): made by git running as the sandbox user,
//! with the imported history, HEAD as it was on the host, and an index equal to HEAD, so that
//! `git status` in the guest shows the changes the project had uncommitted on the host.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, Mode};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};
use tokio::sync::mpsc;

use super::error::{HeadError, RepoError};
use super::request::arg_with;
use crate::git::{first_line, is_object_id, Git, Run};
use crate::process_group::Stop;
use crate::spawn::ExecUser;
use crate::statedir::{self};

/// Branch a repository starts on when the host did not name one.
pub(super) const DEFAULT_BRANCH: &str = "main";

/// What HEAD was on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Head {
    Branch(String),
    Commit(String),
}

pub(super) fn parse_head(head: &str) -> Result<Head, HeadError> {
    if let Some(branch) = head.strip_prefix("refs/heads/") {
        // git check-ref-format runs later; these keep the name from ever looking like an
        // option or a path.
        if branch.is_empty()
            || branch.starts_with('-')
            || branch.contains("..")
            || branch.bytes().any(|b| b.is_ascii_control() || b == b' ')
        {
            return Err(HeadError::BranchName(head.to_owned()));
        }
        return Ok(Head::Branch(branch.to_owned()));
    }
    let lower = head.to_ascii_lowercase();
    if is_object_id(&lower) {
        return Ok(Head::Commit(lower));
    }
    Err(HeadError::Unknown(head.to_owned()))
}

/// A descriptor of the bundle the sandbox user's git can read: the file itself when git runs
/// as the agent, else a copy owned by that user whose name is removed at once (git opens it
/// as `/proc/self/fd/0`, which re-checks the file's own permissions but not the 0700 state
/// directory's).
pub(super) fn bundle_for(
    state_fd: std::os::fd::BorrowedFd<'_>,
    name: &str,
    user: Option<ExecUser>,
) -> Result<OwnedFd, RepoError> {
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
    .map_err(RepoError::CreateBundleCopy)?;
    let _ = unlinkat(state_fd, temp, UnlinkatFlags::NoRemoveDir);
    fchown(
        fd.as_fd(),
        Some(Uid::from_raw(user.uid)),
        Some(Gid::from_raw(user.gid)),
    )
    .and_then(|()| fchmod(fd.as_fd(), Mode::S_IRUSR | Mode::S_IWUSR))
    .map_err(|source| RepoError::HandBundleCopy {
        uid: user.uid,
        source,
    })?;
    let mut copy = File::from(fd);
    std::io::copy(&mut original, &mut copy).map_err(RepoError::CopyBundle)?;
    Ok(OwnedFd::from(copy))
}

/// The path the bundle has in git's eyes: its standard input, reopened.
pub(super) const BUNDLE_PATH: &str = "/proc/self/fd/0";

/// Makes the user's repository: init, history, HEAD, index = HEAD. Runs as `user`.
pub(super) async fn user_repository(
    git: &Git,
    workspace: &Path,
    user: Option<ExecUser>,
    head: Option<&Head>,
    bundle: Option<OwnedFd>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RepoError> {
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(RepoError::PassBundle);
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
                return Err(RepoError::NoBranchInBundle(branch.clone()));
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
    .map_err(|source| RepoError::InvalidBranch {
        branch: branch.to_owned(),
        source,
    })?;
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
                .map_err(|source| RepoError::NoCommitInBundle {
                    id: id.clone(),
                    source,
                })?;
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
