//! Room on the host's filesystem for sandboxes' disks. A sandbox's disk is a sparse file (the
//! jail's ext4 image, the vm's qcow2 layer): left sparse, the host's free space would be
//! promised to every sandbox at once and held by none, and a guest whose write the host cannot
//! store has its filesystem fail under work it already acknowledged. So a sandbox's disk sets
//! aside its whole size on the host's filesystem when the sandbox starts (`fallocate`: blocks
//! reserved, nothing written), and a start the free space cannot back is refused before
//! anything is made ([`check_room`]).
//!
//! What holds a reservation: the disk of every started sandbox, and the kept layer of an
//! `unsaved` task (its recovery boots over it). A warm-pool sandbox reserves when it is
//! claimed: until then it is nobody's, and its sparse disk holds a few hundred KB. The disk
//! templates and spares are sparse too and reserve nothing. A destroyed sandbox, and a
//! finished task (its patch and logs stay, its layer does not), give their room back.
//!
//! A fork reserves nothing, on either backend: a jail fork's disk is a reflinked clone of its
//! source's (where the home's filesystem has reflinks; a copy reserves as any start), and a
//! vm fork's writable layer grows on the host as its guest writes (`dynocap_backend_vm::
//! layers`' `UNRESERVED`: its guest's `disk_room` is `None`, for its life, across its own
//! checkpoints, restores and recoveries). Ten forks take on the host what they write. The
//! price is the one a jail clone pays: once the host's filesystem is full, a fork's write
//! fails in its guest (QEMU reports the ENOSPC to the guest as a disk error: its write or
//! `fsync` fails, and its ext4 turns read-only once the error reaches its metadata), where a
//! task started fresh writes on into its reservation. A vm fork, and a jail fork's clone, is
//! admitted with [`HEADROOM_MB`] free; a jail fork's copy with room for what it copies and
//! for its whole disk, which it reserves when it boots.
//!
//! On the vm a checkpoint or fork freezes the writable layer: the frozen layer keeps the
//! blocks it holds and gives back its room past them, and the guest's new layer reserves the
//! disk again (a task started fresh's; a fork's new layer, as its first, reserves nothing). A
//! restore puts a new layer over a checkpoint's chain, which the guest's boot reserves as it
//! reserved its first (a fork's, again, nothing). Frozen layers are hard links in every
//! directory using them, so the filesystem counts each once and frees it with its last link;
//! a freeze asks for what it adds with [`check_more`] before anything is made.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::foundation::terms::Param;

/// Room on the home's filesystem a start leaves free, beyond the disk it reserves: the
/// records, logs, catalog and results (a finished task's patch) are written there too.
pub const HEADROOM_MB: u64 = 64;

/// How a disk's file takes its room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A file of the disk's size whose blocks the guest's writes fill in (the jail's raw
    /// image): its whole length is reserved.
    Fixed,
    /// A file that grows as the guest writes (the vm's qcow2 layer, which appends clusters):
    /// blocks past its end are reserved, for the disk's size and the format's own tables.
    Growing,
}

/// The room a guest's disk takes on the host: its file, its size and how the file grows. A
/// value apart from the guest, so that the reservation can run beside the rest of a start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRoom {
    pub image: PathBuf,
    pub bytes: u64,
    pub layout: Layout,
}

impl DiskRoom {
    /// See [`reserve`].
    pub fn reserve(&self) -> Result<()> {
        reserve(&self.image, self.bytes, self.layout)
    }
}

/// A reservation under way on a thread of its own. `fallocate` of a whole disk takes a
/// millisecond or more, all of it in the kernel, while the guest's agent starts up and the
/// supervisor readies its control socket: a start begins it right after the boot and
/// [`waits`](PendingRoom::wait) for it before the sandbox is anyone's. Dropped unwaited (the
/// start failed meanwhile), the thread finishes alone on a disk about to be removed.
#[derive(Debug, Default)]
pub struct PendingRoom(Option<Reserving>);

#[derive(Debug)]
enum Reserving {
    Thread(JoinHandle<Result<()>>),
    /// Reserved on the caller's thread: no thread could be started.
    Done(Result<()>),
}

impl PendingRoom {
    /// Starts reserving `room`; where no thread can be started, reserves it here instead.
    pub fn begin(room: DiskRoom) -> Self {
        let for_thread = room.clone();
        match std::thread::Builder::new()
            .name("disk-room".into())
            .spawn(move || for_thread.reserve())
        {
            Ok(thread) => Self(Some(Reserving::Thread(thread))),
            Err(_) => Self(Some(Reserving::Done(room.reserve()))),
        }
    }

    /// [`wait`](Self::wait), from async code: on a blocking thread, the runtime's own go on.
    pub async fn reserved(self) -> Result<()> {
        tokio::task::spawn_blocking(move || self.wait())
            .await
            .map_err(DiskRoomFailure::ReservingThread)?
    }

    /// The reservation's outcome, once it is done; `Ok` when there was nothing to reserve.
    pub fn wait(self) -> Result<()> {
        match self.0 {
            None => Ok(()),
            Some(Reserving::Done(reserved)) => reserved,
            Some(Reserving::Thread(thread)) => thread
                .join()
                .unwrap_or_else(|_| Err(Error::internal("reserving the sandbox's disk panicked"))),
        }
    }
}

/// The MB free to an unprivileged writer on the filesystem holding `dir`.
pub fn free_mb(dir: &Path) -> Result<u64> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(|source| DiskRoomFailure::FreeSpace {
        dir: dir.to_owned(),
        source,
    })?;
    let bytes = stat.blocks_available().saturating_mul(stat.fragment_size());
    Ok(bytes >> 20)
}

/// Whether the filesystem holding `dir` has no room left for an unprivileged writer (less
/// than 1 MiB): where a write failing is no surprise, and a command that only reads must
/// not fail because of it.
pub fn is_full(dir: &Path) -> bool {
    free_mb(dir).is_ok_and(|free| free == 0)
}

/// Refuses (`policy_denied`) a new sandbox whose disk of `disk_mb` the filesystem holding
/// `home` cannot set aside while keeping [`HEADROOM_MB`] free, naming what is free, what is
/// asked and what to do.
pub fn check_room(home: &Path, disk_mb: u64) -> Result<()> {
    check_room_with_cache(home, disk_mb, 0)
}

/// [`check_room`] for a task whose project's package cache is still to be set aside too
/// (`cache_mb`, 0 when the cache already holds its room: it is counted once, when it is
/// made, however many tasks of the project use it).
pub fn check_room_with_cache(home: &Path, disk_mb: u64, cache_mb: u64) -> Result<()> {
    let free = free_mb(home)?;
    if free < disk_mb.saturating_add(cache_mb).saturating_add(HEADROOM_MB) {
        return Err(refusal(home, disk_mb, cache_mb, free));
    }
    // With the home's reflink pool mounted on its `sandboxes/`, the disk goes into the pool:
    // its own room must hold it too, or the start fails making the sandbox's first file there.
    if let Some(pool) = crate::host::jail_pool::mounted(home) {
        let free = free_mb(&pool)?;
        if free < disk_mb.saturating_add(HEADROOM_MB) {
            return Err(refusal(&pool, disk_mb, 0, free));
        }
    }
    Ok(())
}

fn refusal(home: &Path, disk_mb: u64, cache_mb: u64, free: u64) -> Error {
    let most = free.saturating_sub(HEADROOM_MB).saturating_sub(cache_mb);
    let elsewhere = elsewhere(home);
    let home = home.display().to_string();
    Error::worded(ErrorCode::PolicyDenied, move |s| {
        let fit = if most >= crate::model::spec::DISK_MB_MIN {
            format!("ask for a {} of at most {most}", s.param(Param::DiskMb))
        } else {
            format!(
                "no disk fits ({} is at least {})",
                s.param(Param::DiskMb),
                crate::model::spec::DISK_MB_MIN
            )
        };
        let (asked, cache) = if cache_mb == 0 {
            (
                format!("{} {disk_mb} needs {disk_mb} MB", s.param(Param::DiskMb)),
                String::new(),
            )
        } else {
            (
                format!(
                    "{} {disk_mb} and the project's new package cache of {cache_mb} MB \
                     (DYNOCAP_CACHE_MB) need {} MB",
                    s.param(Param::DiskMb),
                    disk_mb.saturating_add(cache_mb)
                ),
                format!(", start the task without caches ({})", s.flag("no-cache")),
            )
        };
        format!(
            "{asked} set aside on the filesystem holding {home}, which \
             has {free} MB free and keeps {HEADROOM_MB} MB for DynoCap's records and results: \
             {fit}{cache}, free space on that filesystem (destroy sandboxes, or rm --purge finished \
             tasks), or {elsewhere}; DYNOCAP_MAX_DISK_MB caps what any one sandbox may ask for"
        )
    })
}

/// The bytes [`reserve`] sets aside for `bytes` of guest disk laid out as `layout`.
pub fn reserved_bytes(bytes: u64, layout: Layout) -> u64 {
    match layout {
        Layout::Fixed => bytes,
        Layout::Growing => bytes.saturating_add(qcow2_tables(bytes)),
    }
}

/// Refuses (`policy_denied`) `what`, which takes `bytes` more from the filesystem holding
/// `dir`, when that filesystem cannot give them and keep [`HEADROOM_MB`] free; the refusal
/// names what is free, what is asked and what to do.
pub fn check_more(dir: &Path, bytes: u64, what: &str) -> Result<()> {
    let free = free_mb(dir)?;
    let needed = bytes.div_ceil(1 << 20);
    if free >= needed.saturating_add(HEADROOM_MB) {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::PolicyDenied,
        format!(
            "{what} needs {needed} MB more on the filesystem holding {}, which has {free} MB \
             free and keeps {HEADROOM_MB} MB for DynoCap's records and results: free space on \
             that filesystem (delete checkpoints, destroy sandboxes, or rm --purge finished \
             tasks), or {}",
            dir.display(),
            elsewhere(dir)
        ),
    ))
}

/// The last fix a refusal for room in `dir` offers: a home on a filesystem with more room,
/// or, when `dir` is on the home's reflink pool (a filesystem of a fixed size that another
/// home would not change), a larger pool.
fn elsewhere(dir: &Path) -> String {
    crate::host::jail_pool::full_hint(dir)
        .unwrap_or_else(|| "point DYNOCAP_HOME at a filesystem with more room".to_owned())
}

/// Sets aside on the host the room the disk at `image` may fill, `bytes` of guest disk laid
/// out as `layout`. Nothing is written; what is reserved already costs nothing again (a kept
/// layer booted over). A filesystem without room is `policy_denied`, as [`check_room`] says it.
pub fn reserve(image: &Path, bytes: u64, layout: Layout) -> Result<()> {
    reserve_with(image, bytes, layout, |dir, free| {
        refusal(dir, bytes >> 20, 0, free)
    })
}

/// [`reserve`], with the refusal for a filesystem without room made by `refuse` (from the
/// directory holding `image` and the MB free there).
pub fn reserve_with(
    image: &Path,
    bytes: u64,
    layout: Layout,
    refuse: impl FnOnce(&Path, u64) -> Error,
) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .open(image)
        .map_err(|source| DiskRoomFailure::Open {
            image: image.to_owned(),
            source,
        })?;
    let mode = match layout {
        Layout::Fixed => 0,
        Layout::Growing => libc::FALLOC_FL_KEEP_SIZE,
    };
    let length = reserved_bytes(bytes, layout);
    let length = i64::try_from(length)
        .map_err(|_| Error::invalid(format!("a disk of {bytes} bytes is too large")))?;
    // SAFETY: fallocate reads its integer arguments and acts on the open descriptor `file`.
    if unsafe { libc::fallocate(file.as_raw_fd(), mode, 0, length) } == 0 {
        return Ok(());
    }
    let errno = nix::errno::Errno::last();
    let dir = image.parent().unwrap_or(image);
    match errno {
        nix::errno::Errno::ENOSPC | nix::errno::Errno::EDQUOT => {
            let free = free_mb(dir).unwrap_or(0);
            Err(refuse(dir, free))
        }
        nix::errno::Errno::EOPNOTSUPP => Err(DiskRoomFailure::Unsupported {
            image: image.to_owned(),
            source: errno,
        }
        .into()),
        _ => Err(DiskRoomFailure::Reserve {
            mb: bytes >> 20,
            image: image.to_owned(),
            source: errno,
        }
        .into()),
    }
}

/// What failed setting aside host room for a sandbox's disk, other than the room being too
/// little (that is a refusal, `policy_denied`: see [`check_room`]).
#[derive(Debug, thiserror::Error)]
enum DiskRoomFailure {
    #[error("reserving the sandbox's disk: {0}")]
    ReservingThread(#[source] tokio::task::JoinError),
    #[error("reading the free space of the filesystem holding {}: {source}", .dir.display())]
    FreeSpace {
        dir: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("opening the sandbox's disk {}: {source}", .image.display())]
    Open {
        image: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the filesystem holding {} cannot reserve room for a sandbox's disk (fallocate: \
         {source}); keep DYNOCAP_HOME on a filesystem that can (ext4, xfs, btrfs, tmpfs)",
        .image.display()
    )]
    Unsupported {
        image: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("reserving {mb} MB for the sandbox's disk {}: {source}", .image.display())]
    Reserve {
        mb: u64,
        image: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
}

impl Coded for DiskRoomFailure {
    /// The host's filesystem failing (or lacking fallocate) is the operator's to fix.
    fn code(&self) -> ErrorCode {
        match self {
            Self::ReservingThread(_)
            | Self::FreeSpace { .. }
            | Self::Open { .. }
            | Self::Unsupported { .. }
            | Self::Reserve { .. } => ErrorCode::Internal,
        }
    }
}

/// What a qcow2 layer of `bytes` may need beyond its data, with its default 64 KiB clusters:
/// an 8-byte L2 entry and a 2-byte refcount per cluster, their tables, the header. A bound,
/// rounded up generously: one L2 and one refcount block per 64 KiB of entries, plus 1 MiB.
fn qcow2_tables(bytes: u64) -> u64 {
    const CLUSTER: u64 = 64 << 10;
    let clusters = bytes.div_ceil(CLUSTER);
    let entries = clusters.saturating_mul(8 + 2);
    entries
        .div_ceil(CLUSTER)
        .saturating_add(2)
        .saturating_mul(CLUSTER)
        + (1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host failing under a reservation is `internal`; only too little room is a refusal.
    #[test]
    fn host_failures_are_internal_and_name_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing");
        let err = free_mb(&missing).expect_err("no such directory");
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(
            err.message.starts_with(&format!(
                "reading the free space of the filesystem holding {}: ",
                missing.display()
            )),
            "{err}"
        );
        let err = reserve(&missing, 1 << 20, Layout::Fixed).expect_err("no such disk");
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(
            err.message.starts_with(&format!(
                "opening the sandbox's disk {}: ",
                missing.display()
            )),
            "{err}"
        );
    }

    #[test]
    fn a_fixed_disk_is_reserved_whole_and_a_growing_one_past_its_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fixed = dir.path().join("fixed");
        let file = std::fs::File::create(&fixed).expect("create");
        file.set_len(8 << 20).expect("size");
        reserve(&fixed, 8 << 20, Layout::Fixed).expect("reserve");
        let allocated = |p: &Path| {
            std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).expect("stat")) * 512
        };
        assert!(allocated(&fixed) >= 8 << 20, "{}", allocated(&fixed));

        let growing = dir.path().join("growing");
        std::fs::write(&growing, b"header").expect("write");
        reserve(&growing, 8 << 20, Layout::Growing).expect("reserve");
        assert_eq!(
            std::fs::metadata(&growing).expect("stat").len(),
            6,
            "the size stays"
        );
        assert!(allocated(&growing) >= (8 << 20) + qcow2_tables(8 << 20));
    }

    /// What a checkpoint or fork takes beyond a start's disk: refused with the free space
    /// named when the filesystem cannot give it and keep the headroom, allowed when it can.
    #[test]
    fn more_room_is_refused_naming_the_free_space_or_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let free = free_mb(dir.path()).expect("free");
        // Far from the edge either way: other writers share the filesystem.
        let fits = free.saturating_sub(HEADROOM_MB + 1024) << 20;
        check_more(dir.path(), fits, "this checkpoint").expect("room for it");
        let too_much = (free + 1024) << 20;
        let err = check_more(dir.path(), too_much, "this checkpoint").expect_err("no room");
        assert_eq!(err.code, ErrorCode::PolicyDenied);
        let needed = format!("this checkpoint needs {} MB more", free + 1024);
        for needle in [needed.as_str(), "MB free", "rm --purge", "DYNOCAP_HOME"] {
            assert!(
                err.message.contains(needle),
                "{needle:?} not in {}",
                err.message
            );
        }
        assert_eq!(reserved_bytes(8 << 20, Layout::Fixed), 8 << 20);
        assert_eq!(
            reserved_bytes(8 << 20, Layout::Growing),
            (8 << 20) + qcow2_tables(8 << 20)
        );
    }

    #[test]
    fn the_tables_bound_covers_every_cluster() {
        // 1 TiB: 16 Mi clusters, 160 MiB of entries.
        let tables = qcow2_tables(1 << 40);
        assert!(tables >= 160 << 20, "{tables}");
        assert!(tables < 170 << 20, "{tables}");
    }

    #[test]
    fn a_refusal_names_free_asked_and_remedies() {
        let err = refusal(Path::new("/h"), 4096, 0, 1000);
        assert_eq!(err.code, ErrorCode::PolicyDenied);
        for needle in ["4096", "1000 MB free", "at most 936", "DYNOCAP_HOME", "/h"] {
            assert!(
                err.message.contains(needle),
                "{needle:?} not in {}",
                err.message
            );
        }
        let none = refusal(Path::new("/h"), 4096, 0, 100);
        assert!(none.message.contains("no disk fits"), "{}", none.message);
        // A new package cache is counted beside the disk, and the way around it named.
        let cached = refusal(Path::new("/h"), 1024, 2048, 3000);
        for needle in [
            "1024",
            "2048 MB",
            "need 3072 MB",
            "at most 888",
            "DYNOCAP_CACHE_MB",
            "no-cache",
        ] {
            assert!(
                cached.message.contains(needle),
                "{needle:?} not in {}",
                cached.message
            );
        }
    }
}
