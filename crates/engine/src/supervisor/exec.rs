//! Runs one command through the agent and turns its frames into the Exec object
//! (docs/mcp.md, "Exec"). Output is guest data: it is bounded here (its head and its tail, see
//! [`crate::foundation::excerpt`]), decoded lossily or base64-encoded, and a terminal's bytes are rendered
//! by a terminal emulator, never echoed. The command's deadline is enforced here too, so an
//! agent that stopped answering cannot hold the caller.

use std::time::Duration;

pub use dynocap_netproxy::NetworkRefusal;
use dynocap_netproxy::RefusalList;
use dynocap_proto::{
    channel, exec_window, from_payload, ExecExit, ExecRequest, FrameKind, Request, Response,
};
use serde::{Deserialize, Serialize};

use tokio::sync::mpsc;

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::foundation::excerpt::{excerpt_str, Excerpt};
use crate::model::output::{OutputChannel, OutputChunk};
use crate::model::spec::{ExecSpec, OutputEncoding, EXEC_KILL_GRACE_MS};
use crate::model::task_spec::Progress;
use crate::supervisor::agent_conn::{agent_error_message, agent_gone, AgentConn, AgentStream};

/// How long past a command's own deadline (timeout plus the kill grace) the agent may take to
/// report its end before the host answers for it.
const HOST_SLACK: Duration = Duration::from_secs(10);

/// The Exec object (docs/mcp.md, "Exec").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResult {
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stderr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub transcript: Option<String>,
    pub truncated: bool,
    /// The sandbox's memory limit killed a process while this command ran.
    #[serde(default)]
    pub oom_killed: bool,
    /// The sandbox's disk failed (see the jail's `disk_failure`): what went wrong. What the
    /// disk acknowledged before is kept; nothing more can be written to it.
    #[serde(rename = "diskError", skip_serializing_if = "Option::is_none", default)]
    pub disk_error: Option<String>,
    /// A `filtered` sandbox's connections its egress proxy refused while this command ran,
    /// each distinct host, port and reason once with its count, in the order they first
    /// happened; at most [`dynocap_netproxy::MAX_COMMAND_REFUSALS`]. A refusal goes to every
    /// command running at the time: two commands running at once may both list it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_refusals: Vec<NetworkRefusal>,
    /// Refused connections left out of `network_refusals` by its bound.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub network_refusals_omitted: u64,
}

impl ExecResult {
    /// Adds the refusals collected while the command ran.
    pub fn with_refusals(mut self, list: RefusalList) -> Self {
        self.network_refusals = list.refusals;
        self.network_refusals_omitted = list.omitted;
        self
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the person running DynoCap can set to allow `host`, which a `filtered` sandbox's
/// allowlist does not name: told to the guest's client in the proxy's refusal, and kept in
/// the exec result's `networkRefusals` (each surface may spell it for its own reader).
pub fn allow_hint(host: &str) -> String {
    let entry = AllowEntry::for_host(host);
    format!(
        "the person running DynoCap can allow it with --allow-host {entry} on `dynocap run` or \
         `dynocap task start`, or by adding {entry} to DYNOCAP_EGRESS_ALLOW (for sandboxes \
         started over MCP, in the MCP server's environment){}",
        entry.note()
    )
}

/// The allowlist entry that allows a refused host: the named registry it belongs to
/// (`@pypi` for pypi.org, so that the registry's other hosts come with it), else the host
/// (a registry's host that serves much else, as storage.googleapis.com, included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowEntry<'a> {
    host: &'a str,
    registry: Option<(&'static str, &'static [&'static str])>,
}

impl<'a> AllowEntry<'a> {
    pub fn for_host(host: &'a str) -> Self {
        let registry = dynocap_netproxy::HostPattern::registry_of(host);
        Self { host, registry }
    }

    /// What a registry entry stands for, to follow the sentence naming it; empty for a host.
    pub fn note(&self) -> String {
        match self.registry {
            Some((name, hosts)) => format!("; @{name} stands for {}", hosts.join(", ")),
            None => String::new(),
        }
    }
}

impl std::fmt::Display for AllowEntry<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.registry {
            Some((name, _)) => write!(f, "@{name}"),
            None => f.write_str(self.host),
        }
    }
}

/// Terminal geometry `terminal: true` promises (docs/mcp.md).
pub const TERMINAL_ROWS: u16 = 24;
pub const TERMINAL_COLS: u16 = 80;
/// Lines of scrollback kept for a transcript, on top of the visible screen.
const TERMINAL_SCROLLBACK: usize = 10_000;

/// Runs `spec` through `conn`. `cancelled` resolves when the caller gave up (client
/// disconnected); the command is then killed and its partial result returned.
///
/// With `output`, every piece of stdout and stderr is also sent there as it comes, whole. The
/// queue is bounded and this waits for room: a client that reads slowly slows the command
/// down (the agent waits, then the command blocks on its pipe) instead of the supervisor
/// buffering without bound.
pub async fn run(
    conn: &AgentConn,
    spec: &ExecSpec,
    cancelled: impl std::future::Future<Output = ()>,
    progress: Option<&(dyn Fn(Progress) + Send + Sync)>,
    output: Option<&mpsc::Sender<OutputChunk>>,
) -> Result<ExecResult> {
    let limit = usize::try_from(spec.max_output_bytes).unwrap_or(usize::MAX);
    let started = std::time::Instant::now();
    let stream = conn.open(&exec_request(spec, output.is_some())).await?;
    let mut pump = Pump {
        stream,
        output,
        progress,
        collected: Collected::new(limit),
        cancel_sent: false,
        owed: 0,
        last_line: String::new(),
    };
    let exit = pump.until_exit(spec, started, cancelled).await?;
    Ok(exec_result(spec, limit, exit, pump.collected))
}

/// The agent's request for `spec`. `streaming` asks for a flow-control window, which the
/// caller then grants as its client consumes the output.
fn exec_request(spec: &ExecSpec, streaming: bool) -> Request {
    Request::Exec(ExecRequest {
        command: spec.command.clone(),
        cwd: spec.cwd.clone(),
        env: spec.env.clone(),
        timeout_ms: spec.timeout_seconds.saturating_mul(1000),
        terminal: spec.terminal,
        // All of it: the tail is kept here, and the agent's own cap keeps only a head.
        output_limit: u64::MAX,
        kill_grace_ms: EXEC_KILL_GRACE_MS,
        // Streaming waits for its client; a window keeps that wait to this stream alone.
        output_window: streaming,
    })
}

/// The command's output as kept so far: each stream's head and tail.
struct Collected {
    stdout: Excerpt,
    stderr: Excerpt,
    /// A transcript is rendered from the raw bytes, then bounded as text.
    terminal: Excerpt,
}

impl Collected {
    fn new(limit: usize) -> Self {
        Self {
            stdout: Excerpt::new(limit),
            stderr: Excerpt::new(limit),
            terminal: Excerpt::new(limit.saturating_mul(4)),
        }
    }
}

/// One command's frames on their way from the agent: kept in [`Collected`], forwarded to a
/// streaming client, and summed up in progress reports.
struct Pump<'a> {
    stream: AgentStream,
    output: Option<&'a mpsc::Sender<OutputChunk>>,
    progress: Option<&'a (dyn Fn(Progress) + Send + Sync)>,
    collected: Collected,
    /// The command was told to stop (the caller gave up, or the streaming client went away).
    cancel_sent: bool,
    /// Window credit consumed and not yet returned to the agent.
    owed: usize,
    /// The latest line of output, for progress reports.
    last_line: String,
}

impl Pump<'_> {
    /// Reads frames until the agent reports the command's end, or until the host answers for
    /// an agent that stopped answering.
    async fn until_exit(
        &mut self,
        spec: &ExecSpec,
        started: std::time::Instant,
        cancelled: impl std::future::Future<Output = ()>,
    ) -> Result<ExecExit> {
        let mut cancelled = std::pin::pin!(cancelled);
        // Past the command's own deadline plus the kill grace, an agent that still has not
        // answered is stopped or wedged: answer for it with what came so far.
        let hard_deadline = tokio::time::Instant::now()
            + Duration::from_secs(spec.timeout_seconds)
            + Duration::from_millis(EXEC_KILL_GRACE_MS)
            + HOST_SLACK;
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        loop {
            let frame = tokio::select! {
                frame = self.stream.next() => frame,
                _ = ticks.tick(), if self.progress.is_some() => {
                    if let Some(progress) = self.progress {
                        progress(running(started.elapsed(), spec.timeout_seconds, &self.last_line));
                    }
                    continue;
                }
                () = &mut cancelled, if !self.cancel_sent => {
                    self.cancel_sent = true;
                    self.stream.cancel().await?;
                    continue;
                }
                () = tokio::time::sleep_until(hard_deadline) => {
                    return Ok(self.answer_for_agent(spec, started).await);
                }
            };
            let Some(frame) = frame else {
                return Err(agent_gone());
            };
            match frame.kind {
                FrameKind::Data => {
                    if let Some((&chan, data)) = frame.payload.split_first() {
                        self.take_data(chan, data, &mut cancelled).await?;
                    }
                }
                FrameKind::Eof => {}
                FrameKind::Done => {
                    return match from_payload::<Response>("exec result", &frame.payload) {
                        Ok(Response::Exit(exit)) => Ok(exit),
                        Ok(other) => Err(ExecFailure::UnexpectedAnswer(Box::new(other)).into()),
                        Err(err) => Err(ExecFailure::Result(err).into()),
                    };
                }
                FrameKind::Error => {
                    return Err(Error::invalid(format!(
                        "the sandbox could not run the command: {}",
                        agent_error_message(&frame.payload)
                    )));
                }
                _ => {}
            }
        }
    }

    /// One chunk of output on channel `chan`: kept, forwarded to the streaming client (waiting
    /// for room, unless `cancelled` resolves meanwhile), its window credit returned, and its
    /// latest line noted for progress.
    async fn take_data<F: std::future::Future<Output = ()>>(
        &mut self,
        chan: u8,
        data: &[u8],
        cancelled: &mut std::pin::Pin<&mut F>,
    ) -> Result<()> {
        let streamed = match chan {
            channel::STDOUT => {
                self.collected.stdout.push(data);
                Some(OutputChannel::Stdout)
            }
            channel::STDERR => {
                self.collected.stderr.push(data);
                Some(OutputChannel::Stderr)
            }
            channel::TERMINAL => {
                self.collected.terminal.push(data);
                None
            }
            _ => None,
        };
        if let (Some(sink), Some(which), false) = (self.output, streamed, self.cancel_sent) {
            let chunk = OutputChunk {
                channel: which,
                data: data.to_vec(),
            };
            // Waiting here for a slow client is the back-pressure; a client that goes away
            // meanwhile still cancels the command.
            tokio::select! {
                sent = sink.send(chunk) => if sent.is_err() {
                    // The connection's writer stopped: the client is gone.
                    self.cancel_sent = true;
                    self.stream.cancel().await?;
                },
                () = cancelled.as_mut() => {
                    self.cancel_sent = true;
                    self.stream.cancel().await?;
                }
            }
        }
        if self.output.is_some() {
            // Consumed (forwarded, or dropped for a client that is gone): the agent may send
            // more.
            self.owed += exec_window::cost(data.len());
            if self.owed >= exec_window::GRANT_BATCH {
                self.stream.grant(std::mem::take(&mut self.owed)).await?;
            }
        }
        if self.progress.is_some() {
            if let Some(line) = latest_line(data) {
                self.last_line = line;
            }
        }
        Ok(())
    }

    /// The end the host reports for a command whose agent went silent past its deadline: a
    /// timeout, with a note on stderr saying the host answered and the command may still run.
    async fn answer_for_agent(&mut self, spec: &ExecSpec, started: std::time::Instant) -> ExecExit {
        let _ = self.stream.cancel().await;
        let note = format!(
            "\ndynocap: the sandbox's guest agent did not report the end of this command within {}s of its {}s timeout, so the host answers for it; the command may still be running. The guest may be stopped or overloaded: destroy the sandbox if this persists.\n",
            HOST_SLACK.as_secs() + EXEC_KILL_GRACE_MS / 1000,
            spec.timeout_seconds
        );
        self.collected.stderr.push(note.as_bytes());
        if let Some(sink) = self.output {
            // Never waits: the host is answering for a guest that stopped.
            let _ = sink.try_send(OutputChunk {
                channel: OutputChannel::Stderr,
                data: note.into_bytes(),
            });
        }
        ExecExit {
            exit_code: None,
            signal: None,
            timed_out: true,
            cancelled: false,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            truncated: false,
        }
    }
}

/// The Exec object for a command that ended with `exit`: its output bounded to `limit` and
/// encoded as `spec` asks, a terminal's rendered into a transcript.
fn exec_result(spec: &ExecSpec, limit: usize, exit: ExecExit, collected: Collected) -> ExecResult {
    let Collected {
        stdout,
        stderr,
        terminal,
    } = collected;
    let mut truncated =
        exit.truncated || stdout.truncated() || stderr.truncated() || terminal.truncated();
    let encode = |bytes: Vec<u8>| match spec.output_encoding {
        OutputEncoding::Utf8 => String::from_utf8_lossy(&bytes).into_owned(),
        OutputEncoding::Base64 => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(bytes)
        }
    };
    let (stdout, stderr, transcript) = if spec.terminal {
        let (text, cut) = excerpt_str(&render_terminal(&terminal.into_bytes()), limit);
        truncated |= cut;
        (None, None, Some(encode(text.into_bytes())))
    } else {
        (
            Some(encode(stdout.into_bytes())),
            Some(encode(stderr.into_bytes())),
            None,
        )
    };
    ExecResult {
        exit_code: exit.exit_code,
        signal: exit.signal.map(|s| sanitize_line(&s, 32)),
        timed_out: exit.timed_out,
        duration_ms: exit.duration_ms,
        stdout,
        stderr,
        transcript,
        truncated,
        oom_killed: false,
        disk_error: None,
        network_refusals: Vec::new(),
        network_refusals_omitted: 0,
    }
}

/// How often a command that reports progress says how it is going.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);

/// A progress report: seconds so far of the timeout, and the latest line of output.
fn running(elapsed: Duration, timeout_seconds: u64, last_line: &str) -> Progress {
    let secs = elapsed.as_secs();
    Progress {
        message: if last_line.is_empty() {
            format!("running for {secs}s, no output yet")
        } else {
            format!("running for {secs}s: {last_line}")
        },
        done: secs,
        total: Some(timeout_seconds),
    }
}

/// The last non-blank line of a chunk of output, made safe and short (it is guest text).
fn latest_line(data: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(data);
    let line = text
        .split(['\n', '\r'])
        .map(|line| line.trim())
        .rfind(|line| !line.is_empty())?;
    Some(sanitize_line(&strip_escapes(line), 120))
}

/// Drops ANSI escape sequences (colours, cursor moves) so a progress message shows text.
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // CSI: parameters and intermediates, then one final byte in @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

/// Renders raw terminal output as a 24x80 terminal shows it: scrollback first, then the
/// screen, trailing blanks trimmed. Cursor movement, `\r` and colours are interpreted, so the
/// transcript contains text only.
pub fn render_terminal(bytes: &[u8]) -> String {
    let mut parser = vt100::Parser::new(TERMINAL_ROWS, TERMINAL_COLS, TERMINAL_SCROLLBACK);
    parser.process(bytes);
    let mut lines: Vec<String> = Vec::new();
    parser.screen_mut().set_scrollback(usize::MAX);
    let depth = parser.screen().scrollback();
    // Walk the scrollback one line at a time: at offset k the top visible row is the k-th
    // line above the screen.
    for offset in (1..=depth).rev() {
        parser.screen_mut().set_scrollback(offset);
        if let Some(row) = parser.screen().rows(0, TERMINAL_COLS).next() {
            lines.push(row);
        }
    }
    parser.screen_mut().set_scrollback(0);
    lines.extend(parser.screen().rows(0, TERMINAL_COLS));
    for line in &mut lines {
        line.truncate(line.trim_end().len());
    }
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    let mut out = lines.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// Makes guest-provided text safe to embed in a one-line message: control characters become
/// spaces and the length is bounded.
pub fn sanitize_line(text: &str, max_chars: usize) -> String {
    let mut out: String = text
        .chars()
        .take(max_chars)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().count() > max_chars {
        out.push('…');
    }
    out
}

/// What failed in the exchange with the agent about a command (the command failing is an
/// exit code, not this).
#[derive(Debug, thiserror::Error)]
enum ExecFailure {
    #[error("unexpected agent answer {0:?}")]
    UnexpectedAnswer(Box<Response>),
    /// The agent's final frame did not decode; the proto crate's text says what it was.
    #[error("{0}")]
    Result(#[source] dynocap_proto::ProtoError),
}

impl Coded for ExecFailure {
    /// Both ends are DynoCap's: a garbled or unexpected answer is never the caller's doing.
    fn code(&self) -> ErrorCode {
        match self {
            Self::UnexpectedAnswer(_) | Self::Result(_) => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_hint_names_the_registry_a_host_belongs_to() {
        let hint = allow_hint("files.pythonhosted.org");
        assert!(
            hint.contains("--allow-host @pypi on `dynocap run`")
                && hint.contains("adding @pypi to DYNOCAP_EGRESS_ALLOW")
                && hint.ends_with("; @pypi stands for pypi.org, files.pythonhosted.org"),
            "{hint}"
        );
        // Cloud Storage is on @go's list but serves every bucket: the host alone.
        let hint = allow_hint("storage.googleapis.com");
        assert!(
            hint.contains("--allow-host storage.googleapis.com on") && !hint.contains('@'),
            "{hint}"
        );
        let hint = allow_hint("example.com");
        assert!(
            hint.contains("--allow-host example.com on")
                && hint.contains("adding example.com to DYNOCAP_EGRESS_ALLOW")
                && !hint.contains('@'),
            "{hint}"
        );
    }

    #[test]
    fn terminal_interprets_carriage_return_and_colours() {
        // What a pty delivers: its line discipline turns each "\n" into "\r\n".
        let out = render_terminal(b"progress 10%\rprogress 100%\r\n\x1b[31mred\x1b[0m text\r\n");
        assert_eq!(out, "progress 100%\nred text\n");
    }

    #[test]
    fn terminal_keeps_scrollback_in_order() {
        let input: String = (0..60).map(|i| format!("line {i}\r\n")).collect();
        let out = render_terminal(input.as_bytes());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 60);
        assert_eq!(lines[0], "line 0");
        assert_eq!(lines[59], "line 59");
    }

    #[test]
    fn progress_shows_the_latest_line_as_plain_text() {
        assert_eq!(latest_line(b"one\ntwo\n\n"), Some("two".to_owned()));
        assert_eq!(
            latest_line(b"50%\r\x1b[32m100%\x1b[0m\r"),
            Some("100%".to_owned())
        );
        assert_eq!(latest_line(b"\n \n"), None);
        let report = running(Duration::from_secs(12), 120, "compiling foo");
        assert_eq!(
            (report.message.as_str(), report.done, report.total),
            ("running for 12s: compiling foo", 12, Some(120))
        );
    }

    #[test]
    fn sanitize_strips_controls_and_bounds() {
        assert_eq!(sanitize_line("a\x1b[2Jb\nc", 100), "a [2Jb c");
        assert_eq!(sanitize_line("abcdef", 3), "abc…");
    }
}
