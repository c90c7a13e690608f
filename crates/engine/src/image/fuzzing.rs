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

    /// One entry: its type, name and link target (written raw), mode and content.
    type Entry<'a> = (tar::EntryType, &'a [u8], &'a [u8], u32, &'a [u8]);

    /// A tar of `entries`.
    fn layer(entries: &[Entry<'_>]) -> Vec<u8> {
        let mut out = tar::Builder::new(Vec::new());
        for (kind, name, link, mode, content) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(*mode);
            header.set_size(content.len() as u64);
            header.as_old_mut().name[..name.len()].copy_from_slice(name);
            if !link.is_empty() {
                header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
            }
            header.set_cksum();
            out.append(&header, *content).expect("append");
        }
        out.into_inner().expect("tar")
    }

    #[test]
    fn hostile_layers_and_their_prefixes_leave_nothing_outside() {
        use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular, Symlink};
        let layers = [
            layer(&[(Regular, b"../escape", b"", 0o644, b"x")]),
            layer(&[(Regular, b"/abs", b"", 0o644, b"x")]),
            layer(&[
                (Symlink, b"d", b"../outside", 0o777, b""),
                (Regular, b"d/x", b"", 0o644, b"x"),
            ]),
            layer(&[
                (Symlink, b"up", b"/", 0o777, b""),
                (Directory, b"up/etc", b"", 0o755, b""),
                (Link, b"h", b"up/etc/passwd", 0o644, b""),
            ]),
            layer(&[(Regular, b".wh...", b"", 0o644, b"")]),
            layer(&[(Regular, b"a/.wh..wh..opq", b"", 0o644, b"")]),
            layer(&[
                (Char, b"null", b"", 0o666, b""),
                (Block, b"sda", b"", 0o660, b""),
                (Fifo, b"pipe", b"", 0o644, b""),
            ]),
            layer(&[
                (Regular, b"suid", b"", 0o4755, b"#!/bin/sh\n"),
                (Directory, b"sgid", b"", 0o2775, b""),
            ]),
            layer(&[
                (Regular, b"f", b"", 0o644, b"one"),
                (Link, b"g", b"f", 0o644, b""),
                (Link, b"k", b"../../etc/shadow", 0o644, b""),
                (Regular, b".wh.f", b"", 0o644, b""),
            ]),
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
