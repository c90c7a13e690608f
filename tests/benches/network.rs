//! Network benchmarks, each beside the same work done directly on the host in the same run,
//! against the loopback fixtures of tests/support/netfix.rs:
//! 1. a 200 MB HTTPS download with curl inside a `filtered` sandbox vs the same curl on the
//!    host straight to the server (target: throughput ratio >= 0.8);
//! 2. the cost of a new connection: TLS connected time (`time_appconnect`) of 50 sequential
//!    curl runs through the proxy vs direct (target: under 2 ms added);
//! 3. `task start --repo https://...` vs a plain `git clone` of the same repository from the
//!    same server (target: ratio <= 1.3).
//!
//! curl's own timers measure 1 and 2, so the exec round trip is not counted; the downloads of
//! 1 alternate with their baseline. Beside 1, the CPU time the sandbox's supervisor and guest
//! agent spent per download (what the filtered path adds to the client and the server, and
//! what bounds it on an idle machine) is read from /proc, which the machine's load does not
//! change. With `DYNOCAP_BENCH_COMPARE=DIR` (a directory holding
//! another build's `dynocap`, `dynocap-core` and static `dynocap-agent`) that build's sandbox
//! downloads in the same rotation, for a comparison of two builds in one run. Run with
//! `scripts/bench.sh` (builds the release binaries first). Needs root.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use dynocap_e2e::bench::{
    child_pids, dynocap_ok, release_bins, report, running_supervisors, sample,
};
use dynocap_e2e::netfix::{product, scrub_client_env, NetFix, BIG_BYTES, GIT_HOST, OTHER_HOST};

const CONNECTIONS: usize = 50;
const DOWNLOADS: usize = 5;
/// The clone benchmark's repository: files of incompressible bytes, so the transfer and not
/// only the per-request overhead counts.
const REPO_FILES: usize = 2_000;
const REPO_FILE_BYTES: usize = 16 * 1024;

fn main() {
    let bins = release_bins();
    let agent =
        std::env::var_os("DYNOCAP_AGENT").map_or_else(|| bins.join("dynocap-agent"), PathBuf::from);
    let fix = NetFix::start();
    // This build, and the one DYNOCAP_BENCH_COMPARE names if any, each with a home of its own.
    let mut builds = vec![Build::new("this build", bins, agent)];
    if let Some(dir) = std::env::var_os("DYNOCAP_BENCH_COMPARE") {
        let dir = PathBuf::from(dir);
        builds.push(Build::new(
            "compared build",
            dir.clone(),
            dir.join("dynocap-agent"),
        ));
    }
    let on_host = |args: &[&str]| -> String {
        let mut cmd = Command::new("curl");
        scrub_client_env(&mut cmd);
        let out = cmd
            .args(["-sS", "--fail"])
            .args(fix.curl_direct())
            .args(args)
            .output()
            .expect("curl");
        assert!(out.status.success(), "curl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let big = format!("https://{OTHER_HOST}/big/{BIG_BYTES}");
    let small = format!("https://{OTHER_HOST}/");
    let timed = ["-o", "/dev/null", "-w", "%{time_total}\n", big.as_str()];
    let direct_connect = sorted(
        (0..CONNECTIONS)
            .map(|_| {
                seconds(&on_host(&[
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{time_appconnect}\n",
                    &small,
                ]))
            })
            .collect(),
    );

    // The guest's curl trusts only the test CA too, as the direct curl does: loading the
    // guest's whole bundle (the system's ~150 certificates plus the test CA) costs more than
    // a TLS handshake on loopback and would be counted against the proxy.
    let pem = std::fs::read_to_string(&fix.ca.ca_cert).expect("the test CA");
    for build in &builds {
        build.dynocap(
            &fix,
            &[
                "run",
                "net",
                "--network",
                "filtered",
                product::FLAG_ALLOW_HOST,
                OTHER_HOST,
            ],
        );
        build.in_sandbox(&fix, &format!("cat > /tmp/test-ca.pem <<'EOF'\n{pem}EOF\n"));
    }
    let curl = "curl -sS --fail --cacert /tmp/test-ca.pem";

    // 1. Throughput: the direct download and each build's alternate, sample by sample, so
    // that all see the same machine (its load drifts within minutes). The first round warms
    // up.
    let download = format!("{curl} -o /dev/null -w '%{{time_total}}\\n' {big}");
    let mut direct_download = Vec::new();
    let mut proxied: Vec<Vec<Duration>> = vec![Vec::new(); builds.len()];
    let mut relay_cpu: Vec<Vec<Duration>> = vec![Vec::new(); builds.len()];
    for round in 0..=DOWNLOADS {
        let direct = seconds(&on_host(&timed));
        let through: Vec<(Duration, Duration)> = builds
            .iter()
            .map(|build| {
                let relay = build.relay_processes();
                let before = cpu_time(&relay);
                let time = seconds(&build.in_sandbox(&fix, &download));
                (time, cpu_time(&relay).saturating_sub(before))
            })
            .collect();
        if round > 0 {
            direct_download.push(direct);
            for (i, (time, cpu)) in through.into_iter().enumerate() {
                proxied[i].push(time);
                relay_cpu[i].push(cpu);
            }
        }
    }
    let direct_download = sorted(direct_download);
    let mbps = |d: Duration| BIG_BYTES as f64 / 1e6 / d.as_secs_f64();
    for (build, (times, cpu)) in builds.iter().zip(proxied.into_iter().zip(relay_cpu)) {
        let cpu = sorted(cpu);
        println!(
            "relay CPU per download ({}): supervisor + agent {:.0} ms (median; the exec's own \
             round trip included)",
            build.name,
            cpu[cpu.len() / 2].as_secs_f64() * 1e3
        );
        let times = sorted(times);
        report(
            &format!("200 MB download through filtered ({})", build.name),
            &times,
            "same curl on host loopback",
            &direct_download,
        );
        let (p, d) = (
            times[times.len() / 2],
            direct_download[direct_download.len() / 2],
        );
        println!(
            "throughput ({}): filtered {:.0} MB/s | direct {:.0} MB/s | ratio {:.2} (target >= 0.8)",
            build.name,
            mbps(p),
            mbps(d),
            mbps(p) / mbps(d)
        );
    }
    let in_sandbox = |command: &str| builds[0].in_sandbox(&fix, command);

    // 2. Added latency per new connection.
    let proxied = sorted(
        in_sandbox(&format!(
            "for i in $(seq {CONNECTIONS}); do \
             {curl} -o /dev/null -w '%{{time_appconnect}}\\n' {small} || exit 1; done"
        ))
        .lines()
        .map(seconds)
        .collect(),
    );
    report(
        &format!("new TLS connection through the proxy ({CONNECTIONS} sequential)"),
        &proxied,
        "direct",
        &direct_connect,
    );
    println!(
        "added latency per connection: {:.2} ms (median; target < 2 ms)",
        (proxied[proxied.len() / 2].as_secs_f64()
            - direct_connect[direct_connect.len() / 2].as_secs_f64())
            * 1e3
    );
    for build in &builds {
        build.dynocap(&fix, &["destroy", "net"]);
    }
    let dynocap = |args: &[&str]| builds[0].dynocap(&fix, args);

    // 3. task start --repo vs git clone.
    generate_repo(&fix.repo.root.join("bench.git"), fix.dir());
    let url = format!("https://{GIT_HOST}/bench.git");
    let start = sample(3, |i| {
        let name = format!("r{i}");
        dynocap(&["task", "start", "--repo", &url, "--name", &name]);
        dynocap(&["rm", &name, "--force", "--purge"]);
    });
    let scratch = fix.dir().join("clones");
    let ca = format!("http.sslCAInfo={}", fix.ca.ca_cert.display());
    let resolve = format!("http.curloptResolve={GIT_HOST}:443:{}", fix.addr);
    let clone = sample(3, |i| {
        let dest = scratch.join(i.to_string());
        let mut cmd = Command::new("git");
        scrub_client_env(&mut cmd);
        let out = cmd
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["-c", &ca, "-c", &resolve, "clone", "-q", &url])
            .arg(&dest)
            .output()
            .expect("git clone");
        assert!(out.status.success(), "{out:?}");
        std::fs::remove_dir_all(&dest).expect("remove clone");
    });
    report(
        &format!(
            "task start --repo ({REPO_FILES} files, {} MB)",
            REPO_FILES * REPO_FILE_BYTES / 1_000_000
        ),
        &start,
        "git clone over the same server",
        &clone,
    );
}

/// A build's binaries, with a home of its own.
struct Build {
    name: &'static str,
    bins: PathBuf,
    agent: PathBuf,
    home: tempfile::TempDir,
}

impl Build {
    fn new(name: &'static str, bins: PathBuf, agent: PathBuf) -> Build {
        let home = tempfile::Builder::new()
            .prefix("dcnb")
            .tempdir_in("/tmp")
            .expect("temp home");
        Build {
            name,
            bins,
            agent,
            home,
        }
    }

    fn dynocap(&self, fix: &NetFix, args: &[&str]) -> Output {
        let product = fix.product_env();
        let mut envs = vec![
            (
                "DYNOCAP_HOME",
                self.home.path().to_str().expect("utf-8 home"),
            ),
            (
                "DYNOCAP_AGENT",
                self.agent.to_str().expect("utf-8 agent path"),
            ),
        ];
        envs.extend(product.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        dynocap_ok(&self.bins.join("dynocap"), &envs, args)
    }

    /// The sandbox's supervisor and its guest agent: the processes a filtered download
    /// crosses besides the client and the server.
    fn relay_processes(&self) -> Vec<i32> {
        let supervisor = *running_supervisors(self.home.path(), "net")
            .first()
            .expect("the sandbox's supervisor");
        let mut found = vec![supervisor];
        let mut next = child_pids(supervisor);
        while let Some(pid) = next.pop() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.contains("agent") {
                found.push(pid);
            }
            next.extend(child_pids(pid));
        }
        assert!(
            found.len() > 1,
            "no guest agent under the supervisor {supervisor}"
        );
        found
    }

    /// The stdout of `command` run in the build's sandbox (curl's -w output).
    fn in_sandbox(&self, fix: &NetFix, command: &str) -> String {
        let out = self.dynocap(
            fix,
            &["--json", "exec", "net", "--timeout", "600", "--", command],
        );
        let exec: serde_json::Value = serde_json::from_slice(&out.stdout).expect("Exec JSON");
        assert_eq!(exec["exitCode"], 0, "{command}: {exec:#}");
        exec["stdout"].as_str().expect("stdout").to_owned()
    }
}

/// User and system CPU time of the processes `pids` (all their threads), from /proc.
fn cpu_time(pids: &[i32]) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("clock ticks");
    let total: u64 = pids
        .iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a live pid");
            // Fields after the command name (which may hold spaces), from field 3 on:
            // utime and stime are fields 14 and 15.
            let rest = &stat[stat.rfind(')').expect("stat's comm") + 2..];
            let fields: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .map(|f| f.parse().expect("a tick count"))
                .collect();
            fields.iter().sum::<u64>()
        })
        .sum();
    Duration::from_millis(total * 1000 / ticks)
}

fn seconds(text: &str) -> Duration {
    Duration::from_secs_f64(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("curl printed no time: {text:?}")),
    )
}

fn sorted(mut times: Vec<Duration>) -> Vec<Duration> {
    times.sort();
    times
}

/// A bare repository at `bare` with [`REPO_FILES`] files of pseudo-random bytes in one
/// commit, built in a work tree under `scratch`.
fn generate_repo(bare: &Path, scratch: &Path) {
    let work = scratch.join("bench-work");
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..REPO_FILES {
        let mut bytes = Vec::with_capacity(REPO_FILE_BYTES);
        while bytes.len() < REPO_FILE_BYTES {
            // xorshift64: cheap, incompressible enough for a pack.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bytes.extend_from_slice(&state.to_le_bytes());
        }
        let path = work.join(format!("dir{}/file{i}.bin", i % 50));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    }
    let git = |dir: &Path, args: &[&str]| dynocap_e2e::git(dir, args);
    git(&work, &["init", "-q", "-b", "main"]);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "bench"]);
    git(
        scratch,
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().expect("utf-8"),
            bare.to_str().expect("utf-8"),
        ],
    );
    std::fs::remove_dir_all(&work).expect("remove work tree");
}
