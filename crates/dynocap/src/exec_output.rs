//! A command's output on the user's stdout and stderr while it runs: every byte, in order, as
//! it arrives. Pipes and files (and `--raw`) get the bytes unchanged; a terminal gets them
//! neutralised (see `terminal.rs`), with what a piece's cut splits carried to the next piece.
//! A pipe whose reader went away ends the CLI as SIGPIPE ends a command, and so the command.

use std::io::{IsTerminal, Write};
use std::sync::{Mutex, PoisonError};

use dynocap_engine::control::OutputChannel;

use crate::terminal::Neutraliser;

/// The user's two streams, shared with the engine's output callback (hence the locks).
pub struct LiveOutput {
    stdout: Mutex<Sink<std::io::Stdout>>,
    stderr: Mutex<Sink<std::io::Stderr>>,
}

struct Sink<W> {
    stream: W,
    /// Set when the stream is a terminal and `--raw` was not given.
    neutraliser: Option<Neutraliser>,
    /// A write failed other than with EPIPE (a terminal that went away): the rest is dropped.
    broken: bool,
}

impl LiveOutput {
    pub fn new(raw: bool) -> Self {
        Self {
            stdout: Mutex::new(Sink::new(std::io::stdout(), raw)),
            stderr: Mutex::new(Sink::new(std::io::stderr(), raw)),
        }
    }

    /// Writes one piece of the command's output to the matching stream, flushed, so that the
    /// user sees it now. Blocks while the reader of a pipe is slow: the command then waits.
    pub fn write(&self, channel: OutputChannel, data: &[u8]) {
        match channel {
            OutputChannel::Stdout => lock(&self.stdout).write(data),
            OutputChannel::Stderr => lock(&self.stderr).write(data),
        }
    }

    /// Writes what the neutralisers held back for a next piece that will not come.
    pub fn finish(&self) {
        lock(&self.stdout).finish();
        lock(&self.stderr).finish();
    }
}

impl<W: Write + IsTerminal> Sink<W> {
    fn new(stream: W, raw: bool) -> Self {
        let neutraliser = (!raw && stream.is_terminal()).then(Neutraliser::default);
        Self {
            stream,
            neutraliser,
            broken: false,
        }
    }

    fn write(&mut self, data: &[u8]) {
        match &mut self.neutraliser {
            Some(neutraliser) => {
                let text = neutraliser.push(data);
                self.emit(text.as_bytes());
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

    fn emit(&mut self, bytes: &[u8]) {
        if self.broken || bytes.is_empty() {
            return;
        }
        match self
            .stream
            .write_all(bytes)
            .and_then(|()| self.stream.flush())
        {
            Ok(()) => {}
            // The reader of a pipe is gone (`dynocap exec … | head`): end as a writer in a
            // pipeline does, of SIGPIPE. Our connection closing cancels the command, which
            // would otherwise run on to its timeout for nobody.
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {
                std::process::exit(128 + libc::SIGPIPE)
            }
            Err(_) => self.broken = true,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while writing leaves at worst a partly written piece; the sink is still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
