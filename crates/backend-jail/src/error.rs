//! `JailError`: every way the jail backend fails. Each message names what failed (the file, the
//! syscall, the limit) and, where the operator can do something about it, how.
//!
//! A host file operation or system call that fails is the host crate's
//! [`HostError::Io`]/[`HostError::Sys`] (made by [`JailError::io`] and [`JailError::sys`]),
//! wrapped as [`JailError::Host`]: one definition of those failures and of how a hint is
//! appended to them, for the jail and the systems it shares with the other backends.

use std::io;
use std::path::Path;

use dynocap_host::HostError;
use nix::errno::Errno;

/// An error from the jail backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JailError {
    /// The [`JailSpec`](crate::JailSpec) cannot be used as given.
    #[error("invalid jail spec: {0}")]
    InvalidSpec(String),

    /// `Jail::spawn` was called from a process with more than one thread.
    #[error(
        "Jail::spawn needs a single-threaded process but this one has {threads} threads; \
         spawn the jail before starting any thread or async runtime (the guest init runs Rust \
         code between clone and exec)"
    )]
    NotSingleThreaded {
        /// Threads found in `/proc/self/status`.
        threads: usize,
    },

    /// A resource limit could not be applied; the jail is not started without it.
    #[error("cannot apply the {limit} limit: {reason}")]
    LimitUnavailable {
        /// `cpu`, `memory` or `pids`.
        limit: &'static str,
        /// Why, and what to do.
        reason: String,
    },

    /// The guest init reported a failure while building the sandbox (before exec).
    #[error("building the sandbox failed: {0}")]
    GuestSetup(String),

    /// The guest init died before exec without reporting why.
    #[error("the guest init died during setup ({0}) without reporting an error")]
    GuestDied(String),

    /// The guest init neither failed nor exec'd the agent in time.
    #[error("timed out after {secs}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        secs: u64,
    },

    /// The seccomp program could not be built.
    #[error("building the seccomp filter failed: {0}")]
    Seccomp(String),

    /// A host-side file operation or system call failed ([`JailError::io`],
    /// [`JailError::sys`]), or a host system the jail shares with the other backends (id
    /// maps, the host's cgroups) did; its text is the one it always had.
    #[error(transparent)]
    Host(#[from] HostError),

    /// Tearing a sandbox down left something behind; each entry names one leftover.
    #[error("teardown incomplete: {}", .0.join("; "))]
    Teardown(Vec<String>),
}

impl JailError {
    /// A host file operation on `path` failed: "cannot `action` `path`: the error".
    pub(crate) fn io(action: &str, path: &Path, source: io::Error) -> Self {
        JailError::Host(HostError::io(action, path, source))
    }

    /// A host system call failed: "`context`: the errno".
    pub(crate) fn sys(context: impl Into<String>, errno: Errno) -> Self {
        JailError::Host(HostError::sys(context, errno))
    }

    /// Attaches an operator hint to a failed file operation or system call (other errors are
    /// returned as is).
    pub(crate) fn hint(self, text: &'static str) -> Self {
        match self {
            JailError::Host(err) => JailError::Host(err.hint(text)),
            other => other,
        }
    }
}

/// The hint for "permission denied" on cgroup, namespace and state files.
pub(crate) const HINT_PRIVILEGE: &str = dynocap_host::HINT_PRIVILEGE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_error_names_path_and_hint() {
        let err = JailError::io(
            "create cgroup",
            Path::new("/sys/fs/cgroup/memory/dynocap/x"),
            io::Error::from_raw_os_error(libc::EACCES),
        )
        .hint(HINT_PRIVILEGE);
        let text = err.to_string();
        assert!(
            text.starts_with("cannot create cgroup /sys/fs/cgroup/memory/dynocap/x: "),
            "{text}"
        );
        assert!(text.contains("denied"), "{text}");
        assert!(text.ends_with(HINT_PRIVILEGE), "{text}");
    }

    #[test]
    fn sys_error_shows_errno_name() {
        let text = JailError::sys("clone", Errno::EPERM).to_string();
        assert!(text.starts_with("clone: EPERM"), "{text}");
    }

    #[test]
    fn a_failed_file_operation_is_the_host_error_with_its_cause_as_source() {
        let err = JailError::io(
            "open",
            Path::new("/dev/loop-control"),
            io::Error::from_raw_os_error(libc::ENOENT),
        )
        .hint("the disk limit needs loop devices (modprobe loop)");
        assert_eq!(
            err.to_string(),
            format!(
                "cannot open /dev/loop-control: {}; the disk limit needs loop devices \
                 (modprobe loop)",
                io::Error::from_raw_os_error(libc::ENOENT)
            )
        );
        let source = std::error::Error::source(&err).expect("the io::Error");
        assert_eq!(
            source
                .downcast_ref::<io::Error>()
                .and_then(|e| e.raw_os_error()),
            Some(libc::ENOENT)
        );
        assert!(
            matches!(err, JailError::Host(HostError::Io { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn a_hint_leaves_other_failures_as_they_are() {
        let err = JailError::InvalidSpec("no name".into()).hint(HINT_PRIVILEGE);
        assert_eq!(err.to_string(), "invalid jail spec: no name");
    }
}
