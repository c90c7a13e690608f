//! The backend's content-addressed cache (initramfs archives, base disks, the KVM probe's
//! answers): a key is the SHA-256 of everything the artefact is made from, and a finished
//! artefact is linked into place under its key, never replaced, so a running VM's files never
//! change under it. A hit records the use ([`crate::cache_gc`] prunes what goes unused).

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Result, VmError};

/// Accumulates the inputs of an artefact.
pub struct Key(Sha256);

impl Key {
    /// `kind` separates artefacts made from the same inputs (and names the format revision).
    pub fn new(kind: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(kind.as_bytes());
        hasher.update([0]);
        Self(hasher)
    }

    /// Adds one input; length-prefixed, so inputs cannot run into each other.
    pub fn add(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    pub fn hex(self) -> String {
        self.0
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Returns `dir/name`, building it first with `build(temp_path)` if it is not there yet. The
/// build writes a temporary file which is hard-linked into place: a crash leaves no
/// half-made artefact under the final name, and a concurrent build of the same key loses
/// harmlessly (its copy is dropped, the first one stays).
pub fn get_or_build(
    dir: &Path,
    name: &str,
    build: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let path = dir.join(name);
    if path.is_file() {
        crate::cache_gc::mark_used(&path);
        return Ok(path);
    }
    fs::create_dir_all(dir).map_err(|err| VmError::io("creating", dir, err))?;
    // Unique per process and per call: two threads of one process (an engine serving two
    // boots at once) building the same key must not share, or remove, each other's file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let temp = dir.join(format!(".{name}.tmp-{}-{call}", std::process::id()));
    let _ = fs::remove_file(&temp);
    let built = build(&temp).and_then(|()| match fs::hard_link(&temp, &path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(err) => Err(VmError::io("installing", &path, err)),
    });
    let _ = fs::remove_file(&temp);
    built.map(|()| path)
}

/// Writes `bytes` to a new file at `path` and syncs it.
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|err| VmError::io("creating", path, err))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|err| VmError::io("writing", path, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_building_one_key_at_once_all_get_it() {
        let dir = tempfile::tempdir().unwrap();
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    let path = get_or_build(dir.path(), "shared", |tmp| {
                        barrier.wait();
                        write_new(tmp, b"same content")
                    })
                    .expect("every builder succeeds");
                    assert_eq!(fs::read(path).unwrap(), b"same content");
                });
            }
        });
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["shared"], "no temporary file is left");
    }

    #[test]
    fn keys_separate_inputs() {
        let key = |parts: &[&[u8]]| {
            let mut k = Key::new("t");
            for p in parts {
                k.add(p);
            }
            k.hex()
        };
        assert_eq!(key(&[b"ab", b"c"]), key(&[b"ab", b"c"]));
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]));
        assert_eq!(key(&[]).len(), 64);
    }

    #[test]
    fn an_artefact_is_built_once_and_a_failed_build_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut builds = 0;
        for _ in 0..2 {
            let path = get_or_build(dir.path(), "a", |tmp| {
                builds += 1;
                write_new(tmp, b"x")
            })
            .unwrap();
            assert_eq!(fs::read(path).unwrap(), b"x");
        }
        assert_eq!(builds, 1);
        let failed = get_or_build(dir.path(), "b", |tmp| {
            write_new(tmp, b"half")?;
            Err(VmError::Unavailable("boom".into()))
        });
        assert!(failed.is_err());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a"]);
    }
}
