//! `VmError`: every way the vm backend fails. Each message names what failed and, where the
//! operator can do something about it, how.

use std::io;
use std::path::Path;

/// An error from the vm backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VmError {
    /// This machine cannot serve a VM (no QEMU, no usable accelerator, a host tool or call
    /// missing); the message says what to install or set.
    #[error("{0}")]
    Unavailable(String),

    /// The image cannot boot as a VM (no kernel, or one without the devices a VM needs); the
    /// message says which image to use instead.
    #[error("{0}")]
    Image(String),

    /// The [`VmSpec`](crate::VmSpec) cannot be used as given.
    #[error("invalid vm spec: {0}")]
    InvalidSpec(String),

    /// A host-side file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A host tool (mke2fs, qemu-img) failed.
    #[error("{tool} failed ({status}): {stderr}")]
    Tool {
        tool: String,
        status: String,
        /// The tool's last output lines.
        stderr: String,
    },

    /// The guest did not come up; `tail` holds the last lines QEMU and the guest console wrote.
    #[error("the VM did not boot: {reason}\n{tail}")]
    Boot { reason: String, tail: String },

    /// Talking to QEMU's monitor (QMP) failed.
    #[error("QMP: {0}")]
    Qmp(String),
}

impl VmError {
    pub(crate) fn io(what: &str, path: &Path, source: io::Error) -> Self {
        Self::Io {
            context: format!("{what} {}", path.display()),
            source,
        }
    }
}

pub type Result<T, E = VmError> = std::result::Result<T, E>;
