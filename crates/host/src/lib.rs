//! DynoCap's host systems that more than one backend, the engine and `dynocap doctor` use:
//! none of them is one backend's own.
//!
//! - [`usernet`]: pasta, the user-mode networking of a `nat` guest (a jail's network
//!   namespace, or the one a VM's QEMU runs in);
//! - [`idmap`]: how guest ids map to host ids, and the root-mode pool of host id ranges;
//! - [`idpool`]: handing out that pool's ranges, one per sandbox state directory;
//! - [`durable`]: files written whole or not at all, synced where they must survive a crash
//!   (the engine's records and results, the pool's range records);
//! - [`cgroup`]: the host's cgroup layout, the `dynocap` parent cgroup and the memory bound
//!   over all sandboxes together, and their probe;
//! - [`Check`]: what a probe of the machine reports.
//!
//! Errors are [`HostError`]; the backends wrap it (`JailError::Host`) with its text unchanged.

pub mod cgroup;
mod check;
pub mod durable;
mod error;
pub mod idmap;
pub mod idpool;
pub mod usernet;

pub use cgroup::{bound_all_sandboxes_memory, SharedBound};
pub use check::Check;
pub use error::{HostError, HINT_PRIVILEGE};
pub use idmap::{
    IdMap, IdRange, ROOTLESS_GUEST_ID, ROOT_MODE_COUNT, ROOT_MODE_HOST_BASE, ROOT_MODE_RANGES,
};
pub use usernet::{find_pasta, log_worthy as usernet_log_worthy, UserNet, PASTA, PASTA_MISSING};
