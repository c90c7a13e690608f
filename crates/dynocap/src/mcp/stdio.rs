//! The stdio framing in front of the MCP SDK: newline-delimited JSON-RPC on stdin/stdout.
//! Every stdin line is checked to be JSON before the SDK sees it; a line that is not gets a
//! JSON-RPC parse error (-32700, id null) on stdout and is dropped, and the server keeps
//! running (the SDK alone would drop it silently). Stdout receives whole lines only, from the
//! SDK or from these replies, never interleaved. SDK-free: the SDK is handed two in-memory
//! byte streams.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::log::Log;

/// Longest accepted message line; longer ones are dropped with a parse error reply.
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// Buffer of the in-memory pipes to and from the SDK.
const PIPE_BUFFER: usize = 256 * 1024;

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
pub fn start(log: Log) -> Pipes {
    let (input, output) = take_std_streams(&log);
    start_over(input, output, log)
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
pub fn start_over<R, W>(input: R, output: W, log: Log) -> Pipes
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (to_sdk, feed) = tokio::io::duplex(PIPE_BUFFER);
    let (from_sdk, drain) = tokio::io::duplex(PIPE_BUFFER);
    let (replies, reply_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let reader = tokio::spawn(read_input(input, feed, replies, log.clone()));
    let writer = tokio::spawn(write_output(drain, reply_rx, output, log));
    Pipes {
        to_sdk,
        from_sdk,
        pumps: Pumps { reader, writer },
    }
}

/// The reply to a line that is not JSON.
pub fn parse_error(detail: &str) -> Vec<u8> {
    let reply = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": -32700, "message": format!("Parse error: {detail}") }
    });
    let mut line = reply.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// Whether `line` is one JSON value; `Err` says where it is not (never echoes the input).
pub fn check_json(line: &[u8]) -> Result<(), String> {
    serde_json::from_slice::<serde::de::IgnoredAny>(line)
        .map(|_| ())
        .map_err(|err| err.to_string())
}

async fn read_input<R: AsyncRead + Unpin>(
    input: R,
    mut feed: tokio::io::DuplexStream,
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
            // Too long: skip to the end of the line, then report it.
            let mut sink = Vec::new();
            loop {
                sink.clear();
                match (&mut input)
                    .take(64 * 1024)
                    .read_until(b'\n', &mut sink)
                    .await
                {
                    Ok(0) => break,
                    Ok(_) if sink.ends_with(b"\n") => break,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            log.warn(format_args!(
                "dropped a stdin message longer than {MAX_LINE} bytes"
            ));
            let _ = replies.send(parse_error(&format!(
                "message longer than {MAX_LINE} bytes"
            )));
            continue;
        }
        let body = trim_line(&line);
        if body.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Err(detail) = check_json(body) {
            log.warn(format_args!(
                "stdin line is not JSON ({detail}); replied with a parse error"
            ));
            let _ = replies.send(parse_error(&detail));
            continue;
        }
        if feed.write_all(body).await.is_err() || feed.write_all(b"\n").await.is_err() {
            break;
        }
    }
    // End of input: the SDK sees end of stream and shuts down.
    let _ = feed.shutdown().await;
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

    #[tokio::test]
    async fn bad_lines_get_parse_errors_and_good_lines_pass() {
        let (mut client_in, server_in) = tokio::io::duplex(4096);
        let (server_out, mut client_out) = tokio::io::duplex(4096);
        let pipes = start_over(server_in, server_out, Log::stderr());
        client_in
            .write_all(b"{\"jsonrpc\":\"2.0\"\r\n\n{not json}\n  \n[1,2]\n")
            .await
            .unwrap();
        drop(client_in);
        // The SDK side receives the valid lines only.
        let mut to_sdk = pipes.to_sdk;
        let mut received = String::new();
        to_sdk.read_to_string(&mut received).await.unwrap();
        assert_eq!(received, "[1,2]\n");
        // The SDK writes one message and closes.
        let mut from_sdk = pipes.from_sdk;
        from_sdk.write_all(b"{\"ok\":1}\n").await.unwrap();
        drop(from_sdk);
        drop(to_sdk);
        pipes.pumps.finish().await;
        let mut out = String::new();
        client_out.read_to_string(&mut out).await.unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(
            lines.iter().filter(|l| l.contains("-32700")).count(),
            2,
            "{out}"
        );
        assert!(lines.contains(&"{\"ok\":1}"));
    }
}
