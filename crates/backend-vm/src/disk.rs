//! The guest's root disk: a read-only ext4 base made from the image's rootfs with
//! `mke2fs -d` at the sandbox's disk size (cached by the image's content id and that size, or
//! for an image without one by a walk of its files), and per sandbox a qcow2 layer over it of
//! the same virtual size.
//!
//! The base is made at the disk's final size rather than small and grown by the guest: an
//! online resize at every boot rewrote group descriptors, bitmaps and the new groups' inode
//! tables before the agent could start, a long wait under TCG. A base per size costs
//! one `mke2fs -d` per image and size, and the image's bytes once per size in the cache (the
//! file is sparse: the free space costs nothing).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cache::{self, Key};
use crate::error::{Result, VmError};

/// Bump when the base image's making changes.
const FORMAT: &str = "dynocap-base-ext4-2";
/// Bump when the empty layer's making changes.
const LAYER_FORMAT: &str = "dynocap-layer-qcow2-1";

/// The base's block size: 4 KiB whatever the size (mke2fs would pick 1 KiB blocks below
/// 512 MiB, which quadruples the metadata and the work of every later resize).
const BLOCK: u64 = 4096;

/// Bytes per inode, mke2fs' default for ordinary filesystems.
const BYTES_PER_INODE: u64 = 16_384;

/// The base disk for `rootfs` on a disk of `disk_bytes`, building it if needed.
///
/// `image_id`: the image's content id (a built image's; it is immutable once built, so the id
/// names its content). The key is then the id and the size, and a base built before is found
/// without touching the rootfs: walking a Debian image's ~18,000 files on every boot cost
/// tens of milliseconds. Without an id the key covers the size and every entry's path, type,
/// mode, owner, size, mtime and link target (the content without reading every byte).
pub fn base_image(
    cache_dir: &Path,
    rootfs: &Path,
    image_id: Option<&str>,
    disk_bytes: u64,
) -> Result<PathBuf> {
    let mut key;
    let summary = match image_id {
        Some(id) => {
            key = Key::new(&format!("{FORMAT} by image id"));
            key.add(id.as_bytes()).add(&disk_bytes.to_le_bytes());
            None
        }
        None => {
            key = Key::new(FORMAT);
            key.add(&disk_bytes.to_le_bytes());
            Some(walk(rootfs, Some(&mut key))?)
        }
    };
    let name = format!("base-{}.ext4", key.hex());
    let found = cache_dir.join(&name);
    if found.is_file() {
        return Ok(found);
    }
    // To be built: the walk gives the room the files need (done already without an id).
    let summary = match summary {
        Some(summary) => summary,
        None => walk(rootfs, None)?,
    };
    let fs_bytes = disk_bytes - disk_bytes % BLOCK;
    if summary.bytes >= fs_bytes {
        return Err(VmError::InvalidSpec(format!(
            "the image's files take about {} MiB, more than the {} MiB disk; ask for a larger \
             disk",
            summary.bytes >> 20,
            disk_bytes >> 20
        )));
    }
    cache::get_or_build(cache_dir, &name, |temp| {
        make_ext4(rootfs, temp, &summary, fs_bytes)?;
        fs::set_permissions(temp, fs::Permissions::from_mode(0o444))
            .map_err(|err| VmError::io("making read-only", temp, err))
    })
}

/// What the base needs room for.
#[derive(Debug, Default)]
struct Summary {
    bytes: u64,
    entries: u64,
}

/// The room `rootfs`' files need, and with `key` their identities added to it.
fn walk(rootfs: &Path, mut key: Option<&mut Key>) -> Result<Summary> {
    let mut summary = Summary::default();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = rootfs.join(&rel);
        let mut entries: Vec<_> = fs::read_dir(&dir)
            .map_err(|err| VmError::io("listing the image", &dir, err))?
            .collect::<std::io::Result<_>>()
            .map_err(|err| VmError::io("listing the image", &dir, err))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let rel = rel.join(entry.file_name());
            let meta = fs::symlink_metadata(entry.path())
                .map_err(|err| VmError::io("reading the image", &entry.path(), err))?;
            if let Some(key) = key.as_deref_mut() {
                key.add(rel.as_os_str().as_encoded_bytes());
                key.add(&meta.mode().to_le_bytes())
                    .add(&meta.uid().to_le_bytes())
                    .add(&meta.gid().to_le_bytes())
                    .add(&meta.size().to_le_bytes())
                    .add(&meta.mtime().to_le_bytes())
                    .add(&meta.mtime_nsec().to_le_bytes());
                if meta.file_type().is_symlink() {
                    let target = fs::read_link(entry.path())
                        .map_err(|err| VmError::io("reading the link", &entry.path(), err))?;
                    key.add(target.as_os_str().as_encoded_bytes());
                }
            }
            if meta.is_dir() {
                stack.push(rel);
            }
            // Blocks, not length: sparse files and rounding both count as they will in ext4.
            summary.bytes += meta.blocks() * 512 + 4096;
            summary.entries += 1;
        }
    }
    Ok(summary)
}

/// Formats `target`, a file that does not exist yet, as an ext4 of `fs_bytes` holding
/// `rootfs`.
fn make_ext4(rootfs: &Path, target: &Path, summary: &Summary, fs_bytes: u64) -> Result<()> {
    // The ordinary density, but never fewer inodes than the image needs plus room to work.
    let inodes = (fs_bytes / BYTES_PER_INODE).max(summary.entries + summary.entries / 5 + 16_384);
    let run = |extended: &str| {
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-L", "dynocap-root"])
            .args(["-b", &BLOCK.to_string(), "-N", &inodes.to_string()])
            .args(["-E", extended, "-d"])
            .arg(rootfs)
            .arg(target)
            .arg(format!("{}k", fs_bytes / 1024))
            .output()
            .map_err(|err| {
                VmError::Unavailable(format!(
                    "cannot run mke2fs ({err}); install e2fsprogs (apt-get install e2fsprogs)"
                ))
            })
    };
    // mke2fs creates `target` as a sparse file: it reads as zeros, so the inode tables need
    // no zeroing, neither now nor by the guest kernel's lazy-init thread after every boot
    // (which would write them into each sandbox's layer). e2fsprogs before 1.47 does not know
    // the option; it then leaves the zeroing to the guest, which is slower but correct.
    let mut output = run("root_owner=0:0,assume_storage_prezeroed=1")?;
    if !output.status.success()
        && String::from_utf8_lossy(&output.stderr).contains("assume_storage_prezeroed")
    {
        let _ = fs::remove_file(target);
        output = run("root_owner=0:0")?;
    }
    if !output.status.success() {
        return Err(tool_error("mke2fs", &output));
    }
    Ok(())
}

/// Creates the sandbox's layer over `base`, `bytes` big (its virtual size), as a copy of an
/// empty layer cached in `cache_dir` for that base and size. An empty qcow2 layer is the same
/// bytes every time (its header names the backing file and the size; nothing in it is unique),
/// so `qemu-img create` runs once per base and size instead of at every boot, where its
/// process start was on the boot's critical path.
pub fn create_layer(cache_dir: &Path, base: &Path, layer: &Path, bytes: u64) -> Result<()> {
    let base = base
        .canonicalize()
        .map_err(|err| VmError::io("resolving the base disk", base, err))?;
    let mut key = Key::new(LAYER_FORMAT);
    key.add(base.as_os_str().as_encoded_bytes())
        .add(&bytes.to_le_bytes());
    let name = format!("layer-{}.qcow2", key.hex());
    let empty = cache::get_or_build(cache_dir, &name, |temp| qemu_img_create(&base, temp, bytes))?;
    fs::copy(&empty, layer)
        .map(drop)
        .map_err(|err| VmError::io("copying the empty layer to", layer, err))
}

/// `qemu-img create` of a qcow2 `layer` over the raw `base`, `bytes` big.
fn qemu_img_create(base: &Path, layer: &Path, bytes: u64) -> Result<()> {
    let mut backing = String::from("backing_file=");
    // qemu-img's -o values separate options with commas; a comma in a path is doubled.
    backing.push_str(&base.to_string_lossy().replace(',', ",,"));
    backing.push_str(",backing_fmt=raw");
    create_qcow2(&["-o".as_ref(), backing.as_ref()], layer, bytes)
}

/// `qemu-img create -q -f qcow2 OPTIONS FILE BYTES`: a new qcow2 `file` of `bytes` (virtual);
/// a failure removes what it left at `file`.
pub(crate) fn create_qcow2(options: &[&std::ffi::OsStr], file: &Path, bytes: u64) -> Result<()> {
    let output = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .args(options)
        .arg(file)
        .arg(bytes.to_string())
        .output()
        .map_err(|err| {
            VmError::Unavailable(format!(
                "cannot run qemu-img ({err}); install qemu-utils (apt-get install qemu-utils)"
            ))
        })?;
    if !output.status.success() {
        let _ = fs::remove_file(file);
        return Err(tool_error("qemu-img create", &output));
    }
    Ok(())
}

fn tool_error(tool: &str, output: &std::process::Output) -> VmError {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
    VmError::Tool {
        tool: tool.into(),
        status: output.status.to_string(),
        stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have(tool: &str) -> bool {
        Command::new(tool).arg("--help").output().is_ok()
    }

    /// A temporary directory holding a one-file rootfs (`root`) and the cache path, or `None`
    /// (after saying why) without mke2fs.
    fn tiny_rootfs() -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
        if !have("mke2fs") {
            eprintln!("SKIP: mke2fs is not installed (apt-get install e2fsprogs)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/hostname"), b"x").unwrap();
        let cache = dir.path().join("cache");
        Some((dir, root, cache))
    }

    #[test]
    fn the_key_follows_content_and_size_and_the_base_fills_the_disk() {
        let Some((dir, root, cache)) = tiny_rootfs() else {
            return;
        };
        std::os::unix::fs::symlink("etc", root.join("link")).unwrap();
        // Not a multiple of the block size: the filesystem stops at the last whole block.
        let size = (64 << 20) + 1000;
        let first = base_image(&cache, &root, None, size).unwrap();
        assert_eq!(base_image(&cache, &root, None, size).unwrap(), first);
        assert_eq!(fs::metadata(&first).unwrap().mode() & 0o777, 0o444);
        assert_eq!(fs::metadata(&first).unwrap().len(), 64 << 20);
        // Sparse: the free space takes no room in the cache.
        assert!(fs::metadata(&first).unwrap().blocks() * 512 < 32 << 20);
        assert_ne!(base_image(&cache, &root, None, 128 << 20).unwrap(), first);
        fs::write(root.join("etc/hostname"), b"yy").unwrap();
        assert_ne!(base_image(&cache, &root, None, size).unwrap(), first);
        if have("dumpe2fs") {
            let out = Command::new("dumpe2fs")
                .arg("-h")
                .arg(&first)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let field = |name: &str| -> String {
                text.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_else(|| panic!("{name} missing in {text}"))
                    .trim()
                    .to_owned()
            };
            assert_eq!(field("Block size:"), "4096");
            assert_eq!(field("Block count:"), (16_384).to_string());
        }
        if have("qemu-img") {
            let layer = dir.path().join("layer.qcow2");
            create_layer(&cache, &first, &layer, 64 << 20).unwrap();
            // A second layer is a copy of the same cached empty layer, and its own file.
            let second = dir.path().join("second.qcow2");
            create_layer(&cache, &first, &second, 64 << 20).unwrap();
            assert_eq!(fs::read(&layer).unwrap(), fs::read(&second).unwrap());
            fs::write(&second, b"changed").unwrap();
            assert_ne!(fs::read(&layer).unwrap(), fs::read(&second).unwrap());
            let info = Command::new("qemu-img")
                .args(["info", "--output=json"])
                .arg(&layer)
                .output()
                .unwrap();
            let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
            assert_eq!(info["virtual-size"], 64_u64 << 20);
            assert_eq!(info["backing-filename-format"], "raw");
            // The cache's pruning finds the base through the layer's header.
            let named = crate::cache_gc::qcow2_backing_file(&layer).expect("a backing file");
            assert_eq!(named.canonicalize().unwrap(), first.canonicalize().unwrap());
        }
    }

    /// With a content id the key is the id and the size: a built base is found again without
    /// the rootfs (the walk is only for building), and another id or size is another base.
    #[test]
    fn a_base_keyed_by_image_id_is_found_without_walking() {
        let Some((_dir, root, cache)) = tiny_rootfs() else {
            return;
        };
        let size = 64 << 20;
        let first = base_image(&cache, &root, Some("id-1"), size).unwrap();
        let by_walk = base_image(&cache, &root, None, size).unwrap();
        assert_ne!(first, by_walk, "an id and a walk key differently");
        let second = base_image(&cache, &root, Some("id-1"), 128 << 20).unwrap();
        assert_ne!(first, second, "the size is in the key");
        let third = base_image(&cache, &root, Some("id-2"), size).unwrap();
        assert_ne!(first, third, "the id is in the key");
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            base_image(&cache, &root, Some("id-1"), size).unwrap(),
            first,
            "found without the rootfs"
        );
        // A base not built yet needs the rootfs: the walk runs, and says what is missing.
        let err = base_image(&cache, &root, Some("id-3"), size)
            .unwrap_err()
            .to_string();
        assert!(err.contains("listing the image"), "{err}");
    }

    #[test]
    fn an_image_larger_than_the_disk_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("big"), vec![1_u8; 2 << 20]).unwrap();
        let err = base_image(&dir.path().join("cache"), &root, Some("id"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(err.contains("larger"), "{err}");
        assert!(!dir.path().join("cache").exists(), "nothing was built");
    }
}
