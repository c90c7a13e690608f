//! `JailError`: every way the jail backend fails. Each message names what failed (the file, the
//! syscall, the limit) and, where the operator can do something about it, how.

use std::io;
use std::path::Path;

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

    /// A host-side file operation failed.
    #[error("{context}: {source}{}", hint_suffix(*.hint))]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
        /// What the operator can do about it.
        hint: Option<&'static str>,
    },

    /// A host-side system call failed.
    #[error("{context}: {errno}{}", hint_suffix(*.hint))]
    Sys {
        /// What was being done.
        context: String,
        /// The error number the kernel returned.
        errno: Errno,
        /// What the operator can do about it.
        hint: Option<&'static str>,
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

    /// A host system the jail shares with the other backends (id maps, the host's cgroups)
    /// failed; its text is the one it always had.
    #[error(transparent)]
    Host(#[from] dynocap_host::HostError),

    /// Tearing a sandbox down left something behind; each entry names one leftover.
    #[error("teardown incomplete: {}", .0.join("; "))]
    Teardown(Vec<String>),
}

fn hint_suffix(hint: Option<&'static str>) -> String {
    hint.map(|h| format!("; {h}")).unwrap_or_default()
}

impl JailError {
    /// A host file operation on `path` failed.
    pub(crate) fn io(action: &str, path: &Path, source: io::Error) -> Self {
        JailError::Io {
            context: format!("cannot {action} {}", path.display()),
            source,
            hint: None,
        }
    }

    /// A host system call failed.
    pub(crate) fn sys(context: impl Into<String>, errno: Errno) -> Self {
        JailError::Sys {
            context: context.into(),
            errno,
            hint: None,
        }
    }

    /// Attaches an operator hint to an `Io` or `Sys` error (other variants are returned as is).
    pub(crate) fn hint(mut self, text: &'static str) -> Self {
        match &mut self {
            JailError::Io { hint, .. } | JailError::Sys { hint, .. } => *hint = Some(text),
            _ => {}
        }
        self
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
}
