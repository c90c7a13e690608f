//! Running `git` with a hardened environment: no system or global config, no hooks, no
//! fsmonitor, no transports, no prompts, no auto-gc, and the process-wide facts about the
//! installed git (its path, its version, whether it honours `GIT_ATTR_SOURCE`) found once.
//!
//! Every run goes through [`crate::command`], hence the agent's own fork/exec and reaper.

use std::ffi::{CString, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::sync::{mpsc, OnceCell};

use crate::command::{self, env_list, Finished, RunError};
use crate::process_group::Stop;
use crate::spawn::BASE_PATH;
use crate::spawn::{ChildSpec, ExecUser};

/// The empty tree's id in a SHA-1 repository (the private one always is).
pub const EMPTY_TREE_SHA1: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// Identity written into reflogs and the baseline commit.
pub const IDENTITY_NAME: &str = "dynocap";
pub const IDENTITY_EMAIL: &str = "dynocap@localhost";

/// `-c` settings given to every git run, ahead of anything a repository's own config says.
const HARDENING: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "protocol.allow=never",
    "safe.directory=*",
    "gc.auto=0",
    "maintenance.auto=false",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.symlinks=true",
    "core.fileMode=true",
    "core.ignoreCase=false",
    "core.precomposeUnicode=false",
    "core.untrackedCache=false",
    "core.splitIndex=false",
    "core.quotePath=true",
    "advice.addEmbeddedRepo=false",
    "advice.detachedHead=false",
];

/// Why a git command line cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{0} contains a NUL byte")]
    Nul(&'static str),
    #[error("{0}")]
    Env(#[source] std::io::Error),
}

/// The installed git, found on the agent's PATH.
#[derive(Debug)]
pub struct Git {
    pub program: CString,
    /// Git 2.40 and later read attributes from `GIT_ATTR_SOURCE` instead of the work tree.
    pub attr_source: bool,
}

static GIT: OnceCell<Git> = OnceCell::const_new();

/// The installed git, detected on first use (a failed detection is retried next time).
pub async fn git(stop: &mut mpsc::Receiver<Stop>) -> Result<&'static Git, RunError> {
    GIT.get_or_try_init(|| detect(stop)).await
}

fn find_program() -> Option<PathBuf> {
    BASE_PATH
        .split(':')
        .map(|dir| Path::new(dir).join("git"))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

async fn detect(stop: &mut mpsc::Receiver<Stop>) -> Result<Git, RunError> {
    let program = find_program().ok_or(RunError::NoGit)?;
    let program =
        CString::new(program.as_os_str().as_bytes()).map_err(|_| RunError::NulInGitPath)?;
    let probe = Git {
        program,
        attr_source: false,
    };
    let out = probe
        .run(&[OsStr::new("version")], Run::new(Path::new("/")), stop)
        .await?;
    let text = String::from_utf8_lossy(&out);
    let version = parse_version(&text);
    let attr_source = version.is_some_and(|v| v >= (2, 40));
    if !attr_source {
        log!(
            "{} does not support GIT_ATTR_SOURCE (2.40 or later needed): only the private \
             repository's info/attributes keeps the work tree's .gitattributes out of the diff",
            text.trim()
        );
    }
    Ok(Git {
        attr_source,
        ..probe
    })
}

/// `git version 2.47.3` → `(2, 47)`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let rest = text.trim().strip_prefix("git version ")?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Where and how one git run happens.
pub struct Run<'a> {
    pub cwd: &'a Path,
    /// Run as this user instead of the agent's.
    pub user: Option<ExecUser>,
    /// Environment added to the hardened base.
    pub env: Vec<(&'static str, String)>,
    /// `-c` settings added after the hardening ones.
    pub config: Vec<String>,
    pub stdin: Option<OwnedFd>,
    /// Cap on collected stdout.
    pub cap: usize,
    /// Run this copy of git instead, keeping this supplementary group (see `gitguard`).
    pub guarded: Option<(CString, Option<u32>)>,
}

impl<'a> Run<'a> {
    pub fn new(cwd: &'a Path) -> Self {
        Self {
            cwd,
            user: None,
            env: Vec::new(),
            config: Vec::new(),
            stdin: None,
            cap: command::OUTPUT_CAP,
            guarded: None,
        }
    }

    pub fn guarded(mut self, program: CString, group: Option<u32>) -> Self {
        self.guarded = Some((program, group));
        self
    }

    pub fn user(mut self, user: Option<ExecUser>) -> Self {
        self.user = user;
        self
    }

    pub fn env(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.env.push((key, value.into()));
        self
    }

    pub fn config(mut self, setting: impl Into<String>) -> Self {
        self.config.push(setting.into());
        self
    }

    pub fn stdin(mut self, fd: OwnedFd) -> Self {
        self.stdin = Some(fd);
        self
    }
}

impl Git {
    /// The process description of `git <hardening> <run.config> <args>`.
    pub fn spec<S: AsRef<OsStr>>(&self, args: &[S], run: Run<'_>) -> Result<ChildSpec, SpecError> {
        let nul = SpecError::Nul;
        let mut argv = vec![c"git".to_owned()];
        for setting in HARDENING
            .iter()
            .map(|s| s.to_string())
            .chain(run.config.iter().cloned())
        {
            argv.push(c"-c".to_owned());
            argv.push(CString::new(setting).map_err(|_| nul("a git setting"))?);
        }
        for arg in args {
            argv.push(CString::new(arg.as_ref().as_bytes()).map_err(|_| nul("a git argument"))?);
        }
        let mut env: Vec<(&str, &str)> = vec![
            ("PATH", BASE_PATH),
            ("HOME", "/nonexistent"),
            ("LC_ALL", "C"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_TERMINAL_PROMPT", "0"),
            ("GIT_NO_REPLACE_OBJECTS", "1"),
            ("GIT_COMMITTER_NAME", IDENTITY_NAME),
            ("GIT_COMMITTER_EMAIL", IDENTITY_EMAIL),
        ];
        env.extend(run.env.iter().map(|(k, v)| (*k, v.as_str())));
        let env = env_list(env).map_err(SpecError::Env)?;
        let (program, extra_group) = match run.guarded {
            Some((program, group)) => (program, group),
            None => (self.program.clone(), None),
        };
        Ok(ChildSpec {
            program,
            argv,
            env,
            cwd: CString::new(run.cwd.as_os_str().as_bytes())
                .map_err(|_| nul("a working directory"))?,
            terminal: false,
            user: run.user,
            stdin: run.stdin,
            cgroup: None,
            extra_group,
            stdio: None,
        })
    }

    /// Runs git to its end; a non-zero exit is an error naming the subcommand.
    pub async fn run<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        run: Run<'_>,
        stop: &mut mpsc::Receiver<Stop>,
    ) -> Result<Vec<u8>, RunError> {
        let (out, finished) = self.run_status(args, run, stop).await?;
        if finished.success() {
            Ok(out)
        } else {
            Err(RunError::GitFailed {
                subcommand: subcommand(args),
                outcome: finished.describe(),
            })
        }
    }

    /// Runs git to its end and returns its status whatever it is.
    pub async fn run_status<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        run: Run<'_>,
        stop: &mut mpsc::Receiver<Stop>,
    ) -> Result<(Vec<u8>, Finished), RunError> {
        let cap = run.cap;
        let spec = self.spec(args, run)?;
        command::run(&spec, cap, stop)
            .await
            .map_err(|err| match err {
                RunError::Cancelled => RunError::Cancelled,
                err => RunError::Git {
                    subcommand: subcommand(args),
                    source: Box::new(err),
                },
            })
    }
}

/// The first argument that is not an option, for messages.
pub fn subcommand<S: AsRef<OsStr>>(args: &[S]) -> String {
    let mut args = args.iter().map(|a| a.as_ref().to_string_lossy());
    while let Some(arg) = args.next() {
        if arg == "-c" || arg == "-C" {
            args.next(); // the option's value
        } else if !arg.starts_with('-') {
            return arg.into_owned();
        }
    }
    String::new()
}

/// Whether `text` is a full object id (SHA-1 or SHA-256, lower-case hex).
pub fn is_object_id(text: &str) -> bool {
    (text.len() == 40 || text.len() == 64)
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The first line of git's output, trimmed.
pub fn first_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("git version 2.47.3\n"), Some((2, 47)));
        assert_eq!(parse_version("git version 2.39.5"), Some((2, 39)));
        assert_eq!(
            parse_version("git version 2.40.0.rc1.windows.1"),
            Some((2, 40))
        );
        assert_eq!(parse_version("nonsense"), None);
    }

    #[test]
    fn object_ids_and_subcommands() {
        assert!(is_object_id(EMPTY_TREE_SHA1));
        assert!(is_object_id(&"a".repeat(64)));
        assert!(!is_object_id(&"A".repeat(40)));
        assert!(!is_object_id(&"a".repeat(41)));
        assert!(!is_object_id("refs/heads/main"));
        assert_eq!(subcommand(&["--git-dir=x", "add", "-A"]), "add");
        assert_eq!(
            subcommand(&["--git-dir=x", "-c", "core.x=1", "update-index", "-z"]),
            "update-index"
        );
    }

    #[tokio::test]
    async fn git_is_found_and_hardened() {
        crate::init::setup();
        let (_tx, mut stop) = mpsc::channel(1);
        let git = match git(&mut stop).await {
            Ok(git) => git,
            Err(err) => panic!("git: {err:?}"),
        };
        assert!(git.program.to_bytes().ends_with(b"/git"), "{git:?}");
        let out = git
            .run(
                &["config", "--get", "core.hooksPath"],
                Run::new(Path::new("/")),
                &mut stop,
            )
            .await;
        assert!(matches!(out, Ok(ref o) if o == b"/dev/null\n"), "{out:?}");
    }
}
