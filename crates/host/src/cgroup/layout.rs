//! Where each cgroup controller lives on this machine: v1 hierarchies, the v2 unified
//! hierarchy, or a hybrid of both, as `/proc/self/mountinfo` says (never assumed).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::mountinfo::{self, MountEntry};
use crate::error::HostError;

/// A controller the jail sets limits with (and the memory bound over all sandboxes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Controller {
    /// CPU bandwidth (`cpu.cfs_quota_us` on v1, `cpu.max` on v2).
    Cpu,
    /// Memory (`memory.limit_in_bytes` on v1, `memory.max` on v2).
    Memory,
    /// Number of tasks (`pids.max`).
    Pids,
}

impl Controller {
    /// Every controller a jail needs.
    pub const ALL: [Controller; 3] = [Controller::Cpu, Controller::Memory, Controller::Pids];

    /// The kernel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
        }
    }
}

/// cgroup version of a hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies.
    V1,
    /// The unified hierarchy.
    V2,
}

/// Overall cgroup setup of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupLayoutKind {
    /// Only v1 hierarchies are mounted.
    V1,
    /// Only the v2 unified hierarchy is mounted.
    V2,
    /// Both (systemd's "hybrid": controllers on v1, an unified hierarchy beside them).
    Hybrid,
    /// No cgroup filesystem is mounted.
    None,
}

/// One mounted hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub version: CgroupVersion,
    pub mount_point: PathBuf,
    /// v1: controllers bound to it (from the mount's super options); v2: controllers the
    /// root's `cgroup.controllers` lists.
    pub controllers: Vec<String>,
}

impl Hierarchy {
    pub fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

/// All mounted cgroup hierarchies: v1 ones first, then the v2 one if mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub hierarchies: Vec<Hierarchy>,
}

/// Controller names the kernel can bind to a v1 hierarchy (named hierarchies such as
/// `name=systemd` have none).
const V1_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

impl Layout {
    /// Reads this process's mount table and the v2 root's `cgroup.controllers`.
    pub fn discover() -> Result<Layout, HostError> {
        let mounts = mountinfo::read_self()?;
        Ok(Layout::from_mounts(&mounts, |dir| {
            std::fs::read_to_string(dir.join("cgroup.controllers")).ok()
        }))
    }

    /// Builds the layout from mount entries; `v2_controllers` reads a v2 mount's
    /// `cgroup.controllers`.
    pub(crate) fn from_mounts(
        mounts: &[MountEntry],
        v2_controllers: impl Fn(&Path) -> Option<String>,
    ) -> Layout {
        // Prefer mounts of a hierarchy's root over bind mounts of a subtree.
        let mut ordered: Vec<&MountEntry> = mounts.iter().collect();
        ordered.sort_by_key(|m| m.root != Path::new("/"));

        let mut hierarchies = Vec::new();
        let mut seen_v1 = HashSet::new();
        for mount in ordered.iter().filter(|m| m.fs_type == "cgroup") {
            let controllers: Vec<String> = mount
                .super_options
                .split(',')
                .filter(|o| V1_CONTROLLERS.contains(o) || o.starts_with("name="))
                .map(str::to_owned)
                .collect();
            // The same hierarchy mounted twice carries the same option set.
            if seen_v1.insert(controllers.clone()) {
                hierarchies.push(Hierarchy {
                    version: CgroupVersion::V1,
                    mount_point: mount.mount_point.clone(),
                    controllers: controllers
                        .into_iter()
                        .filter(|c| !c.starts_with("name="))
                        .collect(),
                });
            }
        }
        if let Some(mount) = ordered.iter().find(|m| m.fs_type == "cgroup2") {
            let controllers = v2_controllers(&mount.mount_point).unwrap_or_default();
            hierarchies.push(Hierarchy {
                version: CgroupVersion::V2,
                mount_point: mount.mount_point.clone(),
                controllers: controllers.split_whitespace().map(str::to_owned).collect(),
            });
        }
        Layout { hierarchies }
    }

    /// The hierarchy that manages `controller`: the v1 hierarchy it is bound to, else the v2
    /// hierarchy if it offers it. (A controller is active in one hierarchy at a time.)
    pub fn locate(&self, controller: Controller) -> Option<&Hierarchy> {
        let name = controller.name();
        self.hierarchies
            .iter()
            .find(|h| h.version == CgroupVersion::V1 && h.has(name))
            .or_else(|| {
                self.hierarchies
                    .iter()
                    .find(|h| h.version == CgroupVersion::V2 && h.has(name))
            })
    }

    /// V1, V2, hybrid or none.
    pub fn kind(&self) -> CgroupLayoutKind {
        let v1 = self
            .hierarchies
            .iter()
            .any(|h| h.version == CgroupVersion::V1);
        let v2 = self
            .hierarchies
            .iter()
            .any(|h| h.version == CgroupVersion::V2);
        match (v1, v2) {
            (true, true) => CgroupLayoutKind::Hybrid,
            (true, false) => CgroupLayoutKind::V1,
            (false, true) => CgroupLayoutKind::V2,
            (false, false) => CgroupLayoutKind::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::mountinfo::parse;

    const HYBRID: &[u8] = b"\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
99 23 0:32 /sub /mnt/membind rw,relatime - cgroup cgroup rw,memory
";

    #[test]
    fn hybrid_with_controllers_on_v1() {
        let layout = Layout::from_mounts(&parse(HYBRID), |_| Some(String::new()));
        assert_eq!(layout.kind(), CgroupLayoutKind::Hybrid);
        let cpu = layout.locate(Controller::Cpu).expect("cpu");
        assert_eq!(cpu.version, CgroupVersion::V1);
        assert_eq!(cpu.mount_point, Path::new("/sys/fs/cgroup/cpu"));
        // The root mount wins over the bind of a subtree.
        let memory = layout.locate(Controller::Memory).expect("memory");
        assert_eq!(memory.mount_point, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(
            layout
                .hierarchies
                .iter()
                .filter(|h| h.has("memory"))
                .count(),
            1
        );
        assert_eq!(
            layout
                .locate(Controller::Pids)
                .map(|h| h.mount_point.clone()),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
    }

    #[test]
    fn pure_v2() {
        let text = b"30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let layout = Layout::from_mounts(&parse(text), |dir| {
            assert_eq!(dir, Path::new("/sys/fs/cgroup"));
            Some("cpuset cpu io memory pids\n".to_owned())
        });
        assert_eq!(layout.kind(), CgroupLayoutKind::V2);
        for controller in Controller::ALL {
            let h = layout.locate(controller).expect("located");
            assert_eq!(h.version, CgroupVersion::V2);
        }
    }

    #[test]
    fn comounted_v1_and_missing_controller() {
        let text = b"32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let layout = Layout::from_mounts(&parse(text), |_| None);
        assert_eq!(layout.kind(), CgroupLayoutKind::V1);
        let cpu = layout.locate(Controller::Cpu).expect("cpu");
        assert_eq!(
            cpu.controllers,
            vec!["cpu".to_owned(), "cpuacct".to_owned()]
        );
        assert!(layout.locate(Controller::Memory).is_none());
    }

    #[test]
    fn nothing_mounted() {
        let layout = Layout::from_mounts(&[], |_| None);
        assert_eq!(layout.kind(), CgroupLayoutKind::None);
        assert!(layout.locate(Controller::Pids).is_none());
    }
}
