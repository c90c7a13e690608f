//! The foundation layer: what every other layer of the engine builds on and that knows nothing
//! of sandboxes: the error type, failpoints, the terms user-facing messages name, git URLs,
//! SSH keys and output excerpts. Durable file writes are the host crate's
//! (`dynocap_host::durable`), which its id range pool shares.
//!
//! It imports nothing from the crate outside this folder (scripts/layers.py checks).

pub(crate) mod error;
pub mod excerpt;
pub(crate) mod failpoint;
pub mod git_url;
pub mod ssh_key;
pub mod terms;
