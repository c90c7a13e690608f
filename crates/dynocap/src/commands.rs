//! One function per subcommand: turn parsed arguments into engine calls and print results.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::process::ExitCode;

use dynocap_engine::catalog::Kind;
use dynocap_engine::spec::{ExecSpec, RunSpec};
use dynocap_engine::{Config, Engine, Error, ExecResult, Home};

use crate::cli::{Cli, Command, ExecArgs, RunArgs, SuperviseArgs};
use crate::config::Settings;
use crate::output::{
    fail, print_json, sandbox_notes, sandbox_rows, sayln, table, Streams, SANDBOX_HEADERS,
};

pub async fn dispatch(cli: Cli, settings: Settings) -> ExitCode {
    let json = cli.json;
    let result = match cli.command {
        Command::Doctor(_)
        | Command::JailPool(_)
        | Command::Supervise(_)
        | Command::CliServer(_)
        | Command::Completions(_)
        | Command::Man => {
            unreachable!(
                "doctor, jail-pool, supervise, cli-server, completions and man are dispatched \
                 before the runtime starts"
            )
        }
        Command::Mcp(args) => {
            let options = crate::mcp::Options {
                log_file: args.log_file,
            };
            return crate::mcp::run(options, settings).await;
        }
        command => with_engine(json, command, settings.engine).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => fail(json, &err),
    }
}

async fn with_engine(json: bool, command: Command, config: Config) -> Result<ExitCode, Error> {
    let engine = Engine::new(Home::from_config(&config.home)?, config)?;
    if is_served(&command) {
        let code = run_served(&engine, json, command, &Streams::of_process()).await;
        return Ok(ExitCode::from(code));
    }
    match command {
        Command::Task(command) => crate::task_commands::task(&engine, json, command).await,
        Command::Image(command) => crate::image_commands::image(engine, json, command).await,
        Command::Ls => crate::task_commands::ls(&engine, json),
        Command::Job(args) => crate::job_commands::job(&engine, json, args).await,
        Command::Cp(args) => crate::cp_commands::cp(&engine, json, args).await,
        Command::Port(args) => crate::port_commands::port(&engine, json, args).await,
        Command::Rm(args) => crate::task_commands::rm(&engine, json, args).await,
        Command::Cache(command) => crate::cache_commands::cache(&engine, json, command),
        Command::Pool(args) => {
            let (verb, count) = if args.drain {
                ("drained", engine.drain_pool().await?)
            } else {
                ("started", engine.top_up_pool()?)
            };
            let status = engine.pool_status()?;
            if json {
                print_json(&serde_json::json!({ verb: count, "pool": status }));
            } else {
                sayln!(
                    "{verb} {count}; warm pool: {} ready, {} booting, target {} ({})",
                    status.ready,
                    status.warming,
                    status.target,
                    dynocap_engine::pool::POOL_ENV
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(_) | Command::Exec(_) | Command::Destroy(_) | Command::Ps => {
            unreachable!("served commands are run above")
        }
        Command::Doctor(_)
        | Command::JailPool(_)
        | Command::Supervise(_)
        | Command::CliServer(_)
        | Command::Mcp(_)
        | Command::Completions(_)
        | Command::Man => {
            unreachable!("handled by dispatch")
        }
    }
}

/// The commands the command server runs in its own process (see `cli_server`): the ones a
/// sandbox's cycle is made of. Their whole output goes through [`Streams`], and none reads
/// the working directory, stdin or the terminal's process group.
pub fn is_served(command: &Command) -> bool {
    matches!(
        command,
        Command::Run(_) | Command::Exec(_) | Command::Destroy(_) | Command::Ps
    )
}

/// Runs a command [`is_served`] says is served, writing to `streams`: its exit code.
pub async fn run_served(engine: &Engine, json: bool, command: Command, streams: &Streams) -> u8 {
    let result = match command {
        Command::Run(args) => run(engine, json, args, streams).await,
        Command::Exec(args) => {
            exec(
                engine,
                json,
                &args.name,
                args.cwd.as_deref(),
                args.exec,
                false,
                streams,
            )
            .await
        }
        Command::Destroy(args) => engine.destroy(&args.name).await.map(|destroyed| {
            if json {
                streams.json(&serde_json::json!({ "destroyed": destroyed }));
            } else {
                streams
                    .stdout()
                    .write_str(&format!("destroyed {destroyed}\n"));
            }
            0
        }),
        Command::Ps => engine.ps().map(|sandboxes| {
            if json {
                streams.json(&serde_json::json!({ "sandboxes": sandboxes }));
            } else {
                streams.stdout().write_str(&format!(
                    "{}{}",
                    table(SANDBOX_HEADERS, &sandbox_rows(&sandboxes)),
                    sandbox_notes(&sandboxes)
                ));
            }
            0
        }),
        other => Err(Error::internal(format!(
            "{other:?} is not a served command"
        ))),
    };
    let code = result.unwrap_or_else(|err| streams.fail(json, &err));
    // The work is done whoever read: a closed stdout ends it as SIGPIPE would have.
    if streams.stdout().reader_gone() {
        crate::exec_output::READER_GONE_EXIT
    } else {
        code
    }
}

async fn run(engine: &Engine, json: bool, args: RunArgs, streams: &Streams) -> Result<u8, Error> {
    let mut spec = RunSpec::raw(
        &args.name,
        args.network.as_deref(),
        args.ttl_seconds,
        args.cpus,
        args.memory_mb,
        args.disk_mb,
    )?;
    spec.allow_hosts = args.allow_hosts;
    let say = |line: &str| streams.stderr().write_str(&format!("{line}\n"));
    crate::image_commands::pull_for_start(engine, args.image.as_deref(), args.pull, &say).await?;
    spec.image = args.image;
    spec.backend = args.backend;
    spec.kernel = args.kernel;
    let publish = args.publish.clone();
    Engine::check_publish(&publish)?;
    // Its supervisor starts up while the checks and the catalog work below run.
    engine.start_a_standby_supervisor(&spec);
    let mut info = engine.run(&spec).await?;
    info.forwards = engine.publish(&info.name, &publish).await?;
    if json {
        streams.json(&info);
    } else {
        streams.stdout().write_str(&format!(
            "{}{}",
            table(SANDBOX_HEADERS, &sandbox_rows(std::slice::from_ref(&info))),
            crate::port_commands::forward_lines(&info.name, &info.forwards)
        ));
    }
    Ok(0)
}

/// `exec` and `task exec`: same flags, different default cwd and target kind.
pub async fn exec(
    engine: &Engine,
    json: bool,
    target: &str,
    cwd: Option<&str>,
    args: ExecArgs,
    task: bool,
    streams: &Streams,
) -> Result<u8, Error> {
    let env = args
        .env
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| Error::invalid(format!("--env {pair:?} must be KEY=VALUE")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let command = shell_command(&args.command);
    let default_cwd = if task { "/workspace" } else { "/" };
    let spec = ExecSpec::new(
        &command,
        cwd,
        default_cwd,
        env,
        args.timeout_seconds,
        args.tty,
    )?;
    if args.background {
        let kind = if task { Kind::Task } else { Kind::Raw };
        let mut report = engine
            .exec_job(kind, target, &spec, std::time::Duration::ZERO, None)
            .await?;
        if let Some(err) = report.error.take() {
            return Err(err);
        }
        if json {
            streams.json(&serde_json::json!({ "job": report.job, "running": true }));
        } else {
            streams.stdout().write_str(&format!("{}\n", report.job));
            streams.stderr().write_str(&format!(
                "dynocap: started {job} in {target}; follow it with: dynocap job {target} {job} --follow\n",
                job = report.job
            ));
        }
        return Ok(0);
    }
    if json || args.tty {
        // One result object, or a rendered screen: the bounded excerpt, as MCP gets it.
        let result = if task {
            engine.task_exec(target, &spec).await?
        } else {
            engine.exec(target, &spec).await?
        };
        if json {
            streams.json(&result);
        } else {
            print_transcript(streams, &result, spec.timeout_seconds, args.raw);
        }
        return Ok(exit_code_of(&result));
    }
    // Everything the command prints, as it prints it; the result's excerpt is not shown.
    let live = crate::exec_output::LiveOutput::new(streams, args.raw);
    let on_output = |channel, data: &[u8]| live.write(channel, data);
    let running = async {
        if task {
            engine.task_exec_streaming(target, &spec, &on_output).await
        } else {
            engine.exec_streaming(target, &spec, &on_output).await
        }
    };
    let result = tokio::select! {
        result = running => result,
        () = live.reader_gone() => return Ok(crate::exec_output::READER_GONE_EXIT),
    };
    live.finish();
    let result = result?;
    print_end_notes(streams, &result, spec.timeout_seconds);
    Ok(exit_code_of(&result))
}

/// `--tty`: the rendered screen on stdout, neutralised on a terminal unless `raw` (see
/// `terminal.rs`), with a note when only its head and tail were kept.
fn print_transcript(streams: &Streams, result: &ExecResult, timeout_seconds: u64, raw: bool) {
    let transcript = result.transcript.as_deref().unwrap_or("");
    let stdout = streams.stdout();
    if raw || !stdout.is_terminal() {
        stdout.write_str(transcript);
    } else {
        stdout.write_str(&crate::terminal::neutralise(transcript));
    }
    if result.truncated {
        streams.stderr().write_str(
            "dynocap: the transcript was cut to its head and tail; the [… bytes omitted …] line says how much is missing\n",
        );
    }
    print_end_notes(streams, result, timeout_seconds);
}

/// How the command ended, when its exit code alone does not say it, and the connections the
/// sandbox's network refused meanwhile.
fn print_end_notes(streams: &Streams, result: &ExecResult, timeout_seconds: u64) {
    if result.timed_out {
        streams.stderr().write_str(&format!(
            "dynocap: command timed out after {timeout_seconds}s; its process group was killed\n"
        ));
    }
    streams
        .stderr()
        .write_str(&crate::exec_output::refusal_notes(result));
}

/// The shell's conventions: the exit code, 128+N for signal N, 124 for a timeout.
fn exit_code_of(result: &ExecResult) -> u8 {
    if result.timed_out {
        return 124;
    }
    if let Some(code) = result.exit_code {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    let signal = result
        .signal
        .as_deref()
        .and_then(|name| name.parse::<nix::sys::signal::Signal>().ok())
        .map_or(1, |s| s as i32);
    u8::try_from(128 + signal).unwrap_or(255)
}

pub fn supervise(args: &SuperviseArgs, settings: Settings) -> ExitCode {
    let config = settings.engine;
    // What the starter passed on descriptors, as it announced in the environment: taken out
    // of it first (nothing this process starts may be told of descriptors it does not have),
    // while no other thread exists to read the environment meanwhile.
    let inherited = dynocap_engine::supervisor::Inherited {
        project_fd: take_env(dynocap_engine::workspace::PROJECT_FD_ENV),
        credentials_fd: take_env(dynocap_engine::supervisor::CREDENTIALS_FD_ENV),
    };
    let home = match Home::at(args.home.clone()) {
        Ok(home) => home,
        Err(err) => {
            eprintln!("dynocap supervise: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mode = if args.recover {
        dynocap_engine::supervisor::Mode::Recover {
            include_generated: args.include_generated,
        }
    } else {
        dynocap_engine::supervisor::Mode::Start
    };
    // `prepared_disk`: whether a standby could start making its disk ahead, reported once
    // its log is open (the making itself reports its failure when the start waits for it).
    let (catalog, id, ready, prepared_disk) = match (&args.id, args.ready_fd, args.standby_fd) {
        (Some(id), Some(ready_fd), None) => {
            // SAFETY: the starter gave us the ready pipe on this descriptor and nothing else
            // in this process has taken ownership of it.
            (
                None,
                id.clone(),
                unsafe { OwnedFd::from_raw_fd(ready_fd) },
                None,
            )
        }
        (None, None, Some(orders_fd)) => {
            // First: the disk is made beside everything else, up to the start that takes it.
            let prepared = args
                .prepare_disk
                .then(|| dynocap_engine::backend::start_preparing_default_start(&home, &config));
            // Opened while nothing waits on it; a failure here is the supervisor's to report
            // once it has its sandbox.
            let catalog = dynocap_engine::catalog::Catalog::open(&home).ok();
            match await_standby_order(orders_fd) {
                Some((id, ready)) => (catalog, id, ready, prepared),
                None => return ExitCode::SUCCESS,
            }
        }
        // clap's rules on the arguments admit nothing else.
        _ => {
            eprintln!("dynocap supervise: give --id and --ready-fd, or --standby-fd alone");
            return ExitCode::FAILURE;
        }
    };
    // Stderr is the sandbox's log file now (see `Sandboxes::spawn_supervisor`; a standby's
    // was `/dev/null` until its order), where a mistyped DYNOCAP_LOG is reported first.
    crate::logging::init(&settings.log, std::io::stderr);
    match prepared_disk {
        Some(Ok(())) => tracing::debug!("the standby is making the default start's disk ahead"),
        Some(Err(err)) => tracing::info!("the standby could not make a disk ahead: {err}"),
        None => {}
    }
    match dynocap_engine::supervisor::main(home, catalog, &id, ready, mode, config, inherited) {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}

/// The variable `name`, removed from this process's environment.
fn take_env(name: &str) -> Option<std::ffi::OsString> {
    // Taken out so that nothing this process starts is told of a descriptor it lacks.
    // env-read-ok: a descriptor the starter handed over, not a setting.
    let value = std::env::var_os(name);
    std::env::remove_var(name);
    value
}

/// A standby's wait for its sandbox (see the engine's `standby`): the id and ready pipe, once
/// its log is this process's stdout and stderr; `None` when the starter went away first, or
/// sent something else (said on stderr, which is `/dev/null` until an order comes).
fn await_standby_order(orders_fd: i32) -> Option<(String, OwnedFd)> {
    // SAFETY: the starter gave us the orders socket on this descriptor and nothing else in
    // this process has taken ownership of it.
    let orders = unsafe { OwnedFd::from_raw_fd(orders_fd) };
    let order = match dynocap_engine::standby::await_order(orders.as_fd()) {
        Ok(Some(order)) => order,
        Ok(None) => return None,
        Err(err) => {
            eprintln!("dynocap supervise: {err}");
            return None;
        }
    };
    // Nothing started from here on may hold the socket: the starter's end is what ends the
    // next standby, not this one.
    drop(orders);
    if let Err(err) =
        nix::unistd::dup2_stdout(&order.log).and_then(|()| nix::unistd::dup2_stderr(&order.log))
    {
        // The ready pipe tells the starter; the log could not.
        dynocap_engine::supervisor::report_failed_start(
            order.ready,
            Error::internal(format!(
                "pointing the supervisor's output at its log: {err}"
            )),
        );
        return None;
    }
    Some((order.id, order.ready))
}

/// The `sh -c` command for the words after `--`: one word is a shell command as it stands
/// (`-- 'make && make test'`); several are a program and its arguments, each quoted so that
/// it arrives as given (`-- printf '%s\n' 'a b'`), as `docker exec` and `kubectl exec` do.
fn shell_command(words: &[String]) -> String {
    match words {
        [single] => single.clone(),
        words => words
            .iter()
            .map(|word| shell_quote(word))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// `word` in single quotes, each `'` in it written as `'\''`.
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod command_tests {
    use super::*;

    #[test]
    fn several_words_are_quoted_one_word_is_shell() {
        let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            shell_command(&words(&["make && make test"])),
            "make && make test"
        );
        assert_eq!(
            shell_command(&words(&["printf", "%s\\n", "a b", "it's"])),
            r"'printf' '%s\n' 'a b' 'it'\''s'"
        );
    }
}
