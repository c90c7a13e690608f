//! Host uid/gid ranges for sandboxes: each sandbox gets its own range of the jail's pool (as
//! Podman's `--userns=auto` does), so a guest that escapes its mount tree does not hold the
//! ids that own every other sandbox's files.
//!
//! A range is the index recorded in the sandbox's state directory (`sandboxes/<id>/idrange`).
//! It is reserved for as long as that directory exists, not just while a guest runs: a task
//! whose work could not be saved keeps its writable layer there, owned by that range's host
//! ids, and the recovery guest booted over it must map the same ids to read it. Allocation
//! picks the lowest index no state directory holds, under an `flock` in `DYNOCAP_HOME` so two
//! supervisors starting at once never take the same one.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use dynocap_backend_jail::ROOT_MODE_RANGES;

use crate::catalog::Kind;
use crate::error::{Context, Error, Result};
use crate::home::Home;

/// The file in a sandbox's state directory that holds its range index.
pub const RANGE_FILE: &str = "idrange";
/// The lock file in `DYNOCAP_HOME` that serialises allocations.
const LOCK_FILE: &str = "idrange.lock";
/// Allocation holds the lock for one directory scan; a holder that keeps it this long is stuck.
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// The range index of sandbox `id`: the one its state directory records, else the lowest free
/// one, recorded there now. The state directory must exist.
pub fn reserve(home: &Home, id: &str) -> Result<u32> {
    let state_dir = home.sandbox_dir(id);
    if let Some(index) = recorded(&state_dir)? {
        return Ok(index);
    }
    let _lock = lock(home)?;
    let used = in_use(&home.records_root(Kind::Raw))?;
    let index = lowest_free(&used, ROOT_MODE_RANGES).ok_or_else(|| {
        Error::internal(format!(
            "all {ROOT_MODE_RANGES} host id ranges are held by sandbox state directories under {}; \
             remove sandboxes and tasks you no longer need (`dynocap rm`), or run \
             `dynocap doctor --repair` to clear what dead sandboxes left behind",
            home.records_root(Kind::Raw).display()
        ))
    })?;
    // A task's range must survive a power loss: its kept layer, owned by the range's ids,
    // does. A raw sandbox's state ends with its guest, which a power loss ends too, so its
    // record skips the fsync (half a millisecond on every `run`); after a crash an empty
    // record reserves nothing, as a damaged one does, and dead sandboxes' leftovers go.
    let durable = Kind::of_id(id) != Some(Kind::Raw);
    record(&state_dir, index, durable)?;
    Ok(index)
}

/// The index a state directory records, if it records one.
pub fn recorded(state_dir: &Path) -> Result<Option<u32>> {
    let path = state_dir.join(RANGE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u32>().map(Some).map_err(|_| {
            Error::internal(format!(
                "{} holds {:?}, not a host id range index; it was damaged: if no guest of this \
                 sandbox runs, remove the sandbox (`dynocap rm`)",
                path.display(),
                text.trim()
            ))
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).context(format_args!("reading {}", path.display())),
    }
}

/// Indexes recorded by the state directories under `root`. A damaged record reserves
/// nothing, but cannot make a range be handed out twice: it was written under the lock as a
/// valid number, so damage means someone else wrote it.
fn in_use(root: &Path) -> Result<BTreeSet<u32>> {
    let entries = std::fs::read_dir(root).context(format_args!("listing {}", root.display()))?;
    let mut used = BTreeSet::new();
    for entry in entries {
        let entry = entry.context(format_args!("listing {}", root.display()))?;
        if let Ok(Some(index)) = recorded(&entry.path()) {
            used.insert(index);
        }
    }
    Ok(used)
}

fn lowest_free(used: &BTreeSet<u32>, pool: u32) -> Option<u32> {
    (0..pool).find(|index| !used.contains(index))
}

/// Writes the index whole or not at all (`durable`): a crash of the process leaves either no
/// record or a whole one, never a half-written number another allocation would misread; a
/// `durable` one is synced, so that a power loss does too.
fn record(state_dir: &Path, index: u32, durable: bool) -> Result<()> {
    let path = state_dir.join(RANGE_FILE);
    let text = format!("{index}\n");
    let written = if durable {
        crate::durable::replace(&path, text.as_bytes())
    } else {
        crate::durable::replace_unsynced(&path, text.as_bytes())
    };
    written.context(format_args!(
        "recording host id range {index} in {}",
        path.display()
    ))
}

fn lock(home: &Home) -> Result<Flock<File>> {
    let path = home.root().join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .context(format_args!("opening {}", path.display()))?;
    let deadline = Instant::now() + LOCK_TIMEOUT;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((back, Errno::EINTR)) => file = back,
            Err((back, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                file = back;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err((_, errno)) => {
                return Err(Error::internal(format!(
                    "cannot lock {} to allocate a host id range: {errno}; another dynocap \
                     process may be stuck holding it (look for one with `lsof {}`)",
                    path.display(),
                    path.display()
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home() -> (tempfile::TempDir, Home) {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::at(dir.path().join("home")).expect("home");
        (dir, home)
    }

    fn new_sandbox(home: &Home, id: &str) -> u32 {
        std::fs::create_dir_all(home.sandbox_dir(id)).expect("state dir");
        reserve(home, id).expect("reserve")
    }

    #[test]
    fn lowest_free_index_and_reuse_after_removal() {
        let (_dir, home) = home();
        assert_eq!(new_sandbox(&home, "sbx-a"), 0);
        assert_eq!(new_sandbox(&home, "sbx-b"), 1);
        assert_eq!(new_sandbox(&home, "sbx-c"), 2);
        std::fs::remove_dir_all(home.sandbox_dir("sbx-b")).expect("rm");
        assert_eq!(new_sandbox(&home, "sbx-d"), 1);
        assert_eq!(new_sandbox(&home, "sbx-e"), 3);
    }

    #[test]
    fn a_kept_state_dir_keeps_its_range() {
        let (_dir, home) = home();
        assert_eq!(new_sandbox(&home, "sbx-a"), 0);
        assert_eq!(new_sandbox(&home, "sbx-b"), 1);
        // A second boot over the same state dir (a recovery) reads the recorded range.
        assert_eq!(reserve(&home, "sbx-a").expect("again"), 0);
        assert_eq!(reserve(&home, "sbx-b").expect("again"), 1);
        assert_eq!(recorded(&home.sandbox_dir("sbx-a")).expect("read"), Some(0));
    }

    #[test]
    fn damaged_record_is_an_error_that_names_the_file() {
        let (_dir, home) = home();
        std::fs::create_dir_all(home.sandbox_dir("sbx-a")).expect("dir");
        std::fs::write(home.sandbox_dir("sbx-a").join(RANGE_FILE), "x\n").expect("write");
        let err = reserve(&home, "sbx-a").expect_err("damaged").to_string();
        assert!(err.contains(RANGE_FILE), "{err}");
        // Others still allocate.
        assert_eq!(new_sandbox(&home, "sbx-b"), 0);
    }

    #[test]
    fn exhausted_pool() {
        let used: BTreeSet<u32> = (0..4).collect();
        assert_eq!(lowest_free(&used, 4), None);
        assert_eq!(lowest_free(&used, 5), Some(4));
        let gap: BTreeSet<u32> = [0, 2].into_iter().collect();
        assert_eq!(lowest_free(&gap, 4), Some(1));
    }
}
