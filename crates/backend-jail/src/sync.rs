//! The two channels between the supervisor and the guest init, between clone and exec.
//!
//! - **sync** (a `SOCK_SEQPACKET` socketpair): the supervisor sends one byte once the id maps
//!   are written and the cgroups joined; the init waits for it. If the supervisor's end closes
//!   first (it died or gave up), the init sees EOF and exits. Just before exec the init checks
//!   the end is still open: with `PR_SET_PDEATHSIG` already set, this closes the window in
//!   which the supervisor could die unnoticed. A socket rather than a pipe so the supervisor
//!   can write with `MSG_NOSIGNAL` (no SIGPIPE if the init is gone).
//! - **errors** (a pipe, close-on-exec at both ends): the init writes why it failed, if it
//!   does; a successful `execve` closes its end, so EOF with nothing written means the agent
//!   is running.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use nix::unistd::{pipe2, read, write};

/// Longest failure report read from the init.
const MAX_REPORT: usize = 8192;

/// Both ends of both channels, as created before clone.
pub(crate) struct Channels {
    pub sync_parent: OwnedFd,
    pub sync_child: OwnedFd,
    pub errors_read: OwnedFd,
    pub errors_write: OwnedFd,
}

impl Channels {
    pub fn new() -> Result<Channels, Errno> {
        let (sync_parent, sync_child) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let (errors_read, errors_write) = pipe2(OFlag::O_CLOEXEC)?;
        Ok(Channels {
            sync_parent,
            sync_child,
            errors_read,
            errors_write,
        })
    }
}

/// Supervisor: lets the init proceed.
pub(crate) fn release(sync_parent: BorrowedFd<'_>) -> Result<(), Errno> {
    send(sync_parent.as_raw_fd(), b"1", MsgFlags::MSG_NOSIGNAL).map(drop)
}

/// Init: waits for the release. False if the supervisor went away instead.
pub(crate) fn wait_release(sync_child: BorrowedFd<'_>) -> bool {
    let mut byte = [0u8; 1];
    loop {
        match recv(sync_child.as_raw_fd(), &mut byte, MsgFlags::empty()) {
            Ok(1) => return true,
            Err(Errno::EINTR) => continue,
            _ => return false,
        }
    }
}

/// Init: true if the supervisor's end of `sync` is closed.
pub(crate) fn supervisor_gone(sync_child: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(sync_child, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLIN)
        }),
        Err(_) => true,
    }
}

/// Init: sends the failure report (best effort: if the supervisor is gone nobody reads it).
pub(crate) fn report(errors_write: BorrowedFd<'_>, message: &str) {
    let mut rest = message.as_bytes();
    while !rest.is_empty() {
        match write(errors_write, rest) {
            Ok(0) => return,
            Ok(n) => rest = rest.get(n..).unwrap_or_default(),
            Err(Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// What the supervisor learnt from the error pipe.
pub(crate) enum Outcome {
    /// EOF without a report: the init exec'd (or died silently; the caller checks).
    Exec,
    /// The init's failure report.
    Failed(String),
    /// Neither within the deadline.
    TimedOut,
}

/// Supervisor: reads the error pipe until EOF or `timeout`.
pub(crate) fn read_outcome(
    errors_read: BorrowedFd<'_>,
    timeout: Duration,
) -> Result<Outcome, Errno> {
    let deadline = Instant::now() + timeout;
    let mut report = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Outcome::TimedOut);
        }
        let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(errors_read, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e),
        }
        match read(errors_read, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if report.len() < MAX_REPORT {
                    report.extend_from_slice(buf.get(..n).unwrap_or_default());
                }
            }
            Err(Errno::EINTR | Errno::EAGAIN) => {}
            Err(e) => return Err(e),
        }
    }
    if report.is_empty() {
        Ok(Outcome::Exec)
    } else {
        Ok(Outcome::Failed(
            String::from_utf8_lossy(&report).into_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn release_and_hangup() {
        let ch = Channels::new().expect("channels");
        assert!(!supervisor_gone(ch.sync_child.as_fd()));
        release(ch.sync_parent.as_fd()).expect("release");
        assert!(wait_release(ch.sync_child.as_fd()));
        assert!(!supervisor_gone(ch.sync_child.as_fd()));
        drop(ch.sync_parent);
        assert!(supervisor_gone(ch.sync_child.as_fd()));
        assert!(!wait_release(ch.sync_child.as_fd()));
    }

    #[test]
    fn report_then_eof() {
        let ch = Channels::new().expect("channels");
        report(ch.errors_write.as_fd(), "mounting proc: EPERM");
        drop(ch.errors_write);
        match read_outcome(ch.errors_read.as_fd(), Duration::from_secs(5)).expect("read") {
            Outcome::Failed(m) => assert_eq!(m, "mounting proc: EPERM"),
            _ => panic!("expected a report"),
        }
    }

    #[test]
    fn silent_eof_and_timeout() {
        let ch = Channels::new().expect("channels");
        assert!(matches!(
            read_outcome(ch.errors_read.as_fd(), Duration::from_millis(50)),
            Ok(Outcome::TimedOut)
        ));
        drop(ch.errors_write);
        assert!(matches!(
            read_outcome(ch.errors_read.as_fd(), Duration::from_secs(5)),
            Ok(Outcome::Exec)
        ));
    }
}
