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

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

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

/// Makes and mounts the pool of `mb` of the home at `root` on `root/sandboxes`, unless it is
/// mounted already.
pub fn ensure(root: &Path, mb: u64) -> Result<()> {
    let sandboxes = root.join("sandboxes");
    if dynocap_backend_jail::pool_mounted(&sandboxes, root).map_err(jail)? {
        return Ok(());
    }
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(root.join(LOCK))
        .map_err(|e| Error::internal(format!("opening {}: {e}", root.join(LOCK).display())))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::internal(format!("locking the reflink pool: {e}")))?;
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
    fn the_pool_size_is_megabytes_or_nothing() {
        assert_eq!(parse_mb(None).expect("unset"), None);
        assert_eq!(parse_mb(Some(" ")).expect("blank"), None);
        assert_eq!(parse_mb(Some("4096")).expect("size"), Some(4096));
        for bad in ["x", "-1", "100", "1.5"] {
            assert!(parse_mb(Some(bad)).is_err(), "{bad}");
        }
    }
}
