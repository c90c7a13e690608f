//! Relaying an allowed tunnel: the client's buffered first bytes, then both directions with
//! large buffers until both sides are done, counting bytes even when it ends in an error. A
//! TLS tunnel's bytes pass its [`TlsWatch`] on the way, each read before it is written on.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::watch::{TlsWatch, WatchError};

/// Bytes moved by one tunnel.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Written to the upstream.
    pub up: u64,
    /// Read from the upstream.
    pub down: u64,
}

/// How a relay ended badly.
#[derive(Debug)]
pub(crate) enum RelayError {
    /// The watch refused what the client sent next; it was not forwarded.
    Refused(WatchError),
    Io(io::Error),
}

/// Writes `first` upstream (the watch has released it already), then copies both ways until each
/// side has shut down its half, passing each direction's bytes to `watch` if there is one.
/// Returns the counts and the error that ended the relay, if one did.
pub(crate) async fn relay<C, U>(
    client: &mut C,
    upstream: U,
    first: &[u8],
    buffer_size: usize,
    watch: Option<TlsWatch>,
) -> (Counts, Option<RelayError>)
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut client = Watched {
        inner: client,
        watch: watch.clone(),
        ready: Vec::new(),
        ready_from: 0,
    };
    let mut upstream = Counting {
        inner: upstream,
        counts: Counts::default(),
        watch,
    };
    let result = async {
        if !first.is_empty() {
            upstream.write_all(first).await?;
        }
        // Half-close: when one side ends, its peer's write half is shut down and the other
        // direction keeps flowing until it ends too.
        tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut upstream,
            buffer_size,
            buffer_size,
        )
        .await
    }
    .await;
    (upstream.counts, result.err().map(relay_error))
}

/// The error that ended a relay: the watch's refusal (carried inside an I/O error through the
/// copy) or the I/O error itself.
pub(crate) fn relay_error(err: io::Error) -> RelayError {
    if !err.get_ref().is_some_and(|inner| inner.is::<WatchError>()) {
        return RelayError::Io(err);
    }
    match err.into_inner().map(|inner| inner.downcast::<WatchError>()) {
        Some(Ok(refused)) => RelayError::Refused(*refused),
        Some(Err(other)) => RelayError::Io(io::Error::other(other)),
        None => RelayError::Io(io::Error::other("a relay error without its cause")),
    }
}

/// The client's side: what it sends passes the watch, which may hold bytes back until the
/// handshake message they belong to is judged; the relay gets only what the watch released.
struct Watched<'a, C: ?Sized> {
    inner: &'a mut C,
    watch: Option<TlsWatch>,
    /// Released bytes not yet handed to the relay (a release can exceed its read buffer).
    ready: Vec<u8>,
    ready_from: usize,
}

impl<C: AsyncRead + Unpin + ?Sized> AsyncRead for Watched<'_, C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.ready_from < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.ready_from);
                buf.put_slice(&this.ready[this.ready_from..this.ready_from + n]);
                this.ready_from += n;
                if this.ready_from == this.ready.len() {
                    this.ready.clear();
                    this.ready_from = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let Some(watch) = &this.watch else {
                return Pin::new(&mut *this.inner).poll_read(cx, buf);
            };
            let before = buf.filled().len();
            ready!(Pin::new(&mut *this.inner).poll_read(cx, buf))?;
            if buf.filled().len() == before {
                // End of stream. Held bytes are an unfinished message: never forwarded.
                return Poll::Ready(Ok(()));
            }
            let read = buf.filled()[before..].to_vec();
            buf.set_filled(before);
            this.ready = watch
                .client_bytes(&read)
                .map_err(|refused| io::Error::new(io::ErrorKind::PermissionDenied, refused))?;
            if watch.finished() {
                this.watch = None;
            }
            // Nothing released (all held): read on rather than report an empty read, which
            // the relay would take for the end of the stream.
        }
    }
}

impl<C: AsyncWrite + Unpin + ?Sized> AsyncWrite for Watched<'_, C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// Counts the bytes through the upstream, and shows what the server sends to the watch
/// before the client gets it.
struct Counting<S> {
    inner: S,
    counts: Counts,
    watch: Option<TlsWatch>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counting<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll {
            let read = &buf.filled()[before..];
            self.counts.down += read.len() as u64;
            if let Some(watch) = &self.watch {
                watch.server_bytes(read);
                if watch.finished() {
                    self.watch = None;
                }
            }
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counting<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            self.counts.up += n as u64;
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn relays_both_ways_with_half_close_and_counts() {
        let (mut client, mut client_side) = tokio::io::duplex(1024);
        let (upstream_side, mut server) = tokio::io::duplex(1024);
        let proxy = tokio::spawn(async move {
            relay(&mut client_side, upstream_side, b"first-", 4096, None).await
        });
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"first-request", "the client's EOF reaches the server");
        // The other direction still flows after the client's half-close.
        let writer = tokio::spawn(async move {
            server.write_all(&vec![7u8; 100_000]).await.unwrap();
            server.shutdown().await.unwrap();
        });
        let mut down = Vec::new();
        client.read_to_end(&mut down).await.unwrap();
        assert_eq!(down.len(), 100_000);
        writer.await.unwrap();
        let (counts, err) = proxy.await.unwrap();
        assert!(err.is_none(), "{err:?}");
        assert_eq!(
            counts,
            Counts {
                up: 13,
                down: 100_000
            }
        );
    }
}
