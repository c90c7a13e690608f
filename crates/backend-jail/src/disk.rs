//! The sandbox's disk: a sparse ext4 image `state_dir/disk.img` on a loop device, mounted at
//! `state_dir/disk`, where the overlay's `upper/` and `work/` live. The guest's writes fill
//! that filesystem, never the host's: past its size (or its inode count) the guest gets
//! ENOSPC.
//!
//! The mount is made in a private mount namespace of the supervisor (entered once, before the
//! clone, so the guest's copy of it sees the disk) and the loop device is `LO_FLAGS_AUTOCLEAR`:
//! when the supervisor dies, even by SIGKILL, its namespace goes, the kernel unmounts the
//! filesystem and frees the loop device. Nothing is left on the host but the image file, which
//! is what a kept layer is.
//!
//! Without a limit ([`JailSpec::disk_bytes`] `None`, an explicit opt-out for rootless use),
//! `state_dir/disk` is a plain directory on the host's filesystem.
//!
//! A supervisor standing by for its sandbox can make and mount the disk ahead
//! ([`start_preparing_disk`]): the spare a teardown left (held under its lock) or else an
//! unnamed copy of the template, on a loop device, and a detached mount of it, in no mount
//! namespace at all. The start of that size names the image and attaches the mount in its own
//! namespace; until then no guest sees it, and if the process ends first the kernel frees the
//! mount and the device, and with them an unnamed copy or the spare's lock.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

use crate::error::JailError;
use crate::newmount::{self, FsContext, NODEV, NOSUID};
use crate::remove::remove_tree;
use crate::spec::JailSpec;

/// File name of the image inside the state dir.
const IMAGE: &str = "disk.img";
/// Directory the image is mounted on (or, without a limit, the plain directory) inside the
/// state dir.
const MOUNTPOINT: &str = "disk";

/// One inode per this many bytes: 65,536 files per GiB, so a 10 GiB disk holds 655,360 files
/// (a large `node_modules` has ~100,000) while a runaway file loop stops at its share.
const BYTES_PER_INODE: &str = "16384";

/// How long a kept image may still be held by the loop device of a guest that is going away
/// before booting over it is refused (two mounts of one ext4 image would corrupt it).
const RELEASE_WAIT: Duration = Duration::from_secs(10);

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
pub(crate) const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// `LOOP_CONFIGURE` on a device another process bound between `GET_FREE` and it (one that is
/// not a DynoCap start, which waits its turn: see [`attach_loop`]): retry.
const LOOP_ATTEMPTS: usize = 8;

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
pub(crate) struct LoopInfo64 {
    pub lo_device: u64,
    pub lo_inode: u64,
    lo_rdevice: u64,
    pub lo_offset: u64,
    pub lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of `<linux/loop.h>` (Linux 5.8; the backend needs 5.12 anyway).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// The disk image of the sandbox whose state dir is `state_dir` (there only with a disk limit).
pub fn disk_image(state_dir: &Path) -> PathBuf {
    DiskPaths::at(state_dir).image
}

/// Where a state dir keeps its disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiskPaths {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
}

impl DiskPaths {
    pub fn at(state_dir: &Path) -> DiskPaths {
        DiskPaths {
            image: state_dir.join(IMAGE),
            mountpoint: state_dir.join(MOUNTPOINT),
        }
    }
}

/// What [`Disk::attach`] does for a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// No limit: the layers go in a plain directory on the host's filesystem.
    Plain,
    /// A new image of this many bytes.
    Format(u64),
    /// The image a stopped guest kept, as it is (never formatted again).
    MountKept,
}

impl Plan {
    fn for_spec(spec: &JailSpec, kept_image: bool) -> Plan {
        match (spec.reuse_layers, spec.disk_bytes) {
            // A kept image is mounted as it is, whatever the spec says now: the layer is in it.
            (true, _) if kept_image => Plan::MountKept,
            // A kept layer from a start without a limit, or no limit asked for.
            (true, _) | (false, None) => Plan::Plain,
            (false, Some(bytes)) => Plan::Format(bytes),
        }
    }
}

/// The disk of a starting or running jail, as this process mounted it.
#[derive(Debug)]
pub(crate) struct Disk {
    paths: DiskPaths,
    /// Mounted by this process (a limited disk); unmounted on release.
    mounted: bool,
    /// Made by this start, so undoing the start deletes it.
    fresh: bool,
}

impl Disk {
    /// Makes (or, with [`JailSpec::reuse_layers`], finds) the disk and mounts it. Enters a
    /// private mount namespace first: call it from the process that will clone the guest. On
    /// error nothing made here is left.
    pub fn attach(spec: &JailSpec) -> Result<Disk, JailError> {
        // Taken by every start, used or not: what the guest's clone copies of this process
        // must not include a disk made for another.
        let prepared = PreparedDisk::take();
        let paths = DiskPaths::at(&spec.state_dir);
        let plan = Plan::for_spec(spec, paths.image.exists());
        if plan == Plan::Plain {
            if !spec.reuse_layers {
                create_mountpoint(&paths.mountpoint)?;
            }
            return Ok(Disk {
                fresh: !spec.reuse_layers,
                mounted: false,
                paths,
            });
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(
                JailError::sys("mounting the sandbox's disk", Errno::EPERM).hint(
                    "a disk limit needs root (a loop device and a mount); run dynocap as root, \
                     or set DYNOCAP_DISK_LIMIT=off to run sandboxes without a disk limit (their \
                     files then fill the host's filesystem)",
                ),
            );
        }
        let ahead = match plan {
            Plan::Format(bytes) => {
                // Refused when either exists: they may hold a previous sandbox's files.
                create_mountpoint(&paths.mountpoint)?;
                // Named before this process leaves the host's mount namespace: the image is on
                // a mount of it, and neither a link nor a rename crosses from one mount to another
                // (the new namespace's copy of that filesystem's mount is another).
                prepared
                    .filter(|prepared| prepared.fits(spec.disk_templates.as_deref(), bytes))
                    .and_then(|prepared| {
                        prepared
                            .name(&paths.image)
                            .map_err(|e| {
                                eprintln!("dynocap: the disk made ahead is not usable ({e})")
                            })
                            .ok()
                    })
            }
            Plan::MountKept | Plan::Plain => None,
        };
        if let Err(e) = enter_private_mount_namespace() {
            if matches!(plan, Plan::Format(_)) {
                if ahead.is_some() {
                    let _ = fs::remove_file(&paths.image);
                }
                let _ = fs::remove_dir(&paths.mountpoint);
            }
            return Err(e);
        }
        let mut disk = Disk {
            paths,
            mounted: false,
            fresh: !spec.reuse_layers,
        };
        if let Plan::Format(bytes) = plan {
            if let Some(named) = ahead {
                match named.attach(&disk.paths.mountpoint) {
                    Ok(()) => {
                        disk.mounted = true;
                        return Ok(disk);
                    }
                    // The start goes on as if none had been made; the supervisor's log says why.
                    Err(e) => {
                        eprintln!("dynocap: the disk made ahead is not usable ({e})");
                        let _ = fs::remove_file(&disk.paths.image);
                    }
                }
            }
            let made = match &spec.disk_templates {
                Some(templates) => crate::disk_template::copy_formatted(
                    templates,
                    &disk.paths.image,
                    bytes,
                    make_image,
                ),
                None => make_image(&disk.paths.image, bytes),
            };
            if let Err(e) = made {
                let _ = fs::remove_dir(&disk.paths.mountpoint);
                return Err(e);
            }
        } else {
            wait_released(&disk.paths.image)?;
        }
        match disk.mount() {
            Ok(()) => Ok(disk),
            Err(e) => {
                let _ = disk.release(!disk.fresh);
                Err(e)
            }
        }
    }

    fn mount(&mut self) -> Result<(), JailError> {
        let image = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.paths.image)
            .map_err(|e| JailError::io("open the disk image", &self.paths.image, e))?;
        attach_mount(mount_detached(&image)?, &self.paths.mountpoint)?;
        self.mounted = true;
        Ok(())
    }

    /// Whether this process left the host's mount namespace for one of its own (see
    /// [`enter_private_mount_namespace`]), as a disk it mounted did.
    pub fn in_own_mount_namespace(&self) -> bool {
        self.mounted
    }

    /// Whether this start made the disk (rather than booting over a kept one).
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// Unmounts the disk (if this process mounted it); unless `keep`, deletes the image and
    /// the mountpoint too (the layers on a plain directory are the caller's to remove first).
    /// Returns what failed.
    pub fn release(&mut self, keep: bool) -> Vec<String> {
        let mut problems = self.unmount(keep);
        if !keep {
            problems.extend(remove_disk(&self.paths));
        }
        problems
    }

    /// Unmounts the disk if this process mounted it. Once it is unmounted the layers in it are
    /// out of sight; with `keep`, the image stays for a later guest.
    pub fn unmount(&mut self, keep: bool) -> Vec<String> {
        if !std::mem::replace(&mut self.mounted, false) {
            return Vec::new();
        }
        // A plain unmount, not a lazy one: a kept image must be free before a later guest
        // mounts it again. The guest (and its copy of the mount) is gone by now.
        match umount2(&self.paths.mountpoint, MntFlags::empty()) {
            Ok(()) => Vec::new(),
            Err(e) => {
                if !keep {
                    // The image is going anyway: the detached mount frees it once unused.
                    let _ = umount2(&self.paths.mountpoint, MntFlags::MNT_DETACH);
                }
                vec![format!(
                    "cannot unmount the disk at {}: {e}",
                    self.paths.mountpoint.display()
                )]
            }
        }
    }
}

/// A disk made and mounted ahead of its sandbox (see the module's doc): its image not yet its
/// sandbox's, its filesystem a detached mount. Dropped unused, it is freed by the kernel: the
/// detached mount dissolves, the loop device clears itself, and with it goes an unnamed image
/// or the lock on the spare.
#[derive(Debug)]
struct PreparedDisk {
    templates: PathBuf,
    bytes: u64,
    image: crate::disk_template::AheadImage,
    mount: OwnedFd,
}

/// The disk this process is making or made ahead, for its next start (a supervisor boots one
/// sandbox).
static PREPARED: Mutex<Ahead> = Mutex::new(Ahead::Nothing);

#[derive(Debug)]
enum Ahead {
    Nothing,
    /// Being made on a thread of its own (see [`start_preparing_disk`]), which returns its tid
    /// with the disk.
    Making(std::thread::JoinHandle<(nix::unistd::Pid, Result<PreparedDisk, JailError>)>),
    Made(PreparedDisk),
}

fn prepared() -> std::sync::MutexGuard<'static, Ahead> {
    PREPARED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Makes and mounts ahead, on a thread of its own, the disk of `bytes` that this process's
/// next start of that size, with templates in `templates`, takes instead of making its own
/// (see `Disk::attach`): for a supervisor standing by, so that the loop device and the
/// mount, a large share of a start's time, are not waited for. Its order may come before the
/// disk is made (the CLI's comes milliseconds after its start): the start waits for what is
/// left of it (see `finish_preparing_disk`) rather than for all of it. A failure to make it
/// is reported on stderr (the sandbox's log by then) and the start makes its own. Needs root,
/// as every disk.
pub fn start_preparing_disk(templates: PathBuf, bytes: u64) -> Result<(), JailError> {
    check_root()?;
    let source = templates.clone();
    let making = std::thread::Builder::new()
        .name("disk-ahead".into())
        .spawn(move || (nix::unistd::gettid(), make_ahead(&templates, bytes)))
        .map_err(|e| JailError::io("start a thread to make a disk ahead from", &source, e))?;
    *prepared() = Ahead::Making(making);
    Ok(())
}

/// Waits for the disk being made ahead, if one is: a start needs this process back to one
/// thread before it clones the guest, and takes the disk once it is made.
pub(crate) fn finish_preparing_disk() {
    let mut ahead = prepared();
    *ahead = match std::mem::replace(&mut *ahead, Ahead::Nothing) {
        Ahead::Making(making) => match join_to_the_end(making) {
            Ok(Ok(made)) => Ahead::Made(made),
            Ok(Err(e)) => {
                eprintln!(
                    "dynocap: the disk could not be made ahead ({e}); the start makes its own"
                );
                Ahead::Nothing
            }
            Err(_) => {
                eprintln!(
                    "dynocap: the thread making a disk ahead panicked; the start makes its own"
                );
                Ahead::Nothing
            }
        },
        settled => settled,
    };
}

/// Joins `thread`, which returns its tid with its result, and waits for it to have left the
/// process, as the single-thread check of the start that follows needs (see
/// [`crate::sys::wait_for_joined_thread_to_leave`]). A thread that panicked told no tid; its
/// start reports the panic and makes its own disk.
fn join_to_the_end<T>(
    thread: std::thread::JoinHandle<(nix::unistd::Pid, T)>,
) -> std::thread::Result<T> {
    let (tid, result) = thread.join()?;
    crate::sys::wait_for_joined_thread_to_leave(tid);
    Ok(result)
}

fn check_root() -> Result<(), JailError> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(JailError::sys(
            "making a sandbox's disk ahead",
            Errno::EPERM,
        ))
    }
}

fn make_ahead(templates: &Path, bytes: u64) -> Result<PreparedDisk, JailError> {
    let image = crate::disk_template::ahead_image(templates, bytes, make_image)?;
    let mount = mount_detached(image.file())?;
    Ok(PreparedDisk {
        templates: templates.to_path_buf(),
        bytes,
        image,
        mount,
    })
}

/// Releases the disk this process made ahead, if no start took it: for a process whose start
/// did not make a jail disk (another backend, a failed boot).
pub fn release_prepared_disk() {
    drop(PreparedDisk::take());
}

/// What the image of the disk this process made ahead is, if it holds one (for tests: the
/// start that takes it names that very file). Waits for one being made.
pub fn prepared_disk_image() -> Option<fs::Metadata> {
    finish_preparing_disk();
    match &*prepared() {
        Ahead::Made(made) => made.image.file().metadata().ok(),
        Ahead::Nothing | Ahead::Making(_) => None,
    }
}

impl PreparedDisk {
    /// The disk made ahead, if any: a supervisor starts one sandbox, which takes it or
    /// releases it.
    fn take() -> Option<PreparedDisk> {
        finish_preparing_disk();
        match std::mem::replace(&mut *prepared(), Ahead::Nothing) {
            Ahead::Made(made) => Some(made),
            Ahead::Nothing | Ahead::Making(_) => None,
        }
    }

    /// Whether it is the disk a start of `bytes` from `templates` would make.
    fn fits(&self, templates: Option<&Path>, bytes: u64) -> bool {
        Some(self.templates.as_path()) == templates && self.bytes == bytes
    }

    /// Names the image `image` (which must not exist).
    fn name(self, image: &Path) -> Result<NamedDisk, JailError> {
        self.image.name(image)?;
        Ok(NamedDisk { mount: self.mount })
    }
}

/// A disk made ahead whose image has its sandbox's name: its filesystem is still detached.
#[derive(Debug)]
struct NamedDisk {
    mount: OwnedFd,
}

impl NamedDisk {
    /// Attaches the filesystem on `mountpoint` (an empty directory), in this process's mount
    /// namespace.
    fn attach(self, mountpoint: &Path) -> Result<(), JailError> {
        attach_mount(self.mount, mountpoint)
    }
}

/// Attaches the detached `mount` on `mountpoint` (an empty directory), in this process's mount
/// namespace.
pub(crate) fn attach_mount(mount: OwnedFd, mountpoint: &Path) -> Result<(), JailError> {
    nix::fcntl::open(
        mountpoint,
        nix::fcntl::OFlag::O_PATH
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .and_then(|target| newmount::attach(mount.as_fd(), target.as_fd()))
    .map_err(|e| {
        JailError::sys(
            format!("attaching the sandbox's disk on {}", mountpoint.display()),
            e,
        )
    })
}

/// Binds `image` to a loop device and makes a detached mount of its filesystem (nosuid, nodev,
/// [`MOUNT_OPTIONS`]): every sandbox disk is mounted so, then attached where it belongs.
fn mount_detached(image: &File) -> Result<OwnedFd, JailError> {
    // The loop fd only has to live until the mount holds the device: closing it then is what
    // lets AUTOCLEAR free the device at unmount.
    let (device, _loop_fd) = attach_loop(image)?;
    mount_device(&device)
}

/// A detached mount of the ext4 filesystem on the block device `device` (nosuid, nodev,
/// [`MOUNT_OPTIONS`], `errors=remount-ro`). A device some mount already has gives that
/// mount's filesystem, not a second one.
pub(crate) fn mount_device(device: &Path) -> Result<OwnedFd, JailError> {
    let failed = |e: Errno, detail: String| {
        let what = format!("mounting the sandbox's disk on {}", device.display());
        if detail.is_empty() {
            JailError::sys(what, e)
        } else {
            JailError::sys(format!("{what} ({detail})"), e)
        }
    };
    let context = FsContext::new("ext4").map_err(|e| failed(e, String::new()))?;
    context
        .set("source", &device.to_string_lossy())
        .map_err(|e| failed(e, String::new()))?;
    for option in MOUNT_OPTIONS.split(',') {
        context.flag(option).map_err(|e| failed(e, String::new()))?;
    }
    // An error (a failed write to the image, corrupt metadata) stops all writes at once
    // rather than letting later ones report success over it: see `disk_failure`.
    context
        .set("errors", "remount-ro")
        .map_err(|e| failed(e, String::new()))?;
    context
        .mount(NOSUID | NODEV)
        .map_err(|(e, detail)| failed(e, detail))
}

/// Writes what the guest wrote to its disk through to the image file (`syncfs`), so that it is
/// in the host's filesystem, which has reserved the space for it: a host filesystem that fills
/// up later cannot lose it. Nothing to do without a disk limit (the guest's files are already
/// the host's). Only the process that mounted the disk (the supervisor) sees it.
pub fn sync_disk(state_dir: &Path) -> Result<(), JailError> {
    let paths = DiskPaths::at(state_dir);
    let dir = match File::open(&paths.mountpoint) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(JailError::io("open the disk at", &paths.mountpoint, e)),
    };
    match dir.metadata() {
        Ok(disk) if is_own_filesystem(&disk, state_dir) => {}
        _ => return Ok(()),
    }
    // SAFETY: syncfs takes an open fd, which `dir` is for the duration of the call.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(JailError::sys(
            format!(
                "writing the sandbox's disk through to {}",
                paths.image.display()
            ),
            Errno::last(),
        )
        .hint("the host's filesystem may be full; free space on it"))
    }
}

/// What went wrong with the sandbox's disk, if anything: errors its ext4 recorded
/// (`/sys/fs/ext4/<device>/errors_count`: a failed write to the image, metadata found
/// corrupt), after which it takes no more writes (it is mounted `errors=remount-ro`), or its
/// filesystem read-only for another reason.
/// `None` for a healthy disk, or without a disk limit. Only the process that mounted it (the
/// supervisor) sees it.
pub fn disk_failure(state_dir: &Path) -> Option<String> {
    let paths = DiskPaths::at(state_dir);
    let disk = fs::metadata(&paths.mountpoint).ok()?;
    if !is_own_filesystem(&disk, state_dir) {
        return None;
    }
    let what = filesystem_failure(&paths.mountpoint, &disk)?;
    Some(format!(
        "the sandbox's disk ({}) failed: {what}; what it acknowledged before stays on it",
        paths.image.display()
    ))
}

/// What went wrong with the ext4 filesystem mounted on `mountpoint` (`disk`: its metadata),
/// if anything: the errors it recorded, or its going read-only.
pub(crate) fn filesystem_failure(mountpoint: &Path, disk: &fs::Metadata) -> Option<String> {
    let dev = std::os::unix::fs::MetadataExt::dev(disk);
    // The block device under the mount (`loopN`), as sysfs names it.
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let device = fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let device = device.file_name()?.to_string_lossy().into_owned();
    let ext4 = Path::new("/sys/fs/ext4").join(&device);
    let read = |file: &str| {
        fs::read_to_string(ext4.join(file))
            .ok()
            .map(|text| text.trim().to_owned())
    };
    let errors: u64 = read("errors_count")
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    let read_only = nix::sys::statvfs::statvfs(mountpoint)
        .is_ok_and(|stat| stat.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));
    if errors == 0 && !read_only {
        return None;
    }
    // Mounted `errors=remount-ro`, an ext4 that recorded an error takes no more writes (an
    // emergency read-only state that newer kernels keep apart from the mount's flags).
    let what = if errors > 0 {
        let first = read("first_error_func")
            .filter(|f| !f.is_empty())
            .map(|func| format!(" (the first in {func})"))
            .unwrap_or_default();
        format!("its filesystem recorded {errors} error(s){first} and takes no more writes")
    } else {
        "its filesystem went read-only".to_owned()
    };
    Some(what)
}

/// Whether `disk` (the mountpoint's metadata) is a filesystem of its own, the mounted image,
/// rather than a plain directory on the state dir's filesystem (a start without a disk
/// limit, or an image not mounted). `false` when the state dir cannot be read.
fn is_own_filesystem(disk: &fs::Metadata, state_dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(state_dir).is_ok_and(|parent| parent.dev() != disk.dev())
}

/// Deletes a state dir's image and its (unmounted, or plain and already emptied) mountpoint.
pub(crate) fn remove_disk(paths: &DiskPaths) -> Vec<String> {
    let mut problems = Vec::new();
    for (path, result) in [
        (&paths.image, fs::remove_file(&paths.image)),
        (&paths.mountpoint, fs::remove_dir(&paths.mountpoint)),
    ] {
        match result {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                problems.push(format!("cannot remove {}: {e}", path.display()));
            }
            _ => {}
        }
    }
    problems
}

/// Waits (up to [`RELEASE_WAIT`]) until no loop device is backed by `image`: after a
/// supervisor is killed its namespaces, and with them its mount of the disk, go away
/// asynchronously.
pub(crate) fn wait_released(image: &Path) -> Result<(), JailError> {
    let start = Instant::now();
    loop {
        let Some(device) = loop_device_of(image) else {
            return Ok(());
        };
        if start.elapsed() > RELEASE_WAIT {
            return Err(JailError::InvalidSpec(format!(
                "the disk image {} is still attached to {device}: a previous guest of this \
                 sandbox still has it mounted; try again once its supervisor is gone",
                image.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The loop device (e.g. `loop3`) whose backing file is `image`, if any.
pub(crate) fn loop_device_of(image: &Path) -> Option<String> {
    let entries = fs::read_dir("/sys/block").ok()?;
    entries.flatten().find_map(|entry| {
        let name = entry.file_name().into_string().ok()?;
        let backing = fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
        let backing = backing.trim_end_matches('\n');
        // A deleted backing file reads as "<path> (deleted)": not this (existing) image.
        (Path::new(backing) == image).then_some(name)
    })
}

/// The guest's disk mount must not show in the host's mount table, and must go when this
/// process goes: a mount namespace of its own, receiving the host's mounts but sending none.
pub(crate) fn enter_private_mount_namespace() -> Result<(), JailError> {
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| JailError::sys("creating the supervisor's mount namespace", e))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| JailError::sys("making / a slave mount in the supervisor's namespace", e))
}

fn create_mountpoint(dir: &Path) -> Result<(), JailError> {
    fs::create_dir(dir).map_err(|e| {
        let err = JailError::io("create", dir, e);
        if dir.exists() {
            err.hint("the state dir still holds a previous sandbox; call cleanup_leftovers(name, state_dir) first")
        } else {
            err
        }
    })
}

/// ext4 options of every mount of a sandbox's disk (see `mount_detached`).
///
/// `noinit_itable`: the image is formatted with lazy inode tables; by default a kernel thread
/// then zeroes them in the background for the mount's life, writing (and allocating) the
/// whole inode area into the sparse image, and is started by every mount. Uninitialised
/// tables are correct as they are (the group descriptors say so).
///
/// `no_prefetch_block_bitmaps`: by default a mount starts a kernel thread that reads every
/// group's block bitmap ahead, for the allocator of a large, full filesystem; a sandbox's disk
/// starts empty, and a mount without the thread is measurably faster.
const MOUNT_OPTIONS: &str = "noinit_itable,no_prefetch_block_bitmaps";

/// A sparse file of `bytes` formatted as ext4: no reserved blocks (the guest is the only
/// user), lazy inode-table and journal init (mkfs writes a few hundred KiB, not the size). The
/// journal stays: a kept image must survive a host crash in a state the recovery can mount.
///
/// No resize inode: its reserved group-descriptor blocks are the only thing mkfs writes that
/// scales with the size (4 MiB of zeros for 10 GiB, 95 % of the image's data), and a sandbox's
/// disk is never grown. Every start copies the image's data and flushes it through the loop
/// device; without those blocks attaching the loop device is much faster.
fn make_image(image: &Path, bytes: u64) -> Result<(), JailError> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(image)
        .map_err(|e| JailError::io("create the disk image", image, e))?;
    let result = file
        .set_len(bytes)
        .map_err(|e| JailError::io("size the disk image", image, e))
        .and_then(|()| mkfs(image));
    if result.is_err() {
        // Best effort: the mkfs error is the one to report.
        let _ = fs::remove_file(image);
    }
    result
}

fn mkfs(image: &Path) -> Result<(), JailError> {
    // The layer directories, made by mkfs from a skeleton beside the image (`-d`): see
    // `layers::UPPER`. The image's name is this format's alone, and so is the skeleton's.
    let mut skeleton = image.as_os_str().to_owned();
    skeleton.push(".skeleton");
    let skeleton = PathBuf::from(skeleton);
    let formatted = make_skeleton(&skeleton).and_then(|()| run_mkfs(image, &skeleton));
    // Best effort: what is left is a few empty directories, replaced by the next format.
    let _ = remove_tree(&skeleton);
    formatted
}

fn make_skeleton(skeleton: &Path) -> Result<(), JailError> {
    remove_tree(skeleton).map_err(|e| JailError::io("remove the leftover", skeleton, e))?;
    for dir in [
        crate::layers::UPPER,
        crate::layers::WORK,
        crate::layers::ROOT,
    ] {
        let path = skeleton.join(dir);
        fs::create_dir_all(&path).map_err(|e| JailError::io("create", &path, e))?;
    }
    Ok(())
}

fn run_mkfs(image: &Path, skeleton: &Path) -> Result<(), JailError> {
    let output = Command::new("mkfs.ext4")
        .args([
            "-F",
            "-q",
            "-m",
            "0",
            "-i",
            BYTES_PER_INODE,
            "-O",
            "^resize_inode",
        ])
        .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
        .arg("-d")
        .arg(skeleton)
        .arg(image)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .map_err(|e| {
            JailError::io("run mkfs.ext4 for", image, e)
                .hint("install e2fsprogs (apt-get install e2fsprogs)")
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(JailError::InvalidSpec(format!(
            "mkfs.ext4 {} failed ({}): {}",
            image.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Binds `image` to a free loop device with `LO_FLAGS_AUTOCLEAR`; returns the device's path
/// and an open fd of it (keep it until the device is mounted).
pub(crate) fn attach_loop(image: &File) -> Result<(PathBuf, File), JailError> {
    let control_path = Path::new("/dev/loop-control");
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(control_path)
        .map_err(|e| {
            JailError::io("open", control_path, e)
                .hint("the disk limit needs loop devices (modprobe loop)")
        })?;
    // GET_FREE names the lowest unbound device, the same one to every start asking at once,
    // and only one of them binds it: 50 parallel starts exhausted eight retries. Starts take
    // turns instead, holding a lock on the control device for the two calls, which are short.
    let control = nix::fcntl::Flock::lock(control, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, err)| JailError::sys("locking /dev/loop-control", err))?;
    let backing_fd = u32::try_from(image.as_raw_fd()).expect("an open fd is not negative");
    let mut last = Errno::EBUSY;
    for _ in 0..LOOP_ATTEMPTS {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if number < 0 {
            return Err(JailError::sys(
                "finding a free loop device (LOOP_CTL_GET_FREE)",
                Errno::last(),
            ));
        }
        let path = PathBuf::from(format!("/dev/loop{number}"));
        let device = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| JailError::io("open", &path, e))?;
        // SAFETY: all-zero is a valid loop_config (integers and byte arrays).
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = backing_fd;
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: `config` is a live, initialised struct loop_config the kernel only reads;
        // `device` is an open loop device.
        let ret = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE, &config) };
        if ret == 0 {
            return Ok((path, device));
        }
        last = Errno::last();
        // Another process took this device between GET_FREE and CONFIGURE: ask again.
        if last != Errno::EBUSY {
            break;
        }
    }
    Err(JailError::sys(
        "binding the disk image to a loop device (LOOP_CONFIGURE)",
        last,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::{ROOT, UPPER, WORK};

    /// Starts that bind their disks at the same moment all get a device: the lowest free one
    /// used to go to one of them and the others ran out of retries.
    #[test]
    fn parallel_starts_each_get_a_loop_device() {
        if !nix::unistd::geteuid().is_root() || !Path::new("/dev/loop-control").exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "loop devices need root and /dev/loop-control"
            );
            eprintln!(
                "SKIPPED parallel_starts_each_get_a_loop_device: needs root and loop devices"
            );
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let images: Vec<File> = (0..64)
            .map(|n| {
                let image = File::create(tmp.path().join(format!("{n}.img"))).expect("image");
                image.set_len(1 << 20).expect("size");
                image
            })
            .collect();
        // Every thread reaches the start line (nothing before it can fail), then binds; each
        // device stays bound, its descriptor returned, until all are compared.
        let start = std::sync::Barrier::new(images.len());
        let bound: Vec<(PathBuf, File)> = std::thread::scope(|scope| {
            let threads: Vec<_> = images
                .iter()
                .map(|image| {
                    let start = &start;
                    scope.spawn(move || {
                        start.wait();
                        attach_loop(image)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| {
                    thread
                        .join()
                        .expect("thread")
                        .unwrap_or_else(|err| panic!("a start got no loop device: {err}"))
                })
                .collect()
        });
        let devices: Vec<PathBuf> = bound.iter().map(|(path, _)| path.clone()).collect();
        let distinct: std::collections::HashSet<&PathBuf> = devices.iter().collect();
        assert_eq!(distinct.len(), devices.len(), "{devices:?}");
    }

    #[test]
    fn loop_structs_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    #[test]
    fn a_kept_image_is_mounted_never_formatted() {
        let mut spec = JailSpec {
            name: "t".into(),
            hostname: "t".into(),
            image_root: "/".into(),
            ro_binds: vec![],
            rw_binds: vec![],
            cache: None,
            state_dir: "/s".into(),
            guest_dirs: vec![],
            agent_binary: "/bin/true".into(),
            agent_args: vec![],
            limits: crate::spec::Limits {
                cpu_millis: 1000,
                memory_bytes: 1 << 30,
                pids: 10,
            },
            reuse_layers: false,
            layer_ids: None,
            disk_bytes: Some(64 << 20),
            disk_templates: None,
            net_raw: true,
            idmap_image: false,
            exec_cgroup: None,
        };
        assert_eq!(Plan::for_spec(&spec, false), Plan::Format(64 << 20));
        spec.reuse_layers = true;
        assert_eq!(Plan::for_spec(&spec, true), Plan::MountKept);
        assert_eq!(Plan::for_spec(&spec, false), Plan::Plain);
        spec.disk_bytes = None;
        assert_eq!(Plan::for_spec(&spec, true), Plan::MountKept);
        spec.reuse_layers = false;
        assert_eq!(Plan::for_spec(&spec, false), Plan::Plain);
    }

    #[test]
    fn a_large_image_writes_little_and_keeps_its_journal() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let image = tmp.path().join("disk.img");
        make_image(&image, 10 << 30).expect("format the image (needs e2fsprogs)");
        let meta = fs::metadata(&image).expect("stat the image");
        assert_eq!(meta.len(), 10 << 30);
        // What every sandbox start copies and flushes: no size-proportional reserve.
        let allocated = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
        assert!(allocated < 1 << 20, "{allocated} bytes allocated");
        let features = Command::new("dumpe2fs")
            .args(["-h"])
            .arg(&image)
            .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
            .output()
            .expect("run dumpe2fs");
        let header = String::from_utf8_lossy(&features.stdout);
        let features = header
            .lines()
            .find(|l| l.starts_with("Filesystem features:"))
            .expect("dumpe2fs lists the features");
        assert!(features.contains("has_journal"), "{features}");
        assert!(!features.contains("resize_inode"), "{features}");
        // The layer directories are there, empty, and the skeleton they came from is gone.
        let list = |dir: &str| {
            let out = Command::new("debugfs")
                .args(["-R", &format!("ls {dir}")])
                .arg(&image)
                .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
                .output()
                .expect("run debugfs");
            let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter(|w| {
                    w.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+._".contains(c))
                })
                .filter(|w| !w.chars().all(|c| c.is_ascii_digit()))
                .map(str::to_owned)
                .collect();
            names.sort();
            names
        };
        assert_eq!(list("/"), [".", "..", "lost+found", ROOT, UPPER, WORK]);
        for dir in [ROOT, UPPER, WORK] {
            assert_eq!(list(&format!("/{dir}")), [".", ".."], "{dir}");
        }
        let beside: Vec<_> = fs::read_dir(tmp.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(beside, ["disk.img"]);
    }

    #[test]
    fn removing_a_missing_disk_is_fine() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert!(remove_disk(&DiskPaths::at(tmp.path())).is_empty());
    }
}
