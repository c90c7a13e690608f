//! Checkpoints and forks of a jail's disk: a duplicate of the sandbox's ext4 image taken while
//! its filesystem is frozen, and the thaw of a freeze its supervisor did not live to undo. (A
//! duplicated disk keeps the host ids it was written under: see `idmapped::layer_disk`.)
//!
//! Why a duplicate of the whole image: the guest's root is an overlay whose writable layer
//! lives on the ext4 image, and a mounted overlay's layers cannot be swapped under the guest's
//! running processes; this host kernel has no device-mapper (no dm-snapshot, no thin pools)
//! and no nbd. Where the filesystem holding the image shares extents between files (XFS with
//! reflink, btrfs), the duplicate is a clone (`FICLONE`): constant time, the blocks shared
//! until either side writes them. Elsewhere (ext4) the clone fails with `EOPNOTSUPP` and the
//! duplicate is a copy of the blocks the guest has written (the image is sparse: `SEEK_DATA`
//! skips the rest, and the disk's `fallocate` reservation leaves unwritten extents, which read
//! as holes), inside the kernel (`copy_file_range`): its cost follows what the guest wrote.
//! Which one was used goes to the supervisor's log ([`Duplicated`]).
//!
//! The freeze (`FIFREEZE` on the mounted disk) makes every block on the image consistent and
//! holds the guest's writers for the duplicate; the [`Frozen`] guard thaws on every path out.
//! The freeze writes the filesystem through the loop device into the image file's page cache;
//! a clone shares the blocks on disk, so the image is `fdatasync`ed before it. A freeze
//! outlives a supervisor killed while it holds one (the frozen filesystem keeps its loop
//! device): [`thaw_leftover`] finds it through the loop device of the image and thaws it,
//! which lets the dead namespace's mount, and with it the loop device, go.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::disk::{loop_device_of, DiskPaths};
use crate::error::JailError;
use crate::newmount::{FsContext, NODEV, NOSUID};

/// `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` of `<linux/fs.h>`.
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;
/// `FICLONE` of `<linux/fs.h>`: `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// How a disk image was duplicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duplicated {
    /// Cloned (`FICLONE`): the extents are shared, nothing was copied.
    Cloned,
    /// Copied, because the filesystem cannot clone this file (the error `FICLONE` gave).
    Copied(Errno),
}

impl Duplicated {
    /// For the supervisor's log.
    fn describe(self, bytes: u64) -> String {
        match self {
            Duplicated::Cloned => format!(
                "cloned (FICLONE: {} MB of data, extents shared, none copied)",
                bytes >> 20
            ),
            Duplicated::Copied(why) => format!(
                "copied {} MB (the filesystem cannot share extents: FICLONE {why})",
                bytes >> 20
            ),
        }
    }
}

/// Whether `FICLONE` failing with `errno` means this filesystem (or this pair of files) cannot
/// share extents, so that a copy is the way: no reflink support (`EOPNOTSUPP`, `ENOTTY` from a
/// filesystem without the ioctl, `EINVAL` from one that has it but not for these files) or
/// two filesystems (`EXDEV`). Anything else (`ENOSPC`, `EIO`) is a failure to report.
fn reflink_unsupported(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::EOPNOTSUPP | Errno::EINVAL | Errno::EXDEV | Errno::ENOTTY
    )
}

/// A frozen filesystem, thawed when dropped (or by [`Frozen::thaw`], which reports).
struct Frozen(Option<File>);

impl Frozen {
    fn freeze(dir: &Path) -> Result<Frozen, JailError> {
        let file = File::open(dir).map_err(|e| JailError::io("open the disk at", dir, e))?;
        // SAFETY: FIFREEZE takes an fd and no argument memory.
        if unsafe { libc::ioctl(file.as_raw_fd(), FIFREEZE, 0) } != 0 {
            return Err(JailError::sys(
                format!("freezing the sandbox's disk at {}", dir.display()),
                Errno::last(),
            ));
        }
        Ok(Frozen(Some(file)))
    }

    /// Thaws now, saying whether that failed (the guest's writers then wait until the
    /// supervisor ends and the repair thaws it).
    fn thaw(mut self) -> Result<(), JailError> {
        match self.0.take() {
            Some(file) => {
                thaw_fd(&file).map_err(|e| JailError::sys("thawing the sandbox's disk", e))
            }
            None => Ok(()),
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Some(file) = self.0.take() {
            // Nobody to tell on this path; `thaw` is the one that reports.
            let _ = thaw_fd(&file);
        }
    }
}

fn thaw_fd(file: &File) -> Result<(), Errno> {
    // SAFETY: FITHAW takes an fd and no argument memory.
    if unsafe { libc::ioctl(file.as_raw_fd(), FITHAW, 0) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Duplicates the disk of the sandbox whose state dir is `state_dir`, mounted by this process,
/// to `dest` (created, must not exist) while its filesystem is frozen, and syncs the new file:
/// a clone where the filesystem shares extents, else a copy (see the module's doc). `during`
/// runs with the filesystem frozen, after the duplicate (a fault point). Returns the bytes of
/// data it holds. A sandbox without its own disk (disk limits off) has none to copy.
pub fn snapshot_disk(
    state_dir: &Path,
    dest: &Path,
    during: impl FnOnce() -> io::Result<()>,
) -> Result<u64, JailError> {
    let paths = DiskPaths::at(state_dir);
    let mounted = fs::metadata(&paths.mountpoint)
        .and_then(|disk| fs::metadata(state_dir).map(|parent| parent.dev() != disk.dev()))
        .map_err(|e| JailError::io("stat", &paths.mountpoint, e))?;
    if !mounted {
        return Err(JailError::InvalidSpec(
            "this sandbox has no disk of its own (disk limits are off: DYNOCAP_DISK_LIMIT=off), \
             so its files cannot be checkpointed or forked"
                .to_owned(),
        ));
    }
    // Only the clone, or the copy into the page cache, holds the guest's writers; the sync of
    // the new file follows the thaw.
    let started = std::time::Instant::now();
    let frozen = Frozen::freeze(&paths.mountpoint)?;
    let copied = copy_unsynced(&paths.image, dest)
        .map(|(file, how, bytes)| {
            eprintln!(
                "dynocap: the sandbox's disk {} in {} ms to {}",
                how.describe(bytes),
                started.elapsed().as_millis(),
                dest.display()
            );
            (file, bytes)
        })
        .map_err(|e| JailError::io("duplicate the sandbox's disk to", dest, e));
    let faulted = copied.as_ref().map_or(Ok(()), |_| {
        during().map_err(|e| JailError::io("checkpoint", dest, e))
    });
    let thawed = frozen.thaw();
    let result = faulted.and(thawed).and_then(|()| {
        let (file, bytes) = copied?;
        file.sync_all()
            .map_err(|e| JailError::io("sync the copy of the sandbox's disk at", dest, e))?;
        Ok(bytes)
    });
    if result.is_err() {
        let _ = fs::remove_file(dest);
    }
    result
}

/// Duplicates `src` to a new file `dest` of the same length, a clone where the filesystem
/// shares extents, else a copy of its data (not its holes) in the kernel, and syncs it.
/// Returns the bytes of data `dest` holds. On error `dest` is removed.
pub fn copy_sparse(src: &Path, dest: &Path) -> io::Result<u64> {
    let started = std::time::Instant::now();
    let (to, how, bytes) = copy_unsynced(src, dest)?;
    eprintln!(
        "dynocap: {} {} in {} ms to {}",
        src.display(),
        how.describe(bytes),
        started.elapsed().as_millis(),
        dest.display()
    );
    let synced = to.sync_all();
    if synced.is_err() {
        let _ = fs::remove_file(dest);
    }
    synced.map(|()| bytes)
}

/// [`copy_sparse`] without the sync: the new file, how it was made, and the bytes of data it
/// holds.
fn copy_unsynced(src: &Path, dest: &Path) -> io::Result<(File, Duplicated, u64)> {
    let from = File::open(src)?;
    let to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode_0600()
        .open(dest)?;
    let dir = match dest.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    match duplicate(&from, &to, dir) {
        Ok((how, bytes)) => Ok((to, how, bytes)),
        Err(err) => {
            let _ = fs::remove_file(dest);
            Err(err)
        }
    }
}

/// Clones `from` into the empty `to` (in the directory `dir`), or copies its data where the
/// filesystem cannot clone. The bytes of data `to` holds.
fn duplicate(from: &File, to: &File, dir: &Path) -> io::Result<(Duplicated, u64)> {
    match clone_into(from, to, dir) {
        Ok(()) => Ok((Duplicated::Cloned, data_bytes(to)?)),
        Err(errno) if reflink_unsupported(errno) => {
            Ok((Duplicated::Copied(errno), copy_into(from, to)?))
        }
        Err(errno) => Err(errno.into()),
    }
}

/// `FICLONE` of the whole of `from` into `to`. A clone shares blocks on disk, so where the
/// filesystem clones (`dir`'s: see [`reflinks`]) `from`'s dirty pages are written first (the
/// kernel's clone flushes them too; this makes it explicit). Where it cannot, that write
/// would only hold a frozen guest longer before the copy, which reads the page cache.
fn clone_into(from: &File, to: &File, dir: &Path) -> Result<(), Errno> {
    if reflinks(dir) {
        from.sync_data()
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    }
    // SAFETY: FICLONE reads the source fd number passed by value; both fds are open.
    if unsafe { libc::ioctl(to.as_raw_fd(), FICLONE, from.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// The bytes of `file` that hold data (its holes, and unwritten extents, left out).
fn data_bytes(file: &File) -> io::Result<u64> {
    let end = i64::try_from(file.metadata()?.len())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let (fd, mut offset, mut bytes) = (file.as_raw_fd(), 0i64, 0u64);
    while offset < end {
        // SAFETY: lseek on our open descriptor.
        let data = unsafe { libc::lseek(fd, offset, libc::SEEK_DATA) };
        if data < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(err);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        bytes += u64::try_from(hole - data).unwrap_or(0);
        offset = hole;
    }
    Ok(bytes)
}

/// In a fork's state dir: its disk is a clone of its source's, sharing extents with it.
const CLONE_MARK: &str = "disk.clone";

/// Marks the disk in `state_dir` a clone ([`is_clone`]), durably.
pub fn mark_clone(state_dir: &Path) -> io::Result<()> {
    let mark = File::create(state_dir.join(CLONE_MARK))?;
    mark.sync_all()?;
    File::open(state_dir)?.sync_all()
}

/// Whether the disk in `state_dir` is a fork's clone of its source's (see [`mark_clone`]): it
/// reserves nothing of its own when it boots. Its blocks are shared with the source's (whose
/// reservation made them), and the fork was refused unless the filesystem had room for its
/// whole disk; a reservation would only allocate again the room its guest has not written.
pub fn is_clone(state_dir: &Path) -> bool {
    state_dir.join(CLONE_MARK).exists()
}

/// Whether the filesystem holding the directory `dir` clones files (shares extents): there a
/// duplicate of a disk takes no room until either side writes. Probed with two unnamed files.
pub fn reflinks(dir: &Path) -> bool {
    let unnamed = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .mode(0o600)
            .open(dir)
    };
    let (Ok(mut from), Ok(to)) = (unnamed(), unnamed()) else {
        return false;
    };
    if from.write_all(&[0u8; 4096]).is_err() {
        return false;
    }
    // SAFETY: FICLONE reads the source fd number passed by value; both fds are open.
    unsafe { libc::ioctl(to.as_raw_fd(), FICLONE, from.as_raw_fd()) == 0 }
}

fn copy_into(from: &File, to: &File) -> io::Result<u64> {
    let len = from.metadata()?.len();
    to.set_len(len)?;
    let (src_fd, dst_fd) = (from.as_raw_fd(), to.as_raw_fd());
    let mut copied = 0u64;
    let mut offset: i64 = 0;
    let end = i64::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    while offset < end {
        // SAFETY: lseek on our open descriptor.
        let data = unsafe { libc::lseek(src_fd, offset, libc::SEEK_DATA) };
        if data < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break; // no data past `offset`
            }
            return Err(err);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(src_fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let (mut from_off, mut to_off) = (data, data);
        while from_off < hole {
            let want = usize::try_from(hole - from_off)
                .unwrap_or(usize::MAX)
                .min(1 << 30);
            // SAFETY: both descriptors are open; the offsets are our own variables.
            let n = unsafe {
                libc::copy_file_range(src_fd, &mut from_off, dst_fd, &mut to_off, want, 0)
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                break;
            }
            copied += u64::try_from(n).unwrap_or(0);
        }
        offset = hole;
    }
    Ok(copied)
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        self.mode(0o600)
    }
}

/// The bytes a file holds on its filesystem (its allocated blocks), for listing checkpoints.
pub fn allocated_bytes(path: &Path) -> io::Result<u64> {
    fs::metadata(path).map(|meta| meta.blocks() * 512)
}

/// Thaws the filesystem on `image` if a supervisor that died left it frozen: without the
/// thaw, the frozen filesystem holds the image's loop device (and the dead guest's writers)
/// forever. Nothing to do when no loop device backs `image`, or its filesystem is not frozen.
pub fn thaw_leftover(image: &Path) -> Result<(), JailError> {
    let Some(device) = loop_device_of(image) else {
        return Ok(());
    };
    let device = PathBuf::from("/dev").join(device);
    let failed = |e: Errno| {
        JailError::sys(
            format!("mounting {} to thaw a frozen disk", device.display()),
            e,
        )
    };
    let context = FsContext::new("ext4").map_err(failed)?;
    context
        .set("source", &device.to_string_lossy())
        .map_err(failed)?;
    // The device's superblock is the frozen one: this mount shares it, and goes with `mount`.
    let mount = context.mount(NOSUID | NODEV).map_err(|(e, _)| failed(e))?;
    let dir = nix::fcntl::openat(
        &mount,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(failed)?;
    // SAFETY: `dir` is an open descriptor we own; the File takes it over.
    let dir = unsafe { File::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(dir)) };
    if let Err(errno) = thaw_fd(&dir) {
        // EINVAL: not frozen, nothing was left to thaw.
        if errno != Errno::EINVAL {
            return Err(JailError::sys(
                format!("thawing the frozen disk on {}", device.display()),
                errno,
            ));
        }
    }
    drop::<OwnedFd>(mount);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    #[test]
    fn a_sparse_copy_keeps_data_and_holes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("src");
        let mut file = File::create(&src).expect("create");
        file.set_len(64 << 20).expect("len");
        file.seek(SeekFrom::Start(1 << 20)).expect("seek");
        file.write_all(&[7u8; 8192]).expect("write");
        file.seek(SeekFrom::Start(40 << 20)).expect("seek");
        file.write_all(b"tail").expect("write");
        file.sync_all().expect("sync");
        let dest = dir.path().join("dest");
        let copied = copy_sparse(&src, &dest).expect("copy");
        assert!(copied < 1 << 20, "only the data is copied: {copied}");
        assert_eq!(fs::read(&src).expect("src"), fs::read(&dest).expect("dest"));
        assert!(allocated_bytes(&dest).expect("blocks") < 1 << 20);
        assert!(
            copy_sparse(&src, &dest).is_err(),
            "an existing destination is refused"
        );
        assert!(dest.exists(), "and not removed by the refusal");
    }

    #[test]
    fn only_a_filesystem_without_clones_falls_back_to_the_copy() {
        for unsupported in [
            Errno::EOPNOTSUPP,
            Errno::EINVAL,
            Errno::EXDEV,
            Errno::ENOTTY,
        ] {
            assert!(reflink_unsupported(unsupported), "{unsupported}");
        }
        for failure in [
            Errno::ENOSPC,
            Errno::EIO,
            Errno::EBADF,
            Errno::EPERM,
            Errno::EDQUOT,
        ] {
            assert!(!reflink_unsupported(failure), "{failure}");
        }
    }

    /// The extents of `path` that `filefrag` flags shared, and all its extents.
    fn shared_extents(path: &Path) -> (usize, usize) {
        let out = std::process::Command::new("filefrag")
            .arg("-v")
            .arg(path)
            .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
            .output()
            .expect("run filefrag (e2fsprogs)");
        let text = String::from_utf8_lossy(&out.stdout);
        let extents: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.trim_start()
                    .split(':')
                    .next()
                    .is_some_and(|n| n.trim().parse::<u64>().is_ok())
            })
            .collect();
        let shared = extents.iter().filter(|l| l.contains("shared")).count();
        (shared, extents.len())
    }

    /// On a filesystem that clones (a small XFS the test makes, as root) the duplicate shares
    /// every extent with its source and holds the same bytes; on one that cannot (the test's
    /// temporary directory, when it is ext4) it is a copy of the data.
    #[test]
    fn a_duplicate_is_a_clone_where_the_filesystem_shares_extents() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let write = |dir: &Path| {
            let src = dir.join("src");
            let mut file = File::create(&src).expect("create");
            file.set_len(64 << 20).expect("len");
            file.seek(SeekFrom::Start(1 << 20)).expect("seek");
            file.write_all(&[7u8; 1 << 20]).expect("write");
            src
        };
        let src = write(tmp.path());
        let dest = tmp.path().join("dest");
        let (from, to) = (
            File::open(&src).expect("open"),
            File::create(&dest).expect("dest"),
        );
        let (how, bytes) = duplicate(&from, &to, tmp.path()).expect("duplicate");
        assert_eq!(bytes, 1 << 20);
        assert_eq!(how == Duplicated::Cloned, reflinks(tmp.path()), "{how:?}");
        assert_eq!(fs::read(&src).expect("src"), fs::read(&dest).expect("dest"));

        let mkfs = Path::new("/usr/sbin/mkfs.xfs").exists() || Path::new("/sbin/mkfs.xfs").exists();
        if !nix::unistd::geteuid().is_root() || !mkfs {
            assert!(std::env::var_os("CI").is_none(), "needs root and xfsprogs");
            eprintln!("SKIPPED the XFS half: needs root and mkfs.xfs (apt-get install xfsprogs)");
            return;
        }
        let image = tmp.path().join("xfs.img");
        let mnt = tmp.path().join("mnt");
        fs::create_dir(&mnt).expect("mountpoint");
        File::create(&image)
            .expect("image")
            .set_len(320 << 20)
            .expect("size");
        let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
            let status = std::process::Command::new(cmd)
                .args(args)
                .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
                .status()
                .expect(cmd);
            assert!(status.success(), "{cmd} {args:?}");
        };
        run(
            "mkfs.xfs",
            &[
                "-q".as_ref(),
                "-m".as_ref(),
                "reflink=1".as_ref(),
                image.as_ref(),
            ],
        );
        run(
            "mount",
            &["-o".as_ref(), "loop".as_ref(), image.as_ref(), mnt.as_ref()],
        );
        let result = std::panic::catch_unwind(|| {
            assert!(reflinks(&mnt));
            let src = write(&mnt);
            let dest = mnt.join("dest");
            let (from, to) = (
                File::open(&src).expect("open"),
                File::create(&dest).expect("dest"),
            );
            assert_eq!(
                duplicate(&from, &to, &mnt).expect("clone"),
                (Duplicated::Cloned, 1 << 20)
            );
            assert_eq!(fs::read(&src).expect("src"), fs::read(&dest).expect("dest"));
            let (shared, all) = shared_extents(&dest);
            assert!(all > 0 && shared == all, "{shared} of {all} extents shared");
        });
        run("umount", &[mnt.as_ref()]);
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }
}
