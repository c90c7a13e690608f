//! Jail checkpoints and forks on a home whose filesystem shares extents: a small XFS with
//! reflink that the test makes and loop-mounts (as root; skipped otherwise). There a
//! checkpoint and a fork clone the frozen disk image (`FICLONE`) instead of copying what the
//! guest wrote: the checkpoint's and the forks' images share the source's extents (FIEMAP's
//! shared flag, read with `filefrag`), three forks take next to none of the filesystem's free
//! space, and each still finishes with a verified patch holding the shared work and its own
//! change only. A checkpoint restored after the workspace broke gives back the workspace and
//! what was written outside it. A supervisor killed during a fork (its disk cloned and synced,
//! not yet in place) leaves the source's work, no record and no files of the fork. Once the
//! filesystem is full, a fork's write it cannot back fails in the guest's `fsync` (the fork's
//! clone sets nothing aside), and the result says the disk failed.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use dynocap_e2e::small_fs::free_mb;
use dynocap_e2e::*;

/// A small XFS with reflink, loop-mounted for a test's home and unmounted on drop.
struct XfsFs {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl XfsFs {
    /// `None` (the test skips) without root or mkfs.xfs.
    fn new(test: &str, megabytes: u64) -> Option<XfsFs> {
        if !can_make_xfs(test) {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("home.xfs");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).expect("mountpoint");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(megabytes << 20))
            .expect("image");
        run_ok(
            "mkfs.xfs",
            &[
                "-q".as_ref(),
                "-m".as_ref(),
                "reflink=1".as_ref(),
                image.as_ref(),
            ],
        );
        run_ok(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_ref(),
                mount.as_ref(),
            ],
        );
        Some(XfsFs { mount, _dir: dir })
    }

    fn home(&self) -> TestHome {
        TestHome::at(self.mount.join("home"))
    }
}

/// Whether this test can make an XFS (root, mkfs.xfs); says why it skips when not.
fn can_make_xfs(test: &str) -> bool {
    if !require_root(test) {
        return false;
    }
    let has_mkfs = ["/usr/sbin/mkfs.xfs", "/sbin/mkfs.xfs"]
        .iter()
        .any(|p| Path::new(p).exists());
    if !has_mkfs {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test} needs mkfs.xfs (apt-get install xfsprogs)"
        );
        eprintln!("SKIPPED {test}: needs mkfs.xfs (apt-get install xfsprogs)");
    }
    has_mkfs
}

impl Drop for XfsFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn run_ok(cmd: &str, args: &[&std::ffi::OsStr]) {
    let status = Command::new(cmd)
        .args(args)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .status()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(status.success(), "{cmd} {args:?}: {status}");
}

/// The bytes of `path`'s extents that FIEMAP flags shared (`filefrag -v`).
fn shared_bytes(path: &Path) -> u64 {
    let out = Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .expect("filefrag (e2fsprogs)");
    let text = String::from_utf8_lossy(&out.stdout);
    let block: u64 = text
        .lines()
        .find_map(|l| l.split("blocksize of ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(4096);
    // "  0:   0..  15:  1234.. 1249:  16:   last,shared,eof"
    text.lines()
        .filter(|l| l.contains("shared"))
        .filter_map(|l| l.split(':').nth(3))
        .filter_map(|len| len.trim().parse::<u64>().ok())
        .sum::<u64>()
        * block
}

fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(entry.path());
            }
            all.push(entry.path());
        }
    }
    all
}

const WRITTEN: u64 = 64_000_000;

#[test]
fn on_xfs_checkpoints_and_forks_clone_the_disk_and_share_its_extents() {
    let test = "on_xfs_checkpoints_and_forks_clone_the_disk_and_share_its_extents";
    let Some(fs) = XfsFs::new(test, 4096) else {
        return;
    };
    let home = fs.home();
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "src", "--disk-mb", "512"]);
    home.task_sh(
        "src",
        &format!(
            "echo shared >> a.txt && mkdir -p ~/deps && head -c {WRITTEN} /dev/urandom > ~/deps/blob && sync"
        ),
    );
    let sum = home.task_sh("src", "md5sum < ~/deps/blob");
    let made = home.json(&["task", "checkpoint", "src", "good"]);
    assert!(
        made["bytes"].as_u64().expect("bytes") >= WRITTEN,
        "{made:#}"
    );
    let src_dir = home.path().join("sandboxes").join(home.sandbox_id("src"));
    let checkpoint = src_dir.join("checkpoints/good/disk.img");
    assert!(
        shared_bytes(&checkpoint) >= WRITTEN,
        "the checkpoint shares the written extents: {} bytes shared",
        shared_bytes(&checkpoint)
    );
    let log = std::fs::read_to_string(
        home.path()
            .join("logs")
            .join(format!("{}.log", home.sandbox_id("src"))),
    )
    .unwrap_or_default();
    assert!(
        log.contains("cloned (FICLONE"),
        "the log says it cloned: {log}"
    );

    // Broken, restored: the workspace and the install are back.
    home.task_sh("src", "rm a.txt && echo junk > junk.txt && rm ~/deps/blob");
    home.json(&["task", "restore", "src", "good"]);
    assert_eq!(home.task_sh("src", "md5sum < ~/deps/blob"), sum);

    // Three forks take next to nothing of the filesystem: their disks share the source's.
    let free_before = free_mb(&fs.mount);
    for fork in ["f1", "f2", "f3"] {
        home.json(&["task", "fork", "src", fork]);
    }
    let f1 = home.path().join("sandboxes").join(home.sandbox_id("f1"));
    assert!(
        shared_bytes(&f1.join("disk.img")) >= WRITTEN,
        "the fork's disk shares the source's extents"
    );
    let used = free_before.saturating_sub(free_mb(&fs.mount));
    assert!(
        used < WRITTEN >> 20,
        "three forks took {used} MB, less than one copy of what was written"
    );
    for (fork, file) in [("f1", "one.txt"), ("f2", "two.txt"), ("f3", "three.txt")] {
        assert_eq!(home.task_sh(fork, "md5sum < ~/deps/blob"), sum, "{fork}");
        home.task_sh(fork, &format!("echo {fork} > {file}"));
    }
    for (fork, file) in [("f1", "one.txt"), ("f2", "two.txt"), ("f3", "three.txt")] {
        let patch = verified_patch(&home.json(&["task", "finish", fork]));
        assert_eq!(patch_files(&patch), ["a.txt", file], "{fork}: {patch}");
        assert!(patch.contains("+shared"), "{fork}: {patch}");
    }
    let patch = verified_patch(&home.json(&["task", "finish", "src"]));
    assert_eq!(patch_files(&patch), ["a.txt"], "{patch}");
    assert!(!patch.contains("junk"), "{patch}");
}

#[test]
fn on_xfs_a_supervisor_killed_during_a_clone_leaves_the_source_and_no_fork() {
    let test = "on_xfs_a_supervisor_killed_during_a_clone_leaves_the_source_and_no_fork";
    let Some(fs) = XfsFs::new(test, 2048) else {
        return;
    };
    let home = fs
        .home()
        .with_env("DYNOCAP_FAILPOINTS", "supervisor.fork.copied=kill");
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "src", "--disk-mb", "512"]);
    home.task_sh("src", "echo work >> a.txt");
    home.json_err(&["task", "fork", "src", "half"]);
    home.assert_only_tasks(&["src"]);
    let patch = verified_patch(&home.json(&["task", "finish", "src"]));
    assert!(
        patch.contains("+work"),
        "the source's work is kept: {patch}"
    );
    // The killed clone's temporary goes with the source's state directory, which the
    // finish removes after its reply.
    let leftovers = || -> Vec<_> {
        walkdir(&home.path().join("sandboxes"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(".making-"))
            .collect()
    };
    assert!(
        wait_until(10, || leftovers().is_empty()),
        "nothing half-made: {:?}",
        leftovers()
    );
    assert!(
        wait_until(10, || home.none_mounted("src")),
        "nothing of the source's disk stays mounted"
    );
}

/// A fork's clone sets nothing aside: it is admitted with less room left than its disk, and
/// once the home's filesystem is full, its guest's write fails where the guest sees it (the write or the `fsync` of `dd conv=fsync`), never
/// acknowledged and lost.
#[test]
fn on_a_full_xfs_a_forks_write_fails_in_its_guest() {
    let test = "on_a_full_xfs_a_forks_write_fails_in_its_guest";
    let Some(fs) = XfsFs::new(test, 1600) else {
        return;
    };
    // No package caches: a second task of the project sets its cache's room aside, which
    // this test, about the disk, would have to leave free.
    let home = fs.home().with_env("DYNOCAP_CACHES", "0");
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "src", "--disk-mb", "512"]);
    home.task_sh("src", "echo work >> a.txt");
    // Less room left than the fork's disk: a clone sets nothing aside, so it is admitted
    // with the headroom free.
    let before_fork = fs.mount.join("ballast-before-fork");
    run_ok(
        "fallocate",
        &[
            "-l".as_ref(),
            format!("{}M", free_mb(&fs.mount).saturating_sub(200)).as_ref(),
            before_fork.as_ref(),
        ],
    );
    assert!(free_mb(&fs.mount) < 512, "less room than the fork's disk");
    home.json(&["task", "fork", "src", "fork"]);
    // Every block left taken from the host's side.
    let ballast = fs.mount.join("ballast");
    let free = free_mb(&fs.mount);
    run_ok(
        "fallocate",
        &[
            "-l".as_ref(),
            format!("{}M", free.saturating_sub(1)).as_ref(),
            ballast.as_ref(),
        ],
    );
    let _ = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", fs.mount.join("ballast-small").display()))
        .arg("bs=4k")
        .stderr(std::process::Stdio::null())
        .status();
    // XFS keeps a few blocks for its own transactions, which no file write gets.
    assert!(free_mb(&fs.mount) <= 1, "the home's filesystem is full");
    let (failed, text) = home.task_exec_outcome(
        "fork",
        "dd if=/dev/urandom of=big bs=1M count=64 conv=fsync",
    );
    assert!(failed, "the write the host cannot back fails: {text}");
    // Which error the guest sees first is a race: the write or its fsync meets the host's
    // ENOSPC itself, or the disk's filesystem has already turned read-only on an earlier
    // failed write-back. Either way the write was never acknowledged.
    assert!(
        text.contains("fsync failed") || text.contains("error writing"),
        "the guest's write or fsync failed: {text}"
    );
    assert!(
        text.contains("No space left") || text.contains("Read-only file system"),
        "{text}"
    );
    assert!(
        text.contains("diskError"),
        "the result says the disk failed: {text}"
    );
    let _ = std::fs::remove_file(&ballast);
    let _ = std::fs::remove_file(fs.mount.join("ballast-small"));
}

/// A directory for a home with a reflink pool (`DYNOCAP_JAIL_POOL_MB`): dropped after the
/// home (declare it first), it unmounts the pool the home mounted and removes everything.
struct PoolDir {
    dir: tempfile::TempDir,
}

impl PoolDir {
    fn home(&self, mb: &str) -> TestHome {
        TestHome::at(self.dir.path().join("h")).with_env("DYNOCAP_JAIL_POOL_MB", mb)
    }
}

impl Drop for PoolDir {
    /// Detaches the pool and the shared bind mount of `sandboxes/` under it (lazily: a
    /// supervisor still ending may hold them), so the directory and its 2 GiB image can be
    /// removed; with either left mounted, its removal failed and kept everything.
    fn drop(&mut self) {
        let sandboxes = self.dir.path().join("h/sandboxes");
        let listed = format!(" {} ", sandboxes.display());
        for _ in 0..4 {
            let mounted = std::fs::read_to_string("/proc/mounts")
                .is_ok_and(|mounts| mounts.contains(&listed));
            if !mounted {
                break;
            }
            let _ = Command::new("umount").arg("-l").arg(&sandboxes).status();
        }
    }
}

/// On a home on the host's ext4, the reflink pool is an XFS image mounted on its
/// `sandboxes/` by the first command: checkpoints and forks there clone, three forks take
/// next to none of its room and finish with their own verified patches. A pool the host
/// cannot back is refused with `policy_denied`, naming the free space, and leaves no image;
/// so is one whose `sandboxes/` holds some of the home's own, before anything is made.
#[test]
fn a_reflink_pool_gives_an_ext4_home_clones() {
    let test = "a_reflink_pool_gives_an_ext4_home_clones";
    if !can_make_xfs(test) {
        return;
    }
    let pool = PoolDir {
        dir: tempfile::Builder::new()
            .prefix("dcpool")
            .tempdir_in("/tmp")
            .expect("tempdir"),
    };
    let refused = pool.home("100000000").json_err(&["ls"]);
    assert_eq!(refused["code"], "policy_denied", "{refused:#}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("MB free")),
        "{refused:#}"
    );
    let home_dir = pool.dir.path().join("h");
    assert!(!home_dir.join("jail-pool.xfs").exists());
    assert!(!home_dir.join("jail-pool.xfs.making").exists());
    // A home whose sandboxes/ holds some of its own: refused before anything is made.
    let used_home = pool.dir.path().join("used");
    std::fs::create_dir_all(used_home.join("sandboxes/leftover")).expect("leftover");
    let refused = TestHome::at(used_home.clone())
        .with_env("DYNOCAP_JAIL_POOL_MB", "2048")
        .json_err(&["ls"]);
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("holds sandboxes")),
        "{refused:#}"
    );
    assert!(!used_home.join("jail-pool.xfs").exists());

    let home = pool.home("2048");
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "src", "--disk-mb", "512"]);
    let sandboxes = home_dir.join("sandboxes");
    let mounts = std::fs::read_to_string("/proc/mounts").expect("mounts");
    assert!(
        mounts.contains(&format!("{} xfs", sandboxes.display())),
        "the pool is mounted on the home's sandboxes: {mounts}"
    );
    home.task_sh(
        "src",
        &format!("echo shared >> a.txt && head -c {WRITTEN} /dev/urandom > ~/blob && sync"),
    );
    home.json(&["task", "checkpoint", "src", "cp"]);
    let src_dir = sandboxes.join(home.sandbox_id("src"));
    assert!(shared_bytes(&src_dir.join("checkpoints/cp/disk.img")) >= WRITTEN);
    let free_before = free_mb(&sandboxes);
    for (fork, file) in [("f1", "one.txt"), ("f2", "two.txt"), ("f3", "three.txt")] {
        home.json(&["task", "fork", "src", fork]);
        home.task_sh(fork, &format!("echo {fork} > {file}"));
    }
    let used = free_before.saturating_sub(free_mb(&sandboxes));
    assert!(
        used < WRITTEN >> 20,
        "three forks took {used} MB of the pool"
    );
    for (fork, file) in [("f1", "one.txt"), ("f2", "two.txt"), ("f3", "three.txt")] {
        let patch = verified_patch(&home.json(&["task", "finish", fork]));
        assert_eq!(patch_files(&patch), ["a.txt", file], "{fork}: {patch}");
    }
}

/// The reflink pool's row of `dynocap --json doctor`.
fn doctor_pool_row(home: &TestHome) -> Value {
    let out = home.run(&["--json", "doctor"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON");
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "reflink pool")
        .cloned()
        .unwrap_or(Value::Null)
}

/// Unmounts a pool a test's home mounted on `0` when dropped (declare it after the
/// filesystem the home is on, and before the home).
struct PoolMount(PathBuf);

impl Drop for PoolMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn pool_mounted_on(sandboxes: &Path) -> bool {
    std::fs::read_to_string("/proc/mounts")
        .expect("mounts")
        .contains(&format!("{} xfs", sandboxes.display()))
}

/// The pool on an ext4 home (a small loop filesystem, so the room it takes and gives back is
/// the test's own): `doctor` shows it before it is made (and makes nothing), then its size,
/// room and sandboxes, and warns when it is nearly full; `jail-pool rm` is refused, naming
/// the task, while the task lives on it; once the task is removed, it unmounts the pool and
/// deletes its image, giving the room back; the next start with DYNOCAP_JAIL_POOL_MB set makes
/// it again. An image that does not mount is an error naming the fix, which `jail-pool rm`
/// then removes.
#[test]
fn a_reflink_pool_is_shown_and_removed() {
    let test = "a_reflink_pool_is_shown_and_removed";
    if !can_make_xfs(test) {
        return;
    }
    let fs = dynocap_e2e::small_fs::SmallFs::new(2000);
    let root = fs.mount.join("home");
    let sandboxes = root.join("sandboxes");
    let image = root.join("jail-pool.xfs");
    let _pool = PoolMount(sandboxes.clone());
    // No package caches: they would take the home's room beside the pool's, and stay.
    let home = fs.home(&[("DYNOCAP_JAIL_POOL_MB", "1024"), ("DYNOCAP_CACHES", "0")]);

    // Doctor looks only: the pool is configured, not made, and doctor does not make it.
    let row = doctor_pool_row(&home);
    assert_eq!(row["status"], "ok", "{row:#}");
    assert!(
        row["detail"]
            .as_str()
            .is_some_and(|d| d.contains("not made yet")),
        "{row:#}"
    );
    assert!(!image.exists(), "doctor made the pool");
    let free_without_pool = fs.free_mb();

    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "t", "--disk-mb", "256"]);
    assert!(
        pool_mounted_on(&sandboxes),
        "the start made and mounted the pool"
    );
    // A sandbox of another home, whose supervisor's private mount namespace copies every
    // mount there is, this pool's too: its copy must not outlive the pool's removal.
    let other = TestHome::new();
    other.sandbox("o", &[]);
    let id = home.sandbox_id("t");
    let row = doctor_pool_row(&home);
    assert_eq!(row["status"], "ok", "{row:#}");
    let detail = row["detail"].as_str().expect("detail");
    for needle in [
        "1024 MB",
        "mounted on",
        "MB used",
        "MB free",
        "1 sandbox on it",
    ] {
        assert!(detail.contains(needle), "{needle:?} not in {detail}");
    }
    let shown = home.json(&["jail-pool", "show"]);
    let pool = &shown["pool"];
    assert_eq!(pool["mounted"], true, "{shown:#}");
    assert_eq!(pool["imageMB"], 1024, "{shown:#}");
    assert_eq!(pool["sandboxes"][0]["name"], "t", "{shown:#}");
    assert_eq!(pool["sandboxes"][0]["id"], id.as_str(), "{shown:#}");
    let size = pool["room"]["sizeMB"].as_u64().expect("sizeMB");
    assert!((900..=1024).contains(&size), "{shown:#}");

    // Refused while the task lives on it, naming it; nothing changes.
    let refused = home.json_err(&["jail-pool", "rm"]);
    assert_eq!(refused["code"], "conflict", "{refused:#}");
    let message = refused["message"].as_str().expect("message");
    for needle in ["task t", id.as_str(), "dynocap rm --force"] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    assert!(pool_mounted_on(&sandboxes) && image.exists());
    assert_eq!(home.task_sh("t", "cat a.txt"), "a\n", "the task runs on");

    // A full pool: a ballast of the host's fills it (counted with the task and its fork, as
    // a directory of the pool's with no record).
    // Doctor warns; a start the pool cannot back, and a fork's write (its clone set nothing
    // aside), fail saying the pool is full and how to make it larger.
    home.json(&["task", "fork", "t", "f"]);
    let ballast = sandboxes.join("ballast");
    std::fs::create_dir(&ballast).expect("ballast dir");
    for (n, bs) in ["1M", "4k"].into_iter().enumerate() {
        let _ = Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", ballast.join(n.to_string()).display()))
            .arg(format!("bs={bs}"))
            .stderr(std::process::Stdio::null())
            .status();
    }
    assert!(free_mb(&sandboxes) <= 1, "the pool is full");
    let row = doctor_pool_row(&home);
    assert_eq!(row["status"], "warning", "{row:#}");
    assert!(
        row["detail"]
            .as_str()
            .is_some_and(|d| d.contains("nearly full") && d.contains("3 sandboxes")),
        "{row:#}"
    );
    assert!(
        row["hint"]
            .as_str()
            .is_some_and(|h| h.contains("jail-pool rm")),
        "{row:#}"
    );
    let (_, text) =
        home.task_exec_outcome("f", "dd if=/dev/urandom of=big bs=1M count=64 conv=fsync");
    assert!(text.contains("diskError"), "the disk failed: {text}");
    for needle in [
        "is full",
        "reflink pool",
        "jail-pool rm",
        "DYNOCAP_JAIL_POOL_MB",
    ] {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    let refused = home.json_err(&["task", "start", &path, "--name", "t3", "--disk-mb", "256"]);
    let message = refused["message"].as_str().expect("message");
    for needle in ["reflink pool", "jail-pool rm"] {
        assert!(message.contains(needle), "{needle:?} not in {refused:#}");
    }
    std::fs::remove_dir_all(&ballast).expect("remove the ballast");
    home.json(&["rm", "f", "--force", "--purge"]);

    // Once the task is gone, the pool goes: unmounted, its image deleted, its room back.
    home.json(&["rm", "t", "--force", "--purge"]);
    assert!(
        wait_until(60, || std::fs::read_dir(&sandboxes)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false)),
        "the task's state directory goes with its teardown"
    );
    home.wait_for_teardown();
    let out = home.run(&["jail-pool", "rm"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(said.contains("removed the reflink pool"), "{said}");
    assert!(
        said.contains("the next start makes the pool again"),
        "{said}"
    );
    assert!(!image.exists(), "the image is deleted");
    assert!(!pool_mounted_on(&sandboxes), "the pool is unmounted");
    // The other home's supervisor lost its copy with the unmount here: nothing holds the
    // image, and its room is back.
    assert!(!said.contains("once pid"), "{said}");
    assert_eq!(
        other.sh("o", "echo up"),
        "up\n",
        "the other home's sandbox runs on"
    );
    // ext4 counts a deleted file's blocks free once its journal commits (every 5 s).
    assert!(
        wait_until(30, || fs.free_mb() + 16 >= free_without_pool),
        "{} MB free after the removal, {free_without_pool} MB before the pool",
        fs.free_mb()
    );
    assert!(doctor_pool_row(&home)["detail"]
        .as_str()
        .is_some_and(|d| d.contains("not made yet")));
    let nothing = home.json(&["jail-pool", "rm"]);
    assert_eq!(nothing["removed"], false, "{nothing:#}");

    // An image that does not mount: the error names it and the fix, which works.
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(600 << 20))
        .expect("a damaged image");
    let err = home.json_err(&["ls"]);
    let message = err["message"].as_str().expect("message");
    for needle in ["mounting the reflink pool", "dmesg", "dynocap jail-pool rm"] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    let removed = home.json(&["jail-pool", "rm"]);
    assert_eq!(removed["removed"], true, "{removed:#}");
    assert_eq!(removed["unmounted"], false, "{removed:#}");

    // The next start with the variable set makes it again.
    home.json(&["task", "start", &path, "--name", "t2", "--disk-mb", "256"]);
    assert!(image.exists() && pool_mounted_on(&sandboxes));
    assert_eq!(home.task_sh("t2", "cat a.txt"), "a\n");
    home.json(&["rm", "t2", "--force", "--purge"]);
    home.wait_for_teardown();
}

/// Without a pool, `doctor` says whether the home's jail checkpoints and forks are clones (a
/// home on XFS) or copies (a home on ext4), and for the copies what makes them clones; neither
/// is a warning.
#[test]
fn doctor_says_whether_a_homes_forks_clone_or_copy() {
    let test = "doctor_says_whether_a_homes_forks_clone_or_copy";
    let Some(xfs) = XfsFs::new(test, 512) else {
        return;
    };
    let row = doctor_pool_row(&xfs.home());
    assert_eq!(row["status"], "ok", "{row:#}");
    let detail = row["detail"].as_str().expect("detail");
    assert!(detail.contains("are clones"), "{detail}");

    let ext4 = dynocap_e2e::small_fs::SmallFs::new(256);
    let row = doctor_pool_row(&ext4.home(&[]));
    assert_eq!(row["status"], "ok", "{row:#}");
    let detail = row["detail"].as_str().expect("detail");
    for needle in ["cannot share extents", "copies", "DYNOCAP_JAIL_POOL_MB"] {
        assert!(detail.contains(needle), "{needle:?} not in {detail}");
    }
}
