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
    // Right after a supervisor was killed its guest's processes may still be on their way
    // out (a cgroup not yet empty, a loop device still held); what could not go yet is tried
    // again for a few seconds before the failure is returned and the directory kept for the
    // next repair.
    let mut tries = 0;
    while let Err(err) = backend.cleanup_leftovers(id, &home.sandbox_dir(id)) {
        if tries == 50 {
            return Err(err);
        }
        tracing::debug!("removing the leftovers of {id}: {err}; trying again");
        tries += 1;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    remove_state_dir(home, id);
    Ok(())
}

/// Removes a sandbox's state directory (its disk, baseline, range file) once its guest is
/// gone. A task of the supervisor that was still finishing (a clone's download, a CA bundle
/// for the proxy) may create a file in it while it is being emptied, which fails the last
/// `rmdir` with `ENOTEMPTY`; the removal is tried again for a moment, since a directory left
/// behind keeps its disk's reserved room on the host. A directory that still cannot go is
/// logged: the next repair finds no record for it and removes it.
pub(crate) fn remove_state_dir(home: &Home, id: &str) {
    let dir = home.sandbox_dir(id);
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => return,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return,
            Err(err) if tries < 20 => {
                tracing::debug!("removing {}: {err}; trying again", dir.display());
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(err) => {
                tracing::error!(
                    "removing the sandbox's state directory {}: {err}",
                    dir.display()
                );
                return;
            }
        }
    }
}
