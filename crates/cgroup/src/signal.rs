//! Signalling a cgroup's processes by pid without reaching a process that reused one: a pid
//! read from `cgroup.procs` may be reaped and handed to an unrelated process before the
//! signal goes out, so each is pinned with a pidfd first, and signalled through it only if
//! the cgroup, read after pinning, still lists it. (If the pinned process died and its pid
//! was reused inside the cgroup, the pidfd still names the dead one and the signal goes
//! nowhere; the next round finds the newcomer.)

use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::pidfd::{pidfd_open, pidfd_send_signal};

/// Processes pinned with a pidfd at a time: a full cgroup never takes more descriptors than
/// a process may have open.
const PIN_BATCH: usize = 128;

/// What to do with a pid that could not be pinned for another reason than being gone
/// (out of descriptors, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpinned {
    /// Leave it: the caller's next round will meet it again.
    Skip,
    /// Signal it by pid if the cgroup lists it: better than not at all, for a caller that
    /// has no next round to count on.
    SignalByPid,
}

/// Sends `signal` to those of `pids` that, once pinned, `members` (read after pinning, once
/// per batch) still lists. A process already gone is no error. Stops at the first error of
/// `members`; an error signalling one process is turned by `failed` into the caller's error
/// and returned once every other process had its signal.
pub fn signal_pinned<E>(
    pids: &[Pid],
    signal: Signal,
    unpinned: Unpinned,
    mut members: impl FnMut() -> Result<Vec<Pid>, E>,
    mut failed: impl FnMut(Pid, Errno) -> E,
) -> Result<(), E> {
    let mut first_failure = None;
    for batch in pids.chunks(PIN_BATCH) {
        let pinned: Vec<(Pid, Result<OwnedFd, Errno>)> =
            batch.iter().map(|&pid| (pid, pidfd_open(pid))).collect();
        let any_to_signal = pinned.iter().any(|(_, pin)| match pin {
            Ok(_) => true,
            Err(Errno::ESRCH) => false,
            Err(_) => unpinned == Unpinned::SignalByPid,
        });
        if !any_to_signal {
            continue;
        }
        let members = members()?;
        for (pid, pin) in pinned {
            if !members.contains(&pid) {
                continue;
            }
            let sent = match pin {
                Ok(pidfd) => pidfd_send_signal(pidfd.as_fd(), signal),
                Err(Errno::ESRCH) => continue,
                Err(_) if unpinned == Unpinned::Skip => continue,
                Err(_) => nix::sys::signal::kill(pid, signal),
            };
            match sent {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(errno) => {
                    if first_failure.is_none() {
                        first_failure = Some(failed(pid, errno));
                    }
                }
            }
        }
    }
    first_failure.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn sleeper() -> (std::process::Child, Pid) {
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
        (child, pid)
    }

    #[test]
    fn only_processes_still_listed_after_pinning_are_signalled() {
        let (mut listed, listed_pid) = sleeper();
        let (mut other, other_pid) = sleeper();
        let mut reads = 0;
        let sent = signal_pinned(
            &[listed_pid, other_pid],
            Signal::SIGKILL,
            Unpinned::Skip,
            || {
                reads += 1;
                Ok::<_, String>(vec![listed_pid])
            },
            |pid, errno| format!("{pid}: {errno}"),
        );
        assert_eq!(sent, Ok(()));
        assert_eq!(reads, 1, "one read of the members per batch");
        assert_eq!(listed.wait().expect("wait").signal(), Some(libc::SIGKILL));
        assert_eq!(other.try_wait().expect("try_wait"), None, "not a member");
        let _ = other.kill();
        let _ = other.wait();
    }

    #[test]
    fn a_member_list_that_cannot_be_read_stops_the_round() {
        let (mut child, pid) = sleeper();
        let sent = signal_pinned(
            &[pid],
            Signal::SIGKILL,
            Unpinned::SignalByPid,
            || Err("unreadable"),
            |_, _| "signal failed",
        );
        assert_eq!(sent, Err("unreadable"));
        assert_eq!(child.try_wait().expect("try_wait"), None);
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_process_gone_is_not_read_for_nor_an_error() {
        let (mut child, pid) = sleeper();
        child.kill().expect("kill");
        child.wait().expect("reap");
        let sent = signal_pinned(
            &[pid],
            Signal::SIGKILL,
            Unpinned::SignalByPid,
            || -> Result<Vec<Pid>, &str> { panic!("nothing pinned: no read") },
            |_, _| "signal failed",
        );
        assert_eq!(sent, Ok(()));
    }
}
