//! `--network filtered` and `--repo` clones end to end through the CLI, against the loopback
//! fixtures of tests/support/netfix.rs (a test CA, an HTTPS server with an npm registry, a
//! PEP 503 index and git smart HTTP, and an sshd serving git):
//! - through the proxy, npm install, pip download, git clone and curl to allowed hosts work,
//!   and every decision lands in `network.jsonl` and the finish summary;
//! - everything else is refused: hosts off the list, raw IPs, port 80, port 22 to a non-git
//!   host, SNI mismatch or absence, a name resolving to loopback, DNS, UDP, direct TCP;
//! - each command's exec result lists what was refused while it ran (`networkRefusals`), a
//!   job's result too, the CLI prints it after the output, and the client hears the reason and
//!   the fix;
//! - `task start --repo` over HTTPS and SSH: the clone is the baseline; the SSH key is used and
//!   then gone; bad keys are refused; a failed clone leaves nothing behind.
//!
//! The raw-sandbox and refusal tests run on each backend (`vm`: the guest's listener is on its
//! own loopback, tunnelled over virtio-serial); the rest on the jail.
//!
//! Traffic stays on loopback: every name goes through a resolve override to the fixture's
//! 127.X.Y.Z (this machine's DNS server is not on loopback), and the targets of refusals are
//! loopback addresses too, so a proxy bug cannot send a packet anywhere else.
//! Needs root.

use std::path::Path;

use dynocap_e2e::netfix::*;
use dynocap_e2e::*;
use serde_json::Value;

/// Fields of the results the product reports; one place for the names.
mod field {
    /// Start result: the effective allowlist.
    pub const EGRESS_ALLOWLIST: &str = "egressAllowlist";
    /// Finish result: the network summary.
    pub const NETWORK: &str = "network";
    pub const HOSTS_REACHED: &str = "hostsReached";
    pub const REFUSALS: &str = "refusals";
    /// Start result: `source.commit`, the commit a `--repo` clone checked out.
    pub const SOURCE_COMMIT: &str = "baseCommit";
    /// Exec result: the connections refused while the command ran.
    pub const NETWORK_REFUSALS: &str = "networkRefusals";
    pub const NETWORK_REFUSALS_OMITTED: &str = "networkRefusalsOmitted";
}

/// A home whose `dynocap` commands reach the fixture under its names and trust its CA,
/// with `allow` (comma-separated) added to the allowlist.
fn home_for(fix: &NetFix, allow: &str) -> TestHome {
    with_fixture(TestHome::new(), fix, allow)
}

/// `home` (of any backend) made to reach the fixture, as [`home_for`].
fn with_fixture(mut home: TestHome, fix: &NetFix, allow: &str) -> TestHome {
    for (key, value) in fix.product_env() {
        home = home.with_env(&key, &value);
    }
    if !allow.is_empty() {
        home = home.with_env(product::ENV_EGRESS_ALLOW, allow);
    }
    home
}

/// Starts a `filtered` task on a one-file project and returns its Task object.
fn filtered_task(home: &TestHome, name: &str) -> Value {
    let project = home.path().join(format!("project-{name}"));
    write(&project.join("README.md"), "# project\n");
    home.json(&[
        "task",
        "start",
        project.to_str().expect("utf-8 temp path"),
        "--name",
        name,
        "--network",
        "filtered",
    ])
}

/// Runs `command` in the task; returns (exit code, stdout, stderr).
fn run_in(home: &TestHome, task: &str, command: &str) -> (i64, String, String) {
    let result = home.exec_in_task(task, command, 300);
    assert!(result.get("error").is_none(), "{command}: {result:#}");
    (
        result["exitCode"].as_i64().unwrap_or(-1),
        result["stdout"].as_str().unwrap_or_default().to_owned(),
        result["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

/// stdout of a command that must succeed in the task.
fn ok_in(home: &TestHome, task: &str, command: &str) -> String {
    let (code, out, err) = run_in(home, task, command);
    assert_eq!(code, 0, "`{command}` failed:\nstdout: {out}\nstderr: {err}");
    out
}

/// A command that must fail in the task; returns stdout + stderr.
fn fails_in(home: &TestHome, task: &str, command: &str) -> String {
    let (code, out, err) = run_in(home, task, command);
    assert_ne!(
        code, 0,
        "`{command}` succeeded:\nstdout: {out}\nstderr: {err}"
    );
    format!("{out}{err}")
}

/// The task's decisions so far, oldest first.
fn network_log(home: &TestHome, task_id: &str) -> Vec<Value> {
    let path = home
        .path()
        .join("results")
        .join(task_id)
        .join(product::NETWORK_LOG);
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("network.jsonl holds JSON lines"))
        .collect()
}

/// Waits (bounded) for a decision matching `pred` and returns it: an allowed connection is
/// logged when it ends, which may be just after the client exits.
fn decision(home: &TestHome, task_id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut found = None;
    wait_until(30, || {
        found = network_log(home, task_id).into_iter().find(|d| pred(d));
        found.is_some()
    });
    found.unwrap_or_else(|| {
        panic!(
            "no decision for {what} in {}: {:#?}",
            product::NETWORK_LOG,
            network_log(home, task_id)
        )
    })
}

fn refused(home: &TestHome, task_id: &str, host: &str, port: u64, what: &str) -> Value {
    let d = decision(home, task_id, what, |d| {
        d["allowed"] == false && d["host"] == host && d["port"] == port
    });
    let reason = d["reason"].as_str().unwrap_or_default();
    assert!(!reason.is_empty(), "a refusal says why: {d:#}");
    d
}

fn assert_decision_fields(d: &Value) {
    for key in [
        "time",
        "allowed",
        "host",
        "port",
        "addr",
        "bytesUp",
        "bytesDown",
        "reason",
    ] {
        assert!(d.get(key).is_some(), "decision without {key}: {d:#}");
    }
}

fn task_id(task: &Value) -> String {
    task["id"].as_str().expect("task id").to_owned()
}

#[test]
fn npm_pip_git_and_curl_work_through_filtered_and_are_logged() {
    if !require_root("npm_pip_git_and_curl_work_through_filtered_and_are_logged") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix, &format!("{GIT_HOST},{PYPI_HOST},*.mirror.test"));
    let task = filtered_task(&home, "net");
    let id = task_id(&task);
    let allowlist = task[field::EGRESS_ALLOWLIST].to_string();
    for host in [NPM_HOST, GIT_HOST, PYPI_HOST, "*.mirror.test"] {
        assert!(allowlist.contains(host), "{host} not in {allowlist}");
    }

    assert_eq!(
        ok_in(
            &home,
            "net",
            &format!("curl -sS --fail https://{NPM_HOST}/")
        ),
        "dynocap netfix\n"
    );
    // npm's default registry, unchanged: only the proxy and the CA come from the sandbox.
    let installed = ok_in(
        &home,
        "net",
        &format!(
            "mkdir -p /tmp/np && cd /tmp/np && echo '{{}}' > package.json && \
             npm install --no-audit --no-fund --cache /tmp/npm-cache {NPM_PACKAGE} >&2 && \
             cat node_modules/{NPM_PACKAGE}/package.json"
        ),
    );
    let installed: Value = serde_json::from_str(&installed).expect("package.json");
    assert_eq!(installed["version"], PACKAGE_VERSION);
    ok_in(
        &home,
        "net",
        &format!(
            "pip download --no-deps --no-cache-dir --dest /tmp/pipdl \
             --index-url https://{PYPI_HOST}/simple/ {PYPI_PACKAGE} >&2 && \
             test -f /tmp/pipdl/{PYPI_WHEEL}"
        ),
    );
    let head = ok_in(
        &home,
        "net",
        &format!(
            "git clone -q {} /tmp/clone >&2 && git -C /tmp/clone rev-parse HEAD",
            fix.https_repo_url()
        ),
    );
    assert_eq!(head.trim(), fix.repo.head);

    // The server saw each name as its SNI: the proxy tunnelled, it did not terminate TLS.
    let requests = fix.https.requests();
    for (sni, path) in [
        (NPM_HOST, format!("/{NPM_PACKAGE}/-/")),
        (PYPI_HOST, format!("/files/{PYPI_WHEEL}")),
        (GIT_HOST, format!("/{REPO}/git-upload-pack")),
    ] {
        assert!(
            requests.iter().any(
                |r| r["sni"] == sni && r["path"].as_str().is_some_and(|p| p.starts_with(&path))
            ),
            "no {path} under {sni}: {requests:#?}"
        );
    }

    let addr = fix.addr.to_string();
    for host in [NPM_HOST, PYPI_HOST, GIT_HOST] {
        let d = decision(&home, &id, host, |d| {
            d["allowed"] == true && d["host"] == host && d["bytesDown"].as_u64() > Some(0)
        });
        assert_decision_fields(&d);
        assert_eq!(d["port"], 443, "{d:#}");
        assert!(
            d["addr"].as_str().unwrap_or_default().contains(&addr),
            "{d:#}"
        );
        assert!(d["bytesUp"].as_u64() > Some(0), "{d:#}");
    }

    let finished = home.json(&["task", "finish", "net"]);
    let summary = &finished[field::NETWORK];
    let reached = summary[field::HOSTS_REACHED]
        .as_array()
        .unwrap_or_else(|| panic!("no hostsReached: {finished:#}"));
    for host in [NPM_HOST, PYPI_HOST, GIT_HOST] {
        let entry = reached
            .iter()
            .find(|h| h["host"] == host)
            .unwrap_or_else(|| panic!("{host} not reached: {summary:#}"));
        assert!(entry["connections"].as_u64() >= Some(1), "{entry:#}");
        assert!(entry["bytesDown"].as_u64() > Some(0), "{entry:#}");
        assert!(entry["bytesUp"].as_u64() > Some(0), "{entry:#}");
    }
    assert_eq!(summary[field::REFUSALS]["count"], 0, "{summary:#}");
}

#[test]
fn a_raw_sandbox_gets_the_default_list_plus_allow_host() {
    a_raw_sandbox_gets_the_default_list_plus_allow_host_on(Backend::Jail);
}

#[test]
fn a_raw_sandbox_gets_the_default_list_plus_allow_host_in_a_vm() {
    a_raw_sandbox_gets_the_default_list_plus_allow_host_on(Backend::Vm);
}

fn a_raw_sandbox_gets_the_default_list_plus_allow_host_on(backend: Backend) {
    let test = "a_raw_sandbox_gets_the_default_list_plus_allow_host";
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    let fix = NetFix::start();
    let home = with_fixture(home, &fix, "");
    let sandbox = home.sandbox(
        "raw",
        &[
            "--network",
            "filtered",
            product::FLAG_ALLOW_HOST,
            OTHER_HOST,
        ],
    );
    assert_eq!(sandbox["backend"], backend.name(), "{sandbox}");
    let allowlist = sandbox[field::EGRESS_ALLOWLIST].to_string();
    assert!(
        allowlist.contains(NPM_HOST) && allowlist.contains(OTHER_HOST),
        "{allowlist}"
    );
    assert!(!allowlist.contains(GIT_HOST), "{allowlist}");
    assert_eq!(
        home.sh("raw", &format!("curl -sS --fail https://{OTHER_HOST}/")),
        "dynocap netfix\n"
    );
    assert_eq!(
        home.sh("raw", &format!("curl -sS --fail https://{NPM_HOST}/")),
        "dynocap netfix\n"
    );
    let refused = home.exec("raw", &[], &format!("curl -sS https://{GIT_HOST}/"));
    assert_ne!(refused["exitCode"], 0, "{refused:#}");
    assert!(
        refused["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("403"),
        "{refused:#}"
    );
    assert!(
        !fix.https.requests().iter().any(|r| r["sni"] == GIT_HOST),
        "{:#?}",
        fix.https.requests()
    );
}

/// A refused connection reaches the agent as more than a bare 403: the exec result lists it
/// (`networkRefusals`: host, port, reason, count, and the fix when the allowlist could allow
/// it), the CLI prints a line for it after the command's output, and the client itself hears
/// the reason and the fix in the proxy's status line (Python's HTTP client, and so pip, shows
/// only that line). A command that was refused nothing has no `networkRefusals`. Nothing
/// reaches the fixture: every refusal happens at the CONNECT.
#[test]
fn refusals_reach_the_exec_result_the_cli_and_the_client() {
    refusals_reach_the_exec_result_the_cli_and_the_client_on(Backend::Jail);
}

#[test]
fn refusals_reach_the_exec_result_the_cli_and_the_client_in_a_vm() {
    refusals_reach_the_exec_result_the_cli_and_the_client_on(Backend::Vm);
}

fn refusals_reach_the_exec_result_the_cli_and_the_client_on(backend: Backend) {
    let test = "refusals_reach_the_exec_result_the_cli_and_the_client";
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    let fix = NetFix::start();
    let home = with_fixture(home, &fix, "");
    let sandbox = home.sandbox("refusals", &["--network", "filtered"]);
    assert_eq!(sandbox["backend"], backend.name(), "{sandbox}");
    let before = fix.https.requests().len();

    // Python's HTTP client through the proxy the guest's environment names, as pip's is.
    let result = home.exec(
        "refusals",
        &[],
        &format!(
            "curl -sS https://{OTHER_HOST}/; curl -sS https://{OTHER_HOST}/; \
             curl -sS https://{NPM_HOST}:8443/; \
             python3 -c 'import urllib.request; urllib.request.urlopen(\"https://{PYPI_HOST}/simple/\")'"
        ),
    );
    assert_ne!(result["exitCode"], 0, "{result:#}");
    let refusals = result[field::NETWORK_REFUSALS]
        .as_array()
        .unwrap_or_else(|| panic!("no {}: {result:#}", field::NETWORK_REFUSALS));
    let entry = |host: &str, port: u64| -> &Value {
        refusals
            .iter()
            .find(|r| r["host"] == host && r["port"] == port)
            .unwrap_or_else(|| panic!("{host}:{port} not listed: {refusals:#?}"))
    };
    let other = entry(OTHER_HOST, 443);
    assert_eq!(other["count"], 2, "{other:#}");
    assert_eq!(
        other["reason"],
        format!("{OTHER_HOST} is not on this sandbox's allowlist"),
        "{other:#}"
    );
    let fix_text = other["fix"].as_str().unwrap_or_default();
    assert!(
        fix_text.contains(&format!("--allow-host {OTHER_HOST}"))
            && fix_text.contains(product::ENV_EGRESS_ALLOW),
        "{other:#}"
    );
    // A port nothing on the allowlist can open: why, and no fix.
    let port = entry(NPM_HOST, 8443);
    assert_eq!(port["count"], 1, "{port:#}");
    assert!(
        port["reason"]
            .as_str()
            .is_some_and(|r| r.contains("port 8443 is not allowed")),
        "{port:#}"
    );
    assert!(port.get("fix").is_none(), "{port:#}");
    let pypi = entry(PYPI_HOST, 443);
    assert!(pypi["count"].as_u64() >= Some(1), "{pypi:#}");
    assert_eq!(refusals.len(), 3, "{refusals:#?}");
    assert!(
        result.get(field::NETWORK_REFUSALS_OMITTED).is_none(),
        "{result:#}"
    );
    // Python printed the proxy's status line: the reason and the fix, not a bare 403.
    let stderr = result["stderr"].as_str().unwrap_or_default();
    assert!(
        stderr.contains(&format!(
            "403 Forbidden (dynocap: {PYPI_HOST} is not on this sandbox's allowlist"
        )) && stderr.contains(&format!("--allow-host {PYPI_HOST}")),
        "{stderr}"
    );
    assert_eq!(
        fix.https.requests().len(),
        before,
        "a refusal reached the fixture"
    );
    if backend == Backend::Jail {
        // pip itself (the host's, in the jail): one retry, so one line with the status line.
        let pip = home.exec(
            "refusals",
            &[],
            &format!(
                "pip download --no-deps --no-cache-dir --retries 1 --timeout 20 --dest /tmp/p \
                 --index-url https://{PYPI_HOST}/simple/ {PYPI_PACKAGE}"
            ),
        );
        let stderr = pip["stderr"].as_str().unwrap_or_default();
        assert!(
            stderr.contains(&format!(
                "Tunnel connection failed: 403 Forbidden (dynocap: {PYPI_HOST} is not on this \
                 sandbox's allowlist; the person running DynoCap can allow it with \
                 --allow-host {PYPI_HOST}"
            )),
            "{stderr}"
        );
        assert_eq!(
            pip[field::NETWORK_REFUSALS][0]["host"],
            PYPI_HOST,
            "{pip:#}"
        );
    }

    // A command that was refused nothing, allowed traffic included, lists nothing.
    let quiet = home.exec(
        "refusals",
        &[],
        &format!("curl -sS --fail https://{NPM_HOST}/"),
    );
    assert_eq!(quiet["exitCode"], 0, "{quiet:#}");
    assert!(quiet.get(field::NETWORK_REFUSALS).is_none(), "{quiet:#}");

    // The CLI: after the command's own output, one line naming the host, why, and the fix.
    let out = home.run(&[
        "exec",
        "refusals",
        "--",
        &format!("curl -sS https://{OTHER_HOST}/; echo done"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stdout, "done\n", "{stderr}");
    let line = format!(
        "dynocap: the sandbox's network refused {OTHER_HOST}:443: {OTHER_HOST} is not on this \
         sandbox's allowlist; to allow it, start a sandbox with --allow-host {OTHER_HOST} \
         (`dynocap run`, `dynocap task start`) or add {OTHER_HOST} to DYNOCAP_EGRESS_ALLOW\n"
    );
    assert!(stderr.ends_with(&line), "{stderr}");
    let curl_said = stderr.find("curl: ").unwrap_or(usize::MAX);
    assert!(curl_said < stderr.len() - line.len(), "{stderr}");
    let again = home.run(&["exec", "refusals", "--", "true"]);
    assert!(again.status.success(), "{again:?}");
    assert_eq!(String::from_utf8_lossy(&again.stderr), "", "{again:?}");

    // A job's result carries them as an exec's does: `job --json` once it ended, and the
    // same line after `job --follow`'s output and its state, stdout left to the command.
    let started = home.run(&[
        "exec",
        "refusals",
        "--background",
        "--",
        &format!("curl -sS https://{OTHER_HOST}/; echo done"),
    ]);
    assert!(started.status.success(), "{started:?}");
    let job = String::from_utf8_lossy(&started.stdout).trim().to_owned();
    let followed = home.run(&["job", "refusals", &job, "--follow"]);
    assert!(followed.status.success(), "{followed:?}");
    let stderr = String::from_utf8_lossy(&followed.stderr);
    assert_eq!(
        String::from_utf8_lossy(&followed.stdout),
        "done\n",
        "{stderr}"
    );
    assert!(
        stderr.ends_with(&format!("dynocap: {job} exited, exit code 0\n{line}")),
        "{stderr}"
    );
    let report = home.json(&["job", "refusals", &job]);
    let listed = report[field::NETWORK_REFUSALS]
        .as_array()
        .unwrap_or_else(|| panic!("no {}: {report:#}", field::NETWORK_REFUSALS));
    assert_eq!(listed.len(), 1, "{report:#}");
    assert_eq!(
        (&listed[0]["host"], &listed[0]["port"], &listed[0]["count"]),
        (&Value::from(OTHER_HOST), &Value::from(443), &Value::from(1)),
        "{report:#}"
    );
    assert!(
        listed[0]["fix"]
            .as_str()
            .is_some_and(|f| f.contains(&format!("--allow-host {OTHER_HOST}"))),
        "{report:#}"
    );
}

/// A filtered task's allowlist also holds its project's own remotes, when they are on the git
/// hosts the operator trusts (`DYNOCAP_MCP_GIT_HOSTS`), and nothing else from them. No packet
/// is sent: only the start result is read.
#[test]
fn a_projects_trusted_remotes_join_its_allowlist() {
    if !require_root("a_projects_trusted_remotes_join_its_allowlist") {
        return;
    }
    let home = TestHome::new().with_env("DYNOCAP_MCP_GIT_HOSTS", "github.com,git.corp.test");
    let project = home.path().join("project-remotes");
    write(&project.join("README.md"), "# project\n");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-C", project.to_str().expect("utf-8")])
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .expect("spawn git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q"]);
    git(&["remote", "add", "origin", "https://GitHub.com/octo/app.git"]);
    git(&["remote", "add", "corp", "git@git.corp.test:team/app.git"]);
    git(&["remote", "add", "other", "https://evil.example/x.git"]);
    let task = home.json(&[
        "task",
        "start",
        project.to_str().expect("utf-8"),
        "--network",
        "filtered",
    ]);
    let allowlist: Vec<String> = task[field::EGRESS_ALLOWLIST]
        .as_array()
        .expect("an allowlist")
        .iter()
        .map(|h| h.as_str().expect("a host").to_owned())
        .collect();
    assert_eq!(
        allowlist,
        ["registry.npmjs.org", "github.com", "git.corp.test"],
        "{task:#}"
    );
}

#[test]
fn everything_but_https_to_allowed_hosts_is_refused_and_logged() {
    everything_but_https_to_allowed_hosts_is_refused_and_logged_on(Backend::Jail);
}

#[test]
fn everything_but_https_to_allowed_hosts_is_refused_and_logged_in_a_vm() {
    everything_but_https_to_allowed_hosts_is_refused_and_logged_on(Backend::Vm);
}

/// A CONNECT client for ssh's `ProxyCommand` (`connect.py PROXY HOST PORT`), in Python
/// because images differ in which `nc` they have, if any.
const CONNECT_PY: &str = r#"import os, socket, sys, threading
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)))
s.sendall(f"CONNECT {sys.argv[2]}:{sys.argv[3]} HTTP/1.1\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    byte = s.recv(1)
    if not byte:
        sys.exit("the proxy closed the connection")
    head += byte
if head.split()[1:2] != [b"200"]:
    sys.exit(head.decode(errors="replace"))
def up():
    while data := os.read(0, 65536):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    os.write(1, data)
"#;

fn everything_but_https_to_allowed_hosts_is_refused_and_logged_on(backend: Backend) {
    let test = "everything_but_https_to_allowed_hosts_is_refused_and_logged";
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    let fix = NetFix::start();
    // `localhost` is allowed by name so that its refusal comes from the address check: the
    // proxy resolves it on the host (from /etc/hosts, no DNS query) to 127.0.0.1, and no
    // override names that address.
    let home = with_fixture(home, &fix, "localhost");
    let task = filtered_task(&home, "deny");
    assert_eq!(task["backend"], backend.name(), "{task}");
    let id = task_id(&task);
    let addr = fix.addr.to_string();

    // A host not on the list (the fixture would answer for it: the override exists).
    let out = fails_in(&home, "deny", &format!("curl -sS https://{OTHER_HOST}/"));
    assert!(out.contains("403"), "{out}");
    refused(&home, &id, OTHER_HOST, 443, "a host not on the list");

    // Raw IPs, v4 and v4-mapped v6; the fixture's address would answer with a valid
    // certificate (it holds an IP SAN), so only the proxy stands in the way.
    let out = fails_in(&home, "deny", &format!("curl -sS https://{addr}/"));
    assert!(out.contains("403"), "{out}");
    refused(&home, &id, &addr, 443, "a raw IPv4 address");
    let out = fails_in(&home, "deny", "curl -sS 'https://[::ffff:127.0.0.1]/'");
    assert!(out.contains("403"), "{out}");
    decision(&home, &id, "a raw v4-mapped IPv6 address", |d| {
        d["allowed"] == false && d["host"].as_str().is_some_and(|h| h.contains("ffff"))
    });

    // Plain HTTP (port 80): a 403 whose body says why.
    let (code, body, err) = run_in(
        &home,
        "deny",
        &format!("curl -sS -w '\\n%{{http_code}}' http://{NPM_HOST}/"),
    );
    assert_eq!(code, 0, "{err}");
    let (reason, status) = body.trim_end().rsplit_once('\n').unwrap_or(("", &body));
    assert_eq!(status, "403", "{body}");
    assert!(!reason.trim().is_empty(), "the 403 body gives the reason");
    decision(&home, &id, "plain HTTP", |d| {
        d["allowed"] == false && d["host"] == NPM_HOST && d["port"] == 80
    });

    // Port 22 to a host that is not the task's git origin; sshd answers there (override
    // registry.npmjs.org:22), so a wrongly opened tunnel would connect.
    let sshd_before = fix.ssh.connections();
    let out = fails_in(&home, "deny", &format!("curl -sS https://{NPM_HOST}:22/"));
    assert!(out.contains("403"), "{out}");
    ok_in(
        &home,
        "deny",
        &format!("cat > /tmp/connect.py <<'EOF'\n{CONNECT_PY}EOF"),
    );
    let out = fails_in(
        &home,
        "deny",
        &format!(
            "ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no \
             -o ProxyCommand='python3 /tmp/connect.py {} %h %p' git@{NPM_HOST} true",
            product::GUEST_PROXY
        ),
    );
    // The proxy said no, not the helper: the refusal reached ssh as the helper's message.
    assert!(out.contains("403"), "{out}");
    assert!(!out.contains("Permission denied"), "reached sshd: {out}");
    refused(&home, &id, NPM_HOST, 22, "port 22 to a non-git host");

    // SNI that differs from the CONNECT host: curl --connect-to, openssl -servername.
    let out = fails_in(
        &home,
        "deny",
        &format!("curl -sS --connect-to {OTHER_HOST}:443:{NPM_HOST}:443 https://{OTHER_HOST}/"),
    );
    assert!(!out.contains("dynocap netfix"), "{out}");
    let out = fails_in(
        &home,
        "deny",
        &format!(
            "openssl s_client -proxy {} -connect {NPM_HOST}:443 -servername {OTHER_HOST} </dev/null",
            product::GUEST_PROXY
        ),
    );
    assert!(
        !out.contains("Server certificate"),
        "handshake completed: {out}"
    );
    // A missing SNI.
    let out = fails_in(
        &home,
        "deny",
        &format!(
            "openssl s_client -proxy {} -connect {NPM_HOST}:443 -noservername </dev/null",
            product::GUEST_PROXY
        ),
    );
    assert!(
        !out.contains("Server certificate"),
        "handshake completed: {out}"
    );
    let sni_refusals = network_log(&home, &id)
        .into_iter()
        .filter(|d| {
            d["allowed"] == false
                && d["host"] == NPM_HOST
                && d["port"] == 443
                && d["reason"]
                    .as_str()
                    .is_some_and(|r| r.to_lowercase().contains("sni"))
        })
        .count();
    assert!(sni_refusals >= 3, "{:#?}", network_log(&home, &id));
    assert!(
        !fix.https
            .requests()
            .iter()
            .any(|r| r["sni"] == OTHER_HOST || r["sni"].is_null()),
        "{:#?}",
        fix.https.requests()
    );

    // A name that resolves to loopback without an override. `--noproxy ''` overrides the
    // sandbox's NO_PROXY (which lists localhost) so curl asks the proxy. The proxy resolves
    // only after an allowed ClientHello, so the refusal is a TLS alert, not an HTTP status.
    let out = fails_in(&home, "deny", "curl -sS --noproxy '' https://localhost/");
    assert!(out.contains("alert access denied"), "{out}");
    let d = refused(&home, &id, "localhost", 443, "a name resolving to loopback");
    assert!(
        d["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("loopback")
            || d["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("127.0.0.1"),
        "{d:#}"
    );

    // No DNS from the guest.
    for name in [NPM_HOST, GIT_HOST] {
        fails_in(&home, "deny", &format!("getent hosts {name}"));
    }

    // Only loopback inside; UDP and direct TCP go nowhere. The targets are the fixture's
    // address, which inside the guest is the guest's own loopback: nothing listens there, and
    // the host-side listeners below must hear nothing.
    let interfaces = ok_in(
        &home,
        "deny",
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    );
    assert_eq!(interfaces, "lo\n");
    let udp = std::net::UdpSocket::bind((fix.addr, 0)).expect("bind a host UDP listener");
    udp.set_nonblocking(true).expect("nonblocking");
    let port = udp.local_addr().expect("local addr").port();
    run_in(
        &home,
        "deny",
        &format!(
            "bash -c 'echo ping > /dev/udp/{addr}/{port}; echo ping > /dev/udp/{NPM_HOST}/53'"
        ),
    );
    let mut buf = [0u8; 64];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a UDP datagram from the guest reached the host"
    );
    let https_before = fix.https.failed_connections().len();
    for target in [
        format!("{addr}/443"),
        format!("{addr}/22"),
        format!("{NPM_HOST}/443"),
        "127.0.0.1/22".to_owned(),
    ] {
        fails_in(
            &home,
            "deny",
            &format!("bash -c 'exec 3<>/dev/tcp/{target}'"),
        );
    }
    assert_eq!(fix.https.failed_connections().len(), https_before);
    assert_eq!(fix.ssh.connections(), sshd_before, "{}", fix.ssh.log());

    // Every decision is logged with all its fields; the summary counts the refusals.
    let log = network_log(&home, &id);
    log.iter().for_each(assert_decision_fields);
    let refusals = log.iter().filter(|d| d["allowed"] == false).count();
    assert!(refusals >= 9, "{log:#?}");
    assert!(log.iter().all(|d| d["allowed"] == false), "{log:#?}");
    let finished = home.json(&["task", "finish", "deny"]);
    assert_eq!(
        finished[field::NETWORK][field::REFUSALS]["count"].as_u64(),
        Some(refusals as u64),
        "{finished:#}"
    );
    assert_eq!(
        finished[field::NETWORK][field::HOSTS_REACHED],
        serde_json::json!([]),
        "{finished:#}"
    );
}

/// `task start --repo URL [flags]`.
fn start_repo(home: &TestHome, url: &str, flags: &[&str]) -> Value {
    let mut args = vec!["task", "start", "--repo", url];
    args.extend_from_slice(flags);
    home.json(&args)
}

/// The task's tree is exactly the served repository's `main`; a change shows alone in the
/// diff, and finish verifies the patch.
fn assert_clone_is_the_baseline(home: &TestHome, fix: &NetFix, name: &str, task: &Value) {
    let files = ok_in(
        home,
        name,
        "find . -path ./.git -prune -o -type f -print | sort",
    );
    let mut expected: Vec<String> = TestRepo::FILES
        .iter()
        .map(|(p, _)| format!("./{p}"))
        .collect();
    expected.sort();
    assert_eq!(files.lines().collect::<Vec<_>>(), expected, "{files}");
    for (path, content) in TestRepo::FILES {
        assert_eq!(ok_in(home, name, &format!("cat {path}")), content);
    }
    assert_eq!(
        task["source"][field::SOURCE_COMMIT],
        fix.repo.head,
        "the clone's commit is recorded: {task:#}"
    );
    ok_in(home, name, "echo changed >> README.md");
    let diff = home.json(&["task", "diff", name]);
    assert_eq!(diff["files"], 1, "{diff:#}");
    let patch = diff["patch"].as_str().expect("patch");
    assert!(
        patch.contains("README.md") && patch.contains("+changed"),
        "{patch}"
    );
    let finished = home.json(&["task", "finish", name]);
    assert_eq!(finished["verified"], true, "{finished:#}");
}

#[test]
fn repo_over_https_is_the_baseline_with_each_history() {
    if !require_root("repo_over_https_is_the_baseline_with_each_history") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix, "");
    let url = fix.https_repo_url();

    let head = start_repo(&home, &url, &["--name", "head", "--history", "head"]);
    assert_eq!(head["source"]["repositoryUrl"], url, "{head:#}");
    assert_eq!(head["source"]["history"], "head");
    assert_eq!(head["network"], "none");
    assert_eq!(
        ok_in(&home, "head", "git rev-parse HEAD").trim(),
        fix.repo.head
    );
    assert_eq!(ok_in(&home, "head", "git rev-list --count HEAD"), "1\n");
    // After the clone a `none` task has no egress, not even to its git host.
    fails_in(
        &home,
        "head",
        &format!("curl -sS --max-time 20 {url}/info/refs"),
    );
    assert_clone_is_the_baseline(&home, &fix, "head", &head);

    let none = start_repo(&home, &url, &["--name", "tree", "--history", "none"]);
    assert_eq!(none["source"]["history"], "none");
    assert_eq!(
        ok_in(
            &home,
            "tree",
            "git rev-parse -q --verify HEAD || echo no-commits"
        ),
        "no-commits\n"
    );
    assert_clone_is_the_baseline(&home, &fix, "tree", &none);

    let branches = start_repo(&home, &url, &["--name", "all", "--history", "branches"]);
    let refs = ok_in(&home, "all", "git branch -a");
    assert!(refs.contains("feature"), "{refs}");
    assert_eq!(ok_in(&home, "all", "git rev-list --count HEAD"), "2\n");
    assert_clone_is_the_baseline(&home, &fix, "all", &branches);
    assert!(
        fix.https
            .requests_for(&format!("/{REPO}/"))
            .iter()
            .all(|r| r["sni"] == GIT_HOST),
        "{:#?}",
        fix.https.requests()
    );
}

/// A clone followed by `filtered`: the proxy, opened to the git host alone for the clone,
/// is then opened to the task's allowlist (which holds the git host), so the task reaches the
/// repository's host over HTTPS and nothing else.
#[test]
fn a_filtered_repo_task_keeps_its_git_host_on_the_allowlist() {
    if !require_root("a_filtered_repo_task_keeps_its_git_host_on_the_allowlist") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix, "");
    let task = start_repo(
        &home,
        &fix.https_repo_url(),
        &["--network", "filtered", "--name", "fr"],
    );
    let allowlist = task[field::EGRESS_ALLOWLIST].to_string();
    assert!(
        allowlist.contains(GIT_HOST) && allowlist.contains(NPM_HOST),
        "{allowlist}"
    );
    assert_eq!(
        ok_in(&home, "fr", &format!("curl -sS --fail https://{GIT_HOST}/")),
        "dynocap netfix\n"
    );
    let refused = fails_in(
        &home,
        "fr",
        &format!("curl -sS --fail https://{OTHER_HOST}/"),
    );
    assert!(refused.contains("403"), "{refused}");
}

/// The second line of a private key file: base64 that appears nowhere else.
fn key_marker(key: &Path) -> String {
    std::fs::read_to_string(key)
        .expect("read key")
        .lines()
        .nth(1)
        .expect("a PEM body line")
        .to_owned()
}

/// A basic regular expression that matches `literal` but not its own text: the first
/// character goes in brackets (the `grep [f]oo` idiom), so a process whose arguments hold the
/// pattern is not found by it. `literal` must not contain `'`, being quoted for sh.
fn not_self_matching(literal: &str) -> String {
    assert!(!literal.contains('\''), "{literal} is quoted with '");
    let mut chars = literal.chars();
    let first = chars.next().expect("a non-empty literal");
    // Every other character stands for itself in brackets.
    assert!(
        !matches!(first, '^' | ']'),
        "{literal} starts with a bracket-special character"
    );
    let mut pattern = format!("[{first}]");
    for c in chars {
        if matches!(c, '\\' | '.' | '[' | ']' | '*' | '^' | '$') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern
}

/// Files under `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                // A sandbox's state directory holds its disk image: the guest's own filesystem,
                // searched from inside the guest above (and sparse, many GiB).
                if path.file_name() != Some(std::ffi::OsStr::new("sandboxes")) {
                    stack.push(path);
                }
            } else if kind.is_file() {
                if let Ok(bytes) = std::fs::read(&path) {
                    if bytes.windows(needle.len()).any(|w| w == needle) {
                        found.push(path);
                    }
                }
            }
        }
    }
    found
}

#[test]
fn repo_over_ssh_uses_the_key_and_leaves_no_trace_of_it() {
    if !require_root("repo_over_ssh_uses_the_key_and_leaves_no_trace_of_it") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix, "").with_env("HOME", fix.ssh_home().to_str().expect("utf-8"));
    let key = fix.ssh.key.to_str().expect("utf-8").to_owned();
    let url = fix.ssh_repo_url();
    let out = home
        .command()
        .args(["--json", "task", "start", "--repo", &url])
        .args([product::FLAG_SSH_KEY, &key, "--name", "ssh"])
        .output()
        .expect("spawn dynocap");
    let marker = key_marker(&fix.ssh.key);
    for stream in [&out.stdout, &out.stderr] {
        assert!(
            !String::from_utf8_lossy(stream).contains(&marker),
            "the key in the start output"
        );
    }
    assert!(
        out.status.success(),
        "task start over ssh: {}\n{}\nsshd: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        fix.ssh.log(),
        home_logs(&home)
    );
    let task: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        fix.ssh.log().contains("Accepted publickey"),
        "{}",
        fix.ssh.log()
    );
    assert_eq!(
        ok_in(&home, "ssh", "git rev-parse HEAD").trim(),
        fix.repo.head
    );

    // Gone from the guest: no file holds its bytes (/proc and /sys are not files; /usr is the
    // host's read-only system image, which the key never reached), no process has it in its
    // environment or arguments.
    // The search's own shell and greps carry its patterns in their command lines, so it uses
    // patterns that match the marker and the key's path but not themselves.
    let (marker_re, key_re) = (not_self_matching(&marker), not_self_matching(&key));
    let search = format!(
        "grep -rls --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr -e '{marker_re}' / ; \
         cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -ca -e '{marker_re}' -e '{key_re}'; true"
    );
    let (_, found, _) = run_in(&home, "ssh", &search);
    assert_eq!(found.trim(), "0", "the key is still in the guest: {found}");
    ok_in(&home, "ssh", "echo changed >> README.md");
    let finished = home.json(&["task", "finish", "ssh"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    assert_eq!(task["source"][field::SOURCE_COMMIT], fix.repo.head);
    // Nor in any output, log, record or result on the host.
    let leaked = files_containing(home.path(), marker.as_bytes());
    assert!(leaked.is_empty(), "the key's bytes in {leaked:?}");
}

#[test]
fn bad_ssh_keys_are_refused_before_anything_starts() {
    if !require_root("bad_ssh_keys_are_refused_before_anything_starts") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix, "").with_env("HOME", fix.ssh_home().to_str().expect("utf-8"));
    let not_a_key = fix.dir().join("not-a-key");
    write(&not_a_key, "this is not an ssh key\n");
    let link = fix.dir().join("key-link");
    std::os::unix::fs::symlink(&fix.ssh.key, &link).expect("symlink");
    let url = fix.ssh_repo_url();
    let sshd_before = fix.ssh.connections();
    for (key, expect) in [
        (&not_a_key, "private key"),
        (&link, "symlink"),
        (&fix.ssh.passphrase_key, "passphrase"),
    ] {
        let err = home.json_err(&[
            "task",
            "start",
            "--repo",
            &url,
            product::FLAG_SSH_KEY,
            key.to_str().expect("utf-8"),
            "--name",
            "bad",
        ]);
        let message = err["message"].as_str().unwrap_or_default();
        assert!(
            message.to_lowercase().contains(expect),
            "{}: {err:#}",
            key.display()
        );
    }
    assert_eq!(
        fix.ssh.connections(),
        sshd_before,
        "a refused key still connected: {}",
        fix.ssh.log()
    );
    assert_nothing_left(&home);
}

/// The supervisor logs and network logs of a home, for failure messages.
fn home_logs(home: &TestHome) -> String {
    let mut text = String::new();
    for dir in ["logs", "results"] {
        let mut stack = vec![home.path().join(dir)];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "log" || e == "jsonl") {
                    let content = std::fs::read_to_string(&path).unwrap_or_default();
                    text.push_str(&format!("--- {}\n{content}", path.display()));
                }
            }
        }
    }
    text
}

/// No task, no supervisor: a failed start leaves the home as it was.
fn assert_nothing_left(home: &TestHome) {
    let ls = home.json(&["ls"]);
    assert_eq!(ls["tasks"], serde_json::json!([]), "{ls:#}");
    assert_eq!(ls["sandboxes"], serde_json::json!([]), "{ls:#}");
    assert!(home.supervisor_pids().is_empty());
}

#[test]
fn a_failed_clone_is_an_error_with_gits_message_and_leaves_nothing() {
    if !require_root("a_failed_clone_is_an_error_with_gits_message_and_leaves_nothing") {
        return;
    }
    let fix = NetFix::start();
    // `unreachable.test` resolves to a loopback address where nothing listens.
    let dead = loop {
        let addr = random_loopback();
        if std::net::TcpStream::connect((addr, 443)).is_err() {
            break addr;
        }
    };
    let mut resolve = fix.resolve_all();
    resolve.push_str(&format!(",unreachable.test:443:{dead}"));
    let home = home_for(&fix, "")
        .with_env(product::ENV_RESOLVE, &resolve)
        .with_env("HOME", fix.ssh_home().to_str().expect("utf-8"));
    // An ed25519 key the server does not know.
    let stranger = fix.dir().join("stranger");
    run(std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&stranger));

    let missing = format!("https://{GIT_HOST}/missing.git");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![missing], "not found"),
        (
            vec!["https://unreachable.test/repo.git".to_owned()],
            "unreachable.test",
        ),
        (
            vec![
                fix.ssh_repo_url(),
                product::FLAG_SSH_KEY.to_owned(),
                stranger.display().to_string(),
            ],
            "Permission denied",
        ),
    ];
    for (args, git_says) in cases {
        let mut argv = vec!["task", "start", "--repo"];
        argv.extend(args.iter().map(String::as_str));
        argv.extend(["--name", "clone"]);
        let err = home.json_err(&argv);
        let message = err["message"].as_str().unwrap_or_default();
        assert!(message.contains(git_says), "{args:?}: {err:#}");
        assert_nothing_left(&home);
    }
    // The name is free.
    start_repo(&home, &fix.https_repo_url(), &["--name", "clone"]);
}
