//! Tests of whole conversations through [`Proxy::serve`]: the client is an in-memory duplex
//! stream, upstreams are real TCP listeners on 127.0.0.1 reached through resolve overrides.
//! They all run a second time as `proxy_socket_tests` (lib.rs), through [`Proxy::serve_socket`]
//! with a TCP client: every refusal and count holds for both relays.
//! Refusal tests never reach DNS or the network: they are refused before resolving, or (for
//! "localhost") resolved from /etc/hosts and refused before connecting. Tests of what must not
//! connect count the connections their own listener accepted ([`Listener::accepted`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::tls::build::{client_hello, extension, hello_for, records, sni};
use crate::*;

/// The client's end of a conversation: in memory, or a TCP socket.
trait ClientIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ClientIo for T {}
type Client = Box<dyn ClientIo>;

/// Whether this copy of the tests serves TCP clients with [`Proxy::serve_socket`].
fn through_socket() -> bool {
    module_path!().ends_with("proxy_socket_tests")
}

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
    fn connect(&self) -> (Client, JoinHandle<Decision>) {
        let proxy = self.proxy.clone();
        if through_socket() {
            // On loopback the connect completes at once and the accept takes it from the
            // backlog: neither blocks the test's runtime for long.
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            for socket in [&client, &server] {
                socket.set_nonblocking(true).unwrap();
            }
            let client = tokio::net::TcpStream::from_std(client).unwrap();
            let server = tokio::net::TcpStream::from_std(server).unwrap();
            return (
                Box::new(client),
                tokio::spawn(async move { proxy.serve_socket(server).await }),
            );
        }
        let (client, server) = tokio::io::duplex(256 * 1024);
        (
            Box::new(client),
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

/// A loopback listener that accepts every connection, keeps it open until its client closes,
/// and records who connected, so that a test can say how many connections the proxy made.
struct Listener {
    addr: SocketAddr,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    _task: JoinHandle<()>,
}

impl Listener {
    async fn start() -> Listener {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let peers = Arc::new(Mutex::new(Vec::new()));
        let seen = peers.clone();
        let task = tokio::spawn(async move {
            loop {
                let (mut stream, peer) = listener.accept().await.unwrap();
                seen.lock().unwrap().push(peer);
                tokio::spawn(async move {
                    let mut sink = Vec::new();
                    let _ = stream.read_to_end(&mut sink).await;
                });
            }
        });
        Listener {
            addr,
            peers,
            _task: task,
        }
    }

    /// Connections accepted so far, not counting a probe of its own: the probe connects
    /// last, and the kernel queues connections in order, so once the probe is accepted every
    /// earlier connection has been counted.
    async fn accepted(&self) -> usize {
        let probe = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let me = probe.local_addr().unwrap();
        loop {
            {
                let mut peers = self.peers.lock().unwrap();
                if let Some(before_probe) = peers.iter().position(|p| *p == me) {
                    peers.remove(before_probe);
                    return before_probe;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
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
    // What a client sends after its hello is TLS records: early data here.
    let early = [23, 3, 3, 0, 4, b'd', b'a', b't', b'a'];
    sent.extend_from_slice(&early);
    let (answer, decision) = h.exchange(&sent).await;

    let (head, tunnel) = split_answer(&answer);
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    assert_eq!(tunnel, reply);
    let mut expected_up = hello.clone();
    expected_up.extend_from_slice(&early);
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

fn hint(host: &str) -> String {
    format!("add {host} to the allowlist")
}

#[tokio::test]
async fn a_host_off_the_allowlist_is_told_what_would_allow_it_before_the_client_hears() {
    let refusals = Arc::new(CommandRefusals::new());
    let summary = Arc::new(SummarySink::new());
    let sink = Arc::new((summary.clone(), refusals.clone()));
    let proxy = Arc::new(
        Proxy::new(
            policy(&["registry.example"]),
            ResolveOverrides::none(),
            sink,
        )
        .with_allow_hint(hint),
    );
    let window = refusals.open();
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let serving = tokio::spawn({
        let proxy = proxy.clone();
        async move { proxy.serve(server).await }
    });
    client
        .write_all(&connect_request("Evil.Example:443"))
        .await
        .unwrap();
    // The status line arrives only once the decision is recorded.
    let mut first = [0u8; 12];
    client.read_exact(&mut first).await.unwrap();
    let list = window.close();
    assert_eq!(list.refusals.len(), 1, "{list:?}");
    let entry = &list.refusals[0];
    assert_eq!(
        (entry.host.as_str(), entry.port, entry.count),
        ("evil.example", 443, 1)
    );
    assert_eq!(
        entry.reason,
        "evil.example is not on this sandbox's allowlist"
    );
    assert_eq!(
        entry.fix.as_deref(),
        Some("add evil.example to the allowlist")
    );

    let mut answer = first.to_vec();
    client.read_to_end(&mut answer).await.unwrap();
    let (head, body) = split_answer(&answer);
    assert!(
        head.starts_with(
            "HTTP/1.1 403 Forbidden (dynocap: evil.example is not on this sandbox's allowlist; \
             add evil.example to the allowlist)\r\n"
        ),
        "{head}"
    );
    let body = String::from_utf8(body).unwrap();
    assert!(
        body.starts_with(
            "dynocap: evil.example is not on this sandbox's allowlist; add evil.example to the \
             allowlist; only HTTPS"
        ),
        "{body}"
    );
    let decision = serving.await.unwrap();
    assert_eq!(
        decision.fix.as_deref(),
        Some("add evil.example to the allowlist")
    );

    // Refusals nothing would allow carry no fix, and a closed window sees nothing more.
    let window = refusals.open();
    let (answer, decision) = {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let proxy = proxy.clone();
        let serving = tokio::spawn(async move { proxy.serve(server).await });
        client
            .write_all(&connect_request("registry.example:80"))
            .await
            .unwrap();
        client.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        (answer, serving.await.unwrap())
    };
    assert_refused(
        &answer,
        "403",
        "port 80 is not allowed for registry.example",
    );
    assert_eq!(decision.fix, None);
    let list = window.close();
    assert_eq!(list.refusals.len(), 1);
    assert_eq!(list.refusals[0].fix, None);
    assert_eq!(list.refusals[0].port, 80);
    assert_eq!(summary.snapshot().refusals.count, 2);
    assert_eq!(refusals.open_windows(), 0);
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

/// A refused client whose request the proxy did not read whole (a body here) still reads
/// the refusal. Through a socket, the proxy's close with those bytes unread is a reset; the
/// client reads the answer and the end before it.
#[tokio::test]
async fn a_refused_request_with_a_body_still_reads_its_refusal() {
    let h = harness(policy(&["registry.example"]), ResolveOverrides::none());
    let body = vec![b'x'; 200_000];
    let mut sent = format!(
        "POST http://registry.example/upload HTTP/1.1\r\nHost: registry.example\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    sent.extend_from_slice(&body);
    let (mut client, decision) = h.connect();
    // As a real client: the whole request, then the answer, without closing first.
    client.write_all(&sent).await.unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    assert_refused(&answer, "403", "plain HTTP (POST) is refused");
    assert!(!decision.await.unwrap().allowed);
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
    // "localhost" comes from /etc/hosts; the proxy resolves it only after an allowed hello,
    // and refuses before any connect.
    let h = harness(policy(&["localhost"]), ResolveOverrides::none());
    let mut sent = connect_request("localhost:443");
    sent.extend_from_slice(&hello_for("localhost", 0));
    let (answer, decision) = h.exchange(&sent).await;
    let (head, tunnel) = split_answer(&answer);
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    assert_eq!(tunnel, ACCESS_DENIED, "a TLS alert ends the handshake");
    assert!(!decision.allowed);
    assert!(
        decision
            .reason
            .contains("localhost resolves to a loopback address ("),
        "{}",
        decision.reason
    );
    let addr: SocketAddr = decision.addr.as_deref().unwrap().parse().unwrap();
    assert_eq!(classify(addr.ip()), AddrClass::Loopback);
    // And what the person running DynoCap can set: the address, as the override spells it.
    let shown = match addr.ip() {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        ip => ip.to_string(),
    };
    assert!(
        decision.reason.ends_with(&format!(
            "unless the person running DynoCap names the address of a mirror they trust in \
             DYNOCAP_RESOLVE (localhost:443:{shown})"
        )),
        "{}",
        decision.reason
    );
    assert_eq!(decision.protocol, Some(Protocol::Tls));

    // Without a hello the name is never looked up: the tunnel ends on the missing hello, not
    // on the address the lookup would have found.
    let (answer, decision) = h.exchange(&connect_request("localhost:443")).await;
    assert_eq!(answer, b"HTTP/1.1 200 Connection established\r\n\r\n");
    assert!(
        decision.reason.contains("before sending a TLS ClientHello"),
        "{}",
        decision.reason
    );
    assert_eq!(decision.addr, None);
}

/// The fatal alerts the proxy ends a refused handshake with.
const ACCESS_DENIED: &[u8] = &[21, 3, 3, 0, 2, 2, 49];
const DECODE_ERROR: &[u8] = &[21, 3, 3, 0, 2, 2, 50];

/// Sends CONNECT and `first` into a tunnel that must make no upstream connection; returns
/// what the client got after the 200, and the decision.
async fn refused_in_tunnel(first: &[u8], fragment: &str) -> (Vec<u8>, Decision) {
    let upstream = Listener::start().await;
    let h = harness(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, upstream.addr)]),
    );
    let mut sent = connect_request("registry.example:443");
    sent.extend_from_slice(first);
    let (answer, decision) = h.exchange(&sent).await;
    let (head, tunnel) = split_answer(&answer);
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    assert_eq!(upstream.accepted().await, 0, "no upstream connection");
    assert!(!decision.allowed);
    assert!(decision.reason.contains(fragment), "{}", decision.reason);
    assert_eq!(decision.addr, None, "not even resolved");
    assert_eq!((decision.bytes_up, decision.bytes_down), (0, 0));
    assert_eq!(h.log_lines().len(), 1);
    (tunnel, decision)
}

#[tokio::test]
async fn sni_mismatch_is_refused() {
    let (tunnel, _) = refused_in_tunnel(
        &hello_for("other.example", 0),
        "the TLS SNI \"other.example\" differs from the CONNECT host \"registry.example\"",
    )
    .await;
    assert_eq!(tunnel, ACCESS_DENIED);
    // A U-label where RFC 6066 wants the A-label: the server would not map it as the proxy.
    let mut host = "registry.example".to_owned();
    host.insert(0, '\u{e9}');
    let policy_host = normalize_host(&host).unwrap();
    assert!(policy_host.starts_with("xn--"), "{policy_host}");
    let upstream = Listener::start().await;
    let h = harness(
        policy(&[policy_host.as_str()]),
        overrides(&[(policy_host.as_str(), 443, upstream.addr)]),
    );
    let mut sent = connect_request(&format!("{policy_host}:443"));
    sent.extend_from_slice(&hello_for(&host, 0));
    let (_, decision) = h.exchange(&sent).await;
    assert!(decision.reason.contains("differs"), "{}", decision.reason);
    assert_eq!(upstream.accepted().await, 0);
}

#[tokio::test]
async fn missing_sni_is_refused() {
    let hello = records(&client_hello(Some(extension(43, &[2, 3, 4]))), 1 << 14);
    refused_in_tunnel(&hello, "has no SNI").await;
    refused_in_tunnel(&records(&client_hello(None), 1 << 14), "has no SNI").await;
}

#[tokio::test]
async fn hellos_hiding_the_server_name_are_refused() {
    for (code, name) in [
        (0xfe0d, "encrypted_client_hello (0xfe0d)"),
        (0xfe0a, "encrypted_client_hello (draft 10) (0xfe0a)"),
        (0xffce, "encrypted_server_name (ESNI) (0xffce)"),
        (0xfd00, "ech_outer_extensions (0xfd00)"),
    ] {
        // The outer SNI is the CONNECT host, as an ECH client's public name would be.
        let mut ext = sni("registry.example");
        ext.extend_from_slice(&extension(code, &[0, 1, 2, 3, 4, 5]));
        let hello = records(&client_hello(Some(ext)), 1 << 14);
        let (tunnel, _) = refused_in_tunnel(&hello, name).await;
        assert_eq!(tunnel, ACCESS_DENIED);
    }
}

#[tokio::test]
async fn ambiguous_server_names_are_refused() {
    let mut two = Vec::new();
    for host in ["registry.example", "other.example"] {
        two.push(0);
        two.extend_from_slice(&u16::try_from(host.len()).unwrap().to_be_bytes());
        two.extend_from_slice(host.as_bytes());
    }
    let mut data = u16::try_from(two.len()).unwrap().to_be_bytes().to_vec();
    data.extend_from_slice(&two);
    let hello = records(&client_hello(Some(extension(0, &data))), 1 << 14);
    let (tunnel, _) = refused_in_tunnel(&hello, "more than one name in server_name").await;
    assert_eq!(tunnel, DECODE_ERROR);
    let mut twice = sni("registry.example");
    twice.extend_from_slice(&sni("other.example"));
    let hello = records(&client_hello(Some(twice)), 1 << 14);
    refused_in_tunnel(&hello, "an extension appears twice").await;
}

#[tokio::test]
async fn a_second_hello_sent_with_the_first_is_refused_before_connecting() {
    let mut both = hello_for("registry.example", 0);
    both.extend_from_slice(&hello_for("other.example", 0));
    let (tunnel, _) = refused_in_tunnel(&both, "a later TLS ClientHello in the tunnel").await;
    assert_eq!(tunnel, ACCESS_DENIED);
    // Within the same records as the first: not a ClientHello followed by records, but one
    // flight holding two messages.
    let mut flight = client_hello(Some(sni("registry.example")));
    flight.extend_from_slice(&client_hello(Some(sni("other.example"))));
    refused_in_tunnel(
        &records(&flight, 1 << 14),
        "handshake data after the ClientHello",
    )
    .await;
}

#[tokio::test]
async fn malformed_client_hello_is_refused() {
    let mut hello = hello_for("registry.example", 0);
    hello[9] ^= 0x40; // corrupt the handshake length
    refused_in_tunnel(&hello, "ClientHello").await;
    let (tunnel, _) =
        refused_in_tunnel(b"GET / HTTP/1.1\r\n\r\n", "not a TLS handshake record").await;
    assert!(
        tunnel.is_empty(),
        "no TLS alert to a client that is not TLS"
    );
    refused_in_tunnel(b"SSH-2.0-OpenSSH_9.2\r\n", "not a TLS handshake record").await;
    let hello = hello_for("registry.example", 0);
    refused_in_tunnel(
        &hello[..hello.len() - 3],
        "closed the tunnel before sending a TLS ClientHello",
    )
    .await;
    refused_in_tunnel(b"", "closed the tunnel before sending a TLS ClientHello").await;
}

#[tokio::test]
async fn tunnels_without_a_whole_hello_make_no_connection() {
    let upstream = Listener::start().await;
    let limits = Limits {
        first_bytes_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let h = harness_with(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, upstream.addr)]),
        limits,
    );
    let hello = records(&client_hello(Some(sni("registry.example"))), 40);
    let mut tunnels = Vec::new();
    for i in 0..40 {
        let (mut client, decision) = h.connect();
        client
            .write_all(&connect_request("registry.example:443"))
            .await
            .unwrap();
        let mut ok = [0u8; 39];
        client.read_exact(&mut ok).await.unwrap();
        assert_eq!(&ok, b"HTTP/1.1 200 Connection established\r\n\r\n");
        // Half send nothing, half a prefix of a valid hello; all keep the tunnel open.
        if i % 2 == 1 {
            client.write_all(&hello[..hello.len() - 1]).await.unwrap();
        }
        tunnels.push((client, decision));
    }
    for (client, decision) in tunnels {
        let decision = decision.await.unwrap();
        assert!(!decision.allowed);
        assert!(
            decision
                .reason
                .contains("no complete TLS ClientHello within"),
            "{}",
            decision.reason
        );
        assert_eq!(decision.addr, None);
        drop(client);
    }
    assert_eq!(upstream.accepted().await, 0);
}

#[tokio::test]
async fn a_hello_larger_than_the_bound_is_refused_unread() {
    let limits = Limits {
        max_client_hello: 1024,
        ..Limits::default()
    };
    let upstream = Listener::start().await;
    let h = harness_with(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, upstream.addr)]),
        limits,
    );
    let mut sent = connect_request("registry.example:443");
    sent.extend_from_slice(&hello_for("registry.example", 2000));
    let (answer, decision) = h.exchange(&sent).await;
    assert!(answer.ends_with(DECODE_ERROR));
    assert!(
        decision.reason.contains("larger than 1024 bytes"),
        "{}",
        decision.reason
    );
    assert_eq!(upstream.accepted().await, 0);
}

/// A scripted TLS server on loopback: answers the first ClientHello with `first_reply`, then
/// keeps everything else it receives; returns it when the proxy closes.
async fn scripted_server(first_reply: Vec<u8>) -> (SocketAddr, JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut replied = false;
        loop {
            let n = stream.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
            if !replied && matches!(parse_client_hello(&got), Ok(Hello::Complete { .. })) {
                stream.write_all(&first_reply).await.unwrap();
                replied = true;
            }
        }
        got
    });
    (addr, task)
}

/// A HelloRetryRequest record, and a ServerHello one, as a TLS 1.3 server sends them.
fn server_hello_record(retry: bool) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(if retry {
        &crate::tls::HELLO_RETRY_RANDOM
    } else {
        &[5; 32]
    });
    body.extend_from_slice(&[0, 0x13, 0x01, 0, 0, 0]);
    let mut msg = vec![2];
    msg.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    records(&msg, 1 << 14)
}

/// Opens a tunnel, sends `first` and reads the 200 and `expect` bytes; returns the client.
async fn open_tunnel(h: &Harness, first: &[u8], expect: usize) -> (Client, Vec<u8>) {
    let (mut client, _) = h.connect();
    let mut sent = connect_request("registry.example:443");
    sent.extend_from_slice(first);
    client.write_all(&sent).await.unwrap();
    let mut got = vec![0u8; 39 + expect];
    client.read_exact(&mut got).await.unwrap();
    (client, got.split_off(39))
}

#[tokio::test]
async fn the_hello_after_a_retry_request_is_judged_too() {
    let ccs = [20u8, 3, 3, 0, 1, 1];
    let retry = server_hello_record(true);
    for (second, allowed) in [
        (hello_for("registry.example", 0), true),
        (hello_for("other.example", 0), false),
    ] {
        let (addr, server) = scripted_server(retry.clone()).await;
        let h = harness(
            policy(&["registry.example"]),
            overrides(&[("registry.example", 443, addr)]),
        );
        let first = hello_for("registry.example", 0);
        let (mut client, got) = open_tunnel(&h, &first, retry.len()).await;
        assert_eq!(got, retry, "the retry request reaches the client");
        // TLS 1.3 compatibility mode: change_cipher_spec, then the second hello, in one
        // write, so that a refusal drops both.
        let mut flight = ccs.to_vec();
        flight.extend_from_slice(&second);
        client.write_all(&flight).await.unwrap();
        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        let upstream_got = server.await.unwrap();
        let mut expected = first.clone();
        if allowed {
            expected.extend_from_slice(&flight);
            assert!(rest.is_empty(), "{rest:?}");
        } else {
            assert_eq!(rest, ACCESS_DENIED);
        }
        assert_eq!(upstream_got, expected, "allowed: {allowed}");
        let lines = h.log_lines();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["allowed"], allowed, "{}", lines[0]);
        if !allowed {
            let reason = lines[0]["reason"].as_str().unwrap();
            assert!(reason.contains("a later TLS ClientHello"), "{reason}");
            assert_eq!(lines[0]["bytesUp"], expected.len());
        }
    }
}

#[tokio::test]
async fn no_byte_of_a_refused_later_hello_goes_upstream() {
    let (addr, server) = scripted_server(Vec::new()).await;
    let h = harness(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, addr)]),
    );
    let first = hello_for("registry.example", 0);
    let (mut client, _) = open_tunnel(&h, &first, 0).await;
    // The second hello in pieces, each given time to be relayed if the proxy would.
    let second = records(&client_hello(Some(sni("other.example"))), 25);
    for piece in second.chunks(11) {
        if client.write_all(piece).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = client.shutdown().await;
    let mut rest = Vec::new();
    let _ = client.read_to_end(&mut rest).await;
    assert_eq!(rest, ACCESS_DENIED);
    // At most the second hello's first record header went up; none of its message.
    let got = server.await.unwrap();
    assert!(got.starts_with(&first), "{got:?}");
    assert!(got.len() <= first.len() + 5, "{got:?}");
    assert_eq!(h.log_lines()[0]["allowed"], false);
}

#[tokio::test]
async fn after_the_server_hello_the_relay_only_copies() {
    let real = server_hello_record(false);
    let (addr, server) = scripted_server(real.clone()).await;
    let h = harness(
        policy(&["registry.example"]),
        overrides(&[("registry.example", 443, addr)]),
    );
    let first = hello_for("registry.example", 0);
    let (mut client, got) = open_tunnel(&h, &first, real.len()).await;
    assert_eq!(got, real);
    // Encrypted records, then bytes that are no records at all: no longer the watch's.
    let mut later = vec![23, 3, 3, 0, 3, 1, 2, 3];
    later.extend_from_slice(&hello_for("other.example", 0)[..10]);
    later.extend_from_slice(b"not a record");
    client.write_all(&later).await.unwrap();
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    let mut expected = first;
    expected.extend_from_slice(&later);
    assert_eq!(server.await.unwrap(), expected);
    assert_eq!(h.log_lines()[0]["allowed"], true);
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

    // TLS (or anything else) on the SSH rule's port is refused, as is a tunnel closed
    // before its version line: neither connects.
    let upstream = Listener::start().await;
    let h = harness(p, overrides(&[("git.example", 22, upstream.addr)]));
    let mut sent = connect_request("git.example:22");
    sent.extend_from_slice(&hello_for("git.example", 0));
    let (_, decision) = h.exchange(&sent).await;
    assert!(!decision.allowed);
    assert!(
        decision.reason.contains("not an SSH-2.0 client"),
        "{}",
        decision.reason
    );
    let (_, decision) = h.exchange(&connect_request("git.example:22")).await;
    assert!(
        decision
            .reason
            .contains("before sending an SSH version line"),
        "{}",
        decision.reason
    );
    assert_eq!(upstream.accepted().await, 0);
    // And port 443 is not allowed for an SSH-only host.
    let (answer, _) = h.exchange(&connect_request("git.example:443")).await;
    assert_refused(
        &answer,
        "403",
        "port 443 is not allowed for git.example (allowed: 22)",
    );
}

#[tokio::test]
async fn connect_failure_after_the_hello_ends_it_with_an_alert() {
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
    let mut sent = connect_request("registry.example:443");
    sent.extend_from_slice(&hello_for("registry.example", 0));
    let (answer, decision) = h.exchange(&sent).await;
    let (_, tunnel) = split_answer(&answer);
    assert_eq!(tunnel, [21, 3, 3, 0, 2, 2, 80], "internal_error");
    assert!(!decision.allowed);
    assert!(
        decision
            .reason
            .contains("could not connect to registry.example"),
        "{}",
        decision.reason
    );
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
    fn check_socket(proxy: &Proxy, s: tokio::net::TcpStream) {
        assert_send(&proxy.serve_socket(s));
    }
    let _ = check_socket;
}
