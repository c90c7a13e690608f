//! cgroup limits hold (v1 and v2): memory without swap, CPU quota, process count.

use dynocap_e2e::*;

#[test]
fn memory_limit_oom_kills_and_sandbox_survives() {
    if !require_root("memory_limit_oom_kills_and_sandbox_survives") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("mem", &["--memory-mb", "256"]);
    let hog = home.exec(
        "mem",
        &["--timeout", "120"],
        "exec perl -e '$x = \"a\" x (2048 * 1024 * 1024); print length($x)'",
    );
    assert_eq!(
        hog["signal"], "SIGKILL",
        "the 2 GiB allocation was OOM-killed: {hog}"
    );
    assert_eq!(home.sh("mem", "echo alive"), "alive\n");
}

#[test]
fn cpu_quota_caps_usage_at_about_one_core() {
    if !require_root("cpu_quota_caps_usage_at_about_one_core") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("cpu", &["--cpus", "1"]);
    // Two busy loops for 3 s of wall time; with one CPU of quota their combined CPU time
    // stays near 3 s, never near the 6 s two free cores would give.
    let out = home.sh(
        "cpu",
        "for i in 1 2; do timeout 3 sh -c 'while :; do :; done' & done; wait; times",
    );
    // `times` prints the shell's, then its children's user and system time: "XmY.YYs XmY.YYs".
    let children = out.lines().last().expect("times prints two lines");
    let secs: f64 = children
        .split_whitespace()
        .map(|t| {
            let (m, s) = t.trim_end_matches('s').split_once('m').unwrap();
            m.parse::<f64>().unwrap() * 60.0 + s.parse::<f64>().unwrap()
        })
        .sum();
    assert!(
        secs < 4.5,
        "two spinning loops used {secs:.2}s of CPU in 3s with a 1-CPU quota"
    );
    assert!(secs > 0.5, "the loops did run ({secs:.2}s)");
}

#[test]
fn pids_limit_stops_a_fork_bomb() {
    if !require_root("pids_limit_stops_a_fork_bomb") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("bomb", &[]);
    let bomb = home.exec(
        "bomb",
        &["--timeout", "10"],
        "bomb() { bomb | bomb & }; bomb; sleep 20",
    );
    assert_eq!(bomb["timedOut"], true, "{bomb}");
    // The limit held the bomb and the sandbox still works once the group is gone.
    assert!(wait_until(60, || {
        let out = home.run(&["--json", "exec", "bomb", "--", "echo usable"]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("usable")
    }));
}
