//! The guest init between clone and exec: PID 1 of the new pid namespace, turning itself into
//! the agent. The order of [`setup`] is the substance of this file; each step says why it
//! sits where it does.
//!
//! This runs in a copy of the supervisor made by a fork-style `clone`. The supervisor was
//! single-threaded when it cloned (checked by `spawn`), so allocating and ordinary Rust code
//! are safe here; the one rule is never to return into the supervisor's code: every path ends
//! in `execve` or `_exit`.

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{open, OFlag};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{sigprocmask, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::stat::{umask, Mode};
use nix::unistd::{execve, setgroups, sethostname, setresgid, setresuid, setsid, Gid, Uid};
use seccompiler::BpfProgram;

use crate::caps;
use crate::failure::{Context, Failure};
use crate::net;
use crate::newmount::{self, NODEV, NOEXEC, NOSUID};
use crate::rootfs::{self, RootPlan};
use crate::seccomp;
use crate::spec::CHANNEL_FD;
use crate::sync;
use crate::sys;

/// Lowest fd number the init keeps its own channels at, clear of stdio and the channel fd.
const PRIVATE_FD_BASE: i32 = 10;

/// The agent's handle on the cgroup delegated for its commands (after the channel's fd 3).
pub(crate) const EXEC_CGROUP_FD: i32 = CHANNEL_FD + 1;

/// Everything the init needs, prepared by the supervisor before clone.
pub(crate) struct ChildPlan {
    pub hostname: String,
    pub root: RootPlan,
    /// Guest ids the init (and so the agent) runs as.
    pub uid: Uid,
    pub gid: Gid,
    /// Clear supplementary groups (impossible, and skipped, when `setgroups` is denied).
    pub drop_groups: bool,
    pub exe: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub seccomp: BpfProgram,
    /// Capability mask to keep.
    pub caps: u64,
    /// Host path of the cgroup delegated to the guest for its commands; the agent gets it as
    /// fd [`EXEC_CGROUP_FD`].
    pub exec_cgroup: Option<PathBuf>,
}

/// The init's ends of the channels.
pub(crate) struct ChildEnds {
    pub sync: OwnedFd,
    pub errors: OwnedFd,
    /// Becomes the agent's fd 3.
    pub channel: OwnedFd,
    /// The `tasks` files of the sandbox's v1 cgroups, which the init joins by writing `0`.
    pub cgroup_joins: Vec<OwnedFd>,
}

/// Why setup stopped.
enum Stop {
    /// The supervisor went away: exit quietly, nobody is listening.
    SupervisorGone,
    Failed(Failure),
}

impl From<Failure> for Stop {
    fn from(f: Failure) -> Stop {
        Stop::Failed(f)
    }
}

/// Runs the init; never returns.
pub(crate) fn run(plan: &ChildPlan, ends: ChildEnds) -> ! {
    let ChildEnds {
        sync,
        errors,
        channel,
        cgroup_joins,
    } = ends;
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        setup(plan, &sync, &channel, cgroup_joins)
    }));
    let message = match outcome {
        Ok(Err(Stop::SupervisorGone)) => sys::exit_now(1),
        Ok(Err(Stop::Failed(failure))) => failure.to_string(),
        Ok(Ok(never)) => match never {},
        Err(payload) => {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            format!("the guest init panicked: {text}")
        }
    };
    sync::report(errors.as_fd(), &message);
    sys::exit_now(1)
}

fn setup(
    plan: &ChildPlan,
    sync_end: &OwnedFd,
    channel: &OwnedFd,
    cgroup_joins: Vec<OwnedFd>,
) -> Result<Infallible, Stop> {
    // Modes of what we create are exactly the ones asked for.
    umask(Mode::empty());
    // Own session: no controlling terminal (so /dev/tty opens nothing and TIOCSTI has no
    // target), and the supervisor's job control signals do not reach us.
    setsid().context(|| "creating a new session")?;
    reset_signals()?;
    // Keep our own fds above the numbers stdio and the channel will take.
    let sync_end =
        sys::dup_at_least(sync_end.as_fd(), PRIVATE_FD_BASE).context(|| "moving the sync fd")?;
    let channel =
        sys::dup_at_least(channel.as_fd(), PRIVATE_FD_BASE).context(|| "moving the channel fd")?;

    // 0. Into the sandbox's v1 cgroups, by ourselves: this thread moving itself takes no
    //    kernel-wide lock, where the supervisor moving us by pid would wait out an RCU grace
    //    period (see `cgroup`). Still with the supervisor's host ids, though the files'
    //    openers' credentials are what the kernel checks.
    for tasks in cgroup_joins {
        nix::unistd::write(&tasks, b"0").context(|| "joining the sandbox's cgroup")?;
    }

    // 1. Wait until the supervisor has written our id maps. It moves us into any v2 cgroups
    //    meanwhile, and says so with a second release before anything of the guest's runs
    //    (step 8).
    if !sync::wait_release(sync_end.as_fd()) {
        return Err(Stop::SupervisorGone);
    }

    // 2. No mount events flow back to the host; host unmounts still propagate in, so the
    //    guest never pins a host mount.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .context(|| "making / a recursive slave mount")?;

    // 3. Open host paths while we still have the supervisor's host uid (see rootfs).
    let host = rootfs::open_host(&plan.root)?;
    //    The delegated cgroup too, already as the detached mount the agent will get: the
    //    path is the host's, and cloning a mount takes the capabilities we hold until exec.
    let exec_cgroup = plan
        .exec_cgroup
        .as_deref()
        .map(detached_cgroup)
        .transpose()?;

    // 4. Become the guest init's ids (guest root, an unprivileged host id) before mounting:
    //    the overlay records its mounter's credentials and creates its work files with them.
    if plan.drop_groups {
        setgroups(&[]).context(|| "clearing supplementary groups")?;
    }
    setresgid(plan.gid, plan.gid, plan.gid).context(|| format!("setresgid({})", plan.gid))?;
    setresuid(plan.uid, plan.uid, plan.uid).context(|| format!("setresuid({})", plan.uid))?;

    // 5. Build the root and pivot into it; the host's tree is gone after this.
    rootfs::build(&plan.root, &host)?;
    drop(host);

    // 6. Identity and network.
    sethostname(&plan.hostname).context(|| format!("setting the hostname to {}", plan.hostname))?;
    net::loopback_up().context(|| "bringing up lo")?;

    // 7. Descriptors: 0 = /dev/null, 1 and 2 inherited (the supervisor's log; /dev/null if
    //    closed), 3 = the channel, everything else closed at exec.
    stdio()?;
    sys::dup_onto(channel.as_fd(), CHANNEL_FD)
        .context(|| format!("placing the channel at fd {CHANNEL_FD}"))?;
    let mut last_handed = CHANNEL_FD;
    if let Some(cgroup) = &exec_cgroup {
        sys::dup_onto(cgroup.as_fd(), EXEC_CGROUP_FD)
            .context(|| format!("placing the exec cgroup at fd {EXEC_CGROUP_FD}"))?;
        last_handed = EXEC_CGROUP_FD;
    }
    let first_private = u32::try_from(last_handed + 1).unwrap_or(5);
    sys::cloexec_from(first_private).context(|| "marking inherited fds close-on-exec")?;

    // 8. Once the supervisor says we are in all our cgroups: a cgroup namespace rooted at them
    //    (the guest sees "/"). Nothing the guest controls has run yet; everything after this
    //    point, the agent included, is charged to and limited by the sandbox's cgroups.
    if !sync::wait_release(sync_end.as_fd()) {
        return Err(Stop::SupervisorGone);
    }
    unshare(CloneFlags::CLONE_NEWCGROUP).context(|| "creating the cgroup namespace")?;

    // 9. Lock down: capabilities, then no_new_privs and seccomp (last: it forbids the
    //    mount-related calls above). The filter is installed by this process and inherited by
    //    everything the agent starts.
    caps::restrict(plan.caps).map_err(|(what, errno)| Failure::new(what, errno))?;
    umask(Mode::from_bits_truncate(0o022));
    seccomp::install(&plan.seccomp)
        .map_err(|e| Failure::message(format!("installing the seccomp filter: {e}")))?;

    // 10. Die with the supervisor. After every credential change (they clear it); then check
    //     the supervisor did not die before it was set.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).context(|| "setting PR_SET_PDEATHSIG")?;
    if sync::supervisor_gone(sync_end.as_fd()) {
        return Err(Stop::SupervisorGone);
    }

    // 11. Become the agent. On success the error pipe closes (close-on-exec): that is the
    //     supervisor's signal that the guest is up.
    execve(&plan.exe, &plan.argv, &plan.envp)
        .context(|| format!("executing {}", plan.exe.to_string_lossy()))
        .map_err(Stop::from)
}

/// Default dispositions and an empty mask: ignored signals survive exec, and a supervisor
/// that ignores SIGPIPE (every Rust program does) must not hand that to guest shells.
fn reset_signals() -> Result<(), Failure> {
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .context(|| "clearing the signal mask")?;
    for signal in Signal::iterator() {
        if matches!(signal, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: installing SIG_DFL registers no handler, so no Rust code can run
        // asynchronously because of it.
        match unsafe { nix::sys::signal::signal(signal, SigHandler::SigDfl) } {
            Ok(_) | Err(Errno::EINVAL) => {}
            Err(e) => return Err(Failure::new(format!("resetting {signal}"), e)),
        }
    }
    Ok(())
}

/// A detached bind mount of the cgroup at `path`, for the agent. A mount, not a plain
/// directory fd: `..` stops at a mount's root, so the handle reaches that cgroup and what the
/// guest creates below it, never its parent or the host's other cgroups. Detached, so nothing
/// in the guest's tree shows it.
fn detached_cgroup(path: &Path) -> Result<OwnedFd, Failure> {
    let what = || format!("opening the delegated cgroup {}", path.display());
    let dir = open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .context(what)?;
    let tree = newmount::clone_tree(dir.as_fd(), false).context(what)?;
    newmount::set_attrs(tree.as_fd(), NOSUID | NODEV | NOEXEC, false).context(what)?;
    sys::dup_at_least(tree.as_fd(), PRIVATE_FD_BASE).context(what)
}

/// fd 0 from /dev/null; fds 1 and 2 too if the supervisor has them closed.
fn stdio() -> Result<(), Failure> {
    let null = open("/dev/null", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
        .context(|| "opening /dev/null")?;
    let null_fd = std::os::fd::AsRawFd::as_raw_fd(&null);
    for fd in [0, 1, 2] {
        // `null` itself landed on a low number only if that number was closed: it must then
        // stay, without close-on-exec (dup_onto onto its own number clears the flag).
        if fd == 0 || fd == null_fd || !sys::fd_is_open(fd) {
            sys::dup_onto(null.as_fd(), fd).context(|| format!("placing /dev/null at fd {fd}"))?;
        }
    }
    if null_fd <= 2 {
        std::mem::forget(null);
    }
    Ok(())
}
