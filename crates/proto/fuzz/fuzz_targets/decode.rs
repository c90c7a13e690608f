//! Fuzzes the frame decoder and message parsers with arbitrary bytes split at arbitrary
//! points: they must never panic, and never buffer more than one frame's bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dynocap_proto::fuzzing::decode_all(data);
});
