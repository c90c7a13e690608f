//! The private repository's `info/attributes`: the neutral line that keeps the work tree's
//! `.gitattributes` from changing content, and the changed files whose line diff would be
//! over the budget, listed as `binary` (see [`bigfiles`]), counted with their lines
//! remembered across diffs.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use dynocap_proto::NEUTRAL_ATTRIBUTES;
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstatat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use tokio::sync::mpsc;

use super::changes::{blob_ids, blobs_of, ChangedFiles};
use super::error::RepoError;
use super::private::{batch_input, feed, Opened};
use crate::bigfiles;
use crate::command::RunError;
use crate::fsutil;
use crate::git::Git;
use crate::process_group::Stop;
use crate::statedir::BASELINE_REPO;

/// Lists the changed files whose line diff would take more than `budget` bytes as `binary`
/// in the private repository's `info/attributes`, replacing the previous diff's list (see
/// [`bigfiles`]).
pub(super) async fn mark_big_files(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    changed: &ChangedFiles,
    budget: u64,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), RepoError> {
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
pub(super) fn lists_big_files(private: &Opened) -> bool {
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
pub(super) async fn set_attributes(private: &Opened, text: Vec<u8>) -> Result<(), RepoError> {
    private
        .in_dir(move |dir| write_attributes(dir, &text))
        .await
}

/// Line counts of blobs this agent has counted (see [`bigfiles::LineCounts`]).
pub(super) static LINE_COUNTS: std::sync::LazyLock<bigfiles::LineCounts> =
    std::sync::LazyLock::new(bigfiles::LineCounts::default);

/// The lines of each of the blobs `ids`: remembered from an earlier diff, else counted as
/// `git cat-file --batch` streams them (a blob is never held whole).
pub(super) async fn count_lines(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    ids: &[String],
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<std::collections::HashMap<String, u64>, RepoError> {
    let (mut known, unknown) = LINE_COUNTS.split(ids);
    let counted = count_lines_now(git, private, workspace, &unknown, stop).await?;
    LINE_COUNTS.remember(&counted);
    known.extend(counted);
    Ok(known)
}

/// [`count_lines`] without the memo.
pub(super) async fn count_lines_now(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    ids: &[String],
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<std::collections::HashMap<String, u64>, RepoError> {
    let Some(input) = batch_input(ids) else {
        return Ok(Default::default());
    };
    let (read, feeder) = feed(input)?;
    let spec = git.spec(
        &private.args(workspace, &["cat-file", "--batch"]),
        private.run().stdin(read),
    )?;
    let mut counter = bigfiles::BatchLineCounter::default();
    let finished = crate::command::run_streaming(&spec, stop, |chunk| {
        counter.feed(chunk);
        Ok(())
    })
    .await;
    let _ = feeder.await;
    let finished = finished?;
    if !finished.success() {
        return Err(RunError::GitFailed {
            subcommand: "cat-file".into(),
            outcome: finished.describe(),
        }
        .into());
    }
    Ok(counter.counts())
}

/// Replaces `baseline.git/info/attributes` in the private directory.
pub(super) fn write_attributes(private: BorrowedFd<'_>, text: &[u8]) -> Result<(), RepoError> {
    write_info(private, c"attributes", text)
}

/// Replaces `baseline.git/info/NAME` in the private directory. The directory belongs to the
/// sandbox user, so every step is relative to a descriptor, follows no symlink, and makes a
/// new file rather than writing into whatever has the name.
pub(super) fn write_info(
    private: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    text: &[u8],
) -> Result<(), RepoError> {
    let what = name.to_string_lossy().into_owned();
    let fail = |source| RepoError::CreateInfo {
        what: what.clone(),
        source,
    };
    let repo = fsutil::open_dir_at(private, BASELINE_REPO).map_err(fail)?;
    match nix::sys::stat::mkdirat(repo.as_fd(), c"info", Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(err) => return Err(fail(err)),
    }
    let info = fsutil::open_dir_at(repo.as_fd(), c"info").map_err(fail)?;
    match unlinkat(info.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(err) => return Err(fail(err)),
    }
    let fd = openat(
        info.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(fail)?;
    File::from(fd)
        .write_all(text)
        .map_err(|source| RepoError::WriteInfo { what, source })
}
