//! The sandbox's cgroups: `dynocap/<name>` in each hierarchy that manages cpu, memory or pids
//! (v1, v2 or a hybrid), with the limits applied before any guest process exists, one of them
//! delegated to the guest for its commands (see `delegate`), then the guest moved in, and at
//! the end every process in them (and in the cgroups the guest made below) killed and the
//! directories removed.
//!
//! How the guest's init moves in: into a v1 leaf by itself, writing `0` to the leaf's `tasks`
//! through a file the supervisor opened ([`CgroupSet::self_join_files`]); into a v2 leaf by
//! the supervisor writing its pid to `cgroup.procs` ([`CgroupSet::attach_rest`]). Moving a
//! process by pid (or a whole thread group) write-locks the kernel-wide
//! `cgroup_threadgroup_rwsem`, which waits for an RCU grace period: on a hybrid host, longer
//! than the init takes to build the guest's root beside it. A single
//! thread moving itself (`0` to `tasks`) takes no such lock. v2 has no such file for a
//! process (`cgroup.threads` moves threads only within a threaded subtree).
//!
//! Where the hierarchies are, the `dynocap` parent, the memory table and the bound over all
//! sandboxes are dynocap-host's (the engine sets that bound whichever backend runs); reading
//! a cgroup's members, `cgroup.kill` and killing by pinned pidfd are dynocap-cgroup's, which
//! the guest agent's per-command cgroups use too.

mod delegate;
mod limits;
mod tree;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::unistd::Pid;

use dynocap_host::cgroup::dirs::{enable_controllers, inherit_cpuset, mkdir_ok_if_exists};
pub use dynocap_host::cgroup::{CgroupLayoutKind, CgroupVersion, Controller, PARENT};
pub(crate) use dynocap_host::cgroup::{Hierarchy, Layout};

use crate::error::{JailError, HINT_PRIVILEGE};
use crate::spec::Limits;

/// One of the sandbox's cgroups as the guest sees it (see [`CgroupSet::guest_views`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupView {
    /// The cgroup's directory on the host.
    pub host: PathBuf,
    /// Where it shows, relative to the guest's `/sys/fs/cgroup` (empty: that directory).
    pub guest: PathBuf,
    /// Symlinks to `guest` beside it, one per controller of a co-mounted v1 hierarchy
    /// (`cpu` and `cpuacct` -> `cpu,cpuacct`), as systemd and Docker make them.
    pub aliases: Vec<String>,
}

/// One sandbox cgroup directory in one hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leaf {
    pub version: CgroupVersion,
    pub dir: PathBuf,
}

/// The sandbox's cgroup in every hierarchy involved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CgroupSet {
    leaves: Vec<Leaf>,
    /// Index in `leaves` of the cgroup delegated to the guest for its commands.
    exec: Option<usize>,
    /// The limits last written to every leaf, when this set wrote them.
    applied: std::cell::Cell<Option<Limits>>,
}

impl CgroupSet {
    /// Creates `dynocap/<name>` where cpu, memory and pids are managed and applies `limits`,
    /// then delegates one of the sandbox's cgroups to `guest_root` (the host uid and gid of
    /// the guest's root), in the hierarchy `exec_cgroup` names if it names one. Fails (leaving
    /// nothing behind) if a controller is missing or a limit or the delegation cannot be
    /// written.
    pub fn create(
        layout: &Layout,
        name: &str,
        limits: &Limits,
        guest_root: (u32, u32),
        exec_cgroup: Option<&str>,
    ) -> Result<CgroupSet, JailError> {
        // Group the controllers by the hierarchy managing them.
        let mut plan: Vec<(&Hierarchy, Vec<Controller>)> = Vec::new();
        for controller in Controller::ALL {
            let hierarchy = layout
                .locate(controller)
                .ok_or_else(|| missing(controller))?;
            match plan
                .iter_mut()
                .find(|(h, _)| h.mount_point == hierarchy.mount_point)
            {
                Some((_, list)) => list.push(controller),
                None => plan.push((hierarchy, vec![controller])),
            }
        }
        let mut set = CgroupSet::default();
        let result = (|| {
            for (hierarchy, controllers) in &plan {
                let leaf = create_leaf(hierarchy, controllers, name)?;
                set.leaves.push(leaf.clone());
                for &controller in controllers {
                    apply(&leaf, controller, limits)?;
                }
            }
            set.exec = Some(delegate::delegate(
                layout,
                &mut set.leaves,
                name,
                guest_root,
                exec_cgroup,
            )?);
            Ok(())
        })();
        match result {
            Ok(()) => {
                set.applied.set(Some(*limits));
                Ok(set)
            }
            Err(e) => {
                // Best effort: the original error is the one to report.
                let _ = set.remove();
                Err(e)
            }
        }
    }

    /// The existing `dynocap/<name>` directories in every mounted hierarchy (whatever their
    /// controllers): what a crashed supervisor may have left.
    pub fn existing(layout: &Layout, name: &str) -> CgroupSet {
        let leaves = layout
            .hierarchies
            .iter()
            .map(|h| Leaf {
                version: h.version,
                dir: h.mount_point.join(PARENT).join(name),
            })
            .filter(|leaf| leaf.dir.is_dir())
            .collect();
        CgroupSet {
            leaves,
            exec: None,
            applied: std::cell::Cell::new(None),
        }
    }

    /// The cgroup directories, one per hierarchy.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.leaves.iter().map(|l| l.dir.clone()).collect()
    }

    /// The cgroup delegated to the guest for its commands.
    pub fn exec_dir(&self) -> Option<&Path> {
        self.exec
            .and_then(|i| self.leaves.get(i))
            .map(|leaf| leaf.dir.as_path())
    }

    /// Where each of the sandbox's cgroups shows in the guest's `/sys/fs/cgroup`, as Docker
    /// lays it out, so that runtimes reading their limits there find the sandbox's: a v1
    /// leaf under its hierarchy's directory name (`memory`, `cpu,cpuacct`), the v2 leaf at
    /// `/sys/fs/cgroup` itself when there is no v1 leaf, else under `unified` (systemd's
    /// hybrid name).
    pub fn guest_views(&self) -> Vec<CgroupView> {
        let any_v1 = self.leaves.iter().any(|l| l.version == CgroupVersion::V1);
        self.leaves
            .iter()
            .filter_map(|leaf| {
                let guest = match leaf.version {
                    CgroupVersion::V2 if !any_v1 => PathBuf::new(),
                    CgroupVersion::V2 => PathBuf::from("unified"),
                    // `<hierarchy mount>/dynocap/<name>`: the hierarchy's own name is two up.
                    CgroupVersion::V1 => PathBuf::from(leaf.dir.parent()?.parent()?.file_name()?),
                };
                let name = guest.to_str().unwrap_or_default();
                let aliases = if name.contains(',') {
                    name.split(',').map(str::to_owned).collect()
                } else {
                    Vec::new()
                };
                Some(CgroupView {
                    host: leaf.dir.clone(),
                    guest,
                    aliases,
                })
            })
            .collect()
    }

    /// The `tasks` file of every v1 leaf, open for writing (close-on-exec): a single-threaded
    /// process that writes `0` to each is in those leaves, without the kernel-wide lock a
    /// move by pid takes. Opened by the supervisor, so that the write is checked against its
    /// credentials, not the init's.
    pub fn self_join_files(&self) -> Result<Vec<OwnedFd>, JailError> {
        self.leaves
            .iter()
            .filter(|leaf| leaf.version == CgroupVersion::V1)
            .map(|leaf| {
                let tasks = leaf.dir.join("tasks");
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&tasks)
                    .map(OwnedFd::from)
                    .map_err(|e| {
                        JailError::io("open for the guest init to join", &tasks, e)
                            .hint(HINT_PRIVILEGE)
                    })
            })
            .collect()
    }

    /// Moves process `pid` into every leaf the process does not join by itself (see
    /// [`CgroupSet::self_join_files`]): the v2 ones.
    pub fn attach_rest(&self, pid: Pid) -> Result<(), JailError> {
        for leaf in self
            .leaves
            .iter()
            .filter(|leaf| leaf.version != CgroupVersion::V1)
        {
            let procs = leaf.dir.join("cgroup.procs");
            std::fs::write(&procs, pid.to_string()).map_err(|e| {
                JailError::io(&format!("move process {pid} into"), &procs, e).hint(HINT_PRIVILEGE)
            })?;
        }
        Ok(())
    }

    /// Kills every process in the leaves and in the cgroups below them, and removes them all;
    /// returns what was left behind.
    pub fn remove(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = tree::kill_all(&self.leaves) {
            problems.push(e);
        }
        for leaf in &self.leaves {
            problems.extend(tree::remove(leaf));
        }
        problems
    }
}

fn missing(controller: Controller) -> JailError {
    JailError::LimitUnavailable {
        limit: controller.name(),
        reason: format!(
            "no mounted cgroup hierarchy offers the {0} controller (checked /proc/self/mountinfo); \
             mount it (cgroup v1) or make it available in the v2 root's cgroup.controllers",
            controller.name()
        ),
    }
}

pub(super) fn create_leaf(
    hierarchy: &Hierarchy,
    controllers: &[Controller],
    name: &str,
) -> Result<Leaf, JailError> {
    let parent = hierarchy.mount_point.join(PARENT);
    let dir = parent.join(name);
    mkdir_ok_if_exists(&parent)?;
    match hierarchy.version {
        CgroupVersion::V1 => {
            if hierarchy.has("cpuset") {
                inherit_cpuset(&parent)?;
            }
        }
        CgroupVersion::V2 => {
            // A v2 controller is usable in a cgroup only if every ancestor enables it for its
            // children.
            for cgroup in [&hierarchy.mount_point, &parent] {
                enable_controllers(cgroup, controllers)?;
            }
        }
    }
    std::fs::create_dir(&dir).map_err(|e| {
        let err = JailError::io("create cgroup", &dir, e);
        if dir.exists() {
            err.hint("it is left from a sandbox whose supervisor died; call cleanup_leftovers(name, state_dir)")
        } else {
            err.hint(HINT_PRIVILEGE)
        }
    })?;
    let leaf = Leaf {
        version: hierarchy.version,
        dir,
    };
    if hierarchy.version == CgroupVersion::V1 && hierarchy.has("cpuset") {
        if let Err(e) = inherit_cpuset(&leaf.dir) {
            let _ = std::fs::remove_dir(&leaf.dir);
            return Err(e.into());
        }
    }
    Ok(leaf)
}

impl CgroupSet {
    /// Replaces the limits of a live sandbox (a warm-pool sandbox claimed with its caller's
    /// limits). On v1 a memory limit that grows must raise memory+swap first, which must
    /// never be below it; one that shrinks lowers memory first.
    pub fn update_limits(&self, limits: &Limits) -> Result<(), JailError> {
        // A claim that asks for the pool's own limits (the defaults, most of them) changes
        // nothing: a dozen reads and writes of cgroup files saved on its path.
        if self.applied.get() == Some(*limits) {
            return Ok(());
        }
        // Until every write below is done, what the files hold is not known.
        self.applied.set(None);
        for leaf in &self.leaves {
            for controller in Controller::ALL {
                if !leaf.dir.join(limit_file(leaf.version, controller)).exists() {
                    continue;
                }
                let swap = limits::SwapFacts::probe(leaf.version, &leaf.dir);
                let mut writes = limits::settings(leaf.version, controller, limits, swap)?;
                let current =
                    std::fs::read_to_string(leaf.dir.join(limit_file(leaf.version, controller)))
                        .ok()
                        .and_then(|text| text.trim().parse::<u64>().ok());
                if controller == Controller::Memory
                    && current.is_some_and(|now| limits.memory_bytes > now)
                {
                    writes.reverse();
                }
                for setting in writes {
                    let path = leaf.dir.join(setting.file);
                    std::fs::write(&path, &setting.value).map_err(|e| {
                        JailError::LimitUnavailable {
                            limit: controller.name(),
                            reason: format!(
                                "writing {:?} to {}: {e}",
                                setting.value,
                                path.display()
                            ),
                        }
                    })?;
                }
            }
        }
        self.applied.set(Some(*limits));
        Ok(())
    }
}

/// The file that holds `controller`'s limit in a cgroup of `version`: present only where the
/// controller manages the cgroup.
fn limit_file(version: CgroupVersion, controller: Controller) -> &'static str {
    match (version, controller) {
        (CgroupVersion::V1, Controller::Cpu) => "cpu.cfs_quota_us",
        (CgroupVersion::V2, Controller::Cpu) => "cpu.max",
        (CgroupVersion::V1, Controller::Memory) => "memory.limit_in_bytes",
        (CgroupVersion::V2, Controller::Memory) => "memory.max",
        (_, Controller::Pids) => "pids.max",
    }
}

fn apply(leaf: &Leaf, controller: Controller, limits: &Limits) -> Result<(), JailError> {
    let swap = limits::SwapFacts::probe(leaf.version, &leaf.dir);
    for setting in limits::settings(leaf.version, controller, limits, swap)? {
        let path = leaf.dir.join(setting.file);
        std::fs::write(&path, &setting.value).map_err(|e| JailError::LimitUnavailable {
            limit: controller.name(),
            reason: format!("writing {:?} to {}: {e}", setting.value, path.display()),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(version: CgroupVersion, dir: &str) -> Leaf {
        Leaf {
            version,
            dir: PathBuf::from(dir),
        }
    }

    fn views(set: &CgroupSet) -> Vec<(String, String, Vec<String>)> {
        set.guest_views()
            .into_iter()
            .map(|v| {
                let (host, guest) = (v.host.display(), v.guest.display());
                (host.to_string(), guest.to_string(), v.aliases)
            })
            .collect()
    }

    #[test]
    fn guest_views_follow_dockers_layout() {
        let hybrid = CgroupSet {
            leaves: vec![
                leaf(CgroupVersion::V1, "/sys/fs/cgroup/cpu,cpuacct/dynocap/box"),
                leaf(CgroupVersion::V1, "/sys/fs/cgroup/memory/dynocap/box"),
                leaf(CgroupVersion::V2, "/sys/fs/cgroup/unified/dynocap/box"),
            ],
            exec: Some(2),
            ..CgroupSet::default()
        };
        assert_eq!(
            views(&hybrid),
            [
                (
                    "/sys/fs/cgroup/cpu,cpuacct/dynocap/box",
                    "cpu,cpuacct",
                    &["cpu", "cpuacct"][..]
                ),
                ("/sys/fs/cgroup/memory/dynocap/box", "memory", &[]),
                ("/sys/fs/cgroup/unified/dynocap/box", "unified", &[]),
            ]
            .map(|(h, g, a)| (
                h.to_owned(),
                g.to_owned(),
                a.iter().map(|a| a.to_string()).collect()
            ))
        );
        let unified = CgroupSet {
            leaves: vec![leaf(CgroupVersion::V2, "/sys/fs/cgroup/dynocap/box")],
            exec: Some(0),
            ..CgroupSet::default()
        };
        assert_eq!(
            views(&unified),
            [(
                "/sys/fs/cgroup/dynocap/box".to_owned(),
                String::new(),
                vec![]
            )]
        );
    }

    /// The v2 path cannot run for real on a host whose controllers sit on v1; on a plain
    /// directory tree standing in for cgroupfs it shows which files are written.
    #[test]
    fn v2_flow_on_a_stand_in_hierarchy() {
        let swap_active =
            std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1);
        if swap_active {
            return; // The stand-in has no memory.swap.max: creation would rightly refuse.
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        std::fs::write(root.join("cgroup.subtree_control"), "cpu").expect("root control");
        std::fs::create_dir(root.join(PARENT)).expect("parent");
        std::fs::write(root.join(PARENT).join("cgroup.subtree_control"), "")
            .expect("parent control");
        let layout = Layout {
            hierarchies: vec![Hierarchy {
                version: CgroupVersion::V2,
                mount_point: root.clone(),
                controllers: vec!["cpu".into(), "memory".into(), "pids".into()],
            }],
        };
        let limits = Limits {
            cpu_millis: 2500,
            memory_bytes: 1 << 30,
            pids: 500,
        };
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let set = CgroupSet::create(&layout, "box", &limits, me, None).expect("create");
        let leaf = root.join("dynocap/box");
        assert_eq!(set.paths(), vec![leaf.clone()]);
        // The one v2 leaf also holds the guest's commands, with a bound on what it may create.
        assert_eq!(set.exec_dir(), Some(leaf.as_path()));
        let read = |p: &Path| std::fs::read_to_string(p).expect("read");
        assert_eq!(read(&leaf.join("cpu.max")), "250000 100000");
        assert_eq!(read(&leaf.join("memory.max")), "1073741824");
        assert_eq!(read(&leaf.join("pids.max")), "500");
        assert_eq!(read(&leaf.join("cgroup.max.descendants")), "4096");
        // "cpu" was already enabled at the root, so only memory and pids were written there
        // (the stand-in keeps the last write); the parent had nothing and got all three.
        assert_eq!(read(&root.join("cgroup.subtree_control")), "+pids");
        assert_eq!(read(&root.join("dynocap/cgroup.subtree_control")), "+pids");
        // A second sandbox of the same name is refused with the way out.
        let err = CgroupSet::create(&layout, "box", &limits, me, None).expect_err("exists");
        assert!(err.to_string().contains("cleanup_leftovers"), "{err}");
    }

    #[test]
    fn missing_controller_is_named() {
        let layout = Layout {
            hierarchies: vec![],
        };
        let limits = Limits {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            pids: 10,
        };
        let err =
            CgroupSet::create(&layout, "x", &limits, (0, 0), None).expect_err("no hierarchies");
        assert!(err.to_string().contains("cpu controller"), "{err}");
    }
}
