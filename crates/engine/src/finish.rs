//! Finishing a task on the host: verifying the patch against the host's pristine copy of the
//! baseline, and writing the results a user takes home (`results/<task-id>/`).
//!
//! Verification never touches the user's project or anything the guest wrote besides the patch
//! bytes: the baseline is unpacked from the host's own tar into a scratch repository, and the
//! patch is applied there by a git that reads no system, global or repository-supplied
//! configuration and runs no hooks.

use std::path::{Path, PathBuf};

use crate::error::{Context, Result};
use crate::exec::sanitize_line;
use crate::hardened_git::HardenedGit;

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
    let size = std::fs::metadata(patch)
        .map_err(|err| format!("reading the patch: {err}"))?
        .len();
    if size == 0 {
        return Ok(());
    }
    std::fs::create_dir_all(scratch)
        .map_err(|err| format!("creating {}: {err}", scratch.display()))?;
    let tar = std::fs::File::open(baseline_tar).map_err(|err| {
        format!("the host's baseline copy is missing ({err}); the patch cannot be checked")
    })?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(tar));
    archive.set_preserve_permissions(true);
    archive.set_overwrite(false);
    archive
        .unpack(scratch)
        .map_err(|err| format!("unpacking the baseline copy: {err}"))?;
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
mod tests {
    use super::*;

    fn baseline(dir: &Path) -> PathBuf {
        let path = dir.join("base.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&path).unwrap());
        let mut header = tar::Header::new_gnu();
        header.set_size(6);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, "a.txt", &b"hello\n"[..])
            .unwrap();
        builder.finish().unwrap();
        path
    }

    #[test]
    fn a_matching_patch_verifies_and_a_stale_one_explains_itself() {
        let dir = tempfile::tempdir().unwrap();
        let tar = baseline(dir.path());
        let good = dir.path().join("good.diff");
        std::fs::write(
            &good,
            "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-hello\n+world\n",
        )
        .unwrap();
        verify(&tar, &good, &dir.path().join("s1")).unwrap();
        assert!(!dir.path().join("s1").exists(), "scratch removed");

        let stale = dir.path().join("stale.diff");
        std::fs::write(
            &stale,
            "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-other\n+world\n",
        )
        .unwrap();
        let err = verify(&tar, &stale, &dir.path().join("s2")).unwrap_err();
        assert!(err.contains("does not apply"), "{err}");

        let empty = dir.path().join("empty.diff");
        std::fs::write(&empty, "").unwrap();
        verify(&tar, &empty, &dir.path().join("s3")).unwrap();
    }
}
