//! The conversation with the host: the frame reader loop and its dispatch, the one writer task
//! that owns the channel's write half, the table of open streams, and the shutdown when the
//! channel ends.
//!
//! Nothing the host sends can make the agent panic or exit: a bad request or a frame for a
//! stream that does not exist is answered with an `Error` frame on that stream. Only a broken
//! channel (end of stream, framing error, I/O error) ends [`serve`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dynocap_proto::{
    channel, exec_window, from_payload, to_payload, Frame, FrameKind, FrameReader, FrameWriter,
    Hello, ProtoError, Request, Response, CONTROL_STREAM, GUEST_STREAM_BIT, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::config::Config;
use crate::egress::Egress;
use crate::exec;
use crate::forward::Forwards;
use crate::input::{self, Input, InputReader};
use crate::outbox::Outbox;
use crate::process_group::Stop;
use crate::session::{self, Gate};
use crate::{clone, repo, statedir, unpack, vmstat};

/// Finished stream ids remembered so that a `Cancel` racing with the end of its exec is
/// ignored instead of answered with an error after the stream's last frame.
const RECENT_STREAMS: usize = 4096;
/// How long shutdown waits for execs to die and report, then for the writer to flush.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Why a frame the host sent cannot be served: the answer is an `Error` frame on its stream.
#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("cannot cancel stream {0}: no such stream is open")]
    CancelUnknown(u32),
    #[error("{kind:?} frame for stream {id}, which is not open")]
    NotOpen { kind: FrameKind, id: u32 },
    #[error("stream 0 is the control stream; requests need a stream id of 1 or more")]
    ControlStream,
    #[error("stream {0} has bit 31 set, which is reserved for streams the guest opens")]
    GuestBit(u32),
    #[error("stream {0} is already open")]
    AlreadyOpen(u32),
    #[error("a rejoin goes on the control stream, before any other request")]
    RejoinOffControl,
}

/// Why [`serve`] returned.
#[derive(Debug)]
pub enum Ended {
    /// The host closed the channel between frames.
    Eof,
    /// The channel broke: a framing error, an I/O error, or EOF in the middle of a frame.
    Broken(ProtoError),
}

/// Streams with work in progress, and the ids of recently finished ones.
#[derive(Default)]
struct Streams {
    active: HashMap<u32, mpsc::Sender<Stop>>,
    /// Where the host's INPUT bytes go, for streams that take input and have not had their
    /// `Eof` yet. Dropping a sender (cancel, shutdown) tells the consumer the input was cut.
    inputs: HashMap<u32, mpsc::Sender<Input>>,
    /// The output credit of flow-controlled execs ([`dynocap_proto::exec_window`]), which the
    /// host's `Window` frames add to.
    windows: HashMap<u32, Arc<Semaphore>>,
    recent: VecDeque<u32>,
    recent_set: HashSet<u32>,
}

impl Streams {
    fn open(&mut self, id: u32, stop: mpsc::Sender<Stop>) {
        self.active.insert(id, stop);
        if self.recent_set.remove(&id) {
            self.recent.retain(|&r| r != id);
        }
    }

    fn finish(&mut self, id: u32) {
        self.active.remove(&id);
        self.inputs.remove(&id);
        self.windows.remove(&id);
        if self.recent_set.insert(id) {
            self.recent.push_back(id);
            if self.recent.len() > RECENT_STREAMS {
                if let Some(old) = self.recent.pop_front() {
                    self.recent_set.remove(&old);
                }
            }
        }
    }

    fn known(&self, id: u32) -> bool {
        self.active.contains_key(&id) || self.recent_set.contains(&id)
    }
}

type SharedStreams = Arc<Mutex<Streams>>;

fn lock(streams: &SharedStreams) -> MutexGuard<'_, Streams> {
    // Every update is a single insert/remove, so the table is consistent even after a panic.
    streams.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves one channel until it ends, then kills what is still running and returns why.
pub async fn serve<R, W>(reader: R, writer: W, config: Config) -> Ended
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (outbox, rx) = Outbox::channel();
    let gate = Arc::new(Gate::default());
    let writer_task = tokio::spawn(session::write_frames(
        FrameWriter::new(writer),
        rx,
        Arc::clone(&gate),
    ));
    send_hello(&outbox).await;

    let mut server = Server {
        config: Arc::new(config),
        outbox,
        streams: SharedStreams::default(),
        tasks: JoinSet::new(),
        repo_lock: Arc::default(),
        egress: Arc::default(),
        forwards: Forwards::default(),
        gate,
    };
    let mut frames = FrameReader::new(reader);
    let ended = loop {
        // Collect finished tasks so the set does not grow with every exec ever run.
        while let Some(result) = server.tasks.try_join_next() {
            log_join_error(result);
        }
        match frames.read_frame().await {
            Ok(Some(frame)) => server.dispatch(frame).await,
            Ok(None) => break Ended::Eof,
            Err(err) => break Ended::Broken(err),
        }
    };
    server.shutdown().await;
    // The writer ends once every sender is gone; the server holds the last one.
    drop(server);
    if tokio::time::timeout(FLUSH_WAIT, writer_task).await.is_err() {
        log!("the host is not reading; dropping the last frames");
    }
    ended
}

struct Server {
    config: Arc<Config>,
    outbox: Outbox,
    streams: SharedStreams,
    tasks: JoinSet<()>,
    /// Held by Baseline and Diff, which share the private repository, its index and the
    /// journal of what changed in the workspace since the last diff.
    repo_lock: Arc<tokio::sync::Mutex<crate::journal::Tracker>>,
    egress: Arc<Egress>,
    /// The host's port-forward connections, carried as tunnels.
    forwards: Forwards,
    /// Holds the writer for a live fork's save (see [`session`]).
    gate: Arc<Gate>,
}

/// The first frame of a session.
async fn send_hello(outbox: &Outbox) {
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        agent_version: env!("CARGO_PKG_VERSION").into(),
    };
    outbox
        .send(Frame::new(
            CONTROL_STREAM,
            FrameKind::Hello,
            to_payload(&hello),
        ))
        .await;
}

impl Server {
    async fn dispatch(&mut self, frame: Frame) {
        let id = frame.stream;
        if id != CONTROL_STREAM {
            // Only a rejoin comes on the control stream: anything else is the saved guest's
            // own host, after a save (see `session`).
            self.gate.release_if_held();
        }
        if id & GUEST_STREAM_BIT != 0 && frame.kind != FrameKind::Open {
            return self.egress.route(frame, &self.outbox).await;
        }
        if frame.kind != FrameKind::Open && self.forwards.owns(id) {
            return self.forwards.route(frame, &self.outbox).await;
        }
        match frame.kind {
            FrameKind::Open => self.open(id, &frame.payload).await,
            FrameKind::Cancel => {
                let outcome = {
                    let mut streams = lock(&self.streams);
                    // Cut the input first, so a worker waiting for bytes wakes up.
                    streams.inputs.remove(&id);
                    match streams.active.get(&id) {
                        // A full queue means a stop is already pending: nothing to add.
                        Some(stop) => {
                            let _ = stop.try_send(Stop::Cancel);
                            Ok(())
                        }
                        // The exec finished while the cancel was on its way: nothing to do.
                        None if streams.known(id) => Ok(()),
                        None => Err(FrameError::CancelUnknown(id)),
                    }
                };
                if let Err(err) = outcome {
                    self.outbox.send_error(id, err).await;
                }
            }
            FrameKind::Data | FrameKind::Eof => {
                let (known, input) = {
                    let mut streams = lock(&self.streams);
                    let is_input = frame.payload.first() == Some(&channel::INPUT);
                    let input = match (is_input, frame.kind) {
                        (false, _) => None,
                        (true, FrameKind::Eof) => streams.inputs.remove(&id),
                        (true, _) => streams.inputs.get(&id).cloned(),
                    };
                    (streams.known(id), input)
                };
                if !known {
                    let err = FrameError::NotOpen {
                        kind: frame.kind,
                        id,
                    };
                    return self.outbox.send_error(id, err).await;
                }
                // Execs read /dev/null, not the host, so input to them is dropped, as is input
                // after Eof or to a stream whose worker has stopped reading (it failed, or
                // finished). Otherwise this waits while the worker's queue is full: that is
                // the back-pressure that keeps the host from filling the agent's memory.
                if let Some(tx) = input {
                    let item = if frame.kind == FrameKind::Eof {
                        Input::Eof
                    } else if frame.payload.len() > 1 {
                        Input::Data {
                            payload: frame.payload,
                            start: 1,
                        }
                    } else {
                        return;
                    };
                    let _ = tx.send(item).await;
                }
            }
            FrameKind::Window => {
                let window = lock(&self.streams).windows.get(&id).cloned();
                let credit = exec_window::parse(&frame.payload);
                match (window, credit) {
                    // More credit than the window holds is a confused host: ignoring it keeps
                    // the bound that protects the host's queues.
                    (Some(window), Some(credit))
                        if window.available_permits() + credit <= exec_window::WINDOW =>
                    {
                        window.add_permits(credit);
                    }
                    // A grant racing with the end of its exec, or a malformed one.
                    _ => log!("ignoring a Window frame from the host on stream {id}"),
                }
            }
            // Only the agent sends these. Answering an Error with an Error could ping-pong.
            FrameKind::Done | FrameKind::Error | FrameKind::Hello => {
                log!(
                    "ignoring a {:?} frame from the host on stream {id}",
                    frame.kind
                );
            }
        }
    }

    async fn open(&mut self, id: u32, payload: &[u8]) {
        if id == CONTROL_STREAM {
            if let Ok(Request::Rejoin(req)) = from_payload::<Request>("request", payload) {
                return self.rejoin(&req).await;
            }
            return self.outbox.send_error(id, FrameError::ControlStream).await;
        }
        if id & GUEST_STREAM_BIT != 0 {
            return self.outbox.send_error(id, FrameError::GuestBit(id)).await;
        }
        if lock(&self.streams).active.contains_key(&id) || self.forwards.owns(id) {
            return self
                .outbox
                .send_error(id, FrameError::AlreadyOpen(id))
                .await;
        }
        let request = match from_payload::<Request>("request", payload) {
            Ok(request) => request,
            Err(err) => return self.outbox.send_error(id, err).await,
        };
        match request {
            Request::Ping => self.outbox.send_done(id, &Response::Pong).await,
            Request::Exec(req) => {
                let (stop_rx, _) = self.register(id, false);
                let window = req.output_window.then(|| {
                    let window = Arc::new(Semaphore::new(exec_window::WINDOW));
                    lock(&self.streams).windows.insert(id, Arc::clone(&window));
                    window
                });
                let config = Arc::clone(&self.config);
                let outbox = self.outbox.clone();
                self.spawn_stream(id, async move {
                    exec::run(req, &config, id, &outbox, stop_rx, window)
                        .await
                        .map(Response::Exit)
                });
            }
            Request::Unpack(req) => {
                let (stop_rx, input_rx) = self.register(id, true);
                self.spawn_stream(id, async move {
                    with_input(stop_rx, input_rx, move |input, cancelled| {
                        unpack::unpack(&req, input, cancelled)
                    })
                    .await
                });
            }
            Request::ReceiveFile(req) => {
                let (stop_rx, input_rx) = self.register(id, true);
                let state_dir = self.config.state_dir.clone();
                self.spawn_stream(id, async move {
                    with_input(stop_rx, input_rx, move |input, _| {
                        statedir::receive_file(&state_dir, &req, input)
                    })
                    .await
                });
            }
            Request::Baseline(req) => {
                let (mut stop_rx, _) = self.register(id, false);
                let config = Arc::clone(&self.config);
                let repo_lock = Arc::clone(&self.repo_lock);
                self.spawn_stream(id, async move {
                    repo::baseline(req, &config, &repo_lock, &mut stop_rx).await
                });
            }
            Request::Diff(req) => {
                let (mut stop_rx, _) = self.register(id, false);
                let config = Arc::clone(&self.config);
                let repo_lock = Arc::clone(&self.repo_lock);
                let outbox = self.outbox.clone();
                self.spawn_stream(id, async move {
                    repo::diff(req, &config, &repo_lock, id, &outbox, &mut stop_rx).await
                });
            }
            Request::Egress(req) => {
                let result = self
                    .egress
                    .configure(req, &self.config.egress_env, &self.outbox)
                    .await;
                match result {
                    Ok(response) => self.outbox.send_done(id, &response).await,
                    Err(message) => self.outbox.send_error(id, message).await,
                }
            }
            Request::Clone(req) => {
                let (mut stop_rx, _) = self.register(id, false);
                let config = Arc::clone(&self.config);
                let outbox = self.outbox.clone();
                self.spawn_stream(id, async move {
                    clone::clone(req, &config, id, &outbox, &mut stop_rx).await
                });
            }
            Request::OomKills => {
                let count = vmstat::oom_kills();
                self.outbox
                    .send_done(id, &Response::OomKills { count })
                    .await
            }
            Request::CacheRoom => {
                let room = crate::vm_cache::room();
                self.outbox
                    .send_done(id, &Response::CacheRoom { room })
                    .await
            }
            Request::Sync => {
                // Registered like any stream, so its id stays taken until its last frame.
                let _ = self.register(id, false);
                // sync(2) waits for the disk; other streams go on meanwhile.
                // A disk whose filesystem recorded an error did not take what was synced: the
                // sync fails, naming it (a jail's supervisor reads the same state on the host).
                self.spawn_stream(id, async move {
                    tokio::task::spawn_blocking(|| {
                        nix::unistd::sync();
                        crate::disk_health::failure()
                    })
                    .await
                    .map_err(|source| DiskRequestError::Worker {
                        what: "sync",
                        source,
                    })
                    .and_then(|failure| unless_failed(failure, Response::Synced))
                });
            }
            Request::File(req) => {
                // Registered like any stream; a file operation is short and not cancelled.
                let _ = self.register(id, false);
                let config = Arc::clone(&self.config);
                self.spawn_stream(id, async move {
                    crate::files::serve(req, &config).await.map(Response::File)
                });
            }
            Request::Connect(req) => self.forwards.open(id, req, &self.outbox).await,
            Request::Pause => {
                self.gate.hold_after(id);
                self.outbox.send_done(id, &Response::Pong).await
            }
            Request::Resume(req) => {
                session::set_clock(req.unix_ms);
                self.gate.release(None);
                self.outbox.send_done(id, &Response::Pong).await
            }
            Request::Rejoin(_) => {
                self.outbox
                    .send_error(id, FrameError::RejoinOffControl)
                    .await
            }
            Request::DiskHealth => {
                let _ = self.register(id, false);
                self.spawn_stream(id, async move {
                    tokio::task::spawn_blocking(crate::disk_health::failure)
                        .await
                        .map_err(|source| DiskRequestError::Worker {
                            what: "reading the disk's health",
                            source,
                        })
                        .and_then(|failure| unless_failed(failure, Response::DiskHealthy))
                });
            }
        }
    }

    /// Enters a stream in the table: its stop queue and, when it takes the host's bytes, its
    /// input queue.
    fn register(
        &mut self,
        id: u32,
        takes_input: bool,
    ) -> (mpsc::Receiver<Stop>, Option<mpsc::Receiver<Input>>) {
        // Two slots: a Cancel, then the Shutdown that may escalate it.
        let (stop_tx, stop_rx) = mpsc::channel(2);
        let mut streams = lock(&self.streams);
        streams.open(id, stop_tx);
        let input_rx = takes_input.then(|| {
            let (tx, rx) = input::queue();
            streams.inputs.insert(id, tx);
            rx
        });
        (stop_rx, input_rx)
    }

    /// Runs a stream's work as a task that ends the stream with `Done` or `Error`.
    fn spawn_stream<F, E>(&mut self, id: u32, work: F)
    where
        F: Future<Output = Result<Response, E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let outbox = self.outbox.clone();
        let streams = Arc::clone(&self.streams);
        self.tasks.spawn(async move {
            let result = work.await;
            // Leave the table before the last frame, so the host may reuse the id as soon as
            // it has seen that frame.
            lock(&streams).finish(id);
            match result {
                Ok(response) => outbox.send_done(id, &response).await,
                Err(err) => outbox.send_error(id, err).await,
            }
        });
    }

    /// Leaves the session of the host whose guest this was saved from, for one with the
    /// host that resumed it (see [`session`]): the old session's commands run on detached,
    /// its port forwards and egress listener end (the new host sets its own up), and the
    /// new session starts with a `Hello` under the host's name and clock.
    async fn rejoin(&mut self, req: &dynocap_proto::RejoinRequest) {
        let hostname = &req.hostname;
        session::take_identity(hostname, req.unix_ms);
        let old = std::mem::take(&mut self.streams);
        {
            let mut old = lock(&old);
            old.inputs.clear();
            for window in old.windows.values() {
                window.add_permits(session::DETACHED_CREDIT);
            }
        }
        self.tasks.detach_all();
        std::mem::take(&mut self.forwards).close_all();
        if let Some(listener) = self.egress.stop() {
            let _ = listener.await;
        }
        let (outbox, rx) = Outbox::channel();
        self.outbox = outbox;
        send_hello(&self.outbox).await;
        self.gate.release(Some(rx));
        log!("rejoined as {hostname}: a new session with the host that resumed this guest");
    }

    /// Kills every exec still running and waits (bounded) for them to finish.
    async fn shutdown(&mut self) {
        let _ = self.egress.stop();
        self.forwards.close_all();
        let stops: Vec<_> = {
            let mut streams = lock(&self.streams);
            // Workers reading input learn that it was cut.
            streams.inputs.clear();
            streams.active.values().cloned().collect()
        };
        for stop in stops {
            let _ = stop.try_send(Stop::Shutdown);
        }
        let drained = tokio::time::timeout(SHUTDOWN_WAIT, async {
            while let Some(result) = self.tasks.join_next().await {
                log_join_error(result);
            }
        })
        .await;
        if drained.is_err() {
            log!("some execs did not finish within {SHUTDOWN_WAIT:?} of shutdown");
            self.tasks.abort_all();
        }
    }
}

/// Why a stream that reads the host's bytes failed: its work's own error, or the agent's.
#[derive(Debug, thiserror::Error)]
enum InputStreamError<E> {
    #[error("{0}")]
    Work(E),
    #[error("internal error: the stream has no input queue")]
    NoInputQueue,
    #[error("internal error: {0}")]
    Worker(#[source] tokio::task::JoinError),
}

/// Runs `work` on the blocking pool with a reader of the stream's input. A stop request raises
/// the cancel flag the worker (and its reader) checks.
async fn with_input<F, E>(
    mut stop: mpsc::Receiver<Stop>,
    input: Option<mpsc::Receiver<Input>>,
    work: F,
) -> Result<Response, InputStreamError<E>>
where
    F: FnOnce(InputReader, &AtomicBool) -> Result<Response, E> + Send + 'static,
    E: Send + 'static,
{
    let Some(input) = input else {
        return Err(InputStreamError::NoInputQueue);
    };
    let cancelled = Arc::new(AtomicBool::new(false));
    let reader = InputReader::new(input, Arc::clone(&cancelled));
    let flag = Arc::clone(&cancelled);
    let mut worker = tokio::task::spawn_blocking(move || work(reader, &flag));
    let mut stop_open = true;
    loop {
        tokio::select! {
            joined = &mut worker => {
                return match joined {
                    Ok(result) => result.map_err(InputStreamError::Work),
                    Err(err) => Err(InputStreamError::Worker(err)),
                };
            }
            message = stop.recv(), if stop_open => match message {
                Some(_) => cancelled.store(true, Ordering::Relaxed),
                None => stop_open = false,
            },
        }
    }
}

/// Why a `Sync` or `DiskHealth` request failed.
#[derive(Debug, thiserror::Error)]
enum DiskRequestError {
    #[error(transparent)]
    Disk(#[from] crate::disk_health::DiskFailure),
    #[error("{what}: {source}")]
    Worker {
        what: &'static str,
        source: tokio::task::JoinError,
    },
}

/// The answer to a disk request: `answer`, or the failure the root filesystem recorded (see
/// `disk_health`), which the request then fails with.
fn unless_failed(
    failure: Option<crate::disk_health::DiskFailure>,
    answer: Response,
) -> Result<Response, DiskRequestError> {
    failure.map_or(Ok(answer), |failure| Err(failure.into()))
}

fn log_join_error(result: Result<(), tokio::task::JoinError>) {
    if let Err(err) = result {
        log!("a stream task failed: {err}");
    }
}

#[cfg(test)]
mod tests;
