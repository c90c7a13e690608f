//! A project's package cache as a jail has it ([`crate::JailSpec::cache`]): an ext4 image of a
//! fixed size, mounted by the supervisor in its own mount namespace (so the host's mount table
//! never shows it, and the kernel unmounts it when the supervisor goes, even by SIGKILL), its
//! directories then bound into the guest through the guest's id map like any read-write bind.
//!
//! Several jails of one project may have the cache at once. Two loop devices over one image
//! would be two ext4 filesystems writing the same blocks, so every jail mounts it through the
//! one loop device already bound to the image when there is one (the kernel then gives every
//! mount the same filesystem), and binds a new device (`LO_FLAGS_AUTOCLEAR`, freed with the
//! last mount) only when none is. A lock on the image makes finding or binding the device, and
//! mounting it, one start's at a time; a device found is held open (so it cannot clear itself)
//! and checked to be the image's before it is mounted.
//!
//! Past its size the guest's writes to the cache fail with ENOSPC; the host's other space is
//! not touched. [`cache_room`] and [`cache_failure`] tell the supervisor, which mounted it, how
//! full the cache is and whether its filesystem failed.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{umount2, MntFlags};

use crate::disk::{self, Disk, LoopInfo64, LOOP_GET_STATUS64};
use crate::error::JailError;
use crate::spec::CacheSpec;

/// The cache as this supervisor mounted it; unmounted on [`CacheMount::unmount`] or drop.
#[derive(Debug)]
pub(crate) struct CacheMount {
    mountpoint: PathBuf,
    mounted: bool,
}

impl CacheMount {
    /// Mounts the cache's image on its mountpoint, in this process's own mount namespace
    /// (entered here unless `disk` entered one), makes its directories and copies an earlier
    /// format's in.
    pub fn mount(spec: &CacheSpec, disk: &Disk) -> Result<CacheMount, JailError> {
        if !disk.in_own_mount_namespace() {
            disk::enter_private_mount_namespace()?;
        }
        let image = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&spec.image)
            .map_err(|e| JailError::io("open the package cache image", &spec.image, e))?;
        let image = nix::fcntl::Flock::lock(image, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| JailError::sys("locking the package cache image", e))?;
        // Held until the mount holds the device.
        let (device, _device_fd) = match shared_device(&image)? {
            Some(found) => found,
            None => {
                // No jail has it: a filesystem a vm guest wrote block by block is made
                // afresh before the host's kernel mounts it (it is only downloads).
                if let Some(marker) = &spec.guest_wrote {
                    reformat_after_guest(&spec.image, marker)?;
                }
                disk::attach_loop(&image)?
            }
        };
        disk::attach_mount(disk::mount_device(&device)?, &spec.mountpoint)?;
        let mut cache = CacheMount {
            mountpoint: spec.mountpoint.clone(),
            mounted: true,
        };
        if let Err(e) = cache.make_dirs(spec) {
            cache.unmount();
            return Err(e);
        }
        // Under the image's lock: one start copies, the others find it done.
        if let Some(legacy) = &spec.legacy {
            migrate(spec, legacy);
        }
        Ok(cache)
    }

    /// Each directory's path here, with its guest path, for the guest's binds.
    pub fn binds(&self, spec: &CacheSpec) -> Vec<(PathBuf, PathBuf)> {
        spec.spots
            .iter()
            .map(|spot| (self.mountpoint.join(&spot.name), spot.target.clone()))
            .collect()
    }

    /// The directories at the image's root, made the guest owner's when new.
    fn make_dirs(&self, spec: &CacheSpec) -> Result<(), JailError> {
        for spot in &spec.spots {
            let path = self.mountpoint.join(&spot.name);
            match fs::DirBuilder::new().mode(0o755).create(&path) {
                Ok(()) => std::os::unix::fs::lchown(&path, Some(spot.uid), Some(spot.gid))
                    .map_err(|e| JailError::io("own", &path, e))?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(JailError::io("create", &path, e)),
            }
            match fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => {}
                _ => {
                    return Err(JailError::InvalidSpec(format!(
                        "{} in the package cache image {} is not a directory; remove the \
                         project's cache with `dynocap cache rm`",
                        spot.name,
                        spec.image.display()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Unmounts the cache (this namespace's mount of it; the filesystem stays while another
    /// jail has it). Returns what failed.
    pub fn unmount(&mut self) -> Vec<String> {
        if !std::mem::replace(&mut self.mounted, false) {
            return Vec::new();
        }
        match umount2(&self.mountpoint, MntFlags::empty()) {
            Ok(()) => Vec::new(),
            Err(e) => {
                let _ = umount2(&self.mountpoint, MntFlags::MNT_DETACH);
                vec![format!(
                    "cannot unmount the package cache at {}: {e}",
                    self.mountpoint.display()
                )]
            }
        }
    }
}

impl Drop for CacheMount {
    fn drop(&mut self) {
        let _ = self.unmount();
    }
}

/// Formats `image` afresh when `marker` says a vm guest had it as a disk, then removes the
/// marker. The image's blocks stay allocated (no discard), so its room stays set aside.
fn reformat_after_guest(image: &Path, marker: &Path) -> Result<(), JailError> {
    match fs::symlink_metadata(marker) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(JailError::io("read", marker, e)),
    }
    let output = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-L", "dynocap-cache"])
        .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
        .arg(image)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .map_err(|e| JailError::io("run mkfs.ext4 (package e2fsprogs) on", image, e))?;
    if !output.status.success() {
        return Err(JailError::InvalidSpec(format!(
            "formatting the package cache image {} afresh after a vm guest had it: mkfs.ext4: \
             {}; remove the project's cache with `dynocap cache rm`",
            image.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    // The new filesystem is on disk before the marker goes: a crash between leaves the
    // marker, and the next mount formats again.
    File::open(image)
        .and_then(|file| file.sync_all())
        .map_err(|e| JailError::io("sync", image, e))?;
    match fs::remove_file(marker) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(JailError::io("remove", marker, e)),
    }
}

/// The loop device already bound to `image` (checked by the backing file's device and inode,
/// from the device itself), opened, if there is one.
fn shared_device(image: &File) -> Result<Option<(PathBuf, File)>, JailError> {
    let meta = image
        .metadata()
        .map_err(|e| JailError::io("read", Path::new("the package cache image"), e))?;
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Ok(None);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("loop")) else {
            continue;
        };
        // Bound devices have a backing file; reading it first spares opening every device.
        if !entry.path().join("loop/backing_file").exists() {
            continue;
        }
        let path = PathBuf::from(format!("/dev/{name}"));
        let Ok(device) = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
        else {
            continue;
        };
        // SAFETY: all-zero is a valid loop_info64 (integers and byte arrays).
        let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
        // SAFETY: LOOP_GET_STATUS64 writes one struct loop_info64 into `info`, which lives
        // across the call; `device` is an open loop device.
        if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_GET_STATUS64, &mut info) } != 0 {
            continue;
        }
        // Open now, the device cannot clear itself: what it is bound to stays so.
        if info.lo_device == meta.dev()
            && info.lo_inode == meta.ino()
            && info.lo_offset == 0
            && info.lo_sizelimit == 0
        {
            return Ok(Some((path, device)));
        }
    }
    Ok(None)
}

/// Copies an earlier format's host directories into the mounted image, then removes them:
/// what does not fit is dropped (it is only downloads), and the supervisor's log says so.
fn migrate(spec: &CacheSpec, legacy: &Path) {
    if !fs::symlink_metadata(legacy).is_ok_and(|meta| meta.is_dir()) {
        return;
    }
    for spot in &spec.spots {
        let from = legacy.join(&spot.name);
        if !fs::symlink_metadata(&from).is_ok_and(|meta| meta.is_dir()) {
            continue;
        }
        // -a: owners (guest ids, as in the image), modes and symlinks as they are.
        let copied = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", from.display()))
            .arg(format!("{}/", spec.mountpoint.join(&spot.name).display()))
            .env("PATH", "/usr/bin:/bin")
            .output();
        match copied {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "dynocap: copying the earlier package cache {} into the image: {}; the rest \
                 is dropped",
                from.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => eprintln!("dynocap: running cp for {}: {e}", from.display()),
        }
    }
    match crate::remove::remove_tree(legacy) {
        Ok(()) => eprintln!(
            "dynocap: the earlier package cache {} is now in {}",
            legacy.display(),
            spec.image.display()
        ),
        Err(e) => eprintln!("dynocap: removing {}: {e}", legacy.display()),
    }
}

/// How full a package cache is: what its filesystem has left for the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheRoom {
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub free_inodes: u64,
}

/// The room left in the package cache this process mounted on `mountpoint`; `None` when it is
/// not mounted there.
pub fn cache_room(mountpoint: &Path) -> Option<CacheRoom> {
    mounted_metadata(mountpoint)?;
    let stat = nix::sys::statvfs::statvfs(mountpoint).ok()?;
    Some(CacheRoom {
        free_bytes: stat.blocks_available().saturating_mul(stat.fragment_size()),
        total_bytes: stat.blocks().saturating_mul(stat.fragment_size()),
        free_inodes: stat.files_available(),
    })
}

/// What went wrong with the package cache this process mounted on `mountpoint`, if anything:
/// the errors its filesystem recorded (after which it takes no more writes), or its going
/// read-only.
pub fn cache_failure(mountpoint: &Path) -> Option<String> {
    let meta = mounted_metadata(mountpoint)?;
    let what = disk::filesystem_failure(mountpoint, &meta)?;
    Some(format!("the project's package cache failed: {what}"))
}

/// The mountpoint's metadata when a filesystem of its own is mounted there.
fn mounted_metadata(mountpoint: &Path) -> Option<fs::Metadata> {
    let meta = fs::metadata(mountpoint).ok()?;
    let parent = fs::metadata(mountpoint.parent()?).ok()?;
    (meta.dev() != parent.dev()).then_some(meta)
}
