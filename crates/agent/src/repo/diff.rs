//! `Diff`: the private index brought up to date, the big files marked, and the patch
//! baseline → work tree streamed on the stream's STDOUT by one git, or by several at once
//! over disjoint paths (see [`diff_split`]), in order.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use dynocap_proto::{
    channel, DiffRequest, Frame, FrameKind, Response, DATA_CHUNK, NEUTRAL_ATTRIBUTES,
};
use nix::errno::Errno;
use nix::sys::stat::fstatat;
use nix::unistd::{unlinkat, UnlinkatFlags};
use tokio::sync::{mpsc, Mutex};

use super::attributes::{lists_big_files, mark_big_files, set_attributes};
use super::changes::changed_files;
use super::error::RepoError;
use super::index::{add_all, add_changed, Storage, BIG_FILE_THRESHOLD};
use super::private::{read_note, Private};
use super::request::{blocking, lock, open_workspace};
use crate::bigfiles;
use crate::command::{stop_requested, Child, RunError};
use crate::config::Config;
use crate::diff_split;
use crate::git::{self, is_object_id};
use crate::index_memo::Memo as IndexMemo;
use crate::journal::Tracker;
use crate::outbox::Outbox;
use crate::process_group::Stop;
use crate::spawn::ChildSpec;
use crate::statedir::{
    self, BASELINE_COMMIT, BASELINE_INDEX, BASELINE_INDEX_LOCK, BASELINE_LARGEST,
    BASELINE_WORKSPACE,
};

/// The exact diff invocation: every option that changes the patch's shape is pinned.
pub(super) const DIFF_ARGS: &[&str] = &[
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
pub(super) fn diff_args(baseline: &str, paths: &[Vec<u8>]) -> Vec<OsString> {
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
) -> Result<Response, RepoError> {
    let (workspace, _ws_fd) = open_workspace(&req.workspace)?;
    let line_diff_budget = req
        .line_diff_budget
        .unwrap_or(bigfiles::DEFAULT_LINE_DIFF_BUDGET);
    let storage = Storage::for_diff(line_diff_budget);
    let mut tracker = lock(repo_lock, stop)
        .await
        .map_err(|err| err.of("the diff"))?;
    let git = git::git(stop)
        .await
        .map_err(|err| RepoError::from(err).of("the diff"))?;
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
            return Err(RepoError::BadBaselineCommit(commit));
        }
        let private = Private::new(&state_dir).open(&git.program, git.attr_source)?;
        // A stale lock is from a git this agent killed (cancel): nobody else uses the index.
        match unlinkat(
            private.dir.as_fd(),
            BASELINE_INDEX_LOCK,
            UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(err) => return Err(RepoError::StaleIndexLock(err)),
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
        return Err(RepoError::OtherWorkspace {
            recorded: String::from_utf8_lossy(&recorded).into_owned(),
            workspace,
        });
    }

    let outcome: Result<u64, RepoError> = async {
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
        .await?;
        *tracker = held;
        let updated = match changed {
            Some(changed) => {
                match add_changed(git, &private, &workspace, &changed, &storage, stop).await {
                    Err(why) if !matches!(why, RepoError::Cancelled(_)) => {
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
                    let why = err.of("reading the private index");
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
            .collect::<Result<Vec<_>, _>>()?;
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
        Err(err) => Err(err.of("the diff")),
    }
}

/// How far each git after the first may run ahead of the reader: the pipe it writes to,
/// read once the gits before it are done. Linux's default `pipe-max-size`.
pub(super) const AHEAD_PIPE_BYTES: i32 = 1 << 20;

/// Starts every git of `runs` at once and sends their stdout on the stream's STDOUT channel
/// one after the other, in order: at most `max_bytes` of it in all. Each git after the first
/// writes into a pipe read once those before it are done, so it runs ahead by that pipe's
/// size, then waits.
pub(super) async fn stream_git_outputs(
    what: &'static str,
    runs: &[ChildSpec],
    max_bytes: u64,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<u64, RepoError> {
    let mut children = Vec::with_capacity(runs.len());
    for (index, spec) in runs.iter().enumerate() {
        // On failure the children started so far are dropped, which kills them.
        let child = Child::spawn(spec).map_err(|source| RepoError::StartGit { what, source })?;
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
pub(super) async fn forward_output(
    what: &'static str,
    child: &mut Child,
    max_bytes: u64,
    sent: &mut u64,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RepoError> {
    let cancelled = || RepoError::Cancelled("the step");
    let mut buf = vec![0_u8; DATA_CHUNK];
    loop {
        let read = tokio::select! {
            biased;
            () = stop_requested(stop) => return Err(cancelled()),
            read = child.read(&mut buf) => read,
        };
        let n = match read {
            Ok(0) => break,
            Ok(n) => n,
            Err(source) => return Err(RepoError::ReadGit { what, source }),
        };
        let len = u64::try_from(n).unwrap_or(u64::MAX);
        if sent.saturating_add(len) > max_bytes {
            return Err(RepoError::TooLarge { what, max_bytes });
        }
        let permit = tokio::select! {
            biased;
            () = stop_requested(stop) => return Err(cancelled()),
            permit = outbox.reserve() => permit,
        };
        // The host is gone: nobody will read the rest.
        let Some(permit) = permit else {
            return Err(cancelled());
        };
        let mut payload = Vec::with_capacity(1 + n);
        payload.push(channel::STDOUT);
        payload.extend_from_slice(&buf[..n]);
        permit.send(Frame::new(stream, FrameKind::Data, payload));
        *sent += len;
    }
    let finished = tokio::select! {
        biased;
        () = stop_requested(stop) => return Err(cancelled()),
        finished = child.wait() => finished,
    };
    if finished.success() {
        Ok(())
    } else {
        Err(RunError::GitFailed {
            subcommand: what.to_owned(),
            outcome: finished.describe(),
        }
        .into())
    }
}
