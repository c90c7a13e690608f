//! The guest's unprivileged user, which every image has and every command runs as (a module
//! of its own so the image modules that add it share it without importing `image.rs`).

/// Guest uid/gid of the unprivileged user every command runs as.
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;
pub const SANDBOX_HOME: &str = "/home/sandbox";
