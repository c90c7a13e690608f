//! A verification's scratch directory in memory (a private directory on the host's
//! `/dev/shm` tmpfs), for patches whose files are few and small.
//!
//! Verification writes every touched file (extracted from the baseline, and again when git
//! applies the patch for real), and nothing of it needs to outlive the verdict. On a disk file
//! system each new file with contents costs a block reservation and a journal entry, so those
//! writes were most of a verification; on tmpfs they cost a small fraction of that.
//!
//! Memory is bounded: only a text patch qualifies (git then writes at most the touched
//! baseline contents plus the patch's own bytes; a binary patch can inflate far beyond its
//! size), the extraction stops at [`MAX_BYTES`], and the tmpfs must have twice that room.
//! A success in memory is the verdict; a refusal is taken again on disk, so that nothing
//! particular to the tmpfs (it filling up meanwhile) can refuse a patch that applies.

use std::path::{Path, PathBuf};

use dynocap_review::patch::FilePatch;
use nix::sys::statfs::{statfs, TMPFS_MAGIC};
use nix::sys::statvfs::statvfs;

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

/// A private directory (0700, a fresh name) on the tmpfs, removed after it is dropped.
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
        remove_abandoned(Path::new(SHM));
        // mkdtemp: a name nobody else holds (the directory is world-writable), mode 0700. The
        // pid in it lets a later verification remove it should this process die first.
        let template = format!("{PREFIX}{}-XXXXXX", std::process::id());
        let dir = nix::unistd::mkdtemp(&Path::new(SHM).join(template)).ok()?;
        Some(Self(dir))
    }

    /// The scratch directory for [`super::git_apply::PendingApply::start`], which removes
    /// and recreates it: beneath the private directory, never a name in `/dev/shm` itself.
    pub fn scratch(&self) -> PathBuf {
        self.0.join("scratch")
    }
}

/// The scratch directories' name: `<PREFIX><pid>-<random>`.
const PREFIX: &str = "dynocap-verify-";

/// Removes scratch directories in `shm` whose process is gone (killed mid-verification): on a
/// tmpfs they would hold their part of a project in memory until the host reboots. Only this
/// user's directories: another user's are not ours to judge, nor could we remove them.
fn remove_abandoned(shm: &Path) {
    let Ok(entries) = std::fs::read_dir(shm) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let ours = std::os::unix::fs::MetadataExt::uid(&match entry.metadata() {
            Ok(meta) if meta.is_dir() => meta,
            _ => continue,
        }) == me;
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if ours && gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for MemoryDir {
    fn drop(&mut self) {
        // Off the verdict's path, like the disk scratch (see `super::discard`): unlinking the
        // entries costs far more than starting a thread, even on tmpfs. Should the process end first, the next verification's
        // `remove_abandoned` takes the directory (its name holds this process's pid).
        super::remove_in_background(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_scratch_directories_of_dead_processes_are_removed() {
        let shm = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let abandoned = shm.path().join(format!("{PREFIX}{dead}-aaaaaa"));
        let live = shm
            .path()
            .join(format!("{PREFIX}{}-bbbbbb", std::process::id()));
        let unrelated = shm.path().join("other-1-cccccc");
        for dir in [&abandoned, &live, &unrelated] {
            std::fs::create_dir_all(dir.join("scratch/tree")).unwrap();
        }
        remove_abandoned(shm.path());
        assert!(!abandoned.exists());
        assert!(live.exists() && unrelated.exists());
    }

    #[test]
    fn a_dropped_directory_is_removed_with_everything_in_it() {
        let Some(dir) = MemoryDir::make() else {
            eprintln!("skipped: /dev/shm is not a tmpfs with room for a verification");
            return;
        };
        let path = dir.0.clone();
        let tree = dir.scratch().join("tree/a/b");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(tree.join("file"), "contents").unwrap();
        drop(dir);
        // Removed by a thread of its own: wait for it (not a timing check, a bound on a hang).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while path.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} is still there a minute after the drop",
                path.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
