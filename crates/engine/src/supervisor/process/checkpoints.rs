//! A task's checkpoints as its supervisor serves them: making, listing and deleting them,
//! seeding a fork's state directory, and a restore, which stops the guest keeping its layer,
//! puts the checkpoint in the disk's place (the jail's copy of it, or on the vm a new empty
//! layer over its chain) and executes the supervisor anew to boot over it (a boot must start
//! from a process with one thread: see the jail's `Jail::spawn`). On the vm the guest's kernel
//! holds what it has not written to its disk yet: the agent syncs it before every freeze.
//! The same process, so the record's supervisor stays alive throughout and nobody takes the
//! task over meanwhile.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use tokio::net::unix::OwnedWriteHalf;

use crate::backend::{Guest, LayerSync};
use crate::foundation::error::{Context, Error, Result};
use crate::host::home::Home;
use crate::store::catalog::{Catalog, State};
use crate::supervisor::checkpoint::{self, Disk, Restored};
use crate::supervisor::control::{write_message, ControlReply};

use super::state::*;

/// The descriptor a supervisor reads its ready pipe from (the facade's `SUPERVISOR_READY_FD`,
/// which this layer cannot name).
const READY_FD: i32 = 3;

/// How the task's disk is checkpointed: its layers frozen (the vm's), or the host's mount of
/// it copied (the jail's).
fn disk(shared: &Shared) -> Result<Disk> {
    if let Some(layers) = &shared.layered_disk {
        return Ok(Disk::Layers(Arc::clone(layers)));
    }
    match &shared.layer_sync {
        LayerSync::HostMount(disk) => Ok(Disk::Copy(Arc::clone(disk))),
        LayerSync::GuestKernel => Err(Error::invalid(
            "this task's disk can be neither copied nor frozen, so it has no checkpoints or \
             forks",
        )),
    }
}

/// The disk to checkpoint or fork, with what the guest's kernel holds written to it first
/// (a vm's: see the module doc).
async fn synced_disk(shared: &Shared) -> Result<Disk> {
    let disk = disk(shared)?;
    if let Disk::Layers(_) = disk {
        super::disk::sync_guest_kernel(&shared.conn).await?;
    }
    Ok(disk)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| Error::internal(format!("a checkpoint's thread failed: {err}")))?
}

/// `Checkpoint`: makes one, labelled `label` or the next free `cp-N`.
pub(super) async fn create(shared: &Shared, label: Option<String>) -> ControlReply {
    let made = async {
        let disk = synced_disk(shared).await?;
        let state_dir = shared.home.sandbox_dir(&shared.id);
        let started = std::time::Instant::now();
        let info = blocking(move || {
            let label = label.unwrap_or_else(|| checkpoint::next_label(&state_dir));
            checkpoint::create(&state_dir, &label, &disk)
        })
        .await?;
        tracing::info!(target: LOG_TARGET,
            "checkpoint {} made in {} ms ({} bytes)",
            info.label,
            started.elapsed().as_millis(),
            info.bytes
        );
        Ok(info)
    };
    ControlReply::from_result(made.await, ControlReply::Checkpoint)
}

/// `Checkpoints`.
pub(super) async fn list(shared: &Shared) -> ControlReply {
    let state_dir = shared.home.sandbox_dir(&shared.id);
    ControlReply::from_result(
        blocking(move || checkpoint::list(&state_dir)).await,
        ControlReply::Checkpoints,
    )
}

/// `DeleteCheckpoint`.
pub(super) async fn delete(shared: &Shared, label: String) -> ControlReply {
    let state_dir = shared.home.sandbox_dir(&shared.id);
    ControlReply::from_result(
        blocking(move || {
            checkpoint::delete(&state_dir, &label)?;
            checkpoint::list(&state_dir)
        })
        .await,
        ControlReply::Checkpoints,
    )
}

/// A fork's id as the catalog makes them: what may name a directory of the home.
fn check_fork_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("{id:?} is not a sandbox id")))
    }
}

/// `SeedFork`.
pub(super) async fn seed_fork(
    shared: &Shared,
    fork_id: String,
    from: Option<String>,
) -> ControlReply {
    let seeded = async {
        check_fork_id(&fork_id)?;
        let disk = match &from {
            // A checkpoint is on the host's disk already.
            Some(_) => disk(shared)?,
            None => synced_disk(shared).await?,
        };
        let home = shared.home.clone();
        let id = shared.id.clone();
        let started = std::time::Instant::now();
        blocking(move || {
            let id_range = crate::host::idpool::reserve(&home, &id)?;
            checkpoint::seed_fork(
                &home.sandbox_dir(&id),
                &fork_id,
                &home.sandbox_dir(&fork_id),
                from.as_deref(),
                &disk,
                id_range,
            )
        })
        .await?;
        tracing::info!(target: LOG_TARGET,
            "a fork's disk made in {} ms",
            started.elapsed().as_millis()
        );
        Ok(())
    };
    ControlReply::from_result(seeded.await, |()| ControlReply::Forked)
}

/// Checks that a restore to `label` can begin: the task has that checkpoint.
pub(super) fn check_restore(shared: &Shared, label: &str) -> Result<()> {
    disk(shared)?;
    checkpoint::disk_of(&shared.home.sandbox_dir(&shared.id), label).map(drop)
}

/// Ends the guest for a restore to `label`, puts the checkpoint's copy in its disk's place,
/// answers `waiters` and executes the supervisor anew, which boots over it. Returns only if
/// that execution failed, with the exit code; the task is `unsaved` then, its files kept.
#[allow(clippy::too_many_arguments)]
pub(super) async fn restore(
    home: &Home,
    catalog: &Catalog,
    id: &str,
    guest: Box<dyn Guest>,
    shared: &Shared,
    waiters: Vec<OwnedWriteHalf>,
    clients: &mut tokio::task::JoinSet<()>,
    label: &str,
) -> i32 {
    let _ = shared.ending.set(format!(
        "the task was restored to its checkpoint {label:?} while the command ran; the command \
         was stopped"
    ));
    let jobs_ended = shared.jobs.running();
    let cut_off = jobs_ended.clone();
    // Every job runs as a command served here: the rest are the callers' commands.
    let commands_ended = shared
        .execs
        .load(std::sync::atomic::Ordering::SeqCst)
        .saturating_sub(jobs_ended.len());
    tracing::info!(target: LOG_TARGET,
        "restoring checkpoint {label}: ending {} job(s) and {commands_ended} command(s)",
        jobs_ended.len()
    );
    match tokio::task::spawn_blocking(move || guest.stop_keeping_layer()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::error!(target: LOG_TARGET, "stopping the guest: {err}"),
        Err(err) => tracing::error!(target: LOG_TARGET, "stopping the guest panicked: {err}"),
    }
    let state_dir = home.sandbox_dir(id);
    let layered = shared.layered_disk.is_some();
    let swapped = {
        let (state_dir, label) = (state_dir.clone(), label.to_owned());
        blocking(move || {
            if layered {
                checkpoint::restore_layers(&state_dir, &label)
            } else {
                swap_in(&state_dir, &label)
            }
        })
        .await
    };
    let reply = match &swapped {
        Ok(()) => ControlReply::Restored(Restored {
            label: label.to_owned(),
            jobs_ended,
            commands_ended,
        }),
        Err(err) => {
            tracing::error!(target: LOG_TARGET, "restoring checkpoint {label}: {err}");
            ControlReply::Error(err.clone())
        }
    };
    // Over the restored disk, or the task's own if the copy failed: either way it boots again.
    let marked = checkpoint::mark_resume(&state_dir);
    for mut waiter in waiters {
        let _ = write_message(&mut waiter, &reply).await;
    }
    let _ = tokio::time::timeout(DRAIN_CLIENTS, async {
        while clients.join_next().await.is_some() {}
    })
    .await;
    // The guest is stopped and its commands answered: what the jobs kept is all there. (A
    // small file written while nothing else is served: the process executes itself next.)
    shared.jobs.hand_over(&cut_off, label);
    let err = match marked {
        Ok(()) => exec_again(home, id),
        Err(err) => err,
    };
    let note = format!(
        "the task could not boot again after its restore: {}; its files are kept: finish the \
         task to recover them",
        err.message
    );
    tracing::error!(target: LOG_TARGET, "{note}");
    let _ = catalog.transition(id, State::Running, State::Unsaved, Some(&note));
    1
}

/// Copies checkpoint `label` beside the disk and renames it over it: the disk is whole
/// either way.
fn swap_in(state_dir: &std::path::Path, label: &str) -> Result<()> {
    let disk = dynocap_backend_jail::disk_image(state_dir);
    let incoming = state_dir.join("disk.img.restoring");
    let _ = std::fs::remove_file(&incoming);
    checkpoint::copy_disk(state_dir, label, &incoming)?;
    std::fs::rename(&incoming, &disk).context("putting the checkpoint in the disk's place")
}

/// Executes this supervisor anew for sandbox `id`: the same process, a fresh program. Its
/// ready pipe is `/dev/null` (nobody waits on it: the restore's caller watches the socket).
/// Returns only on failure.
fn exec_again(home: &Home, id: &str) -> Error {
    use std::os::unix::process::CommandExt;
    // The program this process runs, by the kernel's own link to it: the path it was started
    // from may name another build by now (an upgrade renames a new binary over it, and the
    // old one's path then reads "... (deleted)"), and this supervisor's state is its own
    // build's. argv[0] stays the path people and `ps` know it by.
    let shown_as = std::env::current_exe()
        .map(|exe| exe.into_os_string())
        .unwrap_or_else(|_| "dynocap-core".into());
    let null = match std::fs::File::open("/dev/null") {
        Ok(null) => null,
        Err(err) => return Error::internal(format!("opening /dev/null: {err}")),
    };
    let ready_fd = READY_FD;
    // SAFETY: dup2 onto the ready pipe's number, which the new program reads; whatever held it
    // is one of ours, closed on exec anyway, and nothing runs between this and the exec. Then
    // the number is kept across the exec (dup2 onto itself would keep close-on-exec).
    let prepared = unsafe {
        libc::dup2(null.as_raw_fd(), ready_fd) >= 0 && libc::fcntl(ready_fd, libc::F_SETFD, 0) == 0
    };
    if !prepared {
        return Error::internal(format!(
            "preparing the supervisor's ready descriptor: {}",
            std::io::Error::last_os_error()
        ));
    }
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(shown_as)
        .arg("supervise")
        .arg("--home")
        .arg(home.root())
        .arg("--id")
        .arg(id)
        .arg("--ready-fd")
        .arg(ready_fd.to_string())
        .exec();
    Error::internal(format!("executing the supervisor anew: {err}"))
}
