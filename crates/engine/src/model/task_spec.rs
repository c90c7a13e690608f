//! Task requests and result objects (docs/mcp.md: Task, Diff, Finish, ls, rm), with the
//! defaults and ranges docs/mcp.md documents. Validation here is what every caller gets;
//! the MCP layer adds its host policy on top.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::foundation::git_url::GitUrl;
use crate::model::import_notes::History;
use crate::model::spec::{validate_name, Network, Resources, TASK_CPUS_DEFAULT};
pub use crate::model::task_results::{
    DiffResult, FinishResult, JobLog, LsResult, Progress, ResultBrief, RmResult, SkipKind, Skipped,
    SkippedPath, SourceInfo, TaskInfo, SKIPPED_LISTED,
};

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
    #[serde(rename = "diskMB")]
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
    /// The built image whose kernel a vm boots (`--kernel`); `None`: the image's own, else
    /// the newest image's that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Leave the project's package caches out (`--no-cache`): the task downloads afresh and
    /// writes into no cache.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_cache: bool,
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
            kernel: None,
            ssh_key_path: None,
            no_cache: false,
        })
    }
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
    /// Set for a fork: the task it was forked from, and the checkpoint if from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkOrigin>,
    /// The id of the project's package cache the task's guest gets (see the host's
    /// `project_cache`), decided when it started; `None`: no cache (`--no-cache`,
    /// `DYNOCAP_CACHES=0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
}

/// Where a forked task came from (`task fork`, `fromTask`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkOrigin {
    /// The parent's name when it was forked (its id when it had none).
    pub task: String,
    pub task_id: String,
    /// The parent's checkpoint the fork started from; `None`: its state at the fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

impl TaskDetail {
    pub fn from_json(text: Option<&str>) -> Result<Self> {
        let text = text.ok_or(TaskRecordFailure::NoDetail)?;
        serde_json::from_str(text).map_err(|err| TaskRecordFailure::Damaged(err).into())
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

/// What is wrong with a task record's detail as the catalog holds it.
#[derive(Debug, thiserror::Error)]
enum TaskRecordFailure {
    #[error("the task record has no detail")]
    NoDetail,
    #[error("the task record is damaged: {0}")]
    Damaged(#[source] serde_json::Error),
}

impl Coded for TaskRecordFailure {
    /// Task records are written by DynoCap alone: a bad one is never the caller's doing.
    fn code(&self) -> ErrorCode {
        match self {
            Self::NoDetail | Self::Damaged(_) => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::import_notes::{Note, NoteKind, Special};

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
    fn source_json_carries_skipped_paths() {
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
    }
}
