//! The client API for a task's checkpoints and forks: make, list and delete checkpoints,
//! restore one, and start a new task from a task's current state or from one of its
//! checkpoints. The copies are the task's supervisor's to make (see the supervisor's
//! `checkpoint`); a fork then boots under its own supervisor over the disk it was given, with
//! the parent's baseline, imported commit, image, backend and limits, and its own name, TTL
//! and network.

use std::time::Duration;

use crate::facade::sandboxes::{kill_supervisor, remove_leftovers, unexpected, Engine, Keep, Via};
use crate::foundation::error::{Error, Result};
use crate::model::spec::Network;
use crate::model::task_spec::{ForkOrigin, Progress, TaskDetail, TaskInfo};
use crate::store::catalog::{Catalog, Kind, ProcessId, Record, State};
use crate::supervisor::checkpoint::{CheckpointInfo, Restored};
use crate::supervisor::control::{ControlReply, ControlRequest};
use crate::supervisor::egress::EgressSpec;
use crate::supervisor::process::Mode;

/// How long a restored task may take to boot again before its restore is reported failed.
const RESTORE_BOOT: Duration = Duration::from_secs(180);

/// What a fork may set of its own; the rest is its parent's.
#[derive(Debug, Clone, Default)]
pub struct ForkSpec {
    pub name: Option<String>,
    /// The parent's checkpoint to start from; `None`: the parent as it is now.
    pub checkpoint: Option<String>,
    pub ttl_seconds: Option<u64>,
    pub network: Option<Network>,
    /// For a `filtered` fork: its allowlist; empty keeps the parent's (or the host's default).
    pub allow_hosts: Vec<String>,
    /// Keep the parent's running processes: the vm backend's live fork (see `live_forks`).
    pub live: bool,
}

impl Engine {
    /// Makes a checkpoint of a running task's files, labelled `label` or the next `cp-N`.
    pub async fn task_checkpoint(
        &self,
        target: &str,
        label: Option<String>,
    ) -> Result<CheckpointInfo> {
        if let Some(label) = &label {
            crate::supervisor::checkpoint::validate_label(label)?;
        }
        let record = self.live_record(target, Kind::Task)?;
        match self
            .call(&record, &ControlRequest::Checkpoint { label })
            .await?
        {
            ControlReply::Checkpoint(info) => Ok(info),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }

    /// A running task's checkpoints, oldest first.
    pub async fn task_checkpoints(&self, target: &str) -> Result<Vec<CheckpointInfo>> {
        let record = self.live_record(target, Kind::Task)?;
        checkpoints(self.call(&record, &ControlRequest::Checkpoints).await?)
    }

    /// Deletes a checkpoint; returns those left.
    pub async fn task_checkpoint_delete(
        &self,
        target: &str,
        label: &str,
    ) -> Result<Vec<CheckpointInfo>> {
        crate::supervisor::checkpoint::validate_label(label)?;
        let record = self.live_record(target, Kind::Task)?;
        let request = ControlRequest::DeleteCheckpoint {
            label: label.to_owned(),
        };
        checkpoints(self.call(&record, &request).await?)
    }

    /// Brings a running task's files back to checkpoint `label`: its commands and jobs end,
    /// its guest boots again over the checkpoint. Returns once the task serves again.
    pub async fn task_restore(&self, target: &str, label: &str) -> Result<Restored> {
        crate::supervisor::checkpoint::validate_label(label)?;
        let record = self.live_record(target, Kind::Task)?;
        let request = ControlRequest::Restore {
            label: label.to_owned(),
        };
        let restored = match self.call(&record, &request).await? {
            ControlReply::Restored(restored) => restored,
            ControlReply::Error(err) => {
                // A restore that failed after the guest stopped boots it again over its own
                // disk: the task serves again either way.
                self.wait_serving(&record).await?;
                return Err(err);
            }
            other => return Err(unexpected(&other)),
        };
        self.wait_serving(&record).await?;
        Ok(restored)
    }

    /// Waits until the supervisor of `record` (the same process, booting the guest again)
    /// answers on its socket, or the task stopped running.
    async fn wait_serving(&self, record: &Record) -> Result<()> {
        let display = record.name.as_deref().unwrap_or(&record.id).to_owned();
        let catalog = self.catalog()?;
        let deadline = tokio::time::Instant::now() + RESTORE_BOOT;
        loop {
            if self.call(record, &ControlRequest::Ping).await.is_ok() {
                return Ok(());
            }
            let current = catalog.get(&record.id)?;
            let serving = current.as_ref().is_some_and(|r| {
                r.state == State::Running && r.supervisor.is_some_and(|p| p.is_alive())
            });
            if !serving {
                let note = current
                    .and_then(|r| r.note)
                    .unwrap_or_else(|| "its supervisor ended".to_owned());
                return Err(Error::internal(format!(
                    "task \"{display}\" did not come back after its restore: {note}"
                )));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::timeout(format!(
                    "task \"{display}\" did not come back within {}s of its restore; see its \
                     supervisor log",
                    RESTORE_BOOT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a new task from running task `target`: its files now, or as its checkpoint
    /// `spec.checkpoint` was. Dropping the future before it completes removes what it made.
    pub async fn task_fork(
        &self,
        target: &str,
        spec: &ForkSpec,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<TaskInfo> {
        if let Some(label) = &spec.checkpoint {
            crate::supervisor::checkpoint::validate_label(label)?;
        }
        let parent = self.live_record(target, Kind::Task)?;
        let ttl = spec.ttl_seconds.unwrap_or(parent.ttl_seconds);
        let network = spec.network.unwrap_or(parent.network);
        if spec.live {
            super::live_forks::check(spec, &parent, network)?;
        }
        // A fork whose disk shares its parent's sets nothing aside on the host, and needs
        // only the headroom free: a vm fork's layers (see `disk_room`), and a jail fork's clone
        // on a home (or its reflink pool) whose filesystem shares extents. A jail fork's copy
        // is reserved whole, as any task's disk.
        let shares_disk = match crate::backend::BackendChoice::parse(&parent.backend) {
            Some(crate::backend::BackendChoice::Vm) => true,
            _ => dynocap_backend_jail::reflinks(&self.home().sandbox_dir(&parent.id)),
        };
        let reserved_mb = if shares_disk { 0 } else { parent.disk_mb };
        self.admit_setting_aside(
            parent.cpus,
            parent.memory_mb,
            parent.disk_mb,
            ttl,
            reserved_mb,
        )?;
        crate::host::usernet::ensure_available(network)?;
        let parent_detail = TaskDetail::from_json(parent.detail.as_deref())?;
        let egress = match network {
            Network::Filtered => match (&parent.egress, spec.allow_hosts.is_empty()) {
                (Some(egress), true) if parent.network == Network::Filtered => Some(egress.clone()),
                _ => Some(EgressSpec::from_config(
                    &self.config().egress,
                    true,
                    &spec.allow_hosts,
                    &[],
                )?),
            },
            _ => {
                EgressSpec::refuse_hosts(&spec.allow_hosts)?;
                None
            }
        };
        let mut start = parent_detail.start.clone();
        start.name = spec.name.clone();
        start.ttl_seconds = ttl;
        start.network = network;
        let detail = TaskDetail {
            start,
            source: parent_detail.source.clone(),
            result: None,
            project_fd: None,
            ssh_key_path: None,
            fork: Some(ForkOrigin {
                task: parent.name.clone().unwrap_or_else(|| parent.id.clone()),
                task_id: parent.id.clone(),
                checkpoint: spec.checkpoint.clone(),
            }),
            ..parent_detail
        };
        let mut record = self.new_record(
            Kind::Task,
            spec.name.clone(),
            network,
            parent.cpus,
            parent.memory_mb,
            parent.disk_mb,
            ttl,
            Some(detail.to_json()),
            Some(&parent.image.name),
            crate::backend::BackendChoice::parse(&parent.backend),
        )?;
        // The parent's very image and backend: the disk is a layer over that image.
        record.image = parent.image.clone();
        record.backend = parent.backend.clone();
        record.egress = egress;
        // Until the fork's own supervisor records itself, the parent's answers for it: a
        // reconcile meanwhile finds a live supervisor, and the fork is taken over (removed)
        // only if the parent's supervisor dies while it copies.
        record.supervisor = parent.supervisor;
        let catalog = self.catalog()?;
        catalog.insert(&record)?;
        let mut guard = ForkGuard {
            engine: self,
            catalog: &catalog,
            id: record.id.clone(),
            backend: record.backend.clone(),
            parent_supervisor: parent.supervisor,
            armed: true,
        };
        progress(crate::supervisor::workspace::step(match &spec.checkpoint {
            _ if spec.live => "saving the running task",
            // A copy on the jail, a frozen layer on the vm.
            Some(_) => "taking the checkpoint's files",
            None => "taking the task's files",
        }));
        let seed = if spec.live {
            ControlRequest::SeedLiveFork {
                fork_id: record.id.clone(),
            }
        } else {
            ControlRequest::SeedFork {
                fork_id: record.id.clone(),
                checkpoint: spec.checkpoint.clone(),
            }
        };
        match self.call(&parent, &seed).await? {
            ControlReply::Forked => {}
            ControlReply::Error(err) => return Err(err),
            other => return Err(unexpected(&other)),
        }
        self.start_supervisor(
            &catalog,
            &record.id,
            Mode::Start,
            Via::Spawn(Default::default()),
            progress,
        )
        .await?;
        guard.armed = false;
        let record = catalog
            .get(&record.id)?
            .ok_or_else(|| Error::internal("the fork's record vanished right after its start"))?;
        self.task_info(&record.id)
    }
}

fn checkpoints(reply: ControlReply) -> Result<Vec<CheckpointInfo>> {
    match reply {
        ControlReply::Checkpoints(list) => Ok(list),
        ControlReply::Error(err) => Err(err),
        other => Err(unexpected(&other)),
    }
}

/// Undoes a fork that did not complete: its supervisor (never the parent's), its files, its
/// results and its record.
struct ForkGuard<'a> {
    engine: &'a Engine,
    catalog: &'a Catalog,
    id: String,
    backend: String,
    parent_supervisor: Option<ProcessId>,
    armed: bool,
}

impl Drop for ForkGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(Some(record)) = self.catalog.get(&self.id) {
            if let Some(process) = record
                .supervisor
                .filter(|p| Some(*p) != self.parent_supervisor && p.is_alive())
            {
                kill_supervisor(process);
            }
        }
        let home = self.engine.home();
        let _ = remove_leftovers(home, &self.id, &self.backend, Keep::Nothing);
        let _ = std::fs::remove_dir_all(crate::supervisor::finish::results_dir(
            home.root(),
            &self.id,
        ));
        let _ = self.catalog.delete(&self.id);
    }
}
