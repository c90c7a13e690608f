//! A command's process group as the agent's two ways of running programs (the host's execs
//! and the agent's own helpers, such as git) both see it: why the host wants it stopped, the
//! SIGKILL that repeats until the group is gone, and the reading of its pipes to the end.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;

/// How often SIGKILL is repeated until the process group is gone, and for how long at most.
pub const KILL_RETRY: Duration = Duration::from_millis(10);
const KILL_GIVE_UP: Duration = Duration::from_secs(5);

/// Why the host wants an exec stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A `Cancel` frame: SIGTERM, grace period, SIGKILL, like a timeout.
    Cancel,
    /// The channel is gone: SIGKILL at once.
    Shutdown,
}

/// Reads a non-blocking descriptor until EOF or an error, handing each chunk to `each`.
pub async fn read_until_eof(fd: &AsyncFd<OwnedFd>, mut each: impl FnMut(&[u8])) {
    let mut buf = [0_u8; 4096];
    loop {
        let mut guard = match fd.readable().await {
            Ok(guard) => guard,
            Err(_) => return,
        };
        match guard.try_io(|fd| Ok(nix::unistd::read(fd.get_ref(), &mut buf)?)) {
            Err(_would_block) => {}
            Ok(Ok(0)) => return,
            Ok(Ok(n)) => each(&buf[..n]),
            Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(_)) => return,
        }
    }
}

/// Whether no process (not even a zombie) is left in the group.
pub fn group_gone(pgid: Pid) -> bool {
    killpg(pgid, None) == Err(Errno::ESRCH)
}

/// SIGKILLs the process group until the kernel says it no longer exists, so that a group that
/// keeps forking cannot outrun one signal. The group only disappears once its zombies are
/// reaped, which the reaper thread does on its own.
pub async fn kill_group_until_gone(pgid: Pid) {
    let give_up = Instant::now() + KILL_GIVE_UP;
    loop {
        match killpg(pgid, Signal::SIGKILL) {
            Err(Errno::ESRCH) => return,
            Err(err) => {
                log!("cannot kill process group {pgid}: {err}");
                return;
            }
            Ok(()) => {}
        }
        if Instant::now() >= give_up {
            log!("process group {pgid} still exists after {KILL_GIVE_UP:?} of SIGKILL");
            return;
        }
        tokio::time::sleep(KILL_RETRY).await;
    }
}
