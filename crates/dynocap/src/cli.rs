//! The command line: every subcommand, flag and default, in one place.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dynocap",
    version,
    about = "Isolated Linux sandboxes for coding agents"
)]
pub struct Cli {
    /// Print results as JSON objects (CONTRACT.md) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot a raw sandbox: a bare, ephemeral Linux box.
    Run(RunArgs),
    /// Run a shell command in a raw sandbox; exits with the command's exit code.
    Exec(ExecArgs),
    /// List raw sandboxes.
    Ps,
    /// Destroy a raw sandbox and release its name.
    Destroy(TargetArgs),
    /// Work on a copy of a project: start, exec, diff, finish.
    #[command(subcommand)]
    Task(TaskCommand),
    /// List tasks (live and retained) and raw sandboxes.
    Ls,
    /// Release a task's name; --purge deletes its results, --force ends it if running.
    Rm(RmArgs),
    /// Serve the MCP tools over stdio (for Claude Desktop, Cursor, Cline, ...).
    Mcp(McpArgs),
    /// Report what this machine supports and what to install or enable; --repair rebuilds a
    /// damaged catalog.
    Doctor(DoctorArgs),
    /// Internal: run a sandbox's supervisor (started by `run`).
    #[command(hide = true)]
    Supervise(SuperviseArgs),
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Copy a project into a new task sandbox at /workspace.
    Start(TaskStartArgs),
    /// Run a shell command in the task's workspace; exits with the command's exit code.
    Exec(ExecArgs),
    /// Show what the agent changed, with risky paths flagged.
    Diff(TargetArgs),
    /// End the task: final diff, sandbox destroyed, patch verified and saved.
    Finish(TargetArgs),
}

#[derive(Debug, Args)]
pub struct TaskStartArgs {
    /// The project directory (default: the current directory).
    pub path: Option<std::path::PathBuf>,
    /// A git URL to clone instead of a local project.
    #[arg(long = "repo", value_name = "URL", conflicts_with = "path")]
    pub repository_url: Option<String>,
    /// Task name (default: none; the id always works).
    #[arg(long)]
    pub name: Option<String>,
    /// How much git history comes: branches (default), head or none.
    #[arg(long, value_name = "branches|head|none")]
    pub history: Option<String>,
    /// Network mode (default none).
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// Lifetime in seconds (30 to 86400, default 1800); at expiry the task is finished.
    #[arg(long = "ttl", value_name = "SECONDS")]
    pub ttl_seconds: Option<u64>,
    /// CPU quota in whole CPUs (default 2).
    #[arg(long)]
    pub cpus: Option<u64>,
    /// Memory limit in MiB, no swap (default 1024).
    #[arg(long = "memory-mb", value_name = "MB")]
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// Task name or id.
    pub name: String,
    /// End the task first if it is still running (its patch and logs are kept).
    #[arg(long)]
    pub force: bool,
    /// Also delete the task's record and its results directory.
    #[arg(long)]
    pub purge: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Sandbox name: 1-63 characters from a-z, 0-9, '_', '.', '-'.
    pub name: String,
    /// Lifetime in seconds (30 to 86400); the sandbox is destroyed when it ends.
    #[arg(long = "ttl", value_name = "SECONDS")]
    pub ttl_seconds: Option<u64>,
    /// CPU quota in whole CPUs (default 1).
    #[arg(long)]
    pub cpus: Option<u64>,
    /// Memory limit in MiB, no swap (default 1024).
    #[arg(long = "memory-mb", value_name = "MB")]
    pub memory_mb: Option<u64>,
    /// Network mode (default none: loopback only).
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox or task name (or id).
    pub name: String,
    /// Working directory inside the sandbox (default / for sandboxes, /workspace for tasks).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment variable for the command, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Deadline in seconds (default 30); the command's process group is killed at it.
    #[arg(long = "timeout", value_name = "SECONDS")]
    pub timeout_seconds: Option<u64>,
    /// Run in a 24x80 pseudo-terminal and print the screen transcript.
    #[arg(long)]
    pub tty: bool,
    /// The command, run with `sh -c`; several words are joined with spaces.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Name (or id).
    pub name: String,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Instead of the checks: rebuild a damaged catalog from the record files in the results
    /// and sandbox directories (the damaged files are moved aside, never deleted). A healthy
    /// catalog is left as it is.
    #[arg(long)]
    pub repair: bool,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Also append the server's log to this file (DYNOCAP_MCP_LOG=1 picks
    /// $DYNOCAP_HOME/logs/mcp.log). Stdout carries the protocol only; logs go to stderr.
    #[arg(long = "log-file", value_name = "PATH")]
    pub log_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct SuperviseArgs {
    #[arg(long)]
    pub home: std::path::PathBuf,
    #[arg(long)]
    pub id: String,
    #[arg(long = "ready-fd")]
    pub ready_fd: i32,
}
