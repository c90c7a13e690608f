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
            // Into the unfilled part as it is: a large frame's payload is read into its own
            // buffer's spare capacity, which zeroing first (`initialize_unfilled`) would
            // clear on every read, again for each short read of the same frame.
            // SAFETY: nothing de-initializes bytes of it: `read` only writes into it.
            let unfilled = unsafe { buf.unfilled_mut() };
            match guard.try_io(|fd| read_uninit(fd.get_ref(), unfilled)) {
                Ok(Ok(n)) => {
                    // SAFETY: `read` wrote the first `n` bytes of the unfilled part.
                    unsafe { buf.assume_init(n) };
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

/// `read(2)` into memory that need not be initialized; the count of bytes it wrote.
fn read_uninit(fd: &OwnedFd, into: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: the pointer and length are those of a live, writable slice; read(2) only
    // writes bytes into it, which the caller counts as initialized up to the returned count.
    let n = unsafe { libc::read(fd.as_raw_fd(), into.as_mut_ptr().cast(), into.len()) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
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

    /// Frames read in pieces (the peer writes a few KiB at a time) into recycled payload
    /// buffers that still hold an earlier frame's bytes come out exactly as sent: each read
    /// counts only the bytes it wrote.
    #[tokio::test]
    async fn frames_read_in_pieces_into_recycled_buffers_come_in_whole() {
        use dynocap_proto::tunnel::TUNNEL_CHUNK;
        use dynocap_proto::{Frame, FrameKind, FrameReader};
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let (reader, _writer) = split(OwnedFd::from(ours)).expect("split");
        let theirs = tokio::net::UnixStream::from_std({
            theirs.set_nonblocking(true).expect("nonblocking");
            theirs
        })
        .expect("register");
        // Buffers of a tunnel frame's size, dirty, in the pool the reader takes from.
        for _ in 0..4 {
            let mut dirty = dynocap_proto::buffers::take(TUNNEL_CHUNK + 1);
            dirty.resize(TUNNEL_CHUNK + 1, 0xee);
            dynocap_proto::buffers::give(dirty);
        }
        let frames: Vec<Frame> = (0..6u8)
            .map(|n| {
                let len = TUNNEL_CHUNK + 1 - usize::from(n) * 1000;
                let payload = (0..len)
                    .map(|i| u8::try_from(i % 251).expect("under 251") ^ n)
                    .collect();
                Frame::new(u32::from(n), FrameKind::Data, payload)
            })
            .collect();
        let sent = frames.clone();
        let mut theirs = theirs;
        let send = tokio::spawn(async move {
            let mut bytes = Vec::new();
            for frame in &sent {
                bytes.extend(frame.encode().expect("encode"));
            }
            for piece in bytes.chunks(3000) {
                theirs.write_all(piece).await.expect("write");
                tokio::task::yield_now().await;
            }
        });
        let mut reader = FrameReader::new(reader);
        for expect in &frames {
            let got = reader.read_frame().await.expect("read").expect("a frame");
            assert!(got == *expect, "frame {} differs", expect.stream);
            dynocap_proto::buffers::give(got.payload);
        }
        send.await.expect("join");
    }
}
