//! `dynocap-agent`: the guest's PID 1. Owns the command line, the order of start-up steps
//! (mounts, reaper, channel, runtime) and the way the process ends.
//!
//! ```text
//! dynocap-agent --channel-fd N [--cgroup-fd N] [--exec-user UID:GID] [--home DIR]
//! dynocap-agent --channel-path PATH [--cgroup-fd N] [--exec-user UID:GID] [--home DIR]
//! sudo COMMAND [ARG...]     (under that name: the client of `--sudo-broker`, see `sudo`)
//! dynocap-agent file-op UID:GID   (started by the agent for one file operation, see `files`)
//! ```
//!
//! In a VM the kernel starts the agent as the initramfs' `/init` with `--vm-boot` first:
//! see `vm_boot`, which boots the sandbox's disk and re-executes the agent in it.
//!
//! `--cgroup-fd` is a directory descriptor of a cgroup delegated to the agent, where each
//! command gets a cgroup of its own (see `cgroup`).

use std::ffi::OsString;
use std::io::Write as _;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Writes one line to stderr. Never panics (unlike `eprintln!`, which panics when stderr is a
/// closed pipe): as PID 1 a panic would take the whole guest down.
macro_rules! log {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "dynocap-agent: {}", format_args!($($arg)*));
    }};
}

mod apt_cache;
mod bigfiles;
mod cgroup;
mod channel;
mod checkout_tar;
mod clone;
mod command;
mod config;
mod diff_split;
mod disk_health;
mod egress;
mod exec;
mod files;
mod forward;
mod fsutil;
mod git;
mod git_index;
mod gitguard;
mod index_memo;
mod init;
mod input;
mod journal;
mod outbox;
mod process_group;
mod proxy_connect;
mod reaper;
mod repo;
mod script;
mod server;
mod session;
mod spawn;
mod statedir;
mod sudo;
mod unpack;
mod vm_boot;
mod vm_cache;
mod vm_net;
mod vmstat;

#[cfg(test)]
mod test_support;

const USAGE: &str = "usage: dynocap-agent --channel-fd N [--cgroup-fd N] [--exec-user UID:GID] [--home DIR] [--sudo-broker]\n       \
     dynocap-agent --channel-path PATH [--cgroup-fd N] [--exec-user UID:GID] [--home DIR] [--sudo-broker]";

/// Where the byte stream to the host comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ChannelArg {
    /// An inherited descriptor (a socketpair end in the jail backend).
    Fd(RawFd),
    /// A character device such as a virtio-serial port (VM backend).
    Path(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Run {
        channel: ChannelArg,
        /// `--cgroup-fd`: becomes `config.exec_cgroups` once adopted.
        cgroup_fd: Option<RawFd>,
        config: config::Config,
        /// `--sudo-broker`: serve `sudo` for the exec user (see `sudo`).
        sudo_broker: bool,
    },
    Help,
    Version,
}

/// Why the command line is not one the agent runs with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ArgsError {
    #[error("argument {0:?} is not UTF-8")]
    NotUtf8(OsString),
    #[error("{0} needs a value")]
    MissingValue(String),
    #[error("value {value:?} of {flag} is not UTF-8")]
    ValueNotUtf8 { flag: String, value: OsString },
    #[error("give exactly one of --channel-fd and --channel-path")]
    TwoChannels,
    #[error("one of --channel-fd or --channel-path is required")]
    NoChannel,
    #[error("{0} given twice")]
    Repeated(&'static str),
    #[error("--channel-path is empty")]
    EmptyChannelPath,
    #[error("--home {0:?} must be an absolute path")]
    RelativeHome(String),
    #[error("unknown argument {0:?}")]
    Unknown(String),
    #[error("{flag} {raw:?} is not a file descriptor number")]
    NotAnFd { flag: &'static str, raw: String },
    #[error("{flag} {fd}: must be 3 or higher (0-2 are stdio)")]
    StdioFd { flag: &'static str, fd: RawFd },
    #[error("--exec-user {0:?} must be UID:GID (two numbers)")]
    ExecUser(String),
    #[error("--cgroup-fd and --channel-fd name the same descriptor")]
    SameFd,
    #[error("--sudo-broker needs --exec-user (whom it serves)")]
    SudoBrokerWithoutUser,
}

/// Why a descriptor or path the command line named cannot serve the agent.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{flag} {fd} is not an open descriptor: {source}")]
    NotOpen {
        flag: &'static str,
        fd: RawFd,
        source: nix::errno::Errno,
    },
    #[error("cannot open --channel-path {}: {source}", path.display())]
    ChannelPath {
        path: PathBuf,
        source: nix::errno::Errno,
    },
    #[error("--cgroup-fd {fd}: {source}")]
    Cgroups { fd: RawFd, source: std::io::Error },
}

fn parse_args<I: IntoIterator<Item = OsString>>(args: I) -> Result<Command, ArgsError> {
    let mut channel = None;
    let mut cgroup_fd = None;
    let mut exec_user = None;
    let mut home = None;
    let mut sudo_broker = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg.into_string().map_err(ArgsError::NotUtf8)?;
        // Both `--flag value` and `--flag=value` are accepted, as most tools do.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg, None),
        };
        let mut value = |name: &str| -> Result<String, ArgsError> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args
                    .next()
                    .ok_or_else(|| ArgsError::MissingValue(name.to_owned()))?
                    .into_string()
                    .map_err(|value| ArgsError::ValueNotUtf8 {
                        flag: name.to_owned(),
                        value,
                    }),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--channel-fd" | "--channel-path" if channel.is_some() => {
                return Err(ArgsError::TwoChannels);
            }
            "--channel-fd" => {
                // 0-2 are the agent's stdio; stderr carries its log, which would corrupt frames.
                channel = Some(ChannelArg::Fd(parse_fd(
                    "--channel-fd",
                    &value("--channel-fd")?,
                )?));
            }
            "--cgroup-fd" => {
                if cgroup_fd.is_some() {
                    return Err(ArgsError::Repeated("--cgroup-fd"));
                }
                cgroup_fd = Some(parse_fd("--cgroup-fd", &value("--cgroup-fd")?)?);
            }
            "--channel-path" => {
                let path = value("--channel-path")?;
                if path.is_empty() {
                    return Err(ArgsError::EmptyChannelPath);
                }
                channel = Some(ChannelArg::Path(path.into()));
            }
            "--exec-user" => {
                if exec_user.is_some() {
                    return Err(ArgsError::Repeated("--exec-user"));
                }
                exec_user = Some(parse_exec_user(&value("--exec-user")?)?);
            }
            "--home" => {
                if home.is_some() {
                    return Err(ArgsError::Repeated("--home"));
                }
                let dir = value("--home")?;
                if !dir.starts_with('/') {
                    return Err(ArgsError::RelativeHome(dir));
                }
                home = Some(PathBuf::from(dir));
            }
            "--sudo-broker" => sudo_broker = true,
            other => return Err(ArgsError::Unknown(other.to_owned())),
        }
    }
    let channel = channel.ok_or(ArgsError::NoChannel)?;
    if let (Some(cgroup), ChannelArg::Fd(fd)) = (cgroup_fd, &channel) {
        if cgroup == *fd {
            return Err(ArgsError::SameFd);
        }
    }
    if sudo_broker && exec_user.is_none() {
        return Err(ArgsError::SudoBrokerWithoutUser);
    }
    Ok(Command::Run {
        channel,
        cgroup_fd,
        config: config::Config {
            exec_user,
            home,
            ..config::Config::default()
        },
        sudo_broker,
    })
}

/// An inherited descriptor number: 3 or higher, since 0-2 are stdio.
fn parse_fd(flag: &'static str, raw: &str) -> Result<RawFd, ArgsError> {
    let fd: RawFd = raw.parse().map_err(|_| ArgsError::NotAnFd {
        flag,
        raw: raw.to_owned(),
    })?;
    if fd < 3 {
        return Err(ArgsError::StdioFd { flag, fd });
    }
    Ok(fd)
}

fn parse_exec_user(text: &str) -> Result<spawn::ExecUser, ArgsError> {
    let bad = || ArgsError::ExecUser(text.to_owned());
    let (uid, gid) = text.split_once(':').ok_or_else(bad)?;
    Ok(spawn::ExecUser {
        uid: uid.parse().map_err(|_| bad())?,
        gid: gid.parse().map_err(|_| bad())?,
    })
}

/// Takes ownership of an inherited descriptor (named by `flag`) after checking it is open,
/// and marks it close-on-exec: commands must never inherit it.
fn adopt_fd(flag: &'static str, fd: RawFd) -> Result<OwnedFd, StartError> {
    nix::fcntl::fcntl(
        // SAFETY: the borrow only lives for this fcntl call; F_SETFD on a closed number fails
        // with EBADF instead of touching anything.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|source| StartError::NotOpen { flag, fd, source })?;
    // SAFETY: the descriptor is open (checked above), it is >= 3 so std's stdio does not own it,
    // and nothing else in this process has claimed it: the command line is parsed once and
    // the two descriptor flags are checked to differ.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_channel(arg: &ChannelArg) -> Result<OwnedFd, StartError> {
    match arg {
        ChannelArg::Fd(fd) => adopt_fd("--channel-fd", *fd),
        ChannelArg::Path(path) => {
            use nix::fcntl::OFlag;
            nix::fcntl::open(
                path.as_path(),
                OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|source| StartError::ChannelPath {
                path: path.clone(),
                source,
            })
        }
    }
}

fn main() -> ExitCode {
    // Under the name `sudo` (the image's /usr/local/bin/sudo links here): a client of the
    // broker, run by the sandbox user.
    if std::env::args_os()
        .next()
        .is_some_and(|a| sudo::invoked_as_sudo(&a))
    {
        let args: Vec<OsString> = std::env::args_os().skip(1).collect();
        return sudo::client(&args);
    }
    // A helper mode that runs as an ordinary command inside the guest, never as PID 1.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "proxy-connect")
    {
        let args: Vec<String> = std::env::args_os()
            .skip(2)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return proxy_connect::run(&args);
    }
    // The helper of one file operation, which the agent starts for each (see `files`).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == files::HELPER_ARG)
    {
        let args: Vec<OsString> = std::env::args_os().skip(2).collect();
        return files::helper_main(&args);
    }
    // The VM backend's initramfs runs us as /init with this flag: boot the disk first.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == vm_boot::FLAG)
        && nix::unistd::getpid().as_raw() == 1
    {
        return vm_boot::run(std::env::args_os().skip(2).collect());
    }
    let (channel, cgroup_fd, mut config, sudo_broker) =
        match parse_args(std::env::args_os().skip(1)) {
            Ok(Command::Run {
                channel,
                cgroup_fd,
                config,
                sudo_broker,
            }) => (channel, cgroup_fd, config, sudo_broker),
            // Like log!, never panic on a closed stdout.
            Ok(Command::Help) => {
                let _ = writeln!(std::io::stdout(), "{USAGE}");
                return ExitCode::SUCCESS;
            }
            Ok(Command::Version) => {
                let _ = writeln!(
                    std::io::stdout(),
                    "dynocap-agent {}",
                    env!("CARGO_PKG_VERSION")
                );
                return ExitCode::SUCCESS;
            }
            Err(msg) => {
                log!("{msg}\n{USAGE}");
                return ExitCode::from(2);
            }
        };

    // Mounts come first: the channel path (/dev/vport…) and /dev/null may only exist after them.
    init::setup();
    init::ensure_stdio_open();
    // The project's package caches are bound by now: a jail's before the agent ran, a VM's by
    // its boot stage.
    for line in apt_cache::keep_downloads(&init::mounted_targets()) {
        log!("{line}");
    }
    if let Err(err) = reaper::start() {
        log!("cannot start the reaper thread: {err}");
        return ExitCode::from(1);
    }
    let fd = match open_channel(&channel) {
        Ok(fd) => fd,
        Err(msg) => {
            log!("{msg}");
            return ExitCode::from(2);
        }
    };
    if let Some(cgroup_fd) = cgroup_fd {
        // Without it no timeout could reach what a command moved out of its process group:
        // better no guest than one that breaks that promise.
        let cgroups = adopt_fd("--cgroup-fd", cgroup_fd).and_then(|fd| {
            cgroup::ExecCgroups::new(fd).map_err(|source| StartError::Cgroups {
                fd: cgroup_fd,
                source,
            })
        });
        match cgroups {
            Ok(cgroups) => config.exec_cgroups = Some(cgroups),
            Err(msg) => {
                log!("{msg}");
                return ExitCode::from(2);
            }
        }
    }

    if sudo_broker {
        // Commands run through sudo share the agent's uid (guest root); without this they
        // could ptrace the agent, read its memory and descriptors and speak on its channel.
        // A non-dumpable process can be traced only with CAP_SYS_PTRACE, which the guest
        // lacks.
        if let Err(err) = nix::sys::prctl::set_dumpable(false) {
            log!("cannot make the agent non-dumpable, so no sudo broker: {err}");
            return ExitCode::from(1);
        }
        let user = config.exec_user.map_or(0, |u| u.uid);
        if let Err(err) = sudo::serve(user, config.exec_cgroups.clone()) {
            // The guest still works; only `sudo` will say it has no root access.
            log!("cannot start the sudo broker at {}: {err}", sudo::SOCKET);
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            log!("cannot build the runtime: {err}");
            return ExitCode::from(1);
        }
    };
    let ended = runtime.block_on(async move {
        let (reader, writer) = match channel::split(fd) {
            Ok(halves) => halves,
            Err(err) => {
                log!(
                    "the channel cannot be polled (socket, pipe or character device needed): {err}"
                );
                return None;
            }
        };
        Some(server::serve(reader, writer, config).await)
    });
    drop(runtime);

    if nix::unistd::getpid().as_raw() == 1 {
        // Everything still alive belongs to this guest; nothing may outlive the channel.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), nix::sys::signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(2);
        while reaper::has_children() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if vm_boot::is_vm_guest() {
            // The disk may be kept for a later boot (a task's unsaved work): what the guest
            // wrote must reach it before the VM stops.
            vm_boot::power_off();
        }
    }
    match ended {
        Some(server::Ended::Eof) => {
            log!("the host closed the channel; exiting");
            ExitCode::SUCCESS
        }
        Some(server::Ended::Broken(err)) => {
            log!("exiting: {err}");
            ExitCode::from(1)
        }
        None => ExitCode::from(2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, ArgsError> {
        parse_args(args.iter().map(OsString::from))
    }

    #[test]
    fn full_command_line() {
        let cmd = parse(&[
            "--channel-fd",
            "3",
            "--cgroup-fd=4",
            "--exec-user",
            "1000:100",
            "--home=/home/u",
        ]);
        assert_eq!(
            cmd,
            Ok(Command::Run {
                channel: ChannelArg::Fd(3),
                cgroup_fd: Some(4),
                config: config::Config {
                    exec_user: Some(spawn::ExecUser {
                        uid: 1000,
                        gid: 100
                    }),
                    home: Some("/home/u".into()),
                    ..config::Config::default()
                },
                sudo_broker: false,
            })
        );
        let cmd = parse(&["--channel-path=/dev/vport0p1"]);
        assert_eq!(
            cmd,
            Ok(Command::Run {
                channel: ChannelArg::Path("/dev/vport0p1".into()),
                cgroup_fd: None,
                config: config::Config::default(),
                sudo_broker: false,
            })
        );
        assert_eq!(parse(&["--help"]), Ok(Command::Help));
        assert_eq!(parse(&["--version"]), Ok(Command::Version));
    }

    #[test]
    fn bad_command_lines_are_refused() {
        for args in [
            &[][..],
            &["--channel-fd"],
            &["--channel-fd", "x"],
            &["--channel-fd", "2"],
            &["--channel-fd", "-1"],
            &["--channel-fd", "3", "--channel-path", "/dev/x"],
            &["--channel-fd", "3", "--exec-user", "1000"],
            &["--channel-fd", "3", "--exec-user", "a:b"],
            &["--channel-fd", "3", "--home", "relative"],
            &["--channel-fd", "3", "--bogus"],
            &["--channel-path", ""],
            &["--channel-fd", "3", "--cgroup-fd", "2"],
            &["--channel-fd", "3", "--cgroup-fd", "3"],
            &["--channel-fd", "3", "--cgroup-fd", "4", "--cgroup-fd", "5"],
            &["--channel-fd", "3", "--sudo-broker"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be refused");
        }
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let message = |args: &[&str]| parse(args).unwrap_err().to_string();
        assert_eq!(
            message(&["--channel-fd", "2"]),
            "--channel-fd 2: must be 3 or higher (0-2 are stdio)"
        );
        assert_eq!(
            message(&["--channel-fd", "3", "--exec-user", "a:b"]),
            "--exec-user \"a:b\" must be UID:GID (two numbers)"
        );
        assert_eq!(
            message(&["--channel-fd", "3", "--cgroup-fd", "4", "--cgroup-fd", "5"]),
            "--cgroup-fd given twice"
        );
        assert_eq!(message(&["--channel-fd"]), "--channel-fd needs a value");
    }

    #[test]
    fn adopt_fd_refuses_closed_descriptors() {
        assert!(adopt_fd("--channel-fd", 987_654).is_err());
    }
}
