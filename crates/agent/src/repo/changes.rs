//! What the private index changes against the baseline: git's raw list of the changed paths
//! and the sizes of their blobs, which decide which files are too big for a line diff and
//! how a diff is split.

use std::path::Path;

use tokio::sync::mpsc;

use super::error::RepoError;
use super::private::{cat_file_batch, Opened};
use crate::bigfiles;
use crate::diff_split;
use crate::git::Git;
use crate::process_group::Stop;

/// What the private index changes against the baseline: each path in the order the diff
/// prints them, and the sizes of the regular files' blobs on both sides.
pub(super) struct ChangedFiles {
    pub(super) changes: Vec<bigfiles::Change>,
    /// Every record of git's list parsed: each changed path is in `changes`.
    pub(super) complete: bool,
    pub(super) sizes: std::collections::HashMap<String, u64>,
}

impl ChangedFiles {
    /// What diffing each path costs, for [`diff_split::plan`]; `None` when the list may miss
    /// a path, which a split would then leave out of the patch.
    pub(super) fn weighed(&self) -> Option<Vec<diff_split::Weighed>> {
        if !self.complete {
            return None;
        }
        let weighed = self.changes.iter().map(|change| {
            let blob_bytes = blobs_of(change)
                .into_iter()
                .flatten()
                .map(|id| self.sizes.get(&id).copied().unwrap_or(0))
                .fold(0_u64, u64::saturating_add);
            diff_split::Weighed {
                path: change.path.clone(),
                bytes: blob_bytes.saturating_add(diff_split::PER_PATH_BYTES),
            }
        });
        Some(weighed.collect())
    }
}

pub(super) fn blobs_of(change: &bigfiles::Change) -> [Option<String>; 2] {
    [change.old_blob.clone(), change.new_blob.clone()]
}

/// The blobs of `changes`, both sides.
pub(super) fn blob_ids<'a>(changes: impl IntoIterator<Item = &'a bigfiles::Change>) -> Vec<String> {
    changes.into_iter().flat_map(blobs_of).flatten().collect()
}

/// Lists what the private index changes against `baseline`, with the blobs' sizes.
pub(super) async fn changed_files(
    git: &Git,
    private: &Opened,
    workspace: &Path,
    baseline: &str,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<ChangedFiles, RepoError> {
    let raw = git
        .run(
            &private.args(
                workspace,
                &[
                    "diff",
                    "--cached",
                    "--raw",
                    "-z",
                    "--no-renames",
                    "--no-abbrev",
                    "--ignore-submodules=none",
                    baseline,
                ],
            ),
            private.run(),
            stop,
        )
        .await?;
    let (changes, complete) = bigfiles::parse_raw(&raw);
    let ids = blob_ids(&changes);
    let sizes = bigfiles::parse_sizes(
        &cat_file_batch(
            git,
            private,
            workspace,
            "--batch-check=%(objectname) %(objectsize)",
            &ids,
            stop,
        )
        .await?,
    );
    Ok(ChangedFiles {
        changes,
        complete,
        sizes,
    })
}
