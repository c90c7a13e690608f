//! A task's checkpoints and the disk a fork of it starts from, as files of its state
//! directory: `checkpoints/<label>/` holds `checkpoint.json` and the disk as it was at one
//! instant, which is on the jail `disk.img`, a duplicate of the guest's disk (see
//! [`HostDisk::snapshot`]: a clone sharing its extents where the home's filesystem has
//! reflinks, else a copy of what the guest wrote), and on the vm the chain of read-only qcow2 layers the disk was
//! then (hard links of the `frozen-*.qcow2` files, see `dynocap_backend_vm::layers`) with
//! [`LAYER_TOP`] naming its top: the guest's writable layer was frozen, the guest going on on
//! a new one above it, so a checkpoint costs the same whatever the task wrote. A restore or a
//! fork boots over a new empty layer above it. A checkpoint or a fork's disk
//! is made under a temporary name (`checkpoints/.making-*`) and renamed into place once whole
//! and synced: one killed half-way leaves only the temporary, which the next checkpoint
//! operation of the task removes, and the task's teardown with its state directory.
//!
//! A fork's new state directory gets the disk (the jail's copy, or the vm's `vm/` with the
//! chain's links and a new layer over them), the host's pristine copy of what was imported
//! (`baseline.tar`, its index and `baseline.untracked`, hard links: never written again) and
//! [`LAYER_IDS`], the host id range its files were written under, so that its guest boots over
//! the disk as a recovery does, the files shown as the fork's own ids through an idmapped
//! mount (a fork costs the same whatever the task wrote: nothing is chowned). The agent's
//! baseline repository is on the disk itself, so the fork's diff and verified patch are
//! against the original imported state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dynocap_backend_vm::layers;
use serde::{Deserialize, Serialize};

use crate::backend::{HostDisk, LayeredDisk};
use crate::foundation::error::{Context, Error, Result};
use crate::foundation::failpoint;
use crate::supervisor::workspace::BASELINE_HOST_FILES;

/// The directory of a task's checkpoints, inside its state directory.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// In a fork's state directory: the host id range its disk's files were written under (its
/// first source's, the one that was no fork), for the life of the disk: every boot shows them
/// to the guest as its own through an idmapped mount, and nothing on the disk changes owner.
pub const LAYER_IDS: &str = "layer-ids";
/// In a state directory: its next boot is over the disk it holds (a fork's first, or a
/// task's after a restore), not a fresh one with the project imported.
const RESUME: &str = "resume";
/// The disk image, in a checkpoint and in a state directory.
const DISK: &str = "disk.img";
/// Where the jail mounts the disk, in a state directory.
const DISK_MOUNT: &str = "disk";
const META: &str = "checkpoint.json";
/// In a vm task's checkpoint: the file name of the top of its chain of layers.
pub const LAYER_TOP: &str = "layer";
const MAKING: &str = ".making-";
/// At most this many checkpoints per task: each holds what the guest had written.
pub const MAX_CHECKPOINTS: usize = 32;
/// Room a checkpoint leaves free on the home's filesystem beyond its own bytes.
const HEADROOM_BYTES: u64 = 64 << 20;

/// How a task's disk is checkpointed, restored and forked.
#[derive(Clone)]
pub enum Disk {
    /// Copied while its filesystem is frozen (the jail's).
    Copy(Arc<dyn HostDisk>),
    /// Its writable layer frozen and shared (the vm's).
    Layers(Arc<dyn LayeredDisk>),
}

/// One checkpoint, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointInfo {
    pub label: String,
    /// RFC 3339.
    pub created_at: String,
    /// What the checkpoint holds on the host's disk.
    pub bytes: u64,
}

/// What a restore ended, as its caller is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restored {
    pub label: String,
    /// The jobs that were running, and were ended.
    pub jobs_ended: Vec<crate::model::sandbox_info::RunningJob>,
    /// Commands (execs) that were running, and were ended.
    pub commands_ended: usize,
}

/// Refuses a label that is not 1 to 63 of `[A-Za-z0-9._-]` starting with a letter or digit.
pub fn validate_label(label: &str) -> Result<()> {
    let ok = !label.is_empty()
        && label.len() <= 63
        && label.as_bytes()[0].is_ascii_alphanumeric()
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "checkpoint label {label:?} is not 1 to 63 letters, digits, '.', '_' or '-' starting \
             with a letter or digit"
        )))
    }
}

fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join(CHECKPOINTS_DIR)
}

/// The task's checkpoints, oldest first.
pub fn list(state_dir: &Path) -> Result<Vec<CheckpointInfo>> {
    let entries = match std::fs::read_dir(dir(state_dir)) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err).context("listing the task's checkpoints"),
    };
    let mut all = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(MAKING) {
            continue;
        }
        let Ok(text) = std::fs::read(entry.path().join(META)) else {
            continue;
        };
        if let Ok(mut info) = serde_json::from_slice::<CheckpointInfo>(&text) {
            // The bytes of its own copy, or of the layer it froze (the layers below it are
            // earlier checkpoints', or the task's before its first).
            info.bytes = checkpoint_disk(&entry.path())
                .and_then(|disk| dynocap_backend_jail::allocated_bytes(&disk).ok())
                .unwrap_or(0);
            all.push(info);
        }
    }
    all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.label.cmp(&b.label)));
    Ok(all)
}

/// The first free label `cp-N`.
pub fn next_label(state_dir: &Path) -> String {
    (1..)
        .map(|n| format!("cp-{n}"))
        .find(|label| !dir(state_dir).join(label).exists())
        .unwrap_or_else(|| "cp".to_owned())
}

/// The disk a checkpoint's directory holds: its copy, or the top of its chain of layers.
fn checkpoint_disk(checkpoint: &Path) -> Option<PathBuf> {
    let copy = checkpoint.join(DISK);
    if copy.is_file() {
        return Some(copy);
    }
    let top = std::fs::read_to_string(checkpoint.join(LAYER_TOP)).ok()?;
    let top = top.trim();
    let layer = checkpoint.join(top);
    (layers::is_frozen_name(top) && layer.is_file()).then_some(layer)
}

/// The disk of checkpoint `label` (see [`checkpoint_disk`]), or `not_found` naming the task's
/// checkpoints.
pub fn disk_of(state_dir: &Path, label: &str) -> Result<PathBuf> {
    validate_label(label)?;
    if let Some(disk) = checkpoint_disk(&dir(state_dir).join(label)) {
        return Ok(disk);
    }
    let known: Vec<String> = list(state_dir)?.into_iter().map(|c| c.label).collect();
    Err(Error::not_found(format!(
        "this task has no checkpoint {label:?}; its checkpoints: {}",
        if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        }
    )))
}

/// Removes what checkpoints or fork copies killed half-way left.
fn sweep(state_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir(state_dir)) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(MAKING) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// What the home's filesystem must have free for a duplicate of the jail disk `image`: what
/// it holds, for a copy; nothing, for a clone (its extents are shared, and counted once in
/// the filesystem's free space).
fn duplicate_bytes(state_dir: &Path, image: &Path) -> u64 {
    if dynocap_backend_jail::reflinks(state_dir) {
        0
    } else {
        dynocap_backend_jail::allocated_bytes(image).unwrap_or(0)
    }
}

/// Refuses a copy of about `bytes` the home's filesystem cannot hold beside its headroom.
fn check_room(state_dir: &Path, bytes: u64) -> Result<()> {
    let free = crate::host::disk_room::free_mb(state_dir)?.saturating_mul(1 << 20);
    if free >= bytes.saturating_add(HEADROOM_BYTES) {
        return Ok(());
    }
    Err(Error::new(
        crate::foundation::error::ErrorCode::PolicyDenied,
        format!(
            "the copy needs about {} MB on the filesystem holding {}, which has {} MB free; free \
         space there (delete checkpoints, rm --purge finished tasks)",
            bytes >> 20,
            state_dir.display(),
            free >> 20
        ),
    ))
}

/// The vm's layer directory in a state directory.
fn vm_dir(state_dir: &Path) -> PathBuf {
    dynocap_backend_vm::VmPaths::at(state_dir).dir
}

/// Freezes the vm's writable layer and links the chain it tops into `dest`: the disk as it is
/// now, in a directory of its own. Returns the top's name and its bytes.
fn freeze_into(state_dir: &Path, disk: &dyn LayeredDisk, dest: &Path) -> Result<(String, u64)> {
    let (top, bytes) = disk.freeze()?;
    layers::link_chain(&vm_dir(state_dir), &top, dest)
        .context("linking the disk's layers for the copy")?;
    Ok((top, bytes))
}

/// Makes checkpoint `label` of the disk. Blocking: call from a blocking thread.
pub fn create(state_dir: &Path, label: &str, disk: &Disk) -> Result<CheckpointInfo> {
    validate_label(label)?;
    sweep(state_dir);
    let existing = list(state_dir)?;
    if existing.iter().any(|c| c.label == label) {
        return Err(Error::conflict(format!(
            "this task has a checkpoint {label:?} already; delete it first or choose another label"
        )));
    }
    if existing.len() >= MAX_CHECKPOINTS {
        return Err(Error::new(
            crate::foundation::error::ErrorCode::PolicyDenied,
            format!(
            "this task has {MAX_CHECKPOINTS} checkpoints, the most it may have; delete one first"
        ),
        ));
    }
    if let Disk::Copy(_) = disk {
        check_room(state_dir, duplicate_bytes(state_dir, &state_dir.join(DISK)))?;
    }
    if let Disk::Layers(disk) = disk {
        crate::host::disk_room::check_more(
            state_dir,
            disk.freeze_cost(),
            "this checkpoint (the task's disk layer kept as it is, and a new one set aside for \
             the task's disk)",
        )?;
    }
    let making = dir(state_dir).join(format!("{MAKING}{label}"));
    std::fs::create_dir_all(&making).with_context(|| format!("creating {}", making.display()))?;
    let made = (|| {
        let started = std::time::Instant::now();
        let bytes = match disk {
            Disk::Copy(disk) => disk.snapshot(&making.join(DISK), &mut || {
                // The copy is done and the disk still frozen: how long its writers waited.
                tracing::info!(
                    "checkpoint {label}: the guest's writes were held for {} ms",
                    started.elapsed().as_millis()
                );
                failpoint::hit("supervisor.checkpoint.copied")
            })?,
            Disk::Layers(disk) => {
                let (top, bytes) = freeze_into(state_dir, disk.as_ref(), &making)?;
                tracing::info!(
                    "checkpoint {label}: the disk's layer {top} frozen in {} ms",
                    started.elapsed().as_millis()
                );
                failpoint::hit("supervisor.checkpoint.copied")?;
                dynocap_host::durable::replace(&making.join(LAYER_TOP), top.as_bytes())
                    .context("writing the checkpoint's layer")?;
                bytes
            }
        };
        let info = CheckpointInfo {
            label: label.to_owned(),
            created_at: crate::model::sandbox_info::rfc3339(chrono::Utc::now()),
            bytes,
        };
        let json = serde_json::to_vec_pretty(&info).context("encoding the checkpoint")?;
        dynocap_host::durable::replace(&making.join(META), &json)
            .context("writing the checkpoint's record")?;
        std::fs::rename(&making, dir(state_dir).join(label))
            .context("putting the checkpoint in place")?;
        sync_dir(&dir(state_dir));
        Ok(info)
    })();
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&making);
    }
    made
}

/// Deletes checkpoint `label`.
pub fn delete(state_dir: &Path, label: &str) -> Result<()> {
    let disk = disk_of(state_dir, label)?;
    let Some(checkpoint) = disk.parent() else {
        return Err(Error::internal("a checkpoint's disk has no directory"));
    };
    // Renamed aside first: a delete cut short leaves a temporary the next sweep removes,
    // never a checkpoint without its disk.
    let aside = dir(state_dir).join(format!("{MAKING}deleted-{label}"));
    std::fs::rename(checkpoint, &aside).context("deleting the checkpoint")?;
    std::fs::remove_dir_all(&aside).context("deleting the checkpoint")
}

/// Puts a new empty layer over checkpoint `label`'s chain in the vm's disk's place (its chain
/// linked beside it first): what a restore boots over. Blocking.
pub fn restore_layers(state_dir: &Path, label: &str) -> Result<()> {
    let top = disk_of(state_dir, label)?;
    let (Some(from), Some(name)) = (top.parent(), top.file_name()) else {
        return Err(Error::internal("a checkpoint's layer has no directory"));
    };
    let name = name.to_string_lossy();
    let vm = vm_dir(state_dir);
    layers::link_chain(from, &name, &vm).context("linking the checkpoint's layers")?;
    layers::replace_disk_over(&vm, &name).context("putting the checkpoint in the disk's place")
}

/// Copies checkpoint `label`'s disk to `dest` (a new file): what a restore boots over.
pub fn copy_disk(state_dir: &Path, label: &str, dest: &Path) -> Result<u64> {
    let disk = disk_of(state_dir, label)?;
    check_room(state_dir, duplicate_bytes(state_dir, &disk))?;
    dynocap_backend_jail::copy_sparse(&disk, dest)
        .with_context(|| format!("copying the checkpoint to {}", dest.display()))
}

/// Where a fork's state directory is made before it is renamed into place.
fn fork_making(state_dir: &Path, fork_id: &str) -> PathBuf {
    dir(state_dir).join(format!("{MAKING}fork-{fork_id}"))
}

/// Makes the state directory `fork_dir` of a fork of this task (whose state directory is
/// `state_dir` and host id range `id_range`): its disk from checkpoint `from`, or from the
/// live `disk` at this instant, the baseline copy and [`LAYER_IDS`]. Blocking.
pub fn seed_fork(
    state_dir: &Path,
    fork_id: &str,
    fork_dir: &Path,
    from: Option<&str>,
    disk: &Disk,
    id_range: u32,
) -> Result<()> {
    sweep(state_dir);
    if fork_dir.exists() {
        return Err(Error::conflict(format!(
            "the fork's state directory {} exists already",
            fork_dir.display()
        )));
    }
    let making = fork_making(state_dir, fork_id);
    std::fs::create_dir_all(&making).with_context(|| format!("creating {}", making.display()))?;
    let made = (|| {
        match (from, disk) {
            // A clone sets nothing aside: its guest's writes take room as they come, and fail
            // in the guest once the filesystem is full (as a vm fork's). A copy needs room for
            // what it copies, and its fork reserves its whole disk when it boots.
            (Some(label), Disk::Copy(_)) => {
                copy_disk(state_dir, label, &making.join(DISK))?;
            }
            (None, Disk::Copy(disk)) => {
                let image = state_dir.join(DISK);
                check_room(state_dir, duplicate_bytes(state_dir, &image))?;
                disk.snapshot(&making.join(DISK), &mut || Ok(()))?;
            }
            (from, Disk::Layers(disk)) => {
                // The fork's own layer sets nothing aside (see `layers`' `UNRESERVED`): only
                // the source's freeze counts, and the frozen chain counts nothing again.
                let (cost, what) = match from {
                    Some(_) => (0, "this fork"),
                    None => (
                        disk.freeze_cost(),
                        "this fork (the task's disk layer kept as it is, and a new one set \
                         aside for the task's disk)",
                    ),
                };
                crate::host::disk_room::check_more(state_dir, cost, what)?;
                let vm = vm_dir(&making);
                std::fs::create_dir_all(&vm).context("creating the fork's vm directory")?;
                layers::mark_unreserved(&vm).context("marking the fork's disk layers")?;
                let top = match from {
                    Some(label) => {
                        let top = disk_of(state_dir, label)?;
                        let (Some(dir), Some(name)) = (top.parent(), top.file_name()) else {
                            return Err(Error::internal("a checkpoint's layer has no directory"));
                        };
                        let name = name.to_string_lossy().into_owned();
                        layers::link_chain(dir, &name, &vm)
                            .context("linking the checkpoint's layers for the fork")?;
                        name
                    }
                    None => freeze_into(state_dir, disk.as_ref(), &vm)?.0,
                };
                layers::new_layer_over(&vm, &top, &dynocap_backend_vm::VmPaths::at(&making).disk)
                    .context("making the fork's disk layer")?;
            }
        }
        failpoint::hit("supervisor.fork.copied")?;
        if let Disk::Copy(_) = disk {
            // Cloned where the filesystem shares extents (the duplicate falls back to a copy
            // only where it cannot): the fork reserves nothing of its own when it boots.
            if dynocap_backend_jail::reflinks(state_dir) {
                dynocap_backend_jail::mark_clone(&making)
                    .context("marking the fork's disk a clone")?;
            }
            // The disk's mount point, as a stopped guest's kept state directory has it.
            std::fs::create_dir(making.join(DISK_MOUNT))
                .context("creating the fork's disk mount point")?;
        }
        for name in BASELINE_HOST_FILES {
            let source = state_dir.join(name);
            if source.exists() {
                std::fs::hard_link(&source, making.join(name))
                    .with_context(|| format!("linking {} for the fork", source.display()))?;
            }
        }
        // The source's disk is written under its own ids, or, a fork itself, its source's.
        let written = layer_id_range(state_dir).unwrap_or(id_range);
        dynocap_host::durable::replace(&making.join(LAYER_IDS), written.to_string().as_bytes())
            .context("writing the fork's layer ids")?;
        mark_resume(&making)?;
        std::fs::rename(&making, fork_dir).context("putting the fork's files in place")?;
        if let Some(parent) = fork_dir.parent() {
            sync_dir(parent);
        }
        Ok(())
    })();
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&making);
    }
    made
}

/// The host id range a fork's disk was written under ([`LAYER_IDS`]), if its state directory
/// has one.
pub fn layer_id_range(state_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(state_dir.join(LAYER_IDS))
        .ok()
        .and_then(|text| text.trim().parse().ok())
}

/// Whether the next boot of the sandbox whose state directory this is boots over its disk
/// (see [`RESUME`]).
pub fn resuming(state_dir: &Path) -> bool {
    state_dir.join(RESUME).exists()
}

/// Marks `state_dir` for [`resuming`].
pub fn mark_resume(state_dir: &Path) -> Result<()> {
    dynocap_host::durable::replace(&state_dir.join(RESUME), b"")
        .context("marking the task to boot over its disk")
}

/// After a boot over the disk came up: a later boot is a recovery's. [`LAYER_IDS`] stays with
/// the disk.
pub fn resumed(state_dir: &Path) {
    let _ = std::fs::remove_file(state_dir.join(RESUME));
}

fn sync_dir(dir: &Path) {
    if let Ok(handle) = std::fs::File::open(dir) {
        let _ = handle.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_short_plain_names() {
        for good in ["a", "cp-1", "before.refactor", "A_9"] {
            assert!(validate_label(good).is_ok(), "{good}");
        }
        for bad in ["", "-x", ".x", "a/b", "..", "a b", &"x".repeat(64)] {
            assert!(validate_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn listing_skips_what_is_being_made() {
        let state = tempfile::tempdir().expect("tempdir");
        assert!(list(state.path()).expect("empty").is_empty());
        assert_eq!(next_label(state.path()), "cp-1");
        let made = dir(state.path()).join("cp-1");
        std::fs::create_dir_all(&made).expect("dir");
        std::fs::write(made.join(DISK), b"disk").expect("disk");
        let info = CheckpointInfo {
            label: "cp-1".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            bytes: 4,
        };
        std::fs::write(made.join(META), serde_json::to_vec(&info).expect("json")).expect("meta");
        std::fs::create_dir_all(dir(state.path()).join(".making-cp-2")).expect("making");
        let listed = list(state.path()).expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].label, "cp-1");
        assert_eq!(next_label(state.path()), "cp-2");
        sweep(state.path());
        assert!(!dir(state.path()).join(".making-cp-2").exists());
        delete(state.path(), "cp-1").expect("delete");
        assert!(list(state.path()).expect("list").is_empty());
        assert_eq!(
            disk_of(state.path(), "cp-1").expect_err("gone").code,
            crate::foundation::error::ErrorCode::NotFound
        );
    }
}
