//! A verification's scratch directory in memory (a private directory on the host's
//! `/dev/shm` tmpfs), for patches whose files are few and small.
//!
//! Verification writes every file twice (extracted from the baseline, then rewritten by
//! `git apply`), and nothing of it needs to outlive the verdict. On a disk file system each
//! new file with contents costs 60–160 µs (block reservation, journal), so those writes were
//! most of a verification; on tmpfs they cost a tenth of that.
//!
//! Memory is bounded: only a text patch qualifies (git then writes at most the touched
//! baseline contents plus the patch's own bytes; a binary patch can inflate far beyond its
//! size), the extraction stops at [`MAX_BYTES`], and the tmpfs must have twice that room.
//! A success in memory is the verdict; a refusal is taken again on disk, so that nothing
//! particular to the tmpfs (it filling up meanwhile) can refuse a patch that applies.

use std::path::{Path, PathBuf};

use nix::sys::statfs::{statfs, TMPFS_MAGIC};
use nix::sys::statvfs::statvfs;

use crate::patch::FilePatch;

/// The tmpfs a scratch directory goes to.
const SHM: &str = "/dev/shm";

/// Most bytes a verification keeps in memory: the touched baseline contents and the patch.
const MAX_BYTES: u64 = 64 << 20;

/// What the extracted baseline contents may take when `files` (a patch of `patch_len` bytes)
/// is verified in memory; `None` when it must be verified on disk.
pub(super) fn budget(files: &[FilePatch<'_>], patch_len: usize) -> Option<u64> {
    if files.iter().any(|file| file.is_binary) {
        return None;
    }
    MAX_BYTES.checked_sub(u64::try_from(patch_len).ok()?)
}

/// A private directory (0700, a fresh name) on the tmpfs, removed when dropped.
pub(super) struct MemoryDir(PathBuf);

impl MemoryDir {
    /// Makes one, if `/dev/shm` is a tmpfs with room for twice [`MAX_BYTES`]; `None` sends
    /// the verification to disk.
    pub fn make() -> Option<Self> {
        let fs = statfs(SHM).ok()?;
        if fs.filesystem_type() != TMPFS_MAGIC {
            return None;
        }
        let room = statvfs(SHM).ok()?;
        let free = room.blocks_available().saturating_mul(room.fragment_size());
        if free < 2 * MAX_BYTES {
            return None;
        }
        // mkdtemp: a name nobody else holds (the directory is world-writable), mode 0700.
        let dir = nix::unistd::mkdtemp(&Path::new(SHM).join("dynocap-verify-XXXXXX")).ok()?;
        Some(Self(dir))
    }

    /// The scratch directory for [`super::git_apply::PendingApply::start`], which removes
    /// and recreates it: beneath the private directory, never a name in `/dev/shm` itself.
    pub fn scratch(&self) -> PathBuf {
        self.0.join("scratch")
    }
}

impl Drop for MemoryDir {
    fn drop(&mut self) {
        // Here and now: unlinking a hundred entries on tmpfs takes less than starting a
        // thread to do it would.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
