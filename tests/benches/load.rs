//! Load run: 50 sandboxes started in parallel, then 200 commands at once across them, then
//! the memory all their supervisors hold. Every start and every command must succeed (a
//! failure ends the run with its error); the figures are the time each phase took beside the
//! time one sandbox or one command takes alone in the same run, and the total PSS.
//!
//! Run with `scripts/bench.sh` (builds the release binaries first). Needs root.

use std::process::Command;
use std::time::{Duration, Instant};

use dynocap_e2e::bench::{
    child_pids, dynocap_ok, proc_kib, release_bins, running_supervisors, stop_command_servers,
    wait_for_supervisors_to_exit,
};

const SANDBOXES: usize = 50;
const EXECS: usize = 200;

fn main() {
    let bins = release_bins();
    let home = tempfile::Builder::new()
        .prefix("dcl")
        .tempdir_in("/tmp")
        .expect("temp home");
    if std::env::var_os("DYNOCAP_AGENT").is_none() {
        std::env::set_var("DYNOCAP_AGENT", bins.join("dynocap-agent"));
    }
    let dynocap = bins.join("dynocap");
    let _cleanup = Cleanup {
        dynocap: &dynocap,
        home: home.path(),
    };
    let envs = [
        ("DYNOCAP_HOME", home.path().to_str().expect("utf-8 home")),
        // 50 sandboxes of the default 1024 MB go past the default ceiling (half of RAM);
        // memoryMB is a cgroup maximum, not a reservation, and this run stays far below it.
        ("DYNOCAP_MAX_MEMORY_MB", "1048576"),
    ];
    let run = |args: &[&str]| -> Duration {
        let started = Instant::now();
        dynocap_ok(&dynocap, &envs, args);
        started.elapsed()
    };

    // Alone, for scale.
    let one_start = run(&["run", "solo"]);
    let one_exec = run(&["exec", "solo", "--", "echo ok"]);
    run(&["destroy", "solo"]);

    // 50 starts at once.
    let started = Instant::now();
    let starts: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..SANDBOXES)
            .map(|i| scope.spawn(move || run(&["run", &format!("l{i}")])))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("start thread"))
            .collect()
    });
    let all_started = started.elapsed();

    // 200 commands at once, four per sandbox.
    let started = Instant::now();
    let mut execs: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..EXECS)
            .map(|i| {
                scope.spawn(move || {
                    run(&[
                        "exec",
                        &format!("l{}", i % SANDBOXES),
                        "--",
                        "echo ok; sleep 0.1",
                    ])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("exec thread"))
            .collect()
    });
    let all_execs = started.elapsed();
    execs.sort();

    std::thread::sleep(Duration::from_secs(1));
    let supervisors = running_supervisors(home.path(), "");
    assert_eq!(supervisors.len(), SANDBOXES, "every sandbox is running");
    let supervisor_pss: u64 = supervisors
        .iter()
        .map(|&p| proc_kib(p, "smaps_rollup", "Pss:"))
        .sum();
    let guest_pss: u64 = supervisors
        .iter()
        .flat_map(|&p| child_pids(p))
        .map(|p| proc_kib(p, "smaps_rollup", "Pss:"))
        .sum();

    let mut slowest_start = starts.clone();
    slowest_start.sort();
    println!(
        "load: {SANDBOXES} starts in parallel: all ready in {:.2} s, slowest {:.2} s (one alone {:.0} ms; parallel/alone ratio {:.1}x for {SANDBOXES}x the work), 0 failed",
        all_started.as_secs_f64(),
        slowest_start[SANDBOXES - 1].as_secs_f64(),
        one_start.as_secs_f64() * 1e3,
        all_started.as_secs_f64() / one_start.as_secs_f64()
    );
    println!(
        "load: {EXECS} concurrent execs across them: all done in {:.2} s, median {:.0} ms, p90 {:.0} ms (one alone {:.0} ms), 0 failed",
        all_execs.as_secs_f64(),
        execs[EXECS / 2].as_secs_f64() * 1e3,
        execs[EXECS * 9 / 10].as_secs_f64() * 1e3,
        one_exec.as_secs_f64() * 1e3
    );
    println!(
        "load: PSS of the {} supervisors {:.1} MiB in all ({:.0} KiB each); their guests' agents {:.1} MiB in all",
        supervisors.len(),
        supervisor_pss as f64 / 1024.0,
        supervisor_pss as f64 / supervisors.len() as f64,
        guest_pss as f64 / 1024.0
    );
}

/// Destroys every sandbox the run may have started when it ends, however it ends: a failed
/// start panics, and its home directory goes with it, but not the sandboxes already running.
/// The home is removed once their supervisors have finished tearing them down.
struct Cleanup<'a> {
    dynocap: &'a std::path::Path,
    home: &'a std::path::Path,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let names =
            std::iter::once("solo".to_owned()).chain((0..SANDBOXES).map(|i| format!("l{i}")));
        let (dynocap, home) = (self.dynocap, self.home);
        std::thread::scope(|scope| {
            for name in names {
                scope.spawn(move || {
                    // A name never started (or gone already) is an error to ignore here.
                    let _ = Command::new(dynocap)
                        .args(["destroy", &name])
                        .env("DYNOCAP_HOME", home)
                        .output();
                });
            }
        });
        // The command server keeps a supervisor standing by for as long as it lives.
        stop_command_servers(home);
        let left = wait_for_supervisors_to_exit(home, Duration::from_secs(60));
        if !left.is_empty() {
            eprintln!(
                "load: supervisors {left:?} still running a minute after their sandboxes were destroyed"
            );
        }
    }
}
