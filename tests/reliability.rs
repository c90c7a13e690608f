//! A task's work is never lost, and nothing waits forever: each test breaks something for
//! real (SIGKILL or SIGSTOP of a supervisor or an agent, a full disk, a patch larger than any
//! bound, a kill at a named step of the finish) and checks that the work is either saved or
//! kept, said so, and recovered by `task finish`; and that every call still answers.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dynocap_e2e::*;
use serde_json::Value;

fn project() -> tempfile::TempDir {
    one_commit_project("a.txt", "one\n")
}

fn start(home: &TestHome, project: &Path, name: &str, env: &[(&str, &str)]) -> Value {
    let out = home
        .command()
        .envs(env.iter().copied())
        .args([
            "--json",
            "task",
            "start",
            project.to_str().unwrap(),
            "--name",
            name,
        ])
        .output()
        .expect("spawn dynocap");
    assert!(
        out.status.success(),
        "task start failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs a command that must succeed in the task.
fn work(home: &TestHome, name: &str, command: &str) {
    let result = home.exec_in_task(name, command, 300);
    assert_eq!(result["exitCode"], 0, "`{command}`: {result:#}");
}

fn task(home: &TestHome, name: &str) -> Value {
    let ls = home.json(&["ls"]);
    ls["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name || t["id"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no task {name} in {ls:#}"))
}

fn supervisor_of(home: &TestHome, name: &str) -> i32 {
    let out = Command::new("sqlite3")
        .arg(home.path().join("catalog.db"))
        .arg(format!(
            "SELECT supervisor_pid FROM sandboxes WHERE name = '{name}' OR id = '{name}'"
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no supervisor recorded for {name}"))
}

/// The id of sandbox or task `name` (a raw sandbox's JSON has none: it is named by its name).
fn id_of(home: &TestHome, name: &str) -> String {
    let out = Command::new("sqlite3")
        .arg(home.path().join("catalog.db"))
        .arg(format!("SELECT id FROM sandboxes WHERE name = '{name}'"))
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!id.is_empty(), "no record named {name}");
    id
}

/// The guest's init (the agent, PID 1 of the guest) of a supervisor.
fn guest_init_of(supervisor: i32) -> i32 {
    let children =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
            .unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.contains("agent"))
        })
        .unwrap_or_else(|| panic!("supervisor {supervisor} has no guest init child"))
}

fn signal(pid: i32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::kill(pid, signal) },
        0,
        "kill({pid}, {signal})"
    );
}

/// Whether `pid` exits within 20 s (see [`gone_now`]).
fn gone(pid: i32) -> bool {
    wait_until(20, || gone_now(pid))
}

fn patch_of(result: &Value) -> String {
    std::fs::read_to_string(result["patchPath"].as_str().unwrap()).unwrap()
}

/// `ls` shows the task unsaved with a reason, a plain exec says what to do, and `task finish`
/// recovers the work: a verified patch holding `expect`.
fn assert_unsaved_then_recovered(home: &TestHome, name: &str, expect: &str) -> Value {
    let listed = task(home, name);
    assert_eq!(listed["state"], "unsaved", "{listed:#}");
    let note = listed["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("finish"),
        "the note says what to do: {listed:#}"
    );
    let refused = home.json_err(&["task", "exec", name, "--", "true"]);
    assert!(
        refused["message"].as_str().unwrap().contains("unsaved"),
        "{refused}"
    );
    let id = listed["id"].as_str().unwrap().to_owned();
    let layer = match listed["backend"].as_str() {
        Some("vm") => "vm/disk.qcow2",
        _ => "disk.img",
    };
    assert!(
        home.path()
            .join("sandboxes")
            .join(&id)
            .join(layer)
            .is_file(),
        "the writable layer (the sandbox's disk) is kept: {listed:#}"
    );
    let result = home.json(&["task", "finish", name]);
    assert_eq!(result["verified"], true, "{result:#}");
    assert!(
        patch_of(&result).contains(expect),
        "recovered work: {result:#}"
    );
    assert_eq!(task(home, name)["state"], "finished");
    assert!(
        wait_until(20, || !home.path().join("sandboxes").join(&id).exists()),
        "the kept layer goes once the work is saved"
    );
    // Finishing again shows the same saved result and says so; the diff is the saved patch.
    let again = home.json(&["task", "finish", name]);
    assert_eq!(again["patchPath"], result["patchPath"]);
    assert_eq!(again["alreadyFinished"], true);
    let said = home.run(&["task", "finish", name]);
    assert!(String::from_utf8_lossy(&said.stdout).contains("had already ended"));
    let diff = home.json(&["task", "diff", name]);
    assert!(diff["patch"].as_str().unwrap().contains(expect), "{diff:#}");
    assert_eq!(diff["files"], result["files"]);
    result
}

#[test]
fn a_patch_larger_than_any_bound_is_saved_whole_at_finish_expiry_and_forced_rm() {
    if !require_root("a_patch_larger_than_any_bound_is_saved_whole") {
        return;
    }
    let home = TestHome::new();
    let project = project();
    // 70 MiB of incompressible output (over the 64 MiB a diff shows) and two texts whose
    // line diffs would take more than the quarter of the guest's memory a file's diff may
    // (10 million numbers; 8 million one-byte lines under an odd name) beside a one-line edit.
    let big = "head -c 73400320 /dev/urandom > generated.bin; seq 1 10000000 > numbers.txt; \
               yes | head -c 16000000 > 'odd *name [1].txt'; echo two > a.txt";
    for (name, how) in [("fin", "finish"), ("ttl", "expiry"), ("gone", "rm")] {
        let started = if how == "expiry" {
            home.json(&[
                "task",
                "start",
                project.path().to_str().unwrap(),
                "--name",
                name,
                "--ttl",
                "30",
            ])
        } else {
            start(&home, project.path(), name, &[])
        };
        let id = started["id"].as_str().unwrap().to_owned();
        work(&home, name, big);
        let shown = home.json_err(&["task", "diff", name]);
        assert!(
            shown["message"]
                .as_str()
                .unwrap()
                .contains("task finish saves the whole patch"),
            "the advice names what exists: {shown}"
        );
        match how {
            "finish" => {
                home.json(&["task", "finish", name]);
            }
            "expiry" => assert!(
                wait_until(120, || task(&home, &id)["state"] == "expired"),
                "the task expired"
            ),
            _ => {
                home.json(&["rm", name, "--force"]);
            }
        }
        let result = home.json(&["task", "finish", &id]);
        assert_eq!(result["verified"], true, "{how}: {result:#}");
        assert_eq!(result["files"], 4, "{how}: {result:#}");
        let patch = std::fs::metadata(result["patchPath"].as_str().unwrap()).unwrap();
        assert!(
            patch.len() > 73_400_320,
            "{how}: the whole file is in the patch"
        );
        // Large files travel as binary, matched by their exact (odd) names.
        let text =
            String::from_utf8_lossy(&std::fs::read(result["patchPath"].as_str().unwrap()).unwrap())
                .into_owned();
        let odd = text
            .find("diff --git \"a/odd *name [1].txt\"")
            .or_else(|| text.find("diff --git a/odd *name [1].txt"));
        let odd = odd.unwrap_or_else(|| panic!("{how}: the odd name is in the patch"));
        assert!(
            text[odd..].lines().take(6).any(|l| l == "GIT binary patch"),
            "{how}"
        );
        assert!(
            text.contains("+two"),
            "{how}: the small edit is a text diff"
        );
        // The saved patch applies at home.
        let clone = tempfile::tempdir().unwrap();
        git(
            clone.path(),
            &["clone", "-q", project.path().to_str().unwrap(), "."],
        );
        git(
            clone.path(),
            &["apply", "--check", result["patchPath"].as_str().unwrap()],
        );
    }
}

#[test]
fn a_killed_supervisor_or_a_dead_guest_keeps_the_work_for_finish_to_recover() {
    if !require_root("a_killed_supervisor_or_a_dead_guest_keeps_the_work") {
        return;
    }
    let home = TestHome::new();
    let project = project();

    // Idle supervisor, SIGKILL.
    start(&home, project.path(), "idle", &[]);
    work(&home, "idle", "echo idle-work > a.txt");
    let supervisor = supervisor_of(&home, "idle");
    signal(supervisor, libc::SIGKILL);
    assert!(gone(supervisor));
    assert_unsaved_then_recovered(&home, "idle", "+idle-work");

    // SIGKILL while a command runs: the caller gets an answer, the work is kept.
    start(&home, project.path(), "busy", &[]);
    work(
        &home,
        "busy",
        "echo busy-work > a.txt; mkdir -p deep/er; echo x > deep/er/new.txt",
    );
    let supervisor = supervisor_of(&home, "busy");
    let running = home
        .command()
        .args([
            "--json",
            "task",
            "exec",
            "busy",
            "--timeout",
            "120",
            "--",
            "sleep 100",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    signal(supervisor, libc::SIGKILL);
    let asked = Instant::now();
    let out = running.wait_with_output().unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(60),
        "the caller was answered"
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(answer.get("error").is_some(), "{answer:#}");
    let result = assert_unsaved_then_recovered(&home, "busy", "+busy-work");
    assert!(patch_of(&result).contains("deep/er/new.txt"));

    // The guest's init dies: the supervisor sees it and keeps the layer.
    start(&home, project.path(), "dead", &[]);
    work(&home, "dead", "echo dead-work > a.txt");
    let supervisor = supervisor_of(&home, "dead");
    signal(guest_init_of(supervisor), libc::SIGKILL);
    assert!(wait_until(30, || task(&home, "dead")["state"] == "unsaved"));
    assert_unsaved_then_recovered(&home, "dead", "+dead-work");

    // Removing an unsaved task without purge keeps its files; purge says so and discards.
    start(&home, project.path(), "kept", &[]);
    work(&home, "kept", "echo kept-work > a.txt");
    let id = task(&home, "kept")["id"].as_str().unwrap().to_owned();
    let supervisor = supervisor_of(&home, "kept");
    signal(supervisor, libc::SIGKILL);
    assert!(gone(supervisor));
    let removed = home.json(&["rm", "kept"]);
    assert!(removed["keptWork"].as_str().is_some(), "{removed:#}");
    assert!(home
        .path()
        .join("sandboxes")
        .join(&id)
        .join("disk.img")
        .is_file());
    let purged = home
        .command()
        .args(["rm", &id, "--purge"])
        .output()
        .unwrap();
    assert!(purged.status.success());
    assert!(
        String::from_utf8_lossy(&purged.stderr).contains("discarding the unsaved work"),
        "purge says what it discards: {}",
        String::from_utf8_lossy(&purged.stderr)
    );
    assert!(!home.path().join("sandboxes").join(&id).exists());
}

/// The command that notices a dead supervisor is often about another sandbox: a clean-up
/// that fails after it (a leftover that will not go) is written into the task's note, not
/// made that command's error, and removing the sandbox tries the clean-up again.
#[test]
fn a_failed_clean_up_after_a_dead_supervisor_is_noted_and_retried_not_fatal() {
    if !require_root("a_failed_clean_up_after_a_dead_supervisor_is_noted_and_retried") {
        return;
    }
    let home = TestHome::new();
    let project = project();
    start(&home, project.path(), "noted", &[]);
    work(&home, "noted", "echo noted-work > a.txt");
    let task_supervisor = supervisor_of(&home, "noted");
    home.json(&["run", "rawbox"]);
    let raw_id = id_of(&home, "rawbox");
    let raw_supervisor = supervisor_of(&home, "rawbox");
    for supervisor in [task_supervisor, raw_supervisor] {
        signal(supervisor, libc::SIGKILL);
        assert!(gone(supervisor));
    }

    let out = home
        .command()
        .env("DYNOCAP_FAILPOINTS", "take-over.clean-up=error")
        .args(["--json", "ls"])
        .output()
        .expect("spawn dynocap");
    assert!(
        out.status.success(),
        "ls answers although a clean-up failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ls: Value = serde_json::from_slice(&out.stdout).unwrap();
    let noted = ls["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "noted")
        .unwrap_or_else(|| panic!("{ls:#}"));
    assert_eq!(noted["state"], "unsaved", "{noted:#}");
    let note = noted["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("finish") && note.contains("cleaning up what it left failed"),
        "the note keeps what to do and adds what failed: {noted:#}"
    );
    assert!(note.contains("take-over.clean-up"), "{noted:#}");
    let leftover = Path::new("/sys/fs/cgroup/pids/dynocap").join(&raw_id);
    assert!(
        leftover.is_dir(),
        "the failed clean-up left the raw sandbox's cgroup"
    );

    home.json(&["destroy", "rawbox"]);
    assert!(!leftover.exists(), "destroy cleaned up what was left");
    assert!(!home.path().join("sandboxes").join(&raw_id).exists());
    assert_unsaved_then_recovered(&home, "noted", "+noted-work");
}

/// A supervisor killed outright leaves its task's jobs' output on the host, and the recovery
/// that `task finish` runs saves it with the work, under each job's id, byte for byte: the
/// job that had ended and the one the death cut off (before, the recovery knew no job and
/// saved none of their output).
#[test]
fn a_killed_supervisors_jobs_output_is_saved_by_the_recovery() {
    if !require_root("a_killed_supervisors_jobs_output_is_saved_by_the_recovery") {
        return;
    }
    let home = TestHome::new();
    let project = project();
    start(&home, project.path(), "jobbed", &[]);
    work(&home, "jobbed", "echo jobbed-work > a.txt");
    let background = |command: &str| -> String {
        let started = home.json(&[
            "task",
            "exec",
            "jobbed",
            "--background",
            "--timeout",
            "600",
            "--",
            command,
        ]);
        started["job"].as_str().expect("a job id").to_owned()
    };
    let report = |job: &str| -> Value {
        let out = home.run(&["--json", "job", "jobbed", job]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    };
    // Bytes that are no text, and more than one write.
    let ended = background("seq 1 20000; printf '\\377\\000\\376'; echo oops >&2");
    let cut = background("seq 1 5000; printf 'half'; sleep 300");
    let mut ended_out: Vec<u8> = (1..=20000)
        .flat_map(|n| format!("{n}\n").into_bytes())
        .collect();
    ended_out.extend_from_slice(b"\xff\x00\xfe");
    let mut cut_out: Vec<u8> = (1..=5000)
        .flat_map(|n| format!("{n}\n").into_bytes())
        .collect();
    cut_out.extend_from_slice(b"half");
    assert!(
        wait_until(60, || report(&ended)["state"] == "exited"
            && report(&cut)["stdoutOffset"] == cut_out.len() as u64),
        "the jobs printed: {:#} {:#}",
        report(&ended),
        report(&cut)
    );
    let supervisor = supervisor_of(&home, "jobbed");
    signal(supervisor, libc::SIGKILL);
    assert!(gone(supervisor));
    let result = assert_unsaved_then_recovered(&home, "jobbed", "+jobbed-work");
    let entry = |job: &str| -> Value {
        result["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|entry| entry["job"] == job))
            .cloned()
            .unwrap_or_else(|| panic!("no log of {job}: {result:#}"))
    };
    let saved = |entry: &Value, stream: &str| -> Vec<u8> {
        std::fs::read(entry[format!("{stream}Path")].as_str().unwrap()).unwrap()
    };
    let first = entry(&ended);
    assert!(saved(&first, "stdout") == ended_out, "{first:#}");
    assert_eq!(saved(&first, "stderr"), b"oops\n");
    assert_eq!(first.get("cutOff"), None, "{first:#}");
    let second = entry(&cut);
    assert!(saved(&second, "stdout") == cut_out, "{second:#}");
    assert_eq!(second["cutOff"], true, "{second:#}");
    let cut_off: Vec<&Value> = result["jobsCutOff"].as_array().unwrap().iter().collect();
    assert_eq!(cut_off.len(), 1, "{result:#}");
    assert_eq!(cut_off[0]["job"], cut.as_str());
}

/// A vm task's work is on the host's disk after each command, although the guest's own kernel
/// caches its writes: its supervisor and its QEMU (stopped first, so that it cannot end by
/// itself when its channel closes) die, and the kept layer boots again on vm for
/// `task finish`, even where the next command's environment selects the jail.
#[test]
fn a_vm_tasks_work_survives_its_supervisor_and_qemu_and_recovers_on_vm() {
    let test = "a_vm_tasks_work_survives_its_supervisor_and_qemu_and_recovers_on_vm";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let project = project();
    start(&home, project.path(), "vmbox", &[]);
    work(&home, "vmbox", "echo vm-work > a.txt");
    let id = task(&home, "vmbox")["id"].as_str().unwrap().to_owned();
    let pid_file = home.path().join("sandboxes").join(&id).join("vm/qemu.pid");
    let qemu: i32 = std::fs::read_to_string(&pid_file)
        .expect("the vm's pid file")
        .trim()
        .parse()
        .expect("a pid");
    signal(qemu, libc::SIGSTOP);
    let supervisor = supervisor_of(&home, "vmbox");
    signal(supervisor, libc::SIGKILL);
    assert!(gone(supervisor));
    assert!(!gone_now(qemu), "a stopped QEMU outlives its supervisor");

    let home = home.with_env("DYNOCAP_BACKEND", "jail");
    assert_eq!(task(&home, "vmbox")["backend"], "vm");
    assert!(
        gone_now(qemu),
        "the reconcile killed the leftover QEMU: {:?}",
        std::fs::read_to_string(format!("/proc/{qemu}/stat"))
    );
    assert_unsaved_then_recovered(&home, "vmbox", "+vm-work");
}

/// Whether `pid` has exited right now: no longer listed, or listed as a zombie (`Z`) or as
/// dead (`X`, between its exit and its removal, which the exit's notification precedes).
fn gone_now(pid: i32) -> bool {
    matches!(process_state(pid), Some('Z' | 'X') | None)
}

#[test]
fn a_supervisor_killed_at_any_step_of_finish_leaves_a_result_or_the_work() {
    if !require_root("a_supervisor_killed_at_any_step_of_finish") {
        return;
    }
    let home = TestHome::new();
    let project = project();
    for point in [
        "supervisor.final-diff",
        "save.patch-written",
        "supervisor.patch-saved",
        "supervisor.results-written",
    ] {
        let name = point.replace('.', "-");
        let armed = format!("{point}=kill");
        start(
            &home,
            project.path(),
            &name,
            &[("DYNOCAP_FAILPOINTS", &armed)],
        );
        work(&home, &name, &format!("echo {name} > a.txt"));
        // The supervisor dies mid-finish; the same finish then finds the result on disk or
        // recovers the kept work through a fresh guest.
        let result = home.json(&["task", "finish", &name]);
        assert_eq!(result["verified"], true, "{point}: {result:#}");
        assert!(patch_of(&result).contains(&format!("+{name}")), "{point}");
        assert_eq!(task(&home, &name)["state"], "finished", "{point}");
        let id = result["id"].as_str().unwrap();
        assert!(home
            .path()
            .join("results")
            .join(id)
            .join("summary.json")
            .is_file());
    }
}

#[test]
fn a_full_disk_keeps_the_work_until_there_is_room() {
    if !require_root("a_full_disk_keeps_the_work_until_there_is_room") {
        return;
    }
    // DYNOCAP_HOME on its own small filesystem, which the test fills.
    let disk = tempfile::tempdir().unwrap();
    let image = disk.path().join("home.ext4");
    let mount = disk.path().join("mnt");
    std::fs::create_dir(&mount).unwrap();
    run_ok("truncate", &["-s", "160M", image.to_str().unwrap()]);
    run_ok(
        "mkfs.ext4",
        &["-q", "-F", "-m", "0", image.to_str().unwrap()],
    );
    run_ok(
        "mount",
        &[
            "-o",
            "loop",
            image.to_str().unwrap(),
            mount.to_str().unwrap(),
        ],
    );
    let _unmount = Unmount(mount.clone());
    // Without a package cache, which would set its own room aside here too.
    let home = TestHome::at(mount.join("home")).with_env("DYNOCAP_CACHES", "0");
    let project = project();
    // A disk this small filesystem can reserve beside the home's own files.
    home.json(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "full",
        "--disk-mb",
        "64",
    ]);
    work(
        &home,
        "full",
        "seq 1 2000000 > numbers.txt; echo full-work > a.txt",
    );
    // Fill what is left, from the host.
    let ballast = mount.join("ballast");
    let _ = Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", ballast.display()),
            "bs=1M",
        ])
        .stderr(std::process::Stdio::null())
        .status();
    let failed = home.json_err(&["task", "finish", "full"]);
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.contains("full") && message.contains("kept"),
        "{failed}"
    );
    std::fs::remove_file(&ballast).unwrap();
    // The supervisor records `unsaved` before its reply, in the catalog on this full
    // filesystem: when that write finds no room, the state is recorded once the supervisor
    // has gone (the next command's reconcile), so wait for that.
    home.wait_for_teardown();
    let result = assert_unsaved_then_recovered(&home, "full", "+full-work");
    assert!(patch_of(&result).contains("b/numbers.txt"));
}

#[test]
fn the_ttl_is_absolute_and_a_command_cut_off_by_it_says_so() {
    if !require_root("the_ttl_is_absolute") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("busy", &["--ttl", "30"]);
    let started = Instant::now();
    // An exec every 3 s must not keep the sandbox alive past its TTL.
    let mut last = Value::Null;
    while started.elapsed() < Duration::from_secs(90) {
        let out = home
            .command()
            .args(["--json", "exec", "busy", "--", "sleep 2"])
            .output()
            .unwrap();
        last = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if last.get("error").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the sandbox expired at its TTL, not later: {last:#}"
    );
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("TTL") || message.contains("no sandbox") || message.contains("gone"),
        "{last:#}"
    );

    // A task command still running at expiry is told why it stopped.
    let project = project();
    home.json(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "late",
        "--ttl",
        "30",
    ]);
    let out = home
        .command()
        .args([
            "--json",
            "task",
            "exec",
            "late",
            "--timeout",
            "600",
            "--",
            "sleep 300",
        ])
        .output()
        .unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("TTL"), "{answer:#}");
    assert!(message.contains("saved"), "{answer:#}");

    // And one still running when the task is finished.
    start(&home, project.path(), "done", &[]);
    let running = home
        .command()
        .args([
            "--json",
            "task",
            "exec",
            "done",
            "--timeout",
            "600",
            "--",
            "sleep 300",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    home.json(&["task", "finish", "done"]);
    let answer: Value =
        serde_json::from_slice(&running.wait_with_output().unwrap().stdout).unwrap();
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("finished while the command ran"),
        "{answer:#}"
    );
}

#[test]
fn a_stopped_supervisor_or_agent_never_makes_a_call_hang() {
    if !require_root("a_stopped_supervisor_or_agent_never_makes_a_call_hang") {
        return;
    }
    let home = TestHome::new();
    // A stopped supervisor: exec answers, destroy ends it from outside.
    home.sandbox("frozen", &[]);
    let supervisor = supervisor_of(&home, "frozen");
    let init = guest_init_of(supervisor);
    signal(supervisor, libc::SIGSTOP);
    let asked = Instant::now();
    let err = home.json_err(&["exec", "frozen", "--timeout", "5", "--", "true"]);
    assert!(asked.elapsed() < Duration::from_secs(60), "exec answered");
    assert!(
        err["message"].as_str().unwrap().contains("stopped"),
        "{err}"
    );
    let destroyed = home.run(&["destroy", "frozen"]);
    assert!(destroyed.status.success(), "{destroyed:?}");
    assert!(
        gone(supervisor) && gone(init),
        "supervisor and guest are gone"
    );
    assert!(home.json(&["ps"])["sandboxes"]
        .as_array()
        .unwrap()
        .is_empty());

    // A stopped supervisor of a task: finish ends it and saves the work.
    let project = project();
    start(&home, project.path(), "paused", &[]);
    work(&home, "paused", "echo paused-work > a.txt");
    let supervisor = supervisor_of(&home, "paused");
    signal(supervisor, libc::SIGSTOP);
    let result = home.json(&["task", "finish", "paused"]);
    assert!(patch_of(&result).contains("+paused-work"), "{result:#}");
    assert!(gone(supervisor));

    // A stopped agent: the host enforces the command's deadline, and a finish that cannot
    // take the diff keeps the work instead of waiting forever.
    start(&home, project.path(), "numb", &[]);
    work(&home, "numb", "echo numb-work > a.txt");
    let init = guest_init_of(supervisor_of(&home, "numb"));
    signal(init, libc::SIGSTOP);
    let asked = Instant::now();
    let timed = home.exec_in_task("numb", "true", 3);
    assert!(asked.elapsed() < Duration::from_secs(60));
    assert_eq!(timed["timedOut"], true, "{timed:#}");
    let failed = home.json_err(&["task", "finish", "numb"]);
    assert!(
        failed["message"].as_str().unwrap().contains("kept"),
        "{failed}"
    );
    assert_unsaved_then_recovered(&home, "numb", "+numb-work");
}

fn run_ok(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}");
}

struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A task whose supervisor died keeps its state dir, and with it its host id range: another
/// sandbox started meanwhile gets a different one, and the recovery guest booted by
/// `task finish` maps the same range (its writable layer is owned by those ids; with any
/// other range the agent could not read its own state and the work would not verify).
#[test]
fn a_recovered_task_keeps_its_host_id_range() {
    if !require_root("a_recovered_task_keeps_its_host_id_range") {
        return;
    }
    let home = TestHome::new();
    let project = project();
    home.sandbox("first", &[]);
    let started = start(&home, project.path(), "ranged", &[]);
    let id = started["id"].as_str().unwrap().to_owned();
    let range_file = home.path().join("sandboxes").join(&id).join("idrange");
    let range = std::fs::read_to_string(&range_file).unwrap();
    assert_eq!(range, "1\n", "range 0 is taken by the raw sandbox");
    work(&home, "ranged", "echo ranged-work > a.txt");
    let supervisor = supervisor_of(&home, "ranged");
    signal(supervisor, libc::SIGKILL);
    assert!(gone(supervisor));
    assert!(wait_until(30, || task(&home, "ranged")["state"] == "unsaved"));

    // The kept layer still holds range 1: a new sandbox gets the next free one, and once the
    // raw sandbox goes, range 0 is free but the recovery still takes 1.
    home.sandbox("second", &[]);
    let second = home
        .path()
        .join("sandboxes")
        .join(home.sandbox_id("second"));
    assert_eq!(
        std::fs::read_to_string(second.join("idrange")).unwrap(),
        "2\n"
    );
    let first = home.path().join("sandboxes").join(home.sandbox_id("first"));
    home.json(&["destroy", "first"]);
    assert!(wait_until(20, || !first.exists()));
    assert_eq!(std::fs::read_to_string(&range_file).unwrap(), "1\n");

    assert_unsaved_then_recovered(&home, "ranged", "+ranged-work");
    let log = std::fs::read_to_string(home.log_path(&id)).unwrap();
    let boots: Vec<&str> = log.lines().filter(|l| l.contains("guest booted")).collect();
    assert_eq!(boots.len(), 2, "the start and the recovery: {log}");
    for boot in boots {
        assert!(boot.ends_with("host id range 1"), "{boot}");
    }
}

#[test]
fn a_task_expiring_under_a_damaged_catalog_saves_its_whole_result() {
    if !require_root("a_task_expiring_under_a_damaged_catalog_saves_its_whole_result") {
        return;
    }
    let home = TestHome::new();
    let project = project();
    let started = home.json(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "orphan",
        "--ttl",
        "30",
    ]);
    let id = started["id"].as_str().unwrap().to_owned();
    work(&home, "orphan", "echo orphan-work > a.txt");
    // The catalog is ruined under the live supervisor (random bytes over it and its WAL).
    let db = home.path().join("catalog.db");
    for file in [db.clone(), home.path().join("catalog.db-wal")] {
        if let Ok(meta) = std::fs::metadata(&file) {
            std::fs::write(
                &file,
                vec![0x5a_u8; usize::try_from(meta.len()).unwrap().max(4096)],
            )
            .unwrap();
        }
    }
    let results = home.path().join("results").join(&id);
    assert!(
        wait_until(120, || results.join("summary.json").is_file()),
        "the expiry wrote its summary without the catalog"
    );
    let summary: Value =
        serde_json::from_slice(&std::fs::read(results.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["task"]["state"], "expired", "{summary:#}");
    assert_eq!(summary["task"]["verified"], true, "{summary:#}");
    assert!(std::fs::read_to_string(results.join("patch.diff"))
        .unwrap()
        .contains("+orphan-work"));
    // The damage is named with its remedy, and the repair brings the expired task back.
    let err = home.json_err(&["ls"]);
    assert!(
        err["message"].as_str().unwrap().contains("doctor --repair"),
        "{err}"
    );
    home.json(&["doctor", "--repair"]);
    assert!(wait_until(30, || task(&home, &id)["state"] == "expired"));
    assert_eq!(home.json(&["task", "finish", &id])["verified"], true);
}

/// Whether anything under `home` is mounted in this mount namespace.
fn mounted_under(home: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|mount_point| Path::new(mount_point).starts_with(home))
}

/// A sandbox whose home is deleted under it (`rm -rf` of the home) can no longer be reached
/// by anyone: its supervisor notices, ends it, guest and all, and writes nothing back into
/// the deleted home. A task whose control socket alone goes (its home intact) ends the same
/// way with its work saved.
#[test]
fn a_sandbox_nobody_can_reach_any_more_ends_and_a_tasks_work_is_saved() {
    if !require_root("a_sandbox_nobody_can_reach_any_more_ends") {
        return;
    }
    // The home deleted: the raw sandbox and the task in it end; the home stays deleted.
    let deleted = TestHome::new();
    let project = project();
    deleted.sandbox("orphan", &[]);
    start(&deleted, project.path(), "orphan-task", &[]);
    let supervisors = [
        supervisor_of(&deleted, "orphan"),
        supervisor_of(&deleted, "orphan-task"),
    ];
    let inits = supervisors.map(guest_init_of);
    assert!(
        !mounted_under(deleted.path()),
        "the host sees no guest mount"
    );
    // As `rm -rf` does, again should a process of the home add a file meanwhile (a spare
    // disk, a log) and make a directory non-empty again.
    assert!(
        wait_until(10, || std::fs::remove_dir_all(deleted.path()).is_ok()
            || !deleted.path().exists()),
        "the home could not be deleted"
    );
    for pid in supervisors.into_iter().chain(inits) {
        assert!(gone(pid), "process {pid} outlived its deleted home");
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !deleted.path().exists(),
        "the deleted home was made again: {:?}",
        walk(deleted.path())
    );

    // The socket alone removed: the task ends with its work saved, as a removal saves it.
    let home = TestHome::new();
    start(&home, project.path(), "cut-off", &[]);
    work(&home, "cut-off", "echo kept > a.txt && echo new > b.txt");
    let supervisor = supervisor_of(&home, "cut-off");
    let id = id_of(&home, "cut-off");
    std::fs::remove_file(home.path().join("run").join(format!("{id}.sock")))
        .expect("remove the control socket");
    assert!(gone(supervisor), "the cut-off supervisor did not end");
    let listed = task(&home, "cut-off");
    assert_eq!(listed["state"], "destroyed", "{listed:#}");
    let patch = std::fs::read_to_string(home.path().join("results").join(&id).join("patch.diff"))
        .expect("the saved patch");
    assert!(patch.contains("+kept") && patch.contains("+new"), "{patch}");
    let log = std::fs::read_to_string(home.log_path(&id)).expect("the supervisor's log");
    assert!(log.contains("control socket"), "{log}");
}

/// Every path under `dir`, for a message.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        found.push(entry.path());
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            found.extend(walk(&entry.path()));
        }
    }
    found
}

/// From its TTL's end until its work is saved a task is `ending`, and every command says what
/// is true then: `ls` shows it ending (never running again), a command is refused as ending,
/// `task diff` waits and shows the saved patch, `rm` waits and releases the name. The save is
/// held four seconds long (a failpoint) so the window is wide.
#[test]
fn a_task_past_its_ttl_is_ending_in_every_command_until_its_work_is_saved() {
    if !require_root("a_task_past_its_ttl_is_ending_in_every_command_until_its_work_is_saved") {
        return;
    }
    let home = TestHome::new().with_env("DYNOCAP_FAILPOINTS", "supervisor.final-diff=sleep(4000)");
    let project = project();
    home.json(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "late",
        "--ttl",
        "30",
    ]);
    work(&home, "late", "echo two >> a.txt");
    let mut seen: Vec<String> = Vec::new();
    while seen.last().is_none_or(|s| s == "running") {
        let state = task(&home, "late")["state"].as_str().unwrap().to_owned();
        if seen.last() != Some(&state) {
            seen.push(state);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(seen, ["running", "ending"], "{seen:?}");
    // The TTL ran out and the work is being saved (four seconds at least).
    let refused = home.json_err(&["task", "exec", "late", "--", "true"]);
    let message = refused["message"].as_str().unwrap();
    assert!(
        refused["code"] == "conflict" && message.contains("is ending") && message.contains("TTL"),
        "{refused:#}"
    );
    // Both wait for the end: the diff shows the saved patch, rm releases the name.
    let id = task(&home, "late")["id"].as_str().unwrap().to_owned();
    let diff = std::thread::scope(|scope| {
        let diff = scope.spawn(|| home.json(&["task", "diff", &id]));
        let removed = home.json(&["rm", "late"]);
        assert_eq!(removed["released"], "late", "{removed:#}");
        diff.join().unwrap()
    });
    assert!(diff["patch"].as_str().unwrap().contains("+two"), "{diff:#}");
    let ended = task(&home, &id);
    assert!(
        ended["state"] == "expired" && ended["name"].is_null(),
        "{ended:#}"
    );
}

/// A home deleted (`rm -rf`) while its sandboxes' teardowns are still running: a raw
/// sandbox's after `destroy` answered (its disk, cgroups and spare disk still to come) and a
/// task's while its work is being saved. Neither teardown writes anything back: no record
/// file, results, log or spare disk makes the deleted home exist again.
#[test]
fn a_home_deleted_during_its_teardowns_stays_deleted() {
    a_home_deleted_during_its_teardowns_stays_deleted_on(Backend::Jail);
}

#[test]
fn a_home_deleted_during_its_teardowns_stays_deleted_in_a_vm() {
    a_home_deleted_during_its_teardowns_stays_deleted_on(Backend::Vm);
}

fn a_home_deleted_during_its_teardowns_stays_deleted_on(backend: Backend) {
    let Some(home) = TestHome::on(backend, "a_home_deleted_during_its_teardowns_stays_deleted")
    else {
        return;
    };
    let home = home.with_env(
        "DYNOCAP_FAILPOINTS",
        "supervisor.destroy.replied=sleep(3000);supervisor.final-diff=sleep(3000)",
    );
    let project = project();
    home.sandbox("box", &[]);
    start(&home, project.path(), "work", &[]);
    work(&home, "work", "echo two >> a.txt");
    let supervisors = [supervisor_of(&home, "box"), supervisor_of(&home, "work")];
    assert_eq!(home.json(&["destroy", "box"])["destroyed"], "box");
    // The task ends as a SIGTERM ends it (its work saved), with no client waiting on it.
    signal(supervisors[1], libc::SIGTERM);
    let id = id_of(&home, "work");
    // It has reached its save (the failpoint holds it there for three seconds).
    assert!(
        wait_until(20, || std::fs::read_to_string(home.log_path(&id))
            .is_ok_and(|log| log.contains("failpoint supervisor.final-diff"))),
        "the task's end began"
    );
    bench::stop_command_servers(home.path());
    assert!(
        wait_until(10, || std::fs::remove_dir_all(home.path()).is_ok()
            || !home.path().exists()),
        "the home could not be deleted"
    );
    for pid in supervisors {
        assert!(gone(pid), "supervisor {pid} did not end");
    }
    assert!(
        !home.path().exists(),
        "the deleted home was made again: {:?}",
        walk(home.path())
    );
}
