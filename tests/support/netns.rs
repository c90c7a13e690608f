//! Network namespaces a test creates for itself: a stand-in for "the host" (`H`, where dynocap
//! runs) and a test server (`S`), joined by a veth pair on 198.51.100.0/24 (a documentation
//! range, only ever inside these namespaces), `H`'s default route leading to `S`. Everything is
//! deleted on drop, also when the test panics.
//!
//! `ip netns exec` mounts a fresh sysfs, which hides the cgroup hierarchies dynocap needs, so
//! commands run in `H` with `nsenter --net` instead, in a private mount namespace where `H`'s
//! `resolv.conf` is bound over `/etc/resolv.conf` (what `ip netns exec` would have done).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// `H`'s address on the veth pair.
pub const HOST_ADDR: &str = "198.51.100.1";
/// `S`'s address: the test server and the default gateway of `H`.
pub const SERVER_ADDR: &str = "198.51.100.2";

/// A network namespace, deleted (with its processes' sockets) on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    fn create(name: String) -> Netns {
        run(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NAME ARGS`, which must succeed.
    pub fn ip(&self, args: &[&str]) {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        run(&full);
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// A command run inside this namespace (network only; mounts and the rest are the host's).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// Starts a server process inside this namespace; killed on drop of the returned guard.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Server {
        let child = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a server in the test namespace");
        Server(child)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name));
    }
}

/// A process the test started; killed and reaped on drop.
pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `H` and `S` joined by a veth pair; `H` resolves names through `S`.
pub struct Topology {
    pub host: Netns,
    pub server: Netns,
}

impl Topology {
    pub fn new() -> Topology {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let host = Netns::create(format!("dch{tag}"));
        let server = Netns::create(format!("dcs{tag}"));
        // Interface names are at most 15 bytes; created inside H so nothing appears on the
        // real host even for a moment.
        let (vh, vs) = ("veth-h", "veth-s");
        host.ip(&["link", "add", vh, "type", "veth", "peer", "name", vs]);
        host.ip(&["link", "set", vs, "netns", &server.name]);
        host.ip(&["addr", "add", &format!("{HOST_ADDR}/24"), "dev", vh]);
        server.ip(&["addr", "add", &format!("{SERVER_ADDR}/24"), "dev", vs]);
        host.ip(&["link", "set", vh, "up"]);
        server.ip(&["link", "set", vs, "up"]);
        host.ip(&["route", "add", "default", "via", SERVER_ADDR]);
        let etc = PathBuf::from(format!("/etc/netns/{}", host.name));
        std::fs::create_dir_all(&etc).expect("create /etc/netns/H");
        std::fs::write(
            etc.join("resolv.conf"),
            format!("nameserver {SERVER_ADDR}\n"),
        )
        .expect("write H's resolv.conf");
        Topology { host, server }
    }

    /// A command that runs `program` in `H` as `ip netns exec` would, without its sysfs
    /// remount: a private mount namespace with `H`'s resolv.conf, then `H`'s network.
    pub fn in_host(&self, program: &Path) -> Command {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount --bind /etc/netns/{0}/resolv.conf /etc/resolv.conf && \
                 exec nsenter --net=/run/netns/{0} -- \"$0\" \"$@\"",
                self.host.name
            ))
            .arg(program);
        cmd
    }
}

impl Default for Topology {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `args` (`ip`, `tc`, `nsenter`), failing the test if it fails.
pub fn run(args: &[&str]) {
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap_or_else(|e| panic!("{args:?}: {e} (apt-get install iproute2 util-linux)"));
    assert!(status.success(), "{args:?} failed: {status}");
}
