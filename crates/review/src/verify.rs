//! The parts of verifying a patch against the host's pristine baseline that need no git:
//! which entries of the baseline tar a `git apply` of the patch can see, extracting just
//! those into a directory the caller made ([`touched`], writing regular files through
//! directory descriptors in `tree_files`), and whether `git apply --check` alone gives the
//! verdict a real apply would ([`dry_run`]). The engine starts git and gives the verdict.

pub mod dry_run;
pub mod touched;
mod tree_files;

#[cfg(test)]
mod tests;
