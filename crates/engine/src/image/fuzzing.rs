//! The body of the `oci_layer` fuzz target (`crates/engine/fuzz`), which the unit tests below
//! also run over generated hostile layers: a container image's layer and its JSON are hostile
//! input (see [`super::unpack`]), so whatever the bytes, reading them ends in `Ok` or an
//! error, never a panic, and an unpacked layer leaves nothing outside the root and nothing the
//! import promises not to make (device nodes, fifos, set-id bits).

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use super::oci;
use super::unpack::{Limits, Root};

/// Small bounds: a fuzz input never needs more, and a bomb is cut short.
const LIMITS: Limits = Limits {
    max_bytes: 1 << 20,
    max_files: 1000,
};

/// Reads `data` as each JSON document of an image and as a layer's names, then unpacks it as
/// a layer twice over (the second time over what the first left, as an upper layer does)
/// into `scratch/root`, and checks what is there. `scratch` must be an empty directory of
/// this process's own.
pub fn oci_layer(scratch: &Path, data: &[u8]) {
    let _ = oci::parse_json::<oci::Index>(data, "index");
    let _ = oci::parse_json::<oci::Manifest>(data, "manifest");
    let _ = oci::parse_json::<oci::ImageConfig>(data, "config");
    let _ = oci::parse_json::<Vec<oci::DockerEntry>>(data, "manifest.json");
    let text = String::from_utf8_lossy(data);
    let _ = oci::Digest::parse(&text);
    let _ = oci::member_path(&text);
    if let Ok(parts) = oci::entry_components(data) {
        for part in parts {
            assert!(
                !part.is_empty() && part != b"." && part != b".." && !part.contains(&0),
                "an accepted name has the component {part:?}"
            );
        }
    }
    let _ = oci::classify(data);

    let root = scratch.join("root");
    let outside = scratch.join("outside");
    fs::create_dir(&root).expect("making the fuzz root");
    fs::create_dir(&outside).expect("making the canary directory");
    if let Ok(mut unpacking) = Root::open(&root, LIMITS) {
        for _ in 0..2 {
            let _ = unpacking.apply_layer(data, &|| Ok(()));
        }
    }
    let beside: Vec<_> = fs::read_dir(scratch)
        .expect("reading the scratch directory")
        .flatten()
        .map(|entry| entry.file_name())
        .collect();
    assert_eq!(
        beside.len(),
        2,
        "something was made beside the root: {beside:?}"
    );
    assert!(
        fs::read_dir(&outside)
            .expect("reading the canary")
            .next()
            .is_none(),
        "something was made outside the root"
    );
    check_tree(&root);
    fs::remove_dir_all(&root).expect("removing the fuzz root");
    fs::remove_dir(&outside).expect("removing the canary");
}

/// Every entry under `dir` is a directory, a regular file or a symlink, with no set-id bit.
fn check_tree(dir: &Path) {
    for entry in fs::read_dir(dir)
        .expect("reading the unpacked tree")
        .flatten()
    {
        let meta = fs::symlink_metadata(entry.path()).expect("an unpacked entry");
        let kind = meta.file_type();
        assert!(
            !(kind.is_block_device()
                || kind.is_char_device()
                || kind.is_fifo()
                || kind.is_socket()),
            "{:?} is a device, fifo or socket",
            entry.path()
        );
        assert_eq!(
            meta.permissions().mode() & 0o6000,
            0,
            "{:?} kept a set-id bit",
            entry.path()
        );
        if kind.is_dir() {
            check_tree(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::unpack::tests::Layer;

    #[test]
    fn hostile_layers_and_their_prefixes_leave_nothing_outside() {
        use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular, Symlink};
        let layers = [
            Layer::new()
                .entry(Regular, "../escape", "", 0o644, b"x")
                .bytes(),
            Layer::new().entry(Regular, "/abs", "", 0o644, b"x").bytes(),
            Layer::new()
                .entry(Symlink, "d", "../outside", 0o777, b"")
                .entry(Regular, "d/x", "", 0o644, b"x")
                .bytes(),
            Layer::new()
                .entry(Symlink, "up", "/", 0o777, b"")
                .entry(Directory, "up/etc", "", 0o755, b"")
                .entry(Link, "h", "up/etc/passwd", 0o644, b"")
                .bytes(),
            Layer::new()
                .entry(Regular, ".wh...", "", 0o644, b"")
                .bytes(),
            Layer::new()
                .entry(Regular, "a/.wh..wh..opq", "", 0o644, b"")
                .bytes(),
            Layer::new()
                .entry(Char, "null", "", 0o666, b"")
                .entry(Block, "sda", "", 0o660, b"")
                .entry(Fifo, "pipe", "", 0o644, b"")
                .bytes(),
            Layer::new()
                .entry(Regular, "suid", "", 0o4755, b"#!/bin/sh\n")
                .entry(Directory, "sgid", "", 0o2775, b"")
                .bytes(),
            Layer::new()
                .entry(Regular, "f", "", 0o644, b"one")
                .entry(Link, "g", "f", 0o644, b"")
                .entry(Link, "k", "../../etc/shadow", 0o644, b"")
                .entry(Regular, ".wh.f", "", 0o644, b"")
                .bytes(),
        ];
        for bytes in &layers {
            // The whole layer, and cut at every header boundary and inside one.
            let cuts = (0..=bytes.len()).step_by(256).chain([bytes.len()]);
            for cut in cuts {
                let scratch = tempfile::tempdir().expect("scratch");
                oci_layer(scratch.path(), &bytes[..cut]);
            }
        }
        // JSON documents and names alone.
        for text in [
            &b"{\"manifests\":[{\"digest\":\"sha256:00\",\"size\":-1}]}"[..],
            b"[{\"Config\":\"../x\",\"Layers\":[\"/etc/passwd\"]}]",
            b"sha256:../../etc",
            b"a/\0/b",
        ] {
            let scratch = tempfile::tempdir().expect("scratch");
            oci_layer(scratch.path(), text);
        }
    }
}
