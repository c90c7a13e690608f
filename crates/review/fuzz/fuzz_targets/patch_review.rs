//! Fuzzes the host's reading of a guest's patch: the parser, the review with its
//! sensitive-path rules, the diff view, and what verification derives from a parsed patch. No
//! panic; the parser and the review refuse the same patches; a parsed path stays inside the
//! repository and out of `.git`; every reason is one safe, bounded line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dynocap_review::fuzzing::patch_review(data);
});
