//! The egress proxy judges a tunnel's whole ClientHello before anything leaves the host, end
//! to end through a real `filtered` sandbox: a guest-side program (tests/support/netfix/
//! hello_client.py, run by the host's python3 that the jail's `host` image binds) sends each
//! shape of hello through the proxy to a TLS server of this test's own on a fresh loopback
//! address (tests/support/netfix/counting_tls_server.py), which logs every connection it
//! accepts. "No upstream connection" is the server's own count, never the proxy's word.
//!
//! Shapes refused without any connection: tunnels that never send a hello, a slow partial
//! hello, Encrypted ClientHello and ESNI beside an allowed SNI, server_name with two names or
//! another name type, no SNI, another SNI, a second hello in the first one's records, a hello
//! past the size bound, non-TLS bytes, plain HTTP; a QUIC datagram goes nowhere. A second
//! hello right behind the first is refused before any of it is forwarded. Shapes allowed: a
//! real handshake whose hello is cut into many records and writes, a real TLS 1.3 handshake
//! through a HelloRetryRequest, a real TLS 1.2 handshake. Refused after the retry: a second
//! hello naming another host or carrying ECH, sent where the client's own belongs. The server
//! keeps every byte it received, and none of a refused name or hidden-name extension is there.
//!
//! The jail runs every shape; the vm (whose guest's connections reach the proxy over
//! virtio-serial) a few of each kind.
//!
//! Traffic stays on loopback: the allowed name resolves through an override to the server's
//! 127.X.Y.Z. Needs root.

use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use dynocap_e2e::netfix::*;
use dynocap_e2e::*;
use serde_json::Value;

/// The guest-side program, copied into the guest before it runs.
const HELLO_CLIENT: &str = include_str!("support/netfix/hello_client.py");
/// Where the guest keeps it.
const GUEST_CLIENT: &str = "/tmp/hello_client.py";
/// The payload of every ECH/ESNI extension the client sends (hello_client.py's MARKER).
const HIDDEN_NAME_MARKER: &str = "dynocap-hidden-name-marker";
/// What the counting server answers a completed handshake with.
const REPLY: &str = "hello from the counting server\n";

/// The counting TLS server on `addr:443`; killed on drop.
struct CountingServer {
    child: Child,
    addr: Ipv4Addr,
    log: PathBuf,
    /// Peers of this test's own probes, which are not the proxy's connections.
    probes: std::cell::RefCell<Vec<String>>,
}

impl CountingServer {
    /// Starts the server with `ca`'s server certificate, key exchange limited to P-256 so that
    /// a client offering X25519 first gets a HelloRetryRequest.
    fn start(dir: &Path, ca: &TestCa, addr: Ipv4Addr) -> Result<CountingServer, String> {
        let log = dir.join("counting.jsonl");
        let out = std::fs::File::create(dir.join("counting.out")).expect("server output file");
        let child = Command::new("python3")
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("support/netfix/counting_tls_server.py"),
            )
            .arg("--addr")
            .arg(addr.to_string())
            .arg("--cert")
            .arg(&ca.server_cert)
            .arg("--key")
            .arg(&ca.server_key)
            .args(["--groups", "prime256v1"])
            .arg("--log")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .map_err(|err| format!("spawn the counting server: {err}"))?;
        let mut server = CountingServer {
            child,
            addr,
            log,
            probes: Default::default(),
        };
        let listening = wait_until(30, || {
            server.child.try_wait().ok().flatten().is_none()
                && TcpStream::connect((addr, 443)).is_ok_and(|probe| {
                    server.note_probe(&probe);
                    true
                })
        });
        if !listening {
            let out = std::fs::read_to_string(dir.join("counting.out")).unwrap_or_default();
            return Err(format!(
                "the counting server did not listen on {addr}:443: {out}"
            ));
        }
        Ok(server)
    }

    fn note_probe(&self, probe: &TcpStream) {
        let peer = probe.local_addr().expect("probe address").to_string();
        self.probes.borrow_mut().push(peer);
    }

    fn entries(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("the server logs JSON lines"))
            .collect()
    }

    /// Connections accepted so far that were not this test's probes. A fresh probe connects
    /// last; the server logs accepts in order, so once it has logged the probe every earlier
    /// connection is counted.
    fn accepted(&self) -> usize {
        let probe = TcpStream::connect((self.addr, 443)).expect("probe the counting server");
        self.note_probe(&probe);
        let me = probe.local_addr().expect("probe address").to_string();
        assert!(
            wait_until(30, || self
                .entries()
                .iter()
                .any(|e| e["accepted"] == me.as_str())),
            "the counting server did not log its probe"
        );
        let probes = self.probes.borrow();
        self.entries()
            .iter()
            .filter_map(|e| e["accepted"].as_str())
            .filter(|peer| !probes.iter().any(|p| p == peer))
            .count()
    }

    /// The handshakes that completed: `{"peer", "sni", "version"}`.
    fn handshakes(&self) -> Vec<Value> {
        self.entries()
            .into_iter()
            .filter(|e| e.get("version").is_some())
            .collect()
    }
}

impl Drop for CountingServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The task's decisions so far, oldest first.
fn network_log(home: &TestHome, task_id: &str) -> Vec<Value> {
    std::fs::read_to_string(
        home.path()
            .join("results")
            .join(task_id)
            .join(product::NETWORK_LOG),
    )
    .unwrap_or_default()
    .lines()
    .map(|l| serde_json::from_str(l).expect("network.jsonl holds JSON lines"))
    .collect()
}

/// What one shape did: the client's report and the decisions it added.
struct Outcome {
    report: Value,
    decisions: Vec<Value>,
    connections: usize,
}

/// A `filtered` task on `backend` whose allowed `registry.npmjs.org` resolves to the counting
/// server, with the guest-side client copied in.
struct Bench {
    home: TestHome,
    server: CountingServer,
    id: String,
    _dir: tempfile::TempDir,
}

impl Bench {
    fn start(backend: Backend, test: &str) -> Option<Bench> {
        let home = TestHome::on(backend, test)?;
        let dir = tempfile::Builder::new()
            .prefix("dchello")
            .tempdir_in("/tmp")
            .expect("fixture dir");
        let mut failures = Vec::new();
        let server = loop {
            let addr = random_loopback();
            let ca = TestCa::generate(&dir.path().join("pki"), addr);
            match CountingServer::start(dir.path(), &ca, addr) {
                Ok(server) => break server,
                Err(err) if failures.len() < 4 => failures.push(err),
                Err(err) => panic!("{err}; before: {failures:#?}"),
            }
        };
        let home = home.with_env(
            product::ENV_RESOLVE,
            &format!("{NPM_HOST}:443:{}", server.addr),
        );
        let project = home.path().join("project");
        write(&project.join("README.md"), "# project\n");
        let task = home.json(&[
            "task",
            "start",
            project.to_str().expect("utf-8 temp path"),
            "--name",
            "hello",
            "--network",
            "filtered",
        ]);
        assert_eq!(task["backend"], backend.name(), "{task}");
        let id = task["id"].as_str().expect("task id").to_owned();
        let copy = home.exec_in_task(
            "hello",
            &format!("cat > {GUEST_CLIENT} <<'EOF'\n{HELLO_CLIENT}EOF"),
            60,
        );
        assert_eq!(copy["exitCode"], 0, "{copy:#}");
        Some(Bench {
            home,
            server,
            id,
            _dir: dir,
        })
    }

    /// Runs `shape` in the guest and waits until `expect` decisions were logged for it.
    fn send(&self, shape: &str, expect: usize) -> Outcome {
        self.send_with(shape, expect, "")
    }

    /// [`Bench::send`], with the argument some shapes take.
    fn send_with(&self, shape: &str, expect: usize, argument: &str) -> Outcome {
        let before = network_log(&self.home, &self.id).len();
        let accepted_before = self.server.accepted();
        let command = format!(
            "python3 {GUEST_CLIENT} {} {NPM_HOST} {shape} {argument}",
            product::GUEST_PROXY
        );
        let result = self.home.exec_in_task("hello", &command, 300);
        let stdout = result["stdout"].as_str().unwrap_or_default();
        assert_eq!(result["exitCode"], 0, "{shape}: {result:#}");
        let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|err| {
            panic!("{shape}: the client printed no JSON ({err}): {result:#}")
        });
        let mut decisions = Vec::new();
        // A decision is logged when its conversation ends, which may be just after the
        // client's.
        wait_until(60, || {
            decisions = network_log(&self.home, &self.id).split_off(before);
            decisions.len() >= expect
        });
        assert_eq!(decisions.len(), expect, "{shape}: {decisions:#?}");
        let connections = self.server.accepted() - accepted_before;
        // One line per shape in the test's output: what the client saw, what the proxy said.
        eprintln!(
            "{shape}: client {report}; upstream connections {connections}; decision {}",
            decisions
                .last()
                .map(|d| d["reason"].to_string())
                .unwrap_or_default()
        );
        Outcome {
            report,
            decisions,
            connections,
        }
    }

    /// `tunnels` tunnels opened at once that never send a byte: as many refusals, and no
    /// connection, no lookup.
    fn silent_tunnels(&self, tunnels: usize) {
        let silent = self.send_with("silent", tunnels, &tunnels.to_string());
        assert_eq!(silent.report["tunnels"], tunnels, "{}", silent.report);
        refused_unconnected(
            &silent,
            "silent",
            None,
            "closed the tunnel before sending a TLS ClientHello",
        );
    }

    /// Each shape refused inside its tunnel without any upstream connection.
    fn refused_hellos(&self, shapes: &[Refusal]) {
        for (shape, alert, reason) in shapes {
            let outcome = self.send(shape, 1);
            refused_unconnected(&outcome, shape, *alert, reason);
        }
    }

    /// Real handshakes by Python's TLS client: one whose hello is cut into records of 90
    /// bytes over several writes, one through a HelloRetryRequest (its second hello judged
    /// and allowed).
    fn real_handshakes_pass(&self) {
        let split = self.send("split-real", 1);
        assert_eq!(split.report["handshake"], "TLSv1.3", "{}", split.report);
        assert_eq!(split.report["retried"], false, "{}", split.report);
        assert_eq!(split.report["reply"], REPLY);
        assert_eq!(split.connections, 1);
        assert_eq!(
            split.decisions[0]["allowed"], true,
            "{:#}",
            split.decisions[0]
        );
        let retry = self.send("retry-real", 1);
        assert_eq!(retry.report["retried"], true, "{}", retry.report);
        assert_eq!(retry.report["handshake"], "TLSv1.3", "{}", retry.report);
        assert_eq!(retry.report["reply"], REPLY);
        assert_eq!(retry.connections, 1);
        assert_eq!(
            retry.decisions[0]["allowed"], true,
            "{:#}",
            retry.decisions[0]
        );
    }

    /// The retry answered with a hello the first would have been refused for: the tunnel was
    /// open (one connection, for the allowed first hello), the second never completes.
    fn refused_after_retry(&self, shapes: &[(&str, &str)]) {
        for (shape, reason) in shapes {
            let handshakes = self.server.handshakes().len();
            let outcome = self.send(shape, 1);
            assert_eq!(
                outcome.report["retried"], true,
                "{shape}: {}",
                outcome.report
            );
            assert_eq!(
                outcome.report["alert"], "access_denied",
                "{shape}: {}",
                outcome.report
            );
            assert_eq!(outcome.connections, 1, "{shape}");
            let d = &outcome.decisions[0];
            assert_eq!(d["allowed"], false, "{shape}: {d:#}");
            let said = d["reason"].as_str().unwrap_or_default();
            assert!(said.contains("a later TLS ClientHello"), "{shape}: {said}");
            assert!(said.contains(reason), "{shape}: {said}");
            assert_eq!(
                self.server.handshakes().len(),
                handshakes,
                "{shape} completed"
            );
        }
    }

    /// Only the `allowed` real handshakes completed, all for the allowed name, and no byte of
    /// a refused name or hidden-name extension reached the server.
    fn nothing_refused_reached_the_server(&self, allowed: usize) {
        let done = self.server.handshakes();
        assert_eq!(done.len(), allowed, "{done:#?}");
        assert!(done.iter().all(|h| h["sni"] == NPM_HOST), "{done:#?}");
        let hex = |text: &str| text.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        for entry in self.server.entries() {
            let received = entry["received"].as_str().unwrap_or_default();
            for never in [OTHER_HOST, HIDDEN_NAME_MARKER] {
                assert!(
                    !received.contains(&hex(never)),
                    "the server received {never:?}: {entry:#}"
                );
            }
        }
    }
}

/// A shape refused in its tunnel: its name, the TLS alert the client gets (none for a client
/// that sent no TLS), and what the decision's reason says.
type Refusal = (&'static str, Option<&'static str>, &'static str);

const REFUSALS: [Refusal; 14] = [
    (
        "slow-partial",
        None,
        "closed the tunnel before sending a TLS ClientHello",
    ),
    (
        "ech",
        Some("access_denied"),
        "encrypted_client_hello (0xfe0d)",
    ),
    (
        "esni",
        Some("access_denied"),
        "encrypted_server_name (ESNI) (0xffce)",
    ),
    (
        "ech-no-sni",
        Some("access_denied"),
        "encrypted_client_hello (0xfe0d)",
    ),
    (
        "two-names",
        Some("decode_error"),
        "more than one name in server_name",
    ),
    (
        "other-name-type",
        Some("decode_error"),
        "a server_name entry that is not a host_name",
    ),
    ("no-sni", Some("access_denied"), "has no SNI"),
    (
        "other-sni",
        Some("access_denied"),
        "the TLS SNI \"other.test\" differs from the CONNECT host",
    ),
    (
        "second-hello-same-record",
        Some("decode_error"),
        "handshake data after the ClientHello",
    ),
    ("not-tls", None, "not a TLS handshake record"),
    ("huge", Some("decode_error"), "larger than 65536 bytes"),
    (
        "empty-record",
        Some("decode_error"),
        "empty handshake record",
    ),
    (
        "sslv2",
        None,
        "not a TLS handshake record (first byte 0x80)",
    ),
    (
        "ccs-first",
        None,
        "not a TLS handshake record (first byte 0x14)",
    ),
];

/// CONNECTs refused before any tunnel: the status, and what the decision's reason says.
const CONNECT_REFUSALS: [(&str, &str, &str); 2] = [
    (
        "other-port",
        "403",
        "port 444 is not allowed for registry.npmjs.org (allowed: 443)",
    ),
    ("signed-port", "400", "CONNECT target has an invalid port"),
];

const RETRY_REFUSALS: [(&str, &str); 2] = [
    ("retry-other-sni", "differs from the CONNECT host"),
    ("retry-ech", "encrypted_client_hello (0xfe0d)"),
];

/// Asserts a shape refused inside the tunnel with no upstream connection: the 200, then
/// `alert` (or nothing), and a decision naming `reason`.
fn refused_unconnected(outcome: &Outcome, shape: &str, alert: Option<&str>, reason: &str) {
    let Outcome {
        report,
        decisions,
        connections,
    } = outcome;
    assert_eq!(report["status"], "200", "{shape}: {report}");
    assert_eq!(*connections, 0, "{shape} reached the server: {report}");
    assert_eq!(report["alert"].as_str(), alert, "{shape}: {report}");
    if alert.is_none() {
        assert_eq!(report["received"], "", "{shape}: {report}");
    }
    for d in decisions {
        assert_eq!(d["allowed"], false, "{shape}: {d:#}");
        assert!(d["addr"].is_null(), "{shape} was resolved: {d:#}");
        let said = d["reason"].as_str().unwrap_or_default();
        assert!(said.contains(reason), "{shape}: {said}");
    }
}

#[test]
fn every_shape_of_client_hello_is_judged_before_anything_leaves() {
    let test = "every_shape_of_client_hello_is_judged_before_anything_leaves";
    let Some(bench) = Bench::start(Backend::Jail, test) else {
        return;
    };
    bench.silent_tunnels(100);
    bench.refused_hellos(&REFUSALS);
    for (shape, status, reason) in CONNECT_REFUSALS {
        let refused = bench.send(shape, 1);
        assert_eq!(
            refused.report["status"], status,
            "{shape}: {}",
            refused.report
        );
        assert_eq!(refused.connections, 0, "{shape}");
        let d = &refused.decisions[0];
        assert_eq!(d["allowed"], false, "{shape}: {d:#}");
        assert!(d["addr"].is_null(), "{shape} was resolved: {d:#}");
        let said = d["reason"].as_str().unwrap_or_default();
        assert!(said.contains(reason), "{shape}: {said}");
    }

    // A second hello right behind the first, in one write: judged and refused before it is
    // forwarded. Whether the first alone was read (and connected for) before the second
    // arrived depends on how the stream was cut on its way; the second never reaches the
    // server either way (checked at the end).
    let second = bench.send("second-hello", 1);
    assert_eq!(second.report["alert"], "access_denied", "{}", second.report);
    assert!(second.connections <= 1, "{}", second.connections);
    let said = second.decisions[0]["reason"].as_str().unwrap_or_default();
    assert!(
        said.contains("a later TLS ClientHello in the tunnel was refused"),
        "{said}"
    );

    // QUIC: a datagram to the server's address and port, which inside the guest is only the
    // guest's own loopback, and to the allowed name, which the guest cannot resolve. No
    // decision: UDP never reaches the proxy; the server's host side hears nothing.
    let udp =
        std::net::UdpSocket::bind((bench.server.addr, 443)).expect("bind a host UDP listener");
    udp.set_nonblocking(true).expect("nonblocking");
    let quic = bench.send_with("quic", 0, &bench.server.addr.to_string());
    assert_eq!(quic.connections, 0);
    let mut datagram = [0u8; 2048];
    assert!(
        udp.recv_from(&mut datagram).is_err(),
        "a QUIC datagram from the guest reached the host: {}",
        quic.report
    );

    // Plain HTTP through the proxy: a 403 before any tunnel.
    let plain = bench.send("plain-http", 1);
    assert_eq!(plain.report["status"], "403", "{}", plain.report);
    assert_eq!(plain.connections, 0);
    assert_eq!(plain.decisions[0]["port"], 80);

    bench.real_handshakes_pass();
    // TLS 1.2: the client's key exchange follows the ServerHello in plaintext records, which
    // the watch reads and lets through.
    let tls12 = bench.send("tls12-real", 1);
    assert_eq!(tls12.report["handshake"], "TLSv1.2", "{}", tls12.report);
    assert_eq!(tls12.report["reply"], REPLY);
    assert_eq!(
        tls12.decisions[0]["allowed"], true,
        "{:#}",
        tls12.decisions[0]
    );
    bench.refused_after_retry(&RETRY_REFUSALS);
    bench.nothing_refused_reached_the_server(3);
}

/// The same judgement on `vm`, whose guest's connections reach the proxy over virtio-serial
/// and are cut differently on the way: a few shapes of each kind, to keep the suite lean.
#[test]
fn client_hellos_are_judged_before_anything_leaves_in_a_vm() {
    let test = "client_hellos_are_judged_before_anything_leaves_in_a_vm";
    let Some(bench) = Bench::start(Backend::Vm, test) else {
        return;
    };
    bench.silent_tunnels(20);
    let shapes: Vec<Refusal> = REFUSALS
        .into_iter()
        .filter(|(shape, ..)| ["slow-partial", "ech", "two-names", "other-sni"].contains(shape))
        .collect();
    bench.refused_hellos(&shapes);
    bench.real_handshakes_pass();
    bench.refused_after_retry(&RETRY_REFUSALS[..1]);
    bench.nothing_refused_reached_the_server(2);
}
