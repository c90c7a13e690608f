//! A vm task's project package caches, in the first stage of the boot: the host attaches the
//! project's cache image (ext4 of a fixed size; a jail's supervisor mounts the same image on
//! the host, never while a vm guest has it) as a second virtio disk whose
//! serial is [`SERIAL`], and names on the kernel command line (`dynocap.cache=`) each cache's
//! directory on it and where it goes in the guest: `pip:.cache/pip` (relative: under the
//! sandbox user's home, the user's) or `apt:/var/cache/apt/archives` (absolute: guest
//! root's). The disk is mounted once, and each directory bound over its place in the new root
//! (nosuid, nodev). Nothing here may stop a boot: a sandbox without its caches still works,
//! and the console says why it has none.

use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::mount::{mount, MsFlags};

/// The cache disk's virtio serial, by which it is found whatever its device name.
pub const SERIAL: &str = "dynocap-cache";
/// Where the disk is mounted in the first stage's own root (left behind, still mounted under
/// the binds, by the switch to the new root).
const MOUNTED: &str = "/cache";

/// One cache: its directory on the disk, and where it goes in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spot {
    pub name: String,
    pub guest: PathBuf,
}

/// Reads `dynocap.cache`'s value: `name:path` entries separated by commas.
pub fn parse(value: &str) -> Vec<Spot> {
    value
        .split(',')
        .filter_map(|entry| entry.split_once(':'))
        .filter(|(name, path)| {
            !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !path.is_empty()
                && !path.split('/').any(|c| c == ".." || c == ".")
        })
        .map(|(name, path)| Spot {
            name: name.to_owned(),
            guest: PathBuf::from(path),
        })
        .collect()
}

/// Mounts the cache disk and binds each of `spots` into `new_root`. `home` and `user`: the
/// sandbox user's home (in the guest) and ids.
pub fn mount_caches(
    spots: &[Spot],
    new_root: &Path,
    home: Option<&Path>,
    user: Option<(u32, u32)>,
    wait: Duration,
) -> Result<(), String> {
    let device = find_disk(wait)?;
    make_dir(Path::new(MOUNTED), 0o755, None)?;
    mount(
        Some(&device),
        MOUNTED,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("errors=remount-ro"),
    )
    .map_err(|e| format!("mounting {} on {MOUNTED}: {e}", device.display()))?;
    let root_dir = Path::new(MOUNTED);
    // The disk's root: guest root's, readable by all.
    let _ = fs::set_permissions(root_dir, fs::Permissions::from_mode(0o755));
    for spot in spots {
        let (target, owner) = if spot.guest.is_absolute() {
            let rel = spot.guest.strip_prefix("/").unwrap_or(&spot.guest);
            let target = new_root.join(rel);
            if !target.is_dir() {
                // The image has no such program (apt's archives in an image without apt).
                continue;
            }
            (target, (0, 0))
        } else {
            let (Some(home), Some(user)) = (home, user) else {
                continue;
            };
            let home = new_root.join(home.strip_prefix("/").unwrap_or(home));
            // Each directory from the home down is the user's, as a program of theirs would
            // have made it.
            let mut dir = home.clone();
            for part in spot.guest.iter() {
                dir.push(part);
                make_dir(&dir, 0o755, Some(user))?;
            }
            (dir, user)
        };
        let source = root_dir.join(&spot.name);
        make_dir(&source, 0o755, Some(owner))?;
        mount(
            Some(&source),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| {
            format!(
                "binding {} onto {}: {e}",
                source.display(),
                target.display()
            )
        })?;
        mount(
            None::<&str>,
            &target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            None::<&str>,
        )
        .map_err(|e| format!("making {} nosuid: {e}", target.display()))?;
    }
    Ok(())
}

/// The cache disk's block device name (`vdb`), found by its serial: `None` in a guest without
/// one. Looked up once: the disk is attached at boot, before the agent runs.
pub fn device_name() -> Option<&'static str> {
    static NAME: OnceLock<Option<String>> = OnceLock::new();
    NAME.get_or_init(|| {
        fs::read_dir("/sys/block")
            .ok()?
            .flatten()
            .find_map(|entry| {
                let serial = fs::read_to_string(entry.path().join("serial")).unwrap_or_default();
                (serial.trim() == SERIAL).then(|| entry.file_name().to_string_lossy().into_owned())
            })
    })
    .as_deref()
}

/// The room left on the cache disk, read where the guest has it mounted (its binds: the
/// first stage's own mount is out of the new root's sight); `None` without a cache disk, or
/// with one the boot could not mount.
pub fn room() -> Option<dynocap_proto::CacheRoom> {
    let device = device_name()?;
    let dev = fs::read_to_string(Path::new("/sys/block").join(device).join("dev")).ok()?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let point = mount_point_of(&mountinfo, dev.trim())?;
    let stat = nix::sys::statvfs::statvfs(&point).ok()?;
    Some(dynocap_proto::CacheRoom {
        free_bytes: stat.blocks_available().saturating_mul(stat.fragment_size()),
        total_bytes: stat.blocks().saturating_mul(stat.fragment_size()),
        free_inodes: stat.files_available(),
    })
}

/// The first mount point in `mountinfo` (`/proc/self/mountinfo`'s text) of the filesystem on
/// device `dev` (`major:minor`), its octal escapes (`\040` for a space) undone.
fn mount_point_of(mountinfo: &str, dev: &str) -> Option<PathBuf> {
    let line = mountinfo
        .lines()
        .find(|line| line.split(' ').nth(2) == Some(dev))?;
    let escaped = line.split(' ').nth(4)?.as_bytes();
    let mut path = Vec::with_capacity(escaped.len());
    let mut i = 0;
    while i < escaped.len() {
        let octal = escaped
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (escaped[i], octal) {
            (b'\\', Some(byte)) => {
                path.push(byte);
                i += 4;
            }
            (byte, _) => {
                path.push(byte);
                i += 1;
            }
        }
    }
    Some(PathBuf::from(std::ffi::OsString::from_vec(path)))
}

/// The virtio disk whose serial is [`SERIAL`], once it has appeared.
fn find_disk(wait: Duration) -> Result<PathBuf, String> {
    let deadline = Instant::now() + wait;
    loop {
        if let Ok(entries) = fs::read_dir("/sys/block") {
            for entry in entries.flatten() {
                let serial = fs::read_to_string(entry.path().join("serial")).unwrap_or_default();
                if serial.trim() == SERIAL {
                    let device = Path::new("/dev").join(entry.file_name());
                    if device.exists() {
                        return Ok(device);
                    }
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no disk with serial {SERIAL} appeared within {}s",
                wait.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn make_dir(path: &Path, mode: u32, owner: Option<(u32, u32)>) -> Result<(), String> {
    if !path.is_dir() {
        fs::DirBuilder::new()
            .mode(mode)
            .create(path)
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .map_err(|e| format!("handing {} to {uid}:{gid}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_found_where_its_device_is_mounted() {
        let mountinfo = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                         40 22 254:16 /pip /home/sandbox\\040user/.cache/pip rw - ext4 /dev/vdb rw\n\
                         41 22 254:16 /apt /var/cache/apt/archives rw - ext4 /dev/vdb rw\n";
        assert_eq!(
            mount_point_of(mountinfo, "254:16"),
            Some(PathBuf::from("/home/sandbox user/.cache/pip"))
        );
        assert_eq!(mount_point_of(mountinfo, "254:0"), Some(PathBuf::from("/")));
        assert_eq!(mount_point_of(mountinfo, "254:32"), None);
    }

    #[test]
    fn entries_are_read_and_paths_that_climb_are_dropped() {
        let spots = parse("pip:.cache/pip,apt:/var/cache/apt/archives,bad:../x,:y,z:,w:a/./b");
        assert_eq!(
            spots,
            vec![
                Spot {
                    name: "pip".into(),
                    guest: ".cache/pip".into()
                },
                Spot {
                    name: "apt".into(),
                    guest: "/var/cache/apt/archives".into()
                },
            ]
        );
    }
}
