//! DynoCap engine: everything between a caller (CLI or MCP server) and a guest — request
//! validation, the catalog, guest images, the per-sandbox supervisor and the client that
//! talks to it.
//!
//! Its layers, bottom up, each a folder that imports only the layers below it (checked by
//! scripts/layers.py): `foundation` (errors, message terms, git URLs), `model`
//! (the shared types and requests), `host` (the state directory, child processes, hardened
//! git, the id pool, the `nat` helper), `store` (the catalog, the record files), `image`,
//! `backend`, `supervisor` and the client `facade` (`Engine`).

pub(crate) mod foundation;
pub(crate) mod model;

pub(crate) mod host;

pub mod store;

pub mod image;

pub mod backend;

pub mod supervisor;

pub(crate) mod facade;

pub use facade::sandboxes::{Engine, SandboxInfo};
pub use foundation::error::{Error, ErrorCode, Result};
pub use host::home::Home;
pub use model::config::Config;
pub use supervisor::exec::ExecResult;

// A task's checkpoints and forks.
pub use facade::forks;
pub use supervisor::checkpoint;

// The paths other crates (the `dynocap` binary, the end-to-end tests) name, kept from before
// the layers had folders.
pub use facade::caches;
pub use facade::image_recipe;
pub use facade::{apply, ceilings, files, image_admin, jail_pool, pool, ports, repair, standby};
pub use foundation::{excerpt, git_url, ssh_key, terms};
pub use model::{config, spec, task_spec};
pub use store::{catalog, records};
pub use supervisor::{agent_conn, control, exec, finish, import, jobs, workspace};
// Public before the layers had folders, with items no code of the workspace uses today (git
// protocols, `Detach::No`): kept public rather than deleted, which is not this layout's call.
pub use host::{hardened_git, spawn};
