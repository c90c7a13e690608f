//! Async adapters that move frames over any tokio byte stream (a socketpair in the jail, a
//! virtio-serial port in a VM).

use std::io::IoSlice;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::ProtoError;
use crate::{Frame, FrameDecoder};

/// Reads frames from a byte stream.
pub struct FrameReader<R> {
    inner: R,
    decoder: FrameDecoder,
    buf: Box<[u8]>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            decoder: FrameDecoder::new(),
            // Small on purpose: a large frame's header comes in with at most this much of
            // its payload, copied through here; the rest is read straight into the payload.
            // A reader that read a quarter MiB at once, behind a writer that got ahead,
            // copied nearly every byte of a download through the decoder (twice).
            buf: vec![0; crate::frame::DIRECT_PAYLOAD].into_boxed_slice(),
        }
    }

    /// The next frame, or `Ok(None)` on a clean end of stream between frames.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, ProtoError> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return Ok(Some(frame));
            }
            // A large frame's payload is read into its own allocation, not through the buffer.
            let n = match self.decoder.room() {
                Some((payload, missing)) => {
                    let missing = u64::try_from(missing).unwrap_or(u64::MAX);
                    let n = (&mut self.inner).take(missing).read_buf(payload).await?;
                    self.decoder.settle();
                    n
                }
                None => {
                    let n = self.inner.read(&mut self.buf).await?;
                    self.decoder.push(&self.buf[..n]);
                    n
                }
            };
            if n == 0 {
                if self.decoder.buffered() == 0 {
                    return Ok(None);
                }
                return Err(ProtoError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "peer closed the channel in the middle of a frame",
                )));
            }
        }
    }
}

/// Writes frames to a byte stream.
pub struct FrameWriter<W> {
    inner: W,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(inner: W) -> Self {
        Self { inner }
    }

    /// Writes `frame` and gives its payload back for reuse ([`crate::buffers`]).
    pub async fn write_owned(&mut self, frame: Frame) -> Result<(), ProtoError> {
        let written = self.write_frame(&frame).await;
        crate::buffers::give(frame.payload);
        written
    }

    /// Writes `frame`: where the stream takes vectored writes (a socket), its header and
    /// payload go in one `writev` without copying the payload; elsewhere encoded, in one write.
    pub async fn write_frame(&mut self, frame: &Frame) -> Result<(), ProtoError> {
        if !self.inner.is_write_vectored() {
            let bytes = frame.encode()?;
            self.inner.write_all(&bytes).await?;
            self.inner.flush().await?;
            return Ok(());
        }
        let header = frame.header()?;
        let (mut header, mut payload) = (&header[..], &frame.payload[..]);
        while !header.is_empty() || !payload.is_empty() {
            let n = self
                .inner
                .write_vectored(&[IoSlice::new(header), IoSlice::new(payload)])
                .await?;
            if n == 0 {
                return Err(ProtoError::Io(std::io::ErrorKind::WriteZero.into()));
            }
            let from_header = n.min(header.len());
            header = &header[from_header..];
            payload = &payload[n - from_header..];
        }
        self.inner.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FrameKind;

    /// Large and small frames over a socket (vectored writes, reads shorter than a frame)
    /// and over a pipe that takes no vectored writes: the same frames come out.
    #[tokio::test]
    async fn large_and_small_frames_cross_a_socket_and_a_pipe() {
        let big: Vec<u8> = (0..300_000usize)
            .map(|i| u8::try_from(i % 253).unwrap())
            .collect();
        let frames = vec![
            Frame::new(1, FrameKind::Data, big.clone()),
            Frame::new(2, FrameKind::Window, vec![0, 0, 1, 0]),
            Frame::new(1, FrameKind::Data, big[..20_000].to_vec()),
            Frame::new(1, FrameKind::Eof, vec![4]),
            Frame::new(1, FrameKind::Data, big),
        ];
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (c, d) = tokio::io::duplex(1000);
        for (write, read) in [
            (
                Box::new(a) as Box<dyn AsyncWrite + Unpin + Send>,
                Box::new(b) as Box<dyn AsyncRead + Unpin + Send>,
            ),
            (Box::new(c), Box::new(d)),
        ] {
            let mut writer = FrameWriter::new(write);
            let mut reader = FrameReader::new(read);
            let sent = frames.clone();
            let task = tokio::spawn(async move {
                for frame in &sent {
                    writer.write_frame(frame).await.unwrap();
                }
            });
            for expect in &frames {
                assert_eq!(reader.read_frame().await.unwrap().as_ref(), Some(expect));
            }
            task.await.unwrap();
            assert_eq!(reader.read_frame().await.unwrap(), None);
        }
    }

    #[tokio::test]
    async fn frames_cross_a_duplex_pipe() {
        let (a, b) = tokio::io::duplex(16);
        let mut writer = FrameWriter::new(a);
        let mut reader = FrameReader::new(b);
        let sent = Frame::new(3, FrameKind::Data, vec![7; 1000]);
        let expect = sent.clone();
        let task = tokio::spawn(async move {
            writer.write_frame(&sent).await.unwrap();
            drop(writer);
        });
        assert_eq!(reader.read_frame().await.unwrap(), Some(expect));
        assert_eq!(reader.read_frame().await.unwrap(), None);
        task.await.unwrap();
    }
}
