//! What the `Baseline` and `Diff` requests share: the check of the workspace path, the
//! repository lock taken unless a stop comes first, blocking work on the blocking pool, and
//! the words of a cancelled step.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use tokio::sync::{mpsc, Mutex};

use crate::command::{stop_requested, RunError};
use crate::fsutil;
use crate::process_group::Stop;

/// Checks a workspace path and opens it without following symlinks.
pub(super) fn open_workspace(workspace: &str) -> Result<(PathBuf, OwnedFd), String> {
    let path = PathBuf::from(workspace);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "workspace {workspace:?} must be an absolute path without '..'"
        ));
    }
    // `/workspace/` and `/workspace/.` are `/workspace`: the baseline records one spelling.
    let path: PathBuf = path.components().collect();
    let fd = fsutil::open_dir_nofollow(&path)
        .map_err(|err| format!("cannot open the workspace {workspace}: {err}"))?;
    Ok((path, fd))
}

pub(super) fn cancelled_or(err: RunError, what: &str) -> String {
    match err {
        RunError::Cancelled => format!("{what} was cancelled"),
        RunError::Failed(message) => message,
    }
}

/// Takes the repository lock, unless a stop comes first.
pub(super) async fn lock<'a, T>(
    lock: &'a Mutex<T>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<tokio::sync::MutexGuard<'a, T>, RunError> {
    tokio::select! {
        biased;
        () = stop_requested(stop) => Err(RunError::Cancelled),
        guard = lock.lock() => Ok(guard),
    }
}

/// Runs a blocking closure on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|err| format!("internal error: {err}"))?
}

pub(super) fn arg_with(prefix: &str, path: &Path) -> OsString {
    let mut arg = OsString::from(prefix);
    arg.push(path.as_os_str());
    arg
}
