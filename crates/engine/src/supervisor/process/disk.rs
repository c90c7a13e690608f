//! The guest's disk as commands see it: flushing its writes, checking it for I/O errors, and
//! the note a failed disk leaves on every result.

use std::sync::Arc;

use crate::backend::LayerSync;
use crate::foundation::error::Result;
use crate::store::catalog::Catalog;
use crate::supervisor::agent_conn::AgentConn;
use crate::supervisor::workspace::{self};

use super::failure::*;
use super::state::*;

/// What the sandbox's disk failed with, if it did: the error state its filesystem keeps
/// (jail), else a sync of it that failed (`synced`). The first failure goes into the sandbox's
/// record note, which `ls` shows.
pub(super) async fn check_disk(shared: &Shared, synced: Result<()>) -> Option<String> {
    // The filesystem's own error state first: it names the root cause, of which a failed
    // sync is only a symptom.
    let recorded = match &shared.layer_sync {
        LayerSync::HostMount(disk) => {
            let disk = Arc::clone(disk);
            tokio::task::spawn_blocking(move || disk.failure())
                .await
                .ok()
                .flatten()
        }
        LayerSync::GuestKernel => None,
    };
    let failure = recorded.or_else(|| synced.err().map(|err| err.message))?;
    let failure = match pool_full(&shared.home.sandbox_dir(&shared.id)) {
        Some(note) => format!("{failure}; {note}"),
        None => failure,
    };
    if shared.disk_failed.set(failure.clone()).is_ok() {
        tracing::error!(target: LOG_TARGET, "{failure}");
        let note = format!(
            "{failure}; finish the task (or destroy the sandbox): its work up to the failure is kept"
        );
        if let Err(err) =
            Catalog::open(&shared.home).and_then(|c| c.set_note(&shared.id, Some(&note)))
        {
            tracing::warn!(target: LOG_TARGET, "recording the disk's failure in the record: {err}");
        }
    }
    Some(failure)
}

/// When the sandbox's state directory `dir` is on the home's reflink pool and the pool is
/// full: what the disk's failure adds, that the pool ran out of room and how to give it more.
/// A fork's clone sets nothing aside (its blocks are its source's until it writes them), so a
/// full pool fails the fork's next write, which the guest sees as its disk failing.
fn pool_full(dir: &std::path::Path) -> Option<String> {
    // XFS keeps a few blocks for its own transactions, which no file write gets.
    let full = crate::host::disk_room::free_mb(dir).is_ok_and(|free| free <= 1);
    let hint = crate::host::jail_pool::full_hint(dir).filter(|_| full)?;
    Some(format!(
        "the filesystem holding the sandbox's disk is full: free room there (finish tasks, \
         delete checkpoints, destroy sandboxes), or {hint}"
    ))
}

/// What the result of a command says when the project's package cache the guest has is
/// full, if it is: a jail's read on the host (the supervisor mounted it), a VM task's asked
/// of its agent (the cache is a disk of the guest kernel's, whose free space only that kernel
/// knows: the image's own counts on the host lag behind its journal).
pub(super) async fn cache_full(shared: &Shared) -> Option<String> {
    match &shared.layer_sync {
        LayerSync::HostMount(disk) => {
            let disk = Arc::clone(disk);
            tokio::task::spawn_blocking(move || disk.cache_full())
                .await
                .ok()
                .flatten()
        }
        // Only tasks have a project, so only they have its cache.
        LayerSync::GuestKernel if shared.task.is_some() => {
            let room = guest_cache_room(&shared.conn).await?;
            crate::host::project_cache::full_note(
                room.free_bytes,
                room.total_bytes,
                room.free_inodes,
            )
        }
        LayerSync::GuestKernel => None,
    }
}

/// The room on the guest's package cache disk, from its agent: `None` without a cache, or
/// from an agent that predates the request (it answers with an error).
async fn guest_cache_room(conn: &AgentConn) -> Option<dynocap_proto::CacheRoom> {
    let stream = conn.open(&dynocap_proto::Request::CacheRoom).await.ok()?;
    match workspace::finish_stream(stream, "reading the guest's package cache room")
        .await
        .ok()?
    {
        dynocap_proto::Response::CacheRoom { room } => room,
        _ => None,
    }
}

/// What a command's stderr gets when the sandbox's disk failed.
pub(super) fn disk_failure_note(failure: &str) -> String {
    format!("\ndynocap: {failure}.\n")
}

/// Syncs the guest's disk to the host (see [`LayerSync`]); a failure is logged: the command
/// has run, and what it wrote may still reach the host.
pub(super) async fn sync_layer(how: LayerSync, conn: &AgentConn) -> Result<()> {
    let synced = match how {
        LayerSync::HostMount(disk) => {
            match tokio::task::spawn_blocking(move || disk.sync()).await {
                Ok(synced) => synced,
                Err(err) => Err(ProcessFailure::SyncPanicked(err).into()),
            }
        }
        LayerSync::GuestKernel => sync_guest_kernel(conn).await,
    };
    if let Err(err) = &synced {
        tracing::warn!(target: LOG_TARGET, "{err}");
    }
    synced
}

/// Asks the agent whether the guest kernel's root filesystem recorded errors.
pub(super) async fn guest_disk_health(conn: &AgentConn) -> Result<()> {
    ask_guest_disk(
        conn,
        dynocap_proto::Request::DiskHealth,
        dynocap_proto::Response::DiskHealthy,
        "reading the guest's disk health",
    )
    .await
}

/// Asks the agent to write the guest kernel's cached writes to its disk.
pub(super) async fn sync_guest_kernel(conn: &AgentConn) -> Result<()> {
    ask_guest_disk(
        conn,
        dynocap_proto::Request::Sync,
        dynocap_proto::Response::Synced,
        "syncing the guest's disk",
    )
    .await
}

/// Sends the agent a request about its disk and waits for the one answer that says all is
/// well; the agent's error (the failure its filesystem recorded) is the call's.
pub(super) async fn ask_guest_disk(
    conn: &AgentConn,
    request: dynocap_proto::Request,
    healthy: dynocap_proto::Response,
    what: &str,
) -> Result<()> {
    let stream = conn.open(&request).await?;
    match workspace::finish_stream(stream, what).await? {
        answer if answer == healthy => Ok(()),
        other => Err(ProcessFailure::AgentAnswered {
            what: what.to_owned(),
            answer: Box::new(other),
        }
        .into()),
    }
}
