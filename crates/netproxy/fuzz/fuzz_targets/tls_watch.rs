//! Fuzzes the watch over a TLS handshake after its first ClientHello with client and server
//! bytes interleaved: no panic, and nothing forwarded upstream that the client did not send.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dynocap_netproxy::fuzzing::tls_watch(data);
});
