//! Named registries in the allowlist, end to end through the CLI: `--allow-host @pypi` (and
//! `DYNOCAP_EGRESS_ALLOW=@pypi`) lets a `filtered` sandbox's pip reach PyPI's two hosts, the
//! sandbox's allowlist shows them, and an unknown `@name` is refused with the known names.
//!
//! PyPI here is tests/support/tlsfix.rs on a 127.X.Y.Z, reached under the real names through
//! `DYNOCAP_RESOLVE`: nothing leaves loopback. Needs root.

#[path = "support/tlsfix.rs"]
mod tlsfix;

use dynocap_e2e::netfix::{product, PYPI_WHEEL};
use dynocap_e2e::{require_root, TestHome};
use serde_json::Value;
use tlsfix::TlsFix;

const PYPI: [&str; 2] = ["pypi.org", "files.pythonhosted.org"];
const KNOWN: &str =
    "the named registries are @npm, @pypi, @crates, @go, @debian, @rubygems, @maven";

fn home_for(fix: &TlsFix) -> TestHome {
    TestHome::new()
        .with_env(product::ENV_RESOLVE, &fix.resolve(&PYPI))
        .with_env(product::ENV_EXTRA_CA, &fix.ca_cert.display().to_string())
}

fn allowlist(value: &Value) -> Vec<String> {
    value["egressAllowlist"]
        .as_array()
        .unwrap_or_else(|| panic!("no egressAllowlist: {value:#}"))
        .iter()
        .map(|h| h.as_str().expect("a host").to_owned())
        .collect()
}

/// pip's default index is pypi.org, whose page links the wheel on files.pythonhosted.org:
/// both names must be allowed, and both are reached.
fn pip_downloads(home: &TestHome, name: &str, fix: &TlsFix) {
    let result = home.exec(
        name,
        &["--timeout", "120"],
        &format!(
            "env | grep -q '^PIP_INDEX_URL=' && exit 99; \
             pip download --no-deps --no-cache-dir --retries 0 --dest /tmp/pipdl dynocap-fixture >&2 && \
             test -f /tmp/pipdl/{PYPI_WHEEL}"
        ),
    );
    assert_eq!(result["exitCode"], 0, "{result:#}");
    let requests = fix.requests();
    for (sni, path) in [
        ("pypi.org", "/simple/dynocap-fixture/"),
        ("files.pythonhosted.org", "/files/"),
    ] {
        assert!(
            requests.iter().any(|r| r["sni"] == sni
                && r["status"] == 200
                && r["path"].as_str().is_some_and(|p| p.starts_with(path))),
            "no {sni} {path} request: {requests:#?}"
        );
    }
}

#[test]
fn allow_host_pypi_reaches_both_of_pypis_hosts() {
    if !require_root("allow_host_pypi_reaches_both_of_pypis_hosts") {
        return;
    }
    let fix = TlsFix::start(&PYPI);
    let home = home_for(&fix);
    // Before: pypi.org is not on the default list, so pip is refused.
    home.sandbox("plain", &["--network", "filtered"]);
    let refused = home.exec(
        "plain",
        &["--timeout", "120"],
        "pip download --no-deps --no-cache-dir --retries 0 --dest /tmp/p dynocap-fixture",
    );
    assert_ne!(refused["exitCode"], 0, "{refused:#}");
    assert!(fix.requests().is_empty(), "{:#?}", fix.requests());

    let info = home.sandbox(
        "py",
        &["--network", "filtered", product::FLAG_ALLOW_HOST, "@pypi"],
    );
    let shown = allowlist(&info);
    for host in PYPI {
        assert!(shown.contains(&host.to_owned()), "{host}: {shown:?}");
    }
    assert!(!shown.iter().any(|h| h.starts_with('@')), "{shown:?}");
    // ps and ls show the same expansion.
    for command in ["ps", "ls"] {
        let listed = home.json(&[command]);
        let sandbox = listed["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .find(|s| s["name"] == "py")
            .unwrap_or_else(|| panic!("{command}: {listed:#}"))
            .clone();
        assert_eq!(allowlist(&sandbox), shown, "{command}: {sandbox:#}");
    }
    pip_downloads(&home, "py", &fix);
}

#[test]
fn egress_allow_takes_registry_names_and_unknown_ones_are_refused() {
    if !require_root("egress_allow_takes_registry_names_and_unknown_ones_are_refused") {
        return;
    }
    let fix = TlsFix::start(&PYPI);
    let home = home_for(&fix).with_env(product::ENV_EGRESS_ALLOW, "@PyPI");
    let info = home.sandbox("py", &["--network", "filtered"]);
    let shown = allowlist(&info);
    assert!(
        PYPI.iter().all(|h| shown.contains(&(*h).to_owned())),
        "{shown:?}"
    );
    pip_downloads(&home, "py", &fix);

    let err = home.json_err(&[
        "run",
        "bad",
        "--network",
        "filtered",
        "--allow-host",
        "@foo",
    ]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    let message = err["message"].as_str().expect("message");
    assert!(
        message.contains("\"@foo\": there is no registry named @foo") && message.contains(KNOWN),
        "{message}"
    );
    let bad_env = home_for(&fix).with_env(product::ENV_EGRESS_ALLOW, "pypi.org,@pip");
    let err = bad_env.json_err(&["run", "bad", "--network", "filtered"]);
    let message = err["message"].as_str().expect("message");
    assert!(
        message.contains("\"@pip\": there is no registry named @pip") && message.contains(KNOWN),
        "{message}"
    );
    // The flag's help names them.
    for command in [&["run", "--help"][..], &["task", "start", "--help"]] {
        let help = String::from_utf8(home.run(command).stdout).expect("utf8");
        assert!(
            help.contains("@npm, @pypi, @crates, @go, @debian, @rubygems, @maven"),
            "{help}"
        );
    }
    // Nothing was made for either.
    let listed = home.json(&["ls"]);
    assert!(
        !listed["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .any(|s| s["name"] == "bad"),
        "{listed:#}"
    );
}

/// `@go` is every host `go mod download` reaches: the module proxy answers many `.zip`
/// requests with a `302` to Google Cloud Storage, so a sandbox given `@go` must reach
/// storage.googleapis.com as well as the proxy and the checksum database, and one without
/// `@go` none of them.
#[test]
fn allow_host_go_reaches_the_proxy_the_checksums_and_the_zips_storage() {
    if !require_root("allow_host_go_reaches_the_proxy_the_checksums_and_the_zips_storage") {
        return;
    }
    const GO: [&str; 3] = [
        "proxy.golang.org",
        "sum.golang.org",
        "storage.googleapis.com",
    ];
    let fix = TlsFix::start(&GO);
    let zip = "proxy-golang-org-prod/example.com-mod-v1.0.0.zip";
    let served = fix.www().join(zip);
    std::fs::create_dir_all(served.parent().expect("parent")).expect("mkdir");
    std::fs::write(&served, "zip").expect("write");
    let home = TestHome::new()
        .with_env(product::ENV_RESOLVE, &fix.resolve(&GO))
        .with_env(product::ENV_EXTRA_CA, &fix.ca_cert.display().to_string());
    let fetch_all = GO
        .iter()
        .map(|host| format!("curl -sS --max-time 20 -o /dev/null https://{host}/{zip}"))
        .collect::<Vec<_>>()
        .join(" && ");

    home.sandbox("plain", &["--network", "filtered"]);
    let refused = home.exec("plain", &["--timeout", "120"], &fetch_all);
    assert_ne!(refused["exitCode"], 0, "{refused:#}");
    assert!(fix.requests().is_empty(), "{:#?}", fix.requests());

    let info = home.sandbox(
        "go",
        &["--network", "filtered", product::FLAG_ALLOW_HOST, "@go"],
    );
    let shown = allowlist(&info);
    for host in GO {
        assert!(shown.contains(&host.to_owned()), "{host}: {shown:?}");
    }
    let fetched = home.exec("go", &["--timeout", "120"], &fetch_all);
    assert_eq!(fetched["exitCode"], 0, "{fetched:#}");
    assert!(fetched.get("networkRefusals").is_none(), "{fetched:#}");
    let requests = fix.requests();
    for host in GO {
        assert!(
            requests
                .iter()
                .any(|r| r["sni"] == host && r["status"] == 200),
            "no {host} request: {requests:#?}"
        );
    }
}
