//! Bytes the host streams into a request (`Data` frames on channel INPUT, then `Eof`), carried
//! from the frame reader to the request's worker through a small bounded queue.
//!
//! The queue is what gives back-pressure: when the worker (a blocking thread writing files) is
//! slower than the host, the server's frame reader waits on the full queue and stops reading
//! the channel, so the agent never buffers more than [`INPUT_QUEUE`] frames per stream.
//!
//! The worker side is a plain [`std::io::Read`], for use on a blocking thread. It tells three
//! endings apart: the host's `Eof` (a clean end: `read` returns 0), the sender dropped without
//! one (the stream was cancelled or the channel died: an error), and a cancel flag raised while
//! data is still queued (an error on the next read).

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

/// Frames queued per stream. A `Data` frame holds at most about 1 MiB, so this bounds what one
/// stream can make the agent hold.
pub const INPUT_QUEUE: usize = 4;

/// One item of a stream's input.
#[derive(Debug)]
pub enum Input {
    /// A `Data` frame's payload; the bytes start at `start` (after the channel byte), so the
    /// payload is handed over without a copy.
    Data { payload: Vec<u8>, start: usize },
    /// The host's `Eof` for the input channel.
    Eof,
}

/// How the input of a stream ended, as far as the reader has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputState {
    /// Still open: more bytes may come.
    Open,
    /// The host sent `Eof` and every byte before it has been read.
    Ended,
    /// The sender went away without `Eof`, or the cancel flag was raised.
    Aborted,
}

/// Creates a stream's input queue.
pub fn queue() -> (mpsc::Sender<Input>, mpsc::Receiver<Input>) {
    mpsc::channel(INPUT_QUEUE)
}

/// Blocking reader over a stream's input queue. Must not be used on a runtime thread.
pub struct InputReader {
    rx: mpsc::Receiver<Input>,
    current: Vec<u8>,
    pos: usize,
    state: InputState,
    cancelled: Arc<AtomicBool>,
}

impl InputReader {
    pub fn new(rx: mpsc::Receiver<Input>, cancelled: Arc<AtomicBool>) -> Self {
        Self {
            rx,
            current: Vec::new(),
            pos: 0,
            state: InputState::Open,
            cancelled,
        }
    }

    pub fn state(&self) -> InputState {
        self.state
    }

    /// Whether the reader stopped because the stream was cancelled (or the channel died).
    pub fn aborted(&self) -> bool {
        self.state == InputState::Aborted || self.cancelled.load(Ordering::Relaxed)
    }

    fn abort(&mut self) -> io::Error {
        self.state = InputState::Aborted;
        self.current = Vec::new();
        self.pos = 0;
        // Closing the queue makes the frame reader drop further input at once instead of
        // waiting for room that will never come.
        self.rx.close();
        io::Error::new(io::ErrorKind::ConnectionAborted, "the stream was cancelled")
    }
}

impl Read for InputReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.cancelled.load(Ordering::Relaxed) || self.state == InputState::Aborted {
                return Err(self.abort());
            }
            if out.is_empty() {
                return Ok(0);
            }
            if let Some(rest) = self.current.get(self.pos..).filter(|r| !r.is_empty()) {
                let n = rest.len().min(out.len());
                out[..n].copy_from_slice(&rest[..n]);
                self.pos += n;
                return Ok(n);
            }
            if self.state == InputState::Ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Input::Data { payload, start }) => {
                    self.current = payload;
                    self.pos = start;
                }
                Some(Input::Eof) => self.state = InputState::Ended,
                None => return Err(self.abort()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(bytes: &[u8]) -> Input {
        let mut payload = vec![0];
        payload.extend_from_slice(bytes);
        Input::Data { payload, start: 1 }
    }

    #[test]
    fn reads_across_frames_then_ends_cleanly() {
        let (tx, rx) = queue();
        let flag = Arc::new(AtomicBool::new(false));
        let reader = std::thread::spawn(move || {
            let mut reader = InputReader::new(rx, flag);
            let mut all = Vec::new();
            reader.read_to_end(&mut all).expect("clean end");
            (all, reader.state())
        });
        tx.blocking_send(data(b"hello ")).expect("send");
        tx.blocking_send(data(b"")).expect("send");
        tx.blocking_send(data(b"world")).expect("send");
        tx.blocking_send(Input::Eof).expect("send");
        let (all, state) = reader.join().expect("join");
        assert_eq!(all, b"hello world");
        assert_eq!(state, InputState::Ended);
    }

    #[test]
    fn the_queue_is_bounded() {
        let (tx, _rx) = queue();
        for _ in 0..INPUT_QUEUE {
            tx.try_send(data(b"x")).expect("room");
        }
        assert!(tx.try_send(data(b"x")).is_err());
    }

    #[test]
    fn a_dropped_sender_or_a_raised_flag_is_an_error() {
        let (tx, rx) = queue();
        let flag = Arc::new(AtomicBool::new(false));
        tx.blocking_send(data(b"abc")).expect("send");
        drop(tx);
        let mut reader = InputReader::new(rx, Arc::clone(&flag));
        let mut buf = [0_u8; 2];
        assert_eq!(reader.read(&mut buf).expect("data"), 2);
        assert_eq!(reader.read(&mut buf).expect("data"), 1);
        assert!(reader.read(&mut buf).is_err());
        assert!(reader.aborted());

        let (tx, rx) = queue();
        tx.blocking_send(data(b"abc")).expect("send");
        let mut reader = InputReader::new(rx, Arc::clone(&flag));
        flag.store(true, Ordering::Relaxed);
        assert!(reader.read(&mut buf).is_err());
        // The queue is closed: the sender learns at once.
        assert!(tx.blocking_send(data(b"x")).is_err());
    }
}
