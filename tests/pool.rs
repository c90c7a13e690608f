//! The warm pool through the CLI (`DYNOCAP_WARM_POOL`): `run` claims a booted sandbox and
//! gives it its name, limits and TTL; the pool refills; specs the pool cannot serve boot
//! afresh; a claim that fails leaves the pool as it was; a dead pool sandbox is cleaned up;
//! `pool --drain` ends it all; a bad pool size is a clear error.

use dynocap_e2e::*;
use serde_json::Value;

fn pool_home(size: &str) -> TestHome {
    TestHome::new().with_env("DYNOCAP_WARM_POOL", size)
}

/// Tops the pool up and waits until it holds `ready` booted sandboxes.
fn wait_ready(home: &TestHome, ready: u64) -> Value {
    let mut last = Value::Null;
    let full = wait_until(120, || {
        last = home.json(&["pool"]);
        last["pool"]["ready"] == ready
    });
    assert!(
        full,
        "the pool never held {ready} ready sandboxes: {last:#}"
    );
    last
}

/// A process's nice value (field 19 of /proc/PID/stat, after the parenthesised name).
fn nice(pid: i32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    after_name
        .split(' ')
        .nth(16)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no nice value in /proc/{pid}/stat: {stat}"))
}

fn sqlite_supervisor(home: &TestHome, id: &str) -> i32 {
    let out = std::process::Command::new("sqlite3")
        .arg(home.path().join("catalog.db"))
        .arg(format!(
            "SELECT supervisor_pid FROM sandboxes WHERE id = '{id}'"
        ))
        .output()
        .expect("sqlite3 is installed");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a supervisor pid")
}

fn supervisor_log(home: &TestHome, id: &str) -> String {
    std::fs::read_to_string(home.log_path(id)).unwrap_or_default()
}

/// What the guest reads as its memory limit and CPU count (see tests/isolation.rs).
fn guest_limits(home: &TestHome, name: &str) -> (String, String) {
    let memory = home.sh(
        name,
        "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    );
    let cpus = home.sh(
        name,
        "if [ -f /sys/fs/cgroup/cpu.max ]; then read quota period < /sys/fs/cgroup/cpu.max; \
         else quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us); \
         period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us); fi; \
         echo $(( (quota + period - 1) / period ))",
    );
    (memory.trim().to_owned(), cpus.trim().to_owned())
}

#[test]
fn run_claims_a_booted_sandbox_with_its_own_name_limits_and_ttl_and_the_pool_refills() {
    if !require_root(
        "run_claims_a_booted_sandbox_with_its_own_name_limits_and_ttl_and_the_pool_refills",
    ) {
        return;
    }
    let home = pool_home("2");
    wait_ready(&home, 2);
    assert_eq!(
        home.json(&["ps"])["sandboxes"],
        serde_json::json!([]),
        "pool sandboxes are nobody's: not listed"
    );
    // Booting and idle, the pool runs at the lowest priority, guests included.
    for supervisor in home.supervisor_pids() {
        for pid in std::iter::once(supervisor).chain(descendants(supervisor)) {
            assert_eq!(nice(pid), 19, "pid {pid} of pool supervisor {supervisor}");
        }
    }

    // More memory than the pool's default (v1 raises memory+swap first), two CPUs.
    let info = home.sandbox(
        "big",
        &["--cpus", "2", "--memory-mb", "2048", "--ttl", "600"],
    );
    assert_eq!(info["name"], "big");
    assert_eq!(info["state"], "running");
    assert_eq!(info["cpus"], 2);
    assert_eq!(info["memoryMB"], 2048);
    assert_eq!(info["ttlSeconds"], 600);
    let created =
        chrono::DateTime::parse_from_rfc3339(info["createdAt"].as_str().unwrap()).unwrap();
    let expires =
        chrono::DateTime::parse_from_rfc3339(info["expiresAt"].as_str().unwrap()).unwrap();
    assert_eq!((expires - created).num_seconds(), 600, "{info:#}");
    let big = home.sandbox_id("big");
    assert!(
        supervisor_log(&home, &big).contains("claimed from the warm pool as big"),
        "{}",
        supervisor_log(&home, &big)
    );
    assert_eq!(home.sh("big", "hostname"), "big\n");
    // Claimed, it and its guest are back at the normal priority, and so is what it runs.
    let claimed = sqlite_supervisor(&home, &big);
    for pid in std::iter::once(claimed).chain(descendants(claimed)) {
        assert_eq!(nice(pid), 0, "pid {pid} of the claimed sandbox");
    }
    assert_eq!(home.sh("big", "cut -d' ' -f19 /proc/self/stat"), "0\n");
    assert_eq!(
        guest_limits(&home, "big"),
        ((2048u64 << 20).to_string(), "2".to_owned())
    );

    // Less memory than the default: lowered.
    home.sandbox("small", &["--memory-mb", "256"]);
    let small = home.sandbox_id("small");
    assert!(supervisor_log(&home, &small).contains("claimed from the warm pool"));
    assert_eq!(
        guest_limits(&home, "small"),
        ((256u64 << 20).to_string(), "1".to_owned())
    );
    // The memory limit holds after the claim: past it, the kernel kills.
    let hog = home.exec(
        "small",
        &[],
        "python3 -c 'b = b\"x\" * (400 << 20); print(len(b))'",
    );
    assert_ne!(hog["exitCode"], 0, "{hog:#}");

    let ps = home.json(&["ps"]);
    assert_eq!(ps["sandboxes"].as_array().unwrap().len(), 2, "{ps:#}");
    // Each claim booted a replacement.
    wait_ready(&home, 2);

    // A disk size other than the pool's is made afresh, not claimed.
    home.sandbox("disk", &["--disk-mb", "256"]);
    let disk = home.sandbox_id("disk");
    assert!(!supervisor_log(&home, &disk).contains("claimed from the warm pool"));
    assert_eq!(home.json(&["pool"])["pool"]["ready"], 2);

    for name in ["big", "small", "disk"] {
        home.json(&["destroy", name]);
    }
    let drained = home.json(&["pool", "--drain"]);
    assert_eq!(drained["drained"], 2, "{drained:#}");
    assert_eq!(drained["pool"]["ready"], 0);
    assert_eq!(drained["pool"]["warming"], 0);
    home.wait_for_teardown();
    assert!(home.supervisor_pids().is_empty(), "no record is left");
}

#[test]
fn a_claim_under_a_taken_name_leaves_the_pool_as_it_was() {
    if !require_root("a_claim_under_a_taken_name_leaves_the_pool_as_it_was") {
        return;
    }
    let home = pool_home("1");
    wait_ready(&home, 1);
    home.sandbox("twin", &[]);
    wait_ready(&home, 1);
    let err = home.json_err(&["run", "twin"]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    assert!(
        err["message"].as_str().unwrap().contains("already taken"),
        "{err:#}"
    );
    let status = home.json(&["pool"]);
    assert_eq!(
        status["pool"]["ready"], 1,
        "the pooled sandbox is still there: {status:#}"
    );
    assert_eq!(home.sh("twin", "hostname"), "twin\n");
}

#[test]
fn a_dead_pool_sandbox_is_cleaned_up_and_replaced() {
    if !require_root("a_dead_pool_sandbox_is_cleaned_up_and_replaced") {
        return;
    }
    let home = pool_home("1");
    wait_ready(&home, 1);
    let victim = home.supervisor_pids()[0];
    // SAFETY: plain kill(2) of a pid we own.
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    assert!(wait_until(20, || !pid_exists(victim)));
    // The next top-up's reconcile removes it and boots another.
    wait_ready(&home, 1);
    assert!(!home.supervisor_pids().contains(&victim));
    // And a run claims the new one.
    home.sandbox("after", &[]);
    let id = home.sandbox_id("after");
    assert!(supervisor_log(&home, &id).contains("claimed from the warm pool"));
    assert_eq!(home.sh("after", "echo ok"), "ok\n");
}

#[test]
fn a_bad_pool_size_is_refused_with_the_variable_and_its_range() {
    let home = pool_home("lots");
    let err = home.json_err(&["run", "x"]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("DYNOCAP_WARM_POOL=lots"), "{message}");
    assert!(message.contains("from 0 to 16"), "{message}");
}

#[test]
fn the_pool_takes_only_room_under_the_ceilings_that_nobody_uses_and_yields_it() {
    if !require_root("the_pool_takes_only_room_under_the_ceilings_that_nobody_uses_and_yields_it") {
        return;
    }
    // Room for three sandboxes in all. Memory is not room the pool takes: limits overcommit
    // (the kernel bounds what all sandboxes use together), so the count is what binds.
    let home = pool_home("3").with_env("DYNOCAP_MAX_SANDBOXES", "3");
    wait_ready(&home, 3);
    let pooled = |home: &TestHome| {
        let status = home.json(&["pool"]);
        status["pool"]["ready"].as_u64().unwrap() + status["pool"]["warming"].as_u64().unwrap()
    };

    // A claim, with more memory than the pool's: the pool does not refill past the count.
    home.sandbox("big", &["--memory-mb", "2048"]);
    assert_eq!(
        pooled(&home),
        2,
        "one caller's sandbox + two pool sandboxes = 3"
    );
    // The claimed sandbox's disk took its room at the claim; the pool's hold none yet.
    let allocated = |id: &str| {
        let image = home.path().join("sandboxes").join(id).join("disk.img");
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(image).expect("disk.img")) * 512
    };
    assert!(allocated(&home.sandbox_id("big")) >= 2048 << 20);
    let pooled_ids = std::process::Command::new("sqlite3")
        .arg(home.path().join("catalog.db"))
        .arg("SELECT id FROM sandboxes WHERE state = 'pooled'")
        .output()
        .expect("sqlite3");
    for id in String::from_utf8_lossy(&pooled_ids.stdout).lines() {
        assert!(
            allocated(id) < 16 << 20,
            "pool sandbox {id} reserves nothing"
        );
    }
    // A start the pool cannot serve is admitted as if the pool were not there, and the pool
    // yields.
    home.sandbox("other", &["--disk-mb", "256"]);
    assert_eq!(pooled(&home), 1);
    home.sandbox("third", &[]);
    assert_eq!(pooled(&home), 0);
    // The ceiling still binds the caller's own sandboxes.
    let err = home.json_err(&["run", "fourth"]);
    assert_eq!(err["code"], "policy_denied", "{err:#}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("DYNOCAP_MAX_SANDBOXES=3"),
        "{err:#}"
    );

    // Room freed, room refilled.
    for name in ["big", "other", "third"] {
        home.json(&["destroy", name]);
    }
    wait_ready(&home, 3);
}

/// Sets the mtime of `path` to `unix` seconds (a toucher as a supervisor's request is).
fn set_mtime(path: &std::path::Path, unix: i64) {
    let out = std::process::Command::new("touch")
        .arg("-d")
        .arg(format!("@{unix}"))
        .arg(path)
        .output()
        .expect("touch");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn mtime_unix(path: &std::path::Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .expect("the activity marker")
        .mtime()
}

/// A refill boots in a lull, not beside the commands of the sandbox just claimed: every
/// request a supervisor serves marks the home busy (`run/activity`), and a refill waits until
/// nothing has for a moment (at most a few seconds).
#[test]
fn a_refill_boots_once_the_home_is_quiet() {
    if !require_root("a_refill_boots_once_the_home_is_quiet") {
        return;
    }
    let home = pool_home("1");
    wait_ready(&home, 1);
    let marker = home.path().join("run/activity");
    home.sandbox("first", &[]);
    wait_ready(&home, 1);

    // A request marks the home busy.
    set_mtime(&marker, 0);
    home.sh("first", "true");
    let now = chrono::Utc::now().timestamp();
    assert!(
        mtime_unix(&marker) >= now - 60,
        "the exec did not mark the home busy"
    );

    // Kept busy (marked a second ahead, again and again) while a claim's refill starts: it
    // cannot boot before that stops.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let toucher = {
        let (stop, marker) = (std::sync::Arc::clone(&stop), marker.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                set_mtime(&marker, chrono::Utc::now().timestamp() + 1);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    home.sandbox("second", &[]);
    let second = home.sandbox_id("second");
    assert!(supervisor_log(&home, &second).contains("claimed from the warm pool"));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    toucher.join().expect("toucher");
    wait_ready(&home, 1);
    let longest_wait = std::fs::read_dir(home.path().join("logs"))
        .expect("logs")
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .flat_map(|log| {
            log.lines()
                .filter_map(|line| {
                    let rest = line.split("warm-pool boot after ").nth(1)?;
                    rest.split(' ').next()?.parse::<u64>().ok()
                })
                .collect::<Vec<_>>()
        })
        .max()
        .expect("a refill logged its wait");
    assert!(
        longest_wait >= 1000,
        "the refill booted while the home was busy (waited {longest_wait} ms)"
    );
    for name in ["first", "second"] {
        home.json(&["destroy", name]);
    }
}
