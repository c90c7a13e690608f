//! Async adapters that move frames over any tokio byte stream (a socketpair in the jail, a
//! virtio-serial port in a VM).

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
            buf: vec![0; 256 * 1024].into_boxed_slice(),
        }
    }

    /// The next frame, or `Ok(None)` on a clean end of stream between frames.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, ProtoError> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return Ok(Some(frame));
            }
            let n = self.inner.read(&mut self.buf).await?;
            if n == 0 {
                if self.decoder.buffered() == 0 {
                    return Ok(None);
                }
                return Err(ProtoError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "peer closed the channel in the middle of a frame",
                )));
            }
            self.decoder.push(&self.buf[..n]);
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

    pub async fn write_frame(&mut self, frame: &Frame) -> Result<(), ProtoError> {
        let bytes = frame.encode()?;
        self.inner.write_all(&bytes).await?;
        self.inner.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FrameKind;

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
