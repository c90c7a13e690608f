//! [`probe_cgroups`]: where cpu, memory and pids are managed on this machine and whether the
//! supervisor can make cgroups there, for the jail's probe and `dynocap doctor`.

use std::path::PathBuf;

use nix::unistd::{access, AccessFlags};

use super::dirs::PARENT;
use super::layout::{CgroupLayoutKind, CgroupVersion, Controller, Layout};
use crate::check::Check;
use crate::error::HINT_PRIVILEGE;

/// Where one controller is and whether the supervisor can create cgroups there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerProbe {
    /// The controller.
    pub controller: Controller,
    /// Version of the hierarchy managing it, if any does.
    pub version: Option<CgroupVersion>,
    /// Mount point of that hierarchy.
    pub hierarchy: Option<PathBuf>,
    /// The supervisor can create `dynocap/<name>` there.
    pub writable: bool,
}

/// The cgroup setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupProbe {
    /// v1, v2, hybrid or none.
    pub layout: CgroupLayoutKind,
    /// cpu, memory, pids.
    pub controllers: Vec<ControllerProbe>,
    /// All three located and writable.
    pub check: Check,
}

/// Locates each controller and tries whether its `dynocap` parent (or the hierarchy root,
/// before there is one) is writable.
pub fn probe_cgroups() -> CgroupProbe {
    let layout = match Layout::discover() {
        Ok(layout) => layout,
        Err(e) => {
            return CgroupProbe {
                layout: CgroupLayoutKind::None,
                controllers: Vec::new(),
                check: Check::missing(e.to_string(), "mount /proc"),
            }
        }
    };
    let controllers: Vec<ControllerProbe> = Controller::ALL
        .iter()
        .map(|&controller| {
            let hierarchy = layout.locate(controller);
            let writable = hierarchy.is_some_and(|h| {
                let parent = h.mount_point.join(PARENT);
                let dir = if parent.is_dir() {
                    parent
                } else {
                    h.mount_point.clone()
                };
                access(&dir, AccessFlags::W_OK).is_ok()
            });
            ControllerProbe {
                controller,
                version: hierarchy.map(|h| h.version),
                hierarchy: hierarchy.map(|h| h.mount_point.clone()),
                writable,
            }
        })
        .collect();
    let missing: Vec<&str> = controllers
        .iter()
        .filter(|c| c.version.is_none())
        .map(|c| c.controller.name())
        .collect();
    let readonly: Vec<&str> = controllers
        .iter()
        .filter(|c| c.version.is_some() && !c.writable)
        .map(|c| c.controller.name())
        .collect();
    let describe = controllers
        .iter()
        .map(|c| match (&c.version, &c.hierarchy) {
            (Some(v), Some(path)) => format!(
                "{} on {v:?} at {}{}",
                c.controller.name(),
                path.display(),
                if c.writable { "" } else { " (not writable)" }
            ),
            _ => format!("{} not found", c.controller.name()),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let detail = format!("{:?} layout: {describe}", layout.kind());
    let check = if !missing.is_empty() {
        Check::missing(
            detail,
            format!(
                "make {} available: mount it as cgroup v1, or list it in the v2 root's cgroup.controllers",
                missing.join(", ")
            ),
        )
    } else if !readonly.is_empty() {
        Check::missing(detail, HINT_PRIVILEGE)
    } else {
        Check::ok(detail)
    };
    CgroupProbe {
        layout: layout.kind(),
        controllers,
        check,
    }
}
