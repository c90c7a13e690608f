//! Helper programs the agent runs for itself (git), from async code, through the same
//! fork/exec path and reaper as execs: nothing here calls `waitpid`, so statuses are never
//! stolen from the reaper thread.
//!
//! A [`Child`] leads its own process group; cancelling or dropping it kills the whole group.
//! Its stdout is read by the caller chunk by chunk (so a diff can be streamed as it comes);
//! its stderr is collected on the side, bounded, for error messages.

use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::process_group::{kill_group_until_gone, Stop};
use crate::reaper::ExitStatus;
use crate::spawn::{self, ChildSpec};

/// Stderr kept for error messages; the rest is read and dropped.
const STDERR_KEEP: usize = 16 * 1024;
/// After the program exits, its pipes are read until they are empty and closed, or this long
/// at most (a process it left behind might hold them open).
const DRAIN_CAP: Duration = Duration::from_secs(2);
/// Default cap on the stdout [`run`] collects.
pub const OUTPUT_CAP: usize = 16 * 1024 * 1024;

/// How a program ended, with its captured stderr.
#[derive(Debug)]
pub struct Finished {
    pub status: Option<ExitStatus>,
    pub stderr: Vec<u8>,
}

impl Finished {
    pub fn success(&self) -> bool {
        self.status == Some(ExitStatus::Exited(0))
    }

    /// `exit 128: fatal: ...`, for error messages.
    pub fn describe(&self) -> String {
        let status = match self.status {
            Some(ExitStatus::Exited(code)) => format!("exit {code}"),
            Some(ExitStatus::Signaled(sig)) => {
                format!("killed by {}", crate::reaper::signal_name(sig))
            }
            None => "exit status lost".to_owned(),
        };
        let text = String::from_utf8_lossy(&self.stderr);
        let text = text.trim();
        if text.is_empty() {
            status
        } else {
            format!("{status}: {text}")
        }
    }
}

/// Why running a program (git, mostly) did not give a result. Callers say what was
/// cancelled in their own words; every other variant's text is the whole story.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A `Cancel` frame or the end of the channel stopped it; the group was killed.
    #[error("the run was cancelled")]
    Cancelled,
    #[error("cannot start {program}: {source}")]
    Start { program: String, source: io::Error },
    #[error("cannot read the output of {program}: {source}")]
    ReadOutput { program: String, source: io::Error },
    #[error("{program} wrote more than {cap} bytes of output")]
    OutputTooLarge { program: String, cap: usize },
    /// A git run that could not start, or whose output could not be read, named by its
    /// subcommand.
    #[error("git {subcommand}: {source}")]
    Git {
        subcommand: String,
        source: Box<RunError>,
    },
    /// Git ran and failed: its exit status and stderr (see [`Finished::describe`]).
    #[error("git {subcommand} failed ({outcome})")]
    GitFailed { subcommand: String, outcome: String },
    #[error(transparent)]
    GitSpec(#[from] crate::git::SpecError),
    #[error("git is not installed in the sandbox (looked in {})", spawn::BASE_PATH)]
    NoGit,
    #[error("git's path has a NUL byte")]
    NulInGitPath,
}

/// What one step of [`Child::read`] gave.
enum Step {
    Read(io::Result<usize>),
    WouldBlock,
    Exited(Result<ExitStatus, oneshot::error::RecvError>),
    DrainOver,
}

/// A running helper program.
pub struct Child {
    pgid: Pid,
    exit: oneshot::Receiver<ExitStatus>,
    status: Option<ExitStatus>,
    /// The reaper went away without a status (never expected).
    status_lost: bool,
    exited_at: Option<Instant>,
    stdout: Option<AsyncFd<OwnedFd>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_task: Option<JoinHandle<()>>,
    /// Set once the group is known to be dead (or was killed): nothing to kill on drop.
    finished: bool,
}

impl Child {
    /// Starts the program. `spec.terminal` must be false.
    pub fn spawn(spec: &ChildSpec) -> io::Result<Child> {
        let spawned = spawn::spawn(spec)?;
        let mut child = Child {
            pgid: Pid::from_raw(spawned.pid),
            exit: spawned.exit,
            status: None,
            status_lost: false,
            exited_at: None,
            stdout: None,
            stderr: Arc::default(),
            stderr_task: None,
            finished: false,
        };
        for (channel, fd) in spawned.outputs {
            // On failure the returned error drops `child`, which kills the group.
            let fd = AsyncFd::new(fd)?;
            if channel == dynocap_proto::channel::STDOUT {
                child.stdout = Some(fd);
            } else {
                child.stderr_task =
                    Some(tokio::spawn(collect_stderr(fd, Arc::clone(&child.stderr))));
            }
        }
        Ok(child)
    }

    /// Asks for a stdout pipe of `bytes` (at most the system's `pipe-max-size`), so that the
    /// command can run ahead of its reader by that much; the pipe stays as it is when the
    /// kernel refuses.
    pub fn widen_stdout(&self, bytes: i32) {
        if let Some(fd) = self.stdout.as_ref() {
            let _ = nix::fcntl::fcntl(fd.get_ref(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(bytes));
        }
    }

    /// Reads the next chunk of stdout into `buf`; 0 means stdout is finished. Cancel-safe.
    pub async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let drain_at = self.exited_at.map(|at| at + DRAIN_CAP);
            let step = {
                let Some(fd) = self.stdout.as_ref() else {
                    return Ok(0);
                };
                let waiting = self.status.is_none() && !self.status_lost;
                tokio::select! {
                    biased;
                    ready = fd.readable() => match ready {
                        Err(err) => Step::Read(Err(err)),
                        Ok(mut guard) => {
                            match guard.try_io(|fd| Ok(nix::unistd::read(fd.get_ref(), &mut *buf)?)) {
                                Ok(result) => Step::Read(result),
                                Err(_would_block) => Step::WouldBlock,
                            }
                        }
                    },
                    status = &mut self.exit, if waiting => Step::Exited(status),
                    () = sleep_until(drain_at), if drain_at.is_some() => Step::DrainOver,
                }
            };
            match step {
                Step::Read(Ok(0)) | Step::DrainOver => {
                    self.stdout = None;
                    return Ok(0);
                }
                Step::Read(Ok(n)) => return Ok(n),
                Step::Read(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                Step::Read(Err(err)) => {
                    self.stdout = None;
                    return Err(err);
                }
                Step::WouldBlock => {}
                Step::Exited(status) => self.note_exit(status),
            }
        }
    }

    fn note_exit(&mut self, status: Result<ExitStatus, oneshot::error::RecvError>) {
        match status {
            Ok(status) => self.status = Some(status),
            Err(_) => {
                log!("exit status of helper process {} was lost", self.pgid);
                self.status_lost = true;
            }
        }
        self.exited_at = Some(Instant::now());
    }

    /// Waits for the program to exit (stdout should have been read to its end first) and
    /// returns its status and stderr. Cancel-safe.
    pub async fn wait(&mut self) -> Finished {
        // Whatever stdout still holds is not wanted any more.
        self.stdout = None;
        if self.status.is_none() && !self.status_lost {
            let status = (&mut self.exit).await;
            self.note_exit(status);
        }
        self.finished = true;
        if let Some(task) = self.stderr_task.as_mut() {
            if tokio::time::timeout(DRAIN_CAP, &mut *task).await.is_err() {
                task.abort();
            }
        }
        self.stderr_task = None;
        Finished {
            status: self.status,
            stderr: self.stderr_text_bytes(),
        }
    }

    fn stderr_text_bytes(&self) -> Vec<u8> {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Kills the whole process group and waits until it is gone.
    pub async fn kill(&mut self) {
        self.stdout = None;
        if !self.finished {
            kill_group_until_gone(self.pgid).await;
            self.finished = true;
        }
        if let Some(task) = self.stderr_task.take() {
            task.abort();
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // A task dropped mid-run (shutdown timeout) must not leave git running.
        if !self.finished {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
        if let Some(task) = self.stderr_task.take() {
            task.abort();
        }
    }
}

async fn collect_stderr(fd: AsyncFd<OwnedFd>, sink: Arc<Mutex<Vec<u8>>>) {
    crate::process_group::read_until_eof(&fd, |chunk| {
        let mut kept = sink.lock().unwrap_or_else(PoisonError::into_inner);
        let room = STDERR_KEEP.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    })
    .await;
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Resolves when the stream is asked to stop. A closed stop queue never resolves: the stream
/// table only drops it after the stream finished.
pub async fn stop_requested(stop: &mut mpsc::Receiver<Stop>) {
    if stop.recv().await.is_none() {
        std::future::pending::<()>().await;
    }
}

/// Runs a program to its end, collecting at most `cap` bytes of stdout (more is an error).
/// A stop request kills it.
pub async fn run(
    spec: &ChildSpec,
    cap: usize,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(Vec<u8>, Finished), RunError> {
    let name = program_name(spec);
    let mut stdout = Vec::new();
    let finished = run_streaming(spec, stop, |chunk| {
        if stdout.len() + chunk.len() > cap {
            return Err(RunError::OutputTooLarge {
                program: name.clone(),
                cap,
            });
        }
        stdout.extend_from_slice(chunk);
        Ok(())
    })
    .await?;
    Ok((stdout, finished))
}

/// Runs a program to its end, handing its stdout to `sink` as it comes; an error from the
/// sink kills it and is the result. A stop request kills it.
pub async fn run_streaming(
    spec: &ChildSpec,
    stop: &mut mpsc::Receiver<Stop>,
    mut sink: impl FnMut(&[u8]) -> Result<(), RunError>,
) -> Result<Finished, RunError> {
    let name = program_name(spec);
    let mut child = Child::spawn(spec).map_err(|source| RunError::Start {
        program: name.clone(),
        source,
    })?;
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let read = tokio::select! {
            biased;
            () = stop_requested(stop) => None,
            read = child.read(&mut buf) => Some(read),
        };
        let failed = match read {
            None => {
                child.kill().await;
                return Err(RunError::Cancelled);
            }
            Some(Ok(0)) => break,
            Some(Ok(n)) => sink(&buf[..n]).err(),
            Some(Err(source)) => Some(RunError::ReadOutput {
                program: name.clone(),
                source,
            }),
        };
        if let Some(err) = failed {
            child.kill().await;
            return Err(err);
        }
    }
    let finished = tokio::select! {
        biased;
        () = stop_requested(stop) => None,
        finished = child.wait() => Some(finished),
    };
    match finished {
        Some(finished) => Ok(finished),
        None => {
            child.kill().await;
            Err(RunError::Cancelled)
        }
    }
}

/// `argv[1]` (the git subcommand after options is not known here) or the program path, for
/// messages.
pub fn program_name(spec: &ChildSpec) -> String {
    spec.argv
        .first()
        .map(|arg| arg.to_string_lossy().into_owned())
        .unwrap_or_else(|| spec.program.to_string_lossy().into_owned())
}

/// Builds the `KEY=VALUE` list of an environment.
pub fn env_list<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> io::Result<Vec<CString>> {
    pairs
        .into_iter()
        .map(|(k, v)| {
            CString::new(format!("{k}={v}")).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "environment contains a NUL byte",
                )
            })
        })
        .collect()
}

/// For tests: `sh -c script` in `/` with the base PATH, as the agent itself, in no command
/// cgroup.
#[cfg(test)]
pub(crate) fn shell_spec(script: &str) -> ChildSpec {
    let argv = vec![
        c"sh".to_owned(),
        c"-c".to_owned(),
        CString::new(script).expect("no NUL"),
    ];
    program_spec(c"/bin/sh", argv, c"/")
}

/// For tests: `program` with `argv` in `cwd`, with the base PATH alone, as the agent itself,
/// in no command cgroup. Run it with [`run`]: a test's own `std::process` child could be
/// reaped by the reaper thread another test started.
#[cfg(test)]
pub(crate) fn program_spec(
    program: &std::ffi::CStr,
    argv: Vec<CString>,
    cwd: &std::ffi::CStr,
) -> ChildSpec {
    ChildSpec {
        program: program.to_owned(),
        argv,
        env: env_list([("PATH", crate::spawn::BASE_PATH)]).expect("env"),
        cwd: cwd.to_owned(),
        terminal: false,
        user: None,
        stdin: None,
        cgroup: None,
        extra_group: None,
        stdio: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn collects_stdout_stderr_and_status() {
        crate::init::setup();
        let (_stop_tx, mut stop) = mpsc::channel(1);
        let (out, finished) = run(
            &shell_spec("echo out; echo err >&2; exit 3"),
            1024,
            &mut stop,
        )
        .await
        .expect("runs");
        assert_eq!(out, b"out\n");
        assert_eq!(finished.status, Some(ExitStatus::Exited(3)));
        assert_eq!(finished.describe(), "exit 3: err");
        assert!(!finished.success());
    }

    #[tokio::test]
    async fn output_over_the_cap_and_stop_requests_kill_the_group() {
        crate::init::setup();
        let (_stop_tx, mut stop) = mpsc::channel(1);
        let err = run(&shell_spec("head -c 100000 /dev/zero"), 1000, &mut stop).await;
        match err {
            Err(err @ RunError::OutputTooLarge { cap: 1000, .. }) => {
                assert_eq!(err.to_string(), "sh wrote more than 1000 bytes of output");
            }
            other => panic!("{other:?}"),
        }

        let (stop_tx, mut stop) = mpsc::channel(1);
        stop_tx.send(Stop::Cancel).await.expect("send");
        let started = Instant::now();
        let err = run(&shell_spec("sleep 100"), 1000, &mut stop).await;
        assert!(matches!(err, Err(RunError::Cancelled)));
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[tokio::test]
    async fn a_left_behind_process_holding_stdout_does_not_hang_the_run() {
        crate::init::setup();
        let (_stop_tx, mut stop) = mpsc::channel(1);
        let started = Instant::now();
        let (out, finished) = run(
            &shell_spec("echo $$; sleep 30 & echo done"),
            1024,
            &mut stop,
        )
        .await
        .expect("runs");
        assert!(started.elapsed() < Duration::from_secs(15));
        assert!(finished.success());
        let text = String::from_utf8_lossy(&out).into_owned();
        let pgid: i32 = text
            .lines()
            .next()
            .and_then(|l| l.parse().ok())
            .expect("pid");
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}
