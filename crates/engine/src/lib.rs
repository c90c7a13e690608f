//! DynoCap engine: everything between a caller (CLI or MCP server) and a guest — request
//! validation, the catalog, guest images, the per-sandbox supervisor and the client that
//! talks to it.

mod activity;
mod admission;
pub mod agent_conn;
pub mod apply;
pub mod backend;
pub mod catalog;
mod catalog_file;
mod catalog_lock;
pub mod ceilings;
pub mod clone;
pub mod control;
pub mod disk_room;
pub mod durable;
pub mod egress;
pub mod error;
pub mod excerpt;
pub mod exec;
pub mod failpoint;
pub mod finish;
pub mod git_url;
pub mod hardened_git;
pub mod home;
pub mod host_children;
pub mod idpool;
pub mod image;
pub mod image_admin;
pub mod import;
pub(crate) mod leftovers;
pub mod model;
mod oom;
pub mod pool;
pub mod records;
pub mod repair;
pub mod sandboxes;
pub mod save;
pub mod spawn;
pub mod spec;
pub mod ssh_key;
pub mod standby;
mod starter_watch;
pub mod supervisor;
pub mod task_spec;
pub mod tasks;
pub mod usernet;
pub mod vm_ready;
pub mod wording;
pub mod workspace;

pub use error::{Error, ErrorCode, Result};
pub use exec::ExecResult;
pub use home::Home;
pub use sandboxes::{Engine, SandboxInfo};
