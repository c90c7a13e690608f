//! What the thin `dynocap` client and the command server in `dynocap-core` must agree on:
//! where a home's server listens ([`rendezvous`]) and what crosses its socket ([`wire`]).
//!
//! Why there is a server at all: a command through `dynocap-core` alone pays for starting an
//! 11 MB binary (dynamic loading, relocation, page faults: about 2.3 ms, most of a `destroy`),
//! three times in a `run` + `exec` + `destroy` cycle. The server is a process that has paid it
//! once: it runs the client's command on a thread of its own, with the client's stdout,
//! stderr, environment and umask, and sends back its exit status. (A fork of the server per command saves nothing: the forked process pays
//! the same page faults and teardown as a new one, measured at 2.2 against 2.2 ms for `ps`.)

pub mod rendezvous;
pub mod wire;

/// The binary that does the work, installed beside `dynocap`.
pub const CORE_BINARY: &str = "dynocap-core";

/// `DYNOCAP_CLI_SERVER=0` runs every command in a `dynocap-core` process of its own, and
/// starts no server.
pub const SERVER_SWITCH_ENV: &str = "DYNOCAP_CLI_SERVER";

/// The hidden subcommand of `dynocap-core` that serves a home's commands.
pub const SERVER_SUBCOMMAND: &str = "cli-server";
