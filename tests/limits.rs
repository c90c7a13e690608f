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
    // Contention on a shared machine can only lower the loops' usage, so the cap is the
    // assertion that holds whatever the load; that they ran at all is all a lower bound says.
    assert!(
        secs < 4.5,
        "two spinning loops used {secs:.2}s of CPU in 3s with a 1-CPU quota"
    );
    assert!(secs > 0.0, "the loops did run");
    // And the quota itself: one CPU per 100 ms period, on cgroup v1 or v2.
    let id = home.sandbox_id("cpu");
    let v1 = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/dynocap/{id}/cpu.cfs_quota_us"));
    let v2 = std::fs::read_to_string(format!("/sys/fs/cgroup/dynocap/{id}/cpu.max"));
    match (v1, v2) {
        (Ok(quota), _) => assert_eq!(quota.trim(), "100000"),
        (_, Ok(max)) => assert_eq!(max.trim(), "100000 100000"),
        (Err(e1), Err(e2)) => panic!("no cpu quota file for {id}: v1 {e1}, v2 {e2}"),
    }
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
