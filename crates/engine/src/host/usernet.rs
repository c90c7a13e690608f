//! The `nat` network mode: what the guest is told (its resolver) and the supervisor's side of
//! running pasta (the parent-death tie, its messages in the sandbox's log). Starting pasta and
//! keeping the guest off the host's addresses is [`dynocap_host::UserNet`]'s job. pasta
//! serves a network namespace: a jail's own, or on the vm backend the one QEMU runs in, where
//! QEMU's user networking turns the guest's packets into sockets (see `backend/vm.rs`).

use std::io::{BufRead, Read};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use dynocap_host::{find_pasta, usernet_log_worthy, UserNet};

use crate::foundation::error::{Coded, Context, Error, ErrorCode, Result};
use crate::host::host_children;

/// The guest's resolver: pasta answers DNS sent here by forwarding it to the host's first
/// nameserver. Link-local, so it collides with nothing the guest may want to reach, and
/// nothing else of the host answers on it.
pub const DNS_FORWARD: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// Longest line of pasta's output copied into the log.
const LOG_LINE_BYTES: u64 = 4096;

/// Refuses a network mode this build cannot provide, rather than handing out a sandbox whose
/// network differs from what was asked for.
pub fn ensure_available(network: crate::spec::Network) -> Result<()> {
    match network {
        crate::spec::Network::None | crate::spec::Network::Filtered => Ok(()),
        crate::spec::Network::Nat => available(),
    }
}

/// Whether this machine can give a guest `nat`; the error names what is missing and the fix.
pub fn available() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::invalid(
            "network \"nat\" needs DynoCap to run as root (pasta must enter the guest's \
             network namespace); use network \"none\" or run as root",
        ));
    }
    find_pasta().map_err(|_| Error::invalid(dynocap_host::PASTA_MISSING))?;
    Ok(())
}

/// Writes the resolver configuration a `nat` guest gets (bound read-only over its
/// `/etc/resolv.conf`) into `state_dir`; returns its path.
pub fn write_resolv_conf(state_dir: &Path) -> Result<PathBuf> {
    let path = state_dir.join("resolv.conf");
    std::fs::write(
        &path,
        format!("# DynoCap: network \"nat\" (DNS through pasta)\nnameserver {DNS_FORWARD}\n"),
    )
    .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Stops a guest's pasta, if it has one (first, so the guest's network goes before the
/// guest). Idempotent.
pub fn stop(usernet: &mut Option<UserNet>) -> Result<()> {
    match usernet.take() {
        Some(usernet) => usernet
            .stop()
            .map_err(|err| UsernetFailure::Stop(err).into()),
        None => Ok(()),
    }
}

/// Starts pasta for the network namespace of `guest_pid` (a jail's init, or a `nat` VM's
/// QEMU); returns once that namespace's network is up. Call from the thread that holds the
/// guest: pasta dies with it.
pub fn start(guest_pid: nix::unistd::Pid, state_dir: &Path) -> Result<UserNet> {
    start_in(
        &PathBuf::from(format!("/proc/{guest_pid}/ns/net")),
        state_dir,
    )
}

/// As [`start`], for the namespace `netns` names (`/proc/PID/ns/net` or a file bound to it).
pub fn start_in(netns: &Path, state_dir: &Path) -> Result<UserNet> {
    let (usernet, stderr) = UserNet::start_in(
        netns,
        DNS_FORWARD,
        state_dir,
        host_children::die_with_parent,
    )
    .map_err(UsernetFailure::Start)?;
    serving(&usernet, stderr)?;
    Ok(usernet)
}

/// Starts the guest's pasta again after it died, with the configuration it started with, for
/// the namespace `netns` names (as for [`start_in`]). Call from the thread that holds the
/// guest, as [`start`].
pub fn restart(usernet: &mut UserNet, netns: &Path) -> Result<()> {
    let stderr = usernet
        .restart_in(netns, host_children::die_with_parent)
        .map_err(UsernetFailure::Restart)?;
    serving(usernet, stderr)
}

/// Logs which pasta serves the guest and relays its messages into the log.
fn serving(usernet: &UserNet, stderr: impl Read + Send + 'static) -> Result<()> {
    tracing::info!(
        "network \"nat\": pasta (pid {}) serves the guest's network namespace",
        usernet.pid().unwrap_or(0)
    );
    std::thread::Builder::new()
        .name("pasta-log".into())
        .spawn(move || relay(stderr))
        .context("starting the pasta log relay")?;
    Ok(())
}

/// A guest's pasta's pidfd, readable once it has exited (see `Guest::network_exit_fd`);
/// `None` for a guest without one.
pub fn exit_fd(usernet: &Option<UserNet>) -> Option<std::os::fd::BorrowedFd<'_>> {
    usernet.as_ref().and_then(UserNet::exit_fd)
}

/// How a guest's pasta exited, reaping it (see `Guest::network_exit`).
pub fn exit_of_any(usernet: &mut Option<UserNet>) -> String {
    usernet
        .as_mut()
        .map_or_else(|| "no network process".to_owned(), exit_of)
}

/// What a guest's pasta exited with, reaping it, for the log ("killed by signal 9").
pub fn exit_of(usernet: &mut UserNet) -> String {
    match usernet.exit_status() {
        Ok(Some(status)) => status.to_string(),
        Ok(None) => "still running".to_owned(),
        Err(err) => format!("unknown: {err}"),
    }
}

/// Copies pasta's messages into the log, line by line, bounded.
fn relay(stderr: impl Read) {
    let mut reader = std::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(LOG_LINE_BYTES)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                if usernet_log_worthy(text) {
                    tracing::info!("pasta: {text}");
                }
            }
        }
    }
}

/// What failed running a guest's pasta; the host crate's error is the cause.
#[derive(Debug, thiserror::Error)]
enum UsernetFailure {
    #[error("starting the guest's network: {0}")]
    Start(#[source] dynocap_host::HostError),
    #[error("restarting the guest's network: {0}")]
    Restart(#[source] dynocap_host::HostError),
    #[error("stopping the guest's network: {0}")]
    Stop(#[source] dynocap_host::HostError),
}

impl Coded for UsernetFailure {
    /// pasta is a host program: its failing is the operator's to fix, never the caller's.
    fn code(&self) -> ErrorCode {
        match self {
            Self::Start(_) | Self::Restart(_) | Self::Stop(_) => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_resolver_is_the_forwarded_address() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_resolv_conf(dir.path()).expect("written");
        let text = std::fs::read_to_string(path).expect("read");
        assert!(
            text.lines().any(|l| l == "nameserver 169.254.1.1"),
            "{text}"
        );
    }
}
