//! Built images for the tests: one Debian image per machine, shared by every test home.
//!
//! A build downloads ~150 MB and takes minutes, so tests point `DYNOCAP_IMAGE_CACHE` at one
//! directory that outlives the run ([`cache_dir`]). The first `dynocap image build debian`
//! of a run builds into it (or finds it there from an earlier run: the cache is keyed by the
//! recipe's content id, so a changed recipe never reuses a stale image); every other home
//! copies the image from it with hard links, in seconds.

use std::path::PathBuf;

use serde_json::Value;

use crate::TestHome;

/// The shared cache: `DYNOCAP_TEST_IMAGE_CACHE`, else `/var/cache/dynocap-test-images`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("DYNOCAP_TEST_IMAGE_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || PathBuf::from("/var/cache/dynocap-test-images"),
            PathBuf::from,
        )
}

/// Whether image tests can run: mmdebstrap installed. A missing one skips the test outside
/// CI and fails it in CI (scripts/install-deps.sh installs it).
pub fn require_mmdebstrap(test: &str) -> bool {
    let found = std::process::Command::new("mmdebstrap")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if found {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs mmdebstrap (apt-get install mmdebstrap), and CI must have it");
    }
    eprintln!("SKIPPED {test}: needs mmdebstrap (apt-get install mmdebstrap)");
    false
}

/// A test home using the shared cache.
pub fn cached_home() -> TestHome {
    TestHome::new().with_env("DYNOCAP_IMAGE_CACHE", &cache_dir().to_string_lossy())
}

/// A home with the debian image built (from the shared cache when it has it); returns the
/// home and the build's JSON (`{image, origin}`).
pub fn debian_home() -> (TestHome, Value) {
    let home = cached_home();
    let built = home.json(&["image", "build", "debian"]);
    (home, built)
}
