//! Keeps the backend's cache from growing without bound. Artefacts are keyed by content and
//! never replaced, so every agent build (a new initramfs), kernel (a new ELF), image or disk
//! size (a new base disk and empty layer) adds files, and before this nothing removed the old
//! ones: a machine upgrading DynoCap, or a CI runner keeping its image cache, filled its disk
//! with initramfs archives of 40 MB and base disks of hundreds.
//!
//! A use of an artefact sets its modification time ([`mark_used`]; a cache hit is a use), so
//! that time says when it last served a boot. After a boot, each kind that grows keeps its
//! [`KEEP_PER_KIND`] most recently used files and every file used within [`KEEP_UNUSED_FOR`];
//! the others go, as do build leftovers ([`crate::cache::get_or_build`]'s temporaries) that old.
//! Removing a file never disturbs a running guest (QEMU holds its files open). A base disk is
//! kept whatever its age while a sandbox layer in the home names it as its backing file: such
//! a layer may be a task's unsaved work, which a recovery boots over that base.

use std::collections::HashSet;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How many of each kind stay whatever their age: the current one and a couple to go back to.
pub const KEEP_PER_KIND: usize = 3;
/// Anything used this recently stays (a boot that just found a file has not opened it yet).
pub const KEEP_UNUSED_FOR: Duration = Duration::from_secs(24 * 60 * 60);

/// The artefacts that accumulate, by name prefix and suffix. The small records (the KVM
/// probe's answers, machine types, kernel notes) stay: they are bytes, not megabytes.
const KINDS: [(&str, &str); 4] = [
    ("initramfs-", ".cpio"),
    ("vmlinux-", ".elf"),
    ("base-", ".ext4"),
    ("layer-", ".qcow2"),
];

/// Records that `path` served a boot now. Best effort: a cache another user owns stays as it
/// is, and at worst an artefact is rebuilt after it was pruned.
pub fn mark_used(path: &Path) {
    if let Ok(file) = fs::File::open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// Prunes `cache_dir` as the module doc says. `layers` are the home's sandbox layers (qcow2
/// files, missing ones ignored), whose backing files are the base disks still needed. Returns
/// what was removed.
pub fn prune(cache_dir: &Path, layers: &[PathBuf], now: SystemTime) -> Vec<PathBuf> {
    let Ok(cache_dir) = cache_dir.canonicalize() else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir(&cache_dir) else {
        return Vec::new();
    };
    let needed = backing_files(layers);
    let mut by_kind: Vec<Vec<(SystemTime, PathBuf)>> = vec![Vec::new(); KINDS.len()];
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let used = meta.modified().unwrap_or(now);
        let old = now.duration_since(used).unwrap_or_default() > KEEP_UNUSED_FOR;
        if name.starts_with('.') && name.contains(".tmp-") {
            // A build that died before installing its result.
            if old && meta.is_file() && fs::remove_file(entry.path()).is_ok() {
                removed.push(entry.path());
            }
            continue;
        }
        if let Some(kind) = KINDS
            .iter()
            .position(|(prefix, suffix)| name.starts_with(prefix) && name.ends_with(suffix))
        {
            by_kind[kind].push((used, entry.path()));
        }
    }
    for mut files in by_kind {
        // Newest first; the first few stay whatever their age.
        files.sort_by_key(|(used, _)| std::cmp::Reverse(*used));
        for (used, path) in files.into_iter().skip(KEEP_PER_KIND) {
            let old = now.duration_since(used).unwrap_or_default() > KEEP_UNUSED_FOR;
            if old && !needed.contains(&path) && fs::remove_file(&path).is_ok() {
                removed.push(path);
            }
        }
    }
    removed
}

/// The backing files `layers` name, canonical.
fn backing_files(layers: &[PathBuf]) -> HashSet<PathBuf> {
    layers
        .iter()
        .filter_map(|layer| qcow2_backing_file(layer))
        .filter_map(|path| path.canonicalize().ok())
        .collect()
}

/// The backing file named in a qcow2 image's header (all fields big-endian: magic `QFI\xfb`,
/// version, then the backing file name's offset (u64) and length (u32)), if it names one.
pub(crate) fn qcow2_backing_file(layer: &Path) -> Option<PathBuf> {
    let mut file = fs::File::open(layer).ok()?;
    let mut header = [0u8; 20];
    file.read_exact(&mut header).ok()?;
    if header[..4] != *b"QFI\xfb" {
        return None;
    }
    let offset = u64::from_be_bytes(header[8..16].try_into().ok()?);
    let length = u32::from_be_bytes(header[16..20].try_into().ok()?);
    // qcow2 caps the name at 1023 bytes.
    if offset == 0 || length == 0 || length > 1023 {
        return None;
    }
    let mut name = vec![0u8; length as usize];
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset)).ok()?;
    file.read_exact(&mut name).ok()?;
    let name =
        PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(name));
    // A relative name is relative to the layer's directory.
    Some(match layer.parent() {
        Some(dir) if name.is_relative() => dir.join(name),
        _ => name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 60 * 60);

    fn file_used(dir: &Path, name: &str, used: SystemTime) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, name).unwrap();
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(used)
            .unwrap();
        path
    }

    /// A qcow2 header naming `backing` (only the fields `qcow2_backing_file` reads).
    fn layer_over(path: &Path, backing: &Path) {
        let name = backing.as_os_str().as_encoded_bytes();
        let mut bytes = Vec::from(*b"QFI\xfb");
        bytes.extend(3u32.to_be_bytes());
        bytes.extend(104u64.to_be_bytes());
        bytes.extend(u32::try_from(name.len()).unwrap().to_be_bytes());
        bytes.resize(104, 0);
        bytes.extend(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn each_kind_keeps_its_recent_and_its_newest_files_and_loses_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        fs::create_dir(&cache).unwrap();
        let now = SystemTime::now();
        // Five archives: two used today, three last used 2, 3 and 4 days ago.
        let today: Vec<_> = (0..2)
            .map(|i| file_used(&cache, &format!("initramfs-t{i}.cpio"), now - DAY / 4))
            .collect();
        let old: Vec<_> = (2..5)
            .map(|i| file_used(&cache, &format!("initramfs-o{i}.cpio"), now - DAY * i))
            .collect();
        // Records and unknown names are never touched, however old.
        let record = file_used(&cache, "kvm-probe-x", now - DAY * 30);
        let other = file_used(&cache, "notes.txt", now - DAY * 30);
        // An old build leftover goes; a fresh one may be a build under way.
        let stale_temp = file_used(&cache, ".base-a.ext4.tmp-1-0", now - DAY * 2);
        let live_temp = file_used(&cache, ".base-b.ext4.tmp-2-0", now);

        let mut removed = prune(&cache, &[], now);
        removed.sort();
        // Kept: the two of today and the newest old one (three per kind).
        let cache = cache.canonicalize().unwrap();
        let mut expected = vec![
            cache.join(old[1].file_name().unwrap()),
            cache.join(old[2].file_name().unwrap()),
            cache.join(stale_temp.file_name().unwrap()),
        ];
        expected.sort();
        assert_eq!(removed, expected);
        for kept in today.iter().chain([&old[0], &record, &other, &live_temp]) {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
    }

    #[test]
    fn a_base_a_layer_still_names_is_kept_however_old() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        fs::create_dir(&cache).unwrap();
        let now = SystemTime::now();
        let bases: Vec<_> = (0..5)
            .map(|i| file_used(&cache, &format!("base-{i}.ext4"), now - DAY * (10 + i)))
            .collect();
        // A kept task layer over the oldest base; another sandbox without a layer.
        let layers = [
            tmp.path().join("task-a/vm/disk.qcow2"),
            tmp.path().join("raw-b/vm/disk.qcow2"),
        ];
        layer_over(&layers[0], &bases[4]);

        let removed = prune(&cache, &layers, now);
        assert_eq!(removed, [cache.canonicalize().unwrap().join("base-3.ext4")]);
        assert!(bases[4].exists(), "the base a layer needs was removed");
        assert!(bases[..3].iter().all(|b| b.exists()));
    }

    #[test]
    fn a_layers_backing_file_is_read_from_its_header() {
        let tmp = tempfile::tempdir().unwrap();
        let layer = tmp.path().join("vm/disk.qcow2");
        layer_over(&layer, Path::new("/cache/base-x.ext4"));
        assert_eq!(
            qcow2_backing_file(&layer),
            Some(PathBuf::from("/cache/base-x.ext4"))
        );
        layer_over(&layer, Path::new("base-y.ext4"));
        assert_eq!(
            qcow2_backing_file(&layer),
            Some(tmp.path().join("vm/base-y.ext4"))
        );
        fs::write(&layer, b"not a qcow2 image at all").unwrap();
        assert_eq!(qcow2_backing_file(&layer), None);
    }

    #[test]
    fn marking_a_file_used_moves_its_time_to_now() {
        let tmp = tempfile::tempdir().unwrap();
        let long_ago = SystemTime::now() - DAY * 7;
        let path = file_used(tmp.path(), "initramfs-a.cpio", long_ago);
        mark_used(&path);
        let used = fs::metadata(&path).unwrap().modified().unwrap();
        assert!(used > long_ago + DAY * 6);
    }
}
