//! Jobs from the command line: `exec --background` returns at once with a job id, `dynocap
//! job` lists the sandbox's jobs, follows one to its end (its output once, in order, and its
//! exit code) and kills one; a job id names nothing in another sandbox; a job still running
//! when its sandbox is destroyed is cut off, on the host too. `ps` and `ls` list running jobs;
//! a task's finish and its TTL say which jobs they cut off and keep each job's whole output
//! in the task's results; a restore keeps the jobs before it, their output read by their ids
//! and saved at the finish; a 17th background job is refused, saying how to free one;
//! `--json --follow` reports the whole output at the end.

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

/// `dynocap --json exec NAME --background --timeout SECS -- COMMAND`: the job's id. The
/// start answers while the command runs (`running`), not once it has ended: no clock needed.
fn background(home: &TestHome, name: &str, timeout: &str, command: &str) -> String {
    let value = home.json(&[
        "exec",
        name,
        "--background",
        "--timeout",
        timeout,
        "--",
        command,
    ]);
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

/// `--json job NAME JOB --follow` waits for the job's end and prints its report of the whole
/// output, as `--json job NAME JOB` after the end does. (It printed only what its last poll
/// read: `two`, without the `one` its first look had taken.)
#[test]
fn a_job_followed_with_json_reports_its_whole_output() {
    let Some(home) = booted("a_job_followed_with_json_reports_its_whole_output", &["jj"]) else {
        return;
    };
    let job = background(&home, "jj", "60", "echo one; sleep 3; echo two");
    // `one` is out before the follow starts: its first look reads it.
    assert!(
        wait_until(30, || home.json(&["job", "jj", &job])["stdout"] == "one\n"),
        "the job printed nothing"
    );
    let followed = home.json(&["job", "jj", &job, "--follow"]);
    assert_eq!(
        (
            &followed["state"],
            &followed["stdout"],
            &followed["stdoutOffset"]
        ),
        (
            &Value::from("exited"),
            &Value::from("one\ntwo\n"),
            &Value::from(8)
        ),
        "{followed:#}"
    );
}

/// `--follow` into a pipe writes every byte the job printed, as it printed it: megabytes
/// that came between two polls, bytes that are not UTF-8, a character split between two
/// writes. (It printed head and tail, with U+FFFD for such bytes.)
#[test]
fn a_followed_job_writes_every_byte_to_a_pipe() {
    let Some(home) = booted("a_followed_job_writes_every_byte_to_a_pipe", &["jp"]) else {
        return;
    };
    let job = background(
        &home,
        "jp",
        "120",
        "printf 'ab\\303'; sleep 2; printf '\\251\\n'; seq 1 1000000; printf '\\377\\376\\n'; \
         seq 1 5000 >&2",
    );
    let out: Output = home.run(&["job", "jp", &job, "--follow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut expected = "ab\u{e9}\n".as_bytes().to_vec();
    for n in 1..=1_000_000 {
        expected.extend_from_slice(format!("{n}\n").as_bytes());
    }
    expected.extend_from_slice(b"\xff\xfe\n");
    assert!(
        out.stdout == expected,
        "{} bytes, {} expected; the end: {:?}",
        out.stdout.len(),
        expected.len(),
        text(&out.stdout[out.stdout.len().saturating_sub(40)..])
    );
    let errs: String = (1..=5000).map(|n| format!("{n}\n")).collect();
    assert!(
        text(&out.stderr).starts_with(&errs),
        "{}",
        text(&out.stderr)
    );
    // Followed again once it ended: the same bytes.
    let again: Output = home.run(&["job", "jp", &job, "--follow"]);
    assert!(again.stdout == expected, "{} bytes", again.stdout.len());
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

/// A sandbox runs at most 16 background jobs: a 17th `--background` is refused saying how to
/// free one, and once one is killed it starts.
#[test]
fn a_seventeenth_background_job_is_refused_naming_the_kill() {
    let Some(home) = booted(
        "a_seventeenth_background_job_is_refused_naming_the_kill",
        &["j16"],
    ) else {
        return;
    };
    let jobs: Vec<String> = (0..16)
        .map(|_| background(&home, "j16", "600", "sleep 300"))
        .collect();
    let args = ["exec", "j16", "--background", "--", "sleep 300"];
    let err = home.json_err(&args);
    assert_eq!(err["code"], "conflict", "{err:#}");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("dynocap job NAME JOB --kill") && message.contains(&jobs[15]),
        "{err:#}"
    );
    // A command that is not a background job runs all the same.
    assert_eq!(home.sh("j16", "echo ok"), "ok\n");
    let out = home.run(&["--json", "job", "j16", &jobs[0], "--kill"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("a Job object");
    assert_eq!(report["state"], "killed", "{report:#}");
    background(&home, "j16", "600", "sleep 300");
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

/// The `jobs` a listing shows for the sandbox or task named `name` in `list`.
fn listed_jobs(list: &Value, name: &str) -> Vec<Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .find(|entry| entry["name"] == name)
        .and_then(|entry| entry["jobs"].as_array().cloned())
        .unwrap_or_default()
}

#[test]
fn ps_and_ls_list_a_sandboxs_running_jobs() {
    let Some(home) = booted("ps_and_ls_list_a_sandboxs_running_jobs", &["jl"]) else {
        return;
    };
    let ps = home.json(&["ps"]);
    assert!(listed_jobs(&ps["sandboxes"], "jl").is_empty(), "{ps:#}");
    let job = background(&home, "jl", "600", "sleep 310");
    let ps = home.json(&["ps"]);
    let jobs = listed_jobs(&ps["sandboxes"], "jl");
    assert_eq!(jobs.len(), 1, "{ps:#}");
    assert_eq!(
        (&jobs[0]["job"], &jobs[0]["command"]),
        (&Value::from(job.as_str()), &Value::from("sleep 310")),
        "{ps:#}"
    );
    assert!(jobs[0]["startedAt"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    assert!(jobs[0]["runningSeconds"].as_u64().is_some(), "{ps:#}");
    let ls = home.json(&["ls"]);
    assert_eq!(listed_jobs(&ls["sandboxes"], "jl").len(), 1, "{ls:#}");
    let table = text(&home.run(&["ps"]).stdout);
    assert!(
        table.contains(&format!("jl: job {job} running")) && table.contains("sleep 310"),
        "{table}"
    );
    // An ended job is no longer listed.
    home.run(&["job", "jl", &job, "--kill"]);
    let ps = home.json(&["ps"]);
    assert!(listed_jobs(&ps["sandboxes"], "jl").is_empty(), "{ps:#}");
}

/// Starts task `name` on a one-file project, with `flags`.
fn task(home: &TestHome, project: &std::path::Path, name: &str, flags: &[&str]) -> String {
    std::fs::write(project.join("a.txt"), "a\n").expect("write the project");
    let path = project.to_str().expect("utf-8 temp path");
    let mut args = vec!["task", "start", path, "--name", name];
    args.extend_from_slice(flags);
    let task = home.json(&args);
    task["id"].as_str().expect("a task id").to_owned()
}

/// `dynocap --json task exec NAME --background -- COMMAND`: the job's id.
fn task_background(home: &TestHome, name: &str, command: &str) -> String {
    let value = home.json(&[
        "task",
        "exec",
        name,
        "--background",
        "--timeout",
        "600",
        "--",
        command,
    ]);
    assert_eq!(value["running"], true, "{value:#}");
    value["job"].as_str().expect("a job id").to_owned()
}

/// The jobs `summary.json` of task `id` says its end cut off.
fn summary(home: &TestHome, id: &str) -> Value {
    let path = home.path().join("results").join(id).join("summary.json");
    serde_json::from_slice(&std::fs::read(&path).expect("summary.json")).expect("JSON")
}

#[test]
fn a_finish_says_which_jobs_it_cut_off_and_keeps_their_whole_output() {
    let test = "a_finish_says_which_jobs_it_cut_off_and_keeps_their_whole_output";
    if !require_root(test) {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().expect("tempdir");
    let id = task(&home, project.path(), "jf", &[]);
    // About 1.3 MB of output: far more than an exec result's or the exec log's excerpt.
    let job = task_background(&home, "jf", "seq 1 200000; sleep 320");
    let whole: String = (1..=200_000).map(|n| format!("{n}\n")).collect();
    assert!(
        wait_until(60, || {
            let report = home.json(&["job", "jf", &job]);
            report["stdoutOffset"].as_u64() == Some(whole.len() as u64)
        }),
        "the job's output reaches the host"
    );
    let ls = home.json(&["ls"]);
    assert_eq!(listed_jobs(&ls["tasks"], "jf").len(), 1, "{ls:#}");
    let result = home.json(&["task", "finish", "jf"]);
    assert_eq!(result["jobsCutOff"][0]["job"], job.as_str(), "{result:#}");
    assert_eq!(
        result["jobsCutOff"][0]["command"],
        "seq 1 200000; sleep 320"
    );
    assert_eq!(result["jobs"][0]["cutOff"], true, "{result:#}");
    let saved = home.path().join("results").join(&id).join("jobs");
    assert_eq!(
        result["jobs"][0]["stdoutPath"],
        saved.join(format!("{job}.stdout")).display().to_string()
    );
    let kept = std::fs::read_to_string(saved.join(format!("{job}.stdout"))).expect("saved");
    assert!(
        kept == whole,
        "the whole output is kept ({} bytes)",
        kept.len()
    );
    assert_eq!(result["jobs"][0]["stdoutBytes"], whole.len() as u64);
    let summary = summary(&home, &id);
    assert_eq!(
        summary["task"]["jobsCutOff"][0]["job"],
        job.as_str(),
        "{summary:#}"
    );
    // The exec log's entry for it says where its output went, not that it was lost.
    let log = std::fs::read_to_string(home.path().join("results").join(&id).join("exec.jsonl"))
        .expect("exec.jsonl");
    let entry: Value = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|entry| entry["command"] == "seq 1 200000; sleep 320")
        .expect("the job's exec.jsonl entry");
    let error = entry["error"].as_str().unwrap_or_default();
    assert!(
        !error.contains("lost") && error.contains(&saved.display().to_string()),
        "{entry:#}"
    );
    // Said in the text result too.
    let again = text(&home.run(&["task", "finish", "jf"]).stdout);
    assert!(
        again.contains("jobs cut off by the task's end:") && again.contains(&job),
        "{again}"
    );
}

/// `dynocap --json job NAME JOB` as a Job object, whatever its exit status (the job's).
fn job_report(home: &TestHome, name: &str, job: &str) -> Value {
    let out = home.run(&["--json", "job", name, job]);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("a Job object: {}", text(&out.stderr)))
}

/// A restore ends the task's jobs and executes its supervisor anew, which takes on the jobs
/// before it as ended ones: read by their old ids (it knew none of them: their output was
/// neither readable nor saved at the finish), saved byte for byte with the task's logs at its
/// end; the ids it gives after go on from them (it gave job-1 again, and a caller holding
/// the old id read the new command's output under it).
#[test]
fn a_restore_keeps_the_jobs_before_it_and_their_output() {
    let test = "a_restore_keeps_the_jobs_before_it_and_their_output";
    if !require_root(test) {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().expect("tempdir");
    let id = task(&home, project.path(), "jr", &[]);
    home.json(&["task", "checkpoint", "jr", "ready"]);
    // Known bytes, not all of them text, on both streams.
    let done = task_background(
        &home,
        "jr",
        r"printf 'before\n\000\377\376end'; printf 'to stderr\n' >&2",
    );
    let stdout_bytes: &[u8] = b"before\n\x00\xff\xfeend";
    assert!(
        wait_until(60, || job_report(&home, "jr", &done)["state"] == "exited"),
        "the first job ends"
    );
    let cut = task_background(&home, "jr", "echo running; sleep 300");
    assert!(
        wait_until(60, || job_report(&home, "jr", &cut)["stdoutOffset"] == 8),
        "the second job's output reaches the host"
    );
    // Beside the job, one command runs in the foreground and a client has connected without
    // asking anything yet: the restore ends the command and the job, and only the command is
    // counted as one (not the idle connection, not the job's own, not the restore's).
    let mut foreground = home
        .command()
        .args(["task", "exec", "jr", "--", "echo started; sleep 300"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a foreground command");
    let mut started = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(foreground.stdout.as_mut().expect("piped")),
        &mut started,
    )
    .expect("the foreground command's first line");
    assert_eq!(started, "started\n");
    let socket = home.path().join("run").join(format!("{id}.sock"));
    let idle = std::os::unix::net::UnixStream::connect(&socket).expect("connect to the task");
    let restored = home.json(&["task", "restore", "jr", "ready"]);
    assert_eq!(
        restored["jobsEnded"][0]["job"],
        cut.as_str(),
        "{restored:#}"
    );
    assert_eq!(restored["jobsEnded"].as_array().map(Vec::len), Some(1));
    assert_eq!(restored["commandsEnded"], 1, "{restored:#}");
    drop(idle);
    let ended = foreground
        .wait_with_output()
        .expect("the foreground command ends");
    assert!(
        !ended.status.success() && text(&ended.stderr).contains("restored to its checkpoint"),
        "{}",
        text(&ended.stderr)
    );
    let after = task_background(&home, "jr", "echo after");
    assert!(after != done && after != cut, "{after}");

    // The old ids read the old jobs: every byte, their state as the restore left it.
    let followed = home.run(&["job", "jr", &done, "--follow"]);
    assert_eq!(followed.stdout, stdout_bytes, "{}", text(&followed.stderr));
    assert_eq!(
        followed.status.code(),
        Some(0),
        "{}",
        text(&followed.stderr)
    );
    let report = job_report(&home, "jr", &done);
    assert_eq!(
        (&report["state"], &report["exitCode"], &report["stderr"]),
        (
            &Value::from("exited"),
            &Value::from(0),
            &Value::from("to stderr\n")
        ),
        "{report:#}"
    );
    let report = job_report(&home, "jr", &cut);
    assert_eq!(
        (&report["state"], &report["exitCode"], &report["stdout"]),
        (
            &Value::from("failed"),
            &Value::Null,
            &Value::from("running\n")
        ),
        "{report:#}"
    );
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains("restored to its checkpoint"), "{report:#}");
    let listed = home.json(&["job", "jr"]);
    let ids: Vec<&str> = listed["jobs"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|job| job["job"].as_str())
        .collect();
    assert_eq!(
        ids,
        [done.as_str(), cut.as_str(), after.as_str()],
        "{listed:#}"
    );
    assert!(
        wait_until(60, || job_report(&home, "jr", &after)["state"] == "exited"),
        "the job after the restore ends"
    );

    // The finish saves them all with the task's logs, the first byte for byte.
    let result = home.json(&["task", "finish", "jr"]);
    let saved = home.path().join("results").join(&id).join("jobs");
    let logged: Vec<&str> = result["jobs"]
        .as_array()
        .expect("the jobs' logs")
        .iter()
        .filter_map(|log| log["job"].as_str())
        .collect();
    assert_eq!(
        logged,
        [done.as_str(), cut.as_str(), after.as_str()],
        "{result:#}"
    );
    let read = |job: &str, stream: &str| {
        std::fs::read(saved.join(format!("{job}.{stream}"))).expect("a saved log")
    };
    assert_eq!(read(&done, "stdout"), stdout_bytes);
    assert_eq!(read(&done, "stderr"), b"to stderr\n");
    assert_eq!(read(&cut, "stdout"), b"running\n");
    assert_eq!(read(&after, "stdout"), b"after\n");
    // The finish cut none of them off: the restore ended the one that ran.
    assert!(
        result["jobsCutOff"].as_array().is_none_or(Vec::is_empty),
        "{result:#}"
    );
}

#[test]
fn a_tasks_ttl_says_which_jobs_it_cut_off() {
    let test = "a_tasks_ttl_says_which_jobs_it_cut_off";
    if !require_root(test) {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().expect("tempdir");
    let id = task(&home, project.path(), "jt", &["--ttl", "30"]);
    let job = task_background(&home, "jt", "echo before the ttl; sleep 330");
    assert!(
        wait_until(90, || home.json(&["ls"])["tasks"][0]["state"] == "expired"),
        "the task expired"
    );
    let summary = summary(&home, &id);
    assert_eq!(
        summary["task"]["jobsCutOff"][0]["job"],
        job.as_str(),
        "{summary:#}"
    );
    let saved = home.path().join("results").join(&id).join("jobs");
    assert_eq!(
        std::fs::read_to_string(saved.join(format!("{job}.stdout"))).expect("saved"),
        "before the ttl\n"
    );
    // The finish that follows answers with what the expiry saved, the cut-off jobs with it.
    let result = home.json(&["task", "finish", "jt"]);
    assert_eq!(result["state"], "expired", "{result:#}");
    assert_eq!(result["jobsCutOff"][0]["job"], job.as_str(), "{result:#}");
    assert_eq!(result["jobs"][0]["cutOff"], true, "{result:#}");
}
