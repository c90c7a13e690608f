//! Whether the process on the other end of a command server's connection could have run its
//! command itself: the check that makes a served command run with exactly its client's
//! authority. The socket's name (`rendezvous`) only sends a client to the right server; it is
//! computed by the client, so a client can connect to any server of the user's. What counts
//! is what the kernel says of the connecting process, compared with what it says of this one:
//! every attribute of [`dynocap_client::attributes`] (user and groups, capabilities,
//! `no_new_privs`, seccomp, namespaces, root, resource limits, cgroups, priorities,
//! affinity, OOM score, execution domain, security label), and the umask and environment the
//! request claims. Anything that cannot be read, or differs, refuses the client; it then runs
//! its command in a process of its own, with its own authority.
//!
//! The process is the one that connected, named by a pidfd the kernel gives for the socket
//! (`SO_PEERPIDFD`, Linux 6.5+), not by a pid that could be reused: its pid is read from the
//! pidfd before its `/proc` directory is read, and again after; if it is the same, the
//! process was alive throughout, and `/proc/<pid>` was its own.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use dynocap_client::attributes::{Attribute, Process};
use dynocap_client::rendezvous::Context;
use nix::sys::socket::{getsockopt, sockopt};

/// Why a client is not served, for the server's log.
#[derive(Debug)]
pub struct Refusal(pub String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn refuse(why: impl Into<String>) -> Refusal {
    Refusal(why.into())
}

/// Errors that mean the kernel has no such attribute, for any process: alike in both.
const ABSENT_EVERYWHERE: [i32; 3] = [libc::ENOENT, libc::EINVAL, libc::EOPNOTSUPP];

/// Checks the process connected on `conn` against this one, and the `request` context (umask
/// and environment) it sent against what the kernel shows of it. `own_only` is this
/// process's [`Process::own_only`], read once: it does not change them.
pub fn check(
    conn: BorrowedFd<'_>,
    request: &Context,
    own_only: &[Attribute],
) -> Result<(), Refusal> {
    let pidfd = peer_pidfd(conn)?;
    let pid = pid_of(&pidfd)?;
    let credentials = getsockopt(&conn, sockopt::PeerCredentials)
        .map_err(|err| refuse(format!("reading the client's credentials: {err}")))?;
    if credentials.uid() != nix::unistd::geteuid().as_raw() {
        return Err(refuse(format!(
            "the client runs as uid {}, not as this server's",
            credentials.uid()
        )));
    }
    let client = Process::with_pid(pid);
    let theirs_own_only = client.own_only();
    let theirs = client.changeable();
    let umask = client.umask().map_err(|errno| unreadable("umask", errno))?;
    let environment = client
        .environment()
        .map_err(|errno| unreadable("environment", errno))?;
    // Still the process that connected: a pid is not reused while its process lives.
    if pid_of(&pidfd)? != pid {
        return Err(refuse("the client ended while it was being checked"));
    }
    compare(own_only, &theirs_own_only)?;
    compare(&Process::current().changeable(), &theirs)?;
    // Two filters are told apart by nothing the kernel shows of another process (only their
    // number): a filtered client is never served.
    let seccomp = theirs.iter().find(|attribute| attribute.name == "Seccomp");
    if !seccomp
        .is_some_and(|attribute| matches!(&attribute.value, Ok(mode) if mode.trim_ascii() == b"0"))
    {
        return Err(refuse(
            "the client runs under seccomp, whose filters cannot be compared from outside",
        ));
    }
    if umask != request.umask {
        return Err(refuse(format!(
            "the request claims umask {:03o}, the client's is {umask:03o}",
            request.umask
        )));
    }
    if Context::keyed(umask, environment) != *request {
        return Err(refuse(
            "the request's environment is not the one the client was started with",
        ));
    }
    Ok(())
}

/// Every attribute of `theirs` must be `ours`; one absent from both alike (a kernel without
/// it) is alike, anything else unreadable is a refusal.
fn compare(ours: &[Attribute], theirs: &[Attribute]) -> Result<(), Refusal> {
    if ours.len() != theirs.len() {
        return Err(refuse(
            "the client's attributes do not line up with the server's",
        ));
    }
    for (own, their) in ours.iter().zip(theirs) {
        match (&own.value, &their.value) {
            (Ok(own_value), Ok(their_value)) if own_value == their_value => {}
            (Ok(_), Ok(_)) => {
                return Err(refuse(format!(
                    "the client differs from this server in its {}",
                    their.name
                )))
            }
            (Err(own_errno), Err(their_errno))
                if own_errno == their_errno && ABSENT_EVERYWHERE.contains(their_errno) => {}
            (_, Err(errno)) => return Err(unreadable(&their.name, *errno)),
            (Err(errno), Ok(_)) => {
                return Err(refuse(format!(
                    "the server cannot read its own {} ({}), which the client has",
                    own.name,
                    nix::errno::Errno::from_raw(*errno).desc()
                )))
            }
        }
    }
    Ok(())
}

fn unreadable(what: &str, errno: i32) -> Refusal {
    refuse(format!(
        "cannot read the client's {what}: {}",
        nix::errno::Errno::from_raw(errno).desc()
    ))
}

/// A pidfd of the process that connected (`SO_PEERPIDFD`).
fn peer_pidfd(conn: BorrowedFd<'_>) -> Result<OwnedFd, Refusal> {
    let mut fd: libc::c_int = -1;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .expect("the size of an int fits a socklen_t");
    // SAFETY: `fd` and `len` are valid for writes of the sizes given; the kernel writes an
    // int (a new descriptor, owned by this process) and its size.
    let done = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            std::ptr::from_mut(&mut fd).cast(),
            &mut len,
        )
    };
    if done != 0 || fd < 0 {
        return Err(refuse(format!(
            "the kernel does not name the client's process (SO_PEERPIDFD, Linux 6.5+): {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: getsockopt just made this descriptor for this process, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The pid, in this process's pid namespace, of the process `pidfd` refers to, from its
/// `/proc/self/fdinfo` (`Pid:`, 0 for a process this namespace cannot see, -1 once it ended).
fn pid_of(pidfd: &OwnedFd) -> Result<libc::pid_t, Refusal> {
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))
        .map_err(|err| refuse(format!("reading the client's pidfd: {err}")))?;
    let pid = fdinfo
        .lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|value| value.trim().parse::<libc::pid_t>().ok())
        .ok_or_else(|| refuse("the client's pidfd names no pid"))?;
    match pid {
        -1 => Err(refuse("the client ended before it was checked")),
        0 => Err(refuse(
            "the client is in a pid namespace this server cannot see",
        )),
        pid => Ok(pid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribute(name: &str, value: Result<&[u8], i32>) -> Attribute {
        Attribute {
            name: name.to_owned(),
            value: value.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn alike_passes_and_any_difference_or_unreadable_value_refuses() {
        let ours = [
            attribute("CapEff", Ok(b"1ff")),
            attribute("attr/current", Err(libc::EINVAL)),
        ];
        assert!(compare(&ours, &ours).is_ok());
        let fewer_caps = [
            attribute("CapEff", Ok(b"0")),
            attribute("attr/current", Err(libc::EINVAL)),
        ];
        let refused = compare(&ours, &fewer_caps).expect_err("other capabilities");
        assert!(refused.0.contains("CapEff"), "{refused}");
        let hidden = [
            attribute("CapEff", Err(libc::EACCES)),
            attribute("attr/current", Err(libc::EINVAL)),
        ];
        let refused = compare(&ours, &hidden).expect_err("unreadable");
        assert!(
            refused.0.contains("cannot read the client's CapEff"),
            "{refused}"
        );
        let labelled = [
            attribute("CapEff", Ok(b"1ff")),
            attribute("attr/current", Ok(b"confined")),
        ];
        assert!(compare(&ours, &labelled).is_err());
        // Absent from both, but for another reason than the kernel lacking it: refused.
        let denied_both = [
            attribute("CapEff", Ok(b"1ff")),
            attribute("attr/current", Err(libc::EACCES)),
        ];
        assert!(compare(&denied_both, &denied_both).is_err());
        assert!(compare(&ours, &ours[..1]).is_err());
    }

    #[test]
    fn this_process_connected_to_itself_passes() {
        use std::os::fd::AsFd;
        let (a, _b) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .expect("socketpair");
        let umask = Process::current().umask().expect("umask");
        let env = std::env::vars_os().map(|(key, value)| {
            let mut entry = key;
            entry.push("=");
            entry.push(value);
            entry
        });
        let context = Context::keyed(umask, env);
        let own_only = Process::current().own_only();
        check(a.as_fd(), &context, &own_only).expect("this process could run its own command");
        let other_umask = Context::keyed(umask ^ 0o002, context.env.clone());
        assert!(check(a.as_fd(), &other_umask, &own_only).is_err());
        let mut other_env = context.env.clone();
        other_env.push("DYNOCAP_NOT_SET_HERE=1".into());
        assert!(check(a.as_fd(), &Context::keyed(umask, other_env), &own_only).is_err());
    }
}
