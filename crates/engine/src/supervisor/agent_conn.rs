//! The supervisor's end of the agent channel: one connection, many concurrent streams.
//!
//! A reader task routes each incoming frame to the stream it belongs to; a writer task owns
//! the write half. Everything the agent sends is untrusted: frames for unknown streams are
//! dropped, and the connection's death ends every open stream with an error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynocap_proto::{
    channel, exec_window, from_payload, to_payload, tunnel, ErrorBody, Frame, FrameKind,
    FrameReader, FrameWriter, GuestRequest, Hello, Request, CONTROL_STREAM, DATA_CHUNK,
    GUEST_STREAM_BIT, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use crate::foundation::error::{Coded, Error, ErrorCode, Result};

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::agent_conn";

type Routes = Arc<Mutex<HashMap<u32, mpsc::Sender<Frame>>>>;
type Tunnels = Arc<Mutex<HashMap<u32, tunnel::Inbox>>>;

/// Serves the tunnels the guest opens (its egress): gets each new one with the queue its
/// frames go out on.
pub type TunnelHandler = Arc<dyn Fn(tunnel::Tunnel, mpsc::Sender<Frame>) + Send + Sync>;

/// How often [`AgentConn::while_responsive`] pings, and how long an answer may take. The agent
/// answers pings on its dispatch loop, beside any running request, so a healthy agent answers
/// in milliseconds even under load.
const AGENT_PING_INTERVAL: Duration = Duration::from_secs(3);
const AGENT_PING_DEADLINE: Duration = Duration::from_secs(20);

/// Frames buffered per stream before the reader waits for that stream's consumer (which
/// stalls every stream). A flow-controlled exec never has more in flight than this: its
/// window's frames plus its `Eof`s and last frame.
const STREAM_QUEUE: usize = exec_window::MAX_FRAMES_IN_FLIGHT + 8;

#[derive(Clone)]
pub struct AgentConn {
    outgoing: mpsc::Sender<Frame>,
    routes: Routes,
    next_stream: Arc<AtomicU32>,
    tunnel_handler: Arc<Mutex<Option<TunnelHandler>>>,
    /// Tunnels on streams this side opened ([`AgentConn::open_tunnel`]: port forwards).
    host_tunnels: Tunnels,
    /// Set by the reader once the channel closed, under the routes' lock, before it ends the
    /// streams open then: a stream opened after is refused instead of waiting for frames no
    /// one will route (a task's sync after a command the guest's stop cut off, say).
    closed: Arc<AtomicBool>,
    /// Holds the writer still while the guest is saved for a live fork (see `live_fork`).
    pub(crate) hold: Arc<crate::supervisor::live_fork::WriterHold>,
}

/// One request in flight: its frames, in order, until `Done` or `Error`.
pub struct AgentStream {
    id: u32,
    incoming: mpsc::Receiver<Frame>,
    outgoing: mpsc::Sender<Frame>,
    routes: Routes,
}

impl AgentConn {
    /// Starts the reader and writer tasks and waits for the agent's hello.
    pub async fn start<R, W>(read: R, write: W, hello_timeout: Duration) -> Result<(Self, Hello)>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut reader = FrameReader::new(read);
        let first = tokio::time::timeout(hello_timeout, reader.read_frame())
            .await
            .map_err(|_| {
                Error::timeout(format!(
                    "the guest agent did not answer within {}s of boot",
                    hello_timeout.as_secs()
                ))
            })?
            .map_err(AgentFailure::Waiting)?
            .ok_or(AgentFailure::ExitedBeforeHello)?;
        if first.kind != FrameKind::Hello || first.stream != CONTROL_STREAM {
            return Err(AgentFailure::SpokeBeforeHello.into());
        }
        let hello: Hello = from_payload("hello", &first.payload)?;
        if hello.protocol != PROTOCOL_VERSION {
            return Err(AgentFailure::Protocol {
                agent: hello.protocol,
            }
            .into());
        }

        let (outgoing, mut queue) = mpsc::channel::<Frame>(1024);
        let mut writer = FrameWriter::new(write);
        let hold = Arc::new(crate::supervisor::live_fork::WriterHold::default());
        let writer_hold = Arc::clone(&hold);
        tokio::spawn(async move {
            while let Some(frame) = queue.recv().await {
                let holds = writer_hold.holds_after(&frame);
                if writer.write_owned(frame).await.is_err() {
                    break;
                }
                if holds {
                    writer_hold.released().await;
                }
            }
        });

        let routes: Routes = Arc::default();
        let tunnel_handler: Arc<Mutex<Option<TunnelHandler>>> = Arc::default();
        let reader_routes = routes.clone();
        let reader_handler = tunnel_handler.clone();
        let reader_outgoing = outgoing.clone();
        let host_tunnels: Tunnels = Arc::default();
        let reader_host_tunnels = host_tunnels.clone();
        let closed = Arc::new(AtomicBool::new(false));
        let reader_closed = closed.clone();
        tokio::spawn(async move {
            let tunnels: Tunnels = Arc::default();
            loop {
                let frame = match reader.read_frame().await {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(err) => {
                        tracing::error!(target: LOG_TARGET, "agent channel: {err}; closing it");
                        break;
                    }
                };
                if frame.stream & GUEST_STREAM_BIT != 0 {
                    let refusal = guest_stream(frame, &tunnels, &reader_handler, &reader_outgoing);
                    if let Some((stream, message)) = refusal {
                        let body = to_payload(&ErrorBody { message });
                        let _ = reader_outgoing
                            .send(Frame::new(stream, FrameKind::Error, body))
                            .await;
                    }
                    continue;
                }
                let route = lock(&reader_routes).get(&frame.stream).cloned();
                if let Some(tx) = route {
                    // A consumer that went away just loses its frames.
                    let _ = tx.send(frame).await;
                    continue;
                }
                // A tunnel's frames never wait: its inbox holds at most its window.
                let stream = frame.stream;
                let routed = tunnel::route(&mut lock(&reader_host_tunnels), frame);
                if let Err(tunnel::Violation(message)) = routed {
                    let body = to_payload(&ErrorBody { message });
                    let _ = reader_outgoing
                        .send(Frame::new(stream, FrameKind::Error, body))
                        .await;
                }
            }
            // Dropping every sender ends every stream; none is opened from now on.
            {
                let mut routes = lock(&reader_routes);
                reader_closed.store(true, Ordering::SeqCst);
                routes.clear();
            }
            for (_, inbox) in lock(&tunnels).drain() {
                inbox.close("the agent channel closed");
            }
            for (_, inbox) in lock(&reader_host_tunnels).drain() {
                inbox.close("the agent channel closed");
            }
        });

        Ok((
            Self {
                outgoing,
                routes,
                next_stream: Arc::new(AtomicU32::new(1)),
                tunnel_handler,
                host_tunnels,
                closed,
                hold,
            },
            hello,
        ))
    }

    /// Whether the channel closed: the agent is gone and every request fails.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// From now on, tunnels the guest opens go to `handler`; before, or after
    /// [`AgentConn::refuse_tunnels`], they are refused.
    pub fn serve_tunnels(&self, handler: TunnelHandler) {
        *lock(&self.tunnel_handler) = Some(handler);
    }

    pub fn refuse_tunnels(&self) {
        *lock(&self.tunnel_handler) = None;
    }

    /// Opens a stream with `request`.
    pub async fn open(&self, request: &Request) -> Result<AgentStream> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed) & !GUEST_STREAM_BIT;
        let (tx, incoming) = mpsc::channel(STREAM_QUEUE);
        {
            let mut routes = lock(&self.routes);
            if self.closed.load(Ordering::SeqCst) {
                return Err(agent_gone());
            }
            routes.insert(id, tx);
        }
        let stream = AgentStream {
            id,
            incoming,
            outgoing: self.outgoing.clone(),
            routes: self.routes.clone(),
        };
        stream.send(FrameKind::Open, to_payload(request)).await?;
        Ok(stream)
    }

    /// Opens a stream with `request` whose answer is a tunnel (a port forward's
    /// [`Request::Connect`]): the tunnel to [`tunnel::pump`] and the queue its frames go out
    /// on. A refusal (nothing listens there) arrives as the tunnel's end with the agent's
    /// message.
    pub async fn open_tunnel(
        &self,
        request: &Request,
    ) -> Result<(tunnel::Tunnel, mpsc::Sender<Frame>)> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed) & !GUEST_STREAM_BIT;
        let (inbox, tunnel) = tunnel::open(id);
        {
            // The reader drains these after it marks the channel closed.
            let mut tunnels = lock(&self.host_tunnels);
            if self.closed.load(Ordering::SeqCst) {
                return Err(agent_gone());
            }
            tunnels.insert(id, inbox);
        }
        let open = Frame::new(id, FrameKind::Open, to_payload(request));
        if self.outgoing.send(open).await.is_err() {
            lock(&self.host_tunnels).remove(&id);
            return Err(agent_gone());
        }
        Ok((tunnel, self.outgoing.clone()))
    }

    /// Runs `work` (something the agent is doing for us) while checking that the agent still
    /// answers: a ping every few seconds must come back in time, else the work is abandoned
    /// with an error. A stopped or wedged agent thus fails a long request instead of hanging it,
    /// however long the request itself may legitimately take.
    pub async fn while_responsive<T>(
        &self,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T> {
        let watchdog = async {
            loop {
                tokio::time::sleep(AGENT_PING_INTERVAL).await;
                match tokio::time::timeout(AGENT_PING_DEADLINE, self.ping()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => return err,
                    Err(_) => return AgentFailure::StoppedAnswering.into(),
                }
            }
        };
        tokio::select! {
            out = work => Ok(out),
            err = watchdog => Err(err),
        }
    }

    /// Round trip of a ping, for health checks.
    pub async fn ping(&self) -> Result<()> {
        let mut stream = self.open(&Request::Ping).await?;
        match stream.next().await {
            Some(frame) if frame.kind == FrameKind::Done => Ok(()),
            Some(_) => Err(Error::internal(
                "the guest agent answered a ping with something else",
            )),
            None => Err(agent_gone()),
        }
    }
}

impl AgentStream {
    /// The next frame of this stream; `None` when the connection closed.
    pub async fn next(&mut self) -> Option<Frame> {
        self.incoming.recv().await
    }

    /// Asks the agent to stop this stream's work.
    pub async fn cancel(&self) -> Result<()> {
        self.send(FrameKind::Cancel, Vec::new()).await
    }

    /// Returns `credit` of a flow-controlled exec's output window to the agent.
    pub async fn grant(&self, credit: usize) -> Result<()> {
        let frame = exec_window::grant(self.id, credit);
        self.send(frame.kind, frame.payload).await
    }

    /// A handle that feeds bytes into this stream's input channel from blocking code (a
    /// tar writer running on a blocking thread).
    pub fn input(&self) -> InputWriter {
        InputWriter {
            id: self.id,
            outgoing: self.outgoing.clone(),
        }
    }

    async fn send(&self, kind: FrameKind, payload: Vec<u8>) -> Result<()> {
        self.outgoing
            .send(Frame::new(self.id, kind, payload))
            .await
            .map_err(|_| agent_gone())
    }
}

/// `std::io::Write` into a stream's [`channel::INPUT`], in frames of at most
/// [`DATA_CHUNK`] bytes. Blocks when the agent's queue is full (back-pressure); use it from a
/// blocking thread only.
pub struct InputWriter {
    id: u32,
    outgoing: mpsc::Sender<Frame>,
}

impl InputWriter {
    /// Marks the end of the input.
    pub fn finish(self) -> std::io::Result<()> {
        self.push(FrameKind::Eof, vec![channel::INPUT])
    }

    fn push(&self, kind: FrameKind, payload: Vec<u8>) -> std::io::Result<()> {
        self.outgoing
            .blocking_send(Frame::new(self.id, kind, payload))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the guest agent is gone")
            })
    }
}

impl std::io::Write for InputWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(DATA_CHUNK);
        let mut payload = Vec::with_capacity(n + 1);
        payload.push(channel::INPUT);
        payload.extend_from_slice(&buf[..n]);
        self.push(FrameKind::Data, payload)?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for AgentStream {
    fn drop(&mut self) {
        lock(&self.routes).remove(&self.id);
    }
}

/// The message of an agent's `Error` frame, made safe to show: it is guest text.
pub fn agent_error_message(payload: &[u8]) -> String {
    let message = from_payload::<ErrorBody>("error", payload)
        .map(|body| body.message)
        .unwrap_or_else(|_| "malformed error from the guest agent".into());
    crate::supervisor::exec::sanitize_line(&message, 500)
}

pub fn agent_gone() -> Error {
    Error::internal("the sandbox's guest agent is gone (the sandbox was destroyed or crashed)")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps stay consistent even if a holder panicked: every update is a single insert or
    // remove. So a poisoned lock is still safe to use.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Routes a frame of a stream the guest opened. Returns the stream and a message when the
/// guest is to be told the stream is refused or broken.
fn guest_stream(
    frame: Frame,
    tunnels: &Tunnels,
    handler: &Mutex<Option<TunnelHandler>>,
    outgoing: &mpsc::Sender<Frame>,
) -> Option<(u32, String)> {
    let id = frame.stream;
    if frame.kind == FrameKind::Open {
        if lock(tunnels).contains_key(&id) {
            return Some((id, format!("stream {id:#x} is already open")));
        }
        match from_payload::<GuestRequest>("guest request", &frame.payload) {
            Ok(GuestRequest::Tunnel) => {}
            Err(err) => return Some((id, err.to_string())),
        }
        let Some(handler) = lock(handler).clone() else {
            return Some((
                id,
                "this sandbox has no network egress (network \"none\")".to_owned(),
            ));
        };
        let (inbox, tunnel) = tunnel::open(id);
        lock(tunnels).insert(id, inbox);
        handler(tunnel, outgoing.clone());
        return None;
    }
    tunnel::route(&mut lock(tunnels), frame)
        .err()
        .map(|tunnel::Violation(why)| (id, why))
}

/// What failed talking to the guest agent over its channel.
#[derive(Debug, thiserror::Error)]
enum AgentFailure {
    #[error("waiting for the guest agent: {0}")]
    Waiting(#[source] dynocap_proto::ProtoError),
    #[error("the guest agent exited before saying hello")]
    ExitedBeforeHello,
    #[error("the guest agent spoke before saying hello")]
    SpokeBeforeHello,
    /// `agent` is the protocol the agent's hello names.
    #[error(
        "the guest agent speaks protocol {agent} but this dynocap speaks {PROTOCOL_VERSION}; \
         install matching dynocap and dynocap-agent binaries"
    )]
    Protocol { agent: u32 },
    #[error(
        "the guest agent stopped answering (no reply to a ping within {}s)",
        AGENT_PING_DEADLINE.as_secs()
    )]
    StoppedAnswering,
}

impl Coded for AgentFailure {
    /// The agent is DynoCap's own program in the guest: a failure to reach it, or a
    /// mismatched one, is for the operator to fix (the protocol message says how).
    fn code(&self) -> ErrorCode {
        match self {
            Self::Waiting(_)
            | Self::ExitedBeforeHello
            | Self::SpokeBeforeHello
            | Self::Protocol { .. }
            | Self::StoppedAnswering => ErrorCode::Internal,
        }
    }
}

/// A connection to an agent the test plays: the supervisor's side, started on its Hello, and
/// the agent's two halves of the channel.
#[cfg(test)]
pub(crate) async fn connected_to_a_test_agent() -> (
    AgentConn,
    tokio::io::ReadHalf<tokio::io::DuplexStream>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
) {
    use dynocap_proto::{Frame, FrameKind, FrameWriter, Hello, PROTOCOL_VERSION};

    let (host, agent) = tokio::io::duplex(1 << 20);
    let (host_read, host_write) = tokio::io::split(host);
    let (agent_read, mut agent_write) = tokio::io::split(agent);
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        agent_version: "test".into(),
    };
    FrameWriter::new(&mut agent_write)
        .write_frame(&Frame::new(0, FrameKind::Hello, to_payload(&hello)))
        .await
        .unwrap();
    let (conn, _) = AgentConn::start(host_read, host_write, Duration::from_secs(5))
        .await
        .unwrap();
    (conn, agent_read, agent_write)
}

#[cfg(test)]
mod tests {
    use dynocap_proto::Request;

    use super::*;

    /// Once the agent's side of the channel is closed (a VM's guest stopped for a restore,
    /// its writes still accepted until the writer fails), a request made after is refused at
    /// once: it used to wait forever for frames nothing would route, holding the command that
    /// made it (a task's sync after a command the stop cut off) and the restore behind it.
    #[tokio::test]
    async fn a_stream_opened_after_the_channel_closed_is_refused_not_left_waiting() {
        // The agent's reading half stays: the supervisor's writes go on being accepted.
        let (conn, _agent_read, mut agent_write) = connected_to_a_test_agent().await;
        let mut before = conn.open(&Request::Ping).await.unwrap();
        tokio::io::AsyncWriteExt::shutdown(&mut agent_write)
            .await
            .unwrap();
        // The stream open when the channel closed ends: the reader has seen the end.
        assert!(before.next().await.is_none());

        let after = tokio::time::timeout(Duration::from_secs(60), conn.open(&Request::Ping))
            .await
            .expect("open answers");
        assert_eq!(
            after.err().map(|err| err.message),
            Some(agent_gone().message)
        );
        assert!(conn.is_closed());
        let pinged = tokio::time::timeout(Duration::from_secs(60), conn.ping())
            .await
            .expect("a ping on a closed channel answers rather than waits");
        assert!(pinged.is_err());
        let tunnel = conn.open_tunnel(&Request::Ping).await;
        assert_eq!(
            tunnel.err().map(|err| err.message),
            Some(agent_gone().message)
        );
    }
}
