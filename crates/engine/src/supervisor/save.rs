//! Saving a task's work into its results directory: the final patch streamed to disk as the
//! agent produces it, then the host's reading of it (summary, verification) and
//! `summary.json`.
//!
//! The supervisor keeps one rule with this module (docs/architecture.md, Invariants): the guest's
//! writable layer is deleted only once `summary.json` is on disk. Every file here is written
//! to a temporary name, synced and renamed, so a result directory never holds half a patch
//! or half a summary: `patch.diff` without `summary.json` means "saved, not yet read", and a
//! supervisor killed at any step leaves either a complete result or a kept layer.

use std::path::{Path, PathBuf};

use dynocap_review::patch::{self, DiffSummary};
use serde::Serialize;

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::model::task_spec::{FinishResult, SourceInfo};
use crate::store::catalog::State;
use crate::supervisor::agent_conn::AgentConn;
use crate::supervisor::finish;
use crate::supervisor::workspace;

/// The files of one task's results directory.
#[derive(Debug, Clone)]
pub struct ResultFiles {
    pub dir: PathBuf,
}

impl ResultFiles {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }
    pub fn patch(&self) -> PathBuf {
        self.dir.join(finish::PATCH_FILE)
    }
    pub fn summary(&self) -> PathBuf {
        self.dir.join(finish::SUMMARY_FILE)
    }
    pub fn exec_log(&self) -> PathBuf {
        self.dir.join(finish::EXEC_LOG_FILE)
    }

    /// The result a finished task saved (`summary.json`), if it is there and readable.
    pub fn saved_result(&self) -> Option<FinishResult> {
        #[derive(serde::Deserialize)]
        struct Summary {
            task: FinishResult,
        }
        let text = std::fs::read(self.summary()).ok()?;
        serde_json::from_slice::<Summary>(&text)
            .ok()
            .map(|summary| summary.task)
    }
}

/// Streams the patch baseline → working tree into `patch.diff`, whatever its size, and makes
/// it durable. While the agent works, it must keep answering pings: a stopped or wedged agent
/// fails the save instead of hanging it. On failure no `patch.diff` is left behind.
pub async fn take_final_patch(
    conn: &AgentConn,
    files: &ResultFiles,
    line_diff_budget: u64,
) -> Result<u64> {
    let partial = files.dir.join(format!("{}.partial", finish::PATCH_FILE));
    let taken = async {
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .await
            .map_err(|err| disk_error("creating", &partial, err))?;
        let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
        let size = conn
            .while_responsive(workspace::diff_into(
                conn,
                &mut out,
                None,
                line_diff_budget,
                workspace::Scan::Everything,
            ))
            .await??;
        crate::foundation::failpoint::hit("save.patch-written")?;
        use tokio::io::AsyncWriteExt;
        out.flush()
            .await
            .map_err(|err| disk_error("writing", &partial, err))?;
        out.into_inner()
            .sync_all()
            .await
            .map_err(|err| disk_error("writing", &partial, err))?;
        Ok::<u64, Error>(size)
    }
    .await;
    let size = match taken {
        Ok(size) => size,
        Err(err) => {
            let _ = std::fs::remove_file(&partial);
            return Err(match err.message.contains("No space left on device") {
                true => out_of_space(&files.dir),
                false => err,
            });
        }
    };
    crate::foundation::durable::publish(&partial, &files.patch())
        .map_err(|err| disk_error("saving", &files.patch(), err))?;
    Ok(size)
}

/// What `summary.json` holds besides the result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SummaryFile<'a> {
    task: &'a FinishResult,
    source: Option<&'a SourceInfo>,
    created_at: &'a str,
    finished_at: String,
}

/// Everything [`finalize`] needs to know about the task besides its files.
pub struct TaskFacts<'a> {
    pub id: &'a str,
    pub name: Option<&'a str>,
    pub created_at: &'a str,
    pub source: Option<&'a SourceInfo>,
    /// The host's copy of what was imported (`baseline.tar`).
    pub baseline_tar: &'a Path,
    /// Scratch space for the verification, removed afterwards.
    pub scratch: &'a Path,
    /// The egress proxy's summary, for a task that had one.
    pub network: Option<serde_json::Value>,
}

/// Reads the saved `patch.diff` (the host parses it itself), verifies it against the host's
/// copy of the baseline and writes `summary.json`. A patch that does not parse or apply is a
/// result with `verified: false` and the reason; only a failure to write is an error.
pub fn finalize(
    facts: &TaskFacts<'_>,
    files: &ResultFiles,
    state: State,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<FinishResult> {
    let patch_path = files.patch();
    // A refused patch keeps its summary: every entry counted, every name flagged.
    let (summary, parse_error) = match summarize_file(&patch_path, baseline) {
        Ok(review) => (review.summary, review.refusal.map(|why| refused(&why))),
        Err(err) => (DiffSummary::default(), Some(err)),
    };
    let verify_error = match parse_error {
        Some(err) => Some(err),
        None => finish::verify(facts.baseline_tar, &patch_path, facts.scratch).err(),
    };
    let result = FinishResult {
        id: facts.id.to_owned(),
        name: facts.name.map(str::to_owned),
        state,
        verified: verify_error.is_none(),
        verify_error,
        patch_path: patch_path.display().to_string(),
        log_path: files.exec_log().display().to_string(),
        summary_path: files.summary().display().to_string(),
        files: summary.files,
        additions: summary.additions,
        deletions: summary.deletions,
        sensitive_paths: summary.sensitive_paths,
        already_finished: false,
        network: facts.network.clone(),
    };
    let text = serde_json::to_vec_pretty(&SummaryFile {
        task: &result,
        source: facts.source,
        created_at: facts.created_at,
        finished_at: crate::model::sandbox_info::rfc3339(chrono::Utc::now()),
    })
    .map_err(SaveFailure::EncodeSummary)?;
    write_durably(&files.summary(), &text)?;
    Ok(result)
}

/// The host's reading of a saved patch of any size: mapped, not read into memory.
fn summarize_file(
    path: &Path,
    baseline: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> std::result::Result<patch::Review, String> {
    let file = std::fs::File::open(path).map_err(|err| format!("reading the patch: {err}"))?;
    let size = file
        .metadata()
        .map_err(|err| format!("reading the patch: {err}"))?
        .len();
    if size == 0 {
        return Ok(patch::Review::default());
    }
    // SAFETY: the patch lives in the task's 0700 results directory, written and closed by
    // this supervisor before this call; nothing else writes it while it is mapped (another
    // process of the same user truncating it would be the same trust domain, not the guest).
    let map =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|err| format!("reading the patch: {err}"))?;
    Ok(patch::review(&map, map.len(), baseline))
}

fn refused(why: &str) -> String {
    format!("the patch from the sandbox was refused: {why}")
}

/// Writes `bytes` to `path` whole or not at all ([`crate::foundation::durable`]); a full disk is said as
/// such, with what to do.
pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::foundation::durable::replace(path, bytes).map_err(|err| match err.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            out_of_space(path.parent().unwrap_or(Path::new("/")))
        }
        _ => disk_error("writing", path, err),
    })
}

/// `what` is the verb: "creating", "writing", "saving".
fn disk_error(what: &'static str, path: &Path, source: std::io::Error) -> Error {
    SaveFailure::Disk {
        what,
        path: path.to_owned(),
        source,
    }
    .into()
}

fn out_of_space(dir: &Path) -> Error {
    SaveFailure::OutOfSpace {
        dir: dir.to_owned(),
    }
    .into()
}

/// What failed saving a task's results on the host.
#[derive(Debug, thiserror::Error)]
enum SaveFailure {
    #[error("encoding the summary: {0}")]
    EncodeSummary(#[source] serde_json::Error),
    #[error("{what} {}: {source}", .path.display())]
    Disk {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The cause is gone by now (it may have come through the agent's diff as text).
    #[error(
        "the disk holding {} is full (No space left on device); free space there (or point \
         DYNOCAP_HOME at a larger disk), then finish the task again",
        .dir.display()
    )]
    OutOfSpace { dir: PathBuf },
}

impl Coded for SaveFailure {
    /// The results directory is on the host, DynoCap's: a full or failing disk there is the
    /// operator's to fix (the message says how), never the caller's.
    fn code(&self) -> ErrorCode {
        match self {
            Self::EncodeSummary(_) | Self::Disk { .. } | Self::OutOfSpace { .. } => {
                ErrorCode::Internal
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_durable_write_replaces_whole_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        write_durably(&path, b"one").unwrap();
        write_durably(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn a_saved_result_is_found_from_the_summary_alone() {
        let dir = tempfile::tempdir().unwrap();
        let files = ResultFiles::new(dir.path().to_owned());
        assert!(files.saved_result().is_none());
        std::fs::write(files.patch(), "").unwrap();
        let baseline = dir.path().join("baseline.tar");
        tar::Builder::new(std::fs::File::create(&baseline).unwrap())
            .finish()
            .unwrap();
        let facts = TaskFacts {
            id: "task-x",
            name: Some("t"),
            created_at: "2026-01-01T00:00:00Z",
            source: None,
            baseline_tar: &baseline,
            scratch: &dir.path().join("scratch"),
            network: None,
        };
        let result = finalize(&facts, &files, State::Expired, &|_| None).unwrap();
        assert!(result.verified);
        assert_eq!(files.saved_result(), Some(result));
    }
}
