//! What a sandbox whose supervisor is gone left on the host, and its removal: by the backend
//! its record names, whatever `DYNOCAP_BACKEND` says now.

use crate::foundation::error::Result;
use crate::host::home::Home;

/// What [`remove_leftovers`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    Nothing,
    /// The writable layer (and the state directory holding it): unsaved work.
    Layer,
}

/// Removes what a sandbox whose supervisor is gone left behind: processes and cgroups (the
/// part of `backend`, the one its record names, whatever `DYNOCAP_BACKEND` says now), its
/// state directory and its control socket. Idempotent.
pub(crate) fn remove_leftovers(home: &Home, id: &str, backend: &str, keep: Keep) -> Result<()> {
    let _ = std::fs::remove_file(home.control_socket(id));
    let backend = crate::backend::by_name(backend)?;
    if keep == Keep::Layer {
        return backend.cleanup_keeping_layer(id, &home.sandbox_dir(id));
    }
    backend.cleanup_leftovers(id, &home.sandbox_dir(id))?;
    let _ = std::fs::remove_dir_all(home.sandbox_dir(id));
    Ok(())
}
