//! Running git over the workspace as the sandbox user, in a process that no other process of
//! that user can reach into, while it alone can reach the agent's private repository.
//!
//! The workspace is a tree the sandbox user rewrites at will, also while git walks it: a
//! directory swapped for a symlink between two of git's checks redirects git's next open. Git
//! running as guest root would then read root-only files (the history bundle, `/etc/shadow`)
//! into the private index and the patch. So every git run that touches the workspace runs
//! with the *sandbox user's* uid and gid (the baseline's owner): whatever a race redirects it
//! to, it can only read what that user could read anyway. The rest of this module keeps the
//! private repository away from that same user's other processes.
//!
//! - **Reaching the private repository.** It is `<state dir>/private/` (owned by the sandbox
//!   user, so git can write objects and the index). The state directory is guest root's,
//!   mode 0710, group [`GIT_GROUP`]: only a process in that group can pass it, and only the
//!   guarded git runs get the group (as a supplementary group; no other guest process has it,
//!   and `no_new_privs` stops set-gid programs from granting it). Everything else in the state
//!   directory is guest root's with mode 0600 (or 0111: the git copy below), so passing it
//!   gives git nothing more to read. The one thing a guarded git reads beyond what the
//!   sandbox user can is the private repository itself (a racing symlink can lead git into
//!   it): the user's own imported tree and index, nothing of root's.
//!   (A path git can walk is needed: git canonicalizes its git directory, e.g. for a nested
//!   repository in the work tree, so a `/proc/self/fd` path alone does not do.)
//! - **Reaching git.** A process of the same uid may normally ptrace a process, write its
//!   memory, or open its files through `/proc/<pid>/` (`cwd`, `fd/`), and so reach whatever
//!   it reaches. The kernel refuses all of that for a *non-dumpable* process, and `execve`
//!   makes the new program non-dumpable when the executing user may not read the executable.
//!   So guarded git is executed from a copy with mode 0111 (executable, not readable) in the
//!   state directory, and the child also drops dumpability itself between its `setuid` and its
//!   `execve`. This needs `fs.suid_dumpable` to be 0 or 2 (with 1 such processes stay
//!   dumpable), which is checked before the first guarded run.
//! - **Moving the baseline.** Only guarded git runs can write the private repository, and
//!   the baseline commit id is also kept by the agent in its own files and named explicitly,
//!   so a rewritten ref could not change what a diff is taken against.
//!
//! A signal from the sandbox user can still kill a guarded git (same uid): that fails the
//! request, it cannot change its answer.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmod, fstat, fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// The guest group that may pass the state directory: given to guarded git runs only.
pub const GIT_GROUP: u32 = 65_533;

/// The execute-only copy of git, in the state directory.
const COPY_NAME: &CStr = c".git-exec";
/// Where the copy is written before it is moved into place.
const COPY_TEMP: &CStr = c".git-exec.new";

/// Why no guarded git can run.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("cannot read /proc/sys/fs/suid_dumpable: {0}")]
    SuidDumpableUnknown(#[source] std::io::Error),
    #[error(
        "fs.suid_dumpable is {0}: the sandbox user could then attach to the git that diffs the \
         workspace; set it to 0 on the host (sysctl -w fs.suid_dumpable=0)"
    )]
    SuidDumpable(String),
    #[error("the state directory's path contains a NUL byte")]
    NulInStatePath,
    /// A system call on the way to the copy failed.
    #[error("cannot {what} the private copy of {program}: {source}")]
    Sys {
        what: &'static str,
        program: String,
        source: Errno,
    },
    #[error("cannot {what} the private copy of {program}: {source}")]
    Io {
        what: &'static str,
        program: String,
        source: std::io::Error,
    },
}

/// The path of the execute-only copy of `program` in the state directory, made when missing
/// (or not what this agent made: wrong owner, mode, type or size).
pub fn executable(
    state_path: &Path,
    state_dir: BorrowedFd<'_>,
    program: &CStr,
) -> Result<CString, GuardError> {
    check_suid_dumpable()?;
    let fail = |what: &'static str| {
        move |source| GuardError::Sys {
            what,
            program: program.to_string_lossy().into_owned(),
            source,
        }
    };
    let mut source = File::from(
        openat(
            AT_FDCWD,
            program,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(fail("read the original for"))?,
    );
    let size = fstat(source.as_fd())
        .map_err(fail("inspect the original for"))?
        .st_size;
    let path = CString::new(state_path.join(".git-exec").as_os_str().as_bytes())
        .map_err(|_| GuardError::NulInStatePath)?;
    let euid = nix::unistd::geteuid().as_raw();
    if let Ok(stat) = fstatat(state_dir, COPY_NAME, AtFlags::AT_SYMLINK_NOFOLLOW) {
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFREG
            && stat.st_mode & 0o7777 == 0o111
            && stat.st_uid == euid
            && stat.st_size == size
        {
            return Ok(path);
        }
    }
    match unlinkat(state_dir, COPY_TEMP, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(err) => return Err(fail("remove a stale")(err)),
    }
    let written = openat(
        state_dir,
        COPY_TEMP,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::S_IRWXU,
    )
    .map_err(fail("create"))?;
    let mut file = File::from(written);
    std::io::copy(&mut source, &mut file).map_err(|source| GuardError::Io {
        what: "write",
        program: program.to_string_lossy().into_owned(),
        source,
    })?;
    // Executable by anyone, readable by nobody without CAP_DAC_OVERRIDE.
    fchmod(file.as_fd(), Mode::S_IXUSR | Mode::S_IXGRP | Mode::S_IXOTH).map_err(fail("protect"))?;
    // Closed before anything executes it (a writer open makes execve fail with ETXTBSY).
    drop(file);
    renameat(state_dir, COPY_TEMP, state_dir, COPY_NAME).map_err(fail("place"))?;
    Ok(path)
}

/// Refuses to run when setuid-like processes stay dumpable (`fs.suid_dumpable` = 1): then the
/// sandbox user could reach into a guarded git.
fn check_suid_dumpable() -> Result<(), GuardError> {
    let value = std::fs::read_to_string("/proc/sys/fs/suid_dumpable")
        .map_err(GuardError::SuidDumpableUnknown)?;
    suid_dumpable_allows(value.trim())
}

fn suid_dumpable_allows(value: &str) -> Result<(), GuardError> {
    match value {
        "0" | "2" => Ok(()),
        other => Err(GuardError::SuidDumpable(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suid_dumpable_values() {
        assert!(suid_dumpable_allows("0").is_ok());
        assert!(suid_dumpable_allows("2").is_ok());
        assert!(suid_dumpable_allows("1")
            .expect_err("1 is refused")
            .to_string()
            .contains("sysctl -w fs.suid_dumpable=0"));
        assert_eq!(
            suid_dumpable_allows("1")
                .expect_err("1 is refused")
                .to_string(),
            "fs.suid_dumpable is 1: the sandbox user could then attach to the git that diffs the \
             workspace; set it to 0 on the host (sysctl -w fs.suid_dumpable=0)"
        );
        let err = GuardError::Sys {
            what: "place",
            program: "/usr/bin/git".into(),
            source: Errno::EXDEV,
        };
        assert_eq!(
            err.to_string(),
            format!(
                "cannot place the private copy of /usr/bin/git: {}",
                Errno::EXDEV
            )
        );
    }
}
