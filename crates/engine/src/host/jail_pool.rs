//! The home's reflink pool (`DYNOCAP_JAIL_POOL_MB`, opt-in): an XFS with reflink in the image
//! `jail-pool.xfs` of the home, mounted on its `sandboxes/`, so that on a home whose own
//! filesystem cannot share extents (ext4) the jail's checkpoints and forks clone the disk
//! image instead of copying what the task wrote (see `dynocap_backend_jail::pool`).
//!
//! The first process of the home that needs the pool makes it, under the lock
//! `jail-pool.lock`: the image reserved whole on the host when made (`fallocate`, as disks and
//! caches are: a host that cannot back it is `policy_denied`, naming its free space),
//! formatted, and mounted; after a reboot the first one mounts it again. Sandboxes' disks are
//! reserved inside it as on any filesystem, and a fork's clone shares its source's extents.
//!
//! The user sees it ([`state`]: `dynocap doctor`, `dynocap jail-pool`) and takes it away
//! ([`remove`]: `dynocap jail-pool rm`), under the same lock: refused while a sandbox lives
//! on it, otherwise unmounted and its image deleted. A refusal for room on it
//! ([`full_hint`]) says that the filesystem out of room is the pool, and how to give it more.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::foundation::error::{Error, ErrorCode, Result};

/// The pool's image, in the home.
const IMAGE: &str = "jail-pool.xfs";
const LOCK: &str = "jail-pool.lock";
/// The smallest XFS that mkfs.xfs makes.
const MIN_MB: u64 = 512;

/// Parses `DYNOCAP_JAIL_POOL_MB`: the pool's size in MB, or none (blank or unset).
pub fn parse_mb(value: Option<&str>) -> Result<Option<u64>> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match value.parse::<u64>() {
        Ok(mb) if mb >= MIN_MB => Ok(Some(mb)),
        _ => Err(Error::invalid(format!(
            "DYNOCAP_JAIL_POOL_MB={value:?} is not a size in MB of at least {MIN_MB}"
        ))),
    }
}

/// Used past this share of its room, the pool is nearly full (`dynocap doctor` warns): the
/// next fork's writes, which its clone sets nothing aside for, may not fit.
pub const NEARLY_FULL_PERCENT: u64 = 90;

/// Makes and mounts the pool of `mb` of the home at `root` on `root/sandboxes`, unless it is
/// mounted already.
pub fn ensure(root: &Path, mb: u64) -> Result<()> {
    let sandboxes = root.join("sandboxes");
    if dynocap_backend_jail::pool_mounted(&sandboxes, root).map_err(jail)? {
        return Ok(());
    }
    let _lock = lock(root)?;
    if dynocap_backend_jail::pool_mounted(&sandboxes, root).map_err(jail)? {
        return Ok(());
    }
    let image = root.join(IMAGE);
    dynocap_backend_jail::check_pool_mountpoint(&sandboxes).map_err(jail)?;
    if !image.exists() {
        make(root, &image, mb)?;
    }
    dynocap_backend_jail::mount_pool(&image, &sandboxes).map_err(jail)
}

/// Holds the pool's lock (`jail-pool.lock`) until dropped: one process at a time makes,
/// mounts or removes the pool.
fn lock(root: &Path) -> Result<nix::fcntl::Flock<File>> {
    let path = root.join(LOCK);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::internal(format!("opening {}: {e}", path.display())))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::internal(format!("locking the reflink pool: {e}")))
}

/// The home's reflink pool as it is now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolState {
    /// Its image in the home (`jail-pool.xfs`).
    pub image: PathBuf,
    /// Where it is mounted: the home's `sandboxes/`.
    pub mountpoint: PathBuf,
    /// `DYNOCAP_JAIL_POOL_MB`: the size a pool is made with; none when unset.
    #[serde(rename = "configuredMB")]
    pub configured_mb: Option<u64>,
    /// The image's size, once made.
    #[serde(rename = "imageMB")]
    pub image_mb: Option<u64>,
    /// Whether it is mounted on `mountpoint` (in this process's mount namespace, the host's).
    pub mounted: bool,
    /// The MB free on the home's own filesystem (where the image is, or is to be, made).
    #[serde(rename = "homeFreeMB")]
    pub home_free_mb: u64,
    /// Its filesystem's room, while mounted.
    pub room: Option<PoolRoom>,
    /// The ids of the sandboxes on it (their state directories), while mounted.
    pub sandboxes: Vec<String>,
}

/// The room of the pool's XFS, as `df` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRoom {
    #[serde(rename = "sizeMB")]
    pub size_mb: u64,
    #[serde(rename = "usedMB")]
    pub used_mb: u64,
    #[serde(rename = "freeMB")]
    pub free_mb: u64,
}

impl PoolRoom {
    /// The share of its room in use, in percent (rounded up: 99.5 % is not "99").
    pub fn used_percent(&self) -> u64 {
        (self.used_mb * 100).div_ceil(self.size_mb.max(1))
    }

    /// Whether it is past [`NEARLY_FULL_PERCENT`].
    pub fn nearly_full(&self) -> bool {
        self.used_percent() >= NEARLY_FULL_PERCENT
    }
}

/// The reflink pool of the home at `root`, made with `configured` MB
/// (`DYNOCAP_JAIL_POOL_MB`): none when it is not configured and there is none. Looks only:
/// nothing is made or mounted.
pub fn state(root: &Path, configured: Option<u64>) -> Result<Option<PoolState>> {
    let sandboxes = root.join("sandboxes");
    let image = root.join(IMAGE);
    let image_mb = match std::fs::metadata(&image) {
        Ok(meta) => Some(meta.len() >> 20),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::internal(format!("reading {}: {e}", image.display()))),
    };
    let mounted =
        sandboxes.is_dir() && dynocap_backend_jail::pool_mounted(&sandboxes, root).map_err(jail)?;
    if configured.is_none() && image_mb.is_none() && !mounted {
        return Ok(None);
    }
    let (room, held) = if mounted {
        let stat = nix::sys::statvfs::statvfs(&sandboxes).map_err(|e| {
            Error::internal(format!("reading the room of {}: {e}", sandboxes.display()))
        })?;
        let block = stat.fragment_size();
        let size_mb = stat.blocks().saturating_mul(block) >> 20;
        let free_mb = stat.blocks_available().saturating_mul(block) >> 20;
        let used_mb = stat
            .blocks()
            .saturating_sub(stat.blocks_free())
            .saturating_mul(block)
            >> 20;
        (
            Some(PoolRoom {
                size_mb,
                used_mb,
                free_mb,
            }),
            sandbox_ids(&sandboxes)?,
        )
    } else {
        (None, Vec::new())
    };
    Ok(Some(PoolState {
        image,
        mountpoint: sandboxes,
        configured_mb: configured,
        image_mb,
        mounted,
        home_free_mb: crate::host::disk_room::free_mb(root)?,
        room,
        sandboxes: held,
    }))
}

/// The sandboxes whose state directories are in `sandboxes`, sorted.
fn sandbox_ids(sandboxes: &Path) -> Result<Vec<String>> {
    let mut ids: Vec<String> = std::fs::read_dir(sandboxes)
        .map_err(|e| Error::internal(format!("reading {}: {e}", sandboxes.display())))?
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        // The filesystem's own (an XFS has none at its root, ext4's lost+found is not this).
        .filter(|name| name != "lost+found")
        .collect();
    ids.sort();
    Ok(ids)
}

/// What [`remove`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRemoved {
    /// Whether there was a pool to remove.
    pub removed: bool,
    pub image: PathBuf,
    /// Whether it was mounted (and is no longer).
    pub unmounted: bool,
    /// The image's blocks: what the home's filesystem gets back, once no process holds it.
    #[serde(rename = "freedMB")]
    pub freed_mb: u64,
    /// The processes that still have the pool mounted in mount namespaces of their own
    /// (supervisors that started while it was mounted): its blocks come back when they end.
    pub held_by: Vec<String>,
    /// Whether the next start makes it again (`DYNOCAP_JAIL_POOL_MB` is set).
    pub made_again: bool,
}

/// Removes the reflink pool of the home at `root`: refused (`conflict`) while a sandbox lives
/// on it, naming each as `named` words it; otherwise unmounted and its image deleted.
/// `configured`: `DYNOCAP_JAIL_POOL_MB`, whether the next start makes it again.
///
/// A start that makes its sandbox's directory between the check and the unmount puts it on
/// the home's own filesystem, where the pool is then refused until that sandbox goes
/// ([`dynocap_backend_jail::check_pool_mountpoint`]): nothing is lost, nothing is hidden.
pub fn remove(
    root: &Path,
    configured: Option<u64>,
    named: impl Fn(&str) -> String,
) -> Result<PoolRemoved> {
    let sandboxes = root.join("sandboxes");
    let image = root.join(IMAGE);
    let _lock = lock(root)?;
    let mounted =
        sandboxes.is_dir() && dynocap_backend_jail::pool_mounted(&sandboxes, root).map_err(jail)?;
    if mounted {
        let held = sandbox_ids(&sandboxes)?;
        if !held.is_empty() {
            let names: Vec<String> = held.iter().map(|id| named(id)).collect();
            return Err(Error::conflict(format!(
                "the reflink pool {} still holds {} sandbox{}: {}; finish or remove {} first \
                 (dynocap task finish NAME, dynocap rm --force NAME, dynocap destroy NAME for \
                 a raw sandbox; a task's checkpoints go with it), then run dynocap jail-pool rm \
                 again",
                image.display(),
                held.len(),
                if held.len() == 1 { "" } else { "es" },
                names.join(", "),
                if held.len() == 1 { "it" } else { "them" },
            )));
        }
        dynocap_backend_jail::unmount_pool(&sandboxes).map_err(jail)?;
    }
    let _ = std::fs::remove_file(root.join(format!("{IMAGE}.making")));
    let freed = match std::fs::metadata(&image) {
        Ok(meta) => meta.blocks().saturating_mul(512) >> 20,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(PoolRemoved {
                removed: mounted,
                image,
                unmounted: mounted,
                freed_mb: 0,
                held_by: Vec::new(),
                made_again: configured.is_some(),
            })
        }
        Err(e) => return Err(Error::internal(format!("reading {}: {e}", image.display()))),
    };
    // Supervisors that started while the pool was mounted (of any home: a private mount
    // namespace copies every mount) keep their copy of it until they end; none of them uses
    // it, but the image's blocks stay in use until then.
    let held_by = dynocap_backend_jail::pool_holders(&image)
        .into_iter()
        .map(|h| format!("pid {} ({})", h.pid, h.command))
        .collect();
    std::fs::remove_file(&image)
        .map_err(|e| Error::internal(format!("deleting {}: {e}", image.display())))?;
    if let Ok(dir) = File::open(root) {
        let _ = dir.sync_all();
    }
    Ok(PoolRemoved {
        removed: true,
        image,
        unmounted: mounted,
        freed_mb: freed,
        held_by,
        made_again: configured.is_some(),
    })
}

/// The home's `sandboxes/` at `root`, when its reflink pool is mounted there.
pub fn mounted(root: &Path) -> Option<PathBuf> {
    let sandboxes = root.join("sandboxes");
    dynocap_backend_jail::pool_mounted(&sandboxes, root)
        .unwrap_or(false)
        .then_some(sandboxes)
}

/// When `dir` is on a home's mounted reflink pool: the fix a refusal for room there offers
/// last, saying that the filesystem out of room is the pool and how to make it larger,
/// instead of "point DYNOCAP_HOME elsewhere", which does not help a pool of a fixed size.
pub fn full_hint(dir: &Path) -> Option<String> {
    let sandboxes = dir
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "sandboxes"))?;
    let root = sandboxes.parent()?;
    let image = root.join(IMAGE);
    if !image.is_file() || !dynocap_backend_jail::pool_mounted(sandboxes, root).unwrap_or(false) {
        return None;
    }
    let size = std::fs::metadata(&image)
        .map(|m| m.len() >> 20)
        .unwrap_or(0);
    Some(format!(
        "make the home's reflink pool larger: that filesystem is the pool ({}, {size} MB, \
         DYNOCAP_JAIL_POOL_MB); once it holds no sandbox, dynocap jail-pool rm removes it and \
         a larger DYNOCAP_JAIL_POOL_MB makes it anew at the next start",
        image.display()
    ))
}

/// Makes the pool's image under a temporary name: reserved, formatted, then named.
fn make(root: &Path, image: &Path, mb: u64) -> Result<()> {
    let making = root.join(format!("{IMAGE}.making"));
    let _ = std::fs::remove_file(&making);
    // Checked before the reservation too: a `fallocate` the host cannot back may take every
    // block it has before it fails, under everyone else's writes.
    let free = crate::host::disk_room::free_mb(root)?;
    if free < mb.saturating_add(crate::host::disk_room::HEADROOM_MB) {
        return Err(refusal(root, mb, free));
    }
    let made = (|| {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&making)
            .map_err(|e| Error::internal(format!("creating {}: {e}", making.display())))?;
        drop(file);
        crate::host::disk_room::reserve_with(
            &making,
            mb << 20,
            crate::host::disk_room::Layout::Fixed,
            |dir, free| refusal(dir, mb, free),
        )?;
        dynocap_backend_jail::format_pool(&making).map_err(jail)?;
        std::fs::rename(&making, image)
            .map_err(|e| Error::internal(format!("naming {}: {e}", image.display())))
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&making);
    }
    made
}

fn refusal(dir: &Path, mb: u64, free: u64) -> Error {
    Error::new(
        ErrorCode::PolicyDenied,
        format!(
            "the reflink pool (DYNOCAP_JAIL_POOL_MB={mb}) needs {mb} MB set aside on the \
             filesystem holding {}, which has {free} MB free and keeps {} MB for DynoCap's \
             records: make it smaller, free space there, or unset DYNOCAP_JAIL_POOL_MB",
            dir.display(),
            crate::host::disk_room::HEADROOM_MB
        ),
    )
}

fn jail(err: dynocap_backend_jail::JailError) -> Error {
    Error::invalid(err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_without_a_pool_shows_none_or_what_the_next_start_makes() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("sandboxes")).expect("sandboxes");
        assert_eq!(state(root.path(), None).expect("state"), None);
        let planned = state(root.path(), Some(2048))
            .expect("state")
            .expect("configured");
        assert_eq!(planned.configured_mb, Some(2048));
        assert_eq!((planned.image_mb, planned.mounted), (None, false));
        assert!(planned.room.is_none() && planned.sandboxes.is_empty());
        // Not a pool: a refusal there keeps its usual fix, and nothing is removed.
        assert_eq!(full_hint(&root.path().join("sandboxes")), None);
        let removed = remove(root.path(), None, str::to_owned).expect("remove");
        assert!(!removed.removed && !removed.unmounted, "{removed:?}");
    }

    #[test]
    fn a_pool_is_nearly_full_from_ninety_percent_used() {
        let room = |used_mb, free_mb| PoolRoom {
            size_mb: used_mb + free_mb,
            used_mb,
            free_mb,
        };
        assert_eq!(room(0, 1000).used_percent(), 0);
        assert!(!room(890, 110).nearly_full());
        assert!(room(899, 101).nearly_full(), "89.9% rounds up");
        assert!(room(900, 100).nearly_full());
        assert_eq!(room(995, 5).used_percent(), 100);
    }

    #[test]
    fn the_pool_size_is_megabytes_or_nothing() {
        assert_eq!(parse_mb(None).expect("unset"), None);
        assert_eq!(parse_mb(Some(" ")).expect("blank"), None);
        assert_eq!(parse_mb(Some("4096")).expect("size"), Some(4096));
        for bad in ["x", "-1", "100", "1.5"] {
            assert!(parse_mb(Some(bad)).is_err(), "{bad}");
        }
    }
}
