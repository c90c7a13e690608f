//! `sudo` as the sandbox user runs it: the agent binary under that name parses the common
//! sudo options, sends the command to the broker and exits with its exit code.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use super::wire::{check_assignment, encode, EncodeError, VERSION};
use super::SOCKET;

/// Why a command could not be run through the broker (`sudo: ` and this, on stderr).
#[derive(Debug, thiserror::Error)]
enum ClientError {
    #[error(
        "this sandbox has no root access: its image does not offer sudo (the host image never \
         does; start the sandbox with --image debian)"
    )]
    NoBroker(#[source] std::io::Error),
    #[error("cannot reach the agent at {SOCKET}: {0}")]
    Connect(#[source] std::io::Error),
    #[error("cannot read the working directory: {0}")]
    Cwd(#[source] std::io::Error),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("cannot send the request to the agent: {0}")]
    SendFds(#[source] nix::errno::Errno),
    #[error("cannot send the request to the agent: {0}")]
    Send(#[source] std::io::Error),
    #[error("the agent ended the command without an exit code")]
    NoExitCode(#[source] std::io::Error),
}

/// True when this binary was started under the name `sudo`.
pub fn invoked_as_sudo(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new("sudo"))
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Invocation {
    /// The command, and the `VAR=value` assignments before it, applied last (over the root
    /// environment the broker makes) as sudo applies them.
    Run {
        argv: Vec<OsString>,
        assignments: Vec<OsString>,
    },
    /// `-u` naming the caller: the command runs as the caller, here, with the assignments
    /// over the caller's environment (sudo itself does no more for it).
    RunAsCaller {
        argv: Vec<OsString>,
        assignments: Vec<OsString>,
    },
    /// `-v`, `-k`, `-K`: nothing to validate or forget.
    Nothing,
    Usage(String),
}

/// Who runs `sudo`: `-u` may name them as well as root.
struct Caller {
    uid: u32,
    name: Option<String>,
}

impl Caller {
    fn current() -> Self {
        let uid = nix::unistd::getuid();
        Self {
            uid: uid.as_raw(),
            name: nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|user| user.name),
        }
    }

    /// Whether `user` (a name, a uid, or `#uid`) names the caller.
    fn is(&self, user: &str) -> bool {
        self.name.as_deref() == Some(user)
            || user.strip_prefix('#').unwrap_or(user).parse::<u32>() == Ok(self.uid)
    }
}

/// Parses the common sudo options. Options that change who or how are refused: there is one
/// target (root, or the caller itself) and no password. `-E` and `--preserve-env` are accepted
/// as they are: the caller's environment is always kept (but for HOME, USER, LOGNAME, PATH and
/// MAIL, which the broker sets as root's), which is what they ask for.
fn parse(args: &[OsString], caller: &Caller) -> Invocation {
    let mut rest = args.iter();
    let mut shell = false;
    let mut as_caller = false;
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy();
        match text.as_ref() {
            "--" => return command(rest.cloned().collect(), shell, as_caller),
            "-E" | "-H" | "-n" | "-S" | "-P" | "--preserve-env" | "--non-interactive"
            | "--set-home" => {}
            _ if text.starts_with("--preserve-env=") => {}
            "-v" | "-k" | "-K" | "--validate" | "--reset-timestamp" => return Invocation::Nothing,
            "-s" | "-i" | "--shell" | "--login" => shell = true,
            "-u" | "--user" => match rest.next().map(|u| u.to_string_lossy().into_owned()) {
                Some(user) if ["root", "0", "#0"].contains(&user.as_str()) => as_caller = false,
                Some(user) if caller.is(&user) => as_caller = true,
                Some(user) => {
                    return Invocation::Usage(format!(
                        "sudo: only root (and you) are available in this sandbox, not {user:?}"
                    ))
                }
                None => return Invocation::Usage("sudo: -u needs a user".into()),
            },
            _ if text.starts_with('-') && text.len() > 1 => {
                return Invocation::Usage(format!(
                    "sudo: option {text} is not supported by DynoCap's sudo; use `sudo COMMAND [ARG...]`"
                ))
            }
            _ => {
                let mut all = vec![arg.clone()];
                all.extend(rest.cloned());
                return command(all, shell, as_caller);
            }
        }
    }
    command(Vec::new(), shell, as_caller)
}

/// The command after the options: `VAR=value` words first (as sudo takes them: any word with
/// a `=` not at its start), then the command and its arguments.
fn command(args: Vec<OsString>, shell: bool, as_caller: bool) -> Invocation {
    let mut words = args.into_iter().peekable();
    let mut assignments = Vec::new();
    while let Some(word) = words.next_if(|w| is_assignment(w)) {
        if let Err(message) = check_assignment(word.as_bytes()) {
            return Invocation::Usage(format!("sudo: {message}"));
        }
        assignments.push(word);
    }
    let args: Vec<OsString> = words.collect();
    let argv = match (args.is_empty(), shell) {
        (true, true) => vec!["/bin/bash".into()],
        (true, false) => {
            return Invocation::Usage("usage: sudo [VAR=value...] COMMAND [ARG...]".into())
        }
        (false, true) => {
            // `sudo -s CMD ARGS`: the shell runs the words as one command line.
            let line = args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ");
            vec!["/bin/sh".into(), "-c".into(), line.into()]
        }
        (false, false) => args,
    };
    if as_caller {
        Invocation::RunAsCaller { argv, assignments }
    } else {
        Invocation::Run { argv, assignments }
    }
}

/// Whether sudo reads `word` as an assignment rather than as the command: it has a `=`, and
/// not as its first byte (`=x` is a command's name).
fn is_assignment(word: &OsStr) -> bool {
    word.as_bytes().iter().position(|b| *b == b'=').unwrap_or(0) > 0
}

/// The `sudo` client. Returns the command's exit code.
pub fn client(args: &[OsString]) -> ExitCode {
    let (argv, assignments) = match parse(args, &Caller::current()) {
        Invocation::Run { argv, assignments } => (argv, assignments),
        Invocation::RunAsCaller { argv, assignments } => return run_here(&argv, &assignments),
        Invocation::Nothing => return ExitCode::SUCCESS,
        Invocation::Usage(message) => {
            let _ = writeln!(std::io::stderr(), "{message}");
            return ExitCode::from(1);
        }
    };
    match run_remote(&argv, &assignments) {
        Ok(code) => ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)),
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "sudo: {message}");
            ExitCode::from(1)
        }
    }
}

/// Runs the command in place of this process, as the caller, with `assignments` (checked
/// `VAR=value` words) over the caller's environment. Returns only when it cannot be run.
fn run_here(argv: &[OsString], assignments: &[OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt as _;
    let Some((program, args)) = argv.split_first() else {
        return ExitCode::from(1);
    };
    let mut command = std::process::Command::new(program);
    command.args(args);
    for assignment in assignments {
        let bytes = assignment.as_bytes();
        if let Some(at) = bytes.iter().position(|b| *b == b'=') {
            command.env(
                OsStr::from_bytes(&bytes[..at]),
                OsStr::from_bytes(&bytes[at + 1..]),
            );
        }
    }
    let err = command.exec();
    let _ = writeln!(
        std::io::stderr(),
        "sudo: {}: {err}",
        program.to_string_lossy()
    );
    // As sudo: 1 when the command could not be run.
    ExitCode::from(1)
}

fn run_remote(argv: &[OsString], assignments: &[OsString]) -> Result<i32, ClientError> {
    let mut stream = UnixStream::connect(SOCKET).map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ClientError::NoBroker(err)
        }
        _ => ClientError::Connect(err),
    })?;
    let cwd = std::env::current_dir().map_err(ClientError::Cwd)?;
    let env: Vec<OsString> = std::env::vars_os()
        .map(|(k, v)| {
            let mut entry = k;
            entry.push("=");
            entry.push(v);
            entry
        })
        .collect();
    let mut fields: Vec<&[u8]> = vec![VERSION, cwd.as_os_str().as_bytes()];
    let argc = argv.len().to_string();
    fields.push(argc.as_bytes());
    fields.extend(argv.iter().map(|a| a.as_bytes()));
    let envc = env.len().to_string();
    fields.push(envc.as_bytes());
    fields.extend(env.iter().map(|e| e.as_bytes()));
    let setc = assignments.len().to_string();
    fields.push(setc.as_bytes());
    fields.extend(assignments.iter().map(|a| a.as_bytes()));
    let request = encode(&fields)?;

    let stdio = [0, 1, 2];
    let rights = [ControlMessage::ScmRights(&stdio)];
    let first = [std::io::IoSlice::new(&request)];
    let sent = sendmsg::<()>(stream.as_raw_fd(), &first, &rights, MsgFlags::empty(), None)
        .map_err(ClientError::SendFds)?;
    stream
        .write_all(&request[sent..])
        .map_err(ClientError::Send)?;
    let mut reply = [0u8; 4];
    stream
        .read_exact(&mut reply)
        .map_err(ClientError::NoExitCode)?;
    Ok(i32::from_le_bytes(reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// `parse` as the sandbox user (1000, `sandbox`) runs it.
    fn parse_as_sandbox(args: &[OsString]) -> Invocation {
        parse(
            args,
            &Caller {
                uid: 1000,
                name: Some("sandbox".to_owned()),
            },
        )
    }

    fn run(argv: &[&str], assignments: &[&str]) -> Invocation {
        Invocation::Run {
            argv: os(argv),
            assignments: os(assignments),
        }
    }

    #[test]
    fn common_sudo_command_lines_parse() {
        assert_eq!(
            parse_as_sandbox(&os(&["apt-get", "install", "-y", "jq"])),
            run(&["apt-get", "install", "-y", "jq"], &[])
        );
        assert_eq!(
            parse_as_sandbox(&os(&["-E", "-u", "root", "--", "-weird"])),
            run(&["-weird"], &[])
        );
        assert_eq!(
            parse_as_sandbox(&os(&["-s", "id", "-u"])),
            run(&["/bin/sh", "-c", "id -u"], &[])
        );
        assert_eq!(parse_as_sandbox(&os(&["-v"])), Invocation::Nothing);
        assert!(matches!(parse_as_sandbox(&os(&[])), Invocation::Usage(_)));
        // The caller itself, by name or id: the command runs as it, assignments and all.
        for user in ["sandbox", "1000", "#1000"] {
            assert_eq!(
                parse_as_sandbox(&os(&["-u", user, "A=1", "id"])),
                Invocation::RunAsCaller {
                    argv: os(&["id"]),
                    assignments: os(&["A=1"])
                },
                "{user}"
            );
        }
        assert_eq!(
            parse_as_sandbox(&os(&["-u", "sandbox", "-u", "root", "id"])),
            run(&["id"], &[])
        );
        assert!(matches!(
            parse_as_sandbox(&os(&["-u", "nobody", "id"])),
            Invocation::Usage(_)
        ));
        assert!(matches!(
            parse_as_sandbox(&os(&["-u", "1001", "id"])),
            Invocation::Usage(_)
        ));
        assert!(matches!(
            parse_as_sandbox(&os(&["-g", "x", "id"])),
            Invocation::Usage(_)
        ));
        assert!(invoked_as_sudo(OsStr::new("/usr/local/bin/sudo")));
        assert!(!invoked_as_sudo(OsStr::new("/.dynocap/agent")));
    }

    #[test]
    fn assignments_before_the_command_are_the_commands_environment() {
        assert_eq!(
            parse_as_sandbox(&os(&[
                "DEBIAN_FRONTEND=noninteractive",
                "apt-get",
                "install",
                "-y",
                "A=1"
            ])),
            run(
                &["apt-get", "install", "-y", "A=1"],
                &["DEBIAN_FRONTEND=noninteractive"]
            )
        );
        assert_eq!(
            parse_as_sandbox(&os(&["-E", "--", "A=1", "B=", "_c=x=y", "env"])),
            run(&["env"], &["A=1", "B=", "_c=x=y"])
        );
        // A word starting with `=` is the command, as in sudo.
        assert_eq!(
            parse_as_sandbox(&os(&["=x", "A=1"])),
            run(&["=x", "A=1"], &[])
        );
        assert_eq!(
            parse_as_sandbox(&os(&["-s", "A=1", "echo", "$A"])),
            run(&["/bin/sh", "-c", "echo $A"], &["A=1"])
        );
        assert_eq!(
            parse_as_sandbox(&os(&["-s", "A=1"])),
            run(&["/bin/bash"], &["A=1"])
        );
        let usage = |args: &[&str]| match parse_as_sandbox(&os(args)) {
            Invocation::Usage(message) => message,
            other => panic!("{args:?} parsed as {other:?}"),
        };
        assert_eq!(
            usage(&["A=1"]),
            "usage: sudo [VAR=value...] COMMAND [ARG...]"
        );
        assert_eq!(
            usage(&["1A=b", "env"]),
            "sudo: \"1A\" is not a valid environment variable name: in VAR=value, VAR is ASCII \
             letters, digits and underscores, not starting with a digit"
        );
        assert!(usage(&["A=1", "B-C=2", "env"]).starts_with("sudo: \"B-C\" is not a valid"));
        assert!(usage(&["./x=y"]).starts_with("sudo: \"./x\" is not a valid"));
    }
}
