//! The sending side of the one task that writes frames to the host. Every request handler
//! gets a clone; the queue behind it is small on purpose, so a host that reads slowly makes
//! producers wait (and commands block on their pipes) instead of the agent buffering output.

use dynocap_proto::{to_payload, ErrorBody, Frame, FrameKind, Response};
use tokio::sync::mpsc;

/// Frames waiting for the writer.
const OUTBOX_CAPACITY: usize = 16;

/// The sending side of the writer task. Sends never fail: once the writer is gone (the host
/// stopped reading), frames are dropped, and commands still run to completion.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Frame>,
}

impl Outbox {
    /// An outbox and the receiving end its writer task drains.
    pub fn channel() -> (Self, mpsc::Receiver<Frame>) {
        let (tx, rx) = mpsc::channel(OUTBOX_CAPACITY);
        (Self { tx }, rx)
    }

    #[cfg(test)]
    pub fn for_tests(tx: mpsc::Sender<Frame>) -> Self {
        Self { tx }
    }

    pub async fn send(&self, frame: Frame) {
        let _ = self.tx.send(frame).await;
    }

    /// Room for one frame, or `None` when the writer is gone.
    pub async fn reserve(&self) -> Option<mpsc::Permit<'_, Frame>> {
        self.tx.reserve().await.ok()
    }

    /// The queue itself, for tasks that send frames of their own (tunnels).
    pub fn sender(&self) -> mpsc::Sender<Frame> {
        self.tx.clone()
    }

    /// Ends `stream` with an `Error` frame: the one place an error of the agent becomes the
    /// text the host reports. That text is the error's `Display`, which each of the agent's
    /// error types writes as the whole story, its cause's text included (`cannot open the
    /// workspace /w: ENOENT: No such file or directory`): the host sees nothing but this line,
    /// and the typed cause stays reachable through `source()` for code that looks.
    pub async fn send_error(&self, stream: u32, error: impl std::fmt::Display) {
        let message = error.to_string();
        self.send(Frame::new(
            stream,
            FrameKind::Error,
            to_payload(&ErrorBody { message }),
        ))
        .await;
    }

    /// Ends `stream` with its `Done` frame.
    pub async fn send_done(&self, stream: u32, response: &Response) {
        self.send(Frame::new(stream, FrameKind::Done, to_payload(response)))
            .await;
    }
}
