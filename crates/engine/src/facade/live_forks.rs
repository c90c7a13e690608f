//! What a live fork (`task fork --live`, `live` with `fromTask`) may be: the parent's running
//! guest resumed by another QEMU with every process in it, which only the vm backend can do
//! (see the supervisor's `live_fork` and the backend's `vm_live`). Checked before anything
//! is made, so a refusal leaves nothing behind; a backend that cannot save a running guest
//! (the jail) refuses in its supervisor ([`crate::backend::Guest::save_live`]), and the fork's
//! guard removes what the fork had made.

use crate::facade::forks::ForkSpec;
use crate::foundation::error::{Error, Result};
use crate::model::spec::Network;
use crate::store::catalog::Record;

/// Refuses a live fork of `parent` as `spec` asks, with the fork's network `network`, that
/// cannot be made right.
pub(super) fn check(spec: &ForkSpec, parent: &Record, network: Network) -> Result<()> {
    let name = parent.name.as_deref().unwrap_or(&parent.id);
    if spec.checkpoint.is_some() {
        return Err(Error::invalid(
            "a live fork starts from the task as it runs now; a checkpoint holds files, not \
             running processes: give --live or --checkpoint, not both",
        ));
    }
    // The saved devices are the parent's: a `nat` guest has a NIC the others have not.
    if (parent.network == Network::Nat) != (network == Network::Nat) {
        return Err(Error::invalid(format!(
            "a live fork keeps the guest's devices, and task \"{name}\" has network \"{}\": \
             its live fork can have network \"nat\" only if the task has it (none and \
             filtered may be swapped); fork it without --live for network \"{}\"",
            parent.network.as_str(),
            network.as_str()
        )));
    }
    Ok(())
}
