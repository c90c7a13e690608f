//! Host ceilings (`DYNOCAP_MAX_*`) through the CLI: requests above one are `policy_denied`
//! naming the variable and the value allowed, bad values are named errors, live sandboxes
//! share the count bound and overcommit memory, and `doctor` shows what is in force.

use std::process::Command;

use dynocap_e2e::*;
use serde_json::Value;

/// `dynocap --json ARGS` with extra environment; the error object of a refused call.
fn refused(home: &TestHome, env: &[(&str, &str)], args: &[&str]) -> Value {
    let mut command = home.command();
    command.envs(env.iter().copied()).arg("--json").args(args);
    let out = command.output().expect("spawn dynocap");
    assert!(
        !out.status.success(),
        "dynocap {args:?} with {env:?} was accepted: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let value: Value = serde_json::from_slice(&out.stdout).expect("errors are JSON with --json");
    value["error"].clone()
}

fn with_env(home: &TestHome, env: &[(&str, &str)]) -> Command {
    let mut command = home.command();
    command.envs(env.iter().copied());
    command
}

fn assert_denied(err: &Value, needle: &str) {
    assert_eq!(err["code"], "policy_denied", "{err}");
    let message = err["message"].as_str().expect("message");
    assert!(message.contains(needle), "{needle:?} not in {message:?}");
}

/// No sandbox starts in these: every refusal comes before anything is created.
#[test]
fn requests_above_a_ceiling_are_denied_naming_the_variable() {
    let home = TestHome::new();
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if host_cpus < 64 {
        // The default ceiling is the host's CPUs.
        let err = refused(&home, &[], &["run", "big", "--cpus", "64"]);
        assert_denied(&err, &format!("DYNOCAP_MAX_CPUS={host_cpus}"));
    }
    // The default memory ceiling is half of RAM, so the spec's maximum is always above it.
    let err = refused(&home, &[], &["run", "big", "--memory-mb", "1048576"]);
    assert_denied(&err, "DYNOCAP_MAX_MEMORY_MB=");

    let caps = [
        ("DYNOCAP_MAX_CPUS", "2"),
        ("DYNOCAP_MAX_MEMORY_MB", "2048"),
        ("DYNOCAP_MAX_TTL_SECONDS", "600"),
    ];
    for (flags, needle) in [
        (&["--cpus", "3"][..], "DYNOCAP_MAX_CPUS=2"),
        (&["--memory-mb", "2049"][..], "DYNOCAP_MAX_MEMORY_MB=2048"),
        (&["--ttl", "601"][..], "DYNOCAP_MAX_TTL_SECONDS=600"),
    ] {
        let mut args = vec!["run", "big"];
        args.extend_from_slice(flags);
        assert_denied(&refused(&home, &caps, &args), needle);
    }
    // Tasks go through the same check, before any import.
    let project = tempfile::tempdir().expect("project dir");
    let path = project.path().to_str().expect("utf-8 temp path");
    let err = refused(&home, &caps, &["task", "start", path, "--cpus", "3"]);
    assert_denied(&err, "DYNOCAP_MAX_CPUS=2");
    // Nothing was recorded for the refused starts.
    let ls = home.json(&["ls"]);
    assert_eq!(ls["tasks"], serde_json::json!([]), "{ls}");
    assert_eq!(ls["sandboxes"], serde_json::json!([]), "{ls}");
}

#[test]
fn an_unusable_ceiling_is_an_error_naming_the_variable() {
    let home = TestHome::new();
    for (var, value) in [
        ("DYNOCAP_MAX_CPUS", "0"),
        ("DYNOCAP_MAX_MEMORY_MB", "lots"),
        ("DYNOCAP_MAX_SANDBOXES", "-1"),
        ("DYNOCAP_MAX_DISK_MB", "1.5"),
        ("DYNOCAP_MAX_TTL_SECONDS", ""),
    ] {
        let err = refused(&home, &[(var, value)], &["run", "x"]);
        assert_eq!(err["code"], "invalid_argument", "{err}");
        let message = err["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{var}=")), "{message}");
    }
}

#[test]
fn doctor_shows_the_ceilings_in_force() {
    let home = TestHome::new();
    let doctor = |env: &[(&str, &str)]| -> Value {
        let out = with_env(&home, env)
            .args(["--json", "doctor"])
            .output()
            .expect("spawn dynocap doctor");
        let report: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
        report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == "host ceilings")
            .cloned()
            .unwrap_or_else(|| panic!("no host ceilings check in {report}"))
    };
    let check = doctor(&[("DYNOCAP_MAX_CPUS", "3"), ("DYNOCAP_MAX_SANDBOXES", "5")]);
    assert_eq!(check["ok"], true, "{check}");
    let detail = check["detail"].as_str().expect("detail");
    for needle in [
        "DYNOCAP_MAX_CPUS=3",
        "DYNOCAP_MAX_SANDBOXES=5",
        "DYNOCAP_MAX_MEMORY_MB=",
        "DYNOCAP_MAX_DISK_MB=10240",
        "DYNOCAP_MAX_TTL_SECONDS=86400",
    ] {
        assert!(detail.contains(needle), "{needle} not in {detail}");
    }
    let bad = doctor(&[("DYNOCAP_MAX_DISK_MB", "big")]);
    assert_eq!(bad["ok"], false, "{bad}");
    assert!(bad["detail"]
        .as_str()
        .is_some_and(|d| d.contains("DYNOCAP_MAX_DISK_MB")));
}

/// The count ceiling bounds the live sandboxes' number, and a destroyed sandbox gives its
/// place back. Their memory limits may add up past the memory ceiling (it bounds what they
/// use together, in the kernel: see tests/host_room.rs).
#[test]
fn live_sandboxes_share_the_count_ceiling_and_overcommit_memory() {
    if !require_root("live_sandboxes_share_the_count_ceiling_and_overcommit_memory") {
        return;
    }
    let home = TestHome::new();
    let env = [
        ("DYNOCAP_MAX_MEMORY_MB", "4096"),
        ("DYNOCAP_MAX_SANDBOXES", "2"),
    ];
    let start = |name: &str, memory: &str| {
        with_env(&home, &env)
            .args([
                "--json",
                "run",
                name,
                "--memory-mb",
                memory,
                "--disk-mb",
                "64",
            ])
            .output()
            .expect("spawn dynocap run")
    };
    assert!(start("first", "3000").status.success());
    let second = start("second", "3000");
    assert!(
        second.status.success(),
        "6000 MB of limits under a 4096 MB ceiling: {}",
        String::from_utf8_lossy(&second.stdout)
    );
    let err = refused(&home, &env, &["run", "third", "--memory-mb", "64"]);
    assert_denied(&err, "DYNOCAP_MAX_SANDBOXES=2");

    home.json(&["destroy", "second"]);
    let out = start("third", "4096");
    assert!(
        out.status.success(),
        "accepted once another is gone: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    home.json(&["destroy", "third"]);
    home.json(&["destroy", "first"]);
}
