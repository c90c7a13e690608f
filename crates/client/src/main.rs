//! `dynocap`: the command a person types. The commands of a sandbox's cycle (`run`, `exec`,
//! `destroy`, `ps`) it hands to its home's command server (see the crate docs), which runs
//! them with this process's stdout, stderr, environment and umask, and it ends as the command
//! ends: the same exit code, or the same signal. Ctrl-C and `kill` end the command there.
//!
//! Every other command, and every command when there is no server yet, the server does not
//! serve it (or this process), or the server does not accept it within the deadline
//! (`dynocap_client::deadline`), runs in `dynocap-core` itself, as an `exec` of this
//! process; a missing server is started for the next command. Nothing runs twice: the server
//! runs a command only once this process commits it (`Go`), after which this process waits
//! for its end, and gives up with an error only on a server that falls silent or dies.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use dynocap_client::rendezvous;
use dynocap_client::wire::{self, Message, Request};
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{self, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    connect, getsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, UnixAddr,
};

/// The signals that end a command; the server ends it, and this process then ends of the
/// same signal. Others act on this process as they would on any.
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// The commands the server runs (`commands::is_served` in `dynocap-core` decides; this only
/// spares the others a round trip): the ones a sandbox's cycle is made of.
const SERVED: [&str; 4] = ["run", "exec", "destroy", "ps"];

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let core = match std::env::current_exe() {
        Ok(exe) => rendezvous::core_beside(&exe),
        Err(err) => {
            eprintln!("dynocap: cannot find where dynocap is installed (/proc/self/exe): {err}");
            return ExitCode::from(127);
        }
    };
    if let Some(code) = through_server(&core, &args) {
        return code;
    }
    run_core(&core, &args)
}

/// Replaces this process with `dynocap-core` running the command.
fn run_core(core: &Path, args: &[OsString]) -> ExitCode {
    let program_name = args.first().cloned().unwrap_or_else(|| "dynocap".into());
    let err = Command::new(core)
        .arg0(program_name)
        .args(args.iter().skip(1))
        .exec();
    eprintln!(
        "dynocap: cannot run {}: {err}; install {} beside dynocap (cargo build --release \
         builds both into target/release)",
        core.display(),
        dynocap_client::CORE_BINARY
    );
    ExitCode::from(127)
}

/// The command's end, if the home's server ran it; `None` if it did not (no server, or one
/// that cannot serve this command or this process), and nothing ran.
fn through_server(core: &Path, args: &[OsString]) -> Option<ExitCode> {
    if std::env::var_os(dynocap_client::SERVER_SWITCH_ENV).is_some_and(|v| v == "0") {
        return None;
    }
    let subcommand = args
        .iter()
        .skip(1)
        .find(|arg| !arg.as_bytes().starts_with(b"-"));
    if !subcommand.is_some_and(|name| SERVED.iter().any(|served| name == *served)) {
        return None;
    }
    // A relative home is this directory's: the server, which works from `/`, would not serve
    // it (see `serve` in dynocap-core), so none is looked for or started.
    let home = rendezvous::home_dir(|name| std::env::var_os(name)).filter(|h| h.is_absolute())?;
    let run_dir = home.join("run");
    let context = rendezvous::Context::of_this_process();
    let socket_path = rendezvous::socket_path(&run_dir, core, &context).ok()?;
    let socket = match connect_to(&socket_path) {
        Ok(socket) => socket,
        Err(Errno::ENOENT | Errno::ECONNREFUSED) => {
            start_server(core, &socket_path, &run_dir);
            return None;
        }
        // EAGAIN: its backlog is full, as a server that stopped accepting leaves it.
        Err(_) => return None,
    };
    // A server that is stopped (SIGSTOP, a debugger) would not answer: no use waiting.
    if server_is_stopped(&socket) {
        return None;
    }
    let deadline = dynocap_client::deadline();
    // Blocked from here, so that none is lost between the request and `Go`; if the command
    // is not served after all they are unblocked, and act on this process as usual.
    let mut forwarded = SigSet::empty();
    for signal in FORWARDED {
        forwarded.add(signal);
    }
    let mut previous_mask = SigSet::empty();
    signal::sigprocmask(
        SigmaskHow::SIG_BLOCK,
        Some(&forwarded),
        Some(&mut previous_mask),
    )
    .ok()?;
    let unblock = || {
        let _ = signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&previous_mask), None);
    };
    // Made before the command is sent: once it runs there, this process must wait for it.
    let Ok(signals) = SignalFd::with_flags(&forwarded, SfdFlags::SFD_CLOEXEC) else {
        unblock();
        return None;
    };
    let Some(server) = send_command(&socket, args, context, deadline) else {
        unblock();
        return None;
    };
    let end = await_end(&socket, &signals, server, deadline, args);
    if end.is_none() {
        unblock();
    }
    end
}

fn connect_to(path: &Path) -> Result<OwnedFd, Errno> {
    // Non-blocking: a connect that would wait for room in the backlog fails instead, and
    // every later read and write is given its deadline with `poll`.
    let socket = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    connect(socket.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(socket)
}

/// Whether the process listening on `socket` is stopped or traced (state `T` or `t`), which
/// the kernel says of the pid it gives for the listener (`SO_PEERCRED`).
fn server_is_stopped(socket: &OwnedFd) -> bool {
    let Ok(peer) = getsockopt(socket, sockopt::PeerCredentials) else {
        return false;
    };
    let Ok(stat) = std::fs::read(format!("/proc/{}/stat", peer.pid())) else {
        return false;
    };
    // The state follows the command's name, which ends at the last `)`.
    stat.iter()
        .rposition(|b| *b == b')')
        .and_then(|end| stat.get(end + 2))
        .is_some_and(|state| matches!(state, b'T' | b't'))
}

/// Sends the command and `context` (the one its socket was named for), then, once the server
/// accepts it within `deadline`, commits it to the server with this process's stdout and
/// stderr; the server's pid once the command is the server's, `None` if nothing ran.
fn send_command(
    socket: &OwnedFd,
    args: &[OsString],
    context: rendezvous::Context,
    deadline: Duration,
) -> Option<i32> {
    let request = Request {
        umask: context.umask,
        args: args.to_vec(),
        env: context.env,
    };
    wire::send_request(socket.as_fd(), &request).ok()?;
    let until = Instant::now() + deadline;
    // `NotServed`, an error, the end of the connection or the deadline: nothing ran, and
    // nothing will: without `Go` the server runs nothing, and this process's connection
    // closes when it returns (or execs `dynocap-core`, the socket being close-on-exec).
    let server = loop {
        if !readable_before(socket, until) {
            return None;
        }
        match wire::recv_message(socket.as_fd()) {
            Ok(Some(Message::Accepted(pid))) => break pid,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => return None,
        }
    };
    // A closed stdout or stderr cannot be passed (EBADF): the server, given no `Go`, runs
    // nothing, and the command runs here.
    wire::send_go(socket.as_fd(), [1, 2]).ok()?;
    Some(server)
}

/// Whether `socket` has something to read (or has ended) before `until`.
fn readable_before(socket: &OwnedFd, until: Instant) -> bool {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) | Err(Errno::EINTR) => {}
            Ok(_) => return true,
            Err(_) => return false,
        }
    }
}

/// Forwards signals until the server says how the command ended, then ends the same way. A
/// server that says nothing for `deadline` (stopped or stuck: a running one says it is alive
/// well within it) is given up on: the command ends with an error here, and there as soon as
/// the server runs again and finds its client gone. `None` if the server ran nothing after
/// all (`Go` came too late for it): the command is this process's to run.
fn await_end(
    socket: &OwnedFd,
    signals: &SignalFd,
    server: i32,
    deadline: Duration,
    args: &[OsString],
) -> Option<ExitCode> {
    let mut heard = Instant::now();
    // A signal forwarded before a `NotServed` (nothing ran) is this process's own to die of.
    let mut forwarded = None;
    loop {
        let left = (heard + deadline).saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Some(lost(
                args,
                &format!(
                    "the command server (pid {server}) has not answered for {} ms (stopped or \
                     stuck); its command is abandoned, and ends as soon as the server runs again",
                    deadline.as_millis()
                ),
            ));
        }
        let mut fds = [
            PollFd::new(socket.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(err) => {
                return Some(lost(
                    args,
                    &format!("waiting for the command server: {err}"),
                ))
            }
        }
        let signal_ready = fds[1].any().unwrap_or(false);
        let socket_ready = fds[0].any().unwrap_or(false);
        if signal_ready {
            if let Ok(Some(info)) = signals.read_signal() {
                forward(socket, info.ssi_signo);
                forwarded = i32::try_from(info.ssi_signo).ok();
            }
        }
        if socket_ready {
            match wire::recv_message(socket.as_fd()) {
                Ok(Some(Message::Exited(code))) => {
                    return Some(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)))
                }
                Ok(Some(Message::Killed(number))) => return Some(die_of(number)),
                Ok(Some(Message::NotServed)) => return forwarded.map(die_of),
                Ok(Some(_)) => heard = Instant::now(),
                Ok(None) => {
                    return Some(lost(
                        args,
                        "the command server ended before the command did",
                    ));
                }
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                    ) => {}
                Err(err) => {
                    return Some(lost(
                        args,
                        &format!("reading from the command server: {err}"),
                    ))
                }
            }
        }
    }
}

/// Passes a signal on to the server, which ends the command.
fn forward(socket: &OwnedFd, number: u32) {
    if let Ok(number) = i32::try_from(number) {
        let _ = wire::send_message(socket.as_fd(), Message::Signal(number));
    }
}

/// Ends this process by the signal that ended the command, as its parent would have seen it.
fn die_of(number: i32) -> ExitCode {
    if let Ok(signal) = Signal::try_from(number) {
        // SAFETY: restoring the default disposition installs no handler.
        let _ = unsafe { signal::signal(signal, SigHandler::SigDfl) };
        let mut only = SigSet::empty();
        only.add(signal);
        let _ = signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&only), None);
        let _ = signal::raise(signal);
    }
    // A signal that did not end this process, or one this build does not know: the shell's
    // convention.
    ExitCode::from(u8::try_from(128 + (number & 0x7f)).unwrap_or(255))
}

/// Ends a command whose server was lost while running it: said on stderr, and with `--json`
/// as the JSON error object every failed command prints on stdout.
fn lost(args: &[OsString], what: &str) -> ExitCode {
    let message = format!(
        "{what}; the command may have run in part: `dynocap ls` shows the state, and \
         DYNOCAP_CLI_SERVER=0 runs commands without a server"
    );
    if json_requested(args) {
        println!(
            "{{\"error\":{{\"code\":\"internal\",\"message\":{}}}}}",
            json_string(&message)
        );
    }
    eprintln!("dynocap: internal: {message}");
    ExitCode::from(1)
}

/// Whether the command line asks for JSON output, as `dynocap-core` decides it: `--json`
/// anywhere before `--`.
fn json_requested(args: &[OsString]) -> bool {
    args.iter()
        .skip(1)
        .take_while(|arg| *arg != "--")
        .any(|arg| arg == "--json" || arg.as_bytes().starts_with(b"--json="))
}

/// `text` as a JSON string, quotes included.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Starts the home's server for the next command (this one runs without it). A server that
/// finds another already listening ends at once.
fn start_server(core: &Path, socket: &Path, run_dir: &Path) {
    // A home that does not exist yet: the command run directly makes it.
    if !run_dir.is_dir() {
        return;
    }
    let _ = Command::new(core)
        .arg0(dynocap_client::CORE_BINARY)
        .arg(dynocap_client::SERVER_SUBCOMMAND)
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}
