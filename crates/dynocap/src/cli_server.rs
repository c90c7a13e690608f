//! `dynocap-core cli-server --socket PATH`: a home's command server, started by the thin
//! `dynocap` client (see the `dynocap-client` crate for why, and its `wire` module for the
//! protocol). It runs the commands a sandbox's cycle is made of (`commands::is_served`) in
//! this long-lived process, each on a thread of its own writing to the client's stdout and
//! stderr; it answers `NotServed` to the rest, which the client runs in a `dynocap-core` of
//! their own. Each command opens the catalog anew, as a process of its own would, so that it
//! sees the catalog as it is (damaged, repaired, replaced), not as an open connection last
//! saw it; what the server saves is the start of a process, and the cold start of its code.
//!
//! A served command must run with exactly the authority and settings its client's own
//! process would have: [`peer`] checks, from the kernel, that the connecting process is
//! alike with this one in everything a command inherits, and that the environment and umask
//! its request brings are its own (the socket's name, see `rendezvous`, only sends each
//! client to a server like it). Anything else, a malformed request included, is answered
//! `NotServed`, and the server goes on serving. The server ends after [`IDLE`] without a
//! command, or once its socket or the home is gone (checked every [`CHECK_EVERY`]).

mod peer;

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::config::Settings;
use clap::Parser;
use dynocap_client::attributes::{Attribute, Process};
use dynocap_client::rendezvous::{self, Context};
use dynocap_client::wire::{self, Message, Request};
use dynocap_engine::standby::SharedStandby;
use dynocap_engine::{Config, Engine, Home};
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::socket::{
    accept4, bind, getsockopt, listen, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    UnixAddr,
};
use nix::sys::stat::Mode;
use tokio::io::unix::AsyncFd;

use crate::cli::Cli;
use crate::output::{Stream, Streams};

/// How long a server waits with no command before it ends; its next client starts another.
pub const IDLE: Duration = Duration::from_secs(60);

/// Sets [`IDLE`] in whole seconds, at least one.
pub const IDLE_ENV: &str = "DYNOCAP_CLI_SERVER_IDLE_SECONDS";

/// How often the server checks that its socket is still its own, and whether it is idle.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long a connected client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The signals that end a command as they would have ended its client's own process.
const ENDING: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Serves the home whose `run/` directory holds `socket`, until idle. Must be called while
/// this process has one thread, before anything opens a descriptor.
pub fn serve(socket: &Path, settings: Settings) -> ExitCode {
    // This server works from `/`, where a relative path means another file than in its
    // clients' directories; their commands run in processes of their own instead. Nothing
    // is made first: the home such a path names is the clients' to make.
    let relative = settings.relative_paths();
    if !relative.is_empty() {
        eprintln!(
            "dynocap cli-server: not serving: {} set to a relative path; commands run \
             in their own processes (set an absolute path to have them served)",
            relative.join(", ")
        );
        return ExitCode::FAILURE;
    }
    let idle = idle_setting(settings.cli_server_idle.as_deref());
    let config = settings.engine;
    // What the first client's process held (a shell's redirections, a build's jobserver
    // pipe) must not stay open for as long as the server lives: a reader would wait on it.
    // SAFETY: nothing in this process owns a descriptor above stderr yet: this runs first
    // thing in `main`, and the standard library opens none before it.
    unsafe { libc::syscall(libc::SYS_close_range, 3, libc::c_uint::MAX, 0) };
    // Out of the client's session, so that its terminal's hang-up does not reach here, and
    // out of its directory, which the server would otherwise keep busy.
    let _ = nix::unistd::setsid();
    let _ = nix::unistd::chdir("/");
    let server = match Server::bind(socket, config, idle) {
        Ok(Some(server)) => server,
        // Another server holds the socket: it serves.
        Ok(None) => return ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("dynocap cli-server: {err}");
            return ExitCode::FAILURE;
        }
    };
    server.run()
}

/// What every command's thread shares.
struct Shared {
    home: Home,
    /// The engine's configuration, from the server's environment, which every client shares.
    config: Config,
    /// Drives every command's I/O and timers, and outlives them: what a command leaves
    /// running (the reaping of a supervisor it started) runs on here.
    runtime: tokio::runtime::Runtime,
    /// The server's own environment and umask: a request must bring the same.
    context: Context,
    /// The attributes of this process that only it can change, which it does not: read once
    /// (see `peer::check`).
    own_only: Vec<Attribute>,
    /// Commands connected and not yet ended.
    active: AtomicUsize,
    /// How long to wait without a command before ending.
    idle: Duration,
    /// The supervisor standing by for the next `run`, across commands: each command's
    /// engine is new, and without this a `run` would start its supervisor's process (exec,
    /// load, runtime) and the default disk while its client waits. It ends with the server.
    standby: SharedStandby,
    last_active: Mutex<Instant>,
}

impl Shared {
    fn touch(&self) {
        *self
            .last_active
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }
}

/// Counts a command as active for as long as it lives.
struct Active(Arc<Shared>);

impl Active {
    fn begin(shared: &Arc<Shared>) -> Self {
        shared.active.fetch_add(1, Ordering::AcqRel);
        shared.touch();
        Self(Arc::clone(shared))
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Server {
    socket: PathBuf,
    /// The socket file's inode: what is removed at the end must be this server's.
    socket_inode: u64,
    listener: OwnedFd,
    /// Held for the server's life: one server per socket.
    _lock: File,
    lock_path: PathBuf,
    shared: Arc<Shared>,
}

impl Server {
    /// Takes the socket's lock and listens; `None` if another server holds the lock.
    fn bind(socket: &Path, config: Config, idle: Duration) -> Result<Option<Self>, String> {
        let run_dir = socket
            .parent()
            .ok_or_else(|| format!("{} has no directory", socket.display()))?;
        // Only the name a client of this very binary, environment and process computes: one
        // that asked for another (it ran a binary replaced since) starts that one's server.
        let context = Context::of_this_process();
        let expected = rendezvous::socket_path(run_dir, Path::new("/proc/self/exe"), &context)
            .map_err(|err| format!("reading this binary's identity: {err}"))?;
        if expected != socket {
            return Err(format!(
                "{} is not the socket for this binary and environment ({})",
                socket.display(),
                expected.display()
            ));
        }
        redirect_stderr_to_log(run_dir);
        let lock_path = socket.with_extension("lock");
        let Some(lock) = lock_exclusively(&lock_path)? else {
            return Ok(None);
        };
        let home = Home::from_config(&config.home).map_err(|err| err.to_string())?;
        if home.root().join("run") != run_dir {
            return Err(format!(
                "{} is not in this environment's home {}",
                socket.display(),
                home.root().display()
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cli-server-io")
            .enable_all()
            .build()
            .map_err(|err| format!("starting the async runtime: {err}"))?;
        // Ours under the lock: a file left by a server that died is removed.
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(format!("removing the old {}: {err}", socket.display())),
        }
        let listener = socket_listening(socket)?;
        let socket_inode = std::fs::metadata(socket)
            .map_err(|err| format!("{}: {err}", socket.display()))?
            .ino();
        Ok(Some(Self {
            socket: socket.to_owned(),
            socket_inode,
            listener,
            _lock: lock,
            lock_path,
            shared: Arc::new(Shared {
                home,
                // A warm pool's claims need no supervisor.
                standby: SharedStandby::new(matches!(config.pool_target(), Ok(0))),
                config,
                runtime,
                context,
                own_only: Process::current().own_only(),
                active: AtomicUsize::new(0),
                idle,
                last_active: Mutex::new(Instant::now()),
            }),
        }))
    }

    fn run(self) -> ExitCode {
        loop {
            let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(CHECK_EVERY).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(err) => {
                    eprintln!("dynocap cli-server: poll: {err}");
                    break;
                }
            }
            if fds[0].any().unwrap_or(false) {
                self.accept_all();
            }
            if !self.still_reachable() {
                break;
            }
            let idle = self.shared.active.load(Ordering::Acquire) == 0
                && self.shared.idle_for() >= self.shared.idle;
            if idle {
                break;
            }
        }
        self.stop_listening();
        // Commands still running finish; their clients are waiting for them.
        while self.shared.active.load(Ordering::Acquire) > 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        ExitCode::SUCCESS
    }

    fn accept_all(&self) {
        loop {
            let conn = match accept4(self.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
                // SAFETY: accept4 just returned this descriptor, owned by nothing else.
                Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
                Err(Errno::EINTR | Errno::ECONNABORTED) => continue,
                Err(_) => return,
            };
            // The socket is the user's own (mode 0600 in a 0700 home); this is the check
            // that does not depend on how the home was made.
            let ours = getsockopt(&conn, sockopt::PeerCredentials)
                .is_ok_and(|peer| peer.uid() == nix::unistd::geteuid().as_raw());
            if !ours {
                continue;
            }
            let active = Active::begin(&self.shared);
            let spawned = std::thread::Builder::new()
                .name("command".into())
                .spawn(move || serve_one(conn, &active));
            if let Err(err) = spawned {
                // The connection closed with the thread: the client runs the command itself.
                eprintln!("dynocap cli-server: cannot start a command's thread: {err}");
            }
        }
    }

    /// Whether the socket is still this server's: not once the home or `run/` is removed.
    fn still_reachable(&self) -> bool {
        std::fs::metadata(&self.socket).is_ok_and(|m| m.ino() == self.socket_inode)
    }

    fn stop_listening(&self) {
        // Removed first: a client that finds no socket starts a new server, while one that
        // connected meanwhile sees its connection close before `Accepted`, and runs its
        // command itself. The lock file goes too, while still held, so that `run/` does not
        // gather one per binary and environment it has seen; a server starting meanwhile
        // locks a file of its own.
        if self.still_reachable() {
            let _ = std::fs::remove_file(&self.socket);
            let _ = std::fs::remove_file(&self.lock_path);
        }
    }
}

/// Opens and locks `path` without waiting; `None` if another server holds it. A server that
/// is ending removes its lock file while holding it, so a lock taken on a file no longer at
/// `path` proves nothing: the file is opened again until the locked one is the one named.
fn lock_exclusively(path: &Path) -> Result<Option<File>, String> {
    loop {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|err| format!("opening {}: {err}", path.display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(err)) => {
                return Err(format!("locking {}: {err}", path.display()))
            }
        }
        let locked = lock
            .metadata()
            .map_err(|err| format!("{}: {err}", path.display()))?;
        match std::fs::metadata(path) {
            Ok(named) if named.dev() == locked.dev() && named.ino() == locked.ino() => {
                return Ok(Some(lock))
            }
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(format!("{}: {err}", path.display())),
        }
    }
}

/// One client's command, on its own thread: a command that blocks on a slow reader of its
/// output holds up no other.
fn serve_one(conn: OwnedFd, active: &Active) {
    let shared = &active.0;
    let Some(cli) = accept_command(&conn, shared) else {
        // Nothing runs: the client runs its command itself. Gone already, it needs no answer.
        let _ = wire::send_message(conn.as_fd(), Message::NotServed);
        return;
    };
    let pid = i32::try_from(std::process::id()).unwrap_or(0);
    if wire::send_message(conn.as_fd(), Message::Accepted(pid)).is_err() {
        return;
    }
    // The client gave up waiting (or went away, or sent no proper `Go`): it runs the
    // command itself.
    let Some(streams) = told_to_go(&conn) else {
        let _ = wire::send_message(conn.as_fd(), Message::NotServed);
        return;
    };
    // From here the connection is read only when it has something (by the runtime, and once
    // more at the end); its flags are the server's side's alone.
    if set_nonblocking(&conn).is_err() {
        return;
    }
    let mut engine = match Engine::new(shared.home.clone(), shared.config.clone()) {
        Ok(engine) => engine,
        Err(err) => {
            let code = streams.fail(cli.json, &err);
            let _ = send_result(&conn, Message::Exited(i32::from(code)));
            return;
        }
    };
    engine.use_shared_standby(&shared.standby);
    let heartbeat = conn
        .try_clone()
        .ok()
        .map(|watched| shared.runtime.spawn(say_alive(watched)));
    // On this thread: the engine's futures are not `Send`; the runtime's worker drives
    // their I/O, and keeps what they spawn.
    let outcome = shared.runtime.block_on(async {
        let json = cli.json;
        let command = crate::commands::run_served(&engine, json, cli.command, &streams);
        tokio::select! {
            code = command => Some(Message::Exited(i32::from(code))),
            // Dropping the command ends it as its process's death would have: its
            // connections close, and a command running in a sandbox is cancelled.
            signal = ending_signal(&conn) => signal.map(|signal| Message::Killed(signal as i32)),
        }
    });
    if let Some(heartbeat) = heartbeat {
        heartbeat.abort();
    }
    // A signal that came while the command was ending (its output, waiting for room, gave up
    // on seeing it) ends it all the same; a client gone meanwhile needs no answer.
    let outcome = match (outcome, wire::recv_message(conn.as_fd())) {
        (Some(Message::Exited(code)), Ok(Some(Message::Signal(number)))) => {
            Some(ending(number).map_or(Message::Exited(code), |signal| {
                Message::Killed(signal as i32)
            }))
        }
        (Some(Message::Exited(_)), Ok(None)) => None,
        (outcome, _) => outcome,
    };
    // A standby this command started and did not use stays in the server's slot for the
    // next `run`.
    drop(engine);
    if let Some(message) = outcome {
        let _ = send_result(&conn, message);
    }
}

/// The command, if the request is one this server runs for this client: well formed, in
/// time, a served command, from a client with this server's context and authority (see
/// [`peer`]). Each refusal's reason goes to the server's log.
fn accept_command(conn: &OwnedFd, shared: &Shared) -> Option<Cli> {
    let request = receive_request(conn)?;
    // A client sends the context its socket was named for; another is not this server's.
    let context = Context::keyed(request.umask, request.env);
    if context != shared.context {
        eprintln!(
            "dynocap cli-server: a client refused: {}",
            context_difference(&context, &shared.context)
        );
        return None;
    }
    let cli = Cli::try_parse_from(&request.args)
        .ok()
        .filter(|cli| crate::commands::is_served(&cli.command))?;
    if let Err(refusal) = peer::check(conn.as_fd(), &context, &shared.own_only) {
        eprintln!("dynocap cli-server: a client refused: {refusal}");
        return None;
    }
    Some(cli)
}

/// How a client's context differs from the server's, for the log: the umasks, or the names
/// (never the values) of the variables set differently.
fn context_difference(client: &Context, server: &Context) -> String {
    use std::collections::BTreeSet;
    use std::os::unix::ffi::OsStrExt;
    if client.umask != server.umask {
        return format!(
            "its umask {:03o} is not this server's {:03o}",
            client.umask, server.umask
        );
    }
    let entries = |context: &Context| -> BTreeSet<Vec<u8>> {
        context
            .env
            .iter()
            .map(|entry| entry.as_bytes().to_vec())
            .collect()
    };
    let (ours, theirs) = (entries(server), entries(client));
    let names: BTreeSet<String> = ours
        .symmetric_difference(&theirs)
        .map(|entry| {
            let name = entry.split(|b| *b == b'=').next().unwrap_or_default();
            String::from_utf8_lossy(name).into_owned()
        })
        .collect();
    format!(
        "its environment is not this server's ({} set otherwise)",
        names.into_iter().collect::<Vec<_>>().join(", ")
    )
}

/// The client's output streams, if it commits its command to this server (`Go`, with its
/// stdout and stderr) in time; anything else (it gave up waiting and closed, or sent
/// something else) runs nothing.
fn told_to_go(conn: &OwnedFd) -> Option<Streams> {
    if !readable_within(conn, REQUEST_TIMEOUT) {
        return None;
    }
    let [stdout, stderr] = match wire::recv_go(conn.as_fd()) {
        Ok(Some(fds)) => fds,
        Ok(None) => return None,
        Err(err) => {
            eprintln!("dynocap cli-server: a client refused: {err}");
            return None;
        }
    };
    match (
        ClientOutput::stream(stdout, conn),
        ClientOutput::stream(stderr, conn),
    ) {
        (Ok(stdout), Ok(stderr)) => Some(Streams::of(stdout, stderr)),
        _ => None,
    }
}

/// Says the command is still running, every fifth of the client's deadline (see
/// `dynocap_client::deadline`), so that it can tell a long command from a stopped server.
/// Only when the client has read what came before: a client that is itself stopped finds one
/// `Alive` waiting, not a queue that leaves no room for the command's end.
async fn say_alive(conn: OwnedFd) {
    let period = dynocap_client::deadline() / 5;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        ticks.tick().await;
        if unread_bytes(&conn) == Some(0) {
            let _ = wire::send_message(conn.as_fd(), Message::Alive);
        }
    }
}

/// How many bytes this end sent that the client has not read yet (`SIOCOUTQ`).
fn unread_bytes(conn: &OwnedFd) -> Option<libc::c_int> {
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int to the pointer given, which is valid for it.
    let done = unsafe { libc::ioctl(conn.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    (done == 0).then_some(queued)
}

/// Sends a command's end, waiting for room (the connection is non-blocking by now) for as
/// long as the client is there to make it.
fn send_result(conn: &OwnedFd, message: Message) -> std::io::Result<()> {
    loop {
        match wire::send_message(conn.as_fd(), message) {
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLOUT)];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(errno) => return Err(errno.into()),
                }
            }
            sent => return sent,
        }
    }
}

/// One of a client's output streams. A write waits for room with `poll`, not in `write`,
/// watching the client's connection meanwhile: a client that goes away or is signalled while
/// its reader is not reading (a full pipe) must still end its command, which a thread stuck
/// in `write` could not notice. (The descriptor's own flags are the client's to keep: it may
/// not be made non-blocking.)
struct ClientOutput {
    file: File,
    client: OwnedFd,
}

impl ClientOutput {
    fn stream(file: OwnedFd, client: &OwnedFd) -> std::io::Result<Stream> {
        let file = File::from(file);
        let terminal = std::io::IsTerminal::is_terminal(&file);
        let client = client.try_clone()?;
        Ok(Stream::of_writer(terminal, Self { file, client }))
    }
}

impl std::io::Write for ClientOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // At most PIPE_BUF at once: a pipe that polls writable takes that much whole,
        // without blocking.
        let piece = &buf[..buf.len().min(libc::PIPE_BUF)];
        loop {
            let mut fds = [
                PollFd::new(self.file.as_fd(), PollFlags::POLLOUT),
                PollFd::new(self.client.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(errno) => return Err(errno.into()),
            }
            if fds[1].any().unwrap_or(false) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the client went away or was signalled",
                ));
            }
            if fds[0].any().unwrap_or(false) {
                // Writable, or an error (a reader gone) that the write reports.
                return self.file.write(piece);
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The request, if it comes in time and whole; a malformed one is said in the log.
fn receive_request(conn: &OwnedFd) -> Option<Request> {
    if !readable_within(conn, REQUEST_TIMEOUT) {
        eprintln!(
            "dynocap cli-server: a client refused: no request within {}s",
            REQUEST_TIMEOUT.as_secs()
        );
        return None;
    }
    match wire::recv_request(conn.as_fd()) {
        Ok(received) => received,
        Err(err) => {
            eprintln!("dynocap cli-server: a request refused: {err}");
            None
        }
    }
}

/// Whether `conn` has something to read (or has ended) within `timeout`.
fn readable_within(conn: &OwnedFd, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) => return false,
            Ok(_) => return true,
            Err(Errno::EINTR) if !left.is_zero() => {}
            Err(_) => return false,
        }
    }
}

/// The first signal the client forwards that ends a command; `None` if the client went away
/// (it died: its command goes with it, as it would have in its own process).
async fn ending_signal(conn: &OwnedFd) -> Option<Signal> {
    // A second descriptor of the (non-blocking) connection, for the runtime to poll.
    let watched = AsyncFd::new(conn.try_clone().ok()?).ok()?;
    loop {
        let mut ready = watched.readable().await.ok()?;
        match ready.try_io(|fd| wire::recv_message(fd.get_ref().as_fd())) {
            // Not readable after all: wait again.
            Err(_would_block) => {}
            Ok(Ok(Some(Message::Signal(number)))) => {
                if let Some(signal) = ending(number) {
                    return Some(signal);
                }
            }
            Ok(Ok(Some(_))) => {}
            // The connection ended, or broke: the client has gone.
            Ok(Ok(None) | Err(_)) => return None,
        }
    }
}

/// [`IDLE`], or what [`IDLE_ENV`] says (read in `config`); a value that is not a whole
/// number of seconds from 1 is said in the server's log, and the default kept.
fn idle_setting(value: Option<&std::ffi::OsStr>) -> Duration {
    let Some(value) = value else {
        return IDLE;
    };
    match value.to_str().and_then(|v| v.trim().parse::<u64>().ok()) {
        Some(seconds) if seconds >= 1 => Duration::from_secs(seconds),
        _ => {
            eprintln!(
                "dynocap cli-server: {IDLE_ENV}={value:?} is not a whole number of seconds from \
                 1; waiting {}s",
                IDLE.as_secs()
            );
            IDLE
        }
    }
}

/// Signal `number`, if it is one of [`ENDING`].
fn ending(number: i32) -> Option<Signal> {
    ENDING.into_iter().find(|signal| *signal as i32 == number)
}

fn set_nonblocking(fd: &OwnedFd) -> nix::Result<()> {
    let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(flags)).map(drop)
}

fn socket_listening(path: &Path) -> Result<OwnedFd, String> {
    let listener = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|err| format!("socket: {err}"))?;
    let address = UnixAddr::new(path).map_err(|err| format!("{}: {err}", path.display()))?;
    // Made 0600, not changed after: no moment when another user could connect.
    let previous = nix::sys::stat::umask(Mode::from_bits_truncate(0o177));
    let bound = bind(listener.as_raw_fd(), &address);
    nix::sys::stat::umask(previous);
    bound.map_err(|err| format!("binding {}: {err}", path.display()))?;
    let backlog = Backlog::new(128).map_err(|err| format!("listen backlog: {err}"))?;
    listen(&listener, backlog).map_err(|err| format!("listen: {err}"))?;
    Ok(listener)
}

/// The server's stderr (its own errors) to `run/cli-server.log`: beside its socket, not
/// among the sandboxes' logs.
fn redirect_stderr_to_log(run_dir: &Path) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(run_dir.join("cli-server.log"));
    if let Ok(log) = log {
        let _ = nix::unistd::dup2_stderr(&log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_holder_and_a_removed_lock_file_frees_the_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cli-x.lock");
        let first = lock_exclusively(&path)
            .expect("lock")
            .expect("nobody holds it yet");
        assert!(lock_exclusively(&path).expect("lock").is_none());
        // An ending server removes the file while it still holds the lock: the name is free
        // at once, and the new holder's file is the one named.
        std::fs::remove_file(&path).expect("remove");
        let second = lock_exclusively(&path)
            .expect("lock")
            .expect("the removed file's lock is not the name's");
        let named = std::fs::metadata(&path).expect("named");
        assert_eq!(named.ino(), second.metadata().expect("stat").ino());
        drop(first);
        assert!(lock_exclusively(&path).expect("lock").is_none());
    }
}
