//! Fuzzes a container image's hostile input: its JSON documents, its layers' names, and a
//! layer unpacked twice into a root (see `dynocap_engine::image::fuzzing`). Each run works in
//! a directory of this process under the temporary directory; libFuzzer ends the process
//! without running destructors, so each start removes those of processes that are gone.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

const PREFIX: &str = "dynocap-engine-fuzz-";

fn scratch() -> PathBuf {
    let base = std::env::temp_dir();
    for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let pid = name.to_str().and_then(|name| name.strip_prefix(PREFIX));
        if pid.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = base.join(format!("{PREFIX}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("making the fuzz target's directory");
    dir
}

static DIR: OnceLock<PathBuf> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let dir = DIR.get_or_init(scratch);
    dynocap_engine::image::fuzzing::oci_layer(dir, data);
});
