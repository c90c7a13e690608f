//! The host layer: this machine's resources as the engine uses them: the state directory
//! (`DYNOCAP_HOME`), child processes (spawning, reaping, killing a session), git run with the
//! host hardened against the repositories it reads, the host's memory and its disk room, and
//! when sandboxes were last used. The id pool and the `nat` network helper (`idpool.rs`,
//! `usernet.rs` at the crate root) belong to this layer too.
//!
//! It may import the foundation and the model, nothing above them.

pub(crate) mod activity;
pub(crate) mod disk_room;
pub mod hardened_git;
pub(crate) mod home;
pub(crate) mod host_children;
pub(crate) mod memory;
pub mod spawn;
