//! Flow control for an exec's output, when the host asks for it
//! ([`crate::ExecRequest::output_window`]): the agent sends output `Data` frames only while it
//! holds credit, and the host returns credit in `Window` frames as its consumer takes the
//! output. One slow consumer (a streaming client that stopped reading) then makes only its own
//! command wait; without a window its frames would pile up in front of the shared channel
//! and stall every other stream of the sandbox.

use crate::Frame;

/// Credit a flow-controlled exec starts with, in cost units (see [`cost`]).
pub const WINDOW: usize = 4 << 20;
/// What an output frame costs beyond its bytes. Large on purpose: it bounds the frames in
/// flight to `WINDOW / FRAME_COST` (256) however small they are, so the host's per-stream
/// queue ([`MAX_FRAMES_IN_FLIGHT`]) never fills and never makes the channel's reader wait.
pub const FRAME_COST: usize = 16 << 10;
/// Output frames a flow-controlled exec can have in flight at once.
pub const MAX_FRAMES_IN_FLIGHT: usize = WINDOW / FRAME_COST;
/// Credit is returned in batches of at least this much, not one `Window` frame per data frame.
pub const GRANT_BATCH: usize = WINDOW / 8;

/// The credit an output frame carrying `len` bytes uses.
pub fn cost(len: usize) -> usize {
    len + FRAME_COST
}

/// A `Window` frame returning `credit` on `stream`.
pub fn grant(stream: u32, credit: usize) -> Frame {
    crate::tunnel::window_frame(stream, credit)
}

/// Decodes a `Window` frame's payload (the same 4-byte credit as a tunnel's).
pub fn parse(payload: &[u8]) -> Option<usize> {
    crate::tunnel::parse_window(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FrameKind;

    #[test]
    fn a_grant_reads_back_and_the_window_bounds_frames() {
        let frame = grant(7, GRANT_BATCH);
        assert_eq!((frame.stream, frame.kind), (7, FrameKind::Window));
        assert_eq!(parse(&frame.payload), Some(GRANT_BATCH));
        assert_eq!(MAX_FRAMES_IN_FLIGHT, 256);
        assert!(WINDOW / cost(0) <= MAX_FRAMES_IN_FLIGHT);
    }
}
