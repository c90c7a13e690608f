//! The supervisor's log (`$DYNOCAP_HOME/logs/<id>.log`) as `DYNOCAP_LOG` and
//! `DYNOCAP_LOG_FORMAT` shape it: JSON lines for machines, debug lines only when asked, and a
//! mistyped level reported in the log without stopping the sandbox.

use dynocap_e2e::*;
use serde_json::Value;

/// Starts a sandbox with `env` set for its supervisor, runs one command, destroys it, and
/// returns the supervisor's log with the sandbox's id. The log's last line ("supervisor
/// exiting", at info) comes after `destroy` answered: it is waited for unless `level_info`
/// is false (the line is filtered out then, and every earlier line is in already).
fn log_of_a_sandbox(env: &[(&str, &str)], level_info: bool) -> (String, String) {
    let home = TestHome::new();
    let mut run = home.command();
    run.args(["--json", "run", "logged"]);
    for (key, value) in env {
        run.env(key, value);
    }
    let out = run.output().expect("spawn dynocap run");
    assert!(
        out.status.success(),
        "run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(home.sh("logged", "echo hi"), "hi\n");
    let id = home.sandbox_id("logged");
    home.json(&["destroy", "logged"]);
    let path = home.log_path(&id);
    assert!(
        !level_info
            || wait_until(20, || std::fs::read_to_string(&path)
                .is_ok_and(|log| log.contains("supervisor exiting"))),
        "{} never ended: {:?}",
        path.display(),
        std::fs::read_to_string(&path)
    );
    (std::fs::read_to_string(&path).expect("read the log"), id)
}

#[test]
fn json_format_writes_one_object_per_line_naming_the_sandbox() {
    if !require_root("json_format_writes_one_object_per_line_naming_the_sandbox") {
        return;
    }
    let (log, id) = log_of_a_sandbox(&[("DYNOCAP_LOG_FORMAT", "json")], true);
    let lines: Vec<Value> = log
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"))
        })
        .collect();
    assert!(lines.len() >= 4, "{log}");
    for line in &lines {
        assert!(line["timestamp"].is_string(), "{line}");
        assert!(
            ["ERROR", "WARN", "INFO"].contains(&line["level"].as_str().unwrap_or("")),
            "{line}"
        );
        assert_eq!(line["span"]["sandbox"], id.as_str(), "{line}");
    }
    let messages: Vec<&str> = lines
        .iter()
        .map(|l| l["message"].as_str().expect("a message"))
        .collect();
    for expected in ["guest booted in ", "ready in ", "supervisor exiting"] {
        assert!(
            messages.iter().any(|m| m.starts_with(expected)),
            "{expected}: {messages:?}"
        );
    }
}

#[test]
fn debug_lines_appear_only_when_asked() {
    if !require_root("debug_lines_appear_only_when_asked") {
        return;
    }
    let (default, _) = log_of_a_sandbox(&[], true);
    assert!(!default.contains(" DEBUG "), "{default}");
    assert!(!default.contains("exec ended in"), "{default}");
    assert!(default.contains(" INFO "), "{default}");

    let (debug, _) = log_of_a_sandbox(&[("DYNOCAP_LOG", "debug")], true);
    let ended = debug
        .lines()
        .find(|l| l.contains("exec ended in"))
        .unwrap_or_else(|| panic!("no exec line at debug: {debug}"));
    assert!(
        ended.contains(" DEBUG ") && ended.contains("exit code Some(0)"),
        "{ended}"
    );

    // The boot's info lines were written before `run` answered; at error they are not.
    let (quiet, _) = log_of_a_sandbox(&[("DYNOCAP_LOG", "error")], false);
    assert!(!quiet.contains("guest booted"), "{quiet}");
}

#[test]
fn a_mistyped_level_is_reported_with_the_valid_ones_and_the_sandbox_runs() {
    if !require_root("a_mistyped_level_is_reported_with_the_valid_ones_and_the_sandbox_runs") {
        return;
    }
    let (log, _) = log_of_a_sandbox(&[("DYNOCAP_LOG", "verbose")], true);
    let first = log.lines().next().expect("a first line");
    assert!(first.contains(" WARN "), "{first}");
    assert!(first.contains("DYNOCAP_LOG=verbose"), "{first}");
    assert!(
        first.contains("error, warn, info, debug or trace"),
        "{first}"
    );
    // The default level still applies.
    assert!(log.contains("guest booted in "), "{log}");
}
