//! `dynocap task apply`: a finished task's verified patch, committed onto a new branch of the
//! user's repository, branched from the commit the task's project was imported on top of.
//!
//! CLI only, on purpose: applying stays a person's decision, so no MCP tool reaches this.
//! What it refuses, and why:
//!
//! - a task that has not ended (its patch is not saved yet), or whose patch did not verify;
//! - a patch that no longer reads as the one the task saved (`patch.diff` edited since);
//! - sensitive paths, unless the person says `--accept-sensitive` (the commit message then
//!   lists them, so the acceptance stays on record);
//! - a branch name `git check-ref-format --branch` refuses (`HEAD`, `-x`, `a..b`, ...: see
//!   `branch_name`), and an existing branch (never moved or overwritten);
//! - uncommitted work on any path the patch touches: the branch would be checked out over it.
//!
//! The user's current branch, index and working tree are never touched (`repo`).

mod branch_name;
mod repo;

use std::path::{Path, PathBuf};

use dynocap_review::generated::GeneratedGroup;
use dynocap_review::patch::{self, SensitivePath};
use serde::{Deserialize, Serialize};

use crate::facade::sandboxes::{find, Engine};
use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::model::task_spec::{FinishResult, TaskDetail};
use crate::store::catalog::{Kind, State};
use crate::supervisor::exec::sanitize_line;

pub use repo::Uncommitted;

/// `dynocap task apply NAME [--branch B] [--accept-sensitive] [--to PATH]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplySpec {
    /// The task's name or id.
    pub target: String,
    /// Default: `dynocap/<task name or id>`.
    pub branch: Option<String>,
    pub accept_sensitive: bool,
    /// The repository to apply to instead of the task's project (required when the task has
    /// no project path). Absolute.
    pub to: Option<PathBuf>,
}

/// What `task apply` made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyResult {
    pub id: String,
    pub name: Option<String>,
    /// The repository's top directory.
    pub repository: String,
    pub branch: String,
    pub commit: String,
    /// The commit the branch starts from (the one the task's project was imported on).
    pub base_commit: String,
    /// Every path the commit changes (both names of a rename).
    pub files: Vec<String>,
    /// The sensitive paths `--accept-sensitive` let through (empty when there were none).
    pub sensitive_paths_accepted: Vec<SensitivePath>,
    /// The generated files the task wrote (docs/tasks.md, "Generated files"), as its finish
    /// grouped them: left out of the commit unless the finish kept them in its patch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generated: Vec<GeneratedGroup>,
    /// The finish kept the generated files in the patch: they are in the commit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub generated_included: bool,
    /// Where the generated entries left out are, as a patch of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_patch_path: Option<String>,
}

impl Engine {
    /// Commits a finished task's verified patch onto a new branch of its project (or of
    /// `spec.to`). See the module documentation for what is refused.
    pub async fn task_apply(&self, spec: &ApplySpec) -> Result<ApplyResult> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        let record = find(&catalog, &spec.target)?;
        let target = &spec.target;
        if record.kind != Kind::Task {
            return Err(Error::conflict(format!(
                "\"{target}\" is a raw sandbox; only a task's work can be applied"
            )));
        }
        // Ending (its TTL ran out, or another call finishes it): its patch is being saved.
        let record = self
            .wait_while_ending(&catalog, record)
            .await?
            .ok_or_else(|| Error::not_found(format!("task \"{target}\" was removed")))?;
        match record.state {
            // A task is never pooled (only raw sandboxes are); treated as still starting.
            State::Starting | State::Running | State::Ending | State::Warming | State::Pooled => {
                return Err(Error::conflict(format!(
                    "task \"{target}\" is still running; its patch is saved when it ends: run \
                     `dynocap task finish {target}` first"
                )))
            }
            State::Unsaved | State::Recovering => {
                return Err(Error::conflict(format!(
                    "task \"{target}\" ended without saving its work; run `dynocap task finish \
                     {target}` first (it recovers and saves the work)"
                )))
            }
            State::Finished | State::Expired | State::Destroyed | State::Lost => {}
        }
        let result = self.saved_result(&catalog, &record, target)?;
        let detail = TaskDetail::from_json(record.detail.as_deref())?;
        let source = detail.source.as_ref();
        let base = source.and_then(|s| s.base_commit.clone()).ok_or_else(|| {
            Error::conflict(format!(
                "task \"{target}\" recorded no commit to branch from (its project was not a \
                     git repository with a commit when it started); apply its patch by hand: \
                     git apply {}",
                result.patch_path
            ))
        })?;
        let project = source
            .and_then(|s| s.project_path.clone())
            .map(PathBuf::from);
        let repository = match (&spec.to, project) {
            (Some(to), _) => to.clone(),
            (None, Some(project)) => project,
            (None, None) => {
                return Err(Error::invalid(format!(
                    "task \"{target}\" has no project directory on this machine; name a clone of \
                     its repository with --to PATH"
                )))
            }
        };
        let branch = spec
            .branch
            .clone()
            .unwrap_or_else(|| format!("dynocap/{}", record.name.as_deref().unwrap_or(&record.id)));
        let job = Job {
            target: target.clone(),
            id: record.id.clone(),
            name: record.name.clone(),
            result,
            base,
            repository,
            branch,
            accept_sensitive: spec.accept_sensitive,
        };
        tokio::task::spawn_blocking(move || job.run())
            .await
            .map_err(ApplyFailure::Stopped)?
    }
}

/// Everything the blocking part needs (git runs on its own thread, which outlives it).
struct Job {
    target: String,
    id: String,
    name: Option<String>,
    result: FinishResult,
    base: String,
    repository: PathBuf,
    branch: String,
    accept_sensitive: bool,
}

impl Job {
    fn run(self) -> Result<ApplyResult> {
        let target = &self.target;
        let result = &self.result;
        if !result.verified {
            return Err(Error::conflict(format!(
                "task \"{target}\"'s patch did not verify ({}); it is not applied. Review it in {}",
                result
                    .verify_error
                    .as_deref()
                    .unwrap_or("no reason recorded"),
                result.patch_path
            )));
        }
        let patch_path = PathBuf::from(&result.patch_path);
        let bytes = std::fs::read(&patch_path).map_err(|source| ApplyFailure::ReadPatch {
            path: patch_path.clone(),
            source,
        })?;
        let files = touched_paths(&bytes, result, &patch_path)?;
        if files.is_empty() {
            return Err(Error::conflict(match &result.generated_patch_path {
                Some(left_out) => format!(
                    "task \"{target}\" changed nothing but generated files, which its finish \
                     left out of the patch; there is nothing to apply. They are in {left_out} \
                     (git apply it by hand if you want them)"
                ),
                None => format!("task \"{target}\" changed nothing; there is nothing to apply"),
            }));
        }

        let repo = repo::Repo::open(&self.repository)?;
        repo.check_branch_name(&self.branch)?;
        if !repo.has_commit(&self.base)? {
            return Err(Error::conflict(format!(
                "{} does not have commit {} (the one task \"{target}\" started from); fetch it \
                 there, or name a clone that has it with --to PATH",
                repo.dir().display(),
                self.base
            )));
        }
        let sensitive = sensitive_paths(&bytes, result, &|path| repo.blob_at(&self.base, path));
        if !sensitive.is_empty() && !self.accept_sensitive {
            return Err(Error::new(
                ErrorCode::PolicyDenied,
                format!(
                    "task \"{target}\"'s patch changes sensitive paths:{}\nReview them \
                     (`dynocap task diff {target}`), then apply with --accept-sensitive",
                    list_sensitive(&sensitive)
                ),
            ));
        }
        if repo.branch_exists(&self.branch)? {
            return Err(Error::conflict(format!(
                "branch {} already exists in {}; pick another name with --branch BRANCH",
                self.branch,
                repo.dir().display()
            )));
        }
        let uncommitted = repo.uncommitted(&files)?;
        if !uncommitted.is_empty() {
            let list: String = uncommitted
                .iter()
                .map(|(path, how)| format!("\n  {path} ({})", how.as_str()))
                .collect();
            return Err(Error::conflict(format!(
                "the patch touches files with uncommitted changes in {}:{list}\nCommit or stash \
                 them first; nothing was changed",
                repo.dir().display()
            )));
        }

        let scratch = Scratch::new()?;
        let message = self.message(&sensitive);
        let commit = repo.commit_patch(&self.base, &patch_path, &message, scratch.path())?;
        repo.create_branch(
            &self.branch,
            &commit,
            &format!(
                "dynocap task apply {}",
                self.name.as_deref().unwrap_or(&self.id)
            ),
        )?;
        Ok(ApplyResult {
            id: self.id.clone(),
            name: self.name.clone(),
            repository: repo.dir().display().to_string(),
            branch: self.branch.clone(),
            commit,
            base_commit: self.base.clone(),
            files,
            sensitive_paths_accepted: sensitive,
            generated: self.result.generated.clone(),
            generated_included: self.result.generated_included,
            generated_patch_path: self.result.generated_patch_path.clone(),
        })
    }

    /// The commit message: which task, and every sensitive path let through.
    fn message(&self, sensitive: &[SensitivePath]) -> String {
        let task = match &self.name {
            Some(name) => format!("\"{name}\" ({})", self.id),
            None => self.id.clone(),
        };
        let result = &self.result;
        let mut message = format!(
            "DynoCap task {task}\n\nThe verified patch of DynoCap task {task}: {} {}, +{} -{}.\n",
            result.files,
            if result.files == 1 { "file" } else { "files" },
            result.additions,
            result.deletions
        );
        if !sensitive.is_empty() {
            message.push_str("\nSensitive paths, accepted with --accept-sensitive:");
            message.push_str(&list_sensitive(sensitive));
            message.push('\n');
        }
        if !result.generated.is_empty() {
            // Whoever reads the commit learns that the task's tool output is not in it.
            let files: u64 = result.generated.iter().map(|g| g.files).sum();
            message.push_str(&format!(
                "\n{files} generated {} the task wrote ({}) {}.\n",
                if files == 1 { "file" } else { "files" },
                result
                    .generated
                    .iter()
                    .map(|g| format!("{} under {}", g.pattern, sanitize_line(&g.under, 200)))
                    .collect::<Vec<_>>()
                    .join(", "),
                if result.generated_included {
                    "are in this commit (finished with --include-generated)"
                } else {
                    "are left out of this commit"
                }
            ));
        }
        message
    }
}

/// `path (kind): reason`, one per line, each line starting with a newline.
fn list_sensitive(paths: &[SensitivePath]) -> String {
    paths
        .iter()
        .map(|p| {
            format!(
                "\n  {} ({}): {}",
                sanitize_line(&p.path, 300),
                p.kind.as_str(),
                p.reason
            )
        })
        .collect()
}

/// Every path the patch touches (old and new names), read from the saved patch itself. The
/// patch must still read as what the task saved: one edited since (other counts, a part that
/// no longer parses) is refused, since its review no longer stands.
fn touched_paths(bytes: &[u8], result: &FinishResult, path: &Path) -> Result<Vec<String>> {
    let changed = || {
        Error::conflict(format!(
            "{} changed since the task finished (it no longer matches the task's summary); \
             it is not applied",
            path.display()
        ))
    };
    let entries = patch::parse(bytes, bytes.len()).map_err(|_| changed())?;
    let summary = patch::summarize(bytes, bytes.len(), &|_| None).map_err(|_| changed())?;
    if (summary.files, summary.additions, summary.deletions)
        != (result.files, result.additions, result.deletions)
    {
        return Err(changed());
    }
    let mut paths: Vec<String> = Vec::new();
    for entry in &entries {
        for name in [&entry.old_path, &entry.new_path].into_iter().flatten() {
            if name.contains('\u{fffd}') {
                return Err(Error::conflict(format!(
                    "the patch names a path that is not UTF-8 (shown as {}); apply {} by hand",
                    sanitize_line(name, 300),
                    path.display()
                )));
            }
            if !paths.contains(name) {
                paths.push(name.clone());
            }
        }
    }
    Ok(paths)
}

/// The sensitive paths the task's review found, and any more a review of the patch as it is
/// now finds against the base commit (which differs from the imported tree where the project
/// had uncommitted changes): a path either review flags needs accepting.
fn sensitive_paths(
    bytes: &[u8],
    result: &FinishResult,
    base: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Vec<SensitivePath> {
    let mut all = result.sensitive_paths.clone();
    for found in patch::review(bytes, bytes.len(), base)
        .summary
        .sensitive_paths
    {
        if !all
            .iter()
            .any(|p| p.path == found.path && p.kind == found.kind)
        {
            all.push(found);
        }
    }
    all
}

/// A private directory for the temporary index and message, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let dir =
            std::env::temp_dir().join(format!("dynocap-apply-{:016x}", rand::random::<u64>()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| ApplyFailure::CreateScratch {
                dir: dir.clone(),
                source,
            })?;
        Ok(Self(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What failed applying a task's patch, on the host's side (the repository's own failures
/// are `repo`'s).
#[derive(Debug, thiserror::Error)]
enum ApplyFailure {
    #[error("applying the patch stopped: {0}")]
    Stopped(#[source] tokio::task::JoinError),
    #[error("reading {}: {source}", .path.display())]
    ReadPatch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating {}: {source}", .dir.display())]
    CreateScratch {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Coded for ApplyFailure {
    /// The saved patch and the scratch directory are DynoCap's own files on the host.
    fn code(&self) -> ErrorCode {
        match self {
            Self::Stopped(_) | Self::ReadPatch { .. } | Self::CreateScratch { .. } => {
                ErrorCode::Internal
            }
        }
    }
}
