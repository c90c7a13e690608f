//! The body of the decoder fuzz target, shared with a deterministic unit test so every
//! `cargo test` exercises it on pseudo-random input too.

use crate::{
    from_payload, ErrorBody, FrameDecoder, FrameKind, GuestRequest, Hello, Request, Response,
    MAX_FRAME_LEN,
};

/// Feeds `data` to a decoder in chunks whose sizes come from the data itself (pushed, or
/// appended to a large frame's payload in place), parses every frame's payload as the
/// message its kind implies, and checks the decoder's memory bound.
pub fn decode_all(data: &[u8]) {
    let mut decoder = FrameDecoder::new();
    let mut rest = data;
    while !rest.is_empty() {
        let mut chunk = usize::from(rest[0]).max(1).min(rest.len());
        // An odd length byte appends straight into a large frame's payload, as the reader's
        // `read_buf` does (up to its spare capacity); an even one pushes.
        match decoder.room() {
            Some((payload, _)) if rest[0] % 2 == 1 => {
                chunk = chunk.min(payload.capacity() - payload.len()).max(1);
                payload.extend_from_slice(&rest[..chunk]);
                decoder.settle();
            }
            _ => decoder.push(&rest[..chunk]),
        }
        rest = &rest[chunk..];
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    assert!(frame.payload.len() <= MAX_FRAME_LEN);
                    let p = &frame.payload;
                    match frame.kind {
                        FrameKind::Open => {
                            drop(from_payload::<Request>("request", p));
                            drop(from_payload::<GuestRequest>("guest request", p));
                        }
                        FrameKind::Window => drop(crate::tunnel::parse_window(p)),
                        FrameKind::Done => drop(from_payload::<Response>("response", p)),
                        FrameKind::Error => drop(from_payload::<ErrorBody>("error", p)),
                        FrameKind::Hello => drop(from_payload::<Hello>("hello", p)),
                        FrameKind::Data | FrameKind::Eof | FrameKind::Cancel => {}
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(decoder.buffered() <= MAX_FRAME_LEN + 4 + 255);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{to_payload, Frame};

    /// xorshift: deterministic pseudo-random bytes without a dependency.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.max(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x & 0xff) as u8
            })
            .collect()
    }

    #[test]
    fn random_and_mutated_input_never_panics() {
        let valid: Vec<u8> = [
            Frame::new(1, FrameKind::Open, to_payload(&Request::Ping)),
            Frame::new(1, FrameKind::Data, vec![1, 2, 3]),
            Frame::new(1, FrameKind::Done, to_payload(&Response::Pong)),
        ]
        .iter()
        .flat_map(|f| f.encode().unwrap())
        .collect();
        for seed in 1..2000u64 {
            decode_all(&noise(seed, 512));
            let mut mutated = valid.clone();
            let flips = noise(seed, 4);
            let at = usize::from(flips[0]) % mutated.len();
            mutated[at] ^= flips[1];
            decode_all(&mutated);
        }
    }
}
