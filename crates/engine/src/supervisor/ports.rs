//! A sandbox's port forwards, in its supervisor: a listener on the host per forward, and for
//! each connection it accepts, a connection to the guest port made inside the guest. On a
//! jail whose network namespace the supervisor may join (a root supervisor), the supervisor
//! makes it there itself and splices the two sockets together ([`direct`]); otherwise (a VM,
//! or a rootless jail) a tunnel through the agent channel carries it (the agent connects
//! inside the guest, see the agent's `forward`). Either way a forward works in every network
//! mode: it reaches the guest's loopback and never changes the guest's network.
//!
//! The listeners belong to the supervisor and end with the sandbox ([`Forwards::close_all`]
//! runs before a destroy answers); a restore, which executes the supervisor anew, opens them
//! again ([`Forwards::reopen_saved`]). The list is also written to [`FORWARDS_FILE`] in the
//! sandbox's directory, which listings read without asking the supervisor.
//!
//! A sandbox carries at most `MAX_CONNECTIONS` connections at once: past it each listener
//! holds the connection it accepted until a slot is free, and the kernel's backlog the rest. A connection the guest refuses
//! (nothing listens on the port) ends as a server closing at once would, with a FIN after
//! what the client sent is read, on both paths (`close_gently`).

mod direct;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dynocap_proto::{ConnectRequest, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use crate::foundation::error::{Error, Result};
use crate::model::sandbox_info::PortForward;
use crate::supervisor::agent_conn::AgentConn;
use direct::GuestNet;

const LOG_TARGET: &str = "dynocap_engine::ports";

/// The forwards' list in the sandbox's directory, for listings.
pub const FORWARDS_FILE: &str = "forwards.json";
/// Forwards one sandbox holds at once.
pub const MAX_FORWARDS: usize = 32;
/// Connections carried at once over all of a sandbox's forwards (the agent's own bound).
/// Past it a further connection waits (accepted, or in the host's listen backlog) until one
/// ends, instead of being closed.
const MAX_CONNECTIONS: usize = 256;
/// How long a connection whose guest port nobody listens on is read after its end-of-stream
/// was sent, so that it closes with a FIN the client reads as an end, not a reset.
const REFUSED_DRAIN: Duration = Duration::from_secs(5);

/// What a caller asks to forward. The address is checked here too, whoever asked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForwardRequest {
    pub guest_port: u16,
    /// 0: a free port, chosen by the host.
    pub host_port: u16,
    pub host_address: IpAddr,
}

/// The forwards listed in the sandbox directory `dir`; none when it has no file or one that
/// does not read (a listing never fails on it).
pub fn read_forwards(dir: &std::path::Path) -> Vec<PortForward> {
    std::fs::read(dir.join(FORWARDS_FILE))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok())
        .unwrap_or_default()
}

struct Entry {
    forward: PortForward,
    /// The accept loop: it owns the listener and its connections' tasks, so aborting it and
    /// awaiting it closes them all.
    task: JoinHandle<()>,
}

/// The forwards of one sandbox.
pub struct Forwards {
    conn: AgentConn,
    /// The guest's network namespace until the first forward tries to join it, then the
    /// thread in it (`None`: forwards go through the agent).
    guest_net: Mutex<GuestNetState>,
    file: PathBuf,
    list: tokio::sync::Mutex<Vec<Entry>>,
    /// One permit per connection carried, shared by all the forwards.
    slots: Arc<Semaphore>,
    /// Set once the sandbox ends: no forward is added after that.
    closed: Mutex<bool>,
}

enum GuestNetState {
    Untried(Option<std::fs::File>),
    Tried(Option<Arc<GuestNet>>),
}

impl Forwards {
    /// `netns`: the guest's network namespace when it shares the host's kernel (a jail), for
    /// the direct path.
    pub fn new(conn: AgentConn, sandbox_dir: PathBuf, netns: Option<std::fs::File>) -> Self {
        Self {
            conn,
            guest_net: Mutex::new(GuestNetState::Untried(netns)),
            file: sandbox_dir.join(FORWARDS_FILE),
            list: tokio::sync::Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            closed: Mutex::new(false),
        }
    }

    pub async fn list(&self) -> Vec<PortForward> {
        self.list
            .lock()
            .await
            .iter()
            .map(|e| e.forward.clone())
            .collect()
    }

    /// Listens on the host and starts carrying connections to the guest port.
    pub async fn add(&self, request: &ForwardRequest) -> Result<PortForward> {
        check_port("the guest port", request.guest_port, "GUESTPORT")?;
        let mut list = self.list.lock().await;
        if *self.closed.lock().unwrap_or_else(PoisonError::into_inner) {
            return Err(Error::conflict("the sandbox is ending"));
        }
        if let Some(old) = list
            .iter()
            .find(|e| e.forward.guest_port == request.guest_port)
        {
            return Err(Error::conflict(format!(
                "guest port {} is already forwarded from {}; remove that forward first to forward it again",
                request.guest_port,
                old.forward.short()
            )));
        }
        if list.len() >= MAX_FORWARDS {
            return Err(Error::conflict(format!(
                "this sandbox already has {MAX_FORWARDS} port forwards, the most it holds; remove one first"
            )));
        }
        let wanted = SocketAddr::new(request.host_address, request.host_port);
        let listener = TcpListener::bind(wanted)
            .await
            .map_err(|err| bind_error(wanted, &err))?;
        let local = listener
            .local_addr()
            .map_err(|err| Error::internal(format!("reading the forward's address: {err}")))?;
        let forward = PortForward::new(request.guest_port, local);
        let task = tokio::spawn(accept_loop(
            listener,
            request.guest_port,
            Route {
                conn: self.conn.clone(),
                guest_net: self.guest_net(),
            },
            Arc::clone(&self.slots),
        ));
        tracing::info!(target: LOG_TARGET, "forwarding {}", forward.short());
        list.push(Entry {
            forward: forward.clone(),
            task,
        });
        self.write(&list);
        Ok(forward)
    }

    /// Opens again the forwards a restore cut: a restore executes the supervisor anew, which
    /// closes its listeners, but the task goes on with the forwards it had (on the same host
    /// addresses and ports, which the list in [`FORWARDS_FILE`] still names). One whose port
    /// another process took meanwhile is dropped from the list, and logged.
    pub async fn reopen_saved(&self) {
        let saved = read_forwards(self.file.parent().unwrap_or(std::path::Path::new(".")));
        if saved.is_empty() {
            return;
        }
        // Rewritten by the adds below: what could not be opened again is not listed.
        self.write(&[]);
        for forward in saved {
            let Ok(host_address) = forward.host_address.parse::<IpAddr>() else {
                tracing::warn!(target: LOG_TARGET, "dropping the forward {}: its address does not read", forward.short());
                continue;
            };
            let request = ForwardRequest {
                guest_port: forward.guest_port,
                host_port: forward.host_port,
                host_address,
            };
            if let Err(err) = self.add(&request).await {
                tracing::warn!(target: LOG_TARGET, "the forward {} was not opened again after the restore: {err}", forward.short());
            }
        }
    }

    /// Stops the forward of `guest_port`: its listener closes and its connections end.
    pub async fn remove(&self, guest_port: u16) -> Result<PortForward> {
        let mut list = self.list.lock().await;
        let Some(at) = list.iter().position(|e| e.forward.guest_port == guest_port) else {
            let open: Vec<String> = list.iter().map(|e| e.forward.short()).collect();
            return Err(Error::not_found(format!(
                "guest port {guest_port} is not forwarded{}",
                if open.is_empty() {
                    "; this sandbox has no forwards".to_owned()
                } else {
                    format!(" (forwards: {})", open.join(", "))
                }
            )));
        };
        let entry = list.remove(at);
        entry.task.abort();
        let _ = entry.task.await;
        self.write(&list);
        tracing::info!(target: LOG_TARGET, "stopped forwarding {}", entry.forward.short());
        Ok(entry.forward)
    }

    /// Closes every listener and connection (the sandbox is ending). Returns once the
    /// listening sockets are closed, so a connection attempt after it is refused.
    pub async fn close_all(&self) {
        *self.closed.lock().unwrap_or_else(PoisonError::into_inner) = true;
        let mut list = self.list.lock().await;
        for entry in list.drain(..) {
            entry.task.abort();
            let _ = entry.task.await;
        }
        let _ = std::fs::remove_file(&self.file);
    }

    /// The thread in the guest's network namespace, started by the first forward; `None`
    /// when there is none to join or this process may not join it.
    fn guest_net(&self) -> Option<Arc<GuestNet>> {
        let mut state = self
            .guest_net
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let GuestNetState::Untried(netns) = &mut *state {
            let started = netns.take().and_then(|netns| match join(netns) {
                Ok(net) => {
                    tracing::info!(target: LOG_TARGET,
                        "forwarded connections are made in the guest's network namespace and spliced");
                    Some(Arc::new(net))
                }
                Err(err) => {
                    tracing::info!(target: LOG_TARGET,
                        "forwarded connections go through the guest agent: joining the guest's network namespace: {err}");
                    None
                }
            });
            *state = GuestNetState::Tried(started);
        }
        match &*state {
            GuestNetState::Tried(net) => net.clone(),
            GuestNetState::Untried(_) => None,
        }
    }

    fn write(&self, list: &[Entry]) {
        let forwards: Vec<&PortForward> = list.iter().map(|e| &e.forward).collect();
        let partial = self.file.with_extension("json.partial");
        let written = serde_json::to_vec(&forwards)
            .map_err(std::io::Error::other)
            .and_then(|text| std::fs::write(&partial, text))
            .and_then(|()| std::fs::rename(&partial, &self.file));
        if let Err(err) = written {
            // Only listings miss it: the forwards themselves work.
            tracing::warn!(target: LOG_TARGET, "writing {}: {err}", self.file.display());
        }
    }
}

/// Joins the guest's network namespace for the direct path. A root supervisor always may; the
/// failpoint stands for one that may not (a supervisor without `CAP_SYS_ADMIN`), so the tests
/// drive the agent channel's path on a jail too.
fn join(netns: std::fs::File) -> std::io::Result<GuestNet> {
    crate::foundation::failpoint::hit("supervisor.ports.join-netns").map_err(|err| {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, err.to_string())
    })?;
    GuestNet::start(netns)
}

/// Refuses port 0 where a port must be named.
pub fn check_port(what: &str, port: u16, fix: &str) -> Result<()> {
    if port == 0 {
        return Err(Error::invalid(format!(
            "{what} must be 1 to 65535, not 0; pass the port the server listens on as {fix}"
        )));
    }
    Ok(())
}

/// A failed listen, said with what to do.
pub fn bind_error(wanted: SocketAddr, err: &std::io::Error) -> Error {
    match err.raw_os_error() {
        Some(libc::EADDRINUSE) => Error::conflict(format!(
            "host port {} on {} is in use; pick another host port, or pass 0 (or none) to have a free one chosen",
            wanted.port(),
            wanted.ip()
        )),
        Some(libc::EADDRNOTAVAIL) => Error::invalid(format!(
            "{} is not an address of this host; listen on 127.0.0.1 (the default) or one of the host's own addresses",
            wanted.ip()
        )),
        Some(libc::EACCES) => Error::invalid(format!(
            "listening on host port {} needs privileges this process lacks; pick a port of 1024 or more",
            wanted.port()
        )),
        _ => Error::internal(format!("listening on {wanted}: {err}")),
    }
}

/// How a forward's connections reach the guest.
#[derive(Clone)]
struct Route {
    conn: AgentConn,
    /// Set: directly, from the guest's network namespace; else through the agent.
    guest_net: Option<Arc<GuestNet>>,
}

impl Route {
    /// Carries `socket` to the guest port until both ends are done. A connection the guest
    /// refused is handed back, to be closed with [`close_gently`] once its slot is free.
    async fn carry(
        self,
        socket: TcpStream,
        guest_port: u16,
    ) -> Result<(), (String, Option<TcpStream>)> {
        if let Some(net) = self.guest_net {
            let guest = match net.connect(guest_port).await {
                Ok(guest) => guest,
                Err(err) => {
                    return Err((format!("nothing in the sandbox accepts connections on port {guest_port} (127.0.0.1 or ::1): {err}"), Some(socket)));
                }
            };
            return direct::relay(socket, guest)
                .await
                .map(|_| ())
                .map_err(|err| (err.to_string(), None));
        }
        let request = Request::Connect(ConnectRequest { port: guest_port });
        let (tunnel, outgoing) = self
            .conn
            .open_tunnel(&request)
            .await
            .map_err(|err| (err.to_string(), None))?;
        // A second descriptor of the socket, so that a connection the guest refused can still
        // be closed gently once the tunnel has dropped its own.
        let std_socket = socket
            .into_std()
            .map_err(|err| (format!("taking the connection: {err}"), None))?;
        let kept = std_socket
            .try_clone()
            .map_err(|err| (format!("duplicating the connection: {err}"), None))?;
        let socket = TcpStream::from_std(std_socket)
            .map_err(|err| (format!("registering the connection: {err}"), None))?;
        let answered = Arc::new(AtomicBool::new(false));
        let carried = dynocap_proto::tunnel::pump(
            tunnel,
            Answered {
                inner: socket,
                answered: Arc::clone(&answered),
            },
            outgoing,
        )
        .await;
        match carried {
            Ok(_) => Ok(()),
            // Refused before the guest sent a byte (nothing listens on the port): closed as
            // the direct path closes it. Past the first byte a failure stays a reset, so the
            // client cannot take a cut answer for a whole one.
            Err(why) if !answered.load(Ordering::Acquire) => {
                Err((why, TcpStream::from_std(kept).ok()))
            }
            Err(why) => Err((why, None)),
        }
    }
}

/// A forwarded connection that notes the first bytes the guest's side wrote to it.
struct Answered {
    inner: TcpStream,
    answered: Arc<AtomicBool>,
}

impl tokio::io::AsyncRead for Answered {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Answered {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let written = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(written, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.answered.store(true, Ordering::Release);
        }
        written
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Ends a connection the guest refused as a server that closes at once would: an
/// end-of-stream, then what the client sent is read until it closes too (or for
/// [`REFUSED_DRAIN`]). Dropping it with the request it sent unread would answer a reset, which
/// clients report as an error of the network rather than a closed connection.
async fn close_gently(mut socket: TcpStream) {
    if socket.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSED_DRAIN, async {
        while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

async fn accept_loop(listener: TcpListener, guest_port: u16, route: Route, slots: Arc<Semaphore>) {
    // Dropped with this loop: aborting the loop ends its connections too.
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let socket = match accepted {
            Ok((socket, _)) => socket,
            Err(err) => {
                tracing::warn!(target: LOG_TARGET, "accepting on the forward to {guest_port}: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // A slot before the next accept: while every slot is taken, this connection waits
        // for one and the next ones wait in the listen backlog. (Taken after the accept, so
        // that an idle forward holds none.)
        let slot = loop {
            tokio::select! {
                slot = Arc::clone(&slots).acquire_owned() => break slot,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        };
        let Ok(slot) = slot else {
            // The semaphore is never closed; if it were, nothing more could be carried.
            return;
        };
        let _ = socket.set_nodelay(true);
        let route = route.clone();
        connections.spawn(async move {
            let carried = route.carry(socket, guest_port).await;
            // The slot is for carrying: a refused connection's close need not hold it.
            drop(slot);
            if let Err((why, refused)) = carried {
                tracing::debug!(target: LOG_TARGET, "a connection forwarded to {guest_port}: {why}");
                if let Some(socket) = refused {
                    close_gently(socket).await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dynocap_proto::{
        from_payload, to_payload, ErrorBody, Frame, FrameKind, FrameReader, FrameWriter,
    };

    use super::*;
    use crate::foundation::error::ErrorCode;

    /// The inode of the IPv4 socket listening on `127.0.0.1:port` in this network namespace.
    fn listening_inode(port: u16) -> Option<u64> {
        let local = format!("0100007F:{port:04X}");
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // `0A`: TCP_LISTEN.
            (fields[1] == local && fields[3] == "0A").then(|| fields[9].parse().unwrap())
        })
    }

    /// Whether one of this process's descriptors is the socket with `inode`.
    fn held_here(inode: u64) -> bool {
        let socket = std::ffi::OsString::from(format!("socket:[{inode}]"));
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == socket))
    }

    /// A connection to an agent played by the test: the supervisor's side, and the frames it
    /// sends the agent.
    async fn conn() -> (
        AgentConn,
        FrameReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
        // Held for the test's length: the agent's side never closes.
        FrameWriter<tokio::io::WriteHalf<tokio::io::DuplexStream>>,
    ) {
        let (conn, agent_read, agent_write) =
            crate::supervisor::agent_conn::connected_to_a_test_agent().await;
        (
            conn,
            FrameReader::new(agent_read),
            FrameWriter::new(agent_write),
        )
    }

    fn request(guest_port: u16, host_port: u16) -> ForwardRequest {
        ForwardRequest {
            guest_port,
            host_port,
            host_address: IpAddr::from([127, 0, 0, 1]),
        }
    }

    #[tokio::test]
    async fn a_forward_asks_the_agent_per_connection_and_closes_with_the_sandbox() {
        let (conn, mut agent, _agent_writer) = conn().await;
        let dir = tempfile::tempdir().unwrap();
        let forwards = Forwards::new(conn, dir.path().to_path_buf(), None);
        let forward = forwards.add(&request(8000, 0)).await.unwrap();
        assert_eq!(forward.host_address, "127.0.0.1");
        assert_ne!(forward.host_port, 0);
        assert_eq!(read_forwards(dir.path()), std::slice::from_ref(&forward));

        // Each accepted connection is one Connect stream to the agent.
        let _client = tokio::net::TcpStream::connect(("127.0.0.1", forward.host_port))
            .await
            .unwrap();
        let open = agent.read_frame().await.unwrap().unwrap();
        assert_eq!(open.kind, FrameKind::Open);
        assert_eq!(
            from_payload::<Request>("request", &open.payload).unwrap(),
            Request::Connect(ConnectRequest { port: 8000 })
        );

        // The same guest port twice, port 0, and a host port in use are refused.
        let err = forwards.add(&request(8000, 0)).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Conflict);
        let err = forwards.add(&request(0, 0)).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        let err = forwards
            .add(&request(8001, forward.host_port))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Conflict);
        assert!(err.message.contains("is in use"), "{err}");

        // Closed when the sandbox ends: this process holds its listening socket no more.
        // Looked for among this process's descriptors, not by connecting nor in the kernel's
        // socket table: the freed port is anyone's, and a child another test forked
        // meanwhile holds a copy of every descriptor until it execs or exits.
        let listener = listening_inode(forward.host_port).expect("the forward listens");
        assert!(
            held_here(listener),
            "the forward's listener is this process's"
        );
        forwards.close_all().await;
        assert!(
            !held_here(listener),
            "the forward's listener outlived the sandbox"
        );
        assert!(read_forwards(dir.path()).is_empty());
        let err = forwards.add(&request(9000, 0)).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Conflict);
    }

    /// Past [`MAX_CONNECTIONS`] at once a connection waits in the listen backlog and is
    /// carried once another ends, instead of being closed unanswered.
    #[tokio::test]
    async fn connections_past_the_bound_wait_for_a_slot() {
        let (conn, mut agent, mut agent_writer) = conn().await;
        let dir = tempfile::tempdir().unwrap();
        let forwards = Forwards::new(conn, dir.path().to_path_buf(), None);
        let forward = forwards.add(&request(8000, 0)).await.unwrap();
        // An idle forward beside it holds no slot: the busy one gets all of them.
        forwards.add(&request(8001, 0)).await.unwrap();
        let mut clients = Vec::new();
        for _ in 0..=MAX_CONNECTIONS {
            let client = tokio::net::TcpStream::connect(("127.0.0.1", forward.host_port))
                .await
                .unwrap();
            clients.push(client);
        }
        let mut opened = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), async {
            while opened.len() < MAX_CONNECTIONS {
                let frame = agent.read_frame().await.unwrap().unwrap();
                if frame.kind == FrameKind::Open {
                    opened.push(frame.stream);
                }
            }
        })
        .await
        .expect("every slot carries a connection of the busy forward");
        // The agent refuses the first: its slot goes to the connection that waited.
        let refusal = ErrorBody {
            message: "connection refused".into(),
        };
        agent_writer
            .write_frame(&Frame::new(
                opened[0],
                FrameKind::Error,
                to_payload(&refusal),
            ))
            .await
            .unwrap();
        let next = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let frame = agent.read_frame().await.unwrap().unwrap();
                if frame.kind == FrameKind::Open {
                    return frame;
                }
            }
        })
        .await
        .expect("the waiting connection was carried once a slot was free");
        assert!(!opened.contains(&next.stream));
        // The waiting client was never closed: its bytes go to that tunnel.
        clients[MAX_CONNECTIONS].write_all(b"late").await.unwrap();
        let data = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let frame = agent.read_frame().await.unwrap().unwrap();
                if frame.kind == FrameKind::Data && frame.stream == next.stream {
                    return frame;
                }
            }
        })
        .await
        .expect("the late client's bytes were carried");
        assert!(data.payload.ends_with(b"late"), "{:?}", data.payload);
        forwards.close_all().await;
    }

    /// On the direct path, a connection to a guest port nobody listens on ends as the agent's
    /// path ends it: the client that sent a request reads an end of stream, not a reset.
    #[tokio::test]
    async fn a_refused_guest_port_closes_the_connection_cleanly() {
        if !nix::unistd::geteuid().is_root() {
            // Joining a network namespace needs CAP_SYS_ADMIN; the e2e tests run as root.
            return;
        }
        let (conn, _agent, _agent_writer) = conn().await;
        let dir = tempfile::tempdir().unwrap();
        let netns = std::fs::File::open("/proc/self/ns/net").unwrap();
        let forwards = Forwards::new(conn, dir.path().to_path_buf(), Some(netns));
        // A port nothing listens on: bound, then closed.
        let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let guest_port = unused.local_addr().unwrap().port();
        drop(unused);
        let forward = forwards.add(&request(guest_port, 0)).await.unwrap();
        let mut client = tokio::net::TcpStream::connect(("127.0.0.1", forward.host_port))
            .await
            .unwrap();
        client.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        let mut got = Vec::new();
        let read = client.read_to_end(&mut got).await;
        assert_eq!(read.map_err(|e| e.kind()), Ok(0), "a clean end, no bytes");
        forwards.close_all().await;
    }

    /// On the agent's path, a connection the guest refuses before answering (nothing listens
    /// on the port) ends as the direct path ends it, though the client sent more than the
    /// tunnel took in: an end of stream, not a reset.
    #[tokio::test]
    async fn a_connection_the_agent_refuses_closes_cleanly() {
        let (conn, mut agent, mut agent_writer) = conn().await;
        let dir = tempfile::tempdir().unwrap();
        let forwards = Forwards::new(conn, dir.path().to_path_buf(), None);
        let forward = forwards.add(&request(8000, 0)).await.unwrap();
        let client = tokio::net::TcpStream::connect(("127.0.0.1", forward.host_port))
            .await
            .unwrap();
        let (mut reading, mut writing) = client.into_split();
        // More than a tunnel's window: some of it is still unread when the refusal comes.
        let sending = tokio::spawn(async move {
            let sent = writing.write_all(&vec![b'x'; 8 << 20]).await;
            let _ = writing.shutdown().await;
            sent
        });
        let open = loop {
            let frame = agent.read_frame().await.unwrap().unwrap();
            if frame.kind == FrameKind::Open {
                break frame;
            }
        };
        let refusal = ErrorBody {
            message: "nothing listens on port 8000".into(),
        };
        agent_writer
            .write_frame(&Frame::new(
                open.stream,
                FrameKind::Error,
                to_payload(&refusal),
            ))
            .await
            .unwrap();
        let mut got = Vec::new();
        let read = reading.read_to_end(&mut got).await;
        assert_eq!(read.map_err(|e| e.kind()), Ok(0), "a clean end, no bytes");
        sending.await.unwrap().expect("everything sent was taken");
        forwards.close_all().await;
    }
}
