//! A link shaped like one to a real package registry, for the benches: the test index
//! (netfix's `https_server.py`, serving a [`TlsFix`]'s tree with its certificate) runs in a
//! server namespace `S` of the bench's own, reached from a host namespace `H` where the bench
//! runs dynocap, over a veth pair on a random 10.X.Y.0/30 (only ever inside these two
//! namespaces; `H` has no other route). Each end's egress is rate limited with `tbf`, so
//! downloads and uploads each get `RATE` as they would over a real uplink, and `DELAY` is
//! added each way: by `netem` where the kernel has `sch_netem` (checked by
//! [`ShapedLink::start`]), else (this development machine's kernel has only `tbf` and `htb`)
//! `tbf` limits the rate and `delay_relay.py`, in `S` in front of the server, holds each
//! direction's bytes for `DELAY`. Both namespaces and the processes in `S` go on drop.
//!
//! dynocap runs in `H` through `nsenter --net` (see [`ShapedLink::command`]): mounts, cgroups
//! and the rest are the host's, so sandboxes start as usual and their egress proxy connects
//! out of `H`. Included by the bench files that use it (`#[path]`), next to `tlsfix.rs`.

// Each file including this uses part of it.
#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dynocap_e2e::netns::run;
use serde_json::Value;

use crate::tlsfix::{self, TlsFix};

/// Each direction's rate, as `tc` spells it.
pub const RATE: &str = "100mbit";
/// The one-way delay, in milliseconds.
pub const DELAY_MS: u32 = 20;

/// The two namespaces, the server in `S`, and what the link is shaped with.
pub struct ShapedLink {
    /// `S`'s address: where `DYNOCAP_RESOLVE` sends the registry names.
    pub server_addr: Ipv4Addr,
    /// How the link is shaped, for the bench's report ("tbf 100mbit each way, no delay").
    pub shape: String,
    host: String,
    server_ns: String,
    log: PathBuf,
    servers: Vec<Child>,
}

impl ShapedLink {
    /// The namespaces and the link, and `fix`'s tree served in `S` on 443 with `fix`'s
    /// certificate (its CA is the one `DYNOCAP_EXTRA_CA` already names). `tag` keeps two
    /// links of one process apart.
    pub fn start(fix: &TlsFix, tag: &str) -> Self {
        let pid = std::process::id();
        let host = format!("dcl{pid}{tag}h");
        let server_ns = format!("dcl{pid}{tag}s");
        // Random within 10/8, so parallel runs (and a leaked earlier one) do not collide;
        // the /30 is the whole of what either namespace routes.
        let seed = u32::from(fix.addr) ^ pid.rotate_left(12);
        let base = Ipv4Addr::new(
            10,
            (seed >> 16) as u8,
            (seed >> 8) as u8,
            (seed as u8) & 0xfc,
        );
        let [a, b, c, d] = base.octets();
        let host_addr = Ipv4Addr::new(a, b, c, d + 1);
        let server_addr = Ipv4Addr::new(a, b, c, d + 2);
        let mut link = ShapedLink {
            server_addr,
            shape: String::new(),
            host: host.clone(),
            server_ns: server_ns.clone(),
            log: fix.dir().join(format!("shaped-{tag}.jsonl")),
            servers: Vec::new(),
        };
        for ns in [&host, &server_ns] {
            run(&["ip", "netns", "add", ns]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        // Made inside H, so nothing appears on the real host even for a moment.
        run(&[
            "ip", "-n", &host, "link", "add", "veth-h", "type", "veth", "peer", "name", "veth-s",
        ]);
        run(&[
            "ip", "-n", &host, "link", "set", "veth-s", "netns", &server_ns,
        ]);
        for (ns, dev, addr) in [
            (&host, "veth-h", host_addr),
            (&server_ns, "veth-s", server_addr),
        ] {
            run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/30"),
                "dev",
                dev,
            ]);
            run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        let netem = has_netem();
        for (ns, dev) in [(&host, "veth-h"), (&server_ns, "veth-s")] {
            if netem {
                run(&[
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "netem",
                    "delay",
                    &format!("{DELAY_MS}ms"),
                    "rate",
                    RATE,
                    "limit",
                    "10000",
                ]);
            } else {
                // A burst of 256 KiB: more than one 64 KiB GSO segment, and at most 20 ms at
                // the rate, so the rate holds over any span pip would notice.
                run(&[
                    "tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", RATE,
                    "burst", "256kb", "latency", "50ms",
                ]);
            }
        }
        link.shape = if netem {
            format!("netem delay {DELAY_MS}ms rate {RATE} on each end ({DELAY_MS} ms each way)")
        } else {
            format!(
                "tbf rate {RATE} on each end, {DELAY_MS} ms each way added by a relay in front \
                 of the server (this kernel has no sch_netem)"
            )
        };
        let support = Path::new(env!("CARGO_MANIFEST_DIR")).join("support");
        let file = |name: &str| fix.dir().join(name);
        // Behind the relay the server listens on S's own loopback, the relay on the link.
        let server_on = if netem {
            server_addr.to_string()
        } else {
            "127.0.0.1".to_owned()
        };
        let mut server = vec![
            OsString::from(support.join("netfix/https_server.py")),
            "--addr".into(),
            server_on.clone().into(),
            "--cert".into(),
            file("server.pem").into(),
            "--key".into(),
            file("server.key").into(),
            "--www".into(),
            fix.www().into(),
            "--git-root".into(),
            file("git").into(),
            "--log".into(),
            link.log.clone().into(),
            "--ready".into(),
        ];
        server.push(file(&format!("shaped-{tag}.ready")).into());
        link.spawn_in_s(fix, &format!("{tag}-server"), server);
        if !netem {
            let relay = vec![
                OsString::from(support.join("delay_relay.py")),
                server_addr.to_string().into(),
                "443".into(),
                server_on.into(),
                "443".into(),
                DELAY_MS.to_string().into(),
                file(&format!("shaped-{tag}-relay.ready")).into(),
            ];
            link.spawn_in_s(fix, &format!("{tag}-relay"), relay);
        }
        link
    }

    /// Starts `python3 ARGS` in `S`, its output in the fixture's directory, and waits for the
    /// file its last argument names (written once it listens).
    fn spawn_in_s(&mut self, fix: &TlsFix, name: &str, args: Vec<OsString>) {
        let out_path = fix.dir().join(format!("shaped-{name}.out"));
        let out = std::fs::File::create(&out_path).expect("server log");
        let ready = PathBuf::from(args.last().expect("a ready file"));
        let child = self
            .in_ns(&self.server_ns, OsStr::new("python3"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .process_group(0)
            .spawn()
            .expect("spawn python3 in S");
        self.servers.push(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            assert!(
                Instant::now() < deadline,
                "{name} in S did not start: {}",
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `program` run in `H`'s network namespace (everything else the host's).
    pub fn command(&self, program: &Path) -> Command {
        self.in_ns(&self.host, program.as_os_str())
    }

    fn in_ns(&self, ns: &str, program: &OsStr) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{ns}"))
            .arg("--")
            .arg(program);
        cmd
    }

    /// `DYNOCAP_RESOLVE` sending each of `names` to the server in `S` on 443.
    pub fn resolve(&self, names: &[&str]) -> String {
        tlsfix::resolve_to(names, self.server_addr)
    }

    /// Every request the server in `S` answered, as [`TlsFix::requests`].
    pub fn requests(&self) -> Vec<Value> {
        tlsfix::requests_in(&self.log)
    }
}

impl Drop for ShapedLink {
    fn drop(&mut self) {
        for server in &mut self.servers {
            tlsfix::kill(server);
        }
        for ns in [&self.host, &self.server_ns] {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

/// Whether the kernel has `sch_netem`: tried on the loopback of a throwaway namespace.
fn has_netem() -> bool {
    let ns = format!("dcl{}probe", std::process::id());
    run(&["ip", "netns", "add", &ns]);
    let added = Command::new("tc")
        .args([
            "-n", &ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
        ])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let _ = Command::new("ip").args(["netns", "delete", &ns]).status();
    added
}
