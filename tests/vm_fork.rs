//! Checkpoints and forks of a vm task (TCG, lean: one task each) beyond tests/fork.rs's:
//! - the host's room: a checkpoint or fork the home's filesystem cannot back is refused
//!   (`policy_denied` naming what is free) and leaves the task running; a fork of a checkpoint
//!   sets aside its own layer only, the frozen chain it shares counting once; the layers go
//!   with their last user (`rm --purge`), and the room comes back;
//! - five checkpoints taken while a job runs: the chain past four frozen layers is flattened
//!   in the background while every checkpoint stays whole, forks of the oldest and the newest
//!   each hold their own files, and a restore ends the job and names it.

use std::path::{Path, PathBuf};
use std::process::Command;

use dynocap_e2e::small_fs::SmallFs;
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
    if !require_root(test) {
        return;
    }
    // The debian image (~700 MB copied here), two 1 GiB disks' room and a little more.
    let fs = SmallFs::new(3400);
    let Some(home) = backend::vm_home_at(test, fs.mount.join("home")) else {
        return;
    };
    let home = home.with_env("DYNOCAP_CACHES", "0");
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

    // The fork of the checkpoint sets aside its own layer; the chain (64 MB and more) is the
    // task's and the checkpoint's already.
    let before_fork = fs.free_mb();
    home.json(&["task", "fork", "v", "f", "--checkpoint", "a"]);
    let taken = before_fork.saturating_sub(fs.free_mb());
    assert!(
        (1024..1024 + 40).contains(&taken),
        "the fork took {taken} MB: its 1 GiB layer, not a copy of the chain"
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
    use std::os::unix::fs::MetadataExt;
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
    let after = fs.free_mb();
    assert!(
        after + 16 >= before_start,
        "the room came back: {after} MB free, {before_start} MB before the task"
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
    let job = home.json(&[
        "task",
        "exec",
        "v",
        "--background",
        "--timeout",
        "900",
        "--",
        "i=0; while :; do i=$((i+1)); echo $i > ~/counter; sleep 0.1; done",
    ]);
    let job = job["job"].as_str().expect("job id").to_owned();
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
