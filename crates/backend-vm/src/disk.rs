//! The guest's root disk: a read-only ext4 base made from the image's rootfs with
//! `mke2fs -d` (cached by the rootfs' content), and per sandbox a qcow2 layer over it whose
//! virtual size is the sandbox's disk limit (the guest grows its ext4 to fill it at boot).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cache::{self, Key};
use crate::error::{Result, VmError};

/// Bump when the base image's making changes.
const FORMAT: &str = "dynocap-base-ext4-1";

/// Free room in the base beyond the rootfs' content, for ext4's own metadata (the sandbox's
/// room comes from the layer's size).
const BASE_SLACK: u64 = 64 << 20;

/// The base disk for `rootfs`, building it if needed. The key covers every entry's path,
/// type, mode, owner, size, mtime and link target: images are immutable once built, so this
/// is their content without reading every byte.
pub fn base_image(cache_dir: &Path, rootfs: &Path) -> Result<PathBuf> {
    let mut key = Key::new(FORMAT);
    let summary = walk(rootfs, &mut key)?;
    let name = format!("base-{}.ext4", key.hex());
    cache::get_or_build(cache_dir, &name, |temp| {
        make_ext4(rootfs, temp, &summary)?;
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

fn walk(rootfs: &Path, key: &mut Key) -> Result<Summary> {
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
            } else if meta.is_dir() {
                stack.push(rel);
            }
            // Blocks, not length: sparse files and rounding both count as they will in ext4.
            summary.bytes += meta.blocks() * 512 + 4096;
            summary.entries += 1;
        }
    }
    Ok(summary)
}

fn make_ext4(rootfs: &Path, target: &Path, summary: &Summary) -> Result<()> {
    let bytes = summary.bytes + summary.bytes / 5 + BASE_SLACK;
    let inodes = summary.entries + summary.entries / 5 + 16_384;
    let kib = bytes.div_ceil(1024);
    let output = Command::new("mke2fs")
        .args([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-L",
            "dynocap-root",
            "-E",
            "root_owner=0:0",
        ])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-d")
        .arg(rootfs)
        .arg(target)
        .arg(format!("{kib}k"))
        .output()
        .map_err(|err| {
            VmError::Unavailable(format!(
                "cannot run mke2fs ({err}); install e2fsprogs (apt-get install e2fsprogs)"
            ))
        })?;
    if !output.status.success() {
        return Err(tool_error("mke2fs", &output));
    }
    Ok(())
}

/// Creates the sandbox's layer over `base`, `bytes` big (its virtual size).
pub fn create_layer(base: &Path, layer: &Path, bytes: u64) -> Result<()> {
    let base = base
        .canonicalize()
        .map_err(|err| VmError::io("resolving the base disk", base, err))?;
    let mut backing = String::from("backing_file=");
    // qemu-img's -o values separate options with commas; a comma in a path is doubled.
    backing.push_str(&base.to_string_lossy().replace(',', ",,"));
    backing.push_str(",backing_fmt=raw");
    let output = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-o"])
        .arg(backing)
        .arg(layer)
        .arg(bytes.to_string())
        .output()
        .map_err(|err| {
            VmError::Unavailable(format!(
                "cannot run qemu-img ({err}); install qemu-utils (apt-get install qemu-utils)"
            ))
        })?;
    if !output.status.success() {
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

    #[test]
    fn the_key_follows_content_and_the_base_is_built_once() {
        if !have("mke2fs") {
            eprintln!("SKIP: mke2fs is not installed (apt-get install e2fsprogs)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/hostname"), b"x").unwrap();
        std::os::unix::fs::symlink("etc", root.join("link")).unwrap();
        let cache = dir.path().join("cache");
        let first = base_image(&cache, &root).unwrap();
        assert_eq!(base_image(&cache, &root).unwrap(), first);
        assert_eq!(fs::metadata(&first).unwrap().mode() & 0o777, 0o444);
        fs::write(root.join("etc/hostname"), b"yy").unwrap();
        assert_ne!(base_image(&cache, &root).unwrap(), first);
        if have("qemu-img") {
            let layer = dir.path().join("layer.qcow2");
            create_layer(&first, &layer, 1 << 30).unwrap();
            let info = Command::new("qemu-img")
                .args(["info", "--output=json"])
                .arg(&layer)
                .output()
                .unwrap();
            let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
            assert_eq!(info["virtual-size"], 1_u64 << 30);
            assert_eq!(info["backing-filename-format"], "raw");
        }
    }
}
