//! How a sandbox ends: why (`Ending`), a raw sandbox's teardown, a task's work saved (or
//! kept `unsaved`) and its record's end, and the recovery of an `unsaved` task.

use tokio::net::unix::OwnedWriteHalf;

use crate::backend::{self, Guest, LayerSync};
use crate::foundation::error::{Error, Result};
use crate::foundation::failpoint;
use crate::host::disk_room::PendingRoom;
use crate::host::home::Home;
use crate::model::sandbox_info::RunningJob;
use crate::model::task_spec::{FinishResult, JobLog, Progress, TaskDetail};
use crate::store::catalog::{Catalog, Record, State};
use crate::supervisor::agent_conn::AgentConn;
use crate::supervisor::control::{write_message, ControlReply};
use crate::supervisor::jobs::{save_logs, Jobs, JOBS_DIR};
use crate::supervisor::save::{self, TaskFacts};
use crate::supervisor::workspace::BASELINE_TAR;

use super::come_up::*;
use super::failure::*;
use super::state::*;

/// Why the supervisor stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    Destroyed,
    Finished,
    Expired,
    GuestDied,
    Signalled,
    /// Its control socket was removed or replaced (its home deleted): no client can reach it.
    CutOff,
}

impl Ending {
    /// The state a sandbox is left in when its work (if any) was saved.
    pub(super) fn state(self) -> State {
        match self {
            Self::Finished => State::Finished,
            Self::Expired => State::Expired,
            Self::GuestDied => State::Lost,
            Self::Destroyed | Self::Signalled | Self::CutOff => State::Destroyed,
        }
    }

    /// What a command still running is told when the sandbox ends under it.
    pub(super) fn interrupts(self, what: &str, ttl_seconds: u64) -> String {
        match self {
            // Not "its output is lost": a job's is kept (saved beside the task's work), and
            // an exec's caller had it streamed or holds it in the job's report.
            Self::Finished => format!("the task was finished while the command ran; the command was stopped{what}"),
            Self::Expired => format!("the sandbox reached the end of its TTL ({ttl_seconds}s) while the command ran; the command was stopped{what}"),
            Self::Destroyed | Self::Signalled => format!("the sandbox was destroyed while the command ran{what}"),
            Self::GuestDied => "the sandbox's guest died while the command ran".to_owned(),
            Self::CutOff => format!("the sandbox's control socket was removed (was its home deleted?) while the command ran, so the sandbox was ended{what}"),
        }
    }
}

/// Says in the log why the sandbox ends.
pub(super) fn log_ending(ending: Ending, ttl_seconds: u64, control_socket: &std::path::Path) {
    match ending {
        Ending::Expired => {
            tracing::info!(target: LOG_TARGET, "expired after its TTL of {}s", ttl_seconds)
        }
        Ending::GuestDied => {
            tracing::warn!(target: LOG_TARGET, "the guest's init exited unexpectedly")
        }
        Ending::Signalled => {
            tracing::info!(target: LOG_TARGET, "the supervisor was asked to stop (SIGTERM)")
        }
        Ending::CutOff => tracing::warn!(target: LOG_TARGET,
            "the control socket {} was removed or replaced (the home deleted?): no client can \
             reach this sandbox any more, so it ends",
            control_socket.display()
        ),
        Ending::Destroyed | Ending::Finished => {
            tracing::info!(target: LOG_TARGET, "ending: {ending:?}")
        }
    }
}

/// Ends a raw sandbox: its processes at once, then the reply to those who asked for the end,
/// then the rest of the teardown.
pub(super) async fn tear_down_raw(
    home: &Home,
    catalog: &Catalog,
    id: &str,
    mut guest: Box<dyn Guest>,
    ending: Ending,
    waiters: &mut Vec<OwnedWriteHalf>,
) -> ControlReply {
    // A raw sandbox's callers wait only for its processes to die and its name to be free;
    // the slow rest of the teardown (cgroups, the disk's unmount, its files) follows the
    // reply. Until it is done the record stays, `destroyed` and nameless, so that if this
    // process dies meanwhile the next reconcile finishes the job. Blocking, for as long as
    // reaping the guest's init takes (a few ms): the serving loop is over, so it holds
    // nothing else up.
    if let Err(err) = guest.kill() {
        tracing::error!(target: LOG_TARGET, "teardown: {err}");
    }
    let recorded = match ending {
        // A lost raw sandbox stays visible.
        Ending::GuestDied => catalog.set_state(
            id,
            State::Lost,
            Some("the guest's init exited unexpectedly; see the supervisor log"),
        ),
        _ => catalog.release_as_destroyed(id),
    };
    if let Err(err) = recorded {
        tracing::error!(target: LOG_TARGET, "updating the catalog: {err}");
    }
    for mut waiter in waiters.drain(..) {
        let _ = write_message(&mut waiter, &ControlReply::Destroyed).await;
    }
    if let Err(err) = failpoint::hit("supervisor.destroy.replied") {
        tracing::error!(target: LOG_TARGET, "{err}");
    }
    match tokio::task::spawn_blocking(move || guest.destroy()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::error!(target: LOG_TARGET, "teardown: {err}"),
        Err(err) => tracing::error!(target: LOG_TARGET, "teardown panicked: {err}"),
    }
    crate::supervisor::leftovers::remove_state_dir(home, id);
    if ending != Ending::GuestDied {
        if let Err(err) = catalog.delete(id) {
            tracing::error!(target: LOG_TARGET, "updating the catalog: {err}");
        }
    }
    ControlReply::Destroyed
}

/// How a task's guest ended.
pub(super) enum TaskEnd {
    /// The work is saved and the result written; the guest is stopped, its layer still kept.
    Saved(Box<FinishResult>),
    /// The work could not be saved; the guest is stopped and its layer kept.
    Unsaved(Error),
}

/// Saves a task's work, then stops its guest (keeping the layer until the caller removes it).
pub(super) async fn end_task(
    conn: &AgentConn,
    task: &TaskContext,
    guest: Box<dyn Guest>,
    memory_mb: u64,
    ending: Ending,
    jobs: Option<(&Jobs, Vec<RunningJob>)>,
) -> TaskEnd {
    let taken = match ending {
        Ending::GuestDied => Err(Error::internal(
            "the guest's init exited unexpectedly (see the supervisor log), so the final diff could not be taken",
        )),
        _ => match failpoint::hit("supervisor.final-diff") {
            Ok(()) => {
                // git holds a large file whole while it diffs it; the work must not be lost to
                // the limit the agent worked under.
                let limit = save_memory_limit(memory_mb);
                if let Err(err) = guest.raise_memory_limit(limit) {
                    tracing::warn!(target: LOG_TARGET, "{err}; saving within the sandbox's own limit");
                }
                save::take_final_patch(conn, &task.files, task.line_diff_budget).await
            }
            Err(err) => Err(err),
        },
    };
    // A diff that failed on a failed disk says so: the disk is the cause to report, and the
    // recovery that the unsaved note offers reads the work from it.
    let taken = taken.map_err(|err| match guest.layer_sync() {
        LayerSync::HostMount(disk) => match disk.failure() {
            Some(failure) => ProcessFailure::FinalDiffOnFailedDisk {
                failure,
                taking: err,
            }
            .into(),
            None => err,
        },
        LayerSync::GuestKernel => err,
    });
    match tokio::task::spawn_blocking(move || guest.stop_keeping_layer()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::error!(target: LOG_TARGET, "stopping the guest: {err}"),
        Err(err) => tracing::error!(target: LOG_TARGET, "stopping the guest panicked: {err}"),
    }
    if let Err(err) = taken {
        return TaskEnd::Unsaved(err);
    }
    if let Err(err) = failpoint::hit("supervisor.patch-saved") {
        return TaskEnd::Unsaved(err);
    }
    // The guest is stopped: its jobs' output is all there, and goes into the results (the
    // exec log keeps only an excerpt of each).
    let (cut_off, logs) = match jobs {
        Some((jobs, cut_off)) => {
            let kept = jobs.kept_output(&cut_off);
            let dir = task.files.dir.join(JOBS_DIR);
            let logs = tokio::task::spawn_blocking(move || save_logs(&dir, kept))
                .await
                .unwrap_or_default();
            (cut_off, logs)
        }
        None => (Vec::new(), Vec::new()),
    };
    let state = ending.state();
    match finalize(task, state, cut_off, logs).await {
        Ok(result) => match failpoint::hit("supervisor.results-written") {
            Ok(()) => TaskEnd::Saved(Box::new(result)),
            Err(err) => TaskEnd::Unsaved(err),
        },
        Err(err) => TaskEnd::Unsaved(err),
    }
}

/// The memory limit while a task's work is saved: twice its own plus 1 GiB (git holds a
/// large file and its compressed form at once), at most half of the host's memory, never less
/// than the sandbox had.
pub(super) fn save_memory_limit(memory_mb: u64) -> u64 {
    let own = memory_mb.saturating_mul(1 << 20);
    let wanted = own.saturating_mul(2).saturating_add(1 << 30);
    let half_host = crate::host::memory::total_memory_mb().map_or(wanted, |mb| (mb << 20) / 2);
    wanted.min(half_host).max(own)
}

/// Reads, verifies and summarises the saved patch (blocking work, off the runtime).
pub(super) async fn finalize(
    task: &TaskContext,
    state: State,
    jobs_cut_off: Vec<RunningJob>,
    jobs: Vec<JobLog>,
) -> Result<FinishResult> {
    let baseline = task.baseline();
    let network = task
        .egress
        .as_ref()
        .and_then(|egress| serde_json::to_value(egress.summary()).ok());
    let facts_id = task.id.clone();
    let name = task.name.clone();
    let created_at = task.created_at.clone();
    let source = task.source.clone();
    let files = task.files.clone();
    let state_dir = task.state_dir.clone();
    let include_generated = task
        .include_generated
        .load(std::sync::atomic::Ordering::Relaxed);
    tokio::task::spawn_blocking(move || {
        let facts = TaskFacts {
            id: &facts_id,
            name: name.as_deref(),
            created_at: &created_at,
            source: source.as_ref(),
            baseline_tar: &state_dir.join(BASELINE_TAR),
            scratch: &state_dir.join("verify"),
            network,
            include_generated,
            project: &*baseline,
            jobs_cut_off,
            jobs,
        };
        save::finalize(&facts, &files, state, &|path| baseline.get(path))
    })
    .await
    .unwrap_or_else(|err| Err(ProcessFailure::SavePanicked(err).into()))
}

/// The note an `unsaved` task carries: what happened and what to do.
pub(super) fn unsaved_note(task: &TaskContext, ending: Ending, err: &Error) -> String {
    let when = match ending {
        Ending::Finished => "when it was finished",
        Ending::Expired => "when its TTL ran out",
        Ending::Destroyed | Ending::Signalled => "when it was removed",
        Ending::GuestDied => "when its guest died",
        Ending::CutOff => "when its control socket was removed",
    };
    format!(
        "the work of task \"{}\" could not be saved {when}: {}. Its files are kept (state unsaved); finish the task again to recover them",
        task.display_name(),
        err.message
    )
}

pub(super) fn reply_result(reply: &ControlReply) -> Option<&FinishResult> {
    match reply {
        ControlReply::Finished(result) => Some(result),
        _ => None,
    }
}

/// Records how a task ended. The results directory already holds everything needed to list
/// it, so a catalog that cannot be written loses nothing: it is logged.
pub(super) fn record_end(
    catalog: &Catalog,
    id: &str,
    state: State,
    note: Option<&str>,
    result: Option<&FinishResult>,
) {
    let recorded = (|| -> Result<()> {
        if let Some(result) = result {
            let record = catalog
                .get(id)?
                .ok_or_else(|| Error::internal("the task record vanished"))?;
            let mut detail = TaskDetail::from_json(record.detail.as_deref())?;
            detail.result = Some(result.clone());
            catalog.set_detail(id, &detail.to_json())?;
        }
        catalog.set_state(id, state, note)?;
        if note.is_none() {
            // A saved task's state says all; an older note (why it was unsaved) is history.
            catalog.set_note(id, None)?;
        }
        Ok(())
    })();
    if let Err(err) = recorded {
        tracing::error!(target: LOG_TARGET, "recording the end of the task in the catalog: {err}");
    }
}

/// Deletes what is left of a sandbox on the host, by the backend that booted it, once nothing
/// needs it.
pub(super) fn remove_sandbox_files(home: &Home, id: &str, backend: &str) {
    match backend::by_name(backend)
        .and_then(|backend| backend.cleanup_leftovers(id, &home.sandbox_dir(id)))
    {
        Ok(()) => {}
        Err(err) => tracing::error!(target: LOG_TARGET, "removing the sandbox's files: {err}"),
    }
    crate::supervisor::leftovers::remove_state_dir(home, id);
}

/// [`Mode::Recover`]: the guest booted over the kept layer; take the diff, save, answer on the
/// ready pipe and end. The guest has no network and runs nothing of the agent's.
pub(super) async fn recover(
    home: Home,
    catalog: Catalog,
    record: Record,
    mut guest: Box<dyn Guest>,
    room: PendingRoom,
    ready: ReadyPipe,
    include_generated: bool,
) -> i32 {
    let id = record.id.clone();
    let prepared = async {
        room.reserved().await?;
        let conn = connect_agent(guest.as_mut()).await?;
        let detail = TaskDetail::from_json(record.detail.as_deref())?;
        let task = TaskContext::open(&home, &record, detail.source)?;
        task.include_generated
            .store(include_generated, std::sync::atomic::Ordering::Relaxed);
        Ok::<_, Error>((conn, task))
    }
    .await;
    let (conn, task) = match prepared {
        Ok(parts) => parts,
        Err(err) => {
            tracing::error!(target: LOG_TARGET, "recovery failed: {err}");
            let _ = tokio::task::spawn_blocking(move || guest.stop_keeping_layer()).await;
            let note = format!(
                "the work could not be recovered: {}; its files are still kept, finish the task again to retry",
                err.message
            );
            record_end(&catalog, &id, State::Unsaved, Some(&note), None);
            ready.send(&ReadyMessage::Failed(Error::new(err.code, note)));
            return 1;
        }
    };
    ready.send(&ReadyMessage::Progress(Progress {
        message: format!("recovering the work of task \"{}\"", task.display_name()),
        done: 0,
        total: None,
    }));
    // The jobs the killed supervisor listed: their output goes into the results as a
    // finish's would (the files are named by sequence number; its index maps them to ids).
    let (jobs, cut_off) = Jobs::recovered(home.sandbox_dir(&id).join(JOBS_DIR));
    match end_task(
        &conn,
        &task,
        guest,
        record.memory_mb,
        Ending::Finished,
        Some((&jobs, cut_off)),
    )
    .await
    {
        TaskEnd::Saved(result) => {
            record_end(&catalog, &id, result.state, None, Some(&result));
            ready.send(&ReadyMessage::Finished(result));
            remove_sandbox_files(&home, &id, &record.backend);
            0
        }
        TaskEnd::Unsaved(err) => {
            let note = unsaved_note(&task, Ending::Finished, &err);
            tracing::warn!(target: LOG_TARGET, "{note}");
            record_end(&catalog, &id, State::Unsaved, Some(&note), None);
            ready.send(&ReadyMessage::Failed(Error::new(err.code, note)));
            1
        }
    }
}
