//! `dynocap image import PATH`: an OCI image layout directory or a `docker save` archive
//! (classic, or the OCI layout newer Docker writes inside the tar) made into an image of the
//! store, exactly as a build is: unpacked into `images/<name>/.tmp-*` under the build lock,
//! customised for DynoCap, and installed by one atomic rename, so an import that fails or is
//! killed leaves nothing listed (the next import or build removes its leftovers).
//!
//! Every blob is checked against its digest while it is read; layers are unpacked by
//! [`unpack`], which treats them as hostile, into staging directories of the shared [`layers`]
//! store (each layer once, by its diff id), and the image's rootfs is assembled from them by
//! hard links. One `syncfs` then covers the layers and the image before the renames that
//! install them, as a pull's does; the layers of an import that fails go in all the same.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, Mode};
use sha2::{Digest as _, Sha256};

use super::build::{remove_dead_builds, BuildLock, Staging};
use super::failure::ImageFailure;
use super::layers::{Layer, LayerStore, StagedLayer, Unpacked};
use super::oci::{self, Compression, ContainerConfig, Digest};
use super::sandbox_user::{SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID};
use super::store::{tree_size, BuiltImage, ImageMeta, ImageSource, ImageStore, META_FILE};
use super::unpack::{remove_tree, Hashing, Limits, Root, Stats};
use crate::foundation::error::{Context, Error, Result};
use crate::foundation::failpoint;

/// Bump when the import's customisation changes: the same image imported again then makes a
/// new id instead of reusing an old result.
const IMPORT_REVISION: &str = "1";

/// A finished import.
#[derive(Debug, Clone)]
pub struct Imported {
    pub image: BuiltImage,
    /// The store had this very image already (same name and config digest).
    pub present: bool,
    /// What the layers held and what was left out (zero when `present`).
    pub stats: Stats,
}

/// Imports the image at `path` as `name` (default: from the file's name).
pub fn import(
    store: &ImageStore,
    path: &Path,
    name: Option<&str>,
    limits: Limits,
    progress: &dyn Fn(&str),
    cancel: &AtomicBool,
) -> Result<Imported> {
    let path =
        std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))?;
    let name = match name {
        Some(name) => name.to_owned(),
        None => oci::default_name(
            &path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
    };
    if let Some(why) = super::store::unfit_name(&name) {
        return Err(Error::invalid(format!(
            "\"{}\" cannot name an image: {why}; give another with --name, e.g. --name mytool",
            oci::printable(&name)
        )));
    }
    let source = Source::open(&path)?;
    let plan = source.plan()?;
    let id = {
        let digest = Sha256::digest(
            format!(
                "dynocap-import {IMPORT_REVISION}\nname {name}\nconfig {}\n",
                plan.config_digest
            )
            .as_bytes(),
        );
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    if let Some(image) = store.get(&name, &id) {
        return Ok(Imported {
            image,
            present: true,
            stats: Stats::default(),
        });
    }
    let parent = store.dir().join(&name);
    let _lock = BuildLock::take(&parent, progress)?;
    if let Some(image) = store.get(&name, &id) {
        return Ok(Imported {
            image,
            present: true,
            stats: Stats::default(),
        });
    }
    remove_dead_builds(&parent)?;
    let staging = Staging::new(&parent)?;
    let rootfs = staging.path.join("rootfs");
    fs::create_dir(&rootfs).with_context(|| format!("creating {}", rootfs.display()))?;
    let stop = || -> Result<()> {
        if cancel.load(Ordering::SeqCst) {
            Err(Error::conflict("the import was stopped; nothing was kept"))
        } else {
            Ok(())
        }
    };
    let layer_store = LayerStore::in_images_dir(store.dir());
    let _shared = layer_store.lock_shared()?;
    layer_store.sweep_dead_unpacks();
    let mut budget = Budget::new(limits);
    let mut unpacked = Vec::new();
    let total = plan.layers.len();
    let unpacking = (|| -> Result<()> {
        for (n, layer) in plan.layers.iter().enumerate() {
            progress(&format!("layer {}/{total}: {}", n + 1, layer.digest));
            // `image.import.layer2=kill`: dies with layer 1 unpacked, mid-import.
            failpoint::hit(&format!("image.import.layer{}", n + 1))?;
            let layer = match layer_store.get(&layer.diff_id) {
                Some(present) => {
                    // Stored already (by its diff id, checked then): not read again, but the
                    // image must still hold it as a plain file of its own.
                    source.reader(&layer.member)?;
                    Unpacked::Stored(present)
                }
                None => source.stage_layer(layer, &layer_store, budget.left(), &stop)?,
            };
            budget.add(&layer.layer())?;
            unpacked.push(layer);
        }
        stop()
    })();
    if let Err(err) = unpacking {
        // The layers unpacked go in all the same, so the next import starts from them.
        keep_layers(&layer_store, unpacked);
        return Err(err);
    }
    let source = ImageSource {
        format: source.format().to_owned(),
        path: path.display().to_string(),
        manifest_digest: plan.manifest_digest.as_ref().map(Digest::to_string),
        config_digest: plan.config_digest.to_string(),
    };
    let meta = ImageMeta::layered(&name, &id, source, plan.config);
    // Staged layers are assembled from where they are staged: the rootfs hard-links their
    // files, and the links follow the inodes through the renames that install them.
    let layers: Vec<Layer> = unpacked.iter().map(Unpacked::layer).collect();
    let assembled =
        assemble_image(&layer_store, &layers, &staging.path, limits, meta).and_then(|()| stop());
    if let Err(err) = assembled {
        keep_layers(&layer_store, unpacked);
        return Err(err);
    }
    // The import's one wait for the disk: the image's files and every layer staged for it
    // (see `Staging::install` for why before the renames).
    super::build::sync_filesystem(&staging.path)?;
    layer_store.install_synced(staged_only(unpacked))?;
    let target = store.image_dir(&name, &id);
    staging.install_synced(&target)?;
    let image = store
        .get(&name, &id)
        .ok_or(ImageFailure::Unreadable { dir: target })?;
    Ok(Imported {
        image,
        present: false,
        stats: budget.stats,
    })
}

/// The layers of `unpacked` that were unpacked now, not found in the store.
fn staged_only(unpacked: Vec<Unpacked>) -> Vec<StagedLayer> {
    unpacked
        .into_iter()
        .filter_map(|layer| match layer {
            Unpacked::Staged(staged) => Some(staged),
            Unpacked::Stored(_) => None,
        })
        .collect()
}

/// Installs the layers a failed import unpacked (one sync for all), so the next import of an
/// image sharing them does not unpack them again; a failure to is only logged, as the
/// import's own error is what the user must see.
fn keep_layers(store: &LayerStore, unpacked: Vec<Unpacked>) {
    if let Err(err) = store.install(staged_only(unpacked)) {
        tracing::warn!("keeping the unpacked layers of a failed import: {err}");
    }
}

/// An image's bounds, spent layer by layer: a layer the store has already counts as much as
/// one unpacked now.
pub(super) struct Budget {
    limits: Limits,
    pub(super) stats: Stats,
}

impl Budget {
    pub(super) fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            stats: Stats::default(),
        }
    }

    /// What a layer unpacked now may still write.
    pub(super) fn left(&self) -> Limits {
        Limits {
            max_bytes: self.limits.max_bytes.saturating_sub(self.stats.bytes),
            max_files: self.limits.max_files.saturating_sub(self.stats.counted()),
        }
    }

    pub(super) fn add(&mut self, layer: &Layer) -> Result<()> {
        let s = &layer.meta.stats;
        self.stats.bytes += s.bytes;
        self.stats.files += s.files;
        self.stats.devices_skipped += s.devices_skipped;
        self.stats.setid_cleared += s.setid_cleared;
        self.stats.whiteouts += s.whiteouts;
        self.stats.implicit_dirs += s.implicit_dirs;
        if self.stats.bytes > self.limits.max_bytes {
            return Err(Error::invalid(format!(
                "the image's files add up to more than {} bytes, the bound on an image's size \
                 (--max-bytes)",
                self.limits.max_bytes
            )));
        }
        if self.stats.counted() > self.limits.max_files {
            return Err(self.stats.too_many(self.limits.max_files));
        }
        Ok(())
    }
}

/// One layer to apply: where it is and how to check it.
#[derive(Debug, Clone)]
struct LayerRef {
    member: String,
    media_type: String,
    digest: Digest,
    /// The digest of the uncompressed tar: the layer's key in the layer store.
    diff_id: Digest,
    /// OCI: the digest and size are the blob's. Docker classic: the digest is the diff id,
    /// of the uncompressed tar.
    of_blob: bool,
    size: Option<u64>,
}

/// What an image is made of, read and verified from its JSON.
#[derive(Debug)]
struct Plan {
    manifest_digest: Option<Digest>,
    config_digest: Digest,
    config: Option<ContainerConfig>,
    layers: Vec<LayerRef>,
}

/// An OCI layout directory, or a tar (its regular members' offsets and sizes).
enum Source {
    Dir(PathBuf),
    Tar {
        path: PathBuf,
        members: HashMap<String, (u64, u64)>,
    },
}

/// The member a symlink member `name` of an archive names: `target` taken relative to
/// `name`'s directory, inside the archive (an absolute target, or one whose `..` leaves the
/// archive, names none: nothing outside the archive is ever read).
fn link_member(name: &str, target: &[u8]) -> Option<String> {
    let target = std::str::from_utf8(target).ok()?;
    if target.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    oci::member_path(&parts.join("/")).ok()
}

impl Source {
    fn open(path: &Path) -> Result<Source> {
        let meta = fs::metadata(path).map_err(|err| {
            Error::invalid(format!(
                "cannot read the image at {}: {err}",
                path.display()
            ))
        })?;
        if meta.is_dir() {
            return Ok(Source::Dir(path.to_owned()));
        }
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut archive = tar::Archive::new(BufReader::new(file));
        let mut members = HashMap::new();
        let not_tar = |err: std::io::Error| {
            Error::invalid(format!(
                "{} is neither an OCI image layout directory nor a docker save tar: {err}",
                path.display()
            ))
        };
        // Symlinked members (name, target): a classic `docker save` writes a layer that
        // comes twice (the same diff id, such as the empty layer) once, and the second
        // `<id>/layer.tar` as a symlink to the first.
        let mut links = Vec::new();
        for entry in archive.entries().map_err(not_tar)? {
            let entry = entry.map_err(not_tar)?;
            let kind = entry.header().entry_type();
            if !kind.is_file() && !kind.is_symlink() {
                continue;
            }
            let Ok(name) = oci::member_path(&String::from_utf8_lossy(&entry.path_bytes())) else {
                continue;
            };
            if kind.is_symlink() {
                if let Some(target) = entry.link_name_bytes() {
                    links.push((name, target.into_owned()));
                }
                continue;
            }
            members.insert(name, (entry.raw_file_position(), entry.size()));
        }
        for (name, target) in links {
            let found = link_member(&name, &target).and_then(|t| members.get(&t).copied());
            if let Some(found) = found {
                members.entry(name).or_insert(found);
            }
        }
        Ok(Source::Tar {
            path: path.to_owned(),
            members,
        })
    }

    fn format(&self) -> &'static str {
        if self.has("index.json") && self.has("oci-layout") && !self.is_tar() {
            ImageSource::OCI_LAYOUT
        } else {
            ImageSource::DOCKER_ARCHIVE
        }
    }

    fn is_tar(&self) -> bool {
        matches!(self, Source::Tar { .. })
    }

    fn has(&self, member: &str) -> bool {
        match self {
            Source::Dir(dir) => dir.join(member).is_file(),
            Source::Tar { members, .. } => members.contains_key(member),
        }
    }

    /// A member's bytes (no digest checked here) and its size.
    fn reader(&self, member: &str) -> Result<(Box<dyn Read + '_>, u64)> {
        let member = oci::member_path(member)?;
        let missing = || {
            Error::invalid(format!(
                "the image names {member}, which is not in it (an incomplete export?)"
            ))
        };
        match self {
            Source::Dir(dir) => {
                // A layout may come from anywhere: a member that is (or goes through) a
                // symlink could read a host file into the image, so none is followed.
                let mut path = dir.clone();
                for part in member.split('/') {
                    path.push(part);
                    if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                        return Err(Error::invalid(format!(
                            "the image's {member} is a symlink ({}); refusing to follow it",
                            path.display()
                        )));
                    }
                }
                let file = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(|_| missing())?;
                let size = file
                    .metadata()
                    .with_context(|| format!("reading {}", path.display()))?
                    .len();
                Ok((Box::new(file), size))
            }
            Source::Tar { path, members } => {
                let (offset, size) = *members.get(&member).ok_or_else(missing)?;
                let mut file =
                    File::open(path).with_context(|| format!("opening {}", path.display()))?;
                file.seek(SeekFrom::Start(offset))
                    .with_context(|| format!("reading {}", path.display()))?;
                Ok((Box::new(file.take(size)), size))
            }
        }
    }

    /// A small JSON member, read whole; checked against `digest` if given.
    fn json_member(&self, member: &str, digest: Option<&Digest>) -> Result<Vec<u8>> {
        let (reader, size) = self.reader(member)?;
        if size > oci::MAX_JSON_BYTES {
            return Err(Error::invalid(format!(
                "the image's {member} is {size} bytes, more than the {} a manifest or config may be",
                oci::MAX_JSON_BYTES
            )));
        }
        let mut bytes = Vec::new();
        let mut hashing = Hashing::new(reader);
        hashing
            .by_ref()
            .take(oci::MAX_JSON_BYTES)
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading the image's {member}"))?;
        if let Some(digest) = digest {
            hashing.verify(member, digest, None)?;
        }
        Ok(bytes)
    }

    fn plan(&self) -> Result<Plan> {
        if self.has("index.json") {
            self.oci_plan()
        } else if self.has("manifest.json") {
            self.docker_plan()
        } else {
            Err(Error::invalid(
                "this is neither an OCI image layout (no index.json) nor a docker save \
                 archive (no manifest.json)",
            ))
        }
    }

    fn oci_plan(&self) -> Result<Plan> {
        let index: oci::Index =
            oci::parse_json(&self.json_member("index.json", None)?, "index.json")?;
        let mut descriptor = oci::pick_manifest(&index)?.clone();
        // A multi-platform image: its index is one level further down.
        for _ in 0..2 {
            if !oci::is_index(&descriptor) {
                break;
            }
            let digest = Digest::parse(&descriptor.digest)?;
            let nested: oci::Index = oci::parse_json(
                &self.json_member(&digest.blob_path(), Some(&digest))?,
                "index",
            )?;
            descriptor = oci::pick_manifest(&nested)?.clone();
        }
        let manifest_digest = Digest::parse(&descriptor.digest)?;
        let manifest: oci::Manifest = oci::parse_json(
            &self.json_member(&manifest_digest.blob_path(), Some(&manifest_digest))?,
            "manifest",
        )?;
        let config_digest = Digest::parse(&manifest.config.digest)?;
        let config: oci::ImageConfig = oci::parse_json(
            &self.json_member(&config_digest.blob_path(), Some(&config_digest))?,
            "config",
        )?;
        config.check_platform("this image")?;
        let diff_ids = diff_ids(&config, manifest.layers.len())?;
        let layers = manifest
            .layers
            .iter()
            .zip(diff_ids)
            .map(|(layer, diff_id)| {
                let digest = Digest::parse(&layer.digest)?;
                Ok(LayerRef {
                    member: digest.blob_path(),
                    media_type: layer.media_type.clone(),
                    digest,
                    diff_id,
                    of_blob: true,
                    size: Some(layer.size),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Plan {
            manifest_digest: Some(manifest_digest),
            config_digest,
            config: config.config,
            layers,
        })
    }

    fn docker_plan(&self) -> Result<Plan> {
        let entries: Vec<oci::DockerEntry> =
            oci::parse_json(&self.json_member("manifest.json", None)?, "manifest.json")?;
        let entry = match entries.as_slice() {
            [one] => one,
            [] => return Err(Error::invalid("the archive's manifest.json lists no image")),
            many => {
                return Err(Error::invalid(format!(
                    "the archive holds {} images; save one image per archive to import it",
                    many.len()
                )))
            }
        };
        // The config's name is its digest: `<hex>.json` (classic) or `blobs/sha256/<hex>`.
        let config_member = oci::member_path(&entry.config)?;
        let hex = config_member
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .trim_end_matches(".json");
        let config_digest = Digest::parse(&format!("sha256:{hex}")).map_err(|_| {
            Error::invalid(format!(
                "the archive's config {} is not named by its digest",
                oci::printable(&entry.config)
            ))
        })?;
        let config: oci::ImageConfig = oci::parse_json(
            &self.json_member(&config_member, Some(&config_digest))?,
            "config",
        )?;
        config.check_platform("this image")?;
        let diff_ids = config.rootfs.clone().unwrap_or_default().diff_ids;
        if diff_ids.len() != entry.layers.len() {
            return Err(Error::invalid(format!(
                "the archive lists {} layers but its config {} diff ids",
                entry.layers.len(),
                diff_ids.len()
            )));
        }
        let layers = entry
            .layers
            .iter()
            .zip(&diff_ids)
            .map(|(member, diff_id)| {
                Ok(LayerRef {
                    member: oci::member_path(member)?,
                    media_type: String::new(),
                    digest: Digest::parse(diff_id)?,
                    diff_id: Digest::parse(diff_id)?,
                    of_blob: false,
                    size: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Plan {
            manifest_digest: None,
            config_digest,
            config: config.config,
            layers,
        })
    }

    /// Unpacks one layer into a staging directory of the layer store, checking its blob
    /// digest (OCI) and its diff id as it is read; the import installs it with the image.
    fn stage_layer(
        &self,
        layer: &LayerRef,
        store: &LayerStore,
        limits: Limits,
        stop: &dyn Fn() -> Result<()>,
    ) -> Result<Unpacked> {
        let (reader, _) = self.reader(&layer.member)?;
        if layer.of_blob {
            let mut hashing = Hashing::new(BufReader::new(reader));
            let unpacked = stage_blob(
                &mut hashing,
                &layer.media_type,
                &layer.diff_id,
                store,
                limits,
                stop,
            )?;
            hashing.verify(
                &format!("layer {}", layer.digest),
                &layer.digest,
                layer.size,
            )?;
            Ok(unpacked)
        } else {
            stage_blob(
                reader,
                &layer.media_type,
                &layer.diff_id,
                store,
                limits,
                stop,
            )
        }
    }
}

/// Unpacks a layer blob (gzip or plain tar, by its media type and first bytes) into a staging
/// directory of the layer store ([`LayerStore::stage`]), checking the tar against `diff_id`:
/// [`LayerStore::install_one`] puts it in, or a pull's [`LayerStore::install`] with its
/// others, for one sync.
pub(super) fn stage_blob(
    blob: impl Read,
    media_type: &str,
    diff_id: &Digest,
    store: &LayerStore,
    limits: Limits,
    stop: &dyn Fn() -> Result<()>,
) -> Result<Unpacked> {
    let mut raw = BufReader::with_capacity(BLOB_BUFFER, blob);
    let magic = raw
        .fill_buf()
        .with_context(|| format!("reading layer {diff_id}"))?;
    match oci::compression(media_type, magic)? {
        // Every member: a gzip file may be several concatenated (valid gzip, and what some
        // image builders write), where `GzDecoder` would stop after the first and the
        // layer's diff id would then not match.
        Compression::Gzip => store.stage(
            diff_id,
            flate2::read::MultiGzDecoder::new(raw),
            limits,
            stop,
        ),
        Compression::None => store.stage(diff_id, raw, limits, stop),
    }
}

/// Bytes of a blob read at once: fewer, larger reads than `BufReader`'s 8 KiB.
const BLOB_BUFFER: usize = 256 << 10;

/// The config's diff ids, one per layer of the manifest.
pub(super) fn diff_ids(config: &oci::ImageConfig, layers: usize) -> Result<Vec<Digest>> {
    let ids = config
        .rootfs
        .as_ref()
        .map(|r| r.diff_ids.as_slice())
        .unwrap_or_default();
    if ids.len() != layers {
        return Err(Error::invalid(format!(
            "the image's manifest lists {layers} layers but its config {} diff ids",
            ids.len()
        )));
    }
    ids.iter().map(|id| Digest::parse(id)).collect()
}

/// Assembles `layers` into `<staging>/rootfs`, makes DynoCap's changes to it ([`customise`])
/// and writes `<staging>/image.json` from `meta` with when, how big and which layers filled
/// in: the one way an image made of stored layers (pulled, imported or a recipe's) is put
/// together before it is installed.
pub(super) fn assemble_image(
    layer_store: &LayerStore,
    layers: &[Layer],
    staging: &Path,
    limits: Limits,
    meta: ImageMeta,
) -> Result<()> {
    let rootfs = staging.join("rootfs");
    layer_store.assemble(layers, &rootfs)?;
    customise(&Root::open(&rootfs, limits)?)?;
    let meta = ImageMeta {
        // Microseconds: a name's newest build is the one a start boots, so two builds of one
        // name within a second (a recipe changed and rebuilt) must not tie.
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        size_bytes: tree_size(&rootfs),
        layers: layers.iter().map(|l| l.meta.diff_id.clone()).collect(),
        ..meta
    };
    let json = serde_json::to_string_pretty(&meta)
        .map_err(|err| Error::internal(format!("writing image.json: {err}")))?;
    fs::write(staging.join(META_FILE), json).context("writing image.json")
}

/// DynoCap's changes to an imported rootfs, made through the same no-symlink walk as the
/// layers (the rootfs is the image's, so a symlinked `/etc` is refused, never followed):
/// mountpoints, no trace of the image's build host, the sandbox user and group (added to the
/// image's `/etc/passwd` and `/etc/group`, or minimal ones made), the agent's mountpoint and
/// `sudo`. Debian-only steps (apt sources) are not made.
pub(super) fn customise(root: &Root) -> Result<()> {
    let dir = |rel: &str| -> Result<std::os::fd::OwnedFd> {
        let parts: Vec<Vec<u8>> = rel.split('/').map(|p| p.as_bytes().to_vec()).collect();
        root.walk(&parts, true)?
            .ok_or_else(|| Error::internal(format!("creating /{rel} in the image")))
    };
    for rel in [
        "proc",
        "dev",
        "sys",
        "run",
        "home",
        "etc",
        ".dynocap",
        "usr/local/bin",
    ] {
        dir(rel)?;
    }
    for rel in ["tmp", "var/tmp"] {
        fchmod(dir(rel)?, Mode::from_bits_truncate(0o1777))
            .map_err(|e| Error::internal(format!("setting the mode of /{rel}: {e}")))?;
    }
    let etc = dir("etc")?;
    let etc = etc.as_fd();
    replace(etc, "hostname", b"dynocap\n", 0o644)?;
    replace(
        etc,
        "hosts",
        b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        0o644,
    )?;
    replace(
        etc,
        "resolv.conf",
        b"# DynoCap: no DNS inside the sandbox unless its network mode provides it\n",
        0o644,
    )?;
    let user = format!(
        "sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:DynoCap sandbox user:{SANDBOX_HOME}:/bin/sh"
    );
    add_line(etc, "passwd", "root:x:0:0:root:/root:/bin/sh", &user, 0o644)?;
    add_line(
        etc,
        "group",
        "root:x:0:",
        &format!("sandbox:x:{SANDBOX_GID}:"),
        0o644,
    )?;
    if read_at(etc, "shadow")?.is_some() {
        add_line(etc, "shadow", "", "sandbox:!:20000:0:99999:7:::", 0o640)?;
    }
    if read_at(etc, "gshadow")?.is_some() {
        add_line(etc, "gshadow", "", "sandbox:!::", 0o640)?;
    }
    replace(dir(".dynocap")?.as_fd(), "agent", b"", 0o755)?;
    // `sudo` is the agent under another name (see customise.rs).
    let bin = dir("usr/local/bin")?;
    remove_tree(bin.as_fd(), b"sudo")?;
    nix::unistd::symlinkat("/.dynocap/agent", bin.as_fd(), "sudo")
        .map_err(|e| Error::internal(format!("creating /usr/local/bin/sudo: {e}")))?;
    Ok(())
}

/// The content of `dir/name` if it is a regular file (not followed if a symlink).
fn read_at(dir: BorrowedFd<'_>, name: &str) -> Result<Option<Vec<u8>>> {
    match openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => {
            let mut bytes = Vec::new();
            File::from(fd)
                .take(oci::MAX_JSON_BYTES)
                .read_to_end(&mut bytes)
                .with_context(|| format!("reading /etc/{name} of the image"))?;
            Ok(Some(bytes))
        }
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(errno) => Err(Error::invalid(format!(
            "/etc/{name} of the image cannot be read ({errno}); is it a symlink?"
        ))),
    }
}

/// Replaces `dir/name` (whatever it was, a symlink included) with a root-owned file.
fn replace(dir: BorrowedFd<'_>, name: &str, content: &[u8], mode: u32) -> Result<()> {
    remove_tree(dir, name.as_bytes())?;
    let fd = openat(
        dir,
        OsStr::from_bytes(name.as_bytes()),
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| Error::internal(format!("creating {name} in the image: {e}")))?;
    let mut file = File::from(fd);
    std::io::Write::write_all(&mut file, content)
        .with_context(|| format!("writing {name} in the image"))?;
    nix::unistd::fchown(
        &file,
        Some(nix::unistd::Uid::from_raw(0)),
        Some(nix::unistd::Gid::from_raw(0)),
    )
    .map_err(|e| Error::internal(format!("chowning {name} in the image: {e}")))?;
    fchmod(&file, Mode::from_bits_truncate(mode))
        .map_err(|e| Error::internal(format!("setting the mode of {name} in the image: {e}")))
}

/// Adds `line` to `dir/name` unless its first field is there; a missing file starts with
/// `first` (when not empty).
fn add_line(dir: BorrowedFd<'_>, name: &str, first: &str, line: &str, mode: u32) -> Result<()> {
    let mut text = match read_at(dir, name)? {
        Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        None if first.is_empty() => String::new(),
        None => format!("{first}\n"),
    };
    let key = line.split(':').next().unwrap_or_default();
    if text.lines().any(|l| l.split(':').next() == Some(key)) {
        return Ok(());
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
    text.push('\n');
    replace(dir, name, text.as_bytes(), mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::unpack::tests::Layer as Tar;
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).expect("gzip");
        encoder.finish().expect("gzip")
    }

    #[test]
    fn a_symlinked_member_names_a_member_of_the_archive_only() {
        assert_eq!(
            link_member("b/layer.tar", b"../a/layer.tar").as_deref(),
            Some("a/layer.tar")
        );
        assert_eq!(
            link_member("b/layer.tar", b"./x/../layer.tar").as_deref(),
            Some("b/layer.tar")
        );
        assert_eq!(link_member("b/layer.tar", b"../../etc/passwd"), None);
        assert_eq!(link_member("layer.tar", b"../x"), None);
        assert_eq!(link_member("b/layer.tar", b"/etc/passwd"), None);
        assert_eq!(link_member("b/layer.tar", b".."), None);
    }

    /// A layer gzipped as two concatenated members unpacks whole, and matches its diff id.
    #[test]
    fn a_layer_of_several_gzip_members_unpacks_whole() {
        let tar = Tar::new()
            .file("first", &"a".repeat(10_000))
            .file("second", "b")
            .bytes();
        let (head, tail) = tar.split_at(tar.len() / 2);
        let blob = [gzip(head), gzip(tail)].concat();
        let diff_id = Digest {
            hex: Sha256::digest(&tar)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        };
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        let layer = stage_blob(
            &blob[..],
            "application/vnd.oci.image.layer.v1.tar+gzip",
            &diff_id,
            &store,
            Limits::default(),
            &|| Ok(()),
        )
        .and_then(|staged| store.install_one(staged))
        .expect("a two-member gzip layer unpacks");
        assert_eq!(
            fs::read_to_string(layer.tree().join("second")).expect("the second file"),
            "b"
        );
    }
}
