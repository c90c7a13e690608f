//! The memory bound over all sandboxes together: the `dynocap` parent cgroup of the memory
//! hierarchy holds every sandbox's cgroup, so its limit bounds what they use in all, while
//! each sandbox's own limit bounds that sandbox. The sum of the sandboxes' own limits may
//! exceed the parent's (they overcommit): idle sandboxes use a few MB of the limit they may
//! grow to, and the kernel reclaims, then OOM-kills within the parent, only when what they
//! really use together reaches it.

use super::dirs::{enable_controllers, inherit_cpuset, mkdir_ok_if_exists, PARENT};
use super::layout::{CgroupVersion, Controller, Layout};
use super::memory::{self as limits, SwapFacts};
use crate::error::HostError;

/// What [`bound_all_sandboxes_memory`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedBound {
    /// The parent's limit is what was asked for.
    Applied,
    /// Not set, and why: this process may not write the parent's limit (an unprivileged user
    /// given delegated `dynocap` parents, whose delegator sets the bound), or no mounted
    /// hierarchy offers the memory controller (where no jail can start either).
    NotApplied(String),
}

/// Sets the memory limit of the `dynocap` parent cgroup, which every sandbox's cgroup is
/// under, to `bytes` (no swap), making the parent if there is none yet. Lowering it below what
/// the sandboxes use now makes the kernel reclaim first; where it cannot (v1), the write is
/// refused and so is this call, naming what is in use.
pub fn bound_all_sandboxes_memory(bytes: u64) -> Result<SharedBound, HostError> {
    let layout = Layout::discover()?;
    let Some(hierarchy) = layout.locate(Controller::Memory) else {
        return Ok(SharedBound::NotApplied(
            "no mounted cgroup hierarchy offers the memory controller (checked \
             /proc/self/mountinfo)"
                .to_owned(),
        ));
    };
    let parent = hierarchy.mount_point.join(PARENT);
    if let Err(e) = mkdir_ok_if_exists(&parent) {
        return not_permitted_or(e);
    }
    match hierarchy.version {
        CgroupVersion::V1 if hierarchy.has("cpuset") => inherit_cpuset(&parent)?,
        CgroupVersion::V1 => {}
        CgroupVersion::V2 => enable_controllers(&hierarchy.mount_point, &[Controller::Memory])?,
    }
    let swap = SwapFacts::probe(hierarchy.version, &parent);
    let mut writes = limits::memory_settings(hierarchy.version, bytes, swap)?;
    // Every start asks for the bound and the ceiling rarely changes: reading what is in force
    // costs less than writing it again, which has the kernel resize the limit.
    let in_force = |setting: &limits::Setting| {
        std::fs::read_to_string(parent.join(setting.file))
            .is_ok_and(|text| text.trim() == setting.value.trim())
    };
    if writes.iter().all(in_force) {
        return Ok(SharedBound::Applied);
    }
    let limit_file = writes[0].file;
    let current = std::fs::read_to_string(parent.join(limit_file))
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    // v1 refuses memory+swap below memory: a limit that grows raises memory+swap first.
    if current.is_some_and(|now| bytes > now) {
        writes.reverse();
    }
    for setting in writes {
        let path = parent.join(setting.file);
        match std::fs::write(&path, &setting.value) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                let usage_file = match hierarchy.version {
                    CgroupVersion::V1 => "memory.usage_in_bytes",
                    CgroupVersion::V2 => "memory.current",
                };
                let used = std::fs::read_to_string(parent.join(usage_file))
                    .map(|t| format!("{} MB", t.trim().parse::<u64>().unwrap_or(0) >> 20))
                    .unwrap_or_else(|_| "more".to_owned());
                return Err(HostError::LimitUnavailable {
                    limit: "memory",
                    reason: format!(
                        "the live sandboxes use {used}, more than the {} MB all of them may \
                         use together, and the kernel could not reclaim enough; destroy a \
                         sandbox, or raise the host's memory ceiling",
                        bytes >> 20
                    ),
                });
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::PermissionDenied) => {
                return Ok(SharedBound::NotApplied(format!(
                    "cannot write {}: {e}",
                    path.display()
                )));
            }
            Err(e) => {
                return Err(HostError::LimitUnavailable {
                    limit: "memory",
                    reason: format!("writing {:?} to {}: {e}", setting.value, path.display()),
                })
            }
        }
    }
    Ok(SharedBound::Applied)
}

fn not_permitted_or(e: HostError) -> Result<SharedBound, HostError> {
    if e.is_permission_denied() {
        Ok(SharedBound::NotApplied(e.to_string()))
    } else {
        Err(e)
    }
}
