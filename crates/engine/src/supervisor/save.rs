//! Saving a task's work into its results directory: the final patch streamed to disk as the
//! agent produces it, then the host's reading of it (summary, verification) and
//! `summary.json`. Unless the finish asked for them, the generated files the task added
//! ([`dynocap_review::generated`]) are moved out of `patch.diff` into `generated.diff` before
//! the patch is read and verified: what is verified and applied is the patch without them.
//!
//! The supervisor keeps one rule with this module (docs/architecture.md, Invariants): the guest's
//! writable layer is deleted only once `summary.json` is on disk. Every file here is written
//! to a temporary name, synced and renamed, so a result directory never holds half a patch
//! or half a summary: `patch.diff` without `summary.json` means "saved, not yet read", and a
//! supervisor killed at any step leaves either a complete result or a kept layer.

use std::path::{Path, PathBuf};

use dynocap_review::generated::{self, GeneratedGroup, Project, Split};
use dynocap_review::patch::{self, DiffSummary};
use serde::Serialize;

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::model::sandbox_info::RunningJob;
use crate::model::task_spec::{FinishResult, JobLog, SourceInfo};
use crate::store::catalog::State;
use crate::supervisor::agent_conn::AgentConn;
use crate::supervisor::finish;
use crate::supervisor::workspace;

/// Generated files left out of the patch, beside `patch.diff`.
pub const GENERATED_PATCH_FILE: &str = "generated.diff";

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
    /// The generated entries left out of `patch.diff`, as a patch of their own.
    pub fn generated_patch(&self) -> PathBuf {
        self.dir.join(GENERATED_PATCH_FILE)
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
    dynocap_host::durable::publish(&partial, &files.patch())
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
    /// Keep the generated files in the patch (`--include-generated`).
    pub include_generated: bool,
    /// What the project tracks in the baseline: which files the generated rules may leave
    /// out.
    pub project: &'a dyn Project,
    /// The jobs the task's end cut off.
    pub jobs_cut_off: Vec<RunningJob>,
    /// The task's jobs, their output saved in the results.
    pub jobs: Vec<JobLog>,
}

/// The generated entries of `patch` and the rest, or `None` when it has none (or cannot be
/// read: the review then says why, of the whole patch).
pub fn split_generated(patch: &[u8], project: &dyn Project) -> Option<Split> {
    let files = patch::parse(patch, patch.len().max(1)).ok()?;
    let split = generated::split(patch, &files, project);
    (!split.generated.is_empty()).then_some(split)
}

/// Moves the generated entries of `patch.diff` into `generated.diff` (written first, so a
/// supervisor killed in between loses nothing) and says what they were; with
/// `include_generated`, only says. A finalize run again after such a kill finds
/// `patch.diff` without them and reads the groups back from `generated.diff`.
fn leave_out_generated(
    facts: &TaskFacts<'_>,
    files: &ResultFiles,
) -> Result<(Vec<GeneratedGroup>, Option<String>)> {
    let patch_path = files.patch();
    let generated_path = files.generated_patch();
    let shown_path = || Some(generated_path.display().to_string());
    // Unreadable or empty: nothing to leave out (the review says why it cannot read it).
    let Some(map) = map_file(&patch_path) else {
        return Ok((Vec::new(), None));
    };
    match split_generated(&map, facts.project) {
        Some(split) if facts.include_generated => Ok((split.groups, None)),
        Some(split) => {
            write_ranges_durably(&generated_path, &map, &split.generated)?;
            write_ranges_durably(&patch_path, &map, &split.kept)?;
            Ok((split.groups, shown_path()))
        }
        None if facts.include_generated => Ok((Vec::new(), None)),
        None => Ok(
            match map_file(&generated_path)
                .and_then(|left_out| split_generated(&left_out, facts.project))
            {
                Some(split) => (split.groups, shown_path()),
                None => (Vec::new(), None),
            },
        ),
    }
}

/// A results file mapped, not read into memory (a patch has no size bound); `None` when it
/// is missing, empty or unreadable.
fn map_file(path: &Path) -> Option<memmap2::Mmap> {
    let file = std::fs::File::open(path).ok()?;
    if file.metadata().ok()?.len() == 0 {
        return None;
    }
    // SAFETY: the file lives in the task's 0700 results directory, written and closed by this
    // supervisor; nothing else writes it while it is mapped (replacing it renames a new file
    // over the name, which leaves the mapped one as it was; another process of the same user
    // truncating it would be the same trust domain, not the guest).
    unsafe { memmap2::Mmap::map(&file) }.ok()
}

/// Writes the `ranges` of `bytes` to `path`, whole or not at all (a temporary beside it,
/// synced, renamed over it), without gathering them in memory.
fn write_ranges_durably(
    path: &Path,
    bytes: &[u8],
    ranges: &[std::ops::Range<usize>],
) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".partial");
    let partial = path.with_file_name(name);
    let written = (|| -> std::io::Result<()> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        for range in ranges {
            out.write_all(&bytes[range.clone()])?;
        }
        out.into_inner()
            .map_err(std::io::IntoInnerError::into_error)?
            .sync_all()?;
        dynocap_host::durable::publish(&partial, path)
    })();
    written.map_err(|err| {
        let _ = std::fs::remove_file(&partial);
        write_error(path, err)
    })
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
    let (generated, generated_patch_path) = leave_out_generated(facts, files)?;
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
        generated_included: facts.include_generated && !generated.is_empty(),
        generated,
        generated_patch_path,
        jobs_cut_off: facts.jobs_cut_off.clone(),
        jobs: facts.jobs.clone(),
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

/// Writes `bytes` to `path` whole or not at all ([`dynocap_host::durable`]); a full disk is said as
/// such, with what to do.
pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    dynocap_host::durable::replace(path, bytes).map_err(|err| write_error(path, err))
}

/// A failure writing `path`: a full disk said as such, with what to do.
fn write_error(path: &Path, err: std::io::Error) -> Error {
    match err.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            out_of_space(path.parent().unwrap_or(Path::new("/")))
        }
        _ => disk_error("writing", path, err),
    }
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

    fn added(name: &str) -> String {
        format!(
            "diff --git a/{name} b/{name}\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n+x\n"
        )
    }

    #[test]
    fn generated_files_are_moved_out_of_the_patch_before_it_is_verified() {
        let dir = tempfile::tempdir().unwrap();
        let files = ResultFiles::new(dir.path().to_owned());
        let baseline = dir.path().join("baseline.tar");
        tar::Builder::new(std::fs::File::create(&baseline).unwrap())
            .finish()
            .unwrap();
        let edits = added("pkg/new.py");
        let whole = [edits.clone(), added("pkg/__pycache__/new.cpython-311.pyc")].concat();
        let scratch = dir.path().join("scratch");
        let facts = |include_generated| TaskFacts {
            id: "task-x",
            name: Some("t"),
            created_at: "2026-01-01T00:00:00Z",
            source: None,
            baseline_tar: &baseline,
            scratch: &scratch,
            network: None,
            include_generated,
            project: &|_: &str| false,
            jobs_cut_off: Vec::new(),
            jobs: Vec::new(),
        };
        std::fs::write(files.patch(), &whole).unwrap();
        let result = finalize(&facts(false), &files, State::Finished, &|_| None).unwrap();
        assert!(result.verified, "{result:?}");
        assert_eq!((result.files, result.generated.len()), (1, 1));
        assert!(!result.generated_included);
        assert_eq!(std::fs::read_to_string(files.patch()).unwrap(), edits);
        assert_eq!(
            result.generated_patch_path.as_deref(),
            Some(files.generated_patch().to_str().unwrap())
        );
        let left_out = std::fs::read_to_string(files.generated_patch()).unwrap();
        assert_eq!(left_out, added("pkg/__pycache__/new.cpython-311.pyc"));
        // Run again (a supervisor killed before the summary): the same answer, nothing lost.
        let again = finalize(&facts(false), &files, State::Finished, &|_| None).unwrap();
        assert_eq!(again, result);
        assert_eq!(
            std::fs::read_to_string(files.generated_patch()).unwrap(),
            left_out
        );

        // Asked for, they stay in the patch and are verified with it.
        std::fs::remove_file(files.generated_patch()).unwrap();
        std::fs::write(files.patch(), &whole).unwrap();
        let kept = finalize(&facts(true), &files, State::Finished, &|_| None).unwrap();
        assert!(kept.verified && kept.generated_included, "{kept:?}");
        assert_eq!((kept.files, kept.generated.len()), (2, 1));
        assert_eq!(kept.generated_patch_path, None);
        assert_eq!(std::fs::read_to_string(files.patch()).unwrap(), whole);
        assert!(!files.generated_patch().exists());
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
            include_generated: false,
            project: &|_: &str| false,
            jobs_cut_off: Vec::new(),
            jobs: Vec::new(),
        };
        let result = finalize(&facts, &files, State::Expired, &|_| None).unwrap();
        assert!(result.verified);
        assert_eq!(files.saved_result(), Some(result));
    }
}
