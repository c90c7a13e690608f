//! Per-project package caches on the host: `$DYNOCAP_HOME/caches/<project-id>/`, one per
//! project, holding what pip, npm, cargo, go and apt download, so that the second task of a
//! project does not download it again. A cache is shown only to tasks of its own project
//! (never to another project's, never to a raw sandbox), read-write, outside `/workspace`, so
//! nothing of it reaches a patch.
//!
//! A project is named by where its tasks come from: the canonical project directory of a
//! local task (every symlink resolved, as the import opens it), or the repository of a
//! clone, as host and path (`github.com/team/app`: scheme, user, port, a trailing `/` and
//! `.git` left out, so `https://` and `ssh://` clones of one repository share it; but a path
//! in an ssh login's home, `alice@host:app`, keeps its user other than `git`: `bob@host:app`
//! is another repository). The directory's name is a hash of that ([`ProjectKey::id`]); `project.json` in it says
//! which project it is.
//!
//! The cache itself is `cache.img`, an ext4 image of a fixed size (`DYNOCAP_CACHE_MB`) whose
//! whole size is set aside on the host's filesystem when it is made (`fallocate`: blocks
//! reserved, nothing written; see `disk_room`), with one directory per package manager at
//! its root. So a task filling its cache fills the cache, never the host, and the room is
//! counted once, when the cache is made, however many tasks of the project use it. The jail
//! mounts it on the host (in its supervisor's own mount namespace, every jail of the project
//! through one loop device) and binds its directories through the guest's id map, so the
//! files' owners in it are guest ids whatever host id range a sandbox has; the vm attaches
//! it as a second disk that only its guest mounts. `cache.lock` keeps the two apart: jails
//! share it, a vm guest has it alone. A vm guest's kernel writes the image's blocks as it
//! likes, so after one had it the next jail formats it afresh before mounting it (`vm-wrote`):
//! the host's kernel never parses a filesystem a guest made block by block. The caches directory is private to the user running
//! DynoCap (0700), so no host account reaches them.
//!
//! An earlier DynoCap kept a cache as plain host directories (`data/<name>/`, unbounded) and
//! a sparse vm disk (`vm.img`): the sparse disk becomes the image (its room then set aside),
//! and the jail copies what the directories hold into the image the first time it mounts it,
//! then removes them.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::foundation::error::{Context, Error, Result};
use crate::host::disk_room::Layout;
use crate::model::task_spec::Source;

/// The caches' directory in the home.
pub const CACHES: &str = "caches";
/// What project a cache is for, in its directory.
const PROJECT_FILE: &str = "project.json";
/// Touched at each start of a task of the project.
const LAST_USED_FILE: &str = "last-used";
/// The cache's ext4 image.
const IMAGE: &str = "cache.img";
/// Shared (flock) by the supervisors whose jails have the image mounted, held alone by the
/// one whose vm guest has it.
const LOCK: &str = "cache.lock";
/// Where a jail's supervisor mounts the image, in its own mount namespace.
const MOUNTPOINT: &str = "mnt";
/// Made when a vm guest takes the image as a disk (and for an earlier format's vm disk):
/// its kernel writes the image's blocks, so the next jail formats it afresh before the
/// host's kernel mounts it (see the jail backend's `CacheSpec::guest_wrote`).
const GUEST_WROTE: &str = "vm-wrote";
/// An earlier format's host directories, one per package manager.
const LEGACY_DATA: &str = "data";
/// An earlier format's sparse vm disk, of the image's layout.
const LEGACY_VM_DISK: &str = "vm.img";

/// One package manager's cache: its directory under `data/`, where the guest sees it, and
/// whether guest root owns it (apt) rather than the sandbox user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spot {
    pub name: &'static str,
    /// Relative to the sandbox user's home, or absolute.
    pub guest: &'static str,
    pub root_owned: bool,
}

/// Every cache a project keeps: pip's, npm's, cargo's registry and git checkouts, go's
/// modules and build cache, and apt's downloaded archives.
pub const SPOTS: &[Spot] = &[
    Spot {
        name: "pip",
        guest: ".cache/pip",
        root_owned: false,
    },
    Spot {
        name: "npm",
        guest: ".npm",
        root_owned: false,
    },
    Spot {
        name: "cargo-registry",
        guest: ".cargo/registry",
        root_owned: false,
    },
    Spot {
        name: "cargo-git",
        guest: ".cargo/git",
        root_owned: false,
    },
    Spot {
        name: "go-mod",
        guest: "go/pkg/mod",
        root_owned: false,
    },
    Spot {
        name: "go-build",
        guest: ".cache/go-build",
        root_owned: false,
    },
    Spot {
        name: "apt",
        guest: "/var/cache/apt/archives",
        root_owned: true,
    },
];

/// Directories of the sandbox user's home the caches hang from, which must be the user's
/// own (not guest root's, as a bind's missing parents would be), parents first.
pub const HOME_PARENTS: &[&str] = &[".cache", ".cargo", "go", "go/pkg"];

/// What a cache is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectKey {
    /// `path` (a local project directory) or `repository` (a clone's host and path).
    pub kind: String,
    /// The canonical directory, or `host/path` of the repository.
    pub project: String,
}

impl ProjectKey {
    /// The project of a task's source (a local directory's path must be the canonical one
    /// its import opened). `None` for a URL an earlier version recorded and nothing clones.
    pub fn for_source(source: &Source) -> Option<Self> {
        match source {
            Source::ProjectPath(path) => Some(Self {
                kind: "path".to_owned(),
                project: path.display().to_string(),
            }),
            Source::RepositoryUrl(url) => {
                let path = url.path().trim_start_matches('/').trim_end_matches('/');
                let path = path.strip_suffix(".git").unwrap_or(path);
                // A path in the login user's home (`alice@host:app`, `ssh://alice@host/~/app`)
                // is that user's repository: another user's `app` is another project. Forges
                // log everyone in as `git` and map the path to one repository, whatever the
                // transport, so theirs stay `host/path`.
                let home = in_login_home(url);
                let user = url
                    .user()
                    .filter(|user| *user != "git" && home)
                    .map(|user| format!("{user}@"))
                    .unwrap_or_default();
                // `~/app` and `app` are one place in the home.
                let path = match path.strip_prefix("~/") {
                    Some(rest) if home => rest,
                    _ => path,
                };
                Some(Self {
                    kind: "repository".to_owned(),
                    project: format!("{user}{}/{}", url.host(), path.trim_end_matches('/')),
                })
            }
            Source::RefusedUrl(_) => None,
        }
    }

    /// The cache's directory name: 16 hex digits of a SHA-256 of the kind and the project.
    pub fn id(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(b"dynocap-project-cache-v1\0");
        hash.update(self.kind.as_bytes());
        hash.update(b"\0");
        hash.update(self.project.as_bytes());
        hash.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Whether the URL's path is in the login user's home, as ssh and git read it: an scp-like
/// path not starting with `/` (or with `~/`), or an `ssh://` path starting with `/~/`; not
/// `~user/…`, which names its user.
fn in_login_home(url: &crate::foundation::git_url::GitUrl) -> bool {
    use crate::foundation::git_url::Transport;
    let path = url.path();
    match url.transport() {
        Transport::Scp => {
            !path.starts_with('/') && (!path.starts_with('~') || path.starts_with("~/"))
        }
        Transport::Ssh => path == "/~" || path.starts_with("/~/"),
        Transport::Https => false,
    }
}

/// `caches/` of the home at `root`.
pub fn caches_dir(root: &Path) -> PathBuf {
    root.join(CACHES)
}

/// Whether `id` can name a cache directory (what [`ProjectKey::id`] makes).
pub fn is_cache_id(id: &str) -> bool {
    id.len() == 16
        && id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// A project's cache, made if it is new, and marked used now.
#[derive(Debug, Clone)]
pub struct ProjectCache {
    dir: PathBuf,
    /// The image's size.
    bytes: u64,
}

impl ProjectCache {
    /// The cache of `key` in the home at `root`: its image made if new (`bytes` of it, its
    /// room set aside on the host: a filesystem without that room refuses the start,
    /// `policy_denied`), an earlier format's adopted, and its last use set to now. An image
    /// that exists keeps the size it was made with.
    pub fn prepare(root: &Path, key: &ProjectKey, bytes: u64) -> Result<Self> {
        let caches = caches_dir(root);
        let dir = caches.join(key.id());
        private_dir(&caches)?;
        private_dir(&dir)?;
        let project = dir.join(PROJECT_FILE);
        if std::fs::symlink_metadata(&project).is_err() {
            let text = serde_json::to_vec_pretty(key)
                .map_err(|err| Error::internal(format!("writing {PROJECT_FILE}: {err}")))?;
            dynocap_host::durable::replace(&project, &text)
                .with_context(|| format!("writing {}", project.display()))?;
        }
        let image = dir.join(IMAGE);
        adopt_legacy_vm_disk(&dir, &image)?;
        let bytes = match regular_file(&image)? {
            Some(meta) => meta.len(),
            None => {
                make_image(&dir, &image, bytes)?;
                bytes
            }
        };
        // Made before, its room is still its own (nothing to do but check it): an image copied
        // sparse (a backup restored) gets it back here, or the start is refused.
        reserve(&image, bytes)?;
        private_dir(&dir.join(MOUNTPOINT))?;
        drop_empty_legacy_data(&dir.join(LEGACY_DATA));
        let stamp = dir.join(LAST_USED_FILE);
        std::fs::File::create(&stamp)
            .and_then(|mut f| f.write_all(b""))
            .with_context(|| format!("marking {} used", dir.display()))?;
        Ok(Self { dir, bytes })
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache's ext4 image.
    pub fn image(&self) -> PathBuf {
        self.dir.join(IMAGE)
    }

    /// The image's size.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The file that says a vm guest had the image since a jail last mounted it.
    pub fn guest_wrote(&self) -> PathBuf {
        self.dir.join(GUEST_WROTE)
    }

    /// Where a jail's supervisor mounts the image, in its own mount namespace (an empty
    /// directory on the host).
    pub fn mountpoint(&self) -> PathBuf {
        self.dir.join(MOUNTPOINT)
    }

    /// An earlier format's host directories with something in them, for the jail to copy into
    /// the image and remove.
    pub fn legacy_data(&self) -> Option<PathBuf> {
        let data = self.dir.join(LEGACY_DATA);
        std::fs::symlink_metadata(&data)
            .is_ok_and(|meta| meta.is_dir())
            .then_some(data)
    }

    /// The caches a guest gets: apt's only when `with_apt` (an image that has apt's archives).
    pub fn spots(with_apt: bool) -> impl Iterator<Item = &'static Spot> {
        SPOTS
            .iter()
            .filter(move |spot| with_apt || !spot.root_owned)
    }

    /// Holds the cache for a guest: shared with the project's other jails (`exclusive`
    /// false), or alone for a vm guest, whose kernel mounts the image itself. `None` when
    /// another guest holds it the other way: this guest then goes without it.
    pub fn hold(&self, exclusive: bool) -> Result<Option<std::fs::File>> {
        use std::os::fd::AsRawFd;
        let path = self.dir.join(LOCK);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let how = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let held = unsafe { libc::flock(lock.as_raw_fd(), how | libc::LOCK_NB) } == 0;
        Ok(held.then_some(lock))
    }
}

/// A vm guest's hold on its project's cache disk.
#[derive(Debug)]
pub struct VmCacheDisk {
    pub image: PathBuf,
    /// The lock, held while the guest has the disk.
    pub lock: std::fs::File,
    /// `name:path` entries for the guest (see the agent's `vm_cache`).
    pub spots: String,
}

impl ProjectCache {
    /// The project's cache image for a vm guest, held alone; `None` while another guest of
    /// the project has it (the guest then starts without caches: a copy-on-write layer over
    /// the image would take host room nothing set aside).
    pub fn vm_disk(&self, with_apt: bool) -> Result<Option<VmCacheDisk>> {
        let Some(lock) = self.hold(true)? else {
            return Ok(None);
        };
        mark_guest_wrote(&self.dir)?;
        let spots = Self::spots(with_apt)
            .map(|spot| format!("{}:{}", spot.name, spot.guest))
            .collect::<Vec<_>>()
            .join(",");
        Ok(Some(VmCacheDisk {
            image: self.image(),
            lock,
            spots,
        }))
    }
}

/// The room a task start must still set aside for the cache `id` of `bytes` (the configured
/// size): none for a cache whose image holds its room already, the rest of an image (or an
/// earlier format's vm disk) that does not, the whole size for a cache to be made.
pub fn room_needed(root: &Path, id: &str, bytes: u64) -> u64 {
    let dir = caches_dir(root).join(id);
    for name in [IMAGE, LEGACY_VM_DISK] {
        if let Ok(meta) = std::fs::symlink_metadata(dir.join(name)) {
            if meta.is_file() {
                return meta.len().saturating_sub(meta.blocks().saturating_mul(512));
            }
        }
    }
    bytes
}

/// What a command's result says about a package cache with `free` of `total` bytes and
/// `free_inodes` files left: `None` while it has room (more than 1 % of it, and at least 1
/// MiB, and files to spare).
pub fn full_note(free: u64, total: u64, free_inodes: u64) -> Option<String> {
    if free > (total / 100).max(1 << 20) && free_inodes > 0 {
        return None;
    }
    let places = SPOTS
        .iter()
        .map(|spot| {
            if spot.guest.starts_with('/') {
                spot.guest.to_owned()
            } else {
                format!("~/{}", spot.guest)
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "the project's package cache is full ({} of {} MB used{}): writes to it ({places}) \
         fail with \"No space left on device\" and what did not fit was not cached; the \
         sandbox's own disk and the host are not affected. `dynocap cache rm` empties the \
         cache (once no task of the project runs), DYNOCAP_CACHE_MB sizes new ones",
        total.saturating_sub(free) >> 20,
        total >> 20,
        if free_inodes == 0 {
            ", no file left"
        } else {
            ""
        }
    ))
}

/// The image's metadata when it exists; an error when something else is in its place.
fn regular_file(path: &Path) -> Result<Option<std::fs::Metadata>> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => Ok(Some(meta)),
        Ok(_) => Err(Error::internal(format!(
            "{} is not a regular file; remove the project's cache with `dynocap cache rm`",
            path.display()
        ))),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
    }
}

/// An earlier format's sparse vm disk has the image's layout (a directory per package
/// manager at its root): it becomes the image, keeping its size. One left beside an image is
/// nobody's.
fn adopt_legacy_vm_disk(dir: &Path, image: &Path) -> Result<()> {
    let legacy = dir.join(LEGACY_VM_DISK);
    if regular_file(&legacy)?.is_none() {
        return Ok(());
    }
    match std::fs::hard_link(&legacy, image) {
        Ok(()) => {
            tracing::info!(
                "the earlier vm cache disk {} is now {}",
                legacy.display(),
                image.display()
            );
        }
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err).with_context(|| format!("adopting {}", legacy.display())),
    }
    // A vm guest's kernel wrote it.
    mark_guest_wrote(dir)?;
    std::fs::remove_file(&legacy).with_context(|| format!("removing {}", legacy.display()))?;
    let _ = std::fs::remove_file(dir.join("vm.lock"));
    Ok(())
}

/// Says, durably and before a vm guest gets the image, that its blocks are the guest's.
fn mark_guest_wrote(dir: &Path) -> Result<()> {
    let marker = dir.join(GUEST_WROTE);
    dynocap_host::durable::replace(&marker, b"")
        .with_context(|| format!("writing {}", marker.display()))
}

/// Makes the image: a file of `bytes`, formatted (`mkfs.ext4`), its room set aside, then
/// named. Under a name of this process's own until then, so two starts of a new project at
/// once make one image between them (the first named wins, the other's goes).
fn make_image(dir: &Path, image: &Path, bytes: u64) -> Result<()> {
    let partial = dir.join(format!("{IMAGE}.{}.partial", std::process::id()));
    let made =
        format_image(&partial, bytes).and_then(|()| match std::fs::hard_link(&partial, image) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(err) => Err(err).with_context(|| format!("naming {}", image.display())),
        });
    let _ = std::fs::remove_file(&partial);
    made
}

/// `partial` made a formatted image of `bytes` with its room set aside.
fn format_image(partial: &Path, bytes: u64) -> Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    file.set_len(bytes)
        .with_context(|| format!("sizing {}", partial.display()))?;
    drop(file);
    // Discards off: on a file, mke2fs's discard punches holes, which would give back the room
    // set aside.
    let output = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-L", "dynocap-cache"])
        .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
        .arg(partial)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .context("running mkfs.ext4 (package e2fsprogs) for the project's package cache")?;
    if !output.status.success() {
        return Err(Error::internal(format!(
            "mkfs.ext4 {}: {}",
            partial.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    reserve(partial, bytes)
}

/// Sets aside the image's whole size on the host (see `disk_room`); too little room is a
/// refusal that names the cache and the ways around it.
fn reserve(image: &Path, bytes: u64) -> Result<()> {
    use crate::foundation::error::ErrorCode;
    crate::host::disk_room::reserve_with(image, bytes, Layout::Fixed, |dir, free| {
        let mb = bytes >> 20;
        let dir = dir.display().to_string();
        Error::worded(ErrorCode::PolicyDenied, move |s| {
            format!(
                "the project's package cache of {mb} MB (DYNOCAP_CACHE_MB) needs {mb} MB set \
                 aside on the filesystem holding {dir}, which has {free} MB free: start the \
                 task without caches ({}), lower DYNOCAP_CACHE_MB, free space on that \
                 filesystem (`dynocap cache rm` removes caches), or point DYNOCAP_HOME at a \
                 filesystem with more room",
                s.flag("no-cache")
            )
        })
    })
}

/// An earlier format's directories with no file in them (a vm-only project's) go now; ones
/// with files wait for a jail to copy them into the image.
fn drop_empty_legacy_data(data: &Path) {
    let Ok(entries) = std::fs::read_dir(data) else {
        return;
    };
    let empty = entries.flatten().all(|entry| {
        entry.file_type().is_ok_and(|t| t.is_dir())
            && std::fs::read_dir(entry.path()).is_ok_and(|mut inner| inner.next().is_none())
    });
    if empty {
        make_dirs_writable(data);
        let _ = std::fs::remove_dir_all(data);
    }
}

fn private_dir(dir: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            match std::fs::symlink_metadata(dir) {
                Ok(meta) if meta.is_dir() => Ok(()),
                _ => Err(Error::internal(format!(
                    "{} is not a directory",
                    dir.display()
                ))),
            }
        }
        Err(err) => Err(err).with_context(|| format!("creating {}", dir.display())),
    }
}

/// One cache as `dynocap cache ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheInfo {
    pub id: String,
    /// `None` when its `project.json` is missing or unreadable.
    pub key: Option<ProjectKey>,
    /// Bytes its files take on disk.
    pub bytes: u64,
    pub last_used: Option<SystemTime>,
}

/// Every cache in the home at `root`, by id.
pub fn list(root: &Path) -> Result<Vec<CacheInfo>> {
    let caches = caches_dir(root);
    let entries = match std::fs::read_dir(&caches) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err).with_context(|| format!("reading {}", caches.display())),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", caches.display()))?;
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_cache_id(&id) {
            continue;
        }
        found.push(info(root, &id));
    }
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

/// What the home at `root` knows of the cache `id` (which must be a cache id).
pub fn info(root: &Path, id: &str) -> CacheInfo {
    let dir = caches_dir(root).join(id);
    let key = std::fs::read(dir.join(PROJECT_FILE))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok());
    let last_used = std::fs::symlink_metadata(dir.join(LAST_USED_FILE))
        .and_then(|meta| meta.modified())
        .ok();
    CacheInfo {
        id: id.to_owned(),
        key,
        bytes: disk_usage(&dir),
        last_used,
    }
}

/// Bytes the files under `dir` take on disk, following no symlink.
fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.file_type().and_then(|_| entry.metadata()) else {
                continue;
            };
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    total
}

/// Deletes the cache `id` (a cache id) and everything in it, following no symlink. `false`
/// when there was none.
pub fn remove(root: &Path, id: &str) -> Result<bool> {
    if !is_cache_id(id) {
        return Err(Error::invalid(format!("{id:?} is not a cache id")));
    }
    let dir = caches_dir(root).join(id);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        // Go writes its module cache read-only: make each directory writable and go again.
        Err(_) => {
            make_dirs_writable(&dir);
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            Ok(true)
        }
    }
}

/// Deletes the cache `id` as [`remove`] does, unless a guest has it now (a supervisor holds
/// its `cache.lock`, shared or alone): `false` then, or when there was none. The lock is held
/// while it goes, so no jail or vm guest takes it meanwhile.
pub fn remove_unheld(root: &Path, id: &str) -> Result<bool> {
    use std::os::fd::AsRawFd;
    if !is_cache_id(id) {
        return Err(Error::invalid(format!("{id:?} is not a cache id")));
    }
    let path = caches_dir(root).join(id).join(LOCK);
    let lock = match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(lock) => Some(lock),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => return Err(err).with_context(|| format!("opening {}", path.display())),
    };
    if let Some(lock) = &lock {
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Ok(false);
        }
    }
    remove(root, id)
}

fn make_dirs_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::foundation::git_url::GitUrl;

    fn repo(url: &str) -> ProjectKey {
        ProjectKey::for_source(&Source::RepositoryUrl(GitUrl::parse(url).unwrap())).unwrap()
    }

    #[test]
    fn one_repository_is_one_project_however_it_is_spelled() {
        let https = repo("https://GitHub.com/team/app.git");
        assert_eq!(https.project, "github.com/team/app");
        assert_eq!(https, repo("ssh://git@github.com/team/app"));
        assert_eq!(https, repo("git@github.com:team/app.git"));
        assert_ne!(https.id(), repo("https://github.com/team/other").id());
        assert!(is_cache_id(&https.id()), "{}", https.id());
    }

    #[test]
    fn two_users_repositories_in_their_homes_are_two_projects() {
        let alice = repo("alice@example.org:app.git");
        assert_eq!(alice.project, "alice@example.org/app");
        assert_ne!(alice.id(), repo("bob@example.org:app.git").id());
        assert_eq!(alice, repo("ssh://alice@example.org/~/app"));
        assert_ne!(alice.id(), repo("https://example.org/app").id());
        // A path that names its place is the same repository whoever logs in.
        assert_eq!(
            repo("alice@example.org:/srv/git/app"),
            repo("bob@example.org:/srv/git/app")
        );
        assert_eq!(
            repo("alice@example.org:/srv/git/app").project,
            "example.org/srv/git/app"
        );
        assert_eq!(
            repo("ssh://alice@example.org/~carol/app"),
            repo("bob@example.org:~carol/app")
        );
        // Forges' `git` login: one repository however it is spelled.
        assert_eq!(
            repo("git@example.org:team/app").project,
            "example.org/team/app"
        );
    }

    #[test]
    fn a_directory_and_a_repository_of_the_same_text_are_different_projects() {
        let dir =
            ProjectKey::for_source(&Source::ProjectPath("/github.com/team/app".into())).unwrap();
        let url = repo("https://github.com/team/app");
        assert_ne!(dir.id(), url.id());
    }

    #[test]
    fn a_cache_is_made_with_its_room_set_aside_listed_and_removed() {
        let home = tempfile::tempdir().unwrap();
        let key = ProjectKey::for_source(&Source::ProjectPath("/src/app".into())).unwrap();
        let bytes = 40 << 20;
        assert_eq!(room_needed(home.path(), &key.id(), bytes), bytes);
        let cache = ProjectCache::prepare(home.path(), &key, bytes).unwrap();
        let image = std::fs::metadata(cache.image()).unwrap();
        assert_eq!(image.len(), bytes);
        assert!(
            image.blocks() * 512 >= bytes,
            "the whole image is set aside"
        );
        assert_eq!(
            room_needed(home.path(), &key.id(), bytes),
            0,
            "counted once"
        );
        assert!(cache.mountpoint().is_dir());
        assert_eq!(ProjectCache::spots(false).count(), SPOTS.len() - 1);
        // Made again, with another size asked: the image stays as it is.
        let again = ProjectCache::prepare(home.path(), &key, 64 << 20).unwrap();
        assert_eq!(again.bytes(), bytes);
        // Jails share it; a vm guest has it alone.
        let shared = cache.hold(false).unwrap().expect("shared");
        assert!(cache.hold(false).unwrap().is_some());
        assert!(cache.vm_disk(false).unwrap().is_none());
        drop(shared);
        assert!(!cache.guest_wrote().exists(), "no guest had it yet");
        let vm = cache.vm_disk(true).unwrap().expect("alone");
        assert!(
            cache.guest_wrote().exists(),
            "marked before the guest gets it: the next jail formats it afresh"
        );
        assert!(vm.spots.contains("pip:.cache/pip"), "{}", vm.spots);
        assert!(cache.hold(false).unwrap().is_none());
        drop(vm);
        let listed = list(home.path()).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].key.as_ref(), Some(&key));
        assert!(listed[0].bytes >= bytes, "{listed:?}");
        assert!(listed[0].last_used.is_some());
        // Not while a guest has it.
        let held = cache.hold(false).unwrap().expect("shared");
        assert!(!remove_unheld(home.path(), &key.id()).unwrap());
        assert!(cache.image().is_file());
        drop(held);
        assert!(remove_unheld(home.path(), &key.id()).unwrap());
        let _ = ProjectCache::prepare(home.path(), &key, bytes).unwrap();
        assert!(remove(home.path(), &key.id()).unwrap());
        assert!(!remove(home.path(), &key.id()).unwrap());
        assert!(!remove_unheld(home.path(), &key.id()).unwrap());
        assert!(list(home.path()).unwrap().is_empty());
        assert!(remove(home.path(), "../x").is_err());
    }

    #[test]
    fn a_full_cache_is_told_and_one_with_room_is_not() {
        let mb = 1 << 20;
        assert_eq!(full_note(500 * mb, 2048 * mb, 10), None);
        let full = full_note(0, 64 * mb, 10).expect("full");
        for needle in [
            "64 of 64 MB",
            "~/.cache/pip",
            "/var/cache/apt/archives",
            "DYNOCAP_CACHE_MB",
        ] {
            assert!(full.contains(needle), "{needle:?} not in {full}");
        }
        assert!(full_note(mb / 2, 64 * mb, 10).is_some());
        assert!(full_note(500 * mb, 2048 * mb, 0).is_some_and(|n| n.contains("no file left")));
    }

    #[test]
    fn an_earlier_formats_cache_is_adopted() {
        let home = tempfile::tempdir().unwrap();
        let key = ProjectKey::for_source(&Source::ProjectPath("/src/old".into())).unwrap();
        let dir = caches_dir(home.path()).join(key.id());
        std::fs::create_dir_all(dir.join("data/pip")).unwrap();
        std::fs::create_dir_all(dir.join("data/npm")).unwrap();
        std::fs::write(dir.join("data/pip/wheel"), b"w").unwrap();
        std::fs::File::create(dir.join("vm.img"))
            .unwrap()
            .set_len(48 << 20)
            .unwrap();
        assert_eq!(room_needed(home.path(), &key.id(), 1 << 30), 48 << 20);
        let cache = ProjectCache::prepare(home.path(), &key, 32 << 20).unwrap();
        assert!(!dir.join("vm.img").exists());
        assert_eq!(cache.bytes(), 48 << 20, "the vm disk became the image");
        assert!(cache.guest_wrote().exists(), "a vm guest's kernel wrote it");
        assert!(std::fs::metadata(cache.image()).unwrap().blocks() * 512 >= 48 << 20);
        assert_eq!(
            cache.legacy_data(),
            Some(dir.join("data")),
            "kept for a jail to copy"
        );
        // Directories holding nothing go at once.
        std::fs::remove_file(dir.join("data/pip/wheel")).unwrap();
        let cache = ProjectCache::prepare(home.path(), &key, 32 << 20).unwrap();
        assert_eq!(cache.legacy_data(), None);
    }
}
