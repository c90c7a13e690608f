//! The guest end of port forwards on a VM, and on a jail whose supervisor may not join the
//! guest's network namespace (a root supervisor connects there itself): each connection the
//! host accepted on a forwarded port arrives as a
//! [`Request::Connect`](dynocap_proto::Request::Connect) stream, which the agent connects to
//! the port on the guest's own loopback and then carries as a tunnel
//! ([`dynocap_proto::tunnel`]), as egress tunnels are carried the other way.
//!
//! The agent runs in the guest's network namespace (a jail's, or a VM's own kernel), so the
//! connection reaches what a command there would reach, whatever the sandbox's network mode.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dynocap_proto::tunnel::{self, Inbox};
use dynocap_proto::{ConnectRequest, Frame};
use tokio::net::TcpStream;

use crate::outbox::Outbox;

/// Forwarded connections open at once; the host bounds its own side the same way.
const MAX_CONNECTIONS: usize = 256;
/// How long connecting to a guest port may take (a loopback connect answers at once unless
/// the listener's backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Ended connections remembered, so the host's last frames crossing the end are dropped
/// quietly instead of being answered as frames of an unknown stream.
const RECENT: usize = 1024;

/// Why a forwarded connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("{MAX_CONNECTIONS} forwarded connections are open in the guest; close some")]
    TooMany,
    #[error(
        "nothing in the sandbox accepts connections on port {port} (127.0.0.1 or ::1): {source}"
    )]
    Connect { port: u16, source: std::io::Error },
    #[error("connecting to port {port} in the sandbox took over {}s", CONNECT_TIMEOUT.as_secs())]
    Timeout { port: u16 },
}

#[derive(Default)]
struct State {
    live: HashMap<u32, Inbox>,
    recent: VecDeque<u32>,
    recent_set: HashSet<u32>,
}

impl State {
    fn end(&mut self, id: u32) {
        self.live.remove(&id);
        if self.recent_set.insert(id) {
            self.recent.push_back(id);
            if self.recent.len() > RECENT {
                if let Some(old) = self.recent.pop_front() {
                    self.recent_set.remove(&old);
                }
            }
        }
    }
}

/// The forwarded connections, by the host's stream id.
#[derive(Default, Clone)]
pub struct Forwards(Arc<Mutex<State>>);

impl Forwards {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update is one insert or remove, so the map is consistent after a panic.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `id` is (or just was) a forwarded connection, whose frames [`Self::route`]
    /// takes.
    pub fn owns(&self, id: u32) -> bool {
        let state = self.lock();
        state.live.contains_key(&id) || state.recent_set.contains(&id)
    }

    /// Starts the connection the host asked for on stream `id`. Its tunnel is entered at
    /// once, so the host's bytes that follow the request wait in it while the connect runs.
    pub async fn open(&self, id: u32, req: ConnectRequest, outbox: &Outbox) {
        let tunnel = {
            let mut state = self.lock();
            (state.live.len() < MAX_CONNECTIONS).then(|| {
                let (inbox, tunnel) = tunnel::open(id);
                state.live.insert(id, inbox);
                tunnel
            })
        };
        let Some(tunnel) = tunnel else {
            return outbox.send_error(id, ForwardError::TooMany).await;
        };
        let forwards = self.clone();
        let outbox = outbox.clone();
        tokio::spawn(async move {
            match connect(req.port).await {
                Ok(socket) => {
                    let _ = socket.set_nodelay(true);
                    // The host reports a failed connection; the guest's server sees it close.
                    let _ = tunnel::pump(tunnel, socket, outbox.sender()).await;
                }
                Err(err) => outbox.send_error(id, err).await,
            }
            forwards.lock().end(id);
        });
    }

    /// Routes a frame of a forwarded connection; frames after its end are dropped.
    pub async fn route(&self, frame: Frame, outbox: &Outbox) {
        let id = frame.stream;
        let violation = tunnel::route(&mut self.lock().live, frame).err();
        if let Some(tunnel::Violation(why)) = violation {
            log!("forward {id}: {why}");
            outbox.send_error(id, why).await;
        }
    }

    /// Ends every forwarded connection (the channel is closing).
    pub fn close_all(&self) {
        for (_, inbox) in self.lock().live.drain() {
            inbox.close("the agent is shutting down");
        }
    }
}

async fn connect(port: u16) -> Result<TcpStream, ForwardError> {
    let attempt = async {
        match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(socket) => Ok(socket),
            // A server listening on IPv6 alone (`::1`, or `::` with v6only) is still the
            // sandbox's server on that port.
            Err(v4) => TcpStream::connect(("::1", port)).await.map_err(|_| v4),
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(Ok(socket)) => Ok(socket),
        Ok(Err(source)) => Err(ForwardError::Connect { port, source }),
        Err(_) => Err(ForwardError::Timeout { port }),
    }
}
