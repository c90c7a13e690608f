//! `HostError`: every way the shared host systems fail. The messages are the ones the jail
//! backend gave when these systems were its own, word for word: the backends wrap this type
//! (`JailError::Host`) and callers see the same text as before.

use std::io;
use std::path::Path;

use nix::errno::Errno;

/// The hint for "permission denied" on cgroup, namespace and state files.
pub const HINT_PRIVILEGE: &str =
    "run the supervisor as root, or delegate a cgroup v2 subtree to this user";

/// An error from a host system (pasta, id maps, the id range pool, host cgroups).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// An id range outside the root-mode pool was asked for.
    #[error("invalid jail spec: id range {index} is outside the pool of {pool} ranges")]
    IdRangeOutsidePool {
        /// The range asked for.
        index: u32,
        /// How many ranges the pool holds.
        pool: u32,
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

    /// A resource limit could not be applied.
    #[error("cannot apply the {limit} limit: {reason}")]
    LimitUnavailable {
        /// `cpu`, `memory` or `pids`.
        limit: &'static str,
        /// Why, and what to do.
        reason: String,
    },

    /// Something the host was asked to do did not happen in time.
    #[error("timed out after {secs}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        secs: u64,
    },

    /// User-mode networking (pasta) could not be started or stopped.
    #[error("user-mode networking: {0}")]
    UserNet(String),

    /// The id range pool could not hand out or read a range; the message says why and what
    /// to do.
    #[error("{0}")]
    IdPool(String),
}

fn hint_suffix(hint: Option<&'static str>) -> String {
    hint.map(|h| format!("; {h}")).unwrap_or_default()
}

impl HostError {
    /// A host file operation on `path` failed.
    pub fn io(action: &str, path: &Path, source: io::Error) -> Self {
        HostError::Io {
            context: format!("cannot {action} {}", path.display()),
            source,
            hint: None,
        }
    }

    /// A host system call failed.
    pub fn sys(context: impl Into<String>, errno: Errno) -> Self {
        HostError::Sys {
            context: context.into(),
            errno,
            hint: None,
        }
    }

    /// Attaches an operator hint to an `Io` or `Sys` error (other variants are returned as is).
    pub fn hint(mut self, text: &'static str) -> Self {
        match &mut self {
            HostError::Io { hint, .. } | HostError::Sys { hint, .. } => *hint = Some(text),
            _ => {}
        }
        self
    }

    /// Whether this is a file operation the kernel refused for lack of permission.
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, HostError::Io { source, .. }
            if source.kind() == io::ErrorKind::PermissionDenied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_error_names_path_and_hint() {
        let err = HostError::io(
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
        assert!(err.is_permission_denied());
        assert!(text.ends_with(HINT_PRIVILEGE), "{text}");
        assert!(!HostError::UserNet("x".into()).is_permission_denied());
    }
}
