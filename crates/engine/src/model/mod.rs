//! The types every layer of the engine shares: what a sandbox is and where it is in its
//! life, what it was asked for, and the values its results carry. Nothing here does I/O
//! beyond reading `/proc` for a process's identity. The requests (`spec`, `task_spec`) live
//! here too: every layer reads them.
//!
//! It may import only the foundation; the host layer, the catalog, the supervisor, the
//! backends and the client facade all build on it.

pub mod backend_choice;
pub mod config;
pub mod egress_spec;
pub mod image_ref;
pub mod import_notes;
pub mod lifecycle;
pub mod output;
pub mod sandbox_info;
pub mod spec;
pub mod task_results;
pub mod task_spec;
