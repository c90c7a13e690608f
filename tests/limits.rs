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
        // `sleep` is started before the bomb: forked after it, it could find the pids limit
        // already reached and end the command long before the timeout.
        "bomb() { bomb | bomb & }; sleep 20 & bomb; wait",
    );
    assert_eq!(bomb["timedOut"], true, "{bomb}");
    // The limit held the bomb and the sandbox still works once the group is gone.
    assert!(wait_until(60, || {
        let out = home.run(&["--json", "exec", "bomb", "--", "echo usable"]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("usable")
    }));
}

/// A guest's devpts has its own bound: one sandbox opening ptys until it fails stops there
/// (ENOSPC) while another sandbox's `exec --tty` still gets a terminal.
#[test]
fn one_sandbox_cannot_take_every_host_pty() {
    if !require_root("one_sandbox_cannot_take_every_host_pty") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("ptyhog", &[]);
    home.sandbox("ptyok", &[]);
    // Holds every pty it gets until told to let go (or two minutes pass, so nothing is left
    // behind if the test dies).
    let hog = r#"
import errno, os, resource, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds, err = [], 0
while len(fds) < 100000:
    try:
        fds.append(os.openpty())
    except OSError as e:
        err = e.errno
        break
with open("/tmp/held.new", "w") as f:
    f.write(f"{len(fds)} {errno.errorcode.get(err, err)}")
os.rename("/tmp/held.new", "/tmp/held")
deadline = time.time() + 120
while not os.path.exists("/tmp/release") and time.time() < deadline:
    time.sleep(0.1)
"#;
    let holder = home
        .command()
        .args(["--json", "exec", "ptyhog", "--timeout", "300", "--"])
        .arg(format!("python3 -c '{hog}'"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dynocap");
    let mut held = String::new();
    assert!(
        wait_until(120, || {
            held = home.sh("ptyhog", "cat /tmp/held 2>/dev/null || true");
            !held.is_empty()
        }),
        "the pty hog never reported"
    );
    let (count, errno) = held.split_once(' ').expect("count and errno");
    let count: u32 = count.parse().expect("count");
    assert_eq!(errno, "ENOSPC", "{held}");
    assert!((1..=256).contains(&count), "opened {count} ptys");

    // While the hog holds its ptys, another sandbox still gets a terminal.
    let tty = home.exec("ptyok", &["--tty"], "tty");
    assert_eq!(tty["exitCode"], 0, "{tty:#}");
    assert!(
        tty["transcript"]
            .as_str()
            .unwrap_or_default()
            .contains("/dev/pts/"),
        "{tty:#}"
    );

    home.sh("ptyhog", "touch /tmp/release");
    let done = holder.wait_with_output().expect("hog exec");
    let result: serde_json::Value = serde_json::from_slice(&done.stdout).expect("Exec JSON");
    assert_eq!(result["exitCode"], 0, "{result:#}");
    // With the ptys released, the hog's sandbox has terminals again.
    assert_eq!(home.exec("ptyhog", &["--tty"], "true")["exitCode"], 0);
}

/// /tmp and /dev/shm are sized tmpfs: writing past the size fails with ENOSPC (not an OOM
/// kill), and the sandbox keeps working.
#[test]
fn tmp_and_shm_fill_up_with_enospc() {
    if !require_root("tmp_and_shm_fill_up_with_enospc") {
        return;
    }
    let home = TestHome::new();
    // 256 MiB of memory: /tmp is 128 MiB, /dev/shm 64 MiB.
    home.sandbox("tmpfs", &["--memory-mb", "256"]);
    let mounts = home.sh("tmpfs", "grep -E ' /(tmp|dev/shm) ' /proc/mounts");
    let shm = mounts
        .lines()
        .find(|l| l.contains(" /dev/shm "))
        .unwrap_or_else(|| panic!("no /dev/shm: {mounts}"));
    for option in ["nosuid", "nodev", "noexec", "size=65536k"] {
        assert!(shm.contains(option), "/dev/shm lacks {option}: {shm}");
    }
    // The kernel leaves tmpfs's default mode (1777) out of /proc/mounts.
    assert_eq!(home.sh("tmpfs", "stat -c %a /dev/shm /tmp"), "1777\n1777\n");
    assert!(mounts.contains("size=131072k"), "/tmp size: {mounts}");

    for (dir, mib) in [("/tmp", 200), ("/dev/shm", 100)] {
        let fill = home.exec(
            "tmpfs",
            &["--timeout", "120"],
            &format!("head -c {mib}M /dev/zero > {dir}/fill; echo rc=$?"),
        );
        let stderr = fill["stderr"].as_str().unwrap_or_default();
        assert!(
            stderr.contains("No space left on device"),
            "{dir}: {fill:#}"
        );
        assert!(
            fill["signal"].is_null(),
            "{dir}: killed, not ENOSPC: {fill:#}"
        );
        assert_ne!(fill["oomKilled"], true, "{dir}: {fill:#}");
        assert_eq!(
            fill["stdout"], "rc=1\n",
            "{dir}: head failed, alone: {fill:#}"
        );
        assert_eq!(
            home.sh("tmpfs", &format!("rm {dir}/fill && echo freed")),
            "freed\n"
        );
    }
    assert_eq!(
        home.sh("tmpfs", "echo ok > /tmp/small && cat /tmp/small"),
        "ok\n"
    );
}
