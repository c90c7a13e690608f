//! The single owner of `waitpid` in the process: one thread reaps every child (exec leaders
//! and the orphans the agent adopts as PID 1 or child subreaper) and hands exec leaders'
//! statuses to the exec that started them.
//!
//! Why a dedicated thread blocked in `waitpid(-1)` rather than a SIGCHLD-driven task: it
//! needs no signal disposition games (SIGCHLD stays at its default), it cannot miss
//! coalesced signals, and it is independent of any tokio runtime, so it is a true
//! process-wide singleton (unit tests run many runtimes in one process; several reapers would
//! steal each other's statuses). When there is no child at all, `waitpid` fails with ECHILD
//! and the thread parks until the next spawn unparks it.
//!
//! The race "child exits before its pid is registered" cannot happen: [`spawn_child`] holds
//! the waiter lock across fork and registration, and the thread takes that lock before it
//! delivers a status, so a status reaped early simply waits for the registration. Statuses
//! nobody registered for (adopted orphans) are dropped, so nothing accumulates.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::Thread;
use std::time::Duration;

use tokio::sync::oneshot;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Signaled(i32),
}

impl ExitStatus {
    fn from_raw(status: libc::c_int) -> Option<Self> {
        if libc::WIFEXITED(status) {
            Some(Self::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(Self::Signaled(libc::WTERMSIG(status)))
        } else {
            None
        }
    }

    pub fn code(self) -> Option<i32> {
        match self {
            Self::Exited(code) => Some(code),
            Self::Signaled(_) => None,
        }
    }

    /// `SIGKILL`-style name of the killing signal.
    pub fn signal_name(self) -> Option<String> {
        match self {
            Self::Exited(_) => None,
            Self::Signaled(sig) => Some(signal_name(sig)),
        }
    }
}

/// Name of a signal number; real-time signals, which nix has no names for, become `SIG<n>`.
pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(|_| format!("SIG{sig}"))
}

type Waiters = BTreeMap<libc::pid_t, oneshot::Sender<ExitStatus>>;

static WAITERS: Mutex<Waiters> = Mutex::new(BTreeMap::new());
static THREAD: Mutex<Option<Thread>> = Mutex::new(None);

fn waiters() -> MutexGuard<'static, Waiters> {
    // The map stays consistent even if a holder panicked: every update is one insert/remove.
    WAITERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts the reaper thread once per process; later calls return the running one.
pub fn start() -> io::Result<Thread> {
    let mut slot = THREAD.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(thread) = slot.as_ref() {
        return Ok(thread.clone());
    }
    // An inherited SIG_IGN for SIGCHLD would make the kernel auto-reap children, and waitpid
    // would never report an exec's status.
    // SAFETY: setting a standard disposition for SIGCHLD; no handler function is involved.
    let previous = unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    if previous == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    let handle = std::thread::Builder::new()
        .name("reaper".into())
        .stack_size(64 * 1024)
        .spawn(reap_forever)?;
    let thread = handle.thread().clone();
    *slot = Some(thread.clone());
    Ok(thread)
}

/// Runs `fork_child` (which forks and returns the child's pid in the parent) so that the
/// child's exit status is delivered to the returned receiver and nowhere else.
pub fn spawn_child<F>(fork_child: F) -> io::Result<(libc::pid_t, oneshot::Receiver<ExitStatus>)>
where
    F: FnOnce() -> io::Result<libc::pid_t>,
{
    let thread = start()?;
    let mut map = waiters();
    let pid = fork_child()?;
    let (tx, rx) = oneshot::channel();
    map.insert(pid, tx);
    drop(map);
    // The thread may be parked after an ECHILD from before this fork.
    thread.unpark();
    Ok((pid, rx))
}

fn reap_forever() {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid, writable c_int for the duration of the call.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if pid > 0 {
            deliver(pid, status);
            continue;
        }
        match io::Error::last_os_error().raw_os_error() {
            // No children: sleep until a spawn unparks us. A spurious wake-up just loops.
            Some(libc::ECHILD) => std::thread::park(),
            Some(libc::EINTR) => {}
            _ => {
                log!("waitpid failed: {}", io::Error::last_os_error());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn deliver(pid: libc::pid_t, status: libc::c_int) {
    let Some(exit) = ExitStatus::from_raw(status) else {
        return;
    };
    let waiter = waiters().remove(&pid);
    if let Some(tx) = waiter {
        // The exec may have gone away (its task was dropped); the status is then moot.
        let _ = tx.send(exit);
    }
}

/// Whether the process still has children (alive or zombie). Does not reap: WNOWAIT leaves
/// any zombie to the reaper thread.
pub fn has_children() -> bool {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value for it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t for the duration of the call.
    let rc = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL,
        )
    };
    rc == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork_exit(code: libc::c_int) -> io::Result<libc::pid_t> {
        // SAFETY: the child only calls _exit, which is async-signal-safe.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            // SAFETY: _exit never returns and runs no destructors or atexit handlers.
            0 => unsafe { libc::_exit(code) },
            pid => Ok(pid),
        }
    }

    #[tokio::test]
    async fn statuses_reach_their_spawner_even_when_the_child_exits_at_once() {
        let mut receivers = Vec::new();
        for code in 0..40 {
            let (pid, rx) = spawn_child(|| fork_exit(code)).expect("fork");
            // Give the child time to exit (and be reaped) before we even look.
            if code % 4 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            receivers.push((pid, code, rx));
        }
        for (pid, code, rx) in receivers {
            let status = tokio::time::timeout(Duration::from_secs(30), rx)
                .await
                .expect("status within 30 s")
                .expect("reaper delivers");
            assert_eq!(status, ExitStatus::Exited(code), "pid {pid}");
        }
    }

    #[test]
    fn statuses_decode() {
        assert_eq!(ExitStatus::from_raw(3 << 8), Some(ExitStatus::Exited(3)));
        assert_eq!(ExitStatus::from_raw(9), Some(ExitStatus::Signaled(9)));
        assert_eq!(
            ExitStatus::Signaled(9).signal_name().as_deref(),
            Some("SIGKILL")
        );
        assert_eq!(ExitStatus::Signaled(9).code(), None);
        assert_eq!(ExitStatus::Exited(0).signal_name(), None);
        assert_eq!(signal_name(40), "SIG40");
    }
}
