//! A command's output on the user's stdout and stderr while it runs: every byte, in order, as
//! it arrives. Pipes and files (and `--raw`) get the bytes unchanged; a terminal gets them
//! neutralised (see `terminal.rs`), with what a piece's cut splits carried to the next piece.
//! A pipe whose reader went away ends the command (see [`LiveOutput::reader_gone`]), as
//! SIGPIPE ends a writer in a pipeline.
//!
//! After the output, [`refusal_notes`] says on stderr which connections the sandbox's egress
//! proxy refused while the command ran, why, and what would allow them.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use dynocap_engine::control::OutputChannel;
use dynocap_engine::ExecResult;

use crate::output::{Stream, Streams};
use crate::terminal::Neutraliser;

pub use crate::output::READER_GONE_EXIT;

/// The user's two streams, shared with the engine's output callback (hence the locks).
pub struct LiveOutput<'a> {
    stdout: Mutex<Sink<'a>>,
    stderr: Mutex<Sink<'a>>,
    reader_gone: AtomicBool,
    reader_gone_notice: tokio::sync::Notify,
}

struct Sink<'a> {
    stream: &'a Stream,
    /// Set when the stream is a terminal and `--raw` was not given.
    neutraliser: Option<Neutraliser>,
    /// A write failed other than with EPIPE (a terminal that went away): the rest is dropped.
    broken: bool,
}

/// What a write found of its reader.
enum Written {
    Delivered,
    ReaderGone,
}

impl<'a> LiveOutput<'a> {
    pub fn new(streams: &'a Streams, raw: bool) -> Self {
        Self {
            stdout: Mutex::new(Sink::new(streams.stdout(), raw)),
            stderr: Mutex::new(Sink::new(streams.stderr(), raw)),
            reader_gone: AtomicBool::new(false),
            reader_gone_notice: tokio::sync::Notify::new(),
        }
    }

    /// Writes one piece of the command's output to the matching stream, flushed, so that the
    /// user sees it now. Blocks while the reader of a pipe is slow: the command then waits.
    pub fn write(&self, channel: OutputChannel, data: &[u8]) {
        let written = match channel {
            OutputChannel::Stdout => lock(&self.stdout).write(data),
            OutputChannel::Stderr => lock(&self.stderr).write(data),
        };
        if matches!(written, Written::ReaderGone) && !self.reader_gone.swap(true, Ordering::AcqRel)
        {
            self.reader_gone_notice.notify_one();
        }
    }

    /// Whether a stream's reader has gone (see [`LiveOutput::reader_gone`]).
    pub fn is_reader_gone(&self) -> bool {
        self.reader_gone.load(Ordering::Acquire)
    }

    /// Resolves once a stream's reader has gone (`dynocap exec … | head`): the caller then
    /// drops the command, whose connection closing cancels it in the guest, rather than let
    /// it run on to its timeout for nobody.
    pub async fn reader_gone(&self) {
        if !self.reader_gone.load(Ordering::Acquire) {
            self.reader_gone_notice.notified().await;
        }
    }

    /// Writes what the neutralisers held back for a next piece that will not come.
    pub fn finish(&self) {
        lock(&self.stdout).finish();
        lock(&self.stderr).finish();
    }
}

impl<'a> Sink<'a> {
    fn new(stream: &'a Stream, raw: bool) -> Self {
        Self {
            stream,
            neutraliser: (!raw && stream.is_terminal()).then(Neutraliser::default),
            broken: false,
        }
    }

    fn write(&mut self, data: &[u8]) -> Written {
        match &mut self.neutraliser {
            Some(neutraliser) => {
                let text = neutraliser.push(data);
                self.emit(text.as_bytes())
            }
            None => self.emit(data),
        }
    }

    fn finish(&mut self) {
        if let Some(neutraliser) = &mut self.neutraliser {
            let text = neutraliser.finish();
            self.emit(text.as_bytes());
        }
    }

    fn emit(&mut self, bytes: &[u8]) -> Written {
        if self.broken || bytes.is_empty() {
            return Written::Delivered;
        }
        let mut writer = self.stream.lock();
        match writer.write_all(bytes).and_then(|()| writer.flush()) {
            Ok(()) => Written::Delivered,
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {
                self.broken = true;
                Written::ReaderGone
            }
            Err(_) => {
                self.broken = true;
                Written::Delivered
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while writing leaves at worst a partly written piece; the sink is still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Longest refusal line printed: host and reason are bounded already; this holds whatever
/// comes.
const MAX_REFUSAL_LINE: usize = 1200;

/// The lines for stderr after a command's output: one per distinct refusal in its result
/// (`networkRefusals`), saying which host was refused, how often, why and, for a host the
/// allowlist does not name, what the user can set to allow it; then how many were left out.
/// Host and reason come from the guest's request: each line has its control characters made
/// spaces and what a terminal would still act on made visible, so it can neither inject an
/// escape sequence nor start a line of its own.
pub fn refusal_notes(result: &ExecResult) -> String {
    let mut out = String::new();
    for refusal in &result.network_refusals {
        let target = if refusal.host.is_empty() {
            "a request that named no host".to_owned()
        } else {
            format!("{}:{}", refusal.host, refusal.port)
        };
        let times = match refusal.count {
            1 => String::new(),
            n => format!(" ({n} times)"),
        };
        let mut line = format!(
            "the sandbox's network refused {target}{times}: {}",
            refusal.reason
        );
        if refusal.fix.is_some() {
            let entry = dynocap_engine::exec::AllowEntry::for_host(&refusal.host);
            line.push_str(&format!(
                "; to allow it, start a sandbox with --allow-host {entry} (`dynocap run`, \
                 `dynocap task start`) or add {entry} to DYNOCAP_EGRESS_ALLOW{}",
                entry.note()
            ));
        }
        push_note(&mut out, &line);
    }
    match result.network_refusals_omitted {
        0 => {}
        n => push_note(
            &mut out,
            &format!(
                "the sandbox's network refused {n} more connection{} not listed here; \
                 network.jsonl has every decision",
                if n == 1 { "" } else { "s" }
            ),
        ),
    }
    out
}

fn push_note(out: &mut String, line: &str) {
    let safe = dynocap_engine::exec::sanitize_line(line, MAX_REFUSAL_LINE);
    out.push_str("dynocap: ");
    out.push_str(&crate::terminal::neutralise(&safe));
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynocap_engine::exec::NetworkRefusal;

    fn result(refusals: Vec<NetworkRefusal>, omitted: u64) -> ExecResult {
        let mut result: ExecResult = serde_json::from_value(serde_json::json!({
            "exitCode": 0, "signal": null, "timedOut": false, "durationMs": 1, "truncated": false
        }))
        .unwrap();
        result.network_refusals = refusals;
        result.network_refusals_omitted = omitted;
        result
    }

    fn refusal(host: &str, port: u16, reason: &str, count: u64, fix: bool) -> NetworkRefusal {
        NetworkRefusal {
            host: host.to_owned(),
            port,
            reason: reason.to_owned(),
            count,
            fix: fix.then(|| "engine wording".to_owned()),
        }
    }

    #[test]
    fn one_line_per_refusal_with_the_fix_where_one_exists() {
        let notes = refusal_notes(&result(
            vec![
                refusal(
                    "pypi.org",
                    443,
                    "pypi.org is not on this sandbox's allowlist",
                    5,
                    true,
                ),
                refusal(
                    "other.example",
                    443,
                    "other.example is not on this sandbox's allowlist",
                    1,
                    true,
                ),
                refusal(
                    "registry.npmjs.org",
                    80,
                    "port 80 is not allowed for registry.npmjs.org (allowed: 443)",
                    1,
                    false,
                ),
                refusal(
                    "",
                    0,
                    "plain HTTP (GET) is refused in a filtered sandbox",
                    1,
                    false,
                ),
            ],
            3,
        ));
        assert_eq!(
            notes,
            "dynocap: the sandbox's network refused pypi.org:443 (5 times): pypi.org is not on \
             this sandbox's allowlist; to allow it, start a sandbox with --allow-host @pypi \
             (`dynocap run`, `dynocap task start`) or add @pypi to DYNOCAP_EGRESS_ALLOW; @pypi \
             stands for pypi.org, files.pythonhosted.org\n\
             dynocap: the sandbox's network refused other.example:443: other.example is not on \
             this sandbox's allowlist; to allow it, start a sandbox with --allow-host \
             other.example (`dynocap run`, `dynocap task start`) or add other.example to \
             DYNOCAP_EGRESS_ALLOW\n\
             dynocap: the sandbox's network refused registry.npmjs.org:80: port 80 is not \
             allowed for registry.npmjs.org (allowed: 443)\n\
             dynocap: the sandbox's network refused a request that named no host: plain HTTP \
             (GET) is refused in a filtered sandbox\n\
             dynocap: the sandbox's network refused 3 more connections not listed here; \
             network.jsonl has every decision\n"
        );
        assert_eq!(refusal_notes(&result(Vec::new(), 0)), "");
    }

    #[test]
    fn guest_text_cannot_escape_its_line() {
        let notes = refusal_notes(&result(
            vec![refusal(
                "evil\u{1b}]52;c;aGk=\u{7}.example\nforged",
                443,
                "\u{9b}2J\u{202e}reversed\r\nfake line",
                1,
                true,
            )],
            0,
        ));
        assert_eq!(notes.lines().count(), 1, "{notes:?}");
        assert!(
            !notes
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{notes:?}"
        );
        assert!(notes.contains("<U+202E>reversed"), "{notes:?}");
        let long = refusal_notes(&result(
            vec![refusal(&"h".repeat(3000), 443, "r", 1, false)],
            0,
        ));
        assert!(
            long.chars().count() < MAX_REFUSAL_LINE + 20,
            "{}",
            long.len()
        );
    }
}
