//! Task requests and result objects (CONTRACT.md: Task, Diff, Finish, ls, rm), with the
//! defaults and ranges of the tools reference. Validation here is what every caller gets;
//! the MCP layer adds its host policy on top.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::catalog::State;
use crate::error::{Error, Result};
use crate::import::History;
use crate::patch::{DiffSummary, SensitivePath};
use crate::sandboxes::SandboxInfo;
use crate::spec::{validate_name, Network, Resources, TASK_CPUS_DEFAULT};

/// Where a task's project comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    ProjectPath(PathBuf),
    RepositoryUrl(String),
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
}

impl TaskStartSpec {
    /// Applies the task defaults (ttl 1800, cpus 2, memory 1024, history branches, network
    /// none) and validates every value.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        project_path: Option<PathBuf>,
        repository_url: Option<String>,
        history: Option<&str>,
        name: Option<String>,
        network: Option<&str>,
        ttl_seconds: Option<u64>,
        cpus: Option<u64>,
        memory_mb: Option<u64>,
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
        let resources = Resources::new(network, ttl_seconds, cpus, memory_mb, TASK_CPUS_DEFAULT)?;
        Ok(Self {
            source,
            history,
            name,
            network: resources.network,
            ttl_seconds: resources.ttl_seconds,
            cpus: resources.cpus,
            memory_mb: resources.memory_mb,
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
}

/// The Task object (CONTRACT.md).
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
    pub ttl_seconds: u64,
    pub created_at: String,
    pub expires_at: String,
    pub source: SourceInfo,
    /// Why the task is in its state, when that needs saying (an `unsaved` task: what went
    /// wrong and what to do).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub note: Option<String>,
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
    /// CONTRACT.md's text form: one line of JSON (the header), a newline, the patch.
    pub fn to_text(&self) -> String {
        let header = serde_json::to_string(&self.summary).unwrap_or_else(|_| "{}".to_owned());
        format!("{header}\n{}", self.patch)
    }
}

/// The Finish object (CONTRACT.md).
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
