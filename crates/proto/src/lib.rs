//! DynoCap agent protocol: the framed, multiplexed conversation between a sandbox's
//! supervisor (host) and `dynocap-agent` (guest PID 1) over one byte stream.
//!
//! Both sides treat the other as untrusted input: frames are bounded ([`MAX_FRAME_LEN`]),
//! messages are strict JSON, and any violation is an error value, never a panic.

pub mod buffers;
mod error;
pub mod exec_window;
pub mod files;
mod frame;
pub mod fuzzing;
mod io;
mod message;
pub mod proxy_env;
pub mod redact;
pub mod trust;
pub mod tunnel;

pub use error::ProtoError;
pub use frame::{
    Frame, FrameDecoder, FrameError, FrameKind, CONTROL_STREAM, DATA_CHUNK, GUEST_STREAM_BIT,
    MAX_FRAME_LEN,
};
pub use io::{FrameReader, FrameWriter};
pub use message::{
    channel, from_payload, to_payload, BaselineRequest, CacheRoom, CloneRequest, ConnectRequest,
    DiffRequest, EgressRequest, ErrorBody, ExecExit, ExecRequest, GuestRequest, Hello,
    ReceiveFileRequest, RejoinRequest, Request, Response, ResumeRequest, UnpackRequest,
    MAX_COMMAND_LEN, PROTOCOL_VERSION,
};

/// The git attributes of every path while a task's patch is made (the guest's diff) and
/// checked (the host's verification), written to the repository's `info/attributes`, which
/// outranks every `.gitattributes` of the tree: none of the attributes that convert a file as
/// git reads it, nor the diff and merge drivers. So the patch holds the files' bytes as they
/// are on disk (a checkout's `$Id: …$` expanded, its CRLF kept) whatever the project's
/// attributes say, and the host applies it to those same bytes.
pub const NEUTRAL_ATTRIBUTES: &str =
    "* !text !crlf !eol !ident !filter !working-tree-encoding !diff !merge\n";
