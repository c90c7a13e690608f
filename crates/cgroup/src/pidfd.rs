//! `pidfd_open(2)` and `pidfd_send_signal(2)` in nix's types. The calls are rustix's (the
//! workspace's one way to make them, with no unsafe block of its own); the agent, the jail and
//! pasta's keeper in dynocap-host all take them from here.

use std::os::fd::{BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// `pidfd_open(2)`: a stable handle on process `pid` (fails with ESRCH if it is gone).
pub fn pidfd_open(pid: Pid) -> Result<OwnedFd, Errno> {
    // A pid of 0 or below names no one process.
    let pid = (pid.as_raw() > 0)
        .then(|| rustix::process::Pid::from_raw(pid.as_raw()))
        .flatten()
        .ok_or(Errno::EINVAL)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).map_err(errno)
}

/// `pidfd_send_signal(2)`: signals exactly the process `pidfd` refers to, never a process
/// that reused its pid.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: Signal) -> Result<(), Errno> {
    let signal = rustix::process::Signal::from_named_raw(signal as i32).ok_or(Errno::EINVAL)?;
    rustix::process::pidfd_send_signal(pidfd, signal).map_err(errno)
}

fn errno(err: rustix::io::Errno) -> Errno {
    Errno::from_raw(err.raw_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn pidfd_of_self() {
        let me = nix::unistd::getpid();
        let fd = pidfd_open(me).expect("pidfd_open");
        // The kernel says whose pidfd it is.
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
            .expect("fdinfo");
        assert!(info.lines().any(|l| l == format!("Pid:\t{me}")), "{info}");
        assert_eq!(pidfd_open(Pid::from_raw(0)).unwrap_err(), Errno::EINVAL);
        assert_eq!(pidfd_open(Pid::from_raw(-1)).unwrap_err(), Errno::EINVAL);
    }

    #[test]
    fn pidfd_signals_its_process_only() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
        let fd = pidfd_open(pid).expect("pidfd_open");
        pidfd_send_signal(fd.as_fd(), Signal::SIGKILL).expect("pidfd_send_signal");
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: the pidfd still names that process, which is gone, not a successor.
        assert_eq!(
            pidfd_send_signal(fd.as_fd(), Signal::SIGKILL).unwrap_err(),
            Errno::ESRCH
        );
    }
}
