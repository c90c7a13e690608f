//! Finishing a task on the host: verifying the patch against the host's pristine copy of the
//! baseline, and writing the results a user takes home (`results/<task-id>/`).
//!
//! Verification never touches the user's project or anything the guest wrote besides the patch
//! bytes: the part of the baseline the patch can see (`touched`: the paths it names, their
//! leading directories and attributes) is unpacked from the host's own tar into a scratch
//! repository, and the patch is applied there by a git that reads no system, global or repository-supplied
//! configuration and runs no hooks. The tar's offset index ([`crate::tar_index`]) finds those
//! entries without reading the others' headers; without a usable index the tar is read
//! through, with the same verdict.

use std::path::{Path, PathBuf};

use crate::error::{Context, Result};
use crate::exec::sanitize_line;
use crate::hardened_git::{GitError, HardenedGit};
use crate::patch;
use crate::tar_index::{IndexError, TarIndex};

mod touched;

use touched::{Failure, Source, Touched};

/// Files in a task's results directory.
pub const PATCH_FILE: &str = "patch.diff";
pub const EXEC_LOG_FILE: &str = "exec.jsonl";
pub const SUMMARY_FILE: &str = "summary.json";

/// Applies `patch` to a pristine copy of the baseline (`baseline_tar`) in `scratch` (created,
/// then removed). `Ok(())` means it applies cleanly; `Err` says why not, in words a person can
/// act on.
pub fn verify(baseline_tar: &Path, patch: &Path, scratch: &Path) -> Result<(), String> {
    let result = verify_in(baseline_tar, patch, scratch);
    discard(scratch);
    result
}

/// Removes `scratch` off the caller's path: renamed aside at once (its name is free for the
/// next verification when this returns), then removed by a thread of its own. Unlinking the
/// hundred-odd entries of a 50-file patch costs 10–20 ms on a busy disk, more than the rest
/// of the verification, and the verdict need not wait for it. Should the process end first,
/// a `<scratch>.discarded-*` directory is left beside it, in the state directory that holds
/// it.
fn discard(scratch: &Path) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = scratch.file_name().unwrap_or_default().to_owned();
    name.push(format!(".discarded-{}-{n}", std::process::id()));
    let aside = scratch.with_file_name(name);
    if std::fs::rename(scratch, &aside).is_err() {
        // Nothing there (an empty patch makes none), or it cannot move: remove it in place.
        let _ = std::fs::remove_dir_all(scratch);
        return;
    }
    let removing = aside.clone();
    let spawned = std::thread::Builder::new()
        .name("verify-cleanup".into())
        .spawn(move || {
            let _ = std::fs::remove_dir_all(removing);
        });
    if spawned.is_err() {
        let _ = std::fs::remove_dir_all(aside);
    }
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
    let touched = Touched::of(&files);
    let fresh_scratch = || {
        let _ = std::fs::remove_dir_all(scratch);
        std::fs::create_dir_all(scratch)
            .map_err(|err| format!("creating {}: {err}", scratch.display()))
    };
    fresh_scratch()?;
    if let Some(index) = usable_index(baseline_tar) {
        match touched::extract(baseline_tar, &Source::Indexed(&index), &touched, scratch) {
            Ok(_) => return apply_in(scratch, patch),
            Err(Failure::Baseline(why)) => return Err(why),
            Err(Failure::IndexWrong(why)) => {
                tracing::warn!(
                    "the baseline's index is wrong ({why}); reading the baseline without it"
                );
                // Whatever the index led to is not what a pass over the tar would extract.
                fresh_scratch()?;
            }
        }
    }
    touched::extract(baseline_tar, &Source::Scan, &touched, scratch).map_err(|failure| {
        match failure {
            Failure::Baseline(why) | Failure::IndexWrong(why) => why,
        }
    })?;
    apply_in(scratch, patch)
}

/// The baseline's offset index, when there is a sound one. Without (a baseline made before
/// indexes were written, or a damaged index), verification reads every header of the tar
/// instead: slower, same verdict, so nothing to refuse.
fn usable_index(baseline_tar: &Path) -> Option<TarIndex> {
    match TarIndex::load(baseline_tar) {
        Ok(index) => Some(index),
        Err(IndexError::Missing(_)) => None,
        Err(err) => {
            tracing::warn!("{err}; reading the baseline without it");
            None
        }
    }
}

/// `git apply`s `patch` to the work tree in `scratch`, made a repository first so that git
/// reads the in-tree `.gitattributes` as it would in a checkout (outside a repository it
/// reads none). A real apply, not `--check`: only writing the result finds some refusals
/// (a new file whose directory is a file in the baseline passes `--check`).
fn apply_in(scratch: &Path, patch: &Path) -> Result<(), String> {
    make_repository(scratch).map_err(|err| format!("creating the scratch repository: {err}"))?;
    let patch_arg = patch.to_string_lossy().into_owned();
    HardenedGit::new(scratch)
        .args(["apply", "--whitespace=nowarn", "--", &patch_arg])
        .run()
        .map_err(|err| {
            // git's own words say what does not apply; the command line says nothing more.
            let why = match err {
                GitError::Failed { stderr, .. } => stderr,
                other => other.to_string(),
            };
            format!(
                "the patch does not apply to the imported state: {}",
                sanitize_line(&why, 2000)
            )
        })?;
    Ok(())
}

/// The least git takes for a repository (`HEAD`, `objects/`, `refs/`), written directly: what
/// `git init` would add (config, description, hooks, info/exclude) plays no part in an
/// apply, and `git init` is a process start (8 ms) per verification. Without a config git
/// takes repository format 0 and, the git dir being `.git` in a work tree, a non-bare one.
fn make_repository(dir: &Path) -> std::io::Result<()> {
    let git_dir = dir.join(".git");
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    builder.create(git_dir.join("objects"))?;
    builder.create(git_dir.join("refs"))?;
    std::fs::write(git_dir.join("HEAD"), "ref: refs/heads/main\n")
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
