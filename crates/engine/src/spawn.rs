//! Starting a host child without `fork`: glibc's `posix_spawn`, which clones with
//! `CLONE_VM | CLONE_VFORK`, so nothing of this process's memory map is copied and the
//! allocator's locks (which `fork` takes, stopping every other thread that allocates) are not
//! touched. For a supervisor verifying a patch, `fork` cost 1–2.5 ms before git ran, while the
//! thread extracting the baseline waited on the allocator.
//!
//! `std::process::Command` does the same unless a `pre_exec` hook is set, and
//! [`die_with_parent`](crate::host_children::die_with_parent) sets one. A child started here
//! gets no death signal, so it is only for children whose work is bounded by what the caller
//! feeds them (see [`spawn`]); it inherits no descriptor beyond its stdio and the one named,
//! as with `die_with_parent`.

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

/// Starts `command` (whose environment was cleared: only the variables it sets are passed)
/// with `stdio`, `inherit` (a descriptor of this process and the number it gets in the child,
/// 3 or more), in a process group of its own when `own_group`. The child's signal mask is
/// empty and SIGPIPE is back to its default, as `Command` does; it has no other descriptor.
///
/// The program is looked up in the command's `PATH` here, before the child exists.
pub fn spawn(
    command: &Command,
    stdio: &Stdio<'_>,
    inherit: Option<(RawFd, RawFd)>,
    own_group: bool,
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
    // A source among 0–2 could be overwritten by an earlier dup2 in the child: such a one is
    // duplicated above them first (kept open until the child has its own).
    let mut lifted: Vec<OwnedFd> = Vec::new();
    let mut sources = Vec::with_capacity(3);
    for fd in [stdio.stdin, stdio.stdout, stdio.stderr] {
        if fd.as_raw_fd() > 2 {
            sources.push(fd.as_raw_fd());
        } else {
            let raised = duplicate_from(fd.as_raw_fd(), 3)?;
            sources.push(raised.as_raw_fd());
            lifted.push(raised);
        }
    }
    // The inherited descriptor is handed over from a duplicate numbered above its target: a
    // dup2 onto itself would keep it close-on-exec on older C libraries, and one below 3
    // would be overwritten by stdio first.
    let inherit = match inherit {
        Some((_, target)) if target < 3 => {
            return Err(io::Error::other(format!(
                "a child's descriptor {target} is its stdio, not one to inherit"
            )))
        }
        Some((fd, target)) => {
            let raised = duplicate_from(fd, target + 1)?;
            let number = raised.as_raw_fd();
            lifted.push(raised);
            Some((number, target))
        }
        None => None,
    };

    let mut actions = FileActions::new()?;
    for (fd, target) in sources.into_iter().zip(0..) {
        actions.dup2(fd, target)?;
    }
    let first_closed = match inherit {
        Some((fd, target)) => {
            actions.dup2(fd, target)?;
            target + 1
        }
        None => 3,
    };
    actions.close_from(first_closed)?;
    let attributes = Attributes::new(own_group)?;
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
/// process), and a process group of its own when asked; destroyed on drop.
struct Attributes(libc::posix_spawnattr_t);

impl Attributes {
    fn new(own_group: bool) -> io::Result<Self> {
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
            if own_group {
                flags |= libc::POSIX_SPAWN_SETPGROUP;
                check(libc::posix_spawnattr_setpgroup(&mut attributes.0, 0))?;
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

    /// Runs `sh -c script` through [`spawn`] with `input` on stdin; its exit status, stdout
    /// and stderr.
    fn sh(script: &str, input: &[u8], own_group: bool) -> (ExitStatus, String, String, u32) {
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
            None,
            own_group,
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
        let (status, out, err, _) = sh(&script, b"fed\n", false);
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
    fn sigpipe_is_back_to_its_default_and_the_group_is_its_own() {
        // Rust ignores SIGPIPE in this process; the child dies of it, as after `Command`.
        let (status, out, _, _) = sh("kill -PIPE $$; echo survived", b"", false);
        assert_eq!(status.signal(), Some(libc::SIGPIPE), "{out}");
        // Field 5 of /proc/PID/stat is the process group.
        let (status, out, _, pid) = sh("cut -d' ' -f5 /proc/$$/stat", b"", true);
        assert!(status.success());
        assert_eq!(out.trim(), pid.to_string());
        let (_, out, _, pid) = sh("cut -d' ' -f5 /proc/$$/stat", b"", false);
        assert_ne!(out.trim(), pid.to_string());
    }

    #[test]
    fn a_missing_program_is_an_error_before_any_child() {
        let mut command = Command::new("no-such-program-dynocap");
        command.env_clear().env("PATH", "/usr/bin:/bin");
        let (a, b) = pipe();
        let err = spawn(
            &command,
            &Stdio {
                stdin: &a,
                stdout: &b,
                stderr: &b,
            },
            None,
            false,
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
        let mut command = Command::new("sh");
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .args(["-c", "cat /proc/self/fd/3/marker; ls /proc/self/fd | wc -l"]);
        let (in_read, _in_write) = pipe();
        let (out_read, out_write) = pipe();
        let mut child = spawn(
            &command,
            &Stdio {
                stdin: &in_read,
                stdout: &out_write,
                stderr: &out_write,
            },
            Some((fd.as_raw_fd(), 3)),
            false,
        )
        .expect("spawn");
        drop(out_write);
        let mut out = String::new();
        std::fs::File::from(out_read)
            .read_to_string(&mut out)
            .expect("read");
        assert!(child.wait().expect("wait").success());
        // The marker, then 0–2, 3 and ls's own directory.
        assert_eq!(out, "here5\n");
    }
}
