//! Live forks of a running guest: saving its memory and devices while it is paused, with its
//! disks as they are in the same pause (the caller's: a frozen layer, see [`crate::layers`]),
//! and a QEMU that loads that saved guest over them and runs it instead of booting one.
//!
//! The save is an internal snapshot of the guest's state alone (QMP `snapshot-save` with only
//! a qcow2 of its own listed, `vmstate` and `devices`), not a migration: a migration ends by
//! handing the source's disks over (inactivating them), which a QEMU chrooted in an empty
//! directory (`-runas`, `-chroot`) cannot do, and QEMU 7.2 has no `file:` URI anyway. The
//! state file reaches QEMU as descriptors (`add-fd`, opened by us: QEMU cannot open a path of
//! ours) and leaves it again once written. The resuming QEMU starts paused (`-S`) with the
//! same devices (machine, accelerator, vCPUs, memory, disks, NIC: it is built from the same
//! kind of [`VmSpec`], only paths, ids and the agent channel differ), loads the state
//! (`snapshot-load`) and runs. Its agent is in the middle of the saved guest's session and
//! speaks only when asked for a new one (the engine's rejoin).

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::{Result, VmError};
use crate::vm::{Vm, VmSpec};

/// The saved guest (a qcow2 holding only its state), in the resuming sandbox's `vm/`
/// directory until its QEMU has loaded it.
pub const STATE_FILE: &str = "live-state.qcow2";
/// In the resuming sandbox's `vm/`: the copy of the saved guest's package cache disk, its
/// own from then on.
pub const CACHE_COPY: &str = "cache-copy.img";
/// The node, job and snapshot names of the save and the load in QEMU.
const NODE: &str = "dynocap-live";
const JOB: &str = "dynocap-live";
const TAG: &str = "live";
/// The drive id of a task's package cache disk (`-drive id=cache`, see [`crate::qemu`]).
const CACHE_DRIVE: &str = "cache";
/// Deadline of each QMP question.
const ASK: Duration = Duration::from_secs(10);
/// How often the save's and the resume's progress is asked after.
const POLL: Duration = Duration::from_millis(10);

/// What a save made.
#[derive(Debug, Clone, Copy)]
pub struct Saved {
    /// The saved memory and devices, in bytes.
    pub state_bytes: u64,
    /// The disk layer's copy, in bytes.
    pub disk_bytes: u64,
    /// How long the guest was paused.
    pub paused: Duration,
}

/// The saved guest's file in the state directory `state_dir` of the sandbox that resumes it.
pub fn state_file(state_dir: &Path) -> std::path::PathBuf {
    crate::vm::VmPaths::at(state_dir).dir.join(STATE_FILE)
}

/// Pauses `vm`, runs `disk` (which gives the saved guest its disks as they are at this
/// instant, returning the bytes that took: see [`cache_image`] too), saves the guest's memory
/// and devices to the new file `state`, then lets it run on (also when the save failed).
/// Blocking. `timeout` bounds the save itself.
pub fn save(
    vm: &mut Vm,
    state: &Path,
    disk: &mut dyn FnMut(&mut Vm) -> Result<u64>,
    timeout: Duration,
) -> Result<Saved> {
    create_state_file(state)?;
    let started = Instant::now();
    vm.qmp().execute("stop", ASK)?;
    // Paused, and QEMU drained and flushed the disk when it stopped the guest: the disk is
    // the one the saved memory knows.
    let mut fdset = None;
    let saved = disk(vm).and_then(|bytes| {
        with_state_node(vm, state, &mut fdset, |vm| {
            run_job(vm, "snapshot-save", timeout)
        })
        .map(|()| bytes)
    });
    let resumed = vm.qmp().execute("cont", ASK);
    let paused = started.elapsed();
    let disk_bytes = saved?;
    resumed?;
    release_state(vm, fdset)?;
    let state_bytes = fs::metadata(state)
        .map_err(|err| VmError::io("reading the size of", state, err))?
        .len();
    Ok(Saved {
        state_bytes,
        disk_bytes,
        paused,
    })
}

/// Has QEMU close the state file's descriptors, now that the guest runs: QEMU closes removed
/// descriptors only then, and the `remove-fd` made while it was paused left them open, and
/// with them the deleted file's room.
fn release_state(vm: &mut Vm, fdset: Option<u64>) -> Result<()> {
    match fdset {
        Some(id) => vm
            .qmp()
            .execute_with("remove-fd", Some(json!({ "fdset-id": id })), ASK)
            .map(drop),
        None => Ok(()),
    }
}

/// The host file of the running guest's package cache disk (`-drive id=cache`), if it has
/// one: what a live fork's guest needs a copy of, taken in the save's pause (its kernel has
/// that filesystem mounted).
pub fn cache_image(vm: &mut Vm) -> Result<Option<std::path::PathBuf>> {
    let blocks = vm.qmp().execute("query-block", ASK)?;
    Ok(blocks.as_array().and_then(|blocks| {
        blocks
            .iter()
            .find(|block| block["device"] == CACHE_DRIVE)
            .and_then(|block| block["inserted"]["file"].as_str())
            .map(std::path::PathBuf::from)
    }))
}

/// Creates `state`, a new empty qcow2 for a guest's state (its virtual size is for disk
/// blocks, which it holds none of; the state goes past them).
fn create_state_file(state: &Path) -> Result<()> {
    if state.exists() {
        return Err(VmError::io(
            "creating",
            state,
            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        ));
    }
    crate::disk::create_qcow2(&[], state, 1 << 20)?;
    fs::set_permissions(state, fs::Permissions::from_mode(0o600))
        .map_err(|err| VmError::io("making private", state, err))
}

/// Runs `work` with the qcow2 `state` attached to QEMU as node [`NODE`] (two descriptors in
/// one fd set, read-write and read-only, as QEMU reopens it), and detaches it after.
fn with_state_node(
    vm: &mut Vm,
    state: &Path,
    fdset_out: &mut Option<u64>,
    work: impl FnOnce(&mut Vm) -> Result<()>,
) -> Result<()> {
    let open = |write: bool| {
        fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(state)
            .map_err(|err| VmError::io("opening", state, err))
    };
    let (rw, ro) = (open(true)?, open(false)?);
    let answer = vm
        .qmp()
        .execute_passing_fd("add-fd", None, rw.as_fd(), ASK)?;
    let fdset = answer
        .get("fdset-id")
        .and_then(Value::as_u64)
        .ok_or_else(|| VmError::Qmp(format!("add-fd answered {answer}")))?;
    *fdset_out = Some(fdset);
    let attached = vm
        .qmp()
        .execute_passing_fd(
            "add-fd",
            Some(json!({ "fdset-id": fdset })),
            ro.as_fd(),
            ASK,
        )
        .and_then(|_| {
            vm.qmp().execute_with(
                "blockdev-add",
                Some(json!({
                    "driver": "qcow2",
                    "node-name": NODE,
                    "file": { "driver": "file", "filename": format!("/dev/fdset/{fdset}") },
                })),
                ASK,
            )
        });
    let worked = attached.and_then(|_| {
        let worked = work(vm);
        let detached =
            vm.qmp()
                .execute_with("blockdev-del", Some(json!({ "node-name": NODE })), ASK);
        worked.and(detached.map(drop))
    });
    let _ = vm
        .qmp()
        .execute_with("remove-fd", Some(json!({ "fdset-id": fdset })), ASK);
    worked
}

/// Runs QMP job `command` (`snapshot-save`, `snapshot-load`) of the state in node [`NODE`]
/// alone, and waits (at most `timeout`) for its end.
fn run_job(vm: &mut Vm, command: &str, timeout: Duration) -> Result<()> {
    vm.qmp().execute_with(
        command,
        Some(json!({ "job-id": JOB, "tag": TAG, "vmstate": NODE, "devices": [NODE] })),
        ASK,
    )?;
    let deadline = Instant::now() + timeout;
    loop {
        let jobs = vm.qmp().execute("query-jobs", ASK)?;
        let job = jobs
            .as_array()
            .and_then(|jobs| jobs.iter().find(|job| job["id"] == JOB))
            .cloned()
            .unwrap_or(Value::Null);
        if job["status"] == "concluded" {
            let _ = vm
                .qmp()
                .execute_with("job-dismiss", Some(json!({ "id": JOB })), ASK);
            return match job.get("error").and_then(Value::as_str) {
                None => Ok(()),
                Some(why) => Err(VmError::Qmp(format!(
                    "{command}: {why}\n{}",
                    crate::vm::tail(vm.paths())
                ))),
            };
        }
        if Instant::now() > deadline {
            let _ = vm
                .qmp()
                .execute_with("job-cancel", Some(json!({ "id": JOB })), ASK);
            return Err(VmError::Qmp(format!(
                "{command} did not end within {} s",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(POLL);
    }
}

/// Starts the guest saved in `state` over the disk layer `spec` keeps ([`VmSpec::reuse_disk`]
/// must be set): returns once it runs. The file is removed then: the guest's memory goes its
/// own way from here, and a later boot over the disk is a recovery's. `timeout` bounds the
/// load.
pub fn resume(spec: &VmSpec, state: &Path, timeout: Duration) -> Result<Vm> {
    let mut vm = Vm::boot_with(spec, true)?;
    let mut fdset = None;
    let loaded = with_state_node(&mut vm, state, &mut fdset, |vm| {
        run_job(vm, "snapshot-load", timeout)
    })
    .and_then(|()| vm.qmp().execute("cont", ASK).map(drop))
    .and_then(|()| release_state(&mut vm, fdset));
    if let Err(err) = loaded {
        let _ = vm.kill();
        vm.join_console();
        return Err(VmError::Boot {
            reason: format!("loading the saved guest failed: {err}"),
            tail: crate::vm::tail(vm.paths()),
        });
    }
    let _ = fs::remove_file(state);
    Ok(vm)
}
