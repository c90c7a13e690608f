//! Integration tests of the jail backend against the real kernel (they need root).
//!
//! `Jail::spawn` requires a single-threaded process, which libtest's runner is not, so this
//! target has `harness = false` and its own `main`, which plays several roles:
//!
//! - no role: the driver. Runs each scenario (filtered by the command-line arguments) in a
//!   fresh copy of this binary, with a timeout, and reports like libtest;
//! - `DYNOCAP_JAIL_SCENARIO=<name>`: runs that scenario;
//! - `/.dynocap/agent --channel-fd 3 ...`: the guest agent inside a jail (see `guest`);
//! - `guest-probe <name>`: a probe the agent runs inside the jail;
//! - `DYNOCAP_JAIL_ROLE=spawner|unprivileged|rootless`: helper processes some scenarios
//!   start.

#[path = "jail/fixture.rs"]
mod fixture;
#[path = "jail/guest.rs"]
mod guest;
#[path = "jail/scenarios.rs"]
mod scenarios;

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--channel-fd") => return code(guest::agent_main(&args)),
        Some("guest-probe") => return code(guest::probe_main(&args)),
        _ => {}
    }
    match std::env::var("DYNOCAP_JAIL_ROLE").ok().as_deref() {
        Some("spawner") => return code(scenarios::spawner_role()),
        Some("unprivileged") => return code(scenarios::unprivileged_role()),
        Some("rootless") => return code(scenarios::rootless_role()),
        _ => {}
    }
    if let Ok(name) = std::env::var("DYNOCAP_JAIL_SCENARIO") {
        let Some((_, run)) = scenarios::ALL.iter().find(|(n, _)| *n == name) else {
            eprintln!("no scenario {name}");
            return ExitCode::FAILURE;
        };
        run();
        return ExitCode::SUCCESS;
    }
    drive(&args[1..])
}

fn code(c: i32) -> ExitCode {
    ExitCode::from(u8::try_from(c).unwrap_or(1))
}

/// libtest options that take a value in the next argument; `cargo test -- --test-threads 4`
/// must not turn "4" into a name filter.
const OPTIONS_WITH_VALUE: &[&str] = &[
    "--test-threads",
    "--skip",
    "--format",
    "--color",
    "--logfile",
    "-Z",
];

fn drive(args: &[String]) -> ExitCode {
    let mut filters: Vec<&str> = Vec::new();
    let mut skips: Vec<&str> = Vec::new();
    let mut rest = args.iter().map(String::as_str);
    while let Some(arg) = rest.next() {
        if OPTIONS_WITH_VALUE.contains(&arg) {
            let value = rest.next();
            if arg == "--skip" {
                skips.extend(value);
            }
        } else if !arg.starts_with('-') {
            filters.push(arg);
        }
    }
    if args.iter().any(|a| a == "--list") {
        for (name, _) in scenarios::ALL {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<&str> = scenarios::ALL
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| filters.is_empty() || filters.iter().any(|f| name.contains(f)))
        .filter(|name| !skips.iter().any(|s| name.contains(s)))
        .collect();
    if !nix::unistd::geteuid().is_root() {
        if std::env::var_os("CI").is_some() {
            println!("jail scenarios need root (cgroups, id ranges), and CI must run as root");
            return ExitCode::FAILURE;
        }
        println!("jail scenarios skipped: they need root (cgroups, id ranges)");
        return ExitCode::SUCCESS;
    }
    println!("\nrunning {} jail scenarios", selected.len());
    let mut failed: Vec<&str> = Vec::new();
    for &name in &selected {
        let started = Instant::now();
        let (ok, output) = run_isolated(name);
        println!(
            "test {name} ... {} ({:.1}s)",
            if ok { "ok" } else { "FAILED" },
            started.elapsed().as_secs_f64()
        );
        if !ok || std::env::var_os("DYNOCAP_JAIL_VERBOSE").is_some() {
            println!("---- {name} output ----\n{output}");
        }
        if !ok {
            failed.push(name);
        }
    }
    println!(
        "\njail scenarios: {} passed; {} failed{}",
        selected.len() - failed.len(),
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        }
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs one scenario in a fresh process (single-threaded, as `Jail::spawn` needs) with a
/// timeout; returns success and its combined output.
fn run_isolated(name: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .env("DYNOCAP_JAIL_SCENARIO", name)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn scenario");
    let deadline = Instant::now() + SCENARIO_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut output = std::fs::read_to_string(&log_path).unwrap_or_default();
    match status {
        Some(s) if s.success() => (true, output),
        Some(s) => {
            output.push_str(&format!("\n(scenario process ended with {s})"));
            (false, output)
        }
        None => {
            output.push_str(&format!(
                "\n(timed out after {}s)",
                SCENARIO_TIMEOUT.as_secs()
            ));
            (false, output)
        }
    }
}
