//! The short path of a jail's port forwards: the supervisor connects to the guest port
//! itself and moves the bytes between the two sockets with `splice(2)`, so a forwarded
//! connection crosses one process between the client and the guest's server, as on the
//! host's own loopback, instead of four (the supervisor, the agent channel's framing and the
//! agent).
//!
//! A jail shares the host's kernel: a socket made in its network namespace reaches what a
//! command in the guest would reach, wherever the process holding it runs. So a thread of the
//! supervisor joins that namespace ([`GuestNet`]) and only makes sockets there; connecting and
//! relaying happen on the supervisor's other threads, which stay in the host's namespace. The
//! guest's server is no more trusted than before: its bytes are moved, never read. Joining
//! needs `CAP_SYS_ADMIN` (a root supervisor); without it, and for a VM (its own kernel), the
//! forward goes through the agent as before (`super::accept_loop`).

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::socket::{AddressFamily, SockFlag, SockType};
use tokio::io::Interest;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

/// How long connecting to a guest port may take, as the agent allows (a loopback connect
/// answers at once unless the listener's backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The pipe a direction's bytes pass through: a larger one moves more per `splice` pair.
const PIPE_BYTES: libc::c_int = 1 << 20;

type Ask = (AddressFamily, oneshot::Sender<io::Result<OwnedFd>>);

/// A thread in a guest's network namespace that makes TCP sockets there. It ends when this
/// is dropped.
pub(super) struct GuestNet {
    asks: mpsc::Sender<Ask>,
}

impl GuestNet {
    /// Starts the thread in the network namespace `netns` (a jail's); an error when this
    /// process may not join it.
    pub fn start(netns: File) -> io::Result<Self> {
        let (asks, asked) = mpsc::channel::<Ask>();
        let (joined_tx, joined) = mpsc::sync_channel::<io::Result<()>>(1);
        std::thread::Builder::new()
            .name("guest-net".into())
            .spawn(move || {
                let entered = nix::sched::setns(&netns, CloneFlags::CLONE_NEWNET);
                drop(netns);
                let ok = entered.is_ok();
                let _ = joined_tx.send(entered.map_err(io::Error::from));
                if !ok {
                    return;
                }
                for (family, reply) in asked {
                    let made = nix::sys::socket::socket(
                        family,
                        SockType::Stream,
                        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                        None,
                    );
                    let _ = reply.send(made.map_err(io::Error::from));
                }
            })?;
        joined
            .recv()
            .map_err(|_| io::Error::other("the guest network thread ended"))??;
        Ok(Self { asks })
    }

    /// Connects to `port` on the guest's loopback: 127.0.0.1, else ::1 (a server listening
    /// on IPv6 alone is still the sandbox's server on that port).
    pub async fn connect(&self, port: u16) -> io::Result<TcpStream> {
        let attempt = async {
            let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            match self.connect_to(v4).await {
                Ok(stream) => Ok(stream),
                Err(err) => {
                    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
                    self.connect_to(v6).await.map_err(|_| err)
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, attempt)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting took over {}s", CONNECT_TIMEOUT.as_secs()),
                )
            })?
    }

    async fn connect_to(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let family = if addr.is_ipv6() {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let (reply, made) = oneshot::channel();
        self.asks
            .send((family, reply))
            .map_err(|_| io::Error::other("the guest network thread ended"))?;
        let fd = made
            .await
            .map_err(|_| io::Error::other("the guest network thread ended"))??;
        let stream = TcpSocket::from_std_stream(std::net::TcpStream::from(fd))
            .connect(addr)
            .await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// Moves bytes both ways between `a` and `b` until both directions ended; a direction's end
/// is passed on as a half-close. Returns the bytes moved from `a` to `b` and back.
pub(super) async fn relay(a: TcpStream, b: TcpStream) -> io::Result<(u64, u64)> {
    tokio::try_join!(one_way(&a, &b), one_way(&b, &a))
}

/// `from` → `to` through a pipe, by `splice`: the bytes stay in the kernel. The pipe is
/// emptied before the next read, so a read that would block means `from` has nothing (never
/// a full pipe), and a write that would block means `to` is full: each readiness is cleared
/// for the right socket.
async fn one_way(from: &TcpStream, to: &TcpStream) -> io::Result<u64> {
    let pipe = Pipe::new()?;
    let mut moved = 0u64;
    loop {
        let filled = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                splice(from.as_raw_fd(), pipe.write.as_raw_fd(), pipe.room)
            }) {
                Ok(n) => break n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        };
        if filled == 0 {
            // The peer stays open for the other direction; a socket already reset has no
            // write side to shut.
            let _ = nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write);
            return Ok(moved);
        }
        let mut left = filled;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), to.as_raw_fd(), left)
            }) {
                Ok(n) => left -= n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }
        moved += filled as u64;
    }
}

/// One `splice` of up to `len` bytes, never blocking on the pipe (the sockets are
/// non-blocking themselves).
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the call (owned by the caller's sockets and
    // pipe); null offsets are what splice takes for sockets and pipes.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// What one read may put in it.
    room: usize,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // A larger pipe is an optimisation: the default size still works.
        let room = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES))
            .ok()
            .and_then(|size| usize::try_from(size).ok())
            .unwrap_or(1 << 16);
        Ok(Self { read, write, room })
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A connected pair of loopback sockets.
    async fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn the_relay_carries_both_ways_whole_and_passes_on_half_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (mut client, near) = pair(&listener).await;
        let (far, mut server) = pair(&listener).await;
        let relayed = tokio::spawn(relay(near, far));

        // More than a pipe holds, each way at once.
        let up: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        let (got_up, got_down, (), ()) = tokio::join!(
            async {
                let mut got = Vec::new();
                server_read.read_to_end(&mut got).await.unwrap();
                got
            },
            async {
                let mut got = Vec::new();
                client_read.read_to_end(&mut got).await.unwrap();
                got
            },
            async {
                client_write.write_all(&up).await.unwrap();
                // The client's half-close reaches the server, which still answers.
                client_write.shutdown().await.unwrap();
            },
            async {
                server_write.write_all(&down).await.unwrap();
                server_write.shutdown().await.unwrap();
            },
        );
        assert!(got_up == up, "upload arrived whole");
        assert!(got_down == down, "download arrived whole");
        let (a_to_b, b_to_a) = relayed.await.unwrap().unwrap();
        assert_eq!((a_to_b, b_to_a), (up.len() as u64, down.len() as u64));
    }

    /// The thread joins a network namespace (here the supervisor's own, as root) and its
    /// sockets reach a server there; a port nobody listens on is refused. Without the
    /// privilege to join, starting says so (the forward then goes through the agent).
    #[tokio::test]
    async fn sockets_made_in_a_namespace_reach_its_servers() {
        let netns = File::open("/proc/self/ns/net").unwrap();
        let net = match GuestNet::start(netns) {
            Ok(net) => net,
            Err(err) => {
                assert!(!nix::unistd::geteuid().is_root(), "{err}");
                assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
                return;
            }
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (connected, accepted) = tokio::join!(net.connect(port), listener.accept());
        let mut connected = connected.unwrap();
        let (mut accepted, _) = accepted.unwrap();
        connected.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        accepted.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        drop(listener);
        let refused = net.connect(port).await.unwrap_err();
        assert_eq!(
            refused.kind(),
            io::ErrorKind::ConnectionRefused,
            "{refused}"
        );
    }
}
