//! Whether anyone still waits for a supervisor's start.
//!
//! A start is asked for by a process that waits on the read end of the supervisor's ready pipe:
//! `dynocap task start`, `dynocap run`, the MCP server in the middle of a `dynocap_task_start`.
//! A starter that is interrupted drops its start, and its guard kills the supervisor. A
//! starter that cannot clean up (SIGKILL, the OOM killer, a crash) only leaves the pipe: its
//! read end closes with its last holder, the starter's process. Without this watch the
//! supervisor would then run its clone, import or boot to the end (a clone that a server never
//! answers runs until the clone's 15-minute timeout), for nobody.
//!
//! The kernel says when the last reader of a pipe is gone: its write end polls as `POLLERR`.
//! The supervisor holds that end anyway, so watching it costs nothing and needs no pid of the
//! starter (which would not be the same process for a standby, handed its order by whoever
//! holds it). The watch runs beside every step of a start (boot, connecting to the agent,
//! import or clone, opening the egress); once the starter is gone, the start is dropped and the
//! supervisor removes the sandbox as the starter's guard would have: guest, files, record.
//!
//! Not watched: a warm-pool boot, whose starter does not wait (it drops the read end at once:
//! the pooled sandbox is nobody's until it is claimed), and a recovery, which saves an
//! unsaved task's work whoever waits for it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::starter_watch";

/// A watch on the reader of a ready pipe, through a duplicate of its write end.
///
/// The duplicate is one more writer: drop the watch before the supervisor's last word, so that
/// a starter that reads to end-of-file is not kept waiting by it.
pub struct StarterWatch {
    fd: OwnedFd,
}

impl StarterWatch {
    /// Watches the reader of the pipe whose write end is `ready`.
    pub fn new(ready: BorrowedFd<'_>) -> io::Result<Self> {
        Ok(StarterWatch {
            fd: ready.try_clone_to_owned()?,
        })
    }

    /// True once every reader of the pipe has closed it (the starter ended).
    pub fn gone_now(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            // Errors and hang-ups are always reported; nothing else is asked for.
            events: 0,
            revents: 0,
        };
        // SAFETY: poll reads and writes one pollfd, a live local; timeout 0 never blocks.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready > 0 && poll.revents & (libc::POLLERR | libc::POLLHUP) != 0
    }

    /// Completes once every reader of the pipe has closed it; never if that cannot be watched
    /// (the start then runs on, as without a watch, and the starter's guard still ends it).
    pub async fn gone(&self) {
        let Some(watched) = self.register() else {
            tracing::warn!(target: LOG_TARGET, "cannot watch the ready pipe's reader; a dead starter goes unnoticed");
            return std::future::pending().await;
        };
        loop {
            match watched.ready(Interest::ERROR).await {
                Ok(mut guard) => {
                    if self.gone_now() {
                        return;
                    }
                    guard.clear_ready();
                }
                Err(_) => return std::future::pending().await,
            }
        }
    }

    /// The pipe registered with the runtime for its error state only. A second duplicate,
    /// since the registration owns what it watches.
    fn register(&self) -> Option<AsyncFd<OwnedFd>> {
        // SAFETY: fcntl with F_DUPFD_CLOEXEC reads no memory and returns a new descriptor or -1.
        let raw = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if raw < 0 {
            return None;
        }
        // SAFETY: fcntl just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        AsyncFd::with_interest(fd, Interest::ERROR).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe")
    }

    #[test]
    fn a_reader_that_closes_is_gone_and_one_that_holds_is_not() {
        let (read, write) = pipe();
        let watch = StarterWatch::new(write.as_fd()).expect("watch");
        assert!(!watch.gone_now());
        drop(read);
        assert!(watch.gone_now());
    }

    #[test]
    fn the_watch_wakes_when_the_reader_closes_later() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (read, write) = pipe();
        let watch = StarterWatch::new(write.as_fd()).expect("watch");
        runtime.block_on(async {
            let closer = tokio::spawn(async move {
                tokio::task::yield_now().await;
                drop(read);
            });
            watch.gone().await;
            closer.await.expect("closer");
        });
        assert!(watch.gone_now());
    }

    #[test]
    fn a_reader_gone_before_the_watch_starts_is_seen_at_once() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (read, write) = pipe();
        drop(read);
        let watch = StarterWatch::new(write.as_fd()).expect("watch");
        runtime.block_on(watch.gone());
    }
}
