//! The control protocol between clients (CLI, MCP server) and a sandbox's supervisor: one
//! JSON request line per connection on the supervisor's unix socket, one JSON reply line.
//! Closing the connection before the reply cancels the request (an exec is killed).
//! Before its one final reply, a request may get interim lines: progress, and for an exec
//! that asked for it, its output as it comes.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
pub use crate::model::output::{OutputChannel, OutputChunk};
use crate::model::spec::ExecSpec;
use crate::supervisor::exec::ExecResult;

/// Longest line either side accepts; an exec request carries the command (≤ 256 KiB) and
/// a reply carries up to 2 MiB of output, JSON-escaped (a streamed [`OutputChunk`] is at most
/// 64 KiB, about 88 KiB in base64).
pub const MAX_LINE: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum ControlRequest {
    Ping,
    Exec {
        spec: ExecSpec,
    },
    /// Tear the sandbox down; the reply is sent once its guest is dead and its name free
    /// (the rest of the teardown follows).
    Destroy,
    /// Make an idle warm-pool sandbox the caller's: the guest's hostname and limits, and
    /// the supervisor's deadline.
    Claim(Claim),
    /// Tasks: a checkpoint of the guest's files ([`crate::supervisor::checkpoint`]), labelled
    /// `label` or the next free `cp-N`; answered with `Checkpoint`.
    Checkpoint {
        #[serde(default)]
        label: Option<String>,
    },
    /// Tasks: their checkpoints, oldest first; answered with `Checkpoints`.
    Checkpoints,
    /// Tasks: deletes a checkpoint; answered with `Checkpoints` (those left).
    DeleteCheckpoint {
        label: String,
    },
    /// Tasks: the guest's files back as checkpoint `label` was taken. Running commands and
    /// jobs end, and the guest boots again over a copy of the checkpoint, under the same
    /// supervisor process (which executes itself anew); answered with `Restored` before that,
    /// after which the socket answers again once the guest is up.
    Restore {
        label: String,
    },
    /// Tasks: the state directory of a new task `fork_id` forked from this one, its disk a
    /// copy of this task's (now, or as checkpoint `checkpoint` was); answered with `Forked`.
    SeedFork {
        fork_id: String,
        #[serde(default)]
        checkpoint: Option<String>,
    },
    /// Tasks on the vm backend: the state directory of a live fork `fork_id` of this task,
    /// the running guest saved with its processes; answered with `Forked`.
    SeedLiveFork {
        fork_id: String,
    },
    /// Tasks: the patch baseline → working tree, with the host's summary.
    Diff,
    /// Tasks: final diff, guest destroyed, patch verified, results written. Generated files
    /// ([`dynocap_review::generated`]) are left out of the patch unless `include_generated`.
    Finish {
        #[serde(default)]
        include_generated: bool,
    },
    /// A file operation in the guest as the sandbox user ([`crate::supervisor::files`]);
    /// answered with `File`.
    File {
        request: dynocap_proto::files::FileRequest,
    },
    /// Run `spec` as a job ([`crate::supervisor::jobs`]) and answer with `Job` once it ended
    /// or `wait_ms` passed, whichever is first (0: at once); progress lines come meanwhile
    /// when `spec.report_progress`. The job goes on when this connection closes.
    StartJob {
        spec: ExecSpec,
        wait_ms: u64,
    },
    /// A job of this sandbox: its state and output since the offsets; answered with `Job`.
    Job(crate::supervisor::jobs::JobQuery),
    /// This sandbox's jobs, without output; answered with `Jobs`.
    Jobs,
    /// Forward a host port to a guest port ([`crate::supervisor::ports`]); answered with
    /// `Forward`.
    Forward(crate::supervisor::ports::ForwardRequest),
    /// Stop the forward of a guest port; answered with `Forward` (the one removed).
    Unforward {
        guest_port: u16,
    },
    /// This sandbox's forwards; answered with `Forwards`.
    Forwards,
}

/// What a claim of a warm-pool sandbox sets (its record already says the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub hostname: String,
    pub cpus: u32,
    pub memory_mb: u64,
    pub ttl_seconds: u64,
    /// The new deadline, in seconds since the Unix epoch.
    pub expires_unix: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ControlReply {
    /// Sent before the final reply of a request that asked for progress (an exec with
    /// `report_progress`); any number of them.
    Progress(crate::model::task_spec::Progress),
    /// Sent while an exec with `stream_output` runs: the next piece of its stdout or stderr,
    /// in the order the supervisor received them. Any number of them, before the final reply.
    Output(OutputChunk),
    Pong,
    Exec(ExecResult),
    Destroyed,
    Claimed,
    Diff(crate::model::task_spec::DiffResult),
    Checkpoint(crate::supervisor::checkpoint::CheckpointInfo),
    Checkpoints(Vec<crate::supervisor::checkpoint::CheckpointInfo>),
    Restored(crate::supervisor::checkpoint::Restored),
    Forked,
    Finished(crate::model::task_spec::FinishResult),
    File(dynocap_proto::files::FileResult),
    Job(Box<crate::supervisor::jobs::JobReport>),
    Jobs(Vec<crate::supervisor::jobs::JobReport>),
    Forward(crate::model::sandbox_info::PortForward),
    Forwards(Vec<crate::model::sandbox_info::PortForward>),
    Error(Error),
}

impl ControlReply {
    pub fn from_result<T>(result: Result<T>, ok: impl FnOnce(T) -> Self) -> Self {
        match result {
            Ok(value) => ok(value),
            Err(err) => Self::Error(err),
        }
    }
}

/// Reads one newline-terminated JSON value, refusing lines longer than [`MAX_LINE`].
pub async fn read_message<T, R>(reader: &mut BufReader<R>) -> Result<Option<T>>
where
    T: for<'de> Deserialize<'de>,
    R: AsyncRead + Unpin,
{
    let mut line = Vec::new();
    let mut limited = (&mut *reader).take(MAX_LINE as u64 + 1);
    let n = limited
        .read_until(b'\n', &mut line)
        .await
        .map_err(ControlFailure::Read)?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() > MAX_LINE {
        return Err(ControlFailure::TooLong.into());
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|err| ControlFailure::Malformed(err).into())
}

use tokio::io::AsyncReadExt as _;

pub async fn write_message<T: Serialize, W: AsyncWrite + Unpin>(
    writer: &mut W,
    message: &T,
) -> Result<()> {
    let mut bytes = serde_json::to_vec(message).map_err(ControlFailure::Encode)?;
    bytes.push(b'\n');
    writer
        .write_all(&bytes)
        .await
        .map_err(|err| ControlFailure::Write(err).into())
}

/// What failed carrying a message over a supervisor's control socket.
#[derive(Debug, thiserror::Error)]
enum ControlFailure {
    #[error("reading from the supervisor socket: {0}")]
    Read(#[source] std::io::Error),
    #[error("control message too long")]
    TooLong,
    #[error("malformed control message: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("encoding a control message: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("writing to the supervisor socket: {0}")]
    Write(#[source] std::io::Error),
}

impl Coded for ControlFailure {
    /// Both ends of the socket are DynoCap's: a failure on it is never the caller's.
    fn code(&self) -> ErrorCode {
        match self {
            Self::Read(_)
            | Self::TooLong
            | Self::Malformed(_)
            | Self::Encode(_)
            | Self::Write(_) => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bad_or_overlong_line_is_internal() {
        let mut reader = BufReader::new(&b"not json\n"[..]);
        let err = read_message::<ControlReply, _>(&mut reader)
            .await
            .expect_err("not a message");
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(
            err.message.starts_with("malformed control message: "),
            "{err}"
        );
        let long = vec![b'x'; MAX_LINE + 2];
        let mut reader = BufReader::new(&long[..]);
        let err = read_message::<ControlReply, _>(&mut reader)
            .await
            .expect_err("too long");
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, "control message too long");
    }

    #[tokio::test]
    async fn output_chunks_carry_any_bytes_within_one_line() {
        let data: Vec<u8> = (0..=255u8)
            .cycle()
            .take(dynocap_proto::DATA_CHUNK)
            .collect();
        let reply = ControlReply::Output(OutputChunk {
            channel: OutputChannel::Stderr,
            data: data.clone(),
        });
        let mut wire = Vec::new();
        write_message(&mut wire, &reply).await.expect("encode");
        assert!(wire.len() < 100 * 1024, "one chunk is one short line");
        assert_eq!(wire.iter().filter(|&&b| b == b'\n').count(), 1);
        let mut reader = BufReader::new(&wire[..]);
        match read_message::<ControlReply, _>(&mut reader).await {
            Ok(Some(ControlReply::Output(chunk))) => {
                assert_eq!(chunk.channel, OutputChannel::Stderr);
                assert_eq!(chunk.data, data);
            }
            other => panic!("expected the chunk back, got {other:?}"),
        }
    }
}
