//! The control protocol between clients (CLI, MCP server) and a sandbox's supervisor: one
//! JSON request line per connection on the supervisor's unix socket, one JSON reply line.
//! Closing the connection before the reply cancels the request (an exec is killed).

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::error::{Error, Result};
use crate::exec::ExecResult;
use crate::spec::ExecSpec;

/// Longest line either side accepts; an exec request carries the command (≤ 256 KiB) and
/// a reply carries up to 2 MiB of output, JSON-escaped.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum ControlRequest {
    Ping,
    Exec {
        spec: ExecSpec,
    },
    /// Tear the sandbox down; the reply is sent once nothing of it is left.
    Destroy,
    /// Tasks: the patch baseline → working tree, with the host's summary.
    Diff,
    /// Tasks: final diff, guest destroyed, patch verified, results written.
    Finish,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ControlReply {
    /// Sent before the final reply of a request that asked for progress (an exec with
    /// `report_progress`); any number of them.
    Progress(crate::task_spec::Progress),
    Pong,
    Exec(ExecResult),
    Destroyed,
    Diff(crate::task_spec::DiffResult),
    Finished(crate::task_spec::FinishResult),
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
        .map_err(|err| Error::internal(format!("reading from the supervisor socket: {err}")))?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() > MAX_LINE {
        return Err(Error::internal("control message too long"));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|err| Error::internal(format!("malformed control message: {err}")))
}

use tokio::io::AsyncReadExt as _;

pub async fn write_message<T: Serialize, W: AsyncWrite + Unpin>(
    writer: &mut W,
    message: &T,
) -> Result<()> {
    let mut bytes = serde_json::to_vec(message)
        .map_err(|err| Error::internal(format!("encoding a control message: {err}")))?;
    bytes.push(b'\n');
    writer
        .write_all(&bytes)
        .await
        .map_err(|err| Error::internal(format!("writing to the supervisor socket: {err}")))
}
