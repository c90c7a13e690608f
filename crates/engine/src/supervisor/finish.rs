//! Finishing a task on the host: verifying the patch against the host's pristine copy of the
//! baseline, and writing the results a user takes home (`results/<task-id>/`).
//!
//! Verification never touches the user's project or anything the guest wrote besides the patch
//! bytes: the part of the baseline the patch can see (`touched`: the paths it names, their
//! leading directories and attributes) is unpacked from the host's own tar into a scratch
//! repository (by [`dynocap_review::verify`]), and the patch is applied there by a git that
//! reads no system, global or repository-supplied configuration and runs no hooks, started
//! before the unpacking so that its start costs no time (`git_apply`). It runs as
//! `git apply --check`, writing nothing, unless something in the patch or the tree could make
//! the writing itself refuse (`verify::dry_run`). The tar's offset index
//! ([`dynocap_review::tar_index`]) finds those entries without reading the others' headers;
//! without a usable index the tar is read through, with the same verdict. A text patch of
//! bounded size is verified in memory (`in_memory`), where writing the files costs a small
//! fraction of what it does on disk.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dynocap_review::patch;
use dynocap_review::tar_index::{IndexError, TarIndex};
use dynocap_review::verify::dry_run::DryRun;
use dynocap_review::verify::touched::{self, Budget, Failure, Source, Touched};

use crate::foundation::error::{Context, Result};

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::finish";

mod git_apply;
mod in_memory;

use git_apply::{Apply, PendingApply, Scratch};

/// Files in a task's results directory.
pub const PATCH_FILE: &str = "patch.diff";
pub const EXEC_LOG_FILE: &str = "exec.jsonl";
pub const SUMMARY_FILE: &str = "summary.json";

/// Applies `patch` to a pristine copy of the baseline (`baseline_tar`) in `scratch` (created,
/// then removed), or in memory (`in_memory`) when the patch is small. `Ok(())` means it
/// applies cleanly; `Err` says why not, in words a person can act on.
pub fn verify(baseline_tar: &Path, patch: &Path, scratch: &Path) -> Result<(), String> {
    let result = verify_in(baseline_tar, patch, scratch);
    discard(scratch);
    result
}

/// Removes `scratch` off the caller's path: renamed aside at once (its name is free for the
/// next verification when this returns), then removed by a thread of its own. Unlinking the
/// entries of a verification can cost more than the rest of it on a busy disk, and the
/// verdict need not wait for it. Should the process end first,
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
    remove_in_background(aside);
}

/// Removes `dir` and everything in it on a thread of its own, or here if no thread can be
/// started: a verification's scratch, whose removal the verdict need not wait for.
fn remove_in_background(dir: PathBuf) {
    let removing = dir.clone();
    let spawned = std::thread::Builder::new()
        .name("verify-cleanup".into())
        .spawn(move || {
            let _ = std::fs::remove_dir_all(removing);
        });
    if spawned.is_err() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn verify_in(baseline_tar: &Path, patch: &Path, scratch: &Path) -> Result<(), String> {
    let bytes = std::fs::read(patch).map_err(|err| format!("reading the patch: {err}"))?;
    if bytes.is_empty() {
        return Ok(());
    }
    // The baseline's offset index is read on a thread of its own while the patch is parsed
    // and the scratch made: its checks cover every entry, and it is the first thing the
    // extraction needs.
    let index = OnceLock::new();
    std::thread::scope(|scope| {
        let _reading = std::thread::Builder::new()
            .name("verify-index".into())
            .spawn_scoped(scope, || index.get_or_init(|| usable_index(baseline_tar)));
        verify_patch(baseline_tar, &bytes, &index, scratch)
    })
}

/// [`verify`] of the patch `bytes`, with the baseline's index read into `index` by whichever
/// thread gets to it first.
fn verify_patch(
    baseline_tar: &Path,
    bytes: &[u8],
    index: &OnceLock<Option<TarIndex>>,
    scratch: &Path,
) -> Result<(), String> {
    // The caller verifies only a patch the review read, so this parse succeeds; should it
    // not, nothing is known about what the patch touches and it cannot be verified.
    let files = patch::parse(bytes, bytes.len())
        .map_err(|err| format!("the patch cannot be read: {err}"))?;
    let touched = Touched::of(&files);
    let dry_run = DryRun::of(&files)
        .inspect_err(
            |why| tracing::debug!(target: LOG_TARGET, "the patch is applied for real: {why}"),
        )
        .ok();
    let verification = Verification {
        baseline_tar,
        index,
        touched: &touched,
        dry_run: dry_run.as_ref(),
        patch: bytes,
    };
    if let Some(budget) = in_memory::budget(&files, bytes.len()) {
        if let Some(dir) = in_memory::MemoryDir::make() {
            if verification
                .run(&dir.scratch(), Budget(Some(budget)))
                .is_ok()
            {
                return Ok(());
            }
            // Taken again on disk: see `in_memory` for why a refusal there is not final.
        }
    }
    verification.run(scratch, Budget(None))
}

/// One patch's verification, runnable in more than one place.
struct Verification<'a> {
    baseline_tar: &'a Path,
    /// The baseline's offset index ([`usable_index`]), read once, while the patch is parsed
    /// and git is starting.
    index: &'a OnceLock<Option<TarIndex>>,
    touched: &'a Touched,
    /// What lets `git apply --check` give the verdict, unless the patch alone needs a real
    /// apply (`None`).
    dry_run: Option<&'a DryRun>,
    patch: &'a [u8],
}

impl Verification<'_> {
    /// The verdict, from the touched entries extracted in `scratch` (through the index when
    /// there is one, else or if it proves wrong by a pass over the tar).
    fn run(&self, scratch: &Path, budget: Budget) -> Result<(), String> {
        let scratch_dir = Scratch::make(scratch)?;
        // The extraction runs on a thread of its own while this one starts git: starting a
        // process waits for its exec, and the extraction need not. Git
        // stays with this thread, which finishes it (see `PendingApply`).
        let (extracted, apply) = std::thread::scope(|scope| {
            let extraction = std::thread::Builder::new()
                .name("verify-extract".into())
                .spawn_scoped(scope, || self.extract(scratch_dir.tree(), budget));
            let apply = scratch_dir.start_git(self.first_apply());
            let extracted = match extraction {
                Ok(thread) => thread.join().unwrap_or_else(|_| {
                    Err(Failure::Baseline(
                        "the thread extracting the baseline entries panicked".to_owned(),
                    ))
                }),
                // No thread to spare: one after the other.
                Err(_) => self.extract(scratch_dir.tree(), budget),
            };
            (extracted, apply)
        });
        let apply = apply?;
        match extracted {
            Ok(()) => self.finish(&scratch_dir, apply),
            Err(Failure::IndexWrong(why)) => {
                tracing::warn!(target: LOG_TARGET,
                    "the baseline's index is wrong ({why}); reading the baseline without it"
                );
                // Whatever the index led to is not what a pass over the tar would extract:
                // this git is dropped (killed) and the scratch made afresh.
                drop(apply);
                self.run_scan(scratch, budget)
            }
            Err(other) => Err(verdict(other)),
        }
    }

    /// The touched entries, through the index when there is a sound one.
    fn extract(&self, tree: &Path, budget: Budget) -> Result<(), Failure> {
        let index = self.index.get_or_init(|| usable_index(self.baseline_tar));
        let source = match index {
            Some(index) => Source::Indexed(index),
            None => Source::Scan,
        };
        touched::extract(self.baseline_tar, &source, self.touched, tree, budget).map(drop)
    }

    /// [`run`](Self::run) by a pass over the tar, in a fresh scratch.
    fn run_scan(&self, scratch: &Path, budget: Budget) -> Result<(), String> {
        let scratch_dir = Scratch::make(scratch)?;
        let apply = scratch_dir.start_git(self.first_apply())?;
        touched::extract(
            self.baseline_tar,
            &Source::Scan,
            self.touched,
            scratch_dir.tree(),
            budget,
        )
        .map_err(verdict)?;
        self.finish(&scratch_dir, apply)
    }

    /// How git is started, before the tree is extracted: `--check` unless the patch alone
    /// needs a real apply.
    fn first_apply(&self) -> Apply {
        match self.dry_run {
            Some(_) => Apply::Check,
            None => Apply::Write,
        }
    }

    /// The verdict of `apply` (started as [`first_apply`](Self::first_apply) says) on the
    /// extracted tree. A `--check` is replaced by a real apply when something in the tree
    /// stands in the way of what the patch writes: only writing finds those refusals.
    fn finish(&self, scratch_dir: &Scratch, apply: PendingApply) -> Result<(), String> {
        let Some(dry_run) = self.dry_run else {
            return apply.finish(self.patch);
        };
        match dry_run.suffices_in(scratch_dir.tree()) {
            Ok(()) => apply.finish(self.patch),
            Err(why) => {
                tracing::debug!(target: LOG_TARGET, "the patch is applied for real: {why}");
                // Killed unfinished: it has read nothing, and the tree is as extracted.
                drop(apply);
                scratch_dir.start_git(Apply::Write)?.finish(self.patch)
            }
        }
    }
}

/// An extraction's failure as the verdict.
fn verdict(failure: Failure) -> String {
    match failure {
        Failure::Baseline(why) | Failure::IndexWrong(why) => why,
        Failure::OverBudget => {
            "the files the patch touches are too large to check in memory".to_owned()
        }
    }
}

/// The baseline's offset index, when there is a sound one. Without (its write failed, or it
/// was damaged), verification reads every header of the tar
/// instead: slower, same verdict, so nothing to refuse.
fn usable_index(baseline_tar: &Path) -> Option<TarIndex> {
    match TarIndex::load(baseline_tar) {
        Ok(index) => Some(index),
        Err(IndexError::Missing(_)) => None,
        Err(err) => {
            tracing::warn!(target: LOG_TARGET, "{err}; reading the baseline without it");
            None
        }
    }
}

/// The results directory of a task.
pub fn results_dir(home_root: &Path, id: &str) -> PathBuf {
    crate::host::home::task_results_dir(home_root, id)
}

/// Creates the results directory (0700: patches and logs may hold secrets the agent saw).
pub fn create_results_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

#[cfg(test)]
mod tests;
