//! The `nat` network's watch: pasta restarted when it dies, up to a bound, then the
//! network ended where everyone sees it.

use std::os::fd::AsRawFd;

use tokio::io::unix::AsyncFd;

use crate::backend::Guest;
use crate::model::sandbox_info::rfc3339;
use crate::supervisor::exec::ExecResult;

use super::state::*;

/// How many times a `nat` guest's pasta is started again after it died before its network
/// is ended instead: a pasta that keeps dying is not going to serve, and restarting it for
/// ever would hide that.
pub(super) const NETWORK_RESTARTS: u32 = 3;

/// Watches a `nat` guest's pasta and answers its death: it is started again, with the
/// configuration it first had, up to [`NETWORK_RESTARTS`] times; after that, or when it cannot
/// be, the guest's network ends where everyone sees it (the log, the record's note that `ps`
/// and `ls` show, every command's result).
pub(super) struct NetworkWatch {
    /// pasta's pidfd, registered with the runtime; `None` for a guest without pasta.
    exit: Option<AsyncFd<std::os::fd::RawFd>>,
    restarts: u32,
}

impl NetworkWatch {
    pub(super) fn new(guest: &dyn Guest) -> Self {
        Self {
            exit: Self::watch(guest),
            restarts: 0,
        }
    }

    pub(super) fn watch(guest: &dyn Guest) -> Option<AsyncFd<std::os::fd::RawFd>> {
        let fd = guest.network_exit_fd()?.as_raw_fd();
        match AsyncFd::new(fd) {
            Ok(watch) => Some(watch),
            Err(err) => {
                tracing::error!(target: LOG_TARGET, "cannot watch pasta, the guest's network: {err}");
                None
            }
        }
    }

    /// Resolves once pasta has exited; never without a pasta.
    pub(super) async fn exited(&self) {
        match &self.exit {
            Some(exit) => {
                let _ = exit.readable().await;
            }
            None => std::future::pending().await,
        }
    }

    /// Restarts pasta, or ends the network: what every command is then told (`Some`).
    pub(super) fn answer(&mut self, guest: &mut dyn Guest) -> Option<String> {
        // Unregistered before the restart closes the descriptor it watches.
        self.exit = None;
        let how = guest.network_exit();
        let failed = if self.restarts < NETWORK_RESTARTS {
            self.restarts += 1;
            tracing::warn!(target: LOG_TARGET,
                "network \"nat\": pasta exited ({how}); the guest has no network until it is \
                 started again (restart {} of {NETWORK_RESTARTS})",
                self.restarts
            );
            match guest.restart_network() {
                Ok(()) => {
                    self.exit = Self::watch(guest);
                    return None;
                }
                Err(err) => format!("and could not be started again: {}", err.message),
            }
        } else {
            format!("again after {NETWORK_RESTARTS} restarts")
        };
        if let Err(err) = guest.end_network() {
            tracing::warn!(target: LOG_TARGET, "{err}");
        }
        let lost = format!(
            "the sandbox's network (\"nat\") ended at {}: its pasta exited ({how}) {failed}; \
             the sandbox reaches nothing now. Destroy it and start a new one to have a network \
             again",
            rfc3339(chrono::Utc::now())
        );
        tracing::error!(target: LOG_TARGET, "{lost}");
        Some(lost)
    }
}

/// The line a command's stderr gets once the sandbox's network has ended.
pub(super) fn network_note(lost: &str) -> String {
    format!("\ndynocap: {lost}\n")
}

pub(super) fn with_network_note(mut result: ExecResult, lost: &str) -> ExecResult {
    let note = network_note(lost);
    match (&mut result.stderr, &mut result.transcript) {
        (_, Some(transcript)) => transcript.push_str(&note),
        (Some(stderr), None) => stderr.push_str(&note),
        (None, None) => result.stderr = Some(note),
    }
    result
}
