//! The vm backend's live forks: a running guest saved with its processes
//! ([`dynocap_backend_vm::migrate`]) into a fork's state directory, with its disk frozen in
//! the same pause ([`dynocap_backend_vm::layers`]: the parent goes on on a new layer, the
//! fork gets the frozen chain's links and a new layer of its own, which sets nothing aside
//! on the host, as a fork's from a checkpoint does), and the fork's QEMU resuming it instead
//! of booting.
//!
//! A guest with the project's package cache disk (one guest's at a time, and the parent's
//! goes on changing) gives the fork a sparse copy of it taken in the same pause, the fork's
//! own from then on: what the fork downloads stays with it. Refused, in the facade, where the
//! resumed guest could not be right: a fork whose network would add or remove the guest's NIC
//! (the saved devices are the parent's). A `nat` fork's guest keeps its address, gateway and resolver
//! (slirp's, the same in every QEMU) and reaches out through its own QEMU's slirp and pasta;
//! connections the parent had open do not survive into it.

use std::path::Path;
use std::time::Duration;

use dynocap_backend_vm::qemu::CacheDisk;
use dynocap_backend_vm::{layers, migrate, Vm, VmError, VmPaths, VmSpec};

use super::LiveSaved;
use crate::foundation::error::{Context, Error, Result};

/// How long the save of a guest's memory may take (a few GiB at disk speed).
const SAVE_TIMEOUT: Duration = Duration::from_secs(300);

/// Saves the running guest `vm` for the fork whose state directory is `fork_dir` (see the
/// module doc), once the filesystem holding `home_dir` is seen to have room for `needed`
/// bytes and the package cache disk's copy. The copy sets its whole size aside, as the cache
/// it copies did. Blocking.
pub(super) fn save(
    vm: &mut Vm,
    fork_dir: &Path,
    home_dir: &Path,
    needed: u64,
) -> Result<LiveSaved> {
    let cache = migrate::cache_image(vm)
        .map_err(|err| Error::internal(format!("asking QEMU for the cache disk: {err}")))?;
    let cache_bytes = match &cache {
        Some(image) => std::fs::metadata(image)
            .map_err(|err| Error::internal(format!("reading {}: {err}", image.display())))?
            .len(),
        None => 0,
    };
    crate::host::disk_room::check_more(
        home_dir,
        needed.saturating_add(cache_bytes),
        "this live fork (the task's disk layer kept as it is, a new one set aside for the \
         task's disk, the guest's memory saved and its package cache disk copied)",
    )?;
    let fork = VmPaths::at(fork_dir);
    std::fs::create_dir_all(&fork.dir)
        .map_err(|err| Error::internal(format!("creating {}: {err}", fork.dir.display())))?;
    // The fork's layers set nothing aside, as any fork's (see `layers`' module doc).
    layers::mark_unreserved(&fork.dir).context("marking the live fork's disk layers")?;
    let mut dropped = None;
    let saved = migrate::save(
        vm,
        &migrate::state_file(fork_dir),
        &mut |vm: &mut Vm| {
            let frozen = vm.snapshot_layer()?;
            dropped = frozen.dropped_while_paused;
            let from = vm.paths().dir.clone();
            layers::link_chain(&from, &frozen.name, &fork.dir)?;
            layers::new_layer_over(&fork.dir, &frozen.name, &fork.disk)?;
            let mut bytes = frozen.bytes;
            if let Some(image) = &cache {
                let copy = fork.dir.join(migrate::CACHE_COPY);
                bytes += dynocap_backend_jail::copy_sparse(image, &copy).map_err(|source| {
                    VmError::Io {
                        context: format!("copying the package cache disk to {}", copy.display()),
                        source,
                    }
                })?;
            }
            Ok(bytes)
        },
        SAVE_TIMEOUT,
    )
    .map_err(|err| match err {
        VmError::InvalidSpec(_) => Error::invalid(err.to_string()),
        other => Error::internal(format!("saving the guest for the live fork: {other}")),
    });
    // Whether the save went through or not, the guest runs again: the new layer's dropped
    // descriptor can close now, and must, or the next freeze leaves a layer no fork can open.
    if let Some(dropped) = dropped {
        vm.release_dropped(dropped).map_err(|err| {
            Error::internal(format!(
                "closing the frozen disk layer's write descriptor in QEMU: {err}"
            ))
        })?;
    }
    let saved = saved?;
    if cache.is_some() {
        // Set aside now that the guest runs again: the copy was the pause's, its room is not.
        let copy = fork.dir.join(migrate::CACHE_COPY);
        let layout = crate::host::disk_room::Layout::Fixed;
        crate::host::disk_room::reserve_with(&copy, cache_bytes, layout, |dir, free| {
            Error::new(
                crate::foundation::error::ErrorCode::PolicyDenied,
                format!(
                    "the live fork's copy of the package cache disk needs {} MB set aside on \
                     the filesystem holding {}, which has {free} MB free: free space there \
                     (delete checkpoints, destroy sandboxes, or rm --purge finished tasks)",
                    cache_bytes >> 20,
                    dir.display()
                ),
            )
        })?;
    }
    Ok(LiveSaved {
        state_bytes: saved.state_bytes,
        disk_bytes: saved.disk_bytes,
        paused: saved.paused,
    })
}

/// Whether the guest of `spec` resumes a saved one (see [`boot_or_resume`]): the project's
/// package cache is then not its to take.
pub(super) fn resuming(spec: &super::BootSpec) -> bool {
    resumes(spec.reuse_layer, &spec.state_dir)
}

fn resumes(reuse_disk: bool, state_dir: &Path) -> bool {
    reuse_disk && migrate::state_file(state_dir).is_file()
}

/// Boots the guest of `spec`, or resumes the guest saved in its state directory when it
/// boots over the disk kept there and a saved guest is there too (a live fork's first boot).
/// The flag says which.
pub(super) fn boot_or_resume(spec: &VmSpec) -> std::result::Result<(Vm, bool), VmError> {
    let state = migrate::state_file(&spec.state_dir);
    if resumes(spec.reuse_disk, &spec.state_dir) {
        // The saved guest's devices: its package cache disk is the copy taken with it.
        let copy = VmPaths::at(&spec.state_dir).dir.join(migrate::CACHE_COPY);
        let spec = VmSpec {
            cache_disk: copy.is_file().then(|| CacheDisk {
                image: copy,
                throwaway: false,
                spots: String::new(),
            }),
            ..spec.clone()
        };
        return migrate::resume(&spec, &state, spec.boot_timeout).map(|vm| (vm, true));
    }
    Vm::boot(spec).map(|vm| (vm, false))
}
