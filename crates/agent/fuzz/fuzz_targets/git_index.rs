//! Fuzzes the agent's reader of the private git index, which git runs of the sandbox user
//! write: any bytes, read with SHA-1 or SHA-256 object ids (the first byte chooses), must give
//! a survey or an error, never a panic, and every path it lists is one the file holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The reader itself, compiled from the agent's source: it uses nothing but std.
#[path = "../../src/git_index.rs"]
mod git_index;

fuzz_target!(|data: &[u8]| {
    let Some((&choice, index)) = data.split_first() else {
        return;
    };
    let oid_len = if choice & 1 == 0 { 20 } else { 32 };
    if let Ok(survey) = git_index::every_path(index, oid_len) {
        // Version 4 rebuilds names from their predecessors; no name can outgrow the file.
        assert!(survey.tracked.iter().all(|path| path.len() <= index.len()));
    }
});
