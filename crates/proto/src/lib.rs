//! DynoCap agent protocol: the framed, multiplexed conversation between a sandbox's
//! supervisor (host) and `dynocap-agent` (guest PID 1) over one byte stream.
//!
//! Both sides treat the other as untrusted input: frames are bounded ([`MAX_FRAME_LEN`]),
//! messages are strict JSON, and any violation is an error value, never a panic.

pub mod exec_window;
mod frame;
pub mod fuzzing;
mod io;
mod message;
pub mod redact;
pub mod tunnel;

pub use frame::{
    Frame, FrameDecoder, FrameError, FrameKind, CONTROL_STREAM, DATA_CHUNK, GUEST_STREAM_BIT,
    MAX_FRAME_LEN,
};
pub use io::{FrameReader, FrameWriter};
pub use message::{
    channel, from_payload, to_payload, BaselineRequest, CloneRequest, DiffRequest, EgressRequest,
    ErrorBody, ExecExit, ExecRequest, GuestRequest, Hello, ReceiveFileRequest, Request, Response,
    UnpackRequest, MAX_COMMAND_LEN, PROTOCOL_VERSION,
};

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
