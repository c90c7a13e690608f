//! Network modes end to end, on each backend. `none`: the guest reaches nothing, not even a
//! server on the host's loopback. `nat`: the guest reaches the outside world through pasta
//! (DNS included) but neither the host's loopback nor the host's own addresses; pasta goes
//! with the sandbox. On `vm` the guest is root of its own kernel: guest root rewriting its
//! routes still reaches nothing of the host.
//!
//! Where packets go: the `none` test targets only 127.0.0.1 and a name. The `nat` tests run
//! dynocap inside a namespace `H` the test created, whose only route leads to the test's own
//! server namespace `S` (see `support/netns.rs`): the guest's gateway leads nowhere else.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dynocap_e2e::netns::{Server, Topology, HOST_ADDR, SERVER_ADDR};
use dynocap_e2e::*;
use serde_json::Value;

/// A second address of `H` (on its loopback device): "the host's other local addresses".
const HOST_OTHER_ADDR: &str = "192.0.2.1";
/// The port of `H`'s own server (bound to every address of `H`).
const HOST_PORT: &str = "8081";
/// The port of `S`'s HTTP server.
const SERVER_PORT: &str = "8080";
/// The name `S`'s DNS server answers with `S`'s address.
const SERVER_NAME: &str = "files.test";
/// A `nat` VM's gateway: QEMU's user networking, whose alias for "the host's loopback" it is.
const VM_GATEWAY: &str = "10.0.2.2";

/// A TCP server on the real host's loopback that counts the connections it accepts.
fn loopback_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().expect("local addr").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, accepted)
}

fn exit_code(result: &Value) -> i64 {
    result["exitCode"].as_i64().unwrap_or(-1)
}

#[test]
fn none_reaches_nothing() {
    none_reaches_nothing_on(Backend::Jail);
}

/// A VM with `none` networking has no NIC at all.
#[test]
fn none_reaches_nothing_in_a_vm() {
    none_reaches_nothing_on(Backend::Vm);
}

fn none_reaches_nothing_on(backend: Backend) {
    let Some(home) = TestHome::on(backend, "none_reaches_nothing") else {
        return;
    };
    let (port, accepted) = loopback_listener();
    let started = home.sandbox("nonet", &["--network", "none"]);
    assert_eq!(started["network"], "none", "{started}");
    assert_eq!(started["backend"], backend.name(), "{started}");

    let attempts = [
        format!("curl -sS -m 5 http://127.0.0.1:{port}/"),
        format!("curl -sS -m 5 http://{SERVER_NAME}/"),
        format!("wget -q -T 5 -t 1 -O /dev/null http://127.0.0.1:{port}/"),
        format!("nc -z -w 3 127.0.0.1 {port}"),
        format!("ping -c 1 -W 2 {SERVER_NAME}"),
        format!("getent hosts {SERVER_NAME}"),
        format!("timeout 5 bash -c 'echo > /dev/tcp/127.0.0.1/{port}'"),
        format!("timeout 5 bash -c 'echo > /dev/tcp/{SERVER_NAME}/80'"),
    ];
    for command in &attempts {
        let result = home.exec("nonet", &[], command);
        assert_ne!(exit_code(&result), 0, "`{command}` succeeded: {result:#}");
    }
    // Only loopback, and no resolver.
    // From /proc: an image need not have `ip`.
    let links = home.sh(
        "nonet",
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    );
    assert_eq!(links.trim(), "lo", "{links}");
    let resolv = home.sh("nonet", "cat /etc/resolv.conf");
    assert!(!resolv.contains("nameserver"), "{resolv}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the host's loopback server was reached from a none guest"
    );
}

/// The test world for `nat`: `H` with its own server on every address, `S` with HTTP and DNS.
struct NatWorld {
    topology: Topology,
    _servers: Vec<Server>,
    _www: tempfile::TempDir,
}

/// A DNS responder: answers A queries for [`SERVER_NAME`] with `S`'s address, NXDOMAIN else.
const DNS_SERVER: &str = r#"
import socket, struct, sys
name, addr = sys.argv[1].lower(), socket.inet_aton(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[2], 53))
while True:
    q, peer = s.recvfrom(512)
    if len(q) < 12:
        continue
    i, labels = 12, []
    while i < len(q) and q[i] != 0:
        labels.append(q[i + 1:i + 1 + q[i]].decode(errors="replace"))
        i += 1 + q[i]
    question = q[12:i + 5]
    qtype = struct.unpack("!H", q[i + 1:i + 3])[0] if i + 3 <= len(q) else 0
    hit = ".".join(labels).lower() == name
    if hit and qtype == 1:
        head = q[:2] + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0)
        answer = struct.pack("!HHHLH", 0xC00C, 1, 1, 60, 4) + addr
        s.sendto(head + question + answer, peer)
    else:
        code = 0x8180 if hit else 0x8183
        s.sendto(q[:2] + struct.pack("!HHHHH", code, 1, 0, 0, 0) + question, peer)
"#;

impl NatWorld {
    fn new() -> NatWorld {
        let topology = Topology::new();
        // A second local address of H, and H's own server on all of its addresses.
        topology
            .host
            .ip(&["addr", "add", &format!("{HOST_OTHER_ADDR}/32"), "dev", "lo"]);
        let www = tempfile::tempdir().expect("tempdir");
        std::fs::write(www.path().join("hello.txt"), "hello from S\n").expect("write");
        let www_dir = www.path().to_str().expect("utf-8 path").to_owned();
        let servers = vec![
            topology.server.spawn(
                "python3",
                &[
                    "-m",
                    "http.server",
                    SERVER_PORT,
                    "--bind",
                    SERVER_ADDR,
                    "--directory",
                    &www_dir,
                ],
            ),
            topology
                .server
                .spawn("python3", &["-c", DNS_SERVER, SERVER_NAME, SERVER_ADDR]),
            topology.host.spawn(
                "python3",
                &[
                    "-m",
                    "http.server",
                    HOST_PORT,
                    "--bind",
                    "0.0.0.0",
                    "--directory",
                    &www_dir,
                ],
            ),
        ];
        let world = NatWorld {
            topology,
            _servers: servers,
            _www: www,
        };
        // From H itself everything answers: the servers are up, and what the guest cannot
        // reach below is kept from it, not missing.
        for url in [
            format!("http://{SERVER_NAME}:{SERVER_PORT}/hello.txt"),
            format!("http://127.0.0.1:{HOST_PORT}/hello.txt"),
            format!("http://{HOST_ADDR}:{HOST_PORT}/hello.txt"),
            format!("http://{HOST_OTHER_ADDR}:{HOST_PORT}/hello.txt"),
        ] {
            assert!(
                wait_until(30, || world
                    .in_host(&["curl", "-sf", "-m", "5", &url])
                    .status
                    .success()),
                "{url} does not answer inside the test's host namespace"
            );
        }
        world
    }

    /// Runs a command in `H` as `ip netns exec` would.
    fn in_host(&self, argv: &[&str]) -> Output {
        self.topology
            .in_host(Path::new(argv[0]))
            .args(&argv[1..])
            .output()
            .expect("run a command in H")
    }

    /// `dynocap --json run NAME --network nat` inside `H`, with `home`'s environment (its
    /// backend among it).
    fn start_nat(&self, home: &TestHome, name: &str) -> Value {
        let out = self
            .topology
            .in_host(&dynocap_bin())
            .env("DYNOCAP_HOME", home.path())
            .env_remove("DYNOCAP_BACKEND")
            .envs(home.env_vars().iter().map(|(k, v)| (k, v)))
            .args(["--json", "run", name, "--network", "nat"])
            .output()
            .expect("run dynocap in H");
        assert!(
            out.status.success(),
            "run --network nat failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    }
}

#[test]
fn nat_reaches_a_test_server_but_not_the_host() {
    nat_reaches_a_test_server_but_not_the_host_on(Backend::Jail);
}

/// QEMU's user networking in QEMU's own network namespace, which pasta serves.
#[test]
fn nat_reaches_a_test_server_but_not_the_host_in_a_vm() {
    nat_reaches_a_test_server_but_not_the_host_on(Backend::Vm);
}

fn nat_reaches_a_test_server_but_not_the_host_on(backend: Backend) {
    let Some(home) = TestHome::on(backend, "nat_reaches_a_test_server_but_not_the_host") else {
        return;
    };
    let world = NatWorld::new();
    let started = world.start_nat(&home, "natbox");
    assert_eq!(started["network"], "nat", "{started}");
    assert_eq!(started["backend"], backend.name(), "{started}");
    let listed = home.json(&["ps"]);
    assert_eq!(listed["sandboxes"][0]["network"], "nat", "{listed}");

    // DNS and TCP through pasta, to the test's own server namespace.
    let got = home.sh(
        "natbox",
        &format!("curl -sS -m 60 http://{SERVER_NAME}:{SERVER_PORT}/hello.txt"),
    );
    assert_eq!(got, "hello from S\n");
    // The jail's interface copies H's; a VM's leads to QEMU's user networking.
    let gateway = match backend {
        Backend::Jail => SERVER_ADDR,
        Backend::Vm => VM_GATEWAY,
    };
    assert_eq!(default_gateway(&home, "natbox"), gateway);

    // The host's loopback, its address on the link, its other addresses: all unreachable.
    // On a VM also the gateway, which QEMU maps to the loopback of the namespace it runs in.
    let mut targets = vec!["127.0.0.1", HOST_ADDR, HOST_OTHER_ADDR];
    if backend == Backend::Vm {
        targets.push(VM_GATEWAY);
    }
    assert_unreachable(&home, "natbox", "", &targets);
    match backend {
        // Nothing in the guest can route around that: no raw sockets.
        Backend::Jail => {
            let bounding = home.sh("natbox", "grep CapBnd /proc/self/status");
            assert_eq!(
                cap_mask(&bounding) & (1 << CAP_NET_RAW),
                0,
                "CAP_NET_RAW in a nat guest: {bounding}"
            );
        }
        // Guest root holds every network capability of its own kernel and uses them: it
        // replaces the default route and routes H's addresses explicitly. What keeps H out
        // lives in QEMU's namespace, out of the guest's reach.
        Backend::Vm => {
            let effective = home.sh("natbox", "sudo grep CapEff /proc/self/status");
            let mask = cap_mask(&effective);
            assert_ne!(mask & (1 << CAP_NET_ADMIN), 0, "{effective}");
            assert_ne!(mask & (1 << CAP_NET_RAW), 0, "{effective}");
            home.sh(
                "natbox",
                &format!("cat > /tmp/routes.py <<'EOF'\n{ROUTES_PY}EOF"),
            );
            let routes = home.sh(
                "natbox",
                &format!("sudo python3 /tmp/routes.py {VM_GATEWAY} {HOST_ADDR} {HOST_OTHER_ADDR}"),
            );
            // Default, and one host route for each of H's addresses, all via the gateway.
            let via_gateway = routes.lines().filter(|l| l.contains("\t0202000A\t"));
            assert_eq!(via_gateway.count(), 3, "{routes}");
            assert_unreachable(&home, "natbox", "sudo ", &targets);
            // The rewritten routes still carry the guest's own traffic.
            let got = home.sh(
                "natbox",
                &format!("sudo curl -sS -m 60 http://{SERVER_NAME}:{SERVER_PORT}/hello.txt"),
            );
            assert_eq!(got, "hello from S\n");
        }
    }
    home.json(&["destroy", "natbox"]);
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;

/// The mask of a `CapXxx:\tHEX` line of /proc/PID/status.
fn cap_mask(line: &str) -> u64 {
    u64::from_str_radix(line.split_whitespace().nth(1).expect("mask"), 16).expect("hex mask")
}

/// Asserts that neither curl nor bash, run with `prefix` (`""` or `"sudo "`), reaches
/// `H`'s server at any of `targets`.
fn assert_unreachable(home: &TestHome, name: &str, prefix: &str, targets: &[&str]) {
    for target in targets {
        let command = format!("{prefix}curl -sS -m 5 http://{target}:{HOST_PORT}/hello.txt");
        let result = home.exec(name, &[], &command);
        assert_ne!(exit_code(&result), 0, "`{command}` reached H: {result:#}");
        let command = format!("{prefix}timeout 5 bash -c 'echo > /dev/tcp/{target}/{HOST_PORT}'");
        let result = home.exec(name, &[], &command);
        assert_ne!(exit_code(&result), 0, "`{command}` reached H: {result:#}");
    }
}

/// The guest's default gateway, from /proc (an image need not have `ip`).
fn default_gateway(home: &TestHome, name: &str) -> String {
    let hex = home.sh(
        name,
        "awk '$2 == \"00000000\" && $8 == \"00000000\" { print $3; exit }' /proc/net/route",
    );
    let raw = u32::from_str_radix(hex.trim(), 16)
        .unwrap_or_else(|err| panic!("no default route in the guest ({err}): {hex:?}"));
    // /proc/net/route prints the address as the kernel holds it: network order, read as a
    // native (little-endian) integer.
    std::net::Ipv4Addr::from(raw.to_le_bytes()).to_string()
}

/// Run as guest root: `routes.py GATEWAY ADDR...` deletes the default route, adds a host
/// route via GATEWAY for each ADDR and the default route back (the ioctls `route` uses; the
/// image has no `ip`), and prints /proc/net/route.
const ROUTES_PY: &str = r#"import fcntl, socket, struct, sys
SIOCADDRT, SIOCDELRT = 0x890B, 0x890C
RTF_UP, RTF_GATEWAY, RTF_HOST = 0x1, 0x2, 0x4
def sa(ip):
    return struct.pack("=HH4s8x", socket.AF_INET, 0, socket.inet_aton(ip))
def route(op, dst, mask, gw, flags):
    # struct rtentry on x86_64; "0L" pads the end as C does.
    rt = struct.pack("@L16s16s16sHhLBB3hhPLLH0L", 0, sa(dst), sa(gw), sa(mask), flags,
                     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    fcntl.ioctl(s.fileno(), op, rt)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
gw, any4 = sys.argv[1], "0.0.0.0"
route(SIOCDELRT, any4, any4, gw, RTF_UP | RTF_GATEWAY)
for addr in sys.argv[2:]:
    route(SIOCADDRT, addr, "255.255.255.255", gw, RTF_UP | RTF_GATEWAY | RTF_HOST)
route(SIOCADDRT, any4, any4, gw, RTF_UP | RTF_GATEWAY)
print(open("/proc/net/route").read().strip())
"#;

/// Live (not zombie) pasta processes among `supervisor`'s children.
fn live_pasta_children(supervisor: i32) -> Vec<i32> {
    descendants(supervisor)
        .into_iter()
        .filter(|pid| is_live_pasta(*pid))
        .collect()
}

/// Whether `pid` is a pasta that has not exited (pasta re-executes itself as `passt.avx2`).
fn is_live_pasta(pid: i32) -> bool {
    let mut stat = String::new();
    let read = std::fs::File::open(format!("/proc/{pid}/stat"))
        .and_then(|mut f| f.read_to_string(&mut stat));
    if read.is_err() {
        return false;
    }
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let comm = &stat[open + 1..close];
    let state = stat[close + 2..].chars().next().unwrap_or('X');
    (comm.starts_with("pasta") || comm.starts_with("passt")) && !matches!(state, 'Z' | 'X')
}

#[test]
fn pasta_goes_with_destroy_and_with_a_killed_supervisor() {
    pasta_goes_with_destroy_and_with_a_killed_supervisor_on(Backend::Jail);
}

#[test]
fn pasta_goes_with_destroy_and_with_a_killed_supervisor_in_a_vm() {
    pasta_goes_with_destroy_and_with_a_killed_supervisor_on(Backend::Vm);
}

fn pasta_goes_with_destroy_and_with_a_killed_supervisor_on(backend: Backend) {
    let test = "pasta_goes_with_destroy_and_with_a_killed_supervisor";
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    let world = NatWorld::new();

    world.start_nat(&home, "gone1");
    let supervisor = home.supervisor_pids()[0];
    let pasta = live_pasta_children(supervisor);
    assert_eq!(pasta.len(), 1, "one pasta per nat sandbox: {pasta:?}");
    home.json(&["destroy", "gone1"]);
    assert!(
        wait_until(30, || !is_live_pasta(pasta[0])),
        "pasta {} outlived destroy",
        pasta[0]
    );

    let home = TestHome::on(backend, test).expect("the backend served the first home");
    world.start_nat(&home, "gone2");
    let supervisor = home.supervisor_pids()[0];
    let pasta = live_pasta_children(supervisor);
    assert_eq!(pasta.len(), 1, "one pasta per nat sandbox: {pasta:?}");
    // SAFETY: kill has no memory preconditions; the pid is this test's own supervisor.
    unsafe { libc::kill(supervisor, libc::SIGKILL) };
    // Nobody runs a dynocap command meanwhile: pasta must go by itself (its parent-death
    // signal), not by a later sweep of the dead supervisor's session.
    assert!(
        wait_until(30, || !is_live_pasta(pasta[0])),
        "pasta {} outlived its killed supervisor",
        pasta[0]
    );
}

#[test]
fn nat_without_pasta_is_a_clear_error_and_leaves_nothing() {
    if !require_root("nat_without_pasta_is_a_clear_error_and_leaves_nothing") {
        return;
    }
    let home = TestHome::new();
    let empty = tempfile::tempdir().expect("tempdir");
    let out = home
        .command()
        .env("PATH", empty.path())
        .args(["--json", "run", "nopasta", "--network", "nat"])
        .output()
        .expect("spawn dynocap");
    assert!(!out.status.success());
    let error: Value = serde_json::from_slice(&out.stdout).expect("JSON error");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("apt install passt"), "{error}");
    let listed = home.json(&["ps"]);
    assert_eq!(listed["sandboxes"], serde_json::json!([]), "{listed}");
}

#[test]
fn a_dead_pasta_is_started_again_and_one_that_keeps_dying_ends_the_network_visibly() {
    a_dead_pasta_is_started_again_and_one_that_keeps_dying_ends_the_network_visibly_on(
        Backend::Jail,
    );
}

#[test]
fn a_dead_pasta_is_started_again_and_one_that_keeps_dying_ends_the_network_visibly_in_a_vm() {
    a_dead_pasta_is_started_again_and_one_that_keeps_dying_ends_the_network_visibly_on(Backend::Vm);
}

/// pasta killed under a running `nat` sandbox: the supervisor notices (its pidfd) and starts
/// it again with the same configuration, three times, and the guest reaches the test server
/// again each time. Killed a fourth time, it is not restarted: the sandbox still runs, and its
/// network's end is in the log, in `ps` (the note) and in every command's stderr.
fn a_dead_pasta_is_started_again_and_one_that_keeps_dying_ends_the_network_visibly_on(
    backend: Backend,
) {
    let test = "a_dead_pasta_is_started_again_and_one_that_keeps_dying_ends_the_network_visibly";
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    let world = NatWorld::new();
    world.start_nat(&home, "flaky");
    let supervisor = home.supervisor_pids()[0];
    let fetch = format!("curl -sS -m 20 http://{SERVER_NAME}:{SERVER_PORT}/hello.txt");
    let kill_pasta = || {
        let pasta = live_pasta_children(supervisor);
        assert_eq!(pasta.len(), 1, "one pasta per nat sandbox: {pasta:?}");
        // SAFETY: kill has no memory preconditions; the pid is this sandbox's pasta.
        unsafe { libc::kill(pasta[0], libc::SIGKILL) };
        pasta[0]
    };
    for restart in 1..=3 {
        let dead = kill_pasta();
        assert!(
            wait_until(60, || {
                let now = live_pasta_children(supervisor);
                now.len() == 1 && now[0] != dead
            }),
            "pasta was started again after its death {restart}"
        );
        assert_eq!(
            home.sh("flaky", &fetch),
            "hello from S\n",
            "restart {restart}"
        );
    }
    let log = std::fs::read_to_string(home.log_path(&home.sandbox_id("flaky"))).expect("log");
    assert!(
        log.contains("pasta exited (signal: 9") && log.contains("restart 3 of 3"),
        "{log}"
    );

    kill_pasta();
    let note = || home.json(&["ps"])["sandboxes"][0]["note"].clone();
    assert!(
        wait_until(60, || note().is_string()),
        "ps shows why the network ended"
    );
    let note = note();
    let note = note.as_str().unwrap();
    assert!(
        note.contains("network (\"nat\") ended") && note.contains("again after 3 restarts"),
        "{note}"
    );
    assert_eq!(home.json(&["ps"])["sandboxes"][0]["state"], "running");
    assert!(
        live_pasta_children(supervisor).is_empty(),
        "no fourth restart"
    );
    let result = home.exec("flaky", &[], &fetch);
    assert_ne!(exit_code(&result), 0, "{result:#}");
    let stderr = result["stderr"].as_str().unwrap_or_default();
    assert!(
        stderr.contains("dynocap: the sandbox's network (\"nat\") ended"),
        "{result:#}"
    );
    let text = String::from_utf8(home.run(&["ps"]).stdout).expect("utf-8");
    assert!(text.contains("flaky: the sandbox's network"), "{text}");
    let log = std::fs::read_to_string(home.log_path(&home.sandbox_id("flaky"))).expect("log");
    assert!(log.contains("the sandbox reaches nothing now"), "{log}");
}
