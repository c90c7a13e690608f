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

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dynocap_review::patch::{self, DEFAULT_MAX_PATCH_BYTES};
use tokio::io::{unix::AsyncFd, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::backend::{self, BootSpec, Guest, LayerSync};
use crate::foundation::error::{Coded, Context, Error, ErrorCode, Result};
use crate::foundation::failpoint;
use crate::host::disk_room::PendingRoom;
use crate::host::home::Home;
use crate::image;
use crate::model::config::Config;
use crate::model::sandbox_info::rfc3339;
use crate::model::spec;
use crate::model::spec::ExecSpec;
use crate::model::spec::Network;
use crate::model::task_spec::{DiffResult, FinishResult, Progress, Source, SourceInfo, TaskDetail};
use crate::store::catalog::{Catalog, Kind, ProcessId, Record, State};
use crate::supervisor::agent_conn::AgentConn;
use crate::supervisor::control::{
    read_message, write_message, Claim, ControlReply, ControlRequest, OutputChannel, OutputChunk,
};
use crate::supervisor::egress::Egress;
use crate::supervisor::exec::ExecResult;
use crate::supervisor::oom::OomWatch;
use crate::supervisor::save::{self, ResultFiles, TaskFacts};
use crate::supervisor::starter_watch::StarterWatch;
use crate::supervisor::workspace::{self, BaselineIndex, BASELINE_TAR};
use crate::supervisor::{exec, finish};

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::supervisor";

/// How long the agent may take to say hello after the guest starts.
const AGENT_HELLO_TIMEOUT: Duration = Duration::from_secs(60);
/// Every egress decision of a sandbox, one JSON line each.
pub const NETWORK_LOG: &str = "network.jsonl";
/// Output kept per stream in a task's exec log: its head and tail, as an MCP caller gets it.
const LOG_OUTPUT_BYTES: usize = 32 * 1024;
/// Pieces of streamed exec output (each at most 64 KiB) held for a client that reads slowly
/// before the command is made to wait: 4 MiB per streaming exec.
const STREAM_QUEUE_CHUNKS: usize = 64;
/// How long requests still being served may take to answer once the sandbox has ended.
const DRAIN_CLIENTS: Duration = Duration::from_secs(10);
/// How often the supervisor checks that its control socket is still where clients look for
/// it: once it is gone (the home deleted), nobody can reach the sandbox, and it ends.
const REACHABLE_CHECK_EVERY: Duration = Duration::from_secs(2);

/// What the supervisor tells its starter on the ready pipe: JSON lines, progress first.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReadyMessage {
    Progress(Progress),
    Ready,
    Failed(Error),
    /// A recovery ([`Mode::Recover`]) saved the task's work: its result.
    Finished(FinishResult),
}

/// What a supervisor is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Boot a new sandbox (and import a task's project) and serve it until it ends.
    Start,
    /// Boot a guest over the writable layer an `unsaved` task kept, save its work, and end.
    Recover,
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
        if mode == Mode::Recover {
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
        Mode::Recover => runtime.block_on(recover(home, catalog, record, guest, room, ready)),
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
    let expected = match mode {
        // A warm-pool sandbox starts as any raw one; it only ends its start differently.
        Mode::Start if record.state == State::Warming => State::Warming,
        Mode::Start => State::Starting,
        Mode::Recover => State::Recovering,
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
        .context(format_args!("creating {}", state_dir.display()))?;
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
        reuse_layer: mode == Mode::Recover,
        id_range,
        // Recovery only saves work: no network, whatever the sandbox had.
        network: match mode {
            Mode::Start => record.network,
            Mode::Recover => spec::Network::None,
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

/// The agent binary: `DYNOCAP_AGENT`, else `dynocap-agent` beside this executable.
pub fn agent_binary(config: &Config) -> Result<PathBuf> {
    if let Some(path) = config.agent.clone().filter(|v| !v.as_os_str().is_empty()) {
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

/// The write end of the ready pipe; closed after the final message.
struct ReadyPipe(Mutex<Option<std::fs::File>>);

impl ReadyPipe {
    /// A watch on the starter at the other end, while the pipe is open and can be watched.
    fn watch(&self) -> Option<StarterWatch> {
        let guard = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match StarterWatch::new(guard.as_ref()?.as_fd()) {
            Ok(watch) => Some(watch),
            Err(err) => {
                tracing::warn!(target: LOG_TARGET, "cannot watch the starter through the ready pipe: {err}");
                None
            }
        }
    }

    fn send(&self, message: &ReadyMessage) {
        let mut guard = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let (Some(file), Ok(mut line)) = (guard.as_mut(), serde_json::to_vec(message)) {
            line.push(b'\n');
            let _ = file.write_all(&line);
        }
        if !matches!(message, ReadyMessage::Progress(_)) {
            *guard = None;
        }
    }
}

/// What a task's supervisor keeps besides the guest.
struct TaskContext {
    id: String,
    name: Option<String>,
    created_at: String,
    files: ResultFiles,
    state_dir: PathBuf,
    /// What was imported, once the import is done (kept for `summary.json`).
    source: Option<SourceInfo>,
    exec_log: Mutex<std::fs::File>,
    baseline: OnceLock<Arc<BaselineIndex>>,
    /// The task's egress proxy, when it has one: its summary goes into the result.
    egress: Option<Arc<Egress>>,
    /// What one file's line diff may take in the guest ([`workspace::line_diff_budget`]): the
    /// same for every diff of the task, so `task diff` shows what `task finish` saves.
    line_diff_budget: u64,
}

impl TaskContext {
    /// Opens the task's results directory (created if needed) and its exec log.
    fn open(home: &Home, record: &Record, source: Option<SourceInfo>) -> Result<Self> {
        let files = ResultFiles::new(finish::results_dir(home.root(), &record.id));
        finish::create_results_dir(&files.dir)?;
        let exec_log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(files.exec_log())
            .context("creating the exec log")?;
        Ok(Self {
            id: record.id.clone(),
            name: record.name.clone(),
            created_at: rfc3339(record.created_at),
            files,
            state_dir: home.sandbox_dir(&record.id),
            source,
            exec_log: Mutex::new(exec_log),
            baseline: OnceLock::new(),
            egress: None,
            line_diff_budget: workspace::line_diff_budget(record.memory_mb),
        })
    }

    fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

/// Why the supervisor stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
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
    fn state(self) -> State {
        match self {
            Self::Finished => State::Finished,
            Self::Expired => State::Expired,
            Self::GuestDied => State::Lost,
            Self::Destroyed | Self::Signalled | Self::CutOff => State::Destroyed,
        }
    }

    /// What a command still running is told when the sandbox ends under it.
    fn interrupts(self, what: &str, ttl_seconds: u64) -> String {
        match self {
            Self::Finished => format!("the task was finished while the command ran; the command was stopped and its output so far is lost{what}"),
            Self::Expired => format!("the sandbox reached the end of its TTL ({ttl_seconds}s) while the command ran; the command was stopped{what}"),
            Self::Destroyed | Self::Signalled => format!("the sandbox was destroyed while the command ran{what}"),
            Self::GuestDied => "the sandbox's guest died while the command ran".to_owned(),
            Self::CutOff => format!("the sandbox's control socket was removed (was its home deleted?) while the command ran, so the sandbox was ended{what}"),
        }
    }
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

/// How connection handlers hand the main loop what only it may do (it owns the guest).
#[derive(Clone)]
struct MainLoop {
    end: mpsc::Sender<(EndRequest, OwnedWriteHalf)>,
    claim: mpsc::Sender<(Claim, OwnedWriteHalf)>,
}

/// Requests that end the sandbox; the main loop handles them after leaving its select.
enum EndRequest {
    Destroy,
    Finish,
}

/// What the connection handlers share with the main loop.
struct Shared {
    conn: AgentConn,
    task: Option<TaskContext>,
    oom: OomWatch,
    /// Set once the sandbox is ending: what an interrupted command is told.
    ending: OnceLock<String>,
    /// Set once a `nat` sandbox's network ended for good (see [`NetworkWatch`]): what every
    /// command is told from then on.
    network_lost: OnceLock<String>,
    /// Who syncs the sandbox's disk after every command, and reads its health.
    layer_sync: LayerSync,
    /// The home, whose activity marker every request touches ([`crate::host::activity`]).
    home: Home,
    /// The sandbox's id, for its record.
    id: String,
    /// Set once the sandbox's disk failed: what went wrong (see [`check_disk`]).
    disk_failed: OnceLock<String>,
}

/// A started sandbox, its agent answering: what [`serve`] serves with.
struct Started {
    guest: Box<dyn Guest>,
    conn: AgentConn,
    listener: UnixListener,
    task: Option<TaskContext>,
}

/// Brings the booted guest up to ready: its agent, a task's project, the control socket, the
/// record `running` (or `pooled`), and the ready message. `None` when it could not, or when
/// nobody waits for it any more: the guest is gone then, and what the start made with it.
async fn come_up(
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
    let watch = match record.state {
        State::Warming => None,
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
    let (conn, listener, task) = match started {
        Ok(Some(parts)) => parts,
        Ok(None) => {
            abandon(home, catalog, record, guest).await;
            return None;
        }
        Err(err) => {
            tracing::error!(target: LOG_TARGET, "start failed: {err}");
            ready.send(&ReadyMessage::Failed(err));
            let _ = tokio::task::spawn_blocking(move || guest.destroy()).await;
            let _ = std::fs::remove_dir_all(home.sandbox_dir(&id));
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
        drop((conn, listener, task));
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
    })
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
    let Some(Started {
        mut guest,
        conn,
        listener,
        task,
    }) = come_up(&home, config, &catalog, &mut record, guest, room, &ready).await
    else {
        return 1;
    };
    let mut claimable = record.state == State::Warming;

    let shared = Arc::new(Shared {
        conn,
        task,
        oom: OomWatch::new(guest.oom_counter(), record.memory_mb),
        ending: OnceLock::new(),
        network_lost: OnceLock::new(),
        layer_sync: guest.layer_sync(),
        home: home.clone(),
        id: id.clone(),
        disk_failed: OnceLock::new(),
    });
    let (end_tx, mut end_rx) = mpsc::channel::<(EndRequest, OwnedWriteHalf)>(16);
    let (claim_tx, mut claim_rx) = mpsc::channel::<(Claim, OwnedWriteHalf)>(4);
    let main_loop = MainLoop {
        end: end_tx,
        claim: claim_tx,
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
    let ending = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
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
            Some((request, waiter)) = end_rx.recv() => {
                waiters.push(waiter);
                break match request {
                    EndRequest::Destroy => Ending::Destroyed,
                    EndRequest::Finish => Ending::Finished,
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
    // The record says so before the socket goes: nobody finds it `running` and unreachable.
    match catalog.mark_ending(&id) {
        Ok(_) => {}
        Err(err) => {
            tracing::error!(target: LOG_TARGET, "recording that the sandbox is ending: {err}")
        }
    }
    drop(listener);
    // Only our own: a socket in its place is another's.
    if file_identity(&control_socket) == listening_at {
        let _ = std::fs::remove_file(&control_socket);
    }
    let where_saved = match &shared.task {
        Some(task) => format!("; the task's work is saved in {}", task.files.dir.display()),
        None => String::new(),
    };
    let _ = shared
        .ending
        .set(ending.interrupts(&where_saved, record.ttl_seconds));
    log_ending(ending, record.ttl_seconds, &control_socket);

    let reply = match &shared.task {
        Some(task) => {
            let ended = end_task(&shared.conn, task, guest, record.memory_mb, ending).await;
            let (state, note, reply) = match ended {
                TaskEnd::Saved(result) => (result.state, None, ControlReply::Finished(result)),
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

/// Says in the log why the sandbox ends.
fn log_ending(ending: Ending, ttl_seconds: u64, control_socket: &std::path::Path) {
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
async fn tear_down_raw(
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
    let _ = std::fs::remove_dir_all(home.sandbox_dir(id));
    if ending != Ending::GuestDied {
        if let Err(err) = catalog.delete(id) {
            tracing::error!(target: LOG_TARGET, "updating the catalog: {err}");
        }
    }
    ControlReply::Destroyed
}

/// How many times a `nat` guest's pasta is started again after it died before its network
/// is ended instead: a pasta that keeps dying is not going to serve, and restarting it for
/// ever would hide that.
const NETWORK_RESTARTS: u32 = 3;

/// Watches a `nat` guest's pasta and answers its death: it is started again, with the
/// configuration it first had, up to [`NETWORK_RESTARTS`] times; after that, or when it cannot
/// be, the guest's network ends where everyone sees it (the log, the record's note that `ps`
/// and `ls` show, every command's result).
struct NetworkWatch {
    /// pasta's pidfd, registered with the runtime; `None` for a guest without pasta.
    exit: Option<AsyncFd<std::os::fd::RawFd>>,
    restarts: u32,
}

impl NetworkWatch {
    fn new(guest: &dyn Guest) -> Self {
        Self {
            exit: Self::watch(guest),
            restarts: 0,
        }
    }

    fn watch(guest: &dyn Guest) -> Option<AsyncFd<std::os::fd::RawFd>> {
        let fd = guest.network_exit_fd()?.as_raw_fd();
        match AsyncFd::new(fd) {
            Ok(watch) => Some(watch),
            Err(err) => {
                tracing::error!(target: LOG_TARGET, "cannot watch pasta, the guest's network: {err}");
                None
            }
        }
    }

    /// Resolves once pasta has exited; never without a pasta.
    async fn exited(&self) {
        match &self.exit {
            Some(exit) => {
                let _ = exit.readable().await;
            }
            None => std::future::pending().await,
        }
    }

    /// Restarts pasta, or ends the network: what every command is then told (`Some`).
    fn answer(&mut self, guest: &mut dyn Guest) -> Option<String> {
        // Unregistered before the restart closes the descriptor it watches.
        self.exit = None;
        let how = guest.network_exit();
        let failed = if self.restarts < NETWORK_RESTARTS {
            self.restarts += 1;
            tracing::warn!(target: LOG_TARGET,
                "network \"nat\": pasta exited ({how}); the guest has no network until it is \
                 started again (restart {} of {NETWORK_RESTARTS})",
                self.restarts
            );
            match guest.restart_network() {
                Ok(()) => {
                    self.exit = Self::watch(guest);
                    return None;
                }
                Err(err) => format!("and could not be started again: {}", err.message),
            }
        } else {
            format!("again after {NETWORK_RESTARTS} restarts")
        };
        if let Err(err) = guest.end_network() {
            tracing::warn!(target: LOG_TARGET, "{err}");
        }
        let lost = format!(
            "the sandbox's network (\"nat\") ended at {}: its pasta exited ({how}) {failed}; \
             the sandbox reaches nothing now. Destroy it and start a new one to have a network \
             again",
            rfc3339(chrono::Utc::now())
        );
        tracing::error!(target: LOG_TARGET, "{lost}");
        Some(lost)
    }
}

/// The line a command's stderr gets once the sandbox's network has ended.
fn network_note(lost: &str) -> String {
    format!("\ndynocap: {lost}\n")
}

fn with_network_note(mut result: ExecResult, lost: &str) -> ExecResult {
    let note = network_note(lost);
    match (&mut result.stderr, &mut result.transcript) {
        (_, Some(transcript)) => transcript.push_str(&note),
        (Some(stderr), None) => stderr.push_str(&note),
        (None, None) => result.stderr = Some(note),
    }
    result
}

/// The device and inode of the file at `path`, if there is one.
fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

/// How a task's guest ended.
enum TaskEnd {
    /// The work is saved and the result written; the guest is stopped, its layer still kept.
    Saved(FinishResult),
    /// The work could not be saved; the guest is stopped and its layer kept.
    Unsaved(Error),
}

/// Saves a task's work, then stops its guest (keeping the layer until the caller removes it).
async fn end_task(
    conn: &AgentConn,
    task: &TaskContext,
    guest: Box<dyn Guest>,
    memory_mb: u64,
    ending: Ending,
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
    let state = ending.state();
    match finalize(task, state).await {
        Ok(result) => match failpoint::hit("supervisor.results-written") {
            Ok(()) => TaskEnd::Saved(result),
            Err(err) => TaskEnd::Unsaved(err),
        },
        Err(err) => TaskEnd::Unsaved(err),
    }
}

/// The memory limit while a task's work is saved: twice its own plus 1 GiB (git holds a
/// large file and its compressed form at once), at most half of the host's memory, never less
/// than the sandbox had.
fn save_memory_limit(memory_mb: u64) -> u64 {
    let own = memory_mb.saturating_mul(1 << 20);
    let wanted = own.saturating_mul(2).saturating_add(1 << 30);
    let half_host = crate::host::memory::total_memory_mb().map_or(wanted, |mb| (mb << 20) / 2);
    wanted.min(half_host).max(own)
}

/// Reads, verifies and summarises the saved patch (blocking work, off the runtime).
async fn finalize(task: &TaskContext, state: State) -> Result<FinishResult> {
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
    tokio::task::spawn_blocking(move || {
        let facts = TaskFacts {
            id: &facts_id,
            name: name.as_deref(),
            created_at: &created_at,
            source: source.as_ref(),
            baseline_tar: &state_dir.join(BASELINE_TAR),
            scratch: &state_dir.join("verify"),
            network,
        };
        save::finalize(&facts, &files, state, &|path| baseline.get(path))
    })
    .await
    .unwrap_or_else(|err| Err(ProcessFailure::SavePanicked(err).into()))
}

/// The note an `unsaved` task carries: what happened and what to do.
fn unsaved_note(task: &TaskContext, ending: Ending, err: &Error) -> String {
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

fn reply_result(reply: &ControlReply) -> Option<&FinishResult> {
    match reply {
        ControlReply::Finished(result) => Some(result),
        _ => None,
    }
}

/// Records how a task ended. The results directory already holds everything needed to list
/// it, so a catalog that cannot be written loses nothing: it is logged.
fn record_end(
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
fn remove_sandbox_files(home: &Home, id: &str, backend: &str) {
    match backend::by_name(backend)
        .and_then(|backend| backend.cleanup_leftovers(id, &home.sandbox_dir(id)))
    {
        Ok(()) => {}
        Err(err) => tracing::error!(target: LOG_TARGET, "removing the sandbox's files: {err}"),
    }
    let _ = std::fs::remove_dir_all(home.sandbox_dir(id));
}

/// [`Mode::Recover`]: the guest booted over the kept layer; take the diff, save, answer on the
/// ready pipe and end. The guest has no network and runs nothing of the agent's.
async fn recover(
    home: Home,
    catalog: Catalog,
    record: Record,
    mut guest: Box<dyn Guest>,
    room: PendingRoom,
    ready: ReadyPipe,
) -> i32 {
    let id = record.id.clone();
    let prepared = async {
        room.reserved().await?;
        let conn = connect_agent(guest.as_mut()).await?;
        let detail = TaskDetail::from_json(record.detail.as_deref())?;
        let task = TaskContext::open(&home, &record, detail.source)?;
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
    match end_task(&conn, &task, guest, record.memory_mb, Ending::Finished).await {
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

/// The agent's channel, and its hello.
async fn connect_agent(guest: &mut dyn Guest) -> Result<AgentConn> {
    let channel = guest
        .take_channel()
        .ok_or_else(|| Error::internal("the backend gave no agent channel"))?;
    let stream = std::os::unix::net::UnixStream::from(channel);
    stream
        .set_nonblocking(true)
        .context("configuring the agent channel")?;
    let stream = UnixStream::from_std(stream).context("registering the agent channel")?;
    let (read, write) = stream.into_split();
    let (conn, hello) = AgentConn::start(read, write, AGENT_HELLO_TIMEOUT).await?;
    tracing::info!(target: LOG_TARGET, "agent {} ready", hello.agent_version);
    Ok(conn)
}

/// Ends a start whose starter died without cancelling it (see `starter_watch`), leaving what
/// its guard would have: nothing. The guest goes first, with whatever it runs; then the files,
/// the results directory a task's start made, and the record, which frees the name.
async fn abandon(home: &Home, catalog: &Catalog, record: &Record, guest: Box<dyn Guest>) {
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
/// record running.
async fn start(
    home: &Home,
    config: &Config,
    catalog: &Catalog,
    record: &mut Record,
    guest: &mut dyn Guest,
    room: PendingRoom,
    ready: &ReadyPipe,
) -> Result<(AgentConn, UnixListener, Option<TaskContext>)> {
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
        Some(spec) => Some(Arc::new(Egress::new(spec, &egress_log)?)),
        None => None,
    };

    if let Some(task) = task.as_mut() {
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
        .context(format_args!("listening on {}", socket_path.display()))?;
    // Its disk's room is the sandbox's before the sandbox is anyone's.
    room.reserved().await?;
    // A warm-pool sandbox waits, pooled, for a claim; any other is the caller's now.
    let (from, to) = match record.state {
        State::Warming => (State::Warming, State::Pooled),
        _ => (State::Starting, State::Running),
    };
    if !catalog.transition(&id, from, to, None)? {
        return Err(Error::conflict(
            "the sandbox record changed while it was starting",
        ));
    }
    Ok((conn, listener, task))
}

/// Serves one control connection.
async fn handle_client(stream: UnixStream, shared: &Shared, main_loop: &MainLoop) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let request = match read_message::<ControlRequest, _>(&mut reader).await {
        Ok(Some(request)) => request,
        Ok(None) => return,
        Err(err) => {
            let _ = write_message(&mut write, &ControlReply::Error(err)).await;
            return;
        }
    };
    crate::host::activity::note(&shared.home);
    let conn = &shared.conn;
    let task = shared.task.as_ref();
    let reply = match request {
        ControlRequest::Ping => {
            ControlReply::from_result(conn.ping().await, |()| ControlReply::Pong)
        }
        ControlRequest::Exec { spec } => {
            // The client closing its end (or sending anything more) cancels the command.
            let client_gone = async {
                let mut byte = [0u8; 1];
                let _ = tokio::io::AsyncReadExt::read(&mut reader, &mut byte).await;
            };
            let started_at = chrono::Utc::now();
            tracing::debug!(target: LOG_TARGET,
                "exec: {} bytes of command in {}, timeout {}s",
                spec.command.len(),
                spec.cwd,
                spec.timeout_seconds
            );
            let kills_before = shared.oom.kills(conn).await;
            // Progress lines and streamed output go out on this connection while the command
            // runs. Output waits for the client (bounded queue); progress is a few small lines.
            let (progress_tx, mut progress_rx) = mpsc::unbounded_channel::<Progress>();
            let report: &(dyn Fn(Progress) + Send + Sync) = &move |p: Progress| {
                let _ = progress_tx.send(p);
            };
            let (output_tx, mut output_rx) = mpsc::channel::<OutputChunk>(STREAM_QUEUE_CHUNKS);
            let run = exec::run(
                conn,
                &spec,
                client_gone,
                spec.report_progress.then_some(report),
                (spec.stream_output && !spec.terminal).then_some(&output_tx),
            );
            tokio::pin!(run);
            let result = loop {
                tokio::select! {
                    result = &mut run => break result,
                    Some(p) = progress_rx.recv() => {
                        let _ = write_message(&mut write, &ControlReply::Progress(p)).await;
                    }
                    Some(chunk) = output_rx.recv() => {
                        let _ = write_message(&mut write, &ControlReply::Output(chunk)).await;
                    }
                }
            };
            // Output queued before the end goes out before the final reply.
            while let Ok(chunk) = output_rx.try_recv() {
                let _ = write_message(&mut write, &ControlReply::Output(chunk)).await;
            }
            let result = match result {
                Ok(done) => Ok(shared.oom.annotate(conn, done, kills_before).await),
                Err(err) => Err(err),
            };
            let result = match (result, shared.network_lost.get()) {
                (Ok(done), Some(lost)) => {
                    if spec.stream_output {
                        let note = OutputChunk {
                            channel: OutputChannel::Stderr,
                            data: network_note(lost).into_bytes(),
                        };
                        let _ = write_message(&mut write, &ControlReply::Output(note)).await;
                    }
                    Ok(with_network_note(done, lost))
                }
                (result, _) => result,
            };
            if spec.stream_output && result.as_ref().is_ok_and(|done| done.oom_killed) {
                // A streaming client prints the stream, not the result's stderr: tell it there.
                let note = OutputChunk {
                    channel: OutputChannel::Stderr,
                    data: shared.oom.note().into_bytes(),
                };
                let _ = write_message(&mut write, &ControlReply::Output(note)).await;
            }
            // A task's work is on the host's disk when the command returns; a raw sandbox's
            // files do not outlive the machine, but its failed disk is still the command's
            // error (a jail's is read on the host, a VM's asked of its kernel).
            let synced = match (task, &shared.layer_sync) {
                (Some(_), how) => sync_layer(how.clone(), &shared.conn).await,
                (None, LayerSync::GuestKernel) => guest_disk_health(&shared.conn).await,
                (None, LayerSync::HostMount(_)) => Ok(()),
            };
            let result = match (result, check_disk(shared, synced).await) {
                (Ok(mut done), Some(failure)) => {
                    let note = disk_failure_note(&failure);
                    if spec.stream_output {
                        let chunk = OutputChunk {
                            channel: OutputChannel::Stderr,
                            data: note.clone().into_bytes(),
                        };
                        let _ = write_message(&mut write, &ControlReply::Output(chunk)).await;
                    }
                    for text in [&mut done.stderr, &mut done.transcript]
                        .into_iter()
                        .flatten()
                    {
                        text.push_str(&note);
                    }
                    done.disk_error = Some(failure);
                    Ok(done)
                }
                (result, _) => result,
            };
            // A command cut off by the sandbox's end is told why, not that the agent is gone.
            let result = match (result, shared.ending.get()) {
                (Err(_), Some(ending)) => Err(Error::conflict(ending.clone())),
                (result, _) => result,
            };
            match &result {
                Ok(done) => tracing::debug!(target: LOG_TARGET,
                    "exec ended in {}ms: exit code {:?}, signal {:?}, timed out {}",
                    done.duration_ms,
                    done.exit_code,
                    done.signal,
                    done.timed_out
                ),
                Err(err) => tracing::debug!(target: LOG_TARGET, "exec failed: {err}"),
            }
            if let Some(task) = task {
                task.log_exec(&spec, started_at, &result);
            }
            ControlReply::from_result(result, ControlReply::Exec)
        }
        ControlRequest::Diff => match task {
            Some(task) => {
                let diff = conn.while_responsive(task.diff(conn)).await.and_then(|r| r);
                let diff = match diff {
                    // On a failed disk the failure is the answer, and what to do about it.
                    Err(err) => Err(match check_disk(shared, Ok(())).await {
                        Some(failure) => ProcessFailure::DiffOnFailedDisk {
                            failure,
                            taking: err,
                        }
                        .into(),
                        None => err,
                    }),
                    ok => ok,
                };
                ControlReply::from_result(diff, ControlReply::Diff)
            }
            None => {
                ControlReply::Error(Error::conflict("diff is for tasks; this is a raw sandbox"))
            }
        },
        ControlRequest::Finish if task.is_none() => ControlReply::Error(Error::conflict(
            "finish is for tasks; destroy a raw sandbox instead",
        )),
        ControlRequest::Destroy | ControlRequest::Finish => {
            let kind = if matches!(request, ControlRequest::Finish) {
                EndRequest::Finish
            } else {
                EndRequest::Destroy
            };
            // The main loop replies once teardown is complete.
            let _ = main_loop.end.send((kind, write)).await;
            return;
        }
        ControlRequest::Claim(claim) => {
            let _ = main_loop.claim.send((claim, write)).await;
            return;
        }
    };
    let _ = write_message(&mut write, &reply).await;
}

/// What the sandbox's disk failed with, if it did: the error state its filesystem keeps
/// (jail), else a sync of it that failed (`synced`). The first failure goes into the sandbox's
/// record note, which `ls` shows.
async fn check_disk(shared: &Shared, synced: Result<()>) -> Option<String> {
    // The filesystem's own error state first: it names the root cause, of which a failed
    // sync is only a symptom.
    let recorded = match &shared.layer_sync {
        LayerSync::HostMount(disk) => {
            let disk = Arc::clone(disk);
            tokio::task::spawn_blocking(move || disk.failure())
                .await
                .ok()
                .flatten()
        }
        LayerSync::GuestKernel => None,
    };
    let failure = recorded.or_else(|| synced.err().map(|err| err.message))?;
    if shared.disk_failed.set(failure.clone()).is_ok() {
        tracing::error!(target: LOG_TARGET, "{failure}");
        let note = format!(
            "{failure}; finish the task (or destroy the sandbox): its work up to the failure is kept"
        );
        if let Err(err) =
            Catalog::open(&shared.home).and_then(|c| c.set_note(&shared.id, Some(&note)))
        {
            tracing::warn!(target: LOG_TARGET, "recording the disk's failure in the record: {err}");
        }
    }
    Some(failure)
}

/// What a command's stderr gets when the sandbox's disk failed.
fn disk_failure_note(failure: &str) -> String {
    format!("\ndynocap: {failure}.\n")
}

/// Syncs the guest's disk to the host (see [`LayerSync`]); a failure is logged: the command
/// has run, and what it wrote may still reach the host.
async fn sync_layer(how: LayerSync, conn: &AgentConn) -> Result<()> {
    let synced = match how {
        LayerSync::HostMount(disk) => {
            match tokio::task::spawn_blocking(move || disk.sync()).await {
                Ok(synced) => synced,
                Err(err) => Err(ProcessFailure::SyncPanicked(err).into()),
            }
        }
        LayerSync::GuestKernel => sync_guest_kernel(conn).await,
    };
    if let Err(err) = &synced {
        tracing::warn!(target: LOG_TARGET, "{err}");
    }
    synced
}

/// Asks the agent whether the guest kernel's root filesystem recorded errors.
async fn guest_disk_health(conn: &AgentConn) -> Result<()> {
    ask_guest_disk(
        conn,
        dynocap_proto::Request::DiskHealth,
        dynocap_proto::Response::DiskHealthy,
        "reading the guest's disk health",
    )
    .await
}

/// Asks the agent to write the guest kernel's cached writes to its disk.
async fn sync_guest_kernel(conn: &AgentConn) -> Result<()> {
    ask_guest_disk(
        conn,
        dynocap_proto::Request::Sync,
        dynocap_proto::Response::Synced,
        "syncing the guest's disk",
    )
    .await
}

/// Sends the agent a request about its disk and waits for the one answer that says all is
/// well; the agent's error (the failure its filesystem recorded) is the call's.
async fn ask_guest_disk(
    conn: &AgentConn,
    request: dynocap_proto::Request,
    healthy: dynocap_proto::Response,
    what: &str,
) -> Result<()> {
    let stream = conn.open(&request).await?;
    match workspace::finish_stream(stream, what).await? {
        answer if answer == healthy => Ok(()),
        other => Err(ProcessFailure::AgentAnswered {
            what: what.to_owned(),
            answer: Box::new(other),
        }
        .into()),
    }
}

/// What failed in the supervisor's own work (not the guest's, not the backend's).
#[derive(Debug, thiserror::Error)]
enum ProcessFailure {
    /// The agent binary the configuration names (`DYNOCAP_AGENT`).
    #[error(
        "DYNOCAP_AGENT={} is not a file; point it at a dynocap-agent binary or unset it",
        .path.display()
    )]
    AgentNotAFile { path: PathBuf },
    /// Where the agent binary was looked for, beside the running executable.
    #[error(
        "the guest agent {} is missing; install dynocap-agent next to dynocap or set \
         DYNOCAP_AGENT",
        .path.display()
    )]
    AgentMissing { path: PathBuf },
    #[error("starting the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// `failure` is the disk's (see `HostDisk::failure`), the cause of `taking`'s failure.
    #[error(
        "{failure}, so the final diff could not be taken in the guest ({})",
        .taking.message
    )]
    FinalDiffOnFailedDisk {
        failure: String,
        #[source]
        taking: Error,
    },
    #[error(
        "{failure}, so the diff cannot be taken in the guest ({}); its work up to the failure \
         is kept: `task finish` saves it (from a fresh guest, once a first finish left the \
         task unsaved)",
        .taking.message
    )]
    DiffOnFailedDisk {
        failure: String,
        #[source]
        taking: Error,
    },
    #[error("saving the results panicked: {0}")]
    SavePanicked(#[source] tokio::task::JoinError),
    #[error("syncing the sandbox's disk: {0}")]
    SyncPanicked(#[source] tokio::task::JoinError),
    #[error("{what}: the agent answered {answer:?}")]
    AgentAnswered {
        what: String,
        answer: Box<dynocap_proto::Response>,
    },
}

impl Coded for ProcessFailure {
    /// A failed disk is the machine's, a panic or an unexpected answer DynoCap's: none is
    /// the caller's to fix.
    fn code(&self) -> ErrorCode {
        match self {
            Self::AgentNotAFile { .. }
            | Self::AgentMissing { .. }
            | Self::Runtime(_)
            | Self::FinalDiffOnFailedDisk { .. }
            | Self::DiffOnFailedDisk { .. }
            | Self::SavePanicked(_)
            | Self::SyncPanicked(_)
            | Self::AgentAnswered { .. } => ErrorCode::Internal,
        }
    }
}

impl TaskContext {
    async fn diff(&self, conn: &AgentConn) -> Result<DiffResult> {
        let patch = workspace::diff(conn, self.line_diff_budget).await?;
        let baseline = self.baseline();
        let summary = patch::summarize(&patch, DEFAULT_MAX_PATCH_BYTES, &|path| baseline.get(path))
            .map_err(|err| {
                Error::invalid(format!("the patch from the sandbox was refused: {err}"))
            })?;
        Ok(DiffResult {
            summary,
            patch: String::from_utf8_lossy(&patch).into_owned(),
        })
    }

    /// The host's index of the baseline copy, loaded once.
    fn baseline(&self) -> Arc<BaselineIndex> {
        self.baseline
            .get_or_init(|| {
                Arc::new(
                    BaselineIndex::load(&self.state_dir.join(BASELINE_TAR)).unwrap_or_else(|err| {
                        tracing::warn!(target: LOG_TARGET, "reading the baseline copy: {err}");
                        BaselineIndex::default()
                    }),
                )
            })
            .clone()
    }

    /// Appends one line to `exec.jsonl`. Output keeps its head and tail (32 KiB per stream):
    /// the log says what ran and how it ended; the caller already got the output.
    fn log_exec(
        &self,
        spec: &ExecSpec,
        started_at: chrono::DateTime<chrono::Utc>,
        result: &Result<ExecResult>,
    ) {
        let cut = |text: &Option<String>| {
            text.as_deref()
                .map(|t| crate::foundation::excerpt::excerpt_str(t, LOG_OUTPUT_BYTES).0)
        };
        let mut entry = serde_json::json!({
            "startedAt": rfc3339(started_at),
            "command": spec.command,
            "cwd": spec.cwd,
            "envKeys": spec.env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        });
        let outcome = match result {
            Ok(r) => serde_json::json!({
                "terminal": spec.terminal,
                "exitCode": r.exit_code,
                "signal": r.signal,
                "timedOut": r.timed_out,
                "durationMs": r.duration_ms,
                "stdout": cut(&r.stdout),
                "stderr": cut(&r.stderr),
                "transcript": cut(&r.transcript),
                "truncated": r.truncated || [&r.stdout, &r.stderr, &r.transcript].iter().any(|t| t.as_ref().is_some_and(|t| t.len() > LOG_OUTPUT_BYTES)),
                "oomKilled": r.oom_killed,
                "diskError": r.disk_error,
            }),
            Err(err) => serde_json::json!({ "error": err.to_string() }),
        };
        if let (Some(entry), serde_json::Value::Object(outcome)) = (entry.as_object_mut(), outcome)
        {
            entry.extend(outcome);
        }
        let mut file = self
            .exec_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(err) = writeln!(file, "{entry}") {
            tracing::error!(target: LOG_TARGET, "writing the exec log: {err}");
        }
    }
}
