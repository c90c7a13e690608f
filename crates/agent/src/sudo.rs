//! `sudo` inside a guest whose image opts in: the agent (guest PID 1, the guest's root) runs
//! a command as the guest's root for the sandbox user, who otherwise has no way up.
//!
//! A setuid `sudo` cannot work in a sandbox: the root filesystem is mounted `nosuid` and
//! every process runs with `no_new_privs`. So the image's `/usr/local/bin/sudo` is a link to
//! this very binary, and under that name it is a client ([`client`]): it connects to the
//! broker's socket ([`SOCKET`]), sends its arguments, working directory and environment, and
//! passes its stdin, stdout and stderr along (`SCM_RIGHTS`); the broker ([`serve`]) checks the
//! caller's uid (`SO_PEERCRED`), starts the command as itself in the caller's directory with
//! the caller's descriptors and in the caller's command cgroup (so the command's timeout stops
//! it and all it started), and answers with its exit code. When the caller goes away (a
//! timeout killed it), the broker kills the command's process group too.
//!
//! Guest root gains nothing on the host: it is the sandbox's unprivileged host uid in the
//! sandbox's user namespace, inside the same cgroups, seccomp filter and capability bounding
//! set as everything else in the guest (see SECURITY.md).
//!
//! Wire format, client to broker: `u32` total length, then fields, each a `u32` length and its
//! bytes: [`VERSION`], the cwd, the argument count, the arguments, the environment count, the
//! environment entries. All integers little-endian. Broker to client: one `i32`, the exit code
//! (128 + signal for a command killed by a signal).

use std::ffi::{CString, OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::socket::{
    getsockopt, recvmsg, sendmsg, sockopt::PeerCredentials, ControlMessage, ControlMessageOwned,
    MsgFlags,
};

use std::sync::Arc;

use crate::cgroup::ExecCgroups;
use crate::reaper::ExitStatus;
use crate::spawn::{self, ChildSpec};

/// The broker's socket inside the guest.
pub const SOCKET: &str = "/run/dynocap/sudo.sock";
const VERSION: &[u8] = b"dynocap-sudo-1";
/// Largest request: arguments and environment together.
const MAX_REQUEST: usize = 1 << 20;
/// PATH of commands run as root, as Debian's sudo sets it (`secure_path`).
const ROOT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long a caller has to send its whole request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the broker checks whether the caller is still there.
const CALLER_POLL: Duration = Duration::from_millis(200);

/// True when this binary was started under the name `sudo`.
pub fn invoked_as_sudo(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new("sudo"))
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Invocation {
    Run(Vec<OsString>),
    /// `-v`, `-k`, `-K`: nothing to validate or forget.
    Nothing,
    Usage(String),
}

/// Parses the common sudo options. Options that change who or how are refused: there is one
/// target (root) and no password.
fn parse(args: &[OsString]) -> Invocation {
    let mut rest = args.iter();
    let mut shell = false;
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy();
        match text.as_ref() {
            "--" => return command(rest.cloned().collect(), shell),
            "-E" | "-H" | "-n" | "-S" | "-P" | "--preserve-env" | "--non-interactive"
            | "--set-home" => {}
            _ if text.starts_with("--preserve-env=") => {}
            "-v" | "-k" | "-K" | "--validate" | "--reset-timestamp" => return Invocation::Nothing,
            "-s" | "-i" | "--shell" | "--login" => shell = true,
            "-u" | "--user" => match rest.next().map(|u| u.to_string_lossy().into_owned()) {
                Some(user) if ["root", "0", "#0"].contains(&user.as_str()) => {}
                Some(user) => {
                    return Invocation::Usage(format!(
                        "sudo: only root is available in this sandbox, not {user:?}"
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
                return command(all, shell);
            }
        }
    }
    command(Vec::new(), shell)
}

fn command(args: Vec<OsString>, shell: bool) -> Invocation {
    match (args.is_empty(), shell) {
        (true, true) => Invocation::Run(vec!["/bin/bash".into()]),
        (true, false) => Invocation::Usage("usage: sudo COMMAND [ARG...]".into()),
        (false, true) => {
            // `sudo -s CMD ARGS`: the shell runs the words as one command line.
            let line = args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ");
            Invocation::Run(vec!["/bin/sh".into(), "-c".into(), line.into()])
        }
        (false, false) => Invocation::Run(args),
    }
}

/// The `sudo` client. Returns the command's exit code.
pub fn client(args: &[OsString]) -> ExitCode {
    let argv = match parse(args) {
        Invocation::Run(argv) => argv,
        Invocation::Nothing => return ExitCode::SUCCESS,
        Invocation::Usage(message) => {
            let _ = writeln!(std::io::stderr(), "{message}");
            return ExitCode::from(1);
        }
    };
    match run_remote(&argv) {
        Ok(code) => ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)),
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "sudo: {message}");
            ExitCode::from(1)
        }
    }
}

fn run_remote(argv: &[OsString]) -> Result<i32, String> {
    let mut stream = UnixStream::connect(SOCKET).map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            "this sandbox has no root access: its image does not offer sudo (the host image \
             never does; start the sandbox with --image debian)"
                .to_owned()
        }
        _ => format!("cannot reach the agent at {SOCKET}: {err}"),
    })?;
    let cwd = std::env::current_dir()
        .map_err(|err| format!("cannot read the working directory: {err}"))?;
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
    let request = encode(&fields)?;

    let stdio = [0, 1, 2];
    let rights = [ControlMessage::ScmRights(&stdio)];
    let first = [std::io::IoSlice::new(&request)];
    let sent = sendmsg::<()>(stream.as_raw_fd(), &first, &rights, MsgFlags::empty(), None)
        .map_err(|err| format!("cannot send the request to the agent: {err}"))?;
    stream
        .write_all(&request[sent..])
        .map_err(|err| format!("cannot send the request to the agent: {err}"))?;
    let mut reply = [0u8; 4];
    stream
        .read_exact(&mut reply)
        .map_err(|_| "the agent ended the command without an exit code".to_owned())?;
    Ok(i32::from_le_bytes(reply))
}

fn encode(fields: &[&[u8]]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    for field in fields {
        let len = u32::try_from(field.len()).map_err(|_| "an argument is too long".to_owned())?;
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(field);
    }
    if body.len() > MAX_REQUEST {
        return Err(format!(
            "the arguments and environment are {} bytes, more than the {MAX_REQUEST} allowed",
            body.len()
        ));
    }
    let total = u32::try_from(body.len()).map_err(|_| "request too long".to_owned())?;
    let mut out = total.to_le_bytes().to_vec();
    out.extend_from_slice(&body);
    Ok(out)
}

/// A decoded request.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    cwd: Vec<u8>,
    argv: Vec<Vec<u8>>,
    env: Vec<Vec<u8>>,
}

fn decode(body: &[u8]) -> Result<Request, String> {
    let mut fields = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (len, tail) = rest.split_at_checked(4).ok_or("truncated field length")?;
        let len = usize::try_from(u32::from_le_bytes(
            len.try_into().map_err(|_| "bad length")?,
        ))
        .map_err(|_| "bad length")?;
        let (field, tail) = tail.split_at_checked(len).ok_or("truncated field")?;
        fields.push(field.to_vec());
        rest = tail;
    }
    let mut fields = fields.into_iter();
    if fields.next().as_deref() != Some(VERSION) {
        return Err("unknown request version".into());
    }
    let cwd = fields.next().ok_or("no working directory")?;
    let mut counted = |what: &str| -> Result<Vec<Vec<u8>>, String> {
        let count: usize = std::str::from_utf8(&fields.next().ok_or(format!("no {what} count"))?)
            .ok()
            .and_then(|c| c.parse().ok())
            .ok_or(format!("bad {what} count"))?;
        (0..count)
            .map(|_| fields.next().ok_or(format!("missing {what}")))
            .collect()
    };
    let argv = counted("argument")?;
    let env = counted("environment")?;
    if argv.is_empty() {
        return Err("no command".into());
    }
    Ok(Request { cwd, argv, env })
}

/// Starts the broker: listens on [`SOCKET`] for callers with uid `allowed` (and root) and
/// serves each on a thread of its own.
pub fn serve(allowed: u32, cgroups: Option<Arc<ExecCgroups>>) -> std::io::Result<()> {
    let socket = Path::new(SOCKET);
    let dir = socket.parent().unwrap_or(Path::new("/run"));
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    // Anyone in the guest may connect; the peer's uid decides (SO_PEERCRED).
    std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
    std::thread::Builder::new()
        .name("sudo-broker".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let cgroups = cgroups.clone();
                let _ = std::thread::Builder::new()
                    .name("sudo".into())
                    .spawn(move || serve_one(stream, allowed, cgroups.as_deref()));
            }
        })?;
    Ok(())
}

fn serve_one(mut stream: UnixStream, allowed: u32, cgroups: Option<&ExecCgroups>) {
    // A caller that connects and sends nothing must not hold a thread for ever.
    let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
    let code = match accept(&mut stream, allowed) {
        Ok((request, stdio)) => run_local(&stream, request, stdio, cgroups),
        Err((message, stderr)) => {
            if let Some(stderr) = stderr {
                let _ =
                    std::fs::File::from(stderr).write_all(format!("sudo: {message}\n").as_bytes());
            }
            1
        }
    };
    let _ = stream.write_all(&code.to_le_bytes());
}

type Refusal = (String, Option<OwnedFd>);

/// Reads and checks one request with its three descriptors.
fn accept(stream: &mut UnixStream, allowed: u32) -> Result<(Request, [OwnedFd; 3]), Refusal> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 3]);
    let (received, fds) = {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|err| (format!("reading the request: {err}"), None))?;
        let mut fds = Vec::new();
        for cmsg in msg
            .cmsgs()
            .map_err(|err| (format!("reading the descriptors: {err}"), None))?
        {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                for fd in raw {
                    // SAFETY: SCM_RIGHTS just installed this descriptor in our table; we are
                    // its only owner.
                    fds.push(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
                }
            }
        }
        (msg.bytes, fds)
    };
    let stdio: [OwnedFd; 3] = fds.try_into().map_err(|_| {
        (
            "the request must carry stdin, stdout and stderr".to_owned(),
            None,
        )
    })?;
    let stderr = |message: String, stdio: &[OwnedFd; 3]| (message, stdio[2].try_clone().ok());
    let peer = getsockopt(&stream.as_fd(), PeerCredentials)
        .map_err(|err| stderr(format!("cannot identify the caller: {err}"), &stdio))?;
    if peer.uid() != allowed && peer.uid() != 0 {
        return Err(stderr(
            format!("uid {} may not use sudo in this sandbox", peer.uid()),
            &stdio,
        ));
    }
    let mut data = buf[..received].to_vec();
    let (len, _) = data
        .split_at_checked(4)
        .ok_or_else(|| stderr("truncated request".into(), &stdio))?;
    let total = usize::try_from(u32::from_le_bytes(len.try_into().unwrap_or_default()))
        .unwrap_or(usize::MAX);
    if total > MAX_REQUEST {
        return Err(stderr("the request is too large".into(), &stdio));
    }
    while data.len() < total + 4 {
        let mut chunk = vec![0u8; (total + 4 - data.len()).min(64 * 1024)];
        let n = stream
            .read(&mut chunk)
            .map_err(|err| stderr(format!("reading the request: {err}"), &stdio))?;
        if n == 0 {
            return Err(stderr("truncated request".into(), &stdio));
        }
        data.extend_from_slice(&chunk[..n]);
    }
    let request = decode(&data[4..]).map_err(|err| stderr(err, &stdio))?;
    Ok((request, stdio))
}

/// The command's environment: the caller's, as root (HOME, USER, PATH), with sudo's markers.
fn root_env(caller: &[Vec<u8>], caller_uid: u32) -> Vec<CString> {
    const REPLACED: &[&[u8]] = &[b"HOME", b"USER", b"LOGNAME", b"PATH", b"MAIL"];
    let mut env: Vec<CString> = caller
        .iter()
        .filter(|e| {
            let key = e.split(|b| *b == b'=').next().unwrap_or_default();
            !REPLACED.contains(&key) && !key.starts_with(b"SUDO_")
        })
        .filter_map(|e| CString::new(e.clone()).ok())
        .collect();
    for entry in [
        "HOME=/root".to_owned(),
        "USER=root".to_owned(),
        "LOGNAME=root".to_owned(),
        format!("PATH={ROOT_PATH}"),
        format!("SUDO_UID={caller_uid}"),
        format!("SUDO_GID={caller_uid}"),
        "SUDO_USER=sandbox".to_owned(),
    ] {
        env.push(CString::new(entry).expect("no NUL in fixed entries"));
    }
    env
}

/// Runs the request as the agent's own user (guest root) and waits for it, killing its
/// process group if the caller goes away first.
fn run_local(
    stream: &UnixStream,
    request: Request,
    stdio: [OwnedFd; 3],
    cgroups: Option<&ExecCgroups>,
) -> i32 {
    let peer = getsockopt(&stream.as_fd(), PeerCredentials).ok();
    let peer_uid = peer.map_or(0, |c| c.uid());
    // The caller's command cgroup, so that its timeout stops this command and everything it
    // starts, daemons included (a process-group kill would miss those).
    let cgroup = cgroups
        .zip(peer)
        .and_then(|(cgroups, peer)| cgroups.join_handle_of(nix::unistd::Pid::from_raw(peer.pid())));
    let fail = |stdio: &[OwnedFd; 3], message: String| {
        let _ = nix::unistd::write(&stdio[2], format!("sudo: {message}\n").as_bytes());
        1
    };
    let cstrings = |items: Vec<Vec<u8>>| -> Option<Vec<CString>> {
        items.into_iter().map(|a| CString::new(a).ok()).collect()
    };
    let Some(args) = cstrings(request.argv) else {
        return fail(&stdio, "an argument contains a NUL byte".into());
    };
    let Ok(cwd) = CString::new(request.cwd) else {
        return fail(&stdio, "the working directory contains a NUL byte".into());
    };
    // `sh -c 'exec "$@"'` looks the program up on PATH exactly as a shell would, and reports
    // a missing one the way people expect.
    let mut argv = vec![
        CString::new("sh").expect("static"),
        CString::new("-c").expect("static"),
        CString::new("exec \"$@\"").expect("static"),
        CString::new("sudo").expect("static"),
    ];
    argv.extend(args);
    let spec = ChildSpec {
        program: CString::new("/bin/sh").expect("static"),
        argv,
        env: root_env(&request.env, peer_uid),
        cwd,
        terminal: false,
        user: None,
        stdin: None,
        cgroup,
        extra_group: None,
        stdio: Some(stdio),
    };
    let spawned = match spawn::spawn(&spec) {
        Ok(spawned) => spawned,
        Err(err) => {
            let stdio = spec.stdio.as_ref().expect("set above");
            return fail(stdio, format!("cannot start the command: {err}"));
        }
    };
    // Our copies of the caller's descriptors must close now, or the caller's readers would
    // never see EOF while we wait.
    drop(spec);
    let mut exit = spawned.exit;
    let status = loop {
        match exit.try_recv() {
            Ok(status) => break Some(status),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => break None,
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
        }
        if caller_gone(stream.as_fd()) {
            // The caller was killed (a timeout, a Ctrl-C): so is its command.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(spawned.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            break exit.blocking_recv().ok();
        }
    };
    match status {
        Some(ExitStatus::Exited(code)) => code,
        Some(ExitStatus::Signaled(signal)) => 128 + signal,
        None => 1,
    }
}

/// Waits up to [`CALLER_POLL`] and says whether the caller's end has closed.
fn caller_gone(stream: BorrowedFd<'_>) -> bool {
    let mut fds = [nix::poll::PollFd::new(
        stream,
        // POLLIN: the caller sends nothing after its request, so readable means EOF.
        nix::poll::PollFlags::POLLIN,
    )];
    let timeout =
        nix::poll::PollTimeout::try_from(CALLER_POLL).unwrap_or(nix::poll::PollTimeout::MAX);
    match nix::poll::poll(&mut fds, timeout) {
        Ok(0) | Err(_) => false,
        Ok(_) => fds[0].revents().is_some_and(|r| {
            r.intersects(
                nix::poll::PollFlags::POLLHUP
                    | nix::poll::PollFlags::POLLERR
                    | nix::poll::PollFlags::POLLIN,
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn common_sudo_command_lines_parse() {
        assert_eq!(
            parse(&os(&["apt-get", "install", "-y", "jq"])),
            Invocation::Run(os(&["apt-get", "install", "-y", "jq"]))
        );
        assert_eq!(
            parse(&os(&["-E", "-u", "root", "--", "-weird"])),
            Invocation::Run(os(&["-weird"]))
        );
        assert_eq!(
            parse(&os(&["-s", "id", "-u"])),
            Invocation::Run(os(&["/bin/sh", "-c", "id -u"]))
        );
        assert_eq!(parse(&os(&["-v"])), Invocation::Nothing);
        assert!(matches!(parse(&os(&[])), Invocation::Usage(_)));
        assert!(matches!(
            parse(&os(&["-u", "sandbox", "id"])),
            Invocation::Usage(_)
        ));
        assert!(matches!(
            parse(&os(&["-g", "x", "id"])),
            Invocation::Usage(_)
        ));
        assert!(invoked_as_sudo(OsStr::new("/usr/local/bin/sudo")));
        assert!(!invoked_as_sudo(OsStr::new("/.dynocap/agent")));
    }

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let request =
            encode(&[VERSION, b"/work", b"2", b"id", b"-u", b"1", b"A=b"]).expect("encode");
        let body = &request[4..];
        assert_eq!(
            u32::from_le_bytes(request[..4].try_into().expect("4 bytes")) as usize,
            body.len()
        );
        assert_eq!(
            decode(body),
            Ok(Request {
                cwd: b"/work".to_vec(),
                argv: vec![b"id".to_vec(), b"-u".to_vec()],
                env: vec![b"A=b".to_vec()],
            })
        );
        for bad in [
            encode(&[b"other-1", b"/", b"1", b"id", b"0"]),
            encode(&[VERSION, b"/", b"3", b"id", b"0"]),
            encode(&[VERSION, b"/", b"0", b"0"]),
            encode(&[VERSION, b"/", b"x"]),
        ] {
            let bad = bad.expect("encode");
            assert!(decode(&bad[4..]).is_err());
        }
        assert!(decode(&body[..body.len() - 1]).is_err());
    }

    #[test]
    fn the_command_gets_roots_home_and_path_but_keeps_proxy_settings() {
        let env = root_env(
            &[
                b"HOME=/home/sandbox".to_vec(),
                b"PATH=/evil".to_vec(),
                b"https_proxy=http://127.0.0.1:3128".to_vec(),
                b"SUDO_UID=0".to_vec(),
            ],
            1000,
        );
        let env: Vec<String> = env
            .into_iter()
            .map(|e| e.into_string().expect("utf8"))
            .collect();
        assert!(env.contains(&"HOME=/root".to_owned()));
        assert!(env.contains(&format!("PATH={ROOT_PATH}")));
        assert!(env.contains(&"https_proxy=http://127.0.0.1:3128".to_owned()));
        assert!(env.contains(&"SUDO_UID=1000".to_owned()));
        assert!(!env.iter().any(|e| e == "PATH=/evil" || e == "SUDO_UID=0"));
    }
}
