//! Formatted empty disks to copy from. `mkfs.ext4` costs tens of milliseconds (four fsyncs and
//! a process start) on every sandbox start; a freshly made ext4 image is the same bytes every
//! time for one size and one set of options, a few hundred KiB of metadata in a sparse file. So each
//! size is formatted once into a template directory, and a new sandbox's disk is a sparse copy
//! of it (a reflink where the host filesystem has them).
//!
//! Templates are immutable once published (written under a temporary name, renamed into
//! place under a lock), so a copy never sees half of one. Every copy has the template's
//! filesystem UUID; nothing here or in the kernel's ext4 relies on it being unique.
//!
//! A copy made at start is a new file with dirty pages, and binding it to a loop device
//! (`LOOP_CONFIGURE`) fsyncs it, new directory entries included: a millisecond or two of the
//! start spent waiting on the host's disk. So a sandbox's teardown leaves a *spare*: one copy
//! per size, already on disk, under `spares/`. The next start of that size takes it by
//! renaming it into place, and copies only when there is none. A spare is published (linked
//! from an unnamed file) only once its data is flushed, so a crash leaves either a whole spare
//! or none. A supervisor making its disk ahead holds the spare (an `flock` that lives as long
//! as the loop device bound to it) until its sandbox is known, and every taker locks the spare
//! before it moves it: one spare never becomes two sandboxes' disk.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::JailError;

/// Bump when the mkfs options change, so old templates are never copied again.
const TEMPLATE_REVISION: u32 = 4;

/// Subdirectory of the templates directory holding the spares.
const SPARES: &str = "spares";

/// `FICLONE` of `<linux/fs.h>`: `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// Makes `image`, a new file of `bytes`, as a copy of the template for that size in
/// `templates`, formatting the template first with `format` if there is none yet.
pub(crate) fn copy_formatted(
    templates: &Path,
    image: &Path,
    bytes: u64,
    format: impl FnOnce(&Path, u64) -> Result<(), JailError>,
) -> Result<(), JailError> {
    if take_spare(templates, image, bytes)? {
        return Ok(());
    }
    let source = open_template(templates, bytes, format)?;
    let target = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(image)
        .map_err(|e| JailError::io("create the disk image", image, e))?;
    let copied = sparse_copy(&source, &target, bytes)
        .map_err(|e| JailError::io("copy the disk template into", image, e));
    if copied.is_err() {
        let _ = fs::remove_file(image);
    }
    copied
}

/// The file name of the template for `bytes`, and of its spares.
fn image_name(bytes: u64) -> String {
    format!("ext4-{bytes}-r{TEMPLATE_REVISION}.img")
}

/// Where the template for `bytes` is (or will be).
fn template_path(templates: &Path, bytes: u64) -> PathBuf {
    templates.join(image_name(bytes))
}

/// Where the spare for `bytes` is published.
fn spare_path(templates: &Path, bytes: u64) -> PathBuf {
    templates.join(SPARES).join(image_name(bytes))
}

/// Moves the spare for `bytes` to `image` (which must not exist); `false` when there is no
/// spare (none made yet, or another start took it or holds it).
fn take_spare(templates: &Path, image: &Path, bytes: u64) -> Result<bool, JailError> {
    let Some(spare) = lock_spare(templates, bytes)? else {
        return Ok(false);
    };
    // Unlocked when `spare` closes, by which time it is no longer at the spare's path.
    spare.rename_to(image)?;
    Ok(true)
}

/// The spare for `bytes`, opened and locked (`flock`, exclusive) by this process; `None` when
/// there is none or another start holds it. Every taker locks it first, and a lock lasts as
/// long as its open file, which the loop device a disk made ahead is bound to keeps: so no
/// two starts ever bind or mount one spare.
fn lock_spare(templates: &Path, bytes: u64) -> Result<Option<HeldSpare>, JailError> {
    match open_spare(templates, bytes)? {
        Some((file, path)) => hold(file, path),
        None => Ok(None),
    }
}

/// The spare for `bytes` and its path, opened (read-write, as a loop device binds it), if
/// there is one.
fn open_spare(templates: &Path, bytes: u64) -> Result<Option<(File, PathBuf)>, JailError> {
    let path = spare_path(templates, bytes);
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(file) => Ok(Some((file, path))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(JailError::io("open the spare disk", &path, e)),
    }
}

/// Locks the spare `file` opened at `path`; `None` when another start holds it, or took it
/// between the open and the lock.
fn hold(file: File, path: PathBuf) -> Result<Option<HeldSpare>, JailError> {
    // std's lock, not nix's `Flock`, which unlocks when dropped: the lock must outlive this
    // descriptor for as long as a loop device holds the open file (see `lock_spare`).
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => return Ok(None),
        Err(fs::TryLockError::Error(e)) => {
            return Err(JailError::io("lock the spare disk", &path, e))
        }
    }
    // Opened before another taker moved it away and let go of it: it is that start's disk now.
    let held = file
        .metadata()
        .map_err(|e| JailError::io("inspect the spare disk", &path, e))?;
    match fs::symlink_metadata(&path) {
        Ok(named) if named.dev() == held.dev() && named.ino() == held.ino() => {
            Ok(Some(HeldSpare { file, path }))
        }
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(JailError::io("inspect the spare disk", &path, e)),
    }
}

/// A spare this process holds the lock of (see [`lock_spare`]), still at its path.
#[derive(Debug)]
pub(crate) struct HeldSpare {
    file: File,
    path: PathBuf,
}

impl HeldSpare {
    /// Moves the spare to `image` (which must not exist), where no other start looks for it.
    fn rename_to(&self, image: &Path) -> Result<(), JailError> {
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &self.path,
            nix::fcntl::AT_FDCWD,
            image,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(|errno| {
            JailError::sys(
                format!(
                    "moving the spare disk {} to {}",
                    self.path.display(),
                    image.display()
                ),
                errno,
            )
        })
    }
}

/// The image of a disk made ahead of its sandbox (see [`ahead_image`]), held for it until
/// [`AheadImage::name`] gives it its sandbox's name.
#[derive(Debug)]
pub(crate) enum AheadImage {
    /// The spare, held under its lock. If its holder never names it (it dies, or its start
    /// goes another way) it stays the spare: its filesystem is still empty, and no guest has
    /// seen it.
    Spare(HeldSpare),
    /// A new copy with no name, which the kernel frees if it is never named.
    Unnamed(File),
}

impl AheadImage {
    pub(crate) fn file(&self) -> &File {
        match self {
            AheadImage::Spare(spare) => &spare.file,
            AheadImage::Unnamed(file) => file,
        }
    }

    /// Gives the image the name `image` (which must not exist).
    pub(crate) fn name(&self, image: &Path) -> Result<(), JailError> {
        match self {
            AheadImage::Spare(spare) => spare.rename_to(image),
            AheadImage::Unnamed(file) => link(file, image).map_err(|errno| {
                JailError::sys(format!("naming the disk {}", image.display()), errno)
            }),
        }
    }
}

/// The image for a disk made ahead of its sandbox: the spare for `bytes` when there is one
/// free, which a teardown copied and flushed when nobody was waiting, so binding it to a loop
/// device (which flushes the file) has nothing left to write; else an unnamed copy of the
/// template, formatting the template first with `format` if there is none.
pub(crate) fn ahead_image(
    templates: &Path,
    bytes: u64,
    format: impl FnOnce(&Path, u64) -> Result<(), JailError>,
) -> Result<AheadImage, JailError> {
    if let Some(spare) = lock_spare(templates, bytes)? {
        return Ok(AheadImage::Spare(spare));
    }
    unnamed_copy(templates, bytes, format).map(AheadImage::Unnamed)
}

/// An unnamed copy (`O_TMPFILE`, in `templates`) of the template for `bytes`, formatting the
/// template first with `format` if there is none: a disk made ahead of its sandbox, which
/// nothing has to clean up if its holder dies. [`AheadImage::name`] names it once its sandbox
/// is known.
fn unnamed_copy(
    templates: &Path,
    bytes: u64,
    format: impl FnOnce(&Path, u64) -> Result<(), JailError>,
) -> Result<File, JailError> {
    let source = open_template(templates, bytes, format)?;
    let copy = unnamed_file(templates)
        .map_err(|e| JailError::io("create an unnamed disk in", templates, e))?;
    sparse_copy(&source, &copy, bytes).map_err(|e| {
        JailError::io(
            "copy the disk template into an unnamed disk in",
            templates,
            e,
        )
    })?;
    Ok(copy)
}

/// The template for `bytes`, opened; formatted first with `format` if there is none.
fn open_template(
    templates: &Path,
    bytes: u64,
    format: impl FnOnce(&Path, u64) -> Result<(), JailError>,
) -> Result<File, JailError> {
    let template = ensure(templates, bytes, format)?;
    File::open(&template).map_err(|e| JailError::io("open the disk template", &template, e))
}

/// A new file with no name (`O_TMPFILE`) in `dir`, private to root: a copy that a crash
/// leaves nothing of until [`link`] names it.
fn unnamed_file(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)
}

/// Gives the unnamed `file` the name `path` (which must not exist).
fn link(file: &File, path: &Path) -> nix::Result<()> {
    let unnamed = format!("/proc/self/fd/{}", file.as_raw_fd());
    nix::unistd::linkat(
        nix::fcntl::AT_FDCWD,
        unnamed.as_str(),
        nix::fcntl::AT_FDCWD,
        path,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    )
}

/// Makes the spare for `bytes` from its template, if there is a template and no spare yet;
/// returns whether it made one. Never formats: a size no start has used gets no spare. Meant
/// for after a sandbox's reply (its teardown), where the copy and flush cost no one a wait.
pub fn make_spare(templates: &Path, bytes: u64) -> Result<bool, JailError> {
    let spare = spare_path(templates, bytes);
    let template = template_path(templates, bytes);
    if spare.exists() || !template.is_file() {
        return Ok(false);
    }
    let dir = templates.join(SPARES);
    // Only `spares/` itself: a home removed since the template was seen (its sandbox ended
    // with it) must not be made again, with a disk's worth of spare in it.
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(JailError::io("create", &dir, e)),
    }
    let source =
        File::open(&template).map_err(|e| JailError::io("open the disk template", &template, e))?;
    // Unnamed until whole and on disk: a crash meanwhile leaves nothing behind.
    let copy = unnamed_file(&dir)
        .map_err(|e| JailError::io("create an unnamed spare disk in", &dir, e))?;
    sparse_copy(&source, &copy, bytes)
        .and_then(|()| copy.sync_all())
        .map_err(|e| JailError::io("copy the disk template into a spare in", &dir, e))?;
    match link(&copy, &spare) {
        Ok(()) => {}
        // Another teardown published one first; ours is freed on close.
        Err(nix::errno::Errno::EEXIST) => return Ok(false),
        Err(errno) => {
            return Err(JailError::sys(
                format!("publishing the spare disk {}", spare.display()),
                errno,
            ))
        }
    }
    // Flushes the new name too: the start's fsync (LOOP_CONFIGURE's) then has nothing of
    // this file's to write but what its rename changed.
    copy.sync_all()
        .map_err(|e| JailError::io("flush the spare disk", &spare, e))?;
    Ok(true)
}

/// Creates the templates directory and its parent (the home's cache), but nothing above: a
/// home deleted while a process of it still runs (a standby making a disk ahead) is not made
/// again, with a disk template in it.
fn create_templates_dir(templates: &Path) -> Result<(), JailError> {
    for dir in templates.parent().into_iter().chain([templates]) {
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(JailError::io("create the disk template directory", dir, e)),
        }
    }
    Ok(())
}

/// The template for `bytes`, formatted and published first if missing.
fn ensure(
    templates: &Path,
    bytes: u64,
    format: impl FnOnce(&Path, u64) -> Result<(), JailError>,
) -> Result<PathBuf, JailError> {
    let template = template_path(templates, bytes);
    if template.is_file() {
        return Ok(template);
    }
    create_templates_dir(templates)?;
    let lock_path = templates.join(".lock");
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(&lock_path)
        .map_err(|e| JailError::io("open", &lock_path, e))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| JailError::sys(format!("locking {}", lock_path.display()), errno))?;
    // Another start may have published it while we waited.
    if template.is_file() {
        return Ok(template);
    }
    let partial = templates.join(format!(
        ".ext4-{bytes}-r{TEMPLATE_REVISION}.{}.partial",
        std::process::id()
    ));
    let _ = fs::remove_file(&partial);
    let made = format(&partial, bytes).and_then(|()| {
        fs::rename(&partial, &template)
            .map_err(|e| JailError::io("publish the disk template", &template, e))
    });
    if made.is_err() {
        let _ = fs::remove_file(&partial);
    }
    if made.is_ok() {
        remove_other_revisions(templates);
    }
    made.map(|()| template)
}

/// Removes templates an older (or newer) revision of the options made, and their spares:
/// nothing copies them again, and disks copied from them are files of their own. Best effort,
/// under the lock.
fn remove_other_revisions(templates: &Path) {
    let current = format!("-r{TEMPLATE_REVISION}.img");
    for dir in [templates.to_path_buf(), templates.join(SPARES)] {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("ext4-") && name.ends_with(".img") && !name.ends_with(&current) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Copies `source` into the empty `target` and sizes it to `bytes`, keeping holes: a reflink
/// where the filesystem can share the extents, else only the ranges that hold data.
fn sparse_copy(source: &File, target: &File, bytes: u64) -> io::Result<()> {
    // SAFETY: FICLONE reads the source fd number passed by value; both fds are open.
    let cloned = unsafe { libc::ioctl(target.as_raw_fd(), FICLONE, source.as_raw_fd()) };
    if cloned == 0 {
        return target.set_len(bytes);
    }
    let size = source.metadata()?.len();
    let mut offset: i64 = 0;
    let end = i64::try_from(size).map_err(|_| io::Error::other("template larger than i64"))?;
    while offset < end {
        let Some(data) = seek(source, offset, libc::SEEK_DATA)? else {
            break;
        };
        let hole = seek(source, data, libc::SEEK_HOLE)?.unwrap_or(end);
        copy_range(source, target, data, hole - data)?;
        offset = hole;
    }
    target.set_len(bytes)
}

/// `lseek(fd, offset, whence)`; `None` where SEEK_DATA finds no more data (ENXIO).
fn seek(file: &File, offset: i64, whence: libc::c_int) -> io::Result<Option<i64>> {
    // SAFETY: lseek on an open fd has no memory effects.
    let at = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if at >= 0 {
        return Ok(Some(at));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// Copies `len` bytes at `offset` of `source` to the same offset of `target`, in the kernel.
fn copy_range(source: &File, target: &File, offset: i64, len: i64) -> io::Result<()> {
    let (mut from, mut to, mut left) = (offset, offset, len);
    while left > 0 {
        let chunk = usize::try_from(left).unwrap_or(usize::MAX);
        // SAFETY: both offsets point at i64s owned by this frame; the fds are open.
        let n = unsafe {
            libc::copy_file_range(
                source.as_raw_fd(),
                &mut from,
                target.as_raw_fd(),
                &mut to,
                chunk,
                0,
            )
        };
        match n {
            n if n > 0 => left -= i64::try_from(n).expect("copy_file_range returns <= chunk"),
            0 => return Err(io::Error::other("the disk template ended early")),
            _ => {
                let err = io::Error::last_os_error();
                // Two filesystems of different kinds (the templates on the home's, the disk in
                // its reflink pool): the kernel does not copy between them, so this process does.
                if err.raw_os_error() == Some(libc::EXDEV) {
                    return copy_through(source, target, from, left);
                }
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

/// Copies `len` bytes at `offset` of `source` to the same offset of `target` through a buffer.
fn copy_through(source: &File, target: &File, offset: i64, len: i64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buffer = vec![0u8; 1 << 20];
    let (mut at, end) = (
        u64::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        u64::try_from(offset.saturating_add(len))
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
    );
    while at < end {
        let want = usize::try_from(end - at)
            .unwrap_or(usize::MAX)
            .min(buffer.len());
        let n = source.read_at(&mut buffer[..want], at)?;
        if n == 0 {
            return Err(io::Error::other("the disk template ended early"));
        }
        target.write_all_at(&buffer[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    /// A stand-in formatter: data at the start, a hole, data near 1 MiB.
    fn fake_format(path: &Path, bytes: u64) -> Result<(), JailError> {
        let mut f = File::create(path).unwrap();
        f.write_all(b"superblock").unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(b"group descriptors").unwrap();
        f.set_len(bytes).unwrap();
        Ok(())
    }

    #[test]
    fn copies_keep_data_and_holes_and_the_template_is_made_once() {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        let size = 64 << 20;
        let mut formats = 0;
        for name in ["a.img", "b.img"] {
            let image = dir.path().join(name);
            copy_formatted(&templates, &image, size, |p, b| {
                formats += 1;
                fake_format(p, b)
            })
            .unwrap();
            let meta = fs::metadata(&image).unwrap();
            assert_eq!(meta.len(), size);
            assert!(meta.blocks() * 512 < 1 << 20, "the copy stays sparse");
            let mut content = Vec::new();
            File::open(&image)
                .unwrap()
                .read_to_end(&mut content)
                .unwrap();
            assert_eq!(&content[..10], b"superblock");
            assert_eq!(&content[1 << 20..(1 << 20) + 17], b"group descriptors");
            assert!(content[10..1 << 20].iter().all(|&b| b == 0));
        }
        assert_eq!(formats, 1);
        let names: Vec<_> = fs::read_dir(&templates)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with(".lock"))
            .collect();
        assert_eq!(names, [format!("ext4-{size}-r{TEMPLATE_REVISION}.img")]);
    }

    #[test]
    fn publishing_a_template_removes_other_revisions_only() {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        fs::create_dir_all(&templates).unwrap();
        let old = templates.join(format!("ext4-{}-r0.img", 1 << 20));
        let other_size_old = templates.join(format!("ext4-{}-r0.img", 2 << 20));
        let current_other_size =
            templates.join(format!("ext4-{}-r{TEMPLATE_REVISION}.img", 2 << 20));
        let unrelated = templates.join("notes.txt");
        for path in [&old, &other_size_old, &current_other_size, &unrelated] {
            File::create(path).unwrap();
        }
        copy_formatted(&templates, &dir.path().join("a.img"), 1 << 20, fake_format).unwrap();
        assert!(!old.exists() && !other_size_old.exists());
        assert!(current_other_size.exists() && unrelated.exists());
    }

    #[test]
    fn a_failed_format_publishes_nothing_and_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        let image = dir.path().join("a.img");
        let err = copy_formatted(&templates, &image, 1 << 20, |p, _| {
            File::create(p).unwrap();
            Err(JailError::InvalidSpec("mkfs.ext4 failed".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("mkfs.ext4 failed"), "{err}");
        assert!(!image.exists());
        assert_eq!(
            fs::read_dir(&templates).unwrap().count(),
            1,
            "only the lock file"
        );
        copy_formatted(&templates, &image, 1 << 20, fake_format).unwrap();
        assert!(image.exists());
    }

    #[test]
    fn an_existing_image_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("a.img");
        fs::write(&image, b"a previous sandbox's files").unwrap();
        let err = copy_formatted(&dir.path().join("t"), &image, 1 << 20, fake_format).unwrap_err();
        assert!(err.to_string().contains("create the disk image"), "{err}");
        assert_eq!(fs::read(&image).unwrap(), b"a previous sandbox's files");
    }

    fn read_all(path: &Path) -> Vec<u8> {
        let mut content = Vec::new();
        File::open(path).unwrap().read_to_end(&mut content).unwrap();
        content
    }

    #[test]
    fn a_spare_is_a_flushed_copy_taken_by_one_start_only() {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        let size = 64 << 20;
        // No template for the size yet: no spare, and nothing formatted for one.
        assert!(!make_spare(&templates, size).unwrap());
        assert!(!templates.exists());

        copy_formatted(&templates, &dir.path().join("a.img"), size, fake_format).unwrap();
        assert!(make_spare(&templates, size).unwrap());
        assert!(!make_spare(&templates, size).unwrap(), "one spare per size");
        let spare = spare_path(&templates, size);
        let meta = fs::metadata(&spare).unwrap();
        assert_eq!((meta.len(), meta.mode() & 0o777), (size, 0o600));
        assert_eq!(read_all(&spare), read_all(&template_path(&templates, size)));

        // The next start takes it (a rename: the spare's very inode), the one after copies.
        let b = dir.path().join("b.img");
        let formats_after = std::cell::Cell::new(0);
        copy_formatted(&templates, &b, size, |p, n| {
            formats_after.set(formats_after.get() + 1);
            fake_format(p, n)
        })
        .unwrap();
        assert_eq!(fs::metadata(&b).unwrap().ino(), meta.ino());
        assert!(!spare.exists());
        let c = dir.path().join("c.img");
        copy_formatted(&templates, &c, size, fake_format).unwrap();
        assert_ne!(fs::metadata(&c).unwrap().ino(), meta.ino());
        assert_eq!(read_all(&b), read_all(&c));
        assert_eq!(formats_after.get(), 0);
        // Only the published spare was ever named: no leftovers in its directory.
        assert_eq!(fs::read_dir(templates.join(SPARES)).unwrap().count(), 0);
    }

    #[test]
    fn teardowns_racing_publish_one_spare_and_leave_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        let size = 8 << 20;
        copy_formatted(&templates, &dir.path().join("a.img"), size, fake_format).unwrap();
        let made: usize = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| make_spare(&templates, size).unwrap()))
                .collect();
            racers
                .into_iter()
                .map(|r| usize::from(r.join().unwrap()))
                .sum()
        });
        assert_eq!(made, 1);
        let names: Vec<_> = fs::read_dir(templates.join(SPARES))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [spare_path(&templates, size).file_name().unwrap()]);
    }

    #[test]
    fn a_spare_never_replaces_an_existing_image() {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        copy_formatted(&templates, &dir.path().join("a.img"), 1 << 20, fake_format).unwrap();
        assert!(make_spare(&templates, 1 << 20).unwrap());
        let image = dir.path().join("kept.img");
        fs::write(&image, b"a previous sandbox's files").unwrap();
        let err = copy_formatted(&templates, &image, 1 << 20, fake_format).unwrap_err();
        assert!(err.to_string().contains("moving the spare disk"), "{err}");
        assert_eq!(fs::read(&image).unwrap(), b"a previous sandbox's files");
        assert!(spare_path(&templates, 1 << 20).exists(), "the spare stays");
    }

    /// The templates live in the home's cache: a home deleted under a process still making a
    /// disk (a standby making one ahead) is not made again, with a template in it.
    #[test]
    fn a_deleted_home_is_not_made_again_for_a_template() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let templates = home.join("cache").join("disks");
        let err = copy_formatted(&templates, &dir.path().join("a.img"), 1 << 20, fake_format)
            .unwrap_err();
        assert!(err.to_string().contains("disk template directory"), "{err}");
        assert!(!home.exists(), "the deleted home was made again");
        assert!(!make_spare(&templates, 1 << 20).unwrap(), "no spare either");
        assert!(!home.exists(), "the deleted home was made again");
        // With the home there, its cache and the templates are made.
        fs::create_dir(&home).unwrap();
        copy_formatted(&templates, &dir.path().join("a.img"), 1 << 20, fake_format).unwrap();
        assert!(template_path(&templates, 1 << 20).is_file());
    }

    #[test]
    fn spares_of_other_revisions_go_with_their_templates() {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        fs::create_dir_all(templates.join(SPARES)).unwrap();
        let old_spare = templates
            .join(SPARES)
            .join(format!("ext4-{}-r0.img", 1 << 20));
        File::create(&old_spare).unwrap();
        copy_formatted(&templates, &dir.path().join("a.img"), 1 << 20, fake_format).unwrap();
        assert!(!old_spare.exists());
    }

    /// A templates directory (in the returned temporary directory) with a template for
    /// `size` made by [`fake_format`], and its spare, whose inode number is returned.
    fn templates_with_a_spare(size: u64) -> (tempfile::TempDir, PathBuf, u64) {
        let dir = tempfile::tempdir().unwrap();
        let templates = dir.path().join("templates");
        ensure(&templates, size, fake_format).unwrap();
        assert!(make_spare(&templates, size).unwrap(), "a spare is made");
        let spare = fs::metadata(spare_path(&templates, size)).unwrap().ino();
        (dir, templates, spare)
    }

    #[test]
    fn a_disk_made_ahead_holds_the_spare_until_it_names_it() {
        let size = 64 << 20;
        let (dir, templates, spare) = templates_with_a_spare(size);

        let ahead = ahead_image(&templates, size, |_, _| panic!("formatted")).unwrap();
        assert!(matches!(ahead, AheadImage::Spare(_)), "{ahead:?}");
        assert_eq!(ahead.file().metadata().unwrap().ino(), spare);
        // Another start of the size, made ahead or not, copies while the spare is held.
        let other = ahead_image(&templates, size, |_, _| panic!("formatted")).unwrap();
        assert!(matches!(other, AheadImage::Unnamed(_)), "{other:?}");
        let copied = dir.path().join("copied.img");
        copy_formatted(&templates, &copied, size, |_, _| panic!("formatted")).unwrap();
        assert_ne!(fs::metadata(&copied).unwrap().ino(), spare);
        assert_eq!(
            fs::metadata(spare_path(&templates, size)).unwrap().ino(),
            spare
        );

        let named = dir.path().join("named.img");
        ahead.name(&named).unwrap();
        assert_eq!(fs::metadata(&named).unwrap().ino(), spare);
        assert!(
            !spare_path(&templates, size).exists(),
            "the spare is the sandbox's now"
        );
        let unnamed = dir.path().join("unnamed.img");
        other.name(&unnamed).unwrap();
        assert_eq!(fs::metadata(&unnamed).unwrap().len(), size);
    }

    #[test]
    fn a_spare_held_and_never_named_stays_the_spare() {
        let size = 64 << 20;
        let (dir, templates, spare) = templates_with_a_spare(size);
        drop(ahead_image(&templates, size, fake_format).unwrap());
        let image = dir.path().join("image.img");
        copy_formatted(&templates, &image, size, |_, _| panic!("formatted")).unwrap();
        assert_eq!(
            fs::metadata(&image).unwrap().ino(),
            spare,
            "the start took it"
        );
    }

    #[test]
    fn a_spare_taken_between_the_open_and_the_lock_is_not_held() {
        let size = 64 << 20;
        let (dir, templates, _) = templates_with_a_spare(size);
        let (late, path) = open_spare(&templates, size).unwrap().expect("a spare");
        let image = dir.path().join("image.img");
        assert!(take_spare(&templates, &image, size).unwrap());
        assert!(
            hold(late, path.clone()).unwrap().is_none(),
            "held a taken spare"
        );
        // Nor one that another start took and a teardown replaced at the same path since.
        make_spare(&templates, size).unwrap();
        let (late, path) = open_spare(&templates, size).unwrap().expect("a new spare");
        fs::remove_file(&path).unwrap();
        make_spare(&templates, size).unwrap();
        assert!(hold(late, path).unwrap().is_none(), "held a replaced spare");
        assert!(lock_spare(&templates, size).unwrap().is_some());
    }
}
