//! The one sandbox cgroup the guest manages itself. The agent puts every command in a child
//! cgroup of it, which none of the command's processes can leave, so that a timeout or a
//! cancel kills everything the command started, whatever session or process group it moved
//! to.
//!
//! It is delegated the way systemd and runc delegate: the directory and the files that create
//! children and move processes (`cgroup.procs`, `tasks`, `cgroup.threads`,
//! `cgroup.subtree_control`) belong to the guest's root; the limit files stay host root's, so
//! the guest cannot raise its own limits, and whatever it sets on the children it makes is
//! bounded by them. Commands run as another guest user, who can write none of these files.
//! The guest changes the cgroup only through a detached bind mount its agent inherits as a
//! descriptor (see `child`): the guest's file tree shows it read-only (/sys/fs/cgroup, for
//! runtimes reading their limits; see `rootfs`).
//!
//! Which hierarchy, best first (`DYNOCAP_EXEC_CGROUP=v2|freezer|pids` forces one):
//!
//! | hierarchy | how the agent kills a command's cgroup |
//! |---|---|
//! | `freezer`: a v1 freezer (a hybrid host's) | kill until empty, never frozen (a v1 freeze would outlive an agent killed with its supervisor) |
//! | `v2`: the unified one (alone, or beside v1 in a hybrid) | `cgroup.kill` (5.14+), else freeze, kill, thaw |
//! | `pids`: the v1 pids one the limits already use | kill until empty |
//!
//! A v1 freezer comes first where a hybrid host has one because of what each command costs:
//! its first process joins its cgroup between fork and exec. On v1 it writes `0` to `tasks`,
//! which moves only the writer and takes no global lock; v2 has only `cgroup.procs`, which
//! write-locks the kernel's `cgroup_threadgroup_rwsem` and waits for an RCU grace period (on a
//! busy host, most of a short command's latency). Both kill
//! everything a command started. v1 has no cap on descendants like v2's [`MAX_DESCENDANTS`],
//! but the agent makes one cgroup per command and removes it once empty, so the pids limit
//! (every lingering cgroup holds a process) bounds them all the same.
//!
//! A hierarchy that cannot be used (not mounted, or a rootless supervisor may not create
//! cgroups in it) is skipped; the last one always exists when the sandbox has a pids limit on v1.

use std::path::Path;

use super::{create_leaf, Leaf};
use super::{CgroupVersion, Controller, Hierarchy, Layout};
use crate::error::{JailError, HINT_PRIVILEGE};

/// Host setting that forces the hierarchy execs are tracked in.
pub(crate) const ENV: &str = "DYNOCAP_EXEC_CGROUP";

/// Files of the delegated cgroup that become the guest root's, where the hierarchy has them.
const DELEGATED_FILES: &[&str] = &[
    "cgroup.procs",
    "tasks",
    "cgroup.threads",
    "cgroup.subtree_control",
];

/// Cap on the cgroups the guest may create below its own on v2 (one per running command, plus
/// those of commands whose background processes still run): it bounds the kernel memory a
/// misbehaving guest root could pin. v1 has no such cap.
const MAX_DESCENDANTS: u32 = 4096;

/// A hierarchy that can track execs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExecHierarchy {
    V2,
    Freezer,
    Pids,
}

impl ExecHierarchy {
    /// Best first; see the module doc for why a v1 freezer comes before v2.
    const PREFERENCE: [ExecHierarchy; 3] = [
        ExecHierarchy::Freezer,
        ExecHierarchy::V2,
        ExecHierarchy::Pids,
    ];

    fn name(self) -> &'static str {
        match self {
            ExecHierarchy::V2 => "v2",
            ExecHierarchy::Freezer => "freezer",
            ExecHierarchy::Pids => "pids",
        }
    }

    fn locate(self, layout: &Layout) -> Option<&Hierarchy> {
        let v1_with = |controller: &str| {
            layout
                .hierarchies
                .iter()
                .find(|h| h.version == CgroupVersion::V1 && h.has(controller))
        };
        match self {
            ExecHierarchy::V2 => layout
                .hierarchies
                .iter()
                .find(|h| h.version == CgroupVersion::V2),
            ExecHierarchy::Freezer => v1_with("freezer"),
            ExecHierarchy::Pids => v1_with(Controller::Pids.name()),
        }
    }
}

/// The hierarchies to try, best first: all of them, or the one `setting` ([`ENV`]) names.
fn candidates(setting: Option<&str>) -> Result<(Vec<ExecHierarchy>, bool), JailError> {
    match setting.map(str::trim) {
        None | Some("") => Ok((ExecHierarchy::PREFERENCE.to_vec(), false)),
        Some(value) => ExecHierarchy::PREFERENCE
            .into_iter()
            .find(|h| h.name() == value)
            .map(|h| (vec![h], true))
            .ok_or_else(|| {
                JailError::InvalidSpec(format!(
                    "{ENV}={value:?} is not a cgroup hierarchy for execs; use v2, freezer or \
                     pids, or unset it to take the best one available"
                ))
            }),
    }
}

/// Creates (or picks among `leaves`) the sandbox's cgroup in the best usable hierarchy and
/// delegates it to `owner` (the host uid and gid of the guest's root); `setting` forces a
/// hierarchy by name ([`ENV`]). Returns its index in
/// `leaves`; a leaf it created is added there, so the caller removes it with the rest.
pub(crate) fn delegate(
    layout: &Layout,
    leaves: &mut Vec<Leaf>,
    name: &str,
    owner: (u32, u32),
    setting: Option<&str>,
) -> Result<usize, JailError> {
    let (candidates, forced) = candidates(setting)?;
    let mut skipped = Vec::new();
    for candidate in candidates {
        let Some(hierarchy) = candidate.locate(layout) else {
            skipped.push(format!("{}: not mounted", candidate.name()));
            continue;
        };
        match delegate_in(hierarchy, leaves, name, owner) {
            Ok(index) => return Ok(index),
            Err(e) if forced => return Err(e),
            Err(e) => skipped.push(format!("{}: {e}", candidate.name())),
        }
    }
    Err(JailError::LimitUnavailable {
        limit: "per-command cgroup",
        reason: format!(
            "no cgroup hierarchy can hold the sandbox's commands ({}); {HINT_PRIVILEGE}",
            skipped.join("; ")
        ),
    })
}

fn delegate_in(
    hierarchy: &Hierarchy,
    leaves: &mut Vec<Leaf>,
    name: &str,
    owner: (u32, u32),
) -> Result<usize, JailError> {
    let dir = hierarchy.mount_point.join(super::PARENT).join(name);
    let index = match leaves.iter().position(|leaf| leaf.dir == dir) {
        Some(index) => index,
        None => {
            leaves.push(create_leaf(hierarchy, &[], name)?);
            leaves.len() - 1
        }
    };
    let leaf = &leaves[index];
    match leaf.version {
        CgroupVersion::V2 => write(&leaf.dir, "cgroup.max.descendants", MAX_DESCENDANTS)?,
        // A new v1 cpuset child has no CPUs until told; let the guest's inherit its parent's.
        CgroupVersion::V1 if hierarchy.has("cpuset") => {
            write(&leaf.dir, "cgroup.clone_children", 1)?;
        }
        CgroupVersion::V1 => {}
    }
    chown(&leaf.dir, owner)?;
    for file in DELEGATED_FILES {
        let path = leaf.dir.join(file);
        if path.exists() {
            chown(&path, owner)?;
        }
    }
    Ok(index)
}

fn write(dir: &Path, file: &str, value: impl ToString) -> Result<(), JailError> {
    let path = dir.join(file);
    let value = value.to_string();
    std::fs::write(&path, &value)
        .map_err(|e| JailError::io(&format!("write {value} to"), &path, e).hint(HINT_PRIVILEGE))
}

fn chown(path: &Path, (uid, gid): (u32, u32)) -> Result<(), JailError> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| {
        JailError::io(&format!("give {uid}:{gid} (the guest's root)"), path, e).hint(HINT_PRIVILEGE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_forces_one_hierarchy_or_is_refused() {
        let (all, forced) = candidates(None).expect("default");
        assert_eq!(all, ExecHierarchy::PREFERENCE.to_vec());
        assert!(!forced);
        assert_eq!(candidates(Some("")).expect("empty").0.len(), 3);
        let (one, forced) = candidates(Some("freezer")).expect("freezer");
        assert_eq!((one, forced), (vec![ExecHierarchy::Freezer], true));
        let err = candidates(Some("memory")).expect_err("not a choice");
        assert!(err.to_string().contains("use v2, freezer or pids"), "{err}");
    }

    #[test]
    fn hierarchies_are_located_by_version_and_controller() {
        let h = |version, mount: &str, controllers: &[&str]| Hierarchy {
            version,
            mount_point: mount.into(),
            controllers: controllers.iter().map(|c| (*c).to_owned()).collect(),
        };
        let hybrid = Layout {
            hierarchies: vec![
                h(CgroupVersion::V1, "/cg/pids", &["pids"]),
                h(CgroupVersion::V1, "/cg/freezer", &["freezer"]),
                h(CgroupVersion::V2, "/cg/unified", &[]),
            ],
        };
        let at = |e: ExecHierarchy, layout: &Layout| {
            e.locate(layout)
                .map(|h| h.mount_point.display().to_string())
        };
        assert_eq!(
            at(ExecHierarchy::V2, &hybrid).as_deref(),
            Some("/cg/unified")
        );
        assert_eq!(
            at(ExecHierarchy::Freezer, &hybrid).as_deref(),
            Some("/cg/freezer")
        );
        assert_eq!(
            at(ExecHierarchy::Pids, &hybrid).as_deref(),
            Some("/cg/pids")
        );
        let pure_v2 = Layout {
            hierarchies: vec![h(CgroupVersion::V2, "/cg", &["cpu", "memory", "pids"])],
        };
        assert_eq!(at(ExecHierarchy::V2, &pure_v2).as_deref(), Some("/cg"));
        // The pids controller of a v2 hierarchy is the v2 candidate's business.
        assert_eq!(at(ExecHierarchy::Pids, &pure_v2), None);
        assert_eq!(at(ExecHierarchy::Freezer, &pure_v2), None);
    }
}
