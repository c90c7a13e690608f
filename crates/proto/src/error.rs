//! What goes wrong on the agent channel, as either peer reports it.

use crate::frame::FrameError;

/// Errors a protocol peer reports.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("agent channel framing broken: {0}")]
    Frame(#[from] FrameError),
    #[error("malformed {what} message: {detail}")]
    BadMessage { what: &'static str, detail: String },
    #[error("agent channel I/O: {0}")]
    Io(#[from] std::io::Error),
}
