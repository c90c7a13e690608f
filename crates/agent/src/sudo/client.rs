//! `sudo` as the sandbox user runs it: the agent binary under that name parses the common
//! sudo options, sends the command to the broker and exits with its exit code.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
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

/// The options read so far.
#[derive(Default)]
struct Options {
    /// `-s`/`-i`: the command runs through a shell (a shell alone without one).
    shell: bool,
    /// `-u` named the caller.
    as_caller: bool,
    /// `-v` or `-K`, which take no command: there is nothing to validate or forget.
    alone: Option<&'static str>,
    /// `-k`: nothing cached to forget; alone it does nothing, with a command it runs it.
    reset: bool,
}

impl Options {
    /// Applies the option `letter` (a long option's short one), with its value when it takes
    /// one. An option that changes who or how beyond this is refused.
    fn apply(&mut self, letter: u8, value: Option<String>, caller: &Caller) -> Result<(), String> {
        match letter {
            b'E' | b'H' | b'n' | b'S' | b'P' | b'p' => {}
            b's' | b'i' => self.shell = true,
            b'v' => self.alone = Some("-v"),
            b'K' => self.alone = Some("-K"),
            b'k' => self.reset = true,
            b'u' => match value {
                Some(user) if ["root", "0", "#0"].contains(&user.as_str()) => {
                    self.as_caller = false
                }
                Some(user) if caller.is(&user) => self.as_caller = true,
                Some(user) => {
                    return Err(format!(
                        "sudo: only root (and you) are available in this sandbox, not {user:?}"
                    ))
                }
                None => return Err("sudo: -u needs a user".into()),
            },
            other => {
                return Err(format!(
                    "sudo: option -{} is not supported by DynoCap's sudo; use `sudo COMMAND \
                     [ARG...]`",
                    char::from(other).escape_default()
                ))
            }
        }
        Ok(())
    }
}

/// The short options that take a value (`-u USER`, `-uUSER`; `-p PROMPT`, ignored).
const WITH_VALUE: &[u8] = b"up";

/// Long options with the short one each stands for.
const LONG: &[(&str, u8)] = &[
    ("preserve-env", b'E'),
    ("set-home", b'H'),
    ("non-interactive", b'n'),
    ("stdin", b'S'),
    ("preserve-groups", b'P'),
    ("prompt", b'p'),
    ("shell", b's'),
    ("login", b'i'),
    ("validate", b'v'),
    ("remove-timestamp", b'K'),
    ("reset-timestamp", b'k'),
    ("user", b'u'),
];

/// Parses the common sudo options as sudo does (getopt: `-nE` is `-n -E`, `-uroot` and
/// `--user=root` are `-u root`). Options that change who or how are refused: there is one
/// target (root, or the caller itself) and no password. `-E` and `--preserve-env` are accepted
/// as they are: the caller's environment is always kept (but for HOME, USER, LOGNAME, PATH and
/// MAIL, which the broker sets as root's), which is what they ask for.
fn parse(args: &[OsString], caller: &Caller) -> Invocation {
    let mut rest = args.iter();
    let mut options = Options::default();
    let words: Vec<OsString> = loop {
        let Some(arg) = rest.next() else {
            break Vec::new();
        };
        let bytes = arg.as_bytes();
        let applied = if bytes == b"--" {
            break rest.cloned().collect();
        } else if let Some(long) = bytes.strip_prefix(b"--") {
            long_option(long, &mut rest, &mut options, caller)
        } else if bytes.len() > 1 && bytes[0] == b'-' {
            short_options(&bytes[1..], &mut rest, &mut options, caller)
        } else {
            let mut all = vec![arg.clone()];
            all.extend(rest.cloned());
            break all;
        };
        if let Err(message) = applied {
            return Invocation::Usage(message);
        }
    };
    match options.alone {
        Some(_) if words.is_empty() => return Invocation::Nothing,
        Some(option) => return Invocation::Usage(format!("sudo: {option} takes no command")),
        None => {}
    }
    // `-k` alone forgets nothing; with a command (or -s) it runs it, as sudo does.
    if options.reset && words.is_empty() && !options.shell {
        return Invocation::Nothing;
    }
    command(words, options.shell, options.as_caller)
}

/// One cluster of short options (`-nE`, `-Eu root`, `-uroot`), without its `-`.
fn short_options(
    cluster: &[u8],
    rest: &mut std::slice::Iter<'_, OsString>,
    options: &mut Options,
    caller: &Caller,
) -> Result<(), String> {
    for (at, letter) in cluster.iter().enumerate() {
        if WITH_VALUE.contains(letter) {
            let attached = &cluster[at + 1..];
            let value = if attached.is_empty() {
                rest.next().map(|v| v.to_string_lossy().into_owned())
            } else {
                Some(String::from_utf8_lossy(attached).into_owned())
            };
            return options.apply(*letter, value, caller);
        }
        options.apply(*letter, None, caller)?;
    }
    Ok(())
}

/// One long option (`--user=root`, `--user root`, `--login`), without its `--`.
fn long_option(
    long: &[u8],
    rest: &mut std::slice::Iter<'_, OsString>,
    options: &mut Options,
    caller: &Caller,
) -> Result<(), String> {
    let text = String::from_utf8_lossy(long);
    let (name, attached) = match text.split_once('=') {
        Some((name, value)) => (name, Some(value.to_owned())),
        None => (text.as_ref(), None),
    };
    let Some(&(_, letter)) = LONG.iter().find(|(long, _)| *long == name) else {
        return Err(format!(
            "sudo: option --{} is not supported by DynoCap's sudo; use `sudo COMMAND [ARG...]`",
            name.escape_default()
        ));
    };
    let value = match (WITH_VALUE.contains(&letter), attached) {
        (true, Some(value)) => Some(value),
        (true, None) => rest.next().map(|v| v.to_string_lossy().into_owned()),
        // A list of the variables to keep: every one is kept.
        (false, Some(_)) if letter == b'E' => None,
        (false, Some(_)) => return Err(format!("sudo: option --{name} takes no value")),
        (false, None) => None,
    };
    options.apply(letter, value, caller)
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
        // `sudo -s CMD ARGS`: the shell runs the words as one command line, each word as it
        // was given.
        (false, true) => vec!["/bin/sh".into(), "-c".into(), shell_line(&args)],
        (false, false) => args,
    };
    if as_caller {
        Invocation::RunAsCaller { argv, assignments }
    } else {
        Invocation::Run { argv, assignments }
    }
}

/// The command line `sudo -s` gives the shell: the words joined by spaces, every ASCII byte
/// but letters, digits, `_`, `-` and `$` escaped by a backslash, as sudo escapes them. So
/// each word reaches the command as one argument (`sudo -s touch 'a b'` makes one file), and
/// `$VAR` is expanded by root's shell.
fn shell_line(words: &[OsString]) -> OsString {
    let mut line = Vec::new();
    for (i, word) in words.iter().enumerate() {
        if i > 0 {
            line.push(b' ');
        }
        for &byte in word.as_bytes() {
            if byte.is_ascii() && !(byte.is_ascii_alphanumeric() || b"_-$".contains(&byte)) {
                line.push(b'\\');
            }
            line.push(byte);
        }
    }
    OsString::from_vec(line)
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
    fn options_are_read_as_sudo_reads_them() {
        // Clustered, attached and long forms, as getopt reads them.
        for args in [
            &["-nE", "id"][..],
            &["-uroot", "id"],
            &["--user=root", "id"],
            &["--user", "root", "id"],
            &["-Eu", "root", "id"],
            &["-HEnu#0", "id"],
            &["--preserve-env=PATH,HOME", "--non-interactive", "id"],
            &["-p", "", "id"],
            &["--prompt=[sudo] ", "-S", "id"],
            &["-k", "id"],
            &["--reset-timestamp", "id"],
        ] {
            assert_eq!(parse_as_sandbox(&os(args)), run(&["id"], &[]), "{args:?}");
        }
        assert_eq!(
            parse_as_sandbox(&os(&["-Eusandbox", "id"])),
            Invocation::RunAsCaller {
                argv: os(&["id"]),
                assignments: Vec::new()
            }
        );
        // -k alone forgets nothing; -v and -K take no command.
        for args in [&["-k"][..], &["-v"], &["-K"], &["--validate"]] {
            assert_eq!(parse_as_sandbox(&os(args)), Invocation::Nothing, "{args:?}");
        }
        let usage = |args: &[&str]| match parse_as_sandbox(&os(args)) {
            Invocation::Usage(message) => message,
            other => panic!("{args:?} parsed as {other:?}"),
        };
        assert_eq!(usage(&["-v", "id"]), "sudo: -v takes no command");
        assert_eq!(usage(&["-K", "id"]), "sudo: -K takes no command");
        assert!(usage(&["-Eg", "x", "id"]).starts_with("sudo: option -g is not supported"));
        assert!(usage(&["--group=x", "id"]).starts_with("sudo: option --group is not supported"));
        assert_eq!(
            usage(&["--login=x", "id"]),
            "sudo: option --login takes no value"
        );
        assert_eq!(usage(&["-u"]), "sudo: -u needs a user");
        assert!(usage(&["-unobody", "id"]).contains("not \"nobody\""));
    }

    #[test]
    fn a_shells_command_line_keeps_each_word_whole() {
        assert_eq!(
            parse_as_sandbox(&os(&[
                "-s", "touch", "a b", "it's", "$HOME", ";", "x\\y", "é"
            ])),
            run(
                &["/bin/sh", "-c", "touch a\\ b it\\'s $HOME \\; x\\\\y é"],
                &[]
            )
        );
        assert_eq!(
            parse_as_sandbox(&os(&["-i", "-k", "echo", "-n"])),
            run(&["/bin/sh", "-c", "echo -n"], &[])
        );
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
