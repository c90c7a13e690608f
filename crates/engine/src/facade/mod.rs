//! The client facade: [`Engine`](sandboxes::Engine), what the CLI and the MCP server call.
//! Raw sandboxes, tasks, the warm pool and its standby, applying a task's result to a
//! repository, admission against the host's ceilings, image administration and catalog
//! repair. It reaches a sandbox through its supervisor's control socket.
//!
//! The top layer: it may import every layer below it, and nothing imports it.

pub(crate) mod admission;
pub mod apply;
pub mod caches;
pub mod ceilings;
pub mod files;
pub mod forks;
pub mod image_admin;
pub mod image_pull;
pub mod image_recipe;
pub mod jail_pool;
pub mod jobs;
mod live_forks;
pub mod pool;
pub mod ports;
pub mod repair;
pub(crate) mod sandboxes;
pub mod standby;
pub(crate) mod tasks;
