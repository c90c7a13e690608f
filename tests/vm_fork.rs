//! Checkpoints and forks of a vm task (TCG, lean: one task each) beyond tests/fork.rs's:
//! - the host's room: a checkpoint or fork the home's filesystem cannot back is refused
//!   (`policy_denied` naming what is free) and leaves the task running; a fork of a checkpoint
//!   sets nothing aside, the frozen chain it shares counting once; the layers go with their
//!   last user (`rm --purge`), and the room comes back;
//! - forks take what they write: three forks (of a checkpoint, of the task as it is, live)
//!   each hold far less of the host than their disk's size, together less than one disk, and
//!   a fork restored to its own checkpoint still sets nothing aside; once the home's
//!   filesystem is full, a fork's `dd conv=fsync` fails in its guest (QEMU reports the host's
//!   ENOSPC to it, never pausing it), the restored fork's too, while the source, whose layer
//!   has its room set aside, writes on and finishes with its patch;
//! - five checkpoints taken while a job runs: the chain past four frozen layers is flattened
//!   in the background while every checkpoint stays whole, forks of the oldest and the newest
//!   each hold their own files, and a restore ends the job and names it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use dynocap_e2e::*;
use serde_json::Value;

/// The files of a task's `vm/` directory (its disk's chain).
fn vm_dir(home: &TestHome, name: &str) -> PathBuf {
    home.path()
        .join("sandboxes")
        .join(home.sandbox_id(name))
        .join("vm")
}

/// The files of the chain under `disk` (itself first), as QEMU reads it.
fn chain(disk: &Path) -> Vec<String> {
    let out = Command::new("qemu-img")
        .args(["info", "-U", "--backing-chain", "--output=json"])
        .arg(disk)
        .output()
        .expect("qemu-img");
    assert!(out.status.success(), "{out:?}");
    let info: Value = serde_json::from_slice(&out.stdout).expect("json");
    info.as_array()
        .expect("a chain")
        .iter()
        .filter_map(|layer| layer["filename"].as_str())
        .map(|path| path.rsplit('/').next().unwrap_or(path).to_owned())
        .collect()
}

fn assert_denied_for_room(err: &Value, what: &str) {
    assert_eq!(err["code"], "policy_denied", "{err:#}");
    let message = err["message"].as_str().expect("message");
    for needle in [what, "MB free", "rm --purge"] {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

#[test]
fn vm_checkpoints_and_forks_take_host_room_once_and_give_it_back() {
    let test = "vm_checkpoints_and_forks_take_host_room_once_and_give_it_back";
    // The debian image (~700 MB copied here), two 1 GiB disks' room and a little more.
    let Some((fs, home)) = backend::vm_home_on_small_fs(test, 3400) else {
        return;
    };
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    let before_start = fs.free_mb();
    home.json(&["task", "start", &path, "--name", "v", "--disk-mb", "1024"]);
    home.task_sh(
        "v",
        "head -c 64000000 /dev/urandom > ~/blob && echo work >> a.txt",
    );
    let made = home.json(&["task", "checkpoint", "v", "a"]);
    assert!(made["bytes"].as_u64() >= Some(64_000_000), "{made:#}");

    let ballast = fs.fill();
    let err = home.json_err(&["task", "checkpoint", "v", "b"]);
    assert_denied_for_room(&err, "checkpoint");
    let err = home.json_err(&["task", "fork", "v", "f", "--checkpoint", "a"]);
    assert_eq!(err["code"], "policy_denied", "{err:#}");
    let listed = home.json(&["task", "checkpoints", "v"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed:#}");
    // Its layer's room was set aside: the task writes on.
    home.task_sh("v", "echo more >> a.txt && sync");
    for file in ballast {
        std::fs::remove_file(file).expect("remove the ballast");
    }

    // The fork of the checkpoint sets nothing aside: its layer holds what its guest writes,
    // and the chain (64 MB and more) is the task's and the checkpoint's already.
    let before_fork = fs.free_mb();
    home.json(&["task", "fork", "v", "f", "--checkpoint", "a"]);
    let taken = before_fork.saturating_sub(fs.free_mb());
    assert!(
        taken < 64,
        "the fork took {taken} MB: neither its 1 GiB disk's room nor a copy of the chain"
    );
    assert_eq!(
        home.task_sh("f", "cat a.txt; wc -c < ~/blob"),
        "a\nwork\n64000000\n"
    );
    let fork_vm = vm_dir(&home, "f");
    let frozen: Vec<PathBuf> = std::fs::read_dir(&fork_vm)
        .expect("the fork's vm/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("/frozen-"))
        .collect();
    assert!(!frozen.is_empty(), "the fork's chain");
    for layer in &frozen {
        let links = std::fs::metadata(layer).expect("layer").nlink();
        assert!(links >= 3, "{} is linked {links} times", layer.display());
    }

    // The source goes for good: the layers its fork uses stay, and go with the fork.
    home.json(&["rm", "v", "--force", "--purge"]);
    for layer in &frozen {
        assert_eq!(std::fs::metadata(layer).expect("kept").nlink(), 1);
    }
    assert_eq!(home.task_sh("f", "wc -c < ~/blob"), "64000000\n");
    home.json(&["rm", "f", "--force", "--purge"]);
    home.wait_for_teardown();
    assert!(!fork_vm.exists());
    // ext4 counts the blocks of a deleted file free once its journal commits (every 5 s).
    assert!(
        wait_until(30, || fs.free_mb() + 16 >= before_start),
        "the room came back: {} MB free, {before_start} MB before the task",
        fs.free_mb()
    );
}

#[test]
fn vm_forks_take_what_they_write_and_a_full_host_fails_their_writes_in_the_guest() {
    let test = "vm_forks_take_what_they_write_and_a_full_host_fails_their_writes_in_the_guest";
    // The debian image (~700 MB copied here), the source's 1 GiB disk's room, the live fork's
    // saved memory (512 MB at most) and room to spare: not four disks' room.
    let Some((fs, home)) = backend::vm_home_on_small_fs(test, 3400) else {
        return;
    };
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&[
        "task",
        "start",
        &path,
        "--name",
        "src",
        "--disk-mb",
        "1024",
        "--memory-mb",
        "512",
    ]);
    let wrote = home.exec_in_task(
        "src",
        "head -c 32000000 /dev/urandom > ~/blob && echo work >> a.txt && sync",
        300,
    );
    assert_eq!(wrote["exitCode"], 0, "{wrote:#}");
    home.json(&["task", "checkpoint", "src", "cp"]);

    // Three forks, one of each kind: none sets its disk's room aside.
    let before = fs.free_mb();
    home.json(&["task", "fork", "src", "f-cp", "--checkpoint", "cp"]);
    home.json(&["task", "fork", "src", "f-now"]);
    home.json(&["task", "fork", "src", "f-live", "--live"]);
    let forks = ["f-cp", "f-now", "f-live"];
    for fork in forks {
        assert_eq!(
            home.task_sh(
                fork,
                &format!("wc -c < ~/blob && echo {fork} > {fork}.txt && sync")
            ),
            "32000000\n",
            "{fork}"
        );
        let layer = vm_dir(&home, fork).join("disk.qcow2");
        let allocated = std::fs::metadata(&layer)
            .expect("the fork's layer")
            .blocks()
            * 512;
        eprintln!("{fork}'s layer: {} KiB allocated", allocated >> 10);
        assert!(
            allocated < 128 << 20,
            "{fork}'s layer holds {} MiB of the host, far less than its 1024 MiB disk",
            allocated >> 20
        );
    }
    // A fork keeps setting nothing aside: its own checkpoint freezes its layer and its restore
    // boots it over a new one, neither of which reserves its disk.
    home.json(&["task", "checkpoint", "f-cp", "mine"]);
    home.json(&["task", "restore", "f-cp", "mine"]);
    assert_eq!(home.task_sh("f-cp", "cat f-cp.txt"), "f-cp\n");
    let layer = vm_dir(&home, "f-cp").join("disk.qcow2");
    let allocated = std::fs::metadata(&layer).expect("the layer").blocks() * 512;
    assert!(
        allocated < 128 << 20,
        "the restored fork's layer holds {} MiB of the host",
        allocated >> 20
    );
    // The live fork's saved memory included; before, each fork set aside 1 GiB and more.
    let taken = before.saturating_sub(fs.free_mb());
    eprintln!("three forks took {taken} MB of the home's filesystem");
    assert!(
        taken < 1024,
        "three forks took {taken} MB of the host, less than one of their 1024 MB disks"
    );

    // The host full: the source's layer has its room and takes its writes, ...
    let ballast = fs.fill();
    let more = home.exec_in_task(
        "src",
        "head -c 8000000 /dev/urandom > ~/more && echo more >> a.txt && sync",
        300,
    );
    assert_eq!(more["exitCode"], 0, "the source writes on: {more:#}");
    // ... a fork's write fails in its guest, which goes on answering. (Under QEMU's default
    // for a write error, `werror=enospc`, the guest pauses instead, and this command's
    // supervisor stops answering until `task exec` gives up on it minutes later.)
    for fork in ["f-cp", "f-live"] {
        let (failed, text) =
            home.task_exec_outcome(fork, "dd if=/dev/urandom of=big bs=1M count=64 conv=fsync");
        assert!(
            failed,
            "{fork}: the write the host cannot back fails: {text}"
        );
        // The write-back meets the host's ENOSPC as a disk error (EIO), or the guest's ext4
        // has already turned read-only on an earlier one: never acknowledged either way. (A
        // failed write-back of file data alone is the file's error, not its filesystem's:
        // the result's `diskError` comes once a metadata or journal write fails too.)
        assert!(
            text.contains("fsync failed") || text.contains("error writing"),
            "{fork}: the guest's write or fsync failed: {text}"
        );
        assert!(
            text.contains("Input/output error") || text.contains("Read-only file system"),
            "{fork}: {text}"
        );
    }
    for file in ballast {
        std::fs::remove_file(file).expect("remove the ballast");
    }
    assert_eq!(
        home.task_sh("src", "wc -c < ~/blob; wc -c < ~/more"),
        "32000000\n8000000\n"
    );
    let patch = verified_patch(&home.json(&["task", "finish", "src"]));
    assert_eq!(patch_files(&patch), ["a.txt"], "{patch}");
    assert!(
        patch.contains("+work") && patch.contains("+more"),
        "{patch}"
    );
}

#[test]
fn a_deep_chain_of_checkpoints_under_a_job_flattens_and_each_stays_whole() {
    let test = "a_deep_chain_of_checkpoints_under_a_job_flattens_and_each_stays_whole";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "v"]);
    let job = home.task_job(
        "v",
        900,
        "i=0; while :; do i=$((i+1)); echo $i > ~/counter; sleep 0.1; done",
    );
    for n in 1..=5 {
        home.task_sh("v", &format!("echo {n} > f{n}.txt"));
        let made = home.json(&["task", "checkpoint", "v", &format!("c{n}")]);
        assert_eq!(made["label"], format!("c{n}"), "{made:#}");
    }
    // Five frozen layers under the writable one: past four, flattened onto the bottom one.
    let disk = vm_dir(&home, "v").join("disk.qcow2");
    assert!(
        wait_until(120, || chain(&disk).len() <= 3),
        "never flattened: {:?}",
        chain(&disk)
    );
    let names = chain(&disk);
    assert!(names[1].starts_with("frozen-"), "{names:?}");
    assert_eq!(home.task_sh("v", "cat f*.txt"), "1\n2\n3\n4\n5\n");

    // Each checkpoint is still the disk as it was.
    home.json(&["task", "fork", "v", "old", "--checkpoint", "c1"]);
    assert_eq!(home.task_sh("old", "ls f*.txt"), "f1.txt\n");
    home.json(&["task", "fork", "v", "new", "--checkpoint", "c5"]);
    assert_eq!(
        home.task_sh("new", "ls f*.txt; test -s ~/counter && echo counted"),
        "f1.txt\nf2.txt\nf3.txt\nf4.txt\nf5.txt\ncounted\n"
    );
    let finish = home.json(&["task", "finish", "new"]);
    assert_eq!(finish["verified"], true, "{finish:#}");
    let patch = std::fs::read_to_string(finish["patchPath"].as_str().expect("patchPath"))
        .expect("the patch");
    for n in 1..=5 {
        assert!(patch.contains(&format!("b/f{n}.txt")), "{patch}");
    }

    // The restore of the oldest ends the job, which was running all along, and names it.
    let restored = home.json(&["task", "restore", "v", "c1"]);
    let ended = names_in(&restored["jobsEnded"], "job");
    assert_eq!(ended, [job.as_str()], "{restored:#}");
    assert_eq!(home.task_sh("v", "ls f*.txt"), "f1.txt\n");
}
