//! One exec request from validation to its final status: the environment, streaming output
//! under the per-channel cap, the deadline / cancel kill sequence (the process group and the
//! command's cgroup), and the short drain after the leader exits.
//!
//! All of an exec's frames are sent from its one task, so `Data` frames can never overtake
//! its `Eof` frames or its final `Done`.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dynocap_proto::{
    exec_window, ExecExit, ExecRequest, Frame, FrameKind, DATA_CHUNK, MAX_COMMAND_LEN,
};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::sync::{mpsc, Semaphore, SemaphorePermit};

use crate::cgroup::ExecCgroup;
use crate::config::Config;
use crate::outbox::Outbox;
use crate::process_group::{group_gone, kill_group_until_gone, read_until_eof, Stop, KILL_RETRY};
use crate::reaper::ExitStatus;
use crate::script;
use crate::spawn::{self, ChildSpec, Spawned, BASE_PATH};

/// The shell that runs every command.
const SHELL: &std::ffi::CStr = c"/bin/sh";
/// HOME when `--home` is not given and this directory exists; `/` otherwise.
const DEFAULT_HOME: &str = "/home/sandbox";

/// Bytes read per chunk. Smaller than [`DATA_CHUNK`] so that 100 concurrent execs keep the
/// agent's memory small; the frames are still well filled.
const READ_CHUNK: usize = 32 * 1024;
const _: () = assert!(READ_CHUNK <= DATA_CHUNK);

/// After the leader exits, its output is drained: read until nothing more is there right now
/// (what it wrote before exiting is already in the pipe, or, for a terminal, is flushed to
/// the master by the read itself), so a background process holding the pipe open cannot hold
/// the exec. This bounds that drain, so that a background process that never stops writing,
/// or a host slow to take the output, cannot hold it either; output that only waits for a
/// streaming client's credit is not cut (the client takes it at its pace).
const DRAIN_CAP: Duration = Duration::from_secs(1);
/// Longest grace period between SIGTERM and SIGKILL honoured (one day).
const MAX_GRACE_MS: u64 = 24 * 60 * 60 * 1000;
/// The base environment every command gets before the request's own variables.
pub fn base_env(home: &str, terminal: bool) -> Vec<(String, String)> {
    [
        ("PATH", BASE_PATH),
        ("HOME", home),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
        ("LANG", "C.UTF-8"),
        ("TERM", if terminal { "xterm-256color" } else { "dumb" }),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn home_dir(config: &Config) -> String {
    match &config.home {
        Some(home) => home.to_string_lossy().into_owned(),
        None if Path::new(DEFAULT_HOME).is_dir() => DEFAULT_HOME.to_owned(),
        None => "/".to_owned(),
    }
}

/// Why an exec was refused or its command could not start: the message of the stream's
/// `Error` frame.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("command is {0} bytes long; the limit is {MAX_COMMAND_LEN}")]
    CommandTooLong(usize),
    #[error(transparent)]
    Command(#[from] script::NulInCommand),
    #[error("working directory {0:?} must be an absolute path")]
    RelativeCwd(String),
    #[error("working directory contains a NUL byte")]
    NulInCwd,
    #[error("working directory {0} is not a directory in the sandbox")]
    CwdNotADirectory(String),
    /// Whatever the reason the sandbox gave (missing, unreachable), the path is not there
    /// for the command.
    #[error("working directory {0} does not exist in the sandbox")]
    CwdMissing(String),
    #[error(
        "environment variable name {0:?} is invalid: it must be non-empty and contain no '=' or NUL"
    )]
    EnvName(String),
    #[error("environment variable {0} has a NUL byte in its value")]
    NulInEnvValue(String),
    #[error(
        "environment variable {key} is {len} bytes as KEY=VALUE; the kernel takes at most {max} \
         per variable: put the value in a file in the sandbox",
        max = script::ARG_STRLEN_MAX - 1
    )]
    EnvTooLong { key: String, len: usize },
    #[error("environment contains a NUL byte")]
    NulInEnv,
    #[error("cannot make a cgroup for the command: {0}")]
    Cgroup(#[source] io::Error),
    #[error("cannot start the command: {0}")]
    Spawn(#[source] io::Error),
    #[error("cannot watch the command's output: {0}")]
    WatchOutput(#[source] io::Error),
}

/// Validates a request and turns it into what the child needs.
pub fn prepare(req: &ExecRequest, config: &Config) -> Result<ChildSpec, ExecError> {
    if req.command.len() > MAX_COMMAND_LEN {
        return Err(ExecError::CommandTooLong(req.command.len()));
    }
    let argv = script::shell_argv(req.command.as_bytes())?;

    if !req.cwd.starts_with('/') {
        return Err(ExecError::RelativeCwd(req.cwd.clone()));
    }
    let cwd = CString::new(req.cwd.as_bytes()).map_err(|_| ExecError::NulInCwd)?;
    match std::fs::metadata(&req.cwd) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(ExecError::CwdNotADirectory(req.cwd.clone())),
        Err(_) => return Err(ExecError::CwdMissing(req.cwd.clone())),
    }

    let mut env = base_env(&home_dir(config), req.terminal);
    env.extend(config.egress_env.get());
    let mut index: HashMap<String, usize> = env
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (k.clone(), i))
        .collect();
    for (key, value) in &req.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(ExecError::EnvName(key.clone()));
        }
        if value.contains('\0') {
            return Err(ExecError::NulInEnvValue(key.clone()));
        }
        match index.get(key) {
            Some(&i) => env[i].1.clone_from(value),
            None => {
                index.insert(key.clone(), env.len());
                env.push((key.clone(), value.clone()));
            }
        }
    }
    let env = env
        .into_iter()
        .map(|(k, v)| {
            let entry = format!("{k}={v}");
            if entry.len() >= script::ARG_STRLEN_MAX {
                return Err(ExecError::EnvTooLong {
                    key: k,
                    len: entry.len(),
                });
            }
            CString::new(entry).map_err(|_| ExecError::NulInEnv)
        })
        .collect::<Result<Vec<_>, _>>()?;

    let uid = nix::unistd::getuid().as_raw();
    Ok(ChildSpec {
        program: SHELL.to_owned(),
        argv,
        env,
        cwd,
        terminal: req.terminal,
        user: config.exec_user.filter(|user| user.uid != uid),
        stdin: None,
        cgroup: None,
        extra_group: None,
        stdio: None,
    })
}

/// One output channel of a running command.
struct Output {
    channel: u8,
    fd: AsyncFd<OwnedFd>,
}

/// What happened on an [`Output`] so far. Kept apart from it because the readiness guard of a
/// `select!` branch borrows the outputs until the whole `select!` ends.
#[derive(Clone, Copy)]
struct Progress {
    /// Bytes sent to the host (never more than the limit).
    sent: u64,
    open: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillPhase {
    Idle,
    /// SIGTERM sent; SIGKILL at this instant.
    Terminating(Instant),
    Killed,
}

/// Runs the exec, streaming its output as `Data` then `Eof` frames on `stream`. Returns the
/// exit for the `Done` frame, or the message for an `Error` frame when it could not start.
///
/// With a `window` (the host asked for flow control), each output frame first takes its cost
/// from it: when the host stops returning credit, the command's output waits in its pipe.
pub async fn run(
    req: ExecRequest,
    config: &Config,
    stream: u32,
    outbox: &Outbox,
    mut stop: mpsc::Receiver<Stop>,
    window: Option<Arc<Semaphore>>,
) -> Result<ExecExit, ExecError> {
    let window = window.as_deref();
    let mut spec = prepare(&req, config)?;
    let cgroup = match &config.exec_cgroups {
        Some(cgroups) => {
            let cgroup = cgroups.create().map_err(ExecError::Cgroup)?;
            spec.cgroup = Some(cgroup.join_handle().map_err(ExecError::Cgroup)?);
            Some(cgroup)
        }
        None => None,
    };
    let started = Instant::now();
    let Spawned {
        pid,
        mut exit,
        outputs,
    } = spawn::spawn(&spec).map_err(ExecError::Spawn)?;
    drop(spec);
    let target = Target {
        pgid: Pid::from_raw(pid),
        cgroup,
    };
    let outputs = match register_outputs(outputs) {
        Ok(outputs) => outputs,
        Err(err) => {
            // Without its output the command is useless, and nobody would ever stop it.
            target.kill().await;
            return Err(ExecError::WatchOutput(err));
        }
    };

    let limit = req.output_limit;
    // Bounded so that `now + grace` cannot overflow, whatever the host asks for.
    let grace = Duration::from_millis(req.kill_grace_ms.min(MAX_GRACE_MS));
    let deadline = if req.timeout_ms > 0 {
        started.checked_add(Duration::from_millis(req.timeout_ms))
    } else {
        None
    };
    let mut progress = vec![
        Progress {
            sent: 0,
            open: true
        };
        outputs.len()
    ];
    let mut buf = vec![0_u8; READ_CHUNK];
    let mut exited = false;
    let mut status: Option<ExitStatus> = None;
    let mut ended_at = started;
    let mut kill = KillPhase::Idle;
    let mut stop_open = true;
    let (mut timed_out, mut cancelled, mut truncated) = (false, false, false);

    loop {
        let grace_at = match kill {
            KillPhase::Terminating(at) => Some(at),
            _ => None,
        };
        // Never finish between SIGTERM and SIGKILL: processes ignoring SIGTERM must not
        // survive a timeout just because the leader exited.
        if exited && grace_at.is_none() && !progress.iter().any(|p| p.open) {
            break;
        }
        // The leader is gone and nothing it wrote is left unread: what arrives later is the
        // background's, which the exec does not wait for.
        if exited && grace_at.is_none() && !output_pending(&outputs, &progress) {
            break;
        }
        // Output that waits only for the host's credit is the host's to take, however slowly
        // (a streaming client paused on purpose): the drain's cap must not drop it. Unless the
        // host cancelled: it may have stopped reading the stream, and returns no more credit.
        let starved = !cancelled
            && exited
            && grace_at.is_none()
            && window.is_some_and(|w| w.available_permits() < exec_window::cost(READ_CHUNK))
            && output_pending(&outputs, &progress);
        let drain_cap_at = (exited && grace_at.is_none() && !starved).then(|| ended_at + DRAIN_CAP);
        // Once the leader is gone, look now and then whether SIGTERM already emptied the
        // group, instead of sitting out the whole grace period.
        let grace_check_at = grace_at.map(|at| {
            if exited {
                at.min(Instant::now() + KILL_RETRY)
            } else {
                at
            }
        });
        let watch = |i: usize| match progress.get(i) {
            Some(p) if p.open => outputs.get(i).map(|o| (o, p.sent < limit)),
            _ => None,
        };
        let (first, second) = (watch(0), watch(1));

        // Control arms come first: a command flooding its output must not starve its deadline.
        tokio::select! {
            biased;
            message = stop.recv(), if stop_open && (!exited || window.is_some()) && kill != KillPhase::Killed => {
                match message {
                    None => stop_open = false,
                    // Draining for a host that no longer wants the output: stop there.
                    Some(_) if exited => {
                        if kill == KillPhase::Idle {
                            break;
                        }
                    }
                    Some(Stop::Cancel) => {
                        if kill == KillPhase::Idle {
                            cancelled = true;
                            kill = target.terminate(grace);
                        }
                    }
                    Some(Stop::Shutdown) => {
                        cancelled = true;
                        target.kill().await;
                        kill = KillPhase::Killed;
                    }
                }
            }
            () = sleep_until(deadline), if deadline.is_some() && !exited && kill == KillPhase::Idle => {
                timed_out = true;
                kill = target.terminate(grace);
            }
            () = sleep_until(grace_check_at), if grace_at.is_some() => {
                if grace_at.is_some_and(|at| Instant::now() >= at) {
                    target.kill().await;
                    kill = KillPhase::Killed;
                } else if target.gone() {
                    kill = KillPhase::Killed;
                }
            }
            result = &mut exit, if !exited => {
                exited = true;
                ended_at = Instant::now();
                match result {
                    Ok(s) => status = Some(s),
                    Err(_) => log!("exit status of pid {pid} was lost"),
                }
            }
            () = sleep_until(drain_cap_at), if drain_cap_at.is_some() => break,
            (ready, permit, credit) = wait_output(first, outbox, window), if first.is_some() => {
                let got = read_ready(ready, &mut buf);
                let sink = Sink { stream, channel: outputs[0].channel, limit, permit, credit };
                handle_read(&mut progress[0], got, &buf, sink, &mut truncated);
            }
            (ready, permit, credit) = wait_output(second, outbox, window), if second.is_some() => {
                let got = read_ready(ready, &mut buf);
                let sink = Sink { stream, channel: outputs[1].channel, limit, permit, credit };
                handle_read(&mut progress[1], got, &buf, sink, &mut truncated);
            }
        }
    }

    let channels: Vec<u8> = outputs.iter().map(|o| o.channel).collect();
    for (output, _) in outputs.into_iter().zip(&progress).filter(|(_, p)| p.open) {
        // Whoever still holds the pipe must never block on a full pipe or die of SIGPIPE.
        tokio::spawn(discard_until_eof(output.fd));
    }
    for channel in channels {
        outbox
            .send(Frame::new(stream, FrameKind::Eof, vec![channel]))
            .await;
    }
    let duration = ended_at.saturating_duration_since(started);
    Ok(ExecExit {
        exit_code: status.and_then(ExitStatus::code),
        signal: status.and_then(ExitStatus::signal_name),
        timed_out,
        cancelled,
        duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
        truncated,
    })
}

fn register_outputs(outputs: Vec<(u8, OwnedFd)>) -> io::Result<Vec<Output>> {
    outputs
        .into_iter()
        .map(|(channel, fd)| {
            Ok(Output {
                channel,
                fd: AsyncFd::new(fd)?,
            })
        })
        .collect()
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Waits until `output` is readable and, when its bytes are still to be sent
/// (`want_room`), for the credit a full read may cost (with a `window`) and for room in the
/// outbox. Readiness comes first so that idle commands never sit on credit or outbox slots.
/// Cancel-safe: nothing is consumed until the caller reads (an unused credit permit returns
/// to its window when dropped).
async fn wait_output<'a>(
    output: Option<(&'a Output, bool)>,
    outbox: &'a Outbox,
    window: Option<&'a Semaphore>,
) -> (
    io::Result<AsyncFdReadyGuard<'a, OwnedFd>>,
    Option<mpsc::Permit<'a, Frame>>,
    Option<Credit<'a>>,
) {
    let Some((output, want_room)) = output else {
        return std::future::pending().await;
    };
    let ready = output.fd.readable().await;
    if ready.is_err() || !want_room {
        return (ready, None, None);
    }
    let credit = match window {
        Some(window) => {
            let full = exec_window::cost(READ_CHUNK);
            let need = u32::try_from(full).expect("a read's cost fits u32");
            match window.acquire_many(need).await {
                Ok(permit) => Some(Credit { window, permit }),
                // Closed windows do not exist (it is never closed): read as without one.
                Err(_) => None,
            }
        }
        None => None,
    };
    (ready, outbox.reserve().await, credit)
}

/// Credit taken for one read: what the frame does not use goes back to the window.
struct Credit<'a> {
    window: &'a Semaphore,
    permit: SemaphorePermit<'a>,
}

impl Credit<'_> {
    /// Keeps the cost of a frame of `len` bytes out of the window (until the host returns
    /// it) and gives the rest back.
    fn spend(self, len: usize) {
        let taken = self.permit.num_permits();
        self.permit.forget();
        self.window
            .add_permits(taken.saturating_sub(exec_window::cost(len)));
    }
}

/// Where the bytes of one read go.
struct Sink<'a> {
    stream: u32,
    channel: u8,
    limit: u64,
    /// Room in the outbox; `None` while under the limit means the host side is gone.
    permit: Option<mpsc::Permit<'a, Frame>>,
    /// Flow-controlled execs: the credit for this read.
    credit: Option<Credit<'a>>,
}

/// What one read attempt gave.
enum ReadResult {
    Data(usize),
    Eof,
    Retry,
}

fn read_ready(ready: io::Result<AsyncFdReadyGuard<'_, OwnedFd>>, buf: &mut [u8]) -> ReadResult {
    let mut guard = match ready {
        Ok(guard) => guard,
        Err(err) => {
            log!("cannot poll command output: {err}");
            return ReadResult::Eof;
        }
    };
    match guard.try_io(|fd| Ok(nix::unistd::read(fd.get_ref(), buf)?)) {
        Err(_would_block) => ReadResult::Retry,
        Ok(Ok(0)) => ReadResult::Eof,
        Ok(Ok(n)) => ReadResult::Data(n),
        Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => ReadResult::Retry,
        // A pty master reports EIO once every slave descriptor is closed: that is its EOF.
        Ok(Err(err)) if err.raw_os_error() == Some(libc::EIO) => ReadResult::Eof,
        Ok(Err(err)) => {
            log!("reading command output failed: {err}");
            ReadResult::Eof
        }
    }
}

/// Applies one read to its channel: forwards what fits under the limit, counts the rest as
/// truncated.
fn handle_read(
    progress: &mut Progress,
    got: ReadResult,
    buf: &[u8],
    sink: Sink<'_>,
    truncated: &mut bool,
) {
    let n = match got {
        ReadResult::Data(n) => n,
        ReadResult::Eof => {
            progress.open = false;
            return;
        }
        ReadResult::Retry => return,
    };
    let room = usize::try_from(sink.limit.saturating_sub(progress.sent)).unwrap_or(usize::MAX);
    let take = n.min(room);
    if take < n {
        *truncated = true;
    }
    if take > 0 {
        if let Some(permit) = sink.permit {
            let mut payload = Vec::with_capacity(1 + take);
            payload.push(sink.channel);
            payload.extend_from_slice(&buf[..take]);
            permit.send(Frame::new(sink.stream, FrameKind::Data, payload));
            if let Some(credit) = sink.credit {
                credit.spend(take);
            }
        }
        progress.sent += u64::try_from(take).unwrap_or(u64::MAX);
    }
}

/// Whether any open output has bytes (or its EOF) waiting right now.
fn output_pending(outputs: &[Output], progress: &[Progress]) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds: Vec<PollFd<'_>> = outputs
        .iter()
        .zip(progress)
        .filter(|(_, p)| p.open)
        .map(|(o, _)| PollFd::new(o.fd.get_ref().as_fd(), PollFlags::POLLIN))
        .collect();
    if poll(&mut fds, PollTimeout::ZERO).is_err() {
        return false;
    }
    fds.iter().any(|fd| {
        fd.revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP))
    })
}

/// Reads and drops everything until EOF, for outputs still held open after the exec ended.
async fn discard_until_eof(fd: AsyncFd<OwnedFd>) {
    read_until_eof(&fd, |_| {}).await;
}

/// What a timeout or a cancel stops: the command's process group and, when the agent has
/// cgroups to give, the command's cgroup, which also holds what left the group.
struct Target {
    pgid: Pid,
    cgroup: Option<ExecCgroup>,
}

impl Target {
    /// Sends SIGTERM (and SIGCONT, so stopped processes can act on it) to every process.
    fn terminate(&self, grace: Duration) -> KillPhase {
        for signal in [Signal::SIGTERM, Signal::SIGCONT] {
            let _ = killpg(self.pgid, signal);
            if let Some(cgroup) = &self.cgroup {
                cgroup.signal(signal);
            }
        }
        KillPhase::Terminating(Instant::now() + grace)
    }

    /// Whether no process (not even a zombie of the group) is left.
    fn gone(&self) -> bool {
        group_gone(self.pgid) && self.cgroup.as_ref().is_none_or(ExecCgroup::is_empty)
    }

    /// SIGKILLs everything until nothing is left (or giving up, logged).
    async fn kill(&self) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all().await;
        }
        // Also without a cgroup, and for a group whose leader's zombie is not reaped yet.
        kill_group_until_gone(self.pgid).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(command: &str, cwd: &str) -> ExecRequest {
        ExecRequest {
            command: command.into(),
            cwd: cwd.into(),
            env: vec![],
            timeout_ms: 0,
            terminal: false,
            output_limit: 1024,
            kill_grace_ms: 0,
            output_window: false,
        }
    }

    fn env_of(spec: &ChildSpec) -> Vec<String> {
        spec.env
            .iter()
            .map(|e| e.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn base_environment_and_overrides() {
        let config = Config {
            exec_user: None,
            home: Some("/home/me".into()),
            ..Config::default()
        };
        let mut req = request("true", "/");
        req.env = vec![
            ("PATH".into(), "/opt/bin".into()),
            ("FOO".into(), "a=b".into()),
        ];
        let spec = prepare(&req, &config).expect("valid");
        assert_eq!(
            env_of(&spec),
            [
                "PATH=/opt/bin",
                "HOME=/home/me",
                "USER=sandbox",
                "LOGNAME=sandbox",
                "LANG=C.UTF-8",
                "TERM=dumb",
                "FOO=a=b"
            ]
        );
        req.terminal = true;
        let spec = prepare(&req, &config).expect("valid");
        assert!(env_of(&spec).contains(&"TERM=xterm-256color".to_owned()));
    }

    #[test]
    fn default_home_falls_back_to_root() {
        let home = home_dir(&Config::default());
        if Path::new(DEFAULT_HOME).is_dir() {
            assert_eq!(home, DEFAULT_HOME);
        } else {
            assert_eq!(home, "/");
        }
    }

    #[test]
    fn invalid_requests_are_refused_with_a_reason() {
        let config = Config::default();
        let long = "x".repeat(MAX_COMMAND_LEN + 1);
        let cases: Vec<(ExecRequest, &str)> = vec![
            (request(&long, "/"), "limit"),
            (request("a\0b", "/"), "NUL"),
            (
                request("true", "/no/such/dir"),
                "working directory /no/such/dir does not exist in the sandbox",
            ),
            (request("true", "/etc/passwd"), "is not a directory"),
            (request("true", "relative"), "absolute"),
            (request("true", ""), "absolute"),
            (
                ExecRequest {
                    env: vec![("".into(), "v".into())],
                    ..request("true", "/")
                },
                "invalid",
            ),
            (
                ExecRequest {
                    env: vec![("A=B".into(), "v".into())],
                    ..request("true", "/")
                },
                "invalid",
            ),
            (
                ExecRequest {
                    env: vec![("A\0".into(), "v".into())],
                    ..request("true", "/")
                },
                "invalid",
            ),
            (
                ExecRequest {
                    env: vec![("A".into(), "v\0".into())],
                    ..request("true", "/")
                },
                "NUL",
            ),
            (
                ExecRequest {
                    env: vec![("BIG".into(), "v".repeat(script::ARG_STRLEN_MAX))],
                    ..request("true", "/")
                },
                "at most 131071 per variable",
            ),
        ];
        for (req, needle) in cases {
            let err = prepare(&req, &config)
                .expect_err("must be refused")
                .to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }

    /// What the host reads for each kind of refusal is the text it always read, and a
    /// failure of the system keeps its cause.
    #[test]
    fn refusals_read_as_the_host_has_always_seen_them() {
        let config = Config::default();
        let text = |req: ExecRequest| prepare(&req, &config).expect_err("refused").to_string();
        assert_eq!(
            text(request("true", "tmp")),
            r#"working directory "tmp" must be an absolute path"#
        );
        assert_eq!(
            text(request("true", "/nonexistent-dynocap")),
            "working directory /nonexistent-dynocap does not exist in the sandbox"
        );
        assert_eq!(
            text(request("true", "/proc/self/status")),
            "working directory /proc/self/status is not a directory in the sandbox"
        );
        assert_eq!(text(request("a\0b", "/")), "command contains a NUL byte");
        assert_eq!(
            text(ExecRequest {
                env: vec![("A=B".into(), "v".into())],
                ..request("true", "/")
            }),
            r#"environment variable name "A=B" is invalid: it must be non-empty and contain no '=' or NUL"#
        );
        let err = ExecError::Spawn(io::Error::from_raw_os_error(libc::ENOEXEC));
        assert_eq!(
            err.to_string(),
            format!(
                "cannot start the command: {}",
                io::Error::from_raw_os_error(libc::ENOEXEC)
            )
        );
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn exec_user_equal_to_ours_is_not_applied() {
        let uid = nix::unistd::getuid().as_raw();
        let config = Config {
            exec_user: Some(spawn::ExecUser { uid, gid: 0 }),
            home: None,
            ..Config::default()
        };
        assert_eq!(
            prepare(&request("true", "/"), &config).expect("valid").user,
            None
        );
        let other = Config {
            exec_user: Some(spawn::ExecUser {
                uid: uid + 1,
                gid: 5,
            }),
            home: None,
            ..Config::default()
        };
        assert!(prepare(&request("true", "/"), &other)
            .expect("valid")
            .user
            .is_some());
    }
}
