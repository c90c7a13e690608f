//! Live forks (`task fork --live`): on the vm (one task, TCG, checkpointed first) a server
//! started as a job in the parent still runs in the fork, and in a second live fork; each
//! answers on its own hostname while the parent's session goes on; the parent keeps its job,
//! the forks list none; each finishes with a verified patch of the shared work and its own
//! change only. Both guests' clocks are the host's right after the fork (the save paused
//! the parent's, and the fork's stood still from the save to its resume). A live fork of a
//! `filtered` task is filtered as its parent: an allowed host answers, another is refused.
//! On the jail, `--live` is refused, saying it is the vm backend's, and leaves no fork behind.
//! A live fork the host cannot back (its state file does not fit) is refused before the
//! pause: the parent runs on untouched and nothing half-made is left.

use dynocap_e2e::netfix::*;
use dynocap_e2e::*;

/// Asserts that the guest clock of task `name` reads the host's, within a few seconds.
fn assert_clock_is_the_hosts(home: &TestHome, name: &str) {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
    };
    let before = now();
    let guest: u64 = home
        .task_sh(name, "date +%s")
        .trim()
        .parse()
        .expect("date +%s");
    let after = now();
    assert!(
        guest + 3 >= before && guest <= after + 3,
        "{name}'s clock reads {guest}, the host's {before}..{after}"
    );
}

/// HTTP status of `curl` to the guest's port 8000 from inside task `name`, waiting for the
/// server to listen.
const CURL: &str = "for i in $(seq 150); do curl -s -o /dev/null localhost:8000/ && break; \
                    sleep 0.2; done; curl -s -o /dev/null -w '%{http_code}' localhost:8000/";

#[test]
fn a_live_fork_keeps_the_running_server_and_finishes_its_own_patch() {
    let test = "a_live_fork_keeps_the_running_server_and_finishes_its_own_patch";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "p"]);
    let job = home.task_job(
        "p",
        900,
        "cd /tmp && echo $$ > /tmp/server.pid && exec python3 -m http.server 8000 --bind 127.0.0.1",
    );
    assert_eq!(home.task_sh("p", CURL), "200");
    let server = home.task_sh("p", "cat /tmp/server.pid");
    home.task_sh("p", "echo shared >> a.txt");

    // A checkpoint first: the live fork then freezes a layer a freeze added.
    home.json(&["task", "checkpoint", "p", "before"]);
    let fork = home.json(&["task", "fork", "p", "f", "--live"]);
    assert_eq!(fork["forkedFrom"]["task"], "p", "{fork:#}");
    assert_clock_is_the_hosts(&home, "p");
    assert_clock_is_the_hosts(&home, "f");
    // The parent's session went on across the save: its job is running and listed.
    assert_eq!(home.task_sh("p", CURL), "200");
    let jobs = home.json(&["job", "p"]);
    assert!(jobs.to_string().contains(&job), "{jobs:#}");

    // The very process (its pid in /tmp, which is memory), answering, in the fork, which has
    // its own name and no jobs.
    let seen = home.task_sh(
        "f",
        &format!("{CURL}; echo; hostname; cat /tmp/server.pid; tr '\\0' ' ' < /proc/$(cat /tmp/server.pid)/cmdline"),
    );
    assert_eq!(
        seen,
        format!("200\nf\n{server}python3 -m http.server 8000 --bind 127.0.0.1 ")
    );
    let fork_jobs = home.json(&["job", "f"]);
    assert!(!fork_jobs.to_string().contains("job-"), "{fork_jobs:#}");

    // A second live fork of the same running task: the layer the first froze is now the
    // first fork's too, and this one freezes another above it.
    let second = home.json(&["task", "fork", "p", "g", "--live"]);
    assert_eq!(second["forkedFrom"]["task"], "p", "{second:#}");
    assert_eq!(
        home.task_sh("g", &format!("{CURL}; echo; hostname")),
        "200\ng\n"
    );
    let finish = home.json(&["task", "finish", "g"]);
    assert_eq!(finish["verified"], true, "{finish:#}");

    home.task_sh("f", "echo fork > fork.txt");
    home.task_sh("p", "echo parent > parent.txt");
    let finish = home.json(&["task", "finish", "f"]);
    assert_eq!(finish["verified"], true, "{finish:#}");
    let patch = std::fs::read_to_string(finish["patchPath"].as_str().expect("patchPath"))
        .expect("the fork's patch");
    assert!(
        patch.contains("+shared") && patch.contains("b/fork.txt") && !patch.contains("parent"),
        "{patch}"
    );
    let finish = home.json(&["task", "finish", "p"]);
    assert_eq!(finish["verified"], true, "{finish:#}");
    let patch = std::fs::read_to_string(finish["patchPath"].as_str().expect("patchPath"))
        .expect("the parent's patch");
    assert!(
        patch.contains("+shared") && patch.contains("b/parent.txt") && !patch.contains("fork"),
        "{patch}"
    );
}

#[test]
fn a_live_fork_of_a_filtered_task_is_filtered_too() {
    let test = "a_live_fork_of_a_filtered_task_is_filtered_too";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let fix = NetFix::start();
    let home = fix
        .product_env()
        .iter()
        .fold(home, |home, (key, value)| home.with_env(key, value));
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&[
        "task",
        "start",
        &path,
        "--name",
        "p",
        "--network",
        "filtered",
    ]);
    let allowed = format!("curl -sS --fail https://{NPM_HOST}/");
    assert_eq!(home.task_sh("p", &allowed), "dynocap netfix\n");
    let fork = home.json(&["task", "fork", "p", "f", "--live"]);
    assert_eq!(fork["network"], "filtered", "{fork:#}");
    for name in ["f", "p"] {
        assert_eq!(home.task_sh(name, &allowed), "dynocap netfix\n", "{name}");
        let refused = home.exec_in_task(name, &format!("curl -sS https://{GIT_HOST}/"), 60);
        assert_ne!(refused["exitCode"], 0, "{name}: {refused:#}");
        assert!(
            refused["stderr"]
                .as_str()
                .unwrap_or_default()
                .contains("403"),
            "{name}: {refused:#}"
        );
    }
    assert!(
        !fix.https.requests().iter().any(|r| r["sni"] == GIT_HOST),
        "{:#?}",
        fix.https.requests()
    );
}

#[test]
fn a_live_fork_of_a_jail_task_is_refused_as_the_vms() {
    let test = "a_live_fork_of_a_jail_task_is_refused_as_the_vms";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "j"]);
    let err = home.json_err(&["task", "fork", "j", "jf", "--live"]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    let message = err["message"].as_str().expect("message");
    assert!(message.contains("only the vm backend"), "{message}");
    let listed = home.json(&["ls"]);
    assert!(!listed.to_string().contains("\"jf\""), "{listed:#}");
    assert_eq!(home.task_sh("j", "cat a.txt"), "a\n", "the source runs on");
}

/// A home on a small filesystem, nearly filled from the host so that the live fork's state
/// file (the guest's memory) cannot fit: the fork is refused `policy_denied` before the
/// pause, naming the room it needs and the fix. The parent was never stopped: its job's
/// process is alive, it answers, its work is intact and it finishes with its patch; no fork,
/// no `.making-live-*` and no fork's state directory are left.
#[test]
fn a_live_fork_the_host_cannot_back_is_refused_and_the_parent_runs_on() {
    let test = "a_live_fork_the_host_cannot_back_is_refused_and_the_parent_runs_on";
    // The debian image (~700 MB copied here), the task's 1 GiB disk and some room to spare.
    let Some((fs, home)) = backend::vm_home_on_small_fs(test, 3200) else {
        return;
    };
    let project = one_commit_project("a.txt", "a\n");
    let path = project.path().to_string_lossy();
    home.json(&["task", "start", &path, "--name", "p", "--disk-mb", "1024"]);
    home.task_sh("p", "echo shared >> a.txt && sync");
    let job = home.task_job("p", 900, "echo $$ > /tmp/sleeper.pid && exec sleep 900");
    assert!(wait_until(30, || home
        .task_sh("p", "cat /tmp/sleeper.pid 2>/dev/null || true")
        .trim()
        .parse::<u32>()
        .is_ok()));

    // Less room than the guest's memory (1 GiB by default) needs in the state file.
    let ballast = fs.mount.join("ballast");
    let keep = 300;
    let status = std::process::Command::new("fallocate")
        .args(["-l", &format!("{}M", fs.free_mb().saturating_sub(keep))])
        .arg(&ballast)
        .status()
        .expect("fallocate");
    assert!(status.success());
    assert!(fs.free_mb() <= keep, "{} MB free", fs.free_mb());

    let err = home.json_err(&["task", "fork", "p", "f", "--live"]);
    assert_eq!(err["code"], "policy_denied", "{err:#}");
    let message = err["message"].as_str().expect("message");
    for needle in ["live fork", "needs", "MB more", "MB free", "rm --purge"] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }

    // Nothing half-made: no fork in the catalog, no fork's directory, no temporary.
    let listed = home.json(&["ls"]);
    assert!(!listed.to_string().contains("\"f\""), "{listed:#}");
    let id = home.sandbox_id("p");
    home.assert_only_sandbox_dirs(&["p"]);
    let checkpoints = home.path().join("sandboxes").join(&id).join("checkpoints");
    let leftovers: Vec<String> = std::fs::read_dir(&checkpoints)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".making-live-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // The parent runs on as it was: its job's process, its work, its session.
    assert_eq!(
        home.task_sh(
            "p",
            "kill -0 $(cat /tmp/sleeper.pid) && echo alive; cat a.txt"
        ),
        "alive\na\nshared\n"
    );
    let jobs = home.json(&["job", "p"]);
    assert!(jobs.to_string().contains(&job), "{jobs:#}");
    std::fs::remove_file(&ballast).expect("remove the ballast");
    home.task_sh("p", "echo after > after.txt");
    let finish = home.json(&["task", "finish", "p"]);
    let patch = verified_patch(&finish);
    assert_eq!(patch_files(&patch), ["a.txt", "after.txt"], "{patch}");
    // The finish replies before its teardown ends.
    let state_dir = home.path().join("sandboxes").join(&id);
    assert!(
        wait_until(60, || !state_dir.exists()),
        "the task's state directory goes with its teardown"
    );
}
