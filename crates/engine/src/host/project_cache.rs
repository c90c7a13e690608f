//! Per-project package caches on the host: `$DYNOCAP_HOME/caches/<project-id>/`, one per
//! project, holding what pip, npm, cargo, go and apt download, so that the second task of a
//! project does not download it again. A cache is shown only to tasks of its own project
//! (never to another project's, never to a raw sandbox), read-write, outside `/workspace`, so
//! nothing of it reaches a patch.
//!
//! A project is named by where its tasks come from: the canonical project directory of a
//! local task (every symlink resolved, as the import opens it), or the repository of a
//! clone, as host and path (`github.com/team/app`: scheme, user, port, a trailing `/` and
//! `.git` left out, so `https://` and `ssh://` clones of one repository share it). The
//! directory's name is a hash of that ([`ProjectKey::id`]); `project.json` in it says
//! which project it is.
//!
//! The jail binds `data/<name>/` directories through the guest's id map, so the files' owners
//! on disk are guest ids (the sandbox user's, or guest root's for apt's archives) whatever
//! host id range a sandbox has; the caches directory is private to the user running
//! DynoCap (0700), so no host account reaches them. Everything here reads the guest's files
//! without following a symlink.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::foundation::error::{Context, Error, Result};
use crate::model::task_spec::Source;

/// The caches' directory in the home.
pub const CACHES: &str = "caches";
/// What project a cache is for, in its directory.
const PROJECT_FILE: &str = "project.json";
/// Touched at each start of a task of the project.
const LAST_USED_FILE: &str = "last-used";
/// The directories the jail binds.
const DATA: &str = "data";

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
                Some(Self {
                    kind: "repository".to_owned(),
                    project: format!("{}/{}", url.host(), path.trim_end_matches('/')),
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
}

impl ProjectCache {
    /// The cache of `key` in the home at `root`: its directories made (the sandbox user's,
    /// `user` as guest ids, but apt's, which is guest root's) and its last use set to now.
    pub fn prepare(root: &Path, key: &ProjectKey, user: (u32, u32)) -> Result<Self> {
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
        let data = dir.join(DATA);
        private_dir(&data)?;
        for spot in SPOTS {
            let path = data.join(spot.name);
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => continue,
                Ok(_) => {
                    return Err(Error::internal(format!(
                        "{} is not a directory; remove the project's cache with `dynocap cache rm`",
                        path.display()
                    )))
                }
                Err(_) => {}
            }
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            // Only root can hand them to guest ids; an unprivileged supervisor's jail binds
            // no caches (it cannot make the idmapped mounts) and its vm's are on the disk.
            if nix::unistd::geteuid().is_root() {
                let (uid, gid) = if spot.root_owned { (0, 0) } else { user };
                std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                    .with_context(|| format!("owning {}", path.display()))?;
            }
        }
        let stamp = dir.join(LAST_USED_FILE);
        std::fs::File::create(&stamp)
            .and_then(|mut f| f.write_all(b""))
            .with_context(|| format!("marking {} used", dir.display()))?;
        Ok(Self { dir })
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Each cache's host directory with the guest path it is bound on (`home`: the sandbox
    /// user's home). apt's only when `with_apt` (an image that has apt's archives).
    pub fn binds(&self, home: &Path, with_apt: bool) -> Vec<(PathBuf, PathBuf)> {
        SPOTS
            .iter()
            .filter(|spot| with_apt || !spot.root_owned)
            .map(|spot| (self.dir.join(DATA).join(spot.name), home.join(spot.guest)))
            .collect()
    }
}

/// The vm's cache disk: a sparse raw ext4 image, only ever mounted by guests (a guest kernel
/// writes it, so the host never reads its files).
const VM_DISK: &str = "vm.img";
/// Held (flock) by the supervisor whose guest has the disk read-write.
const VM_LOCK: &str = "vm.lock";
/// The vm cache disk's size: its files take room on the host only as the guests write them.
pub const VM_DISK_BYTES: u64 = 8 << 30;

/// A vm guest's hold on its project's cache disk.
#[derive(Debug)]
pub struct VmCacheDisk {
    pub image: PathBuf,
    /// The lock, held while the guest has the disk read-write; `None`: another guest has it,
    /// and this one writes to a throwaway layer over it.
    pub lock: Option<std::fs::File>,
    /// `name:path` entries for the guest (see the agent's `vm_cache`).
    pub spots: String,
}

impl ProjectCache {
    /// The project's vm cache disk, made (formatted by `mkfs.ext4`) if new, and locked for
    /// this guest unless another guest of the project has it.
    pub fn vm_disk(&self, with_apt: bool) -> Result<VmCacheDisk> {
        use std::os::fd::AsRawFd;
        let image = self.dir.join(VM_DISK);
        if std::fs::symlink_metadata(&image).is_err() {
            let partial = self.dir.join("vm.img.partial");
            let file = std::fs::File::create(&partial)
                .with_context(|| format!("creating {}", partial.display()))?;
            file.set_len(VM_DISK_BYTES)
                .with_context(|| format!("sizing {}", partial.display()))?;
            drop(file);
            let made = std::process::Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-L", "dynocap-cache"])
                .arg(&partial)
                .output()
                .context("running mkfs.ext4 (package e2fsprogs) for the vm's cache disk")?;
            if !made.status.success() {
                let _ = std::fs::remove_file(&partial);
                return Err(Error::internal(format!(
                    "mkfs.ext4 {}: {}",
                    partial.display(),
                    String::from_utf8_lossy(&made.stderr).trim()
                )));
            }
            std::fs::rename(&partial, &image)
                .with_context(|| format!("naming {}", image.display()))?;
        }
        let lock_path = self.dir.join(VM_LOCK);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let held = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        let spots = SPOTS
            .iter()
            .filter(|spot| with_apt || !spot.root_owned)
            .map(|spot| format!("{}:{}", spot.name, spot.guest))
            .collect::<Vec<_>>()
            .join(",");
        Ok(VmCacheDisk {
            image,
            lock: held.then_some(lock),
            spots,
        })
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
    fn a_directory_and_a_repository_of_the_same_text_are_different_projects() {
        let dir =
            ProjectKey::for_source(&Source::ProjectPath("/github.com/team/app".into())).unwrap();
        let url = repo("https://github.com/team/app");
        assert_ne!(dir.id(), url.id());
    }

    #[test]
    fn a_cache_is_made_listed_and_removed() {
        let home = tempfile::tempdir().unwrap();
        let key = ProjectKey::for_source(&Source::ProjectPath("/src/app".into())).unwrap();
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let cache = ProjectCache::prepare(home.path(), &key, me).unwrap();
        let binds = cache.binds(Path::new("/home/sandbox"), false);
        assert_eq!(binds.len(), SPOTS.len() - 1);
        assert!(binds
            .iter()
            .any(|(_, guest)| guest == Path::new("/home/sandbox/.cache/pip")));
        std::fs::write(binds[0].0.join("wheel"), vec![1u8; 10_000]).unwrap();
        // Made again: what is there stays.
        ProjectCache::prepare(home.path(), &key, me).unwrap();
        let listed = list(home.path()).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].key.as_ref(), Some(&key));
        assert!(listed[0].bytes >= 10_000, "{listed:?}");
        assert!(listed[0].last_used.is_some());
        assert!(remove(home.path(), &key.id()).unwrap());
        assert!(!remove(home.path(), &key.id()).unwrap());
        assert!(list(home.path()).unwrap().is_empty());
        assert!(remove(home.path(), "../x").is_err());
    }
}
