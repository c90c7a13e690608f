//! [`Jail`]: a running sandbox as the supervisor holds it (the init's pid and pidfd, the
//! channel, the cgroups and layers it owns) and its teardown.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::cache_disk::CacheMount;
use crate::cgroup::CgroupSet;
use crate::disk::Disk;
use crate::error::JailError;
use crate::layers::Layers;
use crate::spec::JailSpec;
use crate::sys;
use crate::uts::Renamer;
use dynocap_host::IdMap;

/// Where a jail's files live: its overlay directories on its disk.
#[derive(Debug)]
pub(crate) struct Storage {
    pub layers: Layers,
    pub disk: Disk,
    /// The project's package cache, mounted for this guest.
    pub cache: Option<CacheMount>,
}

/// A running sandbox. Dropping it without [`Jail::destroy`] tears it down too (best effort,
/// errors ignored).
#[derive(Debug)]
pub struct Jail {
    name: String,
    pid: Pid,
    pidfd: OwnedFd,
    channel: Option<OwnedFd>,
    id_map: IdMap,
    cgroups: CgroupSet,
    layers: Layers,
    /// The disk the writable layers live on.
    disk: Disk,
    /// The project's package cache, mounted for this guest.
    cache: Option<CacheMount>,
    /// How the init ended, once reaped.
    exit: Option<WaitStatus>,
    /// The guest's mount namespace, held from [`Jail::kill`] until the teardown: freeing it
    /// unmounts the guest's whole tree and waits for an RCU grace period, which would
    /// otherwise fall inside the init's exit, and so inside the kill's wait.
    held_mounts: Option<OwnedFd>,
    /// A thread waiting in the guest's UTS namespace to rename it ([`Jail::prepare_rename`]).
    renamer: Option<Renamer>,
    torn_down: bool,
}

impl Jail {
    /// Builds and starts a sandbox; returns once the agent has been exec'd.
    ///
    /// Must be called while the calling process has exactly one thread (before any tokio
    /// runtime or other thread starts): the guest init runs Rust code between clone and exec,
    /// which is only sound in a copy of a single-threaded process. Checked via
    /// `/proc/self/status`; refused otherwise.
    ///
    /// The thread that calls this must outlive the sandbox: the guest is SIGKILLed when it
    /// exits (`PR_SET_PDEATHSIG` follows the creating thread). The caller must not reap
    /// children it did not start (`waitpid(-1)`, `SIGCHLD` set to `SIG_IGN`): [`Jail::destroy`]
    /// reaps the init.
    pub fn spawn(spec: &JailSpec) -> Result<Jail, JailError> {
        crate::spawn::spawn(spec, IdMap::for_current_process())
    }

    /// As [`Jail::spawn`], with the guest's ids mapped by `ids` (e.g. a range of the pool the
    /// caller allocated for this sandbox: [`IdMap::for_current_process_in_range`]). A map the
    /// process cannot write (root mode without host root) fails the spawn.
    pub fn spawn_with_ids(spec: &JailSpec, ids: IdMap) -> Result<Jail, JailError> {
        crate::spawn::spawn(spec, ids)
    }

    pub(crate) fn new(
        spec: &JailSpec,
        pid: Pid,
        pidfd: OwnedFd,
        channel: OwnedFd,
        id_map: IdMap,
        cgroups: CgroupSet,
        Storage {
            layers,
            disk,
            cache,
        }: Storage,
    ) -> Jail {
        Jail {
            name: spec.name.clone(),
            pid,
            pidfd,
            channel: Some(channel),
            id_map,
            cgroups,
            layers,
            disk,
            cache,
            exit: None,
            held_mounts: None,
            renamer: None,
            torn_down: false,
        }
    }

    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Host pid of the guest's PID 1 (the agent).
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The host end of the agent channel (a `SOCK_STREAM` unix socket, close-on-exec; the
    /// guest end is the agent's fd 3). `None` after the first call.
    pub fn take_channel(&mut self) -> Option<OwnedFd> {
        self.channel.take()
    }

    /// A pidfd of the guest init: it becomes readable when the guest dies (the whole pid
    /// namespace dies with its init), for async "guest died" detection.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// How guest ids map to host ids.
    pub fn id_map(&self) -> IdMap {
        self.id_map
    }

    /// The sandbox's cgroup directories, one per hierarchy involved.
    pub fn cgroup_paths(&self) -> Vec<PathBuf> {
        self.cgroups.paths()
    }

    pub(crate) fn cgroup_set(&self) -> &CgroupSet {
        &self.cgroups
    }

    /// Reaps the init if it has exited, without blocking; `Some` once it has (and from then
    /// on), `None` while it runs.
    pub fn try_wait(&mut self) -> Result<Option<WaitStatus>, JailError> {
        if self.exit.is_none() {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {}
                Ok(status) => self.exit = Some(status),
                Err(e) => return Err(JailError::sys(format!("waitpid({})", self.pid), e)),
            }
        }
        Ok(self.exit)
    }

    /// SIGKILLs the init (the whole pid namespace dies with it), reaps it, kills whatever is
    /// left in the cgroups, removes them, unmounts the sandbox's disk and deletes it and the
    /// layers from the state dir. The guest's mounts live only in its mount namespace, which
    /// is gone with it.
    pub fn destroy(mut self) -> Result<(), JailError> {
        let problems = self.teardown(false);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(JailError::Teardown(problems))
        }
    }

    /// Raises the guest's memory limit to `bytes` (never below what it was): for the last
    /// thing a guest does before it goes, saving its work, which may need more memory than the
    /// work itself did. Swap stays off (on v1 the memory+swap limit moves with it).
    pub fn raise_memory_limit(&self, bytes: u64) -> Result<(), JailError> {
        for dir in self.cgroups.paths() {
            // v1: memory+swap must stay at least the memory limit, so it goes up first.
            for file in [
                "memory.memsw.limit_in_bytes",
                "memory.limit_in_bytes",
                "memory.max",
            ] {
                let path = dir.join(file);
                let Ok(current) = std::fs::read_to_string(&path) else {
                    continue;
                };
                let current = current.trim();
                if current == "max" || current.parse::<u64>().is_ok_and(|c| c >= bytes) {
                    continue;
                }
                std::fs::write(&path, bytes.to_string())
                    .map_err(|e| JailError::io("raise the memory limit in", &path, e))?;
            }
        }
        Ok(())
    }

    /// As [`Jail::destroy`], but keeps `upper/`, the guest's files (and the disk image that
    /// holds them), in the state dir: for a sandbox whose work could not be saved, so that a
    /// later jail can boot over it ([`crate::JailSpec::reuse_layers`]). Processes and cgroups
    /// are gone all the same.
    pub fn stop_keeping_layers(mut self) -> Result<(), JailError> {
        let problems = self.teardown(true);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(JailError::Teardown(problems))
        }
    }

    /// Replaces the guest's cpu, memory and pids limits.
    pub fn set_limits(&self, limits: &crate::spec::Limits) -> Result<(), JailError> {
        self.cgroups.update_limits(limits)
    }

    /// Renames the guest's host (its UTS namespace) from outside (see `uts`): through the
    /// thread [`Jail::prepare_rename`] started, if it did, else a thread started for the call.
    pub fn set_hostname(&self, hostname: &str) -> Result<(), JailError> {
        match &self.renamer {
            Some(renamer) => renamer.rename(hostname),
            None => crate::uts::rename_once(self.pid, hostname),
        }
    }

    /// Starts, ahead of a rename the caller expects (a warm-pool sandbox's claim), the thread
    /// that will do it, so that the rename does not wait for a thread to start.
    pub fn prepare_rename(&mut self) -> Result<(), JailError> {
        if self.renamer.is_none() {
            self.renamer = Some(Renamer::start(self.pid)?);
        }
        Ok(())
    }

    /// Kills the guest: its init, and with it every process of its pid namespace. The rest of
    /// the teardown ([`Jail::destroy`]) may follow later; until then the cgroups, disk and
    /// state dir stay.
    pub fn kill(&mut self) -> Result<(), JailError> {
        if self.exit.is_none() && self.held_mounts.is_none() {
            // The init is our unreaped child, so its pid cannot name another process. Without
            // the hold the kill is only slower.
            self.held_mounts = std::fs::File::open(format!("/proc/{}/ns/mnt", self.pid))
                .ok()
                .map(OwnedFd::from);
        }
        let problems = self.kill_init();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(JailError::Teardown(problems))
        }
    }

    fn kill_init(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        self.channel = None;
        if self.exit.is_none() {
            match sys::pidfd_send_signal(self.pidfd.as_fd(), Signal::SIGKILL) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => problems.push(format!("cannot SIGKILL the guest init {}: {e}", self.pid)),
            }
            loop {
                match waitpid(self.pid, None) {
                    Ok(status) => {
                        self.exit = Some(status);
                        break;
                    }
                    Err(Errno::EINTR) => continue,
                    // Reaped by someone else: nothing left to wait for.
                    Err(Errno::ECHILD) => break,
                    Err(e) => {
                        problems.push(format!("cannot reap the guest init {}: {e}", self.pid));
                        break;
                    }
                }
            }
        }
        problems
    }

    fn teardown(&mut self, keep_layers: bool) -> Vec<String> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Vec::new();
        }
        let mut problems = self.kill_init();
        // The guest's mounts go before its disk is unmounted and released.
        self.held_mounts = None;
        if let Some(cache) = self.cache.as_mut() {
            problems.extend(cache.unmount());
        }
        problems.extend(self.cgroups.remove());
        if keep_layers {
            problems.extend(self.layers.remove_scratch());
            problems.extend(self.disk.release(true));
        } else {
            // Unmounted first, the disk's layers go with its image at once; on a plain
            // directory (no disk limit) they are removed one file at a time.
            problems.extend(self.disk.unmount(false));
            problems.extend(self.layers.remove());
            problems.extend(self.disk.release(false));
        }
        problems
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; destroy() is the checked path. A jail dropped
        // without either call (a failed start) is undone like its layers' preparation: a
        // fresh layer goes, a kept one that it booted over stays.
        let keep = !self.layers.is_fresh() || !self.disk.is_fresh();
        let _ = self.teardown(keep);
    }
}
