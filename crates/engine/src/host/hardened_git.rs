//! Running the host's `git` against repositories a hostile party may have prepared.
//!
//! A project the user asks us to import, or the scratch repository a guest's patch is verified
//! in, can carry a `.git/config`, `.gitattributes`, hooks and refs written by a prompt-injected
//! model. Git executes programs named in several of those places. [`HardenedGit`] builds a
//! [`Command`] that shuts off every such place git lets a caller shut off:
//!
//! - the environment is cleared, so nothing of the host user's git setup (`GIT_DIR`,
//!   `GIT_EXEC_PATH`, `GIT_SSH_COMMAND`, `GIT_CONFIG_PARAMETERS`, …) leaks in, and system and
//!   global configuration are not read;
//! - `-c` overrides, which have the highest precedence of all configuration, neutralise the
//!   program-running keys a repository's own config may set (see [`OVERRIDES`]);
//! - network transports are refused unless the caller opts one in ([`HardenedGit::allow_protocol`]).
//!
//! What it cannot do: git always reads the repository's own `config` (and whatever it
//! `include`s), its `info/attributes` and in-tree `.gitattributes`. Keys without a blanket
//! override stay live there — above all `filter.<driver>.clean/smudge/process`, which run when
//! git converts work-tree content (`add`, `status`, `diff` against the work tree, `checkout`).
//! So against an untrusted repository use only plumbing that neither converts content nor runs
//! config-named programs — `rev-parse`, `ls-files` (without `--modified`/`--deleted`, which
//! compare content), `for-each-ref`, `rev-list`, `cat-file` (without `--filters`/`--textconv`),
//! `bundle create` — and pass [`DIFF_SAFETY_ARGS`] to any diff-family command. The import
//! (`crate::supervisor::import`) sticks to that list, and its tests check a repository whose config names
//! an fsmonitor, a hooks path and a filter runs none of them.
//!
//! Git also follows what the repository's git directory points to — `commondir`,
//! `objects/info/alternates`, a `.git` file's `gitdir:` — so objects it serves (a bundle, a
//! `cat-file`) may come from another repository on the host that those files name.
//!
//! Requires git 2.36 or later (`safe.directory=*`); older versions read no global config either
//! way (`HOME` points nowhere), but refuse repositories owned by another user.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Read};
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// `PATH` for git when the host process has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Most of git's stderr kept in an error message; a hostile repository can make it long.
const STDERR_LIMIT: usize = 4096;

/// Options for diff-family commands (`diff`, `log -p`, `show`, `format-patch`): no
/// `diff.external`/`diff.<driver>.command` program and no `textconv` filter. These are options
/// of the subcommand, not of `git`, so the builder cannot add them itself.
pub const DIFF_SAFETY_ARGS: [&str; 2] = ["--no-ext-diff", "--no-textconv"];

/// The `-c key=value` overrides every hardened command carries, in this order, before the
/// caller's own [`HardenedGit::config`] values. Command-line configuration beats the
/// repository's `config`, so each of these wins over whatever the repository says.
pub const OVERRIDES: &[(&str, &str)] = &[
    // Hooks are programs in the repository: look for them in a path that cannot hold any.
    ("core.hooksPath", "/dev/null"),
    // An fsmonitor is a program git runs whenever it reads the index (plain `git ls-files`
    // runs it); `false` turns it off entirely.
    ("core.fsmonitor", "false"),
    // A stale or crafted untracked cache in the index could hide files from `--others`; make
    // git walk the directories for real.
    ("core.untrackedCache", "false"),
    // Transports are refused below; should a caller opt ssh in, it must name its own command.
    ("core.sshCommand", "false"),
    // A pager is only run on a terminal, but `cat` makes sure none is ever configured one.
    ("core.pager", "cat"),
    // No attributes file outside the repository (the in-tree ones cannot be turned off).
    ("core.attributesFile", "/dev/null"),
    // Names are passed through byte for byte (we also use `-z`, which never quotes).
    ("core.quotePath", "false"),
    // `diff.external` names a program for porcelain `diff`/`log -p`. An empty value does not
    // mean "none" (git then fails to run ""), so name `false`: a diff run without
    // `--no-ext-diff` fails instead of running the repository's program. `--no-ext-diff`
    // ([`DIFF_SAFETY_ARGS`]) also covers `diff.<driver>.command`, which no `-c` can.
    ("diff.external", "false"),
    // No network or local transport at all: no `ext::` helper, no `file://` clone of a path
    // the repository names. Callers opt in per protocol.
    ("protocol.allow", "never"),
    // An empty value resets the helper list: no credential helper (`!cmd` runs a shell).
    ("credential.helper", ""),
    // `core.askPass` names a program; empty runs none (`GIT_ASKPASS` below also wins over it).
    ("core.askPass", ""),
    // Run as root on a user's repository without the ownership check refusing it. That check
    // exists to stop a foreign repository's config from running programs; the overrides here
    // are what prevents that instead.
    ("safe.directory", "*"),
    // Never start `gc`/`maintenance` in the background: no writes to a repository we only read.
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    // `log.showSignature` would run `gpg.program` for `log`/`show`.
    ("log.showSignature", "false"),
    // Commands that can recurse into submodules do not: each repository is hardened on its own.
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
];

/// Environment variables set after the environment is cleared (`PATH`, and
/// `GIT_CEILING_DIRECTORIES` for [`HardenedGit::new`], come on top).
const ENVIRONMENT: &[(&str, &str)] = &[
    // Untranslated messages: stderr ends up in error messages and logs.
    ("LANG", "C"),
    ("LC_ALL", "C"),
    // No `~/.gitconfig`, `~/.config/git/*` or `~/.git-credentials`.
    ("HOME", "/nonexistent"),
    // No system (`/etc/gitconfig`) or global configuration, whatever HOME says.
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_CONFIG_SYSTEM", "/dev/null"),
    // No `/etc/gitattributes`.
    ("GIT_ATTR_NOSYSTEM", "1"),
    // Never prompt on a terminal; an empty GIT_ASKPASS runs no program (and beats core.askPass).
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_ASKPASS", ""),
    // The editor and pager env variables beat `core.editor`/`sequence.editor`/`core.pager`.
    ("GIT_EDITOR", "false"),
    ("GIT_SEQUENCE_EDITOR", "false"),
    ("GIT_PAGER", "cat"),
    // `refs/replace/*` would let the repository substitute one object for another.
    ("GIT_NO_REPLACE_OBJECTS", "1"),
    // No opportunistic index refresh writes into a repository we are only reading.
    ("GIT_OPTIONAL_LOCKS", "0"),
    // A partial clone must not fetch missing objects behind our back (git 2.45+).
    ("GIT_NO_LAZY_FETCH", "1"),
    // Protocols whose policy is `user` are refused (only explicitly allowed ones run).
    ("GIT_PROTOCOL_FROM_USER", "0"),
    // Paths we pass are paths, never pathspec magic (`:(exclude)…`, globs).
    ("GIT_LITERAL_PATHSPECS", "1"),
    // Less noise in stderr (git 2.46+).
    ("GIT_ADVICE", "0"),
];

/// A transport a caller may opt in to; everything else stays refused (`ext::` never runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Local repositories and bundle files (`git fetch some.bundle` counts as `file`).
    File,
    Https,
    Ssh,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Https => "https",
            Self::Ssh => "ssh",
        }
    }
}

/// Where git finds the repository.
#[derive(Debug, Clone)]
enum Location {
    /// `-C dir`; discovery looks at `dir` itself only (a work tree with `.git`, or a git dir).
    Dir(PathBuf),
    /// `--git-dir` (a directory or a `.git` file) and `--work-tree`, or `--bare`.
    GitDir {
        git_dir: PathBuf,
        work_tree: Option<PathBuf>,
    },
    /// The work tree is a directory descriptor the caller holds open: git inherits it as
    /// [`INHERITED_DIR_FD`] and starts in it, with `.git` and `.` as its git dir and work tree,
    /// so no path names the directory and swapping it for a symlink cannot redirect git.
    DirFd(RawFd),
}

/// The descriptor number a [`HardenedGit::in_dir_fd`] git gets its work tree on.
pub const INHERITED_DIR_FD: RawFd = 3;

/// A `git` invocation hardened against the repository it runs on. Build it, add arguments,
/// then [`run`](Self::run) it or take the [`Command`] with [`command`](Self::command).
#[derive(Debug, Clone)]
pub struct HardenedGit {
    program: OsString,
    location: Location,
    protocols: Vec<Protocol>,
    config: Vec<(String, OsString)>,
    args: Vec<OsString>,
    timeout: Option<Duration>,
    index_file: Option<PathBuf>,
    stdin_piped: bool,
}

impl HardenedGit {
    /// Git in `dir` (a work tree or a git dir). Discovery stops at `dir`: git never climbs to
    /// a repository that merely contains `dir`. `dir` is used as given; canonicalize it first
    /// if symlinks in it matter.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_location(Location::Dir(dir.into()))
    }

    /// Git with an explicit git directory (a `.git` directory, a bare repository, or a `.git`
    /// file that git resolves itself) and optionally a work tree (git runs at its top; without
    /// one, git runs `--bare` and commands that need a work tree fail). No discovery happens,
    /// and `core.worktree` in the repository's config is overridden. Give absolute paths.
    pub fn with_git_dir(git_dir: impl Into<PathBuf>, work_tree: Option<&Path>) -> Self {
        Self::with_location(Location::GitDir {
            git_dir: git_dir.into(),
            work_tree: work_tree.map(Path::to_path_buf),
        })
    }

    /// Git in the work tree `dir` (an open directory descriptor, typically `O_PATH`), which
    /// must stay open until git has been spawned. Git runs at the top of that very directory
    /// whatever its path says by then; the git directory is its `.git` (a directory or a
    /// `gitdir:` file, which git resolves itself: check where it points first).
    pub fn in_dir_fd(dir: BorrowedFd<'_>) -> Self {
        Self::with_location(Location::DirFd(dir.as_raw_fd()))
    }

    fn with_location(location: Location) -> Self {
        Self {
            program: OsString::from("git"),
            location,
            protocols: Vec::new(),
            config: Vec::new(),
            args: Vec::new(),
            timeout: None,
            index_file: None,
            stdin_piped: false,
        }
    }

    /// The git binary to run (default: `git`, looked up in `PATH`).
    #[must_use]
    pub fn program(mut self, program: impl Into<OsString>) -> Self {
        self.program = program.into();
        self
    }

    /// Allow one transport (`protocol.<name>.allow=always`).
    #[must_use]
    pub fn allow_protocol(mut self, protocol: Protocol) -> Self {
        if !self.protocols.contains(&protocol) {
            self.protocols.push(protocol);
        }
        self
    }

    /// One more `-c key=value`, after the [`OVERRIDES`] (so it can replace one of them: the
    /// caller is trusted, the repository is not). For values the host chose, never for values
    /// taken from the repository or the guest.
    #[must_use]
    pub fn config(mut self, key: impl Into<String>, value: impl Into<OsString>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Kill git (and whatever it started: it runs in a process group of its own) if
    /// [`output`](Self::output)/[`run`](Self::run) take longer than `limit`. A crafted
    /// repository can make git block (a `gitdir:` pointing at a fifo); without a limit, git
    /// runs until it ends.
    #[must_use]
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// Use `path` (absolute) as the index instead of the repository's own (`GIT_INDEX_FILE`):
    /// index plumbing (`read-tree`, `apply --cached`, `write-tree`) then builds a tree without
    /// touching the index the user works with.
    #[must_use]
    pub fn index_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.index_file = Some(path.into());
        self
    }

    /// Give git a pipe for stdin instead of `/dev/null` ([`RunningGit::take_stdin`]): for
    /// input a command reads from stdin (`git apply` with no file), which the caller can then
    /// write while git is already starting.
    #[must_use]
    pub fn stdin_piped(mut self) -> Self {
        self.stdin_piped = true;
        self
    }

    /// One argument after the global options (the first is the subcommand).
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Several arguments, see [`arg`](Self::arg).
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The command, ready to spawn: cleared environment, global options, `-c` overrides, the
    /// caller's arguments; stdin is `/dev/null`. Convert it with `tokio::process::Command::from`
    /// for async use. Git gets SIGKILL when the thread that spawns it ends and inherits no
    /// descriptor beyond stdio ([`crate::host::host_children::die_with_parent`]): spawn it from a
    /// thread that outlives it. What git starts ends with it, in its own pid namespace where
    /// one can be made ([`crate::host::host_children::in_own_pid_namespace`]).
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        // Registered first: it marks every descriptor from 3 up close-on-exec, and the
        // directory descriptor's hook then makes that one cross.
        crate::host::host_children::die_with_parent(&mut cmd);
        if let Location::DirFd(fd) = self.location {
            inherit_as(&mut cmd, fd, INHERITED_DIR_FD);
        }
        // Last: what git starts (pack-objects, index-pack) has no death signal, and ends with
        // git's pid namespace instead, whoever dies first.
        crate::host::host_children::in_own_pid_namespace(&mut cmd);
        self.invocation(cmd)
    }

    /// What `command` runs, without its hooks: cleared environment, global options, `-c`
    /// overrides, the caller's arguments, stdin `/dev/null`.
    fn invocation(&self, mut cmd: Command) -> Command {
        cmd.env_clear();
        cmd.env(
            "PATH",
            // env-read-ok: the child git's PATH, passed on as it is (not a setting).
            std::env::var_os("PATH")
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| DEFAULT_PATH.into()),
        );
        for (key, value) in ENVIRONMENT {
            cmd.env(key, value);
        }
        if let Some(index) = &self.index_file {
            cmd.env("GIT_INDEX_FILE", index);
        }
        cmd.arg("--no-pager");
        match &self.location {
            Location::Dir(dir) => {
                if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    cmd.env("GIT_CEILING_DIRECTORIES", parent);
                }
                cmd.arg("-C").arg(dir);
            }
            Location::GitDir {
                git_dir,
                work_tree: Some(work_tree),
            } => {
                // Run at the top of the work tree, so paths are relative to it and `ls-files`
                // lists all of it whatever our own current directory is.
                cmd.arg("-C").arg(work_tree);
                cmd.arg(prefixed("--git-dir=", git_dir.as_os_str()));
                cmd.arg(prefixed("--work-tree=", work_tree.as_os_str()));
            }
            Location::DirFd(_) => {
                // `-C` goes through the magic link to the directory itself; relative git dir
                // and work tree then name it from there (git keeps `.` as is when it equals
                // the current directory, so it never walks a path back to it).
                cmd.arg("-C")
                    .arg(format!("/proc/self/fd/{INHERITED_DIR_FD}"));
                cmd.arg("--git-dir=.git").arg("--work-tree=.");
            }
            Location::GitDir {
                git_dir,
                work_tree: None,
            } => {
                // Without `--bare`, git would take our current directory for the work tree.
                cmd.arg(prefixed("--git-dir=", git_dir.as_os_str()));
                cmd.arg("--bare");
            }
        }
        for (key, value) in OVERRIDES {
            cmd.arg("-c").arg(format!("{key}={value}"));
        }
        for protocol in &self.protocols {
            cmd.arg("-c")
                .arg(format!("protocol.{}.allow=always", protocol.name()));
        }
        for (key, value) in &self.config {
            let mut pair = OsString::from(key);
            pair.push("=");
            pair.push(value);
            cmd.arg("-c").arg(pair);
        }
        cmd.args(&self.args);
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Starts git with stdout and stderr captured, in a process group of its own (so a timeout
    /// or a dropped handle kills whatever git started too). Wait for it with
    /// [`RunningGit::wait`] on this same thread: git dies with the thread that spawned it.
    pub fn spawn(&self) -> Result<RunningGit, GitError> {
        let mut cmd = self.command();
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if self.stdin_piped {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().map_err(|source| GitError::Spawn {
            program: self.program.to_string_lossy().into_owned(),
            source,
        })?;
        let stdin = child.stdin.take();
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        Ok(self.running(Process::Forked(child), stdin, stdout, stderr))
    }

    /// Like [`spawn`](Self::spawn) with stdin piped, for a git whose work is bounded by what
    /// the caller feeds it (`git apply` of a patch): started without `fork`
    /// ([`crate::host::spawn`]), so git runs sooner and no other thread of this process waits on
    /// the allocator meanwhile. Git gets no death signal, and needs none: should this process
    /// die, git reads the end of its input and ends, and a dead supervisor's session is killed
    /// whole anyway ([`crate::host::host_children::kill_session`]).
    pub fn spawn_fed(&self) -> Result<RunningGit, GitError> {
        let spawn_error = |source| GitError::Spawn {
            program: self.program.to_string_lossy().into_owned(),
            source,
        };
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|err| spawn_error(io::Error::from(err)))
        };
        let ((in_read, in_write), (out_read, out_write), (err_read, err_write)) =
            (pipe()?, pipe()?, pipe()?);
        let inherit = match self.location {
            Location::DirFd(fd) => vec![(fd, INHERITED_DIR_FD)],
            _ => Vec::new(),
        };
        let stdio = crate::host::spawn::Stdio {
            stdin: &in_read,
            stdout: &out_write,
            stderr: &err_write,
        };
        let command = self.invocation(Command::new(&self.program));
        let child = crate::host::spawn::spawn(
            &command,
            &stdio,
            &inherit,
            crate::host::spawn::Detach::Group,
        )
        .map_err(spawn_error)?;
        // The child has its own copies; with these closed, git's exit ends the readers.
        drop((in_read, out_write, err_write));
        Ok(self.running(
            Process::Spawned(child),
            Some(ChildStdin::from(in_write)),
            drain(Some(std::fs::File::from(out_read))),
            drain(Some(std::fs::File::from(err_read))),
        ))
    }

    /// The handle of a git just started.
    fn running(
        &self,
        child: Process,
        stdin: Option<ChildStdin>,
        stdout: OutputReader,
        stderr: OutputReader,
    ) -> RunningGit {
        RunningGit {
            stdin,
            child: Some(child),
            readers: Some((stdout, stderr)),
            timeout: self.timeout,
            started: Instant::now(),
            command: self.describe(),
            _spawning_thread: PhantomData,
        }
    }

    /// Runs to completion (or until the [`timeout`](Self::timeout)), capturing stdout and
    /// stderr, whatever the exit status.
    pub fn output(&self) -> Result<Output, GitError> {
        self.spawn()?.wait()
    }

    /// Runs to completion and returns stdout; a non-zero exit is an error carrying (the start
    /// of) stderr.
    pub fn run(&self) -> Result<Vec<u8>, GitError> {
        self.spawn()?.finish()
    }

    /// `git <subcommand> <first arguments>` for messages.
    fn describe(&self) -> String {
        let mut words = String::from("git");
        for arg in self.args.iter().take(3) {
            words.push(' ');
            words.push_str(&arg.to_string_lossy());
        }
        if self.args.len() > 3 {
            words.push_str(" …");
        }
        words
    }
}

/// A git started by [`HardenedGit::spawn`]. Dropping it unwaited kills git and what it started.
///
/// Not `Send`: git's death signal follows the thread that spawned it, so the handle (and the
/// waiting) stays on that thread, which thus outlives git.
#[must_use = "dropping a RunningGit kills git"]
pub struct RunningGit {
    /// With [`HardenedGit::stdin_piped`], until the caller takes it.
    stdin: Option<ChildStdin>,
    /// `None` once reaped.
    child: Option<Process>,
    readers: Option<(OutputReader, OutputReader)>,
    timeout: Option<Duration>,
    started: Instant,
    command: String,
    _spawning_thread: PhantomData<*const ()>,
}

type OutputReader = thread::JoinHandle<io::Result<Vec<u8>>>;

/// How a [`RunningGit`]'s process was started.
enum Process {
    Forked(Child),
    Spawned(crate::host::spawn::Spawned),
}

impl Process {
    fn id(&self) -> u32 {
        match self {
            Process::Forked(child) => child.id(),
            Process::Spawned(child) => child.id(),
        }
    }

    fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Process::Forked(child) => child.wait(),
            Process::Spawned(child) => child.wait(),
        }
    }

    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            Process::Forked(child) => child.try_wait(),
            Process::Spawned(child) => child.try_wait(),
        }
    }
}

impl RunningGit {
    /// Git's stdin, once, if it was [piped](HardenedGit::stdin_piped). Git reads until the
    /// caller drops it.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    /// Waits until git ends, or until the timeout runs out and it is killed; returns what it
    /// printed, whatever its exit status.
    pub fn wait(mut self) -> Result<Output, GitError> {
        // A stdin still held here would leave git waiting for input that never comes.
        drop(self.stdin.take());
        let mut child = self
            .child
            .take()
            .expect("a RunningGit holds its child until waited for or dropped");
        let (stdout, stderr) = self
            .readers
            .take()
            .expect("a RunningGit holds its readers until waited for or dropped");
        let waited = match self.timeout {
            Some(limit) => wait_until(&mut child, self.started + limit),
            None => child.wait().map(Some),
        };
        if !matches!(waited, Ok(Some(_))) {
            // Timed out (or waiting failed): kill the whole group, so no grandchild keeps the
            // pipes open, then reap.
            kill_group(&child);
            let _ = child.wait();
        }
        let (stdout, stderr) = (join(stdout), join(stderr));
        match waited {
            Ok(Some(status)) => Ok(Output {
                status,
                stdout: stdout?,
                stderr: stderr?,
            }),
            Ok(None) => Err(GitError::TimedOut {
                command: std::mem::take(&mut self.command),
                after: self.timeout.unwrap_or_default(),
            }),
            Err(source) => Err(GitError::Wait {
                command: std::mem::take(&mut self.command),
                source,
            }),
        }
    }

    /// [`wait`](Self::wait), then stdout; a non-zero exit is an error carrying (the start of)
    /// stderr.
    pub fn finish(self) -> Result<Vec<u8>, GitError> {
        let command = self.command.clone();
        let output = self.wait()?;
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(GitError::Failed {
                command,
                status: output.status,
                stderr: bounded_text(&output.stderr),
            })
        }
    }
}

impl Drop for RunningGit {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&child);
            let _ = child.wait();
        }
        if let Some((stdout, stderr)) = self.readers.take() {
            let _ = (stdout.join(), stderr.join());
        }
    }
}

/// SIGKILL for git's process group: git and whatever it started.
fn kill_group(child: &Process) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Reads a child's pipe to the end on a thread of its own.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<io::Result<Vec<u8>>> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            pipe.read_to_end(&mut bytes)?;
        }
        Ok(bytes)
    })
}

fn join(reader: thread::JoinHandle<io::Result<Vec<u8>>>) -> Result<Vec<u8>, GitError> {
    match reader.join() {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(source)) => Err(GitError::Io(source)),
        Err(_) => Err(GitError::Io(io::Error::other(
            "the thread reading git's output panicked",
        ))),
    }
}

/// Waits for `child` until `deadline`: `Ok(None)` if it is still running then.
fn wait_until(child: &mut Process, deadline: Instant) -> io::Result<Option<ExitStatus>> {
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Makes `fd` (open in this process) the child's descriptor `target`, without close-on-exec.
/// Runs after [`crate::host::host_children::die_with_parent`]'s hook, which marks every descriptor
/// from 3 up close-on-exec: this one is then the only one beyond stdio that crosses exec.
fn inherit_as(cmd: &mut Command, fd: RawFd, target: RawFd) {
    // SAFETY: the hook runs in the forked child before exec and only calls dup2 and fcntl
    // (async-signal-safe, no allocation) through `inherit_as`.
    unsafe {
        cmd.pre_exec(move || crate::host::host_children::inherit_as(fd, target));
    }
}

fn prefixed(prefix: &str, value: &OsStr) -> OsString {
    let mut arg = OsString::from(prefix);
    arg.push(value);
    arg
}

fn bounded_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    match text.char_indices().nth(STDERR_LIMIT) {
        Some((cut, _)) => format!("{} …", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Running git failed.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The binary could not be started at all.
    #[error("could not run {program}: {source}; install git or put it on PATH")]
    Spawn { program: String, source: io::Error },
    /// It ran and exited unsuccessfully.
    #[error("`{command}` failed ({}): {stderr}", ExitDisplay(*status))]
    Failed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
    /// It ran longer than its [`HardenedGit::timeout`] and was killed.
    #[error("`{command}` did not finish within {}s and was stopped", after.as_secs())]
    TimedOut { command: String, after: Duration },
    /// Waiting for it failed.
    #[error("waiting for `{command}` failed: {source}")]
    Wait { command: String, source: io::Error },
    /// Reading its output failed.
    #[error("reading git's output failed: {0}")]
    Io(io::Error),
}

struct ExitDisplay(ExitStatus);

impl fmt::Display for ExitDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use std::os::unix::process::ExitStatusExt;
        match (self.0.code(), self.0.signal()) {
            (Some(code), _) => write!(f, "exit status {code}"),
            (None, Some(signal)) => write!(f, "killed by signal {signal}"),
            (None, None) => write!(f, "{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// The test's own, unhardened git, to build fixtures.
    fn git(dir: &Path, args: &[&str]) {
        let out = Command::new("git")
            .current_dir(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run git");
        assert!(
            out.status.success(),
            "git {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes an executable script.
    fn script(path: &Path, text: &str) -> PathBuf {
        fs::write(path, text).expect("write script");
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).expect("chmod");
        path.to_path_buf()
    }

    /// `run`, retried while the script is "busy": a test thread forking meanwhile may hold
    /// the script's write descriptor open until it execs (ETXTBSY).
    fn run_script(git: &HardenedGit) -> Result<Vec<u8>, GitError> {
        retry_while_busy(|| git.run())
    }

    /// `start`, again while the script it runs is still busy being written (ETXTBSY).
    fn retry_while_busy<T>(mut start: impl FnMut() -> Result<T, GitError>) -> Result<T, GitError> {
        for _ in 0..100 {
            match start() {
                Err(GitError::Spawn { source, .. })
                    if source.raw_os_error() == Some(libc::ETXTBSY) =>
                {
                    thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
        start()
    }

    /// A stand-in `git` that prints its environment and arguments.
    fn fake_git(dir: &Path) -> PathBuf {
        script(
            &dir.join("fake-git"),
            "#!/bin/sh\nenv\necho ARGS\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n",
        )
    }

    #[test]
    fn environment_is_cleared_and_overrides_come_first() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let git = HardenedGit::new(tmp.path().join("repo"))
            .program(fake_git(tmp.path()))
            .config("user.name", "host")
            .args(["ls-files", "-z"]);
        let out = run_script(&git).expect("fake git runs");
        let out = String::from_utf8(out).expect("utf-8");
        let (env, args) = out.split_once("ARGS\n").expect("marker");
        let mut names: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        names.sort_unstable();
        // `sh` itself adds PWD (and maybe SHLVL/_); nothing else of ours or the host's.
        names.retain(|n| !matches!(*n, "PWD" | "SHLVL" | "_" | "OLDPWD"));
        let mut expected: Vec<&str> = ENVIRONMENT.iter().map(|(k, _)| *k).collect();
        expected.extend(["PATH", "GIT_CEILING_DIRECTORIES"]);
        expected.sort_unstable();
        assert_eq!(names, expected);
        assert!(env.contains("GIT_CONFIG_GLOBAL=/dev/null\n"));
        assert!(env.contains(&format!(
            "GIT_CEILING_DIRECTORIES={}\n",
            tmp.path().display()
        )));

        let args: Vec<&str> = args.lines().collect();
        assert_eq!(
            args[..3],
            [
                "--no-pager",
                "-C",
                &*tmp.path().join("repo").to_string_lossy()
            ]
        );
        assert!(args
            .iter()
            .skip(3)
            .step_by(2)
            .take(OVERRIDES.len() + 1)
            .all(|a| *a == "-c"));
        let values: Vec<&str> = args
            .iter()
            .skip(4)
            .step_by(2)
            .take(OVERRIDES.len() + 1)
            .copied()
            .collect();
        assert_eq!(values[0], "core.hooksPath=/dev/null");
        assert!(values.contains(&"core.fsmonitor=false"));
        assert!(values.contains(&"protocol.allow=never"));
        assert_eq!(
            values.last().copied(),
            Some("user.name=host"),
            "caller config comes last"
        );
        assert_eq!(args[args.len() - 2..], ["ls-files", "-z"]);
    }

    #[test]
    fn git_dir_mode_names_git_dir_and_work_tree() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let git = HardenedGit::with_git_dir("/r/.git", Some(Path::new("/r")))
            .program(fake_git(tmp.path()))
            .arg("rev-parse");
        let out = run_script(&git).expect("fake git runs");
        let out = String::from_utf8(out).expect("utf-8");
        let (env, args) = out.split_once("ARGS\n").expect("marker");
        assert!(!env.contains("GIT_CEILING_DIRECTORIES"));
        let args: Vec<&str> = args.lines().collect();
        assert_eq!(
            args[..5],
            [
                "--no-pager",
                "-C",
                "/r",
                "--git-dir=/r/.git",
                "--work-tree=/r"
            ]
        );
    }

    #[test]
    fn without_a_work_tree_git_runs_bare() {
        let tmp = tempfile::tempdir().expect("tempdir");
        git(tmp.path(), &["init", "-q"]);
        fs::write(tmp.path().join("a"), "a\n").expect("write");
        let git_dir = tmp.path().join(".git");
        let err = HardenedGit::with_git_dir(&git_dir, None)
            .args(["ls-files", "--others"])
            .run()
            .expect_err("bare");
        assert!(
            err.to_string().contains("must be run in a work tree"),
            "{err}"
        );
        let out = HardenedGit::with_git_dir(&git_dir, Some(tmp.path()))
            .args(["ls-files", "-z", "--others"])
            .run()
            .expect("ls-files");
        assert_eq!(out, b"a\0");
    }

    #[test]
    fn hostile_config_is_not_obeyed_by_plumbing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = tmp.path().join("repo");
        fs::create_dir(&repo).expect("mkdir");
        git(&repo, &["init", "-q"]);
        fs::write(repo.join("a"), "a\n").expect("write");
        git(&repo, &["add", "a"]);
        git(&repo, &["commit", "-qm", "a"]);
        let marker = tmp.path().join("pwned");
        git(
            &repo,
            &[
                "config",
                "core.fsmonitor",
                &format!("touch {}", marker.display()),
            ],
        );
        // Unhardened, plain `ls-files` runs the fsmonitor: the test is meaningful.
        git(&repo, &["ls-files"]);
        assert!(marker.exists(), "unhardened git runs core.fsmonitor");
        fs::remove_file(&marker).expect("rm marker");

        let out = HardenedGit::new(&repo)
            .args(["ls-files", "-z"])
            .run()
            .expect("ls-files");
        assert_eq!(out, b"a\0");
        HardenedGit::new(&repo)
            .args(["rev-parse", "--verify", "HEAD"])
            .run()
            .expect("rev-parse");
        assert!(!marker.exists(), "hardened git ran the fsmonitor");
    }

    #[test]
    fn transports_are_refused_unless_allowed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let src = tmp.path().join("src");
        fs::create_dir(&src).expect("mkdir");
        git(&src, &["init", "-q"]);
        fs::write(src.join("a"), "a\n").expect("write");
        git(&src, &["add", "a"]);
        git(&src, &["commit", "-qm", "a"]);
        let url = format!("file://{}", src.display());

        let refused = HardenedGit::new(tmp.path())
            .args(["clone", "-q", &url, "refused"])
            .run()
            .expect_err("file:// refused");
        let text = refused.to_string();
        assert!(text.contains("git clone -q"), "{text}");
        assert!(text.contains("transport 'file' not allowed"), "{text}");

        HardenedGit::new(tmp.path())
            .allow_protocol(Protocol::File)
            .args(["clone", "-q", &url, "allowed"])
            .run()
            .expect("file:// allowed when opted in");
        assert!(tmp.path().join("allowed/a").exists());
    }

    #[test]
    fn discovery_stops_at_the_directory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        git(tmp.path(), &["init", "-q"]);
        let sub = tmp.path().join("sub");
        fs::create_dir(&sub).expect("mkdir");
        let err = HardenedGit::new(&sub)
            .args(["rev-parse", "--git-dir"])
            .run()
            .expect_err("no repo");
        assert!(err.to_string().contains("not a git repository"), "{err}");
    }

    #[test]
    fn a_timeout_kills_git_and_what_it_started() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // A child that outlives its parent would keep the pipes open if only the parent died.
        let slow = script(
            &tmp.path().join("slow-git"),
            "#!/bin/sh\nsleep 30 &\nsleep 30\n",
        );
        let started = Instant::now();
        let git = HardenedGit::new(tmp.path())
            .program(&slow)
            .timeout(Duration::from_millis(300))
            .arg("status");
        let err = run_script(&git).expect_err("times out");
        assert!(matches!(err, GitError::TimedOut { .. }), "{err}");
        assert!(
            err.to_string().contains("`git status` did not finish"),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );

        let out = HardenedGit::new(tmp.path())
            .timeout(Duration::from_secs(60))
            .arg("version")
            .run()
            .expect("git version");
        assert!(out.starts_with(b"git version "));
    }

    /// `spawn_fed` runs the same command as `spawn` (environment, arguments, the directory
    /// descriptor), with what the caller writes on its stdin.
    #[test]
    fn a_fed_git_gets_the_same_command_and_its_input() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fed = script(
            &tmp.path().join("fed-git"),
            "#!/bin/sh\nenv | sort\necho ARGS \"$@\"\ncat\nls /proc/self/fd/3/\n",
        );
        fs::create_dir(tmp.path().join("proj")).expect("mkdir");
        fs::write(tmp.path().join("proj/marker"), "").expect("write");
        let dir = fs::File::open(tmp.path().join("proj")).expect("open");
        let git = HardenedGit::in_dir_fd(std::os::fd::AsFd::as_fd(&dir))
            .program(&fed)
            .args(["apply", "-"]);
        let mut running = retry_while_busy(|| git.spawn_fed()).expect("spawn");
        std::io::Write::write_all(&mut running.take_stdin().expect("stdin"), b"the patch\n")
            .expect("feed");
        let out = String::from_utf8(running.finish().expect("finish")).expect("utf-8");
        let forked = String::from_utf8(run_script(&git).expect("run")).expect("utf-8");
        // Everything but what was fed is what the forked start printed.
        assert_eq!(out.replace("the patch\n", ""), forked);
        assert!(out.contains("ARGS --no-pager -C /proc/self/fd/3"), "{out}");
        assert!(out.contains("the patch\nmarker\n"), "{out}");
        // The environment is the hardened one, not this process's (cargo sets this one).
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        assert!(!out.contains("CARGO_PKG_NAME="), "{out}");
    }

    #[test]
    fn missing_binary_is_named() {
        let err = HardenedGit::new("/")
            .program("/nonexistent/git")
            .arg("version")
            .run()
            .expect_err("no such binary");
        assert!(err.to_string().contains("/nonexistent/git"), "{err}");
        assert!(err.to_string().contains("install git"), "{err}");
    }

    #[test]
    fn a_directory_descriptor_is_followed_not_its_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (proj, other) = (tmp.path().join("proj"), tmp.path().join("other"));
        for (dir, file) in [(&proj, "mine.txt"), (&other, "theirs.txt")] {
            fs::create_dir(dir).expect("mkdir");
            git(dir, &["init", "-q"]);
            fs::write(dir.join(file), "x").expect("write");
            git(dir, &["add", "-A"]);
        }
        let fd = nix::fcntl::open(
            &proj,
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .expect("open");
        // The path now leads elsewhere; git must still read the directory that was opened.
        fs::rename(&proj, tmp.path().join("moved")).expect("rename");
        std::os::unix::fs::symlink(&other, &proj).expect("symlink");
        let listed = HardenedGit::in_dir_fd(std::os::fd::AsFd::as_fd(&fd))
            .args(["ls-files", "-z"])
            .run()
            .expect("ls-files");
        assert_eq!(listed, b"mine.txt\0");
    }
}
