//! The network fixtures (tests/support/netfix.rs) exercised directly from the host, without
//! DynoCap: curl, git over HTTPS and SSH, npm and pip against them. When these pass, a failing
//! `filtered` test is a product bug, not a fixture bug. Needs root (binds :443 and :22).

use std::path::Path;
use std::process::Command;

use dynocap_e2e::netfix::*;
use dynocap_e2e::*;

/// A command with no proxy settings, CA overrides or user configuration from the environment.
fn clean(program: &str) -> Command {
    let mut cmd = Command::new(program);
    scrub_client_env(&mut cmd);
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
    cmd
}

fn curl(fix: &NetFix, args: &[&str]) -> std::process::Output {
    clean("curl")
        .args(["-sS", "--fail", "--max-time", "60"])
        .args(fix.curl_direct())
        .args(args)
        .output()
        .expect("curl is installed")
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn git_ok(cmd: &mut Command) {
    let out = cmd.output().expect("git is installed");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn assert_is_served_repo(clone: &Path, fix: &NetFix) {
    let head = git(clone, &["rev-parse", "HEAD"]);
    assert_eq!(head.trim(), fix.repo.head);
    for (path, content) in TestRepo::FILES {
        assert_eq!(
            std::fs::read_to_string(clone.join(path)).expect("cloned file"),
            content
        );
    }
}

#[test]
fn https_serves_every_name_with_the_test_ca_and_logs_the_sni() {
    if !require_root("https_serves_every_name_with_the_test_ca_and_logs_the_sni") {
        return;
    }
    let fix = NetFix::start();
    for name in CERT_NAMES {
        let out = curl(&fix, &[&format!("https://{name}/")]);
        assert!(out.status.success(), "{name}: {out:?}");
        assert_eq!(stdout(&out), "dynocap netfix\n");
    }
    let snis: Vec<_> = fix
        .https
        .requests()
        .iter()
        .map(|r| r["sni"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(snis, CERT_NAMES);

    // The chain is real: without the test CA, verification fails.
    let out = clean("curl")
        .args(["-sS", "--noproxy", "*", "--max-time", "30", "--resolve"])
        .arg(format!("{GIT_HOST}:443:{}", fix.addr))
        .arg(format!("https://{GIT_HOST}/"))
        .output()
        .expect("curl");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("certificate"),
        "{out:?}"
    );
    // A name the certificate does not hold fails too.
    let out = clean("curl")
        .args(["-sS", "--noproxy", "*", "--max-time", "30", "--cacert"])
        .arg(&fix.ca.ca_cert)
        .arg("--resolve")
        .arg(format!("unlisted.test:443:{}", fix.addr))
        .arg("https://unlisted.test/")
        .output()
        .expect("curl");
    assert!(!out.status.success(), "{out:?}");
}

#[test]
fn the_large_endpoint_streams_the_size_asked_for() {
    if !require_root("the_large_endpoint_streams_the_size_asked_for") {
        return;
    }
    let fix = NetFix::start();
    let size = 10 * 1024 * 1024 + 7;
    let out = curl(
        &fix,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            &format!("https://{OTHER_HOST}/big/{size}"),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), size.to_string());
    // The benchmark's size is announced without being sent.
    let out = curl(
        &fix,
        &["-I", &format!("https://{OTHER_HOST}/big/{BIG_BYTES}")],
    );
    assert!(
        stdout(&out).contains(&format!("Content-Length: {BIG_BYTES}")),
        "{out:?}"
    );
}

#[test]
fn git_clones_over_https_by_name() {
    if !require_root("git_clones_over_https_by_name") {
        return;
    }
    let fix = NetFix::start();
    let scratch = tempfile::tempdir().expect("tempdir");
    let resolve = format!("{GIT_HOST}:443:{}", fix.addr);
    let ca = fix.ca.ca_cert.display().to_string();
    for (dest, extra) in [("full", vec![]), ("shallow", vec!["--depth", "1"])] {
        git_ok(
            clean("git")
                .args(["-c", &format!("http.sslCAInfo={ca}")])
                .args(["-c", &format!("http.curloptResolve={resolve}")])
                .args(["clone", "-q"])
                .args(&extra)
                .arg(fix.https_repo_url())
                .arg(scratch.path().join(dest)),
        );
        assert_is_served_repo(&scratch.path().join(dest), &fix);
    }
    let branches = git(&scratch.path().join("full"), &["branch", "-r"]);
    assert!(branches.contains("origin/feature"), "{branches}");
    let depth = git(
        &scratch.path().join("shallow"),
        &["rev-list", "--count", "HEAD"],
    );
    assert_eq!(depth.trim(), "1");
    assert!(
        fix.https
            .requests_for(&format!("/{REPO}/git-upload-pack"))
            .iter()
            .all(|r| r["status"] == 200 && r["sni"] == GIT_HOST),
        "{:#?}",
        fix.https.requests()
    );
}

#[test]
fn npm_installs_the_fixture_package_from_the_registry() {
    if !require_root("npm_installs_the_fixture_package_from_the_registry") {
        return;
    }
    let fix = NetFix::start();
    // The metadata points at a tarball under the registry's own name, with matching digests.
    let meta = curl(&fix, &[&format!("https://{NPM_HOST}/{NPM_PACKAGE}")]);
    assert!(meta.status.success(), "{meta:?}");
    let meta: serde_json::Value = serde_json::from_slice(&meta.stdout).expect("JSON metadata");
    let dist = &meta["versions"][PACKAGE_VERSION]["dist"];
    let tarball = dist["tarball"].as_str().expect("dist.tarball");
    assert!(
        tarball.starts_with(&format!("https://{NPM_HOST}/{NPM_PACKAGE}/-/")),
        "{tarball}"
    );
    let scratch = tempfile::tempdir().expect("tempdir");
    let tgz = scratch.path().join("pkg.tgz");
    let out = curl(&fix, &["-o", tgz.to_str().expect("utf-8"), tarball]);
    assert!(out.status.success(), "{out:?}");
    let sha1 = run(Command::new("sha1sum").arg(&tgz));
    assert!(stdout(&sha1).starts_with(dist["shasum"].as_str().expect("shasum")));

    // npm itself, with a throwaway npmrc. Node has no resolve override, so it names the
    // server by address (the certificate holds it); `replace-registry-host=always` makes npm
    // fetch the tarball from that address too instead of looking up registry.npmjs.org.
    let project = scratch.path().join("project");
    write(
        &project.join("package.json"),
        "{\"name\":\"p\",\"version\":\"1.0.0\"}\n",
    );
    let npmrc = scratch.path().join("npmrc");
    write(
        &npmrc,
        &format!(
            "registry=https://{}/\nreplace-registry-host=always\ncache={}\naudit=false\nfund=false\nupdate-notifier=false\n",
            fix.addr,
            scratch.path().join("cache").display()
        ),
    );
    let out = clean("npm")
        .args(["install", "--loglevel=error", NPM_PACKAGE])
        .current_dir(&project)
        .env("npm_config_userconfig", &npmrc)
        .env("npm_config_globalconfig", "/dev/null")
        .env("NODE_EXTRA_CA_CERTS", &fix.ca.ca_cert)
        .env("HOME", scratch.path())
        .output()
        .expect("npm is installed");
    assert!(
        out.status.success(),
        "npm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let installed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(project.join(format!("node_modules/{NPM_PACKAGE}/package.json")))
            .expect("installed package.json"),
    )
    .expect("JSON");
    assert_eq!(installed["version"], PACKAGE_VERSION);
    let lock = std::fs::read_to_string(project.join("package-lock.json")).expect("lock file");
    assert!(lock.contains(dist["integrity"].as_str().expect("integrity")));
}

#[test]
fn pip_downloads_the_fixture_wheel_from_the_index() {
    if !require_root("pip_downloads_the_fixture_wheel_from_the_index") {
        return;
    }
    let fix = NetFix::start();
    let dest = tempfile::tempdir().expect("tempdir");
    // The guest's pip is the system one; use the same here.
    let out = clean("/usr/bin/python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--index-url",
            &format!("https://{}/simple/", fix.addr),
            "--cert",
            fix.ca.ca_cert.to_str().expect("utf-8"),
            "--dest",
            dest.path().to_str().expect("utf-8"),
            PYPI_PACKAGE,
        ])
        .env("PIP_CONFIG_FILE", "/dev/null")
        .output()
        .expect("python3 -m pip (python3-pip)");
    assert!(
        out.status.success(),
        "pip download: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dest.path().join(PYPI_WHEEL).is_file());
    assert_eq!(
        fix.https
            .requests_for(&format!("/files/{PYPI_WHEEL}"))
            .len(),
        1
    );
}

/// `ssh` as git should run it against the fixture: this key, this known_hosts, nothing from
/// the user's configuration.
fn ssh_command(key: &Path, known_hosts: &Path) -> String {
    format!(
        "ssh -F /dev/null -i {} -o IdentitiesOnly=yes -o BatchMode=yes \
         -o UserKnownHostsFile={} -o GlobalKnownHostsFile=/dev/null \
         -o StrictHostKeyChecking=yes -o HostKeyAlias={GIT_HOST}",
        key.display(),
        known_hosts.display()
    )
}

#[test]
fn git_clones_over_ssh_with_the_test_key_and_known_host() {
    if !require_root("git_clones_over_ssh_with_the_test_key_and_known_host") {
        return;
    }
    let fix = NetFix::start();
    let scratch = tempfile::tempdir().expect("tempdir");
    let known_hosts = fix.ssh_home().join(".ssh/known_hosts");
    assert_eq!(
        std::fs::read_to_string(&known_hosts).expect("known_hosts"),
        format!("{GIT_HOST} {}\n", fix.ssh.host_key)
    );
    let by_addr = format!("ssh://{SSH_USER}@{}{}", fix.addr, fix.repo.bare().display());
    let dest = scratch.path().join("clone");
    git_ok(
        clean("git")
            .env("GIT_SSH_COMMAND", ssh_command(&fix.ssh.key, &known_hosts))
            .args(["clone", "-q", &by_addr])
            .arg(&dest),
    );
    assert_is_served_repo(&dest, &fix);
    assert!(
        fix.ssh.log().contains("Accepted publickey"),
        "{}",
        fix.ssh.log()
    );

    // The key runs git only: no shell.
    let out = clean("sh")
        .arg("-c")
        .arg(format!(
            "{} {SSH_USER}@{} id",
            ssh_command(&fix.ssh.key, &known_hosts),
            fix.addr
        ))
        .output()
        .expect("ssh");
    assert!(!out.status.success(), "{out:?}");
    assert!(!stdout(&out).contains("uid="), "{out:?}");

    // Another host key for git.test is refused by ssh itself.
    let wrong = scratch.path().join("wrong_known_hosts");
    let other = scratch.path().join("other_host_key");
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other));
    let other_pub = std::fs::read_to_string(other.with_extension("pub")).expect("pub");
    let other_pub: Vec<_> = other_pub.split_whitespace().take(2).collect();
    write(&wrong, &format!("{GIT_HOST} {}\n", other_pub.join(" ")));
    let out = clean("git")
        .env("GIT_SSH_COMMAND", ssh_command(&fix.ssh.key, &wrong))
        .args(["clone", "-q", &by_addr])
        .arg(scratch.path().join("refused"))
        .output()
        .expect("git");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Host key verification failed"),
        "{out:?}"
    );
}

#[test]
fn the_passphrase_key_is_encrypted_and_the_plain_key_is_not() {
    if !require_root("the_passphrase_key_is_encrypted_and_the_plain_key_is_not") {
        return;
    }
    let fix = NetFix::start();
    let public = |key: &Path, passphrase: &str| {
        Command::new("ssh-keygen")
            .args(["-y", "-P", passphrase, "-f"])
            .arg(key)
            .output()
            .expect("ssh-keygen")
            .status
            .success()
    };
    assert!(public(&fix.ssh.key, ""));
    assert!(!public(&fix.ssh.passphrase_key, ""));
    assert!(public(&fix.ssh.passphrase_key, KEY_PASSPHRASE));
}

#[test]
fn fixtures_get_their_own_addresses_and_die_on_drop() {
    if !require_root("fixtures_get_their_own_addresses_and_die_on_drop") {
        return;
    }
    let (a, b) = (NetFix::start(), NetFix::start());
    assert_ne!(a.addr, b.addr);
    let addr = a.addr;
    let dir = a.dir().to_owned();
    assert!(std::net::TcpStream::connect((addr, 443)).is_ok());
    drop(a);
    for port in [443, 22] {
        assert!(
            std::net::TcpStream::connect((addr, port)).is_err(),
            "{addr}:{port} still answers after drop"
        );
    }
    assert!(!dir.exists());
    // The other fixture is untouched.
    assert!(std::net::TcpStream::connect((b.addr, 443)).is_ok());
    assert!(std::net::TcpStream::connect((b.addr, 22)).is_ok());
}
