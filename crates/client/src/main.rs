//! `dynocap`: the command a person types. The commands of a sandbox's cycle (`run`, `exec`,
//! `destroy`, `ps`) it hands to its home's command server (see the crate docs), which runs
//! them with this process's stdout, stderr, environment and umask, and it ends as the command
//! ends: the same exit code, or the same signal. Ctrl-C and `kill` end the command there.
//!
//! Every other command, and every command when there is no server yet or the server does not
//! serve it, runs in `dynocap-core` itself, as an `exec` of this process; a missing server
//! is started for the next command. Nothing is lost either way: a server that goes away
//! before it says the command started has run nothing.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use dynocap_client::rendezvous;
use dynocap_client::wire::{self, Message, Request};
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{self, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};

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
    let home = rendezvous::home_dir(|name| std::env::var_os(name))?;
    // The server works from `/`: it is given the socket by its full path.
    let home = if home.is_absolute() {
        home
    } else {
        std::env::current_dir().ok()?.join(home)
    };
    let run_dir = home.join("run");
    let context = rendezvous::Context::of_this_process();
    let socket_path = rendezvous::socket_path(&run_dir, core, &context).ok()?;
    let socket = match connect_to(&socket_path) {
        Ok(socket) => socket,
        Err(Errno::ENOENT | Errno::ECONNREFUSED) => {
            start_server(core, &socket_path, &run_dir);
            return None;
        }
        Err(_) => return None,
    };
    // Blocked from here, so that none is lost between the request and `Started`; if the
    // command is not served after all they are unblocked, and act on this process as usual.
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
    if !send_command(&socket, args, context) {
        unblock();
        return None;
    }
    Some(await_end(&socket, &signals))
}

fn connect_to(path: &Path) -> Result<OwnedFd, Errno> {
    let socket = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(socket.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(socket)
}

/// Sends the command with this process's stdout and stderr, and `context` (the one its
/// socket was named for); true once the server says it runs it.
fn send_command(socket: &OwnedFd, args: &[OsString], context: rendezvous::Context) -> bool {
    let request = Request {
        umask: context.umask,
        args: args.to_vec(),
        env: context.env,
    };
    // A closed stdout or stderr cannot be passed (EBADF): such a command runs here.
    if wire::send_request(socket.as_fd(), &request, [1, 2]).is_err() {
        return false;
    }
    // `NotServed`, an error or the end of the connection: nothing ran.
    matches!(
        wire::recv_message(socket.as_fd()),
        Ok(Some(Message::Started(_)))
    )
}

/// Forwards signals until the server says how the command ended, then ends the same way.
fn await_end(socket: &OwnedFd, signals: &SignalFd) -> ExitCode {
    loop {
        let mut fds = [
            PollFd::new(socket.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(err) => return lost(&format!("waiting for the command server: {err}")),
        }
        let signal_ready = fds[1].any().unwrap_or(false);
        let socket_ready = fds[0].any().unwrap_or(false);
        if signal_ready {
            if let Ok(Some(info)) = signals.read_signal() {
                forward(socket, info.ssi_signo);
            }
        }
        if socket_ready {
            match wire::recv_message(socket.as_fd()) {
                Ok(Some(Message::Exited(code))) => {
                    return ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1))
                }
                Ok(Some(Message::Killed(number))) => return die_of(number),
                Ok(Some(_)) => {}
                Ok(None) => {
                    return lost("the command server ended before the command did");
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return lost(&format!("reading from the command server: {err}")),
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

fn lost(what: &str) -> ExitCode {
    eprintln!(
        "dynocap: {what}; the command may have run in part: `dynocap ls` shows the state, and \
         DYNOCAP_CLI_SERVER=0 runs commands without a server"
    );
    ExitCode::from(1)
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
