//! What the thin `dynocap` client and the command server in `dynocap-core` must agree on:
//! where a home's server listens ([`rendezvous`]) and what crosses its socket ([`wire`]).
//!
//! Why there is a server at all: a command through `dynocap-core` alone pays for starting an
//! large binary (dynamic loading, relocation, page faults: most of a `destroy`), three times in
//! a `run` + `exec` + `destroy` cycle. The server is a process that has paid it once: it runs
//! the client's command on a thread of its own, with the client's stdout, stderr, environment
//! and umask, and sends back its exit status. (A fork of the server per command saves
//! nothing: the forked process pays the same page faults and teardown as a new one.)

pub mod attributes;
pub mod rendezvous;
pub mod wire;

/// The binary that does the work, installed beside `dynocap`.
pub const CORE_BINARY: &str = "dynocap-core";

/// `DYNOCAP_CLI_SERVER=0` runs every command in a `dynocap-core` process of its own, and
/// starts no server.
pub const SERVER_SWITCH_ENV: &str = "DYNOCAP_CLI_SERVER";

/// The hidden subcommand of `dynocap-core` that serves a home's commands.
pub const SERVER_SUBCOMMAND: &str = "cli-server";

/// `DYNOCAP_CLI_SERVER_DEADLINE_MS`: how long, in milliseconds, a client waits for its server
/// to accept a command, and how long it waits without a word from the server while its
/// command runs (see [`deadline`]).
pub const DEADLINE_ENV: &str = "DYNOCAP_CLI_SERVER_DEADLINE_MS";

/// The default of [`DEADLINE_ENV`].
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// The deadline [`DEADLINE_ENV`] sets, at least 100 ms; [`DEADLINE`] if it is unset or not a
/// whole number. The server reads the same variable (a client and its server share their
/// environment) and says it is alive five times within it.
pub fn deadline() -> std::time::Duration {
    std::env::var(DEADLINE_ENV)
        .ok()
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map_or(DEADLINE, |ms| std::time::Duration::from_millis(ms.max(100)))
}
