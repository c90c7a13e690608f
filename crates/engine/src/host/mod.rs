//! The host layer: this machine's resources as the engine uses them: the state directory
//! (`DYNOCAP_HOME`), child processes (spawning, reaping, killing a session), git run with the
//! host hardened against the repositories it reads, the host's memory and its disk room, and
//! when sandboxes were last used, the host uid ranges of sandboxes (`idpool`), the `nat`
//! network helper (`usernet`) and the projects' package caches (`project_cache`).
//!
//! It may import the foundation and the model, nothing above them.

pub(crate) mod activity;
pub(crate) mod disk_room;
pub mod hardened_git;
pub(crate) mod home;
pub(crate) mod host_children;
pub(crate) mod idpool;
pub(crate) mod jail_pool;
pub(crate) mod memory;
pub mod project_cache;
pub mod spawn;
pub(crate) mod usernet;
