//! The private index brought up to date with the work tree: the whole tree through
//! `git add -A`, or only what the journal saw change, and how git stores what it adds.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use tokio::sync::mpsc;

use super::error::RepoError;
use super::private::{run_fed, run_fed_status, Opened};
use super::request::blocking;
use crate::command::RunError;
use crate::fsutil;
use crate::git::Git;
use crate::index_memo::{self, Memo as IndexMemo, Seen};
use crate::journal::Changed;
use crate::process_group::Stop;

/// `git add -A` into the private index. Paths git cannot add are skipped, not fatal: a nested
/// repository without a commit, or a tracked file replaced by a FIFO or socket, must not make
/// every later diff fail. They are logged; a skipped tracked path keeps its previous entry.
///
/// With `within`, NUL-separated workspace-relative paths, only what is at or beneath them.
pub(super) async fn add_all(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    storage: &Storage,
    extra: &[&str],
    within: Option<Vec<u8>>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RepoError> {
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
        _ => Err(RunError::GitFailed {
            subcommand: "add".into(),
            outcome: finished.describe(),
        }
        .into()),
    }
}

/// Brings the private index up to date for what the journal saw change, as [`add_all`] would
/// for the whole workspace: the trees through `git add -A` limited to them; the paths
/// through `git update-index`, which reads and hashes those files alone, less the untracked
/// ones that git ignores (`git add -A` leaves those out; a tracked file stays tracked
/// whatever the ignore rules say). A path git refuses fails the whole step, and the caller
/// then scans everything, which skips such paths one by one.
pub(super) async fn add_changed(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    changed: &Changed,
    storage: &Storage,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RepoError> {
    // A pathspec that matches nothing is fatal to `git add`: a directory made and removed
    // between two diffs (a build's scratch) is gone from the work tree and was never in the
    // index. What is gone only leaves the index, which `git rm --cached` does quietly.
    let trees = changed.trees.clone();
    let ws = workspace.to_path_buf();
    let (present, gone): (Vec<Vec<u8>>, Vec<Vec<u8>>) = blocking(move || {
        let root = fsutil::open_dir_nofollow(&ws)
            .map_err(|source| RepoError::ReopenWorkspace { path: ws, source })?;
        Ok(trees
            .into_iter()
            .partition(|tree| !is_gone(root.as_fd(), tree)))
    })
    .await?;
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
pub(super) async fn look_in(
    workspace: &Path,
    paths: &std::sync::Arc<Vec<Vec<u8>>>,
) -> Result<Vec<Seen>, RepoError> {
    let (workspace, paths) = (workspace.to_path_buf(), std::sync::Arc::clone(paths));
    blocking(move || {
        let root =
            fsutil::open_dir_nofollow(&workspace).map_err(|source| RepoError::ReopenWorkspace {
                path: workspace,
                source,
            })?;
        Ok(index_memo::look(root.as_fd(), &paths))
    })
    .await
}

/// Whether nothing is at the workspace-relative `path` (as far as the agent can tell without
/// following a symlink: one on the way leaves the path to `git add`, which knows what to do).
pub(super) fn is_gone(workspace: BorrowedFd<'_>, path: &[u8]) -> bool {
    matches!(
        fsutil::open_beneath(workspace, OsStr::from_bytes(path), OFlag::O_PATH),
        Err(Errno::ENOENT | Errno::ENOTDIR)
    )
}

/// Which of the untracked `paths` git ignores. `--no-index`: they are all untracked, and
/// with the index git would look for each of them through every entry.
pub(super) async fn ignored_of(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    paths: &std::collections::BTreeSet<Vec<u8>>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<std::collections::BTreeSet<Vec<u8>>, RepoError> {
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
        return Err(RunError::GitFailed {
            subcommand: "check-ignore".into(),
            outcome: finished.describe(),
        }
        .into());
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
pub(super) fn nul_separated<'a>(items: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
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
pub(super) const BASELINE_COMPRESSION: [&str; 4] =
    ["-c", "core.looseCompression=0", "-c", "pack.compression=0"];

/// How a diff stores the changed files: stored, like the baseline. Git's default (level 6
/// for big files) made a diff of two changed 9 MB files cost a second; level 1 still took a
/// third of the `update-index` of a 50-file diff from the journal (18–49 ms against 14–18).
/// The price is disk, as for the baseline: each diff's new versions of the changed files at
/// their full size, in the task's scratch repository.
pub(super) const DIFF_COMPRESSION: [&str; 4] = BASELINE_COMPRESSION;

/// How a `git add` or `git update-index` stores what it writes: its compression, and the
/// size over which a file is streamed into a pack rather than read whole.
///
/// Git reads a file under `core.bigFileThreshold` whole (mapped, so from the page cache, and
/// copied only when an attribute converts its line endings) and writes it as a loose object.
/// Above it, git streams the file into a new pack, which costs two more passes over the bytes
/// (the pack's checksum and CRC beside the object's id) and a sync of the pack. With two
/// 9 MB files changed among 29, the diff's `git add` took 106–120 ms read whole against
/// 230–270 ms streamed, and the whole `task diff` 379–438 ms against 417–535 (7 runs each).
pub(super) struct Storage {
    pub(super) threshold: String,
    pub(super) compression: [&'static str; 4],
}

impl Storage {
    /// The smallest size a diff streams rather than reads whole.
    const FLOOR: u64 = 8 << 20;
    /// Git's own `core.bigFileThreshold`.
    const CEILING: u64 = 512 << 20;

    /// The baseline's: [`BASELINE_COMPRESSION`], the files over [`BIG_FILE_THRESHOLD`]
    /// streamed.
    pub(super) fn baseline() -> Self {
        Self {
            threshold: BIG_FILE_THRESHOLD.to_owned(),
            compression: BASELINE_COMPRESSION,
        }
    }

    /// A diff's: [`DIFF_COMPRESSION`], and a file read whole up to half the diff's line
    /// budget. The budget is a quarter of the sandbox's memory and bounds what the diff itself
    /// holds of one file; half of it bounds what the add may map of one, between the
    /// baseline's 8 MiB (the smallest sandbox) and git's own default of 512 MiB.
    pub(super) fn for_diff(line_diff_budget: u64) -> Self {
        let bytes = (line_diff_budget / 2).clamp(Self::FLOOR, Self::CEILING);
        Self {
            threshold: format!("core.bigFileThreshold={bytes}"),
            compression: DIFF_COMPRESSION,
        }
    }

    /// The `-c` options for git.
    pub(super) fn args(&self) -> Vec<&str> {
        let mut args = vec!["-c", self.threshold.as_str()];
        args.extend_from_slice(&self.compression);
        args
    }
}

/// Git streams files above this size into the object store instead of reading them whole
/// (`git add`), and stores them without delta search; [`bigfiles`] makes the diff carry them
/// as binary.
pub(super) const BIG_FILE_THRESHOLD: &str = "core.bigFileThreshold=8m";
