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
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::socket::{AddressFamily, SockFlag, SockType};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

/// How long connecting to a guest port may take, as the agent allows (a loopback connect
/// answers at once unless the listener's backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The pipe a direction's bytes pass through: a larger one moves more per `splice` pair.
const PIPE_BYTES: usize = 1 << 20;

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

/// Moves bytes both ways between `a` and `b` in the kernel until both directions ended; a
/// direction's end is passed on as a half-close. Returns the bytes moved from `a` to `b` and
/// back.
pub(super) async fn relay(a: TcpStream, b: TcpStream) -> io::Result<(u64, u64)> {
    dynocap_netproxy::splice::splice_both_ways(&a, &b, PIPE_BYTES).await
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

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
        // A port bound without SO_REUSEADDR and not listening: no other test's listener can
        // take it meanwhile (a dropped listener's port could be, and was, taken in CI).
        let unheard = tokio::net::TcpSocket::new_v4().unwrap();
        unheard.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = unheard.local_addr().unwrap().port();
        let refused = net.connect(port).await.unwrap_err();
        assert_eq!(
            refused.kind(),
            io::ErrorKind::ConnectionRefused,
            "{refused}"
        );
    }
}
