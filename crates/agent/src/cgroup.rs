//! One cgroup per command, which none of its processes can leave, so that a timeout or a
//! cancel stops everything the command started: also what moved to a new session or process
//! group (`setsid`, daemons, `set -m` job control), which a process-group kill misses.
//!
//! The jail hands the agent a handle on the sandbox cgroup delegated to it (`--cgroup-fd`).
//! Each command gets a child `exec-<n>` of it, joined by the command's first process before
//! it becomes the sandbox user; that user can write no cgroup file (they belong to the guest's
//! root) and sees the cgroup filesystems only through read-only mounts (/sys/fs/cgroup), so
//! it cannot move out. How a cgroup is killed depends
//! on what the hierarchy offers, and is repeated until `cgroup.procs` is empty:
//!
//! - v2 with `cgroup.kill` (Linux 5.14): the kernel kills every member atomically;
//! - v2 without it: freeze (`cgroup.freeze`), SIGKILL each member, thaw;
//! - any v1 hierarchy (a hybrid host's freezer or pids): SIGKILL each member, round after
//!   round. A v1 freezer is never frozen: a task frozen there ignores even SIGKILL until
//!   someone thaws it, so a freeze taken by an agent that then died (its supervisor
//!   SIGKILLed, which kills the agent at any instant) would keep the command's processes,
//!   and with them the guest's pid namespace, alive until the host's next clean-up. A v2
//!   frozen task still dies of SIGKILL, so a v2 freeze cannot outlive the guest.
//!
//! A command's first process joins by writing `0` to a file of its cgroup, between fork and
//! exec. On v2 that is `cgroup.procs`. On v1 it is `tasks`: `cgroup.procs` moves the writer's
//! whole thread group, for which the kernel write-locks the global `cgroup_threadgroup_rwsem`
//! and so waits for an RCU grace period (10-15 ms on a busy host, most of a short command's
//! latency); `tasks` moves the writing thread only, which, being the caller itself, needs no
//! such lock. The writer is a freshly forked child, single-threaded, so it moves the whole
//! process either way. (v2 has no such file for a domain cgroup: `cgroup.threads` refuses to
//! move a thread out of its domain.)
//!
//! A frozen cgroup cannot fork, so nothing escapes between reading the members and killing
//! them. Without a freeze, a process forked between the read and the kill is in the cgroup
//! (a fork stays in its parent's) and dies in the next round; the sandbox's pids limit
//! bounds how many there can be. A command that ends on its own may leave processes running (a dev server started
//! with `&`): they keep running, and its cgroup lingers until they are gone; lingering cgroups
//! that emptied are removed before each new one is made and whenever a command ends.
//!
//! The cgroup directory handle and the pid-reuse-safe signalling are dynocap-cgroup's, shared
//! with the jail's teardown; which kill method, the rounds and the waits between them (on the
//! agent's runtime) are this module's.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dynocap_cgroup::{signal_pinned, CgroupDir, Removal, Unpinned, Version};
use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// Pause between kill rounds, and between looks at a cgroup being frozen.
const RETRY: Duration = Duration::from_millis(10);
/// Longest wait for a cgroup to freeze; the round kills what it can after that anyway.
const FREEZE_WAIT: Duration = Duration::from_secs(1);
/// Longest a kill keeps going before giving up on a cgroup that will not empty.
const KILL_GIVE_UP: Duration = Duration::from_secs(5);

/// How a cgroup's members are all killed (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMethod {
    /// Write `1` to `cgroup.kill` (v2).
    Kill,
    /// Freeze with `cgroup.freeze`, kill each member, thaw (v2).
    FreezeV2,
    /// Kill each member, round after round (v1; see the module doc for why never a freeze).
    Signal,
}

impl KillMethod {
    /// The best method the delegated cgroup `root` offers.
    fn detect(root: &CgroupDir) -> io::Result<KillMethod> {
        match root.version()? {
            Some(Version::V2) => Ok(if root.has("cgroup.kill") {
                KillMethod::Kill
            } else if root.has("cgroup.freeze") {
                KillMethod::FreezeV2
            } else {
                KillMethod::Signal
            }),
            Some(Version::V1) => Ok(KillMethod::Signal),
            None => Err(io::Error::other(
                "the --cgroup-fd descriptor is not a directory of a cgroup filesystem",
            )),
        }
    }
}

/// The delegated cgroup the agent makes command cgroups in.
#[derive(Debug)]
pub struct ExecCgroups {
    /// A directory handle (through a detached mount in the jail: `..` stays inside).
    root: CgroupDir,
    method: KillMethod,
    /// The file a process writes `0` to to join a command cgroup (see the module doc).
    join_file: &'static str,
    next: AtomicU64,
    /// Cgroups of finished commands that still had processes when the command ended.
    lingering: Mutex<BTreeSet<u64>>,
}

/// Handles compare by identity: two are equal only if they are the same.
impl PartialEq for ExecCgroups {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for ExecCgroups {}

impl ExecCgroups {
    /// Takes the delegated cgroup `root` (a directory descriptor) and picks how to kill in it.
    pub fn new(root: OwnedFd) -> io::Result<Arc<ExecCgroups>> {
        let root = CgroupDir::from_fd(root);
        let method = KillMethod::detect(&root)?;
        Ok(Self::with_cgroup_dir(root, method))
    }

    #[cfg(test)]
    pub(crate) fn with_method(root: OwnedFd, method: KillMethod) -> Arc<ExecCgroups> {
        Self::with_cgroup_dir(CgroupDir::from_fd(root), method)
    }

    fn with_cgroup_dir(root: CgroupDir, method: KillMethod) -> Arc<ExecCgroups> {
        let v1 = root.version().is_ok_and(|v| v == Some(Version::V1));
        Arc::new(ExecCgroups {
            root,
            method,
            join_file: if v1 { "tasks" } else { "cgroup.procs" },
            next: AtomicU64::new(1),
            lingering: Mutex::default(),
        })
    }

    /// Makes a new, empty cgroup for one command.
    pub fn create(self: &Arc<Self>) -> io::Result<ExecCgroup> {
        self.sweep();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("exec-{id}");
        self.root
            .mkdir(&name)
            .map_err(|err| io::Error::other(format!("cannot create cgroup {name}: {err}")))?;
        Ok(ExecCgroup {
            parent: Arc::clone(self),
            id,
            name,
        })
    }

    /// The join file (open for writing; see [`ExecCgroup::join_handle`]) of the command cgroup
    /// `pid` is in, if any: what a process started on that command's behalf (the `sudo`
    /// broker's) joins, so that the command's timeout or cancel stops it too. `pid` is of the
    /// agent's pid namespace.
    pub fn join_handle_of(&self, pid: Pid) -> Option<OwnedFd> {
        let names = self.root.entries().ok()?;
        names
            .into_iter()
            .filter(|name| name.starts_with("exec-"))
            .find_map(|name| {
                let members = self.root.pids(&name).ok()?;
                if members.contains(&pid) {
                    let join = self
                        .root
                        .open_file(&format!("{name}/{}", self.join_file), OFlag::O_WRONLY);
                    join.ok().map(OwnedFd::from)
                } else {
                    None
                }
            })
    }

    /// Removes the lingering cgroups that emptied since.
    fn sweep(&self) {
        let mut lingering = self
            .lingering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        lingering.retain(|&id| !self.try_remove(id));
    }

    /// Removes cgroup `exec-<id>`; false while it still has processes.
    fn try_remove(&self, id: u64) -> bool {
        match self.root.rmdir(&format!("exec-{id}")) {
            Ok(Removal::Removed) => true,
            Ok(Removal::Busy) => false,
            Err(err) => {
                log!("cannot remove cgroup exec-{id}: {err}");
                false
            }
        }
    }

    /// Called when a command ended: removes its cgroup now if it is empty, else later.
    fn release(&self, id: u64) {
        if !self.try_remove(id) {
            self.lingering
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(id);
        }
        self.sweep();
    }
}

/// One command's cgroup. Dropping it removes the cgroup, now or once its processes are gone.
#[derive(Debug)]
pub struct ExecCgroup {
    parent: Arc<ExecCgroups>,
    id: u64,
    name: String,
}

impl ExecCgroup {
    fn open(&self, file: &str, flags: OFlag) -> io::Result<std::fs::File> {
        let path = format!("{}/{file}", self.name);
        self.parent
            .root
            .open_file(&path, flags)
            .map_err(|err| io::Error::other(format!("cannot open cgroup file {path}: {err}")))
    }

    fn write(&self, file: &str, value: &str) -> io::Result<()> {
        use std::io::Write as _;
        self.open(file, OFlag::O_WRONLY)?
            .write_all(value.as_bytes())
            .map_err(|err| io::Error::other(format!("cannot write {value:?} to {file}: {err}")))
    }

    /// The join file open for writing (`cgroup.procs`, `tasks` on v1; see the module doc): a
    /// single-threaded process that writes `0` to it joins the cgroup. For a child between
    /// fork and exec, while it still has the agent's credentials.
    pub fn join_handle(&self) -> io::Result<OwnedFd> {
        Ok(OwnedFd::from(
            self.open(self.parent.join_file, OFlag::O_WRONLY)?,
        ))
    }

    /// The processes in the cgroup, as pids of the agent's pid namespace.
    pub fn pids(&self) -> io::Result<Vec<Pid>> {
        let path = format!("{}/cgroup.procs", self.name);
        self.parent
            .root
            .pids(&self.name)
            .map_err(|err| io::Error::other(format!("cannot open cgroup file {path}: {err}")))
    }

    /// Whether no process is left (an unreadable cgroup counts as not empty).
    pub fn is_empty(&self) -> bool {
        self.pids().is_ok_and(|pids| pids.is_empty())
    }

    /// Sends `signal` to every process in the cgroup, best effort.
    pub fn signal(&self, signal: Signal) {
        if let Ok(pids) = self.pids() {
            self.signal_members(&pids, signal);
        }
    }

    /// Signals those of `pids` that, once pinned by a pidfd, are still members: a pid read
    /// from `cgroup.procs` may have been reaped and reused meanwhile. One that cannot be
    /// pinned (out of descriptors?) is signalled by pid: better than not at all.
    fn signal_members(&self, pids: &[Pid], signal: Signal) {
        // Best effort: what is missed now, the caller's next round (or the guest's end) gets.
        let _ = signal_pinned(
            pids,
            signal,
            Unpinned::SignalByPid,
            || self.pids(),
            |_, errno| io::Error::from(errno),
        );
    }

    /// Kills every process in the cgroup, round after round, until it is empty. Returns false
    /// if it could not be emptied (logged).
    pub async fn kill_all(&self) -> bool {
        let give_up = Instant::now() + KILL_GIVE_UP;
        loop {
            match self.pids() {
                Ok(pids) if pids.is_empty() => return true,
                Ok(_) if Instant::now() >= give_up => {
                    log!(
                        "cgroup {} still has processes after {KILL_GIVE_UP:?} of SIGKILL",
                        self.name
                    );
                    return false;
                }
                Ok(pids) => {
                    if let Err(err) = self.kill_round(&pids).await {
                        log!("killing cgroup {}: {err}", self.name);
                    }
                }
                Err(err) => {
                    log!("{err}");
                    return false;
                }
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn kill_round(&self, pids: &[Pid]) -> io::Result<()> {
        let kill_each = |pids: &[Pid]| self.signal_members(pids, Signal::SIGKILL);
        match self.parent.method {
            KillMethod::Kill => self.write("cgroup.kill", "1"),
            KillMethod::Signal => {
                kill_each(pids);
                Ok(())
            }
            KillMethod::FreezeV2 => {
                let (file, freeze, thaw) = ("cgroup.freeze", "1", "0");
                let froze = self.write(file, freeze);
                if froze.is_ok() {
                    self.wait_frozen().await;
                }
                // Members read once frozen: none can fork or exit until the thaw, so none is
                // missed and no pid is reused meanwhile.
                match self.pids() {
                    Ok(frozen) => kill_each(&frozen),
                    Err(_) => kill_each(pids),
                }
                // The SIGKILLs take effect as the members thaw.
                let thawed = match froze {
                    Ok(()) => self.write(file, thaw),
                    Err(_) => Ok(()),
                };
                froze.and(thawed)
            }
        }
    }

    /// Waits until the freeze took hold, or [`FREEZE_WAIT`] passed.
    async fn wait_frozen(&self) {
        let until = Instant::now() + FREEZE_WAIT;
        while Instant::now() < until {
            let frozen = self
                .parent
                .root
                .event(&self.name, "frozen")
                .unwrap_or(false);
            if frozen {
                return;
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

impl Drop for ExecCgroup {
    fn drop(&mut self) {
        self.parent.release(self.id);
    }
}

#[cfg(test)]
mod tests {
    //! Against the host's real hierarchies (as root): every kill method, on commands whose
    //! processes leave the process group in all the usual ways.

    use std::path::{Path, PathBuf};

    use super::*;
    use crate::spawn::{self, ChildSpec};

    /// Processes that a process-group kill misses or that shrug off SIGTERM.
    const ESCAPES: &str = "\
        setsid sh -c 'trap \"\" TERM; sleep 1001' </dev/null >/dev/null 2>&1 &
        (trap '' TERM; setsid sleep 1002 </dev/null >/dev/null 2>&1 &) &
        setsid sh -c '(trap \"\" TERM HUP; sleep 1003) &' </dev/null >/dev/null 2>&1
        nohup sleep 1004 >/dev/null 2>&1 &
        trap '' TERM; sleep 1005";

    /// A test cgroup under the root of the hierarchy mounted with `fs_type` (and `option` among
    /// its super options), removed on drop.
    struct TestParent(PathBuf);

    impl TestParent {
        fn new(fs_type: &str, option: Option<&str>, test: &str) -> Option<TestParent> {
            if !nix::unistd::geteuid().is_root() {
                eprintln!("SKIPPED {test}: needs root to make cgroups");
                return None;
            }
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
            let mount = mountinfo.lines().find_map(|line| {
                let (before, after) = line.split_once(" - ")?;
                let mut after = after.split(' ');
                let (fs, _source, options) = (after.next()?, after.next()?, after.next()?);
                let matches =
                    fs == fs_type && option.is_none_or(|o| options.split(',').any(|x| x == o));
                matches.then(|| before.split(' ').nth(4).map(PathBuf::from))?
            });
            let Some(mount) = mount else {
                eprintln!("SKIPPED {test}: no {fs_type} hierarchy with {option:?} mounted");
                return None;
            };
            let dir = mount.join(format!("dynocap-agent-test-{}-{test}", std::process::id()));
            std::fs::create_dir(&dir).expect("test cgroup");
            Some(TestParent(dir))
        }

        fn cgroups(&self, method: Option<KillMethod>) -> Arc<ExecCgroups> {
            let fd = nix::fcntl::open(
                self.0.as_path(),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .expect("open test cgroup");
            match method {
                Some(method) => ExecCgroups::with_method(fd, method),
                None => ExecCgroups::new(fd).expect("a cgroup directory"),
            }
        }
    }

    impl Drop for TestParent {
        fn drop(&mut self) {
            // A failed test may have left processes: kill them, then remove children first,
            // giving the killed a moment to leave.
            let mut dirs: Vec<PathBuf> = std::fs::read_dir(&self.0)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            dirs.push(self.0.clone());
            for dir in &dirs {
                kill_listed(dir);
            }
            for dir in &dirs {
                for _ in 0..500 {
                    match std::fs::remove_dir(dir) {
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                            std::thread::sleep(RETRY);
                        }
                        _ => break,
                    }
                }
            }
        }
    }

    fn kill_listed(dir: &Path) {
        for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
        {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    fn start_in(cgroup: &ExecCgroup, script: &str) -> spawn::Spawned {
        let spec = ChildSpec {
            cgroup: Some(cgroup.join_handle().expect("join handle")),
            ..crate::command::shell_spec(script)
        };
        spawn::spawn(&spec).expect("spawn")
    }

    /// How many of `pids` run one of the `sleep 100N` of [`ESCAPES`].
    fn sleeping(pids: &[Pid]) -> usize {
        pids.iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"sleep\x00100"))
            })
            .count()
    }

    async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
        for _ in 0..3000 {
            if check() {
                return;
            }
            tokio::time::sleep(RETRY).await;
        }
        panic!("gave up waiting for {what}");
    }

    /// Runs [`ESCAPES`] in a command cgroup, kills it, and checks nothing survived and the
    /// cgroup went away.
    async fn kill_everything(parent: TestParent, method: Option<KillMethod>, expected: KillMethod) {
        crate::init::setup();
        let cgroups = parent.cgroups(method);
        assert_eq!(cgroups.method, expected);
        let cgroup = cgroups.create().expect("create");
        let dir = parent.0.join(&cgroup.name);
        assert!(dir.is_dir());
        let _spawned = start_in(&cgroup, ESCAPES);
        wait_for("every escape to start", || {
            cgroup.pids().is_ok_and(|pids| sleeping(&pids) == 5)
        })
        .await;
        let members = cgroup.pids().expect("pids");
        cgroup.signal(Signal::SIGTERM);
        assert!(cgroup.kill_all().await, "{expected:?} emptied the cgroup");
        assert!(cgroup.is_empty());
        for pid in members {
            // Reaped by the reaper thread (we are a child subreaper), or never ours.
            wait_for("a killed process to be reaped", || {
                !Path::new(&format!("/proc/{pid}")).exists()
                    || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                        .is_ok_and(|s| s.contains(") Z"))
            })
            .await;
        }
        drop(cgroup);
        assert!(!dir.exists(), "an emptied cgroup is removed when released");
    }

    #[tokio::test]
    async fn a_member_is_found_in_its_command_cgroup() {
        let Some(parent) = TestParent::new("cgroup", Some("pids"), "joinof") else {
            return;
        };
        crate::init::setup();
        let cgroups = parent.cgroups(Some(KillMethod::Signal));
        let (first, second) = (
            cgroups.create().expect("create"),
            cgroups.create().expect("create"),
        );
        let spawned = start_in(&second, "sleep 1009");
        let pid = Pid::from_raw(spawned.pid);
        wait_for("the sleep to join", || {
            second.pids().is_ok_and(|pids| pids.contains(&pid))
        })
        .await;
        // The handle joins the member's cgroup, not another: a process writing 0 to it lands
        // beside the sleep.
        let handle = cgroups.join_handle_of(pid).expect("found");
        let joined = ChildSpec {
            cgroup: Some(handle),
            ..crate::command::shell_spec("sleep 1010")
        };
        let joiner = spawn::spawn(&joined).expect("spawn");
        wait_for("the joiner to join", || {
            second
                .pids()
                .is_ok_and(|pids| pids.contains(&Pid::from_raw(joiner.pid)))
        })
        .await;
        assert!(first.is_empty());
        assert!(
            cgroups.join_handle_of(Pid::this()).is_none(),
            "not in any command cgroup"
        );
        assert!(second.kill_all().await);
    }

    /// v1 is joined through `tasks` (no global lock, see the module doc), v2 through
    /// `cgroup.procs`; either way the command's first process, and so what it starts, is in.
    #[tokio::test]
    async fn a_command_joins_through_its_hierarchys_join_file() {
        crate::init::setup();
        for (fs_type, option, file) in [
            ("cgroup", Some("pids"), "tasks"),
            ("cgroup2", None, "cgroup.procs"),
        ] {
            let Some(parent) = TestParent::new(fs_type, option, "joinfile") else {
                continue;
            };
            let cgroups = parent.cgroups(None);
            assert_eq!(cgroups.join_file, file, "{fs_type}");
            let cgroup = cgroups.create().expect("create");
            let spawned = start_in(&cgroup, "sleep 1011 & sleep 1012");
            wait_for(
                &format!("the command and its child to join ({fs_type})"),
                || {
                    cgroup.pids().is_ok_and(|pids| {
                        pids.contains(&Pid::from_raw(spawned.pid)) && pids.len() >= 2
                    })
                },
            )
            .await;
            assert!(cgroup.kill_all().await);
        }
    }

    #[tokio::test]
    async fn cgroup_kill_on_v2() {
        let Some(parent) = TestParent::new("cgroup2", None, "v2kill") else {
            return;
        };
        if !parent.0.join("cgroup.kill").exists() {
            eprintln!("SKIPPED cgroup_kill_on_v2: the kernel has no cgroup.kill");
            return;
        }
        kill_everything(parent, None, KillMethod::Kill).await;
    }

    #[tokio::test]
    async fn freeze_kill_thaw_on_v2() {
        let Some(parent) = TestParent::new("cgroup2", None, "v2freeze") else {
            return;
        };
        kill_everything(parent, Some(KillMethod::FreezeV2), KillMethod::FreezeV2).await;
    }

    /// A v1 freezer's command cgroup is killed round after round and never frozen: a freeze
    /// the agent took and could not undo (it is SIGKILLed with its supervisor) would hold the
    /// processes past every SIGKILL. A fork loop still cannot outrun the rounds.
    #[tokio::test]
    async fn a_v1_freezer_is_killed_without_ever_being_frozen() {
        let Some(parent) = TestParent::new("cgroup", Some("freezer"), "v1freezer") else {
            return;
        };
        let state = |dir: &Path| std::fs::read_to_string(dir.join("freezer.state"));
        crate::init::setup();
        let cgroups = parent.cgroups(None);
        assert_eq!(cgroups.method, KillMethod::Signal);
        let cgroup = cgroups.create().expect("create");
        let dir = parent.0.join(&cgroup.name);
        let _spawned = start_in(
            &cgroup,
            "setsid sh -c 'while :; do sleep 1000 & done' </dev/null >/dev/null 2>&1 & sleep 1000",
        );
        wait_for("the loop to fill the cgroup", || {
            cgroup.pids().is_ok_and(|pids| pids.len() >= 50)
        })
        .await;
        // The freezer's state is watched from another thread for the whole kill.
        let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let watcher = {
            let (watching, dir) = (watching.clone(), dir.clone());
            std::thread::spawn(move || {
                let mut seen = BTreeSet::new();
                while watching.load(Ordering::Relaxed) {
                    if let Ok(now) = state(&dir) {
                        seen.insert(now.trim().to_owned());
                    }
                }
                seen
            })
        };
        let killed = cgroup.kill_all().await;
        watching.store(false, Ordering::Relaxed);
        let seen = watcher.join().expect("watcher");
        assert!(killed, "the kill kept up with the forks");
        assert!(cgroup.is_empty());
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            ["THAWED"],
            "a v1 freezer is never frozen"
        );
        drop((cgroup, cgroups));
        // The ESCAPES shapes die the same way.
        kill_everything(parent, None, KillMethod::Signal).await;
    }

    #[tokio::test]
    async fn kill_loop_on_v1_pids() {
        let Some(parent) = TestParent::new("cgroup", Some("pids"), "v1pids") else {
            return;
        };
        kill_everything(parent, None, KillMethod::Signal).await;
    }

    #[tokio::test]
    async fn a_fork_loop_cannot_outrun_a_kill_without_freezer() {
        let Some(parent) = TestParent::new("cgroup", Some("pids"), "forkloop") else {
            return;
        };
        // Bounded, as the sandbox's pids limit bounds it in a guest.
        std::fs::write(parent.0.join("pids.max"), "200").expect("pids.max");
        crate::init::setup();
        let cgroups = parent.cgroups(None);
        assert_eq!(cgroups.method, KillMethod::Signal);
        let cgroup = cgroups.create().expect("create");
        let _spawned = start_in(
            &cgroup,
            "setsid sh -c 'while :; do sleep 1000 & done' </dev/null >/dev/null 2>&1 & sleep 1000",
        );
        wait_for("the loop to fill the cgroup", || {
            cgroup.pids().is_ok_and(|pids| pids.len() >= 50)
        })
        .await;
        assert!(cgroup.kill_all().await, "the kill kept up with the forks");
        assert!(cgroup.is_empty());
    }

    #[tokio::test]
    async fn a_cgroup_with_processes_left_lingers_until_they_exit() {
        let Some(parent) = TestParent::new("cgroup", Some("pids"), "linger") else {
            return;
        };
        crate::init::setup();
        let cgroups = parent.cgroups(None);
        let cgroup = cgroups.create().expect("create");
        let dir = parent.0.join(&cgroup.name);
        let spawned = start_in(&cgroup, "sleep 1001 </dev/null >/dev/null 2>&1 & echo $!");
        let status = spawned.exit.await.expect("exit status");
        assert_eq!(status, crate::reaper::ExitStatus::Exited(0));
        let survivor = cgroup.pids().expect("pids");
        assert_eq!(survivor.len(), 1, "the background sleep keeps running");
        drop(cgroup);
        assert!(dir.is_dir(), "a cgroup with a process left is kept");
        let _ = nix::sys::signal::kill(survivor[0], Signal::SIGKILL);
        wait_for("the survivor to leave", || {
            std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty())
        })
        .await;
        // The next command's cgroup sweeps it away.
        let next = cgroups.create().expect("create");
        assert!(!dir.exists(), "the emptied cgroup was swept");
        drop(next);
    }
}
