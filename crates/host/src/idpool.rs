//! Host uid/gid ranges for sandboxes: each sandbox gets its own range of the root-mode pool
//! ([`crate::idmap`]; as Podman's `--userns=auto` does), so a guest that escapes its mount
//! tree does not hold the ids that own every other sandbox's files.
//!
//! A range is the index recorded in the sandbox's state directory (`<records>/<id>/idrange`).
//! It is reserved for as long as that directory exists, not just while a guest runs: a task
//! whose work could not be saved keeps its writable layer there, owned by that range's host
//! ids, and the recovery guest booted over it must map the same ids to read it. Allocation
//! picks the lowest index no state directory holds, under an `flock` on a lock file beside
//! the records, so two supervisors starting at once never take the same one.
//!
//! A sandbox's record is a hard link to a file the pool keeps for that index (made once,
//! holding the index), not a file of its own: recording a range then creates no inode on the
//! host's filesystem and removing the state directory deletes none. On an ext4 without a
//! journal each new inode skips every one deleted in the last minute, which cost up to a
//! millisecond of every start (see the project's docs/performance.md). Where hard links are
//! refused, the record is written as a file of its own.
//!
//! Where the records, the index files and the lock live, and how durably a record is made,
//! are the caller's (the engine's `idpool` knows its home's layout and which sandboxes
//! outlive a power loss).

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::durable::{sync_parent, write_new};
use crate::error::HostError;
use crate::idmap::ROOT_MODE_RANGES;

/// The file in a sandbox's state directory that holds its range index.
pub const RANGE_FILE: &str = "idrange";
/// Allocation holds the lock for one directory scan; a holder that keeps it this long is stuck.
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Where one pool's ranges are recorded.
#[derive(Debug, Clone, Copy)]
pub struct IdPool<'a> {
    /// The file whose `flock` serialises allocations.
    pub lock_file: &'a Path,
    /// The directory holding every sandbox's state directory.
    pub records_root: &'a Path,
    /// The directory of index files, one per index ever handed out, on the records'
    /// filesystem; made if missing.
    pub index_files: &'a Path,
}

/// How a new record must survive: [`Durability::Synced`], on the disk before
/// [`IdPool::reserve`] returns; [`Durability::Unsynced`], for state a power loss ends anyway
/// (after a crash a missing record reserves nothing).
pub use crate::durable::Durability;

impl IdPool<'_> {
    /// The range index of the sandbox whose state directory is `state_dir` (under
    /// `records_root`): the one it records, else the lowest free one, recorded there now
    /// (whole or not at all for any reader). The state directory must exist.
    pub fn reserve(&self, state_dir: &Path, durability: Durability) -> Result<u32, HostError> {
        if let Some(index) = recorded(state_dir)? {
            return Ok(index);
        }
        let _lock = lock(self.lock_file)?;
        let used = in_use(self.records_root)?;
        let index = lowest_free(&used, ROOT_MODE_RANGES).ok_or_else(|| {
            HostError::IdPool(format!(
                "all {ROOT_MODE_RANGES} host id ranges are held by sandbox state directories \
                 under {}; remove sandboxes and tasks you no longer need (`dynocap rm`), or run \
                 `dynocap doctor --repair` to clear what dead sandboxes left behind",
                self.records_root.display()
            ))
        })?;
        let path = state_dir.join(RANGE_FILE);
        self.record(index, &path, durability)
            .map_err(|source| HostError::Io {
                context: format!("recording host id range {index} in {}", path.display()),
                source,
                hint: None,
            })?;
        Ok(index)
    }

    /// Makes `path` say `index`: a hard link to the index's file, or where the filesystem
    /// refuses one, a file of its own.
    fn record(&self, index: u32, path: &Path, durability: Durability) -> std::io::Result<()> {
        let contents = format!("{index}\n");
        let linked = self
            .index_file(index, &contents)
            .and_then(|file| std::fs::hard_link(file, path));
        match linked {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => return Err(err),
            Err(_) => write_new(path, contents.as_bytes(), durability)?,
        }
        if durability == Durability::Synced {
            sync_parent(path)?;
        }
        Ok(())
    }

    /// The index file for `index`, made (synced, whole or not at all) if it is missing or
    /// does not hold `contents`.
    fn index_file(&self, index: u32, contents: &str) -> std::io::Result<PathBuf> {
        let file = self.index_files.join(index.to_string());
        if std::fs::read(&file).is_ok_and(|held| held == contents.as_bytes()) {
            return Ok(file);
        }
        match std::fs::create_dir(self.index_files) {
            Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => return Err(err),
            _ => {}
        }
        let temp = self
            .index_files
            .join(format!(".{index}.{}.tmp", std::process::id()));
        let written = write_new(&temp, contents.as_bytes(), Durability::Synced)
            .and_then(|()| std::fs::rename(&temp, &file))
            .and_then(|()| sync_parent(&file));
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written.map(|()| file)
    }
}

/// The index a state directory records, if it records one.
pub fn recorded(state_dir: &Path) -> Result<Option<u32>, HostError> {
    let path = state_dir.join(RANGE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u32>().map(Some).map_err(|_| {
            HostError::IdPool(format!(
                "{} holds {:?}, not a host id range index; it was damaged: if no guest of this \
                 sandbox runs, remove the sandbox (`dynocap rm`)",
                path.display(),
                text.trim()
            ))
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HostError::Io {
            context: format!("reading {}", path.display()),
            source,
            hint: None,
        }),
    }
}

/// Indexes recorded by the state directories under `root`. A damaged record reserves
/// nothing, but cannot make a range be handed out twice: it was written under the lock as a
/// valid number, so damage means someone else wrote it.
fn in_use(root: &Path) -> Result<BTreeSet<u32>, HostError> {
    let listing = |source| HostError::Io {
        context: format!("listing {}", root.display()),
        source,
        hint: None,
    };
    let entries = std::fs::read_dir(root).map_err(listing)?;
    let mut used = BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(listing)?;
        if let Ok(Some(index)) = recorded(&entry.path()) {
            used.insert(index);
        }
    }
    Ok(used)
}

fn lowest_free(used: &BTreeSet<u32>, pool: u32) -> Option<u32> {
    (0..pool).find(|index| !used.contains(index))
}

fn lock(path: &Path) -> Result<Flock<File>, HostError> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| HostError::Io {
            context: format!("opening {}", path.display()),
            source,
            hint: None,
        })?;
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
                return Err(HostError::IdPool(format!(
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

    use std::os::unix::fs::MetadataExt;

    struct Pool {
        _dir: tempfile::TempDir,
        lock: std::path::PathBuf,
        records: std::path::PathBuf,
        index_files: std::path::PathBuf,
    }

    impl Pool {
        fn new() -> Pool {
            let dir = tempfile::tempdir().expect("tempdir");
            let records = dir.path().join("sandboxes");
            std::fs::create_dir(&records).expect("records");
            Pool {
                lock: dir.path().join("idrange.lock"),
                index_files: dir.path().join("idranges"),
                records,
                _dir: dir,
            }
        }

        fn state_dir(&self, id: &str) -> std::path::PathBuf {
            self.records.join(id)
        }

        fn ids(&self) -> IdPool<'_> {
            IdPool {
                lock_file: &self.lock,
                records_root: &self.records,
                index_files: &self.index_files,
            }
        }

        fn reserve(&self, id: &str) -> Result<u32, HostError> {
            self.ids()
                .reserve(&self.state_dir(id), Durability::Unsynced)
        }

        fn new_sandbox(&self, id: &str) -> u32 {
            std::fs::create_dir_all(self.state_dir(id)).expect("state dir");
            self.reserve(id).expect("reserve")
        }
    }

    #[test]
    fn lowest_free_index_and_reuse_after_removal() {
        let pool = Pool::new();
        assert_eq!(pool.new_sandbox("sbx-a"), 0);
        assert_eq!(pool.new_sandbox("sbx-b"), 1);
        assert_eq!(pool.new_sandbox("sbx-c"), 2);
        std::fs::remove_dir_all(pool.state_dir("sbx-b")).expect("rm");
        assert_eq!(pool.new_sandbox("sbx-d"), 1);
        assert_eq!(pool.new_sandbox("sbx-e"), 3);
    }

    #[test]
    fn a_kept_state_dir_keeps_its_range() {
        let pool = Pool::new();
        assert_eq!(pool.new_sandbox("sbx-a"), 0);
        assert_eq!(pool.new_sandbox("sbx-b"), 1);
        // A second boot over the same state dir (a recovery) reads the recorded range.
        assert_eq!(pool.reserve("sbx-a").expect("again"), 0);
        assert_eq!(pool.reserve("sbx-b").expect("again"), 1);
        assert_eq!(recorded(&pool.state_dir("sbx-a")).expect("read"), Some(0));
    }

    #[test]
    fn damaged_record_is_an_error_that_names_the_file() {
        let pool = Pool::new();
        std::fs::create_dir_all(pool.state_dir("sbx-a")).expect("dir");
        std::fs::write(pool.state_dir("sbx-a").join(RANGE_FILE), "x\n").expect("write");
        let err = pool.reserve("sbx-a").expect_err("damaged").to_string();
        assert!(err.contains(RANGE_FILE), "{err}");
        // Others still allocate.
        assert_eq!(pool.new_sandbox("sbx-b"), 0);
    }

    #[test]
    fn a_failed_record_names_the_range_and_the_file() {
        let pool = Pool::new();
        // No state directory to record in.
        let err = pool
            .ids()
            .reserve(&pool.state_dir("sbx-a"), Durability::Synced)
            .expect_err("not recorded")
            .to_string();
        assert!(
            err.starts_with("recording host id range 0 in ") && err.contains(RANGE_FILE),
            "{err}"
        );
    }

    /// A record is the index's file under another name: no inode of its own is made for it,
    /// none is freed with its sandbox, and the index file outlives every holder.
    #[test]
    fn a_record_is_a_link_to_its_index_file() {
        let pool = Pool::new();
        for (id, durability) in [
            ("sbx-a", Durability::Unsynced),
            ("task-b", Durability::Synced),
        ] {
            std::fs::create_dir_all(pool.state_dir(id)).expect("state dir");
            pool.ids()
                .reserve(&pool.state_dir(id), durability)
                .expect("reserve");
        }
        for (id, index) in [("sbx-a", "0"), ("task-b", "1")] {
            let record = std::fs::metadata(pool.state_dir(id).join(RANGE_FILE)).expect("record");
            let file = std::fs::metadata(pool.index_files.join(index)).expect("index file");
            assert_eq!((record.ino(), record.nlink()), (file.ino(), 2), "{id}");
            assert_eq!(
                std::fs::read_to_string(pool.index_files.join(index)).expect("read"),
                format!("{index}\n")
            );
        }
        std::fs::remove_dir_all(pool.state_dir("sbx-a")).expect("rm");
        let file = std::fs::metadata(pool.index_files.join("0")).expect("index file stays");
        assert_eq!(file.nlink(), 1);
        // The next holder of index 0 links the same file.
        assert_eq!(pool.new_sandbox("sbx-c"), 0);
        let record = std::fs::metadata(pool.state_dir("sbx-c").join(RANGE_FILE)).expect("record");
        assert_eq!(record.ino(), file.ino());
    }

    /// An index file that no longer holds its index is made again before anyone links it;
    /// the sandbox that holds the damaged one keeps it.
    #[test]
    fn a_damaged_index_file_is_replaced_not_linked() {
        let pool = Pool::new();
        assert_eq!(pool.new_sandbox("sbx-a"), 0);
        std::fs::write(pool.state_dir("sbx-a").join(RANGE_FILE), "7\n").expect("damage");
        std::fs::remove_dir_all(pool.state_dir("sbx-a")).expect("rm");
        assert_eq!(pool.new_sandbox("sbx-b"), 0);
        assert_eq!(recorded(&pool.state_dir("sbx-b")).expect("read"), Some(0));
        let leftovers: Vec<_> = std::fs::read_dir(&pool.index_files)
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(leftovers, ["0"], "no temporary file left");
    }

    /// Where there can be no index file (here its directory's name is taken by a file), the
    /// record is a file of its own and says the same.
    #[test]
    fn without_index_files_the_record_is_a_file_of_its_own() {
        let pool = Pool::new();
        std::fs::write(&pool.index_files, "not a directory").expect("block");
        assert_eq!(pool.new_sandbox("sbx-a"), 0);
        assert_eq!(pool.new_sandbox("sbx-b"), 1);
        let record = std::fs::metadata(pool.state_dir("sbx-b").join(RANGE_FILE)).expect("record");
        assert_eq!(record.nlink(), 1);
        assert_eq!(recorded(&pool.state_dir("sbx-b")).expect("read"), Some(1));
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
