//! OCI images the end-to-end tests make themselves, for `dynocap image import`, `image pull`
//! (pushed to a test registry) and the bases of image recipes: layer tars written header by
//! header (names raw, so hostile ones get through), a static busybox root to start layers
//! from, and OCI image layouts (blobs by digest, config, manifests, `index.json`).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The static busybox of Debian's busybox-static (scripts/install-deps.sh installs it).
pub fn busybox_path() -> Option<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The static busybox, or `None` after saying why `test` skips; in CI a missing one fails.
pub fn require_busybox(test: &str) -> Option<PathBuf> {
    let found = busybox_path();
    if found.is_none() {
        if std::env::var_os("CI").is_some() {
            panic!("{test}: needs busybox-static, and CI must have it");
        }
        eprintln!("SKIPPED {test}: needs busybox-static (apt-get install busybox-static)");
    }
    found
}

/// Lowercase hex SHA-256 of `data`: a blob's name in `blobs/sha256/`.
pub fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).expect("gzip");
    enc.finish().expect("gzip")
}

/// A layer tar written header by header, names raw so hostile ones get through.
pub struct Layer(tar::Builder<Vec<u8>>);

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    pub fn new() -> Layer {
        Layer(tar::Builder::new(Vec::new()))
    }

    /// A root of `bin/busybox` (read from `busybox`) and a minimal /etc (root's passwd and
    /// group lines); the caller adds its files and [`Layer::applets`].
    pub fn busybox_root(busybox: &Path) -> Layer {
        Layer::new()
            .dir("bin")
            .entry(
                tar::EntryType::Regular,
                "bin/busybox",
                "",
                0o755,
                &std::fs::read(busybox).expect("read busybox"),
            )
            .dir("etc")
            .file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
            .file("etc/group", "root:x:0:\n")
    }

    pub fn entry(
        mut self,
        kind: tar::EntryType,
        path: &str,
        link: &str,
        mode: u32,
        data: &[u8],
    ) -> Self {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        if !link.is_empty() {
            header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        self.0.append(&header, data).expect("append");
        self
    }

    pub fn dir(self, path: &str) -> Self {
        self.entry(tar::EntryType::Directory, path, "", 0o755, b"")
    }

    pub fn file(self, path: &str, data: &str) -> Self {
        self.entry(tar::EntryType::Regular, path, "", 0o644, data.as_bytes())
    }

    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.entry(tar::EntryType::Symlink, path, target, 0o777, b"")
    }

    /// `bin/<applet>` links to busybox for each of `applets`.
    pub fn applets(self, applets: &[&str]) -> Self {
        applets.iter().fold(self, |layer, applet| {
            layer.symlink(&format!("bin/{applet}"), "busybox")
        })
    }

    pub fn bytes(self) -> Vec<u8> {
        self.0.into_inner().expect("tar")
    }
}

/// A layer of `levels` nested directories `d/d/…`, each listed, and a file `f` in the
/// deepest; names longer than a header holds go in GNU long-name entries, as tar writes them.
pub fn nested_layer(levels: usize) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut append = |kind: tar::EntryType, path: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
        header.set_size(data.len() as u64);
        header.set_mtime(1_700_000_000);
        tar.append_data(&mut header, path, data).expect("append");
    };
    let mut path = String::new();
    for _ in 0..levels {
        if !path.is_empty() {
            path.push('/');
        }
        path.push('d');
        append(tar::EntryType::Directory, &path, b"");
    }
    append(tar::EntryType::Regular, &format!("{path}/f"), b"deep\n");
    tar.into_inner().expect("tar")
}

/// A layer of one regular file `name` whose header claims `size` bytes while the layer holds
/// 1 KiB after it: a bomb that only its header makes large.
pub fn huge_header_layer(name: &str, size: u64) -> Vec<u8> {
    let mut header = tar::Header::new_gnu();
    header.set_path(name).expect("name");
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(size);
    header.set_cksum();
    let mut tar = header.as_bytes().to_vec();
    tar.extend([0u8; 1024]);
    tar
}

/// A layer of one GNU sparse file (type `S`) `name` that is `real` bytes long, all of it a
/// hole but its last 512 bytes: 2.5 KiB of tar for any size.
pub fn sparse_gnu_layer(name: &str, real: u64) -> Vec<u8> {
    let mut header = tar::Header::new_gnu();
    header.set_path(name).expect("name");
    header.set_entry_type(tar::EntryType::GNUSparse);
    header.set_mode(0o644);
    header.set_size(512);
    let gnu = header.as_gnu_mut().expect("gnu");
    gnu.set_real_size(real);
    gnu.sparse[0].set_offset(real - 512);
    gnu.sparse[0].set_length(512);
    header.set_cksum();
    let mut tar = header.as_bytes().to_vec();
    tar.extend([b'x'; 512]);
    tar.extend([0u8; 1024]);
    tar
}

/// The same file in GNU tar's PAX 1.0 form (what `tar --sparse --format=posix` writes):
/// `GNU.sparse.*` keys giving its name and real size, then a regular entry
/// `GNUSparseFile.0/NAME` holding the sparse map and the stored bytes.
pub fn sparse_pax_layer(name: &str, real: u64) -> Vec<u8> {
    let mut records = Vec::new();
    for (key, value) in [
        ("GNU.sparse.major", "1".to_owned()),
        ("GNU.sparse.minor", "0".to_owned()),
        ("GNU.sparse.name", name.to_owned()),
        ("GNU.sparse.realsize", real.to_string()),
    ] {
        // A record is "LEN KEY=VALUE\n", LEN counting itself.
        let rest = format!(" {key}={value}\n");
        let mut len = rest.len() + 1;
        while len.to_string().len() + rest.len() != len {
            len += 1;
        }
        records.extend(format!("{len}{rest}").into_bytes());
    }
    let padded = |data: &[u8]| {
        let mut out = data.to_vec();
        out.resize(data.len().div_ceil(512) * 512, 0);
        out
    };
    let header = |path: &str, kind: tar::EntryType, size: usize| {
        let mut header = tar::Header::new_ustar();
        header.set_path(path).expect("path");
        header.set_entry_type(kind);
        header.set_mode(0o644);
        header.set_size(size as u64);
        header.set_cksum();
        header.as_bytes().to_vec()
    };
    let map = padded(format!("1\n{}\n512\n", real - 512).as_bytes());
    let mut tar = header(
        &format!("PaxHeaders.0/{name}"),
        tar::EntryType::XHeader,
        records.len(),
    );
    tar.extend(padded(&records));
    tar.extend(header(
        &format!("GNUSparseFile.0/{name}"),
        tar::EntryType::Regular,
        map.len() + 512,
    ));
    tar.extend(map);
    tar.extend([b'x'; 512]);
    tar.extend([0u8; 1024]);
    tar
}

/// A layer of an OCI layout: its tar, gzip or not, and its media type (defaulted from that).
pub struct OciLayer {
    pub tar: Vec<u8>,
    pub gzip: bool,
    pub media_type: Option<&'static str>,
}

pub fn oci_layer(tar: Vec<u8>, gzip: bool) -> OciLayer {
    OciLayer {
        tar,
        gzip,
        media_type: None,
    }
}

/// An image config blob for `arch`: `run_config` (Env, Cmd, WorkingDir...) and the layers'
/// uncompressed digests `diff_ids` (hex).
pub fn image_config(arch: &str, run_config: Value, diff_ids: &[String]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "architecture": arch,
        "os": "linux",
        "config": run_config,
        "rootfs": {
            "type": "layers",
            "diff_ids": diff_ids.iter().map(|d| format!("sha256:{d}")).collect::<Vec<_>>(),
        },
    }))
    .expect("json")
}

/// An image manifest written into a [`Layout`].
pub struct Manifest {
    /// Its descriptor (with its platform), for an index.
    pub descriptor: Value,
    /// The digests (hex) of its layers' blobs, in order.
    pub layer_digests: Vec<String>,
}

/// An OCI layout being written: blobs by digest, then `index.json`.
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: &Path) -> Layout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).expect("mkdir");
        std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("write");
        Layout {
            dir: dir.to_owned(),
        }
    }

    /// Stores `data` as a blob; returns its digest (hex).
    pub fn put(&self, data: &[u8]) -> String {
        let hex = sha256(data);
        std::fs::write(self.dir.join("blobs/sha256").join(&hex), data).expect("write blob");
        hex
    }

    /// An image manifest of `layers` for `arch` with `run_config` as its config's `config`.
    pub fn manifest(&self, layers: &[OciLayer], arch: &str, run_config: Value) -> Manifest {
        let diff_ids: Vec<String> = layers.iter().map(|l| sha256(&l.tar)).collect();
        let mut descriptors = Vec::new();
        let mut layer_digests = Vec::new();
        for layer in layers {
            let blob = if layer.gzip {
                gzip(&layer.tar)
            } else {
                layer.tar.clone()
            };
            let hex = self.put(&blob);
            let media_type = layer.media_type.unwrap_or(if layer.gzip {
                "application/vnd.oci.image.layer.v1.tar+gzip"
            } else {
                "application/vnd.oci.image.layer.v1.tar"
            });
            descriptors.push(
                json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": blob.len()}),
            );
            layer_digests.push(hex);
        }
        let config = image_config(arch, run_config, &diff_ids);
        let config_hex = self.put(&config);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": format!("sha256:{config_hex}"), "size": config.len()},
            "layers": descriptors,
        }))
        .expect("json");
        let hex = self.put(&manifest);
        Manifest {
            descriptor: json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "digest": format!("sha256:{hex}"), "size": manifest.len(),
                               "platform": {"architecture": arch, "os": "linux"}}),
            layer_digests,
        }
    }

    /// Writes `index.json` listing `manifests` (descriptors).
    pub fn index(&self, manifests: Vec<Value>) {
        std::fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests})).expect("json"),
        )
        .expect("write index");
    }

    /// A layout at `dir` of one amd64 image of `layers` with `run_config`; returns it and its
    /// layers' blob digests.
    pub fn image(dir: &Path, layers: &[OciLayer], run_config: Value) -> (Layout, Vec<String>) {
        let layout = Layout::new(dir);
        let manifest = layout.manifest(layers, "amd64", run_config);
        layout.index(vec![manifest.descriptor]);
        (layout, manifest.layer_digests)
    }
}
