//! A sandbox cgroup together with the cgroups the guest created below it (its agent puts every
//! command in one): listing them, killing every process in them, removing them bottom-up.
//!
//! The tree below a delegated cgroup is guest-made, so it is walked without recursion and
//! with a bound on its size; cgroupfs holds only directories and kernel files, never
//! symlinks, so nothing in it can lead the walk elsewhere.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dynocap_cgroup::{signal_pinned, CgroupDir, Unpinned};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::{CgroupVersion, Leaf};

/// How long to keep killing before giving up on a cgroup that will not empty.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `rmdir` may keep answering EBUSY (exiting tasks still being torn down).
const RMDIR_TIMEOUT: Duration = Duration::from_secs(5);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// More cgroups than a sandbox can make (v2 caps it far lower with `cgroup.max.descendants`;
/// v1 has no such cap): past this the walk stops instead of running away.
const MAX_TREE: usize = 100_000;

/// `top` and every cgroup below it, each parent before its children.
fn walk(top: &Path) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    if !top.is_dir() {
        return Ok(found);
    }
    found.push(top.to_path_buf());
    let mut next = 0;
    while let Some(dir) = found.get(next).cloned() {
        next += 1;
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // Removed meanwhile (by the guest, or its last process exited and we raced).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot list cgroup {}: {e}", dir.display())),
        };
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list cgroup {}: {e}", dir.display()))?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if found.len() >= MAX_TREE {
                    return Err(format!(
                        "cgroup {} has more than {MAX_TREE} cgroups below it",
                        top.display()
                    ));
                }
                found.push(entry.path());
            }
        }
    }
    Ok(found)
}

/// Pids listed in `dir/cgroup.procs` (none if the cgroup is gone).
fn procs(dir: &Path) -> Result<Vec<Pid>, String> {
    match CgroupDir::open(dir).and_then(|cgroup| cgroup.pids("")) {
        Ok(pids) => Ok(pids),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("cannot read {}/cgroup.procs: {e}", dir.display())),
    }
}

/// SIGKILLs every process in the leaves and the cgroups below them until none is left.
///
/// All of a sandbox's leaves are killed in one loop because a process is in one cgroup of
/// every hierarchy: a command left frozen in the v1 freezer hierarchy (the guest's agent
/// freezes a command's cgroup to kill it, and an agent killed between its freeze and its thaw
/// leaves it frozen) keeps its SIGKILL pending until that freezer cgroup is thawed, so
/// waiting for the cpu or memory leaf to empty before looking at the freezer would never end.
///
/// A pid read from `cgroup.procs` may be reused by an unrelated process before we signal it,
/// so each one is first pinned with a pidfd and only signalled through it if, after pinning,
/// the pid is still listed in the cgroup. (If the pinned process died and its pid was reused
/// inside the cgroup, the pidfd still names the dead process and the signal goes nowhere.)
/// On v2 with `cgroup.kill` (Linux 5.14) the kernel does all of this atomically for the whole
/// subtree; the loop then only waits for it.
pub(super) fn kill_all(leaves: &[Leaf]) -> Result<(), String> {
    for leaf in leaves.iter().filter(|l| l.version == CgroupVersion::V2) {
        let kill = leaf.dir.join("cgroup.kill");
        let Ok(cgroup) = CgroupDir::open(&leaf.dir) else {
            continue; // gone already: nothing in it to kill
        };
        if cgroup.has("cgroup.kill") {
            cgroup
                .write("cgroup.kill", "1")
                .map_err(|e| format!("cannot write 1 to {}: {e}", kill.display()))?;
        }
    }
    let deadline = Instant::now() + KILL_TIMEOUT;
    loop {
        let mut members = Vec::new();
        for leaf in leaves {
            let populated = populated(leaf)?;
            if !populated.is_empty() {
                members.push((leaf, populated));
            }
        }
        if members.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let left: Vec<String> = members
                .iter()
                .map(|(leaf, populated)| {
                    let pids: Vec<Pid> = populated.iter().flat_map(|(_, p)| p.clone()).collect();
                    format!(
                        "processes {pids:?} are still in {} after {}s of SIGKILL",
                        leaf.dir.display(),
                        KILL_TIMEOUT.as_secs()
                    )
                })
                .collect();
            return Err(left.join("; "));
        }
        for (dir, pids) in members.iter().flat_map(|(_, populated)| populated) {
            for pid in pids {
                kill_pinned(dir, *pid)?;
            }
        }
        // The frozen freezer cgroup holds the same processes, so it is among the members.
        for (dir, _) in members.iter().flat_map(|(_, populated)| populated) {
            thaw(dir)?;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The cgroups of a leaf's tree that hold processes, each with its pids.
type Populated = Vec<(PathBuf, Vec<Pid>)>;

fn populated(leaf: &Leaf) -> Result<Populated, String> {
    let mut populated = Vec::new();
    for dir in walk(&leaf.dir)? {
        let pids = procs(&dir)?;
        if !pids.is_empty() {
            populated.push((dir, pids));
        }
    }
    Ok(populated)
}

/// Thaws `dir` if it is a frozen (or freezing) v1 freezer cgroup; elsewhere does nothing.
fn thaw(dir: &Path) -> Result<(), String> {
    let state = dir.join("freezer.state");
    match std::fs::read_to_string(&state) {
        Ok(now) if now.trim() == "THAWED" => Ok(()),
        Ok(_) => std::fs::write(&state, "THAWED")
            .map_err(|e| format!("cannot thaw {}: {e}", dir.display())),
        // Not a v1 freezer cgroup (or the root one, which has no state), or gone meanwhile.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot read {}: {e}", state.display())),
    }
}

/// SIGKILLs `pid` if, once pinned, it is still in `dir`. One that cannot be pinned is gone,
/// or is met again in the next round.
fn kill_pinned(dir: &Path, pid: Pid) -> Result<(), String> {
    signal_pinned(
        &[pid],
        Signal::SIGKILL,
        Unpinned::Skip,
        || procs(dir),
        |pid, e| format!("cannot kill process {pid} in {}: {e}", dir.display()),
    )
}

/// Removes the leaf and every cgroup below it, children first. Their processes must be gone.
pub(super) fn remove(leaf: &Leaf) -> Vec<String> {
    let dirs = match walk(&leaf.dir) {
        Ok(dirs) => dirs,
        Err(e) => return vec![e],
    };
    dirs.iter()
        .rev()
        .filter_map(|dir| rmdir_retrying(dir).err())
        .collect()
}

fn rmdir_retrying(dir: &Path) -> Result<(), String> {
    let deadline = Instant::now() + RMDIR_TIMEOUT;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(POLL_INTERVAL);
            }
            Err(e) => return Err(format!("cannot remove cgroup {}: {e}", dir.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn walk_lists_parents_before_children() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let top = tmp.path().join("box");
        for dir in ["exec-1/a", "exec-2"] {
            std::fs::create_dir_all(top.join(dir)).expect("mkdir");
        }
        std::fs::write(top.join("cgroup.procs"), "").expect("file");
        let found = walk(&top).expect("walk");
        assert_eq!(found.first(), Some(&top));
        assert_eq!(found.len(), 4, "{found:?}");
        let at = |p: &str| found.iter().position(|f| f == &top.join(p)).expect(p);
        assert!(at("exec-1") < at("exec-1/a"));
        assert!(walk(&tmp.path().join("gone")).expect("walk").is_empty());
    }

    /// A v1 hierarchy of `controller` where this machine has one and we may make cgroups in it.
    fn v1_root(controller: &str) -> Option<PathBuf> {
        let root = PathBuf::from("/sys/fs/cgroup").join(controller);
        (nix::unistd::geteuid().is_root() && root.join("tasks").exists()).then_some(root)
    }

    /// A process frozen in the freezer hierarchy is also in the sandbox's leaf of every other
    /// hierarchy; the set is killed whole, whichever leaf comes first.
    #[test]
    fn processes_left_frozen_in_a_v1_freezer_are_killed_from_any_leaf_first() {
        let (Some(freezer), Some(pids)) = (v1_root("freezer"), v1_root("pids")) else {
            eprintln!(
                "skipped: needs root and v1 freezer and pids hierarchies (a hybrid cgroup host)"
            );
            return;
        };
        let name = format!("dynocap-tree-test-{}", std::process::id());
        let (frozen_top, other_top) = (freezer.join(&name), pids.join(&name));
        let command = frozen_top.join("exec-1");
        std::fs::create_dir_all(&command).expect("mkdir in the freezer hierarchy");
        std::fs::create_dir_all(&other_top).expect("mkdir in the pids hierarchy");
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep");
        std::fs::write(other_top.join("cgroup.procs"), child.id().to_string()).expect("join");
        std::fs::write(command.join("cgroup.procs"), child.id().to_string()).expect("join");
        // As an agent killed between its freeze and its thaw leaves a command.
        std::fs::write(command.join("freezer.state"), "FROZEN").expect("freeze");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !std::fs::read_to_string(command.join("freezer.state"))
            .is_ok_and(|s| s.trim() == "FROZEN")
        {
            assert!(Instant::now() < deadline, "the cgroup never froze");
            std::thread::sleep(POLL_INTERVAL);
        }
        // The pids leaf first, as a set lists cpu and memory before the delegated freezer.
        let leaves = [other_top.clone(), frozen_top.clone()].map(|dir| Leaf {
            version: CgroupVersion::V1,
            dir,
        });
        let killed = kill_all(&leaves);
        // Let the child go whatever happened, or a failed kill would hang the test on it.
        let _ = std::fs::write(command.join("freezer.state"), "THAWED");
        let _ = child.kill();
        let status = child.wait().expect("reap sleep");
        let removed: Vec<String> = leaves.iter().flat_map(remove).collect();
        assert_eq!(killed, Ok(()));
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(removed.is_empty(), "{removed:?}");
        assert!(!frozen_top.exists() && !other_top.exists());
    }
}
