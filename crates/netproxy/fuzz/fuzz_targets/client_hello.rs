//! Fuzzes the first bytes of a TLS tunnel: the ClientHello reassembled across records and
//! reads, and its judgement against the CONNECT host. No panic, and no prefix of the bytes is
//! decided differently from the whole.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dynocap_netproxy::fuzzing::client_hello(data);
});
