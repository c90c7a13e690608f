//! The command line: every subcommand, flag and default, in one place, and how a command line
//! that does not parse is explained.

use std::ffi::OsString;
use std::num::IntErrorKind;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dynocap",
    version,
    about = "Isolated Linux sandboxes for coding agents"
)]
pub struct Cli {
    /// Print results as JSON objects (those the MCP tools return) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot a raw sandbox: a bare, ephemeral Linux box.
    Run(RunArgs),
    /// Run a shell command in a raw sandbox; exits with the command's exit code (for a task:
    /// `dynocap task exec`).
    Exec(SandboxExecArgs),
    /// List raw sandboxes.
    Ps,
    /// A sandbox's or task's jobs (commands started with --background, or MCP execs that ran
    /// past the server's wait bound): list them, show or --follow one, or --kill it.
    Job(JobArgs),
    /// Copy files and directories out of or into a sandbox or task, as docker cp: `dynocap
    /// cp NAME:GUESTPATH HOSTPATH`, `dynocap cp HOSTPATH NAME:GUESTPATH` (`SRC/.` copies a
    /// directory's contents).
    Cp(CpArgs),
    /// Forward a host port to a port inside a sandbox or task (`dynocap port NAME 8000`
    /// listens on a free 127.0.0.1 port and prints it), list its forwards (no GUESTPORT),
    /// or --remove one.
    Port(crate::port_commands::PortArgs),
    /// Destroy a raw sandbox and release its name.
    Destroy(TargetArgs),
    /// Show the warm pool (DYNOCAP_WARM_POOL=N keeps N sandboxes booted for `run` to
    /// claim), top it up, or --drain it.
    Pool(PoolArgs),
    /// Work on a copy of a project: start, exec, diff, finish.
    #[command(subcommand)]
    Task(TaskCommand),
    /// List tasks (live and retained) and raw sandboxes.
    Ls,
    /// Release a task's name; --purge deletes its results, --force ends it if running.
    Rm(RmArgs),
    /// The projects' package caches (pip, npm, cargo, go, apt) that a project's tasks share:
    /// ls, rm.
    #[command(subcommand)]
    Cache(crate::cache_commands::CacheCommand),
    /// Serve the MCP tools over stdio (for Claude Desktop, Cursor, Cline, ...).
    Mcp(McpArgs),
    /// Report what this machine supports and what to install or enable; --repair rebuilds a
    /// damaged catalog.
    Doctor(DoctorArgs),
    /// The home's reflink pool (DYNOCAP_JAIL_POOL_MB: an XFS image mounted on the home's
    /// sandboxes/, where jail checkpoints and forks clone): show it, or rm it.
    #[command(subcommand, name = "jail-pool")]
    JailPool(JailPoolCommand),
    /// Build, import, list and remove guest images (`dynocap image build debian`).
    #[command(subcommand)]
    Image(ImageCommand),
    /// Print a completion script for a shell: `dynocap completions bash > /etc/bash_completion.d/dynocap`.
    Completions(CompletionsArgs),
    /// Print the manual page (roff): `dynocap man | man -l -`.
    Man,
    /// Internal: run a sandbox's supervisor (started by `run`).
    #[command(hide = true)]
    Supervise(SuperviseArgs),
    /// Internal: serve a home's commands to the `dynocap` client (started by it).
    #[command(hide = true, name = "cli-server")]
    CliServer(CliServerArgs),
}

/// `dynocap jail-pool` (see `jail_pool_commands`).
#[derive(Debug, Subcommand)]
pub enum JailPoolCommand {
    /// Show the pool: its image and size, whether it is mounted, its used and free room, and
    /// the sandboxes on it.
    Show,
    /// Unmount the pool and delete its image, giving its room back to the home's filesystem;
    /// refused, naming them, while sandboxes live on it. With DYNOCAP_JAIL_POOL_MB still set,
    /// the next start makes it again (of that size).
    Rm,
}

#[derive(Debug, Args)]
pub struct CliServerArgs {
    /// The socket to listen on, in the home's `run/` directory.
    #[arg(long)]
    pub socket: std::path::PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build an image: debian (Debian bookworm with git, curl, python3, build-essential and
    /// the cloud kernel, made with mmdebstrap), or NAME from a recipe: --from BASE with steps
    /// run inside a jail sandbox of BASE as its root (--copy, --env, --apt, --run; in that
    /// order, each in the order given), or the steps of --file recipe.toml in its order.
    /// Content-addressed: a built recipe is reused.
    Build(ImageBuildArgs),
    /// Import an OCI image layout directory (skopeo copy … oci:DIR, podman save --format
    /// oci-dir) or a `docker save` archive as an image both backends boot (the vm backend
    /// with the kernel of a built debian image, as container images carry none).
    Import(ImageImportArgs),
    /// Pull an image from a registry over HTTPS (registry.example/team/tool:1, or
    /// …@sha256:…), only from the registries in DYNOCAP_REGISTRIES; layers are stored once
    /// and shared between images. Credentials: --username/--password-stdin or the Docker
    /// config file; never stored.
    Pull(ImagePullArgs),
    /// List the images on this host (built, imported and pulled): source, size, bytes shared
    /// with other images, and the sandboxes using each.
    Ls,
    /// Show one image: its source, size, users and its config (Env, WorkingDir, User,
    /// Entrypoint, Cmd; only Env and WorkingDir are applied, nothing is ever run).
    Inspect(ImageNameArgs),
    /// Remove an image (by name: its newest build; or by id) and the layers no other image
    /// uses; refused while a live sandbox uses it.
    Rm(ImageNameArgs),
}

#[derive(Debug, Args)]
pub struct ImagePullArgs {
    /// The image: registry/repository:tag or registry/repository@sha256:digest.
    #[arg(value_name = "REF")]
    pub reference: String,
    /// The image's name (default: the reference as given).
    #[arg(long)]
    pub name: Option<String>,
    /// The registry user (with --password-stdin); default: the Docker config file's entry.
    #[arg(long, requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the password from standard input (its first line).
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// Refuse an image whose files add up to more than this many bytes.
    #[arg(long, default_value_t = 16 << 30)]
    pub max_bytes: u64,
    /// Refuse an image with more than this many entries: files, directories (those a layer
    /// makes only as parents included), whiteouts.
    #[arg(long, default_value_t = 2_000_000)]
    pub max_files: u64,
}

#[derive(Debug, Args)]
pub struct ImageImportArgs {
    /// The OCI layout directory or the docker save tar.
    pub path: std::path::PathBuf,
    /// The image's name (default: from the file's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Refuse an image whose files add up to more than this many bytes.
    #[arg(long, default_value_t = 16 << 30)]
    pub max_bytes: u64,
    /// Refuse an image with more than this many entries: files, directories (those a layer
    /// makes only as parents included), whiteouts.
    #[arg(long, default_value_t = 2_000_000)]
    pub max_files: u64,
}

#[derive(Debug, Args)]
pub struct ImageBuildArgs {
    /// debian, or the name of the image a recipe makes.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The recipe's base: a pulled, imported or recipe-built image.
    #[arg(long = "from", value_name = "BASE")]
    pub from: Option<String>,
    /// A shell command run as the guest's root (repeatable).
    #[arg(long = "run", value_name = "CMD")]
    pub run: Vec<String>,
    /// A Debian package installed with apt-get (repeatable; a Debian-based base).
    #[arg(long = "apt", value_name = "PKG")]
    pub apt: Vec<String>,
    /// A host file, or a directory copied whole (modes kept, symlinks as symlinks), put into
    /// the image owned by root (repeatable).
    #[arg(long = "copy", value_name = "HOSTPATH:GUESTPATH")]
    pub copy: Vec<String>,
    /// A variable added to the image's Env, seen by later steps too (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// The recipe as a TOML file (from, network, allow-hosts and [[step]]s), instead of the
    /// step flags.
    #[arg(long = "file", value_name = "RECIPE.toml", conflicts_with_all = ["run", "apt", "copy", "env"])]
    pub file: Option<std::path::PathBuf>,
    /// The network the steps run with: none (default), filtered or nat.
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// A host a filtered build may also reach over HTTPS (repeatable).
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// Refuse a built layer whose files add up to more than this many bytes.
    #[arg(long, default_value_t = 16 << 30)]
    pub max_bytes: u64,
    /// Refuse a built layer with more than this many files.
    #[arg(long, default_value_t = 2_000_000)]
    pub max_files: u64,
    /// Memory limit in MiB of the sandbox the steps run in (default 1024).
    #[arg(long = "memory-mb", value_name = "MB", value_parser = whole_number)]
    pub memory_mb: Option<u64>,
    /// Disk limit in MiB of the sandbox the steps run in: what they may write, the new layer
    /// (64 to 1048576, default 2048). Not part of the recipe's id.
    #[arg(long = "disk-mb", value_name = "MB", value_parser = whole_number)]
    pub disk_mb: Option<u64>,
    /// Seconds the whole build may take, its steps together (60 to 86400, default 3600; a
    /// recipe file's `timeout`). Not part of the recipe's id.
    #[arg(long = "timeout", value_name = "SECONDS", value_parser = whole_number)]
    pub timeout: Option<u64>,
}

#[derive(Debug, Args)]
pub struct ImageNameArgs {
    /// Image name (debian) or id (at least 4 leading characters, for `rm`).
    #[arg(value_name = "NAME|ID")]
    pub name: String,
}

#[derive(Debug, Args)]
pub struct PoolArgs {
    /// End every warm-pool sandbox (booting or ready) instead of topping the pool up.
    #[arg(long)]
    pub drain: bool,
}

/// When `run` and `task start` pull their `--image` (`--pull`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PullWhen {
    /// When this host lacks the image.
    Missing,
    /// Never: an image this host lacks is an error.
    Never,
    /// Every time: the registry's image now.
    Always,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Copy a project into a new task sandbox at /workspace.
    Start(TaskStartArgs),
    /// Run a shell command in the task's workspace; exits with the command's exit code.
    Exec(TaskExecArgs),
    /// Show what the agent changed, with risky paths flagged.
    Diff(TargetArgs),
    /// End the task: final diff, sandbox destroyed, patch verified and saved. Files the task
    /// added under directories tools generate (`__pycache__/`, `node_modules/`, …) are left
    /// out of the patch, into generated.diff beside it.
    Finish(TaskFinishArgs),
    /// Commit a finished task's verified patch to a new branch of its project; your current
    /// branch, index and working tree are left as they are.
    Apply(TaskApplyArgs),
    /// Record the task's whole filesystem (workspace, installed packages, everything the
    /// guest wrote) as a checkpoint to restore or fork from; --delete removes one.
    Checkpoint(TaskCheckpointArgs),
    /// List the task's checkpoints with their sizes.
    Checkpoints(TargetArgs),
    /// Bring the task's workspace and filesystem back to a checkpoint; its running commands
    /// and jobs are ended (the result says which).
    Restore(TaskRestoreArgs),
    /// Start a new task from this one's current state or one of its checkpoints: same
    /// baseline, imported commit, image and limits; its own name, TTL and network.
    Fork(TaskForkArgs),
}

#[derive(Debug, Args)]
pub struct TaskCheckpointArgs {
    /// Task name or id.
    pub name: String,
    /// The checkpoint's label (default: the next free cp-N): 1-63 of a-z, A-Z, 0-9, '.', '_',
    /// '-'.
    pub label: Option<String>,
    /// Delete checkpoint LABEL instead of making one.
    #[arg(long, requires = "label")]
    pub delete: bool,
}

#[derive(Debug, Args)]
pub struct TaskRestoreArgs {
    /// Task name or id.
    pub name: String,
    /// The checkpoint to restore.
    pub label: String,
}

#[derive(Debug, Args)]
pub struct TaskForkArgs {
    /// The task to fork (name or id); it must be running.
    pub name: String,
    /// The new task's name.
    pub new_name: String,
    /// Start from this checkpoint of the task instead of its current state.
    #[arg(long, value_name = "LABEL")]
    pub checkpoint: Option<String>,
    /// Keep the task's running processes (a dev server, a build daemon): the guest is saved
    /// as it runs and the fork resumes it. vm backend only; the network may not add or remove
    /// nat.
    #[arg(long, conflicts_with = "checkpoint")]
    pub live: bool,
    /// Lifetime in seconds (default: the parent's TTL).
    #[arg(long = "ttl", value_name = "SECONDS", value_parser = whole_number)]
    pub ttl_seconds: Option<u64>,
    /// Network mode (default: the parent's): none, filtered or nat, as the host allows.
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// A host a filtered fork may also reach over HTTPS (repeatable; default: the parent's
    /// allowlist when the parent is filtered too).
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
}

#[derive(Debug, Args)]
pub struct TaskFinishArgs {
    /// Task name or id.
    pub name: String,
    /// Keep the generated files (`__pycache__/`, `node_modules/`, … that the project neither
    /// tracks nor ignores) in the patch.
    #[arg(long)]
    pub include_generated: bool,
}

#[derive(Debug, Args)]
pub struct TaskApplyArgs {
    /// Task name or id (the task must be finished: `dynocap task finish NAME`).
    pub name: String,
    /// The branch to create, from the commit the task started on (default:
    /// `dynocap/<task name>`). An existing branch is never moved.
    #[arg(long, value_name = "BRANCH")]
    pub branch: Option<String>,
    /// Apply even though the patch changes sensitive paths (hooks, CI, build scripts, ...);
    /// review them first with `dynocap task diff NAME`. The commit message lists them.
    #[arg(long)]
    pub accept_sensitive: bool,
    /// Apply to this clone of the project's repository instead of the task's project
    /// directory (required for a task cloned from a URL).
    #[arg(long, value_name = "PATH")]
    pub to: Option<std::path::PathBuf>,
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
    /// Network mode (default none): none (loopback only), filtered (HTTPS through the host's
    /// proxy to the npm registry, the repository's host, DYNOCAP_EGRESS_ALLOW and
    /// --allow-host), or nat (unrestricted outbound).
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// A host a filtered task may also reach over HTTPS (repeatable; `*.example.com` allowed,
    /// and named registries: @npm, @pypi, @crates, @go, @debian, @rubygems, @maven).
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// The image to boot: host (the host's own /usr, read-only; the default unless
    /// DYNOCAP_IMAGE names another), a built, imported or pulled image such as debian
    /// (`dynocap image ls`), or a registry reference such as registry.example/team/tool:1,
    /// pulled first when this host lacks it (see --pull).
    #[arg(long, value_name = "NAME")]
    pub image: Option<String>,
    /// When to pull an --image that is a registry reference (registry.example/repo:tag, in
    /// a registry DYNOCAP_REGISTRIES allows): missing (when this host lacks it; the default),
    /// never (a missing image is an error) or always (pull it again, and boot what the
    /// registry has now).
    #[arg(long, value_name = "missing|never|always", value_enum, default_value_t = PullWhen::Missing)]
    pub pull: PullWhen,
    /// The backend to boot on: jail (Linux namespaces), vm (a QEMU microVM; needs a built
    /// image with a kernel, e.g. --image debian) or auto (vm where KVM boots the image's
    /// kernel, else jail). Default: DYNOCAP_BACKEND, else auto.
    #[arg(long, value_name = "jail|vm|auto", value_parser = backend_choice)]
    pub backend: Option<dynocap_engine::backend::BackendChoice>,
    /// The built image whose kernel the vm boots (one that has a kernel, e.g. debian: `dynocap
    /// image ls` shows each image's). Default: the image's own kernel, else, for a container
    /// image, which carries none, the newest image's that has one. vm backend only.
    #[arg(long, value_name = "IMAGE")]
    pub kernel: Option<String>,
    /// Leave the project's package caches out: the task downloads afresh and keeps nothing
    /// for the project's next task.
    #[arg(long = "no-cache")]
    pub no_cache: bool,
    /// SSH private key (no passphrase) for an ssh:// --repo clone; it is readable only by the
    /// clone and removed when the clone ends.
    #[arg(long = "ssh-key", value_name = "PATH", requires = "repository_url")]
    pub ssh_key: Option<std::path::PathBuf>,
    /// Lifetime in seconds (30 to 86400, default 1800); at expiry the task is finished.
    #[arg(long = "ttl", value_name = "SECONDS", value_parser = whole_number)]
    pub ttl_seconds: Option<u64>,
    /// CPU quota in whole CPUs (default 2).
    #[arg(long, value_parser = whole_number)]
    pub cpus: Option<u64>,
    /// Memory limit in MiB, no swap (default 1024).
    #[arg(long = "memory-mb", value_name = "MB", value_parser = whole_number)]
    pub memory_mb: Option<u64>,
    /// Disk limit in MiB for everything the sandbox writes (64 to 1048576, default 2048);
    /// past it, or past its file count (one per 16 KiB), writes fail with ENOSPC.
    #[arg(long = "disk-mb", value_name = "MB", value_parser = whole_number)]
    pub disk_mb: Option<u64>,
    /// Forward 127.0.0.1:HOST on the host to GUEST inside the task's sandbox (repeatable;
    /// without HOST, or with 0, a free port is chosen and printed; GUEST:ADDR:HOST listens on
    /// ADDR instead, e.g. 0.0.0.0 to open it to the network).
    #[arg(long = "publish", short = 'p', value_name = "GUEST[:[ADDR:]HOST]", value_parser = crate::port_commands::publish_spec)]
    pub publish: Vec<dynocap_engine::ports::ForwardRequest>,
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
    /// With --purge: also delete the package cache of the task's project (refused while
    /// another running task of the project has it).
    #[arg(long, requires = "purge")]
    pub cache: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Sandbox name: 1-63 characters from a-z, 0-9, '_', '.', '-'.
    pub name: String,
    /// Lifetime in seconds (30 to 86400); the sandbox is destroyed when it ends.
    #[arg(long = "ttl", value_name = "SECONDS", value_parser = whole_number)]
    pub ttl_seconds: Option<u64>,
    /// CPU quota in whole CPUs (default 1).
    #[arg(long, value_parser = whole_number)]
    pub cpus: Option<u64>,
    /// Memory limit in MiB, no swap (default 1024).
    #[arg(long = "memory-mb", value_name = "MB", value_parser = whole_number)]
    pub memory_mb: Option<u64>,
    /// Disk limit in MiB for everything the sandbox writes (64 to 1048576, default 2048);
    /// past it, or past its file count (one per 16 KiB), writes fail with ENOSPC.
    #[arg(long = "disk-mb", value_name = "MB", value_parser = whole_number)]
    pub disk_mb: Option<u64>,
    /// Network mode (default none: loopback only): none, filtered (HTTPS through the host's
    /// proxy to the npm registry, DYNOCAP_EGRESS_ALLOW and --allow-host) or nat.
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// A host a filtered sandbox may also reach over HTTPS (repeatable; `*.example.com`, and
    /// named registries: @npm, @pypi, @crates, @go, @debian, @rubygems, @maven).
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// The image to boot: host (the host's own /usr, read-only; the default unless
    /// DYNOCAP_IMAGE names another), a built, imported or pulled image such as debian
    /// (`dynocap image ls`), or a registry reference such as registry.example/team/tool:1,
    /// pulled first when this host lacks it (see --pull).
    #[arg(long, value_name = "NAME")]
    pub image: Option<String>,
    /// When to pull an --image that is a registry reference (registry.example/repo:tag, in
    /// a registry DYNOCAP_REGISTRIES allows): missing (when this host lacks it; the default),
    /// never (a missing image is an error) or always (pull it again, and boot what the
    /// registry has now).
    #[arg(long, value_name = "missing|never|always", value_enum, default_value_t = PullWhen::Missing)]
    pub pull: PullWhen,
    /// The backend to boot on: jail (Linux namespaces), vm (a QEMU microVM; needs a built
    /// image with a kernel, e.g. --image debian) or auto (vm where KVM boots the image's
    /// kernel, else jail). Default: DYNOCAP_BACKEND, else auto.
    #[arg(long, value_name = "jail|vm|auto", value_parser = backend_choice)]
    pub backend: Option<dynocap_engine::backend::BackendChoice>,
    /// The built image whose kernel the vm boots (one that has a kernel, e.g. debian: `dynocap
    /// image ls` shows each image's). Default: the image's own kernel, else, for a container
    /// image, which carries none, the newest image's that has one. vm backend only.
    #[arg(long, value_name = "IMAGE")]
    pub kernel: Option<String>,
    /// Forward 127.0.0.1:HOST on the host to GUEST inside the sandbox (repeatable;
    /// without HOST, or with 0, a free port is chosen and printed; GUEST:ADDR:HOST listens on
    /// ADDR instead, e.g. 0.0.0.0 to open it to the network).
    #[arg(long = "publish", short = 'p', value_name = "GUEST[:[ADDR:]HOST]", value_parser = crate::port_commands::publish_spec)]
    pub publish: Vec<dynocap_engine::ports::ForwardRequest>,
}

/// `dynocap exec`: the target is a raw sandbox (a task is refused, and the message says to
/// use `task exec`), so its help says only that.
#[derive(Debug, Args)]
pub struct SandboxExecArgs {
    /// Name (or id) of the raw sandbox; for a task, use `dynocap task exec`.
    pub name: String,
    /// Working directory inside the sandbox (default /).
    #[arg(long)]
    pub cwd: Option<String>,
    #[command(flatten)]
    pub exec: ExecArgs,
}

/// `dynocap task exec`.
#[derive(Debug, Args)]
pub struct TaskExecArgs {
    /// Name (or id) of the task; for a raw sandbox, use `dynocap exec`.
    pub name: String,
    /// Working directory inside the task's sandbox (default /workspace).
    #[arg(long)]
    pub cwd: Option<String>,
    #[command(flatten)]
    pub exec: ExecArgs,
}

/// What both exec commands take besides the target.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Environment variable for the command, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Deadline in seconds (default 30); everything the command started is killed at it.
    #[arg(long = "timeout", value_name = "SECONDS", value_parser = whole_number)]
    pub timeout_seconds: Option<u64>,
    /// Run in a 24x80 pseudo-terminal and print the screen transcript.
    #[arg(long)]
    pub tty: bool,
    /// Write the command's output to a terminal byte for byte. Without it, escape sequences
    /// and other control characters are shown as text (`^[`) when stdout or stderr is a
    /// terminal, so the guest cannot drive your terminal; use it only for output you trust.
    /// Pipes and files always get the bytes unchanged.
    #[arg(long)]
    pub raw: bool,
    /// Start the command as a job and return at once with its id; follow it with
    /// `dynocap job NAME JOB --follow`. It runs until it ends, its --timeout, a kill or the
    /// sandbox's end.
    #[arg(long, conflicts_with = "tty")]
    pub background: bool,
    /// The command. One word is a shell command, run with `sh -c` (`-- 'make && make
    /// test'`); several words are a program and its arguments, passed exactly as given
    /// (`-- printf '%s\n' 'a b'`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `dynocap cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// NAME:GUESTPATH or HOSTPATH (a relative GUESTPATH is in a task's /workspace, a raw
    /// sandbox's /; a host path with a colon is written ./a:b).
    pub source: String,
    /// HOSTPATH or NAME:GUESTPATH: an existing directory receives the source inside it; a
    /// missing path is created as the copy.
    pub destination: String,
    /// Most bytes the copy writes; it stops with an error past them.
    #[arg(long, default_value_t = 1 << 30, value_name = "BYTES")]
    pub max_bytes: u64,
    /// Most entries (files, directories, symlinks) the copy makes.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub max_entries: u64,
}

/// `dynocap job`.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// Name (or id) of the raw sandbox or task.
    pub name: String,
    /// The job (job-N); without it, the sandbox's jobs are listed.
    pub job: Option<String>,
    /// Print the job's output as it comes until it ends; exits with its exit code.
    #[arg(long)]
    pub follow: bool,
    /// Kill the job (SIGTERM, SIGKILL 2 s later) and wait for its end.
    #[arg(long)]
    pub kill: bool,
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
    #[arg(long, required_unless_present = "standby_fd", requires = "ready_fd")]
    pub id: Option<String>,
    #[arg(long = "ready-fd", requires = "id")]
    pub ready_fd: Option<i32>,
    /// Boot over the layer an unsaved task kept and save its work, instead of starting anew.
    #[arg(long, requires = "id")]
    pub recover: bool,
    /// With --recover: keep the generated files in the patch, as `finish --include-generated`
    /// asked.
    #[arg(long = "include-generated", requires = "recover")]
    pub include_generated: bool,
    /// Stand by: wait on this socket for the sandbox to supervise (see the engine's
    /// `standby`), instead of being given it on the command line.
    #[arg(long = "standby-fd", conflicts_with_all = ["id", "ready_fd", "recover"])]
    pub standby_fd: Option<i32>,
    /// While standing by, make the default start's disk ahead (see the jail's
    /// `start_preparing_disk`).
    #[arg(long = "prepare-disk", requires = "standby_fd")]
    pub prepare_disk: bool,
}

/// A count, size or number of seconds; the error says what a valid one looks like (clap puts
/// the flag and the value in front of it).
fn whole_number(text: &str) -> Result<u64, String> {
    text.parse::<u64>().map_err(|err| match err.kind() {
        IntErrorKind::PosOverflow => "too large".to_owned(),
        IntErrorKind::Empty => "empty; give a whole number".to_owned(),
        _ => "not a whole number (use digits only)".to_owned(),
    })
}

/// A `--backend` value; the error lists the valid ones (clap puts the flag and the value in
/// front of it).
fn backend_choice(text: &str) -> Result<dynocap_engine::backend::BackendChoice, String> {
    use dynocap_engine::backend::BackendChoice;
    BackendChoice::parse(text).ok_or_else(|| {
        format!(
            "not a backend; use {} (without --backend: DYNOCAP_BACKEND, else auto)",
            BackendChoice::VALUES
        )
    })
}

/// Whether the command line asks for `--json`, wherever it stands, and even when the rest of
/// it does not parse. Only words before a `--` count: after it come the sandbox command's own.
pub fn json_requested(args: &[OsString]) -> bool {
    args.iter()
        .skip(1)
        .take_while(|arg| *arg != "--")
        .filter_map(|arg| arg.to_str())
        .any(|arg| arg == "--json" || arg.starts_with("--json="))
}

/// Clap's error for `args` as one line: what is wrong (clap names the argument and the value)
/// and its tips, without colour or the usage block, ending with the help that lists the valid
/// forms.
pub fn explain(err: &clap::Error, args: &[OsString]) -> String {
    let (path, command) = subcommand_path(args);
    let path = path.join(" ");
    let subcommands = || {
        command
            .get_subcommands()
            .filter(|sub| !sub.is_hide_set())
            .map(|sub| sub.get_name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let what = match err.kind() {
        // Clap's text for the second is the whole help page.
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            format!("`{path}` needs a subcommand: {}", subcommands())
        }
        ErrorKind::InvalidSubcommand => format!(
            "{}; the subcommands of `{path}` are {}",
            summary(&err.render().to_string()),
            subcommands()
        ),
        _ => summary(&err.render().to_string()),
    };
    format!("{what}; see `{path} --help`")
}

/// The subcommands `args` name (`dynocap task start`), as far as they are valid, and the last
/// one's definition. Flags are skipped: no command that has subcommands takes an option value.
fn subcommand_path(args: &[OsString]) -> (Vec<String>, clap::Command) {
    let mut command = Cli::command();
    let mut path = vec![command.get_name().to_owned()];
    for arg in args.iter().skip(1) {
        let Some(arg) = arg.to_str() else { break };
        if arg == "--" {
            break;
        }
        if arg.starts_with('-') {
            continue;
        }
        let Some(sub) = command.find_subcommand(arg).cloned() else {
            break;
        };
        path.push(sub.get_name().to_owned());
        command = sub;
    }
    (path, command)
}

/// Clap's plain error text as one line: `error: ` and the usage block and the pointer to
/// `--help` dropped, continuation lines joined, each tip its own clause.
fn summary(rendered: &str) -> String {
    let mut clauses: Vec<String> = Vec::new();
    for paragraph in rendered.split("\n\n") {
        let paragraph = paragraph.trim();
        if paragraph.starts_with("Usage:") || paragraph.starts_with("For more information") {
            continue;
        }
        for line in paragraph.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let line = line.strip_prefix("error: ").unwrap_or(line);
            match clauses.last_mut() {
                Some(clause) if !line.starts_with("tip:") && !paragraph.starts_with("tip:") => {
                    clause.push(' ');
                    clause.push_str(line);
                }
                _ => clauses.push(line.to_owned()),
            }
        }
    }
    clauses.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<OsString> {
        std::iter::once("dynocap")
            .chain(line.split_whitespace())
            .map(OsString::from)
            .collect()
    }

    fn explained(line: &str) -> String {
        let args = args(line);
        let err = Cli::try_parse_from(&args).expect_err("the command line is wrong");
        explain(&err, &args)
    }

    #[test]
    fn json_is_found_anywhere_before_the_command() {
        assert!(json_requested(&args("--json run x --cpus two")));
        assert!(json_requested(&args("run x --bogus --json")));
        assert!(json_requested(&args("task --json start")));
        assert!(json_requested(&args("--json=yes ps")));
        assert!(!json_requested(&args("exec x -- echo --json")));
        assert!(!json_requested(&args("run x --jsonx")));
    }

    #[test]
    fn errors_name_the_argument_and_the_help_to_read() {
        let cases = [
            (
                "run x --cpus two",
                "invalid value 'two' for '--cpus <CPUS>': not a whole number",
            ),
            (
                "exec x --timeout 99999999999999999999 -- true",
                "'--timeout <SECONDS>': too large",
            ),
            ("run x --bogus", "unexpected argument '--bogus' found; tip:"),
            (
                "exec x --tmeout 3 -- true",
                "tip: a similar argument exists: '--timeout'",
            ),
            (
                "run",
                "the following required arguments were not provided: <NAME>",
            ),
            ("frob", "unrecognized subcommand 'frob'"),
            (
                "",
                "`dynocap` needs a subcommand: run, exec, ps, job, cp, port, destroy, pool, task, \
                 ls, rm, cache, mcp, doctor",
            ),
            (
                "task",
                "`dynocap task` needs a subcommand: start, exec, diff, finish, apply",
            ),
            (
                "image",
                "`dynocap image` needs a subcommand: build, import, pull, ls, inspect, rm",
            ),
            (
                "run x --backend qemu",
                "invalid value 'qemu' for '--backend <jail|vm|auto>': not a backend; use jail, \
                 vm or auto",
            ),
            (
                "task start --backend Jail",
                "invalid value 'Jail' for '--backend <jail|vm|auto>': not a backend",
            ),
            (
                "run x --backend",
                "a value is required for '--backend <jail|vm|auto>'",
            ),
        ];
        for (line, needle) in cases {
            let message = explained(line);
            assert!(message.contains(needle), "{line}: {message}");
            assert!(
                !message.contains('\n') && !message.contains('\x1b'),
                "{line}: {message}"
            );
            assert!(!message.contains("Usage:"), "{line}: {message}");
        }
        assert!(explained("task start --ttl x").ends_with("; see `dynocap task start --help`"));
        assert!(explained("frob").contains("the subcommands of `dynocap` are run, exec"));
        assert!(!explained("frob").contains("supervise"));
    }
}
