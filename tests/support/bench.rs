//! Helpers the benchmarks share: locating the release binaries, sampling, reporting a
//! measurement beside its baseline as a ratio, reading a process's memory counters, finding
//! a home's supervisors and waiting for them to finish, and a bare MCP client over stdio.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The binaries as an install has them (README, "Install"), copied into one directory,
/// `target/bench-install`: the static client `dynocap`, `dynocap-core`, and the static agent.
/// `scripts/bench.sh` builds them.
pub fn release_bins() -> PathBuf {
    let exe = std::env::current_exe().expect("bench path");
    let target = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf();
    let musl = target.join("x86_64-unknown-linux-musl/release");
    let parts = [
        (musl.join("dynocap"), "dynocap"),
        (target.join("release/dynocap-core"), "dynocap-core"),
        (musl.join("dynocap-agent"), "dynocap-agent"),
    ];
    let install = target.join("bench-install");
    std::fs::create_dir_all(&install).expect("target/bench-install");
    for (built, name) in parts {
        assert!(
            built.is_file(),
            "{} is missing; build first: cargo build --release -p dynocap && cargo build \
             --release --target x86_64-unknown-linux-musl -p dynocap-client -p dynocap-agent \
             (scripts/bench.sh does)",
            built.display()
        );
        // A copy, not a link: the client finds dynocap-core beside its own file.
        let staged = install.join(format!("{name}.new"));
        std::fs::copy(&built, &staged).expect("copy into target/bench-install");
        std::fs::rename(&staged, install.join(name)).expect("install");
    }
    install
}

/// Runs `f` `n` times after one warm-up run (given index `n`); returns the sorted durations.
pub fn sample(n: usize, mut f: impl FnMut(usize)) -> Vec<Duration> {
    f(n);
    let mut times: Vec<Duration> = (0..n)
        .map(|i| {
            let start = Instant::now();
            f(i);
            start.elapsed()
        })
        .collect();
    times.sort();
    times
}

/// Runs `dynocap ARGS` with `envs` added to the environment; asserts it succeeded, showing
/// its stdout (where `--json` puts the error) and stderr if not.
pub fn dynocap_ok(dynocap: &Path, envs: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(dynocap)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("spawn dynocap");
    assert!(
        out.status.success(),
        "dynocap {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Durations of two things timed alternately, in the order they ran: `ours[i]` and
/// `baseline[i]` are neighbours, so they ran under the same load.
pub struct Pairs {
    pub ours: Vec<Duration>,
    pub baseline: Vec<Duration>,
}

/// Times `ours` and `baseline` `n` times each, alternately (ours, baseline, ours, ...), after
/// one untimed warm-up of each. Before every timed run of `ours`, `ready` runs untimed (e.g.
/// waiting for a warm pool to fill); then, before each timed run of either, `pause` of idle,
/// so that neither pays for work the other, or its own previous run, left behind after it
/// returned (a sandbox's teardown after the reply; the kernel's cleanup of bwrap's network
/// namespace).
pub fn pairs(
    n: usize,
    pause: Duration,
    mut ready: impl FnMut(),
    mut ours: impl FnMut(usize),
    mut baseline: impl FnMut(usize),
) -> Pairs {
    ready();
    ours(n);
    baseline(n);
    let timed = |run: &mut dyn FnMut(usize), i: usize| {
        std::thread::sleep(pause);
        let start = Instant::now();
        run(i);
        start.elapsed()
    };
    let mut result = Pairs {
        ours: Vec::with_capacity(n),
        baseline: Vec::with_capacity(n),
    };
    for i in 0..n {
        ready();
        result.ours.push(timed(&mut ours, i));
        result.baseline.push(timed(&mut baseline, i));
    }
    result
}

/// Prints one line for [`pairs`]: our median and p90, the baseline's median, the ratio of the
/// medians, and the median of the neighbours' ratios (steadier on a shared machine, where the
/// load drifts during a run).
pub fn report_pairs(name: &str, pairs: &Pairs, baseline: &str) {
    let ((m, p90), (b, _)) = (median_and_p90(&pairs.ours), median_and_p90(&pairs.baseline));
    let mut ratios: Vec<f64> = pairs
        .ours
        .iter()
        .zip(&pairs.baseline)
        .map(|(o, b)| o.as_secs_f64() / b.as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "{name}: median {:.2} ms (p90 {:.2} ms) | {baseline}: median {:.2} ms | ratio {:.2}x, median of {} pair ratios {:.2}x",
        m.as_secs_f64() * 1e3,
        p90.as_secs_f64() * 1e3,
        b.as_secs_f64() * 1e3,
        m.as_secs_f64() / b.as_secs_f64(),
        ratios.len(),
        ratios[ratios.len() / 2]
    );
}

/// The median and the 90th percentile of `times`, in any order.
pub fn median_and_p90(times: &[Duration]) -> (Duration, Duration) {
    let mut times = times.to_vec();
    times.sort();
    (times[times.len() / 2], times[times.len() * 9 / 10])
}

/// Prints one line: the measurement's median and p90, the baseline's median, their ratio.
pub fn report(name: &str, times: &[Duration], baseline: &str, base: &[Duration]) {
    let (m, b) = (times[times.len() / 2], base[base.len() / 2]);
    println!(
        "{name}: median {:.2} ms (p90 {:.2} ms) | {baseline}: median {:.2} ms | ratio {:.2}x",
        m.as_secs_f64() * 1e3,
        times[times.len() * 9 / 10].as_secs_f64() * 1e3,
        b.as_secs_f64() * 1e3,
        m.as_secs_f64() / b.as_secs_f64()
    );
}

/// Pids of the processes running `dynocap supervise --home HOME`: the supervisors of the
/// home's sandboxes and tasks, and standbys.
pub fn supervisor_processes(home: &Path) -> Vec<i32> {
    let mut needle = b"--home\0".to_vec();
    needle.extend_from_slice(home.as_os_str().as_encoded_bytes());
    needle.push(0);
    command_lines()
        .into_iter()
        .filter(|(_, cmdline)| {
            cmdline.split(|&b| b == 0).any(|arg| arg == b"supervise")
                && cmdline
                    .windows(needle.len())
                    .any(|w| w == needle.as_slice())
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Every process's pid and command line (its arguments, each ended by a NUL). A process that
/// has exited has none, and is left out.
fn command_lines() -> Vec<(i32, Vec<u8>)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (!cmdline.is_empty()).then_some((pid, cmdline))
        })
        .collect()
}

/// The command servers of `home` (docs/cli.md, "The command server"): pid and socket of each.
pub fn command_servers(home: &Path) -> Vec<(i32, PathBuf)> {
    let run_dir = home.join("run");
    command_lines()
        .into_iter()
        .filter_map(|(pid, cmdline)| {
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            let socket = Path::new(std::ffi::OsStr::from_bytes(args.get(3)?));
            (args[1] == b"cli-server"
                && args[2] == b"--socket"
                && socket.parent() == Some(&run_dir))
            .then(|| (pid, socket.to_path_buf()))
        })
        .collect()
}

/// Ends the command servers of `home` and waits for them, as their idle time would end them:
/// for a measurement of a quiet home, whose catalog no other process holds open.
pub fn stop_command_servers(home: &Path) {
    for (pid, _) in command_servers(home) {
        // SAFETY: kill has no memory preconditions; the pid is a server of this home.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !command_servers(home).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (at most `within`) until no supervisor of `home` is left, before a bench or a test
/// removes the home: `destroy` answers once the guest is dead, and its supervisor tears
/// down the rest (cgroups, disk, log, the spare disk for the next start) after. Removing the
/// home meanwhile races those writes and leaves it half deleted in /tmp. Returns the pids
/// still running at the deadline (none when all finished); it does not panic, so a clean-up
/// can call it while unwinding.
pub fn wait_for_supervisors_to_exit(home: &Path, within: Duration) -> Vec<i32> {
    let deadline = Instant::now() + within;
    loop {
        let left = supervisor_processes(home);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `Field:  N kB` counter of /proc/PID/status (`VmRSS:`) or smaps_rollup (`Pss:`), in KiB.
pub fn proc_kib(pid: i32, file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Pids of the supervisors of this home's running sandboxes, the one named `first` (if any)
/// first.
pub fn running_supervisors(home: &Path, first: &str) -> Vec<i32> {
    let out = std::process::Command::new("sqlite3")
        .arg(home.join("catalog.db"))
        .arg(format!(
            "SELECT supervisor_pid FROM sandboxes WHERE state = 'running' ORDER BY name != '{first}', name"
        ))
        .output()
        .expect("sqlite3");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The direct children of `pid` (a supervisor's guest init).
pub fn child_pids(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A minimal MCP client over stdio for benchmarks: `dynocap mcp` speaks newline-delimited
/// JSON-RPC, so a cycle's cost is measured without an SDK's own overhead in the way.
pub struct McpSession {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    next_id: u64,
}

impl McpSession {
    /// Starts `dynocap mcp` with `envs` and completes the initialize handshake.
    pub fn start(dynocap: &Path, envs: &[(&str, &str)]) -> McpSession {
        let mut child = std::process::Command::new(dynocap)
            .arg("mcp")
            .envs(envs.iter().copied())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn dynocap mcp");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut session = McpSession {
            child,
            stdin,
            stdout,
            next_id: 1,
        };
        session.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "dynocap-bench", "version": "1"}
            }),
        );
        session.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        session
    }

    fn send(&mut self, message: &serde_json::Value) {
        use std::io::Write;
        let mut line = serde_json::to_vec(message).expect("json");
        line.push(b'\n');
        self.stdin.write_all(&line).expect("write to dynocap mcp");
        self.stdin.flush().expect("flush");
    }

    fn request(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use std::io::BufRead;
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        loop {
            let mut line = String::new();
            let n = self
                .stdout
                .read_line(&mut line)
                .expect("read from dynocap mcp");
            assert!(n > 0, "dynocap mcp closed its output");
            let message: serde_json::Value = serde_json::from_str(&line).expect("json line");
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    }

    /// Calls a tool and returns its structured result; a tool error fails the benchmark.
    pub fn call(&mut self, tool: &str, arguments: serde_json::Value) -> serde_json::Value {
        let result = self.request(
            "tools/call",
            serde_json::json!({"name": tool, "arguments": arguments}),
        );
        assert_ne!(result["isError"], true, "{tool}: {result}");
        result
    }
}

impl Drop for McpSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
