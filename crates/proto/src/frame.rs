//! Wire framing: how frames are laid out on the byte stream, and a bounded decoder.
//!
//! A frame is `len: u32 BE | stream: u32 BE | kind: u8 | payload`, where `len` counts
//! everything after itself. The decoder never allocates more than [`MAX_FRAME_LEN`] for one
//! frame, whatever the length field claims, so a hostile peer cannot make us allocate.

use thiserror::Error;

/// Upper bound for one frame (stream id, kind and payload). Large enough for a 64 KiB data
/// chunk plus headroom for control messages; anything larger is a protocol violation.
pub const MAX_FRAME_LEN: usize = 1024 * 1024;

/// Payload size data producers should use per frame, so frames stay well under the bound.
pub const DATA_CHUNK: usize = 64 * 1024;

const HEADER_LEN: usize = 4 + 4 + 1;

/// Stream 0 carries connection-level messages (the agent's hello); requests use 1 and up.
pub const CONTROL_STREAM: u32 = 0;

/// Streams opened by the guest side (e.g. proxy tunnels) have this bit set, so the two sides
/// never pick the same id.
pub const GUEST_STREAM_BIT: u32 = 1 << 31;

/// What a frame means. The payload format depends on the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Opens a stream; payload is a JSON [`crate::Request`].
    Open = 1,
    /// Bytes on one channel of a stream; payload is `channel: u8 | bytes`.
    Data = 2,
    /// A channel of a stream has ended; payload is `channel: u8`.
    Eof = 3,
    /// The stream finished; payload is a JSON [`crate::Response`]. Last frame of a stream.
    Done = 4,
    /// The stream failed; payload is a JSON [`crate::ErrorBody`]. Last frame of a stream.
    Error = 5,
    /// The opener asks the other side to stop the stream's work (kill the exec). No payload.
    Cancel = 6,
    /// First frame the agent sends, on the control stream; payload is a JSON [`crate::Hello`].
    Hello = 7,
    /// Flow-control credit for a tunnel stream: payload is `bytes: u32 BE`, the cost of data
    /// frames the sender of this frame has consumed (see [`crate::tunnel`]).
    Window = 8,
}

impl FrameKind {
    fn from_u8(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Self::Open,
            2 => Self::Data,
            3 => Self::Eof,
            4 => Self::Done,
            5 => Self::Error,
            6 => Self::Cancel,
            7 => Self::Hello,
            8 => Self::Window,
            _ => return None,
        })
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub stream: u32,
    pub kind: FrameKind,
    pub payload: Vec<u8>,
}

/// Framing errors. Each one is fatal for the connection: after it the byte stream cannot be
/// trusted to be aligned on frame boundaries any more.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame length {0} is outside 9..={max}", max = MAX_FRAME_LEN)]
    BadLength(u32),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
}

impl Frame {
    pub fn new(stream: u32, kind: FrameKind, payload: Vec<u8>) -> Self {
        Self {
            stream,
            kind,
            payload,
        }
    }

    /// Encodes the frame. Panics are impossible: callers that build payloads larger than the
    /// bound get an error instead.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        let body_len = 4 + 1 + self.payload.len();
        if body_len > MAX_FRAME_LEN {
            return Err(FrameError::BadLength(
                u32::try_from(body_len).unwrap_or(u32::MAX),
            ));
        }
        let len = u32::try_from(body_len).map_err(|_| FrameError::BadLength(u32::MAX))?;
        let mut out = Vec::with_capacity(4 + body_len);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.payload);
        Ok(out)
    }
}

/// Incremental decoder: feed it bytes as they arrive, take frames out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes. The buffer never holds more than one maximal frame plus one
    /// read's worth of bytes, because [`FrameDecoder::next_frame`] rejects oversized lengths
    /// before waiting for their payload.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Returns the next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let body_len = len as usize;
        if !(HEADER_LEN - 4..=MAX_FRAME_LEN).contains(&body_len) {
            return Err(self.fail(FrameError::BadLength(len)));
        }
        if self.buf.len() < 4 + body_len {
            return Ok(None);
        }
        let stream = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
        let kind_byte = self.buf[8];
        let Some(kind) = FrameKind::from_u8(kind_byte) else {
            return Err(self.fail(FrameError::UnknownKind(kind_byte)));
        };
        let payload = self.buf[HEADER_LEN..4 + body_len].to_vec();
        self.buf.drain(..4 + body_len);
        Ok(Some(Frame {
            stream,
            kind,
            payload,
        }))
    }

    /// Bytes received but not yet part of a returned frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    fn fail(&mut self, err: FrameError) -> FrameError {
        self.buf = Vec::new();
        self.failed = Some(err.clone());
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_split_at_every_byte() {
        let frames = vec![
            Frame::new(1, FrameKind::Open, b"{\"ping\":{}}".to_vec()),
            Frame::new(1, FrameKind::Data, vec![1, b'h', b'i']),
            Frame::new(7, FrameKind::Done, Vec::new()),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(|f| f.encode().unwrap()).collect();
        for split in 0..wire.len() {
            let mut dec = FrameDecoder::new();
            let mut out = Vec::new();
            dec.push(&wire[..split]);
            while let Some(f) = dec.next_frame().unwrap() {
                out.push(f);
            }
            dec.push(&wire[split..]);
            while let Some(f) = dec.next_frame().unwrap() {
                out.push(f);
            }
            assert_eq!(out, frames, "split at {split}");
            assert_eq!(dec.buffered(), 0);
        }
    }

    #[test]
    fn oversized_length_is_rejected_before_buffering_payload() {
        let mut dec = FrameDecoder::new();
        dec.push(&u32::MAX.to_be_bytes());
        assert_eq!(dec.next_frame(), Err(FrameError::BadLength(u32::MAX)));
        assert_eq!(dec.buffered(), 0);
        // The error sticks: the stream is no longer aligned.
        dec.push(&Frame::new(1, FrameKind::Done, vec![]).encode().unwrap());
        assert!(dec.next_frame().is_err());
    }

    #[test]
    fn too_short_length_and_unknown_kind_are_errors() {
        let mut dec = FrameDecoder::new();
        dec.push(&3u32.to_be_bytes());
        assert_eq!(dec.next_frame(), Err(FrameError::BadLength(3)));

        let mut dec = FrameDecoder::new();
        let mut wire = Frame::new(1, FrameKind::Done, vec![]).encode().unwrap();
        wire[8] = 99;
        dec.push(&wire);
        assert_eq!(dec.next_frame(), Err(FrameError::UnknownKind(99)));
    }

    #[test]
    fn encode_refuses_oversized_payload() {
        let frame = Frame::new(1, FrameKind::Data, vec![0; MAX_FRAME_LEN]);
        assert!(frame.encode().is_err());
        let frame = Frame::new(1, FrameKind::Data, vec![0; MAX_FRAME_LEN - 5]);
        assert!(frame.encode().is_ok());
    }
}
