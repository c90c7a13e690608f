//! `dynocap image build`: a Debian rootfs made with mmdebstrap, customised for DynoCap, and
//! installed into the store by one atomic rename.
//!
//! A build happens in `images/<name>/.tmp-*` under the store's build lock. Whatever stops it
//! (a failed download, `mmdebstrap` killed, Ctrl-C, a crash of this process) leaves no image
//! behind: the temporary directory is removed on the way out, or, if this process died, by
//! the next build, which holds the same lock and so knows no other build is using it (see
//! `mmdebstrap` for why no mount is ever left inside one).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use super::failure::ImageFailure;
use super::recipe::Recipe;
use super::store::{BuiltImage, ImageStore, META_FILE, TMP_PREFIX};
use super::{customise, mmdebstrap};
use crate::foundation::error::{Context, Error, Result};

/// Where the built image came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This store already had it.
    Present,
    /// Copied from `DYNOCAP_IMAGE_CACHE`.
    Cache,
    /// Built now by mmdebstrap.
    Built,
}

/// A finished build.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub image: BuiltImage,
    pub origin: Origin,
}

/// Builds image `name` (or finds it built), reporting progress lines to `progress`. Setting
/// `cancel` stops the build; it then leaves nothing behind and returns an error. `mirror` is
/// `DYNOCAP_DEBIAN_MIRROR`.
pub fn build(
    store: &ImageStore,
    name: &str,
    mirror: Option<&str>,
    progress: &dyn Fn(&str),
    cancel: &AtomicBool,
) -> Result<Outcome> {
    let version = mmdebstrap::version()?;
    let recipe = Recipe::for_name(name, &version, mirror).ok_or_else(|| {
        Error::invalid(format!(
            "there is no recipe for an image named \"{name}\"; images that can be built: {}",
            super::recipe::BUILDABLE.join(", ")
        ))
    })?;
    let id = recipe.id();
    if let Some(image) = store.get(name, &id) {
        return Ok(Outcome {
            image,
            origin: Origin::Present,
        });
    }
    // With a shared cache, its lock is taken first (always in this order: cache, then
    // store): concurrent builds in many homes then make one mmdebstrap run, and the others
    // copy its result.
    let cache = store.cache().filter(|cache| !same_dir(cache, store.dir()));
    let cache_lock = match cache {
        Some(cache) => Some(BuildLock::take(&cache.join(name), progress)?),
        None => None,
    };
    let parent = store.dir().join(name);
    let _lock = BuildLock::take(&parent, progress)?;
    // Another build may have installed it while we waited.
    if let Some(image) = store.get(name, &id) {
        return Ok(Outcome {
            image,
            origin: Origin::Present,
        });
    }
    remove_dead_builds(&parent)?;
    let staging = Staging::new(&parent)?;

    let cached = cache
        .map(|cache| ImageStore::at(cache.to_owned(), None))
        .and_then(|cache| cache.get(name, &id));
    let origin = if let Some(cached) = cached {
        progress(&format!(
            "copying image {} from {}",
            short(&id),
            cached.dir.display()
        ));
        copy_image(&cached.dir, &staging.path)?;
        Origin::Cache
    } else {
        mmdebstrap::run(&recipe, &staging.path.join("rootfs"), progress, cancel)?;
        progress("customising the rootfs for DynoCap");
        customise::customise(&staging.path.join("rootfs"), &recipe)?;
        let meta = customise::describe(&staging.path.join("rootfs"), &recipe, &id);
        let json = serde_json::to_string_pretty(&meta).expect("image metadata always serialises");
        fs::write(staging.path.join(META_FILE), json + "\n")
            .with_context(|| format!("writing {}", staging.path.join(META_FILE).display()))?;
        Origin::Built
    };
    if cancel.load(Ordering::SeqCst) {
        return Err(Error::internal(
            "the image build was interrupted; nothing was installed",
        ));
    }
    let target = store.image_dir(name, &id);
    staging.install(&target)?;
    let image = store
        .get(name, &id)
        .ok_or_else(|| ImageFailure::Unreadable {
            dir: target.clone(),
        })?;
    if let (Origin::Built, Some(cache), Some(_)) = (origin, cache, &cache_lock) {
        if let Err(err) = publish(cache, &image) {
            progress(&format!(
                "warning: not shared into {}: {err}",
                cache.display()
            ));
        }
    }
    Ok(Outcome { image, origin })
}

/// Whether two paths name one directory (a cache set to the store itself is no cache: its
/// lock would be taken twice).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Copies a built image into the shared cache. Callers hold the cache's build lock.
fn publish(cache: &Path, image: &BuiltImage) -> Result<()> {
    let cache_store = ImageStore::at(cache.to_owned(), None);
    if cache_store.get(image.name(), image.id()).is_some() {
        return Ok(());
    }
    let parent = cache.join(image.name());
    remove_dead_builds(&parent)?;
    let staging = Staging::new(&parent)?;
    copy_image(&image.dir, &staging.path)?;
    staging.install(&cache_store.image_dir(image.name(), image.id()))
}

/// The first 12 characters of an id, as `image ls` shows it.
pub fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// Name of the lock file in `images/<name>/`.
const BUILD_LOCK: &str = ".build.lock";

/// The store's one-build-at-a-time lock (`images/<name>/.build.lock`, flock).
///
/// `image rm` of a name's last image removes the lock file and the name's directory while it
/// holds the lock ([`BuildLock::remove_name_if_unused`]), so a taker checks, once it holds
/// the lock, that the file it locked is still the one at the path: if not it locked an
/// unlinked file, which guards nothing, and takes the lock again on the path's new file.
pub(super) struct BuildLock {
    _lock: nix::fcntl::Flock<fs::File>,
}

impl BuildLock {
    pub(super) fn take(parent: &Path, progress: &dyn Fn(&str)) -> Result<BuildLock> {
        let mut told = false;
        loop {
            let (file, path) = open_build_lock(parent)?;
            let file =
                match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => {
                        if let Some(lock) = BuildLock::still_linked(lock, &path)? {
                            return Ok(lock);
                        }
                        continue;
                    }
                    Err((file, nix::errno::Errno::EWOULDBLOCK)) => file,
                    Err((_, source)) => return Err(ImageFailure::Lock { path, source }.into()),
                };
            if !told {
                progress("waiting for another build of this image to finish");
                told = true;
            }
            let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(
                |(_, source)| ImageFailure::Lock {
                    path: path.clone(),
                    source,
                },
            )?;
            if let Some(lock) = BuildLock::still_linked(lock, &path)? {
                return Ok(lock);
            }
        }
    }

    /// The lock of `parent` if no one holds it now, without waiting; `None` when a build,
    /// import or pull of the name is running, or the name has no directory.
    pub(super) fn try_take(parent: &Path) -> Result<Option<BuildLock>> {
        if !parent.is_dir() {
            return Ok(None);
        }
        let (file, path) = open_build_lock(parent)?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => BuildLock::still_linked(lock, &path),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, source)) => Err(ImageFailure::Lock { path, source }.into()),
        }
    }

    /// `lock` as a held build lock if the file it locked is still at `path`.
    fn still_linked(lock: nix::fcntl::Flock<fs::File>, path: &Path) -> Result<Option<BuildLock>> {
        use std::os::unix::fs::MetadataExt;
        let held = lock
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(match fs::symlink_metadata(path) {
            Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {
                Some(BuildLock { _lock: lock })
            }
            Ok(_) => None,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            Err(err) => {
                return Err(Error::internal(format!(
                    "reading {}: {err}",
                    path.display()
                )))
            }
        })
    }

    /// Removes the name's directory `parent` (this lock's file with it) when it holds nothing
    /// else: no image, no build (what dead builds left is removed first; the lock is held,
    /// so no live build owns any of it). A name whose last image is removed leaves nothing.
    pub(super) fn remove_name_if_unused(self, parent: &Path) -> Result<()> {
        remove_dead_builds(parent)?;
        let entries =
            fs::read_dir(parent).with_context(|| format!("reading {}", parent.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", parent.display()))?;
            if entry.file_name() != BUILD_LOCK {
                return Ok(());
            }
        }
        // Unlinked while held: a taker that opened it meanwhile sees it is gone once it
        // holds it, and takes the lock on a new file (see `take`).
        let path = parent.join(BUILD_LOCK);
        if let Err(err) = fs::remove_file(&path) {
            if err.kind() != std::io::ErrorKind::NotFound {
                return Err(Error::internal(format!(
                    "removing {}: {err}",
                    path.display()
                )));
            }
        }
        // A taker may have made a new lock file here since: the directory is then kept.
        match fs::remove_dir(parent) {
            Ok(()) => Ok(()),
            Err(err)
                if matches!(
                    err.raw_os_error(),
                    Some(libc::ENOTEMPTY) | Some(libc::EEXIST) | Some(libc::ENOENT)
                ) =>
            {
                Ok(())
            }
            Err(err) => Err(Error::internal(format!(
                "removing {}: {err}",
                parent.display()
            ))),
        }
        // `self` (the lock) is released here, once the directory is gone.
    }
}

/// Opens (making it and `parent` where missing) the build lock file of `parent`. An `image
/// rm` removing the directory between the two is met by making it again.
fn open_build_lock(parent: &Path) -> Result<(fs::File, PathBuf)> {
    let path = parent.join(BUILD_LOCK);
    for _ in 0..8 {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        match fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(file) => return Ok((file, path)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => {
                return Err(Error::internal(format!(
                    "opening {}: {err}",
                    path.display()
                )))
            }
        }
    }
    Err(Error::internal(format!(
        "opening {}: its directory kept being removed",
        path.display()
    )))
}

/// A build directory that removes itself unless installed.
pub(super) struct Staging {
    pub(super) path: PathBuf,
    installed: bool,
}

impl Staging {
    pub(super) fn new(parent: &Path) -> Result<Staging> {
        let path = parent.join(format!(
            "{TMP_PREFIX}{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
        Ok(Staging {
            path,
            installed: false,
        })
    }

    /// Renames the build into place: the image appears whole or not at all, and durably so.
    pub(super) fn install(self, target: &Path) -> Result<()> {
        // The rename is the image's commit, so what it names must be on the disk first: a
        // rename a crash keeps ahead of the files' data (ext4 and xfs order neither) would
        // leave an image that looks installed, and is never made again, with empty or
        // missing files, image.json included. One syncfs covers the whole tree (an fsync
        // per file would flush the journal once each); the parent's fsync then makes the
        // rename itself last.
        sync_filesystem(&self.path)?;
        self.install_synced(target)
    }

    /// [`Staging::install`] for a caller that has synced the filesystem (`syncfs`) since the
    /// build was written (a pull, whose one sync covers its layers and its image).
    pub(super) fn install_synced(mut self, target: &Path) -> Result<()> {
        fs::rename(&self.path, target).with_context(|| {
            format!(
                "installing the image {} at {}",
                self.path.display(),
                target.display()
            )
        })?;
        self.installed = true;
        sync_dir(target.parent().unwrap_or(Path::new("/")))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.installed {
            if let Err(err) = remove_build_dir(&self.path) {
                tracing::warn!("{err}");
            }
        }
    }
}

/// Writes everything written to the filesystem holding `path` to its disk (`syncfs`): the
/// files and directory entries of a tree about to be installed by a rename.
pub(super) fn sync_filesystem(path: &Path) -> Result<()> {
    let dir = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    nix::unistd::syncfs(&dir).map_err(|errno| {
        Error::internal(format!(
            "writing {} to its disk (syncfs): {errno}",
            path.display()
        ))
    })
}

/// Makes the entries of directory `dir` durable (`fsync`): a rename into it done.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    let file = fs::File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    file.sync_all()
        .with_context(|| format!("writing the entries of {} to its disk", dir.display()))
}

/// Removes the `.tmp-*` directories of builds that died. Callers hold the build lock, so no
/// live build owns any of them.
pub(super) fn remove_dead_builds(parent: &Path) -> Result<()> {
    let entries = fs::read_dir(parent).with_context(|| format!("reading {}", parent.display()))?;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            remove_build_dir(&entry.path())?;
        }
    }
    Ok(())
}

/// Removes a build (or removed image) directory. No mount can be inside it: mmdebstrap's
/// mounts live in its own mount namespace (see the module doc).
pub(crate) fn remove_build_dir(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ImageFailure::RemoveBuildDir {
            path: path.to_owned(),
            source,
        }
        .into()),
    }
}

/// Copies an image directory (rootfs and metadata), hard-linking files where the two stores
/// share a filesystem: the files are never written, so sharing their inodes is safe.
fn copy_image(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from.join(META_FILE), to.join(META_FILE))
        .with_context(|| format!("copying {}", from.join(META_FILE).display()))?;
    let source = from.join("rootfs");
    let target = to.join("rootfs");
    let copy = |link: bool| {
        let mut cmd = Command::new("cp");
        cmd.arg(if link { "-al" } else { "-a" })
            .arg("--")
            .arg(&source)
            .arg(&target)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.output()
    };
    let linked = copy(true).context("running cp")?;
    if linked.status.success() {
        return Ok(());
    }
    // Another filesystem: hard links are impossible, copy the bytes.
    remove_build_dir(&target)?;
    let copied = copy(false).context("running cp")?;
    if copied.status.success() {
        Ok(())
    } else {
        Err(ImageFailure::Copy {
            from: source,
            to: target,
            stderr: String::from_utf8_lossy(&copied.stderr).trim().to_owned(),
        }
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_builds_are_removed_and_installed_images_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let id = "d".repeat(64);
        fs::create_dir_all(tmp.path().join(".tmp-1-abc/rootfs/etc")).expect("mkdir");
        fs::create_dir_all(tmp.path().join(&id).join("rootfs")).expect("mkdir");
        remove_dead_builds(tmp.path()).expect("clean");
        assert!(!tmp.path().join(".tmp-1-abc").exists());
        assert!(tmp.path().join(&id).exists());
    }

    #[test]
    fn a_cache_that_is_the_store_itself_is_recognised() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = tmp.path().join("images");
        fs::create_dir_all(&store).expect("mkdir");
        std::os::unix::fs::symlink(&store, tmp.path().join("alias")).expect("symlink");
        assert!(same_dir(&store, &tmp.path().join("alias")));
        assert!(same_dir(&store, &tmp.path().join("images/../images")));
        assert!(!same_dir(&store, tmp.path()));
    }

    #[test]
    fn an_unfinished_staging_dir_removes_itself() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = {
            let staging = Staging::new(tmp.path()).expect("staging");
            fs::create_dir_all(staging.path.join("rootfs/usr")).expect("mkdir");
            staging.path.clone()
        };
        assert!(!path.exists());
        let staging = Staging::new(tmp.path()).expect("staging");
        let target = tmp.path().join("e".repeat(64));
        staging.install(&target).expect("install");
        assert!(target.is_dir());
    }
}
