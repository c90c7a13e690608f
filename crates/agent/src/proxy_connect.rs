//! `dynocap-agent proxy-connect LISTENER HOST PORT`: ssh's ProxyCommand inside the guest. It
//! asks the egress listener for a `CONNECT HOST:PORT` tunnel and then relays stdin and stdout
//! over it, so an SSH clone goes through the host's proxy like every other connection.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::process::ExitCode;

/// Longest proxy response head read before the tunnel starts.
const MAX_HEAD: usize = 16 * 1024;
/// Bytes moved per read(2) and write(2) of the relay.
const COPY_BUFFER: usize = 64 * 1024;

/// Why no tunnel was had, or the relay could not start: what ssh shows the user.
#[derive(Debug, thiserror::Error)]
enum ProxyError {
    #[error("{host}:{port} is not a host and port")]
    NotAHostAndPort { host: String, port: String },
    #[error("cannot reach the egress proxy at {listener}: {source}")]
    Unreachable {
        listener: String,
        source: std::io::Error,
    },
    #[error("cannot talk to the egress proxy: {0}")]
    Send(#[source] std::io::Error),
    #[error("the egress proxy's answer is too long")]
    AnswerTooLong,
    #[error("the egress proxy closed the connection")]
    Closed,
    #[error("reading the egress proxy's answer: {0}")]
    Receive(#[source] std::io::Error),
    /// The proxy's status line and the reason in its body.
    #[error("the egress proxy refused {host}:{port}: {status} {reason}")]
    Refused {
        host: String,
        port: String,
        status: String,
        reason: String,
    },
    #[error("cannot share the proxy connection between two threads: {0}")]
    Share(#[source] std::io::Error),
}

pub fn run(args: &[String]) -> ExitCode {
    let [listener, host, port] = args else {
        eprintln!("usage: dynocap-agent proxy-connect 127.0.0.1:PORT HOST PORT");
        return ExitCode::from(2);
    };
    match connect(listener, host, port) {
        Ok(stream) => relay(stream),
        Err(err) => {
            eprintln!("dynocap: {err}");
            ExitCode::from(1)
        }
    }
}

fn connect(listener: &str, host: &str, port: &str) -> Result<TcpStream, ProxyError> {
    if host.is_empty()
        || host
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        || port.parse::<u16>().is_err()
    {
        return Err(ProxyError::NotAHostAndPort {
            host: host.to_owned(),
            port: port.to_owned(),
        });
    }
    let mut stream = TcpStream::connect(listener).map_err(|source| ProxyError::Unreachable {
        listener: listener.to_owned(),
        source,
    })?;
    let _ = stream.set_nodelay(true);
    let request = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(ProxyError::Send)?;
    // Byte by byte, so no byte of the tunnelled stream is read into a buffer here.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err(ProxyError::AnswerTooLong);
        }
        match stream.read(&mut byte) {
            Ok(0) => return Err(ProxyError::Closed),
            Ok(_) => head.push(byte[0]),
            Err(err) => return Err(ProxyError::Receive(err)),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        return Ok(stream);
    }
    // The refusal's reason is in the body.
    let mut body = Vec::new();
    let _ = stream.take(4096).read_to_end(&mut body);
    let reason = String::from_utf8_lossy(&body);
    Err(ProxyError::Refused {
        host: host.to_owned(),
        port: port.to_owned(),
        status: status.trim().to_owned(),
        reason: reason.trim().to_owned(),
    })
}

fn relay(stream: TcpStream) -> ExitCode {
    // Descriptors 0 and 1 as plain, unbuffered files: a binary record that does not end in a
    // newline would wait in `Stdout`'s line buffer while ssh waits for it.
    let (input, output) = match (
        std::io::stdin().as_fd().try_clone_to_owned(),
        std::io::stdout().as_fd().try_clone_to_owned(),
    ) {
        (Ok(input), Ok(output)) => (File::from(input), File::from(output)),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("dynocap: cannot use stdin and stdout: {err}");
            return ExitCode::from(1);
        }
    };
    match relay_between(stream, input, output) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("dynocap: {err}");
            ExitCode::from(1)
        }
    }
}

/// Relays `input` to `stream` on a thread and `stream` to `output` on this one, until the
/// stream ends or `output` is closed.
fn relay_between(
    stream: TcpStream,
    mut input: impl Read + Send + 'static,
    mut output: impl Write,
) -> Result<(), ProxyError> {
    let mut upstream_write = stream.try_clone().map_err(ProxyError::Share)?;
    // Detached: it ends when ssh closes our stdin, or when the process exits.
    std::thread::spawn(move || {
        let _ = copy_without_splice(&mut input, &mut upstream_write);
        let _ = upstream_write.shutdown(Shutdown::Write);
    });
    let mut upstream_read = stream;
    // How the connection ended is ssh's to report: it sees its pipe close either way.
    let _ = copy_without_splice(&mut upstream_read, &mut output);
    Ok(())
}

/// Copies until `reader` ends, with read(2) and write(2) only.
///
/// Not `std::io::copy`: on Linux it moves bytes between a socket and a pipe with splice(2),
/// and splice(2) from a socket into a pipe holds the pipe's lock while it waits for the
/// socket. Every read of the pipe, even a non-blocking one, then blocks on that lock. ssh reads
/// the server's banner and KEXINIT from our stdout pipe, while we already wait in splice(2)
/// for the server's next bytes, which the server sends only after ssh's KEXINIT: neither side
/// moves until sshd's LoginGraceTime closes the connection. A read(2) of the socket waits
/// holding nothing, and a write(2) to the pipe holds its lock only while it copies. The other
/// way, splice(2) from the stdin pipe into a full socket would likewise hold that pipe's lock,
/// and block ssh's writes, until the tunnel drains.
fn copy_without_splice(reader: &mut impl Read, writer: &mut impl Write) -> std::io::Result<u64> {
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut copied = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(copied),
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        writer.write_all(&buf[..n])?;
        copied += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    const BANNER: &[u8] = b"SSH-2.0-OpenSSH_9.6\r\n";
    /// Only turns a deadlock into a failure instead of a hung test; nothing is timed.
    const DEADLOCK_WATCHDOG: Duration = Duration::from_secs(60);

    /// The scheduler state of thread `tid` of this process (`R`, `S`, ...).
    fn thread_state(tid: &str) -> char {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
            .expect("a live thread has a stat file");
        // The state follows the command name, which ends at the last ')'.
        let after_name = &stat[stat.rfind(')').expect("stat has the name in parentheses") + 1..];
        after_name
            .trim_start()
            .chars()
            .next()
            .expect("stat has a state")
    }

    /// Waits until `pipe` has bytes to read, without reading it: poll(2) does not take the
    /// pipe's lock, so it cannot be blocked by the relay.
    fn wait_readable(pipe: &impl AsRawFd) {
        let mut fds = libc::pollfd {
            fd: pipe.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, and the descriptor stays open for the call.
        let ready = unsafe { libc::poll(&mut fds, 1, -1) };
        assert_eq!(ready, 1, "poll: {}", std::io::Error::last_os_error());
    }

    /// What ssh does with its ProxyCommand: read the server's banner from the command's
    /// stdout pipe while the command waits for the server, then answer on its stdin pipe. The
    /// server speaks again only after the answer, as sshd sends nothing after its KEXINIT
    /// until the client's.
    #[test]
    fn ssh_reads_the_servers_banner_while_the_relay_waits_for_the_server() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let client = TcpStream::connect(listener.local_addr().expect("a bound address"))
            .expect("connect to the loopback listener");
        let (mut server, _) = listener.accept().expect("accept the relay's connection");
        let (stdin_read, mut stdin_write) = std::io::pipe().expect("a pipe for stdin");
        let (mut stdout_read, stdout_write) = std::io::pipe().expect("a pipe for stdout");

        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let relay = std::thread::spawn(move || {
            let me = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
            let tid = me
                .file_name()
                .expect("task/TID")
                .to_string_lossy()
                .into_owned();
            tid_tx.send(tid).expect("the test waits for the tid");
            relay_between(client, stdin_read, stdout_write)
        });
        let relay_tid = tid_rx.recv().expect("the relay thread sends its tid");

        let sshd = std::thread::spawn(move || {
            server.write_all(BANNER).expect("send the banner");
            server
                .set_read_timeout(Some(DEADLOCK_WATCHDOG))
                .expect("set a read timeout");
            let mut answer = vec![0u8; BANNER.len()];
            let got = server.read_exact(&mut answer);
            // Ends the relay, deadlocked or not.
            let _ = server.shutdown(Shutdown::Both);
            got.map(|()| answer)
        });

        // The banner is in the pipe, and the relay is back to waiting for the server: the
        // moment ssh reads.
        wait_readable(&stdout_read);
        while thread_state(&relay_tid) != 'S' {
            std::thread::yield_now();
        }
        let mut banner = vec![0u8; BANNER.len()];
        stdout_read
            .read_exact(&mut banner)
            .expect("read the banner from stdout");
        assert_eq!(banner, BANNER);
        stdin_write.write_all(&banner).expect("answer on stdin");

        let answer = sshd.join().expect("the server thread does not panic");
        let answer = answer.expect(
            "the server never got ssh's answer: the relay held ssh's stdout pipe while it \
             waited for the server",
        );
        assert_eq!(answer, BANNER);
        relay
            .join()
            .expect("the relay does not panic")
            .expect("the relay ends cleanly when the server closes");
    }

    /// What ssh shows the user when no tunnel is had, for each way of not having one, is the
    /// text it always showed; the proxy here is a real one-shot server on loopback.
    #[test]
    fn refusals_read_as_they_always_did() {
        let err = connect("127.0.0.1:1", "bad host", "22").expect_err("not a host");
        assert_eq!(err.to_string(), "bad host:22 is not a host and port");

        let proxy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let listener = proxy.local_addr().expect("a bound address").to_string();
        let answering = std::thread::spawn(move || {
            let (mut client, _) = proxy.accept().expect("accept");
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                client.read_exact(&mut byte).expect("the request");
                head.push(byte[0]);
            }
            client
                .write_all(b"HTTP/1.1 403 Forbidden\r\n\r\nexample.org is not allowed\n")
                .expect("answer");
            String::from_utf8_lossy(&head).into_owned()
        });
        let err = connect(&listener, "example.org", "443").expect_err("refused");
        assert_eq!(
            answering.join().expect("the proxy"),
            "CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n"
        );
        assert!(matches!(err, ProxyError::Refused { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the egress proxy refused example.org:443: HTTP/1.1 403 Forbidden example.org is not \
             allowed"
        );

        // Nothing listens on a port just freed: the proxy is unreachable, and why is the source.
        let freed = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("a bound address")
            .to_string();
        let err = connect(&freed, "example.org", "443").expect_err("unreachable");
        assert!(
            err.to_string()
                .starts_with(&format!("cannot reach the egress proxy at {freed}: ")),
            "{err}"
        );
        assert!(std::error::Error::source(&err).is_some());
    }
}
