//! Byte tunnels over the agent channel: one TCP connection a guest process made to the egress
//! listener, carried to the host's proxy as one stream.
//!
//! Many tunnels share the channel with commands and pings, so one connection whose reader
//! stalls must never stall the channel. Each direction therefore has a window of credit, as
//! SSH channels do: a side sends data frames only while it holds credit for their cost, and
//! the receiving side returns credit in `Window` frames once it has written the bytes out.
//! The receiving router then never waits: at most a window's worth of frames is queued per
//! tunnel, and a peer that sends beyond its window breaks only its own tunnel.
//!
//! Both ends run the same [`pump`]: the agent between a guest socket and the channel, the
//! supervisor between the channel and the proxy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

use crate::message::{channel, to_payload, ErrorBody};
use crate::{Frame, FrameKind};

mod stream;
pub use stream::TunnelStream;

/// Credit each direction of a tunnel starts with, in cost units (see [`cost`]).
pub const WINDOW: usize = 4 << 20;
/// What a data frame costs beyond its bytes, so that a flood of one-byte frames is bounded
/// in frames as well as in bytes.
const FRAME_COST: usize = 64;
/// Credit is returned in batches of at least this much, not one `Window` frame per data frame.
const GRANT_BATCH: usize = WINDOW / 8;
/// Most bytes one data frame of a tunnel carries. Larger than commands' chunks: a download
/// is bounded by per-frame costs (a wake-up and a write on each side), so fewer, larger
/// frames move more bytes; still well under the frame bound.
pub const TUNNEL_CHUNK: usize = 256 * 1024;
// A full data frame (header, channel byte, chunk) fits the frame bound, and a window holds
// several of them.
const _: () =
    assert!(TUNNEL_CHUNK + 1 + 9 <= crate::MAX_FRAME_LEN && cost(TUNNEL_CHUNK) <= WINDOW / 4);
// A data frame's payload (channel byte and chunk) is exactly what the recycled buffers hold.
const _: () = assert!(TUNNEL_CHUNK + 1 == crate::buffers::CAPACITY);

/// A read shorter than this is copied into a frame of its own size, keeping the large read
/// buffer; a longer one takes the buffer with it.
const SMALL_READ: usize = 64 * 1024;

/// The credit a data frame carrying `len` bytes uses.
pub const fn cost(len: usize) -> usize {
    len + FRAME_COST
}

/// Decodes a `Window` frame's payload.
pub fn parse_window(payload: &[u8]) -> Option<usize> {
    let bytes: [u8; 4] = payload.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(bytes)).ok()
}

/// A `Window` frame returning `credit` on `stream` (tunnels and flow-controlled execs alike).
pub(crate) fn window_frame(stream: u32, credit: usize) -> Frame {
    let credit = u32::try_from(credit).unwrap_or(u32::MAX);
    Frame::new(stream, FrameKind::Window, credit.to_be_bytes().to_vec())
}

/// What the router hands a tunnel's pump, in order.
#[derive(Debug)]
enum Event {
    /// Bytes from the peer: `payload[1..]` (the first byte is the channel).
    Data(Vec<u8>),
    /// The peer will send no more bytes.
    Eof,
    /// The peer ended the tunnel: `None` for a clean end, else why it failed.
    Closed(Option<String>),
}

struct Shared {
    /// Credit to send: permits are cost units.
    send_credit: Semaphore,
    /// Cost of the frames received and not yet written out.
    received: AtomicUsize,
}

/// The router's end of one tunnel: it takes the frames the peer sent on the tunnel's stream.
pub struct Inbox {
    events: mpsc::UnboundedSender<Event>,
    shared: Arc<Shared>,
}

/// The pump's end of one tunnel.
pub struct Tunnel {
    id: u32,
    events: mpsc::UnboundedReceiver<Event>,
    shared: Arc<Shared>,
}

/// A new tunnel on stream `id`: the router keeps the [`Inbox`], the [`pump`] takes the
/// [`Tunnel`].
pub fn open(id: u32) -> (Inbox, Tunnel) {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        send_credit: Semaphore::new(WINDOW),
        received: AtomicUsize::new(0),
    });
    (
        Inbox {
            events: tx,
            shared: Arc::clone(&shared),
        },
        Tunnel {
            id,
            events: rx,
            shared,
        },
    )
}

/// The peer broke the tunnel's rules; the router ends the tunnel with this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

/// Routes `frame` to its tunnel in `inboxes` and drops the tunnel after its last frame. A
/// frame for a tunnel that is gone (its last frames crossing its end) is dropped. A peer that
/// broke the rules ends its tunnel: the violation is returned for the router to tell it.
pub fn route(
    inboxes: &mut std::collections::HashMap<u32, Inbox>,
    frame: Frame,
) -> Result<(), Violation> {
    let id = frame.stream;
    let Some(inbox) = inboxes.get(&id) else {
        return Ok(());
    };
    match inbox.deliver(frame) {
        Ok(true) => Ok(()),
        Ok(false) => {
            inboxes.remove(&id);
            Ok(())
        }
        Err(violation) => {
            inbox.close(&violation.0);
            inboxes.remove(&id);
            Err(violation)
        }
    }
}

impl Inbox {
    /// Routes one frame of the tunnel's stream. Never waits. Returns whether the tunnel is
    /// still open for more frames (false after its last frame).
    pub fn deliver(&self, frame: Frame) -> Result<bool, Violation> {
        let event = match frame.kind {
            FrameKind::Data => {
                if frame.payload.first() != Some(&channel::TUNNEL) {
                    return Err(Violation(
                        "tunnel data on a channel other than TUNNEL".into(),
                    ));
                }
                let used = cost(frame.payload.len() - 1);
                let before = self.shared.received.fetch_add(used, Ordering::AcqRel);
                if before + used > WINDOW {
                    return Err(Violation(format!(
                        "the peer sent {} bytes of tunnel data beyond its window of {WINDOW}",
                        before + used - WINDOW
                    )));
                }
                Event::Data(frame.payload)
            }
            FrameKind::Eof => Event::Eof,
            FrameKind::Window => {
                let credit = parse_window(&frame.payload)
                    .ok_or_else(|| Violation("a Window frame needs a 4-byte payload".into()))?;
                if self.shared.send_credit.available_permits() + credit > WINDOW {
                    return Err(Violation(
                        "the peer returned more tunnel credit than was used".into(),
                    ));
                }
                self.shared.send_credit.add_permits(credit);
                return Ok(true);
            }
            FrameKind::Done => Event::Closed(None),
            FrameKind::Error => Event::Closed(Some(
                crate::from_payload::<ErrorBody>("error", &frame.payload)
                    .map(|body| body.message)
                    .unwrap_or_else(|err| err.to_string()),
            )),
            FrameKind::Cancel => Event::Closed(Some("the peer cancelled the tunnel".into())),
            FrameKind::Open | FrameKind::Hello => {
                return Err(Violation(format!(
                    "a {:?} frame on an open tunnel",
                    frame.kind
                )))
            }
        };
        let last = matches!(event, Event::Closed(_));
        // A pump that is gone has closed its socket; the frame has nowhere to go.
        let _ = self.events.send(event);
        Ok(!last)
    }

    /// Ends the tunnel from the router's side (the channel closed, or the peer broke a rule).
    pub fn close(&self, why: &str) {
        // Wake a sender waiting for credit, so it sees the end instead of waiting forever.
        self.shared.send_credit.close();
        let _ = self.events.send(Event::Closed(Some(why.to_owned())));
    }
}

/// Bytes moved by a finished tunnel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// From the local socket to the peer.
    pub sent: u64,
    /// From the peer to the local socket.
    pub received: u64,
}

/// Moves bytes between `local` and the tunnel until both directions have ended or either side
/// failed. Frames go out through `outgoing`; a failure is reported to the peer with `Error`.
pub async fn pump<S>(
    tunnel: Tunnel,
    local: S,
    outgoing: mpsc::Sender<Frame>,
) -> Result<Totals, String>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let Tunnel {
        id,
        mut events,
        shared,
    } = tunnel;
    let (mut reader, mut writer) = tokio::io::split(local);
    let upstream = {
        let outgoing = outgoing.clone();
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut sent = 0u64;
            let fresh = || {
                let mut buf = crate::buffers::take(TUNNEL_CHUNK + 1);
                buf.push(channel::TUNNEL);
                buf
            };
            let mut buf = fresh();
            loop {
                // Reads into the buffer's spare room: nothing is zeroed first. A full read
                // leaves as the frame and the next read gets a fresh buffer; a short one is
                // copied out, so the large buffer serves the next read.
                buf.truncate(1);
                // The buffer's capacity is one chunk past the channel byte, so a read takes
                // at most a chunk.
                let n = match reader.read_buf(&mut buf).await {
                    Ok(n) => n,
                    Err(err) => return Err(format!("reading the connection: {err}")),
                };
                if n == 0 {
                    let eof = Frame::new(id, FrameKind::Eof, vec![channel::TUNNEL]);
                    outgoing
                        .send(eof)
                        .await
                        .map_err(|_| "the agent channel closed".to_owned())?;
                    return Ok(sent);
                }
                let credit = u32::try_from(cost(n)).expect("a chunk's cost fits in u32");
                match shared.send_credit.acquire_many(credit).await {
                    Ok(permit) => permit.forget(),
                    Err(_) => return Err("the tunnel was closed".to_owned()),
                }
                let payload = if n >= SMALL_READ {
                    std::mem::replace(&mut buf, fresh())
                } else {
                    buf[..=n].to_vec()
                };
                outgoing
                    .send(Frame::new(id, FrameKind::Data, payload))
                    .await
                    .map_err(|_| "the agent channel closed".to_owned())?;
                sent += n as u64;
            }
        })
    };
    // Dropping the pump (its caller aborted) ends the sender too, so the socket closes.
    let upstream_abort = AbortOnDrop(upstream.abort_handle());
    let outcome = async {
        let mut upstream = upstream;
        let mut sent = None;
        let mut received = 0u64;
        let mut peer_done = false;
        let mut unreturned = 0usize;
        while sent.is_none() || !peer_done {
            tokio::select! {
                finished = &mut upstream, if sent.is_none() => match finished {
                    Ok(Ok(n)) => sent = Some(n),
                    Ok(Err(err)) => return Err(err),
                    Err(err) => return Err(format!("the tunnel's sender failed: {err}")),
                },
                event = events.recv(), if !peer_done => match event {
                    Some(Event::Data(payload)) => {
                        let bytes = &payload[1..];
                        writer
                            .write_all(bytes)
                            .await
                            .map_err(|err| format!("writing the connection: {err}"))?;
                        received += bytes.len() as u64;
                        let used = cost(bytes.len());
                        crate::buffers::give(payload);
                        shared.received.fetch_sub(used, Ordering::AcqRel);
                        unreturned += used;
                        if unreturned >= GRANT_BATCH {
                            let frame = window_frame(id, unreturned);
                            unreturned = 0;
                            if outgoing.send(frame).await.is_err() {
                                return Err("the agent channel closed".to_owned());
                            }
                        }
                    }
                    Some(Event::Eof) => {
                        peer_done = true;
                        let _ = writer.shutdown().await;
                    }
                    Some(Event::Closed(None)) => {
                        // A peer ends the stream only once both directions are done there.
                        peer_done = true;
                        let _ = writer.shutdown().await;
                    }
                    Some(Event::Closed(Some(why))) => return Err(why),
                    None => return Err("the agent channel closed".to_owned()),
                },
            }
        }
        Ok(Totals {
            sent: sent.unwrap_or(0),
            received,
        })
    }
    .await;
    drop(upstream_abort);
    shared.send_credit.close();
    match &outcome {
        // Each side ends the stream once both directions are done, so both routers can drop
        // the tunnel when the other's `Done` arrives.
        Ok(_) => {
            let _ = outgoing
                .send(Frame::new(id, FrameKind::Done, b"null".to_vec()))
                .await;
        }
        Err(message) => {
            let body = to_payload(&ErrorBody {
                message: message.clone(),
            });
            let _ = outgoing.send(Frame::new(id, FrameKind::Error, body)).await;
        }
    }
    outcome
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    /// Routes frames from one side's outgoing queue into the other side's inbox, as the two
    /// routers on either end of the channel do.
    pub(super) fn wire(mut from: mpsc::Receiver<Frame>, to: Inbox) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while let Some(frame) = from.recv().await {
                match to.deliver(frame) {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(Violation(why)) => {
                        to.close(&why);
                        return;
                    }
                }
            }
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_cross_both_ways_beyond_the_window_and_half_close() {
        let (guest_inbox, guest_tunnel) = open(7);
        let (host_inbox, host_tunnel) = open(7);
        let (guest_out, guest_rx) = mpsc::channel(16);
        let (host_out, host_rx) = mpsc::channel(16);
        wire(guest_rx, host_inbox);
        wire(host_rx, guest_inbox);
        let (guest_app, guest_local) = duplex(64 * 1024);
        let (host_app, host_local) = duplex(64 * 1024);
        let guest = tokio::spawn(pump(guest_tunnel, guest_local, guest_out));
        let host = tokio::spawn(pump(host_tunnel, host_local, host_out));

        // Three windows' worth each way, so credit must come back for the transfer to end.
        let size = 3 * WINDOW + 12345;
        let data: Vec<u8> = (0..size).map(|i| u8::try_from(i % 251).unwrap()).collect();
        let (mut guest_read, mut guest_write) = tokio::io::split(guest_app);
        let (mut host_read, mut host_write) = tokio::io::split(host_app);
        let up = data.clone();
        let writer_g = tokio::spawn(async move {
            guest_write.write_all(&up).await.unwrap();
            guest_write.shutdown().await.unwrap();
        });
        let down = data.clone();
        let writer_h = tokio::spawn(async move {
            host_write.write_all(&down).await.unwrap();
            host_write.shutdown().await.unwrap();
        });
        let mut at_host = Vec::new();
        host_read.read_to_end(&mut at_host).await.unwrap();
        let mut at_guest = Vec::new();
        guest_read.read_to_end(&mut at_guest).await.unwrap();
        writer_g.await.unwrap();
        writer_h.await.unwrap();
        assert!(at_host == data, "guest → host bytes differ");
        assert!(at_guest == data, "host → guest bytes differ");
        let totals = host.await.unwrap().unwrap();
        assert_eq!(totals.sent, size as u64);
        assert_eq!(totals.received, size as u64);
        assert_eq!(guest.await.unwrap().unwrap().sent, size as u64);
    }

    #[test]
    fn a_peer_beyond_its_window_is_a_violation() {
        let (inbox, _tunnel) = open(1);
        let chunk = vec![channel::TUNNEL; TUNNEL_CHUNK + 1];
        let mut sent = 0;
        loop {
            match inbox.deliver(Frame::new(1, FrameKind::Data, chunk.clone())) {
                Ok(true) => sent += cost(TUNNEL_CHUNK),
                Ok(false) => panic!("data never ends a tunnel"),
                Err(Violation(why)) => {
                    assert!(why.contains("beyond its window"), "{why}");
                    break;
                }
            }
        }
        assert!(sent <= WINDOW && sent + cost(TUNNEL_CHUNK) > WINDOW);
    }

    #[test]
    fn credit_returned_beyond_what_was_used_is_a_violation() {
        let (inbox, _tunnel) = open(1);
        let frame = window_frame(1, 1);
        assert!(inbox.deliver(frame).is_err());
        assert!(inbox
            .deliver(Frame::new(1, FrameKind::Window, vec![1, 2]))
            .is_err());
    }

    #[test]
    fn data_on_another_channel_is_a_violation() {
        let (inbox, _tunnel) = open(1);
        let frame = Frame::new(1, FrameKind::Data, vec![channel::STDOUT, b'x']);
        assert!(inbox.deliver(frame).is_err());
    }

    #[tokio::test]
    async fn a_peer_error_fails_the_pump_and_closes_the_socket() {
        let (inbox, tunnel) = open(3);
        let (out, _rx) = mpsc::channel(16);
        let (mut app, local) = duplex(1024);
        let pumping = tokio::spawn(pump(tunnel, local, out));
        let body = to_payload(&ErrorBody {
            message: "refused: not on the allowlist".into(),
        });
        inbox
            .deliver(Frame::new(3, FrameKind::Error, body))
            .unwrap();
        let err = pumping.await.unwrap().unwrap_err();
        assert!(err.contains("allowlist"), "{err}");
        let mut rest = Vec::new();
        app.read_to_end(&mut rest).await.unwrap();
    }
}
