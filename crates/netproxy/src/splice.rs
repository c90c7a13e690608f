//! Relaying between two TCP sockets, for a client connection that reached the proxy as a
//! socket of its own (a jail's supervisor listens in the guest's network namespace) rather
//! than as a tunnel over the agent channel.
//!
//! Each direction first copies through a buffer in user space, each chunk passing the
//! tunnel's [`TlsWatch`] as [`crate::relay::relay`] does; once the watch has finished (the
//! server's real ServerHello has passed and the client has gone encrypted: no plaintext
//! ClientHello can follow, see `watch.rs`), nothing reads the bytes any more, and the
//! direction moves them with `splice(2)` through a pipe, so they stay in the kernel. A
//! tunnel without a watch (SSH, whose version line was judged before) splices from the
//! start. Counts, half-closes and errors are those of the buffered relay.
//!
//! [`splice_both_ways`] is the same kernel copy for two sockets whose bytes nobody reads at
//! all: a jail's port forwards.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::relay::{relay_error, Counts, RelayError};
use crate::watch::TlsWatch;

/// The largest chunk a direction reads while its bytes are watched: the handshake is a few
/// KiB, and the watch copies what it releases.
const WATCHED_CHUNK: usize = 64 * 1024;

/// Which way a direction runs: the client's bytes go up, the server's come down.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Up,
    Down,
}

/// As [`crate::relay::relay`], between two sockets: writes `first` upstream, then copies both
/// ways until each side has shut down its half. `buffer_size` bounds what a direction holds at
/// once (its pipe), as it bounds the buffered relay's buffers.
pub(crate) async fn relay_sockets(
    client: &TcpStream,
    upstream: &TcpStream,
    first: &[u8],
    buffer_size: usize,
    watch: Option<TlsWatch>,
) -> (Counts, Option<RelayError>) {
    let up = AtomicU64::new(0);
    let down = AtomicU64::new(0);
    let result = async {
        write_all(upstream, first).await?;
        up.fetch_add(first.len() as u64, Ordering::Relaxed);
        tokio::try_join!(
            one_way(client, upstream, Side::Up, watch.clone(), &up, buffer_size),
            one_way(upstream, client, Side::Down, watch, &down, buffer_size),
        )
    }
    .await;
    let counts = Counts {
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
    };
    (counts, result.err().map(relay_error))
}

/// One direction, `from` → `to`, until `from` ends (then `to`'s write half is shut down) or
/// an error. `counted` gets the bytes written upstream (up) or read from it (down), as the
/// buffered relay counts them.
async fn one_way(
    from: &TcpStream,
    to: &TcpStream,
    side: Side,
    watch: Option<TlsWatch>,
    counted: &AtomicU64,
    buffer_size: usize,
) -> io::Result<()> {
    if let Some(watch) = watch {
        let mut buf = vec![0u8; WATCHED_CHUNK.min(buffer_size.max(1))];
        while !watch.finished() {
            let n = read(from, &mut buf).await?;
            if n == 0 {
                // Bytes the watch still holds are an unfinished message: never forwarded.
                end(to);
                return Ok(());
            }
            let read = &buf[..n];
            match side {
                Side::Up => {
                    let pass = watch.client_bytes(read).map_err(|refused| {
                        io::Error::new(io::ErrorKind::PermissionDenied, refused)
                    })?;
                    write_all(to, &pass).await?;
                    counted.fetch_add(pass.len() as u64, Ordering::Relaxed);
                }
                Side::Down => {
                    counted.fetch_add(n as u64, Ordering::Relaxed);
                    // The server's bytes are seen before the client gets them: a
                    // HelloRetryRequest is known before the client can answer it.
                    watch.server_bytes(read);
                    write_all(to, read).await?;
                }
            }
        }
    }
    // Nothing reads the bytes from here on.
    let pipe = Pipe::new(buffer_size)?;
    let count = |n: usize| {
        counted.fetch_add(n as u64, Ordering::Relaxed);
    };
    match side {
        Side::Up => splice_until_end(from, to, &pipe, |_| {}, count).await,
        Side::Down => splice_until_end(from, to, &pipe, count, |_| {}).await,
    }
}

/// Moves bytes both ways between `a` and `b` with `splice(2)`, through a pipe of
/// `pipe_bytes` each way, until both directions have ended; each end is passed on as a
/// half-close. Returns the bytes moved from `a` to `b` and back. For sockets whose bytes
/// nobody needs to read (a jail's port forward).
pub async fn splice_both_ways(
    a: &TcpStream,
    b: &TcpStream,
    pipe_bytes: usize,
) -> io::Result<(u64, u64)> {
    async fn one_way(from: &TcpStream, to: &TcpStream, pipe_bytes: usize) -> io::Result<u64> {
        let pipe = Pipe::new(pipe_bytes)?;
        let mut moved = 0u64;
        splice_until_end(from, to, &pipe, |n| moved += n as u64, |_| {}).await?;
        Ok(moved)
    }
    tokio::try_join!(one_way(a, b, pipe_bytes), one_way(b, a, pipe_bytes))
}

/// `from` → `to` through `pipe` until `from` ends (then `to`'s write half is shut down) or an
/// error; `read` is told each chunk taken from `from`, `written` each one given to `to`. The
/// pipe is emptied before the next read, so a read that would block means `from` has nothing
/// (never a full pipe), and a write that would block means `to` is full: each readiness is
/// cleared for the right socket.
async fn splice_until_end(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    mut read: impl FnMut(usize),
    mut written: impl FnMut(usize),
) -> io::Result<()> {
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
            end(to);
            return Ok(());
        }
        read(filled);
        let mut left = filled;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), to.as_raw_fd(), left)
            }) {
                Ok(n) => {
                    left -= n;
                    written(n);
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }
    }
}

/// Shuts down `to`'s write half: the peer sees the end of this direction while the other
/// keeps flowing. A socket already reset has no write half to shut.
fn end(to: &TcpStream) {
    // SAFETY: the descriptor is `to`'s, open for the call.
    unsafe { libc::shutdown(to.as_raw_fd(), libc::SHUT_WR) };
}

async fn read(from: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        from.readable().await?;
        match from.try_read(buf) {
            Ok(n) => return Ok(n),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
            Err(err) => return Err(err),
        }
    }
}

async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// One `splice` of up to `len` bytes, never blocking on the pipe (the sockets are
/// non-blocking themselves).
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the call (the caller's sockets and pipe); null
    // offsets are what splice takes for sockets and pipes.
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

/// A direction's pipe.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// What one read may put in it.
    room: usize,
}

impl Pipe {
    fn new(size: usize) -> io::Result<Pipe> {
        let mut fds: [libc::c_int; 2] = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both descriptors are open and nothing else owns them.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // The size is rounded up to pages by the kernel; a pipe it will not grow (over
        // pipe-max-size, or the user's pipe pages) keeps its default, which still works.
        let wanted = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
        // SAFETY: F_SETPIPE_SZ on a pipe descriptor we own.
        let set = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, wanted) };
        let room = usize::try_from(set).unwrap_or(1 << 16);
        Ok(Pipe { read, write, room })
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
    async fn splicing_carries_both_ways_whole_and_passes_on_half_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (mut client, near) = pair(&listener).await;
        let (far, mut server) = pair(&listener).await;
        let relayed = tokio::spawn(async move { splice_both_ways(&near, &far, 1 << 20).await });

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
}
