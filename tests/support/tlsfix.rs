//! An HTTPS server for names of our choosing (real registry names such as `pypi.org`), with
//! a CA of its own that nothing trusts unless told: for the tests of named registries and of
//! `DYNOCAP_EXTRA_CA` joining the guest's trust store. The netfix fixture's certificate
//! covers only its fixed test names.
//!
//! It runs netfix's own server script on a fresh 127.X.Y.Z:443, serving what netfix's
//! content script makes (an npm package, a PEP 503 index with one wheel), with the index's
//! link made absolute to `https://files.pythonhosted.org/files/...`, as PyPI's are. The
//! server, its files and its CA go on drop. Included by the test files that use it
//! (`#[path]`), so the shared support library stays as it is.

// Each test file including this uses part of it.
#![allow(dead_code)]

use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dynocap_e2e::netfix::{random_loopback, run, TestCa, PACKAGE_VERSION, PYPI_PACKAGE};
use serde_json::Value;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("support/netfix")
        .join(name)
}

/// The server, on `addr`:443, with a certificate for `names`.
pub struct TlsFix {
    pub addr: Ipv4Addr,
    /// The CA (PEM) that signed the server's certificate: what `DYNOCAP_EXTRA_CA` names.
    pub ca_cert: PathBuf,
    log: PathBuf,
    server: Child,
    // Last: the server dies before its files go.
    dir: tempfile::TempDir,
}

impl TlsFix {
    pub fn start(names: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("dctls")
            .tempdir_in("/tmp")
            .expect("fixture dir");
        let path = |name: &str| dir.path().join(name);
        let www = path("www");
        std::fs::create_dir_all(&www).expect("www");
        run(Command::new("python3").arg(script("content.py")).args([
            www.to_str().expect("utf-8"),
            "dynocap-npm-fixture",
            PYPI_PACKAGE,
            PACKAGE_VERSION,
        ]));
        let project = path("www/simple/dynocap-fixture/index.html");
        let page = std::fs::read_to_string(&project).expect("index page");
        std::fs::write(
            &project,
            page.replace("../../files/", "https://files.pythonhosted.org/files/"),
        )
        .expect("index page");
        std::fs::create_dir_all(path("git")).expect("git root");

        let mut failures = Vec::new();
        for _ in 0..5 {
            let addr = random_loopback();
            let ca_cert = make_certificates(dir.path(), names, addr);
            let log = path("https.jsonl");
            let out = std::fs::File::create(path("https.out")).expect("server log");
            let mut server = Command::new("python3")
                .arg(script("https_server.py"))
                .args(["--addr", &addr.to_string()])
                .arg("--cert")
                .arg(path("server.pem"))
                .arg("--key")
                .arg(path("server.key"))
                .arg("--www")
                .arg(&www)
                .arg("--git-root")
                .arg(path("git"))
                .arg("--log")
                .arg(&log)
                .arg("--ready")
                .arg(path("https.ready"))
                .stdin(Stdio::null())
                .stdout(out.try_clone().expect("dup"))
                .stderr(out)
                .process_group(0)
                .spawn()
                .expect("spawn the https server");
            let deadline = Instant::now() + Duration::from_secs(30);
            let listening = loop {
                if server.try_wait().expect("try_wait").is_some() {
                    break false;
                }
                if TcpStream::connect_timeout(&(addr, 443).into(), Duration::from_millis(500))
                    .is_ok()
                {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if listening {
                return Self {
                    addr,
                    ca_cert,
                    log,
                    server,
                    dir,
                };
            }
            kill(&mut server);
            failures.push(std::fs::read_to_string(path("https.out")).unwrap_or_default());
        }
        panic!("the https server did not start: {failures:#?}");
    }

    /// The directory served (`https://NAME/x` is `www/x`).
    pub fn www(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    /// A scratch directory that lives as long as the server.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `DYNOCAP_RESOLVE` sending each of `names` to this server on 443.
    pub fn resolve(&self, names: &[&str]) -> String {
        resolve_to(names, self.addr)
    }

    /// Every request answered: `sni`, `host`, `method`, `path`, `status`.
    pub fn requests(&self) -> Vec<Value> {
        requests_in(&self.log)
    }
}

impl Drop for TlsFix {
    fn drop(&mut self) {
        kill(&mut self.server);
    }
}

/// `DYNOCAP_RESOLVE` sending each of `names` to `addr` on 443.
pub fn resolve_to(names: &[&str], addr: Ipv4Addr) -> String {
    names
        .iter()
        .map(|name| format!("{name}:443:{addr}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The requests a server of `https_server.py` logged to `log` (its other lines skipped).
pub fn requests_in(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|entry| entry.get("path").is_some())
        .collect()
}

/// Kills the process group `server` leads and reaps it.
pub fn kill(server: &mut Child) {
    // SAFETY: kill(2) of the process group this server leads (process_group(0)).
    unsafe {
        libc::kill(-(server.id() as i32), libc::SIGKILL);
    }
    let _ = server.wait();
}

/// A fresh CA, and a server certificate it signs for `names`; returns the CA's path.
fn make_certificates(dir: &Path, names: &[&str], addr: Ipv4Addr) -> PathBuf {
    TestCa::for_names(dir, names, addr, "DynoCap trust store test CA").ca_cert
}
