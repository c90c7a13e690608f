//! The host's review of what a guest hands back: everything about a patch that can be decided
//! from the bytes it is given, with no process, runtime or state of its own.
//!
//! - [`patch`]: the strict parser of a guest's `git diff --binary` and the review built on it
//!   (file and line counts, the sensitive paths a reviewer must look at);
//! - [`diff_view`]: what a diff shows a model (every file's stats, the text bounded, the
//!   tracked files' changes first);
//! - [`generated`]: the table of files tools generate, and a patch split into the entries
//!   kept and the generated ones left out;
//! - [`tar_index`]: the offset index of a baseline tar, written and read;
//! - [`verify`]: the pure parts of verifying a patch against the baseline (which entries it
//!   touches, extracting just those, and whether `git apply --check` alone gives the verdict).
//!   Running git is the engine's.
//!
//! Imports run one way: `diff_view`, `generated` and `verify` read `patch`, `verify` reads `tar_index`,
//! and neither `patch` nor `tar_index` reads anything else of the crate. The parser, the review
//! and the index reader take hostile input: [`fuzzing`] holds the bodies of their fuzz targets
//! (`fuzz/`), which its unit tests run too.

pub mod diff_view;
pub mod fuzzing;
pub mod generated;
pub mod patch;
pub mod tar_index;
pub mod verify;

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
