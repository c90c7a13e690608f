//! The agent channel's part in a live fork (`task fork --live`, the vm backend): the running
//! guest is saved with its processes and another QEMU resumes it, agent and all, for the fork.
//!
//! At the save nothing may be in flight on the channel either way, or the resumed agent would
//! find half a frame: the host sends `Pause` and holds its own writer right after it
//! ([`WriterHold`]); the agent answers and holds its writer after that answer. Once the
//! answer is in, the channel is still, and the guest is saved. The saved guest's own host
//! then lets its writer go and sends `Resume`: its session goes on. The fork's host, whose
//! agent is the same one in the middle of that session, first sends `Rejoin` on the control
//! stream ([`rejoin`]): the agent starts a new session with it under the fork's hostname,
//! with a new `Hello`, and the parent's commands run on in the fork without a host reading
//! them (see the agent's `session`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dynocap_proto::{
    to_payload, Frame, FrameKind, FrameWriter, RejoinRequest, Request, ResumeRequest,
    CONTROL_STREAM,
};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

use crate::foundation::error::{Error, Result};
use crate::supervisor::agent_conn::{agent_error_message, agent_gone, AgentConn};

/// How long the agent may take to answer a `Pause` or a `Resume`.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// Holds the host's writer to the agent after it has written a `Pause`, until released.
#[derive(Default)]
pub struct WriterHold {
    armed: AtomicBool,
    held: AtomicBool,
    released: Notify,
}

impl WriterHold {
    /// Whether writing `frame` puts the writer on hold: the first `Pause` after [`Self::arm`].
    pub(crate) fn holds_after(&self, frame: &Frame) -> bool {
        if frame.kind != FrameKind::Open || !self.armed.load(Ordering::Acquire) {
            return false;
        }
        if frame.payload != to_payload(&Request::Pause) {
            return false;
        }
        self.armed.store(false, Ordering::Release);
        self.held.store(true, Ordering::Release);
        true
    }

    /// Waits until [`Self::release`].
    pub(crate) async fn released(&self) {
        while self.held.load(Ordering::Acquire) {
            self.released.notified().await;
        }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    fn release(&self) {
        self.armed.store(false, Ordering::Release);
        self.held.store(false, Ordering::Release);
        self.released.notify_one();
    }
}

impl AgentConn {
    /// Stills the channel for a save of the guest (see the module doc). Returns once it is
    /// still; call [`AgentConn::resume_after_save`] after the save, whatever became of it.
    pub async fn pause_for_save(&self) -> Result<()> {
        self.hold.arm();
        let paused = tokio::time::timeout(ANSWER_WITHIN, self.ask(&Request::Pause))
            .await
            .unwrap_or_else(|_| {
                Err(Error::timeout(
                    "the guest agent did not answer the pause for the save in time",
                ))
            });
        if paused.is_err() {
            self.hold.release();
        }
        paused
    }

    /// Lets the channel go on after [`AgentConn::pause_for_save`].
    pub async fn resume_after_save(&self) -> Result<()> {
        self.hold.release();
        let request = Request::Resume(ResumeRequest {
            unix_ms: host_clock_ms(),
        });
        tokio::time::timeout(ANSWER_WITHIN, self.ask(&request))
            .await
            .unwrap_or_else(|_| {
                Err(Error::timeout(
                    "the guest agent did not answer the resume after the save in time",
                ))
            })
    }

    async fn ask(&self, request: &Request) -> Result<()> {
        let mut stream = self.open(request).await?;
        match stream.next().await {
            Some(frame) if frame.kind == FrameKind::Done => Ok(()),
            Some(frame) if frame.kind == FrameKind::Error => Err(Error::internal(format!(
                "the guest agent refused: {}",
                agent_error_message(&frame.payload)
            ))),
            Some(_) => Err(Error::internal(
                "the guest agent answered with something else",
            )),
            None => Err(agent_gone()),
        }
    }
}

/// Asks the agent of a guest resumed from another's save for a new session under `hostname`,
/// its clock set to the host's: the first bytes the host writes on the channel; its answer
/// is the session's `Hello`.
pub async fn rejoin(write: &mut (impl AsyncWrite + Unpin), hostname: &str) -> Result<()> {
    let request = Request::Rejoin(RejoinRequest {
        hostname: hostname.to_owned(),
        unix_ms: host_clock_ms(),
    });
    FrameWriter::new(write)
        .write_frame(&Frame::new(
            CONTROL_STREAM,
            FrameKind::Open,
            to_payload(&request),
        ))
        .await
        .map_err(|err| {
            Error::internal(format!("asking the resumed guest's agent to rejoin: {err}"))
        })
}

/// The host's wall clock, milliseconds since the Unix epoch: what a guest that stood still
/// for a save is set to.
fn host_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_writer_holds_after_an_armed_pause_only() {
        let hold = WriterHold::default();
        let pause = Frame::new(3, FrameKind::Open, to_payload(&Request::Pause));
        let ping = Frame::new(4, FrameKind::Open, to_payload(&Request::Ping));
        assert!(!hold.holds_after(&pause), "not armed");
        hold.arm();
        assert!(!hold.holds_after(&ping));
        assert!(hold.holds_after(&pause));
        assert!(!hold.holds_after(&pause), "once per arming");
        let waiting = tokio::time::timeout(Duration::from_millis(50), hold.released()).await;
        assert!(waiting.is_err(), "released before the release");
        hold.release();
        tokio::time::timeout(Duration::from_secs(5), hold.released())
            .await
            .expect("released");
    }
}
