//! One trust store: a CA given only through `DYNOCAP_EXTRA_CA` is in the guest's system CA
//! bundle, so TLS clients that are told nothing (no `SSL_CERT_FILE`, `CURL_CA_BUNDLE`, apt
//! `CaInfo`, ...) trust a server it signed: curl, Python and git in the `host` image (whose
//! bundle is the host's own, bound read-only: the host's file stays as it was), and curl and
//! apt in the `debian` image, on the jail and on the vm (and apt of an image with plain-HTTP
//! sources and no CA package, as registries' Debian images are); and in a `nat` sandbox (no
//! proxy) on both, against the same server in the test's own network namespace.
//!
//! The server is tests/support/tlsfix.rs on a 127.X address, reached as `trust.test` through
//! `DYNOCAP_RESOLVE`: nothing leaves loopback. Needs root (and mmdebstrap for the debian
//! image, QEMU for the vm).

#[path = "support/tlsfix.rs"]
mod tlsfix;

use dynocap_e2e::backend::Backend;
use dynocap_e2e::images::{debian_home, require_mmdebstrap};
use dynocap_e2e::netfix::product;
use dynocap_e2e::{require_root, TestHome};
use serde_json::Value;
use tlsfix::TlsFix;

const NAME: &str = "trust.test";
/// What the server's `/index.html` holds (netfix's content script).
const INDEX: &str = "dynocap netfix\n";
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Runs `command` with none of the variables that name a CA bundle: only the system's own
/// trust store decides.
fn without_ca_variables(command: &str) -> String {
    format!(
        "env -u SSL_CERT_FILE -u SSL_CERT_DIR -u CURL_CA_BUNDLE -u REQUESTS_CA_BUNDLE \
         -u PIP_CERT -u GIT_SSL_CAINFO -u NODE_EXTRA_CA_CERTS -u CARGO_HTTP_CAINFO \
         -u npm_config_cafile sh -c '{command}'"
    )
}

fn with_fixture(home: TestHome, fix: &TlsFix, extra_ca: bool) -> TestHome {
    let home = home.with_env(product::ENV_RESOLVE, &fix.resolve(&[NAME]));
    if extra_ca {
        home.with_env(product::ENV_EXTRA_CA, &fix.ca_cert.display().to_string())
    } else {
        home
    }
}

fn filtered(home: &TestHome, name: &str, image: &[&str]) -> Value {
    let mut flags = vec!["--network", "filtered", product::FLAG_ALLOW_HOST, NAME];
    flags.extend_from_slice(image);
    home.sandbox(name, &flags)
}

fn certificates(text: &str) -> usize {
    text.matches("-----BEGIN CERTIFICATE-----").count()
}

fn curl(home: &TestHome, name: &str) -> Value {
    home.exec(
        name,
        &["--timeout", "60"],
        &without_ca_variables(&format!("curl -sS https://{NAME}/index.html")),
    )
}

#[test]
fn the_host_image_trusts_the_extra_ca_with_no_variable_and_the_host_file_is_untouched() {
    let test = "the_host_image_trusts_the_extra_ca_with_no_variable_and_the_host_file_is_untouched";
    if !require_root(test) {
        return;
    }
    let fix = TlsFix::start(&[NAME]);
    let host_bundle = std::fs::read(SYSTEM_BUNDLE).expect("the host's CA bundle");

    // Without the extra CA the server is not trusted: what the rest shows is the CA's doing.
    let plain = with_fixture(TestHome::new(), &fix, false);
    filtered(&plain, "plain", &[]);
    let refused = curl(&plain, "plain");
    assert_eq!(
        refused["exitCode"], 60,
        "curl's certificate error: {refused:#}"
    );

    let home = with_fixture(TestHome::new(), &fix, true);
    filtered(&home, "trust", &[]);
    let fetched = curl(&home, "trust");
    assert_eq!(fetched["exitCode"], 0, "{fetched:#}");
    assert_eq!(fetched["stdout"], INDEX);
    let python = home.exec(
        "trust",
        &[],
        &without_ca_variables(&format!(
            "python3 -c \"import urllib.request; print(urllib.request.urlopen(\\\"https://{NAME}/index.html\\\").read().decode(), end=\\\"\\\")\""
        )),
    );
    assert_eq!(python["exitCode"], 0, "{python:#}");
    assert_eq!(python["stdout"], INDEX);
    // git reaches the server over TLS and is told there is no such repository.
    let git = home.exec(
        "trust",
        &[],
        &without_ca_variables(&format!("git ls-remote https://{NAME}/none.git")),
    );
    let stderr = git["stderr"].as_str().expect("stderr");
    assert!(
        stderr.contains("not found") && !stderr.contains("certificate"),
        "{git:#}"
    );

    // The guest's bundle is the host's plus the extra CA; the host's own file is unchanged.
    let guest = home.sh("trust", &format!("cat {SYSTEM_BUNDLE}"));
    let host_text = String::from_utf8_lossy(&host_bundle);
    assert_eq!(certificates(&guest), certificates(&host_text) + 1);
    let extra = std::fs::read_to_string(&fix.ca_cert).expect("the CA");
    assert!(
        guest.contains(extra.trim()),
        "the extra CA is in the guest's bundle"
    );
    assert_eq!(
        std::fs::read(SYSTEM_BUNDLE).expect("the host's CA bundle"),
        host_bundle
    );
    // The guest's root cannot change it either: it is bound read-only.
    let agent_view = home.exec("trust", &[], &format!("test -w {SYSTEM_BUNDLE}"));
    assert_ne!(agent_view["exitCode"], 0, "{agent_view:#}");
}

/// For the apt tests: a home with the debian image that trusts the extra CA, and the fixture
/// server with a flat apt repository of one package (`dynocap-trusted`) at
/// `https://trust.test/apt/`, served over HTTPS signed by that CA. `None` (the test is
/// skipped, saying why) without root or mmdebstrap.
fn debian_and_apt_repository(test: &str) -> Option<(TlsFix, TestHome)> {
    if !(require_root(test) && require_mmdebstrap(test)) {
        return None;
    }
    let fix = TlsFix::start(&[NAME]);
    dynocap_e2e::images::flat_apt_repository(
        &fix.www().join("apt"),
        fix.dir(),
        "dynocap-trusted",
        "trusted",
    );
    let (home, _) = debian_home();
    let home = with_fixture(home, &fix, true);
    Some((fix, home))
}

#[test]
fn apt_and_curl_in_the_debian_image_trust_the_extra_ca() {
    let test = "apt_and_curl_in_the_debian_image_trust_the_extra_ca";
    let Some((fix, home)) = debian_and_apt_repository(test) else {
        return;
    };
    filtered(&home, "deb", &["--image", "debian"]);
    let fetched = curl(&home, "deb");
    assert_eq!(fetched["exitCode"], 0, "{fetched:#}");
    assert_eq!(fetched["stdout"], INDEX);
    // apt is told nothing about the CA: no Acquire::https::CaInfo, no variable (sudo keeps
    // the caller's environment, so the variables are dropped in the shell sudo runs).
    assert_eq!(
        home.sh(
            "deb",
            "test -e /etc/apt/apt.conf.d/00dynocap-egress || echo no-ca-setting"
        ),
        "no-ca-setting\n",
        "an image with a system bundle gets no apt CA setting"
    );
    home.sh(
        "deb",
        &format!(
            "sudo rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && \
             echo 'deb [trusted=yes] https://{NAME}/apt ./' | sudo tee /etc/apt/sources.list.d/fixture.list >/dev/null"
        ),
    );
    let update = home.exec(
        "deb",
        &["--timeout", "120"],
        &without_ca_variables("sudo -E apt-get update"),
    );
    assert_eq!(update["exitCode"], 0, "{update:#}");
    let install = home.exec(
        "deb",
        &["--timeout", "120"],
        &without_ca_variables(
            "sudo -E DEBIAN_FRONTEND=noninteractive apt-get install -y -q dynocap-trusted",
        ),
    );
    assert_eq!(install["exitCode"], 0, "{install:#}");
    assert_eq!(home.sh("deb", "dynocap-trusted"), "trusted\n");
    assert!(
        fix.requests().iter().any(|r| r["status"] == 200
            && r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/dynocap-trusted_1.0_all.deb"))),
        "the package did not come from the server: {:?}",
        fix.requests()
    );
    // A bundle made again from scratch by the distribution's own tool keeps the extra CA
    // (it is among the local CAs the tool reads).
    let remade = home.exec(
        "deb",
        &["--timeout", "120"],
        "sudo update-ca-certificates --fresh",
    );
    assert_eq!(remade["exitCode"], 0, "{remade:#}");
    assert!(
        remade["stdout"]
            .as_str()
            .is_some_and(|out| out.contains("Clearing symlinks")),
        "{remade:#}"
    );
    let again = curl(&home, "deb");
    assert_eq!(
        again["exitCode"], 0,
        "after update-ca-certificates: {again:#}"
    );
}

/// A Debian image as container registries have it: apt sources over plain `http://` (which
/// the `filtered` proxy refuses) and no `ca-certificates`, so no system bundle. In a
/// `filtered` sandbox apt still installs: its sources name the same mirrors over `https://`,
/// and it verifies them against the bundle the host sent (the extra CA with the host's CAs).
/// Made from the debian image by a recipe whose steps have no network.
#[test]
fn apt_with_plain_http_sources_and_no_ca_package_installs_through_filtered() {
    let test = "apt_with_plain_http_sources_and_no_ca_package_installs_through_filtered";
    let Some((_fix, home)) = debian_and_apt_repository(test) else {
        return;
    };
    let steps = format!(
        "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && \
         echo 'deb [trusted=yes] http://{NAME}/apt ./' > /etc/apt/sources.list.d/fixture.list && \
         dpkg --purge --force-depends ca-certificates && \
         rm -f /etc/ssl/certs/ca-certificates.crt"
    );
    home.json(&[
        "image", "build", "httpdeb", "--from", "debian", "--run", &steps,
    ]);
    filtered(&home, "httpdeb", &["--image", "httpdeb"]);
    assert_eq!(
        home.sh(
            "httpdeb",
            "cat /etc/apt/sources.list.d/fixture.list; test -e /etc/ssl/certs/ca-certificates.crt || echo no-bundle"
        ),
        format!("deb [trusted=yes] https://{NAME}/apt ./\nno-bundle\n")
    );
    let install = home.exec(
        "httpdeb",
        &["--timeout", "180"],
        "sudo apt-get update && \
         sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q dynocap-trusted",
    );
    assert_eq!(install["exitCode"], 0, "{install:#}");
    assert!(install.get("networkRefusals").is_none(), "{install:#}");
    assert_eq!(home.sh("httpdeb", "dynocap-trusted"), "trusted\n");
    // What told apt where the CAs are: the bundle the host sent.
    assert_eq!(
        home.sh("httpdeb", "cat /etc/apt/apt.conf.d/00dynocap-egress"),
        "// DynoCap: apt's HTTPS trusts what the sandbox's other clients trust.\n\
         Acquire::https::CaInfo \"/var/lib/dynocap-egress/ca-certificates.crt\";\n"
    );
}

#[test]
fn a_vm_guest_trusts_the_extra_ca_with_no_variable() {
    let test = "a_vm_guest_trusts_the_extra_ca_with_no_variable";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let fix = TlsFix::start(&[NAME]);
    let home = with_fixture(home, &fix, true);
    filtered(&home, "vmtrust", &[]);
    let fetched = curl(&home, "vmtrust");
    assert_eq!(fetched["exitCode"], 0, "{fetched:#}");
    assert_eq!(fetched["stdout"], INDEX);
}

/// `nat`: the guest's clients reach their servers themselves, and trust the extra CA all the
/// same. The server is the same script and certificate in the test's own server namespace
/// `S`; dynocap runs in `H`, whose only route leads there (see `support/netns.rs`), and the
/// guest reaches `S` through pasta.
fn nat_trusts_the_extra_ca_on(backend: Backend, test: &str) {
    use dynocap_e2e::netns::{Topology, SERVER_ADDR};
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    let fix = TlsFix::start(&[NAME]);
    let topology = Topology::new();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("support/netfix/https_server.py");
    let file = |name: &str| fix.dir().join(name).display().to_string();
    let www = fix.www().display().to_string();
    let _server = topology.server.spawn(
        "python3",
        &[
            script.to_str().expect("utf-8 path"),
            "--addr",
            SERVER_ADDR,
            "--cert",
            &file("server.pem"),
            "--key",
            &file("server.key"),
            "--www",
            &www,
            "--git-root",
            &file("git"),
            "--log",
            &file("nat.jsonl"),
            "--ready",
            &file("nat.ready"),
        ],
    );
    let resolve = format!("{NAME}:443:{SERVER_ADDR}");
    let url = format!("https://{NAME}/index.html");
    let ca = fix.ca_cert.display().to_string();
    assert!(
        dynocap_e2e::wait_until(30, || topology
            .in_host(std::path::Path::new("curl"))
            .args([
                "-sf",
                "-m",
                "5",
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
                &url
            ])
            .output()
            .is_ok_and(|out| out.status.success())),
        "the server in S does not answer from H"
    );
    let home = home.with_env(product::ENV_EXTRA_CA, &ca);
    let out = topology
        .in_host(&dynocap_e2e::dynocap_bin())
        .env("DYNOCAP_HOME", home.path())
        .env_remove("DYNOCAP_BACKEND")
        .envs(home.env_vars().iter().map(|(k, v)| (k, v)))
        .args(["--json", "run", "natca", "--network", "nat"])
        .output()
        .expect("run dynocap in H");
    assert!(
        out.status.success(),
        "run --network nat: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The guest's own bundle holds the extra CA, and curl, told nothing, trusts the server.
    let extra = std::fs::read_to_string(&fix.ca_cert).expect("the CA");
    let bundle = home.sh("natca", &format!("cat {SYSTEM_BUNDLE}"));
    assert!(
        bundle.contains(extra.trim()),
        "the extra CA is not in {SYSTEM_BUNDLE}"
    );
    let fetched = home.exec(
        "natca",
        &["--timeout", "60"],
        &without_ca_variables(&format!("curl -sS -m 30 --resolve {resolve} {url}")),
    );
    assert_eq!(fetched["exitCode"], 0, "{fetched:#}");
    assert_eq!(fetched["stdout"], INDEX);
    // No proxy in a nat guest: the CA came alone.
    let env = home.sh("natca", "env | grep -ci '^https_proxy=' || true");
    assert_eq!(env.trim(), "0");
    // Node.js (npm's TLS) never reads the system bundle: it is told where that bundle is.
    // The jail's `host` image has the host's node, when the host has one.
    let has_node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if backend == Backend::Jail && has_node {
        let node = home.exec(
            "natca",
            &["--timeout", "60"],
            &format!(
                "node -e 'require(\"https\").get({{host: \"{NAME}\", path: \"/index.html\", \
                 lookup: (h, o, cb) => o && o.all ? cb(null, [{{address: \"{SERVER_ADDR}\", family: 4}}]) \
                 : cb(null, \"{SERVER_ADDR}\", 4)}}, r => r.pipe(process.stdout)).on(\"error\", e => \
                 {{ console.error(e.message); process.exit(1) }})'"
            ),
        );
        assert_eq!(node["exitCode"], 0, "{node:#}");
        assert_eq!(node["stdout"], INDEX);
    }
}

#[test]
fn a_nat_sandbox_trusts_the_extra_ca_with_no_variable() {
    let test = "a_nat_sandbox_trusts_the_extra_ca_with_no_variable";
    nat_trusts_the_extra_ca_on(Backend::Jail, test);
}

#[test]
fn a_nat_vm_guest_trusts_the_extra_ca_with_no_variable() {
    let test = "a_nat_vm_guest_trusts_the_extra_ca_with_no_variable";
    nat_trusts_the_extra_ca_on(Backend::Vm, test);
}

/// A stand-in for a distribution's own CAs, whose bundle the extra CA joins: any real
/// certificate other than the test CA (the agent only appends; nothing here is trusted).
fn system_certificate() -> String {
    let other = TlsFix::start(&["system.test"]);
    std::fs::read_to_string(&other.ca_cert).expect("the other CA")
}

/// The PEM certificate blocks of `text`, whitespace left out, to compare whatever the lines.
fn blocks(text: &str) -> Vec<String> {
    text.split("-----END CERTIFICATE-----")
        .filter(|b| b.contains("-----BEGIN CERTIFICATE-----"))
        .map(|b| b.split_whitespace().collect())
        .collect()
}

/// An image of busybox with a distribution's CA layout, imported as `name`: Alpine's (the
/// bundle at Debian's path and `/etc/ssl/cert.pem` a link to it, local CAs in
/// `/usr/local/share/ca-certificates/`) or Fedora's (the bundle under
/// `/etc/pki/ca-trust/extracted/`, `/etc/pki/tls/certs/ca-bundle.crt` and `/etc/ssl/certs` links
/// to it, local CAs in `/etc/pki/ca-trust/source/anchors/`).
fn import_layout(home: &TestHome, busybox: &std::path::Path, name: &str, system: &str) {
    use dynocap_e2e::oci::{oci_layer, Layer, Layout};
    let root = Layer::busybox_root(busybox).applets(&["sh", "cat", "readlink", "ls", "grep"]);
    let root = match name {
        "alpine-layout" => root
            .dir("etc/ssl")
            .dir("etc/ssl/certs")
            .file("etc/ssl/certs/ca-certificates.crt", system)
            .symlink("etc/ssl/cert.pem", "certs/ca-certificates.crt")
            .dir("usr")
            .dir("usr/local")
            .dir("usr/local/share")
            .dir("usr/local/share/ca-certificates"),
        "fedora-layout" => root
            .dir("etc/pki")
            .dir("etc/pki/ca-trust")
            .dir("etc/pki/ca-trust/extracted")
            .dir("etc/pki/ca-trust/extracted/pem")
            .file("etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", system)
            .dir("etc/pki/ca-trust/source")
            .dir("etc/pki/ca-trust/source/anchors")
            .dir("etc/pki/tls")
            .dir("etc/pki/tls/certs")
            .symlink(
                "etc/pki/tls/certs/ca-bundle.crt",
                "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
            )
            .symlink(
                "etc/pki/tls/cert.pem",
                "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
            )
            .dir("etc/ssl")
            .symlink("etc/ssl/certs", "../pki/tls/certs"),
        other => panic!("no layout {other}"),
    };
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join(name);
    Layout::image(
        &layout,
        &[oci_layer(root.bytes(), true)],
        serde_json::json!({"Env": ["PATH=/bin"]}),
    );
    home.json(&[
        "image",
        "import",
        layout.to_str().expect("utf8"),
        "--name",
        name,
    ]);
}

/// A container image of another distribution than Debian gets the extra CA where that
/// distribution keeps its bundle (on the vm, booted with the debian image's kernel, which
/// the vm home has built): the file a link names is written once and every link to it
/// still is one, the distribution's local CA directory gets a copy for its update tool, and
/// a `none` sandbox of the same image keeps its bundle as it is.
fn another_distributions_bundle_on(backend: Backend, test: &str) {
    let Some(busybox) = dynocap_e2e::oci::require_busybox(test) else {
        return;
    };
    let Some(home) = TestHome::on(backend, test) else {
        return;
    };
    let fix = TlsFix::start(&[NAME]);
    let extra = std::fs::read_to_string(&fix.ca_cert).expect("the test CA");
    let system = system_certificate();
    let home = with_fixture(home, &fix, true);
    let wanted = [blocks(&system), blocks(&extra)].concat();
    for (image, bundle, links, anchor) in [
        (
            "alpine-layout",
            "/etc/ssl/certs/ca-certificates.crt",
            &["/etc/ssl/cert.pem"][..],
            "/usr/local/share/ca-certificates/dynocap-extra-ca.crt",
        ),
        (
            "fedora-layout",
            "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
            &[
                "/etc/pki/tls/certs/ca-bundle.crt",
                "/etc/pki/tls/cert.pem",
                "/etc/ssl/certs/ca-bundle.crt",
            ][..],
            "/etc/pki/ca-trust/source/anchors/dynocap-extra-ca.pem",
        ),
    ] {
        import_layout(&home, &busybox, image, &system);
        let box_name = format!("{image}-f");
        filtered(&home, &box_name, &["--image", image]);
        let text = home.sh(&box_name, &format!("cat {bundle}"));
        assert_eq!(blocks(&text), wanted, "{image}: {bundle}, written once");
        for link in links {
            assert_eq!(
                home.sh(&box_name, &format!("cat {link}")),
                text,
                "{image}: {link}"
            );
        }
        // Links stay links (a bundle made again by the distribution's tool is read there).
        let first = links[0];
        assert!(
            !home
                .sh(&box_name, &format!("readlink {first}"))
                .trim()
                .is_empty(),
            "{image}: {first} is no longer a link"
        );
        let copy = home.sh(&box_name, &format!("cat {anchor}"));
        assert_eq!(blocks(&copy), blocks(&extra), "{image}: {anchor}");
        home.run(&["destroy", &box_name]);

        let plain = format!("{image}-n");
        home.sandbox(&plain, &["--image", image]);
        let untouched = home.sh(&plain, &format!("cat {bundle}"));
        assert_eq!(untouched, system, "{image}: a none sandbox's bundle");
        assert_eq!(
            home.sh(&plain, &format!("ls {anchor} 2>/dev/null; true")),
            "",
            "{image}"
        );
        home.run(&["destroy", &plain]);
    }
}

#[test]
fn another_distributions_bundle_gets_the_extra_ca() {
    another_distributions_bundle_on(
        Backend::Jail,
        "another_distributions_bundle_gets_the_extra_ca",
    );
}

#[test]
fn another_distributions_bundle_gets_the_extra_ca_in_a_vm() {
    another_distributions_bundle_on(
        Backend::Vm,
        "another_distributions_bundle_gets_the_extra_ca_in_a_vm",
    );
}

/// A relative `DYNOCAP_EXTRA_CA` names the file beside the caller, but the home's command
/// server works from `/` (and a supervisor or the MCP server from wherever it started): it
/// is refused, saying to give the absolute path, whether the command runs in a process of
/// its own (the first, or with the server switched off) or is served, and nothing is made.
#[test]
fn a_relative_extra_ca_is_refused_however_the_command_runs() {
    if !require_root("a_relative_extra_ca_is_refused_however_the_command_runs") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dynocap_e2e::netfix::TestCa::for_names(
        dir.path(),
        &[NAME],
        std::net::Ipv4Addr::LOCALHOST,
        "relative path test CA",
    );
    assert_eq!(ca.ca_cert, dir.path().join("ca.pem"));
    let home = TestHome::new().with_env(product::ENV_EXTRA_CA, "ca.pem");
    // The first starts the server; the later ones are served, but for the one told not to.
    for server in ["1", "1", "0", "1"] {
        let out = home
            .command()
            .current_dir(dir.path())
            .env("DYNOCAP_CLI_SERVER", server)
            .args(["--json", "run", "relative", "--network", "filtered"])
            .output()
            .expect("spawn dynocap");
        assert!(!out.status.success(), "server {server}: {out:?}");
        let err: Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(err["error"]["code"], "invalid_argument", "{err:#}");
        assert_eq!(
            err["error"]["message"],
            "DYNOCAP_EXTRA_CA=ca.pem is a relative path, which DynoCap's long-lived processes \
             would read from another directory than yours; give the file's absolute path",
            "server {server}"
        );
    }
    let listed = home.json(&["ps"]);
    assert_eq!(listed["sandboxes"], serde_json::json!([]), "{listed:#}");
}
