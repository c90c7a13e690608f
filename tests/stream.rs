//! `dynocap exec` streams the command's output: all of it, byte for byte, while the command
//! runs, neutralised on a terminal across the cuts between pieces; `--json` keeps the bounded
//! excerpt; a client that goes away still cancels the command.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};

use dynocap_e2e::*;

fn booted(test: &str) -> Option<TestHome> {
    if !require_root(test) {
        return None;
    }
    let home = TestHome::new();
    home.sandbox("st", &[]);
    Some(home)
}

/// The sha256 of `bytes` in `sha256sum`'s hex, from the host's coreutils.
fn sha256(bytes: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sha256sum from coreutils");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input).expect("feed sha256sum"));
    let out = child.wait_with_output().expect("wait for sha256sum");
    writer.join().expect("feeding sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum prints a digest")
        .to_owned()
}

/// Reads `from` into `seen` until `needle` is in it; the stream ending first fails the test.
fn read_until(from: &mut impl Read, seen: &mut Vec<u8>, needle: &[u8]) {
    let mut buf = [0u8; 4096];
    while !seen.windows(needle.len()).any(|w| w == needle) {
        let n = from.read(&mut buf).expect("read the client's output");
        assert!(
            n > 0,
            "the output ended before {:?} appeared: {:?}",
            String::from_utf8_lossy(needle),
            String::from_utf8_lossy(seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Whether a process whose command line starts with `args` runs in the sandbox.
fn running(home: &TestHome, args: &str) -> bool {
    let count = home.sh("st", &format!("ps -eo args | grep -c '^{args}' || true"));
    count.trim() != "0"
}

#[test]
fn big_output_comes_through_whole_and_byte_exact_with_the_exit_code() {
    let Some(home) = booted("big_output_comes_through_whole_and_byte_exact_with_the_exit_code")
    else {
        return;
    };
    // Random bytes (every byte value, no UTF-8), both streams at once, then exit 3.
    let out = home.run(&[
        "exec",
        "st",
        "--timeout",
        "300",
        "--",
        "head -c 20971520 /dev/urandom > /tmp/o; head -c 5242880 /dev/urandom > /tmp/e; \
         cat /tmp/e >&2 & cat /tmp/o; wait; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "the command's exit code");
    assert_eq!(out.stdout.len(), 20_971_520, "every byte of stdout");
    assert_eq!(out.stderr.len(), 5_242_880, "every byte of stderr");
    let sums = home.sh("st", "sha256sum /tmp/o /tmp/e");
    let guest: Vec<&str> = sums
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        guest,
        [sha256(&out.stdout), sha256(&out.stderr)],
        "the bytes are the guest's"
    );

    // --json is unchanged: one Exec object holding the bounded head-and-tail excerpt.
    let json = home.exec("st", &[], "cat /tmp/o /tmp/o /tmp/o | base64; echo the-end");
    assert_eq!(json["truncated"], true);
    let stdout = json["stdout"].as_str().expect("stdout");
    assert!(
        stdout.len() < 1024 * 1024 + 100,
        "bounded: {}",
        stdout.len()
    );
    assert!(
        stdout.contains(" bytes omitted …]"),
        "the marker says what was dropped"
    );
    assert!(stdout.ends_with("the-end\n"), "the tail is kept");
}

#[test]
fn output_appears_while_the_command_runs() {
    let Some(home) = booted("output_appears_while_the_command_runs") else {
        return;
    };
    // The command waits for a file the test creates only once it has read the first line.
    let mut client = home
        .command()
        .args([
            "exec",
            "st",
            "--timeout",
            "120",
            "--",
            "echo ready; echo also-err >&2; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dynocap exec");
    let mut stdout = BufReader::new(client.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line");
    assert_eq!(line, "ready\n");
    home.sh("st", "touch /tmp/go");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("read the rest");
    let out = client.wait_with_output().expect("wait for dynocap exec");
    assert_eq!(
        rest, "done\n",
        "the command went on once the file was there"
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "also-err\n");
}

/// Spawns `script` running `dynocap exec st -- COMMAND` on a pseudo-terminal, its output piped.
fn under_pty(home: &TestHome, command: &str) -> Child {
    let line = format!(
        "'{}' exec st --timeout 120 -- '{command}'",
        dynocap_bin().display()
    );
    Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("DYNOCAP_HOME", home.path())
        .env_remove("DYNOCAP_BACKEND")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run script(1) from util-linux")
}

#[test]
fn pieces_cut_inside_characters_and_sequences_are_neutralised_on_a_terminal() {
    let Some(home) =
        booted("pieces_cut_inside_characters_and_sequences_are_neutralised_on_a_terminal")
    else {
        return;
    };
    // Four writes, each only after the test saw the previous one on the terminal, so each is
    // its own piece: they cut an escape sequence from its ESC, "é" and U+009B (8-bit CSI)
    // between their bytes, and a CRLF between CR and LF. Double quotes only (two shells).
    let wait = |n: u32| format!("while [ ! -e /tmp/go{n} ]; do sleep 0.1; done");
    let command = format!(
        "printf \"one:\\033\\303\"; {}; printf \"\\251]0;t\\007\\302\"; {}; \
         printf \"\\233two\\r\"; {}; printf \"\\nend\\n\"",
        wait(1),
        wait(2),
        wait(3)
    );
    let mut script = under_pty(&home, &command);
    let mut terminal = script.stdout.take().expect("piped stdout");
    let mut seen = Vec::new();
    for (step, shown) in [(1, &b"one:^["[..]), (2, b"^G"), (3, b"two")] {
        read_until(&mut terminal, &mut seen, shown);
        home.sh("st", &format!("touch /tmp/go{step}"));
    }
    terminal.read_to_end(&mut seen).expect("read the rest");
    assert!(script.wait().expect("wait for script").success());
    let text = String::from_utf8_lossy(&seen);
    // The pty turns each LF written into CRLF; the guest's own CR before LF is kept.
    assert!(
        text.contains("one:^[é]0;t^G<U+009B>two\r\r\nend\r\n"),
        "{text:?}"
    );
    assert!(!seen.contains(&0x1b), "ESC reached the terminal: {text:?}");
}

#[test]
fn a_client_that_goes_away_cancels_its_command() {
    let Some(home) = booted("a_client_that_goes_away_cancels_its_command") else {
        return;
    };
    // Ctrl-C (SIGINT) and SIGTERM while the command waits.
    for (signal, pattern) in [(libc::SIGINT, "sleep 597"), (libc::SIGTERM, "sleep 598")] {
        let mut client = home
            .command()
            .args(["exec", "st", "--timeout", "600", "--"])
            .arg(format!("echo started; exec {pattern}"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn dynocap exec");
        let mut stdout = BufReader::new(client.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the first line");
        assert_eq!(line, "started\n");
        let pid = i32::try_from(client.id()).expect("pid fits i32");
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        client.wait().expect("reap the client");
        assert!(
            wait_until(60, || !running(&home, pattern)),
            "`{pattern}` outlived its client (signal {signal})"
        );
    }

    // The reader of the CLI's stdout goes away (`dynocap exec … | head -1`): the CLI ends as
    // of SIGPIPE and the command with it, instead of running on to its timeout.
    let mut client = home
        .command()
        .args(["exec", "st", "--timeout", "600", "--", "exec yes piped"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dynocap exec");
    let mut stdout = BufReader::new(client.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line");
    assert_eq!(line, "piped\n");
    drop(stdout);
    let status = client.wait().expect("reap the client");
    assert_eq!(status.code(), Some(128 + libc::SIGPIPE));
    assert!(
        wait_until(60, || !running(&home, "yes piped")),
        "the command outlived the pipe"
    );

    // Killed while the command floods a pipe nobody reads: the command is waiting on the
    // client (back-pressure), and still ends with it.
    let mut client = home
        .command()
        .args(["exec", "st", "--timeout", "600", "--"])
        .arg("touch /tmp/flooding; exec cat /dev/zero")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dynocap exec");
    assert!(
        wait_until(60, || home.exec("st", &[], "test -e /tmp/flooding")
            ["exitCode"]
            == 0),
        "the flood did not start"
    );
    assert!(
        running(&home, "cat /dev/zero"),
        "the flood is waiting, not gone"
    );
    client.kill().expect("kill the client");
    client.wait().expect("reap the client");
    assert!(
        wait_until(60, || !running(&home, "cat /dev/zero")),
        "the flood outlived its client"
    );
}

#[test]
fn timeouts_and_out_of_memory_kills_are_told_on_stderr() {
    if !require_root("timeouts_and_out_of_memory_kills_are_told_on_stderr") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("small", &["--memory-mb", "64"]);
    let hog = home.run(&[
        "exec",
        "small",
        "--timeout",
        "60",
        "--",
        "echo before; python3 -c 'x = bytearray(512 * 1024 * 1024)'",
    ]);
    let stderr = String::from_utf8_lossy(&hog.stderr);
    assert_eq!(String::from_utf8_lossy(&hog.stdout), "before\n");
    assert_eq!(hog.status.code(), Some(128 + 9), "SIGKILL: {stderr}");
    assert!(
        stderr.contains("memory limit (64 MB)") && stderr.contains("memoryMB"),
        "{stderr}"
    );

    let slow = home.run(&[
        "exec",
        "small",
        "--timeout",
        "1",
        "--",
        "echo started; sleep 100",
    ]);
    assert_eq!(slow.status.code(), Some(124));
    assert_eq!(String::from_utf8_lossy(&slow.stdout), "started\n");
    assert!(String::from_utf8_lossy(&slow.stderr).contains("timed out after 1s"));
}
