//! The broker inside the agent (guest root): checks each caller, runs its command as root
//! in the caller's directory, with its descriptors, in its command cgroup, and answers with
//! the exit code.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{
    getsockopt, recvmsg, sockopt::PeerCredentials, ControlMessageOwned, MsgFlags,
};

use super::wire::{decode, Request, MAX_REQUEST};
use super::SOCKET;
use crate::cgroup::ExecCgroups;
use crate::reaper::ExitStatus;
use crate::spawn::{self, ChildSpec};

/// PATH of commands run as root, as Debian's sudo sets it (`secure_path`).
const ROOT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long a caller has to send its whole request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the broker checks whether the caller is still there.
const CALLER_POLL: Duration = Duration::from_millis(200);

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
    let request = decode(&data[4..]).map_err(|err| stderr(err.to_string(), &stdio))?;
    Ok((request, stdio))
}

/// The command's environment: the caller's, as root (HOME, USER, PATH), with sudo's markers,
/// and then the `VAR=value` words given before the command, over all of these as sudo puts
/// them (`sudo PATH=/opt/bin cmd` sets PATH too). They only reach the command's own
/// environment: the agent never sets them in its own. Guest root runs anything it likes
/// inside the sandbox anyway, so a variable such as `LD_PRELOAD` gives the caller nothing
/// more than the command itself does.
fn root_env(caller: &[Vec<u8>], assignments: &[Vec<u8>], caller_uid: u32) -> Vec<CString> {
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
    let key = |entry: &[u8]| -> Vec<u8> {
        entry
            .split(|b| *b == b'=')
            .next()
            .unwrap_or_default()
            .to_vec()
    };
    for assignment in assignments {
        // Checked when the request was decoded: a name and no NUL.
        let Ok(entry) = CString::new(assignment.clone()) else {
            continue;
        };
        let name = key(assignment);
        env.retain(|e| key(e.as_bytes()) != name);
        env.push(entry);
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
        env: root_env(&request.env, &request.assignments, peer_uid),
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

    #[test]
    fn the_command_gets_roots_home_and_path_but_keeps_proxy_settings() {
        let env = root_env(
            &[
                b"HOME=/home/sandbox".to_vec(),
                b"PATH=/evil".to_vec(),
                b"https_proxy=http://127.0.0.1:3128".to_vec(),
                b"SUDO_UID=0".to_vec(),
            ],
            &[],
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

    #[test]
    fn assignments_before_the_command_override_everything_else_once() {
        let env = root_env(
            &[b"LANG=C".to_vec(), b"DEBIAN_FRONTEND=dialog".to_vec()],
            &[
                b"DEBIAN_FRONTEND=noninteractive".to_vec(),
                b"PATH=/opt/bin".to_vec(),
                b"EMPTY=".to_vec(),
                b"EQ=a=b".to_vec(),
            ],
            1000,
        );
        let env: Vec<String> = env
            .into_iter()
            .map(|e| e.into_string().expect("utf8"))
            .collect();
        let with = |name: &str| {
            env.iter()
                .filter(|e| e.split('=').next() == Some(name))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(with("DEBIAN_FRONTEND"), ["DEBIAN_FRONTEND=noninteractive"]);
        assert_eq!(with("PATH"), ["PATH=/opt/bin"]);
        assert_eq!(with("EMPTY"), ["EMPTY="]);
        assert_eq!(with("EQ"), ["EQ=a=b"]);
        assert_eq!(with("LANG"), ["LANG=C"]);
        assert_eq!(with("HOME"), ["HOME=/root"]);
    }
}
