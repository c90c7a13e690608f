//! The supervisor: one process per sandbox (`dynocap supervise`), detached from whoever
//! started it. It boots the guest, imports a task's project, holds the agent channel, serves
//! the control socket, enforces the TTL and tears everything down at the end. Its death kills
//! the guest (the guest's init has a parent-death signal and exits when the channel closes).
//!
//! A task's guest goes only after its work is saved ([`crate::supervisor::save`]): at finish, expiry or a
//! forced removal the supervisor streams the final patch to disk, stops the guest keeping its
//! writable layer, writes the summary, answers, and only then deletes the layer. When the work
//! cannot be saved (a dead or stopped agent, a full disk) the layer stays and the task is
//! `unsaved`; a supervisor started with [`Mode::Recover`] later boots a guest over that layer
//! and saves the work the same way.
//!
//! This file boots the guest and runs the serving loop; its parts, each importing only the
//! ones listed after it: `requests` (one control connection), `ending` (how a sandbox ends and
//! a task's work is saved), `come_up` (from a booted guest to ready), `network` (the `nat`
//! network's watch), `disk` (the guest's disk as commands see it), `state` (what they share)
//! and `failure` (the supervisor's errors).

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;

use crate::backend::{self, BootSpec, Guest};
use crate::foundation::error::{Context, Error, Result};
use crate::host::disk_room::PendingRoom;
use crate::host::home::Home;
use crate::image;
use crate::model::config::Config;
use crate::model::spec;
use crate::store::catalog::{Catalog, ProcessId, Record, State};
use crate::supervisor::control::{write_message, Claim, ControlReply};
use crate::supervisor::oom::OomWatch;
use crate::supervisor::workspace::{self};

mod checkpoints;
mod come_up;
mod disk;
mod ending;
mod failure;
mod files;
mod jobs;
mod live_fork;
mod network;
mod requests;
mod state;

use come_up::*;
use ending::*;
use failure::*;
use network::*;
use requests::*;
pub use state::ReadyMessage;
use state::*;

/// What a supervisor is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Boot a new sandbox (and import a task's project) and serve it until it ends.
    Start,
    /// Boot a guest over the writable layer an `unsaved` task kept, save its work, and end.
    /// `include_generated`: the finish that asked for the recovery wants the generated files
    /// in the patch (`finish --include-generated`), as a finish of the live task would.
    Recover { include_generated: bool },
}

impl Mode {
    pub fn is_recover(self) -> bool {
        matches!(self, Self::Recover { .. })
    }
}

/// What the starter announced, in the supervisor's environment, that it passed on
/// descriptors: the values of [`workspace::PROJECT_FD_ENV`] and
/// [`crate::supervisor::clone::CREDENTIALS_FD_ENV`], which the binary reads (and removes) at
/// its edge. `None` where the starter passed nothing.
#[derive(Debug, Default)]
pub struct Inherited {
    pub project_fd: Option<std::ffi::OsString>,
    pub credentials_fd: Option<std::ffi::OsString>,
}

/// Entry point of `dynocap supervise`. Must run before any other thread exists: the jail
/// backend forks a child that runs Rust code. Returns the process exit code.
/// With `catalog`, the catalog opened already (a standby opens it while it waits for its
/// sandbox); without, the supervisor opens it. `config` is what the binary read at its edge,
/// `inherited` what the starter announced it passed.
pub fn main(
    home: Home,
    catalog: Option<Catalog>,
    id: &str,
    ready: OwnedFd,
    mode: Mode,
    config: Config,
    inherited: Inherited,
) -> i32 {
    // Every line of this log names the sandbox (the guest relay thread enters it too).
    let _span = tracing::info_span!(target: LOG_TARGET, "supervisor", sandbox = %id).entered();
    // Before anything can start a child: the project descriptor and the clone's credentials
    // must not leak into one.
    let claimed = workspace::claim_inherited_project(inherited.project_fd).and_then(|()| {
        crate::supervisor::clone::claim_inherited_credentials(inherited.credentials_fd)
    });
    // The ready pipe came without close-on-exec (that is how it crossed exec). Nothing started
    // from here may inherit it: the starter waits for its end-of-file, which would then only
    // come when the last such child exits, long after this process died.
    if let Err(err) = nix::fcntl::fcntl(
        &ready,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    ) {
        tracing::error!(target: LOG_TARGET, "cannot mark the ready pipe close-on-exec: {err}");
        return 1;
    }
    let ready = ReadyPipe(Mutex::new(Some(std::fs::File::from(ready))));
    if let Err(err) = claimed {
        tracing::error!(target: LOG_TARGET, "cannot take what the starter passed: {err}");
        ready.send(&ReadyMessage::Failed(err));
        return 1;
    }
    tracing::info!(target: LOG_TARGET,
        "supervisor for {id} starting (pid {}){}",
        std::process::id(),
        if mode.is_recover() {
            " to recover the work of an unsaved task"
        } else {
            ""
        }
    );
    ready.send(&ReadyMessage::Progress(workspace::step(
        "booting the sandbox",
    )));
    let booted = boot(&home, &config, catalog, id, mode);
    // A disk a standby made ahead and the boot did not take (another backend, a failure) is
    // of no further use here.
    backend::release_unused_preparations();
    let (catalog, record, guest, room) = match booted {
        Ok(parts) => parts,
        Err(err) => {
            tracing::error!(target: LOG_TARGET, "boot failed: {err}");
            ready.send(&ReadyMessage::Failed(err));
            return 1;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            ready.send(&ReadyMessage::Failed(ProcessFailure::Runtime(err).into()));
            // Whoever started us cleans up; a recovering task's files must survive this.
            let _ = guest.stop_keeping_layer();
            return 1;
        }
    };
    let code = match mode {
        Mode::Start => runtime.block_on(serve(home, &config, catalog, record, guest, room, ready)),
        Mode::Recover { include_generated } => runtime.block_on(recover(
            home,
            catalog,
            record,
            guest,
            room,
            ready,
            include_generated,
        )),
    };
    tracing::info!(target: LOG_TARGET, "supervisor exiting");
    code
}

/// Boots the guest with its stdout and stderr on a pipe instead of the supervisor's log file:
/// a guest that got hold of its init's descriptors could otherwise truncate or rewrite the log.
fn boot_with_piped_output(
    backend: &dyn backend::Backend,
    spec: &BootSpec,
) -> Result<(Box<dyn Guest>, OwnedFd)> {
    use nix::unistd::{dup, dup2_stderr, dup2_stdout, pipe2};
    use std::os::fd::AsFd;
    let (read, write) =
        pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("creating the guest output pipe")?;
    let saved_out = dup(std::io::stdout().as_fd()).context("saving stdout")?;
    let saved_err = dup(std::io::stderr().as_fd()).context("saving stderr")?;
    dup2_stdout(&write).context("pointing stdout at the guest pipe")?;
    dup2_stderr(&write).context("pointing stderr at the guest pipe")?;
    let booted = backend.boot(spec);
    // Restore the log before anything else is written.
    let restored = dup2_stdout(&saved_out).and_then(|()| dup2_stderr(&saved_err));
    drop(write);
    restored.context("restoring the supervisor's log")?;
    Ok((booted?, read))
}

/// Copies what the guest's init prints into the log, line by line, marked as guest output
/// and cut to a bounded length (it is guest data).
fn relay_guest_output(pipe: OwnedFd) {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(std::fs::File::from(pipe));
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader).take(4096).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => tracing::info!(target: LOG_TARGET,
                "guest: {}",
                crate::supervisor::exec::sanitize_line(
                    String::from_utf8_lossy(&line).trim_end(),
                    4096
                )
            ),
        }
    }
}

fn boot(
    home: &Home,
    config: &Config,
    catalog: Option<Catalog>,
    id: &str,
    mode: Mode,
) -> Result<(Catalog, Record, Box<dyn Guest>, PendingRoom)> {
    let catalog = match catalog {
        Some(catalog) => catalog,
        None => Catalog::open(home)?,
    };
    let record = catalog
        .get(id)?
        .ok_or_else(|| Error::not_found(format!("no sandbox record {id} to supervise")))?;
    // A fork's first boot, or a task's after a restore, boots over the disk its state
    // directory was given (see `checkpoint`); a restored task is running all along.
    let resume = crate::supervisor::checkpoint::resuming(&home.sandbox_dir(id));
    let expected = match mode {
        Mode::Start if resume && record.state == State::Running => State::Running,
        // A warm-pool sandbox starts as any raw one; it only ends its start differently.
        Mode::Start if record.state == State::Warming => State::Warming,
        Mode::Start => State::Starting,
        Mode::Recover { .. } => State::Recovering,
    };
    if record.state != expected {
        return Err(Error::conflict(format!(
            "sandbox {id} is {}, not {}",
            record.state.as_str(),
            expected.as_str()
        )));
    }
    if let Some(me) = ProcessId::of(i32::try_from(std::process::id()).unwrap_or(i32::MAX)) {
        // The starter records its child as soon as the spawn returns; this covers a starter
        // that died before it could. Writing it again would only take the catalog's write
        // lock (and a record file rewrite) on the start's path, against the starter's own.
        if record.supervisor != Some(me) {
            catalog.set_supervisor(id, me)?;
        }
    }
    if record.state == State::Warming {
        // A refill boots in a lull, not beside the commands of the sandbox just claimed.
        let waited = crate::host::activity::wait_for_quiet(
            home,
            crate::host::activity::QUIET,
            crate::host::activity::MAX_WAIT,
        );
        tracing::info!(target: LOG_TARGET,
            "warm-pool boot after {} ms of waiting for a lull",
            waited.as_millis()
        );
    }
    let backend = backend::by_name(&record.backend)?;
    let image = image::open(home, &record.image)?;
    let state_dir = home.sandbox_dir(id);
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let id_range = crate::host::idpool::reserve(home, id)?;
    let spec = BootSpec {
        id: id.to_owned(),
        hostname: record.name.clone().unwrap_or_else(|| id.to_owned()),
        image,
        state_dir,
        cache_dir: home.cache_dir(),
        agent_binary: agent_binary(config)?,
        cpus: record.cpus,
        memory_mb: record.memory_mb,
        disk_mb: record.disk_mb,
        disk_limit: config.disk_limit.clone(),
        vm_accel: config.vm_accel.clone(),
        exec_cgroup: config.exec_cgroup.clone(),
        pids: spec::PIDS_LIMIT,
        reuse_layer: mode.is_recover() || resume,
        id_range,
        // A disk duplicated from another sandbox's keeps that one's ids at every boot over it.
        layer_id_range: if mode.is_recover() || resume {
            crate::supervisor::checkpoint::layer_id_range(&home.sandbox_dir(id))
        } else {
            None
        },
        // Recovery only saves work: no network, whatever the sandbox had.
        network: match mode {
            Mode::Start => record.network,
            Mode::Recover { .. } => spec::Network::None,
        },
        extra_ca: match (mode, &record.egress) {
            (Mode::Start, Some(egress)) => egress.extra_ca_pem()?,
            (Mode::Start, None) => {
                crate::supervisor::egress::direct_extra_ca(&config.egress, record.network)?
            }
            (Mode::Recover { .. }, _) => None,
        },
        project_cache: match mode {
            Mode::Start => project_cache(home, &record, config)?,
            // Recovery only saves work: nothing of the agent's runs, nothing is downloaded.
            Mode::Recover { .. } => None,
        },
    };
    let booting = std::time::Instant::now();
    let (guest, guest_output) = boot_with_piped_output(backend.as_ref(), &spec)?;
    // A warm-pool guest is nobody's yet: its disk takes its room when it is claimed. Any
    // other's reservation runs beside the rest of the start, which waits for it before the
    // sandbox is anyone's.
    let room = match guest.disk_room() {
        Some(room) if record.state != State::Warming => PendingRoom::begin(room),
        _ => PendingRoom::default(),
    };
    tracing::info!(target: LOG_TARGET,
        "guest booted in {:.2}s on {} backend, init pid {}, host id range {id_range}",
        booting.elapsed().as_secs_f64(),
        backend.name(),
        guest.pid()
    );
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("guest-log".into())
        .spawn(move || span.in_scope(|| relay_guest_output(guest_output)))
        .context("starting the guest log relay")?;
    // The agent must survive the guest's own OOM kills (the agent resets its children to 0).
    // Lowering the score needs host privileges; unprivileged users keep the default.
    let _ = std::fs::write(format!("/proc/{}/oom_score_adj", guest.pid()), "-1000");
    Ok((catalog, record, guest, room))
}

/// The package caches of a task's project, made if new, when the task was started with
/// them (see [`crate::model::task_spec::TaskDetail::cache`]).
fn project_cache(
    home: &Home,
    record: &Record,
    config: &Config,
) -> Result<Option<crate::host::project_cache::ProjectCache>> {
    use crate::host::project_cache::{ProjectCache, ProjectKey};
    if record.kind != crate::store::catalog::Kind::Task {
        return Ok(None);
    }
    let detail = crate::model::task_spec::TaskDetail::from_json(record.detail.as_deref())?;
    let Some(id) = &detail.cache else {
        return Ok(None);
    };
    let Some(key) = ProjectKey::for_source(&detail.start.source) else {
        return Ok(None);
    };
    if &key.id() != id {
        return Err(Error::internal(format!(
            "the task's cache {id} is not its project's ({}); start it again",
            key.id()
        )));
    }
    let cache = ProjectCache::prepare(home.root(), &key, config.cache_bytes()?)?;
    tracing::info!(target: LOG_TARGET,
        "package caches of {} {}: {} ({} MB)",
        key.kind,
        key.project,
        cache.dir().display(),
        cache.bytes() >> 20
    );
    Ok(Some(cache))
}

/// The agent binary: `DYNOCAP_AGENT`, else `dynocap-agent` beside this executable.
pub fn agent_binary(config: &Config) -> Result<PathBuf> {
    if let Some(path) = config.agent.clone().filter(|v| !v.as_os_str().is_empty()) {
        if path.is_relative() {
            return Err(ProcessFailure::AgentRelative { path }.into());
        }
        if path.is_file() {
            return Ok(path);
        }
        return Err(ProcessFailure::AgentNotAFile { path }.into());
    }
    let exe = std::env::current_exe().context("locating the dynocap executable")?;
    let agent = exe.with_file_name("dynocap-agent");
    if agent.is_file() {
        Ok(agent)
    } else {
        Err(ProcessFailure::AgentMissing { path: agent }.into())
    }
}

/// Tells the starter on `ready` that the supervisor failed before [`main`] could start it:
/// a standby that could not take its order's log.
pub fn report_failed_start(ready: OwnedFd, err: Error) {
    ReadyPipe(Mutex::new(Some(std::fs::File::from(ready)))).send(&ReadyMessage::Failed(err));
}

/// A warm-pool supervisor booted at the lowest priority (see `Engine::spawn_supervisor`):
/// once claimed, it runs at the normal one again, every thread of it (its process group).
fn restore_priority() {
    // SAFETY: getpriority/setpriority only read and set scheduling values of our own group.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice > 0 && libc::setpriority(libc::PRIO_PGRP, 0, 0) != 0 {
            tracing::warn!(target: LOG_TARGET,
                "restoring the normal CPU priority: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

async fn serve(
    home: Home,
    config: &Config,
    catalog: Catalog,
    mut record: Record,
    guest: Box<dyn Guest>,
    room: PendingRoom,
    ready: ReadyPipe,
) -> i32 {
    let id = record.id.clone();
    // A restored task's supervisor is executed anew by the one before it, the task running.
    let restored = record.state == State::Running;
    let Some(Started {
        mut guest,
        conn,
        listener,
        task,
        egress,
    }) = come_up(&home, config, &catalog, &mut record, guest, room, &ready).await
    else {
        return 1;
    };
    let mut claimable = record.state == State::Warming;

    let forwards = crate::supervisor::ports::Forwards::new(
        conn.clone(),
        home.sandbox_dir(&id),
        guest.network_namespace(),
    );
    if restored {
        // Before any request is served: the restore's caller finds them open.
        forwards.reopen_saved().await;
    }
    let shared = Arc::new(Shared {
        conn,
        task,
        oom: OomWatch::new(guest.oom_counter(), record.memory_mb),
        ending: OnceLock::new(),
        network_lost: OnceLock::new(),
        layer_sync: guest.layer_sync(),
        layered_disk: guest.layered_disk(),
        home: home.clone(),
        id: id.clone(),
        disk_failed: OnceLock::new(),
        egress,
        jobs: crate::supervisor::jobs::Jobs::new(
            home.sandbox_dir(&id)
                .join(crate::supervisor::jobs::JOBS_DIR),
        ),
        forwards,
        execs: std::sync::atomic::AtomicUsize::new(0),
        image_run: image::run_config(&home, &record.image),
    });
    let (end_tx, mut end_rx) = mpsc::channel::<(EndRequest, OwnedWriteHalf)>(16);
    let (claim_tx, mut claim_rx) = mpsc::channel::<(Claim, OwnedWriteHalf)>(4);
    let (connect_tx, mut connect_rx) = mpsc::channel::<tokio::net::UnixStream>(4);
    let (live_tx, mut live_rx) = live_fork::queue();
    let main_loop = MainLoop {
        end: end_tx,
        claim: claim_tx,
        connect: connect_tx,
        live: live_tx,
    };
    let mut network = NetworkWatch::new(guest.as_ref());
    let guest_exit = match AsyncFd::new(guest.exit_fd().as_raw_fd()) {
        Ok(fd) => fd,
        Err(err) => {
            tracing::error!(target: LOG_TARGET, "cannot watch the guest: {err}");
            let _ = guest.stop_keeping_layer();
            return 1;
        }
    };
    // The deadline is fixed once: serving a request never moves it (claiming a warm-pool
    // sandbox gives it its claimer's, once).
    let until_expiry = (record.expires_at - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO);
    let expiry = tokio::time::sleep_until(tokio::time::Instant::now() + until_expiry);
    tokio::pin!(expiry);
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let control_socket = home.control_socket(&id);
    let listening_at = file_identity(&control_socket);
    let mut reachability = tokio::time::interval(REACHABLE_CHECK_EVERY);
    reachability.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let mut clients = tokio::task::JoinSet::new();
    let mut waiters: Vec<OwnedWriteHalf> = Vec::new();
    let mut restore_to: Option<String> = None;
    let ending = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                let main_loop = main_loop.clone();
                clients.spawn(async move { handle_client(stream, &shared, &main_loop).await });
            }
            Some(stream) = connect_rx.recv() => {
                let shared = shared.clone();
                let main_loop = main_loop.clone();
                clients.spawn(async move { handle_client(stream, &shared, &main_loop).await });
            }
            Some((claim, mut waiter)) = claim_rx.recv() => {
                let reply = if !std::mem::take(&mut claimable) {
                    ControlReply::Error(Error::conflict(
                        "this sandbox is not an idle warm-pool sandbox; it cannot be claimed",
                    ))
                } else {
                    match accept_claim(guest.as_ref(), &mut record, &claim, &shared.oom) {
                        Ok(until) => {
                            expiry.as_mut().reset(tokio::time::Instant::now() + until);
                            ControlReply::Claimed
                        }
                        Err(err) => ControlReply::Error(err),
                    }
                };
                let _ = write_message(&mut waiter, &reply).await;
            }
            Some(_) = clients.join_next(), if !clients.is_empty() => {}
            Some((dir, answer)) = live_rx.recv() => {
                // Inline, on this one-threaded runtime: for the few seconds of the guest's
                // pause its agent's channel is held still anyway (see `live_fork`).
                let _ = answer.send(guest.save_live(&dir));
            }
            Some((request, waiter)) = end_rx.recv() => {
                waiters.push(waiter);
                break match request {
                    EndRequest::Destroy => Ending::Destroyed,
                    EndRequest::Finish => Ending::Finished,
                    EndRequest::Restore(label) => {
                        restore_to = Some(label);
                        // Not an end: the task boots again below, before `ending` is read.
                        Ending::Destroyed
                    }
                };
            }
            () = network.exited() => {
                if let Some(lost) = network.answer(guest.as_mut()) {
                    let _ = catalog.set_note(&id, Some(&lost));
                    let _ = shared.network_lost.set(lost);
                }
            }
            () = &mut expiry => break Ending::Expired,
            _ = guest_exit.readable() => break Ending::GuestDied,
            _ = async { match sigterm.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => break Ending::Signalled,
            _ = reachability.tick(), if listening_at.is_some() => {
                if file_identity(&control_socket) != listening_at {
                    break Ending::CutOff;
                }
            }
        }
    };
    drop(guest_exit);
    // Before the teardown stops pasta and closes the descriptor it watches.
    drop(network);
    if let Some(label) = restore_to {
        drop(listener);
        if file_identity(&control_socket) == listening_at {
            let _ = std::fs::remove_file(&control_socket);
        }
        return checkpoints::restore(
            &home,
            &catalog,
            &id,
            guest,
            &shared,
            waiters,
            &mut clients,
            &label,
        )
        .await;
    }
    // The record says so before the socket goes: nobody finds it `running` and unreachable.
    match catalog.mark_ending(&id) {
        Ok(_) => {}
        Err(err) => {
            tracing::error!(target: LOG_TARGET, "recording that the sandbox is ending: {err}")
        }
    }
    drop(listener);
    // Before anyone is answered: a connection to a forward after a destroy is refused.
    shared.forwards.close_all().await;
    // Only our own: a socket in its place is another's.
    if file_identity(&control_socket) == listening_at {
        let _ = std::fs::remove_file(&control_socket);
    }
    let where_saved = match &shared.task {
        Some(task) => format!(
            "; the task's work is saved in {0}, a job's whole output in {0}/{1}",
            task.files.dir.display(),
            crate::supervisor::jobs::JOBS_DIR
        ),
        None => String::new(),
    };
    let _ = shared
        .ending
        .set(ending.interrupts(&where_saved, record.ttl_seconds));
    let cut_off = shared.jobs.running();
    if !cut_off.is_empty() {
        let listed: Vec<String> = cut_off
            .iter()
            .map(|job| format!("{} ({}) for {}s", job.job, job.command, job.running_seconds))
            .collect();
        tracing::info!(target: LOG_TARGET, "the sandbox's end cuts off its running jobs: {}", listed.join(", "));
    }
    log_ending(ending, record.ttl_seconds, &control_socket);

    let reply = match &shared.task {
        Some(task) => {
            let jobs = Some((&shared.jobs, cut_off));
            let ended = end_task(&shared.conn, task, guest, record.memory_mb, ending, jobs).await;
            let (state, note, reply) = match ended {
                TaskEnd::Saved(result) => (result.state, None, ControlReply::Finished(*result)),
                TaskEnd::Unsaved(err) => {
                    let note = unsaved_note(task, ending, &err);
                    tracing::warn!(target: LOG_TARGET, "{note}");
                    (
                        State::Unsaved,
                        Some(note.clone()),
                        ControlReply::Error(Error::new(err.code, note)),
                    )
                }
            };
            record_end(&catalog, &id, state, note.as_deref(), reply_result(&reply));
            reply
        }
        None => tear_down_raw(&home, &catalog, &id, guest, ending, &mut waiters).await,
    };
    for mut waiter in waiters {
        let _ = write_message(&mut waiter, &reply).await;
    }
    // Commands cut off by the end answer their callers before the process goes.
    let _ = tokio::time::timeout(DRAIN_CLIENTS, async {
        while clients.join_next().await.is_some() {}
    })
    .await;
    // The work is on disk and everyone has their answer: the guest's files can go.
    if matches!(reply, ControlReply::Finished(_)) {
        remove_sandbox_files(&home, &id, &record.backend);
    }
    0
}

/// Makes the idle warm-pool guest its claimer's: its disk's room, its hostname and limits,
/// and the claim's name, limits and deadline in `record`. Returns how long until that
/// deadline.
fn accept_claim(
    guest: &dyn Guest,
    record: &mut Record,
    claim: &Claim,
    oom: &OomWatch,
) -> Result<Duration> {
    // The disk takes its room beside the claim's own work.
    let room = guest
        .disk_room()
        .map_or_else(PendingRoom::default, PendingRoom::begin);
    let claimed = guest.claim(&claim.hostname, claim.cpus, claim.memory_mb);
    room.wait().and(claimed)?;
    restore_priority();
    let expires_at =
        chrono::DateTime::from_timestamp(claim.expires_unix, 0).unwrap_or(record.expires_at);
    record.name = Some(claim.hostname.clone());
    record.cpus = claim.cpus;
    record.memory_mb = claim.memory_mb;
    record.ttl_seconds = claim.ttl_seconds;
    record.expires_at = expires_at;
    oom.set_memory_mb(claim.memory_mb);
    tracing::info!(target: LOG_TARGET, "claimed from the warm pool as {}", claim.hostname);
    Ok((expires_at - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO))
}

/// The device and inode of the file at `path`, if there is one.
fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}
