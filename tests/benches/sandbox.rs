//! Sandbox benchmarks, each beside its baseline in the same run (ratios, not absolute times):
//! 1. `run` + `exec true` + `destroy` vs `bwrap --unshare-all … true`: through the CLI and
//!    through one MCP session, cold and with a ready warm pool (`DYNOCAP_WARM_POOL`); each
//!    cycle is timed beside a bwrap run, alternately, after the same idle pause, so both see
//!    the same machine (these machines are shared, and their speed drifts within minutes);
//! 2. exec round trip of `true` on a running sandbox, through the engine's client API and
//!    through the `dynocap exec` process, vs spawning `sh -c true` on the host; and of
//!    `sleep 1 & true` (a background job holding the output) vs `true`; and, alternately in
//!    one MCP session, a `dynocap_job` poll of a running job vs `dynocap_ps`, and reading a
//!    1 MiB file with `dynocap_read_file` vs `dynocap_exec cat` of it;
//! 3. resident memory of an idle sandbox's supervisor + agent;
//! 4. `dynocap ls` in a home hundreds of sandboxes have used vs `dynocap --version`: the
//!    catalog work of a CLI command that opens the catalog while no other process has it
//!    open, as every command typed at a quiet home does.
//!
//! Run with `scripts/bench.sh` (builds the release binaries first). Needs root and bwrap.
//! `DYNOCAP_BENCH_SANDBOX=mcp-tools` runs only the MCP tool measures of 2 (job polling and
//! file reading), in a minute.

use std::cell::RefCell;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dynocap_e2e::bench::{
    child_pids, dynocap_ok, median_and_p90, pairs, proc_kib, release_bins, report, report_pairs,
    running_supervisors, sample, stop_command_servers, wait_for_supervisors_to_exit, McpSession,
};

use dynocap_engine::spec::{ExecSpec, RunSpec};
use dynocap_engine::{Engine, Home};

/// Timed cycles per path, each beside a timed bwrap run: with 15, the CLI's cold ratio moved
/// by a tenth or more between runs on this machine.
const CYCLES: usize = 30;
/// Idle before every timed run: an agent's calls come seconds apart, and this lets a
/// sandbox's teardown after its reply, and the kernel's cleanup of bwrap's network namespace,
/// finish before the next run is timed.
const PAUSE: Duration = Duration::from_millis(200);
/// Sandboxes started and destroyed in the home before `dynocap ls` is timed in it.
const AGEING_SANDBOXES: usize = 150;

fn main() {
    let bins = release_bins();
    let home_dir = tempfile::Builder::new()
        .prefix("dcb")
        .tempdir_in("/tmp")
        .expect("temp home");
    // scripts/bench.sh points DYNOCAP_AGENT at the static agent, as installs use.
    if std::env::var_os("DYNOCAP_AGENT").is_none() {
        std::env::set_var("DYNOCAP_AGENT", bins.join("dynocap-agent"));
    }
    let dynocap = bins.join("dynocap");
    let home_str = home_dir.path().to_str().expect("utf-8 temp path");
    let home_env = [("DYNOCAP_HOME", home_str)];
    if std::env::var("DYNOCAP_BENCH_SANDBOX").as_deref() == Ok("mcp-tools") {
        mcp_tools(&dynocap, &home_env);
        return;
    }
    let cli = |args: &[&str]| {
        dynocap_ok(&dynocap, &home_env, args);
    };
    // One cycle through the CLI, one process per command, each command's time kept in
    // `times` (the untimed warm-up cycle's included; medians barely notice one more).
    let cli_cycle = |envs: &[(&str, &str)], name: &str, times: &RefCell<CommandTimes>| {
        let timed = |args: &[&str]| {
            let start = Instant::now();
            dynocap_ok(&dynocap, envs, args);
            start.elapsed()
        };
        let run = timed(&["run", name]);
        let exec = timed(&["exec", name, "--", "true"]);
        let destroy = timed(&["destroy", name]);
        let mut times = times.borrow_mut();
        times.run.push(run);
        times.exec.push(exec);
        times.destroy.push(destroy);
    };

    // 1. Start to first command to teardown, each cycle beside a bwrap run (see `pairs`).
    let bwrap_true = |_: usize| {
        let status = Command::new("bwrap")
            .args([
                "--unshare-all",
                "--die-with-parent",
                "--ro-bind",
                "/usr",
                "/usr",
            ])
            .args([
                "--symlink",
                "usr/bin",
                "/bin",
                "--symlink",
                "usr/lib",
                "/lib",
                "--symlink",
                "usr/lib64",
                "/lib64",
            ])
            .args([
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true",
            ])
            .status()
            .expect("bwrap is installed (apt-get install bubblewrap)");
        assert!(status.success());
    };
    let cold_times = RefCell::new(CommandTimes::default());
    let cli_cold = pairs(
        CYCLES,
        PAUSE,
        || {},
        |i| cli_cycle(&home_env, &format!("b{i}"), &cold_times),
        bwrap_true,
    );
    // The same cycle with every command in a dynocap-core process of its own, as without
    // the command server (docs/cli.md, "The command server").
    let unserved_env = [("DYNOCAP_HOME", home_str), ("DYNOCAP_CLI_SERVER", "0")];
    let cli_unserved = pairs(
        CYCLES,
        PAUSE,
        || {},
        |i| cli_cycle(&unserved_env, &format!("u{i}"), &RefCell::default()),
        bwrap_true,
    );
    // What a command the server does not serve costs before it does anything: the client
    // and a dynocap-core process, each started.
    let process_start = sample(CYCLES, |_| cli(&["--version"]));
    let mcp_cycle = |session: &mut McpSession, i: usize| {
        let name = format!("m{i}");
        session.call("dynocap_run", serde_json::json!({ "name": name }));
        session.call(
            "dynocap_exec",
            serde_json::json!({ "name": name, "command": "true" }),
        );
        session.call("dynocap_destroy", serde_json::json!({ "name": name }));
    };
    let mut mcp = McpSession::start(&dynocap, &home_env);
    let mcp_cold = pairs(CYCLES, PAUSE, || {}, |i| mcp_cycle(&mut mcp, i), bwrap_true);
    drop(mcp);

    // With a warm pool of 2, each cycle starting with the pool ready (its refill after a
    // claim runs in the background, outside the timed part).
    let pool_env = [("DYNOCAP_HOME", home_str), ("DYNOCAP_WARM_POOL", "2")];
    let pool_ready = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let out = Command::new(&dynocap)
                .args(["--json", "pool"])
                .envs(pool_env)
                .output()
                .expect("dynocap pool");
            let status: serde_json::Value =
                serde_json::from_slice(&out.stdout).expect("pool status");
            if status["pool"]["ready"] == 2 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the pool never filled: {status}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let cli_pooled = pairs(
        CYCLES,
        PAUSE,
        pool_ready,
        |i| cli_cycle(&pool_env, &format!("p{i}"), &RefCell::default()),
        bwrap_true,
    );
    let mut mcp = McpSession::start(&dynocap, &pool_env);
    let mcp_pooled = pairs(
        CYCLES,
        PAUSE,
        pool_ready,
        |i| mcp_cycle(&mut mcp, 100 + i),
        bwrap_true,
    );
    drop(mcp);
    cli(&["pool", "--drain"]);

    for (name, pairs) in [
        ("run + exec true + destroy (CLI, cold)", &cli_cold),
        (
            "run + exec true + destroy (CLI, cold, no command server)",
            &cli_unserved,
        ),
        ("run + exec true + destroy (MCP, cold)", &mcp_cold),
        ("run + exec true + destroy (CLI, warm pool)", &cli_pooled),
        ("run + exec true + destroy (MCP, warm pool)", &mcp_pooled),
    ] {
        report_pairs(name, pairs, "bwrap --unshare-all true");
    }
    let cold_times = cold_times.into_inner();
    println!(
        "CLI cold cycle by command: run median {:.2} ms, exec {:.2} ms, destroy {:.2} ms | dynocap --version (client and dynocap-core started, not served) median {:.2} ms",
        median_ms(&cold_times.run),
        median_ms(&cold_times.exec),
        median_ms(&cold_times.destroy),
        median_ms(&process_start),
    );
    println!("targets: MCP cold <= 2x, CLI cold <= 3x, MCP with a warm pool < 1x");

    // 4 (before 2, whose engine keeps the catalog open in this process). The catalog's WAL
    // grows with every sandbox that comes and goes, and a command that opens the catalog
    // alone reads all of it: age the home first, as a day of use does.
    for i in 0..AGEING_SANDBOXES {
        let name = format!("old{i}");
        cli(&["run", &name]);
        cli(&["destroy", &name]);
    }
    // As quiet as a home gets: no command server holding the catalog open either.
    stop_command_servers(home_dir.path());
    let listing = pairs(
        CYCLES * 2,
        PAUSE,
        || {},
        |_| cli(&["ls"]),
        |_| cli(&["--version"]),
    );

    // 2. Exec round trip on a running sandbox.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let engine = Engine::with_supervisor_exe(
        Home::at(home_dir.path().to_path_buf()).expect("home"),
        dynocap.clone(),
        dynocap_engine::Config::default(),
    );
    let spec = RunSpec::raw("hot", None, None, None, None, None).expect("spec");
    runtime.block_on(engine.run(&spec)).expect("boot");
    let exec_true = ExecSpec::new("true", None, "/", Vec::new(), None, false).expect("exec spec");
    let api = sample(300, |_| {
        let result = runtime
            .block_on(engine.exec("hot", &exec_true))
            .expect("exec");
        assert_eq!(result.exit_code, Some(0));
    });
    let process = sample(50, |_| cli(&["exec", "hot", "--", "true"]));
    let host = sample(300, |_| {
        assert!(Command::new("sh")
            .args(["-c", "true"])
            .status()
            .expect("sh")
            .success());
    });
    // A command that leaves a background job holding its output returns when it exits, not
    // after a quiet period: the same round trip as `true`.
    let exec_bg =
        ExecSpec::new("sleep 1 & true", None, "/", Vec::new(), None, false).expect("exec spec");
    let background = sample(100, |_| {
        let result = runtime
            .block_on(engine.exec("hot", &exec_bg))
            .expect("exec");
        assert_eq!(result.exit_code, Some(0));
    });
    report("exec true via client API", &api, "host sh -c true", &host);
    report(
        "exec 'sleep 1 & true' via client API",
        &background,
        "exec true via client API",
        &api,
    );
    report(
        "exec true via dynocap exec",
        &process,
        "host sh -c true",
        &host,
    );
    println!("targets: client API median < 2 ms, dynocap exec median < 10 ms");

    mcp_tools(&dynocap, &home_env);

    // 3. Idle memory: RSS of one sandbox (counts shared libc and binary pages in full), and
    // per sandbox across ten idle ones: PSS (shared pages split between their users) and
    // private anonymous memory (what each extra sandbox really adds).
    for i in 0..9 {
        cli(&["run", &format!("idle{i}")]);
    }
    std::thread::sleep(Duration::from_secs(1));
    let supervisors = running_supervisors(home_dir.path(), "hot");
    let mut processes = Vec::new();
    for &sup in &supervisors {
        processes.push(sup);
        processes.extend(child_pids(sup));
    }
    let hot = supervisors[0];
    let one_rss: u64 = std::iter::once(hot)
        .chain(child_pids(hot))
        .map(|p| proc_kib(p, "status", "VmRSS:"))
        .sum();
    let n = supervisors.len() as f64;
    let pss: u64 = processes
        .iter()
        .map(|&p| proc_kib(p, "smaps_rollup", "Pss:"))
        .sum();
    let anon: u64 = processes
        .iter()
        .map(|&p| proc_kib(p, "smaps_rollup", "Anonymous:"))
        .sum();
    println!(
        "idle sandbox memory: RSS of one (supervisor + agent) {:.2} MiB | per sandbox of {} idle: PSS {:.2} MiB, private anonymous {:.2} MiB (target < 10 MiB; PSS ratio to target {:.2})",
        one_rss as f64 / 1024.0,
        supervisors.len(),
        pss as f64 / 1024.0 / n,
        anon as f64 / 1024.0 / n,
        pss as f64 / 1024.0 / n / 10.0
    );
    for i in 0..9 {
        cli(&["destroy", &format!("idle{i}")]);
    }
    runtime.block_on(engine.destroy("hot")).expect("destroy");

    report_pairs(
        &format!("dynocap ls after {AGEING_SANDBOXES} sandboxes came and went"),
        &listing,
        "dynocap --version",
    );
    // The command server keeps a supervisor standing by for as long as it lives.
    stop_command_servers(home_dir.path());
    let left = wait_for_supervisors_to_exit(home_dir.path(), Duration::from_secs(60));
    assert!(
        left.is_empty(),
        "supervisors {left:?} still running a minute after their sandboxes were destroyed"
    );
}

/// Over one MCP session: a `dynocap_job` poll of a running job (no wait, from the offsets the
/// last answer gave) beside the MCP round trip of `dynocap_ps`, alternately: what polling adds
/// per call is the poll's supervisor round trip and its reading of the job's output. Then
/// reading a 1 MiB text file whole with `dynocap_read_file` (two 512 KiB calls, its largest)
/// beside `dynocap_exec cat` of it (one call, output bound raised to the file's size).
fn mcp_tools(dynocap: &Path, home_env: &[(&str, &str)]) {
    let mcp = RefCell::new(McpSession::start(dynocap, home_env));
    mcp.borrow_mut()
        .call("dynocap_run", serde_json::json!({ "name": "poll" }));
    let started = mcp.borrow_mut().call(
        "dynocap_exec",
        serde_json::json!({ "name": "poll", "background": true, "timeoutSeconds": 3600,
                            "command": "while true; do echo tick; sleep 0.1; done" }),
    );
    let job = started["structuredContent"]["job"]
        .as_str()
        .expect("a job id")
        .to_owned();
    let mut offsets = (0u64, 0u64);
    let mut ticks = 0usize;
    let polling = pairs(
        CYCLES * 4,
        Duration::from_millis(50),
        || {},
        |_| {
            let report = mcp.borrow_mut().call(
                "dynocap_job",
                serde_json::json!({ "name": "poll", "job": job,
                                    "stdoutOffset": offsets.0, "stderrOffset": offsets.1 }),
            );
            let report = &report["structuredContent"];
            assert_eq!(report["running"], true, "{report}");
            ticks += report["stdout"]
                .as_str()
                .map_or(0, |out| out.matches("tick").count());
            offsets = (
                report["stdoutOffset"].as_u64().expect("an offset"),
                report["stderrOffset"].as_u64().expect("an offset"),
            );
        },
        |_| {
            mcp.borrow_mut().call("dynocap_ps", serde_json::json!({}));
        },
    );
    assert!(ticks > 0, "the polls read the job's output");
    report_pairs("dynocap_job poll via MCP", &polling, "dynocap_ps via MCP");
    let (poll, _) = median_and_p90(&polling.ours);
    let (floor, _) = median_and_p90(&polling.baseline);
    println!(
        "dynocap_job polling adds {:.2} ms per call over the MCP round trip (target < 5 ms)",
        (poll.as_secs_f64() - floor.as_secs_f64()) * 1e3
    );

    // Text, so that both sides carry it as UTF-8 in their JSON.
    let mb = 1024 * 1024;
    mcp.borrow_mut().call(
        "dynocap_exec",
        serde_json::json!({ "name": "poll",
                            "command": format!("yes 0123456789abcdef | head -c {mb} > /tmp/mb") }),
    );
    let reading = pairs(
        CYCLES,
        PAUSE,
        || {},
        |_| {
            let mut got = 0;
            while got < mb {
                let piece = mcp.borrow_mut().call(
                    "dynocap_read_file",
                    serde_json::json!({ "name": "poll", "path": "/tmp/mb", "offset": got,
                                        "length": 512 * 1024 }),
                );
                let length = piece["structuredContent"]["length"]
                    .as_u64()
                    .expect("a length");
                assert!(length > 0, "{piece}");
                got += length;
            }
        },
        |_| {
            let result = mcp.borrow_mut().call(
                "dynocap_exec",
                serde_json::json!({ "name": "poll", "command": "cat /tmp/mb",
                                    "maxOutputBytes": mb }),
            );
            let out = result["structuredContent"]["stdout"]
                .as_str()
                .expect("stdout");
            assert_eq!(out.len() as u64, mb, "cat's whole output");
        },
    );
    mcp.borrow_mut()
        .call("dynocap_destroy", serde_json::json!({ "name": "poll" }));
    drop(mcp);
    report_pairs(
        "dynocap_read_file of 1 MiB (2 calls) via MCP",
        &reading,
        "dynocap_exec cat of it via MCP",
    );
    println!("target: dynocap_read_file at most 2x dynocap_exec cat");
}

/// Each command's times in the CLI cycles.
#[derive(Default)]
struct CommandTimes {
    run: Vec<Duration>,
    exec: Vec<Duration>,
    destroy: Vec<Duration>,
}

fn median_ms(times: &[Duration]) -> f64 {
    median_and_p90(times).0.as_secs_f64() * 1e3
}
