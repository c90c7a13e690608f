//! The supervisor's own failures and their error codes.

use std::path::PathBuf;

use crate::foundation::error::{Coded, Error, ErrorCode};

/// What failed in the supervisor's own work (not the guest's, not the backend's).
#[derive(Debug, thiserror::Error)]
pub(super) enum ProcessFailure {
    /// The agent binary the configuration names (`DYNOCAP_AGENT`).
    #[error(
        "DYNOCAP_AGENT={} is not a file; point it at a dynocap-agent binary or unset it",
        .path.display()
    )]
    AgentNotAFile { path: PathBuf },
    /// A relative `DYNOCAP_AGENT`, which each process would read against its own directory.
    #[error(
        "DYNOCAP_AGENT={} is a relative path; give the agent binary's absolute path",
        .path.display()
    )]
    AgentRelative { path: PathBuf },
    /// Where the agent binary was looked for, beside the running executable.
    #[error(
        "the guest agent {} is missing; install dynocap-agent next to dynocap or set \
         DYNOCAP_AGENT",
        .path.display()
    )]
    AgentMissing { path: PathBuf },
    #[error("starting the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// `failure` is the disk's (see `HostDisk::failure`), the cause of `taking`'s failure.
    #[error(
        "{failure}, so the final diff could not be taken in the guest ({})",
        .taking.message
    )]
    FinalDiffOnFailedDisk {
        failure: String,
        #[source]
        taking: Error,
    },
    #[error(
        "{failure}, so the diff cannot be taken in the guest ({}); its work up to the failure \
         is kept: `task finish` saves it (from a fresh guest, once a first finish left the \
         task unsaved)",
        .taking.message
    )]
    DiffOnFailedDisk {
        failure: String,
        #[source]
        taking: Error,
    },
    #[error("saving the results panicked: {0}")]
    SavePanicked(#[source] tokio::task::JoinError),
    #[error("syncing the sandbox's disk: {0}")]
    SyncPanicked(#[source] tokio::task::JoinError),
    #[error("{what}: the agent answered {answer:?}")]
    AgentAnswered {
        what: String,
        answer: Box<dynocap_proto::Response>,
    },
}

impl Coded for ProcessFailure {
    /// A failed disk is the machine's, a panic or an unexpected answer DynoCap's: none is
    /// the caller's to fix.
    fn code(&self) -> ErrorCode {
        match self {
            Self::AgentNotAFile { .. }
            | Self::AgentRelative { .. }
            | Self::AgentMissing { .. }
            | Self::Runtime(_)
            | Self::FinalDiffOnFailedDisk { .. }
            | Self::DiffOnFailedDisk { .. }
            | Self::SavePanicked(_)
            | Self::SyncPanicked(_)
            | Self::AgentAnswered { .. } => ErrorCode::Internal,
        }
    }
}
