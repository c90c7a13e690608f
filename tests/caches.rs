//! Per-project package caches end to end through the CLI: a second `pip install -r
//! requirements.txt` in a new task of the same project is served from the project's cache
//! (the index server sees no second request for the wheel), the cache outlives the task that
//! filled it, another project's task sees none of it, `--no-cache` leaves it out, nothing of
//! it reaches the patch, and `dynocap cache ls`/`rm` and `rm --purge --cache` show and clear
//! it. Plus `DYNOCAP_EXTRA_CA` in a `nat` sandbox's system bundle. A cache is an image of a
//! fixed size whose room is set aside on the home's filesystem when it is made: filled, it
//! fails the task's writes to it with a note in the result and leaves the host's space as it
//! was; a start the host cannot back with its new cache is refused naming both, and a cache
//! that exists is counted once, however many tasks of the project use it. A vm task's full
//! or failed cache (a disk of the guest's kernel) is said in its results as a jail's is, and
//! the next jail formats the image afresh before the host's kernel mounts what it wrote.
//!
//! PyPI is tests/support/tlsfix.rs on a 127.X.Y.Z under its real names through
//! `DYNOCAP_RESOLVE` and a `filtered` task allowed `@pypi`: nothing leaves loopback. Needs
//! root.

#[path = "support/tlsfix.rs"]
mod tlsfix;

use std::path::{Path, PathBuf};

use dynocap_e2e::backend::Backend;
use dynocap_e2e::netfix::{product, PYPI_WHEEL};
use dynocap_e2e::small_fs::SmallFs;
use dynocap_e2e::TestHome;
use serde_json::Value;
use tlsfix::TlsFix;

const PYPI: [&str; 2] = ["pypi.org", "files.pythonhosted.org"];
/// Into a directory of its own (not the system's, which pip refuses to change), outside
/// `/workspace`; pip's cache is where it always is, `~/.cache/pip`.
const INSTALL: &str = "pip install --retries 0 --target /tmp/site -r requirements.txt";

fn home_for(home: TestHome, fix: &TlsFix) -> TestHome {
    home.with_env(product::ENV_RESOLVE, &fix.resolve(&PYPI))
        .with_env(product::ENV_EXTRA_CA, &fix.ca_cert.display().to_string())
}

/// A project directory (a plain tree) whose requirements name the fixture's package.
fn project(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("project dir");
    std::fs::write(dir.join("requirements.txt"), "dynocap-fixture==1.0.0\n").expect("write");
    dir
}

fn start(home: &TestHome, name: &str, project: &Path, extra: &[&str]) -> Value {
    let path = project.to_str().expect("utf-8 path");
    let mut args = vec![
        "task",
        "start",
        path,
        "--name",
        name,
        "--network",
        "filtered",
        "--allow-host",
        "@pypi",
    ];
    args.extend_from_slice(extra);
    home.json(&args)
}

/// How many times the index server has sent the wheel itself.
fn wheel_downloads(fix: &TlsFix) -> usize {
    fix.requests()
        .iter()
        .filter(|r| {
            r["status"] == 200 && r["path"].as_str().is_some_and(|p| p.ends_with(PYPI_WHEEL))
        })
        .count()
}

fn install(home: &TestHome, task: &str) {
    let result = home.exec_in_task(task, INSTALL, 300);
    assert_eq!(result["exitCode"], 0, "pip install in {task}: {result:#}");
    assert_eq!(
        home.task_sh(task, "cat /tmp/site/dynocap_fixture/__init__.py"),
        "SERVED_BY = 'the dynocap test index'\n"
    );
}

fn caches(home: &TestHome) -> Vec<Value> {
    home.json(&["cache", "ls"])["caches"]
        .as_array()
        .expect("caches")
        .clone()
}

fn second_install_from_the_cache_on(backend: Backend, test: &str) {
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    let fix = TlsFix::start(&PYPI);
    let home = home_for(home, &fix);
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    let other = project(projects.path(), "other");

    // The first task of the project downloads the wheel and finishes; its cache stays.
    start(&home, "first", &app, &[]);
    install(&home, "first");
    assert_eq!(wheel_downloads(&fix), 1, "{:#?}", fix.requests());
    home.json(&["task", "finish", "first"]);
    let listed = caches(&home);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    let canonical = app.canonicalize().expect("canonical project");
    assert_eq!(listed[0]["project"], canonical.to_str().expect("utf-8"));
    assert_eq!(listed[0]["kind"], "path");
    assert!(listed[0]["bytes"].as_u64().unwrap_or(0) > 0, "{listed:#?}");
    assert_eq!(listed[0]["tasks"], serde_json::json!(["first"]));
    let cache_id = listed[0]["id"].as_str().expect("id").to_owned();
    assert!(
        home.path()
            .join("caches")
            .join(&cache_id)
            .join("cache.img")
            .is_file(),
        "the cache lives in the home's caches/<id>/"
    );

    // A new task of the same project installs without the wheel leaving the server again.
    start(&home, "second", &app, &[]);
    install(&home, "second");
    assert_eq!(
        wheel_downloads(&fix),
        1,
        "the second install downloaded the wheel again: {:#?}",
        fix.requests()
    );
    // Nothing of the cache (or the install) is in the task's work.
    let diff = home.json(&["task", "diff", "second"]);
    assert_eq!(diff["files"], 0, "{diff:#}");
    assert_eq!(diff["patch"], "", "{diff:#}");

    // Another project's task sees none of it and downloads for itself.
    start(&home, "stranger", &other, &[]);
    let seen = home.task_sh(
        "stranger",
        "find ~/.cache/pip -type f | wc -l; grep -c dynocap_fixture -r ~/.cache/pip || true",
    );
    assert_eq!(seen.lines().next(), Some("0"), "{seen}");
    install(&home, "stranger");
    assert_eq!(wheel_downloads(&fix), 2, "{:#?}", fix.requests());
    assert_eq!(caches(&home).len(), 2);

    // --no-cache: the project's cache is not there, and the task downloads.
    start(&home, "fresh", &app, &["--no-cache"]);
    install(&home, "fresh");
    assert_eq!(wheel_downloads(&fix), 3, "{:#?}", fix.requests());

    // A cache a running task has cannot be removed; rm --purge --cache of the project's
    // task removes it once nothing runs with it.
    let busy = home.json_err(&["cache", "rm", &cache_id]);
    assert!(
        busy["message"]
            .as_str()
            .is_some_and(|m| m.contains("second")),
        "{busy:#}"
    );
    for task in ["second", "stranger", "fresh"] {
        home.json(&["task", "finish", task]);
    }
    home.json(&["rm", "first", "--purge"]);
    home.json(&["rm", "second", "--purge", "--cache"]);
    let left = caches(&home);
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!(
        left[0]["project"],
        other.canonicalize().unwrap().to_str().unwrap()
    );
    home.json(&["cache", "rm", "--all"]);
    assert!(caches(&home).is_empty());
}

#[test]
fn a_second_install_of_a_project_comes_from_its_cache_and_no_other_project_sees_it() {
    second_install_from_the_cache_on(
        Backend::Jail,
        "a_second_install_of_a_project_comes_from_its_cache_and_no_other_project_sees_it",
    );
}

#[test]
fn a_raw_sandbox_and_a_host_with_caches_off_get_none() {
    let test = "a_raw_sandbox_and_a_host_with_caches_off_get_none";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    home.sandbox("raw", &[]);
    let mounts = home.sh("raw", "grep -c '/.cache/pip' /proc/self/mountinfo || true");
    assert_eq!(mounts.trim(), "0");
    let off = home.with_env("DYNOCAP_CACHES", "0");
    off.json(&["task", "start", app.to_str().unwrap(), "--name", "off"]);
    let mounts = off.task_sh("off", "grep -c '/.cache/pip' /proc/self/mountinfo || true");
    assert_eq!(mounts.trim(), "0");
    assert!(off.json(&["cache", "ls"])["caches"]
        .as_array()
        .is_some_and(Vec::is_empty));
    // With caches on, a task has them, owned by the sandbox user.
    off.json(&["task", "finish", "off"]);
    let on = TestHome::on(Backend::Jail, test).expect("a home");
    on.json(&["task", "start", app.to_str().unwrap(), "--name", "on"]);
    let owners = on.task_sh(
        "on",
        "grep -c '/.cache/pip' /proc/self/mountinfo; stat -c %u ~/.cache/pip ~/.cache ~/.npm ~/.cargo/registry ~/go/pkg/mod",
    );
    assert_eq!(owners, "1\n1000\n1000\n1000\n1000\n1000\n");
    on.json(&["task", "finish", "on"]);
}

/// The vm: the project's cache disk (a second virtio disk only guests mount) carries what one
/// task of the project left in `~/.cache/pip` to the next; another project's task has a disk
/// of its own, without it.
#[test]
fn a_vm_task_finds_what_the_projects_previous_task_cached() {
    let test = "a_vm_task_finds_what_the_projects_previous_task_cached";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    let other = project(projects.path(), "other");
    let start = |name: &str, dir: &Path| {
        home.json(&["task", "start", dir.to_str().unwrap(), "--name", name]);
    };
    start("vfirst", &app);
    home.task_sh(
        "vfirst",
        "echo kept > ~/.cache/pip/marker && test \"$(stat -c %u ~/.cache/pip/marker)\" = 1000",
    );
    home.json(&["task", "finish", "vfirst"]);
    start("vsecond", &app);
    assert_eq!(home.task_sh("vsecond", "cat ~/.cache/pip/marker"), "kept\n");
    let diff = home.json(&["task", "diff", "vsecond"]);
    assert_eq!(diff["files"], 0, "{diff:#}");
    home.json(&["task", "finish", "vsecond"]);
    start("vstranger", &other);
    let seen = home.task_sh("vstranger", "ls -A ~/.cache/pip | wc -l");
    assert_eq!(seen.trim(), "0");
    home.json(&["task", "finish", "vstranger"]);
    assert_eq!(caches(&home).len(), 2);
}

/// A vm guest's kernel writes its cache disk's blocks as it likes: the host's kernel never
/// mounts what it made. The next jail of the project formats the image afresh first (what the
/// vm cached is gone; it is only downloads), while the room stays set aside, and from then on
/// jails share the cache as before.
#[test]
fn a_jail_after_a_vm_formats_the_cache_afresh_before_mounting_it() {
    let test = "a_jail_after_a_vm_formats_the_cache_afresh_before_mounting_it";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    let start = |name: &str, backend: &str| {
        home.json(&[
            "task",
            "start",
            app.to_str().unwrap(),
            "--name",
            name,
            "--backend",
            backend,
        ]);
    };
    start("byvm", "vm");
    home.task_sh("byvm", "echo from-the-vm > ~/.cache/pip/marker");
    home.json(&["task", "finish", "byvm"]);
    let listed = caches(&home);
    let id = listed[0]["id"].as_str().expect("id").to_owned();
    let dir = home.path().join("caches").join(&id);
    assert!(
        dir.join("vm-wrote").exists(),
        "the vm guest's hold is recorded"
    );
    let image = dir.join("cache.img");
    let allocated = |path: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).expect("image").blocks() * 512
    };
    let size = std::fs::metadata(&image).expect("image").len();

    start("byjail", "jail");
    assert_eq!(
        home.task_sh("byjail", "ls -A ~/.cache/pip"),
        "",
        "the jail mounted what the vm guest wrote"
    );
    assert!(!dir.join("vm-wrote").exists());
    assert!(
        allocated(&image) >= size,
        "the image's room stays set aside: {} of {size}",
        allocated(&image)
    );
    assert_eq!(std::fs::metadata(&image).expect("image").len(), size);
    home.task_sh("byjail", "echo from-a-jail > ~/.cache/pip/marker");
    home.json(&["task", "finish", "byjail"]);
    start("again", "jail");
    assert_eq!(
        home.task_sh("again", "cat ~/.cache/pip/marker"),
        "from-a-jail\n"
    );
    home.json(&["task", "finish", "again"]);
    assert_eq!(caches(&home).len(), 1);
}

fn start_plain(home: &TestHome, name: &str, project: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "task",
        "start",
        project.to_str().expect("utf-8"),
        "--name",
        name,
    ];
    args.extend_from_slice(extra);
    home.json(&args)
}

/// A task writing its cache full gets ENOSPC there and a note naming the cache in its result;
/// the host's free space is what it was (the image's room was set aside when it was made),
/// and the sandbox's own disk still takes writes.
/// Asserts that the exec result `filled` failed on a full package cache and says so, naming the
/// setting to raise, and that it is not taken for a failed disk.
fn says_the_cache_is_full(filled: &Value) {
    assert_ne!(filled["exitCode"], 0, "{filled:#}");
    let stderr = filled["stderr"].as_str().unwrap_or_default();
    assert!(stderr.contains("No space left on device"), "{filled:#}");
    assert!(
        stderr.contains("the project's package cache is full")
            && stderr.contains("DYNOCAP_CACHE_MB"),
        "{filled:#}"
    );
    assert!(
        filled.get("diskError").is_none(),
        "a full cache is no failed disk: {filled:#}"
    );
}

/// Asserts that the exec result `freed` succeeded and no longer speaks of a full cache.
fn says_nothing_of_a_full_cache(freed: &Value) {
    assert_eq!(freed["exitCode"], 0, "{freed:#}");
    assert!(
        !freed["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("package cache is full"),
        "{freed:#}"
    );
}

#[test]
fn a_cache_filled_to_its_bound_is_the_tasks_error_and_leaves_the_host_as_it_was() {
    if !dynocap_e2e::require_root("a_cache_filled_to_its_bound_is_the_tasks_error") {
        return;
    }
    let fs = SmallFs::new(400);
    let home = fs.home(&[("DYNOCAP_CACHE_MB", "64")]);
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    start_plain(&home, "filler", &app, &["--disk-mb", "64"]);
    let listed = caches(&home);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert!(
        listed[0]["bytes"].as_u64().unwrap_or(0) >= 64 << 20,
        "{listed:#?}"
    );
    let before = fs.free_mb();

    let filled = home.exec_in_task(
        "filler",
        "dd if=/dev/zero of=$HOME/.cache/pip/fill bs=1M count=200 conv=fsync",
        120,
    );
    says_the_cache_is_full(&filled);
    let after = fs.free_mb();
    assert!(
        after + 2 >= before,
        "the host's free space went from {before} to {after} MB"
    );

    // The sandbox's own disk is not the cache's: the work goes on.
    let work = home.exec_in_task("filler", "echo more >> requirements.txt && sync", 60);
    assert_eq!(work["exitCode"], 0, "{work:#}");
    assert!(work.get("diskError").is_none(), "{work:#}");
    // Emptied, the cache takes writes again and says nothing.
    let freed = home.exec_in_task(
        "filler",
        "rm ~/.cache/pip/fill && echo x > ~/.cache/pip/y",
        60,
    );
    says_nothing_of_a_full_cache(&freed);
    home.json(&["task", "finish", "filler"]);
    home.json(&["cache", "rm", "--all"]);
}

/// The vm says what the jail says of its cache, though the cache is a disk of the guest's
/// own kernel: filled, the command's result notes it (the agent reads the disk's room), and
/// an error its filesystem records (ext4's `trigger_fs_error`, written as the guest's root)
/// is the command's `diskError`, naming the cache. One vm, the cache 64 MB: lean under TCG.
#[test]
fn a_vm_tasks_full_or_failed_cache_is_said_in_its_result() {
    let test = "a_vm_tasks_full_or_failed_cache_is_said_in_its_result";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let home = home.with_env("DYNOCAP_CACHE_MB", "64");
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    start_plain(&home, "vfull", &app, &[]);

    let filled = home.exec_in_task(
        "vfull",
        "dd if=/dev/zero of=$HOME/.cache/pip/fill bs=1M count=100 conv=fsync",
        300,
    );
    says_the_cache_is_full(&filled);
    // Emptied, it says nothing.
    let freed = home.exec_in_task("vfull", "rm ~/.cache/pip/fill", 60);
    says_nothing_of_a_full_cache(&freed);

    // The cache disk's filesystem records an error (found by the disk's serial).
    let failed = home.exec_in_task(
        "vfull",
        "sudo sh -c 'for d in /sys/block/*; do \
           if [ \"$(cat $d/serial 2>/dev/null)\" = dynocap-cache ]; then \
             echo dynocap-test > /sys/fs/ext4/${d##*/}/trigger_fs_error && echo triggered; \
           fi; done'",
        60,
    );
    assert_eq!(failed["stdout"], "triggered\n", "{failed:#}");
    let disk_error = failed["diskError"].as_str().unwrap_or_default();
    assert!(
        disk_error.contains("the project's package cache failed")
            && disk_error.contains("recorded"),
        "{failed:#}"
    );
    assert!(
        failed["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("package cache failed"),
        "{failed:#}"
    );
}

/// A start whose new cache the home's filesystem cannot set aside beside its disk is refused,
/// naming both and `--no-cache`, which then starts; a cache that exists is counted once, so a
/// second task of the project fits where a second cache would not.
#[test]
fn a_new_cache_is_counted_in_a_start_the_host_cannot_back_and_once_per_project() {
    if !dynocap_e2e::require_root("a_new_cache_is_counted_in_a_start_the_host_cannot_back") {
        return;
    }
    let fs = SmallFs::new(400);
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    std::fs::create_dir_all(fs.mount.join("home")).expect("home");

    let free = fs.free_mb();
    let whole = free.to_string();
    let home = fs.home(&[("DYNOCAP_CACHE_MB", whole.as_str())]);
    let err = home.json_err(&[
        "task",
        "start",
        app.to_str().unwrap(),
        "--name",
        "big",
        "--disk-mb",
        "64",
    ]);
    assert_eq!(err["code"], "policy_denied", "{err:#}");
    let message = err["message"].as_str().unwrap_or_default();
    let cache_words = format!("{free} MB");
    for needle in [
        cache_words.as_str(),
        "64",
        "MB free",
        "DYNOCAP_CACHE_MB",
        "--no-cache",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    assert!(caches(&home).is_empty(), "a refused start made no cache");
    start_plain(&home, "bare", &app, &["--disk-mb", "64", "--no-cache"]);
    home.json(&["task", "finish", "bare"]);
    home.json(&["rm", "bare", "--purge"]);

    // Room for one disk, one cache and a second disk, not for a second cache.
    let free = fs.free_mb();
    let cache_mb = free - 64 - 64 - 64 - 16;
    let cache_text = cache_mb.to_string();
    let home = fs.home(&[("DYNOCAP_CACHE_MB", cache_text.as_str())]);
    start_plain(&home, "one", &app, &["--disk-mb", "64"]);
    start_plain(&home, "two", &app, &["--disk-mb", "64"]);
    let listed = caches(&home);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    let mut users: Vec<&str> = listed[0]["inUseBy"]
        .as_array()
        .expect("inUseBy")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    users.sort_unstable();
    assert_eq!(users, ["one", "two"], "{listed:#?}");
    // Both tasks have the one cache: what one writes, the other reads.
    home.task_sh("one", "echo shared > ~/.cache/pip/marker");
    assert_eq!(home.task_sh("two", "cat ~/.cache/pip/marker"), "shared\n");
    home.json(&["task", "finish", "one"]);
    home.json(&["task", "finish", "two"]);
    home.json(&["cache", "rm", "--all"]);
}

/// `dynocap cache rm` finds a project's cache however the user names the project, as `task
/// start` takes it: a relative directory, `.`, a trailing `/`, a symlink to it (every one
/// resolved to the canonical directory the cache is for); and `rm --purge --cache` reads its
/// argument as a task's name only: a task started `--no-cache` takes its project's cache
/// with it, and a task whose name is another cache's id takes its own project's, not that one.
#[test]
fn a_cache_is_found_by_its_project_as_task_start_names_it_and_rm_reads_a_task() {
    let test = "a_cache_is_found_by_its_project_as_task_start_names_it_and_rm_reads_a_task";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "real/app");
    let other = project(projects.path(), "other");
    let link = projects.path().join("link");
    std::os::unix::fs::symlink(&app, &link).expect("symlink");
    start_plain(&home, "one", &link, &[]);
    let listed = caches(&home);
    assert_eq!(
        listed[0]["project"],
        app.canonicalize().unwrap().to_str().unwrap()
    );
    let id = listed[0]["id"].as_str().expect("id").to_owned();

    // Found (so refused: its task runs) by every name of its directory.
    let refused = |dir: &Path, target: &str| {
        let out = home
            .command()
            .current_dir(dir)
            .args(["--json", "cache", "rm", target])
            .output()
            .expect("spawn dynocap");
        let value: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(value["error"]["code"], "conflict", "{target}: {value:#}");
        assert!(
            value["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("one")),
            "{target}: {value:#}"
        );
    };
    let trailing = format!("{}/", app.display());
    let doubled = format!("{}//app", projects.path().join("real").display());
    refused(&app, ".");
    refused(&app, "./");
    refused(projects.path(), "real/app");
    refused(projects.path(), "link");
    refused(projects.path(), &trailing);
    refused(projects.path(), &doubled);
    refused(projects.path(), link.to_str().unwrap());
    let missing = home.json_err(&["cache", "rm", other.to_str().unwrap()]);
    assert_eq!(missing["code"], "not_found", "{missing:#}");
    // A repository URL is read as its project: a path in a login's home is that user's.
    let repository = home.json_err(&["cache", "rm", "alice@example.org:app.git"]);
    assert!(
        repository["message"]
            .as_str()
            .is_some_and(|m| m.contains("the project alice@example.org/app has no package cache")),
        "{repository:#}"
    );

    // A --no-cache task of the project: rm --purge --cache takes the project's cache.
    start_plain(&home, "bare", &app, &["--no-cache"]);
    home.json(&["task", "finish", "one"]);
    home.json(&["task", "finish", "bare"]);
    home.json(&["rm", "bare", "--purge", "--cache"]);
    assert!(caches(&home).is_empty(), "{:#?}", caches(&home));

    // A task named as the app's cache id is a task of the other project.
    start_plain(&home, "two", &app, &[]);
    start_plain(&home, &id, &other, &[]);
    home.json(&["task", "finish", "two"]);
    home.json(&["task", "finish", &id]);
    assert_eq!(caches(&home).len(), 2);
    home.json(&["rm", &id, "--purge", "--cache"]);
    let left = caches(&home);
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!(left[0]["id"], id.as_str(), "{left:#?}");
    home.json(&["cache", "rm", "--all"]);
}

/// A project directory whose path is not UTF-8 (here behind a UTF-8 symlink, as MCP would
/// name it) is refused at the start, saying why: its task could not be recorded, and its
/// cache could not be told apart from another such directory's.
#[test]
fn a_project_whose_path_is_not_utf8_is_refused_with_the_reason() {
    use std::os::unix::ffi::OsStrExt;
    let test = "a_project_whose_path_is_not_utf8_is_refused_with_the_reason";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let projects = tempfile::tempdir().expect("projects");
    let odd = projects
        .path()
        .join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&odd).expect("mkdir");
    std::fs::write(odd.join("f"), "x\n").expect("write");
    let link = projects.path().join("link");
    std::os::unix::fs::symlink(&odd, &link).expect("symlink");
    let err = home.json_err(&["task", "start", link.to_str().unwrap(), "--name", "odd"]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("not UTF-8") && m.contains("rename")),
        "{err:#}"
    );
    assert!(caches(&home).is_empty());
    let listed = home.json(&["ls"]);
    assert!(
        listed["tasks"].as_array().is_some_and(Vec::is_empty),
        "{listed:#}"
    );
}

/// A start that never becomes a task (here a clone of a repository nothing serves: its host
/// resolves to a loopback address nobody listens on) keeps no cache for its project: a
/// mistyped repository, started again and again, must not leave image after image with its
/// whole size set aside on the host. A project's cache made before stays.
#[test]
fn a_failed_start_of_a_new_project_leaves_no_cache() {
    let test = "a_failed_start_of_a_new_project_leaves_no_cache";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let home = home.with_env(product::ENV_RESOLVE, "example.org:443:127.83.41.7");
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    start_plain(&home, "kept", &app, &[]);
    home.json(&["task", "finish", "kept"]);
    for name in ["typo1", "typo2"] {
        let err = home.json_err(&[
            "task",
            "start",
            "--repo",
            "https://example.org/team/none",
            "--name",
            name,
        ]);
        assert!(
            err["message"]
                .as_str()
                .is_some_and(|m| m.contains("example.org/team/none")),
            "{err:#}"
        );
        let listed = caches(&home);
        assert_eq!(listed.len(), 1, "{listed:#?}");
        assert_eq!(
            listed[0]["tasks"],
            serde_json::json!(["kept"]),
            "{listed:#?}"
        );
    }
    let dirs = std::fs::read_dir(home.path().join("caches"))
        .expect("caches dir")
        .count();
    assert_eq!(dirs, 1, "only the kept project's cache directory is left");
    home.json(&["cache", "rm", "--all"]);
}

/// `cache rm` asks the cache's lock as well as the catalog: a cache a supervisor still holds
/// (here the test holds its lock, shared, as a jail's supervisor does from the guest's boot to
/// its end) is not removed under it, even when no task of the catalog runs; `--all` says which
/// it removed before.
#[test]
fn cache_rm_leaves_a_cache_a_supervisor_still_holds() {
    let test = "cache_rm_leaves_a_cache_a_supervisor_still_holds";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let projects = tempfile::tempdir().expect("projects");
    let app = project(projects.path(), "app");
    start_plain(&home, "one", &app, &[]);
    home.json(&["task", "finish", "one"]);
    let id = caches(&home)[0]["id"].as_str().expect("id").to_owned();
    let lock = std::fs::File::open(home.path().join("caches").join(&id).join("cache.lock"))
        .expect("the cache's lock");
    let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockSharedNonblock)
        .map_err(|(_, e)| e)
        .expect("shared, as a jail's supervisor holds it");
    for args in [&["cache", "rm", id.as_str()][..], &["cache", "rm", "--all"]] {
        let err = home.json_err(args);
        assert_eq!(err["code"], "conflict", "{err:#}");
        assert!(
            err["message"]
                .as_str()
                .is_some_and(|m| m.contains("held by a sandbox's supervisor")),
            "{err:#}"
        );
    }
    assert!(home
        .path()
        .join("caches")
        .join(&id)
        .join("cache.img")
        .is_file());
    drop(held);
    home.json(&["cache", "rm", &id]);
    assert!(caches(&home).is_empty());
}
