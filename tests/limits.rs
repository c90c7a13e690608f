//! Limits hold: cgroups (v1 and v2: memory without swap, CPU quota, process count), the
//! sandbox's disk (bytes and inodes, ENOSPC in the guest, nothing left on the host), ptys, and
//! the sizes of /tmp and /dev/shm.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use dynocap_e2e::*;

#[test]
fn memory_limit_oom_kills_and_sandbox_survives() {
    memory_limit_oom_kills_and_sandbox_survives_on(Backend::Jail);
}

#[test]
fn memory_limit_oom_kills_and_sandbox_survives_in_a_vm() {
    memory_limit_oom_kills_and_sandbox_survives_on(Backend::Vm);
}

fn memory_limit_oom_kills_and_sandbox_survives_on(backend: Backend) {
    let Some(home) = TestHome::on(backend, "memory_limit_oom_kills_and_sandbox_survives") else {
        return;
    };
    let info = home.sandbox("mem", &["--memory-mb", "256"]);
    assert_eq!(info["backend"], backend.name(), "{info:#}");
    // Growing 16 MiB at a time: a guest kernel of its own refuses one allocation larger than
    // its RAM outright (overcommit heuristics), so only growth reaches the OOM killer there.
    let hog = home.exec(
        "mem",
        &["--timeout", "120"],
        "exec perl -e 'my @a; while (1) { push @a, \"a\" x (16 * 1024 * 1024) }'",
    );
    assert_eq!(
        hog["signal"], "SIGKILL",
        "the ever-growing allocation was OOM-killed: {hog}"
    );
    assert_eq!(hog["oomKilled"], true, "the OOM kill is reported: {hog}");
    assert!(
        hog["stderr"]
            .as_str()
            .expect("stderr")
            .contains("memory limit (256 MB)"),
        "{hog}"
    );
    assert_eq!(home.sh("mem", "echo alive"), "alive\n");
    let calm = home.exec("mem", &[], "true");
    assert_eq!(
        calm["oomKilled"], false,
        "only the command that hit the limit: {calm}"
    );
}

#[test]
fn cpu_quota_caps_usage_at_about_one_core() {
    if !require_root("cpu_quota_caps_usage_at_about_one_core") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("cpu", &["--cpus", "1"]);
    // Two busy loops for 3 s of wall time; with one CPU of quota their combined CPU time
    // stays near 3 s, never near the 6 s two free cores would give.
    let out = home.sh(
        "cpu",
        "for i in 1 2; do timeout 3 sh -c 'while :; do :; done' & done; wait; times",
    );
    // `times` prints the shell's, then its children's user and system time: "XmY.YYs XmY.YYs".
    let children = out.lines().last().expect("times prints two lines");
    let secs: f64 = children
        .split_whitespace()
        .map(|t| {
            let (m, s) = t.trim_end_matches('s').split_once('m').unwrap();
            m.parse::<f64>().unwrap() * 60.0 + s.parse::<f64>().unwrap()
        })
        .sum();
    // Contention on a shared machine can only lower the loops' usage, so the cap is the
    // assertion that holds whatever the load; that they ran at all is all a lower bound says.
    assert!(
        secs < 4.5,
        "two spinning loops used {secs:.2}s of CPU in 3s with a 1-CPU quota"
    );
    assert!(secs > 0.0, "the loops did run");
    // And the quota itself: one CPU per 100 ms period, on cgroup v1 or v2.
    let id = home.sandbox_id("cpu");
    let v1 = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/dynocap/{id}/cpu.cfs_quota_us"));
    let v2 = std::fs::read_to_string(format!("/sys/fs/cgroup/dynocap/{id}/cpu.max"));
    match (v1, v2) {
        (Ok(quota), _) => assert_eq!(quota.trim(), "100000"),
        (_, Ok(max)) => assert_eq!(max.trim(), "100000 100000"),
        (Err(e1), Err(e2)) => panic!("no cpu quota file for {id}: v1 {e1}, v2 {e2}"),
    }
}

#[test]
fn pids_limit_stops_a_fork_bomb() {
    if !require_root("pids_limit_stops_a_fork_bomb") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("bomb", &[]);
    let bomb = home.exec(
        "bomb",
        &["--timeout", "10"],
        // `sleep` is started before the bomb: forked after it, it could find the pids limit
        // already reached and end the command long before the timeout.
        "bomb() { bomb | bomb & }; sleep 20 & bomb; wait",
    );
    assert_eq!(bomb["timedOut"], true, "{bomb}");
    // The limit held the bomb and the sandbox still works once the group is gone.
    assert!(wait_until(60, || {
        let out = home.run(&["--json", "exec", "bomb", "--", "echo usable"]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("usable")
    }));
}

/// Loop devices whose backing file lies under `dir` (`/sys/block/loopN/loop/backing_file`).
fn loop_devices_under(dir: &Path) -> Vec<String> {
    std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
            backing.starts_with(dir.to_str()?).then(|| {
                format!(
                    "{}: {}",
                    entry.file_name().to_string_lossy(),
                    backing.trim()
                )
            })
        })
        .collect()
}

/// Mounts under `dir` in any process's mount namespace on the host.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_str().expect("utf-8 temp path");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(mounts) = std::fs::read_to_string(entry.path().join("mounts")) else {
            continue;
        };
        found.extend(
            mounts
                .lines()
                .filter(|line| line.split(' ').nth(1).is_some_and(|at| at.starts_with(dir)))
                .map(|line| format!("pid {}: {line}", entry.file_name().to_string_lossy())),
        );
    }
    found
}

fn state_dir(home: &TestHome, id: &str) -> PathBuf {
    home.path().join("sandboxes").join(id)
}

fn kill_supervisor(pid: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::kill(pid, libc::SIGKILL) },
        0,
        "kill -9 {pid}"
    );
}

/// Writes `bytes` of zeros to `~/big` in sandbox `name`, whose disk holds `disk_bytes`: the
/// write fails with ENOSPC in the guest, and less than the disk was written.
fn fill_past_the_disk(home: &TestHome, name: &str, bytes: u64, disk_bytes: u64, timeout: &str) {
    let fill = home.exec(
        name,
        &["--timeout", timeout],
        &format!("head -c {bytes} /dev/zero > ~/big"),
    );
    assert_ne!(fill["exitCode"], 0, "{fill:#}");
    assert!(
        fill["stderr"]
            .as_str()
            .expect("stderr")
            .contains("No space left on device"),
        "{fill:#}"
    );
    let written: u64 = home
        .sh(name, "stat -c %s ~/big")
        .trim()
        .parse()
        .expect("size");
    assert!(
        written < disk_bytes,
        "wrote {written} bytes to a disk of {disk_bytes}"
    );
}

fn assert_nothing_left(home: &TestHome, what: &str) {
    assert!(
        wait_until(30, || loop_devices_under(home.path()).is_empty()),
        "{what}: loop devices left: {:?}",
        loop_devices_under(home.path())
    );
    assert_eq!(
        mounts_under(home.path()),
        Vec::<String>::new(),
        "{what}: mounts left"
    );
}

#[test]
fn a_full_disk_is_enospc_in_the_guest_for_bytes_and_inodes_and_frees_with_rm() {
    if !require_root("a_full_disk_is_enospc_in_the_guest") {
        return;
    }
    let home = TestHome::new();
    let info = home.sandbox("small", &["--disk-mb", "128"]);
    assert_eq!(info["diskMB"], 128, "{info:#}");
    let ps = home.json(&["ps"]);
    assert_eq!(ps["sandboxes"][0]["diskMB"], 128, "{ps:#}");
    let id = home.sandbox_id("small");
    let image = state_dir(&home, &id).join("disk.img");
    assert_eq!(
        std::fs::metadata(&image).expect("disk.img").len(),
        128 << 20
    );
    // Not in the host's mount table: the disk is mounted in the supervisor's namespace only.
    assert!(
        std::fs::read_to_string("/proc/self/mounts")
            .expect("mounts")
            .lines()
            .all(|l| !l.contains(home.path().to_str().expect("utf-8"))),
        "the sandbox's disk shows in the host's mount table"
    );

    // The whole disk is reserved on the host from the start.
    let reserved = std::fs::metadata(&image).expect("disk.img").blocks() * 512;
    assert!(reserved >= 128 << 20, "{reserved} bytes reserved");
    // Bytes: 300 MB do not fit in 128 MiB.
    fill_past_the_disk(&home, "small", 300_000_000, 128 << 20, "120");
    // The host holds the image and nothing more: its allocation stays what was reserved
    // (its size, and the host's own extent-tree blocks for it).
    let allocated = std::fs::metadata(&image).expect("disk.img").blocks() * 512;
    assert!(
        allocated <= (128 << 20) + (64 << 10),
        "the image takes {allocated} bytes on the host"
    );

    // rm frees the space for the guest.
    assert_eq!(
        home.sh(
            "small",
            "rm ~/big && head -c 50000000 /dev/zero > ~/again && echo ok"
        ),
        "ok\n"
    );

    // Inodes: 128 MiB holds 8192 of them (one per 16 KiB); creating files stops there.
    let files = home.exec(
        "small",
        &["--timeout", "300"],
        "mkdir ~/many && cd ~/many && perl -e 'for ($i = 0; ; $i++) { open(F, \">$i\") or \
         do { print \"$i $!\\n\"; exit 0 }; close F }'",
    );
    let out = files["stdout"].as_str().expect("stdout");
    let (count, error) = out.trim().split_once(' ').expect("count and error");
    let count: u64 = count.parse().expect("count");
    assert_eq!(error, "No space left on device", "{files:#}");
    assert!(
        (4_000..8_192).contains(&count),
        "{count} files on a 128 MiB disk"
    );
    assert_eq!(
        home.sh("small", "rm -rf ~/many ~/again && touch ~/after && echo ok"),
        "ok\n"
    );

    home.json(&["destroy", "small"]);
    home.wait_for_teardown();
    assert!(
        !state_dir(&home, &id).exists(),
        "the state dir and its image are gone"
    );
    assert_nothing_left(&home, "after destroy");
}

/// A teardown leaves a spare disk for the next start of its size: a fresh copy of the
/// formatted template, never the disk it used. The next start takes it (the same file), and
/// its guest finds an empty disk.
#[test]
fn a_teardown_leaves_a_fresh_spare_disk_that_the_next_start_takes() {
    if !require_root("a_teardown_leaves_a_fresh_spare_disk") {
        return;
    }
    // Each `run` in a process of its own: a command server's standby holds a disk of its own
    // (a loop device) for the next `run` (tests/cli_server.rs).
    let home = TestHome::new().with_env("DYNOCAP_CLI_SERVER", "0");
    let spares = home.path().join("cache/disks/spares");
    let spare = || -> Option<std::path::PathBuf> {
        std::fs::read_dir(&spares)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("ext4-{}-", 128u64 << 20)))
            })
    };
    home.sandbox("first", &["--disk-mb", "128"]);
    assert_eq!(
        home.sh(
            "first",
            "echo mine > ~/secret && head -c 10000000 /dev/urandom > ~/blob && echo ok"
        ),
        "ok\n"
    );
    home.json(&["destroy", "first"]);
    home.wait_for_teardown();
    let left = spare().expect("the teardown left a spare disk");
    let left_inode = std::fs::metadata(&left).expect("spare").ino();

    home.sandbox("second", &["--disk-mb", "128"]);
    assert!(spare().is_none(), "the start took the spare");
    let state = state_dir(&home, &home.sandbox_id("second"));
    let image = state.join("disk.img");
    // Mounted (in the supervisor's namespace) without the inode-table zeroing thread, which
    // would write the whole inode area into the sparse image over the sandbox's life, and
    // without the bitmap prefetch, which would start a thread reading every group's bitmap.
    let supervisor = home.supervisor_pids()[0];
    let mountinfo = std::fs::read_to_string(format!("/proc/{supervisor}/mountinfo")).unwrap();
    let disk = state.join("disk").display().to_string();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(disk.as_str()))
        .unwrap_or_else(|| panic!("no mount at {disk}:\n{mountinfo}"));
    assert!(
        line.contains(" - ext4 ")
            && line.contains("noinit_itable")
            && line.contains("no_prefetch_block_bitmaps"),
        "{line}"
    );
    assert_eq!(
        std::fs::metadata(&image).expect("disk.img").ino(),
        left_inode,
        "the start's disk is the spare itself"
    );
    assert_eq!(
        home.sh(
            "second",
            "test ! -e ~/secret && test ! -e ~/blob && echo clean"
        ),
        "clean\n"
    );
    // A size with no spare copies its template as before.
    home.sandbox("other", &["--disk-mb", "64"]);
    assert_eq!(home.sh("other", "touch ~/x && echo ok"), "ok\n");

    home.json(&["destroy", "second"]);
    home.json(&["destroy", "other"]);
    home.wait_for_teardown();
    assert!(spare().is_some(), "the next teardown left another");
    assert_nothing_left(&home, "after destroy");
}

/// The device and backing file of the loop device mounted at sandbox `name`'s disk, as its
/// supervisor (the only process that mounts it) sees it.
fn disk_loop_of(home: &TestHome, name: &str) -> (String, String) {
    let id = home.sandbox_id(name);
    let pid = home
        .supervisor_pid(name)
        .unwrap_or_else(|| panic!("{name} has a supervisor"));
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let disk = state_dir(home, &id).join("disk").display().to_string();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(disk.as_str()))
        .unwrap_or_else(|| panic!("no mount at {disk}:\n{mountinfo}"));
    let device = line
        .split(" - ext4 ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|source| source.strip_prefix("/dev/"))
        .unwrap_or_else(|| panic!("not an ext4 loop mount: {line}"))
        .to_owned();
    let backing = std::fs::read_to_string(format!("/sys/block/{device}/loop/backing_file"))
        .unwrap_or_else(|e| panic!("{device} is not a bound loop device: {e}"));
    (device, backing.trim_end().to_owned())
}

/// The CLI's `run` has its standby supervisor make the default disk while the command does its
/// checks and catalog work, and the start takes that disk: bound to a loop device as an
/// unnamed copy in the disk cache (named `disk.img` since), or, once a teardown has left a
/// spare of the size, that spare, already flushed. A run with another disk size makes none
/// ahead, and none of them leaves anything behind.
#[test]
fn a_cli_run_of_the_default_disk_takes_the_disk_its_standby_made() {
    if !require_root("a_cli_run_of_the_default_disk_takes_the_disk_its_standby_made") {
        return;
    }
    // Each `run` in a process of its own: a command server's standby holds a disk of its own
    // (a loop device) for the next `run` (tests/cli_server.rs).
    let home = TestHome::new().with_env("DYNOCAP_CLI_SERVER", "0");
    let cache = home.path().join("cache/disks");
    home.sandbox("default", &[]);
    let (_, backing) = disk_loop_of(&home, "default");
    assert!(
        backing.starts_with(cache.to_str().expect("utf-8")) && backing.ends_with("(deleted)"),
        "the default start made its own disk ({backing}), not its standby"
    );
    assert_eq!(home.sh("default", "touch ~/x && echo ok"), "ok\n");

    home.sandbox("sized", &["--disk-mb", "96"]);
    let (_, backing) = disk_loop_of(&home, "sized");
    let image = state_dir(&home, &home.sandbox_id("sized")).join("disk.img");
    assert_eq!(
        backing,
        image.display().to_string(),
        "a 96 MiB start uses a disk of its own size"
    );
    // Only the two sandboxes' disks are bound: the standby made none for the 96 MiB start.
    assert_eq!(
        loop_devices_under(home.path()).len(),
        2,
        "{:?}",
        loop_devices_under(home.path())
    );

    home.json(&["destroy", "default"]);
    home.json(&["destroy", "sized"]);
    home.wait_for_teardown();
    let spare = std::fs::read_dir(cache.join("spares"))
        .expect("the teardown left a spare")
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.to_string_lossy()
                .contains(&format!("ext4-{}-", 2048u64 << 20))
        })
        .expect("a spare of the default size");
    let spare_inode = std::fs::metadata(&spare).expect("spare").ino();

    home.sandbox("again", &[]);
    let id = home.sandbox_id("again");
    let image = state_dir(&home, &id).join("disk.img");
    let (_, backing) = disk_loop_of(&home, "again");
    assert_eq!(backing, image.display().to_string());
    assert_eq!(
        std::fs::metadata(&image).expect("disk.img").ino(),
        spare_inode,
        "the disk made ahead is the spare"
    );
    let log = std::fs::read_to_string(home.log_path(&id)).unwrap_or_default();
    assert!(
        !log.contains("made ahead"),
        "the start made its own disk:\n{log}"
    );
    assert_eq!(
        home.sh("again", "ls ~ | wc -l && touch ~/y && echo ok"),
        "0\nok\n",
        "a fresh empty disk"
    );

    home.json(&["destroy", "again"]);
    home.wait_for_teardown();
    assert_nothing_left(&home, "after destroy");
}

/// A VM's CPUs and memory are its own: as many vCPUs as `--cpus`, and `--memory-mb` of RAM
/// of which the guest kernel keeps a little for itself.
#[test]
fn a_vms_vcpus_and_ram_are_its_limits() {
    let Some(home) = TestHome::on(Backend::Vm, "a_vms_vcpus_and_ram_are_its_limits") else {
        return;
    };
    let info = home.sandbox("sized", &["--cpus", "2", "--memory-mb", "768"]);
    assert_eq!(
        (info["cpus"].as_u64(), info["memoryMB"].as_u64()),
        (Some(2), Some(768))
    );
    assert_eq!(home.sh("sized", "nproc").trim(), "2");
    let total_kib: u64 = home
        .sh("sized", "awk '/^MemTotal:/ {print $2}' /proc/meminfo")
        .trim()
        .parse()
        .expect("MemTotal");
    assert!(
        (600 * 1024..=768 * 1024).contains(&total_kib),
        "MemTotal {total_kib} KiB for --memory-mb 768"
    );
    home.json(&["destroy", "sized"]);
}

/// The same limit in a VM: the disk is the guest's qcow2 layer, whose virtual size is the
/// limit and whose root filesystem was grown to it, so the image's own files take part of it.
#[test]
fn a_full_disk_is_enospc_in_a_vm_guest_and_frees_with_rm() {
    let Some(home) = TestHome::on(Backend::Vm, "a_full_disk_is_enospc_in_a_vm_guest") else {
        return;
    };
    let info = home.sandbox("small", &["--disk-mb", "1024"]);
    assert_eq!(info["diskMB"], 1024, "{info:#}");
    assert_eq!(info["backend"], "vm", "{info:#}");
    let size_kib: u64 = home
        .sh("small", "df -k / | tail -1 | awk '{print $2}'")
        .trim()
        .parse()
        .expect("df size");
    assert!(
        (900_000..1_048_576).contains(&size_kib),
        "the guest's root is {size_kib} KiB on a 1024 MB disk"
    );
    // The layer's room is reserved on the host from the start (blocks past its end, which
    // it grows into), and filling the disk takes no more than that.
    let layer = home
        .path()
        .join("sandboxes")
        .join(home.sandbox_id("small"))
        .join("vm/disk.qcow2");
    let reserved = std::fs::metadata(&layer).expect("disk.qcow2").blocks() * 512;
    assert!(
        reserved >= 1 << 30,
        "{reserved} bytes reserved for the layer"
    );
    // Bytes: 1.2 GB do not fit on a 1 GiB disk.
    fill_past_the_disk(&home, "small", 1_200_000_000, 1 << 30, "600");
    let filled = std::fs::metadata(&layer).expect("disk.qcow2").blocks() * 512;
    assert!(
        filled <= reserved + (1 << 20),
        "the layer grew past its reservation: {filled} bytes, {reserved} reserved"
    );
    // rm frees the space for the guest.
    assert_eq!(
        home.sh(
            "small",
            "rm ~/big && head -c 50000000 /dev/zero > ~/again && echo ok"
        ),
        "ok\n"
    );
}

#[test]
fn a_disk_size_out_of_range_is_refused() {
    let home = TestHome::new();
    for bad in ["63", "1048577"] {
        let err = home.json_err(&["run", "x", "--disk-mb", bad]);
        assert_eq!(err["code"], "invalid_argument", "{err}");
        assert!(
            err["message"]
                .as_str()
                .expect("message")
                .contains("--disk-mb"),
            "{err}"
        );
    }
}

#[test]
fn a_killed_supervisor_leaves_no_mount_or_loop_device_and_its_task_recovers() {
    if !require_root("a_killed_supervisor_leaves_no_mount_or_loop_device") {
        return;
    }
    let home = TestHome::new();

    // A raw sandbox: killed, then repaired by whoever looks.
    home.sandbox("raw", &["--disk-mb", "64"]);
    let raw = home.sandbox_id("raw");
    let supervisors = home.supervisor_pids();
    assert_eq!(supervisors.len(), 1);
    kill_supervisor(supervisors[0]);
    assert_nothing_left(&home, "after kill -9 of a raw sandbox's supervisor");
    assert!(wait_until(30, || {
        let ps = home.json(&["ps"]);
        ps["sandboxes"][0]["state"] == "lost"
    }));
    home.run(&["destroy", "raw"]);
    assert!(
        !state_dir(&home, &raw).exists(),
        "the lost sandbox's image is gone"
    );

    // A task: its work is on the kept image; finish boots over it and saves it.
    let project = tempfile::tempdir().expect("tempdir");
    git(project.path(), &["init", "-q", "-b", "main"]);
    write(&project.path().join("a.txt"), "one\n");
    git(project.path(), &["add", "-A"]);
    git(project.path(), &["commit", "-q", "-m", "first"]);
    let task = home.json(&[
        "task",
        "start",
        project.path().to_str().expect("utf-8"),
        "--name",
        "kept",
        "--disk-mb",
        "256",
    ]);
    assert_eq!(task["diskMB"], 256, "{task:#}");
    let id = task["id"].as_str().expect("id").to_owned();
    let work = home.exec_in_task("kept", "echo kept-work > a.txt", 60);
    assert_eq!(work["exitCode"], 0, "{work:#}");
    let supervisors = home.supervisor_pids();
    assert_eq!(supervisors.len(), 1);
    kill_supervisor(supervisors[0]);
    assert_nothing_left(&home, "after kill -9 of a task's supervisor");
    assert!(wait_until(30, || {
        let ls = home.json(&["ls"]);
        ls["tasks"][0]["state"] == "unsaved"
    }));
    assert!(
        state_dir(&home, &id).join("disk.img").is_file(),
        "the unsaved task keeps its disk image"
    );
    let result = home.json(&["task", "finish", "kept"]);
    assert_eq!(result["verified"], true, "{result:#}");
    let patch =
        std::fs::read_to_string(result["patchPath"].as_str().expect("patchPath")).expect("patch");
    assert!(patch.contains("+kept-work"), "{patch}");
    assert!(
        wait_until(20, || !state_dir(&home, &id).exists()),
        "the kept image goes once the work is saved"
    );
    assert_nothing_left(&home, "after the recovered task finished");
}

/// A guest's devpts has its own bound: one sandbox opening ptys until it fails stops there
/// (ENOSPC) while another sandbox's `exec --tty` still gets a terminal.
#[test]
fn one_sandbox_cannot_take_every_host_pty() {
    if !require_root("one_sandbox_cannot_take_every_host_pty") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("ptyhog", &[]);
    home.sandbox("ptyok", &[]);
    // Holds every pty it gets until told to let go (or two minutes pass, so nothing is left
    // behind if the test dies).
    let hog = r#"
import errno, os, resource, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds, err = [], 0
while len(fds) < 100000:
    try:
        fds.append(os.openpty())
    except OSError as e:
        err = e.errno
        break
with open("/tmp/held.new", "w") as f:
    f.write(f"{len(fds)} {errno.errorcode.get(err, err)}")
os.rename("/tmp/held.new", "/tmp/held")
deadline = time.time() + 120
while not os.path.exists("/tmp/release") and time.time() < deadline:
    time.sleep(0.1)
"#;
    let holder = home
        .command()
        .args(["--json", "exec", "ptyhog", "--timeout", "300", "--"])
        .arg(format!("python3 -c '{hog}'"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dynocap");
    let mut held = String::new();
    assert!(
        wait_until(120, || {
            held = home.sh("ptyhog", "cat /tmp/held 2>/dev/null || true");
            !held.is_empty()
        }),
        "the pty hog never reported"
    );
    let (count, errno) = held.split_once(' ').expect("count and errno");
    let count: u32 = count.parse().expect("count");
    assert_eq!(errno, "ENOSPC", "{held}");
    assert!((1..=256).contains(&count), "opened {count} ptys");

    // While the hog holds its ptys, another sandbox still gets a terminal.
    let tty = home.exec("ptyok", &["--tty"], "tty");
    assert_eq!(tty["exitCode"], 0, "{tty:#}");
    assert!(
        tty["transcript"]
            .as_str()
            .unwrap_or_default()
            .contains("/dev/pts/"),
        "{tty:#}"
    );

    home.sh("ptyhog", "touch /tmp/release");
    let done = holder.wait_with_output().expect("hog exec");
    let result: serde_json::Value = serde_json::from_slice(&done.stdout).expect("Exec JSON");
    assert_eq!(result["exitCode"], 0, "{result:#}");
    // With the ptys released, the hog's sandbox has terminals again.
    assert_eq!(home.exec("ptyhog", &["--tty"], "true")["exitCode"], 0);
}

/// /tmp and /dev/shm are sized tmpfs: writing past the size fails with ENOSPC (not an OOM
/// kill), and the sandbox keeps working.
#[test]
fn tmp_and_shm_fill_up_with_enospc() {
    if !require_root("tmp_and_shm_fill_up_with_enospc") {
        return;
    }
    let home = TestHome::new();
    // 256 MiB of memory: /tmp is 128 MiB, /dev/shm 64 MiB.
    home.sandbox("tmpfs", &["--memory-mb", "256"]);
    let mounts = home.sh("tmpfs", "grep -E ' /(tmp|dev/shm) ' /proc/mounts");
    let shm = mounts
        .lines()
        .find(|l| l.contains(" /dev/shm "))
        .unwrap_or_else(|| panic!("no /dev/shm: {mounts}"));
    for option in ["nosuid", "nodev", "noexec", "size=65536k"] {
        assert!(shm.contains(option), "/dev/shm lacks {option}: {shm}");
    }
    // The kernel leaves tmpfs's default mode (1777) out of /proc/mounts.
    assert_eq!(home.sh("tmpfs", "stat -c %a /dev/shm /tmp"), "1777\n1777\n");
    assert!(mounts.contains("size=131072k"), "/tmp size: {mounts}");

    for (dir, mib) in [("/tmp", 200), ("/dev/shm", 100)] {
        let fill = home.exec(
            "tmpfs",
            &["--timeout", "120"],
            &format!("head -c {mib}M /dev/zero > {dir}/fill; echo rc=$?"),
        );
        let stderr = fill["stderr"].as_str().unwrap_or_default();
        assert!(
            stderr.contains("No space left on device"),
            "{dir}: {fill:#}"
        );
        assert!(
            fill["signal"].is_null(),
            "{dir}: killed, not ENOSPC: {fill:#}"
        );
        assert_ne!(fill["oomKilled"], true, "{dir}: {fill:#}");
        assert_eq!(
            fill["stdout"], "rc=1\n",
            "{dir}: head failed, alone: {fill:#}"
        );
        assert_eq!(
            home.sh("tmpfs", &format!("rm {dir}/fill && echo freed")),
            "freed\n"
        );
    }
    assert_eq!(
        home.sh("tmpfs", "echo ok > /tmp/small && cat /tmp/small"),
        "ok\n"
    );
}
