//! When sandboxes of a home were last used, so that a warm-pool refill boots in the lulls
//! rather than beside the commands it is meant to speed up. On cgroup v1 a boot moves its
//! guest between cgroups, which takes a machine-wide lock that every `fork` waits for: a
//! refill booting while the claimed sandbox runs its first command slowed that command
//! several times over (docs/performance.md, "Design measurements").
//!
//! Every supervisor touches `run/activity` when it serves a request (one `utimensat`); a
//! refill waits until nothing has touched it for [`QUIET`], or at most [`MAX_WAIT`], so a
//! home that is never quiet still gets its pool.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::host::home::Home;

/// How long a home must have served no request before a refill boots.
pub const QUIET: Duration = Duration::from_millis(200);
/// The longest a refill waits for that.
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// How often a waiting refill looks again.
const POLL: Duration = Duration::from_millis(25);

fn activity_file(home: &Home) -> PathBuf {
    home.root().join("run").join("activity")
}

/// Records that a sandbox of `home` is serving a request now. Best effort: a home whose
/// marker cannot be written only refills sooner.
pub fn note(home: &Home) {
    mark(home, nix::sys::time::TimeSpec::UTIME_NOW);
}

/// Records a request served at `at` (for tests: a time in the future keeps the home busy).
#[cfg(test)]
pub(crate) fn note_at(home: &Home, at: SystemTime) {
    let since_epoch = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    mark(home, nix::sys::time::TimeSpec::from_duration(since_epoch));
}

/// Sets the marker's time to `time`, making the marker if there is none.
fn mark(home: &Home, time: nix::sys::time::TimeSpec) {
    let path = activity_file(home);
    let set = || {
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &path,
            &time,
            &time,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
    };
    if set() == Err(nix::errno::Errno::ENOENT) && std::fs::File::create(&path).is_ok() {
        let _ = set();
    }
}

/// Waits until `home` has been quiet for `quiet` or `max_wait` has passed; returns how long
/// it waited.
pub fn wait_for_quiet(home: &Home, quiet: Duration, max_wait: Duration) -> Duration {
    let path = activity_file(home);
    let started = std::time::Instant::now();
    while started.elapsed() < max_wait {
        match since_last(&path) {
            Some(idle) if idle < quiet => std::thread::sleep(POLL.min(quiet - idle)),
            // Quiet long enough, or never used (no marker yet).
            _ => break,
        }
    }
    started.elapsed()
}

/// How long ago the marker was last touched; `None` when there is none.
fn since_last(path: &Path) -> Option<Duration> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    // A marker from the future (a clock set back) counts as just touched.
    Some(
        SystemTime::now()
            .duration_since(modified)
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refill_waits_for_quiet_and_no_longer_than_its_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::at(dir.path().to_owned()).expect("home");
        // Never used: no wait.
        let waited = wait_for_quiet(&home, Duration::from_secs(60), Duration::from_secs(60));
        assert!(waited < Duration::from_secs(30), "{waited:?}");
        // Used just now and kept busy: waits out its bound, not the (longer) quiet period.
        note(&home);
        let waited = wait_for_quiet(&home, Duration::from_secs(60), Duration::from_millis(300));
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        // Used just now, then left alone: waits at least the quiet period from the last use.
        note(&home);
        let waited = wait_for_quiet(&home, Duration::from_millis(300), Duration::from_secs(60));
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
    }
}
