//! Files replaced whole or not at all: written under a temporary name beside the target,
//! synced, renamed over it, and the directory synced, so that a reader, or a crash at any
//! point, sees the old file or the new one, never half of one. [`replace_unsynced`] skips the
//! syncs for state a power loss ends anyway.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// The file and its directory entry are on the disk before the write returns.
    Synced,
    Unsynced,
}

fn write_then_rename(path: &Path, bytes: &[u8], durability: Durability) -> std::io::Result<()> {
    let temp = temporary_beside(path);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        match durability {
            Durability::Synced => {
                file.sync_all()?;
                publish(&temp, path)
            }
            Durability::Unsynced => std::fs::rename(&temp, path),
        }
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// Renames a finished, synced file into place and syncs its directory, so the new name
/// survives a crash.
pub fn publish(temp: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::rename(temp, path)?;
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
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
}
