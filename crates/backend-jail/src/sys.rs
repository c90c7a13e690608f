//! Raw system calls the jail needs that neither std nor nix wrap (fork-style `clone` with a
//! pidfd, `close_range`, `dup2` onto a fixed number, `_exit`), each behind a small safe (or
//! documented-unsafe) function; and the pidfd calls (dynocap-cgroup's), in nix's types.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::unistd::Pid;

/// What `clone_fork` returned in this process.
pub(crate) enum CloneResult {
    /// We are the new process.
    Child,
    /// We are the caller; the child is `pid`, and `pidfd` refers to it.
    Parent { pid: Pid, pidfd: OwnedFd },
}

/// `clone(2)` with fork semantics (the child continues on a copy of the caller's stack) into
/// the namespaces in `namespaces`, with `SIGCHLD` as exit signal and a pidfd for the child
/// returned atomically (`CLONE_PIDFD`: no window in which the pid could be reused).
///
/// # Safety
///
/// As for `fork(2)`: if the calling process has other threads, the child may only make
/// async-signal-safe calls (raw syscalls; no allocation, no locks: another thread may have
/// held them at the time of the clone). In every case the child must end in `execve` or
/// [`exit_now`], never by returning into code that believes it is the parent.
pub(crate) unsafe fn clone_fork(namespaces: CloneFlags) -> Result<CloneResult, Errno> {
    let mut pidfd: libc::c_int = -1;
    let flags = namespaces.bits() | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: x86_64 raw clone takes (flags, stack, parent_tid, child_tid, tls). A null stack
    // gives fork semantics (the child runs on its own copy of this stack); with CLONE_PIDFD
    // the kernel writes the pidfd through `parent_tid`, which points at a live c_int. The
    // caller upholds the single-thread contract above.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_long::from(flags),
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    match ret {
        -1 => Err(Errno::last()),
        0 => Ok(CloneResult::Child),
        child => {
            let pid = i32::try_from(child).map_err(|_| Errno::EOVERFLOW)?;
            // SAFETY: on success the kernel installed `pidfd` in our table; nothing else owns it.
            let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
            Ok(CloneResult::Parent {
                pid: Pid::from_raw(pid),
                pidfd,
            })
        }
    }
}

/// `pidfd_send_signal(2)`, shared with the agent (dynocap-cgroup has the pidfd calls).
pub(crate) use dynocap_cgroup::pidfd::pidfd_send_signal;

/// Marks every fd from `first` up close-on-exec (`close_range(first, ~0, CLOSE_RANGE_CLOEXEC)`):
/// whatever the supervisor had open cannot leak into the guest, while fds still needed before
/// exec keep working.
pub(crate) fn cloexec_from(first: u32) -> Result<(), Errno> {
    // SAFETY: close_range only changes fd flags with CLOSE_RANGE_CLOEXEC; no memory involved.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Duplicates `fd` onto the number `target` (replacing whatever was there), without
/// close-on-exec: the way an fd is handed to the program about to be exec'd.
///
/// Only for the guest init between clone and exec: `target` may be an fd some `OwnedFd` of
/// the copied parent state believes it owns, which is fine because that state never runs
/// again in this process.
pub(crate) fn dup_onto(fd: BorrowedFd<'_>, target: RawFd) -> Result<(), Errno> {
    if fd.as_raw_fd() == target {
        // dup2 would be a no-op and leave FD_CLOEXEC set.
        // SAFETY: F_SETFD on a valid fd only changes its flags.
        let ret = unsafe { libc::fcntl(target, libc::F_SETFD, 0) };
        return if ret < 0 { Err(Errno::last()) } else { Ok(()) };
    }
    // SAFETY: dup2 atomically replaces `target`; see the function comment for ownership.
    let ret = unsafe { libc::dup2(fd.as_raw_fd(), target) };
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// A close-on-exec duplicate of `fd` numbered `min` or higher (`F_DUPFD_CLOEXEC`): keeps an
/// fd clear of the low numbers the guest init later fills with stdio and the channel.
pub(crate) fn dup_at_least(fd: BorrowedFd<'_>, min: RawFd) -> Result<OwnedFd, Errno> {
    let new = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) just returned this new fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// True if `fd` is open in this process.
pub(crate) fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only queries flags; an unused number yields EBADF.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Ends this process now, without unwinding, destructors or atexit handlers: the only
/// correct way out of a forked child that must not touch the parent's state.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// Waits (briefly) until this process's thread `tid`, already joined, has left the process.
/// A join returns once the kernel has cleared the thread's tid, which it does while the
/// thread exits and before the thread stops being counted: a single-thread check in that
/// window sees two threads (one start in a few hundred failed so). Gives up after a second,
/// leaving that check to report it.
pub(crate) fn wait_for_joined_thread_to_leave(tid: Pid) {
    has_left(tid, std::time::Duration::from_secs(1));
}

/// Whether thread `tid` of this process has left it within `patience`.
fn has_left(tid: Pid, patience: std::time::Duration) -> bool {
    let task = format!("/proc/self/task/{tid}");
    let deadline = std::time::Instant::now() + patience;
    loop {
        if !std::path::Path::new(&task).exists() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
}

/// Number of threads in this process, from `/proc/self/status`.
pub(crate) fn thread_count() -> std::io::Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other("no Threads: line in /proc/self/status"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_threads() {
        assert!(thread_count().expect("status") >= 1);
    }

    #[test]
    fn a_thread_has_left_once_joined_and_gone_not_while_it_runs() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel();
        let running = std::thread::spawn(move || {
            tell.send(nix::unistd::gettid())
                .expect("the test waits for the tid");
            let _ = stopped.recv();
        });
        let tid = told.recv().expect("the thread tells its tid");
        assert!(!has_left(tid, std::time::Duration::from_millis(50)));
        drop(stop);
        running.join().expect("the thread ends");
        assert!(has_left(tid, std::time::Duration::from_secs(10)));
    }
}
