//! `dynocap-core`: the binary that does the work, which the thin `dynocap` client runs or
//! hands commands to (through a `cli-server` of this binary). Parses the command line and
//! hands off to the command modules; `supervise` and `cli-server` are dispatched before any
//! thread exists, because both fork children that run Rust code.

mod cache_commands;
mod cli;
mod cli_server;
mod commands;
mod config;
mod cp_commands;
mod docs;
mod doctor;
mod exec_output;
mod fork_commands;
mod image_commands;
mod jail_pool_commands;
mod job_commands;
mod logging;
mod mcp;
mod output;
mod port_commands;
mod recipe_file;
mod scrub_args;
mod task_commands;
mod terminal;
mod wording;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(err) => return output::argument_error(&err, &args),
    };
    match &cli.command {
        cli::Command::Completions(args) => return docs::completions(args.shell),
        cli::Command::Man => return docs::man_page(),
        _ => {}
    }
    // Every setting, from this process's environment: read here once, for whatever the
    // command is, and passed down.
    let settings = match config::from_env() {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("dynocap: {err}");
            return ExitCode::FAILURE;
        }
    };
    // Each forks children that run Rust code, or must run first: before any other thread.
    match &cli.command {
        cli::Command::CliServer(server) => return cli_server::serve(&server.socket, settings),
        cli::Command::Supervise(args) => return commands::supervise(args, settings),
        cli::Command::Doctor(args) if args.repair => {
            return output::ended(doctor::repair(cli.json, &settings.engine))
        }
        cli::Command::Doctor(_) => return output::ended(doctor::run(cli.json, &settings.engine)),
        cli::Command::JailPool(command) => {
            return output::ended(jail_pool_commands::run(cli.json, command, &settings.engine))
        }
        _ => {}
    }
    // One thread for every command, the MCP server included: a command is one request, for
    // which no worker threads need spawning and parking; the server runs every tool call on
    // one thread anyway (the engine's futures are not `Send`, see `mcp::local`), and running
    // the SDK's tasks on workers beside it cost a cross-thread wake-up at each hop of every
    // message (stdin, SDK, call, SDK, stdout). Concurrent calls interleave at their awaits;
    // heavy work runs on the blocking pool.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("dynocap: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(commands::dispatch(cli, settings));
    // `dynocap mcp` may leave a blocking stdin read behind (tokio cannot cancel it): do not
    // wait for input that will never come.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    // Only now, the command's work done: a closed stdout ends it as SIGPIPE would have.
    output::ended(code)
}
