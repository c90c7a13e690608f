//! The byte stream to the host as tokio halves, built on one descriptor of any pollable kind:
//! a socketpair end (jail), a virtio-serial port (VM), a pipe pair in tests.
//!
//! Read and write readiness are tracked separately by `AsyncFd`, so the frame reader and the
//! writer task can each own a half and wait independently without a lock between them.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Reading half of the channel.
pub struct ChannelReader(Arc<AsyncFd<OwnedFd>>);

/// Writing half of the channel.
pub struct ChannelWriter(Arc<AsyncFd<OwnedFd>>);

/// Makes `fd` close-on-exec (commands must never inherit the channel) and non-blocking, and
/// registers it with the runtime. Must run inside a tokio runtime.
pub fn split(fd: OwnedFd) -> io::Result<(ChannelReader, ChannelWriter)> {
    set_cloexec_nonblocking(&fd)?;
    let shared = Arc::new(AsyncFd::new(fd)?);
    Ok((ChannelReader(Arc::clone(&shared)), ChannelWriter(shared)))
}

/// Sets FD_CLOEXEC and O_NONBLOCK on a descriptor we own.
pub fn set_cloexec_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    fcntl(fd.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    let flags = OFlag::from_bits_retain(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

impl AsyncRead for ChannelReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| Ok(nix::unistd::read(fd.get_ref(), unfilled)?)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(err)) => return Poll::Ready(Err(err)),
                // Spurious readiness; try_io already cleared it.
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for ChannelWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| Ok(nix::unistd::write(fd.get_ref(), data)?)) {
                Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => {}
            }
        }
    }

    /// A frame's header and payload in one `writev`: no copy of the payload, one syscall.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| Ok(nix::sys::uio::writev(fd.get_ref(), bufs)?)) {
                Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => {}
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the descriptor; there is no user-space buffer.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_socketpair_end_carries_bytes_both_ways_and_is_cloexec() {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let (mut reader, mut writer) = split(OwnedFd::from(ours)).expect("split");
        let mut theirs = tokio::net::UnixStream::from_std({
            theirs.set_nonblocking(true).expect("nonblocking");
            theirs
        })
        .expect("register");

        // More than a socket buffer, so the writer has to wait for readiness.
        let big = vec![0x5a_u8; 4 * 1024 * 1024];
        let expected = big.clone();
        let send = tokio::spawn(async move {
            writer.write_all(&big).await.expect("write");
            writer
        });
        let mut got = vec![0_u8; expected.len()];
        theirs.read_exact(&mut got).await.expect("read");
        assert!(got == expected);
        let _writer = send.await.expect("join");

        theirs.write_all(b"hello").await.expect("write");
        drop(theirs);
        let mut text = Vec::new();
        reader.read_to_end(&mut text).await.expect("read to EOF");
        assert_eq!(text, b"hello");

        let flags = fcntl(reader.0.get_ref(), FcntlArg::F_GETFD).expect("getfd");
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
    }

    /// Frames go out in vectored writes, a frame larger than the socket's buffer included.
    #[tokio::test]
    async fn frames_go_out_whole_in_vectored_writes() {
        use dynocap_proto::{Frame, FrameKind, FrameReader, FrameWriter};
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let (_reader, writer) = split(OwnedFd::from(ours)).expect("split");
        assert!(writer.is_write_vectored());
        let theirs = tokio::net::UnixStream::from_std({
            theirs.set_nonblocking(true).expect("nonblocking");
            theirs
        })
        .expect("register");
        let frames = vec![
            Frame::new(1, FrameKind::Data, vec![0xa5; 900 * 1024]),
            Frame::new(2, FrameKind::Done, b"null".to_vec()),
        ];
        let sent = frames.clone();
        let send = tokio::spawn(async move {
            let mut writer = FrameWriter::new(writer);
            for frame in &sent {
                writer.write_frame(frame).await.expect("write");
            }
        });
        let mut reader = FrameReader::new(theirs);
        for expect in &frames {
            assert_eq!(
                reader.read_frame().await.expect("read").as_ref(),
                Some(expect)
            );
        }
        send.await.expect("join");
    }
}
