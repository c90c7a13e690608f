//! Bringing a booted guest up to ready: its agent's hello, a task's project (imported or
//! cloned), the egress proxy, the control socket and the record `running`; and dropping a
//! start whose starter is gone.

use std::sync::Arc;

use tokio::net::{UnixListener, UnixStream};

use crate::backend::Guest;
use crate::foundation::error::{Context, Error, Result};
use crate::foundation::failpoint;
use crate::host::disk_room::PendingRoom;
use crate::host::home::Home;
use crate::model::config::Config;
use crate::model::sandbox_info::rfc3339;
use crate::model::spec::Network;
use crate::model::task_spec::{Progress, Source, SourceInfo, TaskDetail};
use crate::store::catalog::{Catalog, Kind, Record, State};
use crate::supervisor::agent_conn::AgentConn;
use crate::supervisor::egress::Egress;
use crate::supervisor::finish;
use crate::supervisor::starter_watch::StarterWatch;
use crate::supervisor::workspace::{self};

use super::disk::*;
use super::state::*;

/// Brings the booted guest up to ready: its agent, a task's project, the control socket, the
/// record `running` (or `pooled`), and the ready message. `None` when it could not, or when
/// nobody waits for it any more: the guest is gone then, and what the start made with it.
pub(super) async fn come_up(
    home: &Home,
    config: &Config,
    catalog: &Catalog,
    record: &mut Record,
    mut guest: Box<dyn Guest>,
    room: PendingRoom,
    ready: &ReadyPipe,
) -> Option<Started> {
    let id = record.id.clone();
    let starting = std::time::Instant::now();
    // A warm-pool boot's starter never waits (see `starter_watch`); any other start is
    // dropped once nobody waits for it.
    // A restored task's supervisor was started by itself (see `checkpoint::resuming`).
    let restoring = record.state == State::Running;
    let watch = match record.state {
        State::Warming | State::Running => None,
        _ => ready.watch(),
    };
    let started = match &watch {
        Some(watch) => tokio::select! {
            started = start(home, config, catalog, record, guest.as_mut(), room, ready) => {
                started.map(Some)
            }
            () = watch.gone() => Ok(None),
        },
        None => start(home, config, catalog, record, guest.as_mut(), room, ready)
            .await
            .map(Some),
    };
    let (conn, listener, task, egress) = match started {
        Ok(Some(parts)) => parts,
        Ok(None) => {
            abandon(home, catalog, record, guest).await;
            return None;
        }
        Err(err) if restoring => {
            // The task's files are the restored disk: kept, for `task finish` to recover.
            tracing::error!(target: LOG_TARGET, "booting the restored task failed: {err}");
            let _ = tokio::task::spawn_blocking(move || guest.stop_keeping_layer()).await;
            let note = format!(
                "booting the task again after its restore failed: {}; its files are kept: \
                 finish the task to recover them",
                err.message
            );
            let _ = catalog.transition(&id, State::Running, State::Unsaved, Some(&note));
            ready.send(&ReadyMessage::Failed(err));
            return None;
        }
        Err(err) => {
            tracing::error!(target: LOG_TARGET, "start failed: {err}");
            ready.send(&ReadyMessage::Failed(err));
            let _ = tokio::task::spawn_blocking(move || guest.destroy()).await;
            crate::supervisor::leftovers::remove_state_dir(home, &id);
            return None;
        }
    };
    // The imported tree and its baseline, on the host's disk before anyone relies on them. A
    // raw sandbox's files do not outlive the machine: nothing to sync.
    if task.is_some() {
        // A failure is logged; the first command after it reports it (see `check_disk`).
        let _ = sync_layer(guest.layer_sync(), &conn).await;
    }
    // The last moment a start can be dropped unseen: from the ready message on, the sandbox
    // is its caller's (a `run` that printed it and ended is not a starter that died).
    if watch.as_ref().is_some_and(StarterWatch::gone_now) {
        drop((conn, listener, task, egress));
        abandon(home, catalog, record, guest).await;
        return None;
    }
    // One writer fewer before the last word, for a starter that reads to the end.
    drop(watch);
    if record.state == State::Warming {
        // Before it is ready: a claim may follow at once.
        if let Err(err) = guest.prepare_claim() {
            tracing::warn!(target: LOG_TARGET, "preparing for a claim (it will be slower): {err}");
        }
    }
    ready.send(&ReadyMessage::Ready);
    crate::supervisor::checkpoint::resumed(&home.sandbox_dir(&id));
    tracing::info!(target: LOG_TARGET,
        "ready in {:.2}s after the boot; serving until {}",
        starting.elapsed().as_secs_f64(),
        rfc3339(record.expires_at)
    );
    Some(Started {
        guest,
        conn,
        listener,
        task,
        egress,
    })
}

/// The agent's channel, and its hello.
pub(super) async fn connect_agent(guest: &mut dyn Guest) -> Result<AgentConn> {
    let channel = guest
        .take_channel()
        .ok_or_else(|| Error::internal("the backend gave no agent channel"))?;
    let stream = std::os::unix::net::UnixStream::from(channel);
    stream
        .set_nonblocking(true)
        .context("configuring the agent channel")?;
    let stream = UnixStream::from_std(stream).context("registering the agent channel")?;
    let (read, mut write) = stream.into_split();
    if let Some(hostname) = guest.rejoin_as() {
        // A live fork's guest: its agent speaks once asked to leave its parent's session.
        crate::supervisor::live_fork::rejoin(&mut write, hostname).await?;
    }
    let (conn, hello) = AgentConn::start(read, write, AGENT_HELLO_TIMEOUT).await?;
    tracing::info!(target: LOG_TARGET, "agent {} ready", hello.agent_version);
    Ok(conn)
}

/// Ends a start whose starter died without cancelling it (see `starter_watch`), leaving what
/// its guard would have: nothing. The guest goes first, with whatever it runs; then the files,
/// the results directory a task's start made, and the record, which frees the name.
pub(super) async fn abandon(
    home: &Home,
    catalog: &Catalog,
    record: &Record,
    guest: Box<dyn Guest>,
) {
    tracing::warn!(target: LOG_TARGET,
        "nobody waits for this start any more (its starter ended without cancelling it); \
         removing the sandbox"
    );
    if let Ok(Err(err)) = tokio::task::spawn_blocking(move || guest.destroy()).await {
        tracing::warn!(target: LOG_TARGET, "destroying the guest of the abandoned start: {err}");
    }
    let id = &record.id;
    let removed = crate::supervisor::leftovers::remove_leftovers(
        home,
        id,
        &record.backend,
        crate::supervisor::leftovers::Keep::Nothing,
    );
    if let Err(err) = removed {
        tracing::warn!(target: LOG_TARGET, "removing the abandoned start's files: {err}");
    }
    if record.kind == Kind::Task {
        let _ = std::fs::remove_dir_all(finish::results_dir(home.root(), id));
    }
    if let Err(err) = catalog.delete(id) {
        tracing::warn!(target: LOG_TARGET, "removing the abandoned start's record: {err}");
    }
}

/// Connects to the agent, imports a task's project, opens the control socket and marks the
/// record running. Returns the sandbox's egress proxy too, when it has one.
pub(super) async fn start(
    home: &Home,
    config: &Config,
    catalog: &Catalog,
    record: &mut Record,
    guest: &mut dyn Guest,
    room: PendingRoom,
    ready: &ReadyPipe,
) -> Result<(
    AgentConn,
    UnixListener,
    Option<TaskContext>,
    Option<Arc<Egress>>,
)> {
    let id = record.id.clone();
    let conn = connect_agent(guest).await?;
    ready.send(&ReadyMessage::Progress(workspace::step(
        "the sandbox is up; its guest agent answered",
    )));
    // Fault tests hold a start here (`sleep`), with its guest up, to end its starter.
    failpoint::hit("supervisor.start.agent-answered")?;

    let mut task = match record.kind {
        Kind::Task => Some(TaskContext::open(home, record, None)?),
        Kind::Raw => None,
    };
    // The proxy exists from the start, allowing nothing, so every tunnel the guest opens is
    // decided and logged (beside a task's results); it opens to the task's git host for a
    // clone, then to the allowlist of a `filtered` sandbox.
    let egress_log = match &task {
        Some(task) => task.files.dir.join(NETWORK_LOG),
        None => home.sandbox_dir(&id).join(NETWORK_LOG),
    };
    let egress = match &record.egress {
        Some(spec) => Some(Arc::new(Egress::new(
            spec,
            &egress_log,
            guest.network_namespace(),
        )?)),
        None => None,
    };

    let resume = crate::supervisor::checkpoint::resuming(&home.sandbox_dir(&id));
    if let (Some(task), true) = (task.as_mut(), resume) {
        // A fork or a restored task: its workspace and baseline are on the disk it booted
        // over; what was imported is its record's.
        task.egress = egress.clone();
        task.source = TaskDetail::from_json(record.detail.as_deref())?.source;
    } else if let Some(task) = task.as_mut() {
        let mut detail = TaskDetail::from_json(record.detail.as_deref())?;
        task.egress = egress.clone();
        let report = |progress: Progress| ready.send(&ReadyMessage::Progress(progress));
        let source = match &detail.start.source {
            Source::ProjectPath(path) => {
                let inherited = detail.project_fd.is_some();
                let imported = workspace::import(
                    &conn,
                    path,
                    inherited,
                    detail.start.history,
                    &task.state_dir,
                    &report,
                )
                .await?;
                for note in &imported.notes {
                    tracing::info!(target: LOG_TARGET, "import note: {note}");
                }
                SourceInfo {
                    project_path: Some(imported.root.display().to_string()),
                    repository_url: None,
                    history: imported.history,
                    files: imported.files,
                    bytes: imported.bytes,
                    base_commit: imported.base_commit,
                    skipped: crate::model::task_spec::Skipped::from_notes(&imported.notes),
                    branch: None,
                }
            }
            Source::RefusedUrl(text) => return Err(Source::refused(text)),
            Source::RepositoryUrl(url) => {
                let Some(egress) = &egress else {
                    return Err(Error::internal(
                        "a repositoryUrl task has no egress record; start it again",
                    ));
                };
                let key = detail.ssh_key_path.as_deref();
                crate::supervisor::clone::clone_repository(
                    &conn,
                    egress,
                    url,
                    detail.start.history,
                    crate::supervisor::clone::Access {
                        ssh_key: key,
                        credentials: crate::supervisor::clone::take_inherited_credentials(),
                        user_home: config.home.user_home.as_deref(),
                    },
                    &task.state_dir,
                    &report,
                )
                .await?
            }
        };
        detail.source = Some(source.clone());
        task.source = Some(source);
        let detail = detail.to_json();
        catalog.set_detail(&id, &detail)?;
        record.detail = Some(detail);
    }
    if record.egress.is_none() {
        // A `nat` guest's clients reach their servers themselves: the host's extra CAs join
        // its system bundles all the same (the boot bound them over a bundle from the host).
        if let Some(extra) =
            crate::supervisor::egress::direct_extra_ca(&config.egress, record.network)?
        {
            crate::supervisor::egress::join_system_bundles(&conn, extra).await?;
        }
    }
    if let (Some(egress), Some(spec)) = (&egress, &record.egress) {
        if record.network == Network::Filtered {
            egress.open(&conn, spec.policy()?).await?;
            tracing::info!(target: LOG_TARGET, "egress open to {}", spec.allow.join(", "));
        } else {
            egress.close(&conn).await?;
        }
    }

    let socket_path = home.control_socket(&id);
    let _ = std::fs::remove_file(&socket_path);
    let listener = UnixListener::bind(&socket_path)
        .with_context(|| format!("listening on {}", socket_path.display()))?;
    // Its disk's room is the sandbox's before the sandbox is anyone's.
    room.reserved().await?;
    // A warm-pool sandbox waits, pooled, for a claim; any other is the caller's now.
    let (from, to) = match record.state {
        State::Warming => (State::Warming, State::Pooled),
        State::Running => (State::Running, State::Running),
        _ => (State::Starting, State::Running),
    };
    if !catalog.transition(&id, from, to, None)? {
        return Err(Error::conflict(
            "the sandbox record changed while it was starting",
        ));
    }
    Ok((conn, listener, task, egress))
}
