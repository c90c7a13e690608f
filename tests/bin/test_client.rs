//! `dynocap-test-client`: a client of a command server's socket written for the tests, to do
//! what the real `dynocap` never does: connect to a socket it did not compute (a server of
//! other authority), send requests that are not well formed, or say nothing; and, as
//! `listen-silent`, to be a server that never answers. It prints what the server answered,
//! one word: `accepted` (then `exited N` or `killed N` once the command ends), `not-served`,
//! `closed` (the server hung up without a word) or `no-answer`.
//!
//! `dynocap-test-client SOCKET request ARGV...`          a well-formed request for ARGV
//! `dynocap-test-client SOCKET seccomp-request ARGV...`  the same under an allow-all seccomp filter
//! `dynocap-test-client SOCKET no-go ARGV...`            the same, closing once accepted
//! `dynocap-test-client SOCKET fds N`                    `dynocap ps` carrying N descriptors
//! `dynocap-test-client SOCKET go-fds N`                 `dynocap ps`, its `Go` with N descriptors
//! `dynocap-test-client SOCKET truncated|oversized-length|garbage|too-large|silent`
//! `dynocap-test-client SOCKET listen-silent`            listen there, and never answer

use std::ffi::OsString;
use std::io::{IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::process::ExitCode;

use dynocap_client::wire::{self, Message, Request};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    accept, bind, connect, listen, sendmsg, socket, AddressFamily, Backlog, ControlMessage,
    MsgFlags, SockFlag, SockType, UnixAddr,
};

/// How long to wait for an answer before printing `no-answer`.
const ANSWER_WITHIN: u16 = 30_000;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (Some(socket_path), Some(mode)) = (args.first(), args.get(1)) else {
        eprintln!("usage: dynocap-test-client SOCKET MODE [ARGS...]");
        return ExitCode::from(2);
    };
    let socket_path = Path::new(socket_path);
    let rest = &args[2..];
    let mode = mode.to_string_lossy();
    if mode == "listen-silent" {
        return listen_silent(socket_path);
    }
    let conn = match connect_to(socket_path) {
        Ok(conn) => conn,
        Err(err) => {
            eprintln!("connecting to {}: {err}", socket_path.display());
            return ExitCode::from(3);
        }
    };
    let count = || {
        rest.first()
            .and_then(|n| n.to_str()?.parse::<usize>().ok())
            .expect("a number of descriptors")
    };
    let (sent, go) = match mode.as_ref() {
        "request" => (send_request(&conn, rest, 0), Some(2)),
        "seccomp-request" => {
            allow_all_seccomp();
            (send_request(&conn, rest, 0), Some(2))
        }
        "no-go" => (send_request(&conn, rest, 0), None),
        "fds" => (send_request(&conn, &ps(), count()), Some(2)),
        "go-fds" => (send_request(&conn, &ps(), 0), Some(count())),
        "truncated" => {
            let bytes = own_request(&ps()).encode();
            (send_raw(&conn, &bytes[..bytes.len() / 2], 0), Some(2))
        }
        "oversized-length" => {
            // The magic and umask, then an argv of 2^32-1 entries in a short packet.
            let mut bytes = b"DCQ1".to_vec();
            bytes.extend_from_slice(&0o022u32.to_le_bytes());
            bytes.extend_from_slice(&u32::MAX.to_le_bytes());
            bytes.extend_from_slice(&u32::MAX.to_le_bytes());
            (send_raw(&conn, &bytes, 0), Some(2))
        }
        "garbage" => (
            send_raw(&conn, b"\x00\xffnot a request at all\x7f", 0),
            Some(2),
        ),
        "too-large" => {
            // Room to send it: the default buffer of a socket is smaller.
            nix::sys::socket::setsockopt(&conn, nix::sys::socket::sockopt::SndBufForce, &(4 << 20))
                .expect("SO_SNDBUFFORCE (root)");
            (
                send_raw(&conn, &vec![b'x'; wire::MAX_REQUEST + 4096], 0),
                Some(2),
            )
        }
        "silent" => (Ok(()), Some(2)),
        other => {
            eprintln!("unknown mode {other}");
            return ExitCode::from(2);
        }
    };
    if let Err(err) = sent {
        eprintln!("sending: {err}");
        return ExitCode::from(3);
    }
    report(&conn, go);
    ExitCode::SUCCESS
}

fn ps() -> Vec<OsString> {
    vec!["dynocap".into(), "ps".into()]
}

fn connect_to(path: &Path) -> nix::Result<OwnedFd> {
    let conn = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(conn.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(conn)
}

/// A request as the real client makes it: this process's environment and umask.
fn own_request(args: &[OsString]) -> Request {
    let mask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    nix::sys::stat::umask(mask);
    let env = std::env::vars_os().map(|(key, value)| {
        let mut entry = key.into_vec();
        entry.push(b'=');
        entry.extend(value.into_vec());
        OsString::from_vec(entry)
    });
    let context = dynocap_client::rendezvous::Context::keyed(mask.bits(), env);
    Request {
        umask: context.umask,
        args: args.to_vec(),
        env: context.env,
    }
}

fn send_request(conn: &OwnedFd, args: &[OsString], fds: usize) -> nix::Result<()> {
    send_raw(conn, &own_request(args).encode(), fds)
}

/// Sends `bytes` as one packet with `count` descriptors: stdout, stderr, then more copies of
/// stdout (the client's own `Go` carries stdout and stderr).
fn send_raw(conn: &OwnedFd, bytes: &[u8], count: usize) -> nix::Result<()> {
    let fds: Vec<RawFd> = (0..count).map(|i| if i == 1 { 2 } else { 1 }).collect();
    let rights = [ControlMessage::ScmRights(&fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    sendmsg::<()>(
        conn.as_raw_fd(),
        &[IoSlice::new(bytes)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map(drop)
}

/// Prints the server's answer; for `accepted`, commits the command with `Go` and `go`
/// descriptors (or, for `None`, closes) and prints its end.
fn report(conn: &OwnedFd, go: Option<usize>) {
    let say = |word: &str| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{word}");
        let _ = out.flush();
    };
    match next(conn) {
        Some(Ok(Some(Message::Accepted(_)))) => say("accepted"),
        Some(Ok(Some(Message::NotServed))) => return say("not-served"),
        Some(Ok(None)) | Some(Err(_)) => return say("closed"),
        Some(Ok(Some(other))) => return say(&format!("unexpected {other:?}")),
        None => return say("no-answer"),
    }
    let Some(count) = go else {
        return;
    };
    if send_raw(conn, &Message::Go.encode(), count).is_err() {
        return say("closed");
    }
    loop {
        match next(conn) {
            Some(Ok(Some(Message::Alive))) => {}
            Some(Ok(Some(Message::Exited(code)))) => return say(&format!("exited {code}")),
            Some(Ok(Some(Message::Killed(signal)))) => return say(&format!("killed {signal}")),
            Some(Ok(Some(Message::NotServed))) => return say("not-served"),
            Some(Ok(Some(other))) => return say(&format!("unexpected {other:?}")),
            Some(Ok(None)) | Some(Err(_)) => return say("closed"),
            None => return say("no-answer"),
        }
    }
}

/// The next message, or `None` if none came within [`ANSWER_WITHIN`].
fn next(conn: &OwnedFd) -> Option<std::io::Result<Option<Message>>> {
    let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(ANSWER_WITHIN)) {
        Ok(n) if n > 0 => Some(wire::recv_message(conn.as_fd())),
        _ => None,
    }
}

/// Installs a seccomp filter that allows every call: it changes nothing this process may do,
/// only what the kernel shows of it (`Seccomp: 2`). Without `no_new_privs`, which needs
/// CAP_SYS_ADMIN (the tests run as root), so that seccomp is all that differs.
fn allow_all_seccomp() {
    let allow = libc::sock_filter {
        code: u16::try_from(libc::BPF_RET | libc::BPF_K).expect("a BPF opcode fits"),
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    };
    let program = libc::sock_fprog {
        len: 1,
        filter: std::ptr::from_ref(&allow).cast_mut(),
    };
    // SAFETY: `program` points to one valid instruction that outlives the call, which copies
    // it into the kernel.
    let done = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            std::ptr::from_ref(&program),
        )
    };
    assert_eq!(
        done,
        0,
        "installing a seccomp filter: {}",
        std::io::Error::last_os_error()
    );
}

/// Listens on `path` and accepts connections without ever answering: a server that stopped
/// answering, for the clients' deadline.
fn listen_silent(path: &Path) -> ExitCode {
    let _ = std::fs::remove_file(path);
    let listener = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    bind(
        listener.as_raw_fd(),
        &UnixAddr::new(path).expect("socket path"),
    )
    .expect("bind");
    listen(&listener, Backlog::new(16).expect("backlog")).expect("listen");
    println!("listening");
    let _ = std::io::stdout().flush();
    let mut held = Vec::new();
    while let Ok(fd) = accept(listener.as_raw_fd()) {
        // SAFETY: accept just returned this descriptor, owned by nothing else.
        held.push(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
    ExitCode::SUCCESS
}
