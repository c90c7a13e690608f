//! User-mode networking for a jail (the `nat` network mode): a `pasta` process (Debian package
//! `passt`) on the host that gives the guest's network namespace a tap interface and turns the
//! guest's connections into ordinary host sockets. This module owns starting it, waiting until
//! the guest's interface is up, keeping the guest off the host's own addresses, and stopping it.
//!
//! What pasta would map by default, and what is turned off here:
//! - `--no-map-gw`: without it, connections to the gateway address go to the host's loopback.
//! - `-T none -U none`: without them pasta forwards the host's bound loopback ports into the
//!   guest's loopback; `-t none -u none`: nothing of the guest is exposed on the host.
//! - `--dns-forward ADDR`: DNS sent to `ADDR` goes to the host's first resolver; nothing else
//!   of the host is reachable through that address.
//! - pasta still connects to any destination the guest names, the host's *other* local
//!   addresses included (a second interface, a container bridge). Those are blocked inside the
//!   guest: a `prohibit` route for each address the host has when the guest starts. The guest
//!   cannot remove them (no `CAP_NET_ADMIN`) nor go around them with raw or packet sockets (a
//!   `nat` jail has no `CAP_NET_RAW`: the jail's `JailSpec::net_raw`). Addresses the host gains
//!   later are not covered.
//! - The guest's own interface copies the host's address, so the guest reaching "the host's
//!   address" reaches itself.
//!
//! The same pasta serves a `nat` VM ([`UserNet::start_in`]): there the namespace is the one
//! QEMU runs in, and the guest's packets reach it as QEMU's own sockets.
//!
//! pasta's death is the caller's to notice ([`UserNet::exit_fd`], a pidfd) and to answer,
//! with [`UserNet::restart_in`] or by ending the guest's network for all to see: a guest whose
//! pasta died has no interface left and reaches nothing.
//!
//! pasta runs as host root (`--runas 0`): it drops to `nobody` by default, which then cannot
//! open the guest's namespace (owned by a user namespace of host root), and the change of uid
//! would clear the parent-death signal that ties it to the supervisor. It confines itself
//! (seccomp, no_new_privs, an empty mount namespace, every capability but `CAP_SYS_ADMIN` and
//! `CAP_NET_BIND_SERVICE` dropped).

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use crate::error::HostError;

/// How long pasta may take to configure the guest's interface.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the readiness file is looked for meanwhile.
const READY_POLL: Duration = Duration::from_millis(10);

/// The program that provides user-mode networking, and where to get it.
pub const PASTA: &str = "pasta";
/// What to tell someone whose machine lacks it.
pub const PASTA_MISSING: &str = "network \"nat\" needs pasta: apt install passt";

/// A running pasta for one guest. Dropping it kills and reaps pasta (errors ignored);
/// [`UserNet::stop`] is the checked path.
#[derive(Debug)]
pub struct UserNet {
    child: Option<Child>,
    /// pasta's pidfd: readable once it has exited, whoever killed it ([`UserNet::exit_fd`]).
    pidfd: Option<OwnedFd>,
    /// What [`UserNet::restart_in`] starts it with again.
    dns_forward: Ipv4Addr,
    pid_file: PathBuf,
}

/// Finds `pasta` on `PATH`; the error says how to install it.
pub fn find_pasta() -> Result<PathBuf, HostError> {
    // env-read-ok: where host tools are, as a shell would look them up (not a setting).
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(PASTA))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| HostError::UserNet(PASTA_MISSING.into()))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// pasta's arguments for the guest whose namespace is `netns` (a path); `pid_file` is written
/// once the guest's interface, address and routes are configured.
fn pasta_args(netns: &Path, dns_forward: Ipv4Addr, pid_file: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--foreground",
        "--quiet",
        "--stderr",
        "--runas",
        "0",
        "--netns",
        &netns.to_string_lossy(),
        "--config-net",
        "--no-map-gw",
        "--dns-forward",
        &dns_forward.to_string(),
        "-t",
        "none",
        "-u",
        "none",
        "-T",
        "none",
        "-U",
        "none",
        "--pid",
        &pid_file.to_string_lossy(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if !netns.starts_with("/proc") {
        // A namespace bound to a file ([`UserNet::start_in`]): the caller removes the file
        // once pasta has joined, and pasta must not take that for the namespace's end.
        args.push("--no-netns-quit".into());
    }
    args
}

impl UserNet {
    /// Starts pasta for the guest whose init is `guest` (the caller's child, not yet reaped, so
    /// its pid names it), returns once the guest's interface is configured and the host's
    /// addresses are blocked, with pasta's stderr for the caller's log.
    ///
    /// `prepare` adjusts the command before it is spawned: the caller makes pasta die with it
    /// (`PR_SET_PDEATHSIG`) and inherit none of its descriptors. The thread that calls this
    /// must outlive pasta for the same reason. `state_dir` holds pasta's pid file.
    pub fn start(
        guest: Pid,
        dns_forward: Ipv4Addr,
        state_dir: &Path,
        prepare: impl Fn(&mut Command),
    ) -> Result<(UserNet, ChildStderr), HostError> {
        let netns = PathBuf::from(format!("/proc/{guest}/ns/net"));
        Self::start_in(&netns, dns_forward, state_dir, prepare)
    }

    /// As [`UserNet::start`], for the network namespace `netns` names: `/proc/PID/ns/net`, or
    /// a file it is bound to. A namespace owned by the initial user namespace (a VM's QEMU)
    /// needs the file: pasta drops `CAP_SYS_PTRACE` before opening it, and then may not open
    /// another process's `/proc/PID/ns/net` unless it holds every capability that process
    /// had. The file may be removed once this returns: pasta holds the namespace itself.
    pub fn start_in(
        netns: &Path,
        dns_forward: Ipv4Addr,
        state_dir: &Path,
        prepare: impl Fn(&mut Command),
    ) -> Result<(UserNet, ChildStderr), HostError> {
        let mut usernet = UserNet {
            child: None,
            pidfd: None,
            dns_forward,
            pid_file: state_dir.join("usernet.pid"),
        };
        let stderr = usernet.launch(netns, &prepare)?;
        Ok((usernet, stderr))
    }

    /// Starts pasta again, with the configuration it first had, for the guest whose network
    /// namespace `netns` names (the same namespace: a jail's `/proc/PID/ns/net`, or a file a
    /// VM's QEMU namespace is bound to anew). The pasta before is killed and reaped first:
    /// a pasta that died took the guest's interface with it, and the new one makes it again,
    /// with its address and routes. Returns the new pasta's stderr. `prepare` and the calling
    /// thread are as for [`UserNet::start`].
    pub fn restart_in(
        &mut self,
        netns: &Path,
        prepare: impl Fn(&mut Command),
    ) -> Result<ChildStderr, HostError> {
        self.kill()?;
        self.launch(netns, &prepare)
    }

    /// Spawns pasta for `netns` and waits until the guest's interface is up and the host's
    /// addresses are blocked in it.
    fn launch(
        &mut self,
        netns: &Path,
        prepare: &impl Fn(&mut Command),
    ) -> Result<ChildStderr, HostError> {
        let pasta = find_pasta()?;
        let pid_file = self.pid_file.clone();
        match std::fs::remove_file(&pid_file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(HostError::io("remove", &pid_file, e)),
        }
        let mut command = Command::new(&pasta);
        command
            .args(pasta_args(netns, self.dns_forward, &pid_file))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        prepare(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| HostError::io("start", &pasta, e))?;
        let stderr = child.stderr.take().expect("stderr was asked for as a pipe");
        // Our child, not yet reaped: its pid cannot name another process.
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        self.pidfd = Some(
            dynocap_cgroup::pidfd::pidfd_open(pid)
                .map_err(|e| HostError::sys("opening a pidfd for pasta", e))?,
        );
        self.child = Some(child);
        self.wait_ready(&pid_file)?;
        block_host_addresses(netns, &host_addresses()?, prepare)?;
        Ok(stderr)
    }

    /// Host pid of pasta.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Becomes readable once pasta has exited, however it ended (a pidfd): the caller
    /// watches it to learn that the guest lost its network.
    pub fn exit_fd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(AsFd::as_fd)
    }

    /// How pasta ended, once it has (reaping it); `None` while it runs.
    pub fn exit_status(&mut self) -> Result<Option<ExitStatus>, HostError> {
        self.try_wait()
    }

    /// Polls for the pid file pasta writes after configuring the guest; fails if pasta exits
    /// first or takes too long (a host-side deadline: nothing here waits forever).
    fn wait_ready(&mut self, pid_file: &Path) -> Result<(), HostError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if std::fs::metadata(pid_file).is_ok_and(|m| m.len() > 0) {
                return Ok(());
            }
            if let Some(status) = self.try_wait()? {
                return Err(HostError::UserNet(format!(
                    "pasta exited ({status}) before the guest's network was up; its messages \
                     are in the sandbox's log"
                )));
            }
            if Instant::now() >= deadline {
                return Err(HostError::Timeout {
                    what: "pasta to configure the guest's network",
                    secs: READY_TIMEOUT.as_secs(),
                });
            }
            std::thread::sleep(READY_POLL);
        }
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>, HostError> {
        match self.child.as_mut() {
            Some(child) => child
                .try_wait()
                .map_err(|e| HostError::UserNet(format!("waiting for pasta: {e}"))),
            None => Ok(None),
        }
    }

    /// Kills pasta and reaps it.
    pub fn stop(mut self) -> Result<(), HostError> {
        self.kill()
    }

    fn kill(&mut self) -> Result<(), HostError> {
        self.pidfd = None;
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // An error here means it has exited already; the wait below reaps it either way.
        let _ = child.kill();
        child
            .wait()
            .map(|_| ())
            .map_err(|e| HostError::UserNet(format!("reaping pasta ({}): {e}", child.id())))
    }
}

impl Drop for UserNet {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Every address of the host's interfaces except loopback ones (the guest's own loopback
/// shadows those), as the supervisor's network namespace shows them now.
fn host_addresses() -> Result<Vec<IpAddr>, HostError> {
    let mut found: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map_err(|e| HostError::sys("listing the host's addresses (getifaddrs)", e))?
        .filter_map(|ifa| {
            let addr = ifa.address?;
            if let Some(v4) = addr.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .filter(|ip| !ip.is_loopback())
        .collect();
    found.sort();
    found.dedup();
    Ok(found)
}

/// The `ip -batch` script that makes each address unreachable from the guest.
fn prohibit_script(addresses: &[IpAddr]) -> String {
    addresses
        .iter()
        .map(|ip| match ip {
            IpAddr::V4(v4) => format!("route replace prohibit {v4}/32\n"),
            IpAddr::V6(v6) => format!("route replace prohibit {v6}/128\n"),
        })
        .collect()
}

/// Adds the guest's `prohibit` routes with `ip`, run inside the guest's network namespace
/// (joined between fork and exec; the supervisor itself stays where it is).
fn block_host_addresses(
    netns: &Path,
    addresses: &[IpAddr],
    prepare: &impl Fn(&mut Command),
) -> Result<(), HostError> {
    if addresses.is_empty() {
        return Ok(());
    }
    let ns: OwnedFd = std::fs::File::open(netns)
        .map_err(|e| HostError::io("open", netns, e))?
        .into();
    let raw = ns.as_raw_fd();
    let mut command = Command::new("ip");
    command
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    prepare(&mut command);
    // SAFETY: setns between fork and exec only changes the child's network namespace; `raw`
    // stays open in the parent (owned by `ns`) until the child has been waited for.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(raw, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| {
        HostError::UserNet(format!(
            "running ip (package iproute2) to keep the guest off the host's addresses: {e}"
        ))
    })?;
    let script = prohibit_script(addresses);
    let written = child
        .stdin
        .take()
        .expect("stdin was asked for as a pipe")
        .write_all(script.as_bytes());
    let output = child
        .wait_with_output()
        .map_err(|e| HostError::UserNet(format!("waiting for ip: {e}")))?;
    drop(ns);
    if !output.status.success() || written.is_err() {
        return Err(HostError::UserNet(format!(
            "blocking the host's addresses in the guest failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether a line pasta printed is worth logging: without a syslog daemon it reports every
/// message it could not send there, beside the message itself.
pub fn log_worthy(line: &str) -> bool {
    !(line.starts_with("Failed to send ") && line.ends_with(" bytes to syslog"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    #[test]
    fn pasta_maps_nothing_of_the_host_and_forwards_no_port() {
        let args = pasta_args(
            Path::new("/proc/7/ns/net"),
            Ipv4Addr::new(169, 254, 1, 1),
            Path::new("/s/usernet.pid"),
        );
        let joined = args.join(" ");
        for expected in [
            "--no-map-gw",
            "-t none",
            "-u none",
            "-T none",
            "-U none",
            "--netns /proc/7/ns/net",
            "--dns-forward 169.254.1.1",
            "--runas 0",
            "--foreground",
            "--pid /s/usernet.pid",
        ] {
            assert!(
                joined.contains(expected),
                "{expected} missing from {joined}"
            );
        }
    }

    #[test]
    fn a_namespace_bound_to_a_file_outlives_the_file() {
        let on = |netns: &str| {
            pasta_args(
                Path::new(netns),
                Ipv4Addr::new(169, 254, 1, 1),
                Path::new("/s/usernet.pid"),
            )
            .contains(&"--no-netns-quit".to_owned())
        };
        assert!(on("/state/vm/netns"));
        assert!(!on("/proc/7/ns/net"));
    }

    #[test]
    fn every_host_address_gets_a_prohibit_route() {
        // Data only: no socket is opened.
        let script = prohibit_script(&[
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        ]);
        assert_eq!(
            script,
            "route replace prohibit 192.0.2.1/32\nroute replace prohibit 2001:db8::1/128\n"
        );
    }

    #[test]
    fn syslog_noise_is_dropped_and_messages_kept() {
        assert!(!log_worthy("Failed to send 46 bytes to syslog"));
        assert!(log_worthy("No external routable interface for IPv6"));
    }
}
