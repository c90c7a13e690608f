//! [`CgroupDir`]: one cgroup directory held by a descriptor, and what both the agent and the
//! jail do with one. Every path is relative to it; errors are the kernel's, as `io::Error`,
//! for the caller to word (the agent's log and the jail's teardown report say different
//! things about the same failure).

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{mkdirat, Mode};
use nix::sys::statfs::{fstatfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
use nix::unistd::{faccessat, unlinkat, AccessFlags, Pid, UnlinkatFlags};

use crate::parse_pids;

/// The cgroup version of the filesystem a directory is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// A legacy per-controller hierarchy (`cgroup`).
    V1,
    /// The unified hierarchy (`cgroup2`).
    V2,
}

/// What [`CgroupDir::rmdir`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The child is gone (removed now, or before).
    Removed,
    /// It still has processes (or children): try again once they are gone.
    Busy,
}

/// A cgroup directory held open. Opened `O_PATH` by [`CgroupDir::open`]; a descriptor handed
/// over ([`CgroupDir::from_fd`]) may be a detached mount's, whose `..` stays inside it.
#[derive(Debug)]
pub struct CgroupDir {
    fd: OwnedFd,
}

impl AsFd for CgroupDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `file` of the child `cgroup`, or of this cgroup when `cgroup` is empty.
fn at(cgroup: &str, file: &str) -> String {
    if cgroup.is_empty() {
        file.to_owned()
    } else {
        format!("{cgroup}/{file}")
    }
}

impl CgroupDir {
    /// Opens the cgroup directory at `path`.
    pub fn open(path: &Path) -> io::Result<CgroupDir> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(CgroupDir { fd })
    }

    /// Takes a descriptor of a cgroup directory.
    pub fn from_fd(fd: OwnedFd) -> CgroupDir {
        CgroupDir { fd }
    }

    /// The version of the hierarchy this directory is in; `None` when it is on no cgroup
    /// filesystem at all.
    pub fn version(&self) -> io::Result<Option<Version>> {
        let fs_type = fstatfs(self.fd.as_fd())?.filesystem_type();
        Ok(if fs_type == CGROUP2_SUPER_MAGIC {
            Some(Version::V2)
        } else if fs_type == CGROUP_SUPER_MAGIC {
            Some(Version::V1)
        } else {
            None
        })
    }

    /// Whether the file (or child) `name` exists: what tells which interface files a kernel
    /// and a hierarchy offer (`cgroup.kill`, `cgroup.freeze`, `memory.swap.max`).
    pub fn has(&self, name: &str) -> bool {
        faccessat(self.fd.as_fd(), name, AccessFlags::F_OK, AtFlags::empty()).is_ok()
    }

    /// Opens `path` (a file of this cgroup or of one below), close-on-exec.
    pub fn open_file(&self, path: &str, flags: OFlag) -> io::Result<File> {
        let fd = openat(
            self.fd.as_fd(),
            path,
            flags | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// The whole of the file at `path`.
    pub fn read(&self, path: &str) -> io::Result<String> {
        let mut text = String::new();
        self.open_file(path, OFlag::O_RDONLY)?
            .read_to_string(&mut text)?;
        Ok(text)
    }

    /// Writes `value` to the file at `path` in one write(2), as the kernel takes a setting
    /// (a limit, `1` to `cgroup.kill`, a pid to join).
    pub fn write(&self, path: &str, value: &str) -> io::Result<()> {
        self.open_file(path, OFlag::O_WRONLY)?
            .write_all(value.as_bytes())
    }

    /// The processes of the child `cgroup` (of this one when empty), as `cgroup.procs` lists
    /// them in the reader's pid namespace.
    pub fn pids(&self, cgroup: &str) -> io::Result<Vec<Pid>> {
        Ok(parse_pids(&self.read(&at(cgroup, "cgroup.procs"))?))
    }

    /// Whether the `cgroup.events` of the child `cgroup` (of this one when empty) says
    /// `key 1` (`populated`, `frozen`; v2 only).
    pub fn event(&self, cgroup: &str, key: &str) -> io::Result<bool> {
        let events = self.read(&at(cgroup, "cgroup.events"))?;
        Ok(events.lines().any(|line| {
            line.trim()
                .split_once(' ')
                .is_some_and(|(k, v)| k == key && v == "1")
        }))
    }

    /// Makes the child cgroup `name`.
    pub fn mkdir(&self, name: &str) -> io::Result<()> {
        mkdirat(self.fd.as_fd(), name, Mode::from_bits_truncate(0o755))?;
        Ok(())
    }

    /// Removes the child cgroup `name`, if it has no processes and no children left.
    pub fn rmdir(&self, name: &str) -> io::Result<Removal> {
        match unlinkat(self.fd.as_fd(), name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(Removal::Removed),
            Err(Errno::EBUSY | Errno::ENOTEMPTY) => Ok(Removal::Busy),
            Err(errno) => Err(errno.into()),
        }
    }

    /// The names in this directory (its children and its files).
    pub fn entries(&self) -> io::Result<Vec<String>> {
        let dir = nix::dir::Dir::openat(
            self.fd.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(dir
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str().ok().map(str::to_owned))
            .filter(|name| name != "." && name != "..")
            .collect())
    }
}

#[cfg(test)]
mod tests {
    //! On a plain directory standing in for cgroupfs (what the kernel adds to a new cgroup
    //! is written by hand), and on the host's hierarchy where this runs as root.

    use super::*;

    #[test]
    fn files_children_and_events_on_a_stand_in() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = CgroupDir::open(tmp.path()).expect("open");
        assert_eq!(
            dir.version().expect("statfs"),
            None,
            "a tmp dir is no cgroup"
        );
        dir.mkdir("exec-1").expect("mkdir");
        assert!(dir.has("exec-1") && !dir.has("exec-2"));
        std::fs::write(tmp.path().join("exec-1/cgroup.procs"), "7\n9\n").expect("procs");
        std::fs::write(
            tmp.path().join("exec-1/cgroup.events"),
            "populated 1\nfrozen 0\n",
        )
        .expect("events");
        assert_eq!(
            dir.pids("exec-1").expect("pids"),
            [Pid::from_raw(7), Pid::from_raw(9)]
        );
        assert!(dir.event("exec-1", "populated").expect("events"));
        assert!(!dir.event("exec-1", "frozen").expect("events"));
        std::fs::write(tmp.path().join("exec-1/cgroup.kill"), "").expect("kill file");
        dir.write("exec-1/cgroup.kill", "1").expect("write");
        assert_eq!(dir.read("exec-1/cgroup.kill").expect("read"), "1");
        assert_eq!(dir.entries().expect("entries"), ["exec-1"]);
        // A plain directory with files in it answers as a busy cgroup would.
        assert_eq!(dir.rmdir("exec-1").expect("rmdir"), Removal::Busy);
        assert_eq!(dir.rmdir("exec-9").expect("rmdir"), Removal::Removed);
        assert_eq!(
            dir.read("nothing").expect_err("missing").kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn a_real_hierarchy_says_its_version() {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        for line in mountinfo.lines() {
            let Some((before, after)) = line.split_once(" - ") else {
                continue;
            };
            let (Some(fs), Some(mount)) = (after.split(' ').next(), before.split(' ').nth(4))
            else {
                continue;
            };
            let expected = match fs {
                "cgroup" => Version::V1,
                "cgroup2" => Version::V2,
                _ => continue,
            };
            let dir = CgroupDir::open(Path::new(mount)).expect("open a hierarchy root");
            assert_eq!(dir.version().expect("statfs"), Some(expected), "{mount}");
            assert!(dir.has("cgroup.procs"), "{mount}");
        }
    }
}
