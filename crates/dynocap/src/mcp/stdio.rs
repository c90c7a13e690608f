//! The stdio framing in front of the MCP SDK: newline-delimited JSON-RPC on stdin/stdout.
//! Every stdin line is read here before the SDK sees it (the SDK drops what it cannot parse
//! without a word, or answers it without an id): a line that is not one valid message gets
//! its JSON-RPC error reply here ([`jsonrpc`]), and one the caller's [`Gate`] refuses gets the
//! gate's reply or is dropped; the server keeps serving the next lines either way. Stdout
//! receives whole lines only, from the SDK or from these replies, never interleaved.
//! SDK-free: the SDK is handed two in-memory byte streams.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::jsonrpc::{self, Message, Rejected};
use super::log::Log;

/// Longest accepted message line; longer ones are dropped with a parse error reply. The SDK
/// is told not to enforce a limit of its own, so this is the only one.
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// Buffer of the in-memory pipes to and from the SDK.
const PIPE_BUFFER: usize = 256 * 1024;
/// Byte order mark: RFC 8259 lets a reader ignore one, and the SDK does.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// Decides, for a message whose envelope is valid, whether the SDK may see it; what it refuses
/// is answered or dropped as [`Rejected`] says. Called for each line in order, before the SDK
/// reads it.
pub trait Gate: Send + 'static {
    fn admit(&mut self, line: &[u8], message: &Message) -> Result<(), Rejected>;
}

impl<F> Gate for F
where
    F: FnMut(&[u8], &Message) -> Result<(), Rejected> + Send + 'static,
{
    fn admit(&mut self, line: &[u8], message: &Message) -> Result<(), Rejected> {
        self(line, message)
    }
}

/// The SDK's side of the framing, and the tasks that pump stdin and stdout.
pub struct Pipes {
    /// What the SDK reads: stdin's valid lines.
    pub to_sdk: tokio::io::DuplexStream,
    /// Where the SDK writes its messages.
    pub from_sdk: tokio::io::DuplexStream,
    pub pumps: Pumps,
}

pub struct Pumps {
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Pumps {
    /// Waits until everything the SDK wrote is on stdout (the SDK must have closed its
    /// side); stops reading stdin.
    pub async fn finish(self) {
        self.reader.abort();
        let _ = self.writer.await;
    }
}

/// Starts the framing over the process's stdin and stdout, which it takes for itself:
/// afterwards descriptor 0 reads `/dev/null` and descriptor 1 writes to stderr, so a stray
/// print or a child process that inherits them can neither corrupt the protocol nor eat its
/// input.
pub fn start(gate: impl Gate, log: Log) -> Pipes {
    let (input, output) = take_std_streams(&log);
    start_over(input, output, gate, log)
}

type Reader = Box<dyn AsyncRead + Unpin + Send>;
type Writer = Box<dyn AsyncWrite + Unpin + Send>;

fn take_std_streams(log: &Log) -> (Reader, Writer) {
    let input = private_copy(std::io::stdin().as_fd(), "/proc/self/fd/0", false);
    let output = private_copy(std::io::stdout().as_fd(), "/proc/self/fd/1", true);
    let (input, output) = match (input, output) {
        (Ok(input), Ok(output)) => (input, output),
        (Err(err), _) | (_, Err(err)) => {
            log.warn(format_args!(
                "cannot take stdin/stdout for the protocol ({err}); using them as they are"
            ));
            return (Box::new(tokio::io::stdin()), Box::new(tokio::io::stdout()));
        }
    };
    let swapped = std::fs::File::open("/dev/null")
        .and_then(|null| nix::unistd::dup2_stdin(null).map_err(std::io::Error::from))
        .and_then(|()| nix::unistd::dup2_stdout(std::io::stderr()).map_err(std::io::Error::from));
    if let Err(err) = swapped {
        log.warn(format_args!(
            "cannot point descriptors 0 and 1 away from the protocol: {err}"
        ));
    }
    (reader(input, log), writer(output, log))
}

/// A close-on-exec descriptor for the stream behind `fd`. A pipe is reopened through
/// `/proc`, which gives it an open file description of its own, so making it non-blocking
/// does not leak into the descriptors other processes share; anything else is duplicated.
fn private_copy(
    fd: BorrowedFd<'_>,
    proc_path: &str,
    write: bool,
) -> std::io::Result<std::fs::File> {
    let reopened = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_CLOEXEC)
        .open(proc_path);
    if let Ok(file) = reopened {
        if is_fifo(&file) {
            return Ok(file);
        }
    }
    let copy = nix::unistd::dup(fd)?;
    nix::fcntl::fcntl(
        &copy,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(std::fs::File::from(copy))
}

fn is_fifo(file: &std::fs::File) -> bool {
    file.metadata().is_ok_and(|m| m.file_type().is_fifo())
}

/// Pipes (how MCP clients start servers) go through the reactor; anything else (a terminal,
/// a file) through blocking reads.
fn reader(file: std::fs::File, log: &Log) -> Reader {
    if is_fifo(&file) {
        match file
            .try_clone()
            .map(tokio::net::unix::pipe::Receiver::from_file)
        {
            Ok(Ok(pipe)) => return Box::new(pipe),
            Ok(Err(err)) | Err(err) => log.warn(format_args!("stdin pipe: {err}")),
        }
    }
    Box::new(tokio::fs::File::from_std(file))
}

fn writer(file: std::fs::File, log: &Log) -> Writer {
    if is_fifo(&file) {
        match file
            .try_clone()
            .map(tokio::net::unix::pipe::Sender::from_file)
        {
            Ok(Ok(pipe)) => return Box::new(pipe),
            Ok(Err(err)) | Err(err) => log.warn(format_args!("stdout pipe: {err}")),
        }
    }
    Box::new(tokio::fs::File::from_std(file))
}

/// Starts the framing over any byte streams (tests use in-memory pipes).
pub fn start_over<R, W>(input: R, output: W, gate: impl Gate, log: Log) -> Pipes
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (to_sdk, feed) = tokio::io::duplex(PIPE_BUFFER);
    let (from_sdk, drain) = tokio::io::duplex(PIPE_BUFFER);
    let (replies, reply_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let reader = tokio::spawn(read_input(input, feed, gate, replies, log.clone()));
    let writer = tokio::spawn(write_output(drain, reply_rx, output, log));
    Pipes {
        to_sdk,
        from_sdk,
        pumps: Pumps { reader, writer },
    }
}

async fn read_input<R: AsyncRead + Unpin>(
    input: R,
    mut feed: tokio::io::DuplexStream,
    mut gate: impl Gate,
    replies: mpsc::UnboundedSender<Vec<u8>>,
    log: Log,
) {
    let mut input = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let limit = u64::try_from(MAX_LINE + 1).unwrap_or(u64::MAX);
        let read = (&mut input).take(limit).read_until(b'\n', &mut line).await;
        match read {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) => {
                log.warn(format_args!("reading stdin: {err}"));
                break;
            }
        }
        if line.len() > MAX_LINE && !line.ends_with(b"\n") {
            skip_rest_of_line(&mut input).await;
            let reply = jsonrpc::too_long(&line, MAX_LINE);
            log.warn(format_args!(
                "dropped a stdin message longer than {MAX_LINE} bytes; replied with {}",
                reply.kind()
            ));
            let _ = replies.send(reply.to_line());
            continue;
        }
        let body = trim_line(&line);
        let body = body.strip_prefix(UTF8_BOM).unwrap_or(body);
        let admitted = jsonrpc::read(body).and_then(|message| gate.admit(body, &message));
        match admitted {
            Ok(()) => {
                if feed.write_all(body).await.is_err() || feed.write_all(b"\n").await.is_err() {
                    break;
                }
            }
            Err(Rejected::Reply(reply)) => {
                log.warn(format_args!(
                    "stdin line refused ({}); replied with {}",
                    reply.message,
                    reply.kind()
                ));
                let _ = replies.send(reply.to_line());
            }
            Err(Rejected::Ignore(why)) => log.warn(format_args!("stdin line dropped: {why}")),
        }
    }
    // End of input: the SDK sees end of stream and shuts down.
    let _ = feed.shutdown().await;
}

/// Reads up to the end of the current line (or of input), keeping none of it.
async fn skip_rest_of_line<R: AsyncRead + Unpin>(input: &mut BufReader<R>) {
    let mut sink = Vec::new();
    loop {
        sink.clear();
        match (&mut *input)
            .take(64 * 1024)
            .read_until(b'\n', &mut sink)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) if sink.ends_with(b"\n") => break,
            Ok(_) => {}
        }
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

async fn write_output<W: AsyncWrite + Unpin>(
    drain: tokio::io::DuplexStream,
    mut replies: mpsc::UnboundedReceiver<Vec<u8>>,
    mut output: W,
    log: Log,
) {
    let mut drain = BufReader::new(drain);
    let mut line = Vec::new();
    let mut replies_open = true;
    loop {
        let chunk = tokio::select! {
            read = drain.read_until(b'\n', &mut line) => match read {
                Ok(0) | Err(_) => break,
                Ok(_) if line.ends_with(b"\n") => std::mem::take(&mut line),
                Ok(_) => continue,
            },
            reply = replies.recv(), if replies_open => match reply {
                Some(reply) => reply,
                None => { replies_open = false; continue; }
            },
        };
        if let Err(err) = write_line(&mut output, &chunk).await {
            log.warn(format_args!("writing stdout: {err}"));
            return;
        }
    }
    // The SDK is done: flush its unterminated tail and the replies already queued.
    let mut tail = std::mem::take(&mut line);
    if !tail.is_empty() && !tail.ends_with(b"\n") {
        tail.push(b'\n');
    }
    while let Ok(reply) = replies.try_recv() {
        tail.extend_from_slice(&reply);
    }
    if !tail.is_empty() {
        if let Err(err) = write_line(&mut output, &tail).await {
            log.warn(format_args!("writing stdout: {err}"));
        }
    }
}

async fn write_line<W: AsyncWrite + Unpin>(output: &mut W, line: &[u8]) -> std::io::Result<()> {
    output.write_all(line).await?;
    output.flush().await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::mcp::jsonrpc::{ErrorReply, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};

    fn gate(_line: &[u8], message: &Message) -> Result<(), Rejected> {
        match message {
            Message::Request { id, method, .. } if method == "refused" => Err(Rejected::Reply(
                ErrorReply::new(id.clone(), METHOD_NOT_FOUND, "refused"),
            )),
            Message::Notification { method } if method == "dropped" => {
                Err(Rejected::Ignore("dropped".into()))
            }
            _ => Ok(()),
        }
    }

    #[tokio::test]
    async fn every_line_is_answered_forwarded_or_dropped_by_the_gate() {
        let (mut client_in, server_in) = tokio::io::duplex(4096);
        let (server_out, mut client_out) = tokio::io::duplex(4096);
        let pipes = start_over(server_in, server_out, gate, Log::stderr());
        client_in
            .write_all(
                b"{\"jsonrpc\":\"2.0\"\r\n\n{not json}\n  \n[1,2]\n\
                  {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"}\r\n\
                  \xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"a\"}\n\
                  {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"refused\"}\n\
                  {\"jsonrpc\":\"2.0\",\"method\":\"dropped\"}\n\
                  {\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"a\",\"params\":{\"x\":\"\xff\"}}\n",
            )
            .await
            .unwrap();
        drop(client_in);
        // The SDK side receives the admitted lines only, without line endings' \r or a BOM.
        let mut to_sdk = pipes.to_sdk;
        let mut received = String::new();
        to_sdk.read_to_string(&mut received).await.unwrap();
        assert_eq!(
            received,
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"a\"}\n"
        );
        // The SDK writes one message and closes.
        let mut from_sdk = pipes.from_sdk;
        from_sdk.write_all(b"{\"ok\":1}\n").await.unwrap();
        drop(from_sdk);
        drop(to_sdk);
        pipes.pumps.finish().await;
        let mut out = String::new();
        client_out.read_to_string(&mut out).await.unwrap();
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        let errors: Vec<(i64, serde_json::Value)> = lines
            .iter()
            .filter(|line| line.get("error").is_some())
            .map(|line| (line["error"]["code"].as_i64().unwrap(), line["id"].clone()))
            .collect();
        let null = serde_json::Value::Null;
        assert_eq!(
            errors,
            [
                (PARSE_ERROR, null.clone()),
                (PARSE_ERROR, null.clone()),
                (PARSE_ERROR, null.clone()),
                (PARSE_ERROR, null.clone()),
                (INVALID_REQUEST, null),
                (METHOD_NOT_FOUND, 3.into()),
                (PARSE_ERROR, 4.into()),
            ]
        );
        assert_eq!(lines.len(), errors.len() + 1, "{out}");
        assert!(lines.contains(&serde_json::json!({"ok": 1})));
    }
}
