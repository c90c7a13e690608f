//! Files replaced whole or not at all: written under a temporary name beside the target,
//! synced, renamed over it, and the directory synced, so that a reader, or a crash at any
//! point, sees the old file or the new one, never half of one. [`replace_unsynced`] skips the
//! syncs for state a power loss ends anyway, and swaps the new file in rather than renaming it
//! over the old one: on ext4 a rename over an existing file makes the kernel allocate and start
//! writing the new file's blocks inside the rename (`auto_da_alloc`, a guard for writers that do
//! not sync), a cost paid on every record update of a `run`, a claim and a `destroy`.
//!
//! [`write_new`] and [`sync_parent`] are the two steps everything here is made of, for a
//! writer that links or renames its new file itself (the id range pool, [`crate::idpool`]).
//! The engine's records and saved task results are written here too: one implementation of
//! "on the disk before the call returns" for every crate.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

// Log lines keep the target they had when this was the engine's: people, the e2e tests and
// log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::durable";

/// Replaces `path` with `bytes` (mode 0600).
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_then_rename(path, bytes, Durability::Synced)
}

/// Replaces `path` with `bytes` (mode 0600) whole or not at all for any reader and across a
/// crash of this process, without waiting for the disk: after a power loss the file may be
/// the old one, or empty. For state that does not outlive the machine anyway (a raw
/// sandbox's record: its guest is gone after a power loss too).
pub fn replace_unsynced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_then_rename(path, bytes, Durability::Unsynced)
}

/// How a write must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The file (and, where the call makes one, its directory entry) is on the disk before
    /// the write returns: for state that outlives a power loss.
    Synced,
    /// For state a power loss ends anyway.
    Unsynced,
}

/// Writes a new file at `path` (mode 0600; an existing file is an error), synced when
/// `durability` says so. Its directory entry is not synced: see [`sync_parent`].
pub fn write_new(path: &Path, bytes: &[u8], durability: Durability) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    if durability == Durability::Synced {
        file.sync_all()?;
    }
    Ok(())
}

/// Syncs the directory holding `path`, so that a name made or renamed in it survives a crash.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

fn write_then_rename(path: &Path, bytes: &[u8], durability: Durability) -> std::io::Result<()> {
    let temp = temporary_beside(path);
    let written = write_new(&temp, bytes, durability).and_then(|()| match durability {
        Durability::Synced => publish(&temp, path),
        Durability::Unsynced => swap_in(&temp, path),
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// Puts `temp` where `path` is, atomically for readers: exchanged with the old file
/// (`RENAME_EXCHANGE`), whose content then sits under the temporary name and is removed; where
/// there is no old file, or the filesystem cannot exchange, renamed as usual.
fn swap_in(temp: &Path, path: &Path) -> std::io::Result<()> {
    use nix::errno::Errno;
    use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
    match renameat2(AT_FDCWD, temp, AT_FDCWD, path, RenameFlags::RENAME_EXCHANGE) {
        Ok(()) => {
            // The new content is in place whatever happens here; what could be left is a
            // hidden `.tmp` beside it with the old content, which no reader takes for a record.
            if let Err(err) = std::fs::remove_file(temp) {
                tracing::warn!(target: LOG_TARGET, "removing the replaced copy {}: {err}", temp.display());
            }
            Ok(())
        }
        Err(Errno::ENOENT | Errno::EINVAL | Errno::ENOSYS) => std::fs::rename(temp, path),
        Err(errno) => Err(errno.into()),
    }
}

/// Renames a finished, synced file into place and syncs its directory, so the new name
/// survives a crash.
pub fn publish(temp: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::rename(temp, path)?;
    sync_parent(path)
}

/// A name beside `path` no other writer uses: unique per process and call, so a crashed
/// writer's leftover never collides with a live one's.
fn temporary_beside(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_replace_leaves_the_new_file_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        super::replace(&path, b"one").unwrap();
        super::replace(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn an_unsynced_replace_swaps_the_new_file_in_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        super::replace_unsynced(&path, b"first").unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"first",
            "no old file to swap with"
        );
        let old_inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        super::replace_unsynced(&path, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        let new_inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        assert_ne!(
            old_inode, new_inode,
            "a new file, not the old one rewritten"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "the replaced copy is removed"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
