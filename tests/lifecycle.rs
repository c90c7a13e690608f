//! Raw sandbox lifecycle through the CLI: run, ps, destroy, names, defaults and ranges, TTL
//! expiry, a killed supervisor, a `run` killed while its sandbox starts, many sandboxes side by
//! side.

use dynocap_e2e::*;

#[test]
fn run_ps_exec_destroy_with_defaults() {
    if !require_root("run_ps_exec_destroy_with_defaults") {
        return;
    }
    let home = TestHome::new();
    let info = home.sandbox("box1", &[]);
    assert_eq!(info["name"], "box1");
    assert_eq!(info["state"], "running");
    assert_eq!(info["backend"], "jail");
    assert_eq!(info["network"], "none");
    assert_eq!(info["cpus"], 1);
    assert_eq!(info["memoryMB"], 1024);
    assert_eq!(info["ttlSeconds"], 1800);
    assert!(info["createdAt"].as_str().unwrap().ends_with('Z'));

    assert_eq!(home.sh("box1", "echo hello; hostname"), "hello\nbox1\n");
    let ps = home.json(&["ps"]);
    assert_eq!(ps["sandboxes"].as_array().unwrap().len(), 1);
    let table = String::from_utf8(home.run(&["ps"]).stdout).unwrap();
    assert!(
        table.starts_with("NAME") && table.contains("box1") && table.contains("running"),
        "{table}"
    );

    assert_eq!(home.json(&["destroy", "box1"])["destroyed"], "box1");
    assert_eq!(home.json(&["ps"])["sandboxes"].as_array().unwrap().len(), 0);
    let err = home.json_err(&["exec", "box1", "--", "true"]);
    assert_eq!(err["code"], "not_found");
    // The name is free again.
    home.sandbox("box1", &[]);
}

#[test]
fn names_and_ranges_are_validated_not_clamped() {
    if !require_root("names_and_ranges_are_validated_not_clamped") {
        return;
    }
    let home = TestHome::new();
    for (args, needle) in [
        (vec!["run", "Bad_Name"], "not valid"),
        (
            vec!["run", "ok", "--ttl", "29"],
            "--ttl 29 is below the minimum 30",
        ),
        (
            vec!["run", "ok", "--ttl", "86401"],
            "--ttl 86401 is above the maximum 86400",
        ),
        (vec!["run", "ok", "--cpus", "0"], "--cpus 0"),
        (vec!["run", "ok", "--memory-mb", "1"], "--memory-mb 1"),
        (vec!["run", "ok", "--network", "wifi"], "not a network mode"),
    ] {
        let err = home.json_err(&args);
        assert_eq!(err["code"], "invalid_argument", "{args:?}");
        assert!(
            err["message"].as_str().unwrap().contains(needle),
            "{args:?}: {err}"
        );
    }
    // Allowed hosts only mean something to a filtered sandbox.
    let err = home.json_err(&["run", "ok", "--allow-host", "example.com"]);
    assert_eq!(err["code"], "invalid_argument");
    assert!(
        err["message"].as_str().unwrap().contains("filtered"),
        "{err}"
    );
    let err = home.json_err(&[
        "run",
        "ok",
        "--network",
        "filtered",
        "--allow-host",
        "*.com",
    ]);
    assert_eq!(err["code"], "invalid_argument");
    assert!(err["message"].as_str().unwrap().contains("*.com"), "{err}");
    assert_eq!(
        home.json(&["ps"])["sandboxes"].as_array().unwrap().len(),
        0,
        "nothing was started"
    );

    let low = home.sandbox("edge-low", &["--ttl", "30"]);
    assert_eq!(low["ttlSeconds"], 30);
    let high = home.sandbox(
        "edge-high",
        &["--ttl", "86400", "--cpus", "2", "--memory-mb", "512"],
    );
    assert_eq!(
        (
            high["ttlSeconds"].as_u64(),
            high["cpus"].as_u64(),
            high["memoryMB"].as_u64()
        ),
        (Some(86400), Some(2), Some(512))
    );

    let dup = home.json_err(&["run", "edge-low"]);
    assert_eq!(dup["code"], "conflict");
    assert!(
        dup["message"].as_str().unwrap().contains("already taken"),
        "{dup}"
    );
    let missing = home.json_err(&["destroy", "nope"]);
    assert_eq!(missing["code"], "not_found");
}

#[test]
fn ttl_expiry_destroys_the_sandbox() {
    if !require_root("ttl_expiry_destroys_the_sandbox") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("shortlived", &["--ttl", "30"]);
    let pids = home.supervisor_pids();
    assert_eq!(pids.len(), 1);
    let guest = descendants(pids[0]);
    assert!(!guest.is_empty(), "the supervisor has a guest");
    assert!(
        wait_until(90, || home.json(&["ps"])["sandboxes"]
            .as_array()
            .unwrap()
            .is_empty()),
        "the sandbox is gone after its TTL"
    );
    assert!(
        wait_until(10, || !pid_exists(pids[0])),
        "the supervisor exited"
    );
    for pid in guest {
        assert!(!pid_exists(pid), "guest process {pid} survived expiry");
    }
    let log = std::fs::read_to_string(
        home.path()
            .join("logs")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap();
    assert!(log.contains("expired after its TTL of 30s"), "{log}");
}

#[test]
fn killed_supervisor_leaves_no_guest_and_record_is_lost() {
    if !require_root("killed_supervisor_leaves_no_guest_and_record_is_lost") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("victim", &[]);
    // A background process inside, to prove the whole guest dies, not just its init.
    home.exec("victim", &[], "sleep 1000 >/dev/null 2>&1 &");
    let supervisor = home.supervisor_pids()[0];
    let guest = descendants(supervisor);
    let id = home.sandbox_id("victim");
    assert!(
        !sandbox_cgroups(&id).is_empty(),
        "the running sandbox has cgroups"
    );
    assert!(guest.len() >= 2, "init and the background sleep: {guest:?}");
    // SAFETY: plain kill(2) of a pid we own.
    assert_eq!(unsafe { libc::kill(supervisor, libc::SIGKILL) }, 0);
    assert!(
        wait_until(20, || guest.iter().all(|&p| !pid_exists(p))),
        "guest processes survived: {guest:?}"
    );

    // The next command runs where DYNOCAP_BACKEND names another backend: what the jail left
    // is still the jail's to clean up, by the backend its record names.
    let home = home.with_env("DYNOCAP_BACKEND", "vm");
    let ps = home.json(&["ps"]);
    let sandbox = &ps["sandboxes"][0];
    assert_eq!(sandbox["name"], "victim");
    assert_eq!(sandbox["state"], "lost");
    assert!(
        sandbox_cgroups(&id).is_empty(),
        "cgroups left: {:?}",
        sandbox_cgroups(&id)
    );
    let err = home.json_err(&["exec", "victim", "--", "true"]);
    assert_eq!(err["code"], "conflict");
    assert!(err["message"].as_str().unwrap().contains("lost"), "{err}");
    // Cleanup removed the cgroups and the state directory.
    let id_dirs: Vec<_> = std::fs::read_dir(home.path().join("sandboxes"))
        .unwrap()
        .collect();
    assert!(id_dirs.is_empty(), "state left behind: {id_dirs:?}");
    home.json(&["destroy", "victim"]);
    assert!(home.json(&["ps"])["sandboxes"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// A destroy has answered once its guest is dead; the teardown after it (cgroups, the disk)
/// is the supervisor's business, and neither `ps` nor `ls` shows the sandbox meanwhile.
#[test]
fn a_destroyed_sandbox_is_gone_from_ps_and_ls_while_its_teardown_runs() {
    if !require_root("a_destroyed_sandbox_is_gone_from_ps_and_ls_while_its_teardown_runs") {
        return;
    }
    // The supervisor waits three seconds between its answer and the teardown.
    let home = TestHome::new().with_env(
        "DYNOCAP_FAILPOINTS",
        "supervisor.destroy.replied=sleep(3000)",
    );
    home.sandbox("going", &[]);
    let supervisor = home.supervisor_pids()[0];
    assert_eq!(home.json(&["destroy", "going"])["destroyed"], "going");
    assert!(pid_exists(supervisor), "the teardown is still to come");
    assert_eq!(home.json(&["ps"])["sandboxes"], serde_json::json!([]));
    assert_eq!(home.json(&["ls"])["sandboxes"], serde_json::json!([]));
    assert!(
        wait_until(20, || !pid_exists(supervisor)),
        "the supervisor ends after its teardown"
    );
}

#[test]
fn destroy_answers_once_the_guest_is_dead_and_a_supervisor_dying_after_that_is_cleaned_up() {
    if !require_root(
        "destroy_answers_once_the_guest_is_dead_and_a_supervisor_dying_after_that_is_cleaned_up",
    ) {
        return;
    }
    // The supervisor dies right after its reply, before the rest of the teardown.
    let home = TestHome::new().with_env("DYNOCAP_FAILPOINTS", "supervisor.destroy.replied=kill");
    home.sandbox("brief", &[]);
    home.exec("brief", &[], "sleep 1000 >/dev/null 2>&1 &");
    let supervisor = home.supervisor_pids()[0];
    let guest = descendants(supervisor);
    let id = home.sandbox_id("brief");
    assert!(guest.len() >= 2, "init and the background sleep: {guest:?}");

    assert_eq!(home.json(&["destroy", "brief"])["destroyed"], "brief");
    // What the answer promises holds at once: the guest runs nothing, the name is free.
    assert!(
        guest.iter().all(|&p| !pid_exists(p)),
        "guest processes outlived the answer: {guest:?}"
    );
    assert!(home.json(&["ps"])["sandboxes"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(
        wait_until(20, || !pid_exists(supervisor)),
        "the failpoint kills the supervisor"
    );
    // The next command's reconcile finishes the teardown the supervisor could not.
    home.json(&["ps"]);
    assert!(
        sandbox_cgroups(&id).is_empty(),
        "cgroups left: {:?}",
        sandbox_cgroups(&id)
    );
    assert!(
        !home.path().join("sandboxes").join(&id).exists(),
        "state dir left"
    );
    assert!(home.supervisor_pids().is_empty(), "the record is gone");
    // The name serves a new sandbox.
    home.sandbox("brief", &[]);
    assert_eq!(home.sh("brief", "echo again"), "again\n");
    let id = home.sandbox_id("brief");
    let supervisor = home.supervisor_pids()[0];
    home.json(&["destroy", "brief"]);
    assert!(wait_until(20, || !pid_exists(supervisor)));
    home.json(&["ps"]);
    assert!(sandbox_cgroups(&id).is_empty());
}

#[test]
fn ten_sandboxes_side_by_side() {
    if !require_root("ten_sandboxes_side_by_side") {
        return;
    }
    let home = TestHome::new();
    // Small disks: the test is about isolation, and ten default disks would set aside
    // 20 GB of the host, more than a shared CI machine may have free.
    let names: Vec<String> = (0..10).map(|i| format!("side{i}")).collect();
    let handles: Vec<_> = names
        .iter()
        .map(|name| {
            let mut cmd = home.command();
            cmd.args([
                "--json",
                "run",
                name,
                "--memory-mb",
                "256",
                "--disk-mb",
                "256",
            ]);
            std::thread::spawn(move || cmd.output().expect("spawn"))
        })
        .collect();
    for handle in handles {
        let out = handle.join().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for name in &names {
        // Each sandbox is its own box: own hostname, own files.
        assert_eq!(home.sh(name, "hostname"), format!("{name}\n"));
        home.sh(name, &format!("echo {name} > /tmp/who"));
    }
    for name in &names {
        assert_eq!(home.sh(name, "cat /tmp/who"), format!("{name}\n"));
    }
    assert_eq!(
        home.json(&["ps"])["sandboxes"].as_array().unwrap().len(),
        10
    );
}

/// The sandbox's cgroup directories, on every hierarchy (v1 controllers or the v2 tree).
fn sandbox_cgroups(id: &str) -> Vec<std::path::PathBuf> {
    let mut roots = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    roots.extend(
        std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|h| h.path()),
    );
    roots
        .into_iter()
        .map(|r| r.join("dynocap").join(id))
        .filter(|p| p.exists())
        .collect()
}

#[test]
fn doctor_reports_what_this_machine_supports() {
    if !require_root("doctor_reports_what_this_machine_supports") {
        return;
    }
    let home = TestHome::new();
    let report = home.json(&["doctor"]);
    assert_eq!(report["ready"], true, "{report:#}");
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for expected in [
        "user namespaces",
        "overlay in user namespace",
        "seccomp",
        "guest agent",
        "git",
        "backend",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    assert!(names.iter().any(|n| n.starts_with("cgroups")), "{names:?}");
    // Each failed check tells what to do about it.
    for check in report["checks"].as_array().unwrap() {
        if check["ok"] == false {
            assert!(
                check["hint"].as_str().is_some_and(|h| !h.is_empty()),
                "{check}"
            );
        }
    }
    // A missing agent is a failed required check with a fix, and the exit code says so.
    let out = home
        .command()
        .args(["--json", "doctor"])
        .env("DYNOCAP_AGENT", "/nonexistent/dynocap-agent")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ready"], false, "{report:#}");
    assert!(!out.status.success());
    let agent = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "guest agent")
        .unwrap();
    assert!(
        agent["detail"].as_str().unwrap().contains("DYNOCAP_AGENT"),
        "{agent}"
    );
}

/// Every process whose command line names this home as a `supervise --standby-fd` standby,
/// with where its stderr goes (`/dev/null` until it is given a sandbox, then that one's log).
fn standbys_of(home: &TestHome) -> Vec<(i32, String)> {
    let needle = format!("supervise --home {} --standby-fd", home.path().display());
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| !matches!(process_state(*pid), None | Some('Z')))
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let stderr = std::fs::read_link(format!("/proc/{pid}/fd/2")).ok()?;
            cmdline
                .contains(&needle)
                .then(|| (pid, stderr.display().to_string()))
        })
        .collect()
}

#[test]
fn a_cli_run_starts_its_supervisor_first_and_a_refused_one_leaves_none() {
    if !require_root("a_cli_run_starts_its_supervisor_first_and_a_refused_one_leaves_none") {
        return;
    }
    // A `run` in a process of its own: a command server keeps the standby for its next `run`
    // (tests/cli_server.rs).
    let home = TestHome::new().with_env("DYNOCAP_CLI_SERVER", "0");
    home.sandbox("first", &[]);
    // `run` started the supervisor as a standby before its checks, then handed it the sandbox:
    // it is the sandbox's recorded supervisor, writing to its log, and no other is left.
    let id = home.sandbox_id("first");
    let log = home.log_path(&id);
    let standbys = standbys_of(&home);
    assert_eq!(
        standbys,
        [(home.supervisor_pids()[0], log.display().to_string())],
        "the standby became the sandbox's supervisor, and is the only one"
    );
    assert_eq!(home.sh("first", "echo works"), "works\n");

    // A run refused after the standby started (a host ceiling, checked after) leaves no
    // idle standby behind: it ends with the command that started it.
    let refused = home.json_err(&["run", "second", "--memory-mb", "1048576"]);
    assert_eq!(refused["code"], "policy_denied", "{refused}");
    assert!(
        wait_until(10, || standbys_of(&home).len() == 1),
        "an unused standby outlived its command: {:?}",
        standbys_of(&home)
    );
    assert_eq!(home.json(&["destroy", "first"])["destroyed"], "first");
    home.wait_for_teardown();
    assert!(wait_until(10, || standbys_of(&home).is_empty()));
}

/// A supervisor SIGKILLed while its agent is killing a command that timed out: every guest
/// process dies with it, without waiting for another command of the home to clean up. On a
/// host with a v1 freezer the command's freezer cgroup is watched throughout, and the
/// supervisor is killed the instant it is seen frozen: a v1-frozen process ignores SIGKILL,
/// so an agent that froze it and died with its supervisor left the guest alive.
#[test]
fn a_supervisor_killed_while_a_command_is_being_killed_takes_every_guest_process_with_it() {
    if !require_root(
        "a_supervisor_killed_while_a_command_is_being_killed_takes_every_guest_process_with_it",
    ) {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    let home = TestHome::new();
    home.sandbox("stubborn", &[]);
    let supervisor = home.supervisor_pids()[0];
    let freezer = std::path::Path::new("/sys/fs/cgroup/freezer/dynocap")
        .join(home.sandbox_id("stubborn"))
        .join("exec-1")
        .join("freezer.state");
    let kill_supervisor = || {
        // SAFETY: plain kill(2) of a pid we own; a second call finds it dead (ESRCH).
        unsafe { libc::kill(supervisor, libc::SIGKILL) };
    };
    // 150 processes that shrug off the timeout's SIGTERM, so its SIGKILL round has work to do.
    let mut exec = home
        .command()
        .args(["exec", "stubborn", "--timeout", "1", "--"])
        .arg(
            "trap '' TERM; for i in $(seq 150); do sh -c \"trap '' TERM; sleep 1000\" & done; wait",
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn dynocap exec");
    let (watching, seen_frozen) = (AtomicBool::new(true), AtomicBool::new(false));
    let guest = std::thread::scope(|scope| {
        scope.spawn(|| {
            while watching.load(Ordering::Relaxed) {
                let state = std::fs::read_to_string(&freezer).unwrap_or_default();
                if matches!(state.trim(), "FROZEN" | "FREEZING") {
                    kill_supervisor();
                    seen_frozen.store(true, Ordering::Relaxed);
                    return;
                }
            }
        });
        let mut guest = Vec::new();
        let started = wait_until(60, || {
            guest = descendants(supervisor);
            guest.len() > 150
        });
        // Its timeout (1 s) sends SIGTERM, and the grace period (2 s) after it the SIGKILL
        // round: the supervisor dies as that round begins, if not before.
        std::thread::sleep(std::time::Duration::from_millis(2_900));
        kill_supervisor();
        watching.store(false, Ordering::Relaxed);
        assert!(started, "the command's processes started");
        guest
    });
    let left = || {
        guest
            .iter()
            .filter(|&&p| pid_exists(p))
            .map(|&p| (p, process_state(p)))
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(30, || left().is_empty()),
        "guest processes outlived their supervisor: {:?}",
        left()
    );
    assert!(
        !seen_frozen.load(Ordering::Relaxed),
        "the command's v1 freezer cgroup was frozen"
    );
    let _ = exec.wait();
}

/// A `dynocap run` killed outright (SIGKILL: no chance to cancel) while its sandbox starts,
/// here held with its guest up: the supervisor sees that nobody waits for the start and
/// removes it. Nothing of the home runs on, no record is left, and the name is free.
#[test]
fn a_run_killed_while_its_sandbox_starts_leaves_nothing() {
    if !require_root("a_run_killed_while_its_sandbox_starts_leaves_nothing") {
        return;
    }
    use dynocap_e2e::home_processes::home_processes;
    let home = TestHome::new();
    let log = home.path().join("logs");
    let mut run = home
        .command()
        .args(["--json", "run", "held"])
        .env(
            "DYNOCAP_FAILPOINTS",
            "supervisor.start.agent-answered=sleep(3000)",
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn dynocap");
    let agent_answered = || {
        std::fs::read_dir(&log)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                std::fs::read_to_string(entry.path())
                    .is_ok_and(|text| text.contains("supervisor: agent "))
            })
    };
    assert!(wait_until(120, agent_answered), "the sandbox never came up");
    run.kill().expect("SIGKILL the run");
    run.wait().expect("wait for the run");
    assert!(
        wait_until(120, || home_processes(home.path())
            .iter()
            .all(|p| p.command.contains("cli-server"))),
        "processes of the killed run's sandbox still run: {:#?}",
        home_processes(home.path())
    );
    assert_eq!(home.json(&["ps"])["sandboxes"], serde_json::json!([]));
    assert_eq!(
        std::fs::read_dir(home.path().join("sandboxes"))
            .map(|dir| dir.count())
            .unwrap_or(0),
        0,
        "the sandbox's files are left"
    );
    // The name is free.
    home.sandbox("held", &[]);
}
