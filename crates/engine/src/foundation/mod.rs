//! The foundation layer: what every other layer of the engine builds on and that knows nothing
//! of sandboxes: the error type, failpoints, the terms user-facing messages name, git URLs,
//! SSH keys, output excerpts and durable file writes.
//!
//! It imports nothing from the crate outside this folder (scripts/layers.py checks).

pub(crate) mod durable;
pub(crate) mod error;
pub mod excerpt;
pub(crate) mod failpoint;
pub mod git_url;
pub mod ssh_key;
pub mod terms;
