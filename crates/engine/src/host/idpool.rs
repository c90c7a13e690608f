//! Host uid/gid ranges for sandboxes, from this home: the pool itself (one range per sandbox
//! state directory, under an `flock`) is [`dynocap_host::idpool`]'s; this says where a home
//! keeps the records and the lock, and which records must survive a power loss.

use dynocap_host::idpool::{Durability, IdPool};

use crate::foundation::error::{Coded, ErrorCode, Result};
use crate::host::home::Home;
use crate::model::lifecycle::Kind;

/// The lock file in `DYNOCAP_HOME` that serialises allocations.
const LOCK_FILE: &str = "idrange.lock";
/// The directory in `DYNOCAP_HOME` of the files each sandbox's range record links.
const INDEX_FILES: &str = "idranges";

/// The range index of sandbox `id`: the one its state directory records, else the lowest free
/// one, recorded there now. The state directory must exist.
pub fn reserve(home: &Home, id: &str) -> Result<u32> {
    let pool = IdPool {
        lock_file: &home.root().join(LOCK_FILE),
        records_root: &home.records_root(Kind::Raw),
        index_files: &home.root().join(INDEX_FILES),
    };
    // A task's range must survive a power loss: its kept layer, owned by the range's ids,
    // does. A raw sandbox's state ends with its guest, which a power loss ends too, so its
    // record skips the fsync (half a millisecond on every `run`); after a crash a missing
    // record reserves nothing, as a damaged one does, and dead sandboxes' leftovers go.
    let durability = if Kind::of_id(id) != Some(Kind::Raw) {
        Durability::Synced
    } else {
        Durability::Unsynced
    };
    Ok(pool
        .reserve(&home.sandbox_dir(id), durability)
        .map_err(IdPoolFailure)?)
}

/// The pool could not hand out or record a range; the host crate's text says which file
/// and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct IdPoolFailure(#[source] dynocap_host::HostError);

impl Coded for IdPoolFailure {
    /// The pool's files are the operator's to fix (or `dynocap doctor --repair`'s), never
    /// the caller's.
    fn code(&self) -> ErrorCode {
        ErrorCode::Internal
    }
}

#[cfg(test)]
mod tests {
    //! The pool's own rules are tested in dynocap-host; these, that a home's sandboxes share
    //! one pool and each keeps its range.

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
        assert!(home.root().join(LOCK_FILE).exists());
    }

    #[test]
    fn a_kept_state_dir_keeps_its_range() {
        let (_dir, home) = home();
        assert_eq!(new_sandbox(&home, "sbx-a"), 0);
        assert_eq!(new_sandbox(&home, "sbx-b"), 1);
        // A second boot over the same state dir (a recovery) reads the recorded range.
        assert_eq!(reserve(&home, "sbx-a").expect("again"), 0);
        assert_eq!(reserve(&home, "sbx-b").expect("again"), 1);
        assert_eq!(
            dynocap_host::idpool::recorded(&home.sandbox_dir("sbx-a")).expect("read"),
            Some(0)
        );
    }

    #[test]
    fn damaged_record_is_an_internal_error_that_names_the_file() {
        let (_dir, home) = home();
        std::fs::create_dir_all(home.sandbox_dir("sbx-a")).expect("dir");
        std::fs::write(
            home.sandbox_dir("sbx-a")
                .join(dynocap_host::idpool::RANGE_FILE),
            "x\n",
        )
        .expect("write");
        let err = reserve(&home, "sbx-a").expect_err("damaged");
        assert_eq!(err.code, crate::foundation::error::ErrorCode::Internal);
        assert!(
            err.message.contains(dynocap_host::idpool::RANGE_FILE),
            "{err}"
        );
        // Others still allocate.
        assert_eq!(new_sandbox(&home, "sbx-b"), 0);
    }
}
