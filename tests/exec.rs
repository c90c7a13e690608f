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
    let out = home.run(&["exec", "ex", "--", "kill", "-TERM", "$$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
}

#[test]
fn large_output_is_truncated_and_stdin_is_closed() {
    let Some(home) = booted("large_output_is_truncated_and_stdin_is_closed") else {
        return;
    };
    let big = home.exec(
        "ex",
        &[],
        "head -c 10485760 /dev/zero | tr '\\0' a; echo done >&2",
    );
    assert_eq!(big["exitCode"], 0);
    assert_eq!(big["truncated"], true);
    assert_eq!(big["stdout"].as_str().unwrap().len(), 1024 * 1024);
    assert_eq!(big["stderr"], "done\n");
    // stdin is /dev/null: cat returns at once instead of waiting for the timeout.
    let cat = home.exec("ex", &["--timeout", "20"], "cat; echo eof");
    assert_eq!(cat["stdout"], "eof\n");
    assert_eq!(cat["timedOut"], false);
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let Some(home) = booted("timeout_kills_the_whole_process_group") else {
        return;
    };
    let started = std::time::Instant::now();
    let result = home.exec(
        "ex",
        &["--timeout", "2"],
        "trap '' TERM; (trap '' TERM; sleep 300) & sleep 301 & echo started; sleep 302",
    );
    assert_eq!(result["timedOut"], true);
    assert_eq!(result["stdout"], "started\n", "output so far is returned");
    assert!(started.elapsed().as_secs() < 60, "the timeout was honoured");
    let left = home.sh("ex", "ps -eo args | grep -c '^sleep 30[012]' || true");
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
    let Some(home) = booted("terminal_transcript_renders_carriage_returns_and_colours") else {
        return;
    };
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
