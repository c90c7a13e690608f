//! Making the `dynocap` parent cgroup usable for what goes below it: creating a directory
//! that may already be there, enabling v2 controllers for children, and giving a new v1
//! cpuset cgroup its parent's CPUs. Both the jail's sandbox cgroups and the memory bound over
//! all of them go through these.

use std::path::Path;

use super::layout::Controller;
use crate::error::{HostError, HINT_PRIVILEGE};

/// Directory under each hierarchy root that holds every sandbox's cgroup.
pub const PARENT: &str = "dynocap";

/// Creates the cgroup `dir`; one that exists already is fine.
pub fn mkdir_ok_if_exists(dir: &Path) -> Result<(), HostError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(HostError::io("create cgroup", dir, e).hint(HINT_PRIVILEGE)),
    }
}

/// A new v1 cpuset cgroup starts with no CPUs and no memory nodes, and no task can join it
/// until they are set: copy the parent's.
pub fn inherit_cpuset(dir: &Path) -> Result<(), HostError> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(file);
        let current = std::fs::read_to_string(&own).map_err(|e| HostError::io("read", &own, e))?;
        if current.trim().is_empty() {
            let from = parent.join(file);
            let value =
                std::fs::read_to_string(&from).map_err(|e| HostError::io("read", &from, e))?;
            std::fs::write(&own, value.trim()).map_err(|e| HostError::io("write", &own, e))?;
        }
    }
    Ok(())
}

/// Enables `controllers` for the children of the v2 cgroup `cgroup`, those not enabled yet.
pub fn enable_controllers(cgroup: &Path, controllers: &[Controller]) -> Result<(), HostError> {
    let file = cgroup.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&file).map_err(|e| HostError::io("read", &file, e))?;
    for controller in controllers {
        let name = controller.name();
        if enabled.split_whitespace().any(|c| c == name) {
            continue;
        }
        std::fs::write(&file, format!("+{name}")).map_err(|e| HostError::LimitUnavailable {
            limit: name,
            reason: format!(
                "cannot enable the {name} controller in {}: {e}; {HINT_PRIVILEGE} \
                 (on v2 a controller cannot be enabled for a cgroup that has processes of its own)",
                file.display()
            ),
        })?;
    }
    Ok(())
}
