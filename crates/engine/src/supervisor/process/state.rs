//! What the supervisor's parts share: the ready pipe and its messages, a task's context, the
//! serving loop's shared state and end requests, and the constants they agree on.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dynocap_review::patch::{self, DEFAULT_MAX_PATCH_BYTES};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use crate::backend::{Guest, LayerSync};
use crate::foundation::error::{Context, Error, Result};
use crate::host::home::Home;
use crate::model::sandbox_info::rfc3339;
use crate::model::spec::ExecSpec;
use crate::model::task_spec::{DiffResult, FinishResult, Progress, SourceInfo};
use crate::store::catalog::Record;
use crate::supervisor::agent_conn::AgentConn;
use crate::supervisor::control::Claim;
use crate::supervisor::egress::Egress;
use crate::supervisor::exec::ExecResult;
use crate::supervisor::finish;
use crate::supervisor::oom::OomWatch;
use crate::supervisor::save::ResultFiles;
use crate::supervisor::starter_watch::StarterWatch;
use crate::supervisor::workspace::{self, BaselineIndex, BASELINE_TAR};

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
pub(super) const LOG_TARGET: &str = "dynocap_engine::supervisor";

/// How long the agent may take to say hello after the guest starts.
pub(super) const AGENT_HELLO_TIMEOUT: Duration = Duration::from_secs(60);

/// Every egress decision of a sandbox, one JSON line each.
pub const NETWORK_LOG: &str = "network.jsonl";

/// Output kept per stream in a task's exec log: its head and tail, as an MCP caller gets it.
pub(super) const LOG_OUTPUT_BYTES: usize = 32 * 1024;

/// Pieces of streamed exec output (each at most 64 KiB) held for a client that reads slowly
/// before the command is made to wait: 4 MiB per streaming exec.
pub(super) const STREAM_QUEUE_CHUNKS: usize = 64;

/// How long requests still being served may take to answer once the sandbox has ended.
pub(super) const DRAIN_CLIENTS: Duration = Duration::from_secs(10);

/// How often the supervisor checks that its control socket is still where clients look for
/// it: once it is gone (the home deleted), nobody can reach the sandbox, and it ends.
pub(super) const REACHABLE_CHECK_EVERY: Duration = Duration::from_secs(2);

/// What the supervisor tells its starter on the ready pipe: JSON lines, progress first.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReadyMessage {
    Progress(Progress),
    Ready,
    Failed(Error),
    /// A recovery ([`Mode::Recover`]) saved the task's work: its result.
    Finished(Box<FinishResult>),
}

/// The write end of the ready pipe; closed after the final message.
pub(super) struct ReadyPipe(pub(super) Mutex<Option<std::fs::File>>);

impl ReadyPipe {
    /// A watch on the starter at the other end, while the pipe is open and can be watched.
    pub(super) fn watch(&self) -> Option<StarterWatch> {
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

    pub(super) fn send(&self, message: &ReadyMessage) {
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
pub(super) struct TaskContext {
    pub(super) id: String,
    pub(super) name: Option<String>,
    pub(super) created_at: String,
    pub(super) files: ResultFiles,
    pub(super) state_dir: PathBuf,
    /// What was imported, once the import is done (kept for `summary.json`).
    pub(super) source: Option<SourceInfo>,
    pub(super) exec_log: Mutex<std::fs::File>,
    pub(super) baseline: OnceLock<Arc<BaselineIndex>>,
    /// The task's egress proxy, when it has one: its summary goes into the result.
    pub(super) egress: Option<Arc<Egress>>,
    /// What one file's line diff may take in the guest ([`workspace::line_diff_budget`]): the
    /// same for every diff of the task, so `task diff` shows what `task finish` saves.
    pub(super) line_diff_budget: u64,
    /// A finish asked to keep the generated files in the patch (`--include-generated`).
    pub(super) include_generated: std::sync::atomic::AtomicBool,
}

impl TaskContext {
    /// Opens the task's results directory (created if needed) and its exec log.
    pub(super) fn open(home: &Home, record: &Record, source: Option<SourceInfo>) -> Result<Self> {
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
            include_generated: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub(super) fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

/// How connection handlers hand the main loop what only it may do (it owns the guest).
#[derive(Clone)]
pub(super) struct MainLoop {
    pub(super) end: mpsc::Sender<(EndRequest, OwnedWriteHalf)>,
    pub(super) claim: mpsc::Sender<(Claim, OwnedWriteHalf)>,
    /// A connection of the supervisor's own, to serve as a client's (a job's exec).
    pub(super) connect: mpsc::Sender<tokio::net::UnixStream>,
    /// The guest saved for a live fork (see `live_fork`).
    pub(super) live: mpsc::Sender<super::live_fork::LiveSave>,
}

/// Requests that end the sandbox; the main loop handles them after leaving its select.
pub(super) enum EndRequest {
    Destroy,
    Finish,
    /// A task's restore to this checkpoint (see `checkpoints`).
    Restore(String),
}

/// What the connection handlers share with the main loop.
pub(super) struct Shared {
    pub(super) conn: AgentConn,
    pub(super) task: Option<TaskContext>,
    pub(super) oom: OomWatch,
    /// Set once the sandbox is ending: what an interrupted command is told.
    pub(super) ending: OnceLock<String>,
    /// Set once a `nat` sandbox's network ended for good (see [`NetworkWatch`]): what every
    /// command is told from then on.
    pub(super) network_lost: OnceLock<String>,
    /// Who syncs the sandbox's disk after every command, and reads its health.
    pub(super) layer_sync: LayerSync,
    /// The guest's disk as layers a checkpoint or fork freezes (the vm's); `None`: they copy
    /// the disk through [`LayerSync::HostMount`] (the jail's).
    pub(super) layered_disk: Option<Arc<dyn crate::backend::LayeredDisk>>,
    /// The home, whose activity marker every request touches ([`crate::host::activity`]).
    pub(super) home: Home,
    /// The sandbox's id, for its record.
    pub(super) id: String,
    /// Set once the sandbox's disk failed: what went wrong (see [`check_disk`]).
    pub(super) disk_failed: OnceLock<String>,
    /// The sandbox's egress proxy, when it has one: each command's result lists the
    /// connections it refused while the command ran.
    pub(super) egress: Option<Arc<Egress>>,
    /// Commands that outlive the call that started them.
    pub(super) jobs: crate::supervisor::jobs::Jobs,
    /// Commands being served now, a job's included: each `Exec` request from its start to its
    /// answer ([`ServingExec`]). A restore counts the commands it ends from it, not from the
    /// connections open (an idle one, a job query, the restore's own are none).
    pub(super) execs: std::sync::atomic::AtomicUsize,
    /// Host listeners carried to guest ports; closed when the sandbox ends.
    pub(super) forwards: crate::supervisor::ports::Forwards,
    /// What the sandbox's image's config asks of every command (its `Env`, `WorkingDir`).
    pub(super) image_run: crate::image::run_config::RunConfig,
}

/// One command served, counted in [`Shared::execs`] while it lives.
pub(super) struct ServingExec<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> ServingExec<'a> {
    pub(super) fn begin(execs: &'a std::sync::atomic::AtomicUsize) -> Self {
        execs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(execs)
    }
}

impl Drop for ServingExec<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Shared {
    /// `spec` as it runs here: with the image's `Env` and, in a raw sandbox, its `WorkingDir`.
    /// Applying it twice changes nothing more (a job's command is applied when the job is
    /// recorded and again when its exec is served).
    pub(super) fn with_image_config(
        &self,
        spec: crate::model::spec::ExecSpec,
    ) -> crate::foundation::error::Result<crate::model::spec::ExecSpec> {
        self.image_run
            .apply(spec, self.task.is_none(), self.egress.is_some())
    }
}

/// A started sandbox, its agent answering: what [`serve`] serves with.
pub(super) struct Started {
    pub(super) guest: Box<dyn Guest>,
    pub(super) conn: AgentConn,
    pub(super) listener: UnixListener,
    pub(super) task: Option<TaskContext>,
    pub(super) egress: Option<Arc<Egress>>,
}

impl TaskContext {
    pub(super) async fn diff(&self, conn: &AgentConn) -> Result<DiffResult> {
        let baseline = self.baseline();
        // Generated files are summarised, not shown: as `finish` leaves them out.
        let (patch, generated) = workspace::diff(conn, self.line_diff_budget, &*baseline).await?;
        let summary = patch::summarize(&patch, DEFAULT_MAX_PATCH_BYTES, &|path| baseline.get(path))
            .map_err(|err| {
                Error::invalid(format!("the patch from the sandbox was refused: {err}"))
            })?;
        Ok(DiffResult {
            summary,
            patch: String::from_utf8_lossy(&patch).into_owned(),
            generated,
        })
    }

    /// The host's index of the baseline copy, loaded once.
    pub(super) fn baseline(&self) -> Arc<BaselineIndex> {
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

    /// Appends one JSON line to `exec.jsonl` (a file operation's, see `files`).
    pub(super) fn log_line(&self, entry: &serde_json::Value) {
        let mut file = self
            .exec_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(err) = writeln!(file, "{entry}") {
            tracing::error!(target: LOG_TARGET, "writing the exec log: {err}");
        }
    }

    /// Appends one line to `exec.jsonl`. Output keeps its head and tail (32 KiB per stream):
    /// the log says what ran and how it ended; the caller already got the output.
    pub(super) fn log_exec(
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
