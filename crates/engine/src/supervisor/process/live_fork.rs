//! A live fork as the parent task's supervisor serves it (`SeedLiveFork`): the fork's state
//! directory made from the running guest, saved with its processes (the vm backend's
//! [`crate::backend::Guest::save_live`]: memory and devices, and the disk as it is in the same
//! pause), beside the baseline's links and the mark that its first boot resumes what it was
//! given. The channel to the agent is held still around the save (see the supervisor's
//! `live_fork`); only the main loop, which owns the guest, saves it.
//!
//! What the fork gets: the guest as it ran, every process of it running on (a dev server, a
//! build daemon), its files, and its workspace's baseline, so its diff and verified patch are
//! against the state the parent imported. Not the parent's job records: those, and the
//! output of the parent's commands, stay the parent's; in the fork those processes run on
//! unlisted, and `ps`/`kill` in the fork reach them.
//!
//! The directory is made under `checkpoints/.making-live-<fork id>` in the parent's state
//! directory and renamed into place once whole: a supervisor killed half-way leaves only that,
//! which the parent's next checkpoint operation or its teardown removes.

use std::path::{Path, PathBuf};

use tokio::sync::{mpsc, oneshot};

use crate::backend::LiveSaved;
use crate::foundation::error::{Context, Error, Result};
use crate::supervisor::checkpoint::{self, CHECKPOINTS_DIR};
use crate::supervisor::control::ControlReply;
use crate::supervisor::workspace::BASELINE_HOST_FILES;

use super::state::*;

/// What a connection handler asks the main loop: save the guest for the fork whose state
/// directory is being made at this path, and answer here.
pub(super) type LiveSave = (PathBuf, oneshot::Sender<Result<LiveSaved>>);

/// The main loop's queue of [`LiveSave`]s.
pub(super) fn queue() -> (mpsc::Sender<LiveSave>, mpsc::Receiver<LiveSave>) {
    mpsc::channel(1)
}

/// `SeedLiveFork`.
pub(super) async fn seed(shared: &Shared, main_loop: &MainLoop, fork_id: String) -> ControlReply {
    let started = std::time::Instant::now();
    let seeded = make(shared, main_loop, &fork_id).await;
    if let Ok(saved) = &seeded {
        tracing::info!(target: LOG_TARGET,
            "live fork {fork_id} seeded in {} ms: the guest paused {} ms, {} MiB of memory and \
             devices saved, its disk frozen ({} KiB)",
            started.elapsed().as_millis(),
            saved.paused.as_millis(),
            saved.state_bytes >> 20,
            saved.disk_bytes >> 10
        );
    }
    ControlReply::from_result(seeded, |_| ControlReply::Forked)
}

async fn make(shared: &Shared, main_loop: &MainLoop, fork_id: &str) -> Result<LiveSaved> {
    if shared.task.is_none() {
        return Err(Error::conflict(
            "forks are for tasks; this is a raw sandbox",
        ));
    }
    let fork_dir = shared.home.sandbox_dir(fork_id);
    if !plain_name(fork_id) {
        return Err(Error::invalid(format!("{fork_id:?} is not a sandbox id")));
    }
    if fork_dir.exists() {
        return Err(Error::conflict(format!(
            "the fork's state directory {} exists already",
            fork_dir.display()
        )));
    }
    let state_dir = shared.home.sandbox_dir(&shared.id);
    let making = state_dir
        .join(CHECKPOINTS_DIR)
        .join(format!(".making-live-{fork_id}"));
    let _ = std::fs::remove_dir_all(&making);
    std::fs::create_dir_all(&making).with_context(|| format!("creating {}", making.display()))?;
    let made = async {
        let saved = save(shared, main_loop, &making).await?;
        for name in BASELINE_HOST_FILES {
            let source = state_dir.join(name);
            if source.exists() {
                std::fs::hard_link(&source, making.join(name))
                    .with_context(|| format!("linking {} for the fork", source.display()))?;
            }
        }
        checkpoint::mark_resume(&making)?;
        std::fs::rename(&making, &fork_dir).context("putting the fork's files in place")?;
        if let Some(parent) = fork_dir.parent() {
            if let Ok(dir) = std::fs::File::open(parent) {
                let _ = dir.sync_all();
            }
        }
        Ok(saved)
    }
    .await;
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&making);
    }
    made
}

/// The guest saved into `dir` by the main loop, with the channel held still around it.
async fn save(shared: &Shared, main_loop: &MainLoop, dir: &Path) -> Result<LiveSaved> {
    shared.conn.pause_for_save().await?;
    let (answer, answered) = oneshot::channel();
    let saved = match main_loop.live.send((dir.to_owned(), answer)).await {
        Ok(()) => answered
            .await
            .unwrap_or_else(|_| Err(Error::internal("the supervisor ended during the save"))),
        Err(_) => Err(Error::internal("the supervisor is ending; no save")),
    };
    // Whatever became of the save, the parent's session goes on.
    let resumed = shared.conn.resume_after_save().await;
    let saved = saved?;
    resumed?;
    Ok(saved)
}

/// A sandbox id as the catalog makes them: one plain name of the home's sandboxes directory.
fn plain_name(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}
