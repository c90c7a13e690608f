//! Finishing a task on the host: verifying the patch against the host's pristine copy of the
//! baseline, and writing the results a user takes home (`results/<task-id>/`).
//!
//! Verification never touches the user's project or anything the guest wrote besides the patch
//! bytes: the part of the baseline the patch can see (`touched`: the paths it names, their
//! leading directories and attributes) is unpacked from the host's own tar into a scratch
//! repository, and the patch is applied there by a git that reads no system, global or repository-supplied
//! configuration and runs no hooks.

use std::path::{Path, PathBuf};

use crate::error::{Context, Result};
use crate::exec::sanitize_line;
use crate::hardened_git::HardenedGit;
use crate::patch;

mod touched;

use touched::Touched;

/// Files in a task's results directory.
pub const PATCH_FILE: &str = "patch.diff";
pub const EXEC_LOG_FILE: &str = "exec.jsonl";
pub const SUMMARY_FILE: &str = "summary.json";

/// Applies `patch` to a pristine copy of the baseline (`baseline_tar`) in `scratch` (created,
/// then removed). `Ok(())` means it applies cleanly; `Err` says why not, in words a person can
/// act on.
pub fn verify(baseline_tar: &Path, patch: &Path, scratch: &Path) -> Result<(), String> {
    let result = verify_in(baseline_tar, patch, scratch);
    let _ = std::fs::remove_dir_all(scratch);
    result
}

fn verify_in(baseline_tar: &Path, patch: &Path, scratch: &Path) -> Result<(), String> {
    let bytes = std::fs::read(patch).map_err(|err| format!("reading the patch: {err}"))?;
    if bytes.is_empty() {
        return Ok(());
    }
    // The caller verifies only a patch the review read, so this parse succeeds; should it
    // not, nothing is known about what the patch touches and it cannot be verified.
    let files = patch::parse(&bytes, bytes.len())
        .map_err(|err| format!("the patch cannot be read: {err}"))?;
    std::fs::create_dir_all(scratch)
        .map_err(|err| format!("creating {}: {err}", scratch.display()))?;
    touched::extract(baseline_tar, &Touched::of(&files), scratch)?;
    apply_in(scratch, patch)
}

/// `git apply`s `patch` to the work tree in `scratch` (made a repository first, so that git
/// reads the in-tree `.gitattributes` as it would in a checkout).
fn apply_in(scratch: &Path, patch: &Path) -> Result<(), String> {
    let git = |args: &[&str]| HardenedGit::new(scratch).args(args).run();
    git(&["init", "-q"]).map_err(|err| format!("creating the scratch repository: {err}"))?;
    let patch_arg = patch.to_string_lossy().into_owned();
    git(&["apply", "--whitespace=nowarn", "--", &patch_arg]).map_err(|err| {
        format!(
            "the patch does not apply to the imported state: {}",
            sanitize_line(&err.to_string(), 2000)
        )
    })?;
    Ok(())
}

/// The results directory of a task.
pub fn results_dir(home_root: &Path, id: &str) -> PathBuf {
    home_root.join("results").join(id)
}

/// Creates the results directory (0700: patches and logs may hold secrets the agent saw).
pub fn create_results_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .context(format_args!("creating {}", dir.display()))
}

#[cfg(test)]
mod tests;
