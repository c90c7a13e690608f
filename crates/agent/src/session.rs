//! The agent's side of a live fork (the vm backend saving a running guest for another QEMU to
//! resume): holding the channel still while the host saves the guest, and, in the resumed
//! copy, leaving the saved host's session for a new one with the host that resumed it.
//!
//! The host asks for [`dynocap_proto::Request::Pause`] and sends nothing after it; the agent
//! answers it and then holds its own frames ([`Gate`]), so at the save nothing is in flight
//! either way and the saved guest's agent sits between two frames of each direction. The
//! saved guest's own host then speaks again (any frame ends the hold; it sends `Resume` too)
//! and the session goes on. The resumed copy's host sends `Rejoin`: the agent starts a new
//! session on the same port (a new outbox whose first frame is a new `Hello`, a new table of
//! streams) and the old session's commands run on detached: their frames go to the old
//! outbox, which is drained and dropped, and their output windows are opened wide so nothing
//! waits on credit from a host that is gone.

use std::sync::{Arc, Mutex, PoisonError};

use dynocap_proto::{Frame, FrameKind, FrameWriter};
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, Notify};

/// Output credit given to each of the old session's flow-controlled commands on a rejoin, so
/// that none blocks on its pipe for want of a grant (what it writes is dropped).
pub const DETACHED_CREDIT: usize = 1 << 40;

/// Whether the writer holds, and the queue it switches to on a rejoin.
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Notify,
}

#[derive(Default)]
struct GateState {
    /// The stream of a `Pause`: once its `Done` is written, the writer holds.
    hold_after: Option<u32>,
    held: bool,
    /// A new session's queue, for the writer to take.
    switch: Option<mpsc::Receiver<Frame>>,
}

impl Gate {
    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds the writer once the `Done` of stream `id` has gone out.
    pub fn hold_after(&self, id: u32) {
        self.state().hold_after = Some(id);
    }

    /// Lets the writer go on (`Resume`), or go on with the new session's queue `switch`
    /// (`Rejoin`).
    pub fn release(&self, switch: Option<mpsc::Receiver<Frame>>) {
        {
            let mut state = self.state();
            state.held = false;
            state.hold_after = None;
            if switch.is_some() {
                state.switch = switch;
            }
        }
        self.changed.notify_one();
    }

    /// Ends a hold: the saved guest's own host spoke again after the save. Its `Resume` may
    /// come after other frames it queued meanwhile, whose answers must not wait for it.
    pub fn release_if_held(&self) {
        let held = std::mem::take(&mut self.state().held);
        if held {
            self.changed.notify_one();
        }
    }

    /// Whether writing `frame` puts the writer on hold.
    fn holds_on(&self, frame: &Frame) -> bool {
        let mut state = self.state();
        if frame.kind == FrameKind::Done && state.hold_after == Some(frame.stream) {
            state.hold_after = None;
            state.held = true;
            return true;
        }
        false
    }
}

/// The only writer of the channel: frames from the session's queue, in order, except while
/// the gate holds. On a write error the host is gone: the receiver is dropped so that every
/// later send is a no-op.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    mut writer: FrameWriter<W>,
    mut rx: mpsc::Receiver<Frame>,
    gate: Arc<Gate>,
) {
    loop {
        let (switch, held) = {
            let mut state = gate.state();
            (state.switch.take(), state.held)
        };
        if let Some(new) = switch {
            // The old session's frames, queued and still to come, are nobody's now.
            let mut old = std::mem::replace(&mut rx, new);
            tokio::spawn(async move { while old.recv().await.is_some() {} });
        }
        if held {
            gate.changed.notified().await;
            continue;
        }
        let frame = tokio::select! {
            () = gate.changed.notified() => continue,
            frame = rx.recv() => frame,
        };
        let Some(frame) = frame else { return };
        let hold = gate.holds_on(&frame);
        if let Err(err) = writer.write_owned(frame).await {
            log!("writing to the host failed: {err}; further frames are dropped");
            return;
        }
        if hold {
            log!("holding the channel for the host's save of the guest");
        }
    }
}

/// Takes `hostname` and the host's wall clock `unix_ms`, as the resumed copy of a guest (its
/// host's name for it; its clock stood still from the save to the resume).
pub fn take_identity(hostname: &str, unix_ms: u64) {
    if let Err(err) = nix::unistd::sethostname(hostname) {
        log!("cannot take the hostname {hostname:?}: {err}");
    }
    set_clock(unix_ms);
}

/// Sets the guest's wall clock to the host's `unix_ms`: a guest paused for a save (the saved
/// one and its resumed copy alike) lost the time it stood still.
pub fn set_clock(unix_ms: u64) {
    let now = nix::sys::time::TimeSpec::from(std::time::Duration::from_millis(unix_ms));
    if let Err(err) = nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, now) {
        log!("cannot set the clock to the host's: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynocap_proto::FrameReader;

    /// After a pause's `Done` nothing goes out until the release; a rejoin's queue replaces the
    /// old one, whose frames (queued before and sent after) never reach the host.
    #[tokio::test]
    async fn a_pause_holds_frames_and_a_rejoin_switches_queues() {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let gate = Arc::new(Gate::default());
        let (old_tx, old_rx) = mpsc::channel(16);
        let writer = tokio::spawn(write_frames(
            FrameWriter::new(ours),
            old_rx,
            Arc::clone(&gate),
        ));
        let mut reader = FrameReader::new(theirs);
        gate.hold_after(7);
        old_tx
            .send(Frame::new(7, FrameKind::Done, b"null".to_vec()))
            .await
            .expect("send");
        old_tx
            .send(Frame::new(9, FrameKind::Data, vec![1, 2]))
            .await
            .expect("send");
        let done = reader.read_frame().await.expect("read").expect("frame");
        assert_eq!((done.stream, done.kind), (7, FrameKind::Done));
        let held =
            tokio::time::timeout(std::time::Duration::from_millis(200), reader.read_frame()).await;
        assert!(held.is_err(), "a frame went out while held: {held:?}");
        let (new_tx, new_rx) = mpsc::channel(16);
        new_tx
            .send(Frame::new(0, FrameKind::Hello, b"{}".to_vec()))
            .await
            .expect("send");
        gate.release(Some(new_rx));
        let hello = reader.read_frame().await.expect("read").expect("frame");
        assert_eq!((hello.stream, hello.kind), (0, FrameKind::Hello));
        // The old session's frames go nowhere, and never block their sender.
        for _ in 0..64 {
            old_tx
                .send(Frame::new(9, FrameKind::Data, vec![3]))
                .await
                .expect("drained");
        }
        new_tx
            .send(Frame::new(1, FrameKind::Done, b"null".to_vec()))
            .await
            .expect("send");
        let next = reader.read_frame().await.expect("read").expect("frame");
        assert_eq!((next.stream, next.kind), (1, FrameKind::Done));
        drop((old_tx, new_tx));
        writer.await.expect("writer");
    }

    #[tokio::test]
    async fn a_resume_lets_held_frames_go() {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let gate = Arc::new(Gate::default());
        let (tx, rx) = mpsc::channel(16);
        let _writer = tokio::spawn(write_frames(FrameWriter::new(ours), rx, Arc::clone(&gate)));
        let mut reader = FrameReader::new(theirs);
        gate.hold_after(3);
        tx.send(Frame::new(3, FrameKind::Done, b"null".to_vec()))
            .await
            .expect("send");
        tx.send(Frame::new(5, FrameKind::Data, vec![1]))
            .await
            .expect("send");
        assert_eq!(
            reader
                .read_frame()
                .await
                .expect("read")
                .expect("frame")
                .stream,
            3
        );
        gate.release(None);
        assert_eq!(
            reader
                .read_frame()
                .await
                .expect("read")
                .expect("frame")
                .stream,
            5
        );
    }
}
