//! The host's cgroups as both backends and the doctor see them, not any one sandbox's: where
//! each controller is mounted (v1, v2 or a hybrid: [`Layout`]), the `dynocap` parent every
//! sandbox's cgroup goes under ([`PARENT`], [`dirs`]), the memory table a limit is written
//! by ([`memory`]), the bound over all sandboxes' memory together ([`memory_bound`]), and the
//! probe `dynocap doctor` reports ([`probe`]).
//!
//! A sandbox's own cgroups (creation, limits, delegation to the guest, teardown) stay the
//! jail's: only it makes them.

pub mod dirs;
pub mod layout;
pub mod memory;
pub mod memory_bound;
mod mountinfo;
pub mod probe;

pub use dirs::PARENT;
pub use layout::{CgroupLayoutKind, CgroupVersion, Controller, Hierarchy, Layout};
pub use memory_bound::{bound_all_sandboxes_memory, SharedBound};
pub use probe::{probe_cgroups, CgroupProbe, ControllerProbe};
