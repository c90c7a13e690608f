//! Port forwards end to end: a web server started in a `none` sandbox (no network at all) is
//! reached from the host through `dynocap port`, with curl and with headless Chromium, which
//! runs the page's JavaScript (the rendered DOM holds what the script wrote); a file larger
//! than a tunnel's window arrives whole; `ps` lists the forward; removing it, or destroying
//! the sandbox, closes the host port (a connection is refused). A host port in use, a guest
//! port 0 and an address that is not the host's are refused with messages naming the fix, a
//! `--publish` of a port in use before anything boots. A task started with `--publish` lists
//! its forward and serves through it until it finishes. A jail whose supervisor may not join
//! the guest's network namespace (a failpoint stands in for the missing privilege) carries
//! its forwards through the agent channel instead, reached with curl. One VM case: `run
//! --publish` on the vm backend, reached with curl.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use dynocap_e2e::*;
use serde_json::Value;

/// The page the sandbox serves: its script writes the marker into the DOM, so only a browser
/// that ran it shows the marker.
const PAGE: &str = "<!doctype html><html><body><p id=out>static</p>\
<script>document.getElementById('out').textContent = ['rendered', 'through', 'the', 'forward'].join('-');</script>\
</body></html>";
const RENDERED: &str = "rendered-through-the-forward";

/// Starts `python3 -m http.server` on `port` in `name`, serving `/tmp/site` with the page and
/// a 20 MB file of random bytes, as a job; returns the file's sha256 as the guest sees it.
fn serve(home: &TestHome, name: &str, port: u16) -> String {
    let page = PAGE.replace('\'', "'\\''");
    let sum = home.sh(
        name,
        &format!(
            "mkdir -p /tmp/site && printf '%s' '{page}' > /tmp/site/index.html \
             && head -c 20000000 /dev/urandom > /tmp/site/big && sha256sum /tmp/site/big"
        ),
    );
    home.job(
        name,
        600,
        &format!("exec python3 -m http.server {port} --bind 127.0.0.1 --directory /tmp/site"),
    );
    sum.split_whitespace().next().expect("a sum").to_owned()
}

/// `curl URL` from the host, retried while the server in the sandbox comes up.
fn curl_until_served(url: &str) -> String {
    let start = Instant::now();
    loop {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20", url])
            .output()
            .expect("run curl");
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "curl {url} kept failing: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn host_port(forward: &Value) -> u16 {
    let port = forward["hostPort"].as_u64().expect("hostPort");
    u16::try_from(port).expect("a port")
}

fn refused(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    matches!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)),
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// Headless Chromium loads `url` and prints the DOM after its scripts ran.
fn chromium_dom(url: &str) -> String {
    let profile = tempfile::tempdir().expect("a profile directory");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(["--dump-dom", url])
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_server_in_a_none_sandbox_is_reached_through_a_forward_until_it_ends() {
    let test = "a_server_in_a_none_sandbox_is_reached_through_a_forward_until_it_ends";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let sandbox = home.sandbox("web", &[]);
    assert_eq!(sandbox["network"], "none");
    let sum = serve(&home, "web", 8000);

    let forward = home.json(&["port", "web", "8000"]);
    assert_eq!(forward["guestPort"], 8000);
    assert_eq!(forward["hostAddress"], "127.0.0.1");
    let port = host_port(&forward);
    assert_ne!(port, 0, "a free port was chosen: {forward:#}");
    let url = format!("http://127.0.0.1:{port}/");
    assert_eq!(forward["url"], url.as_str());

    let page = curl_until_served(&url);
    assert!(page.contains("id=out"), "the page came through: {page}");
    assert!(!page.contains(RENDERED), "curl runs no script");

    // Larger than a tunnel's window many times over, byte for byte.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("curl -sS --max-time 60 {url}big | sha256sum"))
        .output()
        .expect("curl the big file");
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&sum),
        "the 20 MB file arrived whole"
    );

    // A real browser renders the page through the forward: the DOM holds what its script
    // wrote.
    let dom = chromium_dom(&url);
    assert!(dom.contains(RENDERED), "the rendered DOM: {dom}");

    // A root supervisor splices the connections itself.
    let log = std::fs::read_to_string(home.log_path(&home.sandbox_id("web"))).unwrap_or_default();
    assert!(
        log.contains("spliced"),
        "the supervisor took the direct path: {log}"
    );

    // Listed by ps and by `port`.
    let ps = home.json(&["ps"]);
    let listed = &ps["sandboxes"][0]["forwards"];
    assert_eq!(listed[0]["hostPort"], port, "{ps:#}");
    let text = home.run(&["ps"]);
    let shown = format!("127.0.0.1:{port}->8000");
    assert!(
        String::from_utf8_lossy(&text.stdout).contains(&shown),
        "ps shows {shown}: {}",
        String::from_utf8_lossy(&text.stdout)
    );
    assert_eq!(
        home.json(&["port", "web"])["forwards"][0]["guestPort"],
        8000
    );

    // A second forward to another port, then removed: its host port closes.
    let second = home.json(&["port", "web", "8001"]);
    let second_port = host_port(&second);
    let removed = home.json(&["port", "web", "--remove", "8001"]);
    assert_eq!(removed["removed"]["hostPort"], second_port);
    assert!(refused(second_port), "a removed forward's port is closed");
    let err = home.json_err(&["port", "web", "--remove", "8001"]);
    assert_eq!(err["code"], "not_found", "{err:#}");

    // The forward ends with the sandbox.
    home.json(&["destroy", "web"]);
    assert!(
        refused(port),
        "after destroy, the host port refuses connections"
    );
}

#[test]
fn bad_forwards_are_refused_with_the_fix() {
    let test = "bad_forwards_are_refused_with_the_fix";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    // A host port in use: `--publish` refuses it before anything boots.
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let taken_port = taken.local_addr().expect("its address").port().to_string();
    let err = home.json_err(&["run", "early", "--publish", &format!("8000:{taken_port}")]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("host port {taken_port} on 127.0.0.1 is in use"))
            && message.contains("pass 0"),
        "{message}"
    );
    assert!(
        home.json(&["ps"])["sandboxes"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "nothing was started"
    );

    // One host port for two forwards: refused before anything boots too.
    let err = home.json_err(&[
        "run",
        "early",
        "--publish",
        "8000:45999",
        "--publish",
        "8001:45999",
    ]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    assert!(
        home.json(&["ps"])["sandboxes"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "nothing was started"
    );

    // GUEST:ADDR:HOST listens on the address the user passed (here IPv6's loopback).
    let sandbox = home.sandbox("bad", &["--publish", "9000", "--publish", "9001:[::1]:0"]);
    let published = &sandbox["forwards"][0];
    assert_eq!(published["guestPort"], 9000, "{sandbox:#}");
    assert_eq!(published["hostAddress"], "127.0.0.1", "{sandbox:#}");
    assert_ne!(published["hostPort"], 0);
    let on_v6 = &sandbox["forwards"][1];
    assert_eq!(on_v6["hostAddress"], "::1", "{sandbox:#}");
    let v6_port = host_port(on_v6);
    assert_eq!(on_v6["url"], format!("http://[::1]:{v6_port}/"));
    assert!(
        TcpStream::connect(("::1", v6_port)).is_ok(),
        "listening on ::1"
    );

    let err = home.json_err(&["port", "bad", "8000", &taken_port]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    assert!(
        err["message"]
            .as_str()
            .unwrap_or_default()
            .contains("is in use"),
        "{err:#}"
    );
    // An address of no interface of this host (TEST-NET-1): nothing is sent, the bind fails.
    let err = home.json_err(&["port", "bad", "8000", "--address", "192.0.2.1"]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    assert!(
        err["message"]
            .as_str()
            .unwrap_or_default()
            .contains("is not an address of this host; listen on 127.0.0.1"),
        "{err:#}"
    );
    // The same guest port twice.
    let err = home.json_err(&["port", "bad", "9000"]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    // Port 0 and out-of-range ports are refused by the command line itself.
    for args in [&["port", "bad", "0"][..], &["port", "bad", "70000"][..]] {
        let out = home.run(args);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("from 1 to 65535"), "{args:?}: {stderr}");
    }
    // Nothing listens on the guest port: the connection is closed cleanly (curl's 52, an
    // empty reply, not 56, a reset, though curl's request was never read), the forward stays.
    let forward = home.json(&["port", "bad", "8123"]);
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .arg(forward["url"].as_str().expect("url"))
        .output()
        .expect("run curl");
    assert_eq!(
        out.status.code(),
        Some(52),
        "no server, an empty reply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!refused(host_port(&forward)), "the forward still listens");
    drop(taken);
    home.json(&["destroy", "bad"]);
}

/// A jail whose supervisor may not join the guest's network namespace (as one without
/// `CAP_SYS_ADMIN` may not; the failpoint makes the join fail that way) forwards through the
/// agent channel, the VM's path: the page and a file of many tunnel windows arrive whole, two
/// connections at once each get their own bytes, and the supervisor logged the path it took.
#[test]
fn a_jail_forward_goes_through_the_agent_when_its_namespace_cannot_be_joined() {
    let test = "a_jail_forward_goes_through_the_agent_when_its_namespace_cannot_be_joined";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let home = home.with_env("DYNOCAP_FAILPOINTS", "supervisor.ports.join-netns=error");
    home.sandbox("relay", &[]);
    let sum = serve(&home, "relay", 8000);
    let forward = home.json(&["port", "relay", "8000"]);
    let url = forward["url"].as_str().expect("url").to_owned();
    let page = curl_until_served(&url);
    assert!(page.contains("id=out"), "the page came through: {page}");

    // Two downloads of the 20 MB file at once, each checked whole.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "curl -sS --max-time 60 {url}big | sha256sum & curl -sS --max-time 60 {url}big | sha256sum; wait"
        ))
        .output()
        .expect("curl the big file twice");
    let sums = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        sums.lines().filter(|line| line.starts_with(&sum)).count(),
        2,
        "both copies of the 20 MB file arrived whole: {sums}"
    );

    let log = std::fs::read_to_string(home.log_path(&home.sandbox_id("relay"))).unwrap_or_default();
    assert!(
        log.contains("forwarded connections go through the guest agent")
            && !log.contains("spliced"),
        "the supervisor took the agent's path: {log}"
    );

    let port = host_port(&forward);
    home.json(&["destroy", "relay"]);
    assert!(
        refused(port),
        "after destroy, the host port refuses connections"
    );
}

/// Starts python's http.server on port 8000 in task `name`'s workspace, as a background job
/// (a restore ends it, so the publish test starts it again after one), and returns the page
/// `url` serves once it answers.
fn serve_workspace(home: &TestHome, name: &str, url: &str) -> String {
    home.task_job(
        name,
        600,
        "exec python3 -m http.server 8000 --bind 127.0.0.1",
    );
    curl_until_served(url)
}

/// `task start --publish`: the task's forward is in its start's result and in `ls`, serves
/// a server the task runs (on its workspace) and closes when the task finishes.
#[test]
fn a_task_started_with_publish_serves_through_its_forward() {
    let test = "a_task_started_with_publish_serves_through_its_forward";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    let project = one_commit_project("index.html", PAGE);
    let task = home.json(&[
        "task",
        "start",
        project.path().to_str().expect("utf-8 temp path"),
        "--name",
        "site",
        "--publish",
        "8000",
    ]);
    let forward = task["forwards"][0].clone();
    assert_eq!(forward["guestPort"], 8000, "{task:#}");
    let port = host_port(&forward);
    assert_ne!(port, 0, "{task:#}");
    let url = format!("http://127.0.0.1:{port}/");
    assert_eq!(forward["url"], url.as_str());
    let ls = home.json(&["ls"]);
    assert_eq!(ls["tasks"][0]["forwards"][0]["hostPort"], port, "{ls:#}");
    assert_eq!(
        home.json(&["port", "site"])["forwards"][0]["hostPort"],
        port
    );

    let page = serve_workspace(&home, "site", &url);
    assert!(page.contains("id=out"), "the workspace's page: {page}");

    // A restore executes the supervisor anew and ends the server: the forward is open again
    // on the same host port, listed once, and serves the server started after it.
    home.json(&["task", "checkpoint", "site", "c1"]);
    home.json(&["task", "restore", "site", "c1"]);
    assert_eq!(
        home.json(&["port", "site"])["forwards"],
        Value::Array(vec![forward.clone()]),
        "the forward after the restore"
    );
    assert_eq!(
        home.json(&["ls"])["tasks"][0]["forwards"][0]["hostPort"],
        port
    );
    let page = serve_workspace(&home, "site", &url);
    assert!(page.contains("id=out"), "served after the restore: {page}");

    home.json(&["task", "finish", "site"]);
    assert!(
        refused(port),
        "after finish, the host port refuses connections"
    );
}

/// The vm backend: the forward crosses the guest's own kernel through the agent; curl and
/// headless Chromium load the page.
#[test]
fn a_vm_sandbox_serves_through_a_published_port() {
    let test = "a_vm_sandbox_serves_through_a_published_port";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let sandbox = home.sandbox("vmweb", &["--publish", "8000", "--ttl", "900"]);
    assert_eq!(sandbox["backend"], "vm");
    let forward = sandbox["forwards"][0].clone();
    assert_eq!(forward["guestPort"], 8000, "{sandbox:#}");
    let sum = serve(&home, "vmweb", 8000);
    let url = forward["url"].as_str().expect("url").to_owned();
    let page = curl_until_served(&url);
    assert!(page.contains("id=out"), "{page}");
    // A real browser renders the page through the VM's forward too.
    let dom = chromium_dom(&url);
    assert!(dom.contains(RENDERED), "the rendered DOM: {dom}");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("curl -sS --max-time 120 {url}big | sha256sum"))
        .output()
        .expect("curl the big file");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&sum));
    home.json(&["destroy", "vmweb"]);
    assert!(refused(host_port(&forward)));
}

/// A server in the sandbox that reads each connection to its end, then answers how many
/// bytes it read and closes: a client that half-closes gets its answer.
const COUNTING_SERVER: &str = r#"
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 9100))
s.listen(1024)
def answer(c):
    n = 0
    while True:
        b = c.recv(65536)
        if not b:
            break
        n += len(b)
    c.sendall(b"read %d\n" % n)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=answer, args=(c,), daemon=True).start()
"#;

/// Sends `bytes` bytes on `client`, shuts its writing side and reads the answer to the end.
fn half_close_and_read(mut client: TcpStream, bytes: usize) -> std::io::Result<String> {
    use std::io::{Read, Write};
    client.set_read_timeout(Some(Duration::from_secs(60)))?;
    client.write_all(&vec![b'x'; bytes])?;
    client.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    client.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Through both paths (spliced, and the agent's tunnel), in `none` and `filtered` sandboxes:
/// a client that half-closes still gets the server's answer, and 300 connections held open at
/// once (past the 256 a sandbox's forwards carry at a time) are all answered: those past the
/// bound wait in the listen backlog for a slot instead of being closed.
#[test]
fn a_forward_carries_half_closes_and_more_connections_than_its_bound() {
    let test = "a_forward_carries_half_closes_and_more_connections_than_its_bound";
    let Some(home) = TestHome::on(Backend::Jail, test) else {
        return;
    };
    carries_half_closes_and_many_connections(&home, "direct", "none");
    carries_half_closes_and_many_connections(&home, "direct-filtered", "filtered");
    let home = home.with_env("DYNOCAP_FAILPOINTS", "supervisor.ports.join-netns=error");
    carries_half_closes_and_many_connections(&home, "tunnel-filtered", "filtered");
}

/// `network`: the sandbox's mode; a forward reaches the guest's loopback in any of them
/// (`filtered`'s proxy sends nothing here: the guest asks for no host).
fn carries_half_closes_and_many_connections(home: &TestHome, name: &str, network: &str) {
    {
        home.sandbox(
            name,
            &[
                "--publish",
                "9100",
                "--disk-mb",
                "256",
                "--network",
                network,
            ],
        );
        let script = COUNTING_SERVER.replace('\'', "'\\''");
        home.sh(name, &format!("printf '%s' '{script}' > /tmp/count.py"));
        home.job(name, 600, "exec python3 /tmp/count.py");
        let port = host_port(&home.json(&["port", name])["forwards"][0]);
        let start = Instant::now();
        let answer = loop {
            // Until the server listens, the forward closes each connection cleanly, though
            // the client sent more than the forward had read (no reset, on either path).
            let client = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            match half_close_and_read(client, 1 << 20) {
                Ok(answer) if !answer.is_empty() => break answer,
                Ok(_) => assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "{name}: the server never answered"
                ),
                Err(err) => panic!("{name}: a refused connection was not closed cleanly: {err}"),
            }
            std::thread::sleep(Duration::from_millis(300));
        };
        assert_eq!(
            answer, "read 1048576\n",
            "{name}: a half-closed client's answer"
        );

        let clients: Vec<TcpStream> = (0..300)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect"))
            .collect();
        let answers: Vec<String> = std::thread::scope(|scope| {
            let running: Vec<_> = clients
                .into_iter()
                .enumerate()
                .map(|(i, client)| {
                    scope.spawn(move || half_close_and_read(client, i + 1).expect("an answer"))
                })
                .collect();
            running
                .into_iter()
                .map(|t| t.join().expect("a client thread"))
                .collect()
        });
        for (i, answer) in answers.iter().enumerate() {
            assert_eq!(answer, &format!("read {}\n", i + 1), "{name}: client {i}");
        }
        home.json(&["destroy", name]);
        assert!(refused(port), "{name}: closed with the sandbox");
    }
}
