//! The client API for sandboxes: start a supervisor, talk to it, list and destroy. Used by the
//! CLI and the MCP server alike, so both behave the same.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use rand::Rng;
use tokio::io::BufReader;
use tokio::net::UnixStream;

use crate::foundation::error::{Coded, Context, Error, ErrorCode, Result};
use crate::foundation::terms::{Op, Words};
use crate::host::home::Home;
use crate::model::config::Config;
pub use crate::model::sandbox_info::{rfc3339, SandboxInfo};
use crate::model::spec::{ExecSpec, RunSpec};
use crate::model::task_spec::{Progress, TaskDetail};
use crate::store::catalog::{Catalog, Kind, ProcessId, Record, State};
use crate::supervisor::clone::{CREDENTIALS_FD_ENV, SUPERVISOR_CREDENTIALS_FD};
use crate::supervisor::control::{
    read_message, write_message, ControlReply, ControlRequest, OutputChannel,
};
use crate::supervisor::egress::EgressSpec;
use crate::supervisor::exec::ExecResult;
pub(crate) use crate::supervisor::leftovers::{remove_leftovers, Keep};
use crate::supervisor::process::{Mode, ReadyMessage};
use crate::supervisor::workspace::{PROJECT_FD_ENV, SUPERVISOR_PROJECT_FD};

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::sandboxes";

/// How long `run` waits for a supervisor to report its guest ready.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
/// A `starting` record whose supervisor never registered is considered lost after this.
const STARTING_GRACE: chrono::TimeDelta = chrono::TimeDelta::seconds(300);

impl SandboxInfo {
    pub fn from_record(record: &Record) -> Self {
        Self {
            name: record.name.clone().unwrap_or_else(|| record.id.clone()),
            state: record.state,
            backend: record.backend.clone(),
            network: record.network.as_str().to_owned(),
            cpus: record.cpus,
            memory_mb: record.memory_mb,
            disk_mb: record.disk_mb,
            ttl_seconds: record.ttl_seconds,
            created_at: rfc3339(record.created_at),
            expires_at: rfc3339(record.expires_at),
            egress_allowlist: egress_allowlist(record),
            image: record.image.name.clone(),
            image_id: record.image.id.clone(),
            kernel: record.image.kernel.as_ref().map(|k| k.name.clone()),
            note: record.note.clone(),
            jobs: Vec::new(),
            forwards: Vec::new(),
        }
    }
}

/// The hosts a sandbox's proxy lets through, for results and `ls`: `filtered` only.
pub fn egress_allowlist(record: &Record) -> Option<Vec<String>> {
    (record.network == crate::model::spec::Network::Filtered)
        .then(|| record.egress.as_ref().map(|e| e.allow.clone()))
        .flatten()
}

/// Entry point for all sandbox operations.
pub struct Engine {
    home: Home,
    /// The executable re-run as `supervise`; the running dynocap binary by default.
    supervisor_exe: PathBuf,
    /// The catalog, opened on first use and kept for the engine's life: a long-lived
    /// process (the MCP server) pays for opening it once, not on every call. It reopens
    /// itself if a repair replaces the file.
    catalog: std::sync::OnceLock<std::sync::Arc<Catalog>>,
    /// The supervisor kept standing by, for an engine that keeps one (see `standby`).
    standby: std::sync::Arc<crate::facade::standby::Slot>,
    /// What the person running DynoCap configured, as the binary read it at its edge.
    config: std::sync::Arc<Config>,
}

impl Engine {
    /// The engine of `home`, configured by `config`, whose supervisors are `config`'s
    /// `supervisor_exe` (`DYNOCAP_BIN`), else the running executable.
    pub fn new(home: Home, config: Config) -> Result<Self> {
        let supervisor_exe = match config
            .supervisor_exe
            .clone()
            .filter(|v| !v.as_os_str().is_empty())
        {
            Some(path) => path,
            None => std::env::current_exe().context("locating the dynocap executable")?,
        };
        Ok(Self::with_supervisor_exe(home, supervisor_exe, config))
    }

    /// For embedders (benchmarks, tests) whose own executable is not `dynocap`.
    pub fn with_supervisor_exe(home: Home, supervisor_exe: PathBuf, config: Config) -> Self {
        Self {
            home,
            supervisor_exe,
            catalog: std::sync::OnceLock::new(),
            standby: Default::default(),
            config: std::sync::Arc::new(config),
        }
    }

    pub fn home(&self) -> &Home {
        &self.home
    }

    /// What the engine was configured with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn standby_slot(&self) -> &std::sync::Arc<crate::facade::standby::Slot> {
        &self.standby
    }

    pub(crate) fn set_standby_slot(&mut self, slot: std::sync::Arc<crate::facade::standby::Slot>) {
        self.standby = slot;
    }

    /// `dynocap supervise --home <home>`, with this process's environment: what every
    /// supervisor, standby or not, starts as.
    pub(crate) fn supervisor_command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.supervisor_exe);
        command
            .env_clear()
            // Not configuration read here: the supervisor is a process of this binary, which
            // builds its configuration from this same environment at its own edge.
            // env-read-ok: building a child's environment
            .envs(std::env::vars_os())
            .arg("supervise")
            .arg("--home")
            .arg(self.home.root());
        command
    }

    pub(crate) fn catalog(&self) -> Result<std::sync::Arc<Catalog>> {
        if let Some(catalog) = self.catalog.get() {
            return Ok(catalog.clone());
        }
        let opened = std::sync::Arc::new(Catalog::open(&self.home)?);
        // Two first uses at once: one of the two opens is kept, both work.
        Ok(self.catalog.get_or_init(|| opened).clone())
    }

    /// Boots a raw sandbox and returns once its agent answers, the warm pool (if any) topped
    /// up again: the pool had none ready (or none fits), or gave one, and has the room this
    /// sandbox left under the ceilings.
    pub async fn run(&self, spec: &RunSpec) -> Result<SandboxInfo> {
        let info = self.run_leaving_pool(spec).await?;
        self.rebalance_pool().await;
        Ok(info)
    }

    /// As [`Engine::run`], but leaves the warm pool as the start left it: the caller calls
    /// [`Engine::rebalance_pool`] once its reply is out. A long-lived server (MCP) answers
    /// first, so that refilling the pool (a catalog transaction and a supervisor's fork and
    /// exec) is not part of the call's latency.
    pub async fn run_leaving_pool(&self, spec: &RunSpec) -> Result<SandboxInfo> {
        self.admit(spec.cpus, spec.memory_mb, spec.disk_mb, spec.ttl_seconds)?;
        crate::host::usernet::ensure_available(spec.network)?;
        if let Some(record) = self.claim_from_pool(spec).await? {
            return Ok(SandboxInfo::from_record(&record));
        }
        let egress = match spec.network {
            crate::model::spec::Network::Filtered => Some(EgressSpec::from_config(
                &self.config().egress,
                true,
                &spec.allow_hosts,
                &[],
            )?),
            _ => EgressSpec::refuse_hosts(&spec.allow_hosts).map(|()| None)?,
        };
        let mut record = self.new_record(
            Kind::Raw,
            Some(spec.name.clone()),
            spec.network,
            spec.cpus,
            spec.memory_mb,
            spec.disk_mb,
            spec.ttl_seconds,
            None,
            spec.image.as_deref(),
            spec.backend,
        )?;
        self.name_kernel(&mut record, spec.kernel.as_deref())?;
        record.egress = egress;
        let record = self.launch(record, &|_| {}).await?;
        Ok(SandboxInfo::from_record(&record))
    }

    /// The kernel a sandbox of `image` on `backend` boots, as its record is to keep it (see
    /// `ImageRef::kernel`): on the vm, the one lent to an image without its own; on a
    /// backend that boots no kernel, none.
    pub(crate) fn recorded_kernel(
        &self,
        image: &crate::image::ImageRef,
        backend: &str,
    ) -> Option<crate::image::KernelRef> {
        (backend == crate::backend::VM)
            .then(|| crate::image::lent_kernel_ref(&self.home, image))
            .flatten()
    }

    /// Records the image `kernel` names (`--kernel`) as the one whose kernel the sandbox's vm
    /// boots, resolved now as its image is.
    pub(crate) fn name_kernel(&self, record: &mut Record, kernel: Option<&str>) -> Result<()> {
        let Some(kernel) = kernel else {
            return Ok(());
        };
        if record.backend != crate::backend::VM {
            return Err(Error::invalid(format!(
                "--kernel names the kernel a vm boots, and this sandbox's backend is {}, \
                 which boots none: add --backend vm, or leave --kernel out",
                record.backend
            )));
        }
        record.image.kernel = Some(crate::image::resolve_kernel(&self.home, kernel)?);
        Ok(())
    }

    /// A fresh `starting` record for a new sandbox.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_record(
        &self,
        kind: Kind,
        name: Option<String>,
        network: crate::model::spec::Network,
        cpus: u32,
        memory_mb: u64,
        disk_mb: u64,
        ttl_seconds: u64,
        detail: Option<String>,
        image: Option<&str>,
        backend: Option<crate::backend::BackendChoice>,
    ) -> Result<Record> {
        // Resolved once, now: the record keeps the content id, so the sandbox (and any
        // recovery boot of it) gets this very image whatever is built later.
        let image = crate::image::resolve(
            &self.home,
            &image.map_or_else(|| self.config().images.default_name(), str::to_owned),
        )?;
        // `auto` decides by the image: only a built image with a kernel can be a VM.
        let backend = match backend {
            Some(choice) => crate::backend::select_as(self.config(), choice, &image.name)?,
            None => crate::backend::select_for(self.config(), &image.name)?,
        };
        let mut image = image;
        image.kernel = self.recorded_kernel(&image, backend.name());
        let now = chrono::Utc::now();
        let ttl = chrono::TimeDelta::seconds(i64::try_from(ttl_seconds).unwrap_or(i64::MAX));
        Ok(Record {
            id: new_id(kind.id_prefix()),
            kind,
            name,
            state: State::Starting,
            backend: backend.name().to_owned(),
            network,
            cpus,
            memory_mb,
            disk_mb,
            ttl_seconds,
            created_at: now,
            expires_at: now + ttl,
            supervisor: None,
            note: None,
            detail,
            egress: None,
            image,
        })
    }

    /// Inserts `record`, starts its supervisor and waits until the sandbox is ready,
    /// forwarding progress. If this future is dropped before that (a cancelled request), or
    /// the start fails, everything made so far is removed.
    pub(crate) async fn launch(
        &self,
        record: Record,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<Record> {
        self.launch_with(record, Handed::default(), progress).await
    }

    /// [`Engine::launch`], the supervisor inheriting what `handed` holds (a task's checked
    /// project directory, a clone's credentials).
    pub(crate) async fn launch_with(
        &self,
        record: Record,
        handed: Handed<'_>,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<Record> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        let mut record = record;
        // A raw sandbox goes to the standby supervisor, if this engine keeps one; a task
        // brings its project, which a standby cannot take. The record names the standby from
        // the start, so that neither it nor the supervisor writes it again.
        let via = if handed.is_empty() {
            match self.take_standby() {
                Some(standby) => {
                    record.supervisor = ProcessId::of(standby.pid());
                    Via::Standby(standby)
                }
                None => Via::Spawn(handed),
            }
        } else {
            Via::Spawn(handed)
        };
        catalog.insert(&record)?;
        let mut guard = StartGuard {
            home: self.home.clone(),
            id: record.id.clone(),
            backend: record.backend.clone(),
            armed: true,
        };
        self.start_supervisor(&catalog, &record.id, Mode::Start, via, progress)
            .await?;
        guard.armed = false;
        catalog.get(&record.id)?.ok_or_else(|| {
            Error::internal(
                "the sandbox record vanished right after start (destroyed concurrently?)",
            )
        })
    }

    /// Starts the supervisor of sandbox `id` (see [`Via`]) and waits for its ready report:
    /// `None` once the sandbox is ready, the task's result when a recovery saved its work.
    pub(crate) async fn start_supervisor(
        &self,
        catalog: &Catalog,
        id: &str,
        mode: Mode,
        via: Via<'_>,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<Option<crate::model::task_spec::FinishResult>> {
        let ready_read = self.spawn_supervisor(catalog, id, mode, via, false)?;
        let log_path = self.home.supervisor_log(id);
        let report = tokio::time::timeout(BOOT_TIMEOUT, read_ready(ready_read, progress)).await;
        match report {
            Err(_) => Err(Error::timeout(format!(
                "the sandbox did not become ready within {}s; see {}",
                BOOT_TIMEOUT.as_secs(),
                log_path.display()
            ))),
            Ok(Ok(Some(ReadyMessage::Ready))) => Ok(None),
            Ok(Ok(Some(ReadyMessage::Finished(result)))) => Ok(Some(*result)),
            Ok(Ok(Some(ReadyMessage::Failed(err)))) => Err(err),
            Ok(Ok(Some(ReadyMessage::Progress(_)) | None)) | Ok(Err(_)) => {
                Err(SupervisorFailure::ExitedBeforeReady {
                    tail: log_tail(&log_path),
                    log: log_path,
                }
                .into())
            }
        }
    }

    /// Spawns `dynocap supervise` detached and returns the read end of its ready pipe (a
    /// caller that drops it does not wait: the warm pool). A `background` supervisor (a
    /// warm-pool boot) runs at the lowest CPU priority, it and its guest, so that it never
    /// slows the sandboxes in use; its claim restores the normal one. Only where this process
    /// could raise the priority back (root): elsewhere it runs at the normal priority.
    pub(crate) fn spawn_supervisor(
        &self,
        catalog: &Catalog,
        id: &str,
        mode: Mode,
        via: Via<'_>,
        background: bool,
    ) -> Result<OwnedFd> {
        let lowered = background && nix::unistd::geteuid().is_root();
        let (ready_read, ready_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("creating the ready pipe")?;
        let log_path = self.home.supervisor_log(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let log = OwnedFd::from(log);
        let handed = match via {
            Via::Spawn(handed) => handed,
            Via::Standby(standby) => {
                let pid = standby.pid();
                match standby.hand_over(id, ready_write.as_fd(), log.as_fd()) {
                    Ok(()) => {
                        self.replenish_standby();
                        return Ok(ready_read);
                    }
                    Err(err) => {
                        // Its pid in the record is replaced by the spawn's below, after
                        // which the next standby starts.
                        tracing::info!(target: LOG_TARGET,
                            "the standby supervisor (pid {pid}) is gone ({err}); starting one for {id}"
                        );
                        Handed::default()
                    }
                }
            }
        };
        let null = OwnedFd::from(
            std::fs::File::open("/dev/null").context("opening /dev/null for the supervisor")?,
        );
        let mut command = self.supervisor_command();
        command
            .arg("--id")
            .arg(id)
            .arg("--ready-fd")
            .arg(SUPERVISOR_READY_FD.to_string())
            .args(mode.is_recover().then_some("--recover"))
            .args(
                matches!(
                    mode,
                    Mode::Recover {
                        include_generated: true
                    }
                )
                .then_some("--include-generated"),
            );
        // The supervisor gets stdio, the ready pipe and the project, nothing else of ours.
        let mut inherit = vec![(ready_write.as_raw_fd(), SUPERVISOR_READY_FD)];
        if let Some(project) = handed.project {
            command.env(PROJECT_FD_ENV, SUPERVISOR_PROJECT_FD.to_string());
            inherit.push((project.as_raw_fd(), SUPERVISOR_PROJECT_FD));
        }
        if let Some(credentials) = handed.credentials {
            command.env(CREDENTIALS_FD_ENV, SUPERVISOR_CREDENTIALS_FD.to_string());
            inherit.push((credentials.as_raw_fd(), SUPERVISOR_CREDENTIALS_FD));
        }
        // Without fork: copying this process's page tables (a server's, with its runtime's
        // threads) and the copy-on-write faults after it cost a millisecond of every start.
        // Its own session: the supervisor outlives the caller's terminal and its ^C.
        let child = crate::host::spawn::spawn(
            &command,
            &crate::host::spawn::Stdio {
                stdin: &null,
                stdout: &log,
                stderr: &log,
            },
            &inherit,
            crate::host::spawn::Detach::Session,
        )
        .map_err(|source| SupervisorFailure::Start {
            exe: self.supervisor_exe.clone(),
            source,
        })?;
        drop(ready_write);
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        if lowered {
            // Best effort: a supervisor at the normal priority works the same. Only its own
            // start (exec, the catalog read) can run before this; a pool boot then waits for
            // a lull, and boots its guest at this priority.
            // SAFETY: setpriority sets a scheduling value of our child; no memory is involved.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, child.id(), BACKGROUND_NICE);
            }
        }
        child.reap_in_background();
        if let Some(process) = ProcessId::of(pid) {
            catalog.set_supervisor(id, process)?;
        }
        if !background {
            self.replenish_standby();
        }
        Ok(ready_read)
    }

    /// Runs a command in a raw sandbox (default cwd `/`).
    pub async fn exec(&self, name: &str, spec: &ExecSpec) -> Result<ExecResult> {
        self.exec_in(Kind::Raw, name, spec, None, None).await
    }

    /// As [`Engine::exec`], reporting progress (time so far, the latest line of output) every
    /// few seconds while the command runs.
    pub async fn exec_reporting(
        &self,
        name: &str,
        spec: &ExecSpec,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<ExecResult> {
        self.exec_in(Kind::Raw, name, spec, Some(progress), None)
            .await
    }

    /// As [`Engine::exec`], passing every piece of the command's stdout and stderr to
    /// `on_output` as it arrives, all of it, in order. `on_output` may block (a slow pipe): the
    /// command then waits for it. The result still holds the bounded excerpt. A terminal
    /// command (`spec.terminal`) streams nothing: its transcript is a rendered screen.
    pub async fn exec_streaming(
        &self,
        name: &str,
        spec: &ExecSpec,
        on_output: OnOutput<'_>,
    ) -> Result<ExecResult> {
        self.exec_in(Kind::Raw, name, spec, None, Some(on_output))
            .await
    }

    /// Runs a command in a live sandbox of the given kind (tasks also log it).
    pub(crate) async fn exec_in(
        &self,
        kind: Kind,
        name: &str,
        spec: &ExecSpec,
        progress: Option<&(dyn Fn(Progress) + Send + Sync)>,
        on_output: Option<OnOutput<'_>>,
    ) -> Result<ExecResult> {
        let record = self.live_record(name, kind)?;
        let spec = ExecSpec {
            report_progress: progress.is_some(),
            stream_output: on_output.is_some() && !spec.terminal,
            ..spec.clone()
        };
        let interim = Interim {
            progress,
            output: on_output,
        };
        match self
            .call_with(&record, &ControlRequest::Exec { spec }, interim)
            .await?
        {
            ControlReply::Exec(result) => Ok(result),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }

    /// Agent round trip through the supervisor (health check, latency benchmark).
    pub async fn ping(&self, name: &str) -> Result<()> {
        let record = self.live_record(name, Kind::Raw)?;
        match self.call(&record, &ControlRequest::Ping).await? {
            ControlReply::Pong => Ok(()),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }

    /// Raw sandboxes: live ones and lost ones not yet destroyed.
    pub fn ps(&self) -> Result<Vec<SandboxInfo>> {
        let catalog = self.catalog()?;
        let deferred = self.reconcile_for_reading(&catalog)?;
        Ok(catalog
            .list()?
            .into_iter()
            .filter(|r| r.kind == Kind::Raw && is_listed(r))
            .map(|mut record| {
                deferred.annotate(&mut record);
                SandboxInfo {
                    jobs: self.running_jobs(&record),
                    forwards: self.port_forwards(&record),
                    ..SandboxInfo::from_record(&record)
                }
            })
            .collect())
    }

    /// Destroys a raw sandbox and releases its name. A lost record is cleaned and removed.
    pub async fn destroy(&self, name: &str) -> Result<String> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        let record = find(&catalog, name)?;
        if record.kind != Kind::Raw {
            return Err(Error::worded(ErrorCode::Conflict, |s| {
                format!(
                    "\"{name}\" is a task; finish it with {} or remove it with {}",
                    s.op(Op::TaskFinish, name),
                    s.op(Op::Rm, name)
                )
            }));
        }
        let display = record.name.clone().unwrap_or_else(|| record.id.clone());
        // Ending already (its TTL ran out, or another call destroys it): its supervisor is
        // doing what this call asks.
        let Some(record) = self.wait_while_ending(&catalog, record).await? else {
            return Ok(display);
        };
        if record.state == State::Destroyed && supervisor_alive(&record) {
            // Its supervisor is finishing the teardown, and deletes the record when done.
            return Ok(display);
        }
        if record.state.is_live() {
            match self.call(&record, &ControlRequest::Destroy).await {
                // The guest is dead and the name free; the supervisor tears down the rest
                // after its reply and then deletes the record.
                Ok(ControlReply::Destroyed) => return Ok(display),
                Ok(ControlReply::Error(err)) => return Err(err),
                Ok(other) => return Err(unexpected(&other)),
                // Dead, stopped or wedged: end it from here.
                Err(_) => {
                    self.kill_supervisor(&record).await;
                    self.reconcile(&catalog)?;
                }
            }
        }
        if let Some(current) = catalog.get(&record.id)? {
            if !current.state.is_live() {
                remove_leftovers(&self.home, &current.id, &current.backend, Keep::Nothing)?;
                catalog.delete(&current.id)?;
            }
        }
        Ok(display)
    }

    /// Waits while `record` is [`State::Ending`] (its supervisor saving a task's work or
    /// killing its guest), for as long as a finish may take, and returns it as it then is:
    /// `None` once it is gone (a raw sandbox's record is deleted at its end). A supervisor that
    /// dies meanwhile is taken over as anywhere else.
    pub(crate) async fn wait_while_ending(
        &self,
        catalog: &Catalog,
        mut record: Record,
    ) -> Result<Option<Record>> {
        const POLL: Duration = Duration::from_millis(20);
        let limit = reply_deadline(&ControlRequest::Finish {
            include_generated: false,
        });
        let deadline = tokio::time::Instant::now() + limit;
        while record.state == State::Ending {
            if !supervisor_alive(&record) {
                self.reconcile(catalog)?;
            } else if tokio::time::Instant::now() >= deadline {
                let display = record.name.as_deref().unwrap_or(&record.id);
                return Err(Error::conflict(format!(
                    "\"{display}\" has been ending for {}s (its supervisor, pid {}, is still \
                     saving its work or stopping its guest); try again later",
                    limit.as_secs(),
                    record.supervisor.map_or(0, |p| p.pid)
                )));
            } else {
                tokio::time::sleep(POLL).await;
            }
            match catalog.get(&record.id)? {
                Some(current) => record = current,
                None => return Ok(None),
            }
        }
        Ok(Some(record))
    }

    pub(crate) fn live_record(&self, name: &str, kind: Kind) -> Result<Record> {
        let catalog = self.catalog()?;
        let record = find(&catalog, name)?;
        if record.kind != kind {
            return Err(Error::worded(ErrorCode::Conflict, |s| match kind {
                Kind::Raw => format!(
                    "\"{name}\" is a task, not a raw sandbox; run commands in it with {}",
                    s.op(Op::TaskExec, name)
                ),
                Kind::Task => format!(
                    "\"{name}\" is a raw sandbox, not a task; run commands in it with {}",
                    s.op(Op::Exec, name)
                ),
            }));
        }
        let serving = matches!(record.state, State::Starting | State::Running);
        if !serving || !supervisor_alive(&record) {
            if let Some(note) = self.reconcile_for_reading(&catalog)?.note() {
                return Err(Error::conflict(format!(
                    "\"{name}\" is not running: {note}"
                )));
            }
            let state = catalog
                .get(&record.id)?
                .map(|r| r.state)
                .unwrap_or(State::Destroyed);
            return Err(Error::worded(ErrorCode::Conflict, |s| {
                not_running(s, name, kind, state)
            }));
        }
        Ok(record)
    }

    /// Sends one request to a supervisor and waits for its reply, never forever: a supervisor
    /// that dies, stays stopped (SIGSTOP) or outlives the request's deadline is an error that
    /// says so. Callers that end a sandbox then fall back to [`Engine::kill_supervisor`].
    pub(crate) async fn call(
        &self,
        record: &Record,
        request: &ControlRequest,
    ) -> Result<ControlReply> {
        self.call_with(record, request, Interim::default()).await
    }

    /// As [`Engine::call`], passing the supervisor's interim lines (progress, streamed output)
    /// to `interim`. Streamed output shows the supervisor is alive, so each piece moves the
    /// deadline on: a slow reader of a long stream is not taken for a wedged supervisor.
    pub(crate) async fn call_with(
        &self,
        record: &Record,
        request: &ControlRequest,
        interim: Interim<'_>,
    ) -> Result<ControlReply> {
        let display = record.name.as_deref().unwrap_or(&record.id);
        let path = self.home.control_socket(&record.id);
        let deadline = reply_deadline(request);
        let mut expires = tokio::time::Instant::now() + deadline;
        let too_late = || {
            Error::from(SupervisorFailure::NoAnswer {
                display: display.to_owned(),
                deadline,
            })
        };
        let exchange = async {
            let send = async {
                let mut stream = match UnixStream::connect(&path).await {
                    Ok(stream) => stream,
                    Err(err) => return Err(self.unreachable(record, &path, err)),
                };
                write_message(&mut stream, request).await?;
                Ok(stream)
            };
            let mut stream = tokio::time::timeout_at(expires, send)
                .await
                .map_err(|_| too_late())??;
            let (read, _write) = stream.split();
            let mut reader = BufReader::new(read);
            loop {
                let message = tokio::time::timeout_at(expires, read_message(&mut reader))
                    .await
                    .map_err(|_| too_late())??;
                match message {
                    Some(ControlReply::Progress(report)) => {
                        if let Some(progress) = interim.progress {
                            progress(report);
                        }
                    }
                    Some(ControlReply::Output(chunk)) => {
                        if let Some(output) = interim.output {
                            output(chunk.channel, &chunk.data);
                        }
                        expires = tokio::time::Instant::now() + deadline;
                    }
                    Some(reply) => return Ok(reply),
                    None => {
                        return Err(SupervisorFailure::NoReply {
                            display: display.to_owned(),
                        }
                        .into())
                    }
                }
            }
        };
        tokio::select! {
            reply = exchange => reply,
            err = watch_supervisor(record, display) => Err(err),
        }
    }

    /// Why a supervisor's socket cannot be reached: most often the sandbox is ending (its TTL
    /// ran out, or another call destroys or finishes it) and closed its socket first.
    fn unreachable(&self, record: &Record, path: &std::path::Path, err: std::io::Error) -> Error {
        let display = record.name.as_deref().unwrap_or(&record.id);
        let kind = record.kind;
        let current = self
            .catalog()
            .and_then(|catalog| catalog.get(&record.id))
            .ok()
            .flatten();
        match current {
            None => Error::not_found(format!(
                "sandbox \"{display}\" is gone: it ended (destroyed, or its TTL ran out) just before this call"
            )),
            Some(current) if !matches!(current.state, State::Starting | State::Running) => {
                Error::worded(ErrorCode::Conflict, |s| {
                    not_running(s, display, kind, current.state)
                })
            }
            Some(current) if current.supervisor.is_some_and(|p| p.is_alive()) => {
                Error::conflict(format!(
                    "{} \"{display}\" is ending (its TTL ran out, or it is being finished or destroyed) and takes no more requests",
                    if kind == Kind::Task { "task" } else { "sandbox" }
                ))
            }
            Some(_) => SupervisorFailure::Unreachable {
                display: display.to_owned(),
                socket: path.to_owned(),
                source: err,
            }
            .into(),
        }
    }

    /// Kills a supervisor that no longer answers (its guest dies with it) and waits until it
    /// is gone, so that [`Engine::reconcile`] can take over its record.
    pub(crate) async fn kill_supervisor(&self, record: &Record) {
        let Some(process) = record.supervisor.filter(ProcessId::is_alive) else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(process.pid);
        // SIGKILL works on a stopped process too.
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        for _ in 0..250 {
            if !process.is_alive() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Takes over records whose supervisor is gone. Any client may do this; the state
    /// transition makes sure only one cleans up. What happens depends on what is at stake:
    /// - a task whose result is on disk (its supervisor died after saving) ends as saved;
    /// - a task whose work is not saved becomes `unsaved`: its processes and cgroups go, its
    ///   writable layer stays for `task finish` to recover;
    /// - a raw sandbox, or a task that never finished starting, is `lost` and removed.
    pub fn reconcile(&self, catalog: &Catalog) -> Result<()> {
        let now = chrono::Utc::now();
        for record in catalog.list()? {
            if record.kind == Kind::Raw
                && record.state == State::Destroyed
                && !supervisor_alive(&record)
            {
                // Destroyed, and its supervisor died before the teardown after its reply was
                // done: finish that teardown.
                remove_leftovers(&self.home, &record.id, &record.backend, Keep::Nothing)?;
                catalog.delete(&record.id)?;
                continue;
            }
            if !record.state.is_live() {
                continue;
            }
            let dead = match record.supervisor {
                Some(process) => !process.is_alive(),
                None => now - record.created_at > STARTING_GRACE,
            };
            if dead {
                self.take_over(catalog, &record)?;
            }
        }
        Ok(())
    }

    /// [`Engine::reconcile`] for a command that only reads (`ls`, `ps`, a task's record or
    /// diff). A take-over is recorded on the home's filesystem; when that is full the record
    /// cannot change, and the command still answers rather than failing on a write it did
    /// not need: it shows the records as they are, each one whose supervisor is gone with a
    /// note saying so (see [`Deferred::annotate`]). The first command after room is freed
    /// records the take-over.
    pub(crate) fn reconcile_for_reading(&self, catalog: &Catalog) -> Result<Deferred> {
        match self.reconcile(catalog) {
            Ok(()) => Ok(Deferred(None)),
            Err(err) if crate::host::disk_room::is_full(self.home.root()) => {
                tracing::warn!(target: LOG_TARGET, "taking over a sandbox left for later: {}", err.message);
                Ok(Deferred(Some(self.home.root().to_owned())))
            }
            Err(err) => Err(err),
        }
    }

    fn take_over(&self, catalog: &Catalog, record: &Record) -> Result<()> {
        // Its host helpers (git packing the history) do not die with it by themselves.
        if let Some(process) = record.supervisor {
            crate::host::host_children::kill_session(process);
        }
        if record.state.is_pool() {
            // Nobody's sandbox yet: nothing to report, only to clean.
            remove_leftovers(&self.home, &record.id, &record.backend, Keep::Nothing)?;
            return catalog.delete(&record.id);
        }
        let pid = match record.supervisor {
            Some(p) => format!("its supervisor (pid {})", p.pid),
            None => "its supervisor, which never started,".to_owned(),
        };
        let results = crate::supervisor::save::ResultFiles::new(
            crate::supervisor::finish::results_dir(self.home.root(), &record.id),
        );
        if record.kind == Kind::Task && record.state != State::Starting {
            if let Some(result) = results.saved_result() {
                // Saved, then killed before recording it: the result on disk is the truth.
                let mut detail = TaskDetail::from_json(record.detail.as_deref())?;
                detail.result = Some(result.clone());
                if catalog.transition(&record.id, record.state, result.state, None)? {
                    catalog.set_detail(&record.id, &detail.to_json())?;
                    self.clean_up_after_take_over(catalog, record, Keep::Nothing, None)?;
                }
                return Ok(());
            }
            let note = format!(
                "{pid} died before the task's work was saved; its files are kept: finish the task to recover them"
            );
            if catalog.transition(&record.id, record.state, State::Unsaved, Some(&note))? {
                self.clean_up_after_take_over(catalog, record, Keep::Layer, Some(&note))?;
            }
            return Ok(());
        }
        let note = format!("{pid} died without cleaning up; the guest was removed");
        if catalog.transition(&record.id, record.state, State::Lost, Some(&note))? {
            self.clean_up_after_take_over(catalog, record, Keep::Nothing, Some(&note))?;
        }
        Ok(())
    }

    /// Removes what a dead supervisor left, once its record has moved on. A failure goes into
    /// the record's note, after `note`, instead of failing the command that noticed the death:
    /// that command may concern another sandbox entirely, and the record is no longer live,
    /// so nothing else would ever tell the user. Removing it tries again.
    fn clean_up_after_take_over(
        &self,
        catalog: &Catalog,
        record: &Record,
        keep: Keep,
        note: Option<&str>,
    ) -> Result<()> {
        let removed = crate::foundation::failpoint::hit("take-over.clean-up")
            .and_then(|()| remove_leftovers(&self.home, &record.id, &record.backend, keep));
        let Err(err) = removed else {
            return Ok(());
        };
        tracing::warn!(target: LOG_TARGET, "cleaning up after {}: {}", record.id, err.message);
        let failed = format!(
            "cleaning up what it left failed ({}); removing it (destroy, or rm --purge for a \
             task) tries again",
            err.message
        );
        let note = match note {
            Some(note) => format!("{note}; {failed}"),
            None => failed,
        };
        catalog.set_note(&record.id, Some(&note))
    }
}

/// The nice value of a warm-pool boot (the lowest priority).
pub const BACKGROUND_NICE: libc::c_int = 19;

/// Descriptor number on which a supervisor finds its ready pipe.
pub const SUPERVISOR_READY_FD: i32 = 3;

/// What a new supervisor inherits beyond stdio and the ready pipe: nothing else of ours.
#[derive(Default, Clone, Copy)]
pub(crate) struct Handed<'a> {
    /// A task's checked project directory, as [`SUPERVISOR_PROJECT_FD`] (told so by
    /// [`PROJECT_FD_ENV`]).
    pub project: Option<BorrowedFd<'a>>,
    /// The read end of a pipe holding a clone's credentials, as [`SUPERVISOR_CREDENTIALS_FD`]
    /// (told so by [`CREDENTIALS_FD_ENV`]). Only a spawned supervisor can take it.
    pub credentials: Option<BorrowedFd<'a>>,
}

impl Handed<'_> {
    fn is_empty(&self) -> bool {
        self.project.is_none() && self.credentials.is_none()
    }
}

/// How a sandbox's supervisor starts.
pub(crate) enum Via<'a> {
    /// A new `dynocap supervise` process, inheriting what is handed to it.
    Spawn(Handed<'a>),
    /// The engine's standby, which falls back to a spawn if it is gone.
    Standby(crate::facade::standby::Standby),
}

/// Take-overs a reading command could not record because the home's filesystem (the path
/// held) is full (see [`Engine::reconcile_for_reading`]).
pub(crate) struct Deferred(Option<std::path::PathBuf>);

impl Deferred {
    /// Notes on a live record whose supervisor is gone that its end is not recorded yet, and
    /// why: what the listing shows instead of a failure.
    pub(crate) fn annotate(&self, record: &mut Record) {
        if record.state.is_live() && !supervisor_alive(record) {
            if let Some(note) = self.note() {
                record.note = Some(note);
            }
        }
    }

    /// Why a take-over waits, if one does.
    fn note(&self) -> Option<String> {
        self.0.as_ref().map(|home| {
            format!(
                "its supervisor is gone, and recording that needs room on the disk holding {}, \
                 which is full; free space there and try again",
                home.display()
            )
        })
    }
}

fn supervisor_alive(record: &Record) -> bool {
    record.supervisor.is_some_and(|p| p.is_alive())
}

/// Why a sandbox or task that is not running cannot take a request, and what to do instead.
fn not_running(s: &Words, name: &str, kind: Kind, state: State) -> String {
    match (kind, state) {
        (Kind::Task, State::Unsaved) => format!(
            "task \"{name}\" is unsaved: its guest ended before its work could be saved, and its \
             files are kept; {} recovers its work",
            s.op(Op::TaskFinish, name)
        ),
        (Kind::Task, State::Recovering) => {
            format!("task \"{name}\" is being recovered; wait for that finish to complete")
        }
        (Kind::Task, State::Ending) => format!(
            "task \"{name}\" is ending (its TTL ran out, or it is being finished or removed) and \
             runs nothing more; its work is being saved. {} waits for it and shows the saved \
             patch, {} its result",
            s.op(Op::TaskDiff, name),
            s.op(Op::TaskFinish, name)
        ),
        (Kind::Raw, State::Ending) => format!(
            "sandbox \"{name}\" is ending (its TTL ran out, or it is being destroyed) and runs \
             nothing more; start a new one with {}",
            s.op(Op::Run, name)
        ),
        (Kind::Task, State::Finished | State::Expired | State::Destroyed) => format!(
            "task \"{name}\" is {}: its guest is gone and its work is saved. See the saved \
             patch with {} (or {}); to keep working, start a new task with {}",
            state.as_str(),
            s.op(Op::TaskDiff, name),
            s.op(Op::TaskFinish, name),
            s.op(Op::TaskStart, name)
        ),
        (Kind::Task, _) => format!(
            "task \"{name}\" is {}, not running; start a new task with {}",
            state.as_str(),
            s.op(Op::TaskStart, name)
        ),
        (Kind::Raw, _) => format!(
            "sandbox \"{name}\" is {}, not running; destroy it with {} and start a new one with {}",
            state.as_str(),
            s.op(Op::Destroy, name),
            s.op(Op::Run, name)
        ),
    }
}

/// Whether a raw sandbox's record is one `ps` and `ls` show: not a destroyed one (it only
/// waits for its supervisor to finish the teardown after the destroy answered), nor the warm
/// pool's (nobody's yet).
pub(crate) fn is_listed(record: &Record) -> bool {
    record.state != State::Destroyed && !record.state.is_pool()
}

/// The record bound to `name` (or with that id). A name that matches nothing is answered with
/// the closest name in use, or the names in use: the message serves the CLI and MCP alike, so
/// it names no command.
pub(crate) fn find(catalog: &Catalog, name: &str) -> Result<Record> {
    if let Some(record) = catalog.find(name)? {
        return Ok(record);
    }
    let names: Vec<String> = catalog.list()?.into_iter().filter_map(|r| r.name).collect();
    let hint = match closest(name, &names) {
        Some(near) => format!("; did you mean \"{near}\"?"),
        None if names.is_empty() => "; there are none".to_owned(),
        None if names.len() <= 10 => format!("; the names in use are {}", names.join(", ")),
        None => format!(
            "; {} names are in use, among them {}",
            names.len(),
            names[..10].join(", ")
        ),
    };
    Err(Error::not_found(format!(
        "no sandbox or task named \"{name}\"{hint}"
    )))
}

/// The name in `names` nearest to `typed` by edit distance, if it is near enough to be a typo
/// (at most one edit per three characters, and at least one).
fn closest<'a>(typed: &str, names: &'a [String]) -> Option<&'a str> {
    let allowed = (typed.chars().count() / 3).max(1);
    names
        .iter()
        .map(|name| (edit_distance(typed, name), name))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name.as_str())
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

pub(crate) fn unexpected(reply: &ControlReply) -> Error {
    SupervisorFailure::UnexpectedReply(format!("{reply:?}")).into()
}

/// What failed between the engine and a sandbox's supervisor process.
#[derive(Debug, thiserror::Error)]
enum SupervisorFailure {
    /// `tail` is the log's last lines, each on a line of its own (see `log_tail`).
    #[error(
        "the supervisor exited before the sandbox was ready; see {}{tail}",
        .log.display()
    )]
    ExitedBeforeReady { log: PathBuf, tail: String },
    #[error("starting the supervisor {}: {source}", .exe.display())]
    Start {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the supervisor of \"{display}\" did not answer within {}s; it may be overloaded or \
         wedged: destroy or remove the sandbox to end it",
        .deadline.as_secs()
    )]
    NoAnswer { display: String, deadline: Duration },
    #[error("the supervisor of \"{display}\" closed the connection without replying")]
    NoReply { display: String },
    #[error("cannot reach the supervisor of \"{display}\" at {}: {source}", .socket.display())]
    Unreachable {
        display: String,
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The reply as `{:?}` shows it: a reply the request does not expect is a bug.
    #[error("unexpected reply from the supervisor: {0}")]
    UnexpectedReply(String),
    #[error(
        "the supervisor of \"{display}\" (pid {pid}) died while handling the request; see its \
         log in the logs directory of DYNOCAP_HOME"
    )]
    Died { display: String, pid: i32 },
    #[error(
        "the supervisor of \"{display}\" (pid {pid}) is stopped (SIGSTOP or a debugger) and \
         cannot answer; continue it (kill -CONT {pid}) or destroy or remove the sandbox to end it"
    )]
    Stopped { display: String, pid: i32 },
}

impl Coded for SupervisorFailure {
    /// A supervisor that fails to start, answer or live is DynoCap's or the machine's
    /// problem; what the caller can do about it (destroy, remove) the message says.
    fn code(&self) -> ErrorCode {
        match self {
            Self::ExitedBeforeReady { .. }
            | Self::Start { .. }
            | Self::NoAnswer { .. }
            | Self::NoReply { .. }
            | Self::Unreachable { .. }
            | Self::UnexpectedReply(_)
            | Self::Died { .. }
            | Self::Stopped { .. } => ErrorCode::Internal,
        }
    }
}

/// `PREFIX-` plus 12 random lowercase alphanumerics.
pub fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let suffix: String = (0..12)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{prefix}-{suffix}")
}

/// Reads the supervisor's ready pipe: progress lines, then the final word (or EOF).
async fn read_ready(
    fd: OwnedFd,
    progress: &(dyn Fn(Progress) + Send + Sync),
) -> std::io::Result<Option<ReadyMessage>> {
    let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?;
    let mut reader = BufReader::new(receiver);
    loop {
        match read_message::<ReadyMessage, _>(&mut reader).await {
            Ok(Some(ReadyMessage::Progress(p))) => progress(p),
            Ok(message) => return Ok(message),
            Err(err) => return Err(std::io::Error::other(err.to_string())),
        }
    }
}

/// Undoes a start that did not complete: kills the supervisor (its guest dies with it),
/// removes leftovers and the record. Runs on failure and when the start future is dropped.
struct StartGuard {
    home: Home,
    id: String,
    /// The backend the sandbox was being started on: its leftovers are that backend's.
    backend: String,
    armed: bool,
}

/// Kills a half-made sandbox's supervisor and waits up to a second for it to be gone: the
/// guest's init dies with its parent, and the cleanup after this must find it gone.
pub(crate) fn kill_supervisor(process: ProcessId) {
    let pid = nix::unistd::Pid::from_raw(process.pid);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    for _ in 0..50 {
        if !process.is_alive() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(catalog) = Catalog::open(&self.home) else {
            return;
        };
        if let Ok(Some(record)) = catalog.get(&self.id) {
            if let Some(process) = record.supervisor.filter(ProcessId::is_alive) {
                kill_supervisor(process);
            }
            // Its host helpers (git packing the history) do not die with it by themselves.
            if let Some(process) = record.supervisor {
                crate::host::host_children::kill_session(process);
            }
        }
        let _ = remove_leftovers(&self.home, &self.id, &self.backend, Keep::Nothing);
        let _ = std::fs::remove_dir_all(crate::supervisor::finish::results_dir(
            self.home.root(),
            &self.id,
        ));
        let _ = catalog.delete(&self.id);
    }
}

/// Receives streamed exec output: which stream, and the bytes exactly as the guest wrote them.
pub type OnOutput<'a> = &'a (dyn Fn(OutputChannel, &[u8]) + Send + Sync);

/// What a caller does with the lines a supervisor sends before its reply.
#[derive(Clone, Copy, Default)]
pub(crate) struct Interim<'a> {
    pub progress: Option<&'a (dyn Fn(Progress) + Send + Sync)>,
    pub output: Option<OnOutput<'a>>,
}

/// How long a supervisor may take to answer `request`. Long requests (a command, a diff, a
/// finish) are watched on the supervisor's side too (the agent must keep answering pings), so
/// this only catches a supervisor that is wedged itself.
fn reply_deadline(request: &ControlRequest) -> Duration {
    match request {
        ControlRequest::Ping | ControlRequest::Claim(_) => Duration::from_secs(30),
        // An edit rewrites at most a few MiB: minutes only on a slow emulated guest.
        ControlRequest::File { .. } => Duration::from_secs(300),
        ControlRequest::Exec { spec } => {
            Duration::from_secs(spec.timeout_seconds)
                + Duration::from_millis(crate::model::spec::EXEC_KILL_GRACE_MS)
                + Duration::from_secs(60)
        }
        ControlRequest::Diff | ControlRequest::Destroy | ControlRequest::Finish { .. } => {
            Duration::from_secs(3600)
        }
        // A copy of what the guest wrote: gigabytes at disk speed.
        ControlRequest::Checkpoint { .. }
        | ControlRequest::DeleteCheckpoint { .. }
        | ControlRequest::Restore { .. }
        | ControlRequest::SeedFork { .. }
        | ControlRequest::SeedLiveFork { .. } => Duration::from_secs(1800),
        ControlRequest::Checkpoints => Duration::from_secs(30),
        ControlRequest::StartJob { wait_ms, .. } => {
            Duration::from_millis(*wait_ms) + Duration::from_secs(60)
        }
        ControlRequest::Job(query) => {
            Duration::from_millis(query.wait_ms) + Duration::from_secs(60)
        }
        ControlRequest::Jobs
        | ControlRequest::Forward(_)
        | ControlRequest::Unforward { .. }
        | ControlRequest::Forwards => Duration::from_secs(30),
    }
}

/// Resolves (with the reason) once the supervisor of `record` has died, or has been stopped
/// (SIGSTOP, a debugger) for a few seconds in a row: either way no answer is coming.
async fn watch_supervisor(record: &Record, display: &str) -> Error {
    const POLL: Duration = Duration::from_millis(250);
    const STOPPED_FOR: u32 = 12; // polls: 3 s
    let Some(process) = record.supervisor else {
        return std::future::pending().await;
    };
    let mut stopped = 0;
    loop {
        tokio::time::sleep(POLL).await;
        match process.run_state() {
            None => {
                return SupervisorFailure::Died {
                    display: display.to_owned(),
                    pid: process.pid,
                }
                .into()
            }
            Some('T' | 't') => {
                stopped += 1;
                if stopped >= STOPPED_FOR {
                    return SupervisorFailure::Stopped {
                        display: display.to_owned(),
                        pid: process.pid,
                    }
                    .into();
                }
            }
            Some(_) => stopped = 0,
        }
    }
}

/// The last lines of a log, to make a failed start self-explanatory.
fn log_tail(path: &std::path::Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    format!(":\n{}", tail.join("\n"))
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn typos_find_their_name_and_strangers_do_not() {
        let names = vec!["fix-bug".to_owned(), "web".to_owned(), "web2".to_owned()];
        assert_eq!(closest("fix-bgu", &names), Some("fix-bug"));
        assert_eq!(
            closest("wbe", &names),
            None,
            "two edits in three letters is not a typo"
        );
        assert!(matches!(closest("web3", &names), Some("web" | "web2")));
        assert_eq!(closest("database", &names), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
