//! The supervisor layer: the process that holds one sandbox (`dynocap supervise`, in
//! `process`) and what it does with its guest: the agent connection, exec, the control
//! protocol it serves, the workspace and the project import, clone and egress, saving a task's
//! work and finishing it, removing what a gone supervisor left, and the watches on the guest's
//! memory and on its starter.
//!
//! It may import the foundation, the model, the host layer, the store (catalog, records), the
//! images and the backends; never the client facade above it.

pub mod agent_conn;
pub mod checkpoint;
pub(crate) mod clone;
pub mod control;
pub(crate) mod egress;
pub mod exec;
pub mod files;
pub mod finish;
pub mod import;
pub mod jobs;
pub(crate) mod leftovers;
pub(crate) mod live_fork;
pub(crate) mod oom;
pub mod ports;
pub(crate) mod process;
pub(crate) mod save;
pub(crate) mod starter_watch;
pub mod workspace;

/// Read by the binary at its edge, for [`Inherited`].
pub use clone::CREDENTIALS_FD_ENV;
pub use process::{agent_binary, main, report_failed_start, Inherited, Mode};
