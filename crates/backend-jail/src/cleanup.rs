//! [`cleanup_leftovers`]: removing what a sandbox leaves when its supervisor dies without
//! `destroy` (SIGKILL, crash). The guest itself is already dying (its init has
//! `PR_SET_PDEATHSIG(SIGKILL)`); what remains are the cgroup directories, possibly a process
//! or two still being torn down, and the layers in the state dir.

use std::path::Path;

use crate::cgroup::{CgroupSet, Layout};
use crate::error::JailError;
use crate::layers::Layers;
use crate::spec::validate_name;

/// Cleans up after a sandbox whose supervisor died: kills every process still in cgroup
/// `dynocap/<name>` (in every mounted hierarchy), removes those cgroup directories, deletes
/// `upper/`, `work/` and `root/` from `state_dir`, then `state_dir` itself if that left it
/// empty (anything else the caller keeps there is not touched). Idempotent: fine if nothing
/// exists.
///
/// Must not be called for a sandbox whose supervisor is alive.
pub fn cleanup_leftovers(name: &str, state_dir: &Path) -> Result<(), JailError> {
    cleanup(name, state_dir, false)
}

/// As [`cleanup_leftovers`], but keeps `upper/` (the guest's files) and `state_dir`: for a
/// sandbox whose work was not saved before its supervisor died, so that a new jail can boot
/// over it ([`crate::JailSpec::reuse_layers`]).
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
    // Processes first, so nothing writes into the layers while they are removed.
    let mut problems = CgroupSet::existing(&layout, name).remove();
    if keep_layers {
        problems.extend(Layers::at(state_dir).remove_scratch());
        return if problems.is_empty() {
            Ok(())
        } else {
            Err(JailError::Teardown(problems))
        };
    }
    problems.extend(Layers::at(state_dir).remove());
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
