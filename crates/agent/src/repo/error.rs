//! Why a `Baseline` or `Diff` failed: one enum for every step of both requests, each variant
//! keeping the error it came from as its source. Its text is what the host reports (see
//! `Outbox::send_error`), so each variant's message is the whole story.

use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

use crate::command::RunError;
use crate::gitguard::GuardError;
use crate::index_memo::MemoError;
use crate::statedir::{ReceivedError, StateDirError};

/// Why a head the host sent is not one the user's repository can start on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("head {0:?} is not a valid branch name")]
    BranchName(String),
    #[error("head {0:?} is neither refs/heads/NAME nor a full commit id")]
    Unknown(String),
}

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    /// A stop request (a `Cancel`, the end of the channel) ended the step; the request names
    /// itself (see [`RepoError::of`]).
    #[error("{0} was cancelled")]
    Cancelled(&'static str),
    /// A git run (or the program behind it) failed.
    #[error(transparent)]
    Run(RunError),
    #[error("workspace {0:?} must be an absolute path without '..'")]
    BadWorkspace(String),
    #[error("cannot open the workspace {workspace}: {source}")]
    OpenWorkspace {
        workspace: String,
        source: io::Error,
    },
    /// The workspace, opened again for a step on the blocking pool.
    #[error("cannot open {}: {source}", path.display())]
    ReopenWorkspace { path: PathBuf, source: io::Error },
    #[error("the baseline is of {recorded}, not of {}", workspace.display())]
    OtherWorkspace {
        recorded: String,
        workspace: PathBuf,
    },
    #[error("internal error: {0}")]
    Worker(#[source] tokio::task::JoinError),
    #[error(transparent)]
    StateDir(#[from] StateDirError),
    #[error(transparent)]
    Head(#[from] HeadError),

    // The user's repository.
    #[error(transparent)]
    Bundle(#[from] ReceivedError),
    #[error("cannot copy the bundle: {0}")]
    CreateBundleCopy(#[source] Errno),
    #[error("cannot copy the bundle: {0}")]
    CopyBundle(#[source] io::Error),
    #[error("cannot hand the bundle copy to uid {uid}: {source}")]
    HandBundleCopy { uid: u32, source: Errno },
    #[error("cannot pass the bundle to git: {0}")]
    PassBundle(#[source] io::Error),
    #[error("the history bundle has no branch {0}")]
    NoBranchInBundle(String),
    #[error("the history bundle has no commit {id}")]
    NoCommitInBundle { id: String, source: RunError },
    #[error("{branch:?} is not a valid branch name")]
    InvalidBranch { branch: String, source: RunError },

    // The private repository and its notes.
    #[error("there is no baseline: send Baseline before Diff")]
    NoBaseline,
    #[error("cannot remove the previous baseline: {0}")]
    RemovePreviousBaseline(#[source] io::Error),
    #[error("cannot create the private repository: {0}")]
    CreatePrivate(#[source] Errno),
    #[error("cannot open the private repository: {0}")]
    OpenPrivate(#[source] Errno),
    #[error("cannot inspect the private repository: {0}")]
    InspectPrivate(#[source] Errno),
    #[error("cannot reach the private repository: {0}")]
    ReachPrivate(#[source] io::Error),
    #[error("cannot hand the private repository to uid {uid}: {source}")]
    HandOver { uid: u32, source: Errno },
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error(transparent)]
    IndexMemo(#[from] MemoError),
    #[error("cannot write the private repository's info/{what}: {source}")]
    CreateInfo { what: String, source: Errno },
    #[error("cannot write the private repository's info/{what}: {source}")]
    WriteInfo { what: String, source: io::Error },
    #[error("cannot record the {what}: {source}")]
    CreateNote { what: String, source: Errno },
    #[error("cannot record the {what}: {source}")]
    WriteNote { what: String, source: io::Error },
    #[error("cannot read the {what}: {source}")]
    OpenNote { what: String, source: Errno },
    #[error("cannot read the {what}: {source}")]
    ReadNote { what: String, source: io::Error },
    #[error("the recorded baseline commit {0:?} is not a commit id; send Baseline again")]
    BadBaselineCommit(String),
    #[error("cannot remove a stale index lock: {0}")]
    StaleIndexLock(#[source] Errno),
    #[error("cannot create a pipe: {0}")]
    Pipe(#[source] Errno),
    #[error("git hashed the empty tree as {0}")]
    EmptyTree(String),
    #[error("git commit-tree printed {0:?}, not a commit id")]
    NotACommit(String),

    // The patch streamed to the host.
    #[error("cannot start git {what}: {source}")]
    StartGit {
        what: &'static str,
        source: io::Error,
    },
    #[error("cannot read git {what}'s output: {source}")]
    ReadGit {
        what: &'static str,
        source: io::Error,
    },
    #[error(
        "the {what} is over the {max_bytes} bytes this request allows; it was not sent in full"
    )]
    TooLarge { what: &'static str, max_bytes: u64 },
}

impl From<RunError> for RepoError {
    fn from(err: RunError) -> Self {
        match err {
            RunError::Cancelled => RepoError::Cancelled("the step"),
            err => RepoError::Run(err),
        }
    }
}

impl From<crate::git::SpecError> for RepoError {
    fn from(err: crate::git::SpecError) -> Self {
        RepoError::Run(err.into())
    }
}

impl RepoError {
    /// The error as the request or step `what` reports it: a cancel says what was cancelled.
    pub(super) fn of(self, what: &'static str) -> Self {
        match self {
            RepoError::Cancelled(_) => RepoError::Cancelled(what),
            err => err,
        }
    }
}
