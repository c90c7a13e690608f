//! The attributes of a process that a command it runs would inherit, and that decide what
//! that command may do: user and groups, capabilities, `no_new_privs`, seccomp, namespaces,
//! root directory, resource limits, cgroups, scheduling and I/O priority, CPU and memory
//! affinity, OOM score, execution domain, security label. Read from `/proc/<pid>` (and
//! `ioprio_get`), the same way for this process and for another, so that the client can name
//! its server's socket after its own ([`crate::rendezvous`]) and the server can compare a
//! connecting client's, read from the kernel, with its own.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The namespaces a command runs in, each compared by its `/proc/<pid>/ns/` inode.
const NAMESPACES: [&str; 8] = ["mnt", "pid", "net", "user", "ipc", "uts", "cgroup", "time"];

/// Files of `/proc/<pid>` whose whole contents are attributes a command's processes
/// inherit and that only the process itself can change: execution domain, LSM label.
const OWN_ONLY_FILES: [&str; 2] = ["personality", "attr/current"];

/// Files of `/proc/<pid>` whose whole contents are attributes a command's processes
/// inherit and that other processes can change: resource limits, cgroups, OOM score.
const CHANGEABLE_FILES: [&str; 3] = ["limits", "cgroup", "oom_score_adj"];

/// The lines of `/proc/<pid>/status` that are inherited attributes (the rest are counters
/// and state): ids and groups, capabilities, `no_new_privs`, seccomp, CPU and memory-node
/// affinity.
const STATUS_FIELDS: [&str; 14] = [
    "Uid:",
    "Gid:",
    "Groups:",
    "CapInh:",
    "CapPrm:",
    "CapEff:",
    "CapBnd:",
    "CapAmb:",
    "NoNewPrivs:",
    "Seccomp:",
    "Seccomp_filters:",
    "Speculation_Store_Bypass:",
    "Cpus_allowed_list:",
    "Mems_allowed_list:",
];

/// The fields of `/proc/<pid>/stat` that are inherited attributes, counted from the first
/// after the command's name (the state, field 3 of proc(5)), with their names: nice,
/// real-time priority and scheduling policy (fields 19, 40 and 41).
const STAT_FIELDS: [(&str, usize); 3] = [
    ("nice", 19 - 3),
    ("rt_priority", 40 - 3),
    ("policy", 41 - 3),
];

/// One attribute: its name, and its value as the kernel shows it, or the error (an errno)
/// that reading it gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    pub name: String,
    pub value: Result<Vec<u8>, i32>,
}

/// A process whose attributes are read: its `/proc` directory, and its pid for the one
/// attribute `/proc` does not show (the I/O priority).
pub struct Process {
    dir: PathBuf,
    pid: libc::pid_t,
}

impl Process {
    /// This process.
    pub fn current() -> Self {
        Self {
            dir: PathBuf::from("/proc/self"),
            pid: std::process::id().cast_signed(),
        }
    }

    /// Process `pid` of this process's pid namespace, as `/proc` shows it.
    pub fn with_pid(pid: libc::pid_t) -> Self {
        Self {
            dir: PathBuf::from(format!("/proc/{pid}")),
            pid,
        }
    }

    /// Every attribute, in a fixed order: [`Process::own_only`], then
    /// [`Process::changeable`].
    pub fn attributes(&self) -> Vec<Attribute> {
        let mut out = self.own_only();
        out.extend(self.changeable());
        out
    }

    /// The attributes only the process itself can change (namespaces, root directory,
    /// execution domain, security label): a process that does not change them may read its
    /// own once.
    pub fn own_only(&self) -> Vec<Attribute> {
        let mut out = Vec::with_capacity(NAMESPACES.len() + 1 + OWN_ONLY_FILES.len());
        // Where the process is first: in another namespace, the rest reads otherwise too
        // (capabilities are a user namespace's), and the namespace is what to name.
        for name in NAMESPACES {
            out.push(attribute(
                &format!("{name} namespace"),
                self.identity(&Path::new("ns").join(name)),
            ));
        }
        out.push(attribute(
            "root directory",
            self.identity(Path::new("root")),
        ));
        for name in OWN_ONLY_FILES {
            out.push(attribute(name, self.read(name)));
        }
        out
    }

    /// The attributes other processes can change too, or that the kernel shows in the same
    /// files as those (`prlimit`, `renice`, `chrt`, `ionice -p`, `taskset -p`, a write to a
    /// cgroup's `cgroup.procs` or to `oom_score_adj`): read afresh for every comparison.
    pub fn changeable(&self) -> Vec<Attribute> {
        let mut out = Vec::with_capacity(STATUS_FIELDS.len() + 8);
        let status = self.read("status");
        for field in STATUS_FIELDS {
            let value = status.as_ref().map_err(Clone::clone).and_then(|status| {
                status_line(status, field).map_or(Err(libc::ENOENT), |line| Ok(line.to_vec()))
            });
            out.push(attribute(field.trim_end_matches(':'), value));
        }
        for name in CHANGEABLE_FILES {
            out.push(attribute(name, self.read(name)));
        }
        let stat = self.read("stat");
        for (name, index) in STAT_FIELDS {
            let value = stat.as_ref().map_err(Clone::clone).and_then(|stat| {
                stat_field(stat, index).map_or(Err(libc::ENOENT), |field| Ok(field.to_vec()))
            });
            out.push(attribute(name, value));
        }
        out.push(attribute("I/O priority", io_priority(self.pid)));
        out
    }

    /// The umask, from `/proc/<pid>/status` (Linux 4.7+).
    pub fn umask(&self) -> Result<u32, i32> {
        let status = self.read("status")?;
        let line = status_line(&status, "Umask:").ok_or(libc::ENOENT)?;
        let text = std::str::from_utf8(line).map_err(|_| libc::EINVAL)?;
        u32::from_str_radix(text.trim(), 8).map_err(|_| libc::EINVAL)
    }

    /// The environment the process was started with, each entry `KEY=VALUE`.
    pub fn environment(&self) -> Result<Vec<std::ffi::OsString>, i32> {
        use std::os::unix::ffi::OsStringExt;
        let environ = self.read("environ")?;
        Ok(environ
            .split(|b| *b == 0)
            .filter(|entry| !entry.is_empty())
            .map(|entry| std::ffi::OsString::from_vec(entry.to_vec()))
            .collect())
    }

    fn read(&self, name: &str) -> Result<Vec<u8>, i32> {
        std::fs::read(self.dir.join(name)).map_err(|err| errno_of(&err))
    }

    /// The device and inode a `/proc/<pid>` link leads to: a namespace, or the root.
    fn identity(&self, link: &Path) -> Result<Vec<u8>, i32> {
        let meta = std::fs::metadata(self.dir.join(link)).map_err(|err| errno_of(&err))?;
        let mut bytes = meta.dev().to_le_bytes().to_vec();
        bytes.extend_from_slice(&meta.ino().to_le_bytes());
        Ok(bytes)
    }
}

fn attribute(name: &str, value: Result<Vec<u8>, i32>) -> Attribute {
    Attribute {
        name: name.to_owned(),
        value,
    }
}

fn errno_of(err: &io::Error) -> i32 {
    err.raw_os_error().unwrap_or(libc::EIO)
}

/// What follows `field` on its line of a `/proc/<pid>/status`.
fn status_line<'a>(status: &'a [u8], field: &str) -> Option<&'a [u8]> {
    status
        .split(|b| *b == b'\n')
        .find_map(|line| line.strip_prefix(field.as_bytes()))
}

/// Field `index` (counted from the state) of a `/proc/<pid>/stat` line.
fn stat_field(stat: &[u8], index: usize) -> Option<&[u8]> {
    // The command's name may hold spaces and parentheses; it ends at the last `)`.
    let end = stat.iter().rposition(|b| *b == b')')?;
    stat[end + 1..]
        .split(|b| *b == b' ' || *b == b'\n')
        .filter(|field| !field.is_empty())
        .nth(index)
}

/// Process `pid`'s I/O scheduling class and priority (`ionice`), which `/proc` does not show.
fn io_priority(pid: libc::pid_t) -> Result<Vec<u8>, i32> {
    /// `IOPRIO_WHO_PROCESS` of linux/ioprio.h.
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    // SAFETY: ioprio_get takes two integers and returns one; no memory is passed.
    let priority = unsafe {
        libc::syscall(
            libc::SYS_ioprio_get,
            IOPRIO_WHO_PROCESS,
            libc::c_long::from(pid),
        )
    };
    if priority < 0 {
        return Err(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    Ok(priority.to_le_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_priority_and_policy_are_read_past_any_command_name() {
        // Fields 3.. of proc(5), numbered by their value, after a name made to mislead.
        let rest: Vec<String> = (3..=52).map(|field| field.to_string()).collect();
        let stat = format!("42 (a) b (c 1) {}\n", rest.join(" "));
        let fields = STAT_FIELDS.map(|(_, index)| stat_field(stat.as_bytes(), index));
        assert_eq!(
            fields,
            [Some(&b"19"[..]), Some(&b"40"[..]), Some(&b"41"[..])]
        );
        assert_eq!(stat_field(b"7 (cut", 0), None);
    }

    #[test]
    fn this_process_read_as_itself_and_by_its_pid_is_the_same() {
        let by_self = Process::current().attributes();
        let by_pid = Process::with_pid(std::process::id().cast_signed()).attributes();
        assert_eq!(by_self, by_pid);
        // The ones every kernel this runs on has.
        for name in [
            "Uid",
            "CapEff",
            "NoNewPrivs",
            "limits",
            "nice",
            "mnt namespace",
        ] {
            let found = by_self.iter().find(|a| a.name == name).expect(name);
            assert!(found.value.is_ok(), "{name}: {found:?}");
        }
        let umask = Process::current().umask().expect("umask");
        assert_eq!(umask, crate::rendezvous::current_umask());
        assert!(
            !Process::current()
                .environment()
                .expect("environ")
                .is_empty()
                || std::env::vars_os().next().is_none()
        );
    }

    #[test]
    fn a_process_that_is_not_there_reads_as_errors() {
        // pid_max is at most 2^22; this pid cannot exist.
        let absent = Process::with_pid(1 << 23).attributes();
        assert!(absent.iter().all(|a| a.value.is_err()), "{absent:?}");
    }
}
