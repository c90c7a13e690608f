//! [`cleanup_leftovers`]: removing what a sandbox leaves when its supervisor dies without
//! `destroy` (SIGKILL, crash). The guest itself is already dying (its init has
//! `PR_SET_PDEATHSIG(SIGKILL)`); what remains are the cgroup directories, possibly a process
//! or two still being torn down, and the layers and disk image in the state dir. The disk's
//! mount and loop device went with the supervisor's mount namespace.

use std::path::Path;

use crate::cgroup::{CgroupSet, Layout};
use crate::disk::{remove_disk, wait_released, DiskPaths};
use crate::error::JailError;
use crate::layers::Layers;
use crate::spec::validate_name;

/// Cleans up after a sandbox whose supervisor died: kills every process still in cgroup
/// `dynocap/<name>` (in every mounted hierarchy), removes those cgroup directories, deletes
/// the layers and the disk image from `state_dir`, then `state_dir` itself if that left it
/// empty (anything else the caller keeps there is not touched). Idempotent: fine if nothing
/// exists.
///
/// Must not be called for a sandbox whose supervisor is alive.
pub fn cleanup_leftovers(name: &str, state_dir: &Path) -> Result<(), JailError> {
    cleanup(name, state_dir, false)
}

/// As [`cleanup_leftovers`], but keeps `upper/` (the guest's files, in the disk image) and
/// `state_dir`: for a sandbox whose work was not saved before its supervisor died, so that a
/// new jail can boot over it ([`crate::JailSpec::reuse_layers`]). Waits (a few seconds at
/// most) for the dead supervisor's loop device to let go of the image.
pub fn cleanup_leftovers_keeping_layers(name: &str, state_dir: &Path) -> Result<(), JailError> {
    cleanup(name, state_dir, true)
}

fn cleanup(name: &str, state_dir: &Path, keep_layers: bool) -> Result<(), JailError> {
    validate_name(name)?;
    if !state_dir.is_absolute() {
        return Err(JailError::InvalidSpec(format!(
            "state_dir {} is not an absolute path",
            state_dir.display()
        )));
    }
    let layout = Layout::discover()?;
    // A supervisor killed during a checkpoint leaves the disk frozen, which holds its loop
    // device, and the dead guest's writers in the kernel, until it is thawed: before the
    // processes are killed, or they cannot die.
    let thawed = crate::checkpoint::thaw_leftover(&DiskPaths::at(state_dir).image);
    // Processes first, so nothing writes into the layers while they are removed.
    let mut problems = CgroupSet::existing(&layout, name).remove();
    if let Err(e) = thawed {
        problems.push(e.to_string());
    }
    let disk = DiskPaths::at(state_dir);
    if keep_layers {
        // The image is unmounted once the dead supervisor's namespaces are gone; its layer
        // (and the scratch `work/` in it) is for the next guest to mount, not for us.
        if let Err(e) = wait_released(&disk.image) {
            problems.push(e.to_string());
        }
        problems.extend(Layers::at(state_dir).remove_scratch());
        return if problems.is_empty() {
            Ok(())
        } else {
            Err(JailError::Teardown(problems))
        };
    }
    problems.extend(Layers::at(state_dir).remove());
    problems.extend(remove_disk(&disk));
    match std::fs::remove_dir(state_dir) {
        Ok(()) => {}
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {}
        Err(e) => problems.push(format!("cannot remove {}: {e}", state_dir.display())),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(JailError::Teardown(problems))
    }
}
