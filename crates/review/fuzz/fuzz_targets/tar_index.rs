//! Fuzzes the baseline tar's index reader, on raw bytes and on bytes sealed with a valid
//! checksum: no panic, and an index it accepts answers every lookup consistently.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dynocap_review::fuzzing::tar_index(data);
});
