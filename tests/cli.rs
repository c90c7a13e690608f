//! The command line's own errors, through the real binary: with `--json` anywhere before `--`,
//! an argument clap refuses is the JSON error object on stdout (as every other `--json`
//! error), naming the argument and the help to read; without it, clap's own text. Help and
//! version requests print as they always did. No sandbox is started.

use std::process::Output;

use dynocap_e2e::TestHome;
use serde_json::Value;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command line that must be refused as a usage error, and returns its JSON message.
fn refused_as_json(home: &TestHome, args: &[&str]) -> String {
    let out = home.run(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: a usage error exits 2\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let value: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
        panic!(
            "{args:?}: stdout is not one JSON value ({err}): {}",
            text(&out.stdout)
        )
    });
    let object = value.as_object().expect("an object");
    assert_eq!(object.len(), 1, "{args:?}: {value}");
    assert_eq!(
        value["error"]["code"], "invalid_argument",
        "{args:?}: {value}"
    );
    let message = value["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{args:?}: no message: {value}"))
        .to_owned();
    assert!(
        !message.contains('\x1b'),
        "{args:?}: colour codes: {message:?}"
    );
    assert!(
        !message.contains("Usage:"),
        "{args:?}: usage block: {message:?}"
    );
    message
}

#[test]
fn argument_errors_are_json_objects_wherever_json_stands() {
    let home = TestHome::new();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--json", "run", "x", "--cpus", "two"],
            &["'two'", "--cpus", "whole number", "`dynocap run --help`"],
        ),
        (
            &["run", "x", "--cpus", "two", "--json"],
            &["'two'", "--cpus", "whole number"],
        ),
        (
            &["run", "--json", "x", "--memory-mb", "1.5"],
            &["'1.5'", "--memory-mb", "whole number"],
        ),
        (&["--json", "run", "x", "--cpus", ""], &["--cpus", "empty"]),
        (
            &[
                "--json",
                "exec",
                "x",
                "--timeout",
                "99999999999999999999",
                "--",
                "true",
            ],
            &[
                "'99999999999999999999'",
                "--timeout",
                "too large",
                "`dynocap exec --help`",
            ],
        ),
        (
            &[
                "task",
                "exec",
                "t",
                "--timeout",
                "99999999999999999999",
                "--json",
                "--",
                "true",
            ],
            &["--timeout", "too large", "`dynocap task exec --help`"],
        ),
        (
            &["task", "start", "--json", "--ttl", "18446744073709551616"],
            &["--ttl", "too large"],
        ),
        (
            &["--json", "run", "x", "--bogus"],
            &["'--bogus'", "`dynocap run --help`"],
        ),
        (
            &["task", "start", "--json", "--tll", "60"],
            &["'--tll'", "similar argument exists: '--ttl'"],
        ),
        (
            &["--json", "run"],
            &["required", "<NAME>", "`dynocap run --help`"],
        ),
        (&["--json", "exec", "x"], &["required", "<COMMAND>"]),
        (
            &["--json", "destroy"],
            &["required", "<NAME>", "`dynocap destroy --help`"],
        ),
        (
            &["--json", "run", "x", "--ttl"],
            &["value is required", "--ttl"],
        ),
        (
            &["--json", "run", "x", "--ttl", "60", "--ttl", "70"],
            &["--ttl", "multiple times"],
        ),
        (
            &["--json", "task", "start", "/p", "--repo", "https://h/r"],
            &["--repo", "cannot be used with"],
        ),
        (
            &["--json", "ps", "extra"],
            &["'extra'", "`dynocap ps --help`"],
        ),
        (
            &["--json", "frob"],
            &["'frob'", "run, exec, ps", "`dynocap --help`"],
        ),
        (&["frob", "--json"], &["'frob'"]),
        (&["--json"], &["`dynocap` needs a subcommand: run, exec"]),
        (
            &["task", "--json"],
            &["`dynocap task` needs a subcommand: start, exec, diff, finish"],
        ),
        (
            &["--json", "task", "begin"],
            &["'begin'", "start, exec, diff, finish"],
        ),
        (&["--json=true", "ps"], &["--json"]),
    ];
    for (args, needles) in cases {
        let message = refused_as_json(&home, args);
        for needle in *needles {
            assert!(
                message.contains(needle),
                "{args:?}: {needle:?} not in {message:?}"
            );
        }
        // The hidden internal subcommand is never offered.
        assert!(!message.contains("supervise"), "{args:?}: {message}");
    }
}

#[test]
fn without_json_argument_errors_stay_clap_text() {
    let home = TestHome::new();
    let cases: &[&[&str]] = &[
        &["run", "x", "--cpus", "two"],
        &[
            "exec",
            "x",
            "--timeout",
            "99999999999999999999",
            "--",
            "true",
        ],
        // After `--`, `--json` is a word of the sandbox command, not a flag.
        &["run", "x", "--bogus", "--", "--json"],
        &["frob"],
    ];
    for args in cases {
        let out: Output = home.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        let stderr = text(&out.stderr);
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(
            stderr.contains("For more information, try '--help'."),
            "{args:?}: {stderr}"
        );
    }
    let stderr = text(&home.run(&["run", "x", "--cpus", "two"]).stderr);
    assert!(
        stderr.contains("invalid value 'two' for '--cpus <CPUS>'"),
        "{stderr}"
    );
}

#[test]
fn help_and_version_are_unchanged_by_json() {
    let home = TestHome::new();
    for (args, expected) in [
        (
            &["--json", "--help"][..],
            "Usage: dynocap [OPTIONS] <COMMAND>",
        ),
        (
            &["run", "--help", "--json"][..],
            "Usage: dynocap run [OPTIONS] <NAME>",
        ),
        (
            &["--json", "help", "task"][..],
            "Usage: dynocap task [OPTIONS] <COMMAND>",
        ),
        (
            &["--version", "--json"][..],
            concat!("dynocap ", env!("CARGO_PKG_VERSION")),
        ),
    ] {
        let out = home.run(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains(expected),
            "{args:?}: {}",
            text(&out.stdout)
        );
    }
}

#[test]
fn completions_load_in_a_real_shell_and_the_man_page_covers_every_command() {
    let home = TestHome::new();
    let script = home.run(&["completions", "bash"]);
    assert!(script.status.success());
    let script_path = home.path().join("dynocap.bash");
    std::fs::write(&script_path, &script.stdout).unwrap();
    // bash itself loads it and registers the completion function.
    let registered = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p dynocap",
            script_path.display()
        ))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&registered.stdout).contains("_dynocap"),
        "{registered:?}"
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = home.run(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
        assert!(
            text(&out.stdout).contains("task"),
            "{shell} completes subcommands"
        );
    }
    let refused = home.json_err(&["completions", "tcsh"]);
    assert_eq!(refused["code"], "invalid_argument");
    let page = home.run(&["man"]);
    let page = text(&page.stdout);
    assert!(
        page.starts_with(".ie") || page.contains(".TH dynocap 1"),
        "{page}"
    );
    for command in [
        "run",
        "exec",
        "task",
        "ls",
        "rm",
        "mcp",
        "doctor",
        "completions",
    ] {
        assert!(page.contains(command), "the man page names {command}");
    }
    assert!(
        !page.contains("supervise"),
        "internal commands stay out of the page"
    );
}

/// `doctor --json` with `DYNOCAP_AGENT` at `agent`: the whole report, and its agent check.
fn doctor_with_agent(home: &TestHome, agent: &std::path::Path) -> (Value, Value) {
    let out = home
        .command()
        .args(["--json", "doctor"])
        .env("DYNOCAP_AGENT", agent)
        .output()
        .expect("spawn dynocap doctor");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
        panic!("doctor --json is JSON ({err}): {}", text(&out.stdout));
    });
    let check = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "guest agent")
        .cloned()
        .unwrap_or_else(|| panic!("no guest agent check: {report:#}"));
    (report, check)
}

/// The agent's linkage decides whether it starts in an image other than the host's: a static
/// (musl) agent passes, a glibc one is a warning naming the build that fixes it, and nothing
/// sends the person to install QEMU for the vm backend this build does not have.
#[test]
fn doctor_tells_a_static_agent_from_a_glibc_one_and_leaves_qemu_out() {
    let home = TestHome::new();
    let bins = dynocap_e2e::bin_dir();
    let musl = bins
        .parent()
        .expect("target dir")
        .join("x86_64-unknown-linux-musl")
        .join(bins.file_name().expect("profile dir"))
        .join("dynocap-agent");
    assert!(
        musl.is_file(),
        "{} is missing: cargo build --target x86_64-unknown-linux-musl -p dynocap-agent",
        musl.display()
    );
    let (_, check) = doctor_with_agent(&home, &musl);
    assert_eq!(check["ok"], true, "{check}");
    assert_eq!(check["status"], "ok", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .is_some_and(|d| d.contains("statically linked")),
        "{check}"
    );

    // The workspace's own build of the agent is glibc's.
    let (report, check) = doctor_with_agent(&home, &bins.join("dynocap-agent"));
    assert_eq!(check["ok"], false, "{check}");
    assert_eq!(check["status"], "warning", "{check}");
    assert_eq!(check["required"], false, "a warning, not a stop: {check}");
    let detail = check["detail"].as_str().expect("detail");
    assert!(
        detail.contains("dynamically linked") && detail.contains("ld-linux"),
        "{check}"
    );
    let hint = check["hint"].as_str().expect("a hint");
    assert!(
        hint.contains("cargo build --release --target x86_64-unknown-linux-musl -p dynocap-agent"),
        "{hint}"
    );
    // The backend row says what `auto` picks: with the `host` image, the jail, no KVM asked.
    let backend = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "backend")
        .unwrap_or_else(|| panic!("no backend row: {report:#}"));
    assert_eq!(backend["status"], "ok", "{backend}");
    assert!(
        backend["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("auto picks jail: the image \"host\"")),
        "{backend}"
    );

    // Neither the JSON nor the table recommends QEMU or KVM.
    let table = home
        .command()
        .arg("doctor")
        .env("DYNOCAP_AGENT", bins.join("dynocap-agent"))
        .output()
        .expect("spawn dynocap doctor");
    let table = text(&table.stdout);
    assert!(
        table.contains("backend") && table.contains("auto picks jail"),
        "{table}"
    );
    for text in [table.as_str(), &report.to_string()] {
        for advice in ["install QEMU", "qemu-system", "kvm group"] {
            assert!(!text.contains(advice), "{advice}: {text}");
        }
    }
}

/// Runs `dynocap --json ARGS` that the engine refuses; returns (code, message).
fn refused(home: &TestHome, envs: &[(&str, &str)], args: &[&str]) -> (String, String) {
    let out = home
        .command()
        .envs(envs.iter().copied())
        .arg("--json")
        .args(args)
        .output()
        .expect("spawn dynocap");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?}: {}",
        text(&out.stderr)
    );
    let value: Value = serde_json::from_slice(&out.stdout).expect("a JSON error");
    let field = |name: &str| value["error"][name].as_str().unwrap_or_default().to_owned();
    (field("code"), field("message"))
}

#[test]
fn refusals_name_the_flags_that_were_typed() {
    let home = TestHome::new();
    let project = tempfile::tempdir().expect("tempdir");
    let project = project.path().to_str().expect("utf-8");
    // (environment, command line, what the message says, what it must not say)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a str, &'a str);
    let cases: &[Case] = &[
        (
            &[],
            &["run", "x", "--ttl", "10"],
            "--ttl 10 is below the minimum 30",
            "ttlSeconds",
        ),
        (
            &[],
            &["task", "start", project, "--memory-mb", "1"],
            "--memory-mb 1 is below the minimum",
            "memoryMB",
        ),
        (
            &[],
            &["exec", "x", "--timeout", "0", "--", "true"],
            "--timeout 0 is below the minimum 1",
            "timeoutSeconds",
        ),
        (
            &[("DYNOCAP_MAX_TTL_SECONDS", "60")],
            &["run", "x", "--ttl", "120"],
            "--ttl 120 is above the host's ceiling 60",
            "ttlSeconds",
        ),
    ];
    for (envs, args, said, unsaid) in cases {
        let (code, message) = refused(&home, envs, args);
        assert!(
            code == "invalid_argument" || code == "policy_denied",
            "{args:?}: {code}"
        );
        assert!(message.contains(said), "{args:?}: {message}");
        assert!(!message.contains(unsaid), "{args:?}: {message}");
    }
    // Without --json, the same wording on stderr.
    let out = home.run(&["run", "x", "--ttl", "10"]);
    assert!(
        text(&out.stderr).contains("invalid_argument: --ttl 10 is below"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn each_exec_help_names_only_what_it_accepts() {
    let home = TestHome::new();
    let raw = text(&home.run(&["exec", "--help"]).stdout);
    assert!(
        raw.contains("Name (or id) of the raw sandbox; for a task, use `dynocap task exec`"),
        "{raw}"
    );
    assert!(raw.contains("(default /)"), "{raw}");
    assert!(!raw.contains("/workspace"), "{raw}");
    let task = text(&home.run(&["task", "exec", "--help"]).stdout);
    assert!(
        task.contains("Name (or id) of the task; for a raw sandbox, use `dynocap exec`"),
        "{task}"
    );
    assert!(task.contains("(default /workspace)"), "{task}");
}

#[test]
fn refusals_point_to_the_command_to_run_instead() {
    if !dynocap_e2e::require_root("refusals_point_to_the_command_to_run_instead") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().expect("tempdir");
    dynocap_e2e::write(&project.path().join("a.txt"), "a\n");
    home.json(&["run", "box"]);
    home.json(&[
        "task",
        "start",
        project.path().to_str().expect("utf-8"),
        "--name",
        "job",
    ]);
    let cases: &[(&[&str], &str)] = &[
        (
            &["exec", "job", "--", "true"],
            "\"job\" is a task, not a raw sandbox; run commands in it with `dynocap task exec job`",
        ),
        (
            &["task", "exec", "box", "--", "true"],
            "\"box\" is a raw sandbox, not a task; run commands in it with `dynocap exec box`",
        ),
        (
            &["destroy", "job"],
            "finish it with `dynocap task finish job` or remove it with `dynocap rm job`",
        ),
        (
            &["task", "finish", "box"],
            "destroy it with `dynocap destroy box` instead",
        ),
        (&["rm", "job"], "or pass --force to end it here"),
    ];
    for (args, said) in cases {
        let (code, message) = refused(&home, &[], args);
        assert_eq!(code, "conflict", "{args:?}: {message}");
        assert!(message.contains(said), "{args:?}: {message}");
        assert!(!message.contains("dynocap_"), "{args:?}: {message}");
    }
    home.json(&["task", "finish", "job"]);
    let (code, message) = refused(&home, &[], &["task", "exec", "job", "--", "true"]);
    assert_eq!(code, "conflict", "{message}");
    assert!(message.contains("task \"job\" is finished"), "{message}");
    assert!(message.contains("`dynocap task diff job`"), "{message}");
    assert!(
        message.contains("start a new task with `dynocap task start`"),
        "{message}"
    );
    assert!(!message.contains("destroy it"), "{message}");
    home.json(&["destroy", "box"]);
}

/// A stdout that cannot be written for another reason than a reader gone (a full disk behind
/// `>`) is said once on stderr and fails the command (1), never a panic; one whose reader
/// went away ends it as SIGPIPE would (141, silently). No sandbox is needed to see either.
#[test]
fn a_stdout_that_fails_is_said_and_a_closed_one_is_141() {
    let home = TestHome::new();
    for args in [
        &["ls"][..],
        &["--json", "ls"],
        &["image", "ls"],
        &["doctor"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full");
        let out = home
            .command()
            .args(args)
            .stdout(full)
            .output()
            .expect("spawn dynocap");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr.matches("dynocap: cannot write to stdout: ").count(),
            1,
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");

        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = home
            .command()
            .args(args)
            .stdout(writer)
            .output()
            .expect("spawn dynocap");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}");
    }
}
