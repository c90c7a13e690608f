//! Task requests and result objects (docs/mcp.md: Task, Diff, Finish, ls, rm), with the
//! defaults and ranges docs/mcp.md documents. Validation here is what every caller gets;
//! the MCP layer adds its host policy on top.

use std::path::PathBuf;

use dynocap_review::patch::{DiffSummary, SensitivePath};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::git_url::GitUrl;
use crate::model::import_notes::{History, Note, NoteKind};
use crate::model::lifecycle::State;
use crate::model::sandbox_info::SandboxInfo;
use crate::spec::{validate_name, Network, Resources, TASK_CPUS_DEFAULT};

/// Where a task's project comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "RecordedSource")]
pub enum Source {
    ProjectPath(PathBuf),
    /// Parsed where it entered; recorded in its canonical spelling, without credentials.
    RepositoryUrl(GitUrl),
    /// A `repositoryUrl` an earlier version recorded that today's rules refuse (see
    /// [`GitUrl::parse`]): its task still lists and shows it as written, credentials already
    /// gone, but nothing clones it. Never made from a request.
    #[serde(rename = "repositoryUrl")]
    RefusedUrl(String),
}

/// A [`Source`] as a record holds it, before its URL is judged.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
enum RecordedSource {
    ProjectPath(PathBuf),
    RepositoryUrl(String),
}

impl Source {
    /// Why a [`Source::RefusedUrl`] cannot start anything.
    pub fn refused(text: &str) -> Error {
        Error::invalid(format!(
            "the repositoryUrl {text} was recorded by an earlier version of DynoCap and today's \
             rules refuse it; start a new task with a URL they accept (https://HOST/path or \
             ssh://user@HOST/path, on the transport's own port)"
        ))
    }
}

impl From<RecordedSource> for Source {
    fn from(recorded: RecordedSource) -> Self {
        match recorded {
            RecordedSource::ProjectPath(path) => Source::ProjectPath(path),
            RecordedSource::RepositoryUrl(text) => match GitUrl::parse(&text) {
                Ok(url) => Source::RepositoryUrl(url),
                Err(_) => Source::RefusedUrl(dynocap_proto::redact::strip_userinfo(&text)),
            },
        }
    }
}

/// `dynocap task start` / `dynocap_task_start`, defaults applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStartSpec {
    pub source: Source,
    pub history: History,
    pub name: Option<String>,
    pub network: Network,
    pub ttl_seconds: u64,
    pub cpus: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskMB", default = "crate::spec::default_disk_mb")]
    pub disk_mb: u64,
    /// Hosts a `filtered` task may also reach (`--allow-host`), beyond the operator's list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
    /// The SSH key for an ssh `repositoryUrl` clone (its path; the key is read at the clone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_path: Option<PathBuf>,
    /// The image to boot (`--image`); `None`: `DYNOCAP_IMAGE`, else `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The backend to boot on (`--backend`); `None`: `DYNOCAP_BACKEND`, else `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::model::backend_choice::BackendChoice>,
}

impl TaskStartSpec {
    /// Applies the task defaults (ttl 1800, cpus 2, memory 1024, history branches, network
    /// none) and validates every value.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        project_path: Option<PathBuf>,
        repository_url: Option<GitUrl>,
        history: Option<&str>,
        name: Option<String>,
        network: Option<&str>,
        ttl_seconds: Option<u64>,
        cpus: Option<u64>,
        memory_mb: Option<u64>,
        disk_mb: Option<u64>,
    ) -> Result<Self> {
        let source = match (project_path, repository_url) {
            (Some(path), None) => Source::ProjectPath(path),
            (None, Some(url)) => Source::RepositoryUrl(url),
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "give either projectPath or repositoryUrl, not both",
                ))
            }
            (None, None) => {
                return Err(Error::invalid(
                    "give projectPath (a local project directory) or repositoryUrl (a git URL)",
                ))
            }
        };
        let history = match history {
            None | Some("branches") => History::Branches,
            Some("head") => History::Head,
            Some("none") => History::None,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "history \"{other}\" is not valid; use \"branches\", \"head\" or \"none\""
                )))
            }
        };
        if let Some(name) = &name {
            validate_name(name)?;
        }
        let resources = Resources::new(
            network,
            ttl_seconds,
            cpus,
            memory_mb,
            disk_mb,
            TASK_CPUS_DEFAULT,
        )?;
        Ok(Self {
            source,
            history,
            name,
            network: resources.network,
            ttl_seconds: resources.ttl_seconds,
            cpus: resources.cpus,
            memory_mb: resources.memory_mb,
            disk_mb: resources.disk_mb,
            allow_hosts: Vec::new(),
            image: None,
            backend: None,
            ssh_key_path: None,
        })
    }
}

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
    /// a git repository or had no commit, and in records made before it was kept. `task apply`
    /// branches from it.
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
    #[serde(rename = "skipped", default)]
    pub paths: Vec<SkippedPath>,
    #[serde(rename = "skippedTotal", default)]
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
    /// `None` for a record made before sandboxes had a disk limit.
    #[serde(rename = "diskMB", default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
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
    #[serde(default = "crate::model::image_ref::default_image_name")]
    pub image: String,
    /// The built image's content id (none for `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
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

/// What the catalog keeps for a task (its `detail` column): how it was started, what came in,
/// and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskDetail {
    pub start: TaskStartSpec,
    pub source: Option<SourceInfo>,
    pub result: Option<FinishResult>,
    /// Set when the project is imported through an inherited descriptor: the directory its
    /// starter opened and checked, passed to the supervisor as this descriptor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_fd: Option<i32>,
    /// The SSH key a `repositoryUrl` clone uses: its path only; the supervisor reads the file
    /// for the clone and the key itself is never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_path: Option<std::path::PathBuf>,
}

impl TaskDetail {
    pub fn from_json(text: Option<&str>) -> Result<Self> {
        let text = text.ok_or_else(|| Error::internal("the task record has no detail"))?;
        serde_json::from_str(text)
            .map_err(|err| Error::internal(format!("the task record is damaged: {err}")))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::import_notes::Special;

    fn note(path: &str, kind: NoteKind) -> Note {
        Note {
            path: PathBuf::from(path),
            kind,
        }
    }

    /// A record an earlier version wrote with a URL today's parser refuses still reads, shows
    /// the URL as recorded (never a credential) and writes back unchanged; a URL the parser
    /// takes reads as a parsed one.
    #[test]
    fn a_recorded_url_the_rules_now_refuse_still_reads_and_starts_nothing() {
        for (recorded, shown) in [
            ("host.example:owner/repo.git", "host.example:owner/repo.git"),
            (
                "https://10.0.0.1:8443/o/r.git",
                "https://10.0.0.1:8443/o/r.git",
            ),
            ("https://user:pw@127.0.0.1/o/r", "https://***@127.0.0.1/o/r"),
        ] {
            let json = serde_json::json!({ "repositoryUrl": recorded }).to_string();
            let source: Source = serde_json::from_str(&json).unwrap();
            assert_eq!(source, Source::RefusedUrl(shown.to_owned()), "{recorded}");
            let again = serde_json::to_string(&source).unwrap();
            assert_eq!(
                again,
                serde_json::json!({ "repositoryUrl": shown }).to_string()
            );
            let err = Source::refused(shown);
            assert!(err.message.contains("start a new task"), "{err}");
            assert!(!err.message.contains("pw"), "{err}");
        }
        let json = r#"{"repositoryUrl":"https://git.example/o/r.git"}"#;
        let source: Source = serde_json::from_str(json).unwrap();
        assert!(matches!(source, Source::RepositoryUrl(_)), "{source:?}");
        assert_eq!(serde_json::to_string(&source).unwrap(), json);
        let path: Source = serde_json::from_str(r#"{"projectPath":"/p"}"#).unwrap();
        assert_eq!(path, Source::ProjectPath(PathBuf::from("/p")));
    }

    #[test]
    fn skipped_paths_are_sorted_bounded_and_counted() {
        let mut notes: Vec<Note> = (0..SKIPPED_LISTED + 10)
            .rev()
            .map(|i| note(&format!("f{i:03}"), NoteKind::Vanished))
            .collect();
        notes.push(note("nested", NoteKind::ReadAsPlainTree("bad".into())));
        let skipped = Skipped::from_notes(&notes);
        assert_eq!(skipped.total, u64::try_from(SKIPPED_LISTED + 10).unwrap());
        assert_eq!(skipped.paths.len(), SKIPPED_LISTED);
        assert_eq!(skipped.paths[0].path, "f000");
        assert!(skipped.paths.iter().all(|p| p.kind == SkipKind::Vanished));
    }

    #[test]
    fn skip_kind_names_match_their_json() {
        for kind in SkipKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }

    #[test]
    fn source_json_carries_skipped_paths_and_old_records_still_load() {
        let source = SourceInfo {
            project_path: Some("/p".into()),
            repository_url: None,
            history: History::None,
            files: 1,
            bytes: 2,
            base_commit: None,
            skipped: Skipped::from_notes(&[note("q", NoteKind::Special(Special::Fifo))]),
            branch: None,
        };
        let json = serde_json::to_value(&source).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "projectPath": "/p", "history": "none", "files": 1, "bytes": 2,
                "skipped": [{
                    "path": "q",
                    "kind": "special-file",
                    "reason": "a fifo, not imported (fifos, sockets and devices never are)"
                }],
                "skippedTotal": 1
            })
        );
        assert_eq!(serde_json::from_value::<SourceInfo>(json).unwrap(), source);
        // Records written before skipped paths were reported.
        let old: SourceInfo = serde_json::from_str(
            r#"{"projectPath": "/p", "history": "none", "files": 1, "bytes": 2}"#,
        )
        .unwrap();
        assert!(old.skipped.is_empty());
    }
}
