//! Starting one child process: its stdio (pipes, or a pseudo-terminal), and the forked
//! child's set-up up to `execve` of its program (`/bin/sh -c command` for an exec, `git` for
//! the agent's own repository work).
//!
//! Why fork/exec by hand instead of `std::process::Command` with `pre_exec`: when a pre_exec
//! hook fails or exec fails, std reaps the child itself with `waitpid(pid)` and asserts that
//! it succeeds, which races with (and panics against) the reaper thread's `waitpid(-1)`.
//! Forking ourselves keeps the reaper the only waiter. Everything the child needs (C strings,
//! pointer arrays, error messages) is built before the fork, because between fork and exec
//! only async-signal-safe calls are allowed: no allocation, no locks.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::OFlag;
use tokio::sync::oneshot;

use crate::reaper::{self, ExitStatus};

/// Terminal size given to `terminal: true` commands, matching the host's transcript renderer.
/// PATH every program the agent starts begins with.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub const TERMINAL_ROWS: u16 = 24;
pub const TERMINAL_COLS: u16 = 80;

/// The user commands run as (`--exec-user UID:GID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecUser {
    pub uid: u32,
    pub gid: u32,
}

/// A validated command, ready to start.
#[derive(Debug)]
pub struct ChildSpec {
    /// Absolute path of the program to execute.
    pub program: CString,
    /// The complete argument vector, `argv[0]` included.
    pub argv: Vec<CString>,
    /// `KEY=VALUE` entries, the complete environment.
    pub env: Vec<CString>,
    pub cwd: CString,
    pub terminal: bool,
    /// Only set when it differs from the agent's own uid.
    pub user: Option<ExecUser>,
    /// Standard input of a non-terminal child; `/dev/null` when `None`.
    pub stdin: Option<OwnedFd>,
    /// The join file (`cgroup.procs`, or `tasks` on v1) of the cgroup the child joins before
    /// it runs anything (see `cgroup`).
    pub cgroup: Option<OwnedFd>,
    /// A supplementary group the child keeps beside `user`'s gid (see `gitguard`); only
    /// applied with `user`, by a privileged agent.
    pub extra_group: Option<u32>,
    /// Standard input, output and error given as they are (the `sudo` broker passes the
    /// caller's): no pipes are made and [`Spawned::outputs`] is empty. Not with `terminal`.
    pub stdio: Option<[OwnedFd; 3]>,
}

/// A started command: its pid (also its process group and session id) and the parent's ends
/// of its output, non-blocking and close-on-exec.
pub struct Spawned {
    pub pid: libc::pid_t,
    pub exit: oneshot::Receiver<ExitStatus>,
    /// `(channel, read end)`: stdout and stderr pipes, or the pty master alone.
    pub outputs: Vec<(u8, OwnedFd)>,
}

const OOM_SCORE_ADJ: &CStr = c"/proc/self/oom_score_adj";

/// Everything the child touches, as raw pointers into memory the parent keeps alive across
/// the fork (the child gets a copy of the address space).
struct ChildPlan<'a> {
    program: &'a CStr,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: &'a CStr,
    stdio: [RawFd; 3],
    controlling_tty: bool,
    /// The cgroup join file to write `0` to, or -1.
    cgroup_join: RawFd,
    user: Option<(libc::uid_t, libc::gid_t, bool)>,
    /// The supplementary groups: the user's gid, then the extra group if any.
    groups: [libc::gid_t; 2],
    groups_len: usize,
    msg_cgroup: Vec<u8>,
    msg_user: Vec<u8>,
    msg_cwd: Vec<u8>,
    msg_exec: Vec<u8>,
}

/// Starts the command. The returned pid leads its own session and process group.
pub fn spawn(spec: &ChildSpec) -> io::Result<Spawned> {
    // The child's ends live in these locals and are closed when this function returns, so
    // that the parent's read ends see EOF once the command (and its children) are done.
    let (stdio, outputs, _child_ends) = if let Some(given) = &spec.stdio {
        (
            [
                given[0].as_raw_fd(),
                given[1].as_raw_fd(),
                given[2].as_raw_fd(),
            ],
            Vec::new(),
            Vec::new(),
        )
    } else if spec.terminal {
        let (master, slave) = open_pty()?;
        let raw = slave.as_raw_fd();
        crate::channel::set_cloexec_nonblocking(&master)?;
        (
            [raw, raw, raw],
            vec![(dynocap_proto::channel::TERMINAL, master)],
            vec![slave],
        )
    } else {
        let stdin = match &spec.stdin {
            Some(fd) => fd.try_clone()?,
            None => nix::fcntl::open(
                c"/dev/null",
                OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|err| io::Error::other(format!("cannot open /dev/null: {err}")))?,
        };
        let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        // Only our ends are non-blocking: O_NONBLOCK lives on the open file description, and
        // pipe2 would give it to the child's write ends too.
        crate::channel::set_cloexec_nonblocking(&out_r)?;
        crate::channel::set_cloexec_nonblocking(&err_r)?;
        let stdio = [stdin.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
        let outputs = vec![
            (dynocap_proto::channel::STDOUT, out_r),
            (dynocap_proto::channel::STDERR, err_r),
        ];
        (stdio, outputs, vec![stdin, out_w, err_w])
    };

    let cwd_text = spec.cwd.to_string_lossy();
    let mut envp: Vec<*const libc::c_char> = spec.env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // setgroups needs privilege; without it only setgid/setuid are attempted.
    let privileged = nix::unistd::geteuid().is_root();
    let mut argv: Vec<*const libc::c_char> = spec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let plan = ChildPlan {
        program: &spec.program,
        argv,
        envp,
        cwd: &spec.cwd,
        stdio,
        controlling_tty: spec.terminal,
        cgroup_join: spec.cgroup.as_ref().map_or(-1, AsRawFd::as_raw_fd),
        user: spec.user.map(|u| (u.uid, u.gid, privileged)),
        groups: [
            spec.user.map_or(0, |u| u.gid),
            spec.extra_group.unwrap_or(0),
        ],
        groups_len: if spec.extra_group.is_some() { 2 } else { 1 },
        msg_cgroup: b"dynocap-agent: cannot move the command into its cgroup\n".to_vec(),
        msg_user: spec
            .user
            .map(|u| {
                format!(
                    "dynocap-agent: cannot switch to uid {} gid {}\n",
                    u.uid, u.gid
                )
            })
            .unwrap_or_default()
            .into_bytes(),
        msg_cwd: format!("dynocap-agent: cannot enter working directory {cwd_text}\n").into_bytes(),
        msg_exec: format!(
            "dynocap-agent: cannot execute {}\n",
            spec.program.to_string_lossy()
        )
        .into_bytes(),
    };

    let (pid, exit) = reaper::spawn_child(|| {
        // SAFETY: the child branch only runs `child_main`, which restricts itself to
        // async-signal-safe calls on memory prepared before the fork, and never returns.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            // SAFETY: we are the freshly forked child; see `child_main`'s contract.
            0 => unsafe { child_main(&plan) },
            pid => Ok(pid),
        }
    })?;
    Ok(Spawned { pid, exit, outputs })
}

/// Opens a pty pair, both ends close-on-exec, sized 24x80.
fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    let master = nix::fcntl::open(
        c"/dev/ptmx",
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|err| io::Error::other(format!("cannot open /dev/ptmx: {err}")))?;
    let mut unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int through the pointer, which is valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &mut unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // TIOCGPTPEER opens the slave through the master itself, so it works whatever devpts
    // instance /dev/pts is and without a path lookup (Linux 4.13+).
    // SAFETY: TIOCGPTPEER takes the open flags by value and returns a new descriptor.
    let peer = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    let slave = if peer >= 0 {
        // SAFETY: the ioctl just returned this new descriptor, which nothing else owns.
        unsafe { OwnedFd::from_raw_fd(peer) }
    } else {
        let mut number: libc::c_uint = 0;
        // SAFETY: TIOCGPTN writes one unsigned int through the pointer, valid for the call.
        if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut number) } < 0 {
            return Err(io::Error::last_os_error());
        }
        nix::fcntl::open(
            format!("/dev/pts/{number}").as_str(),
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?
    };
    let size = libc::winsize {
        ws_row: TERMINAL_ROWS,
        ws_col: TERMINAL_COLS,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize through the pointer, valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((master, slave))
}

/// Writes a prepared message to the child's stderr and exits with `code`.
///
/// # Safety
/// Only for the forked child: it calls `_exit`.
unsafe fn child_fail(message: &[u8], code: libc::c_int) -> ! {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is valid.
    unsafe {
        libc::write(2, message.as_ptr().cast(), message.len());
        libc::_exit(code)
    }
}

/// The forked child: sets itself up and execs its program.
///
/// # Safety
/// Must only run in the child right after `fork()` in a possibly multi-threaded parent: it
/// uses async-signal-safe system calls exclusively and never allocates, unwinds or returns.
unsafe fn child_main(plan: &ChildPlan<'_>) -> ! {
    // SAFETY: every call below is an async-signal-safe system call wrapper operating on
    // memory prepared before the fork (`plan` and static C strings), as this function's
    // contract requires. Return values are checked where a failure matters.
    unsafe {
        // Own session, hence own process group: pgid == sid == pid, which is what lets a
        // timeout kill the whole tree with killpg.
        libc::setsid();
        for (target, source) in [0, 1, 2].into_iter().zip(plan.stdio) {
            if source == target {
                // dup2 onto itself keeps FD_CLOEXEC, so clear it by hand.
                libc::fcntl(target, libc::F_SETFD, 0);
            } else if libc::dup2(source, target) < 0 {
                child_fail(b"dynocap-agent: cannot set up stdio\n", 126);
            }
        }
        if plan.controlling_tty {
            // Job control and programs that open /dev/tty need a controlling terminal.
            libc::ioctl(0, libc::TIOCSCTTY, 0);
        }
        // Join the command's cgroup ("0" is the writer) before running anything, while we
        // still have the agent's credentials: everything the command starts is born in it,
        // and the user it runs as cannot move out. (After stdio, so a failure is reported on
        // the command's stderr.)
        if plan.cgroup_join >= 0 && libc::write(plan.cgroup_join, b"0".as_ptr().cast(), 1) != 1 {
            child_fail(&plan.msg_cgroup, 126);
        }
        // Undo what the agent's process state would otherwise leak into commands: a blocked
        // signal mask and ignored signals (Rust ignores SIGPIPE) survive execve.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for sig in 1..65 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        // The host may have made the agent unkillable by the OOM killer; commands must stay
        // ordinary victims. Raising the value needs no privilege; done before any setuid,
        // which would make /proc/self root-owned. Failure is harmless.
        let oom = libc::open(OOM_SCORE_ADJ.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if oom >= 0 {
            libc::write(oom, b"0".as_ptr().cast(), 1);
            libc::close(oom);
        }
        // Nothing but 0-2 may reach the command, whatever the host leaked into the agent.
        libc::syscall(libc::SYS_close_range, 3_u32, u32::MAX, 0_u32);
        if let Some((uid, gid, set_groups)) = plan.user {
            if (set_groups && libc::setgroups(plan.groups_len, plan.groups.as_ptr()) != 0)
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                child_fail(&plan.msg_user, 126);
            }
            // The uid change made us non-dumpable unless fs.suid_dumpable is 1; make sure, so
            // that no process of the new uid can reach into us before the exec.
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        }
        // After dropping privileges, so the user gets the access they would really have.
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            child_fail(&plan.msg_cwd, 126);
        }
        // ETXTBSY: a program the agent has just written (the guarded git's copy) is still
        // open for writing in another child forked at that moment, until that child's own
        // exec closes it. Brief, so retry for a while, as Go's os/exec does.
        for _ in 0..100 {
            libc::execve(
                plan.program.as_ptr(),
                plan.argv.as_ptr(),
                plan.envp.as_ptr(),
            );
            if *libc::__errno_location() != libc::ETXTBSY {
                break;
            }
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 10_000_000,
            };
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
        child_fail(&plan.msg_exec, 127)
    }
}
