//! The client API for tasks: start one from a project, run commands in it, look at the diff,
//! finish it with a verified patch, list and remove records. Same supervisor machinery as raw
//! sandboxes; task records stay after the guest is gone, until `rm` releases or purges them.

use crate::catalog::{Kind, Record, State};
use crate::control::{ControlReply, ControlRequest};
use crate::error::{Error, Result};
use crate::exec::ExecResult;
use crate::sandboxes::{find, rfc3339, unexpected, Engine, SandboxInfo};
use crate::spec::ExecSpec;
use crate::task_spec::{
    DiffResult, FinishResult, LsResult, Progress, RmResult, Skipped, Source, SourceInfo,
    TaskDetail, TaskInfo, TaskStartSpec,
};

impl Engine {
    /// Boots a task sandbox and imports its project; returns once the agent can work in it.
    /// Dropping the future before it completes removes everything it made.
    pub async fn task_start(
        &self,
        spec: &TaskStartSpec,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<TaskInfo> {
        spec.network.ensure_available()?;
        if let Source::ProjectPath(path) = &spec.source {
            if !path.is_absolute() {
                return Err(Error::invalid(format!(
                    "projectPath {} must be an absolute path",
                    path.display()
                )));
            }
        }
        let detail = TaskDetail {
            start: spec.clone(),
            source: None,
            result: None,
        };
        let record = self.new_record(
            Kind::Task,
            spec.name.clone(),
            spec.network,
            spec.cpus,
            spec.memory_mb,
            spec.ttl_seconds,
            Some(detail.to_json()),
        )?;
        let record = self.launch(record, progress).await?;
        task_info(&record)
    }

    /// Runs a command in a task's workspace (default cwd `/workspace`); logged in exec.jsonl.
    pub async fn task_exec(&self, target: &str, spec: &ExecSpec) -> Result<ExecResult> {
        self.exec_in(Kind::Task, target, spec).await
    }

    /// The patch baseline → working tree and the host's reading of it.
    pub async fn task_diff(&self, target: &str) -> Result<DiffResult> {
        let record = self.live_record(target, Kind::Task)?;
        match self.call(&record, &ControlRequest::Diff).await? {
            ControlReply::Diff(result) => Ok(result),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }

    /// Final diff, guest destroyed, patch verified, results written. A task that already
    /// ended (finished or expired) answers with its recorded result.
    pub async fn task_finish(&self, target: &str) -> Result<FinishResult> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        let record = find(&catalog, target)?;
        if record.kind != Kind::Task {
            return Err(Error::conflict(format!(
                "\"{target}\" is a raw sandbox; destroy it instead"
            )));
        }
        if !record.state.is_live() {
            return TaskDetail::from_json(record.detail.as_deref())?
                .result
                .ok_or_else(|| {
                    Error::conflict(format!(
                        "task \"{target}\" is {} and has no result to show; remove it with rm",
                        record.state.as_str()
                    ))
                });
        }
        match self.call(&record, &ControlRequest::Finish).await? {
            ControlReply::Finished(result) => Ok(result),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }

    /// Tasks (live and retained) and raw sandboxes.
    pub fn ls(&self) -> Result<LsResult> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        let mut tasks = Vec::new();
        let mut sandboxes = Vec::new();
        for record in catalog.list()? {
            match record.kind {
                Kind::Task => tasks.push(task_info(&record)?),
                Kind::Raw => sandboxes.push(SandboxInfo::from_record(&record)),
            }
        }
        Ok(LsResult { tasks, sandboxes })
    }

    /// Releases a task's name; `purge` also deletes its record and results; `force` first
    /// ends a running task (its patch and logs are still saved).
    pub async fn rm(&self, target: &str, force: bool, purge: bool) -> Result<RmResult> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        let record = find(&catalog, target)?;
        if record.kind != Kind::Task {
            return Err(Error::conflict(format!(
                "\"{target}\" is a raw sandbox; remove it with destroy"
            )));
        }
        let mut destroyed = false;
        if record.state.is_live() {
            if !force {
                return Err(Error::conflict(format!(
                    "task \"{target}\" is running; finish it first, or pass force to destroy it (its patch and logs are kept)"
                )));
            }
            match self.call(&record, &ControlRequest::Destroy).await {
                Ok(ControlReply::Finished(_) | ControlReply::Destroyed) => destroyed = true,
                Ok(ControlReply::Error(err)) => return Err(err),
                Ok(other) => return Err(unexpected(&other)),
                Err(_) => self.reconcile(&catalog)?,
            }
        }
        let released = record.name.clone();
        if purge {
            let results = crate::finish::results_dir(self.home().root(), &record.id);
            match std::fs::remove_dir_all(&results) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    return Err(Error::internal(format!(
                        "removing {}: {err}",
                        results.display()
                    )))
                }
            }
            catalog.delete(&record.id)?;
        } else {
            catalog.release_name(&record.id)?;
        }
        Ok(RmResult {
            released,
            purged: purge,
            destroyed,
        })
    }
}

/// The Task object of a record.
fn task_info(record: &Record) -> Result<TaskInfo> {
    let detail = TaskDetail::from_json(record.detail.as_deref())?;
    let source = detail.source.unwrap_or_else(|| SourceInfo {
        project_path: match &detail.start.source {
            Source::ProjectPath(p) => Some(p.display().to_string()),
            Source::RepositoryUrl(_) => None,
        },
        repository_url: match &detail.start.source {
            Source::RepositoryUrl(u) => Some(u.clone()),
            Source::ProjectPath(_) => None,
        },
        history: detail.start.history,
        files: 0,
        bytes: 0,
        skipped: Skipped::default(),
    });
    Ok(TaskInfo {
        id: record.id.clone(),
        name: record.name.clone(),
        state: match record.state {
            // Not a CONTRACT state: a task is "running" from the caller's view once created.
            State::Starting => State::Running,
            other => other,
        },
        backend: record.backend.clone(),
        network: record.network.as_str().to_owned(),
        cpus: record.cpus,
        memory_mb: record.memory_mb,
        ttl_seconds: record.ttl_seconds,
        created_at: rfc3339(record.created_at),
        expires_at: rfc3339(record.expires_at),
        source,
    })
}
