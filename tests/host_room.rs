//! Host admission control through the CLI: a sandbox's disk reserves its size on the home's
//! filesystem when it starts, a start the free space cannot back is `policy_denied` naming
//! what is free and what is asked, a guest keeps writing what its disk holds after the host
//! fills up, the commands that only read answer on a full home while `finish` says the disk
//! is full, and memory limits overcommit under one bound for all sandboxes, so that fifty
//! idle sandboxes start.

use std::path::Path;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use dynocap_e2e::small_fs::{free_mb, SmallFs};
use dynocap_e2e::*;
use serde_json::Value;

/// Every start writes the host's memory ceiling into the one parent cgroup all sandboxes
/// share (the last start's ceiling holds), so the test that reads that bound back runs alone
/// ([`exclusive`]) and every other test of this file that starts sandboxes beside it
/// ([`shared`]). Other test binaries run before or after this one, never beside it.
static MEMORY_BOUND: RwLock<()> = RwLock::new(());

/// Without package caches: each project's would set its own room aside on these small
/// filesystems (tests/caches.rs covers theirs).
const WITHOUT_CACHES: &[(&str, &str)] = &[("DYNOCAP_CACHES", "0")];

fn shared() -> RwLockReadGuard<'static, ()> {
    MEMORY_BOUND.read().unwrap_or_else(PoisonError::into_inner)
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    MEMORY_BOUND.write().unwrap_or_else(PoisonError::into_inner)
}

/// Bytes the file at `path` holds on its filesystem.
fn allocated(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(path).expect("stat")) * 512
}

fn project() -> tempfile::TempDir {
    one_commit_project("calc.py", "one\n")
}

/// Starts the task `calc` on [`project`] with a disk of `disk_mb`, and has it write a line
/// (`EARLY`) that its disk takes without error; the project lives as long as the guard.
fn task_with_an_early_write(home: &TestHome, disk_mb: &str, timeout: u64) -> tempfile::TempDir {
    let project = project();
    home.json(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "calc",
        "--disk-mb",
        disk_mb,
    ]);
    let early = home.exec_in_task("calc", "echo EARLY >> calc.py", timeout);
    assert_eq!(early["exitCode"], 0, "{early:#}");
    assert!(early.get("diskError").is_none(), "{early:#}");
    project
}

fn assert_denied_for_room(err: &Value, asked: &str) {
    assert_eq!(err["code"], "policy_denied", "{err}");
    let message = err["message"].as_str().expect("message");
    for needle in [asked, "MB free", "--disk-mb", "DYNOCAP_HOME"] {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

/// A start whose disk the home's filesystem cannot set aside is refused before anything is
/// made, for a raw sandbox and a task alike; one that fits reserves its whole disk, and gives
/// it back when it ends.
#[test]
fn a_disk_is_reserved_at_start_and_a_start_the_host_cannot_back_is_refused() {
    let _memory_bound = shared();
    if !require_root("a_disk_is_reserved_at_start") {
        return;
    }
    let fs = SmallFs::new(240);
    let home = fs.home(WITHOUT_CACHES);
    // The default disk, and an explicit one, each larger than the free space.
    let err = home.json_err(&["run", "big"]);
    assert_denied_for_room(&err, "2048");
    let project = project();
    let err = home.json_err(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "big",
        "--disk-mb",
        "1024",
    ]);
    assert_denied_for_room(&err, "1024");
    assert!(
        !home.path().join("sandboxes").exists()
            || std::fs::read_dir(home.path().join("sandboxes"))
                .unwrap()
                .next()
                .is_none(),
        "a refused start made nothing"
    );

    let before = free_mb(&fs.mount);
    home.sandbox("small", &["--disk-mb", "96"]);
    let image = home
        .path()
        .join("sandboxes")
        .join(home.sandbox_id("small"))
        .join("disk.img");
    assert!(
        allocated(&image) >= 96 << 20,
        "the whole disk is reserved: {} bytes",
        allocated(&image)
    );
    assert!(
        before - free_mb(&fs.mount) >= 96,
        "the host's free space went down"
    );
    // What is left cannot back a second disk of that size.
    let err = home.json_err(&["run", "second", "--disk-mb", "96"]);
    assert_denied_for_room(&err, "96");

    home.json(&["destroy", "small"]);
    home.wait_for_teardown();
    assert!(!image.exists());
    // ext4 counts a deleted file's blocks free once its journal commits (every 5 s).
    assert!(
        wait_until(30, || free_mb(&fs.mount) + 8 >= before),
        "the room came back"
    );
    home.sandbox("second", &["--disk-mb", "96"]);
    home.json(&["destroy", "second"]);
}

/// The example: the host's filesystem fills while a task works. Writes the guest's
/// disk acknowledged stay written (its room was reserved), `ls`, `ps`, `task diff` answer,
/// `finish` says the disk is full, and once room is freed `finish` saves them all.
#[test]
fn a_full_home_keeps_acknowledged_writes_and_read_only_commands_answer() {
    let _memory_bound = shared();
    if !require_root("a_full_home_keeps_acknowledged_writes") {
        return;
    }
    let fs = SmallFs::new(320);
    let home = fs.home(WITHOUT_CACHES);
    let project = project();
    let start_task = |name: &str| {
        home.json(&[
            "task",
            "start",
            project.path().to_str().unwrap(),
            "--name",
            name,
            "--disk-mb",
            "64",
        ])
    };
    start_task("calc");
    start_task("aside");
    home.sandbox("side", &["--disk-mb", "64"]);
    let early = home.exec_in_task("calc", "echo EARLY >> calc.py", 60);
    assert_eq!(early["exitCode"], 0, "{early:#}");
    let ballast = fs.fill();

    // The guest's disk still takes what fits in it, synced, and its filesystem stays
    // writable.
    let late = home.exec_in_task(
        "calc",
        "dd if=/dev/zero of=blob bs=1M count=16 conv=fsync 2>/dev/null && rm blob && \
         echo LATE >> calc.py && sync && touch still-writable",
        120,
    );
    assert_eq!(late["exitCode"], 0, "{late:#}");

    // Commands that only read answer.
    let ls = home.json(&["ls"]);
    assert_eq!(ls["tasks"].as_array().unwrap().len(), 2, "{ls:#}");
    let ps = home.json(&["ps"]);
    assert_eq!(ps["sandboxes"][0]["name"], "side", "{ps:#}");
    let diff = home.json(&["task", "diff", "calc"]);
    let patch = diff["patch"].as_str().unwrap_or_default();
    assert!(
        patch.contains("+LATE") && patch.contains("+EARLY"),
        "{diff:#}"
    );

    // A supervisor that dies now cannot have its end recorded: `ls` and `ps` still answer,
    // `ls` saying so, and so does a command for that task.
    let aside = home.supervisor_pid("aside").expect("aside's supervisor");
    // SAFETY: kill sends a signal to a process id; no memory is involved.
    let killed = unsafe { libc::kill(aside, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill aside's supervisor");
    assert!(wait_until(30, || !pid_exists(aside)
        || process_state(aside) == Some('Z')));
    let ls = home.json(&["ls"]);
    let listed = ls["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "aside")
        .cloned()
        .unwrap_or_else(|| panic!("aside listed: {ls:#}"));
    let note = listed["note"].as_str().unwrap_or_default();
    assert!(note.contains("is full"), "{listed:#}");
    home.json(&["ps"]);
    let refused = home.json_err(&["task", "exec", "aside", "--", "true"]);
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(message.contains("is full"), "{refused:#}");

    // Finishing needs room for the results: it says the disk is full.
    let failed = home.json_err(&["task", "finish", "calc"]);
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the disk holding") && message.contains("is full"),
        "{failed:#}"
    );

    for path in ballast {
        std::fs::remove_file(path).expect("remove ballast");
    }
    let finished = home.json(&["task", "finish", "calc"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    let saved = std::fs::read_to_string(finished["patchPath"].as_str().unwrap()).unwrap();
    assert!(
        saved.contains("+EARLY") && saved.contains("+LATE"),
        "every acknowledged write is in the patch: {saved}"
    );
    // The dead task's end was recorded once there was room: its work is kept.
    let ls = home.json(&["ls"]);
    let aside = ls["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "aside")
        .cloned()
        .unwrap_or_else(|| panic!("aside listed: {ls:#}"));
    assert_eq!(aside["state"], "unsaved", "{aside:#}");
    home.json(&["destroy", "side"]);
}

/// The memory limits of live sandboxes may add up past the host's memory ceiling: the kernel
/// bounds what they use together, in the one parent cgroup all of theirs are under.
#[test]
fn memory_limits_overcommit_under_one_bound_for_all_sandboxes() {
    let _memory_bound = exclusive();
    if !require_root("memory_limits_overcommit_under_one_bound") {
        return;
    }
    let home = TestHome::new()
        .with_env("DYNOCAP_MAX_MEMORY_MB", "4096")
        .with_env("DYNOCAP_MAX_SANDBOXES", "3");
    for name in ["one", "two", "three"] {
        home.sandbox(name, &["--memory-mb", "3072", "--disk-mb", "64"]);
    }
    assert_eq!(shared_memory_bound(), Some(4096 << 20));
    // Each sandbox's own limit is its own.
    let limit = home.sh("one", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max");
    assert_eq!(limit.trim(), (3072u64 << 20).to_string());
    // The count ceiling still holds.
    let err = home.json_err(&["run", "four", "--disk-mb", "64"]);
    assert_eq!(err["code"], "policy_denied", "{err}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("DYNOCAP_MAX_SANDBOXES=3"),
        "{err}"
    );
    for name in ["one", "two", "three"] {
        home.json(&["destroy", name]);
    }
}

/// The limit of the `dynocap` parent cgroup of the memory controller, v1 or v2.
fn shared_memory_bound() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory/dynocap/memory.limit_in_bytes",
        "/sys/fs/cgroup/dynocap/memory.max",
    ]
    .iter()
    .find_map(|file| std::fs::read_to_string(file).ok())
    .and_then(|text| text.trim().parse().ok())
}

/// Fifty idle sandboxes with the default memory limit (50 GB of limits, past the default
/// ceiling of half the RAM) and a 1 GiB disk each start side by side, then go.
#[test]
fn fifty_idle_sandboxes_start_with_the_default_memory_limit() {
    let _memory_bound = shared();
    if !require_root("fifty_idle_sandboxes_start") {
        return;
    }
    const COUNT: usize = 50;
    let home = TestHome::new();
    // Fifty disks, the 64 MB each start keeps free, and the home's own files.
    let needed = (COUNT as u64) * 1024 + 64 + 256;
    let free = free_mb(home.path());
    if free < needed {
        eprintln!(
            "SKIPPED fifty_idle_sandboxes_start: {free} MB free under /tmp, {needed} MB needed \
             for fifty reserved 1 GiB disks"
        );
        return;
    }
    let names: Vec<String> = (0..COUNT).map(|n| format!("idle{n}")).collect();
    let start = |name: &str| {
        let out = home
            .command()
            .args(["--json", "run", name, "--disk-mb", "1024"])
            .output()
            .expect("spawn dynocap run");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let results: Vec<(bool, String)> = std::thread::scope(|scope| {
        let workers: Vec<_> = names
            .chunks(COUNT / 5)
            .map(|chunk| scope.spawn(move || chunk.iter().map(|n| start(n)).collect::<Vec<_>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("starter thread"))
            .collect()
    });
    let failed: Vec<&String> = results
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, out)| out)
        .collect();
    assert!(
        failed.is_empty(),
        "{} starts failed: {failed:?}",
        failed.len()
    );
    let ps = home.json(&["ps"]);
    let running = ps["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "running" && s["memoryMB"] == 1024)
        .count();
    assert_eq!(running, COUNT, "{ps:#}");
    let answer = home.sh("idle49", "echo alive");
    assert_eq!(answer.trim(), "alive");
    std::thread::scope(|scope| {
        for chunk in names.chunks(COUNT / 5) {
            let home = &home;
            scope.spawn(move || {
                for name in chunk {
                    home.json(&["destroy", name]);
                }
            });
        }
    });
    home.wait_for_teardown();
}

/// The loop device (`loopN`) whose backing file is `image`.
fn loop_device_of(image: &Path) -> String {
    std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten()
        .find_map(|entry| {
            let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
            (Path::new(backing.trim_end()) == image)
                .then(|| entry.file_name().to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| panic!("no loop device backs {}", image.display()))
}

/// An error of the disk's filesystem (as a failed write to its image makes one; here the
/// kernel's own `trigger_fs_error`) is a task error in the exec result and in `ls`, never a
/// silent success: the filesystem goes read-only at once, the diff names the failure, and
/// `task finish` saves what was acknowledged before it from the kept disk.
#[test]
fn a_failed_disk_is_a_task_error_and_its_acknowledged_work_is_saved() {
    let _memory_bound = shared();
    if !require_root("a_failed_disk_is_a_task_error") {
        return;
    }
    let home = TestHome::new();
    let _project = task_with_an_early_write(&home, "64", 60);

    let image = home
        .path()
        .join("sandboxes")
        .join(home.sandbox_id("calc"))
        .join("disk.img");
    let device = loop_device_of(&image);
    std::fs::write(
        format!("/sys/fs/ext4/{device}/trigger_fs_error"),
        "dynocap test: a failed write",
    )
    .expect("trigger an ext4 error");

    let late = home.exec_in_task("calc", "echo LATE >> calc.py", 60);
    assert_ne!(
        late["exitCode"], 0,
        "a write after the failure fails: {late:#}"
    );
    let error = late["diskError"].as_str().unwrap_or_default();
    assert!(
        error.contains("recorded 1 error") && error.contains("takes no more writes"),
        "{late:#}"
    );
    assert!(
        late["stderr"].as_str().unwrap_or_default().contains("disk"),
        "{late:#}"
    );
    // Even a command that writes nothing is told.
    let read = home.exec_in_task("calc", "cat calc.py", 60);
    assert!(read["diskError"].is_string(), "{read:#}");
    let listed = home.json(&["ls"]);
    let note = listed["tasks"][0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("failed"), "{listed:#}");
    let diff = home.json_err(&["task", "diff", "calc"]);
    let message = diff["message"].as_str().unwrap_or_default();
    assert!(message.contains("recorded 1 error"), "{diff:#}");

    // The first finish cannot diff in the failed guest: it says why and keeps the work.
    let first = home.json_err(&["task", "finish", "calc"]);
    let message = first["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("recorded 1 error") && message.contains("kept"),
        "{first:#}"
    );
    let finished = home.json(&["task", "finish", "calc"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    let saved = std::fs::read_to_string(finished["patchPath"].as_str().unwrap()).unwrap();
    assert!(saved.contains("+EARLY"), "{saved}");
    assert!(!saved.contains("LATE"), "{saved}");
}

/// The vm's shape of the failed disk: the guest kernel's ext4 records an error (its root asks
/// the kernel's own `trigger_fs_error`); the sync after each command reports it, and every
/// command's result and the task's record say so.
#[test]
fn a_failed_vm_disk_is_a_task_error() {
    let _memory_bound = shared();
    let Some(home) = TestHome::on(Backend::Vm, "a_failed_vm_disk_is_a_task_error") else {
        return;
    };
    let _project = task_with_an_early_write(&home, "1024", 300);
    let failed = home.exec_in_task(
        "calc",
        "echo 'dynocap test' | sudo tee /sys/fs/ext4/vda/trigger_fs_error >/dev/null",
        300,
    );
    let error = failed["diskError"].as_str().unwrap_or_default();
    // The kernel counts the journal's failures after the first error too.
    assert!(
        error.contains("disk failed") && error.contains("error(s)"),
        "{failed:#}"
    );
    // The guest kernel may take a write into its cache after the error; its result says the
    // disk failed all the same, never a silent success.
    let late = home.exec_in_task("calc", "echo LATE >> calc.py", 300);
    assert!(late["diskError"].is_string(), "{late:#}");
    let listed = home.json(&["ls"]);
    let note = listed["tasks"][0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("disk failed"), "{listed:#}");
}

/// A raw sandbox's files need no sync after each command (they do not outlive it), yet its
/// failed disk is still each command's error and the sandbox's note in `ps`: on the jail the
/// supervisor reads the disk's filesystem on the host, on the vm it asks the guest's kernel.
#[test]
fn a_failed_disk_of_a_raw_sandbox_is_its_commands_error() {
    let _memory_bound = shared();
    if require_root("a_failed_disk_of_a_raw_sandbox") {
        let home = TestHome::new();
        home.sandbox("raw", &["--disk-mb", "64"]);
        let healthy = home.exec("raw", &[], "echo fine > /tmp/f");
        assert!(healthy.get("diskError").is_none(), "{healthy:#}");
        let image = home
            .path()
            .join("sandboxes")
            .join(home.sandbox_id("raw"))
            .join("disk.img");
        std::fs::write(
            format!("/sys/fs/ext4/{}/trigger_fs_error", loop_device_of(&image)),
            "dynocap test: a failed write",
        )
        .expect("trigger an ext4 error");
        let failed = home.exec("raw", &[], "cat /tmp/f");
        let error = failed["diskError"].as_str().unwrap_or_default();
        assert!(error.contains("recorded 1 error"), "{failed:#}");
        assert_raw_note(&home, "recorded 1 error");
        home.json(&["destroy", "raw"]);
    }
    let Some(home) = TestHome::on(Backend::Vm, "a_failed_disk_of_a_raw_vm_sandbox") else {
        return;
    };
    home.sandbox("rawvm", &[]);
    let healthy = home.exec("rawvm", &["--timeout", "300"], "echo fine > /tmp/f");
    assert!(healthy.get("diskError").is_none(), "{healthy:#}");
    let failed = home.exec(
        "rawvm",
        &["--timeout", "300"],
        "echo 'dynocap test' | sudo tee /sys/fs/ext4/vda/trigger_fs_error >/dev/null",
    );
    let error = failed["diskError"].as_str().unwrap_or_default();
    assert!(
        error.contains("disk failed") && error.contains("error(s)"),
        "{failed:#}"
    );
    // A command that writes nothing is told as well.
    let read = home.exec("rawvm", &["--timeout", "300"], "true");
    assert!(read["diskError"].is_string(), "{read:#}");
    assert_raw_note(&home, "disk failed");
    home.json(&["destroy", "rawvm"]);
}

/// The one raw sandbox `ps` lists has a note containing `needle`.
fn assert_raw_note(home: &TestHome, needle: &str) {
    let ps = home.json(&["ps"]);
    let note = ps["sandboxes"][0]["note"].as_str().unwrap_or_default();
    assert!(note.contains(needle), "{ps:#}");
}
