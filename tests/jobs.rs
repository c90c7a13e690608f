//! Jobs from the command line: `exec --background` returns at once with a job id, `dynocap
//! job` lists the sandbox's jobs, follows one to its end (its output once, in order, and its
//! exit code) and kills one; a job id names nothing in another sandbox; a job still running
//! when its sandbox is destroyed is cut off, on the host too.

use std::process::Output;

use dynocap_e2e::*;
use serde_json::Value;

fn booted(test: &str, names: &[&str]) -> Option<TestHome> {
    if !require_root(test) {
        return None;
    }
    let home = TestHome::new();
    for name in names {
        home.sandbox(name, &[]);
    }
    Some(home)
}

/// `dynocap --json exec NAME --background --timeout SECS -- COMMAND`: the job's id.
fn background(home: &TestHome, name: &str, timeout: &str, command: &str) -> String {
    let started = std::time::Instant::now();
    let value = home.json(&[
        "exec",
        name,
        "--background",
        "--timeout",
        timeout,
        "--",
        command,
    ]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "a background start returns at once"
    );
    assert_eq!(value["running"], true, "{value:#}");
    let job = value["job"].as_str().expect("a job id").to_owned();
    assert!(job.starts_with("job-"), "{job}");
    job
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether a process whose command line starts with `args` runs in the sandbox.
fn running(home: &TestHome, name: &str, args: &str) -> bool {
    let count = home.sh(name, &format!("ps -eo args | grep -c '^{args}' || true"));
    count.trim() != "0"
}

#[test]
fn a_background_job_is_listed_and_followed_to_its_end() {
    let Some(home) = booted(
        "a_background_job_is_listed_and_followed_to_its_end",
        &["jb"],
    ) else {
        return;
    };
    let job = background(
        &home,
        "jb",
        "60",
        "echo one; sleep 2; echo two; echo err >&2; exit 3",
    );
    let listed = home.json(&["job", "jb"]);
    let jobs = listed["jobs"].as_array().expect("a list");
    assert_eq!(jobs.len(), 1, "{listed:#}");
    assert_eq!(jobs[0]["job"], job.as_str());
    assert_eq!(
        jobs[0]["command"],
        "echo one; sleep 2; echo two; echo err >&2; exit 3"
    );
    // Followed from the start: each piece of output once, then the state and exit code.
    let out: Output = home.run(&["job", "jb", &job, "--follow"]);
    assert_eq!(
        text(&out.stdout),
        "one\ntwo\n",
        "stderr: {}",
        text(&out.stderr)
    );
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("err\n"), "{stderr}");
    assert!(
        stderr.contains(&format!("{job} exited, exit code 3")),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(3));
    // Once ended, its whole output is still there, and the list says how it ended.
    let report = home.run(&["--json", "job", "jb", &job]);
    let report: Value = serde_json::from_slice(&report.stdout).expect("a Job object");
    assert_eq!(
        (
            &report["state"],
            &report["exitCode"],
            &report["stdout"],
            &report["stderr"]
        ),
        (
            &Value::from("exited"),
            &Value::from(3),
            &Value::from("one\ntwo\n"),
            &Value::from("err\n")
        ),
        "{report:#}"
    );
    assert_eq!(report["stdoutOffset"], 8);
    let listed = home.json(&["job", "jb"]);
    assert_eq!(listed["jobs"][0]["state"], "exited", "{listed:#}");
    let table = text(&home.run(&["job", "jb"]).stdout);
    assert!(table.contains(&job) && table.contains("exited"), "{table}");
}

#[test]
fn a_job_is_killed_and_other_sandboxes_do_not_see_it() {
    let Some(home) = booted(
        "a_job_is_killed_and_other_sandboxes_do_not_see_it",
        &["jk", "jo"],
    ) else {
        return;
    };
    let job = background(&home, "jk", "600", "echo started; sleep 300");
    assert!(wait_until(20, || running(&home, "jk", "sleep 300")));
    // The same id asked of another sandbox names nothing there.
    let err = home.json_err(&["job", "jo", &job]);
    assert_eq!(err["code"], "not_found", "{err:#}");
    let err = home.json_err(&["job", "jk", "job-99"]);
    assert_eq!(err["code"], "not_found", "{err:#}");
    let out = home.run(&["--json", "job", "jk", &job, "--kill"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("a Job object");
    assert_eq!(report["state"], "killed", "{report:#}");
    assert_eq!(report["stdout"], "started\n");
    assert!(
        !running(&home, "jk", "sleep 300"),
        "the kill ends the command"
    );
    // A killed job's sandbox goes on.
    assert_eq!(home.sh("jk", "echo alive"), "alive\n");
}

#[test]
fn a_job_still_running_when_its_sandbox_is_destroyed_is_cut_off() {
    let Some(home) = booted(
        "a_job_still_running_when_its_sandbox_is_destroyed_is_cut_off",
        &["jd"],
    ) else {
        return;
    };
    let id = home.sandbox_id("jd");
    let job = background(&home, "jd", "600", "sleep 4242");
    let sleeping = || {
        processes_in_guest_uid_range()
            .into_iter()
            .any(|(pid, _, name)| {
                name == "sleep"
                    && std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|cmd| cmd.starts_with(b"sleep\x004242"))
            })
    };
    assert!(wait_until(20, sleeping), "the job runs on the host");
    home.json(&["destroy", "jd"]);
    assert!(
        wait_until(20, || !sleeping()),
        "the job ends with its sandbox"
    );
    let log = std::fs::read_to_string(home.log_path(&id)).unwrap_or_default();
    assert!(
        log.contains(&format!("cuts off its running jobs: {job} (sleep 4242)")),
        "{log}"
    );
    let err = home.json_err(&["job", "jd", &job]);
    assert_eq!(err["code"], "not_found", "{err:#}");
}
