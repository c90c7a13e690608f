//! `dynocap exec` end to end: exit codes, signals, cwd/env, streams, truncation, stdin,
//! timeouts, terminals, zombie reaping and concurrency.

use dynocap_e2e::*;

fn booted(test: &str) -> Option<TestHome> {
    if !require_root(test) {
        return None;
    }
    let home = TestHome::new();
    home.sandbox("ex", &[]);
    Some(home)
}

#[test]
fn exit_codes_signals_cwd_env_and_streams() {
    let Some(home) = booted("exit_codes_signals_cwd_env_and_streams") else {
        return;
    };
    let ok = home.exec("ex", &[], "echo out; echo err >&2");
    assert_eq!(ok["exitCode"], 0);
    assert_eq!(ok["stdout"], "out\n");
    assert_eq!(ok["stderr"], "err\n");
    assert_eq!(ok["timedOut"], false);
    assert_eq!(ok["truncated"], false);
    assert!(ok["signal"].is_null());
    assert!(ok["durationMs"].as_u64().is_some());

    assert_eq!(home.exec("ex", &[], "exit 3")["exitCode"], 3);
    let killed = home.exec("ex", &[], "kill -9 $$");
    assert!(killed["exitCode"].is_null());
    assert_eq!(killed["signal"], "SIGKILL");

    assert_eq!(
        home.exec("ex", &[], "pwd")["stdout"],
        "/\n",
        "default cwd is /"
    );
    assert_eq!(
        home.exec("ex", &["--cwd", "/tmp"], "pwd")["stdout"],
        "/tmp\n"
    );
    let env = home.exec(
        "ex",
        &["--env", "GREETING=hi there", "--env", "X=1"],
        "echo \"$GREETING $X\"; id -un",
    );
    assert_eq!(env["stdout"], "hi there 1\nsandbox\n");
    let missing = home.json_err(&["exec", "ex", "--cwd", "/nonexistent", "--", "true"]);
    assert_eq!(missing["code"], "invalid_argument");
    assert!(
        missing["message"]
            .as_str()
            .unwrap()
            .contains("/nonexistent"),
        "{missing}"
    );

    // Without --json, the CLI behaves like the command: same exit code, same streams.
    let out = home.run(&["exec", "ex", "--", "echo visible; echo problem >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "visible\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("problem"));
    let out = home.run(&["exec", "ex", "--", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
}

#[test]
fn large_output_is_truncated_and_stdin_is_closed() {
    let Some(home) = booted("large_output_is_truncated_and_stdin_is_closed") else {
        return;
    };
    // 10 MiB of `a` then a last line: the head and the tail survive, with the count between.
    let big = home.exec(
        "ex",
        &[],
        "head -c 10485760 /dev/zero | tr '\\0' a; echo; echo the-last-line; echo done >&2",
    );
    assert_eq!(big["exitCode"], 0);
    assert_eq!(big["truncated"], true);
    let stdout = big["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("aaaa"), "the head is kept");
    // The tail starts at a line: the 'a's the cut left before it are dropped with the rest.
    assert!(
        stdout.ends_with("omitted …]\nthe-last-line\n"),
        "the tail is kept"
    );
    let omitted: u64 = 10_485_760 + 15 - 1024 * 1024 / 4 - "the-last-line\n".len() as u64;
    let marker = format!(
        "[… {} bytes omitted …]",
        dynocap_engine::excerpt::thousands(omitted)
    );
    assert!(
        stdout.contains(&marker),
        "the marker counts what was dropped: {marker}"
    );
    assert!(stdout.len() < 1024 * 1024 + 100);
    assert_eq!(big["stderr"], "done\n");
    // stdin is /dev/null: cat returns at once instead of waiting for the timeout.
    let cat = home.exec("ex", &["--timeout", "20"], "cat; echo eof");
    assert_eq!(cat["stdout"], "eof\n");
    assert_eq!(cat["timedOut"], false);
}

#[test]
fn timeout_kills_the_whole_process_group() {
    timeout_kills_the_whole_process_group_on(Backend::Jail);
}

#[test]
fn timeout_kills_the_whole_process_group_in_a_vm() {
    timeout_kills_the_whole_process_group_on(Backend::Vm);
}

fn timeout_kills_the_whole_process_group_on(backend: Backend) {
    let Some(home) = TestHome::on(backend, "timeout_kills_the_whole_process_group") else {
        return;
    };
    let info = home.sandbox("ex", &[]);
    assert_eq!(info["backend"], backend.name(), "{info:#}");
    let started = std::time::Instant::now();
    let result = home.exec(
        "ex",
        &["--timeout", "2"],
        "trap '' TERM; (trap '' TERM; sleep 300) & sleep 301 & echo started; sleep 302",
    );
    assert_eq!(result["timedOut"], true);
    assert_eq!(result["stdout"], "started\n", "output so far is returned");
    assert!(started.elapsed().as_secs() < 60, "the timeout was honoured");
    // Every command line of the guest, from /proc: an image need not have `ps`.
    let left = home.sh(
        "ex",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null \
         | grep -c '^sleep 30[012]' || true",
    );
    assert_eq!(
        left.trim(),
        "0",
        "no process of the timed-out group survived"
    );
    // The CLI reports the timeout with exit code 124.
    let out = home.run(&["exec", "ex", "--timeout", "1", "--", "sleep 100"]);
    assert_eq!(out.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
}

#[test]
fn terminal_transcript_renders_carriage_returns_and_colours() {
    terminal_transcript_renders_carriage_returns_and_colours_on(Backend::Jail);
}

#[test]
fn terminal_transcript_renders_carriage_returns_and_colours_in_a_vm() {
    terminal_transcript_renders_carriage_returns_and_colours_on(Backend::Vm);
}

fn terminal_transcript_renders_carriage_returns_and_colours_on(backend: Backend) {
    let test = "terminal_transcript_renders_carriage_returns_and_colours";
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    home.sandbox("ex", &[]);
    let result = home.exec(
        "ex",
        &["--tty"],
        "printf 'loading 10%%\\rloading 100%%\\n'; printf '\\033[31mred\\033[0m plain\\n'; stty size; test -t 1 && echo tty",
    );
    assert_eq!(result["exitCode"], 0);
    assert!(
        result.get("stdout").is_none(),
        "terminal mode returns a transcript: {result}"
    );
    assert_eq!(
        result["transcript"],
        "loading 100%\nred plain\n24 80\ntty\n"
    );
}

#[test]
fn orphans_are_reaped() {
    let Some(home) = booted("orphans_are_reaped") else {
        return;
    };
    // Each command leaves an orphan that exits a moment later; PID 1 must reap them.
    for _ in 0..5 {
        home.sh("ex", "(sleep 0.2 &) ; true");
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    let zombies = home.sh("ex", "ps -eo stat= | grep -c '^Z' || true");
    assert_eq!(zombies.trim(), "0");
}

#[test]
fn hundred_concurrent_execs() {
    let Some(home) = booted("hundred_concurrent_execs") else {
        return;
    };
    let handles: Vec<_> = (0..100)
        .map(|i| {
            let mut cmd = home.command();
            cmd.args([
                "--json",
                "exec",
                "ex",
                "--",
                &format!("sleep 0.5; echo {i}"),
            ]);
            std::thread::spawn(move || (i, cmd.output().expect("spawn")))
        })
        .collect();
    for handle in handles {
        let (i, out) = handle.join().unwrap();
        assert!(
            out.status.success(),
            "exec {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(value["stdout"], format!("{i}\n"));
    }
}

/// Processes that leave the command's process group or shrug off SIGTERM, in the usual ways:
/// a new session, nohup, a shell's double-forked daemon, a changed process group, a SIGTERM
/// handler that starts a new process, a subshell ignoring TERM under setsid, a classic
/// daemon (fork, setsid, fork). Each touches its marker in /tmp/esc just before it settles;
/// the command waits until all eight did.
const ESCAPES: &str = r#"rm -rf /tmp/esc; mkdir /tmp/esc; q='</dev/null >/dev/null 2>&1'
eval "setsid sh -c 'trap \"\" TERM; touch /tmp/esc/1; sleep 1001' $q &"
eval "nohup sh -c 'trap \"\" TERM HUP; touch /tmp/esc/2; sleep 1002' $q &"
eval "(setsid sh -c '(trap \"\" TERM HUP; touch /tmp/esc/3; exec sleep 1003) &' $q &)"
eval "perl -e 'setpgrp(0, 0); \$SIG{TERM} = q(IGNORE); open(F, q(>/tmp/esc/4)); close(F); sleep 1004' $q &"
eval "setsid sh -c 'trap \"sleep 1005 &\" TERM; touch /tmp/esc/5; while :; do sleep 1; done' $q &"
eval "setsid sh -c '(trap \"\" TERM; touch /tmp/esc/6; sleep 1006) &' $q"
eval "perl -MPOSIX -e 'exit if fork; setsid(); exit if fork; \$SIG{TERM} = \$SIG{HUP} = q(IGNORE); open(F, q(>/tmp/esc/7)); close(F); sleep 1007' $q"
trap '' TERM; touch /tmp/esc/8
while [ "$(ls /tmp/esc | wc -l)" -lt 8 ]; do sleep 0.1; done
echo started; sleep 1008"#;

/// Which cgroup hierarchies are mounted here: (`DYNOCAP_EXEC_CGROUP` value, mounted).
fn hierarchy_mounted(choice: &str) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts.lines().any(|line| {
        let Some((_, after)) = line.split_once(" - ") else {
            return false;
        };
        let fields: Vec<&str> = after.split(' ').collect();
        match (choice, fields.as_slice()) {
            ("v2", ["cgroup2", ..]) => true,
            (controller, ["cgroup", _, options, ..]) => options.split(',').any(|o| o == controller),
            _ => false,
        }
    })
}

/// Boots sandbox `name` whose commands are tracked in hierarchy `choice`, if it is mounted.
fn booted_with(test: &str, choice: &str, name: &str) -> Option<TestHome> {
    if !require_root(test) {
        return None;
    }
    if !hierarchy_mounted(choice) {
        eprintln!("SKIPPED {test}: no {choice} cgroup hierarchy on this machine");
        return None;
    }
    let home = TestHome::new();
    let out = home
        .command()
        .env("DYNOCAP_EXEC_CGROUP", choice)
        .args(["--json", "run", name])
        .output()
        .expect("spawn dynocap");
    assert!(
        out.status.success(),
        "run with DYNOCAP_EXEC_CGROUP={choice}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Some(home)
}

/// Host processes in the sandbox's cgroups (any hierarchy), as (pid, command line).
fn sandbox_processes(home: &TestHome, name: &str) -> Vec<(i32, String)> {
    let needle = format!("/dynocap/{}", home.sandbox_id(name));
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cgroups) = std::fs::read_to_string(entry.path().join("cgroup")) else {
            continue;
        };
        let inside = cgroups.lines().any(|line| {
            line.split_once(&needle)
                .is_some_and(|(_, rest)| rest.is_empty() || rest.starts_with('/'))
        });
        if inside {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    found
}

/// The cgroups the guest's agent made below the sandbox's own, as host paths.
fn command_cgroups(home: &TestHome, name: &str) -> Vec<std::path::PathBuf> {
    let id = home.sandbox_id(name);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found = Vec::new();
    for line in mounts.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        if !after.starts_with("cgroup") {
            continue;
        }
        let Some(mount) = before.split(' ').nth(4) else {
            continue;
        };
        let dir = std::path::Path::new(mount).join("dynocap").join(&id);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                found.push(entry.path());
            }
        }
    }
    found
}

/// Waits until the sandbox holds nothing but its agent, then checks that from both sides:
/// on the host (its cgroups) and in the guest (`ps`, which sees only its own exec besides);
/// and that no command cgroup is left.
fn assert_only_the_agent_is_left(home: &TestHome, name: &str, what: &str) {
    let only_agent =
        |procs: &[(i32, String)]| procs.len() == 1 && procs[0].1.starts_with("/.dynocap/agent ");
    let gone = wait_until(30, || only_agent(&sandbox_processes(home, name)));
    assert!(
        gone,
        "{what}: processes other than the agent are left in the sandbox: {:?}",
        sandbox_processes(home, name)
    );
    let ps = home.sh(name, "ps -eo pid=,args=");
    let strays: Vec<&str> = ps
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("1 ") && !l.contains("ps -eo pid=,args="))
        .collect();
    assert!(strays.is_empty(), "{what}: the guest still runs {strays:?}");
    // Emptied, the commands' cgroups are removed too.
    assert!(
        wait_until(30, || command_cgroups(home, name).is_empty()),
        "{what}: command cgroups are left: {:?}",
        command_cgroups(home, name)
    );
}

/// The whole class of escapes dies with its command when it times out (pipes and a
/// terminal) and when its client goes away (a cancel), in hierarchy `choice`.
fn escapes_die_with_their_command(test: &str, choice: &str) {
    let name = format!("esc-{choice}");
    let Some(home) = booted_with(test, choice, &name) else {
        return;
    };
    for flags in [&["--timeout", "8"][..], &["--timeout", "8", "--tty"]] {
        let result = home.exec(&name, flags, ESCAPES);
        assert_eq!(result["timedOut"], true, "{flags:?}: {result:#}");
        let output = result
            .get("stdout")
            .or_else(|| result.get("transcript"))
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        assert!(
            output.contains("started"),
            "{flags:?}: every escape started before the timeout: {result:#}"
        );
        assert_only_the_agent_is_left(&home, &name, &format!("timeout {flags:?}"));
    }

    let mut client = home
        .command()
        .args(["--json", "exec", &name, "--timeout", "600", "--", ESCAPES])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn dynocap exec");
    let started = wait_until(60, || {
        home.sh(&name, "ls /tmp/esc 2>/dev/null | wc -l").trim() == "8"
    });
    assert!(started, "the escapes did not all start");
    client.kill().expect("kill the client");
    client.wait().expect("reap the client");
    assert_only_the_agent_is_left(&home, &name, "cancel");
}

#[test]
fn escapes_die_with_their_command_v2() {
    escapes_die_with_their_command("escapes_die_with_their_command_v2", "v2");
}

#[test]
fn escapes_die_with_their_command_v1_freezer() {
    escapes_die_with_their_command("escapes_die_with_their_command_v1_freezer", "freezer");
}

#[test]
fn escapes_die_with_their_command_v1_pids() {
    escapes_die_with_their_command("escapes_die_with_their_command_v1_pids", "pids");
}

#[test]
fn background_processes_outlive_a_normal_exit_and_their_cgroup_goes_with_them() {
    let Some(home) =
        booted("background_processes_outlive_a_normal_exit_and_their_cgroup_goes_with_them")
    else {
        return;
    };
    let result = home.exec(
        "ex",
        &[],
        "setsid sleep 1010 </dev/null >/dev/null 2>&1 & sleep 1011 </dev/null >/dev/null 2>&1 & echo started",
    );
    assert_eq!(result["exitCode"], 0, "{result:#}");
    assert_eq!(result["stdout"], "started\n");
    // A dev server started with `&` keeps running after its command ended.
    assert_eq!(
        home.sh("ex", "ps -eo args= | grep -c '^sleep 101[01]$' || true"),
        "2\n"
    );
    let lingering = command_cgroups(&home, "ex");
    assert_eq!(
        lingering.len(),
        1,
        "its command's cgroup stays: {lingering:?}"
    );

    home.sh("ex", "pkill -x sleep; true");
    assert!(wait_until(30, || {
        home.sh("ex", "ps -eo args= | grep -c '^sleep 101[01]$' || true") == "0\n"
    }));
    // The next command sweeps the emptied cgroup away, and its own goes when it ends.
    home.sh("ex", "true");
    assert_eq!(
        command_cgroups(&home, "ex"),
        Vec::<std::path::PathBuf>::new()
    );
}

/// `: xxxx…; echo ok` of exactly `len` bytes, as words of at most 100 000 bytes (each
/// argument of `dynocap` itself is bounded by the kernel too); the CLI joins them with spaces.
/// Words after `--` that make a command of exactly `len` bytes once the CLI quotes them for
/// `sh -c` (`'sh' '-c' 'echo ok' '_' 'xxx…' …`): long filler arguments, each under the
/// kernel's 128 KiB per argument so that the CLI itself can be started with them.
fn long_command(len: usize) -> Vec<String> {
    let mut words: Vec<String> = ["sh", "-c", "echo ok", "_"].map(String::from).to_vec();
    let quoted = |words: &[String]| words.iter().map(|w| w.len() + 3).sum::<usize>() - 1;
    while quoted(&words) < len {
        // A new word costs its length plus two quotes and a space.
        let n = (len - quoted(&words)).saturating_sub(3).clamp(1, 100_000);
        words.push("x".repeat(n));
    }
    assert_eq!(quoted(&words), len, "the filler lands on the exact length");
    words
}

#[test]
fn commands_up_to_the_limit_run_and_longer_ones_are_refused() {
    let Some(home) = booted("commands_up_to_the_limit_run_and_longer_ones_are_refused") else {
        return;
    };
    let max = 256 * 1024;
    let exec = |flags: &[&str], len: usize| {
        let mut args: Vec<String> = ["--json", "exec", "ex"].map(String::from).to_vec();
        args.extend(flags.iter().map(|f| (*f).to_owned()));
        args.push("--".to_owned());
        args.extend(long_command(len));
        let out = home.command().args(&args).output().expect("spawn dynocap");
        let value: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{len} bytes {flags:?}: no JSON ({e})"));
        value
    };
    for flags in [&[][..], &["--tty"]] {
        // Past the kernel's 128 KiB per argument, and right at the accepted maximum.
        for len in [200 * 1024, max] {
            let result = exec(flags, len);
            assert_eq!(result["exitCode"], 0, "{len} bytes {flags:?}: {result:#}");
            let output = result
                .get("stdout")
                .or_else(|| result.get("transcript"))
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            assert_eq!(output, "ok\n", "{len} bytes {flags:?}");
        }
        let refused = exec(flags, max + 1);
        assert_eq!(refused["error"]["code"], "invalid_argument", "{refused:#}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("262144"), "the limit is named: {message}");
    }
    // An environment too big for execve is refused the same way, naming its limit.
    let value = "v".repeat(100_000);
    let env: Vec<String> = (0..3).map(|i| format!("V{i}={value}")).collect();
    let mut args = vec!["exec", "ex"];
    for entry in &env {
        args.extend(["--env", entry.as_str()]);
    }
    args.extend(["--", "true"]);
    let refused = home.json_err(&args);
    assert_eq!(refused["code"], "invalid_argument", "{refused:#}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("262144"),
        "{refused:#}"
    );
}

#[test]
fn an_out_of_memory_kill_is_reported_as_such() {
    if !require_root("an_out_of_memory_kill_is_reported_as_such") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("small", &["--memory-mb", "64"]);
    let hog = home.exec(
        "small",
        &["--timeout", "60"],
        "python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'",
    );
    assert_eq!(hog["oomKilled"], true, "{hog:#}");
    assert_eq!(hog["signal"], "SIGKILL", "{hog:#}");
    let stderr = hog["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("memory limit (64 MB)") && stderr.contains("memoryMB"),
        "{hog:#}"
    );
    // The sandbox survives, and a command that fits is not marked.
    let fine = home.exec("small", &[], "echo fine");
    assert_eq!(
        (fine["stdout"].as_str(), fine["oomKilled"].as_bool()),
        (Some("fine\n"), Some(false))
    );
}

#[test]
fn several_words_after_the_dashes_run_as_given() {
    let Some(home) = booted("several_words_after_the_dashes_run_as_given") else {
        return;
    };
    let run = |words: &[&str]| -> serde_json::Value {
        let out = home
            .command()
            .args(["--json", "exec", "ex", "--"])
            .args(words)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let printed = run(&["printf", "%s\\n", "a b", "c d", "it's", "$HOME", "*"]);
    assert_eq!(
        printed["stdout"], "a b\nc d\nit's\n$HOME\n*\n",
        "{printed:#}"
    );
    // One word is still a shell command.
    assert_eq!(run(&["echo one && echo two"])["stdout"], "one\ntwo\n");
}
