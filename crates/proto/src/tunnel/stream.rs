//! A tunnel as a byte stream of its own ([`TunnelStream`]), for a side that serves the
//! tunnel's bytes in-process (the supervisor's egress proxy) rather than copying them to a
//! socket. [`pump`](super::pump) between the tunnel and an in-memory pipe would do the same,
//! at the cost of every byte copied into the pipe and out again and of a task between them;
//! here a read takes the peer's data frames as they come and a write makes the frame itself.
//! Credit, its batched return and the tunnel's end follow the pump's rules exactly.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc::{self, error::TrySendError, OwnedPermit};

use super::{cost, window_frame, Event, Shared, Tunnel, GRANT_BATCH, TUNNEL_CHUNK};
use crate::message::{channel, to_payload, ErrorBody};
use crate::{Frame, FrameKind};

type Reserving = Pin<Box<dyn Future<Output = Result<OwnedPermit<Frame>, ()>> + Send>>;
type Acquiring = Pin<Box<dyn Future<Output = Result<(), ()>> + Send>>;

/// One direction's way onto the outgoing queue: a free place is taken at once when there is
/// one, else waited for (the queue is bounded, so a slow channel holds the writer back).
struct Queue {
    outgoing: mpsc::Sender<Frame>,
    reserving: Option<Reserving>,
}

impl Queue {
    /// Sends `frame` once the queue has room; `make` builds it only then.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        make: impl FnOnce() -> Frame,
    ) -> Poll<io::Result<()>> {
        if self.reserving.is_none() {
            match self.outgoing.try_reserve() {
                Ok(permit) => {
                    permit.send(make());
                    return Poll::Ready(Ok(()));
                }
                Err(TrySendError::Closed(())) => return Poll::Ready(Err(channel_closed())),
                Err(TrySendError::Full(())) => {
                    let outgoing = self.outgoing.clone();
                    self.reserving = Some(Box::pin(async move {
                        outgoing.reserve_owned().await.map_err(|_| ())
                    }));
                }
            }
        }
        let reserving = self.reserving.as_mut().expect("set above");
        let permit = ready!(reserving.as_mut().poll(cx));
        self.reserving = None;
        match permit {
            Ok(permit) => {
                permit.send(make());
                Poll::Ready(Ok(()))
            }
            Err(()) => Poll::Ready(Err(channel_closed())),
        }
    }
}

fn channel_closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the agent channel closed")
}

/// A tunnel read and written in place: reads give the bytes of the peer's data frames, writes
/// go out as data frames while the peer's credit lasts, and shutting down sends `Eof`. End it
/// with [`TunnelStream::finish`], which tells the peer how it ended as the pump does; one
/// dropped unfinished ends the tunnel with an error.
pub struct TunnelStream {
    id: u32,
    events: mpsc::UnboundedReceiver<Event>,
    shared: Arc<Shared>,
    /// The data frame being read and how far.
    reading: Option<(Vec<u8>, usize)>,
    /// The peer will send no more bytes.
    peer_done: bool,
    /// Why the peer ended the tunnel, once it failed it.
    failed: Option<String>,
    /// Credit of frames written out and not yet returned to the peer.
    unreturned: usize,
    /// A `Window` frame waiting for room in the queue, before the next read.
    window_due: usize,
    reads: Queue,
    writes: Queue,
    /// Credit taken for writes and not yet spent.
    credit: usize,
    acquiring: Option<(usize, Acquiring)>,
    shut_down: bool,
    finished: bool,
}

impl Tunnel {
    /// The tunnel as a stream, its frames going out through `outgoing`.
    pub fn into_stream(self, outgoing: mpsc::Sender<Frame>) -> TunnelStream {
        let Tunnel { id, events, shared } = self;
        TunnelStream {
            id,
            events,
            shared,
            reading: None,
            peer_done: false,
            failed: None,
            unreturned: 0,
            window_due: 0,
            reads: Queue {
                outgoing: outgoing.clone(),
                reserving: None,
            },
            writes: Queue {
                outgoing,
                reserving: None,
            },
            credit: 0,
            acquiring: None,
            shut_down: false,
            finished: false,
        }
    }
}

impl TunnelStream {
    /// Ends the tunnel once this side is done with it, as the pump ends a tunnel whose local
    /// socket closed: `Eof` if this side has not shut down yet, then the peer's end is waited
    /// for (its client still reads what was sent); `Done` when the peer ends cleanly, `Error`
    /// when it sends more bytes that nobody will read (or failed), which makes the peer close
    /// its socket at once.
    pub async fn finish(mut self) {
        use tokio::io::AsyncWriteExt;
        if let Some((payload, _)) = self.reading.take() {
            self.consumed(payload);
        }
        if !self.shut_down && self.failed.is_none() && self.shutdown().await.is_err() {
            self.failed = Some("the agent channel closed".to_owned());
        }
        while !self.peer_done && self.failed.is_none() {
            self.failed = match self.events.recv().await {
                Some(Event::Data(_)) => Some("the host closed the connection".to_owned()),
                Some(Event::Eof | Event::Closed(None)) => {
                    self.peer_done = true;
                    None
                }
                Some(Event::Closed(Some(why))) => Some(why),
                None => Some("the agent channel closed".to_owned()),
            };
        }
        self.finished = true;
        self.shared.send_credit.close();
        let frame = self.end_frame();
        let _ = self.writes.outgoing.send(frame).await;
    }

    fn end_frame(&self) -> Frame {
        if self.peer_done && self.shut_down && self.failed.is_none() {
            return Frame::new(self.id, FrameKind::Done, b"null".to_vec());
        }
        let message = match &self.failed {
            Some(why) => why.clone(),
            None => "the host's end of the tunnel went away".to_owned(),
        };
        Frame::new(
            self.id,
            FrameKind::Error,
            to_payload(&ErrorBody { message }),
        )
    }

    /// Returns the credit of the frame just written out, in batches as the pump does.
    fn consumed(&mut self, payload: Vec<u8>) {
        let used = cost(payload.len() - 1);
        crate::buffers::give(payload);
        self.shared.received.fetch_sub(used, Ordering::AcqRel);
        self.unreturned += used;
        if self.unreturned >= GRANT_BATCH {
            self.window_due += self.unreturned;
            self.unreturned = 0;
        }
    }

    /// Takes credit for a frame of `want` cost, waiting for the peer to return some.
    fn poll_credit(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<()>> {
        loop {
            if self.credit >= want {
                return Poll::Ready(Ok(()));
            }
            if let Some((amount, acquiring)) = &mut self.acquiring {
                let got = ready!(acquiring.as_mut().poll(cx));
                let amount = *amount;
                self.acquiring = None;
                match got {
                    Ok(()) => self.credit += amount,
                    Err(()) => return Poll::Ready(Err(tunnel_closed())),
                }
                continue;
            }
            let missing = want - self.credit;
            let units = u32::try_from(missing).expect("a chunk's cost fits in u32");
            match self.shared.send_credit.try_acquire_many(units) {
                Ok(permit) => {
                    permit.forget();
                    self.credit += missing;
                }
                Err(tokio::sync::TryAcquireError::Closed) => {
                    return Poll::Ready(Err(tunnel_closed()))
                }
                Err(tokio::sync::TryAcquireError::NoPermits) => {
                    let shared = Arc::clone(&self.shared);
                    let acquiring: Acquiring = Box::pin(async move {
                        match shared.send_credit.acquire_many(units).await {
                            Ok(permit) => {
                                permit.forget();
                                Ok(())
                            }
                            Err(_) => Err(()),
                        }
                    });
                    self.acquiring = Some((missing, acquiring));
                }
            }
        }
    }
}

fn tunnel_closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the tunnel was closed")
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.window_due > 0 {
                let (id, credit) = (this.id, this.window_due);
                ready!(this.reads.poll_send(cx, || window_frame(id, credit)))?;
                this.window_due = 0;
            }
            if let Some((payload, at)) = &mut this.reading {
                let n = buf.remaining().min(payload.len() - *at);
                buf.put_slice(&payload[*at..*at + n]);
                *at += n;
                if *at == payload.len() {
                    let (payload, _) = this.reading.take().expect("being read");
                    this.consumed(payload);
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(why) = &this.failed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    why.clone(),
                )));
            }
            if this.peer_done {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.events.poll_recv(cx)) {
                Some(Event::Data(payload)) => {
                    if payload.len() > 1 {
                        this.reading = Some((payload, 1));
                    } else {
                        this.consumed(payload);
                    }
                }
                // A peer ends the stream only once both directions are done there.
                Some(Event::Eof | Event::Closed(None)) => this.peer_done = true,
                Some(Event::Closed(Some(why))) => this.failed = Some(why),
                None => this.failed = Some("the agent channel closed".to_owned()),
            }
        }
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.shut_down {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if let Some(why) = &this.failed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                why.clone(),
            )));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(TUNNEL_CHUNK);
        ready!(this.poll_credit(cx, cost(n)))?;
        let id = this.id;
        ready!(this.writes.poll_send(cx, || {
            let mut payload = crate::buffers::take(n + 1);
            payload.push(channel::TUNNEL);
            payload.extend_from_slice(&buf[..n]);
            Frame::new(id, FrameKind::Data, payload)
        }))?;
        this.credit -= cost(n);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Every write is a frame on the queue already.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.shut_down {
            return Poll::Ready(Ok(()));
        }
        let id = this.id;
        ready!(this.writes.poll_send(cx, || Frame::new(
            id,
            FrameKind::Eof,
            vec![channel::TUNNEL]
        )))?;
        this.shut_down = true;
        Poll::Ready(Ok(()))
    }
}

impl Drop for TunnelStream {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.shared.send_credit.close();
        // Dropped unfinished (its task aborted): the peer is still told, if there is room.
        let _ = self.writes.outgoing.try_send(self.end_frame());
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::wire;
    use super::super::{open, pump, WINDOW};
    use super::*;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};

    /// A pump on one side and a stream on the other move several windows each way, with
    /// a small queue (so writes wait for room) and half-closes, and both end cleanly.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_and_a_pump_cross_several_windows_both_ways() {
        let (guest_inbox, guest_tunnel) = open(9);
        let (host_inbox, host_tunnel) = open(9);
        let (guest_out, guest_rx) = mpsc::channel(2);
        let (host_out, host_rx) = mpsc::channel(2);
        wire(guest_rx, host_inbox);
        let host_to_guest = wire(host_rx, guest_inbox);
        let (guest_app, guest_local) = duplex(64 * 1024);
        let guest = tokio::spawn(pump(guest_tunnel, guest_local, guest_out));
        let stream = host_tunnel.into_stream(host_out);

        let size = 3 * WINDOW + 777;
        let data: Vec<u8> = (0..size).map(|i| u8::try_from(i % 249).unwrap()).collect();
        let (mut guest_read, mut guest_write) = tokio::io::split(guest_app);
        let up = data.clone();
        let writer = tokio::spawn(async move {
            guest_write.write_all(&up).await.unwrap();
            guest_write.shutdown().await.unwrap();
        });
        let down = data.clone();
        let host = tokio::spawn(async move {
            let (mut read, mut write) = tokio::io::split(stream);
            let sending = tokio::spawn(async move {
                write.write_all(&down).await.unwrap();
                write.shutdown().await.unwrap();
                write
            });
            let mut got = Vec::new();
            read.read_to_end(&mut got).await.unwrap();
            let write = sending.await.unwrap();
            read.unsplit(write).finish().await;
            got
        });
        let mut at_guest = Vec::new();
        guest_read.read_to_end(&mut at_guest).await.unwrap();
        writer.await.unwrap();
        let at_host = host.await.unwrap();
        assert!(at_host == data, "guest → host bytes differ");
        assert!(at_guest == data, "host → guest bytes differ");
        let totals = guest.await.unwrap().expect("the guest's pump ends cleanly");
        assert_eq!((totals.sent, totals.received), (size as u64, size as u64));
        host_to_guest.await.unwrap();
    }

    /// A stream finished while the peer still sends bytes nobody will read ends the tunnel
    /// with an error, after what it had sent and its end.
    #[tokio::test]
    async fn finishing_while_the_peer_sends_ends_the_tunnel_with_an_error() {
        let (host_inbox, host_tunnel) = open(5);
        let (host_out, mut host_rx) = mpsc::channel(16);
        let mut stream = host_tunnel.into_stream(host_out);
        stream.write_all(b"403 refused").await.unwrap();
        let host = tokio::spawn(stream.finish());
        let data = host_rx.recv().await.unwrap();
        assert_eq!(
            (data.kind, &data.payload[1..]),
            (FrameKind::Data, &b"403 refused"[..])
        );
        assert_eq!(host_rx.recv().await.unwrap().kind, FrameKind::Eof);
        let more = Frame::new(5, FrameKind::Data, vec![channel::TUNNEL, b'x']);
        assert_eq!(host_inbox.deliver(more), Ok(true));
        let end = host_rx.recv().await.unwrap();
        assert_eq!(end.kind, FrameKind::Error);
        let body: ErrorBody = crate::from_payload("error", &end.payload).unwrap();
        assert!(
            body.message.contains("closed the connection"),
            "{}",
            body.message
        );
        host.await.unwrap();
    }

    /// A stream finished before the peer is done waits for the peer's end: a client that
    /// reads the answer and closes ends the tunnel cleanly on both sides.
    #[tokio::test]
    async fn finishing_waits_for_the_peer_to_close() {
        let (guest_inbox, guest_tunnel) = open(6);
        let (host_inbox, host_tunnel) = open(6);
        let (guest_out, guest_rx) = mpsc::channel(16);
        let (host_out, host_rx) = mpsc::channel(16);
        wire(guest_rx, host_inbox);
        wire(host_rx, guest_inbox);
        let (app, local) = duplex(1024);
        let guest = tokio::spawn(pump(guest_tunnel, local, guest_out));
        let mut stream = host_tunnel.into_stream(host_out);
        stream.write_all(b"answer").await.unwrap();
        let host = tokio::spawn(stream.finish());
        let mut answer = Vec::new();
        let (mut read, mut write) = tokio::io::split(app);
        read.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer", "the answer, then the end of the stream");
        write.shutdown().await.unwrap();
        let totals = guest.await.unwrap().expect("a clean end");
        assert_eq!(totals.received, 6);
        host.await.unwrap();
    }

    /// The peer's error reaches reads and writes.
    #[tokio::test]
    async fn a_peer_error_fails_reads_and_writes() {
        let (inbox, tunnel) = open(3);
        let (out, _rx) = mpsc::channel(16);
        let mut stream = tunnel.into_stream(out);
        let body = to_payload(&ErrorBody {
            message: "refused: not on the allowlist".into(),
        });
        inbox
            .deliver(Frame::new(3, FrameKind::Error, body))
            .unwrap();
        let err = stream.read(&mut [0; 16]).await.unwrap_err();
        assert!(err.to_string().contains("allowlist"), "{err}");
        assert!(stream.write(b"x").await.is_err());
    }
}
