//! `dynocap mcp`: the MCP server over stdio that Claude Desktop, Cursor, Cline and other
//! clients start. Stdout carries the protocol only; logs go to stderr and, with `--log-file
//! PATH` or `DYNOCAP_MCP_LOG=1` (`$DYNOCAP_HOME/logs/mcp.log`), to a file.
//!
//! Layout: `server` and `admission` (which client messages reach the SDK) are the only modules
//! that name the MCP SDK; `tools` (definitions and schemas), `args` (strict argument parsing),
//! `calls` (what each tool does), `policy` (the host security rules), `progress`, `stdio`
//! (framing), `jsonrpc` (envelopes and error replies) and `log` are SDK-free.

mod admission;
mod args;
mod calls;
mod files;
mod jsonrpc;
mod local;
mod log;
mod output;
pub mod policy;
mod ports;
mod progress;
mod server;
mod stdio;
pub mod tools;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use dynocap_engine::{Engine, Home};

use crate::config::Settings;

use self::log::Log;
use self::policy::{Policy, PolicyInputs};

/// Options of `dynocap mcp`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Append the log to this file as well as stderr.
    pub log_file: Option<PathBuf>,
}

/// Runs the server until the client closes stdin.
pub async fn run(options: Options, settings: Settings) -> ExitCode {
    let Settings {
        engine: config,
        log: log_settings,
        mcp,
        cli_server_idle: _,
    } = settings;
    let log = Log::stderr();
    log.install_tracing(&log_settings);
    let home = match Home::from_config(&config.home) {
        Ok(home) => home,
        Err(err) => {
            log.warn(format_args!("cannot start: {err}"));
            return ExitCode::FAILURE;
        }
    };
    let file = options.log_file.clone().or_else(|| {
        // `DYNOCAP_MCP_LOG=1`: also log to the home's `logs/mcp.log`.
        (mcp.log.as_deref() == Some("1")).then(|| home.root().join("logs/mcp.log"))
    });
    if let Some(path) = file {
        if let Err(err) = log.open_file(&path) {
            log.warn(format_args!(
                "cannot open the log file {}: {err}; logging to stderr only",
                path.display()
            ));
        }
    }
    let policy = Policy::new(&PolicyInputs::from_process(&mcp, &config), &mut |warning| {
        log.warn(format_args!("policy: {warning}"));
    });
    log.info(format_args!(
        "dynocap {} serving MCP on stdio; DYNOCAP_HOME={}{}",
        env!("CARGO_PKG_VERSION"),
        home.root().display(),
        log.file_path()
            .map(|p| format!("; log file {}", p.display()))
            .unwrap_or_default()
    ));
    log.info(format_args!("policy: {}", policy.summary()));
    // A mistyped ceiling would otherwise surface only at the first start, as a caller's error.
    match dynocap_engine::ceilings::Ceilings::from_config(&config.ceilings) {
        Ok(ceilings) => log.info(format_args!(
            "ceilings: {}",
            ceilings
                .entries()
                .iter()
                .map(|(var, value, _)| format!("{var}={value}"))
                .collect::<Vec<_>>()
                .join(" ")
        )),
        Err(err) => {
            log.warn(format_args!("cannot start: {err}"));
            return ExitCode::FAILURE;
        }
    }
    let engine = match Engine::new(home, config) {
        Ok(engine) => engine,
        Err(err) => {
            log.warn(format_args!("cannot start: {err}"));
            return ExitCode::FAILURE;
        }
    };
    // A warm pool (DYNOCAP_WARM_POOL) boots now, in the background, for the first `run`.
    if let Err(err) = engine.top_up_pool() {
        log.warn(format_args!("warm pool: {err}"));
    }
    // A server starts many sandboxes: each `run` that needs a new supervisor takes one that
    // is already running, idle, instead of waiting for a process to start.
    engine.keep_a_standby_supervisor();
    let wait_bound = wait_bound(mcp.wait_seconds.as_deref(), &log);
    let tools =
        Arc::new(calls::Tools::new(engine, policy, log.clone()).with_wait_bound(wait_bound));
    // The engine's futures are not Send: they run in a LocalSet, beside the SDK's tasks on
    // the same (current-thread) runtime.
    let (dispatcher, jobs) = local::Dispatcher::new(tools);
    let local = tokio::task::LocalSet::new();
    let served = local
        .run_until(async {
            let executor = tokio::task::spawn_local(local::execute(jobs));
            let served = server::serve(dispatcher, log.clone()).await;
            executor.abort();
            served
        })
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            log.warn(err);
            ExitCode::FAILURE
        }
    }
}

/// `DYNOCAP_MCP_WAIT_SECONDS` (1 to the longest a job request waits), else the default, with a
/// warning in the log for a value that is not one.
fn wait_bound(raw: Option<&str>, log: &log::Log) -> std::time::Duration {
    let max = dynocap_engine::jobs::JOB_WAIT_MAX_SECONDS;
    let seconds = match raw.map(|v| v.trim().parse::<u64>()) {
        None => calls::WAIT_SECONDS_DEFAULT,
        Some(Ok(n)) if (1..=max).contains(&n) => n,
        Some(_) => {
            log.warn(format_args!(
                "DYNOCAP_MCP_WAIT_SECONDS={:?} is not a number of seconds from 1 to {max}; using {}",
                raw.unwrap_or_default(),
                calls::WAIT_SECONDS_DEFAULT
            ));
            calls::WAIT_SECONDS_DEFAULT
        }
    };
    log.info(format_args!(
        "exec calls wait up to {seconds}s, then answer with their job"
    ));
    std::time::Duration::from_secs(seconds)
}
