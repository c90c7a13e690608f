//! Host processes a supervisor starts (git, for the import and for verifying a patch): each
//! dies with the supervisor and inherits no descriptor beyond its stdio.
//!
//! A supervisor can die without a chance to clean up: SIGKILL, the OOM killer, or a cancelled
//! start whose client kills it. Whatever it started must not run on. A `git bundle create`
//! packing a large history keeps a core busy for a minute, and a child that inherited one of
//! the supervisor's descriptors (the ready pipe above all) keeps the client waiting for an
//! end-of-file that only comes when that child exits.
//!
//! - [`die_with_parent`] makes a command's child get SIGKILL when its parent dies
//!   (`PR_SET_PDEATHSIG`) and marks every descriptor above stdio close-on-exec.
//! - The kernel clears the death signal in a child's own children (git runs `pack-objects`).
//!   [`in_own_pid_namespace`] makes the kernel end them anyway: the program is the first
//!   process of a pid namespace of its own, and when that process ends, by any cause, the
//!   kernel kills every process left in the namespace. It is chosen over the alternatives
//!   because it needs nobody after the death: a child subreaper gets orphans only while it
//!   lives, and a cgroup of the supervisor's helpers must be killed by someone (the next
//!   command, which may never come, or come to a damaged catalog). A pid namespace for the
//!   supervisor itself would end all of it at once, but would make every pid it reads in the
//!   host's `/proc` (its guest's, pasta's, QEMU's) a pid of another namespace.
//! - A second line, for a host without pid namespaces to give (not root): a supervisor leads a
//!   session of its own (its starter calls `setsid`), and its helpers stay in it even when they
//!   get a process group of their own. [`kill_session`] kills what is left of that session;
//!   whoever notices a dead supervisor calls it.

use std::collections::HashSet;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::model::lifecycle::ProcessId;

/// Makes `command`'s child die with its parent and start with nothing open beyond fds 0–2.
///
/// The death signal follows the *thread* that spawns, not the process: spawn from a thread
/// that outlives the child (wait for the child on the thread that spawned it), or the child is
/// killed when that thread ends. A blocking-pool thread that spawns and returns is exactly
/// that mistake.
pub fn die_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the hook runs in the forked child before exec and only makes the system calls
    // prctl, getppid and close_range; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the signal was armed: then none will come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            cloexec_from(3);
            Ok(())
        });
    }
}

/// Runs `command`'s program as the first process (pid 1) of a pid namespace of its own, under a
/// keeper that waits for it and ends as it did. For a program that starts programs of its own
/// (git runs `pack-objects`, `index-pack`, remote helpers), whose children the death signal of
/// [`die_with_parent`] does not reach: when a namespace's first process ends, by any cause, the
/// kernel kills every process left in it. The program gets SIGKILL when its keeper dies, and the
/// keeper (register [`die_with_parent`] first) when its parent does, so a supervisor killed
/// outright takes all of it along, whatever the catalog says and whether or not anyone comes
/// after it. Killing the child the caller holds (the keeper) ends all of it too.
///
/// As a namespace's first process, the program gets from its own namespace only the signals
/// it handles, and the namespace's orphans become its children (zombies until it ends, git not
/// reaping them): git is killed from outside with SIGKILL (the
/// keeper's, or its process group's), which always arrives.
///
/// Creating a pid namespace takes `CAP_SYS_ADMIN`; without it the program runs as a plain child,
/// with the death signal alone.
pub fn in_own_pid_namespace(command: &mut Command) {
    // SAFETY: the hook runs in the forked child before exec and only makes the system calls
    // unshare, pipe2, fork, close, close_range, prctl, poll, waitpid, sigaction, kill and _exit,
    // all async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWPID) != 0 {
                return Ok(());
            }
            // Open in the keeper as long as it lives: the program checks it once its death
            // signal is armed, as the keeper might have died before.
            let mut alive = [0; 2];
            if libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(io::Error::last_os_error());
            }
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => {
                    libc::close(alive[1]);
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                        libc::_exit(127);
                    }
                    let mut keeper = libc::pollfd {
                        fd: alive[0],
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    if libc::poll(&mut keeper, 1, 0) != 0 {
                        libc::_exit(127);
                    }
                    libc::close(alive[0]);
                    Ok(())
                }
                program => keep(program, alive[1]),
            }
        });
    }
}

/// The keeper of [`in_own_pid_namespace`]: holds nothing open but `alive`, its end of the pipe
/// the program checks it by (the caller's stdio and the pipe on which the spawning process
/// learns of a failed exec belong to the program), waits
/// for `program` and ends as it did: with its exit code, or of its signal.
///
/// # Safety
///
/// Only between fork and exec, in a child whose `program` is its own child.
unsafe fn keep(program: libc::pid_t, alive: RawFd) -> ! {
    // SAFETY: close_range, waitpid, sigaction, sigprocmask, kill and _exit are async-signal-
    // safe; every pointer given is to a live local (the status, the zeroed sigaction and
    // sigset_t, initialised before use) or null where the call allows it.
    unsafe {
        let alive = alive.unsigned_abs();
        if alive > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, alive - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, alive + 1, u32::MAX, 0u32);
        let mut status: libc::c_int = 0;
        loop {
            if libc::waitpid(program, &mut status, 0) == program {
                break;
            }
            if *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let signal = libc::WTERMSIG(status);
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &default, std::ptr::null_mut());
        let mut only: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut only);
        libc::sigaddset(&mut only, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal)
    }
}

/// Marks every descriptor from `first` up close-on-exec, so a child started next gets none of
/// them, whichever of them someone forgot to open with `O_CLOEXEC`. Safe to call between fork
/// and exec. Every descriptor DynoCap opens is close-on-exec already, so on a kernel without
/// `CLOSE_RANGE_CLOEXEC` (before 5.11) this second line of defence is skipped.
pub fn cloexec_from(first: u32) {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only changes descriptor flags; it closes
    // nothing and touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// Makes `fd` the descriptor `target` of a child about to exec, without close-on-exec (so it
/// crosses exec). For a `pre_exec` hook, after [`cloexec_from`]/[`die_with_parent`] marked
/// everything else: async-signal-safe (dup2 and fcntl only, no allocation).
pub fn inherit_as(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: dup2 and fcntl only change this process's descriptor table; a bad number is
    // reported as an error, never undefined behaviour.
    unsafe {
        if fd == target {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
        } else if libc::dup2(fd, target) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Kills every process left in the session `leader` led (a supervisor: its session id is its
/// pid), `leader` included: the helpers of a supervisor that died, or is being killed.
///
/// Pid reuse cannot make this kill a stranger. A session id stays reserved while any member
/// lives, so members found while `leader`'s pid is free or still `leader`'s are members; if the
/// pid belongs to another process now, the session is long gone and nothing is done. Each
/// process is signalled through a pidfd, after checking that the pid still names the process
/// found.
pub fn kill_session(leader: ProcessId) {
    let me = std::process::id();
    let mut signalled = HashSet::new();
    // A member forking while we sweep puts a new process in the session: sweep again until a
    // pass finds no one new. Killed processes cannot fork, so this ends.
    loop {
        if pid_taken_by_another(leader) {
            return;
        }
        let found: Vec<Member> = session_members(leader.pid)
            .into_iter()
            .filter(|m| u32::try_from(m.pid).ok() != Some(me))
            .filter(|m| !signalled.contains(m))
            .collect();
        if found.is_empty() {
            return;
        }
        for member in found {
            kill_member(member, leader.pid);
            signalled.insert(member);
        }
    }
}

/// A live (not zombie) process of a session, as /proc showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Member {
    pid: i32,
    start_ticks: u64,
}

/// The fields of `/proc/PID/stat` this module needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    state: char,
    session: i32,
    start_ticks: u64,
}

/// Parses a `/proc/PID/stat` line. The command name may hold spaces and parentheses, so fields
/// are counted from the last `)`: state is field 3, session 6, start time 22.
fn parse_stat(line: &str) -> Option<Stat> {
    let rest = line.get(line.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split(' ').collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        session: fields.get(3)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
    })
}

fn stat_of(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// True when `leader`'s pid now names a process that is not `leader`.
fn pid_taken_by_another(leader: ProcessId) -> bool {
    stat_of(leader.pid).is_some_and(|stat| stat.start_ticks != leader.start_ticks)
}

fn session_members(session: i32) -> Vec<Member> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = stat_of(pid)?;
            (stat.session == session && !matches!(stat.state, 'Z' | 'X')).then_some(Member {
                pid,
                start_ticks: stat.start_ticks,
            })
        })
        .collect()
}

/// `pidfd_open(2)`: a descriptor of process `pid` that stays its own whoever takes the pid
/// later; `None` when there is no such process (or no pidfd support).
pub(crate) fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // A pid of 0 or below names no one process.
    let pid = rustix::process::Pid::from_raw(pid.max(0))?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// SIGKILL for `member`, unless its pid names another process by now.
fn kill_member(member: Member, session: i32) {
    let Some(pidfd) = pidfd_open(member.pid) else {
        return; // gone already
    };
    // The pidfd pins the process that had the pid when it was opened; if /proc still shows the
    // member's start time under that pid, the pidfd is the member.
    let same = stat_of(member.pid)
        .is_some_and(|s| s.start_ticks == member.start_ticks && s.session == session);
    if !same {
        return;
    }
    // ESRCH: it ended meanwhile; nothing else can fail for a pidfd of ours.
    let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    #[test]
    fn stat_lines_parse_from_the_last_parenthesis() {
        let line = "4242 (a (b) c) S 1 4242 4100 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 100 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                session: 4100,
                start_ticks: 987_654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    /// Waits (bounded: a hang detector, not a timing assertion) until `pid` is gone or a zombie.
    fn dead(pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if stat_of(pid).is_none_or(|s| matches!(s.state, 'Z' | 'X')) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Runs `sh -c script` with [`die_with_parent`], in a session of its own when `leader`;
    /// returns it and the pids the script wrote to `pids` (one line, spaces between).
    fn sh(script: &str, leader: bool, pids: &std::path::Path) -> (std::process::Child, Vec<i32>) {
        let mut command = Command::new("sh");
        command
            .args([
                "-c",
                &format!(
                    "{script}\necho $$ $! > {0}.tmp; mv {0}.tmp {0}; wait",
                    pids.display()
                ),
            ])
            .stdin(Stdio::null());
        die_with_parent(&mut command);
        if leader {
            // SAFETY: setsid between fork and exec: async-signal-safe, touches no memory.
            unsafe {
                command.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("spawn sh");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pids.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let text = std::fs::read_to_string(pids).expect("the script reported its pids");
        let ids = text
            .split_whitespace()
            .map(|p| p.parse().expect("pid"))
            .collect();
        (child, ids)
    }

    #[test]
    fn a_child_dies_with_the_thread_that_spawned_it() {
        let pid = std::thread::spawn(|| {
            let mut command = Command::new("sleep");
            command.arg("600").stdin(Stdio::null());
            die_with_parent(&mut command);
            let child = command.spawn().expect("spawn sleep");
            let pid = i32::try_from(child.id()).expect("pid");
            // The handle goes, the process stays: only the thread's end may kill it.
            std::mem::forget(child);
            pid
        })
        .join()
        .expect("spawning thread");
        assert!(dead(pid), "the child outlived the thread that spawned it");
    }

    #[test]
    fn the_session_sweep_takes_what_the_death_signal_misses() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (mut leader, ids) = sh("sleep 600 &", true, &tmp.path().join("pids"));
        let (sh_pid, sleep_pid) = (ids[0], ids[1]);
        let sh_id = ProcessId::of(sh_pid).expect("sh runs");
        // The leader dies; its child has no death signal (the kernel clears it on fork).
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sh_pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = leader.wait();
        assert!(
            stat_of(sleep_pid).is_some_and(|s| s.session == sh_pid && s.state != 'Z'),
            "the grandchild should still run in the dead leader's session"
        );
        kill_session(sh_id);
        assert!(dead(sleep_pid), "the grandchild survived the session sweep");
    }

    /// The running processes whose command line holds `marker`.
    fn running_with(marker: &str) -> Vec<i32> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| stat_of(pid).is_some_and(|s| !matches!(s.state, 'Z' | 'X')))
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.windows(marker.len()).any(|w| w == marker.as_bytes()))
            })
            .collect()
    }

    #[test]
    fn a_program_in_its_own_pid_namespace_takes_its_children_along() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: a pid namespace needs root (CI runs as root)");
            return;
        }
        // A grandchild with no death signal, as git's pack-objects: killing the keeper (the
        // child a caller holds) must end it, with the program.
        let marker = "607.25";
        let mut command = Command::new("sh");
        command
            // The marker is in the grandchild's command line only.
            .args(["-c", "m=607; sleep $m.25 & echo started; wait"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        die_with_parent(&mut command);
        in_own_pid_namespace(&mut command);
        let mut child = command.spawn().expect("spawn sh");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("read");
        assert_eq!(line, "started\n");
        assert_eq!(running_with(marker).len(), 1, "the grandchild runs");
        child.kill().expect("kill the keeper");
        let _ = child.wait();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !running_with(marker).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            running_with(marker),
            Vec::<i32>::new(),
            "the grandchild survived"
        );
    }

    #[test]
    fn the_keeper_ends_as_its_program_did() {
        for code in [0, 3] {
            let mut command = Command::new("sh");
            command
                .args(["-c", &format!("exit {code}")])
                .stdin(Stdio::null());
            die_with_parent(&mut command);
            in_own_pid_namespace(&mut command);
            let status = command.status().expect("run sh");
            assert_eq!(status.code(), Some(code));
        }
        // A program that cannot start is the spawn's error, as without a namespace.
        let mut command = Command::new("/nonexistent/program");
        die_with_parent(&mut command);
        in_own_pid_namespace(&mut command);
        let err = command.status().expect_err("no such program");
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    }

    #[test]
    fn a_reused_leader_pid_stops_the_sweep() {
        let me = ProcessId::of(i32::try_from(std::process::id()).expect("pid")).expect("self");
        let stranger = ProcessId {
            pid: me.pid,
            start_ticks: me.start_ticks + 1,
        };
        assert!(pid_taken_by_another(stranger));
        assert!(!pid_taken_by_another(me));
    }
}
