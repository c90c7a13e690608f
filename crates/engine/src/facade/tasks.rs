//! The client API for tasks: start one from a project, run commands in it, look at the diff,
//! finish it with a verified patch, list and remove records. Same supervisor machinery as raw
//! sandboxes; task records stay after the guest is gone, until `rm` releases or purges them.

use std::os::fd::AsFd;

use crate::facade::sandboxes::{
    find, remove_leftovers, rfc3339, unexpected, Engine, Handed, Keep, SandboxInfo, Via,
};
use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::foundation::terms::Op;
use crate::model::spec::ExecSpec;
use crate::model::task_spec::{
    DiffResult, FinishResult, LsResult, Progress, ResultBrief, RmResult, Skipped, Source,
    SourceInfo, TaskDetail, TaskInfo, TaskStartSpec,
};
use crate::store::catalog::Catalog;
use crate::store::catalog::{Kind, Record, State};
use crate::supervisor::control::{ControlReply, ControlRequest};
use crate::supervisor::egress::EgressSpec;
use crate::supervisor::exec::ExecResult;
use crate::supervisor::import::ProjectDir;
use crate::supervisor::process::Mode;
use crate::supervisor::save::ResultFiles;
use crate::supervisor::workspace::SUPERVISOR_PROJECT_FD;

impl Engine {
    /// Boots a task sandbox and imports its project; returns once the agent can work in it.
    /// A `projectPath` is opened here, once (see [`Engine::task_start_in`]).
    /// Dropping the future before it completes removes everything it made.
    pub async fn task_start(
        &self,
        spec: &TaskStartSpec,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<TaskInfo> {
        let project = match &spec.source {
            Source::ProjectPath(path) => {
                if !path.is_absolute() {
                    return Err(Error::invalid(format!(
                        "projectPath {} must be an absolute path",
                        path.display()
                    )));
                }
                Some(ProjectDir::open(path)?)
            }
            Source::RepositoryUrl(_) => None,
            Source::RefusedUrl(text) => return Err(Source::refused(text)),
        };
        self.task_start_in(spec, project, progress).await
    }

    /// [`Engine::task_start`] for a project directory the caller already opened (and
    /// checked): the supervisor inherits this very descriptor and imports through it, so what
    /// was checked is what is imported. The task records the descriptor's path.
    pub async fn task_start_in(
        &self,
        spec: &TaskStartSpec,
        project: Option<ProjectDir>,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<TaskInfo> {
        self.admit(spec.cpus, spec.memory_mb, spec.disk_mb, spec.ttl_seconds)?;
        crate::host::usernet::ensure_available(spec.network)?;
        let mut start = spec.clone();
        // The credentials of a repository URL are kept apart from here: the record holds the
        // URL without them, the supervisor gets them on a pipe.
        let mut credentials = None;
        if let Source::RepositoryUrl(url) = &spec.source {
            start.source = Source::RepositoryUrl(url.without_credentials());
            credentials = url.credentials().cloned();
        }
        match (&spec.source, &project) {
            (Source::ProjectPath(_), Some(dir)) => {
                // The task's record, and its project's package cache, name the project by
                // this path as text: one that is not UTF-8 could be neither recorded nor told
                // apart from another spelled with the same replacement characters.
                if dir.path().to_str().is_none() {
                    return Err(Error::invalid(format!(
                        "the project directory {} has a path that is not UTF-8 (every symlink \
                         resolved), which DynoCap cannot record; rename it, or the directories \
                         above it, to UTF-8 names",
                        dir.path().display()
                    )));
                }
                start.source = Source::ProjectPath(dir.path().to_path_buf());
            }
            (Source::ProjectPath(path), None) => {
                return Err(TaskFailure::ProjectNotOpened { path: path.clone() }.into())
            }
            (Source::RepositoryUrl(_), Some(_)) => {
                return Err(Error::invalid(
                    "a project directory was given with a repositoryUrl; give one source",
                ))
            }
            (Source::RepositoryUrl(_), None) => {}
            (Source::RefusedUrl(text), _) => return Err(Source::refused(text)),
        }
        let git_host = match &start.source {
            Source::RepositoryUrl(url) => Some(url.host().to_owned()),
            Source::ProjectPath(_) | Source::RefusedUrl(_) => None,
        };
        if let Some(path) = &spec.ssh_key_path {
            if git_host.is_none() {
                return Err(Error::invalid(
                    "sshKeyPath only applies to cloning a repositoryUrl, not to a projectPath",
                ));
            }
            // Checked now so a bad key fails before anything starts; read again at the clone.
            crate::foundation::ssh_key::read(path)?;
        }
        let filtered = spec.network == crate::model::spec::Network::Filtered;
        let mut git_hosts: Vec<String> = git_host.iter().cloned().collect();
        if let (true, Some(dir)) = (filtered, &project) {
            // The project's own remotes on the git hosts the operator trusts, so fetch and
            // push of the project work.
            git_hosts.extend(crate::supervisor::egress::remote_hosts(
                &self.config().egress,
                &crate::supervisor::import::remote_urls(dir),
            ));
        }
        let egress = if filtered || git_host.is_some() {
            Some(EgressSpec::from_config(
                &self.config().egress,
                filtered,
                &spec.allow_hosts,
                &git_hosts,
            )?)
        } else {
            EgressSpec::refuse_hosts(&spec.allow_hosts)?;
            None
        };
        // The project's package caches, unless the task or the host leaves them out.
        let cache = if spec.no_cache || !self.config().caches()? {
            None
        } else {
            crate::host::project_cache::ProjectKey::for_source(&start.source).map(|key| key.id())
        };
        // A cache still to be made sets its room aside too: the start is refused now, with
        // the disk, if the host cannot back both.
        if let Some(id) = &cache {
            let bytes = self.config().cache_bytes()?;
            let needed = crate::host::project_cache::room_needed(self.home().root(), id, bytes);
            if needed > 0 {
                crate::host::disk_room::check_room_with_cache(
                    self.home().root(),
                    spec.disk_mb,
                    needed.div_ceil(1 << 20),
                )?;
            }
        }
        let detail = TaskDetail {
            start,
            source: None,
            result: None,
            project_fd: project.is_some().then_some(SUPERVISOR_PROJECT_FD),
            ssh_key_path: spec.ssh_key_path.clone(),
            fork: None,
            cache,
        };
        let detail_cache = detail.cache.clone();
        let mut record = self.new_record(
            Kind::Task,
            spec.name.clone(),
            spec.network,
            spec.cpus,
            spec.memory_mb,
            spec.disk_mb,
            spec.ttl_seconds,
            Some(detail.to_json()),
            spec.image.as_deref(),
            spec.backend,
        )?;
        self.name_kernel(&mut record, spec.kernel.as_deref())?;
        record.egress = egress;
        // A task's baseline is a git commit made in the guest: an image without git is told
        // now, with what to do, rather than after it booted and its agent found none.
        if crate::image::has_program(self.home(), &record.image, "git") == Some(false) {
            return Err(TaskFailure::NoGitInImage {
                image: record.image.name.clone(),
            }
            .into());
        }
        let credentials = credentials
            .as_ref()
            .map(crate::supervisor::clone::credentials_pipe)
            .transpose()?;
        let handed = Handed {
            project: project.as_ref().map(ProjectDir::as_fd),
            credentials: credentials.as_ref().map(AsFd::as_fd),
        };
        // A cache this start makes goes again if the start fails.
        let new_cache =
            crate::facade::caches::NewCacheGuard::new(self.home(), detail_cache.as_deref());
        let record = self.launch_with(record, handed, progress).await?;
        new_cache.disarm();
        // Tasks boot afresh (the pool holds raw sandboxes); the pool yields their room.
        self.rebalance_pool().await;
        task_info(&record)
    }

    /// Runs a command in a task's workspace (default cwd `/workspace`); logged in exec.jsonl.
    pub async fn task_exec(&self, target: &str, spec: &ExecSpec) -> Result<ExecResult> {
        self.exec_in(Kind::Task, target, spec, None, None).await
    }

    /// As [`Engine::task_exec`], passing all of the command's output to `on_output` as it
    /// comes (see [`Engine::exec_streaming`]).
    pub async fn task_exec_streaming(
        &self,
        target: &str,
        spec: &ExecSpec,
        on_output: crate::facade::sandboxes::OnOutput<'_>,
    ) -> Result<ExecResult> {
        self.exec_in(Kind::Task, target, spec, None, Some(on_output))
            .await
    }

    /// As [`Engine::task_exec`], reporting progress while the command runs.
    pub async fn task_exec_reporting(
        &self,
        target: &str,
        spec: &ExecSpec,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<ExecResult> {
        self.exec_in(Kind::Task, target, spec, Some(progress), None)
            .await
    }

    /// The patch baseline → working tree and the host's reading of it.
    /// A task that ended shows the patch it saved, with its saved summary.
    pub async fn task_diff(&self, target: &str) -> Result<DiffResult> {
        let catalog = self.catalog()?;
        self.reconcile_for_reading(&catalog)?;
        let mut found = find(&catalog, target)?;
        if found.kind == Kind::Task && found.state == State::Ending {
            // Its work is being saved: the saved patch is the answer, once it is there.
            found = self
                .wait_while_ending(&catalog, found)
                .await?
                .ok_or_else(|| Error::not_found(format!("task \"{target}\" was removed")))?;
        }
        if found.kind == Kind::Task
            && matches!(
                found.state,
                State::Finished | State::Expired | State::Destroyed | State::Lost
            )
        {
            return self.saved_diff(&catalog, &found, target);
        }
        let record = self.live_record(target, Kind::Task)?;
        match self.call(&record, &ControlRequest::Diff).await? {
            ControlReply::Diff(result) => Ok(result),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }

    /// Final diff, patch saved and verified, results written, guest destroyed. A task that
    /// already ended answers with its saved result; an `unsaved` one is recovered first: a
    /// fresh guest boots over its kept files (no network) and its work is saved as usual.
    /// The generated files the task added are left out of the patch (and listed in the
    /// result) unless `include_generated`, which a recovery honours too; a task that already
    /// ended keeps what its save decided (its result's `generatedIncluded` says which).
    pub async fn task_finish(&self, target: &str, include_generated: bool) -> Result<FinishResult> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        let record = find(&catalog, target)?;
        if record.kind != Kind::Task {
            return Err(Error::worded(ErrorCode::Conflict, |s| {
                format!(
                    "\"{target}\" is a raw sandbox; destroy it with {} instead",
                    s.op(Op::Destroy, target)
                )
            }));
        }
        // Ending already (its TTL ran out, or another call finishes it): its result is the
        // answer, once it is saved.
        let record = self
            .wait_while_ending(&catalog, record)
            .await?
            .ok_or_else(|| Error::not_found(format!("task \"{target}\" was removed")))?;
        let record = match record.state {
            State::Starting | State::Running => {
                match self
                    .call(&record, &ControlRequest::Finish { include_generated })
                    .await
                {
                    Ok(ControlReply::Finished(result)) => return Ok(result),
                    Ok(ControlReply::Error(err)) => return Err(err),
                    Ok(other) => return Err(unexpected(&other)),
                    // Dead, stopped or wedged: end it from here; its work is then kept on disk
                    // and saved below.
                    Err(_) => {
                        self.kill_supervisor(&record).await;
                        self.reconcile(&catalog)?;
                        find(&catalog, &record.id)?
                    }
                }
            }
            _ => record,
        };
        match record.state {
            State::Unsaved => self.recover(&catalog, &record, include_generated).await,
            State::Recovering => Err(Error::conflict(format!(
                "task \"{target}\" is being recovered by another finish; wait for it to complete"
            ))),
            _ => self
                .saved_result(&catalog, &record, target)
                .map(|result| FinishResult {
                    already_finished: true,
                    ..result
                }),
        }
    }

    /// The result a task that ended saved: from its record, else from its results directory
    /// (which holds everything needed, whatever happened to the catalog).
    pub(crate) fn saved_result(
        &self,
        catalog: &Catalog,
        record: &Record,
        target: &str,
    ) -> Result<FinishResult> {
        if let Some(result) = TaskDetail::from_json(record.detail.as_deref())?.result {
            return Ok(result);
        }
        let files = ResultFiles::new(crate::supervisor::finish::results_dir(
            self.home().root(),
            &record.id,
        ));
        if let Some(result) = files.saved_result() {
            let mut detail = TaskDetail::from_json(record.detail.as_deref())?;
            detail.result = Some(result.clone());
            catalog.set_detail(&record.id, &detail.to_json())?;
            return Ok(result);
        }
        Err(Error::worded(ErrorCode::Conflict, |s| {
            format!(
                "task \"{target}\" is {} and saved no result ({}); remove it with {}",
                record.state.as_str(),
                record.note.as_deref().unwrap_or("no reason recorded"),
                s.op(Op::Rm, target)
            )
        }))
    }

    /// The saved patch of a task that ended, bounded as a live diff is.
    fn saved_diff(&self, catalog: &Catalog, record: &Record, target: &str) -> Result<DiffResult> {
        let result = self.saved_result(catalog, record, target)?;
        let path = std::path::Path::new(&result.patch_path);
        let size = std::fs::metadata(path)
            .map_err(|source| TaskFailure::ReadPatch {
                path: path.to_owned(),
                source,
            })?
            .len();
        let shown =
            u64::try_from(dynocap_review::patch::DEFAULT_MAX_PATCH_BYTES).unwrap_or(u64::MAX);
        if size > shown {
            return Err(Error::invalid(format!(
                "task \"{target}\" saved a patch of {} MiB, more than the {} MiB a diff shows; read it whole in {}",
                size / (1024 * 1024),
                shown / (1024 * 1024),
                path.display()
            )));
        }
        let patch = std::fs::read(path).map_err(|source| TaskFailure::ReadPatch {
            path: path.to_owned(),
            source,
        })?;
        Ok(DiffResult {
            summary: dynocap_review::patch::DiffSummary {
                files: result.files,
                additions: result.additions,
                deletions: result.deletions,
                sensitive_paths: result.sensitive_paths,
            },
            patch: String::from_utf8_lossy(&patch).into_owned(),
            generated: if result.generated_included {
                Vec::new()
            } else {
                result.generated
            },
        })
    }

    /// Boots a recovery guest over an unsaved task's kept files and saves its work.
    async fn recover(
        &self,
        catalog: &Catalog,
        record: &Record,
        include_generated: bool,
    ) -> Result<FinishResult> {
        if !catalog.transition(&record.id, State::Unsaved, State::Recovering, None)? {
            return Err(Error::conflict(format!(
                "task \"{}\" changed state while its recovery was starting; try again",
                record.name.as_deref().unwrap_or(&record.id)
            )));
        }
        // What the dead supervisor left, if the clean-up after it failed (see the record's
        // note), would stop the recovery's guest from booting; idempotent otherwise. Only
        // after the transition, so that no other finish's recovery guest is running.
        if let Err(err) = remove_leftovers(self.home(), &record.id, &record.backend, Keep::Layer) {
            let _ = catalog.transition(
                &record.id,
                State::Recovering,
                State::Unsaved,
                Some(&format!(
                    "its files are kept, but cleaning up what its supervisor left failed, so \
                     they could not be recovered yet ({}); finish the task to try again",
                    err.message
                )),
            );
            return Err(err);
        }
        let recovered = self
            .start_supervisor(
                catalog,
                &record.id,
                Mode::Recover { include_generated },
                Via::Spawn(Default::default()),
                &|_| {},
            )
            .await;
        match recovered {
            Ok(Some(result)) => Ok(result),
            Ok(None) => Err(Error::internal(
                "the recovery supervisor answered as if it had started a sandbox",
            )),
            Err(err) => {
                // Whatever stopped the recovery, the files stay for the next try.
                if let Some(current) = catalog.get(&record.id)? {
                    self.kill_supervisor(&current).await;
                }
                self.reconcile(catalog)?;
                let _ = catalog.transition(
                    &record.id,
                    State::Recovering,
                    State::Unsaved,
                    Some(&format!("recovering the work failed: {}", err.message)),
                );
                Err(err)
            }
        }
    }

    /// One task's record, by name or id.
    pub fn task_info(&self, target: &str) -> Result<TaskInfo> {
        let catalog = self.catalog()?;
        let deferred = self.reconcile_for_reading(&catalog)?;
        let mut record = find(&catalog, target)?;
        deferred.annotate(&mut record);
        if record.kind != Kind::Task {
            return Err(Error::conflict(format!(
                "\"{target}\" is a raw sandbox, not a task"
            )));
        }
        Ok(TaskInfo {
            jobs: self.running_jobs(&record),
            forwards: self.port_forwards(&record),
            ..task_info(&record)?
        })
    }

    /// Tasks (live and retained) and raw sandboxes (those `ps` lists).
    pub fn ls(&self) -> Result<LsResult> {
        let catalog = self.catalog()?;
        let deferred = self.reconcile_for_reading(&catalog)?;
        let mut tasks = Vec::new();
        let mut sandboxes = Vec::new();
        for mut record in catalog.list()? {
            deferred.annotate(&mut record);
            match record.kind {
                Kind::Task => tasks.push(TaskInfo {
                    jobs: self.running_jobs(&record),
                    forwards: self.port_forwards(&record),
                    ..task_info(&record)?
                }),
                Kind::Raw if crate::facade::sandboxes::is_listed(&record) => {
                    sandboxes.push(SandboxInfo {
                        jobs: self.running_jobs(&record),
                        forwards: self.port_forwards(&record),
                        ..SandboxInfo::from_record(&record)
                    })
                }
                Kind::Raw => {}
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
            return Err(Error::worded(ErrorCode::Conflict, |s| {
                format!(
                    "\"{target}\" is a raw sandbox; remove it with {}",
                    s.op(Op::Destroy, target)
                )
            }));
        }
        let mut destroyed = false;
        // Ending already: its supervisor saves its work and ends it; the name and the record
        // are this call's once it has.
        let record = self
            .wait_while_ending(&catalog, record)
            .await?
            .ok_or_else(|| Error::not_found(format!("task \"{target}\" was removed")))?;
        if record.state == State::Recovering {
            return Err(Error::conflict(format!(
                "task \"{target}\" is being recovered by a finish; wait for it to complete"
            )));
        }
        if record.state.is_live() {
            if !force {
                return Err(Error::worded(ErrorCode::Conflict, |s| {
                    format!(
                        "task \"{target}\" is running; finish it first with {}, or pass {} to \
                         end it here (its patch and logs are kept)",
                        s.op(Op::TaskFinish, target),
                        s.flag("force")
                    )
                }));
            }
            match self.call(&record, &ControlRequest::Destroy).await {
                Ok(ControlReply::Finished(_) | ControlReply::Destroyed) => destroyed = true,
                // The work could not be saved; the task is unsaved with its files kept,
                // which removing its name does not change.
                Ok(ControlReply::Error(_)) => destroyed = true,
                Ok(other) => return Err(unexpected(&other)),
                Err(_) => {
                    self.kill_supervisor(&record).await;
                    self.reconcile(&catalog)?;
                    destroyed = true;
                }
            }
        }
        let current = find(&catalog, &record.id)?;
        let released = record.name.clone();
        if purge && !current.state.is_live() {
            // The caller was told (CLI) or asked for exactly this (purge): the kept files go,
            // and whatever a failed clean-up after a dead supervisor left with them.
            remove_leftovers(self.home(), &record.id, &record.backend, Keep::Nothing)?;
        }
        let kept_work = (!purge && current.state == State::Unsaved)
            .then(|| self.home().sandbox_dir(&record.id).display().to_string());
        if purge {
            let results = crate::supervisor::finish::results_dir(self.home().root(), &record.id);
            match std::fs::remove_dir_all(&results) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(TaskFailure::RemoveResults {
                        dir: results,
                        source,
                    }
                    .into())
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
            kept_work,
        })
    }
}

/// The Task object of a record.
fn task_info(record: &Record) -> Result<TaskInfo> {
    let detail = TaskDetail::from_json(record.detail.as_deref())?;
    let source = detail.source.unwrap_or_else(|| SourceInfo {
        project_path: match &detail.start.source {
            Source::ProjectPath(p) => Some(p.display().to_string()),
            Source::RepositoryUrl(_) | Source::RefusedUrl(_) => None,
        },
        repository_url: match &detail.start.source {
            Source::RepositoryUrl(u) => Some(u.to_string()),
            Source::RefusedUrl(text) => Some(text.clone()),
            Source::ProjectPath(_) => None,
        },
        history: detail.start.history,
        files: 0,
        bytes: 0,
        base_commit: None,
        skipped: Skipped::default(),
        branch: None,
    });
    Ok(TaskInfo {
        id: record.id.clone(),
        name: record.name.clone(),
        state: match record.state {
            // Not states a caller sees: a task is "running" from the caller's view once created,
            // and one being recovered is still unsaved until its result is written.
            State::Starting => State::Running,
            State::Recovering => State::Unsaved,
            other => other,
        },
        note: record.note.clone(),
        backend: record.backend.clone(),
        network: record.network.as_str().to_owned(),
        cpus: record.cpus,
        memory_mb: record.memory_mb,
        disk_mb: record.disk_mb,
        ttl_seconds: record.ttl_seconds,
        created_at: rfc3339(record.created_at),
        expires_at: rfc3339(record.expires_at),
        source,
        result: detail.result.as_ref().map(ResultBrief::of),
        egress_allowlist: crate::facade::sandboxes::egress_allowlist(record),
        image: record.image.name.clone(),
        image_id: record.image.id.clone(),
        kernel: record.image.kernel.as_ref().map(|k| k.name.clone()),
        forked_from: detail.fork.clone(),
        image_note: None,
        jobs: Vec::new(),
        forwards: Vec::new(),
    })
}

/// What failed on the host's side of a task operation (the task's own failures are its
/// supervisor's).
#[derive(Debug, thiserror::Error)]
enum TaskFailure {
    /// The start was to hand its supervisor a project directory it never opened: a bug.
    #[error("projectPath {} was not opened before the start", .path.display())]
    ProjectNotOpened { path: std::path::PathBuf },
    #[error(
        "image {image} has no git (looked for an executable git in /usr/local/sbin, \
         /usr/local/bin, /usr/sbin, /usr/bin, /sbin and /bin inside it), and a task records its \
         baseline as a git commit in the guest: start the task on an image that has git (make \
         one with `dynocap image build NAME --from {image} --apt git` on a Debian-based image, \
         or --run with the image's own package manager), or use the image in a raw sandbox \
         (dynocap run --image {image}, dynocap_run over MCP), which needs no git"
    )]
    NoGitInImage { image: String },
    #[error("reading {}: {source}", .path.display())]
    ReadPatch {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("removing {}: {source}", .dir.display())]
    RemoveResults {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Coded for TaskFailure {
    /// The saved results are DynoCap's files on the host: failing to read or remove them is
    /// not the caller's doing. An image without git is.
    fn code(&self) -> ErrorCode {
        match self {
            Self::ProjectNotOpened { .. } | Self::ReadPatch { .. } | Self::RemoveResults { .. } => {
                ErrorCode::Internal
            }
            // The caller's choice of image: another one, or a raw sandbox.
            Self::NoGitInImage { .. } => ErrorCode::InvalidArgument,
        }
    }
}
