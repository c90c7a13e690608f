//! Tests of whole conversations through [`Proxy::serve`]: the client is an in-memory duplex
//! stream, upstreams are real TCP listeners on 127.0.0.1 reached through resolve overrides.
//! Refusal tests never reach DNS or the network: they are refused before resolving, or (for
//! "localhost") resolved from /etc/hosts and refused before connecting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::tls::build::{client_hello, extension, hello_for, records, sni};
use crate::*;

struct Harness {
    proxy: Arc<Proxy>,
    summary: Arc<SummarySink>,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn harness(policy: Policy, overrides: ResolveOverrides) -> Harness {
    harness_with(policy, overrides, Limits::default())
}

fn harness_with(policy: Policy, overrides: ResolveOverrides, limits: Limits) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("network.jsonl");
    let summary = Arc::new(SummarySink::new());
    let sink = Arc::new((JsonlSink::create(&log).unwrap(), summary.clone()));
    let proxy = Arc::new(Proxy::new(policy, overrides, sink).with_limits(limits));
    Harness {
        proxy,
        summary,
        log,
        _dir: dir,
    }
}

impl Harness {
    /// Starts a conversation; returns the client end and the conversation's decision.
    fn connect(&self) -> (DuplexStream, JoinHandle<Decision>) {
        let (client, server) = tokio::io::duplex(256 * 1024);
        let proxy = self.proxy.clone();
        (
            client,
            tokio::spawn(async move { proxy.serve(server).await }),
        )
    }

    /// Sends `bytes`, half-closes, and returns everything the proxy answered and the decision.
    async fn exchange(&self, bytes: &[u8]) -> (Vec<u8>, Decision) {
        let (mut client, decision) = self.connect();
        client.write_all(bytes).await.unwrap();
        client.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        (answer, decision.await.unwrap())
    }

    fn log_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

/// A one-connection upstream on 127.0.0.1: reads until EOF, then writes `reply` and closes.
/// Its task returns what it read (`None` if nobody connected before the listener dropped).
async fn upstream(reply: Vec<u8>) -> (SocketAddr, JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.unwrap();
        // A refused tunnel is already closed on the proxy's side; the write may fail.
        let _ = stream.write_all(&reply).await;
        let _ = stream.shutdown().await;
        got
    });
    (addr, task)
}

fn policy(hosts: &[&str]) -> Policy {
    Policy::https_hosts(hosts).unwrap()
}

fn overrides(entries: &[(&str, u16, SocketAddr)]) -> ResolveOverrides {
    let mut o = ResolveOverrides::none();
    for (host, port, addr) in entries {
        o.insert(host, *port, *addr).unwrap();
    }
    o
}

fn connect_request(target: &str) -> Vec<u8> {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: test\r\n\r\n").into_bytes()
}

/// Splits an answer into its head (text) and what follows.
fn split_answer(answer: &[u8]) -> (String, Vec<u8>) {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(answer)));
    (
        String::from_utf8(answer[..end].to_vec()).unwrap(),
        answer[end..].to_vec(),
    )
}

/// Asserts a refusal answer: status, header and body naming `fragment`; returns the body.
fn assert_refused(answer: &[u8], status: &str, fragment: &str) -> String {
    let (head, body) = split_answer(answer);
    assert!(head.starts_with(&format!("HTTP/1.1 {status}")), "{head}");
    assert!(head.contains("X-Dynocap-Refusal: "), "{head}");
    assert!(head.contains(fragment), "{head}");
    let body = String::from_utf8(body).unwrap();
    assert!(body.starts_with("dynocap: "), "{body}");
    assert!(body.contains(fragment), "{body}");
    body
}

#[tokio::test]
async fn allowed_connect_relays_both_ways_and_counts() {
    let reply = vec![0x5a; 300_000];
    let (addr, server) = upstream(reply.clone()).await;
    let h = harness(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, addr)]),
    );
    let hello = hello_for("registry.example", 0);
    let mut sent = connect_request("Registry.Example.:443");
    sent.extend_from_slice(&hello);
    sent.extend_from_slice(b"application data");
    let (answer, decision) = h.exchange(&sent).await;

    let (head, tunnel) = split_answer(&answer);
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    assert_eq!(tunnel, reply);
    let mut expected_up = hello.clone();
    expected_up.extend_from_slice(b"application data");
    assert_eq!(server.await.unwrap(), expected_up);

    assert!(decision.allowed, "{decision:?}");
    assert_eq!(decision.host, "registry.example");
    assert_eq!(decision.port, 443);
    assert_eq!(decision.addr, Some(addr.to_string()));
    assert_eq!(decision.protocol, Some(Protocol::Tls));
    assert_eq!(decision.bytes_up, expected_up.len() as u64);
    assert_eq!(decision.bytes_down, reply.len() as u64);
    assert!(
        decision.reason.contains("allowed by registry.example"),
        "{}",
        decision.reason
    );
    assert!(
        decision.reason.contains("resolve override"),
        "{}",
        decision.reason
    );
    assert!(
        decision.time.ends_with('Z') && decision.time.contains('T'),
        "{}",
        decision.time
    );
}

#[tokio::test]
async fn hello_split_across_records_and_writes_is_reassembled() {
    let (addr, server) = upstream(b"down".to_vec()).await;
    let h = harness(
        policy(&["*.example.org"]),
        overrides(&[("a.b.example.org", 443, addr)]),
    );
    let hello = records(&client_hello(Some(sni("a.b.example.org"))), 30);
    let (mut client, decision) = h.connect();
    client
        .write_all(&connect_request("a.b.example.org:443"))
        .await
        .unwrap();
    // Wait for the 200 like a real client, then send the hello in small pieces.
    let mut ok = [0u8; 39];
    client.read_exact(&mut ok).await.unwrap();
    assert_eq!(&ok, b"HTTP/1.1 200 Connection established\r\n\r\n");
    for piece in hello.chunks(7) {
        client.write_all(piece).await.unwrap();
        tokio::task::yield_now().await;
    }
    client.shutdown().await.unwrap();
    let mut down = Vec::new();
    client.read_to_end(&mut down).await.unwrap();
    assert_eq!(down, b"down");
    assert_eq!(server.await.unwrap(), hello);
    let decision = decision.await.unwrap();
    assert!(decision.allowed, "{decision:?}");
    assert!(
        decision.reason.contains("*.example.org"),
        "{}",
        decision.reason
    );
}

#[tokio::test]
async fn host_not_on_the_allowlist_is_refused_with_the_allowlist() {
    let h = harness(
        policy(&["registry.example", "git.example"]),
        ResolveOverrides::none(),
    );
    let (answer, decision) = h.exchange(&connect_request("evil.example:443")).await;
    let body = assert_refused(
        &answer,
        "403 Forbidden",
        "evil.example is not on this sandbox's allowlist",
    );
    assert!(
        body.contains("only HTTPS (CONNECT to port 443) to allowlisted hosts is allowed: registry.example, git.example"),
        "{body}"
    );
    assert!(!decision.allowed);
    assert_eq!(decision.host, "evil.example");
    assert_eq!(decision.addr, None);
    assert_eq!(decision.protocol, None);
}

#[tokio::test]
async fn raw_ips_are_refused() {
    let h = harness(policy(&["registry.example"]), ResolveOverrides::none());
    for target in [
        "127.0.0.1:443",
        "[::1]:443",
        "[::ffff:127.0.0.1]:443",
        "2130706433:443",
    ] {
        let (answer, decision) = h.exchange(&connect_request(target)).await;
        assert_refused(&answer, "403", "raw IP address");
        assert!(!decision.allowed);
        assert_eq!(decision.addr, None, "{target}: never connected");
    }
}

#[tokio::test]
async fn other_ports_are_refused() {
    let h = harness(policy(&["registry.example"]), ResolveOverrides::none());
    let (answer, decision) = h.exchange(&connect_request("registry.example:80")).await;
    assert_refused(
        &answer,
        "403",
        "port 80 is not allowed for registry.example (allowed: 443)",
    );
    assert_eq!(decision.port, 80);
    assert!(!decision.allowed);
}

#[tokio::test]
async fn plain_http_is_refused() {
    let h = harness(policy(&["registry.example"]), ResolveOverrides::none());
    let (answer, decision) = h
        .exchange(b"GET http://registry.example/pkg HTTP/1.1\r\nHost: registry.example\r\n\r\n")
        .await;
    let body = assert_refused(
        &answer,
        "403",
        "plain HTTP (GET) is refused in a filtered sandbox",
    );
    assert!(body.contains("allowed: registry.example"), "{body}");
    assert_eq!(
        (decision.host.as_str(), decision.port),
        ("registry.example", 80)
    );
    assert!(!decision.allowed);
}

#[tokio::test]
async fn deny_all_says_nothing_is_allowed() {
    let h = harness(Policy::deny_all(), ResolveOverrides::none());
    let (answer, _) = h.exchange(&connect_request("registry.example:443")).await;
    let body = assert_refused(&answer, "403", "not on this sandbox's allowlist");
    assert!(body.contains("allows no network connections"), "{body}");
}

#[tokio::test]
async fn malformed_requests_get_400() {
    let h = harness(policy(&["registry.example"]), ResolveOverrides::none());
    let (answer, decision) = h
        .exchange(b"CONNECT registry.example HTTP/1.1\r\n\r\n")
        .await;
    assert_refused(&answer, "400", "bad request line");
    assert!(!decision.allowed);
    // TLS straight at the proxy: refused at once, not after the head timeout.
    let (answer, decision) = h.exchange(&hello_for("registry.example", 0)).await;
    assert_refused(&answer, "400", "not an HTTP proxy request");
    assert!(!decision.allowed);
    let big = format!(
        "CONNECT registry.example:443 HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(9000)
    );
    let (answer, _) = h.exchange(big.as_bytes()).await;
    assert_refused(&answer, "431", "larger than 8192 bytes");
}

#[tokio::test]
async fn a_head_that_never_ends_times_out() {
    let limits = Limits {
        head_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let h = harness_with(
        policy(&["registry.example"]),
        ResolveOverrides::none(),
        limits,
    );
    let (mut client, decision) = h.connect();
    client
        .write_all(b"CONNECT registry.example:443 HTTP/1.1\r\n")
        .await
        .unwrap();
    // The client keeps its end open; the proxy gives up and closes.
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    assert!(answer.is_empty());
    let decision = decision.await.unwrap();
    assert!(!decision.allowed);
    assert!(
        decision.reason.contains("no complete request head"),
        "{}",
        decision.reason
    );
}

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused_without_connecting() {
    // "localhost" comes from /etc/hosts; the proxy refuses before any connect.
    let h = harness(policy(&["localhost"]), ResolveOverrides::none());
    let (answer, decision) = h.exchange(&connect_request("localhost:443")).await;
    assert_refused(&answer, "403", "localhost resolves to a loopback address (");
    assert!(!decision.allowed);
    let addr: SocketAddr = decision.addr.as_deref().unwrap().parse().unwrap();
    assert_eq!(classify(addr.ip()), AddrClass::Loopback);
    assert_eq!(decision.protocol, Some(Protocol::Tls));
}

/// Sends CONNECT and `first` into a tunnel whose upstream must receive nothing.
async fn refused_in_tunnel(first: &[u8], fragment: &str) {
    let (addr, server) = upstream(Vec::new()).await;
    let h = harness(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, addr)]),
    );
    let mut sent = connect_request("registry.example:443");
    sent.extend_from_slice(first);
    let (answer, decision) = h.exchange(&sent).await;
    assert_eq!(answer, b"HTTP/1.1 200 Connection established\r\n\r\n");
    assert!(
        server.await.unwrap().is_empty(),
        "nothing forwarded upstream"
    );
    assert!(!decision.allowed);
    assert!(decision.reason.contains(fragment), "{}", decision.reason);
    assert_eq!(decision.addr, Some(addr.to_string()));
    assert_eq!((decision.bytes_up, decision.bytes_down), (0, 0));
    assert_eq!(h.log_lines().len(), 1);
}

#[tokio::test]
async fn sni_mismatch_is_refused() {
    refused_in_tunnel(
        &hello_for("other.example", 0),
        "the TLS SNI \"other.example\" differs from the CONNECT host \"registry.example\"",
    )
    .await;
}

#[tokio::test]
async fn missing_sni_is_refused() {
    let hello = records(&client_hello(Some(extension(43, &[2, 3, 4]))), 1 << 14);
    refused_in_tunnel(&hello, "has no SNI").await;
}

#[tokio::test]
async fn malformed_client_hello_is_refused() {
    let mut hello = hello_for("registry.example", 0);
    hello[9] ^= 0x40; // corrupt the handshake length
    refused_in_tunnel(&hello, "ClientHello").await;
    refused_in_tunnel(b"GET / HTTP/1.1\r\n\r\n", "not a TLS handshake record").await;
    let hello = hello_for("registry.example", 0);
    refused_in_tunnel(
        &hello[..hello.len() - 3],
        "closed the tunnel before sending a TLS ClientHello",
    )
    .await;
}

#[tokio::test]
async fn ssh_rules_check_the_banner() {
    let (addr, server) = upstream(b"SSH-2.0-server\r\n".to_vec()).await;
    let mut p = Policy::deny_all();
    p.push(Rule::ssh(HostPattern::parse("git.example").unwrap()));
    let h = harness(p.clone(), overrides(&[("git.example", 22, addr)]));
    let mut sent = connect_request("git.example:22");
    sent.extend_from_slice(b"SSH-2.0-OpenSSH_9.2\r\nkexinit");
    let (answer, decision) = h.exchange(&sent).await;
    let (_, tunnel) = split_answer(&answer);
    assert_eq!(tunnel, b"SSH-2.0-server\r\n");
    assert_eq!(server.await.unwrap(), b"SSH-2.0-OpenSSH_9.2\r\nkexinit");
    assert!(decision.allowed);
    assert_eq!(decision.protocol, Some(Protocol::Ssh));

    // TLS (or anything else) on the SSH rule's port is refused.
    let (addr, server) = upstream(Vec::new()).await;
    let h = harness(p, overrides(&[("git.example", 22, addr)]));
    let mut sent = connect_request("git.example:22");
    sent.extend_from_slice(&hello_for("git.example", 0));
    let (_, decision) = h.exchange(&sent).await;
    assert!(server.await.unwrap().is_empty());
    assert!(!decision.allowed);
    assert!(
        decision.reason.contains("not an SSH-2.0 client"),
        "{}",
        decision.reason
    );
    // And port 443 is not allowed for an SSH-only host.
    let (answer, _) = h.exchange(&connect_request("git.example:443")).await;
    assert_refused(
        &answer,
        "403",
        "port 443 is not allowed for git.example (allowed: 22)",
    );
}

#[tokio::test]
async fn connect_failure_is_a_502() {
    // Bind then drop: a loopback port with nothing listening.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let h = harness(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, addr)]),
    );
    let (answer, decision) = h.exchange(&connect_request("registry.example:443")).await;
    assert_refused(&answer, "502", "could not connect to registry.example");
    assert!(!decision.allowed);
    assert_eq!(decision.addr, Some(addr.to_string()));
}

#[tokio::test]
async fn policy_swaps_apply_to_new_conversations() {
    let h = harness(policy(&["clone.example"]), ResolveOverrides::none());
    assert_eq!(
        h.proxy.policy().allows("clone.example", 443),
        Some(Protocol::Tls)
    );
    h.proxy.set_policy(policy(&["registry.example"]));
    let (answer, _) = h.exchange(&connect_request("clone.example:443")).await;
    assert_refused(
        &answer,
        "403",
        "clone.example is not on this sandbox's allowlist",
    );
    assert_eq!(h.proxy.policy().to_string(), "registry.example");
}

#[tokio::test]
async fn decisions_reach_the_log_and_the_summary() {
    let (addr, server) = upstream(b"0123456789".to_vec()).await;
    let h = harness(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, addr)]),
    );
    let mut sent = connect_request("registry.example:443");
    let hello = hello_for("registry.example", 0);
    sent.extend_from_slice(&hello);
    h.exchange(&sent).await;
    server.await.unwrap();
    h.exchange(&connect_request("evil.example:443")).await;
    h.exchange(&connect_request("evil.example:443")).await;
    h.exchange(&connect_request("registry.example:80")).await;

    let lines = h.log_lines();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["allowed"], true);
    assert_eq!(lines[0]["bytesUp"], hello.len());
    assert_eq!(lines[0]["bytesDown"], 10);
    assert_eq!(lines[0]["addr"], addr.to_string());
    assert_eq!(lines[0]["protocol"], "tls");
    assert_eq!(lines[1]["allowed"], false);
    assert_eq!(lines[1]["host"], "evil.example");
    assert!(lines[1]["reason"].as_str().unwrap().contains("allowlist"));

    let summary = h.summary.snapshot();
    assert_eq!(summary.hosts_reached.len(), 1);
    assert_eq!(summary.hosts_reached[0].host, "registry.example");
    assert_eq!(summary.hosts_reached[0].connections, 1);
    assert_eq!(summary.hosts_reached[0].bytes_down, 10);
    assert_eq!(summary.refusals.count, 3);
    assert_eq!(summary.refusals.first.len(), 2);
    assert_eq!(summary.refusals.first[0].count, 2);
}

/// The serve future can run on a multi-threaded runtime (spawned by the supervisor).
#[test]
fn serve_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    fn check<S: AsyncRead + AsyncWrite + Unpin + Send>(proxy: &Proxy, s: S) {
        assert_send(&proxy.serve(s));
    }
    let proxy = Proxy::new(
        Policy::deny_all(),
        ResolveOverrides::none(),
        Arc::new(NullSink),
    );
    let (a, _b) = tokio::io::duplex(16);
    check(&proxy, a);
}
