//! Fuzzes the proxy's reading of a request head, its request line and the CONNECT host with
//! arbitrary bytes arriving in arbitrary pieces: no panic, no read past the head's bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dynocap_netproxy::fuzzing::request_head(data);
});
