//! A command's output on the user's stdout and stderr while it runs: every byte, in order, as
//! it arrives. Pipes and files (and `--raw`) get the bytes unchanged; a terminal gets them
//! neutralised (see `terminal.rs`), with what a piece's cut splits carried to the next piece.
//! A pipe whose reader went away ends the command (see [`LiveOutput::reader_gone`]), as
//! SIGPIPE ends a writer in a pipeline.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use dynocap_engine::control::OutputChannel;

use crate::output::{Stream, Streams};
use crate::terminal::Neutraliser;

/// The exit code of a command whose output pipe closed: 128 + SIGPIPE, as a shell reports a
/// writer that SIGPIPE ended.
pub const READER_GONE_EXIT: u8 = 128 + 13;

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
