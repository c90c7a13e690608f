//! The layer store: container-image layers unpacked once each, by content, and shared by
//! every image made of them.
//!
//! ```text
//! images/.store/lock                         flock: shared while unpacking or assembling,
//!                                            exclusive while freeing (so no .tmp is live then)
//! images/.store/layers/sha256/<diff id>/     one unpacked layer:
//!     layer.json                             its LayerMeta (what it does to lower layers)
//!     tree/                                  its own files, never changed once installed
//! images/.store/layers/.tmp-*                a layer being unpacked, or unpacked and staged
//!                                            until its pull installs it with its others
//! images/.store/blobs/sha256/<digest>        a pulled blob whose layer is not installed yet
//!                                            (resume state)
//! images/.store/blobs/.partial-*             a blob being downloaded
//! images/.store/rootfs-layers/<image id>     the diff id of the layer holding a debian
//!                                            build's whole rootfs (its recipes' base layer)
//! ```
//!
//! A layer is keyed by its diff id (the SHA-256 of its uncompressed tar), checked while it is
//! unpacked by [`unpack::Root`] in layer mode, which applies the same hostile-layer rules as a
//! whole import and records the layer's whiteouts, opaque directories and hard links to lower
//! layers instead of applying them. [`LayerStore::assemble`] makes an image's flattened rootfs
//! from its layers, bottom up: whiteouts and opaque directories applied, directories and
//! symlinks created anew, and regular files HARD-LINKED from the layers' trees, so a second
//! image on the same base stores only its own layers' bytes, and a backend still sees one
//! rootfs directory.
//!
//! Sharing inodes is safe because no one writes a rootfs's files in place: the jail mounts the
//! rootfs as an overlay's read-only lower layer (a write copies the file up into the
//! sandbox's own upper layer first), the vm copies it into an ext4 image (`mke2fs -d`), and
//! DynoCap's own changes to an image (`import::customise`) replace a file by unlinking it and
//! creating a new one, never by writing into it.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{readlinkat, AtFlags};
use nix::sys::stat::{fchmod, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{fchown, fchownat, linkat, symlinkat, Gid, Uid};
use serde::{Deserialize, Serialize};

use super::oci::Digest;
use super::unpack::{
    create_file, dir_here, fs_error, is_type, joined, link_here, list_dir, open_dir, remove_tree,
    show, stat_at, too_deep, Hashing, LayerRecord, Limits, Parts, Root, Stats, MAX_DIR_DEPTH,
};
use crate::foundation::error::{Context, Error, Result};

/// The store's directory under `images/` (not an image name: names never start with `.`).
pub const STORE_DIR: &str = ".store";
const LAYER_META: &str = "layer.json";
const TMP: &str = ".tmp-";
/// Beside `layers/`: per debian build, the layer made of its rootfs ([`LayerStore::rootfs_layer_record`]).
const ROOTFS_LAYERS: &str = "rootfs-layers";

/// What `layer.json` records about one unpacked layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerMeta {
    /// `sha256:<hex>` of the uncompressed tar.
    pub diff_id: String,
    /// What the layer's entries held and what was left out.
    pub stats: Stats,
    /// Apparent size of `tree/` (hard links counted once).
    pub size_bytes: u64,
    #[serde(flatten)]
    pub record: LayerRecord,
}

/// One unpacked layer of the store.
#[derive(Debug, Clone)]
pub struct Layer {
    /// `layers/sha256/<hex>`.
    pub dir: PathBuf,
    pub meta: LayerMeta,
}

impl Layer {
    /// The layer's own files.
    pub fn tree(&self) -> PathBuf {
        self.dir.join("tree")
    }
}

/// A layer unpacked into `layers/.tmp-*` and checked against its diff id, not yet in the
/// store: [`LayerStore::install`] puts it in; dropped before, it is removed.
#[derive(Debug)]
pub struct StagedLayer {
    staging: PathBuf,
    diff_id: Digest,
    meta: LayerMeta,
}

impl StagedLayer {
    /// The layer where it is staged: an image may be assembled from it before it is
    /// installed (its files are hard-linked, and links follow the inodes through the rename).
    pub fn layer(&self) -> Layer {
        Layer {
            dir: self.staging.clone(),
            meta: self.meta.clone(),
        }
    }
}

impl Drop for StagedLayer {
    fn drop(&mut self) {
        // Gone already once installed (renamed away).
        if let Err(err) = remove_dir(&self.staging) {
            tracing::warn!("{err}");
        }
    }
}

/// A layer as [`LayerStore::stage`] left it.
#[derive(Debug)]
pub enum Unpacked {
    /// The store had it already.
    Stored(Layer),
    /// Unpacked now, to be installed.
    Staged(StagedLayer),
}

impl Unpacked {
    /// `sha256:<hex>` of the layer's uncompressed tar.
    pub fn diff_id(&self) -> &str {
        match self {
            Unpacked::Stored(layer) => &layer.meta.diff_id,
            Unpacked::Staged(staged) => &staged.meta.diff_id,
        }
    }

    /// The layer where it is now (the store's, or its staging directory).
    pub fn layer(&self) -> Layer {
        match self {
            Unpacked::Stored(layer) => layer.clone(),
            Unpacked::Staged(staged) => staged.layer(),
        }
    }
}

/// The layer store of one image store (`images/.store`).
#[derive(Debug, Clone)]
pub struct LayerStore {
    dir: PathBuf,
}

/// Held while layers are unpacked or assembled (shared) or freed (exclusive).
pub struct StoreLock {
    _lock: nix::fcntl::Flock<fs::File>,
}

/// What [`LayerStore::free_unused`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Freed {
    pub layers: u64,
    pub bytes: u64,
}

impl LayerStore {
    /// The layer store inside the image store at `images_dir`.
    pub fn in_images_dir(images_dir: &Path) -> LayerStore {
        LayerStore {
            dir: images_dir.join(STORE_DIR),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn layers_dir(&self) -> PathBuf {
        self.dir.join("layers")
    }

    /// `layers/sha256/<hex>`.
    pub fn layer_dir(&self, diff_id: &Digest) -> PathBuf {
        self.layers_dir().join("sha256").join(&diff_id.hex)
    }

    /// `blobs/sha256/<hex>`: where a pull keeps a downloaded blob until its layer is unpacked.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(&digest.hex)
    }

    /// `blobs/`: downloads in progress are `.partial-*` here.
    /// Where the diff id of the layer made of image `image_id`'s whole rootfs is remembered
    /// (a debian build, which keeps no layers of its own, as its recipes' base).
    pub fn rootfs_layer_record(&self, image_id: &str) -> PathBuf {
        self.dir.join(ROOTFS_LAYERS).join(image_id)
    }

    pub fn blobs_dir(&self) -> PathBuf {
        self.dir.join("blobs")
    }

    fn lock(&self, exclusive: bool) -> Result<StoreLock> {
        let (file, path) = super::store::open_lock_file(&self.dir, "lock")?;
        let arg = if exclusive {
            nix::fcntl::FlockArg::LockExclusive
        } else {
            nix::fcntl::FlockArg::LockShared
        };
        let lock = nix::fcntl::Flock::lock(file, arg).map_err(|(_, errno)| {
            Error::internal(format!("locking {}: {errno}", path.display()))
        })?;
        Ok(StoreLock { _lock: lock })
    }

    /// Held by whoever unpacks or assembles layers, so no layer is freed under them.
    pub fn lock_shared(&self) -> Result<StoreLock> {
        self.lock(false)
    }

    /// The unpacked layer with this diff id, if the store has it.
    pub fn get(&self, diff_id: &Digest) -> Option<Layer> {
        let dir = self.layer_dir(diff_id);
        let text = fs::read_to_string(dir.join(LAYER_META)).ok()?;
        let meta: LayerMeta = serde_json::from_str(&text).ok()?;
        (meta.diff_id == diff_id.to_string() && dir.join("tree").is_dir())
            .then_some(Layer { dir, meta })
    }

    /// Unpacks one layer from its uncompressed tar stream, checking the stream against
    /// `diff_id`; the layer appears in the store by one rename, whole or not at all, and
    /// durably ([`LayerStore::install`]). A layer the store has already is returned as it is
    /// and `tar` is not read. Callers hold [`LayerStore::lock_shared`].
    pub fn unpack(
        &self,
        diff_id: &Digest,
        tar: impl Read,
        limits: Limits,
        cancel: &dyn Fn() -> Result<()>,
    ) -> Result<Layer> {
        self.install_one(self.stage(diff_id, tar, limits, cancel)?)
    }

    /// Puts one layer [`LayerStore::stage`] left into the store, durably (see
    /// [`LayerStore::install`]); one the store had already is returned as it is.
    pub fn install_one(&self, unpacked: Unpacked) -> Result<Layer> {
        match unpacked {
            Unpacked::Stored(layer) => Ok(layer),
            Unpacked::Staged(staged) => {
                let diff_id = staged.diff_id.clone();
                self.install(vec![staged])?.pop().ok_or_else(|| {
                    Error::internal(format!("layer {diff_id} vanished once unpacked"))
                })
            }
        }
    }

    /// Unpacks one layer into a staging directory beside the store's layers and checks it
    /// against `diff_id`, without putting it in: [`LayerStore::install`] does, for several
    /// layers at once (a pull's), so their files are synced together. A layer the store has
    /// already is returned as it is and `tar` is not read. Callers hold
    /// [`LayerStore::lock_shared`] until the layer is installed.
    pub fn stage(
        &self,
        diff_id: &Digest,
        tar: impl Read,
        limits: Limits,
        cancel: &dyn Fn() -> Result<()>,
    ) -> Result<Unpacked> {
        if let Some(layer) = self.get(diff_id) {
            return Ok(Unpacked::Stored(layer));
        }
        let parent = self.layers_dir();
        fs::create_dir_all(parent.join("sha256"))
            .with_context(|| format!("creating {}", parent.display()))?;
        let staging = parent.join(format!(
            "{TMP}{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        match self.unpack_into(&staging, diff_id, tar, limits, cancel) {
            Ok(meta) => Ok(Unpacked::Staged(StagedLayer {
                staging,
                diff_id: diff_id.clone(),
                meta,
            })),
            Err(err) => {
                if let Err(err) = remove_dir(&staging) {
                    tracing::warn!("{err}");
                }
                Err(err)
            }
        }
    }

    /// Puts staged layers into the store, durably: one `syncfs` for all of them, then their
    /// renames (see [`LayerStore::install_synced`]).
    pub fn install(&self, staged: Vec<StagedLayer>) -> Result<Vec<Layer>> {
        if let Some(first) = staged.first() {
            super::build::sync_filesystem(&first.staging)?;
        }
        self.install_synced(staged)
    }

    /// Renames staged layers into the store and makes the renames durable (one `fsync` of
    /// the directory), for a caller that has synced the store's filesystem (`syncfs`) since
    /// they were unpacked. The layer's files reach the disk before the rename that installs
    /// it, and the rename before anything names the layer: a layer is found by its directory
    /// alone, so one a crash left renamed but with its files' data lost would be taken as
    /// whole by every later pull, import and build (see `Staging::install`).
    pub fn install_synced(&self, staged: Vec<StagedLayer>) -> Result<Vec<Layer>> {
        let mut layers = Vec::with_capacity(staged.len());
        let mut renamed = false;
        let mut failed = None;
        for staged in staged {
            let target = self.layer_dir(&staged.diff_id);
            match fs::rename(&staged.staging, &target) {
                Ok(()) => {
                    renamed = true;
                    layers.push(Layer {
                        dir: target,
                        meta: staged.meta.clone(),
                    });
                }
                // Another unpack of the same layer won: theirs is the same content (and
                // this one's staging directory goes with `staged`).
                Err(err) => match self.get(&staged.diff_id) {
                    Some(layer) => {
                        tracing::debug!("layer {} installed concurrently: {err}", staged.diff_id);
                        layers.push(layer);
                    }
                    None => {
                        failed = Some(Error::internal(format!(
                            "installing layer {}: {err}",
                            staged.diff_id
                        )));
                        break;
                    }
                },
            }
        }
        if renamed {
            super::build::sync_dir(&self.layers_dir().join("sha256"))?;
        }
        match failed {
            Some(err) => Err(err),
            None => Ok(layers),
        }
    }

    fn unpack_into(
        &self,
        staging: &Path,
        diff_id: &Digest,
        tar: impl Read,
        limits: Limits,
        cancel: &dyn Fn() -> Result<()>,
    ) -> Result<LayerMeta> {
        let tree = staging.join("tree");
        fs::create_dir_all(&tree).with_context(|| format!("creating {}", tree.display()))?;
        let mut root = Root::open_layer(&tree, limits)?;
        let mut hashing = Hashing::new(tar);
        root.apply_layer(&mut hashing, cancel)?;
        hashing.verify(&format!("layer {diff_id}"), diff_id, None)?;
        let stats = root.stats.clone();
        let meta = LayerMeta {
            diff_id: diff_id.to_string(),
            stats,
            size_bytes: super::store::tree_size(&tree),
            record: root.into_record(),
        };
        let json = serde_json::to_vec(&meta)
            .map_err(|err| Error::internal(format!("writing layer.json: {err}")))?;
        fs::write(staging.join(LAYER_META), json).context("writing layer.json")?;
        Ok(meta)
    }

    /// Makes `rootfs` (an empty directory) the flattened image of `layers`, bottom first.
    /// Regular files are hard links to the layers' own; nothing in a layer is written.
    /// Callers hold [`LayerStore::lock_shared`].
    pub fn assemble(&self, layers: &[Layer], rootfs: &Path) -> Result<()> {
        // The root's bounds were the layers' to check when they were unpacked.
        let root = Root::open(
            rootfs,
            Limits {
                max_bytes: 0,
                max_files: 0,
            },
        )?;
        for layer in layers {
            let record = &layer.meta.record;
            for dir in record.opaques.iter() {
                if let Some(fd) = root.walk(&dir, false)? {
                    for name in list_dir(fd.as_fd())? {
                        remove_tree(fd.as_fd(), &name)?;
                    }
                }
            }
            for gone in record.whiteouts.iter() {
                if let Some((name, dir)) = gone.split_last() {
                    if let Some(fd) = root.walk(dir, false)? {
                        remove_tree(fd.as_fd(), name)?;
                    }
                }
            }
            // Linked before this layer's own entries, as in the tar: a file the layer puts
            // at a link's target later does not change what the link names.
            for (link, target) in &record.links {
                link_lower(&root, link, target)?;
            }
            let implicit: HashSet<&[u8]> = record.implicit_dirs.0.iter().map(|p| &p[..]).collect();
            let tree = open_dir(root_fd(&layer.tree())?.as_fd(), b".")
                .map_err(|e| fs_error("opening", layer.tree().as_os_str().as_bytes(), e))?;
            let top = root
                .walk(&[], false)?
                .ok_or_else(|| Error::internal("the rootfs vanished"))?;
            merge(tree, top, &implicit)?;
        }
        Ok(())
    }

    /// Removes what unpacks that died left (`layers/.tmp-<pid>-*` of a process that is
    /// gone: a pull or import killed half-way), so an interrupted pull leaves nothing
    /// behind once the next one starts. A live process's unpack keeps its pid in the name.
    pub fn sweep_dead_unpacks(&self) {
        let layers = self.layers_dir();
        let Ok(names) = read_dir_names(&layers) else {
            return;
        };
        for name in names {
            let Some(rest) = name.strip_prefix(TMP) else {
                continue;
            };
            // `.tmp-rm-*` are the exclusive lock holder's (`free_unused`), which sweeps them.
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
            if !alive {
                if let Err(err) = remove_dir(&layers.join(&name)) {
                    tracing::warn!("{err}");
                }
            }
        }
    }

    /// Frees every layer that no diff id (`sha256:<hex>`) `used` gives names, and leftovers
    /// of unpacks and downloads that died. Takes the store's exclusive lock first, so no
    /// unpack or assembly runs meanwhile and `used` (asked under the lock) sees every image
    /// installed before it.
    pub fn free_unused(&self, used: &dyn Fn() -> Result<HashSet<String>>) -> Result<Freed> {
        let _lock = self.lock(true)?;
        let used = used()?;
        let mut freed = Freed::default();
        let layers = self.layers_dir();
        for entry in read_dir_names(&layers)? {
            if entry.starts_with(TMP) {
                remove_dir(&layers.join(&entry))?;
            }
        }
        for hex in read_dir_names(&layers.join("sha256"))? {
            let Ok(digest) = Digest::parse(&format!("sha256:{hex}")) else {
                continue;
            };
            if used.contains(&digest.to_string()) {
                continue;
            }
            let dir = self.layer_dir(&digest);
            freed.bytes += self.get(&digest).map_or(0, |l| l.meta.size_bytes);
            freed.layers += 1;
            // Out of sight first, so a reader sees the whole layer or none.
            let doomed = layers.join(format!("{TMP}rm-{hex}"));
            fs::rename(&dir, &doomed).with_context(|| format!("removing {}", dir.display()))?;
            remove_dir(&doomed)?;
        }
        let blobs = self.blobs_dir();
        for entry in read_dir_names(&blobs)? {
            if entry.starts_with(".partial-") {
                let _ = fs::remove_file(blobs.join(&entry));
            }
        }
        // A rootfs layer's record goes with its layer: it names nothing once that is freed.
        let records = self.dir.join(ROOTFS_LAYERS);
        for name in read_dir_names(&records)? {
            let record = records.join(&name);
            let names_a_layer = fs::read_to_string(&record)
                .ok()
                .and_then(|diff| Digest::parse(diff.trim()).ok())
                .is_some_and(|digest| self.get(&digest).is_some());
            if !names_a_layer {
                fs::remove_file(&record)
                    .with_context(|| format!("removing {}", record.display()))?;
            }
        }
        if let Err(err) = fs::remove_dir(&records) {
            // Kept while it holds records; absent when no recipe was built on debian.
            if !matches!(
                err.raw_os_error(),
                Some(libc::ENOTEMPTY) | Some(libc::ENOENT)
            ) {
                return Err(Error::internal(format!(
                    "removing {}: {err}",
                    records.display()
                )));
            }
        }
        Ok(freed)
    }
}

fn read_dir_names(dir: &Path) -> Result<Vec<String>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(err) => Err(Error::internal(format!("reading {}: {err}", dir.display()))),
    }
}

fn remove_dir(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(Error::internal(format!(
            "removing {}: {err}",
            path.display()
        ))),
    }
}

fn root_fd(path: &Path) -> Result<OwnedFd> {
    nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fs_error("opening", path.as_os_str().as_bytes(), e))
}

/// A hard link from a layer to a lower layer's file, made in the rootfs.
fn link_lower(root: &Root, link: &Parts, target: &Parts) -> Result<()> {
    let (Some((link_name, link_dir)), Some((target_name, target_dir))) =
        (link.split_last(), target.split_last())
    else {
        return Ok(());
    };
    let Some(source_dir) = root.hard_link_source(link, target_dir, target_name)? else {
        return Err(Error::invalid(format!(
            "the hard link {} names {}, which is not in the image",
            printable(link),
            printable(target)
        )));
    };
    let parent = root
        .walk(link_dir, true)?
        .ok_or_else(|| Error::internal("a created directory vanished"))?;
    link_here(
        source_dir.as_fd(),
        target_name,
        parent.as_fd(),
        link_name,
        link,
    )
}

fn printable(parts: &Parts) -> String {
    super::oci::printable(&String::from_utf8_lossy(&show(parts)))
}

/// Puts the layer's tree (the open directory `tree`) into the rootfs (`top`), replacing what
/// lower layers left there. Iterative, holding the two open directories of each level: the
/// unpacker bounds a layer's depth ([`MAX_DIR_DEPTH`]), and a layer stored before it did is
/// refused past that bound here rather than walked as deep as it goes.
fn merge(tree: OwnedFd, top: OwnedFd, implicit: &HashSet<&[u8]>) -> Result<()> {
    struct Level {
        from: OwnedFd,
        into: OwnedFd,
        names: std::vec::IntoIter<Vec<u8>>,
    }
    let names = list_dir(tree.as_fd())?;
    let mut stack = vec![Level {
        from: tree,
        into: top,
        names: names.into_iter(),
    }];
    // The path of the entry being merged: one component per level below the top.
    let mut path: Parts = Vec::new();
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.names.next() else {
            stack.pop();
            path.pop();
            continue;
        };
        path.push(name);
        let (from, into) = (level.from.as_fd(), level.into.as_fd());
        match merge_entry(from, into, &path, implicit)? {
            Some((sub_from, sub_into)) => {
                // `stack.len()` directories deep, counting this one.
                if stack.len() > MAX_DIR_DEPTH {
                    return Err(too_deep(&path, "a stored layer is"));
                }
                let names = list_dir(sub_from.as_fd())?;
                stack.push(Level {
                    from: sub_from,
                    into: sub_into,
                    names: names.into_iter(),
                });
            }
            None => {
                path.pop();
            }
        }
    }
    Ok(())
}

/// Puts the entry `path` (its last component named in `from`) into `into`; a directory's two
/// open descriptors (the layer's and the rootfs's) are returned, for [`merge`] to go into.
fn merge_entry(
    from: BorrowedFd<'_>,
    into: BorrowedFd<'_>,
    path: &Parts,
    implicit: &HashSet<&[u8]>,
) -> Result<Option<(OwnedFd, OwnedFd)>> {
    let Some(name) = path.last() else {
        return Ok(None);
    };
    let st = fstatat(from, OsStr::from_bytes(name), AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|e| fs_error("reading", &show(path), e))?;
    let existing = stat_at(into, name)?;
    if is_type(st.st_mode, SFlag::S_IFDIR) {
        // A directory the layer holds only as the parent of its entries, where a lower layer
        // left a symlink or a file: the layer's entries go through that, which is refused as
        // it is within one layer (no symlink is followed), not made a directory in its place,
        // which would hide everything the symlink led to (`bin -> usr/bin` and a layer
        // putting `bin/tool` would leave a `/bin` holding only `tool`).
        let lower_not_dir = existing.is_some_and(|e| !is_type(e.st_mode, SFlag::S_IFDIR));
        let is_implicit = implicit.contains(&joined(path)[..]);
        if lower_not_dir && is_implicit {
            return Err(Error::invalid(format!(
                "a layer entry goes through {}, which a lower layer made a symlink or a file; \
                 refusing to follow it (the layer must name the path the link leads to, or \
                 put a directory there itself)",
                printable(path)
            )));
        }
        let (sub_into, was_dir) = dir_here(into, name, existing, path)?;
        // A directory the layer has only as a parent keeps a lower layer's owner and mode.
        if !was_dir || !is_implicit {
            own(&sub_into, &st, path)?;
        }
        let sub_from = open_dir(from, name).map_err(|e| fs_error("opening", &show(path), e))?;
        return Ok(Some((sub_from, sub_into)));
    }
    remove_tree(into, name)?;
    if is_type(st.st_mode, SFlag::S_IFLNK) {
        let target = readlinkat(from, OsStr::from_bytes(name))
            .map_err(|e| fs_error("reading the symlink", &show(path), e))?;
        symlinkat(target.as_os_str(), into, OsStr::from_bytes(name))
            .map_err(|e| fs_error("creating the symlink", &show(path), e))?;
        return fchownat(
            into,
            OsStr::from_bytes(name),
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map(|()| None)
        .map_err(|e| fs_error("chowning", &show(path), e));
    }
    if !is_type(st.st_mode, SFlag::S_IFREG) {
        // The unpacker creates nothing else; a layer directory holding anything else was
        // changed behind the store's back.
        return Err(Error::internal(format!(
            "{} in a stored layer is not a file, directory or symlink",
            printable(path)
        )));
    }
    match linkat(
        from,
        OsStr::from_bytes(name),
        into,
        OsStr::from_bytes(name),
        AtFlags::empty(),
    ) {
        Ok(()) => Ok(None),
        // Too many links to one inode (tens of thousands of images on one layer): a copy.
        Err(Errno::EMLINK) => copy_file(from, into, name, &st, path).map(|()| None),
        Err(e) => Err(fs_error("linking", &show(path), e)),
    }
}

fn own(fd: &OwnedFd, st: &FileStat, path: &Parts) -> Result<()> {
    fchown(
        fd,
        Some(Uid::from_raw(st.st_uid)),
        Some(Gid::from_raw(st.st_gid)),
    )
    .map_err(|e| fs_error("chowning", &show(path), e))?;
    fchmod(fd, Mode::from_bits_truncate(st.st_mode & 0o7777))
        .map_err(|e| fs_error("chmoding", &show(path), e))
}

fn copy_file(
    from: BorrowedFd<'_>,
    into: BorrowedFd<'_>,
    name: &[u8],
    st: &FileStat,
    path: &Parts,
) -> Result<()> {
    use nix::fcntl::{openat, OFlag};
    let src = openat(
        from,
        OsStr::from_bytes(name),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fs_error("opening", &show(path), e))?;
    let mut dst = create_file(into, name, path)?;
    std::io::copy(&mut fs::File::from(src), &mut dst)
        .map_err(|err| Error::internal(format!("copying {}: {err}", printable(path))))?;
    own(&OwnedFd::from(dst), st, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::unpack::tests::Layer as Tar;
    use sha2::{Digest as _, Sha256};
    use std::os::unix::fs::MetadataExt;

    fn digest(bytes: &[u8]) -> Digest {
        Digest {
            hex: Sha256::digest(bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        }
    }

    fn unpack(store: &LayerStore, tar: Tar) -> Layer {
        let bytes = tar.bytes();
        store
            .unpack(&digest(&bytes), &bytes[..], Limits::default(), &|| Ok(()))
            .expect("unpack")
    }

    /// A layer whose entries go through a lower layer's symlink (`bin -> usr/bin`, then
    /// `bin/tool` with no `bin` of its own) is refused, as within one layer: the symlink is
    /// neither followed nor replaced by a directory holding only the new entry. A layer that
    /// puts a directory there itself replaces the symlink, as Docker does.
    #[test]
    fn a_layer_through_a_lower_layers_symlink_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        let base = unpack(
            &store,
            Tar::new()
                .file("usr/bin/sh", "sh")
                .entry(tar::EntryType::Symlink, "bin", "usr/bin", 0o777, b"")
                .file("etc/conf", "c"),
        );
        let through = unpack(&store, Tar::new().file("bin/tool", "t"));
        let rootfs = tmp.path().join("through");
        fs::create_dir(&rootfs).expect("mkdir");
        let err = store
            .assemble(&[base.clone(), through], &rootfs)
            .expect_err("through a symlink");
        assert!(
            err.message.contains("/bin") && err.message.contains("symlink"),
            "{err}"
        );
        assert!(!tmp.path().join("usr/bin/tool").exists());
        // Through a lower layer's file: refused too (Docker cannot make it either).
        let over_file = unpack(&store, Tar::new().file("etc/conf/x", "x"));
        let rootfs = tmp.path().join("over-file");
        fs::create_dir(&rootfs).expect("mkdir");
        assert!(store.assemble(&[base.clone(), over_file], &rootfs).is_err());
        // A directory of the layer's own, or a whiteout first, replaces the symlink.
        for (what, tar) in [
            ("a dir entry", Tar::new().dir("bin").file("bin/tool", "t")),
            (
                "a whiteout",
                Tar::new().file(".wh.bin", "").file("bin/tool", "t"),
            ),
        ] {
            let layer = unpack(&store, tar);
            let rootfs = tmp.path().join(what.replace(' ', "-"));
            fs::create_dir(&rootfs).expect("mkdir");
            store.assemble(&[base.clone(), layer], &rootfs).expect(what);
            let bin = fs::symlink_metadata(rootfs.join("bin")).expect("bin");
            assert!(bin.is_dir(), "{what}");
            assert!(rootfs.join("bin/tool").is_file() && rootfs.join("usr/bin/sh").is_file());
        }
        // Below a directory the lower layer has: the usual case.
        let beside = unpack(&store, Tar::new().file("usr/bin/tool", "t"));
        let rootfs = tmp.path().join("beside");
        fs::create_dir(&rootfs).expect("mkdir");
        store.assemble(&[base, beside], &rootfs).expect("beside");
        assert!(
            rootfs.join("bin/tool").is_file(),
            "reached through the symlink"
        );
    }

    #[test]
    fn an_opaque_marker_at_the_root_hides_every_lower_entry() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        let base = unpack(&store, Tar::new().file("old", "o").file("etc/keep", "k"));
        let top = unpack(&store, Tar::new().file(".wh..wh..opq", "").file("new", "n"));
        assert_eq!(top.meta.record.opaques.to_parts(), vec![Parts::new()]);
        let rootfs = tmp.path().join("rootfs");
        fs::create_dir(&rootfs).expect("mkdir");
        store.assemble(&[base, top], &rootfs).expect("assemble");
        let mut names: Vec<_> = fs::read_dir(&rootfs)
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["new"]);
    }

    #[test]
    fn images_share_their_base_layer_by_hard_links() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        let base = unpack(
            &store,
            Tar::new()
                .dir("etc")
                .file("etc/keep", "k")
                .file("etc/gone", "g")
                .dir("opt")
                .file("opt/old", "o")
                .file("usr/bin/tool", "t"),
        );
        let top = unpack(
            &store,
            Tar::new()
                .file("etc/.wh.gone", "")
                .file("opt/.wh..wh..opq", "")
                .file("opt/new", "n")
                .entry(
                    tar::EntryType::Link,
                    "usr/bin/tool2",
                    "usr/bin/tool",
                    0o755,
                    b"",
                )
                .entry(tar::EntryType::Symlink, "lib", "usr/lib", 0o777, b""),
        );
        assert_eq!(
            top.meta.record.whiteouts.to_parts(),
            vec![vec![b"etc".to_vec(), b"gone".to_vec()]]
        );
        assert!(top
            .meta
            .record
            .implicit_dirs
            .to_parts()
            .contains(&vec![b"usr".to_vec()]));
        // The store's layer holds no whiteout files.
        assert!(!top.tree().join("etc").exists());

        let one = tmp.path().join("one");
        let two = tmp.path().join("two");
        for rootfs in [&one, &two] {
            fs::create_dir(rootfs).expect("mkdir");
            store
                .assemble(&[base.clone(), top.clone()], rootfs)
                .expect("assemble");
        }
        assert!(one.join("etc/keep").is_file() && !one.join("etc/gone").exists());
        assert!(one.join("opt/new").is_file() && !one.join("opt/old").exists());
        assert_eq!(
            fs::read_link(one.join("lib")).expect("link"),
            Path::new("usr/lib")
        );
        let ino = |p: &Path| fs::metadata(p).expect("stat").ino();
        assert_eq!(
            ino(&one.join("usr/bin/tool2")),
            ino(&one.join("usr/bin/tool"))
        );
        assert_eq!(ino(&one.join("etc/keep")), ino(&two.join("etc/keep")));
        assert_eq!(
            ino(&one.join("etc/keep")),
            ino(&base.tree().join("etc/keep"))
        );
        // Nothing of the lower layer changed.
        assert!(base.tree().join("etc/gone").is_file() && base.tree().join("opt/old").is_file());

        // Unpacking the same layer again is the store's.
        let again = unpack(
            &store,
            Tar::new()
                .dir("etc")
                .file("etc/keep", "k")
                .dir("opt")
                .file("opt/old", "o")
                .file("usr/bin/tool", "t")
                .file("etc/gone", "g"),
        );
        assert_ne!(again.dir, base.dir, "different order, different layer");

        // Freeing keeps the used ones, and a rootfs layer's record only while its layer is.
        let kept_record = store.rootfs_layer_record(&"a".repeat(64));
        let freed_record = store.rootfs_layer_record(&"b".repeat(64));
        fs::create_dir_all(kept_record.parent().expect("parent")).expect("mkdir");
        fs::write(&kept_record, &base.meta.diff_id).expect("write");
        fs::write(&freed_record, &top.meta.diff_id).expect("write");
        let used: HashSet<String> = [base.meta.diff_id.clone()].into();
        let freed = store.free_unused(&|| Ok(used.clone())).expect("free");
        assert_eq!(freed.layers, 2);
        assert!(kept_record.is_file());
        assert!(
            !freed_record.exists(),
            "the record of a freed layer is gone"
        );

        assert!(store
            .get(&Digest::parse(&base.meta.diff_id).expect("d"))
            .is_some());
        assert!(store
            .get(&Digest::parse(&top.meta.diff_id).expect("d"))
            .is_none());
        store.free_unused(&|| Ok(HashSet::new())).expect("free");
        assert!(!kept_record.exists());
        assert!(
            !kept_record.parent().expect("parent").exists(),
            "no records, no directory"
        );
    }

    #[test]
    fn staged_layers_are_unseen_until_installed_together_and_gone_when_dropped() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        let stage = |tar: Tar| {
            let bytes = tar.bytes();
            let diff_id = digest(&bytes);
            match store
                .stage(&diff_id, &bytes[..], Limits::default(), &|| Ok(()))
                .expect("stage")
            {
                Unpacked::Staged(staged) => (diff_id, staged),
                Unpacked::Stored(_) => panic!("the store had it already"),
            }
        };
        let (base_id, base) = stage(Tar::new().file("bin/tool", "t"));
        let (top_id, top) = stage(Tar::new().file("etc/conf", "c"));
        let (dropped_id, dropped) = stage(Tar::new().file("gone", "g"));
        assert!(store.get(&base_id).is_none() && store.get(&top_id).is_none());
        assert_eq!(
            read_dir_names(&store.layers_dir().join("sha256"))
                .expect("ls")
                .len(),
            0
        );

        // An image assembled from them where they are staged keeps its files through the
        // renames that install them (hard links follow the inodes).
        let rootfs = tmp.path().join("root");
        fs::create_dir(&rootfs).expect("mkdir");
        store
            .assemble(&[base.layer(), top.layer()], &rootfs)
            .expect("assemble");
        let installed = store.install(vec![base, top]).expect("install");
        assert_eq!(
            installed.iter().map(|l| l.dir.clone()).collect::<Vec<_>>(),
            vec![store.layer_dir(&base_id), store.layer_dir(&top_id)]
        );
        assert!(store.get(&base_id).is_some() && store.get(&top_id).is_some());
        let ino = |p: &Path| fs::metadata(p).expect("stat").ino();
        assert_eq!(
            ino(&rootfs.join("bin/tool")),
            ino(&installed[0].tree().join("bin/tool"))
        );

        // Staged again once stored: the store's own, and nothing is unpacked.
        let again = store
            .stage(&base_id, &b"not a tar"[..], Limits::default(), &|| Ok(()))
            .expect("stored");
        assert!(matches!(again, Unpacked::Stored(layer) if layer.dir == store.layer_dir(&base_id)));

        // One never installed leaves nothing: no layer, no staging directory.
        drop(dropped);
        assert!(store.get(&dropped_id).is_none());
        assert_eq!(
            read_dir_names(&store.layers_dir()).expect("ls"),
            vec!["sha256"]
        );
    }

    #[test]
    fn a_layer_not_matching_its_diff_id_leaves_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        let bytes = Tar::new().file("a", "x").bytes();
        let wrong = digest(b"other");
        let err = store
            .unpack(&wrong, &bytes[..], Limits::default(), &|| Ok(()))
            .expect_err("mismatch");
        assert!(err.message.contains("does not match"), "{err}");
        assert!(store.get(&wrong).is_none());
        assert_eq!(
            read_dir_names(&store.layers_dir()).expect("ls"),
            vec!["sha256"]
        );
    }

    #[test]
    fn hostile_layers_are_refused_in_the_store_too() {
        let outside = tempfile::tempdir().expect("tempdir");
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        for tar in [
            Tar::new().file("../escape", "x"),
            Tar::new().file("a/.wh...", ""),
            Tar::through_symlink_to(outside.path()),
        ] {
            let bytes = tar.bytes();
            assert!(store
                .unpack(&digest(&bytes), &bytes[..], Limits::default(), &|| Ok(()))
                .is_err());
        }
        assert_eq!(fs::read_dir(outside.path()).expect("ls").count(), 0);
        assert_eq!(
            read_dir_names(&store.layers_dir().join("sha256"))
                .expect("ls")
                .len(),
            0
        );
    }

    /// Assembly walks a layer's tree without recursing: one as deep as the unpacker allows is
    /// assembled whole, and one stored deeper (by a version before the bound) is refused
    /// naming the bound instead of overflowing the stack, as 1000 levels did.
    #[test]
    fn assembly_takes_the_deepest_layer_and_refuses_a_deeper_one() {
        use crate::image::unpack::MAX_DIR_DEPTH;
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        let nested = |levels: usize| vec!["d"; levels].join("/");
        let deepest = unpack(
            &store,
            Tar::new().long(
                tar::EntryType::Regular,
                &format!("{}/f", nested(MAX_DIR_DEPTH)),
            ),
        );
        let rootfs = tmp.path().join("root");
        fs::create_dir(&rootfs).expect("mkdir");
        store
            .assemble(std::slice::from_ref(&deepest), &rootfs)
            .expect("as deep as the bound");
        let file = rootfs.join(nested(MAX_DIR_DEPTH)).join("f");
        assert_eq!(
            fs::metadata(&file).expect("the deepest file").ino(),
            fs::metadata(deepest.tree().join(nested(MAX_DIR_DEPTH)).join("f"))
                .expect("the layer's")
                .ino()
        );

        let old = Layer {
            dir: tmp.path().join("old-layer"),
            meta: LayerMeta {
                diff_id: format!("sha256:{}", "0".repeat(64)),
                stats: Stats::default(),
                size_bytes: 0,
                record: LayerRecord::default(),
            },
        };
        fs::create_dir_all(old.tree().join(nested(1000))).expect("a deep tree");
        let rootfs = tmp.path().join("deeper");
        fs::create_dir(&rootfs).expect("mkdir");
        let err = store.assemble(&[old], &rootfs).expect_err("too deep");
        assert!(
            err.message
                .contains(&format!("more than {MAX_DIR_DEPTH} directories deep")),
            "{err}"
        );
    }

    #[test]
    fn a_hard_link_to_a_lower_layer_is_made_at_assembly() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::in_images_dir(tmp.path());
        let base = unpack(&store, Tar::new().file("bin/busybox", "bb"));
        let top = unpack(
            &store,
            Tar::new().entry(tar::EntryType::Link, "bin/sh", "bin/busybox", 0o755, b""),
        );
        let rootfs = tmp.path().join("root");
        fs::create_dir(&rootfs).expect("mkdir");
        store
            .assemble(&[base, top.clone()], &rootfs)
            .expect("assemble");
        let ino = |p: &Path| fs::metadata(p).expect("stat").ino();
        assert_eq!(
            ino(&rootfs.join("bin/sh")),
            ino(&rootfs.join("bin/busybox"))
        );
        // Alone, the link names nothing.
        let alone = tmp.path().join("alone");
        fs::create_dir(&alone).expect("mkdir");
        assert!(store.assemble(&[top], &alone).is_err());
    }
}
