//! What a task's results and listings carry: the Task object and its source, the Diff and
//! Finish objects, `ls` and `rm`, and the progress of a long step.

use dynocap_review::generated::GeneratedGroup;
use dynocap_review::patch::{DiffSummary, SensitivePath};
use serde::{Deserialize, Serialize};

use crate::model::import_notes::{History, Note, NoteKind};
use crate::model::lifecycle::State;
use crate::model::sandbox_info::{RunningJob, SandboxInfo};

/// The `source` of a Task object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceInfo {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub project_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub repository_url: Option<String>,
    pub history: History,
    pub files: u64,
    pub bytes: u64,
    /// The commit the imported tree was taken on top of (`HEAD` then; for a `repositoryUrl`
    /// task the commit it cloned, to which its patch applies); absent when the project was not
    /// a git repository or had no commit. `task apply` branches from it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub base_commit: Option<String>,
    /// `skipped` and `skippedTotal`.
    #[serde(flatten)]
    pub skipped: Skipped,
    /// The branch a `repositoryUrl` task's clone checked out.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub branch: Option<String>,
}

/// How many skipped paths a Task object lists; the supervisor log has them all.
pub const SKIPPED_LISTED: usize = 50;

/// The paths of a project that did not come as they are on the host (left out, or cut short
/// while being read): the first [`SKIPPED_LISTED`] by path, and how many in all. An import
/// never fails for these, so this is the only way a caller learns of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    #[serde(rename = "skipped")]
    pub paths: Vec<SkippedPath>,
    #[serde(rename = "skippedTotal")]
    pub total: u64,
}

/// One path an import left out or cut short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedPath {
    /// Relative to the project root (lossy UTF-8: a name that is not UTF-8 shows U+FFFD).
    pub path: String,
    pub kind: SkipKind,
    pub reason: String,
}

/// Why a path did not come, for programs (`reason` says it for people).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipKind {
    /// A fifo, socket or device.
    SpecialFile,
    /// DynoCap may not read it (permission denied).
    Unreadable,
    /// A directory on its path is a symlink (never followed).
    SymlinkInPath,
    /// Git listed a name that is not a plain relative path, or one too long to open.
    UnsafeName,
    /// It changed type between listing and reading (e.g. a file swapped for a symlink).
    Changed,
    /// It was listed, then removed before it was read.
    Vanished,
    /// It shrank while being read: it came padded with zero bytes.
    Shrank,
    /// Inside repositories nested too deep.
    TooDeep,
}

impl SkipKind {
    pub const ALL: [Self; 8] = [
        Self::SpecialFile,
        Self::Unreadable,
        Self::SymlinkInPath,
        Self::UnsafeName,
        Self::Changed,
        Self::Vanished,
        Self::Shrank,
        Self::TooDeep,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::SpecialFile => "special-file",
            Self::Unreadable => "unreadable",
            Self::SymlinkInPath => "symlink-in-path",
            Self::UnsafeName => "unsafe-name",
            Self::Changed => "changed",
            Self::Vanished => "vanished",
            Self::Shrank => "shrank",
            Self::TooDeep => "too-deep",
        }
    }
}

impl Skipped {
    /// The skipped paths among an import's notes. A nested repository read as plain files is
    /// not one: all of its files came.
    pub fn from_notes(notes: &[Note]) -> Self {
        let mut paths: Vec<SkippedPath> = notes
            .iter()
            .filter_map(|note| {
                let kind = match note.kind {
                    NoteKind::Special(_) => SkipKind::SpecialFile,
                    NoteKind::PermissionDenied => SkipKind::Unreadable,
                    NoteKind::SymlinkInPath => SkipKind::SymlinkInPath,
                    NoteKind::UnsafeName => SkipKind::UnsafeName,
                    NoteKind::Changed => SkipKind::Changed,
                    NoteKind::Vanished => SkipKind::Vanished,
                    NoteKind::Shrank => SkipKind::Shrank,
                    NoteKind::TooDeep => SkipKind::TooDeep,
                    NoteKind::ReadAsPlainTree(_) => return None,
                };
                Some(SkippedPath {
                    path: note.path.to_string_lossy().into_owned(),
                    kind,
                    reason: note.kind.reason(),
                })
            })
            .collect();
        paths.sort_by(|a, b| a.path.cmp(&b.path));
        let total = u64::try_from(paths.len()).unwrap_or(u64::MAX);
        paths.truncate(SKIPPED_LISTED);
        Self { paths, total }
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

/// The Task object (docs/mcp.md, "Task").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskInfo {
    pub id: String,
    pub name: Option<String>,
    pub state: State,
    pub backend: String,
    pub network: String,
    pub cpus: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskMB")]
    pub disk_mb: u64,
    pub ttl_seconds: u64,
    pub created_at: String,
    pub expires_at: String,
    pub source: SourceInfo,
    /// Why the task is in its state, when that needs saying (an `unsaved` task: what went
    /// wrong and what to do).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub note: Option<String>,
    /// What a task that ended saved: the files it changed, whether the patch verified, and
    /// where its results are.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub result: Option<ResultBrief>,
    /// Hosts the egress proxy lets through (HTTPS), for a `filtered` task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_allowlist: Option<Vec<String>>,
    /// The image the task boots (`host` or a built image's name).
    pub image: String,
    /// The built image's content id (none for `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The image whose kernel its vm boots when not the image's own: named (`--kernel`), or
    /// lent to a container image by the newest image on the host that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// How a start that let the project choose (`--image auto`, the MCP default) chose the
    /// image: the devcontainer.json that named it, or why the task is on the default image.
    /// Only in the start's own result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_note: Option<String>,
    /// The task it was forked from, and the checkpoint if from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<crate::model::task_spec::ForkOrigin>,
    /// Its running jobs, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<crate::model::sandbox_info::RunningJob>,
    /// Its port forwards, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forwards: Vec<crate::model::sandbox_info::PortForward>,
}

/// The part of a saved result worth listing beside a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultBrief {
    pub files: u64,
    pub verified: bool,
    pub sensitive_paths: usize,
    pub results_dir: String,
}

impl ResultBrief {
    pub fn of(result: &FinishResult) -> Self {
        Self {
            files: result.files,
            verified: result.verified,
            sensitive_paths: result.sensitive_paths.len(),
            results_dir: std::path::Path::new(&result.patch_path)
                .parent()
                .map(|dir| dir.display().to_string())
                .unwrap_or_default(),
        }
    }
}

/// The Diff object: the header plus the patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffResult {
    #[serde(flatten)]
    pub summary: DiffSummary,
    pub patch: String,
    /// Files the task added under directories tools generate (docs/tasks.md, "Generated
    /// files"), summarised instead of patched: neither in `patch` nor in `summary`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generated: Vec<GeneratedGroup>,
}

impl DiffResult {
    /// The text form (docs/mcp.md, "Diff"): one line of JSON (the header), a newline, the patch.
    pub fn to_text(&self) -> String {
        let header = serde_json::to_string(&self.summary).unwrap_or_else(|_| "{}".to_owned());
        format!("{header}\n{}", self.patch)
    }
}

/// The Finish object (docs/mcp.md, "Finish").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FinishResult {
    pub id: String,
    pub name: Option<String>,
    pub state: State,
    pub verified: bool,
    pub verify_error: Option<String>,
    pub patch_path: String,
    pub log_path: String,
    pub summary_path: String,
    pub files: u64,
    pub additions: u64,
    pub deletions: u64,
    pub sensitive_paths: Vec<SensitivePath>,
    /// The task had already ended before this call: this is the result it saved then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub already_finished: bool,
    /// What the egress proxy allowed and refused (`hostsReached`, `refusals`), for a task
    /// that had egress; every decision is in `network.jsonl` beside the patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
    /// Files the task added under directories tools generate (docs/tasks.md, "Generated
    /// files"): left out of the patch unless the finish asked for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generated: Vec<GeneratedGroup>,
    /// The finish asked for the generated files: they are in the patch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub generated_included: bool,
    /// The generated entries left out, as a patch of their own beside `patch.diff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_patch_path: Option<String>,
    /// The jobs still running when the task ended (finished, or its TTL ran out), which its
    /// end cut off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs_cut_off: Vec<RunningJob>,
    /// The task's jobs (those its sandbox still remembered), each with its whole kept output
    /// saved in the results' `jobs/` directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobLog>,
}

/// A task's job as its results keep it: where its whole output is, and what of it was not
/// kept (past the sandbox's bound on kept job output).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobLog {
    pub job: String,
    pub command: String,
    pub started_at: String,
    /// The task's end cut it off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_off: bool,
    pub stdout_path: String,
    pub stderr_path: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Bytes of its output not kept, so not in the files.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stdout_dropped: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stderr_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The ls object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LsResult {
    pub tasks: Vec<TaskInfo>,
    pub sandboxes: Vec<SandboxInfo>,
}

/// The rm object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RmResult {
    pub released: Option<String>,
    pub purged: bool,
    pub destroyed: bool,
    /// Where the files of an unsaved task stay when it is removed without `purge`: finishing
    /// it by id still recovers them.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kept_work: Option<String>,
}

/// Progress of a long step (import, clone, boot), for progress bars and MCP notifications.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// What is happening, e.g. "importing /src/app".
    pub message: String,
    pub done: u64,
    /// Unknown when `None`.
    pub total: Option<u64>,
}
