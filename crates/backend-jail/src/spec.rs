//! What the engine asks for: [`JailSpec`] and its parts, and the checks that run before
//! anything is created (names, absolute guest paths, limits in range, host paths present).

use std::path::{Component, Path, PathBuf};

use crate::error::JailError;

/// Where the agent binary appears inside the guest.
pub const AGENT_GUEST_PATH: &str = "/.dynocap/agent";

/// The agent's end of the channel socket inside the guest.
pub const CHANNEL_FD: i32 = 3;

/// Everything needed to build one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailSpec {
    /// Stable, never-reused key of the sandbox: the cgroup leaf name (`dynocap/<name>`) and
    /// what [`crate::cleanup_leftovers`] is called with. 1 to 63 characters from
    /// `[A-Za-z0-9_.-]`, starting with a letter or digit.
    pub name: String,
    /// Hostname inside the guest; same rules as `name`.
    pub hostname: String,
    /// Read-only lower layer of the overlay root (a rootfs directory owned by host root). It
    /// may contain empty directories as mountpoints for `ro_binds`, `/proc`, `/dev`, `/tmp`.
    pub image_root: PathBuf,
    /// Host paths bound read-only (recursive, nosuid, nodev) over the root, in this order.
    pub ro_binds: Vec<RoBind>,
    /// Host directories bound read-write (nosuid, nodev) over the root, after `ro_binds`, each
    /// shown through the guest's id map (an idmapped mount, see `idmapped`): their files'
    /// owners on disk are guest ids, the same whatever host id range a sandbox has, so one
    /// directory serves sandbox after sandbox (a project's package caches). Needs a root
    /// supervisor; a target's missing directories are made as [`RoBind::target`]'s are.
    pub rw_binds: Vec<RwBind>,
    /// A project's package cache: an ext4 image mounted by the supervisor, whose directories
    /// are bound read-write over the root through the guest's id map, as `rw_binds` are. Needs
    /// a root supervisor.
    pub cache: Option<CacheSpec>,
    /// Per-sandbox directory the caller created; `upper/`, `work/` and `root/` are made in it.
    pub state_dir: PathBuf,
    /// Directories created in the upper layer before start, owned by the host ids their guest
    /// ids map to (e.g. `/home/sandbox` 1000:1000 0o755).
    pub guest_dirs: Vec<GuestDir>,
    /// Host path of the agent; bound read-only onto [`AGENT_GUEST_PATH`].
    pub agent_binary: PathBuf,
    /// The guest runs `/.dynocap/agent --channel-fd 3 <agent_args...>`.
    pub agent_args: Vec<String>,
    /// cgroup limits; the jail does not start if one cannot be applied.
    pub limits: Limits,
    /// Boot over the `upper/` layer a stopped jail kept in `state_dir` (see
    /// [`crate::Jail::stop_keeping_layers`]) instead of a fresh one: the guest finds its files
    /// as the last guest left them. `guest_dirs` are not created again. A failed start leaves
    /// that layer in place.
    pub reuse_layers: bool,
    /// With `reuse_layers`: the id map the kept layer was written under, when it is not this
    /// jail's own (a layer duplicated from another sandbox's: a fork's, and every later boot
    /// of it). The disk is shown to the guest through an idmapped mount from those ids to
    /// this jail's (see `idmapped::layer_disk`); nothing on it changes owner.
    pub layer_ids: Option<dynocap_host::IdMap>,
    /// Size of the sandbox's disk (an ext4 image under `state_dir`, holding the writable
    /// layer): past it, or past its inodes, the guest's writes fail with ENOSPC. `None` puts
    /// the writable layer on the host's filesystem without a limit (for rootless use, where a
    /// loop mount is impossible). With `reuse_layers`, the kept disk is mounted as it is.
    pub disk_bytes: Option<u64>,
    /// Where formatted empty disks are kept, one per size, for new disks to be copied from
    /// (formatting each afresh costs a process and several fsyncs). `None` formats every
    /// disk afresh.
    pub disk_templates: Option<PathBuf>,
    /// Keep `CAP_NET_RAW` (in Docker's default set). A guest whose traffic leaves through
    /// user-mode networking ([`crate::UserNet`]) must not have it: raw and packet sockets
    /// would let it address packets around the routes that keep it off the host's addresses.
    pub net_raw: bool,
    /// `image_root` is a whole filesystem owned by host root (a built image): show it to the
    /// guest through the guest's id map (an idmapped mount, see `idmapped`), so the guest's
    /// root owns it and can change it (in the upper layer). Needs a root supervisor.
    pub idmap_image: bool,
    /// The cgroup hierarchy the guest's commands run in, by name (`freezer`, `v2`, `pids`:
    /// `DYNOCAP_EXEC_CGROUP`); `None` takes the best one the host has.
    pub exec_cgroup: Option<String>,
}

/// A host path bound read-only into the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoBind {
    /// Host path (file or directory); it must exist.
    pub source: PathBuf,
    /// Absolute guest path, resolved inside the guest root (its symlinks cannot lead out).
    /// Created (in the upper layer) when missing, which needs its parent to be writable by the
    /// guest's root: not a directory of a host-root-owned image.
    pub target: PathBuf,
}

/// A host directory bound read-write into the guest through its id map (see
/// [`JailSpec::rw_binds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwBind {
    /// Host directory; it must exist.
    pub source: PathBuf,
    /// Absolute guest path, resolved inside the guest root.
    pub target: PathBuf,
}

/// A project's package cache for the guest (see [`JailSpec::cache`] and `cache_disk`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSpec {
    /// The cache's ext4 image (its room already set aside on the host by the caller). Every
    /// jail that has it mounts it through one loop device, so they share one filesystem.
    pub image: PathBuf,
    /// An empty host directory the supervisor mounts the image on, in its own mount namespace.
    pub mountpoint: PathBuf,
    /// The cache's directories at the image's root, each bound on its guest path.
    pub spots: Vec<CacheSpot>,
    /// An earlier format's host directories (`<name>/` of each spot): copied into the image
    /// the first time, then removed.
    pub legacy: Option<PathBuf>,
    /// A file whose presence says a vm guest had the image as a disk since a jail last
    /// mounted it: its kernel wrote the image's blocks, so what is there is the guest's
    /// making, not a filesystem the host's kernel should parse. The image is formatted afresh
    /// (under its lock, while no jail has it) before it is mounted, and the file removed.
    pub guest_wrote: Option<PathBuf>,
}

/// One directory of a package cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSpot {
    /// Its name at the image's root: letters, digits and `-`.
    pub name: String,
    /// Guest ids of its owner, made so when it is new.
    pub uid: u32,
    pub gid: u32,
    /// Absolute guest path, resolved inside the guest root.
    pub target: PathBuf,
}

/// A directory created in the upper layer before the guest starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestDir {
    /// Absolute guest path.
    pub path: PathBuf,
    /// Guest uid of the owner.
    pub uid: u32,
    /// Guest gid of the owner.
    pub gid: u32,
    /// Permission bits (at most 0o7777).
    pub mode: u32,
}

/// cgroup limits for the whole sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPU bandwidth in thousandths of a CPU: 1000 = one CPU (at least 10).
    pub cpu_millis: u64,
    /// Memory (RAM, no swap) in bytes (at least 4 MiB).
    pub memory_bytes: u64,
    /// Maximum number of tasks (processes and threads), at least 1.
    pub pids: u64,
}

/// Smallest CPU share: the kernel refuses a CFS quota under 1 ms per 100 ms period.
pub(crate) const MIN_CPU_MILLIS: u64 = 10;
/// Largest CPU share accepted (1024 CPUs); keeps the quota arithmetic far from overflow.
pub(crate) const MAX_CPU_MILLIS: u64 = 1024 * 1000;
/// Below this the agent itself cannot run.
pub(crate) const MIN_MEMORY_BYTES: u64 = 4 << 20;
/// Smallest disk: ext4 with its journal and the guest's directories needs a few MiB.
pub(crate) const MIN_DISK_BYTES: u64 = 16 << 20;
/// Largest disk (1 PiB): far beyond any host, far below ext4's limits.
pub(crate) const MAX_DISK_BYTES: u64 = 1 << 50;
/// Longest sandbox name (a hostname label).
const MAX_NAME_LEN: usize = 63;

impl JailSpec {
    /// Checks everything that can be checked without creating anything.
    pub(crate) fn validate(&self) -> Result<(), JailError> {
        validate_name(&self.name)?;
        validate_name(&self.hostname)?;
        require_dir("image_root", &self.image_root)?;
        require_dir("state_dir", &self.state_dir)?;
        require_absolute("agent_binary", &self.agent_binary)?;
        match std::fs::metadata(&self.agent_binary) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => {
                return Err(invalid(format!(
                    "agent_binary {} is not a regular file",
                    self.agent_binary.display()
                )))
            }
            Err(e) => return Err(JailError::io("use agent_binary", &self.agent_binary, e)),
        }
        for bind in &self.ro_binds {
            require_absolute("ro_bind source", &bind.source)?;
            if let Err(e) = std::fs::metadata(&bind.source) {
                return Err(JailError::io("bind (read-only)", &bind.source, e)
                    .hint("the source of a read-only bind must exist on the host"));
            }
            let rel = guest_relative(&bind.target)?;
            if rel.as_os_str().is_empty() {
                return Err(invalid(format!(
                    "ro_bind {} targets the guest root",
                    bind.source.display()
                )));
            }
            if rel.starts_with(".dynocap") {
                return Err(invalid(format!(
                    "ro_bind target {} is reserved for the agent",
                    bind.target.display()
                )));
            }
        }
        for bind in &self.rw_binds {
            require_dir("rw_bind source", &bind.source)?;
            let rel = guest_relative(&bind.target)?;
            if rel.as_os_str().is_empty() || rel.starts_with(".dynocap") {
                return Err(invalid(format!(
                    "rw_bind target {} is the guest root or reserved for the agent",
                    bind.target.display()
                )));
            }
        }
        if let Some(cache) = &self.cache {
            require_absolute("cache image", &cache.image)?;
            require_dir("cache mountpoint", &cache.mountpoint)?;
            for spot in &cache.spots {
                let simple = !spot.name.is_empty()
                    && spot
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-');
                let rel = guest_relative(&spot.target)?;
                if !simple || rel.as_os_str().is_empty() || rel.starts_with(".dynocap") {
                    return Err(invalid(format!(
                        "cache directory {:?} on {} is not a plain name, or targets the guest \
                         root or the agent's directory",
                        spot.name,
                        spot.target.display()
                    )));
                }
            }
        }
        for dir in &self.guest_dirs {
            if guest_relative(&dir.path)?.as_os_str().is_empty() {
                return Err(invalid("a guest_dir names the guest root".to_string()));
            }
            if dir.mode > 0o7777 {
                return Err(invalid(format!(
                    "guest_dir {} has mode {:o}; at most 0o7777",
                    dir.path.display(),
                    dir.mode
                )));
            }
        }
        if let Some(bytes) = self.disk_bytes {
            if !(MIN_DISK_BYTES..=MAX_DISK_BYTES).contains(&bytes) {
                return Err(invalid(format!(
                    "disk_bytes is {bytes}; it must be between {MIN_DISK_BYTES} and {MAX_DISK_BYTES}"
                )));
            }
        }
        self.limits.validate()
    }
}

impl Limits {
    fn validate(&self) -> Result<(), JailError> {
        if !(MIN_CPU_MILLIS..=MAX_CPU_MILLIS).contains(&self.cpu_millis) {
            return Err(invalid(format!(
                "limits.cpu_millis is {}; it must be between {MIN_CPU_MILLIS} and {MAX_CPU_MILLIS} (1000 = one CPU)",
                self.cpu_millis
            )));
        }
        if self.memory_bytes < MIN_MEMORY_BYTES {
            return Err(invalid(format!(
                "limits.memory_bytes is {}; it must be at least {MIN_MEMORY_BYTES}",
                self.memory_bytes
            )));
        }
        if self.pids == 0 {
            return Err(invalid("limits.pids must be at least 1".to_string()));
        }
        Ok(())
    }
}

/// Checks a sandbox name: it becomes a hostname and a cgroup directory name.
pub(crate) fn validate_name(name: &str) -> Result<(), JailError> {
    let ok_len = (1..=MAX_NAME_LEN).contains(&name.len());
    let ok_first = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric());
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok_len && ok_first && ok_chars {
        Ok(())
    } else {
        Err(invalid(format!(
            "name {name:?} must be 1 to {MAX_NAME_LEN} characters from [A-Za-z0-9_.-], starting with a letter or digit"
        )))
    }
}

/// Turns an absolute guest path into a path relative to the guest root, refusing `.`, `..`
/// and anything that is not plain names (so it cannot climb out of the root it is joined to).
pub(crate) fn guest_relative(path: &Path) -> Result<PathBuf, JailError> {
    let mut components = path.components();
    if components.next() != Some(Component::RootDir) {
        return Err(invalid(format!(
            "guest path {} is not absolute",
            path.display()
        )));
    }
    let mut rel = PathBuf::new();
    for component in components {
        match component {
            Component::Normal(name) => rel.push(name),
            _ => {
                return Err(invalid(format!(
                    "guest path {} must not contain '.' or '..'",
                    path.display()
                )))
            }
        }
    }
    Ok(rel)
}

fn require_absolute(what: &str, path: &Path) -> Result<(), JailError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(invalid(format!(
            "{what} {} is not an absolute path",
            path.display()
        )))
    }
}

fn require_dir(what: &str, path: &Path) -> Result<(), JailError> {
    require_absolute(what, path)?;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(invalid(format!(
            "{what} {} is not a directory",
            path.display()
        ))),
        Err(e) => Err(JailError::io(&format!("use {what}"), path, e)),
    }
}

fn invalid(message: String) -> JailError {
    JailError::InvalidSpec(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["a", "task-1", "Box_2.x", &"x".repeat(63)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", ".", "..", "a/b", "a b", "é", &"x".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn guest_paths() {
        assert_eq!(
            guest_relative(Path::new("/usr/bin")).ok(),
            Some(PathBuf::from("usr/bin"))
        );
        assert_eq!(guest_relative(Path::new("/")).ok(), Some(PathBuf::new()));
        // A trailing slash, doubled slashes and inner "." are plain spelling variants.
        assert_eq!(
            guest_relative(Path::new("//a//b/")).ok(),
            Some(PathBuf::from("a/b"))
        );
        assert_eq!(
            guest_relative(Path::new("/a/./b")).ok(),
            Some(PathBuf::from("a/b"))
        );
        for bad in ["usr", "/a/../b", "/..", ""] {
            assert!(guest_relative(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits() {
        let ok = Limits {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            pids: 100,
        };
        assert!(ok.validate().is_ok());
        assert!(Limits {
            cpu_millis: 9,
            ..ok
        }
        .validate()
        .is_err());
        assert!(Limits {
            cpu_millis: MAX_CPU_MILLIS + 1,
            ..ok
        }
        .validate()
        .is_err());
        assert!(Limits {
            memory_bytes: 1 << 20,
            ..ok
        }
        .validate()
        .is_err());
        assert!(Limits { pids: 0, ..ok }.validate().is_err());
    }
}
