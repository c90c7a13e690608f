//! Shared helpers for the end-to-end tests: locate the built binaries, give every test its
//! own `DYNOCAP_HOME`, run `dynocap` as a user would, and clean up sandboxes afterwards.

pub mod backend;
pub mod bench;
pub mod home_processes;
pub mod host_view;
pub mod images;
pub mod netfix;
pub mod netns;
pub mod oci;
pub mod small_fs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub use backend::Backend;

/// `target/<profile>/` — where cargo put `dynocap` and `dynocap-agent` for this test run.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    for bin in ["dynocap", "dynocap-core", "dynocap-agent"] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: build the workspace first (`cargo build --workspace` or `cargo test --workspace`)",
            dir.join(bin).display()
        );
    }
    dir.to_path_buf()
}

pub fn dynocap_bin() -> PathBuf {
    bin_dir().join("dynocap")
}

/// Whether this test may run: it needs root (namespaces mapped to a host uid range, cgroups).
/// Outside CI a non-root run skips with the reason; in CI a missing requirement is a failure,
/// because CI runs as root and nothing may be silently skipped there.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs root (user namespaces mapped to a host uid range, cgroup limits), and CI must run as root");
    }
    eprintln!(
        "SKIPPED {test}: needs root (user namespaces mapped to a host uid range, cgroup limits)"
    );
    false
}

/// `DYNOCAP_CACHE_MB` for every test home that does not set its own.
pub const TEST_CACHE_MB: &str = "256";

/// A private `DYNOCAP_HOME`; every sandbox started through it is destroyed on drop.
pub struct TestHome {
    path: PathBuf,
    /// Extra environment for every `dynocap` command of this home ([`TestHome::with_env`]).
    env: Vec<(String, String)>,
    /// Removed on drop; `None` for a home the test placed itself ([`TestHome::at`]).
    _dir: Option<tempfile::TempDir>,
}

impl Default for TestHome {
    fn default() -> Self {
        Self::new()
    }
}

impl TestHome {
    pub fn new() -> Self {
        // Short paths: control sockets live under it and unix socket paths are limited.
        let dir = tempfile::Builder::new()
            .prefix("dc")
            .tempdir_in("/tmp")
            .expect("temp DYNOCAP_HOME");
        Self {
            path: dir.path().to_owned(),
            env: Vec::new(),
            _dir: Some(dir),
        }
    }

    /// A home at `path` (e.g. on a filesystem the test mounted); the test removes it.
    pub fn at(path: PathBuf) -> Self {
        std::fs::create_dir_all(&path).expect("create DYNOCAP_HOME");
        Self {
            path,
            env: Vec::new(),
            _dir: None,
        }
    }

    /// Sets `key=value` for every `dynocap` command this home runs (cleanup included).
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The extra environment of this home's `dynocap` commands ([`TestHome::with_env`]), for
    /// a test that starts `dynocap` in a way of its own (in a network namespace, say).
    pub fn env_vars(&self) -> &[(String, String)] {
        &self.env
    }

    pub fn command(&self) -> Command {
        let mut cmd = Command::new(dynocap_bin());
        cmd.env("DYNOCAP_HOME", self.path())
            .env_remove("DYNOCAP_BACKEND")
            // A project's package cache sets its whole size aside on the host when made (2 GB
            // by default): tests start many projects at once, and none fills more than this.
            // A test that sizes caches itself sets its own with `with_env`.
            .env("DYNOCAP_CACHE_MB", TEST_CACHE_MB)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs `dynocap ARGS` and returns its output, whatever the exit status.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("spawn dynocap")
    }

    /// Runs `dynocap --json ARGS`, asserts success and parses stdout.
    pub fn json(&self, args: &[&str]) -> Value {
        let out = self
            .command()
            .arg("--json")
            .args(args)
            .output()
            .expect("spawn dynocap");
        assert!(
            out.status.success(),
            "dynocap {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("dynocap --json prints JSON")
    }

    /// Runs `dynocap --json ARGS`, asserts failure and returns the error object.
    pub fn json_err(&self, args: &[&str]) -> Value {
        let out = self
            .command()
            .arg("--json")
            .args(args)
            .output()
            .expect("spawn dynocap");
        assert!(
            !out.status.success(),
            "dynocap {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let value: Value =
            serde_json::from_slice(&out.stdout).expect("errors are JSON with --json");
        value["error"].clone()
    }

    /// Boots a raw sandbox with extra `run` flags and returns its JSON object.
    pub fn sandbox(&self, name: &str, flags: &[&str]) -> Value {
        let mut args = vec!["run", name];
        args.extend_from_slice(flags);
        self.json(&args)
    }

    /// `dynocap --json exec NAME -- COMMAND` with extra exec flags before `--`. The process
    /// exits with the command's exit code, so only the printed Exec object is checked.
    pub fn exec(&self, name: &str, flags: &[&str], command: &str) -> Value {
        let mut args = vec!["--json", "exec", name];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", command]);
        let out = self.command().args(&args).output().expect("spawn dynocap");
        let value: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
            panic!(
                "dynocap {args:?} printed no JSON ({err}, {}):\nstdout: {}\nstderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(
            value.get("error").is_none(),
            "dynocap {args:?} failed: {value:#}"
        );
        assert!(
            value.get("timedOut").is_some(),
            "not an Exec object: {value:#}"
        );
        value
    }

    /// `dynocap --json task exec NAME --timeout SECS -- COMMAND`, whatever its exit code.
    pub fn exec_in_task(&self, name: &str, command: &str, timeout_secs: u64) -> Value {
        let timeout = timeout_secs.to_string();
        let out = self
            .command()
            .args([
                "--json",
                "task",
                "exec",
                name,
                "--timeout",
                &timeout,
                "--",
                command,
            ])
            .output()
            .expect("spawn dynocap");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "task exec printed no JSON: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// stdout of a command that must succeed in a task's /workspace (the default deadline).
    /// Runs `command` in task `name` (up to 300 s): whether it, or `task exec` itself,
    /// failed, and everything printed (the JSON result and stderr), for a test of how a
    /// command fails.
    pub fn task_exec_outcome(&self, name: &str, command: &str) -> (bool, String) {
        let out = self.run(&[
            "--json",
            "task",
            "exec",
            name,
            "--timeout",
            "300",
            "--",
            command,
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let failed = !out.status.success()
            || serde_json::from_slice::<Value>(&out.stdout)
                .ok()
                .and_then(|v| v["exitCode"].as_i64())
                .is_some_and(|code| code != 0);
        (failed, text)
    }

    /// Starts `command` in sandbox `name` as a background job that may run `timeout_secs`
    /// (`exec --background`, as [`TestHome::task_job`] does for a task); returns the job's id.
    pub fn job(&self, name: &str, timeout_secs: u64, command: &str) -> String {
        self.start_job(&["exec"], name, timeout_secs, command)
    }

    /// Starts `command` in task `name` as a background job that may run `timeout_secs`;
    /// returns the job's id.
    pub fn task_job(&self, name: &str, timeout_secs: u64, command: &str) -> String {
        self.start_job(&["task", "exec"], name, timeout_secs, command)
    }

    /// `dynocap --json EXEC NAME --background --timeout SECS -- COMMAND`, `EXEC` being `exec`
    /// or `task exec`: the started job's id.
    fn start_job(&self, exec: &[&str], name: &str, timeout_secs: u64, command: &str) -> String {
        let timeout = timeout_secs.to_string();
        let mut args = exec.to_vec();
        args.extend_from_slice(&[name, "--background", "--timeout", &timeout, "--", command]);
        let started = self.json(&args);
        started["job"]
            .as_str()
            .unwrap_or_else(|| panic!("a job id: {started:#}"))
            .to_owned()
    }

    pub fn task_sh(&self, name: &str, command: &str) -> String {
        let result = self.exec_in_task(name, command, 30);
        assert_eq!(
            result["exitCode"], 0,
            "`{command}` failed in task {name}: {result:#}"
        );
        result["stdout"].as_str().expect("stdout").to_owned()
    }

    /// stdout of a command that must succeed.
    pub fn sh(&self, name: &str, command: &str) -> String {
        let result = self.exec(name, &[], command);
        assert_eq!(result["exitCode"], 0, "`{command}` failed: {result:#}");
        result["stdout"].as_str().expect("stdout").to_owned()
    }

    /// The log of the sandbox or task `id` (its supervisor's and its guest's lines).
    pub fn log_path(&self, id: &str) -> PathBuf {
        self.path().join("logs").join(format!("{id}.log"))
    }

    /// The id behind a sandbox or task name, from the catalog.
    pub fn sandbox_id(&self, name: &str) -> String {
        let out = Command::new("sqlite3")
            .arg(self.path().join("catalog.db"))
            .arg(format!("SELECT id FROM sandboxes WHERE name = '{name}'"))
            .output()
            .expect("sqlite3 is installed (apt-get install sqlite3)");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(!id.is_empty(), "no record named {name}");
        id
    }

    /// Asserts that `ls` lists exactly the tasks `names` and `sandboxes/` holds only their
    /// directories: what a failed fork or checkpoint must leave (no record, no files of it).
    pub fn assert_only_tasks(&self, names: &[&str]) {
        let listing = self.json(&["ls"]);
        let listed = names_in(&listing["tasks"], "name");
        assert_eq!(listed, names, "no record of the fork: {listing:#}");
        self.assert_only_sandbox_dirs(names);
    }

    /// Asserts that `sandboxes/` holds only the directories of the sandboxes or tasks `names`.
    pub fn assert_only_sandbox_dirs(&self, names: &[&str]) {
        let mut dirs: Vec<String> = std::fs::read_dir(self.path().join("sandboxes"))
            .expect("sandboxes")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        dirs.sort();
        let mut ids: Vec<String> = names.iter().map(|n| self.sandbox_id(n)).collect();
        ids.sort();
        assert_eq!(dirs, ids, "no files of the fork");
    }

    /// Whether no mount on the host names sandbox or task `name`'s id (its disk, its layers).
    pub fn none_mounted(&self, name: &str) -> bool {
        !std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .contains(&self.sandbox_id(name))
    }

    /// Host pid of the supervisor of sandbox or task `name`, if it has one.
    pub fn supervisor_pid(&self, name: &str) -> Option<i32> {
        let out = Command::new("sqlite3")
            .arg(self.path().join("catalog.db"))
            .arg(format!(
                "SELECT supervisor_pid FROM sandboxes WHERE name = '{name}'"
            ))
            .output()
            .expect("sqlite3 is installed (apt-get install sqlite3)");
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }

    /// Host pids of the supervisors of this home's sandboxes.
    pub fn supervisor_pids(&self) -> Vec<i32> {
        let db = self.path().join("catalog.db");
        let out = Command::new("sqlite3")
            .arg(&db)
            .arg("SELECT supervisor_pid FROM sandboxes WHERE supervisor_pid IS NOT NULL")
            .output()
            .expect("sqlite3 is installed (apt-get install sqlite3)");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl TestHome {
    /// Waits until every supervisor of this home has exited. `destroy` answers once the
    /// guest's processes are dead and its name is free; its supervisor removes the rest (its
    /// cgroups, disk and files) right after, then exits.
    pub fn wait_for_teardown(&self) {
        let running = || -> Vec<i32> {
            self.supervisor_pids()
                .into_iter()
                .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
                .collect()
        };
        assert!(
            wait_until(60, || running().is_empty()),
            "supervisors still running a minute after their sandboxes were destroyed: {:?}",
            running()
        );
    }
}

impl Drop for TestHome {
    /// Ends every task and sandbox of this home, so no supervisor outlives its test.
    fn drop(&mut self) {
        let Ok(out) = self.command().args(["--json", "ls"]).output() else {
            return;
        };
        let Ok(value) = serde_json::from_slice::<Value>(&out.stdout) else {
            return;
        };
        for task in value["tasks"].as_array().into_iter().flatten() {
            if let Some(id) = task["id"].as_str() {
                let _ = self
                    .command()
                    .args(["rm", id, "--force", "--purge"])
                    .output();
            }
        }
        for sandbox in value["sandboxes"].as_array().into_iter().flatten() {
            if let Some(name) = sandbox["name"].as_str() {
                let _ = self.command().args(["destroy", name]).output();
            }
        }
        // A warm pool (DYNOCAP_WARM_POOL) is listed nowhere else.
        let _ = self.command().args(["pool", "--drain"]).output();
        // Supervisors write their last lines to the home's logs as they end, and a command
        // server its own: the home is removed (with the temp dir, after this) once they are
        // gone, not while they still write into it.
        bench::stop_command_servers(self.path());
        bench::wait_for_supervisors_to_exit(self.path(), std::time::Duration::from_secs(10));
    }
}

/// Host uids of the whole root-mode pool: every live sandbox maps its guest ids to one range
/// of it (crates/backend-jail/src/idmap.rs).
pub const GUEST_UID_POOL: std::ops::Range<u32> = 1_000_000..1_000_000 + 16_384 * 65_536;

/// Host processes whose real uid is in DynoCap's guest pool (guest processes run there).
pub fn processes_in_guest_uid_range() -> Vec<(i32, u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        let name = status
            .lines()
            .find_map(|l| l.strip_prefix("Name:"))
            .unwrap_or("")
            .trim()
            .to_owned();
        if let Some(uid) = uid {
            if GUEST_UID_POOL.contains(&uid) {
                found.push((pid, uid, name));
            }
        }
    }
    found
}

/// The string field `field` of each element of the JSON array `list` (elements without it are
/// skipped): the names in `ls`, the jobs a restore ended.
pub fn names_in<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .expect("an array")
        .iter()
        .filter_map(|t| t[field].as_str())
        .collect()
}

/// Polls `check` until it returns true or `secs` pass.
pub fn wait_until(secs: u64, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    check()
}

/// Every descendant of `pid` (children, grandchildren, ...) from /proc's parent links.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        if let Some(ppid) = rest.split(' ').nth(1).and_then(|p| p.parse::<i32>().ok()) {
            parent_of.push((child, ppid));
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, ppid) in &parent_of {
            if ppid == p {
                found.push(child);
                frontier.push(child);
            }
        }
    }
    found
}

/// The state letter of process `pid` in `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, `X`, ...),
/// or `None` if it is not listed.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses and may hold spaces.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

pub fn pid_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Runs git on the host for building fixtures, isolated from the machine's configuration.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com")
        .env("GIT_ALLOW_PROTOCOL", "file")
        .output()
        .expect("git is installed");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn write(path: &Path, content: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create parent");
    }
    std::fs::write(path, content).expect("write fixture file");
}

pub fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A project of one committed file, `file` holding `content`, on `main`.
pub fn one_commit_project(file: &str, content: &str) -> tempfile::TempDir {
    let project = tempfile::tempdir().expect("project tempdir");
    git(project.path(), &["init", "-q", "-b", "main"]);
    write(&project.path().join(file), content);
    git(project.path(), &["add", "-A"]);
    git(project.path(), &["commit", "-q", "-m", "first"]);
    project
}

/// A project a user might have: two branches, a stash, an ignored file, an untracked file,
/// an uncommitted edit, a deleted tracked file, a symlink and an executable script, plus
/// things that must never come (hooks, credentials in the remote URL, a reflog).
pub fn sample_project(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    write(&dir.join("README.md"), "# sample\n");
    write(&dir.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }\n");
    write(&dir.join("gone.txt"), "to be deleted\n");
    write(&dir.join("run.sh"), "#!/bin/sh\necho run\n");
    chmod(&dir.join("run.sh"), 0o755);
    write(&dir.join(".gitignore"), "target/\n.env\n");
    write(&dir.join("package.json"), "{\n  \"name\": \"sample\",\n  \"version\": \"1.0.0\",\n  \"scripts\": {\n    \"test\": \"node test.js\"\n  }\n}\n");
    std::os::unix::fs::symlink("src/lib.rs", dir.join("link-to-lib")).expect("symlink");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "first"]);
    git(dir, &["checkout", "-q", "-b", "feature"]);
    write(&dir.join("feature.txt"), "feature work\n");
    git(dir, &["add", "feature.txt"]);
    git(dir, &["commit", "-q", "-m", "feature commit"]);
    git(dir, &["checkout", "-q", "main"]);
    write(
        &dir.join("src/lib.rs"),
        "pub fn answer() -> u32 { 41 + 1 }\n",
    );
    write(&dir.join("stashed.txt"), "stash me\n");
    git(dir, &["add", "stashed.txt"]);
    git(dir, &["stash", "-q"]);
    // Uncommitted state the import must capture.
    write(
        &dir.join("src/lib.rs"),
        "pub fn answer() -> u32 { 6 * 7 }\n",
    );
    std::fs::remove_file(dir.join("gone.txt")).expect("rm");
    write(&dir.join("notes.txt"), "untracked but not ignored\n");
    write(&dir.join(".env"), "SECRET=hunter2\n");
    write(&dir.join("target/debug/big.bin"), "build output\n");
    git(
        dir,
        &[
            "remote",
            "add",
            "origin",
            "https://user:s3cret-token@example.com/repo.git",
        ],
    );
    write(
        &dir.join(".git/info/exclude"),
        "host-only-exclude-pattern\n",
    );
    git(dir, &["config", "dynocap.hostonly", "host-config-value"]);
    write(&dir.join(".git/hooks/pre-commit"), "#!/bin/sh\necho hook\n");
    chmod(&dir.join(".git/hooks/pre-commit"), 0o755);
}

/// The patch a `task finish` result saved, asserting the finish verified it.
pub fn verified_patch(finish: &Value) -> String {
    assert_eq!(finish["verified"], true, "{finish:#}");
    let path = finish["patchPath"].as_str().expect("patchPath");
    std::fs::read_to_string(path).expect("patch")
}

/// The paths a patch changes, in order.
pub fn patch_files(patch: &str) -> Vec<String> {
    patch
        .lines()
        .filter_map(|line| line.strip_prefix("diff --git a/"))
        .map(|rest| rest.split(" b/").next().unwrap_or_default().to_owned())
        .collect()
}
