//! The supervisor: one process per sandbox (`dynocap supervise`), detached from whoever
//! started it. It boots the guest, imports a task's project, holds the agent channel, serves
//! the control socket, enforces the TTL and tears everything down at the end — for a task,
//! after saving its patch and logs, so a timer never loses the agent's work. Its death kills
//! the guest (the guest's init has a parent-death signal and exits when the channel closes).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{unix::AsyncFd, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::agent_conn::AgentConn;
use crate::backend::{self, BootSpec, Guest};
use crate::catalog::{Catalog, Kind, ProcessId, Record, State};
use crate::control::{read_message, write_message, ControlReply, ControlRequest};
use crate::error::{Context, Error, Result};
use crate::exec::ExecResult;
use crate::home::Home;
use crate::patch::{self, DEFAULT_MAX_PATCH_BYTES};
use crate::sandboxes::rfc3339;
use crate::spec::ExecSpec;
use crate::task_spec::{DiffResult, FinishResult, Progress, Source, SourceInfo, TaskDetail};
use crate::workspace::{self, BaselineIndex, BASELINE_TAR};
use crate::{exec, finish, image, spec};

/// How long the agent may take to say hello after the guest starts.
const AGENT_HELLO_TIMEOUT: Duration = Duration::from_secs(60);
/// Output kept per stream in a task's exec log (the caller got up to 1 MiB).
const LOG_OUTPUT_BYTES: usize = 16 * 1024;

/// What the supervisor tells its starter on the ready pipe: JSON lines, progress first.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReadyMessage {
    Progress(Progress),
    Ready,
    Failed(Error),
}

/// Entry point of `dynocap supervise`. Must run before any other thread exists: the jail
/// backend forks a child that runs Rust code. Returns the process exit code.
pub fn main(home: Home, id: &str, ready: OwnedFd) -> i32 {
    let ready = ReadyPipe(Mutex::new(Some(std::fs::File::from(ready))));
    log(&format!(
        "supervisor for {id} starting (pid {})",
        std::process::id()
    ));
    let (catalog, record, guest) = match boot(&home, id) {
        Ok(parts) => parts,
        Err(err) => {
            log(&format!("boot failed: {err}"));
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
            ready.send(&ReadyMessage::Failed(Error::internal(format!(
                "starting the runtime: {err}"
            ))));
            let _ = guest.destroy();
            return 1;
        }
    };
    let code = runtime.block_on(serve(home, catalog, record, guest, ready));
    log("supervisor exiting");
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
            Ok(_) => log(&format!(
                "guest: {}",
                crate::exec::sanitize_line(String::from_utf8_lossy(&line).trim_end(), 4096)
            )),
        }
    }
}

fn boot(home: &Home, id: &str) -> Result<(Catalog, Record, Box<dyn Guest>)> {
    let catalog = Catalog::open(home)?;
    let record = catalog
        .get(id)?
        .ok_or_else(|| Error::not_found(format!("no sandbox record {id} to supervise")))?;
    if record.state != State::Starting {
        return Err(Error::conflict(format!(
            "sandbox {id} is {}, not starting",
            record.state.as_str()
        )));
    }
    if let Some(me) = ProcessId::of(i32::try_from(std::process::id()).unwrap_or(i32::MAX)) {
        catalog.set_supervisor(id, me)?;
    }
    let backend = backend::select()?;
    let image = image::host_image(&home.images_dir())?;
    let state_dir = home.sandbox_dir(id);
    std::fs::create_dir_all(&state_dir)
        .context(format_args!("creating {}", state_dir.display()))?;
    let spec = BootSpec {
        id: id.to_owned(),
        hostname: record.name.clone().unwrap_or_else(|| id.to_owned()),
        image,
        state_dir,
        agent_binary: agent_binary()?,
        cpus: record.cpus,
        memory_mb: record.memory_mb,
        pids: spec::PIDS_LIMIT,
    };
    let (guest, guest_output) = boot_with_piped_output(backend.as_ref(), &spec)?;
    log(&format!(
        "guest booted on {} backend, init pid {}",
        backend.name(),
        guest.pid()
    ));
    std::thread::Builder::new()
        .name("guest-log".into())
        .spawn(move || relay_guest_output(guest_output))
        .context("starting the guest log relay")?;
    // The agent must survive the guest's own OOM kills (the agent resets its children to 0).
    // Lowering the score needs host privileges; unprivileged users keep the default.
    let _ = std::fs::write(format!("/proc/{}/oom_score_adj", guest.pid()), "-1000");
    Ok((catalog, record, guest))
}

/// The agent binary: `DYNOCAP_AGENT`, else `dynocap-agent` beside this executable.
pub fn agent_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("DYNOCAP_AGENT").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(Error::internal(format!(
            "DYNOCAP_AGENT={} is not a file; point it at a dynocap-agent binary or unset it",
            path.display()
        )));
    }
    let exe = std::env::current_exe().context("locating the dynocap executable")?;
    let agent = exe.with_file_name("dynocap-agent");
    if agent.is_file() {
        Ok(agent)
    } else {
        Err(Error::internal(format!(
            "the guest agent {} is missing; install dynocap-agent next to dynocap or set DYNOCAP_AGENT",
            agent.display()
        )))
    }
}

/// The write end of the ready pipe; closed after the final message.
struct ReadyPipe(Mutex<Option<std::fs::File>>);

impl ReadyPipe {
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
    results_dir: PathBuf,
    state_dir: PathBuf,
    exec_log: Mutex<std::fs::File>,
    baseline: OnceLock<BaselineIndex>,
    home: Home,
}

/// Why the supervisor stops.
enum Ending {
    Destroyed,
    Finished,
    Expired,
    GuestDied,
    Signalled,
}

/// Requests that end the sandbox; the main loop handles them after leaving its select.
enum EndRequest {
    Destroy,
    Finish,
}

async fn serve(
    home: Home,
    catalog: Catalog,
    record: Record,
    mut guest: Box<dyn Guest>,
    ready: ReadyPipe,
) -> i32 {
    let id = record.id.clone();
    let started = start(&home, &catalog, &record, guest.as_mut(), &ready).await;
    let (conn, listener, task) = match started {
        Ok(parts) => parts,
        Err(err) => {
            log(&format!("start failed: {err}"));
            ready.send(&ReadyMessage::Failed(err));
            let _ = tokio::task::spawn_blocking(move || guest.destroy()).await;
            let _ = std::fs::remove_dir_all(home.sandbox_dir(&id));
            return 1;
        }
    };
    ready.send(&ReadyMessage::Ready);

    let (end_tx, mut end_rx) = mpsc::channel::<(EndRequest, OwnedWriteHalf)>(16);
    let guest_exit = match AsyncFd::new(guest.exit_fd().as_raw_fd()) {
        Ok(fd) => fd,
        Err(err) => {
            log(&format!("cannot watch the guest: {err}"));
            let _ = guest.destroy();
            return 1;
        }
    };
    let until_expiry = (record.expires_at - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO);
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();

    let mut waiters: Vec<OwnedWriteHalf> = Vec::new();
    let ending = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let conn = conn.clone();
                let end_tx = end_tx.clone();
                let task = task.clone();
                tokio::spawn(async move { handle_client(stream, &conn, task.as_deref(), &end_tx).await });
            }
            Some((request, waiter)) = end_rx.recv() => {
                waiters.push(waiter);
                break match request {
                    EndRequest::Destroy => Ending::Destroyed,
                    EndRequest::Finish => Ending::Finished,
                };
            }
            () = tokio::time::sleep(until_expiry) => break Ending::Expired,
            _ = guest_exit.readable() => break Ending::GuestDied,
            _ = async { match sigterm.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => break Ending::Signalled,
        }
    };
    drop(guest_exit);
    drop(listener);
    let _ = std::fs::remove_file(home.control_socket(&id));

    let (state, note) = match ending {
        Ending::Destroyed => (State::Destroyed, None),
        Ending::Finished => (State::Finished, None),
        Ending::Expired => (
            State::Expired,
            Some(format!("expired after its TTL of {}s", record.ttl_seconds)),
        ),
        Ending::GuestDied => (
            State::Lost,
            Some("the guest's init exited unexpectedly; see the supervisor log".to_owned()),
        ),
        Ending::Signalled => (
            State::Destroyed,
            Some("the supervisor was asked to stop (SIGTERM)".to_owned()),
        ),
    };
    if let Some(note) = &note {
        log(note);
    }

    // A task that ends normally (finish, expiry, destroy) takes its final diff while the guest
    // still runs, so the agent's work is kept whatever ended it.
    let final_patch = match (&task, state) {
        (Some(_), State::Finished | State::Expired | State::Destroyed) => {
            Some(workspace::diff(&conn).await)
        }
        _ => None,
    };
    drop(conn);
    match tokio::task::spawn_blocking(move || guest.destroy()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => log(&format!("teardown: {err}")),
        Err(err) => log(&format!("teardown panicked: {err}")),
    }

    let reply = match (&task, final_patch) {
        (Some(task), Some(patch)) => {
            let finished = tokio::task::spawn_blocking({
                let task = task.clone();
                move || export_results(&task, state, patch)
            })
            .await
            .unwrap_or_else(|err| {
                Err(Error::internal(format!(
                    "exporting results panicked: {err}"
                )))
            });
            match finished {
                Ok(result) => ControlReply::Finished(result),
                Err(err) => {
                    log(&format!("exporting results: {err}"));
                    ControlReply::Error(err)
                }
            }
        }
        _ => ControlReply::Destroyed,
    };
    let _ = std::fs::remove_dir_all(home.sandbox_dir(&id));
    let recorded = match (record.kind, state) {
        // A raw sandbox that is gone releases its record and name; a lost one stays visible.
        (Kind::Raw, State::Destroyed | State::Expired) => catalog.delete(&id),
        _ => catalog.set_state(&id, state, note.as_deref()),
    };
    if let Err(err) = recorded {
        log(&format!("updating the catalog: {err}"));
    }
    for mut waiter in waiters {
        let _ = write_message(&mut waiter, &reply).await;
    }
    0
}

/// Connects to the agent, imports a task's project, opens the control socket and marks the
/// record running.
async fn start(
    home: &Home,
    catalog: &Catalog,
    record: &Record,
    guest: &mut dyn Guest,
    ready: &ReadyPipe,
) -> Result<(AgentConn, UnixListener, Option<Arc<TaskContext>>)> {
    let id = &record.id;
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
    log(&format!("agent {} ready", hello.agent_version));

    let task = if record.kind == Kind::Task {
        let mut detail = TaskDetail::from_json(record.detail.as_deref())?;
        let results_dir = finish::results_dir(home.root(), id);
        finish::create_results_dir(&results_dir)?;
        let exec_log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(results_dir.join(finish::EXEC_LOG_FILE))
            .context("creating the exec log")?;
        let state_dir = home.sandbox_dir(id);
        let source = match &detail.start.source {
            Source::ProjectPath(path) => {
                let report = |progress: Progress| ready.send(&ReadyMessage::Progress(progress));
                let imported = workspace::import(&conn, path, detail.start.history, &state_dir, &report).await?;
                for note in &imported.notes {
                    log(&format!("import note: {note}"));
                }
                SourceInfo {
                    project_path: Some(imported.root.display().to_string()),
                    repository_url: None,
                    history: imported.history,
                    files: imported.files,
                    bytes: imported.bytes,
                }
            }
            Source::RepositoryUrl(_) => {
                return Err(Error::internal(
                    "cloning a repositoryUrl needs the egress proxy, which is not available in this version of DynoCap; \
                     clone the repository on the host and pass its directory as projectPath",
                ))
            }
        };
        detail.source = Some(source);
        catalog.set_detail(id, &detail.to_json())?;
        Some(Arc::new(TaskContext {
            id: id.clone(),
            results_dir,
            state_dir,
            exec_log: Mutex::new(exec_log),
            baseline: OnceLock::new(),
            home: home.clone(),
        }))
    } else {
        None
    };

    let socket_path = home.control_socket(id);
    let _ = std::fs::remove_file(&socket_path);
    let listener = UnixListener::bind(&socket_path)
        .context(format_args!("listening on {}", socket_path.display()))?;
    if !catalog.transition(id, State::Starting, State::Running, None)? {
        return Err(Error::conflict(
            "the sandbox record changed while it was starting",
        ));
    }
    Ok((conn, listener, task))
}

/// Serves one control connection.
async fn handle_client(
    stream: UnixStream,
    conn: &AgentConn,
    task: Option<&TaskContext>,
    end: &mpsc::Sender<(EndRequest, OwnedWriteHalf)>,
) {
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
            let result = exec::run(conn, &spec, client_gone).await;
            if let Some(task) = task {
                task.log_exec(&spec, started_at, &result);
            }
            ControlReply::from_result(result, ControlReply::Exec)
        }
        ControlRequest::Diff => match task {
            Some(task) => ControlReply::from_result(task.diff(conn).await, ControlReply::Diff),
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
            let _ = end.send((kind, write)).await;
            return;
        }
    };
    let _ = write_message(&mut write, &reply).await;
}

impl TaskContext {
    async fn diff(&self, conn: &AgentConn) -> Result<DiffResult> {
        let patch = workspace::diff(conn).await?;
        let summary = self.summarize(&patch)?;
        Ok(DiffResult {
            summary,
            patch: String::from_utf8_lossy(&patch).into_owned(),
        })
    }

    fn summarize(&self, patch: &[u8]) -> Result<patch::DiffSummary> {
        let baseline = self.baseline.get_or_init(|| {
            BaselineIndex::load(&self.state_dir.join(BASELINE_TAR)).unwrap_or_else(|err| {
                log(&format!("reading the baseline copy: {err}"));
                BaselineIndex::default()
            })
        });
        patch::summarize(patch, DEFAULT_MAX_PATCH_BYTES, &|path| baseline.get(path))
            .map_err(|err| Error::invalid(format!("the patch from the sandbox was refused: {err}")))
    }

    /// Appends one line to `exec.jsonl`. Output is cut to a few KiB: the log says what ran,
    /// the caller already got the output.
    fn log_exec(
        &self,
        spec: &ExecSpec,
        started_at: chrono::DateTime<chrono::Utc>,
        result: &Result<ExecResult>,
    ) {
        let cut = |text: &Option<String>| {
            text.as_deref().map(|t| {
                let mut end = t.len().min(LOG_OUTPUT_BYTES);
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                t[..end].to_owned()
            })
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
            log(&format!("writing the exec log: {err}"));
        }
    }
}

/// Writes `patch.diff` and `summary.json`, verifies the patch and records the result.
fn export_results(
    task: &TaskContext,
    state: State,
    patch: Result<Vec<u8>>,
) -> Result<FinishResult> {
    let patch_path = task.results_dir.join(finish::PATCH_FILE);
    let (patch_bytes, diff_error) = match patch {
        Ok(bytes) => (bytes, None),
        Err(err) => (
            Vec::new(),
            Some(format!(
                "the final diff could not be taken: {}",
                err.message
            )),
        ),
    };
    std::fs::write(&patch_path, &patch_bytes)
        .context(format_args!("writing {}", patch_path.display()))?;
    let (summary, summary_error) = match task.summarize(&patch_bytes) {
        Ok(summary) => (summary, None),
        Err(err) => (
            patch::DiffSummary {
                files: 0,
                additions: 0,
                deletions: 0,
                sensitive_paths: Vec::new(),
            },
            Some(err.message),
        ),
    };
    let verify_error = match diff_error.or(summary_error) {
        Some(err) => Some(err),
        None => finish::verify(
            &task.state_dir.join(BASELINE_TAR),
            &patch_path,
            &task.state_dir.join("verify"),
        )
        .err(),
    };
    let catalog = Catalog::open(&task.home)?;
    let record = catalog
        .get(&task.id)?
        .ok_or_else(|| Error::internal("the task record vanished"))?;
    let result = FinishResult {
        id: task.id.clone(),
        name: record.name.clone(),
        state,
        verified: verify_error.is_none(),
        verify_error,
        patch_path: patch_path.display().to_string(),
        log_path: task
            .results_dir
            .join(finish::EXEC_LOG_FILE)
            .display()
            .to_string(),
        summary_path: task
            .results_dir
            .join(finish::SUMMARY_FILE)
            .display()
            .to_string(),
        files: summary.files,
        additions: summary.additions,
        deletions: summary.deletions,
        sensitive_paths: summary.sensitive_paths,
    };
    let mut detail = TaskDetail::from_json(record.detail.as_deref())?;
    detail.result = Some(result.clone());
    let summary_json = serde_json::json!({
        "task": result,
        "source": detail.source,
        "createdAt": rfc3339(record.created_at),
        "finishedAt": rfc3339(chrono::Utc::now()),
    });
    let summary_text =
        serde_json::to_string_pretty(&summary_json).context("encoding the summary")?;
    std::fs::write(&result.summary_path, summary_text).context("writing summary.json")?;
    catalog.set_detail(&task.id, &detail.to_json())?;
    Ok(result)
}

/// Supervisor log lines go to stderr, which the starter points at the sandbox's log file.
pub fn log(message: &str) {
    eprintln!(
        "{} {message}",
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
}
