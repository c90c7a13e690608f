//! The supervisor: one process per sandbox (`dynocap supervise`), detached from whoever
//! started it. It boots the guest, holds the agent channel, serves the control socket,
//! enforces the TTL and tears everything down at the end. Its death kills the guest (the
//! guest's init has a parent-death signal and exits when the agent channel closes).

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::{unix::AsyncFd, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};

use crate::agent_conn::AgentConn;
use crate::backend::{self, BootSpec, Guest};
use crate::catalog::{Catalog, Kind, ProcessId, State};
use crate::control::{read_message, write_message, ControlReply, ControlRequest};
use crate::error::{Context, Error, Result};
use crate::home::Home;
use crate::{exec, image, spec};

/// How long the agent may take to say hello after the guest starts.
const AGENT_HELLO_TIMEOUT: Duration = Duration::from_secs(60);

/// What the supervisor tells its starter on the ready pipe: one JSON line.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReadyMessage {
    Ready,
    Failed(Error),
}

/// Entry point of `dynocap supervise`. Must run before any other thread exists: the jail
/// backend forks a child that runs Rust code. Returns the process exit code.
pub fn main(home: Home, id: &str, ready: OwnedFd) -> i32 {
    let mut ready = std::fs::File::from(ready);
    log(&format!(
        "supervisor for {id} starting (pid {})",
        std::process::id()
    ));
    let booted = boot(&home, id);
    let (catalog, record, guest) = match booted {
        Ok(parts) => parts,
        Err(err) => {
            log(&format!("boot failed: {err}"));
            report(&mut ready, &ReadyMessage::Failed(err));
            return 1;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            report(
                &mut ready,
                &ReadyMessage::Failed(Error::internal(format!("starting the runtime: {err}"))),
            );
            let _ = guest.destroy();
            return 1;
        }
    };
    let code = runtime.block_on(serve(home, catalog, record, guest, ready));
    log("supervisor exiting");
    code
}

fn boot(home: &Home, id: &str) -> Result<(Catalog, crate::catalog::Record, Box<dyn Guest>)> {
    let catalog = Catalog::open(&home.catalog_path())?;
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
    let guest = backend.boot(&spec)?;
    log(&format!(
        "guest booted on {} backend, init pid {}",
        backend.name(),
        guest.pid()
    ));
    // The agent must survive the guest's own OOM kills (the agent resets its children to 0).
    // Lowering the score needs host privileges; unprivileged users keep the default.
    let _ = std::fs::write(format!("/proc/{}/oom_score_adj", guest.pid()), "-1000");
    Ok((catalog, record, guest))
}

/// The agent binary: `DYNOCAP_AGENT`, else `dynocap-agent` beside this executable.
pub fn agent_binary() -> Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("DYNOCAP_AGENT").filter(|v| !v.is_empty()) {
        return Ok(path.into());
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

/// Why the supervisor stops.
enum Ending {
    Destroyed,
    Expired,
    GuestDied,
    Signalled,
}

async fn serve(
    home: Home,
    catalog: Catalog,
    record: crate::catalog::Record,
    mut guest: Box<dyn Guest>,
    mut ready: std::fs::File,
) -> i32 {
    let id = record.id.clone();
    let started = async {
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
        let socket_path = home.control_socket(&id);
        let _ = std::fs::remove_file(&socket_path);
        let listener = UnixListener::bind(&socket_path)
            .context(format_args!("listening on {}", socket_path.display()))?;
        if !catalog.transition(&id, State::Starting, State::Running, None)? {
            return Err(Error::conflict(
                "the sandbox record changed while it was starting",
            ));
        }
        Ok::<_, Error>((conn, listener))
    }
    .await;
    let (conn, listener) = match started {
        Ok(parts) => parts,
        Err(err) => {
            log(&format!("start failed: {err}"));
            report(&mut ready, &ReadyMessage::Failed(err));
            let _ = guest.destroy();
            return 1;
        }
    };
    report(&mut ready, &ReadyMessage::Ready);
    drop(ready);

    // Connections that asked for destroy; they get their reply once teardown is complete.
    let (destroy_tx, mut destroy_rx) = tokio::sync::mpsc::channel::<OwnedWriteHalf>(16);
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

    let mut waiting_for_destroy: Vec<OwnedWriteHalf> = Vec::new();
    let ending = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let conn = conn.clone();
                let destroy_tx = destroy_tx.clone();
                tokio::spawn(async move { handle_client(stream, &conn, &destroy_tx).await });
            }
            Some(waiter) = destroy_rx.recv() => {
                waiting_for_destroy.push(waiter);
                break Ending::Destroyed;
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
    let torn_down = tokio::task::spawn_blocking(move || guest.destroy()).await;
    match torn_down {
        Ok(Ok(())) => {}
        Ok(Err(err)) => log(&format!("teardown: {err}")),
        Err(err) => log(&format!("teardown panicked: {err}")),
    }
    let _ = std::fs::remove_dir_all(home.sandbox_dir(&id));
    let recorded = match (record.kind, state) {
        // A raw sandbox that is gone releases its record and name; a lost one stays visible.
        (Kind::Raw, State::Destroyed | State::Expired) => catalog.delete(&id),
        _ => catalog.set_state(&id, state, note.as_deref()),
    };
    if let Err(err) = recorded {
        log(&format!("updating the catalog: {err}"));
    }
    for mut stream in waiting_for_destroy {
        let _ = write_message(&mut stream, &ControlReply::Destroyed).await;
    }
    0
}

/// Serves one control connection.
async fn handle_client(
    stream: UnixStream,
    conn: &AgentConn,
    destroy: &tokio::sync::mpsc::Sender<OwnedWriteHalf>,
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
            ControlReply::from_result(
                exec::run(conn, &spec, client_gone).await,
                ControlReply::Exec,
            )
        }
        ControlRequest::Destroy => {
            // The main loop replies once teardown is complete.
            let _ = destroy.send(write).await;
            return;
        }
    };
    let _ = write_message(&mut write, &reply).await;
}

fn report(ready: &mut std::fs::File, message: &ReadyMessage) {
    if let Ok(mut line) = serde_json::to_vec(message) {
        line.push(b'\n');
        let _ = ready.write_all(&line);
    }
}

/// Supervisor log lines go to stderr, which the starter points at the sandbox's log file.
pub fn log(message: &str) {
    eprintln!(
        "{} {message}",
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
}
