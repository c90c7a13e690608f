//! What the `Baseline` and `Diff` requests share: the check of the workspace path, the
//! repository lock taken unless a stop comes first, and blocking work on the blocking pool.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use tokio::sync::{mpsc, Mutex};

use super::error::RepoError;
use crate::command::stop_requested;
use crate::fsutil;
use crate::process_group::Stop;

/// Checks a workspace path and opens it without following symlinks.
pub(super) fn open_workspace(workspace: &str) -> Result<(PathBuf, OwnedFd), RepoError> {
    let path = PathBuf::from(workspace);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(RepoError::BadWorkspace(workspace.to_owned()));
    }
    // `/workspace/` and `/workspace/.` are `/workspace`: the baseline records one spelling.
    let path: PathBuf = path.components().collect();
    let fd = fsutil::open_dir_nofollow(&path).map_err(|source| RepoError::OpenWorkspace {
        workspace: workspace.to_owned(),
        source,
    })?;
    Ok((path, fd))
}

/// Takes the repository lock, unless a stop comes first.
pub(super) async fn lock<'a, T>(
    lock: &'a Mutex<T>,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<tokio::sync::MutexGuard<'a, T>, RepoError> {
    tokio::select! {
        biased;
        () = stop_requested(stop) => Err(RepoError::Cancelled("the step")),
        guard = lock.lock() => Ok(guard),
    }
}

/// Runs a blocking closure on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RepoError> + Send + 'static,
) -> Result<T, RepoError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(RepoError::Worker)?
}

pub(super) fn arg_with(prefix: &str, path: &Path) -> OsString {
    let mut arg = OsString::from(prefix);
    arg.push(path.as_os_str());
    arg
}
