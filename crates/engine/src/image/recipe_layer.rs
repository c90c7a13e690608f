//! A recipe's result (`dynocap image build NAME --from BASE --run …`): the overlay upper
//! directory a build sandbox wrote, made into one layer of the shared layer store, and the new
//! image assembled from the base's layers plus that one.
//!
//! The upper directory is HOSTILE: the guest wrote it, and a process a step started may still
//! be changing it while it is read. It is walked from open directory descriptors, each entry
//! opened by name without following a symlink (no path below the upper is ever resolved, so a
//! directory swapped for a link midway never leads the walk to the host's files), and turned
//! into an ordinary OCI layer tar (an overlay whiteout, a 0/0 character device, becomes
//! `.wh.NAME`; an opaque directory, `user.overlay.opaque=y` or its `trusted.` twin, gets
//! `.wh..wh..opq`), which [`LayerStore::unpack`] then checks with the very rules of
//! a pulled layer: names confined to the root, no device nodes, set-id bits cleared, bounds.
//! Host ids are mapped back to the guest's by the upper directory's own owner (the host id of
//! the guest's root). Other device nodes, fifos, sockets and names the layer format reserves
//! (`.wh.*`) are left out and counted.
//!
//! It also lists what a copy step copies from the host ([`host_tree`] for a directory): the
//! host side is the user's, but it is walked without following a symlink all the same, so a
//! link in it is copied as a link and never brings in what it points at.

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::build::{remove_dead_builds, BuildLock, Staging};
use super::failure::ImageFailure;
use super::layers::LayerStore;
use super::oci::Digest;
use super::store::{BuiltImage, ImageMeta, ImageSource, ImageStore};
use super::unpack::Limits;
use crate::foundation::error::{Context, Error, Result};

/// Bump when what a recipe's steps make of an image changes.
const RECIPE_REVISION: &str = "1";
/// Beside `image.json`: the recipe a built image was made from.
pub const RECIPE_FILE: &str = "recipe.json";
/// Guest paths DynoCap itself keeps in the upper layer, never part of an image: the agent's
/// state, its mountpoint, and `/run/dynocap` where it listens for `sudo` (every sandbox has
/// them, so a layer holding them would only carry the socket it cannot hold); and what the
/// agent writes for the sandbox it runs in, which another sandbox of the image must not
/// inherit: the `filtered` proxy's CA bundle and apt's setting naming it (a `nat` sandbox
/// would have apt trust a file it lacks), and apt's setting for the project's package cache.
const NOT_IMAGE: &[&str] = &[
    "var/lib/dynocap",
    ".dynocap",
    "run/dynocap",
    "var/lib/dynocap-egress",
    "etc/apt/apt.conf.d/00dynocap-egress",
    "etc/apt/apt.conf.d/zz-dynocap-package-cache",
];
/// The directory of DynoCap's own that absolute guest path `guest` is in or is, if any
/// (`/run/dynocap`): what a step puts there is no part of the image it builds.
pub fn in_dynocap_own(guest: &str) -> Option<&'static str> {
    let parts: Vec<&str> = guest
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    NOT_IMAGE.iter().copied().find(|own| {
        let own: Vec<&str> = own.split('/').collect();
        parts.len() >= own.len() && parts[..own.len()] == own[..]
    })
}

/// Ids of one guest: a host id outside this range from the guest's root is not the guest's.
const GUEST_IDS: u64 = 65_536;

/// One step of a recipe, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "step", content = "value")]
pub enum Step {
    /// A shell command run as the guest's root.
    Run(String),
    /// Debian packages installed with apt-get.
    Apt(Vec<String>),
    /// A host file, or a directory with everything in it, copied into the image: (host path,
    /// guest path).
    Copy(String, String),
    /// `K=V` added to the image config's `Env`.
    Env(String, String),
}

/// What a built image is made from: recorded in `recipe.json`, hashed for its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecipeSpec {
    pub base_name: String,
    pub base_id: String,
    pub steps: Vec<Step>,
    /// For each copy step in order: a file's mode and content ([`HostFile::id`],
    /// `file:…`), or a directory's [`host_tree`] digest (`tree:…`).
    pub copied: Vec<String>,
    pub network: String,
    #[serde(default)]
    pub allow_hosts: Vec<String>,
}

impl RecipeSpec {
    /// The content id: base, steps in order, copied contents and the network the steps ran
    /// with. The name is not part of it, so one recipe under two names is one id.
    pub fn id(&self) -> String {
        let canonical = serde_json::json!({
            "revision": RECIPE_REVISION,
            "base": self.base_id,
            "steps": self.steps,
            "copied": self.copied,
            "network": self.network,
            "allowHosts": self.allow_hosts,
        });
        hex(&Sha256::digest(canonical.to_string().as_bytes()))
    }
}

/// A host file a single-file copy step copies, as the recipe's id names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    /// Its mode as copied (permissions: set-id bits are never copied).
    pub mode: u32,
    /// SHA-256 of its content.
    pub sha256: String,
}

impl HostFile {
    /// Its entry in [`RecipeSpec::copied`]: the mode is part of it, as a copied directory's
    /// entries' modes are part of its [`host_tree`] digest, so a `chmod +x` rebuilds.
    pub fn id(&self) -> String {
        format!("file:{:04o}:{}", self.mode, self.sha256)
    }
}

/// The host file `path` (a symlink given as the step's path is followed, as the user named
/// it) as a copy step copies it: mode and content read through one open file, so both are
/// of the same file. A file larger than `limits` allows an image (`--max-bytes`) is refused
/// before it is read.
pub fn host_file(path: &Path, limits: Limits) -> Result<HostFile> {
    // Non-blocking: a FIFO is refused below instead of waited on.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!(
            "{} is not a regular file or a directory, which a copy copies",
            path.display()
        )));
    }
    if meta.len() > limits.max_bytes {
        return Err(Error::invalid(format!(
            "copying {}: it is {} bytes, more than {}, the bound on an image's size \
             (--max-bytes)",
            path.display(),
            meta.len(),
            limits.max_bytes
        )));
    }
    Ok(HostFile {
        mode: meta.mode() & 0o777,
        sha256: read_sha256(file, path)?,
    })
}

/// Deepest directory a copied tree may have.
const MAX_TREE_DEPTH: usize = 128;

/// One entry of a host directory a copy step copies, `rel` from that directory (`""` for the
/// directory itself), `/`-separated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum TreeEntry {
    /// Its mode as copied (permissions and the sticky bit).
    Dir { rel: String, mode: u32 },
    /// Its mode as copied (permissions: set-id bits are never copied) and its content's
    /// SHA-256.
    File {
        rel: String,
        mode: u32,
        size: u64,
        sha256: String,
    },
    /// Copied as a link with the target as written, never followed.
    Symlink { rel: String, target: String },
}

/// The host directory `root` as a copy step copies it: its entries, a directory before what it
/// holds and names in byte order, and the tree's digest for the recipe's id (`tree:` and the
/// SHA-256 of the entries: names, kinds, modes as copied, contents' digests, link targets).
/// Nothing below `root` is followed: a symlink is an entry, wherever it points. A FIFO, a
/// socket or a device node refuses the copy, as do a name or link target that is not UTF-8
/// and more entries or bytes than `limits` allow.
pub fn host_tree(root: &Path, limits: Limits) -> Result<(Vec<TreeEntry>, String)> {
    let top = fs::metadata(root).with_context(|| format!("reading {}", root.display()))?;
    if !top.is_dir() {
        return Err(Error::invalid(format!(
            "{} is not a directory",
            root.display()
        )));
    }
    let mut walk = TreeWalk {
        root,
        limits,
        entries: vec![TreeEntry::Dir {
            rel: String::new(),
            mode: top.mode() & 0o1777,
        }],
        bytes: 0,
    };
    walk.dir(root, "", 1)?;
    let listing = serde_json::to_vec(&walk.entries)
        .map_err(|err| Error::internal(format!("listing {}: {err}", root.display())))?;
    Ok((
        walk.entries,
        format!("tree:{}", hex(&Sha256::digest(listing))),
    ))
}

struct TreeWalk<'a> {
    root: &'a Path,
    limits: Limits,
    entries: Vec<TreeEntry>,
    bytes: u64,
}

impl TreeWalk<'_> {
    fn refuse(&self, why: String) -> Error {
        Error::invalid(format!("copying {}: {why}", self.root.display()))
    }

    fn dir(&mut self, host: &Path, rel: &str, depth: usize) -> Result<()> {
        let mut names: Vec<(Vec<u8>, PathBuf)> = Vec::new();
        for entry in fs::read_dir(host).with_context(|| format!("listing {}", host.display()))? {
            let entry = entry.with_context(|| format!("listing {}", host.display()))?;
            names.push((entry.file_name().as_bytes().to_vec(), entry.path()));
        }
        names.sort();
        for (_, path) in names {
            if self.entries.len() as u64 >= self.limits.max_files {
                return Err(self.refuse(format!(
                    "it has more than {} entries, the bound on an image's file count \
                    (--max-files)",
                    self.limits.max_files
                )));
            }
            let name = path
                .file_name()
                .and_then(std::ffi::OsStr::to_str)
                .ok_or_else(|| {
                    self.refuse(format!(
                        "the name of {} is not UTF-8, which a copy cannot carry",
                        path.display()
                    ))
                })?;
            let child = if rel.is_empty() {
                name.to_owned()
            } else {
                format!("{rel}/{name}")
            };
            let meta = fs::symlink_metadata(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                if depth >= MAX_TREE_DEPTH {
                    return Err(self.refuse(format!(
                        "{} is more than {MAX_TREE_DEPTH} directories deep",
                        path.display()
                    )));
                }
                self.entries.push(TreeEntry::Dir {
                    rel: child.clone(),
                    mode: meta.mode() & 0o1777,
                });
                self.dir(&path, &child, depth + 1)?;
            } else if kind.is_symlink() {
                let target =
                    fs::read_link(&path).with_context(|| format!("reading {}", path.display()))?;
                let target = target.to_str().ok_or_else(|| {
                    self.refuse(format!(
                        "the target of the symlink {} is not UTF-8, which a copy cannot carry",
                        path.display()
                    ))
                })?;
                self.entries.push(TreeEntry::Symlink {
                    rel: child,
                    target: target.to_owned(),
                });
            } else if kind.is_file() {
                let (file, opened) = open_host_file(&path)?;
                self.bytes = self.bytes.saturating_add(opened.len());
                if self.bytes > self.limits.max_bytes {
                    return Err(self.refuse(format!(
                        "its files add up to more than {} bytes, the bound on an image's size \
                        (--max-bytes)",
                        self.limits.max_bytes
                    )));
                }
                self.entries.push(TreeEntry::File {
                    rel: child,
                    mode: opened.mode() & 0o777,
                    size: opened.len(),
                    sha256: read_sha256(file, &path)?,
                });
            } else {
                let what = if kind.is_fifo() {
                    "a FIFO"
                } else if kind.is_socket() {
                    "a socket"
                } else {
                    "a device node"
                };
                return Err(self.refuse(format!(
                    "{} is {what}, which a copy does not copy (only directories, files and \
                    symlinks); leave it out of the directory",
                    path.display()
                )));
            }
        }
        Ok(())
    }
}

/// Opens the host file `path` for a copy: never through a symlink, and refused unless what
/// was opened is a regular file (a name swapped for a FIFO is not waited on).
pub fn open_host_file(path: &Path) -> Result<(File, fs::Metadata)> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!(
            "{} is no longer a regular file",
            path.display()
        )));
    }
    Ok((file, meta))
}

fn read_sha256(mut file: File, path: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = io::Read::read(&mut file, &mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What was left out of the upper directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    pub special: u64,
    pub reserved_names: u64,
}

/// Makes the image `name` of `recipe` from `base` and the build's upper directory `upper`
/// (read-only to this function), installed by one rename under the store's build lock.
pub fn install(
    store: &ImageStore,
    name: &str,
    base: &BuiltImage,
    recipe: &RecipeSpec,
    upper: &Path,
    limits: Limits,
    host_trust: &HostTrust,
) -> Result<(BuiltImage, Skipped)> {
    let id = recipe.id();
    let parent = store.dir().join(name);
    let _lock = BuildLock::take(&parent, &|_| {})?;
    if let Some(image) = store.get(name, &id) {
        return Ok((image, Skipped::default()));
    }
    remove_dead_builds(&parent)?;
    let staging = Staging::new(&parent)?;
    let layer_store = LayerStore::in_images_dir(store.dir());
    let _shared = layer_store.lock_shared()?;
    // What a build, pull or import killed mid-unpack left goes now, as a pull's does.
    layer_store.sweep_dead_unpacks();
    let mut layers = Vec::new();
    if base.meta.layers.is_empty() {
        layers.push(rootfs_layer(&layer_store, base, &staging.path, limits)?);
    }
    for diff in &base.meta.layers {
        let digest = Digest::parse(diff)?;
        layers.push(layer_store.get(&digest).ok_or_else(|| {
            Error::conflict(format!(
                "layer {diff} of image {} is missing from the layer store",
                base.name()
            ))
        })?);
    }
    let tar_path = staging.path.join("layer.tar");
    let trust = host_trust.for_build(&base.rootfs(), upper);
    let (diff_id, skipped) = write_layer_tar(upper, &tar_path, &trust)?;
    // `image.recipe.layer=kill`: dies with the layer's tar written, before it is unpacked.
    crate::foundation::failpoint::hit("image.recipe.layer")?;
    let tar = File::open(&tar_path).context("reading the built layer")?;
    let fresh = layer_store.get(&diff_id).is_none();
    let layer = layer_store.unpack(&diff_id, tar, limits, &|| Ok(()))?;
    let layer_dir = layer.dir.clone();
    layers.push(layer);
    let finished = (|| -> Result<BuiltImage> {
        fs::remove_file(&tar_path).context("removing the built layer's tar")?;
        let rootfs = staging.path.join("rootfs");
        fs::create_dir(&rootfs).with_context(|| format!("creating {}", rootfs.display()))?;
        let mut config = base.meta.config.clone().unwrap_or_default();
        let mut env: Vec<String> = config.env.take().unwrap_or_default();
        for step in &recipe.steps {
            if let Step::Env(key, value) = step {
                env.retain(|e| e.split('=').next() != Some(key.as_str()));
                env.push(format!("{key}={value}"));
            }
        }
        config.env = (!env.is_empty()).then_some(env);
        let source = ImageSource {
            format: ImageSource::RECIPE.to_owned(),
            path: format!("{} ({})", recipe.base_name, recipe.base_id),
            manifest_digest: None,
            config_digest: format!("sha256:{id}"),
        };
        let meta = ImageMeta {
            suite: base.meta.suite.clone(),
            packages: base.meta.packages.clone(),
            kernel: base.meta.kernel.clone(),
            ..ImageMeta::layered(name, &id, source, Some(config))
        };
        super::import::assemble_image(&layer_store, &layers, &staging.path, limits, meta)?;
        let json = serde_json::to_string_pretty(recipe)
            .map_err(|err| Error::internal(format!("writing recipe.json: {err}")))?;
        fs::write(staging.path.join(RECIPE_FILE), json).context("writing recipe.json")?;
        let target = store.image_dir(name, &id);
        staging.install(&target)?;
        store
            .get(name, &id)
            .ok_or_else(|| ImageFailure::Unreadable { dir: target }.into())
    })();
    match finished {
        Ok(image) => Ok((image, skipped)),
        Err(err) => {
            // Made by this build and in no image: a failed build leaves no layer behind.
            if fresh {
                if let Err(e) = fs::remove_dir_all(&layer_dir) {
                    tracing::warn!("removing {}: {e}", layer_dir.display());
                }
            }
            Err(err)
        }
    }
}

/// The layer holding the whole rootfs of `base`, an image that keeps no layers (a debian
/// build): made once per base id (the diff id is remembered in `rootfs-layers/<base id>`), then
/// shared by every recipe on that base. The rootfs is DynoCap's own build, owned by host root,
/// so its ids are the guest's as they are.
fn rootfs_layer(
    layer_store: &LayerStore,
    base: &BuiltImage,
    staging: &Path,
    limits: Limits,
) -> Result<super::layers::Layer> {
    let known = layer_store.rootfs_layer_record(base.id());
    if let Some(layer) = fs::read_to_string(&known)
        .ok()
        .and_then(|diff| Digest::parse(diff.trim()).ok())
        .and_then(|digest| layer_store.get(&digest))
    {
        return Ok(layer);
    }
    let tar_path = staging.join("base.tar");
    let (diff_id, _) = write_layer_tar(&base.rootfs(), &tar_path, &BuildTrust::default())?;
    let tar = File::open(&tar_path).context("reading the base's layer")?;
    let layer = layer_store.unpack(&diff_id, tar, limits, &|| Ok(()))?;
    fs::remove_file(&tar_path).context("removing the base's layer tar")?;
    if let Some(dir) = known.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(&known, diff_id.to_string())
        .with_context(|| format!("writing {}", known.display()))?;
    Ok(layer)
}

/// The host's extra CAs (`DYNOCAP_EXTRA_CA`, PEM) as the build sandbox's agent was given
/// them: it joined them into the guest's system bundles and put them in its distribution's
/// local CA directory, for the build's own downloads. None of that is the recipe's, so none of
/// it may reach the image: a sandbox of the image trusts what the host configures when it
/// starts, and an image built while a CA was configured must not trust it for good.
///
/// A `filtered` build's agent also switched the guest's `http://` apt sources to `https://`
/// (the proxy carries HTTPS only): a sources file that is the base's with only that change
/// is left to the base, so the image's apt reads the mirrors its base named.
#[derive(Debug, Clone, Default)]
pub struct HostTrust {
    pem: Option<String>,
    filtered: bool,
}

impl HostTrust {
    /// `pem`: the extra CAs the build's sandbox is given; `filtered`: whether it is a
    /// `filtered` one.
    pub fn new(pem: Option<String>, filtered: bool) -> HostTrust {
        HostTrust {
            pem: pem.filter(|pem| !certificates(pem).is_empty()),
            filtered,
        }
    }

    /// What to take out of the layer of a build on `base_rootfs` whose upper directory is
    /// `upper`: every extra certificate but those the recipe (or its base) installs as a local
    /// CA of its own, which its bundles then hold of its own accord.
    fn for_build(&self, base_rootfs: &Path, upper: &Path) -> BuildTrust {
        let Some(pem) = &self.pem else {
            return BuildTrust {
                base_rootfs: Some(base_rootfs.to_owned()),
                apt_https: self.filtered,
                ..BuildTrust::default()
            };
        };
        let mut own = std::collections::HashSet::new();
        for root in [base_rootfs, upper] {
            for anchor in dynocap_proto::trust::LOCAL_ANCHORS {
                let Some(dir) = Path::new(anchor).parent() else {
                    continue;
                };
                own_anchors(root, dir, 2, &mut own);
            }
        }
        BuildTrust {
            base_rootfs: Some(base_rootfs.to_owned()),
            apt_https: self.filtered,
            text: pem.clone(),
            strip: certificates(pem)
                .into_iter()
                .filter(|cert| !own.contains(cert))
                .collect(),
        }
    }
}

/// Adds the certificates of the local CA files under guest directory `dir` of `root` (to
/// `depth` levels; DynoCap's own anchor files left out) to `found`. Nothing is followed and no
/// path below `root` resolved (see [`Walk`]): the upper directory is the guest's, and may be
/// changing.
fn own_anchors(
    root: &Path,
    dir: &Path,
    depth: usize,
    found: &mut std::collections::HashSet<String>,
) {
    let Some(at) = dir
        .strip_prefix("/")
        .ok()
        .and_then(|rel| dir_in_root(root, rel))
    else {
        return;
    };
    walk_anchors(&at, depth, found);
}

/// The directory `rel` of `root` (an image's rootfs or an upper directory, whose own path is
/// the host's), opened one component at a time from `root`, none a link: no link of theirs
/// leads out of them.
fn dir_in_root(root: &Path, rel: &Path) -> Option<File> {
    let mut at = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(root)
        .ok()?;
    for part in rel.components() {
        let std::path::Component::Normal(name) = part else {
            return None;
        };
        at = open_entry(&at, name.as_bytes(), libc::O_RDONLY | libc::O_DIRECTORY).ok()?;
    }
    Some(at)
}

/// The text of file `rel` in `root` (see [`dir_in_root`] and [`read_small`]).
fn read_in_root(root: &Path, rel: &Path) -> Option<String> {
    let dir = dir_in_root(root, rel.parent()?)?;
    let mut file = open_regular(&dir, rel.file_name()?.as_bytes())?;
    read_small(&mut file)
}

/// The regular file `name` of the open directory `dir`, opened for reading without following
/// a link (nor waiting on a FIFO): `None` for anything else.
fn open_regular(dir: &File, name: &[u8]) -> Option<File> {
    let file = open_entry(dir, name, libc::O_RDONLY | libc::O_NONBLOCK).ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

fn walk_anchors(dir: &File, depth: usize, found: &mut std::collections::HashSet<String>) {
    let Ok(mut listing) = nix::dir::Dir::openat(
        dir.as_fd(),
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) else {
        return;
    };
    let names: Vec<Vec<u8>> = listing
        .iter()
        .flatten()
        .map(|entry| entry.file_name().to_bytes().to_vec())
        .filter(|name| name != b"." && name != b"..")
        .collect();
    for name in names {
        if name.starts_with(dynocap_proto::trust::ANCHOR_STEM.as_bytes()) {
            continue;
        }
        let Ok(entry) = open_entry(dir, &name, libc::O_PATH) else {
            continue;
        };
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if meta.is_dir() && depth > 1 {
            if let Ok(sub) = open_entry(&entry, b".", libc::O_RDONLY | libc::O_DIRECTORY) {
                walk_anchors(&sub, depth - 1, found);
            }
        } else if meta.is_file() {
            if let Some(text) = open_regular(dir, &name).and_then(|mut f| read_small(&mut f)) {
                found.extend(certificates(&text));
            }
        }
    }
}

/// Largest trust file read: distributions' bundles are about 200 KB.
const TRUST_FILE_MAX: u64 = 8 << 20;

/// The text of the open regular file `file`, from its start, if it is at most
/// [`TRUST_FILE_MAX`] bytes; the file is left at its start again, to be copied whole after.
fn read_small(file: &mut File) -> Option<String> {
    use io::Seek as _;
    let len = file.metadata().ok()?.len();
    let text = (len <= TRUST_FILE_MAX)
        .then(|| {
            let mut text = String::new();
            io::Read::read_to_string(&mut io::Read::take(&mut *file, TRUST_FILE_MAX), &mut text)
                .ok()
                .map(|_| text)
        })
        .flatten();
    file.seek(io::SeekFrom::Start(0)).ok()?;
    text
}

/// The PEM certificate blocks of `text`, each with its whitespace taken out, so the same
/// certificate compares equal however its lines end (as the agent compares them).
fn certificates(text: &str) -> Vec<String> {
    pem_blocks(text)
        .into_iter()
        .map(|(start, end)| text[start..end].split_whitespace().collect())
        .collect()
}

/// Byte ranges of the PEM certificate blocks of `text`.
fn pem_blocks(text: &str) -> Vec<(usize, usize)> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(start) = text[from..].find(BEGIN).map(|i| from + i) {
        let Some(len) = text[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        found.push((start, end));
        from = end;
    }
    found
}

/// What one build's layer leaves out of the guest's trust store ([`HostTrust::for_build`]).
#[derive(Debug, Clone, Default)]
struct BuildTrust {
    /// The base's rootfs: a bundle's certificates before the build.
    base_rootfs: Option<PathBuf>,
    /// The extra CAs' PEM as the agent appended it.
    text: String,
    /// Their certificates (whitespace taken out) that are no local CA of the recipe's.
    strip: std::collections::HashSet<String>,
    /// The agent switched the guest's apt sources to `https://` (a `filtered` build).
    apt_https: bool,
}

/// Whether guest path `guest` is an apt sources file, as the agent switches them.
fn is_apt_sources(guest: &Path) -> bool {
    guest == Path::new("/etc/apt/sources.list")
        || (guest.parent() == Some(Path::new("/etc/apt/sources.list.d"))
            && guest
                .extension()
                .is_some_and(|e| e == "list" || e == "sources"))
}

/// Whether `now` is `before` with some of its `http://` made `https://` and nothing else
/// changed: what the agent does to a `filtered` guest's apt sources.
fn only_made_https(before: &str, now: &str) -> bool {
    let (before, now) = (before.as_bytes(), now.as_bytes());
    let (mut i, mut j) = (0, 0);
    let mut switched = false;
    while i < before.len() && j < now.len() {
        if before[i] == now[j] {
            i += 1;
            j += 1;
        } else if before[i..].starts_with(b"://")
            && now[j..].starts_with(b"s://")
            && i >= 4
            && before[i - 4..i].eq_ignore_ascii_case(b"http")
        {
            switched = true;
            j += 1;
        } else {
            return false;
        }
    }
    switched && i == before.len() && j == now.len()
}

impl BuildTrust {
    fn active(&self) -> bool {
        !self.text.is_empty()
    }

    /// Whether guest path `guest` is a bundle the extra CAs are taken out of: a system
    /// bundle, or one Fedora's `update-ca-trust` extracts beside it.
    fn is_bundle(guest: &Path) -> bool {
        dynocap_proto::trust::SYSTEM_BUNDLES
            .iter()
            .any(|b| Path::new(b) == guest)
            || (guest.starts_with("/etc/pki/ca-trust/extracted/pem")
                && guest.extension().is_some_and(|e| e == "pem"))
    }

    /// Whether the entry at guest path `guest` is the agent's anchor file, or a bundle tool's
    /// link to it (`/etc/ssl/certs/dynocap-extra-ca.pem`, and its hash link to that).
    fn is_agents(guest: &Path, link_target: Option<&Path>) -> bool {
        if dynocap_proto::trust::LOCAL_ANCHORS
            .iter()
            .any(|a| Path::new(a) == guest)
        {
            return true;
        }
        link_target.is_some_and(|target| {
            target.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with(dynocap_proto::trust::ANCHOR_STEM)
            })
        })
    }

    /// `bundle` without the extra CAs: the agent's append taken out whole where it is, then
    /// any of their certificates a bundle tool copied in (from the agent's anchor file).
    /// `kept` are the certificates the base's bundle at the same path holds: trusted before
    /// the build, they stay.
    fn strip(&self, bundle: &str, kept: &[String]) -> String {
        let mut text = bundle.to_owned();
        let all_strippable = certificates(&self.text)
            .iter()
            .all(|cert| self.strip.contains(cert) && !kept.contains(cert));
        if all_strippable && !self.text.is_empty() {
            if let Some(at) = text.rfind(self.text.as_str()) {
                let mut end = at + self.text.len();
                if !self.text.ends_with('\n') && text[end..].starts_with('\n') {
                    end += 1;
                }
                text.replace_range(at..end, "");
            }
        }
        for (start, end) in pem_blocks(&text).into_iter().rev() {
            let cert: String = text[start..end].split_whitespace().collect();
            if self.strip.contains(&cert) && !kept.contains(&cert) {
                let mut end = end;
                if text[end..].starts_with("\r\n") {
                    end += 2;
                } else if text[end..].starts_with('\n') {
                    end += 1;
                }
                text.replace_range(start..end, "");
            }
        }
        text
    }
}

/// Writes the layer tar of `upper` to `dest`, hashing it: its diff id. What `trust` says
/// the agent added to the guest's trust store is left out.
fn write_layer_tar(upper: &Path, dest: &Path, trust: &BuildTrust) -> Result<(Digest, Skipped)> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)
        .with_context(|| format!("creating {}", dest.display()))?;
    let hashing = HashingWriter {
        inner: io::BufWriter::new(file),
        hasher: Sha256::new(),
    };
    let mut builder = tar::Builder::new(hashing);
    builder.mode(tar::HeaderMode::Complete);
    builder.follow_symlinks(false);
    // The upper directory's own path is the host's; below it, everything is reached from an
    // open directory by name (see `Walk`).
    let top = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(upper)
        .with_context(|| format!("reading {}", upper.display()))?;
    let meta = top
        .metadata()
        .with_context(|| format!("reading {}", upper.display()))?;
    let mut walk = Walk {
        base_uid: u64::from(meta.uid()),
        base_gid: u64::from(meta.gid()),
        skipped: Skipped::default(),
        trust,
        upper,
    };
    walk.walk(&mut builder, top)?;
    let mut hashing = builder
        .into_inner()
        .map_err(|e| Error::internal(format!("writing the built layer: {e}")))?;
    hashing
        .inner
        .flush()
        .map_err(|e| Error::internal(format!("writing the built layer: {e}")))?;
    let digest = Digest::parse(&format!("sha256:{}", hex(&hashing.hasher.finalize())))?;
    Ok((digest, walk.skipped))
}

struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The deepest directory a built layer may have: the bound every layer is unpacked within
/// (a deeper one would be refused once made), well within the walk's descriptors (one per
/// level).
const MAX_LAYER_DEPTH: usize = super::unpack::MAX_DIR_DEPTH;

/// The walk of an upper directory into a layer tar. A process a step started may still be
/// running in the guest and changing the upper while it is read, so no path below the upper
/// is ever resolved: each entry is opened by name from its open parent directory, without
/// following a link, and what is written is what that descriptor shows. A directory swapped
/// for a link midway is never entered (a path through it would lead to the host's files).
struct Walk<'a> {
    base_uid: u64,
    base_gid: u64,
    skipped: Skipped,
    trust: &'a BuildTrust,
    /// The upper directory's path, for messages.
    upper: &'a Path,
}

impl Walk<'_> {
    fn guest_id(host: u32, base: u64) -> u64 {
        let host = u64::from(host);
        if host >= base && host - base < GUEST_IDS {
            host - base
        } else {
            0
        }
    }

    fn header(&self, meta: &fs::Metadata, kind: tar::EntryType) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(meta.mode() & 0o7777);
        header.set_uid(Self::guest_id(meta.uid(), self.base_uid));
        header.set_gid(Self::guest_id(meta.gid(), self.base_gid));
        header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
        header.set_size(0);
        header
    }

    /// The error for an entry that changed between two looks at it: a process the steps
    /// started is still running in the build's sandbox.
    fn changed(&self, rel: &Path) -> Error {
        Error::conflict(format!(
            "/{} changed in the build's sandbox while its layer was read ({}): a process a \
             step started is still running there; end it in the step that starts it (do not \
             leave it in the background), then build again",
            rel.display(),
            self.upper.display()
        ))
    }

    /// Writes the tree of the open upper directory `top`, each directory before what it
    /// holds and names in byte order. Iterative, one open directory per level: a guest may
    /// nest directories deeper than any stack would hold.
    fn walk<W: Write>(&mut self, builder: &mut tar::Builder<W>, top: File) -> Result<()> {
        struct Level {
            dir: File,
            rel: PathBuf,
            names: std::vec::IntoIter<Vec<u8>>,
        }
        let names = list_names(&top, Path::new(""))?;
        let mut stack = vec![Level {
            dir: top,
            rel: PathBuf::new(),
            names: names.into_iter(),
        }];
        while let Some(level) = stack.last_mut() {
            let Some(name) = level.names.next() else {
                stack.pop();
                continue;
            };
            let rel = level.rel.join(std::ffi::OsStr::from_bytes(&name));
            let Some(sub) = self.entry(builder, &level.dir, &name, &rel)? else {
                continue;
            };
            // `stack.len()` directories below the upper.
            if stack.len() > MAX_LAYER_DEPTH {
                return Err(Error::invalid(format!(
                    "the build made /{}… more than {MAX_LAYER_DEPTH} directories deep, deeper \
                     than a built layer may be",
                    super::oci::printable(&rel.to_string_lossy())
                )));
            }
            let names = list_names(&sub, &rel)?;
            stack.push(Level {
                dir: sub,
                rel,
                names: names.into_iter(),
            });
        }
        Ok(())
    }

    /// Writes entry `name` of the open directory `dir`, at `rel` in the layer; a directory's
    /// own descriptor is returned, for the walk to go into.
    fn entry<W: Write>(
        &mut self,
        builder: &mut tar::Builder<W>,
        dir: &File,
        name: &[u8],
        rel: &Path,
    ) -> Result<Option<File>> {
        if NOT_IMAGE.iter().any(|n| rel == Path::new(n)) {
            return Ok(None);
        }
        if name.starts_with(b".wh.") {
            self.skipped.reserved_names += 1;
            return Ok(None);
        }
        // The entry itself (a link is not followed), as `lstat` would see it; gone
        // meanwhile, the upper is changing.
        let entry = match open_entry(dir, name, libc::O_PATH) {
            Ok(entry) => entry,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Err(self.changed(rel)),
            Err(err) => {
                return Err(Error::internal(format!(
                    "reading /{} of the build's upper directory: {err}",
                    rel.display()
                )))
            }
        };
        let meta = entry
            .metadata()
            .with_context(|| format!("reading /{}", rel.display()))?;
        let kind = meta.file_type();
        let io_err = |e: io::Error| Error::internal(format!("writing the built layer: {e}"));
        if kind.is_dir() {
            // The very directory looked at: "." from its own descriptor.
            let opened = open_entry(&entry, b".", libc::O_RDONLY | libc::O_DIRECTORY)
                .with_context(|| format!("reading /{}", rel.display()))?;
            drop(entry);
            let mut header = self.header(&meta, tar::EntryType::Directory);
            builder
                .append_data(&mut header, rel, io::empty())
                .map_err(io_err)?;
            if is_opaque(&opened) {
                let mut header = self.header(&meta, tar::EntryType::Regular);
                header.set_mode(0o644);
                builder
                    .append_data(&mut header, rel.join(".wh..wh..opq"), io::empty())
                    .map_err(io_err)?;
            }
            return Ok(Some(opened));
        } else if kind.is_char_device() && meta.rdev() == 0 {
            let mut header = self.header(&meta, tar::EntryType::Regular);
            header.set_mode(0o644);
            let mut wh = b".wh.".to_vec();
            wh.extend_from_slice(name);
            let parent = rel.parent().unwrap_or(Path::new(""));
            builder
                .append_data(
                    &mut header,
                    parent.join(std::ffi::OsStr::from_bytes(&wh)),
                    io::empty(),
                )
                .map_err(io_err)?;
        } else if kind.is_symlink() {
            // The link looked at, by its own descriptor (an empty path).
            let target = nix::fcntl::readlinkat(entry.as_fd(), "")
                .map(PathBuf::from)
                .map_err(|err| {
                    Error::internal(format!("reading the link /{}: {err}", rel.display()))
                })?;
            if self.trust.active()
                && rel.starts_with("etc/ssl/certs")
                && BuildTrust::is_agents(&Path::new("/").join(rel), Some(&target))
            {
                return Ok(None);
            }
            let mut header = self.header(&meta, tar::EntryType::Symlink);
            builder
                .append_link(&mut header, rel, &target)
                .map_err(io_err)?;
        } else if kind.is_file() {
            // Opened by name again to read it (an `O_PATH` descriptor reads nothing): it
            // must be the file looked at, not what the guest put in its place since.
            let mut file = open_entry(dir, name, libc::O_RDONLY | libc::O_NONBLOCK)
                .map_err(|_| self.changed(rel))?;
            let opened = file
                .metadata()
                .with_context(|| format!("reading /{}", rel.display()))?;
            if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
                return Err(self.changed(rel));
            }
            let guest = Path::new("/").join(rel);
            if self.trust.active() && BuildTrust::is_agents(&guest, None) {
                return Ok(None);
            }
            if self.trust.apt_https && is_apt_sources(&guest) {
                let before = self
                    .trust
                    .base_rootfs
                    .as_deref()
                    .and_then(|base| read_in_root(base, rel));
                if let (Some(before), Some(now)) = (before, read_small(&mut file)) {
                    if only_made_https(&before, &now) {
                        return Ok(None);
                    }
                }
            }
            if self.trust.active() && BuildTrust::is_bundle(&guest) {
                if let Some(bundle) = read_small(&mut file) {
                    let before = self
                        .trust
                        .base_rootfs
                        .as_deref()
                        .and_then(|base| read_in_root(base, rel));
                    let kept = before.as_deref().map(certificates).unwrap_or_default();
                    let stripped = self.trust.strip(&bundle, &kept);
                    if stripped != bundle {
                        // Just what the base had: the base's file shows through.
                        if before.as_deref() == Some(stripped.as_str()) {
                            return Ok(None);
                        }
                        let mut header = self.header(&opened, tar::EntryType::Regular);
                        header.set_size(stripped.len() as u64);
                        builder
                            .append_data(&mut header, rel, stripped.as_bytes())
                            .map_err(io_err)?;
                        return Ok(None);
                    }
                }
            }
            let mut header = self.header(&opened, tar::EntryType::Regular);
            header.set_size(opened.len());
            // Exactly the size the header declares, whatever the file grows or shrinks
            // to meanwhile (short, the rest is zeros): the tar stays well formed.
            let content = io::Read::take(
                io::Read::chain(io::Read::take(file, opened.len()), io::repeat(0)),
                opened.len(),
            );
            builder
                .append_data(&mut header, rel, content)
                .map_err(io_err)?;
        } else {
            self.skipped.special += 1;
        }
        Ok(None)
    }
}

/// The names in the open directory `dir` (at `rel`, for messages), in byte order.
fn list_names(dir: &File, rel: &Path) -> Result<Vec<Vec<u8>>> {
    let listed = |err: nix::errno::Errno| {
        Error::internal(format!(
            "listing /{} of the build's upper directory: {err}",
            rel.display()
        ))
    };
    let mut listing = nix::dir::Dir::openat(
        dir.as_fd(),
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(listed)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let name = entry.map_err(listed)?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Opens `name` in the open directory `dir` with `flags` (and `O_NOFOLLOW`, `O_CLOEXEC`,
/// `O_NOCTTY`): a link is never followed, and never left for a later lookup to follow.
fn open_entry(dir: &File, name: &[u8], flags: libc::c_int) -> io::Result<File> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: `dir` is an open descriptor and `name` a NUL-terminated string, both alive
    // across the call; the descriptor returned is owned by the `File` made from it below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened by this call and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `user.overlay.opaque` (the jail mounts with `userxattr`) or `trusted.overlay.opaque` is `y`
/// on the open directory `dir`.
fn is_opaque(dir: &File) -> bool {
    ["user.overlay.opaque", "trusted.overlay.opaque"]
        .iter()
        .any(|attr| {
            let Ok(cattr) = CString::new(*attr) else {
                return false;
            };
            let mut value = [0u8; 4];
            // SAFETY: `dir` is an open descriptor and the name NUL-terminated, both alive
            // across the call; the buffer is ours and its length is passed.
            let n = unsafe {
                libc::fgetxattr(
                    dir.as_raw_fd(),
                    cattr.as_ptr(),
                    value.as_mut_ptr().cast(),
                    value.len(),
                )
            };
            n == 1 && value[0] == b'y'
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_copied_file_is_named_by_its_mode_and_content() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tool.sh");
        fs::write(&path, "#!/bin/sh\n").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        let limits = Limits {
            max_bytes: 1 << 20,
            max_files: 10,
        };
        let first = host_file(&path, limits).expect("file");
        assert_eq!(first.mode, 0o644);
        assert!(first.id().starts_with("file:0644:"), "{}", first.id());
        // Written again with the same content: the same id.
        fs::write(&path, "#!/bin/sh\n").expect("write");
        assert_eq!(host_file(&path, limits).expect("file"), first);
        // chmod +x: another id, the content's digest the same.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        let executable = host_file(&path, limits).expect("file");
        assert_eq!(executable.sha256, first.sha256);
        assert_ne!(executable.id(), first.id());
        // Set-id bits are never copied, so they are not part of it.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o4755)).expect("chmod");
        assert_eq!(host_file(&path, limits).expect("file"), executable);
        nix::unistd::mkfifo(
            &dir.path().join("pipe"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .expect("mkfifo");
        assert!(host_file(&dir.path().join("pipe"), limits).is_err());
        // Larger than an image may be: refused before it is read, naming the bound.
        let big = dir.path().join("big");
        File::create(&big)
            .and_then(|f| f.set_len((1 << 20) + 1))
            .expect("sparse file");
        let err = host_file(&big, limits).expect_err("too large");
        assert!(err.message.contains("--max-bytes"), "{err}");
    }

    #[test]
    fn the_id_follows_base_steps_and_content_not_the_name() {
        let spec = RecipeSpec {
            base_name: "bb".into(),
            base_id: "a".repeat(64),
            steps: vec![Step::Run("true".into()), Step::Env("K".into(), "V".into())],
            copied: vec![],
            network: "none".into(),
            allow_hosts: vec![],
        };
        let renamed = RecipeSpec {
            base_name: "other".into(),
            ..spec.clone()
        };
        assert_eq!(spec.id(), renamed.id());
        let mut changed = spec.clone();
        changed.steps.push(Step::Run("true".into()));
        assert_ne!(spec.id(), changed.id());
        let mut copied = spec.clone();
        copied.copied.push("0".repeat(64));
        assert_ne!(spec.id(), copied.id());
    }

    #[test]
    fn a_host_tree_lists_links_as_links_and_its_digest_follows_content_not_times() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("tree");
        fs::create_dir_all(root.join("sub")).expect("mkdir");
        fs::write(root.join("sub/run.sh"), b"#!/bin/sh\n").expect("write");
        fs::set_permissions(
            root.join("sub/run.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o4755),
        )
        .expect("chmod");
        fs::write(dir.path().join("secret"), b"host only").expect("write");
        std::os::unix::fs::symlink("../secret", root.join("out")).expect("symlink");
        std::os::unix::fs::symlink(dir.path(), root.join("host-dir")).expect("symlink");
        let limits = Limits::default();
        let (entries, digest) = host_tree(&root, limits).expect("tree");
        let rels: Vec<(&str, &str)> = entries
            .iter()
            .map(|e| match e {
                TreeEntry::Dir { rel, .. } => ("d", rel.as_str()),
                TreeEntry::File { rel, .. } => ("f", rel.as_str()),
                TreeEntry::Symlink { rel, .. } => ("l", rel.as_str()),
            })
            .collect();
        assert_eq!(
            rels,
            [
                ("d", ""),
                ("l", "host-dir"),
                ("l", "out"),
                ("d", "sub"),
                ("f", "sub/run.sh")
            ]
        );
        assert!(entries.contains(&TreeEntry::File {
            rel: "sub/run.sh".into(),
            mode: 0o755,
            size: 10,
            sha256: hex(&Sha256::digest(b"#!/bin/sh\n")),
        }));
        assert!(digest.starts_with("tree:"));
        // What a link points at is not part of the tree.
        fs::write(dir.path().join("secret"), b"changed").expect("write");
        assert_eq!(host_tree(&root, limits).expect("tree").1, digest);
        fs::write(root.join("sub/run.sh"), b"#!/bin/sh -e\n").expect("write");
        let changed = host_tree(&root, limits).expect("tree").1;
        assert_ne!(changed, digest);
        fs::set_permissions(
            root.join("sub/run.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("chmod");
        assert_ne!(host_tree(&root, limits).expect("tree").1, changed);

        let few = Limits {
            max_files: 3,
            ..limits
        };
        let err = host_tree(&root, few).expect_err("too many");
        assert!(err.message.contains("--max-files"), "{err}");
        let small = Limits {
            max_bytes: 4,
            ..limits
        };
        let err = host_tree(&root, small).expect_err("too big");
        assert!(err.message.contains("--max-bytes"), "{err}");
        let fifo = CString::new(root.join("sub/pipe").as_os_str().as_bytes()).expect("c");
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let err = host_tree(&root, limits).expect_err("fifo");
        assert!(
            err.message
                .contains("sub/pipe is a FIFO, which a copy does not copy"),
            "{err}"
        );
    }

    #[test]
    fn dynocaps_own_directories_are_told_by_component() {
        assert_eq!(in_dynocap_own("/run/dynocap/x"), Some("run/dynocap"));
        assert_eq!(in_dynocap_own("//run/./dynocap"), Some("run/dynocap"));
        assert_eq!(in_dynocap_own("/.dynocap/agent"), Some(".dynocap"));
        assert_eq!(
            in_dynocap_own("/var/lib/dynocap/x"),
            Some("var/lib/dynocap")
        );
        assert_eq!(in_dynocap_own("/run/dynocap-x"), None);
        assert_eq!(in_dynocap_own("/dynocap"), None);
        assert_eq!(in_dynocap_own("/run"), None);
    }

    #[test]
    fn an_upper_becomes_a_layer_tar_with_whiteouts_and_ids_mapped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let upper = dir.path().join("upper");
        fs::create_dir_all(upper.join("etc")).expect("mkdir");
        fs::write(upper.join("etc/new"), b"hello").expect("write");
        fs::write(upper.join(".wh.sneaky"), b"").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", upper.join("link")).expect("symlink");
        fs::create_dir_all(upper.join("var/lib/dynocap")).expect("mkdir");
        fs::create_dir_all(upper.join("var/lib/dynocap-egress")).expect("mkdir");
        fs::write(
            upper.join("var/lib/dynocap-egress/ca-certificates.crt"),
            b"ca",
        )
        .expect("write");
        fs::create_dir_all(upper.join("etc/apt/apt.conf.d")).expect("mkdir");
        fs::write(upper.join("etc/apt/apt.conf.d/00dynocap-egress"), b"x").expect("write");
        fs::write(
            upper.join("etc/apt/apt.conf.d/zz-dynocap-package-cache"),
            b"x",
        )
        .expect("write");
        fs::write(upper.join("etc/apt/apt.conf.d/99mine"), b"x").expect("write");
        fs::create_dir_all(upper.join("run/dynocap")).expect("mkdir");
        let sock = upper.join("run/dynocap/sudo.sock");
        let _listening = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let whiteout = CString::new(upper.join("etc/gone").as_os_str().as_bytes()).expect("c");
        // SAFETY: a NUL-terminated path; mknod of a 0/0 char device is an overlay whiteout.
        let made = unsafe { libc::mknod(whiteout.as_ptr(), libc::S_IFCHR, 0) };
        // A directory the guest removed and made again: overlay marks it opaque.
        fs::create_dir(upper.join("opaque")).expect("mkdir");
        let opaque = CString::new(upper.join("opaque").as_os_str().as_bytes()).expect("c");
        // SAFETY: NUL-terminated path and name, and a buffer of the length passed.
        let marked = unsafe {
            libc::setxattr(
                opaque.as_ptr(),
                c"user.overlay.opaque".as_ptr(),
                b"y".as_ptr().cast(),
                1,
                0,
            )
        };
        let dest = dir.path().join("layer.tar");
        let (_, skipped) = write_layer_tar(&upper, &dest, &BuildTrust::default()).expect("tar");
        assert_eq!(skipped.reserved_names, 1);
        assert_eq!(
            skipped.special, 0,
            "the sudo socket's directory is DynoCap's own"
        );
        let mut archive = tar::Archive::new(File::open(&dest).expect("open"));
        let mut names: Vec<String> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                assert_eq!(e.header().uid().expect("uid"), 0);
                e.path().expect("path").display().to_string()
            })
            .collect();
        names.sort();
        let mut want = vec![
            "etc",
            "etc/apt",
            "etc/apt/apt.conf.d",
            "etc/apt/apt.conf.d/99mine",
            "etc/new",
            "link",
            "opaque",
            "run",
            "var",
            "var/lib",
        ];
        if made == 0 {
            want.push("etc/.wh.gone");
        }
        if marked == 0 {
            want.push("opaque/.wh..wh..opq");
        }
        want.sort();
        assert_eq!(names, want);
    }

    /// A process a step left running swaps a directory of the upper for a link to a host
    /// directory while the layer is read (an exchange, so the name is never missing): whatever
    /// the timing, nothing of the host directory reaches the layer (the walk may fail, saying
    /// the upper changed). Walked by path, the walk listed and read the host's files through
    /// the link in a good share of tries.
    #[test]
    fn a_directory_swapped_for_a_link_while_read_brings_in_nothing_of_the_host() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().expect("tempdir");
        let host = dir.path().join("host");
        fs::create_dir(&host).expect("mkdir");
        fs::write(host.join("zzz"), b"HOST SECRET").expect("write");
        let upper = dir.path().join("upper");
        fs::create_dir_all(upper.join("x/d")).expect("mkdir");
        fs::write(upper.join("x/d/aaa"), vec![b'a'; 1 << 16]).expect("write");
        fs::write(upper.join("x/d/zzz"), b"guest").expect("write");
        std::os::unix::fs::symlink(&host, upper.join("x/l")).expect("symlink");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let racer = {
            let stop = stop.clone();
            let (d, l) = (upper.join("x/d"), upper.join("x/l"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &d,
                        nix::fcntl::AT_FDCWD,
                        &l,
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    )
                    .expect("exchange");
                }
            })
        };
        let dest = dir.path().join("layer.tar");
        let (mut written, mut leaked) = (0, None);
        for _ in 0..300 {
            let _ = fs::remove_file(&dest);
            if write_layer_tar(&upper, &dest, &BuildTrust::default()).is_err() {
                continue;
            }
            written += 1;
            let mut archive = tar::Archive::new(File::open(&dest).expect("open"));
            for entry in archive.entries().expect("entries") {
                let mut entry = entry.expect("entry");
                let mut content = Vec::new();
                io::Read::read_to_end(&mut entry, &mut content).expect("read");
                if content.windows(11).any(|w| w == b"HOST SECRET") {
                    leaked = Some(entry.path().expect("path").display().to_string());
                }
            }
            if leaked.is_some() {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        racer.join().expect("racer");
        assert_eq!(leaked, None, "the host's file reached the layer");
        assert!(written > 0, "no walk got through");
    }

    /// A guest can nest directories far deeper than a path may be long; the walk, which
    /// holds a descriptor and a stack frame per level, refuses past a depth of its own
    /// instead of running out of either.
    #[test]
    fn an_upper_nested_too_deep_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let upper = dir.path().join("upper");
        fs::create_dir(&upper).expect("mkdir");
        // Made one level at a time from the last one's descriptor: the whole path is too
        // long for any one call.
        let mut at = File::open(&upper).expect("open");
        for _ in 0..MAX_LAYER_DEPTH + 1 {
            nix::sys::stat::mkdirat(
                at.as_fd(),
                "d",
                nix::sys::stat::Mode::from_bits_truncate(0o755),
            )
            .expect("mkdirat");
            at = open_entry(&at, b"d", libc::O_RDONLY | libc::O_DIRECTORY).expect("open");
        }
        let dest = dir.path().join("layer.tar");
        let err = write_layer_tar(&upper, &dest, &BuildTrust::default()).expect_err("too deep");
        assert!(
            err.message
                .contains(&format!("more than {MAX_LAYER_DEPTH} directories deep")),
            "{err}"
        );
        // Within the bound, written whole.
        let deep = (0..MAX_LAYER_DEPTH)
            .map(|_| "d")
            .collect::<Vec<_>>()
            .join("/");
        let mut at = File::open(&upper).expect("open");
        for _ in 0..MAX_LAYER_DEPTH - 1 {
            at = open_entry(&at, b"d", libc::O_RDONLY | libc::O_DIRECTORY).expect("open");
        }
        nix::unistd::unlinkat(at.as_fd(), "d/d", nix::unistd::UnlinkatFlags::RemoveDir)
            .expect("rmdir");
        let _ = fs::remove_file(&dest);
        let entries = layer_of(&upper, &BuildTrust::default(), &dest);
        assert_eq!(entries.len(), MAX_LAYER_DEPTH);
        assert!(entries.contains_key(&deep));
    }

    fn pem(body: &str) -> String {
        format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n")
    }

    /// The layer's entries and their contents (files), by name.
    fn layer_of(upper: &Path, trust: &BuildTrust, dest: &Path) -> BTreeMap<String, String> {
        let _ = fs::remove_file(dest);
        write_layer_tar(upper, dest, trust).expect("tar");
        let mut archive = tar::Archive::new(File::open(dest).expect("open"));
        archive
            .entries()
            .expect("entries")
            .map(|e| {
                let mut e = e.expect("entry");
                let name = e.path().expect("path").display().to_string();
                let mut text = String::new();
                io::Read::read_to_string(&mut e, &mut text).expect("read");
                (name, text)
            })
            .collect()
    }

    #[test]
    fn the_host_extra_cas_the_agent_joined_stay_out_of_the_layer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (base, upper) = (dir.path().join("base"), dir.path().join("upper"));
        let system = pem("U1lTVEVN");
        let extra = format!("# the host's CA\n{}", pem("RVhUUkE="));
        let mine = pem("TUlORQ==");
        let bundle = "etc/ssl/certs/ca-certificates.crt";
        for root in [&base, &upper] {
            fs::create_dir_all(root.join("etc/ssl/certs")).expect("mkdir");
            fs::create_dir_all(root.join("usr/local/share/ca-certificates")).expect("mkdir");
        }
        fs::write(base.join(bundle), &system).expect("write");
        // What the agent wrote, and what update-ca-certificates made of its anchor.
        fs::write(upper.join(bundle), format!("{system}{extra}")).expect("write");
        let anchor = "usr/local/share/ca-certificates/dynocap-extra-ca.crt";
        fs::write(upper.join(anchor), &extra).expect("write");
        std::os::unix::fs::symlink(
            format!("/{anchor}"),
            upper.join("etc/ssl/certs/dynocap-extra-ca.pem"),
        )
        .expect("symlink");
        std::os::unix::fs::symlink(
            "dynocap-extra-ca.pem",
            upper.join("etc/ssl/certs/0a1b2c3d.0"),
        )
        .expect("symlink");
        fs::write(upper.join("etc/made"), "made").expect("write");
        let host = HostTrust::new(Some(extra.clone()), false);
        let dest = dir.path().join("layer.tar");

        let layer = layer_of(&upper, &host.for_build(&base, &upper), &dest);
        let names: Vec<&str> = layer.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "etc",
                "etc/made",
                "etc/ssl",
                "etc/ssl/certs",
                "usr",
                "usr/local",
                "usr/local/share",
                "usr/local/share/ca-certificates"
            ],
            "the bundle is the base's again (so left to it), the anchor and its links gone"
        );
        // Without an extra CA configured, the layer is the upper as it is.
        assert!(layer_of(
            &upper,
            &HostTrust::new(None, false).for_build(&base, &upper),
            &dest
        )
        .contains_key(anchor));

        // The recipe's own change to the bundle, and a bundle tool's copy of the extra CA
        // (whitespace of its own): the recipe's stays, the copy goes.
        let copied = pem("RVhUUkE=").replace('\n', "\r\n");
        fs::write(upper.join(bundle), format!("{system}{extra}{mine}{copied}")).expect("write");
        let layer = layer_of(&upper, &host.for_build(&base, &upper), &dest);
        assert_eq!(layer[bundle], format!("{system}{mine}"));

        // A recipe that installs the same CA as a local CA of its own keeps it trusted.
        fs::write(
            upper.join("usr/local/share/ca-certificates/corp.crt"),
            &extra,
        )
        .expect("write");
        fs::write(upper.join(bundle), format!("{system}{extra}")).expect("write");
        let layer = layer_of(&upper, &host.for_build(&base, &upper), &dest);
        assert_eq!(layer[bundle], format!("{system}{extra}"));
        assert!(
            !layer.contains_key(anchor),
            "the agent's own file still goes"
        );

        // A base that trusted the CA already keeps trusting it.
        fs::remove_file(upper.join("usr/local/share/ca-certificates/corp.crt")).expect("rm");
        fs::write(base.join(bundle), format!("{system}{extra}")).expect("write");
        fs::write(upper.join(bundle), format!("{system}{extra}{mine}")).expect("write");
        let layer = layer_of(&upper, &host.for_build(&base, &upper), &dest);
        assert_eq!(layer[bundle], format!("{system}{extra}{mine}"));
    }

    #[test]
    fn a_filtered_builds_switch_of_apt_sources_to_https_stays_out_of_the_layer() {
        assert!(only_made_https(
            "deb http://deb.debian.org/debian bookworm main\n",
            "deb https://deb.debian.org/debian bookworm main\n"
        ));
        let deb822 = "Types: deb\nURIs: http://a.example/ http://b.example/\n";
        assert!(only_made_https(
            deb822,
            "Types: deb\nURIs: https://a.example/ http://b.example/\n"
        ));
        assert!(!only_made_https(deb822, deb822), "nothing switched");
        assert!(!only_made_https(
            "deb http://a.example/ x\n",
            "deb https://a.example/ x\ndeb https://mine.example/ y\n"
        ));
        assert!(!only_made_https("deb ftp://a/ x\n", "deb ftps://a/ x\n"));

        let dir = tempfile::tempdir().expect("tempdir");
        let (base, upper) = (dir.path().join("base"), dir.path().join("upper"));
        for root in [&base, &upper] {
            fs::create_dir_all(root.join("etc/apt/sources.list.d")).expect("mkdir");
        }
        fs::write(
            base.join("etc/apt/sources.list"),
            "deb http://a.example/ x\n",
        )
        .expect("w");
        fs::write(
            upper.join("etc/apt/sources.list"),
            "deb https://a.example/ x\n",
        )
        .expect("w");
        fs::write(
            upper.join("etc/apt/sources.list.d/mine.list"),
            "deb https://mine.example/ y\n",
        )
        .expect("w");
        let dest = dir.path().join("layer.tar");
        let filtered = HostTrust::new(None, true).for_build(&base, &upper);
        let layer = layer_of(&upper, &filtered, &dest);
        assert!(!layer.contains_key("etc/apt/sources.list"), "{layer:?}");
        assert!(layer.contains_key("etc/apt/sources.list.d/mine.list"));
        let nat = HostTrust::new(None, false).for_build(&base, &upper);
        assert!(layer_of(&upper, &nat, &dest).contains_key("etc/apt/sources.list"));
    }
}
