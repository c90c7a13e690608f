//! How results reach a person (aligned tables) or a program (`--json`, the objects of docs/mcp.md),
//! and how errors are reported in either mode.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use dynocap_engine::{Error, SandboxInfo};
use serde::Serialize;

/// The exit code of a command whose output pipe closed: 128 + SIGPIPE, as a shell reports a
/// writer that SIGPIPE ended.
pub const READER_GONE_EXIT: u8 = 128 + 13;

/// Where a command writes: this process's stdout and stderr, or the ones a `dynocap` client
/// passed to the command server with its command (see `cli_server`). The commands the server
/// runs write through this; the others use the process's own streams.
pub struct Streams {
    stdout: Stream,
    stderr: Stream,
}

/// One stream, shared with the engine's output callback (hence the lock).
pub struct Stream {
    writer: Mutex<Box<dyn Write + Send>>,
    terminal: bool,
    /// A write found no reader (EPIPE): the command ends as SIGPIPE would end it.
    reader_gone: AtomicBool,
}

impl Stream {
    fn new(writer: impl Write + IsTerminal + Send + 'static) -> Self {
        Self::of_writer(writer.is_terminal(), writer)
    }

    /// A stream writing through `writer`; `terminal`: whether what it writes to is one.
    pub fn of_writer(terminal: bool, writer: impl Write + Send + 'static) -> Self {
        Self {
            terminal,
            writer: Mutex::new(Box::new(writer)),
            reader_gone: AtomicBool::new(false),
        }
    }

    /// The writer. Each command writes its pieces whole under the lock (a table, a JSON
    /// object, a chunk of output), so pieces written from two places never interleave.
    pub fn lock(&self) -> MutexGuard<'_, Box<dyn Write + Send>> {
        // A panic while writing leaves at worst a partly written piece; the stream is usable.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// Writes `text` whole. A reader that went away is noted (see [`Stream::reader_gone`])
    /// and the command goes on: what it changes must not stop half-way because nobody reads.
    pub fn write_str(&self, text: &str) {
        let mut writer = self.lock();
        let written = writer
            .write_all(text.as_bytes())
            .and_then(|()| writer.flush());
        if matches!(&written, Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe) {
            self.reader_gone.store(true, Ordering::Release);
        }
    }

    /// Whether a write found that the reader had gone (`dynocap ps | head -0`).
    pub fn reader_gone(&self) -> bool {
        self.reader_gone.load(Ordering::Acquire)
    }
}

/// Set when a write to this process's stdout or stderr found no reader. SIGPIPE is ignored
/// in every process of dynocap (the supervisor, the MCP and command servers write to sockets
/// whose peer may go), so a closed pipe is an EPIPE error, which [`ended`] turns into the
/// exit code a shell gives a writer SIGPIPE killed.
static READER_GONE: AtomicBool = AtomicBool::new(false);

/// Set when a write to this process's stdout failed otherwise (a full disk behind `>`); said
/// once on stderr.
static STDOUT_FAILED: AtomicBool = AtomicBool::new(false);

/// This process's stdout, noting a reader that went away (see [`READER_GONE`]) or another
/// failure ([`STDOUT_FAILED`]).
struct ProcessStdout;

impl Write for ProcessStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = std::io::stdout().write(buf);
        note_stdout(&written);
        written
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let flushed = std::io::stdout().flush();
        note_stdout(&flushed);
        flushed
    }
}

fn note_stdout<T>(result: &std::io::Result<T>) {
    let Err(err) = result else { return };
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        READER_GONE.store(true, Ordering::Release);
    } else if !STDOUT_FAILED.swap(true, Ordering::AcqRel) {
        let _ = writeln!(std::io::stderr(), "dynocap: cannot write to stdout: {err}");
    }
}

/// Writes to this process's stdout, as `print!` does, without its panic on a closed pipe:
/// the command goes on to its end and [`ended`] gives its exit code.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = ProcessStdout;
    let _ = out.write_fmt(args).and_then(|()| out.flush());
}

/// Writes a line to this process's stderr, as `eprintln!` does, without its panic on a closed
/// pipe (`dynocap image build debian 2>&1 | head -1` panicked in the build's progress
/// callback, abandoning the build). A reader gone counts as on stdout (SIGPIPE would have
/// ended the command either way); any other failure leaves nowhere to say it.
pub fn write_stderr_line(args: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let written = err
        .write_fmt(format_args!("{args}\n"))
        .and_then(|()| err.flush());
    if matches!(&written, Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe) {
        READER_GONE.store(true, Ordering::Release);
    }
}

/// The exit code of a command run in this process, once its work is done: 141 (128 +
/// SIGPIPE) if its stdout's reader went away, as a shell reports a writer SIGPIPE ended
/// (`dynocap ls | head -0`), a failure if stdout could not be written otherwise, else `code`.
pub fn ended(code: ExitCode) -> ExitCode {
    if READER_GONE.load(Ordering::Acquire) {
        ExitCode::from(READER_GONE_EXIT)
    } else if STDOUT_FAILED.load(Ordering::Acquire) {
        ExitCode::FAILURE
    } else {
        code
    }
}

/// `print!` on this process's stdout through [`write_stdout`].
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` on this process's stdout through [`write_stdout`].
macro_rules! sayln {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` on this process's stderr through [`write_stderr_line`].
macro_rules! warnln {
    ($($arg:tt)*) => {
        $crate::output::write_stderr_line(format_args!($($arg)*))
    };
}

pub(crate) use {say, sayln, warnln};

impl Streams {
    /// This process's stdout and stderr.
    pub fn of_process() -> Self {
        Self {
            stdout: Stream::of_writer(std::io::stdout().is_terminal(), ProcessStdout),
            stderr: Stream::new(std::io::stderr()),
        }
    }

    /// Two streams of another process's (a command server's client).
    pub fn of(stdout: Stream, stderr: Stream) -> Self {
        Self { stdout, stderr }
    }

    pub fn stdout(&self) -> &Stream {
        &self.stdout
    }

    pub fn stderr(&self) -> &Stream {
        &self.stderr
    }

    /// A JSON object on stdout, as `print_json` prints it.
    pub fn json<T: Serialize>(&self, value: &T) {
        match serde_json::to_string_pretty(value) {
            Ok(text) => self.stdout.write_str(&format!("{text}\n")),
            Err(err) => self
                .stderr
                .write_str(&format!("dynocap: cannot encode the result: {err}\n")),
        }
    }

    /// [`fail`] on these streams; the exit code.
    pub fn fail(&self, json: bool, err: &Error) -> u8 {
        let message = crate::wording::text(crate::wording::Surface::Cli, err);
        if json {
            self.json(&serde_json::json!({ "error": { "code": err.code, "message": message } }));
        }
        self.stderr
            .write_str(&format!("dynocap: {}: {message}\n", err.code.as_str()));
        1
    }
}

pub fn print_json<T: Serialize>(value: &T) {
    Streams::of_process().json(value);
}

/// Reports an error: a JSON error object on stdout with `--json`, a readable line on stderr
/// otherwise. Always exits 1, so scripts can tell a refused call from a command's failure
/// only through `--json` (`dynocap exec` uses the command's own exit code on success).
/// The message is the command line's wording of it (`--ttl`, `dynocap task exec NAME`), not
/// the MCP one (`ttlSeconds`, `dynocap_task_exec`).
pub fn fail(json: bool, err: &Error) -> ExitCode {
    ExitCode::from(Streams::of_process().fail(json, err))
}

/// Reports a command line that does not parse. Help and version requests print as clap prints
/// them. An error is clap's own text without `--json`, and with it (anywhere before `--`) the
/// JSON error object on stdout, `invalid_argument` like every refused value. Exits 2 either
/// way, as clap does, so a usage error stands apart from a refused call (1).
pub fn argument_error(err: &clap::Error, args: &[OsString]) -> ExitCode {
    use clap::error::ErrorKind;
    let asked = matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    );
    let code = ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2));
    if asked || !crate::cli::json_requested(args) {
        match err.print() {
            Err(print) if print.kind() == std::io::ErrorKind::BrokenPipe => {
                return ExitCode::from(READER_GONE_EXIT);
            }
            Err(print) => warnln!("dynocap: cannot print the usage message: {print}"),
            Ok(()) => {}
        }
        return code;
    }
    let message = crate::cli::explain(err, args);
    print_json(&serde_json::json!({ "error": { "code": "invalid_argument", "message": message } }));
    warnln!("dynocap: invalid_argument: {message}");
    ended(code)
}

/// A left-aligned table with a header row.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&headers.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>());
    for row in rows {
        line(row);
    }
    out
}

pub fn sandbox_rows(sandboxes: &[SandboxInfo]) -> Vec<Vec<String>> {
    sandboxes
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.state.as_str().to_owned(),
                s.backend.clone(),
                s.image.clone(),
                s.network.clone(),
                s.cpus.to_string(),
                s.memory_mb.to_string(),
                s.disk_mb.to_string(),
                s.expires_at.clone(),
            ]
        })
        .collect()
}

/// The notes of sandboxes that have one (a `nat` network that ended), a line each, for
/// under their table.
pub fn sandbox_notes(sandboxes: &[SandboxInfo]) -> String {
    sandboxes
        .iter()
        .map(|s| {
            let note = s.note.as_deref().map_or_else(String::new, |note| {
                format!(
                    "  {}: {}\n",
                    s.name,
                    dynocap_engine::exec::sanitize_line(note, 1000)
                )
            });
            note + &job_lines(&s.name, &s.jobs)
                + &crate::port_commands::forward_lines(&s.name, &s.forwards)
        })
        .collect()
}

/// One line per running job of a listed sandbox or task: its id, since when and for how
/// long it runs, and the start of its command.
pub fn job_lines(name: &str, jobs: &[dynocap_engine::jobs::RunningJob]) -> String {
    jobs.iter()
        .map(|job| {
            format!(
                "  {name}: job {} running {}s (since {}): {}\n",
                job.job,
                job.running_seconds,
                job.started_at,
                dynocap_engine::exec::sanitize_line(&job.command, 80)
            )
        })
        .collect()
}

pub const SANDBOX_HEADERS: &[&str] = &[
    "NAME",
    "STATE",
    "BACKEND",
    "IMAGE",
    "NETWORK",
    "CPUS",
    "MEMORY_MB",
    "DISK_MB",
    "EXPIRES",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let out = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(out, "A    LONGER\nxyz  1\n");
    }
}
