//! Starting a host child without `fork`: glibc's `posix_spawn`, which clones with
//! `CLONE_VM | CLONE_VFORK`, so nothing of this process's memory map is copied and the
//! allocator's locks (which `fork` takes, stopping every other thread that allocates) are not
//! touched. For a supervisor verifying a patch, `fork` delayed git while the thread extracting
//! the baseline waited on the allocator; for the MCP server, it delayed every sandbox's
//! supervisor (docs/performance.md, "Design measurements").
//!
//! `std::process::Command` does the same unless a `pre_exec` hook is set, and
//! [`die_with_parent`](crate::host::host_children::die_with_parent) sets one. A child started here
//! gets no death signal: it is for children whose work is bounded by what the caller feeds
//! them (a verification's git), or that must outlive the caller anyway (a supervisor, in a
//! session of its own). It inherits no descriptor beyond its stdio and the ones named, as with
//! `die_with_parent`.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// What the child's descriptors 0, 1 and 2 are.
pub struct Stdio<'a> {
    pub stdin: &'a OwnedFd,
    pub stdout: &'a OwnedFd,
    pub stderr: &'a OwnedFd,
}

/// A child started by [`spawn`], reaped by [`wait`](Self::wait) or
/// [`try_wait`](Self::try_wait). Dropping it unreaped leaves a zombie until this process
/// ends: callers kill and wait.
#[derive(Debug)]
pub struct Spawned {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
}

impl Spawned {
    pub fn id(&self) -> u32 {
        self.pid.unsigned_abs()
    }

    /// Waits for the child to end.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.reap(0)? {
                return Ok(status);
            }
        }
    }

    /// The child's status if it has ended.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Leaves the child to be reaped when it ends, by no one waiting for it: a task of the
    /// current tokio runtime that watches its pidfd, else a thread of its own. For a child
    /// that outlives the call (a supervisor), in a process that may outlive the child (the
    /// MCP server), which must not collect zombies.
    pub fn reap_in_background(mut self) {
        if let (Ok(runtime), Some(pidfd)) = (
            tokio::runtime::Handle::try_current(),
            crate::host::host_children::pidfd_open(self.pid),
        ) {
            let _entered = runtime.enter();
            if let Ok(exited) = tokio::io::unix::AsyncFd::new(pidfd) {
                runtime.spawn(async move {
                    // Readable once the child has exited; an error ends the watch, and the
                    // reap below then collects it if it is gone already.
                    let _ = exited.readable().await;
                    let _ = self.try_wait();
                });
                return;
            }
        }
        let waiter = std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || {
                let _ = self.wait();
            });
        // No thread to spare: the child stays a zombie until this process ends.
        drop(waiter);
    }

    fn reap(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw: libc::c_int = 0;
        // SAFETY: waitpid writes the status into `raw`, a live c_int; the pid is this
        // process's own unreaped child.
        let pid = unsafe { libc::waitpid(self.pid, &mut raw, flags) };
        match pid {
            0 => Ok(None),
            -1 => {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    return Ok(None);
                }
                Err(err)
            }
            _ => {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                Ok(Some(status))
            }
        }
    }
}

/// How a child started by [`spawn`] stands apart from this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detach {
    /// In this process's group and session.
    No,
    /// In a process group of its own (so it and what it starts can be killed together).
    Group,
    /// In a session of its own, leading it: it outlives this process's terminal and its ^C.
    Session,
}

/// Starts `command` (whose environment was cleared: only the variables it sets are passed)
/// with `stdio` and `inherit` (descriptors of this process, each with the number it gets in
/// the child: 3 or more, all different), detached as `detach` says. The child's signal mask
/// is empty and SIGPIPE is back to its default, as `Command` does; it has no other descriptor.
///
/// The program is looked up in the command's `PATH` here, before the child exists.
pub fn spawn(
    command: &Command,
    stdio: &Stdio<'_>,
    inherit: &[(RawFd, RawFd)],
    detach: Detach,
) -> io::Result<Spawned> {
    let envs: Vec<(&OsStr, &OsStr)> = command
        .get_envs()
        .filter_map(|(key, value)| value.map(|value| (key, value)))
        .collect();
    let path = envs
        .iter()
        .find(|(key, _)| *key == "PATH")
        .map(|(_, value)| *value);
    let program = resolve(command.get_program(), path)?;
    let program = c_string(program.as_os_str())?;
    let argv_owned: Vec<CString> = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(c_string)
        .collect::<io::Result<_>>()?;
    let env_owned: Vec<CString> = envs
        .iter()
        .map(|(key, value)| {
            let mut pair = key.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            c_string(OsStr::from_bytes(&pair))
        })
        .collect::<io::Result<_>>()?;
    let argv = null_terminated(&argv_owned);
    let envp = null_terminated(&env_owned);
    let mut targets: Vec<RawFd> = inherit.iter().map(|&(_, target)| target).collect();
    targets.sort_unstable();
    if let Some(&target) = targets.first().filter(|&&target| target < 3) {
        return Err(io::Error::other(format!(
            "a child's descriptor {target} is its stdio, not one to inherit"
        )));
    }
    if targets.windows(2).any(|pair| pair[0] == pair[1]) {
        return Err(io::Error::other(
            "two descriptors to inherit under one number",
        ));
    }
    // Every source is handed over from a duplicate numbered above all the targets: a dup2
    // onto itself would keep it close-on-exec on older C libraries, and a source among the
    // targets (or among 0–2) could be overwritten by an earlier dup2 in the child. The
    // duplicates stay open until the child has its own.
    let above = targets.last().map_or(3, |&top| top + 1);
    let mut lifted: Vec<OwnedFd> = Vec::new();
    let mut lift = |fd: RawFd| -> io::Result<RawFd> {
        let raised = duplicate_from(fd, above)?;
        let number = raised.as_raw_fd();
        lifted.push(raised);
        Ok(number)
    };
    let mut sources = Vec::with_capacity(3);
    for fd in [stdio.stdin, stdio.stdout, stdio.stderr] {
        sources.push(if fd.as_raw_fd() >= above {
            fd.as_raw_fd()
        } else {
            lift(fd.as_raw_fd())?
        });
    }
    let handed: Vec<(RawFd, RawFd)> = inherit
        .iter()
        .map(|&(fd, target)| Ok((lift(fd)?, target)))
        .collect::<io::Result<_>>()?;

    let mut actions = FileActions::new()?;
    for (fd, target) in sources.into_iter().zip(0..) {
        actions.dup2(fd, target)?;
    }
    for (fd, target) in handed {
        actions.dup2(fd, target)?;
    }
    actions.close_from(above)?;
    let attributes = Attributes::new(detach)?;
    let _kept_until_spawned = lifted;

    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is live for the call: the program and the NULL-terminated argv
    // and envp arrays point into CStrings owned above; the file actions and attributes were
    // initialised by their constructors and are destroyed by their Drop after the call.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            program.as_ptr(),
            &actions.0,
            &attributes.0,
            argv.as_ptr(),
            envp.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(Spawned { pid, status: None })
}

/// `program` as a path: as given when it holds a `/`, else the first executable file of that
/// name in `path` (the child's PATH).
fn resolve(program: &OsStr, path: Option<&OsStr>) -> io::Result<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let path = path.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is not found: no PATH", program.to_string_lossy()),
        )
    })?;
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not in PATH", program.to_string_lossy()),
            )
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

fn c_string(text: &OsStr) -> io::Result<CString> {
    CString::new(text.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?} holds a NUL byte", text),
        )
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*mut libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr().cast_mut())
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect()
}

/// A close-on-exec duplicate of `fd` numbered `lowest` or more.
fn duplicate_from(fd: RawFd, lowest: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl with F_DUPFD_CLOEXEC reads no memory; a number that is not an open
    // descriptor is an EBADF error.
    let raised = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, lowest) };
    if raised < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raised) })
}

/// `posix_spawn_file_actions_t`, destroyed on drop.
struct FileActions(libc::posix_spawn_file_actions_t);

impl FileActions {
    fn new() -> io::Result<Self> {
        // SAFETY: an all-zero posix_spawn_file_actions_t is a valid place for init to write to.
        let mut actions = FileActions(unsafe { std::mem::zeroed() });
        // SAFETY: init only writes into the struct, owned by `actions`.
        check(unsafe { libc::posix_spawn_file_actions_init(&mut actions.0) })?;
        Ok(actions)
    }

    fn dup2(&mut self, fd: RawFd, target: RawFd) -> io::Result<()> {
        // SAFETY: the actions were initialised; adddup2 copies the two numbers.
        check(unsafe { libc::posix_spawn_file_actions_adddup2(&mut self.0, fd, target) })
    }

    fn close_from(&mut self, first: RawFd) -> io::Result<()> {
        // SAFETY: the actions were initialised; addclosefrom_np (glibc 2.34) records a number.
        check(unsafe { libc::posix_spawn_file_actions_addclosefrom_np(&mut self.0, first) })
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// `posix_spawnattr_t`: an empty signal mask, SIGPIPE at its default (Rust ignores it in this
/// process), and the group or session [`Detach`] asks for; destroyed on drop.
struct Attributes(libc::posix_spawnattr_t);

impl Attributes {
    fn new(detach: Detach) -> io::Result<Self> {
        // SAFETY: an all-zero posix_spawnattr_t is a valid place for init to write to.
        let mut attributes = Attributes(unsafe { std::mem::zeroed() });
        // SAFETY: init only writes into the struct, owned by `attributes`.
        check(unsafe { libc::posix_spawnattr_init(&mut attributes.0) })?;
        let mut flags = libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
        // SAFETY: the sigset_t values are local and initialised by sigemptyset before use;
        // the setters copy them into the initialised attributes.
        unsafe {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            check(libc::posix_spawnattr_setsigmask(&mut attributes.0, &empty))?;
            let mut pipe: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            check(libc::posix_spawnattr_setsigdefault(
                &mut attributes.0,
                &pipe,
            ))?;
            match detach {
                Detach::No => {}
                Detach::Group => {
                    flags |= libc::POSIX_SPAWN_SETPGROUP;
                    check(libc::posix_spawnattr_setpgroup(&mut attributes.0, 0))?;
                }
                // glibc 2.26 and newer: setsid in the child.
                Detach::Session => flags |= libc::POSIX_SPAWN_SETSID,
            }
            let flags = libc::c_short::try_from(flags).map_err(io::Error::other)?;
            check(libc::posix_spawnattr_setflags(&mut attributes.0, flags))?;
        }
        Ok(attributes)
    }
}

impl Drop for Attributes {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe")
    }

    /// `program` with only PATH in its environment.
    fn bare(program: &str) -> Command {
        let mut command = Command::new(program);
        command.env_clear().env("PATH", "/usr/bin:/bin");
        command
    }

    /// Stdin from `input`; stdout and stderr both to `output`.
    fn stdio<'a>(input: &'a OwnedFd, output: &'a OwnedFd) -> Stdio<'a> {
        Stdio {
            stdin: input,
            stdout: output,
            stderr: output,
        }
    }

    /// Everything written to `fd`'s pipe until its last writer closed it.
    fn read_all(fd: OwnedFd) -> String {
        let mut text = String::new();
        std::fs::File::from(fd)
            .read_to_string(&mut text)
            .expect("read");
        text
    }

    /// Runs `sh -c script` through [`spawn`] with `input` on stdin; its exit status, stdout
    /// and stderr.
    fn sh(script: &str, input: &[u8], detach: Detach) -> (ExitStatus, String, String, u32) {
        let mut command = Command::new("sh");
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("ONLY", "this")
            .arg("-c")
            .arg(script);
        let (in_read, in_write) = pipe();
        let (out_read, out_write) = pipe();
        let (err_read, err_write) = pipe();
        let mut child = spawn(
            &command,
            &Stdio {
                stdin: &in_read,
                stdout: &out_write,
                stderr: &err_write,
            },
            &[],
            detach,
        )
        .expect("spawn");
        drop((in_read, out_write, err_write));
        std::fs::File::from(in_write)
            .write_all(input)
            .expect("feed");
        let (mut out, mut err) = (String::new(), String::new());
        std::fs::File::from(out_read)
            .read_to_string(&mut out)
            .expect("stdout");
        std::fs::File::from(err_read)
            .read_to_string(&mut err)
            .expect("stderr");
        let pid = child.id();
        let status = child.wait().expect("wait");
        assert_eq!(
            child.try_wait().expect("again"),
            Some(status),
            "reaped once, kept"
        );
        (status, out, err, pid)
    }

    #[test]
    fn the_child_gets_its_stdio_its_environment_and_nothing_else() {
        // A descriptor this process opened without close-on-exec does not cross.
        let (leak_read, _leak_write) = nix::unistd::pipe().expect("pipe");
        let script = format!(
            "cat; echo \"$ONLY-${{HOME:-unset}}\"; ls /proc/self/fd; \
             test -e /proc/self/fd/{} && echo leaked >&2; exit 7",
            leak_read.as_raw_fd()
        );
        let (status, out, err, _) = sh(&script, b"fed\n", Detach::No);
        assert_eq!(status.code(), Some(7));
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("fed"));
        assert_eq!(lines.next(), Some("this-unset"));
        // ls's own listing: 0–2, and the directory it reads (3).
        let fds: Vec<&str> = lines.collect();
        assert_eq!(fds, ["0", "1", "2", "3"], "{err}");
        assert!(!err.contains("leaked"), "{err}");
    }

    #[test]
    fn sigpipe_is_back_to_its_default_and_the_group_or_session_is_its_own() {
        // Rust ignores SIGPIPE in this process; the child dies of it, as after `Command`.
        let (status, out, _, _) = sh("kill -PIPE $$; echo survived", b"", Detach::No);
        assert_eq!(status.signal(), Some(libc::SIGPIPE), "{out}");
        // Fields 5 and 6 of /proc/PID/stat are the process group and the session.
        let ids = "cut -d' ' -f5,6 /proc/$$/stat";
        let (status, out, _, pid) = sh(ids, b"", Detach::Group);
        assert!(status.success());
        let (group, session) = out.trim().split_once(' ').expect("two fields");
        assert_eq!(group, pid.to_string());
        assert_ne!(session, pid.to_string());
        let (_, out, _, pid) = sh(ids, b"", Detach::Session);
        assert_eq!(
            out.trim(),
            format!("{pid} {pid}"),
            "leads a session of its own"
        );
        let (_, out, _, pid) = sh(ids, b"", Detach::No);
        assert!(
            !out.trim().split(' ').any(|id| id == pid.to_string()),
            "{out}"
        );
    }

    #[test]
    fn a_missing_program_is_an_error_before_any_child() {
        let (a, b) = pipe();
        let err = spawn(
            &bare("no-such-program-dynocap"),
            &stdio(&a, &b),
            &[],
            Detach::No,
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("not in PATH"), "{err}");
    }

    #[test]
    fn a_named_descriptor_crosses_as_its_number() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("marker"), "here").expect("write");
        let fd = nix::fcntl::open(
            dir.path(),
            nix::fcntl::OFlag::O_RDONLY
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .expect("open");
        let mut command = bare("sh");
        command.args(["-c", "cat /proc/self/fd/3/marker; ls /proc/self/fd | wc -l"]);
        let (in_read, _in_write) = pipe();
        let (out_read, out_write) = pipe();
        let mut child = spawn(
            &command,
            &stdio(&in_read, &out_write),
            &[(fd.as_raw_fd(), 3)],
            Detach::No,
        )
        .expect("spawn");
        drop(out_write);
        let out = read_all(out_read);
        assert!(child.wait().expect("wait").success());
        // The marker, then 0–2, 3 and ls's own directory.
        assert_eq!(out, "here5\n");
    }

    #[test]
    fn two_descriptors_cross_as_their_numbers() {
        // Whatever numbers the two write ends have here (the harness runs tests in parallel,
        // so they cannot be chosen), they are 3 and 4 in the child.
        let (a_read, a_write) = pipe();
        let (b_read, b_write) = pipe();
        let (out_read, out_write) = pipe();
        let mut command = bare("sh");
        command.args([
            "-c",
            "echo to-a >&3; echo to-b >&4; ls /proc/self/fd | wc -l",
        ]);
        let (in_read, _in_write) = pipe();
        let mut child = spawn(
            &command,
            &stdio(&in_read, &out_write),
            &[(a_write.as_raw_fd(), 3), (b_write.as_raw_fd(), 4)],
            Detach::No,
        )
        .expect("spawn");
        drop((a_write, b_write, out_write));
        assert!(child.wait().expect("wait").success());
        assert_eq!(read_all(a_read), "to-a\n");
        assert_eq!(read_all(b_read), "to-b\n");
        // 0–2, 3, 4 and ls's own directory.
        assert_eq!(read_all(out_read), "6\n");
        let err = spawn(
            &command,
            &stdio(&in_read, &in_read),
            &[(in_read.as_raw_fd(), 3), (in_read.as_raw_fd(), 3)],
            Detach::No,
        )
        .unwrap_err();
        assert!(err.to_string().contains("under one number"), "{err}");
    }

    /// Starts `sleep` for a moment and leaves it to [`Spawned::reap_in_background`]; its
    /// /proc directory, which stays while it is an unreaped zombie.
    fn sleep_left_to_reap() -> std::path::PathBuf {
        let mut command = bare("sleep");
        command.arg("0.05");
        let (a, b) = pipe();
        let child = spawn(&command, &stdio(&a, &b), &[], Detach::Session).expect("spawn");
        let proc_dir = std::path::PathBuf::from(format!("/proc/{}", child.id()));
        child.reap_in_background();
        proc_dir
    }

    fn gone_within_seconds(dir: &Path, seconds: u64) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        while dir.exists() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        true
    }

    #[test]
    fn a_child_left_to_the_background_is_reaped_with_or_without_a_runtime() {
        assert!(
            gone_within_seconds(&sleep_left_to_reap(), 10),
            "no runtime: a thread reaps it"
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // The runtime's thread drives the reaping task while a blocking thread looks.
        let reaped = runtime.block_on(async {
            let dir = sleep_left_to_reap();
            tokio::task::spawn_blocking(move || gone_within_seconds(&dir, 10))
                .await
                .expect("the check ran")
        });
        assert!(reaped, "a runtime's task reaps it");
    }
}
