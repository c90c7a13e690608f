//! The image store: built images on disk, listed, looked up and removed.
//!
//! ```text
//! images/<name>/<id>/image.json   what was built (ImageMeta)
//! images/<name>/<id>/rootfs/      the root filesystem, never changed once installed
//! images/<name>/.tmp-*            a build or import in progress (removed by the next one if it died)
//! images/<name>/.build.lock       held by the one build running in this store
//! ```
//!
//! An image directory appears only by an atomic rename of a complete build, so whatever is
//! listed here is whole. Images are immutable: a running sandbox's overlay uses the rootfs as
//! its lower layer, which must not change under it; a new recipe makes a new id instead.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::failure::ImageFailure;
use crate::foundation::error::{Context, Error, Result};
use crate::host::home::Home;

/// Name of the metadata file beside each image's rootfs.
pub const META_FILE: &str = "image.json";
/// Prefix of build directories in progress.
pub(crate) const TMP_PREFIX: &str = ".tmp-";

/// Opens the lock file `name` in `dir` (made, with `dir`, where missing; never truncated) for
/// an flock, and says its path for messages.
pub(crate) fn open_lock_file(dir: &Path, name: &str) -> Result<(fs::File, PathBuf)> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok((file, path))
}

/// What `image.json` records about a built image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageMeta {
    pub name: String,
    pub id: String,
    /// RFC 3339.
    pub created: String,
    /// Apparent size of the rootfs in bytes (hard links counted once).
    pub size_bytes: u64,
    /// The Debian suite of a built image (empty for an imported one).
    #[serde(default)]
    pub suite: String,
    #[serde(default)]
    pub packages: Vec<String>,
    /// Kernel release of `/boot/vmlinuz-<release>` in the rootfs, if it has one.
    pub kernel: Option<String>,
    /// The sandbox user may become the guest's root with `sudo` (the agent's broker).
    pub guest_sudo: bool,
    /// Where an imported image came from (absent: built here by `image build`). Fields added
    /// after the first release are optional, so every `image.json` stays readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ImageSource>,
    /// An imported image's run settings from its config, recorded (`Entrypoint`/`Cmd` are
    /// never run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<super::oci::ContainerConfig>,
    /// The diff ids (`sha256:…`) of the layers in the shared layer store
    /// ([`super::layers`]) its rootfs is assembled from, bottom first; empty for an image
    /// whose rootfs is its own (a debian build).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
}

impl ImageMeta {
    /// The record of an image whose rootfs is assembled from shared layers, before
    /// [`super::import::assemble_image`] fills in when, how big and which layers: no Debian
    /// suite, packages or kernel of its own, `sudo` for the sandbox user.
    pub(crate) fn layered(
        name: &str,
        id: &str,
        source: ImageSource,
        config: Option<super::oci::ContainerConfig>,
    ) -> ImageMeta {
        ImageMeta {
            name: name.to_owned(),
            id: id.to_owned(),
            created: String::new(),
            size_bytes: 0,
            suite: String::new(),
            packages: Vec::new(),
            kernel: None,
            guest_sudo: true,
            source: Some(source),
            config,
            layers: Vec::new(),
        }
    }
}

/// Where an imported image came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageSource {
    /// One of the `ImageSource::*` format names: how the image reached this host.
    pub format: String,
    /// The file or directory imported, as given (made absolute).
    pub path: String,
    /// The image manifest's digest (OCI layouts; a classic `docker save` archive has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// The image config's digest (Docker's image id).
    pub config_digest: String,
}

impl ImageSource {
    /// Pulled from a registry by `image pull` (or on demand); `path` is the reference.
    pub const REGISTRY: &'static str = "registry";
    /// Built by `image build` from a recipe; `path` is the recipe's description.
    pub const RECIPE: &'static str = "recipe";
    /// Imported from an OCI image layout directory.
    pub const OCI_LAYOUT: &'static str = "oci-layout";
    /// Imported from a `docker save` archive.
    pub const DOCKER_ARCHIVE: &'static str = "docker-archive";

    pub fn is_registry(&self) -> bool {
        self.format == Self::REGISTRY
    }

    pub fn is_recipe(&self) -> bool {
        self.format == Self::RECIPE
    }
}

/// One built image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// `images/<name>/<id>`.
    pub dir: PathBuf,
    pub meta: ImageMeta,
}

impl BuiltImage {
    pub fn name(&self) -> &str {
        &self.meta.name
    }
    pub fn id(&self) -> &str {
        &self.meta.id
    }
    /// The root filesystem (a directory tree owned by host root).
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }
    /// `/boot/vmlinuz-<kernel>` inside the rootfs, for a backend that boots a kernel.
    pub fn kernel_path(&self) -> Option<PathBuf> {
        let release = self.meta.kernel.as_deref()?;
        Some(self.rootfs().join(format!("boot/vmlinuz-{release}")))
    }
    /// `/boot/initrd.img-<kernel>` inside the rootfs (Debian's own initramfs), if present.
    pub fn initrd_path(&self) -> Option<PathBuf> {
        let release = self.meta.kernel.as_deref()?;
        let path = self.rootfs().join(format!("boot/initrd.img-{release}"));
        path.is_file().then_some(path)
    }
    /// `/lib/modules/<kernel>` inside the rootfs.
    pub fn modules_dir(&self) -> Option<PathBuf> {
        let release = self.meta.kernel.as_deref()?;
        Some(self.rootfs().join(format!("lib/modules/{release}")))
    }
}

/// The images of one `DYNOCAP_HOME` (plus, for builds, the shared cache).
#[derive(Debug, Clone)]
pub struct ImageStore {
    dir: PathBuf,
    cache: Option<PathBuf>,
}

impl ImageStore {
    /// The store of `home`, with `cache` (`DYNOCAP_IMAGE_CACHE`) as its build cache: only a
    /// build uses it, so a store that is only read may have none.
    pub fn for_home(home: &Home, cache: Option<PathBuf>) -> ImageStore {
        ImageStore::at(home.images_dir(), cache)
    }

    pub fn at(dir: PathBuf, cache: Option<PathBuf>) -> ImageStore {
        ImageStore { dir, cache }
    }

    /// `images/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where builds are shared between homes (`DYNOCAP_IMAGE_CACHE`), if anywhere.
    pub fn cache(&self) -> Option<&Path> {
        self.cache.as_deref()
    }

    /// `images/<name>/<id>` (see [`dir_name`] for a name that is a reference).
    pub fn image_dir(&self, name: &str, id: &str) -> PathBuf {
        self.name_dir(name).join(id)
    }

    /// `images/<name>`: every build or pull of one name.
    pub fn name_dir(&self, name: &str) -> PathBuf {
        self.dir.join(dir_name(name))
    }

    /// Every built image, oldest first. Directories without a readable `image.json` (not
    /// images: the `host` skeleton, builds in progress) are skipped.
    pub fn list(&self) -> Result<Vec<BuiltImage>> {
        let mut images = Vec::new();
        let names = match fs::read_dir(&self.dir) {
            Ok(names) => names,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(images),
            Err(source) => {
                return Err(ImageFailure::ReadStore {
                    dir: self.dir.clone(),
                    source,
                }
                .into())
            }
        };
        for name in names.flatten() {
            let Ok(ids) = fs::read_dir(name.path()) else {
                continue;
            };
            for id in ids.flatten() {
                if let Some(image) = read_image(&id.path()) {
                    images.push(image);
                }
            }
        }
        images.sort_by(|a, b| {
            (a.meta.created.as_str(), a.id()).cmp(&(b.meta.created.as_str(), b.id()))
        });
        Ok(images)
    }

    /// The image `name_or_id` names: an image name (its newest build), or an id or a unique
    /// prefix of one (at least 4 characters).
    pub fn find(&self, name_or_id: &str) -> Result<Option<BuiltImage>> {
        let images = self.list()?;
        if let Some(newest) = images.iter().rev().find(|i| i.name() == name_or_id) {
            return Ok(Some(newest.clone()));
        }
        if name_or_id.len() < 4 {
            return Ok(None);
        }
        let matches: Vec<_> = images
            .into_iter()
            .filter(|i| i.id().starts_with(name_or_id))
            .collect();
        match matches.len() {
            0 => Ok(None),
            1 => Ok(matches.into_iter().next()),
            n => Err(Error::invalid(format!(
                "{name_or_id} matches {n} images; give more of the id (see dynocap image ls)"
            ))),
        }
    }

    /// The image `name` with exactly this id.
    pub fn get(&self, name: &str, id: &str) -> Option<BuiltImage> {
        if !is_id(id) || !(is_name(name) || is_reference(name)) {
            return None;
        }
        read_image(&self.image_dir(name, id)).filter(|i| i.name() == name && i.id() == id)
    }

    /// Removes the directory of image name `name` if it holds no image and no build is
    /// running: the lock and `.tmp-*` a build of a name that never got an image left.
    pub fn remove_name_if_unused(&self, name: &str) -> Result<()> {
        if !(is_name(name) || is_reference(name)) {
            return Ok(());
        }
        let parent = self.name_dir(name);
        match super::build::BuildLock::try_take(&parent)? {
            Some(lock) => lock.remove_name_if_unused(&parent),
            None => Ok(()),
        }
    }

    /// Removes a built image. Callers check that no live sandbox uses it. The directory is
    /// renamed out of sight first, so a concurrent lookup sees the whole image or none of it.
    pub fn remove(&self, image: &BuiltImage) -> Result<()> {
        let parent = image.dir.parent().ok_or_else(|| ImageFailure::NoParent {
            dir: image.dir.clone(),
        })?;
        // The name's lock, unless a build, import or pull of it runs (which keeps the
        // directory): held through the removal, so that no other holder's sweep of dead
        // builds takes the `.tmp-rm-*` below for one.
        let lock = super::build::BuildLock::try_take(parent)?;
        let doomed = parent.join(format!("{TMP_PREFIX}rm-{}", image.id()));
        fs::rename(&image.dir, &doomed)
            .with_context(|| format!("removing image {}", image.dir.display()))?;
        super::build::remove_build_dir(&doomed)?;
        // The name's last image gone, its directory (build lock and what dead builds left)
        // goes too.
        match lock {
            Some(lock) => lock.remove_name_if_unused(parent),
            None => Ok(()),
        }
    }
}

/// Reads `dir/image.json`, if `dir` is an installed image.
fn read_image(dir: &Path) -> Option<BuiltImage> {
    let file_name = dir.file_name()?.to_str()?;
    if !is_id(file_name) {
        return None;
    }
    let text = fs::read_to_string(dir.join(META_FILE)).ok()?;
    let meta: ImageMeta = serde_json::from_str(&text).ok()?;
    (meta.id == file_name && dir.join("rootfs").is_dir()).then(|| BuiltImage {
        dir: dir.to_owned(),
        meta,
    })
}

/// A content id: 64 lowercase hex digits.
pub fn is_id(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Why `name` may not name an image that `image pull`, `image import` or a recipe build
/// makes (the caller says how to give another), or `None`: it must be a name ([`is_name`])
/// and none of the words that already mean something where an image is chosen: `host` (the host's own /usr), `debian` (the image
/// `dynocap image build debian` makes, which another image of that name would stand in for
/// wherever `debian` is asked for) and `auto` (on `task start`, the image the project's
/// devcontainer.json names, so an image called that could never be chosen there).
pub fn unfit_name(name: &str) -> Option<String> {
    if !is_name(name) {
        return Some(
            "a name is up to 32 lowercase letters, digits and '-', not starting with '-'"
                .to_owned(),
        );
    }
    let why = match name {
        crate::model::image_ref::DEFAULT_IMAGE => "the host's own /usr",
        "auto" => "the image the project's devcontainer.json names (on task start)",
        _ if super::recipe::BUILDABLE.contains(&name) => {
            "the image `dynocap image build debian` makes"
        }
        _ => return None,
    };
    Some(format!("\"{name}\" already means {why}"))
}

/// An image name: a short lowercase word (it names a directory).
pub fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 32
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
}

/// The directory of the images named `name`: the name itself, or for a reference (which
/// has `/` and `:`) `ref-` and a hash of it.
pub fn dir_name(name: &str) -> String {
    if is_name(name) {
        return name.to_owned();
    }
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("ref-{hex}")
}

/// An image reference that names its registry, as `dynocap image pull` takes it and an
/// image pulled under it is named: `registry.example[:port]/repo/path[:tag][@sha256:<hex>]`.
/// The registry is a host with a `.` (or `localhost`) and an optional port, or any host
/// with a port (`registry:5000`, as Docker reads a first component with a port); repository
/// components are lowercase letters, digits and `._-`, not starting with a separator; a tag
/// is up to 128 of letters, digits and `._-`; at most 255 bytes in all.
pub fn is_reference(text: &str) -> bool {
    if text.len() > 255 || text.is_empty() {
        return false;
    }
    let (rest, digest) = match text.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (text, None),
    };
    if let Some(digest) = digest {
        let ok = digest.strip_prefix("sha256:").is_some_and(is_id);
        if !ok {
            return false;
        }
    }
    let Some((registry, path)) = rest.split_once('/') else {
        return false;
    };
    let (host, port) = match registry.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    };
    let host_ok = (host.contains('.') || host == "localhost" || port.is_some())
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    if !host_ok || !port_ok {
        return false;
    }
    // A tag follows the last component's ':'.
    let (repo, tag) = match path.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag)),
        _ => (path, None),
    };
    if tag.is_none() && digest.is_none() {
        return false;
    }
    let tag_ok = tag.is_none_or(|t| {
        !t.is_empty()
            && t.len() <= 128
            && !t.starts_with(['.', '-'])
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    let repo_ok = repo.split('/').all(|c| {
        !c.is_empty()
            && c.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && c.bytes()
                .last()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && c.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    });
    tag_ok && repo_ok
}

/// Apparent size of a tree, each inode counted once, symlinks not followed.
pub(crate) fn tree_size(root: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if seen.insert((meta.dev(), meta.ino())) {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install(store: &ImageStore, name: &str, id: &str, created: &str) -> BuiltImage {
        let dir = store.image_dir(name, id);
        fs::create_dir_all(dir.join("rootfs/boot")).expect("mkdir");
        let meta = ImageMeta {
            name: name.into(),
            id: id.into(),
            created: created.into(),
            size_bytes: 1,
            suite: "bookworm".into(),
            packages: vec![],
            kernel: Some("6.1.0-1-cloud-amd64".into()),
            guest_sudo: true,
            source: None,
            config: None,
            layers: vec![],
        };
        fs::write(
            dir.join(META_FILE),
            serde_json::to_string(&meta).expect("json"),
        )
        .expect("write");
        BuiltImage { dir, meta }
    }

    #[test]
    fn lists_finds_and_removes_installed_images_only() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = ImageStore::at(tmp.path().to_owned(), None);
        assert!(store.list().expect("empty list").is_empty());
        let old = install(&store, "debian", &"a".repeat(64), "2026-01-01T00:00:00Z");
        let new = install(&store, "debian", &"b".repeat(64), "2026-02-01T00:00:00Z");
        // Not images: a half-made build, the host skeleton, a dir without metadata.
        fs::create_dir_all(tmp.path().join("debian/.tmp-123/rootfs")).expect("mkdir");
        fs::create_dir_all(tmp.path().join("host/rootfs-r3")).expect("mkdir");
        fs::create_dir_all(
            tmp.path()
                .join("debian")
                .join("c".repeat(64))
                .join("rootfs"),
        )
        .expect("mkdir");

        assert_eq!(store.list().expect("list"), vec![old.clone(), new.clone()]);
        assert_eq!(store.find("debian").expect("find"), Some(new.clone()));
        assert_eq!(store.find("aaaa").expect("find"), Some(old.clone()));
        assert_eq!(store.find("aaa").expect("find"), None, "too short a prefix");
        assert_eq!(store.find("alpine").expect("find"), None);
        assert_eq!(store.get("debian", old.id()), Some(old.clone()));
        assert_eq!(store.get("debian", "../x"), None);
        assert_eq!(
            old.kernel_path(),
            Some(old.rootfs().join("boot/vmlinuz-6.1.0-1-cloud-amd64"))
        );

        store.remove(&old).expect("remove");
        assert_eq!(store.list().expect("list"), vec![new]);
        assert!(!old.dir.exists());
        let leftovers: Vec<_> = fs::read_dir(tmp.path().join("debian"))
            .expect("read")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-rm"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn removing_a_names_last_image_leaves_nothing_of_the_name() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = ImageStore::at(tmp.path().to_owned(), None);
        let parent = tmp.path().join("tool");
        // What builds leave: the lock, and a build that died.
        drop(super::super::build::BuildLock::take(&parent, &|_| {}).expect("lock"));
        fs::create_dir_all(parent.join(".tmp-1-dead/rootfs")).expect("mkdir");
        let one = install(&store, "tool", &"a".repeat(64), "2026-01-01T00:00:00Z");
        let two = install(&store, "tool", &"b".repeat(64), "2026-02-01T00:00:00Z");
        store.remove(&one).expect("remove");
        assert!(
            parent.join(".build.lock").is_file(),
            "another image of the name is left"
        );
        store.remove(&two).expect("remove");
        assert!(!parent.exists(), "the name's directory is gone");

        // While a build of the name holds its lock, the directory is that build's.
        let three = install(&store, "tool", &"c".repeat(64), "2026-03-01T00:00:00Z");
        let held = super::super::build::BuildLock::take(&parent, &|_| {}).expect("lock");
        store.remove(&three).expect("remove");
        assert!(parent.join(".build.lock").is_file());
        drop(held);

        // A build waiting on the lock of a name being removed takes it again on a new file.
        let four = install(&store, "tool", &"d".repeat(64), "2026-04-01T00:00:00Z");
        let held = super::super::build::BuildLock::try_take(&parent)
            .expect("lock")
            .expect("free");
        let waiter = {
            let parent = parent.clone();
            std::thread::spawn(move || {
                super::super::build::BuildLock::take(&parent, &|_| {}).expect("lock")
            })
        };
        fs::rename(&four.dir, tmp.path().join("moved")).expect("rename");
        held.remove_name_if_unused(&parent)
            .expect("remove the name");
        let _lock = waiter.join().expect("waiter");
        assert!(
            parent.join(".build.lock").is_file(),
            "the waiter holds a lock file that is at its path"
        );
        assert!(super::super::build::BuildLock::try_take(&parent)
            .expect("try")
            .is_none());
    }

    #[test]
    fn references_name_a_registry_and_a_tag_or_digest() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        for good in [
            "registry.example/team/tool:1".to_owned(),
            "127.0.0.5:5000/base:latest".to_owned(),
            "localhost/x:1".to_owned(),
            "registry:5000/team/tool:1".to_owned(),
            format!("registry.example/tool@{digest}"),
            format!("registry.example/tool:1@{digest}"),
        ] {
            assert!(is_reference(&good), "{good}");
            assert!(
                dir_name(&good).starts_with("ref-") && is_name(&dir_name(&good)),
                "{good}"
            );
        }
        for bad in [
            "alpine:3",
            "team/tool:1",
            "registry.example/tool",
            "Registry.example/tool:1",
            "registry.example/../tool:1",
            "registry.example/tool:1/x",
            "registry.example//tool:1",
            "registry.example/tool@sha256:abc",
            "registry.example/tool:-x",
            "registry/tool:1",
            "registry:/tool:1",
            "Registry:5000/tool:1",
            "debian",
        ] {
            assert!(!is_reference(bad), "{bad}");
        }
        assert_eq!(dir_name("debian"), "debian");
    }

    #[test]
    fn the_words_an_image_choice_reads_name_no_made_image() {
        for word in ["host", "debian", "auto"] {
            let why = unfit_name(word).expect(word);
            assert!(why.contains("already means"), "{why}");
        }
        assert!(unfit_name("Tool").expect("shape").contains("lowercase"));
        assert_eq!(unfit_name("debian-12"), None);
        assert_eq!(unfit_name("mytool"), None);
    }

    #[test]
    fn names_and_ids_are_plain() {
        assert!(is_name("debian") && is_name("debian-12"));
        assert!(!is_name("") && !is_name("../x") && !is_name("-x") && !is_name("Debian"));
        assert!(is_id(&"0f".repeat(32)));
        assert!(!is_id(&"0F".repeat(32)) && !is_id("abc"));
    }
}
