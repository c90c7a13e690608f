//! A guest's disk as a chain of qcow2 layers, and the one operation that grows it: freezing
//! the running guest's writable layer ([`snapshot_layer`]). What checkpoints and forks of a
//! vm are made of.
//!
//! The disk QEMU writes is always `<state>/vm/disk.qcow2` ([`VmPaths::disk`]). A freeze turns
//! it into `frozen-<id>.qcow2` beside it — read-only (0444) from then on, never written by
//! any guest — and the guest continues, without a pause it could notice, on a new empty
//! `disk.qcow2` whose backing file is that frozen layer. The bottom frozen layer's backing
//! file is the read-only ext4 base in the backend's cache ([`crate::disk`]). Every backing
//! name of a frozen layer or of `disk.qcow2` is a bare file name, resolved (by QEMU and
//! here) in the file's own directory: a chain is a set of files in one directory, and
//! putting hard links of them in another directory (a checkpoint's, a fork's `vm/`) makes
//! the same chain there. A hard link is a reference count the filesystem keeps: a layer lives
//! as long as one checkpoint or task still links it, whoever made it, and goes with the last
//! (`rm --purge`).
//!
//! The freeze costs the same whatever the guest wrote: `qemu-img create` of the empty layer
//! (it names a backing file that does not exist yet, so nothing is opened), the empty
//! layer's descriptors handed to QEMU (QMP `add-fd`: QEMU runs chrooted in an empty
//! directory and cannot open a path of ours), `blockdev-add` of it and `blockdev-snapshot`,
//! which drains the guest's writes in flight into the old layer, flushes it to the host's disk
//! and switches the guest to the new one atomically, then a link and a rename. The old layer
//! keeps a name of its own (`frozen-<id>.qcow2`, linked before the switch) and the new one
//! becomes `disk.qcow2` by a rename after it: a supervisor killed at any step leaves
//! `disk.qcow2` a whole chain (at worst the old layer, without the writes of the instant
//! between the switch and the rename, which a guest killed with its supervisor had not synced)
//! and stray files that [`sweep`] removes.
//!
//! Who sets room aside for a writable layer. A task started fresh has its disk's whole room
//! reserved on the host for its writable layer, and again for each new one a freeze or a
//! restore puts under its guest (see the engine's `disk_room`): its writes never meet a full
//! host. A fork's layers reserve nothing, as a jail fork's reflinked clone does: the fork's
//! directory is marked [`UNRESERVED`] ([`mark_unreserved`]) when it is made, from a checkpoint,
//! from the task as it is, or live, and keeps the mark for its life (its own checkpoints,
//! restores, recoveries, and its own forks). So ten forks take on the host what they write,
//! not ten disks; and once the host's filesystem is full, a fork's write meets ENOSPC there.
//! QEMU then reports the error to the guest (the drive's `werror=report`, see
//! [`crate::qemu`]), whose write or `fsync` fails (and whose ext4 turns read-only once the
//! error reaches its metadata): never a write acknowledged and lost, and never QEMU's
//! default, a guest paused without a word.
//!
//! A chain deeper than [`MAX_FROZEN`] frozen layers is flattened in the background: QMP
//! `block-stream` copies what the layers between the bottom frozen layer and the writable one
//! hold into the writable one, which then names the bottom layer as its backing file. Only the
//! writable layer is written; the frozen ones stay as they are for the checkpoints and forks
//! that use them, and [`sweep`] unlinks those the task's own chain no longer names.

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::error::{Result, VmError};
use crate::qmp::Qmp;
use crate::vm::VmPaths;

/// What a frozen layer's file name starts with.
pub const FROZEN_PREFIX: &str = "frozen-";
const SUFFIX: &str = ".qcow2";
/// The empty layer a freeze makes, before it becomes `disk.qcow2`.
const NEXT: &str = "disk.qcow2.next";
/// The directory of a task's checkpoints in its state directory, whose `<label>/` each hold
/// a chain's links: what [`layer_files`] looks in besides `vm/`.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// In a guest's layer directory: its writable layers set nothing aside on the host (a
/// fork's, see the module doc). Empty; its presence is the mark.
pub const UNRESERVED: &str = "unreserved";
/// Frozen layers a chain may have under its writable one before it is flattened.
pub const MAX_FROZEN: usize = 4;
/// A chain longer than this is not one of ours (a loop of names, a damaged header).
const MAX_DEPTH: usize = 256;
/// How long QEMU may take for one QMP command of a freeze.
const QMP_TIMEOUT: Duration = Duration::from_secs(30);
/// The block job that flattens a chain.
const FLATTEN_JOB: &str = "flatten";
/// The drive's id on QEMU's command line (`-drive id=root`): the guest's disk, whatever its
/// top layer.
const ROOT: &str = "root";

/// A layer [`snapshot_layer`] froze.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenLayer {
    /// Its file name (`frozen-<id>.qcow2`), in the directory of the disk it was frozen from.
    pub name: String,
    /// The bytes it holds on the host's disk.
    pub bytes: u64,
    /// The new layer's read-write descriptor in QEMU's fd set, dropped while the guest was
    /// paused (a live fork's save): QEMU closes a dropped descriptor only while the guest
    /// runs, and until then it keeps the write lock that, once the new layer is frozen in
    /// turn, keeps every other QEMU from opening it. [`release_dropped`] closes it once the
    /// guest runs again.
    pub dropped_while_paused: Option<DroppedFd>,
}

/// A descriptor QEMU was told to drop from an fd set while it could not close it yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DroppedFd {
    fdset: u64,
    fd: u64,
}

/// Has QEMU close `dropped` now that its guest runs (asking to drop it again makes QEMU look
/// at the set once more, and close what was dropped).
pub fn release_dropped(qmp: &mut Qmp, dropped: DroppedFd) -> Result<()> {
    qmp.execute_with(
        "remove-fd",
        Some(json!({ "fdset-id": dropped.fdset, "fd": dropped.fd })),
        QMP_TIMEOUT,
    )
    .map(drop)
}

/// Marks the guest's layer directory `dir` [`UNRESERVED`], durably: a fork's, from the moment
/// it is made.
pub fn mark_unreserved(dir: &Path) -> Result<()> {
    let mark = dir.join(UNRESERVED);
    fs::File::create(&mark)
        .and_then(|file| file.sync_all())
        .map_err(|err| VmError::io("marking the disk's layers unreserved at", &mark, err))?;
    sync_dir(dir);
    Ok(())
}

/// Whether the guest's layer directory `dir` is [`UNRESERVED`] (see [`mark_unreserved`]).
pub fn is_unreserved(dir: &Path) -> bool {
    dir.join(UNRESERVED).exists()
}

/// Whether `name` is a frozen layer's file name.
pub fn is_frozen_name(name: &str) -> bool {
    name.starts_with(FROZEN_PREFIX)
        && name.ends_with(SUFFIX)
        && name.len() > FROZEN_PREFIX.len() + SUFFIX.len()
        && !name.contains('/')
}

/// Freezes the writable layer of the running guest whose QEMU `qmp` talks to and whose files
/// are `paths`: see the module doc. Returns the frozen layer, in `paths.dir`. On an error
/// before the switch the guest goes on on its layer as before and nothing new is left.
///
/// The guest's own page cache is not QEMU's to flush: a caller that wants what the guest's
/// programs wrote in the frozen layer has the guest sync first (the agent's `Sync`).
pub fn snapshot_layer(qmp: &mut Qmp, paths: &VmPaths) -> Result<FrozenLayer> {
    sweep(&paths.dir);
    // A flatten in progress holds the chain: it is stopped (what it copied stays in the
    // writable layer, which is fine) and starts again after the freeze if still needed.
    cancel_flatten(qmp)?;
    let bytes = virtual_size(&paths.disk)?;
    let id = new_id();
    let name = format!("{FROZEN_PREFIX}{id}{SUFFIX}");
    let frozen = paths.dir.join(&name);
    let next = paths.dir.join(NEXT);
    create_over(&name, &next, bytes)?;
    let undo = |qmp: &mut Qmp, fdset: Option<u64>, node: bool| {
        if node {
            let _ = qmp.execute_with(
                "blockdev-del",
                Some(json!({ "node-name": node_name(&id) })),
                QMP_TIMEOUT,
            );
        }
        if let Some(fdset) = fdset {
            let _ = qmp.execute_with("remove-fd", Some(json!({ "fdset-id": fdset })), QMP_TIMEOUT);
        }
        let _ = fs::remove_file(&next);
        let _ = fs::remove_file(&frozen);
    };
    // The old layer's second name, before the switch: from the switch on, a killed supervisor
    // leaves `disk.qcow2` naming a backing file that exists.
    if let Err(err) = fs::hard_link(&paths.disk, &frozen) {
        undo(qmp, None, false);
        return Err(VmError::io("linking the layer to freeze as", &frozen, err));
    }
    let fdset = match hand_over(qmp, &next) {
        Ok(fdset) => fdset,
        Err(err) => {
            undo(qmp, None, false);
            return Err(err);
        }
    };
    let added = qmp.execute_with(
        "blockdev-add",
        Some(json!({
            "driver": "qcow2",
            "node-name": node_name(&id),
            "discard": "ignore",
            "file": { "driver": "file", "filename": format!("/dev/fdset/{}", fdset.id) },
            "backing": null,
        })),
        QMP_TIMEOUT,
    );
    if let Err(err) = added {
        undo(qmp, Some(fdset.id), false);
        return Err(err);
    }
    // QEMU has its own copy of the read-write descriptor now. The set's copy goes: it shares
    // the open file, and with it the file's locks, which would outlive the reopen read-only
    // once the layer is frozen and keep a fork's QEMU from opening it.
    if let Err(err) = qmp.execute_with(
        "remove-fd",
        Some(json!({ "fdset-id": fdset.id, "fd": fdset.rw_fd })),
        QMP_TIMEOUT,
    ) {
        undo(qmp, Some(fdset.id), true);
        return Err(err);
    }
    let visible = ChrootLink::make(paths);
    let switched = qmp.execute_with(
        "blockdev-snapshot",
        Some(json!({ "node": ROOT, "overlay": node_name(&id) })),
        QMP_TIMEOUT,
    );
    drop(visible);
    if let Err(err) = switched {
        undo(qmp, Some(fdset.id), true);
        return Err(err);
    }
    // The guest writes to the new layer from here: it takes the disk's name.
    fs::rename(&next, &paths.disk)
        .map_err(|err| VmError::io("putting the new layer in place at", &paths.disk, err))?;
    sync_dir(&paths.dir);
    let bytes = seal(&frozen)?;
    if let Err(err) = flatten_if_deep(qmp, &paths.dir) {
        tracing::warn!("not flattening the disk's layers: {err}");
    }
    let running = qmp
        .execute("query-status", QMP_TIMEOUT)
        .ok()
        .and_then(|status| status.get("running").and_then(Value::as_bool));
    let dropped_while_paused = (running != Some(true)).then_some(DroppedFd {
        fdset: fdset.id,
        fd: fdset.rw_fd,
    });
    Ok(FrozenLayer {
        name,
        bytes,
        dropped_while_paused,
    })
}

/// The layer QEMU switches away from is reopened read-only, by the path it was opened by: a
/// layer added by a freeze through its fd set (which holds a read-only descriptor for this),
/// the one QEMU started with by its path on the host, which a QEMU chrooted into
/// [`VmPaths::empty`] (started as root) cannot see. Left read-write, it would keep the lock
/// that keeps every other QEMU (a fork's) from opening it. So for the switch that layer is
/// linked at its host path inside the chroot; the link and the directories made for it go
/// when this is dropped (and [`sweep`] removes what a killed supervisor left).
struct ChrootLink {
    link: PathBuf,
    made: Vec<PathBuf>,
}

impl ChrootLink {
    fn make(paths: &VmPaths) -> Option<ChrootLink> {
        if !paths.empty.is_dir() {
            return None;
        }
        let inside = paths.disk.strip_prefix("/").ok()?;
        let mut made = Vec::new();
        let mut dir = paths.empty.clone();
        for part in inside.parent()?.components() {
            dir.push(part);
            match fs::create_dir(&dir) {
                Ok(()) => made.push(dir.clone()),
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(err) => {
                    tracing::warn!(
                        "making {} for QEMU to reopen its layer: {err}",
                        dir.display()
                    );
                    break;
                }
            }
        }
        let mut visible = ChrootLink {
            link: paths.empty.join(inside),
            made,
        };
        if let Err(err) = fs::hard_link(&paths.disk, &visible.link) {
            tracing::warn!(
                "linking {} for QEMU to reopen it read-only: {err}",
                paths.disk.display()
            );
            visible.link = PathBuf::new();
        }
        Some(visible)
    }
}

impl Drop for ChrootLink {
    fn drop(&mut self) {
        if !self.link.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.link);
        }
        for dir in self.made.iter().rev() {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// Makes the frozen layer `path` what every later user may rely on: its preallocated room
/// past its end (the running guest's reservation, see the engine's `disk_room`; none for an
/// [`UNRESERVED`] layer) given back, and read-only. Returns the bytes it holds.
fn seal(path: &Path) -> Result<u64> {
    let file = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|err| VmError::io("opening the frozen layer", path, err))?;
    let len = file
        .metadata()
        .map_err(|err| VmError::io("reading the frozen layer", path, err))?
        .len();
    // Truncating to its own length drops the blocks allocated past the end (ext4 trims
    // preallocations on every truncate); the data stays.
    file.set_len(len)
        .map_err(|err| VmError::io("trimming the frozen layer", path, err))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o444))
        .map_err(|err| VmError::io("making read-only", path, err))?;
    allocated_bytes(path)
}

/// Hands QEMU two descriptors of the new layer `path`, read-write for the guest's writes and
/// read-only for QEMU to reopen it with once it is frozen in turn, in one fd set.
fn hand_over(qmp: &mut Qmp, path: &Path) -> Result<FdSet> {
    let open = |write: bool| {
        fs::OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|err| VmError::io("opening the new layer", path, err))
    };
    let (rw, ro) = (open(true)?, open(false)?);
    let answer =
        qmp.execute_passing_fd("add-fd", None, std::os::fd::AsFd::as_fd(&rw), QMP_TIMEOUT)?;
    let (Some(fdset), Some(rw_fd)) = (
        answer.get("fdset-id").and_then(Value::as_u64),
        answer.get("fd").and_then(Value::as_u64),
    ) else {
        return Err(VmError::Qmp(format!("add-fd answered {answer}")));
    };
    let second = qmp.execute_passing_fd(
        "add-fd",
        Some(json!({ "fdset-id": fdset })),
        std::os::fd::AsFd::as_fd(&ro),
        QMP_TIMEOUT,
    );
    if let Err(err) = second {
        let _ = qmp.execute_with("remove-fd", Some(json!({ "fdset-id": fdset })), QMP_TIMEOUT);
        return Err(err);
    }
    Ok(FdSet { id: fdset, rw_fd })
}

/// The fd set [`hand_over`] made.
#[derive(Debug, Clone, Copy)]
struct FdSet {
    id: u64,
    /// QEMU's number for the read-write descriptor in it.
    rw_fd: u64,
}

/// The node name of the layer with id `id` in QEMU (a node name starts with a letter).
fn node_name(id: &str) -> String {
    format!("L{id}")
}

/// A new layer id: unique on this machine (time, process and a counter, hashed), so that
/// layers of different tasks linked into one directory never share a name.
fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let mut key = crate::cache::Key::new("dynocap-layer-id");
    key.add(&now.as_nanos().to_le_bytes())
        .add(&std::process::id().to_le_bytes())
        .add(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    key.hex()[..20].to_owned()
}

/// Creates `dest`, an empty qcow2 layer of `bytes` whose backing file is `backing`, a bare
/// file name in `dest`'s directory (which need not exist yet: nothing is opened).
fn create_over(backing: &str, dest: &Path, bytes: u64) -> Result<()> {
    let _ = fs::remove_file(dest);
    let options = ["-u", "-F", "qcow2", "-b", backing].map(std::ffi::OsStr::new);
    crate::disk::create_qcow2(&options, dest, bytes)
}

/// Creates `dest` (a new file, replacing what is there) as an empty layer over the frozen
/// layer `top` of `dir`, the same virtual size: what a restored task or a fork boots on.
/// `dest` is in `dir` for QEMU to find `top`.
pub fn new_layer_over(dir: &Path, top: &str, dest: &Path) -> Result<()> {
    if !is_frozen_name(top) {
        return Err(VmError::InvalidSpec(format!(
            "{top:?} is not a frozen layer"
        )));
    }
    let bytes = virtual_size(&dir.join(top))?;
    create_over(top, dest, bytes)
}

/// Puts a new empty layer over the frozen layer `top` of `dir` in the disk's place
/// (`dir/disk.qcow2`, replaced by a rename: the old disk or the new, never half of one), then
/// sweeps the frozen layers only the old disk's chain named. For a guest that is not running
/// (a restore).
pub fn replace_disk_over(dir: &Path, top: &str) -> Result<()> {
    let next = dir.join(NEXT);
    new_layer_over(dir, top, &next)?;
    let disk = dir.join("disk.qcow2");
    fs::rename(&next, &disk)
        .map_err(|err| VmError::io("putting the new layer in place at", &disk, err))?;
    sync_dir(dir);
    sweep(dir);
    Ok(())
}

/// The frozen layers below the qcow2 file `path`, nearest first: the bare backing names
/// in its directory, down to the one whose backing file is not a frozen layer (the base).
pub fn frozen_chain(path: &Path) -> Result<Vec<String>> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut chain = Vec::new();
    let mut current = path.to_path_buf();
    loop {
        let header = Header::read(&current)?;
        let Some(name) = header.backing.filter(|name| is_frozen_name(name)) else {
            return Ok(chain);
        };
        if chain.len() >= MAX_DEPTH || chain.contains(&name) {
            return Err(VmError::InvalidSpec(format!(
                "the layers below {} do not end",
                path.display()
            )));
        }
        current = dir.join(&name);
        chain.push(name);
    }
}

/// Links the frozen layer `top` of `from` and the chain below it into `to` (a directory),
/// under the same names: the same chain there. A name `to` has already is the same layer
/// (ids are unique) and is kept.
pub fn link_chain(from: &Path, top: &str, to: &Path) -> Result<()> {
    let mut names = vec![top.to_owned()];
    names.extend(frozen_chain(&from.join(top))?);
    for name in names {
        let target = to.join(&name);
        match fs::hard_link(from.join(&name), &target) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(VmError::io("linking a frozen layer as", &target, err)),
        }
    }
    sync_dir(to);
    Ok(())
}

/// Removes from a guest's layer directory `dir` what a freeze killed half-way left (the new
/// layer not yet in place, a link to the writable layer under a frozen name) and the frozen
/// layers its disk's chain no longer names (after a flatten or a restore): others' links to
/// them keep them for their checkpoints and forks. Nothing when `dir` has no disk.
pub fn sweep(dir: &Path) {
    let disk = dir.join("disk.qcow2");
    let Ok(chain) = frozen_chain(&disk) else {
        return;
    };
    let _ = fs::remove_file(dir.join(NEXT));
    // A `ChrootLink` a killed supervisor left: QEMU's root holds nothing else.
    for entry in fs::read_dir(dir.join("empty"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = fs::remove_dir_all(entry.path());
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_frozen_name(&name) && !chain.contains(&name) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Every qcow2 file of the sandbox whose state directory is `state_dir`: its disk, its frozen
/// layers and its checkpoints' (what names a base disk the cache must keep).
pub fn layer_files(state_dir: &Path) -> Vec<PathBuf> {
    let vm = VmPaths::at(state_dir);
    let mut files = vec![vm.disk.clone()];
    let mut dirs = vec![vm.dir];
    if let Ok(entries) = fs::read_dir(state_dir.join(CHECKPOINTS_DIR)) {
        dirs.extend(entries.flatten().map(|entry| entry.path()));
    }
    for dir in dirs {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            if is_frozen_name(&entry.file_name().to_string_lossy()) {
                files.push(entry.path());
            }
        }
    }
    files
}

/// The bytes a file holds on the host's disk (its allocated blocks).
pub fn allocated_bytes(path: &Path) -> Result<u64> {
    fs::metadata(path)
        .map(|meta| meta.blocks() * 512)
        .map_err(|err| VmError::io("reading", path, err))
}

/// What a chain needs of a qcow2 header (all big-endian: magic `QFI\xfb`, version, the
/// backing file name's offset (u64) and length (u32), cluster bits, then the virtual size).
struct Header {
    backing: Option<String>,
    size: u64,
}

impl Header {
    fn read(path: &Path) -> Result<Header> {
        let bad = |what: &str| {
            VmError::InvalidSpec(format!("{} is not a qcow2 layer: {what}", path.display()))
        };
        let mut file =
            fs::File::open(path).map_err(|err| VmError::io("opening the layer", path, err))?;
        let mut header = [0u8; 32];
        file.read_exact(&mut header)
            .map_err(|err| VmError::io("reading the layer", path, err))?;
        if header[..4] != *b"QFI\xfb" {
            return Err(bad("no qcow2 magic"));
        }
        let field = |range: std::ops::Range<usize>| {
            header[range]
                .iter()
                .fold(0u64, |n, byte| (n << 8) | u64::from(*byte))
        };
        let (offset, length, size) = (field(8..16), field(16..20), field(24..32));
        // qcow2 caps the name at 1023 bytes.
        if offset == 0 || length == 0 {
            return Ok(Header {
                backing: None,
                size,
            });
        }
        if length > 1023 {
            return Err(bad("a backing name over 1023 bytes"));
        }
        let mut name = vec![0u8; usize::try_from(length).unwrap_or(0)];
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(&mut name))
            .map_err(|err| VmError::io("reading the layer's backing name", path, err))?;
        Ok(Header {
            backing: Some(String::from_utf8_lossy(&name).into_owned()),
            size,
        })
    }
}

fn virtual_size(path: &Path) -> Result<u64> {
    Header::read(path).map(|header| header.size)
}

fn sync_dir(dir: &Path) {
    if let Ok(handle) = fs::File::open(dir) {
        let _ = handle.sync_all();
    }
}

/// Stops a flatten running on the guest's disk, and waits until QEMU has let go of it.
fn cancel_flatten(qmp: &mut Qmp) -> Result<()> {
    let running = |qmp: &mut Qmp| -> Result<bool> {
        let jobs = qmp.execute("query-block-jobs", QMP_TIMEOUT)?;
        Ok(jobs
            .as_array()
            .is_some_and(|jobs| jobs.iter().any(|job| job["device"] == FLATTEN_JOB)))
    };
    if !running(qmp)? {
        return Ok(());
    }
    // It may end by itself meanwhile: the answer then does not matter.
    let _ = qmp.execute_with(
        "block-job-cancel",
        Some(json!({ "device": FLATTEN_JOB })),
        QMP_TIMEOUT,
    );
    let deadline = Instant::now() + QMP_TIMEOUT;
    while running(qmp)? {
        if Instant::now() > deadline {
            return Err(VmError::Qmp(
                "the flatten of the disk's layers did not stop".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Starts flattening the disk of `dir` in QEMU when its chain has more than [`MAX_FROZEN`]
/// frozen layers (see the module doc). Returns at once; the job runs in QEMU.
fn flatten_if_deep(qmp: &mut Qmp, dir: &Path) -> Result<()> {
    let chain = frozen_chain(&dir.join("disk.qcow2"))?;
    if chain.len() <= MAX_FROZEN {
        return Ok(());
    }
    let Some(bottom) = chain.last() else {
        return Ok(());
    };
    // The bottom frozen layer's node: the one layer of the chain whose backing file is the
    // base's name, which is what the bottom's header holds.
    let base_name = Header::read(&dir.join(bottom))?.backing;
    let nodes = qmp.execute_with(
        "query-named-block-nodes",
        Some(json!({ "flat": true })),
        QMP_TIMEOUT,
    )?;
    let node = nodes.as_array().and_then(|nodes| {
        nodes
            .iter()
            .filter(|node| node["drv"] == "qcow2")
            .find(|node| node["backing_file"].as_str() == base_name.as_deref())
            .and_then(|node| node["node-name"].as_str().map(str::to_owned))
    });
    let Some(node) = node else {
        return Err(VmError::Qmp(format!(
            "no node of the disk's bottom layer {bottom} in QEMU"
        )));
    };
    qmp.execute_with(
        "block-stream",
        Some(json!({
            "job-id": FLATTEN_JOB,
            "device": ROOT,
            "base-node": node,
            "backing-file": bottom,
        })),
        QMP_TIMEOUT,
    )?;
    tracing::info!(
        "flattening the disk's {} frozen layers onto {bottom}",
        chain.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn have_qemu_img() -> bool {
        Command::new("qemu-img").arg("--version").output().is_ok()
    }

    #[test]
    fn frozen_names_are_bare_and_ours() {
        assert!(is_frozen_name("frozen-abc.qcow2"));
        for bad in [
            "frozen-.qcow2",
            "disk.qcow2",
            "frozen-a/b.qcow2",
            "/x/frozen-a.qcow2",
            "frozen-a.img",
        ] {
            assert!(!is_frozen_name(bad), "{bad}");
        }
        assert_ne!(new_id(), new_id());
    }

    /// A chain of empty layers made as freezes make them: each names the one below by its
    /// bare name; links elsewhere are the same chain; a sweep keeps what the disk's chain
    /// names and removes the rest.
    #[test]
    fn chains_link_elsewhere_and_sweeps_keep_only_the_disks() {
        if !have_qemu_img() {
            eprintln!("SKIPPED: no qemu-img (apt-get install qemu-utils)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        fs::create_dir_all(&dir).unwrap();
        let base = tmp.path().join("base.ext4");
        fs::File::create(&base).unwrap().set_len(64 << 20).unwrap();
        let made = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&base)
            .arg(dir.join("frozen-1.qcow2"))
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        new_layer_over(&dir, "frozen-1.qcow2", &dir.join("frozen-2.qcow2")).unwrap();
        new_layer_over(&dir, "frozen-2.qcow2", &dir.join("disk.qcow2")).unwrap();
        fs::write(dir.join("frozen-stray.qcow2"), b"x").unwrap();
        fs::write(dir.join(NEXT), b"x").unwrap();
        assert_eq!(
            frozen_chain(&dir.join("disk.qcow2")).unwrap(),
            ["frozen-2.qcow2", "frozen-1.qcow2"]
        );
        assert_eq!(virtual_size(&dir.join("disk.qcow2")).unwrap(), 64 << 20);
        sweep(&dir);
        assert!(!dir.join("frozen-stray.qcow2").exists());
        assert!(!dir.join(NEXT).exists());
        assert!(dir.join("frozen-1.qcow2").exists());

        let other = tmp.path().join("b");
        fs::create_dir_all(&other).unwrap();
        link_chain(&dir, "frozen-2.qcow2", &other).unwrap();
        link_chain(&dir, "frozen-2.qcow2", &other).unwrap();
        new_layer_over(&other, "frozen-2.qcow2", &other.join("disk.qcow2")).unwrap();
        // QEMU reads the chain the same way.
        let info = Command::new("qemu-img")
            .args(["info", "--backing-chain", "--output=json", "-U"])
            .arg(other.join("disk.qcow2"))
            .output()
            .unwrap();
        assert!(info.status.success(), "{info:?}");
        let info: Value = serde_json::from_slice(&info.stdout).unwrap();
        assert_eq!(info.as_array().unwrap().len(), 4, "{info}");
        // The first directory going leaves the second's chain whole.
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            frozen_chain(&other.join("disk.qcow2")).unwrap(),
            ["frozen-2.qcow2", "frozen-1.qcow2"]
        );
        assert!(new_layer_over(&other, "disk.qcow2", &other.join("x")).is_err());
    }

    /// A QEMU with the disk as its guest's `root` drive (a microvm with nothing to boot), its
    /// QMP on a socket:
    /// what a freeze talks to. The test writes to the disk with HMP's `qemu-io`, as a guest
    /// would through its virtio disk.
    struct Qemu {
        child: std::process::Child,
        qmp: Qmp,
    }

    impl Qemu {
        fn start(paths: &VmPaths) -> Option<Qemu> {
            if Command::new(crate::qemu::QEMU)
                .arg("--version")
                .output()
                .is_err()
            {
                eprintln!("SKIPPED: no {}", crate::qemu::QEMU);
                return None;
            }
            let socket = paths.dir.join("qmp.sock");
            let mut drive = std::ffi::OsString::from("if=none,id=root,format=qcow2,file=");
            drive.push(&paths.disk);
            let mut command = Command::new(crate::qemu::QEMU);
            command
                .args(["-M", "microvm", "-m", "64", "-accel", "tcg"])
                .args(["-nodefaults", "-display", "none", "-drive"])
                .arg(drive)
                // The guest's disk takes the write permission (and lock) a device's does, and
                // the machine runs (QEMU closes a removed fd only then).
                .args(["-device", "virtio-blk-device,drive=root"]);
            if nix::unistd::geteuid().is_root() {
                // As the supervisor runs it: unprivileged, chrooted into an empty directory.
                let confine =
                    crate::qemu::Confinement::in_empty_dir(&paths.empty, 65534, 65534).unwrap();
                command.args(crate::qemu::confinement_args(false, Some(&confine)));
            }
            let child = command
                .arg("-qmp")
                .arg(format!("unix:{},server=on,wait=off", socket.display()))
                .stdout(std::process::Stdio::null())
                .stderr(fs::File::create(paths.dir.join("qemu.log")).unwrap())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut child = child;
            let stream = loop {
                if let Ok(stream) = std::os::unix::net::UnixStream::connect(&socket) {
                    break stream;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    panic!(
                        "QEMU exited ({status}): {}",
                        fs::read_to_string(paths.dir.join("qemu.log")).unwrap_or_default()
                    );
                }
                assert!(Instant::now() < deadline, "QEMU's QMP socket never came");
                std::thread::sleep(Duration::from_millis(20));
            };
            Some(Qemu {
                child,
                qmp: Qmp::new(stream).unwrap(),
            })
        }

        fn io(&mut self, command: &str) {
            let out = self
                .qmp
                .execute_with(
                    "human-monitor-command",
                    Some(json!({ "command-line": format!("qemu-io root \"{command}\"") })),
                    QMP_TIMEOUT,
                )
                .unwrap();
            let out = out.as_str().unwrap_or_default();
            assert!(
                !out.contains("fail") && !out.contains("error"),
                "{command}: {out}"
            );
        }
    }

    impl Drop for Qemu {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// `qemu-io` of `command` on `path` read-only, sharing it with a running QEMU.
    fn read_back(path: &Path, command: &str) -> String {
        let out = Command::new("qemu-io")
            .args(["-r", "-U", "-f", "qcow2", "-c", command])
            .arg(path)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// Freezes of a running QEMU's disk: each frozen layer holds what was written before it
    /// and nothing after, is read-only and never changes again; the disk's chain reads the
    /// latest writes; past [`MAX_FROZEN`] layers the chain is flattened onto its bottom layer
    /// while the frozen layers stay as they were; a sweep then unlinks what the disk no longer
    /// names.
    #[test]
    fn freezes_of_a_running_disk_keep_each_instant_and_flatten_deep_chains() {
        if !have_qemu_img() {
            eprintln!("SKIPPED: no qemu-img (apt-get install qemu-utils)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let paths = VmPaths::at(&tmp.path().join("state"));
        fs::create_dir_all(&paths.dir).unwrap();
        let base = tmp.path().join("base.raw");
        fs::File::create(&base).unwrap().set_len(64 << 20).unwrap();
        let made = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&base)
            .arg(&paths.disk)
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        let Some(mut qemu) = Qemu::start(&paths) else {
            return;
        };
        let mut frozen = Vec::new();
        for round in 1..=MAX_FROZEN + 1 {
            // Each round overwrites the first MiB and writes a MiB of its own further on.
            qemu.io(&format!("write -P {round} 0 1M"));
            qemu.io(&format!("write -P {round} {round}M 1M"));
            let layer = snapshot_layer(&mut qemu.qmp, &paths).unwrap();
            assert!(layer.bytes >= 1 << 20, "{layer:?}");
            let path = paths.dir.join(&layer.name);
            assert_eq!(
                fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o444
            );
            frozen.push((round, layer.name, fs::read(&path).unwrap()));
        }
        // Written after the last freeze: only in the disk.
        qemu.io("write -P 99 0 1M");
        for (round, name, bytes) in &frozen {
            let path = paths.dir.join(name);
            let first = read_back(&path, &format!("read -P {round} 0 1M"));
            assert!(!first.contains("fail"), "{name}: {first}");
            let own = read_back(&path, &format!("read -P {round} {round}M 1M"));
            assert!(!own.contains("fail"), "{name}: {own}");
            assert_eq!(&fs::read(&path).unwrap(), bytes, "{name} was written");
        }
        // A fork's QEMU opens the whole chain under a layer of its own: no layer of it may
        // still be locked for writing by the running one.
        let fork = VmPaths::at(&tmp.path().join("fork"));
        fs::create_dir_all(&fork.dir).unwrap();
        let top = &frozen[frozen.len() - 1].1;
        link_chain(&paths.dir, top, &fork.dir).unwrap();
        new_layer_over(&fork.dir, top, &fork.disk).unwrap();
        let mut forked = Qemu::start(&fork).unwrap();
        for (round, _, _) in &frozen {
            forked.io(&format!("read -P {round} {round}M 1M"));
        }
        drop(forked);
        let deep = frozen.len();
        let deadline = Instant::now() + Duration::from_secs(60);
        while frozen_chain(&paths.disk).unwrap().len() == deep {
            assert!(Instant::now() < deadline, "the chain was never flattened");
            std::thread::sleep(Duration::from_millis(50));
        }
        let chain = frozen_chain(&paths.disk).unwrap();
        assert_eq!(
            chain,
            [frozen[0].1.clone()],
            "flattened onto the bottom layer"
        );
        for (round, name, bytes) in &frozen {
            assert_eq!(
                &fs::read(paths.dir.join(name)).unwrap(),
                bytes,
                "{name} (round {round})"
            );
        }
        // The disk reads every round's own MiB and the last write, as before the flatten.
        qemu.io("read -P 99 0 1M");
        for (round, _, _) in &frozen {
            qemu.io(&format!("read -P {round} {round}M 1M"));
        }
        sweep(&paths.dir);
        let left: Vec<String> = fs::read_dir(&paths.dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| is_frozen_name(name))
            .collect();
        assert_eq!(left, [frozen[0].1.clone()]);
    }
}
