//! A sandbox cgroup together with the cgroups the guest created below it (its agent puts every
//! command in one): listing them, killing every process in them, removing them bottom-up.
//!
//! The tree below a delegated cgroup is guest-made, so it is walked without recursion and
//! with a bound on its size; cgroupfs holds only directories and kernel files, never
//! symlinks, so nothing in it can lead the walk elsewhere.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::{CgroupVersion, Leaf};
use crate::sys;

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
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(text) => Ok(text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .map(Pid::from_raw)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("cannot read {}/cgroup.procs: {e}", dir.display())),
    }
}

/// SIGKILLs every process in the leaf and the cgroups below it until none is left.
///
/// A pid read from `cgroup.procs` may be reused by an unrelated process before we signal it,
/// so each one is first pinned with a pidfd and only signalled through it if, after pinning,
/// the pid is still listed in the cgroup. (If the pinned process died and its pid was reused
/// inside the cgroup, the pidfd still names the dead process and the signal goes nowhere.)
/// On v2 with `cgroup.kill` (Linux 5.14) the kernel does all of this atomically for the whole
/// subtree; the loop then only waits for it.
pub(super) fn kill_all(leaf: &Leaf) -> Result<(), String> {
    if leaf.version == CgroupVersion::V2 {
        let kill = leaf.dir.join("cgroup.kill");
        if kill.exists() {
            std::fs::write(&kill, "1")
                .map_err(|e| format!("cannot write 1 to {}: {e}", kill.display()))?;
        }
    }
    let deadline = Instant::now() + KILL_TIMEOUT;
    loop {
        let mut members = Vec::new();
        for dir in walk(&leaf.dir)? {
            let pids = procs(&dir)?;
            if !pids.is_empty() {
                members.push((dir, pids));
            }
        }
        if members.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let pids: Vec<Pid> = members.into_iter().flat_map(|(_, p)| p).collect();
            return Err(format!(
                "processes {pids:?} are still in {} after {}s of SIGKILL",
                leaf.dir.display(),
                KILL_TIMEOUT.as_secs()
            ));
        }
        for (dir, pids) in &members {
            for pid in pids {
                kill_pinned(dir, *pid)?;
            }
        }
        // A task in a frozen v1 freezer keeps its SIGKILL pending until it is thawed: the
        // guest's agent freezes a command's cgroup to kill it, and an agent killed between
        // its freeze and its thaw (its supervisor killed mid-command) leaves it frozen.
        for (dir, _) in &members {
            thaw(dir)?;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
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

fn kill_pinned(dir: &Path, pid: Pid) -> Result<(), String> {
    let Ok(pidfd) = sys::pidfd_open(pid) else {
        return Ok(()); // already gone
    };
    if procs(dir)?.contains(&pid) {
        match sys::pidfd_send_signal(std::os::fd::AsFd::as_fd(&pidfd), Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => {
                return Err(format!(
                    "cannot kill process {pid} in {}: {e}",
                    dir.display()
                ))
            }
        }
    }
    Ok(())
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

    /// A v1 freezer hierarchy where this machine has one and we may make cgroups in it.
    fn freezer_root() -> Option<PathBuf> {
        let root = PathBuf::from("/sys/fs/cgroup/freezer");
        (nix::unistd::geteuid().is_root() && root.join("tasks").exists()).then_some(root)
    }

    #[test]
    fn processes_left_frozen_in_a_v1_freezer_are_killed() {
        let Some(root) = freezer_root() else {
            eprintln!("skipped: needs root and a v1 freezer hierarchy (a hybrid cgroup host)");
            return;
        };
        let top = root.join(format!("dynocap-tree-test-{}", std::process::id()));
        let command = top.join("exec-1");
        std::fs::create_dir_all(&command).expect("mkdir in the freezer hierarchy");
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep");
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
        let leaf = Leaf {
            version: CgroupVersion::V1,
            dir: top.clone(),
        };
        let killed = kill_all(&leaf);
        // Let the child go whatever happened, or a failed kill would hang the test on it.
        let _ = std::fs::write(command.join("freezer.state"), "THAWED");
        let _ = child.kill();
        let status = child.wait().expect("reap sleep");
        let removed = remove(&leaf);
        assert_eq!(killed, Ok(()));
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(removed.is_empty(), "{removed:?}");
        assert!(!top.exists());
    }
}
