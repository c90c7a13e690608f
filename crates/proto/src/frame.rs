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

/// Bytes before a frame's payload: length, stream, kind.
pub const HEADER_LEN: usize = 4 + 4 + 1;

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
        let header = self.header()?;
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.payload);
        Ok(out)
    }

    /// The bytes that go before the payload on the wire; an error for a payload over the
    /// bound. A writer that can send the header and the payload in one vectored write needs
    /// no encoded copy of the payload.
    pub fn header(&self) -> Result<[u8; HEADER_LEN], FrameError> {
        let body_len = 4 + 1 + self.payload.len();
        if body_len > MAX_FRAME_LEN {
            return Err(FrameError::BadLength(
                u32::try_from(body_len).unwrap_or(u32::MAX),
            ));
        }
        let len = u32::try_from(body_len).map_err(|_| FrameError::BadLength(u32::MAX))?;
        let mut header = [0; HEADER_LEN];
        header[..4].copy_from_slice(&len.to_be_bytes());
        header[4..8].copy_from_slice(&self.stream.to_be_bytes());
        header[8] = self.kind as u8;
        Ok(header)
    }
}

/// Incremental decoder: feed it bytes as they arrive, take frames out.
///
/// A frame whose payload is at least [`DIRECT_PAYLOAD`] long and not yet all in gets its
/// payload allocated once, at the size its length announced (at most [`MAX_FRAME_LEN`]), and
/// its remaining bytes go straight there: pushed, or read into it by the reader
/// ([`FrameDecoder::room`]). So a tunnel's 256 KiB frames are not copied through the buffer
/// and out again, and the buffer never moves more than a small frame's bytes.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    /// Received bytes; those before `start` belong to frames already returned.
    buf: Vec<u8>,
    start: usize,
    /// A large frame whose header is decoded and whose payload is still arriving.
    partial: Option<Partial>,
    failed: Option<FrameError>,
}

#[derive(Debug)]
struct Partial {
    frame: Frame,
    /// The payload's announced length.
    len: usize,
}

/// Payloads at least this long are filled in place (see [`FrameDecoder`]); shorter frames
/// wait in the buffer until they are whole.
pub const DIRECT_PAYLOAD: usize = 16 * 1024;

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes. The buffer never holds more than one small frame plus one
    /// read's worth of bytes, because [`FrameDecoder::next_frame`] rejects oversized lengths
    /// before waiting for their payload and moves a large frame's payload out of it.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if let Some(partial) = &mut self.partial {
            let take = (partial.len - partial.frame.payload.len()).min(bytes.len());
            partial.frame.payload.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.is_empty() {
            return;
        }
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The payload of a large frame still arriving, when there is one, and how many bytes it
    /// misses: a reader may append the stream's next bytes to it directly, then must call
    /// [`FrameDecoder::settle`]. Its spare capacity may exceed the bytes missing (a recycled
    /// buffer); `settle` moves bytes past the frame's end back into the buffer.
    pub fn room(&mut self) -> Option<(&mut Vec<u8>, usize)> {
        if self.failed.is_some() {
            return None;
        }
        let partial = self.partial.as_mut()?;
        let missing = partial.len.saturating_sub(partial.frame.payload.len());
        Some((&mut partial.frame.payload, missing))
    }

    /// After bytes were appended through [`FrameDecoder::room`]: bytes past the frame's end
    /// move into the buffer.
    pub fn settle(&mut self) {
        let Some(partial) = &mut self.partial else {
            return;
        };
        if partial.frame.payload.len() > partial.len {
            let excess = partial.frame.payload.split_off(partial.len);
            self.push(&excess);
        }
    }

    /// Returns the next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        if let Some(partial) = &self.partial {
            if partial.frame.payload.len() < partial.len {
                return Ok(None);
            }
            return Ok(self.partial.take().map(|partial| partial.frame));
        }
        let avail = &self.buf[self.start..];
        if avail.len() < 4 {
            self.compact();
            return Ok(None);
        }
        let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]);
        let body_len = len as usize;
        if !(HEADER_LEN - 4..=MAX_FRAME_LEN).contains(&body_len) {
            return Err(self.fail(FrameError::BadLength(len)));
        }
        if avail.len() < HEADER_LEN {
            self.compact();
            return Ok(None);
        }
        let stream = u32::from_be_bytes([avail[4], avail[5], avail[6], avail[7]]);
        let kind_byte = avail[8];
        let Some(kind) = FrameKind::from_u8(kind_byte) else {
            return Err(self.fail(FrameError::UnknownKind(kind_byte)));
        };
        let total = 4 + body_len;
        let payload_len = total - HEADER_LEN;
        if avail.len() >= total {
            let payload = avail[HEADER_LEN..total].to_vec();
            self.start += total;
            if self.start == self.buf.len() {
                self.buf.clear();
                self.start = 0;
            }
            return Ok(Some(Frame {
                stream,
                kind,
                payload,
            }));
        }
        if payload_len >= DIRECT_PAYLOAD {
            let mut payload = crate::buffers::take(payload_len);
            payload.extend_from_slice(&avail[HEADER_LEN..]);
            self.buf.clear();
            self.start = 0;
            self.partial = Some(Partial {
                frame: Frame {
                    stream,
                    kind,
                    payload,
                },
                len: payload_len,
            });
            return Ok(None);
        }
        self.compact();
        Ok(None)
    }

    /// Bytes received but not yet part of a returned frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
            + self
                .partial
                .as_ref()
                .map_or(0, |partial| HEADER_LEN + partial.frame.payload.len())
    }

    /// Moves an incomplete frame's bytes to the front, so the buffer does not grow.
    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    fn fail(&mut self, err: FrameError) -> FrameError {
        self.buf = Vec::new();
        self.start = 0;
        self.partial = None;
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

    /// Large frames (filled in place) between small ones, split at many points, pushed or
    /// appended through `room` with the allocator's spare capacity included: the same frames,
    /// and nothing left behind.
    #[test]
    fn large_frames_round_trip_pushed_or_filled_in_place() {
        let big: Vec<u8> = (0..DIRECT_PAYLOAD * 3 + 7)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect();
        let frames = vec![
            Frame::new(1, FrameKind::Data, big.clone()),
            Frame::new(2, FrameKind::Window, vec![0, 0, 1, 0]),
            Frame::new(3, FrameKind::Data, big[..DIRECT_PAYLOAD].to_vec()),
            Frame::new(3, FrameKind::Data, big[..DIRECT_PAYLOAD - 1].to_vec()),
            Frame::new(4, FrameKind::Data, big),
            Frame::new(5, FrameKind::Done, Vec::new()),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(|f| f.encode().unwrap()).collect();
        for chunk in [1, 5, 9, 100, 4096, 20_000, 65_536, wire.len()] {
            for direct in [false, true] {
                let mut dec = FrameDecoder::new();
                let mut out = Vec::new();
                let mut rest = &wire[..];
                while !rest.is_empty() {
                    let mut n = chunk.min(rest.len());
                    match dec.room() {
                        Some((payload, _)) if direct => {
                            // What read_buf does: fill the spare capacity, at most `n`.
                            n = n.min(payload.capacity() - payload.len()).max(1);
                            payload.extend_from_slice(&rest[..n]);
                            dec.settle();
                        }
                        _ => dec.push(&rest[..n]),
                    }
                    rest = &rest[n..];
                    while let Some(f) = dec.next_frame().unwrap() {
                        out.push(f);
                    }
                    assert!(dec.buffered() <= MAX_FRAME_LEN + 4 + chunk);
                }
                assert_eq!(out, frames, "chunk {chunk}, direct {direct}");
                assert_eq!(dec.buffered(), 0);
            }
        }
    }

    /// A large frame's header alone still counts as buffered: the stream is mid-frame.
    #[test]
    fn a_large_frames_header_alone_is_mid_frame() {
        let wire = Frame::new(1, FrameKind::Data, vec![9; DIRECT_PAYLOAD])
            .encode()
            .unwrap();
        let mut dec = FrameDecoder::new();
        dec.push(&wire[..HEADER_LEN]);
        assert_eq!(dec.next_frame(), Ok(None));
        assert!(dec.room().is_some());
        assert_eq!(dec.buffered(), HEADER_LEN);
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
