//! The `git apply` of a verification and the scratch repository it runs in.
//!
//! Git is started while the work tree it applies to is being filled: it reads the patch from
//! stdin, and until that ends it has done nothing but start (exec, dynamic loading, repository
//! setup: a large share of the verification), which thus overlaps the extraction of the
//! baseline entries. Git touches the work tree only once the patch is read, so it sees the
//! tree as the extraction leaves it.
//!
//! The scratch directory holds the git directory and the work tree side by side (`git/`,
//! `tree/`), so that the work tree holds nothing but baseline entries (whatever they are
//! named).
//!
//! Attributes play no part, as in the guest's diff (see
//! [`dynocap_proto::NEUTRAL_ATTRIBUTES`]): the scratch repository's `info/attributes` unsets
//! them. Were git to read the tree's `.gitattributes` here, `ident`, `text` or `eol` would
//! fold the baseline's bytes before comparing, and a faithful patch would not apply.
//! (`GIT_ATTR_SOURCE` would be another way, but `git apply` 2.47 dies of a segmentation fault
//! under it.)

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::host::hardened_git::{GitError, HardenedGit, RunningGit};
use crate::supervisor::exec::sanitize_line;

/// The work tree, in the scratch directory.
const TREE: &str = "tree";
/// The git directory, in the scratch directory.
const GIT_DIR: &str = "git";

/// A scratch directory made afresh, its work tree empty and its repository ready, where
/// git is not started yet.
pub(super) struct Scratch {
    tree: PathBuf,
    git_dir: PathBuf,
}

impl Scratch {
    /// Makes `scratch` afresh: an empty work tree and a repository.
    pub fn make(scratch: &Path) -> Result<Self, String> {
        let _ = std::fs::remove_dir_all(scratch);
        let tree = scratch.join(TREE);
        std::fs::create_dir_all(&tree)
            .map_err(|err| format!("creating {}: {err}", tree.display()))?;
        // Absolute, as `--git-dir`/`--work-tree` want them; also what the extraction needs.
        let scratch = scratch
            .canonicalize()
            .map_err(|err| format!("creating {}: {err}", scratch.display()))?;
        let (tree, git_dir) = (scratch.join(TREE), scratch.join(GIT_DIR));
        make_repository(&git_dir)
            .map_err(|err| format!("creating the scratch repository: {err}"))?;
        Ok(Self { tree, git_dir })
    }

    /// The work tree git will apply the patch to, for the caller to fill before
    /// [`PendingApply::finish`].
    pub fn tree(&self) -> &Path {
        &self.tree
    }

    /// Starts git, waiting for the patch on its stdin. Returns once git runs (its exec done).
    pub fn start_git(&self, how: Apply) -> Result<PendingApply, String> {
        let mut args = vec!["apply", "--whitespace=nowarn"];
        if how == Apply::Check {
            args.push("--check");
        }
        let git = HardenedGit::with_git_dir(&self.git_dir, Some(&self.tree))
            .args(args)
            .spawn_fed()
            .map_err(does_not_apply)?;
        Ok(PendingApply { git })
    }
}

/// How git takes the patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Apply {
    /// `--check`: the checks, nothing written. Its verdict is a real apply's only where
    /// nothing stands in the way of the writes (see `dry_run`).
    Check,
    /// Applied for real: the checks, then the result written, which some refusals need.
    Write,
}

/// A `git apply` waiting for its patch while the caller fills the [`Scratch`]'s tree.
/// Dropped unfinished, git is killed. Finish it on the thread that started it (git dies with
/// that thread, see [`RunningGit`]).
pub(super) struct PendingApply {
    git: RunningGit,
}

impl PendingApply {
    /// Hands git the patch and waits for its verdict: `Ok(())` if it applies cleanly.
    pub fn finish(mut self, patch: &[u8]) -> Result<(), String> {
        let written = match self.git.take_stdin() {
            // Dropped at the end of the arm: git sees the end of the patch.
            Some(mut stdin) => stdin.write_all(patch),
            None => Err(std::io::Error::other("git was started without a stdin")),
        };
        // Should git have stopped reading (it failed to start up), its own words say why.
        self.git.finish().map_err(does_not_apply)?;
        written.map_err(|err| format!("handing the patch to git: {err}"))
    }
}

/// A git failure as the verdict on the patch.
fn does_not_apply(err: GitError) -> String {
    // git's own words say what does not apply; the command line says nothing more.
    let why = match err {
        GitError::Failed { stderr, .. } => stderr,
        other => other.to_string(),
    };
    format!(
        "the patch does not apply to the imported state: {}",
        sanitize_line(&why, 2000)
    )
}

/// The least git takes for a repository (`HEAD`, `objects/`, `refs/`), written directly, and
/// the attributes that keep the tree's own out (see the module doc): what `git init` would
/// add (config, description, hooks, info/exclude) plays no part in an apply, and `git init`
/// is a process start per verification. Without a config git takes repository
/// format 0.
fn make_repository(git_dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    builder.create(git_dir.join("objects"))?;
    builder.create(git_dir.join("refs"))?;
    builder.create(git_dir.join("info"))?;
    std::fs::write(
        git_dir.join("info").join("attributes"),
        dynocap_proto::NEUTRAL_ATTRIBUTES,
    )?;
    std::fs::write(git_dir.join("HEAD"), "ref: refs/heads/main\n")
}
