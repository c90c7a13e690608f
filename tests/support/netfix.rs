//! Network fixtures for the `filtered` tests and the network benchmark: a test CA, an HTTPS
//! server (static files, an npm registry, a PEP 503 index, git smart HTTP, a large download)
//! and an `sshd` serving the same git repository, all on a fresh loopback address 127.X.Y.Z
//! per fixture so tests run in parallel, each binding :443 and :22. Everything is killed and
//! removed on drop.
//!
//! Traffic rule: these fixtures listen on loopback only, and every name the tests use is
//! resolved through overrides (curl `--resolve`, `DYNOCAP_RESOLVE`), never through DNS: this
//! machine's resolver is not on loopback.
//!
//! The names of the product's interface (environment variables, file names) live in
//! [`product`], so a rename is one edit.

use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The names of the product's network interface the tests rely on, in one place.
pub mod product {
    /// Extra allowed hosts, comma-separated, `*.example.com` wildcards.
    pub const ENV_EGRESS_ALLOW: &str = "DYNOCAP_EGRESS_ALLOW";
    /// Resolve overrides in curl `--resolve` syntax, comma-separated: `host:port:addr`.
    pub const ENV_RESOLVE: &str = "DYNOCAP_RESOLVE";
    /// A PEM file of extra CA certificates the guest trusts.
    pub const ENV_EXTRA_CA: &str = "DYNOCAP_EXTRA_CA";
    /// Every proxy decision, one JSON object a line, in the task's results directory.
    pub const NETWORK_LOG: &str = "network.jsonl";
    /// Where the guest's proxy listens (what HTTPS_PROXY points at).
    pub const GUEST_PROXY: &str = "127.0.0.1:3128";
    /// The CLI flag adding one allowed host.
    pub const FLAG_ALLOW_HOST: &str = "--allow-host";
    /// The CLI flag naming the SSH private key for a `--repo` clone.
    pub const FLAG_SSH_KEY: &str = "--ssh-key";
}

/// The npm registry npm uses by default: allowed in every `filtered` sandbox.
pub const NPM_HOST: &str = "registry.npmjs.org";
/// The git server's name (HTTPS and SSH).
pub const GIT_HOST: &str = "git.test";
/// The Python package index's name.
pub const PYPI_HOST: &str = "pypi.test";
/// A name the certificate covers but no default allowlist holds.
pub const OTHER_HOST: &str = "other.test";
/// Every name the server certificate is valid for.
pub const CERT_NAMES: [&str; 4] = [NPM_HOST, GIT_HOST, PYPI_HOST, OTHER_HOST];

/// The package the npm registry serves (`npm install dynocap-fixture`).
pub const NPM_PACKAGE: &str = "dynocap-fixture";
/// The project the PEP 503 index serves (one wheel).
pub const PYPI_PACKAGE: &str = "dynocap-fixture";
/// The version of both packages.
pub const PACKAGE_VERSION: &str = "1.0.0";
/// The wheel `pip download` fetches.
pub const PYPI_WHEEL: &str = "dynocap_fixture-1.0.0-py3-none-any.whl";
/// The git repository both servers serve, relative to the git root.
pub const REPO: &str = "repo.git";
/// The size of the benchmark's download.
pub const BIG_BYTES: u64 = 200 * 1024 * 1024;
/// The user the SSH server lets in (key only, and only to run git: see `authorized_keys`).
pub const SSH_USER: &str = "root";
/// The passphrase of [`SshServer::passphrase_key`].
pub const KEY_PASSPHRASE: &str = "correct horse battery staple";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("support/netfix")
        .join(name)
}

/// A loopback address no other fixture is likely to hold: 127.X.Y.Z with X >= 1, so never
/// 127.0.0.1 (the guest's own proxy address, and what `localhost` names).
pub fn random_loopback() -> Ipv4Addr {
    let mut bytes = [0u8; 3];
    let mut urandom = std::fs::File::open("/dev/urandom").expect("open /dev/urandom");
    std::io::Read::read_exact(&mut urandom, &mut bytes).expect("read /dev/urandom");
    Ipv4Addr::new(127, 1 + bytes[0] % 254, bytes[1], 1 + bytes[2] % 254)
}

/// Removes what this machine's environment sets for HTTP clients and would override the
/// fixture's settings: proxies, CA bundles (`GIT_SSL_CAINFO` beats `-c http.sslCAInfo`,
/// `PIP_CERT` and `REQUESTS_CA_BUNDLE` beat the test CA) and every `PIP_*` setting
/// (`PIP_FIND_LINKS` would offer wheels from elsewhere).
pub fn scrub_client_env(cmd: &mut Command) {
    const VARS: [&str; 16] = [
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "https_proxy",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
        "GIT_SSL_CAINFO",
        "GIT_SSL_CAPATH",
        "CURL_CA_BUNDLE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSH_COMMAND",
    ];
    for var in VARS {
        cmd.env_remove(var);
    }
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("PIP_")
            || var.to_string_lossy().starts_with("npm_config_")
        {
            cmd.env_remove(var);
        }
    }
}

/// Runs a fixture-building command; panics with its output when it fails.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|err| panic!("spawn {cmd:?}: {err}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A child process in its own process group; the group is killed on drop (sshd's sessions and
/// the HTTPS server's `git http-backend` children go with it).
pub struct Daemon {
    child: Child,
    name: &'static str,
    stderr: PathBuf,
}

impl Daemon {
    fn spawn(name: &'static str, cmd: &mut Command, stderr: PathBuf) -> Self {
        let log = std::fs::File::create(&stderr).expect("create daemon log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {name} ({cmd:?}): {err}"));
        Self {
            child,
            name,
            stderr,
        }
    }

    /// Waits until `addr:port` accepts connections. `Err` with the daemon's output if it
    /// exited first (e.g. the address was taken) or never started listening.
    fn wait_listening(&mut self, addr: Ipv4Addr, port: u16) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Err(format!(
                    "{} exited ({status}): {}",
                    self.name,
                    self.output()
                ));
            }
            if TcpStream::connect_timeout(&(addr, port).into(), Duration::from_millis(500)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} is not listening on {addr}:{port} after 30 s: {}",
                    self.name,
                    self.output()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the daemon has printed `needle`. `Err` with its output if it exited first
    /// or never printed it.
    fn wait_output(&mut self, needle: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.output().contains(needle) {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Err(format!(
                    "{} exited ({status}): {}",
                    self.name,
                    self.output()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not print {needle:?} after 30 s: {}",
                    self.name,
                    self.output()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// What the daemon printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pgid = self.child.id() as i32;
        // SAFETY: kill(2) with a negative pid signals that process group, which is the one
        // this daemon leads (process_group(0) at spawn); no memory is involved.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// A test CA and one server certificate for [`CERT_NAMES`] and the fixture's address.
pub struct TestCa {
    /// The CA certificate (PEM): what `DYNOCAP_EXTRA_CA`, `--cacert`, `NODE_EXTRA_CA_CERTS`
    /// point at.
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TestCa {
    pub fn generate(dir: &Path, addr: Ipv4Addr) -> Self {
        Self::for_names(dir, &CERT_NAMES, addr, "DynoCap network test CA")
    }

    /// A CA called `ca_name` and a server certificate for `names` (the first is its subject)
    /// and `addr`, under `dir` (`ca.pem`, `server.pem`, `server.key`).
    pub fn for_names(dir: &Path, names: &[&str], addr: Ipv4Addr, ca_name: &str) -> Self {
        std::fs::create_dir_all(dir).expect("create pki dir");
        let ca_key = dir.join("ca.key");
        let ca_cert = dir.join("ca.pem");
        let server_key = dir.join("server.key");
        let server_csr = dir.join("server.csr");
        let server_cert = dir.join("server.pem");
        let ext = dir.join("server.ext");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        run(Command::new("openssl")
            .args(["req", "-x509"])
            .args(ec)
            .arg("-keyout")
            .arg(&ca_key)
            .arg("-out")
            .arg(&ca_cert)
            .args(["-days", "30", "-subj", &format!("/CN={ca_name}")])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]));
        run(Command::new("openssl")
            .arg("req")
            .args(ec)
            .arg("-keyout")
            .arg(&server_key)
            .arg("-out")
            .arg(&server_csr)
            .args(["-subj", &format!("/CN={}", names[0])]));
        let sans: Vec<String> = names
            .iter()
            .map(|n| format!("DNS:{n}"))
            .chain([format!("IP:{addr}")])
            .collect();
        std::fs::write(
            &ext,
            format!(
                "subjectAltName={}\nbasicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n\
                 subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
                sans.join(",")
            ),
        )
        .expect("write extensions");
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "30", "-set_serial", "2"])
            .arg("-in")
            .arg(&server_csr)
            .arg("-CA")
            .arg(&ca_cert)
            .arg("-CAkey")
            .arg(&ca_key)
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(&server_cert));
        Self {
            ca_cert,
            server_cert,
            server_key,
        }
    }
}

/// A bare repository with two branches (`main`, `feature`) and two commits on `main`.
pub struct TestRepo {
    /// The git root both servers serve; the repository is `root/REPO`.
    pub root: PathBuf,
    /// The commit `main` points at.
    pub head: String,
}

impl TestRepo {
    /// Files of `main`'s tip, which a clone's tree must hold exactly.
    pub const FILES: [(&'static str, &'static str); 3] = [
        ("README.md", "# served repo\n"),
        ("src/lib.rs", "pub fn served() -> u32 { 7 }\n"),
        ("notes/second.txt", "second commit\n"),
    ];

    pub fn create(root: &Path) -> Self {
        let work = root.with_extension("work");
        std::fs::create_dir_all(&work).expect("create repo work dir");
        let git = |args: &[&str]| crate::git(&work, args);
        git(&["init", "-q", "-b", "main"]);
        for (path, content) in &Self::FILES[..2] {
            crate::write(&work.join(path), content);
        }
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "first"]);
        git(&["checkout", "-q", "-b", "feature"]);
        crate::write(&work.join("feature.txt"), "feature branch\n");
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "feature"]);
        git(&["checkout", "-q", "main"]);
        let (path, content) = Self::FILES[2];
        crate::write(&work.join(path), content);
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "second"]);
        let head = git(&["rev-parse", "HEAD"]).trim().to_owned();
        std::fs::create_dir_all(root).expect("create git root");
        let bare = root.join(REPO);
        crate::git(
            root,
            &[
                "clone",
                "-q",
                "--bare",
                work.to_str().expect("utf-8 temp path"),
                bare.to_str().expect("utf-8 temp path"),
            ],
        );
        // Served over dumb and smart HTTP alike; harmless for smart-only clients.
        crate::git(&bare, &["update-server-info"]);
        std::fs::remove_dir_all(&work).expect("remove repo work dir");
        Self {
            root: root.to_owned(),
            head,
        }
    }

    pub fn bare(&self) -> PathBuf {
        self.root.join(REPO)
    }
}

/// The user `/private/` repositories are served to (HTTP Basic).
pub const PRIVATE_USER: &str = "netfix-user";
/// Its password: a marker that must never be found in what the product keeps or shows.
pub const PRIVATE_TOKEN: &str = "ghp_NetfixS3cretTok3nNeverKept";

/// The HTTPS server (tests/support/netfix/https_server.py) on `addr:443`.
pub struct HttpsServer {
    _daemon: Daemon,
    log: PathBuf,
}

impl HttpsServer {
    fn start(dir: &Path, addr: Ipv4Addr, ca: &TestCa, repo: &TestRepo) -> Result<Self, String> {
        let www = dir.join("www");
        if !www.exists() {
            std::fs::create_dir_all(&www).expect("create www");
            run(Command::new("python3").arg(script("content.py")).args([
                www.to_str().expect("utf-8 temp path"),
                NPM_PACKAGE,
                PYPI_PACKAGE,
                PACKAGE_VERSION,
            ]));
        }
        let log = dir.join("https.jsonl");
        let auth = dir.join("https.auth");
        crate::write(&auth, &format!("{PRIVATE_USER}:{PRIVATE_TOKEN}\n"));
        let mut daemon = Daemon::spawn(
            "https server",
            Command::new("python3")
                .arg(script("https_server.py"))
                .arg("--addr")
                .arg(addr.to_string())
                .arg("--cert")
                .arg(&ca.server_cert)
                .arg("--key")
                .arg(&ca.server_key)
                .arg("--www")
                .arg(&www)
                .arg("--git-root")
                .arg(&repo.root)
                .arg("--log")
                .arg(&log)
                .arg("--ready")
                .arg(dir.join("https.ready"))
                .arg("--auth-file")
                .arg(&auth),
            dir.join("https.out"),
        );
        daemon.wait_listening(addr, 443)?;
        let server = Self {
            _daemon: daemon,
            log,
        };
        // The readiness probe is logged from the connection's thread; wait for it, so a test
        // counting connections does not count it later.
        if !crate::wait_until(10, || !server.failed_connections().is_empty()) {
            return Err("the https server did not log its readiness probe".to_owned());
        }
        Ok(server)
    }

    fn log_entries(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("the server logs JSON lines"))
            .collect()
    }

    /// Every request the server answered, oldest first: `sni`, `host`, `method`, `path`,
    /// `status`.
    pub fn requests(&self) -> Vec<Value> {
        self.log_entries()
            .into_iter()
            .filter(|e| e.get("path").is_some())
            .collect()
    }

    /// Connections that ended without a request (failed TLS handshakes, probes): their errors.
    pub fn failed_connections(&self) -> Vec<String> {
        self.log_entries()
            .iter()
            .filter_map(|e| e["error"].as_str().map(str::to_owned))
            .collect()
    }

    /// Requests whose path starts with `prefix`.
    pub fn requests_for(&self, prefix: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
            .collect()
    }
}

/// `sshd` on `addr:22` with its own host key and configuration, letting the test key in to
/// run git only (`git-shell`).
pub struct SshServer {
    daemon: Daemon,
    /// The client key the server accepts (ed25519, no passphrase).
    pub key: PathBuf,
    /// A key with [`KEY_PASSPHRASE`], also accepted by the server: its refusal must come from
    /// the product, not from the server.
    pub passphrase_key: PathBuf,
    /// The host's public key, `ssh-ed25519 AAAA...`.
    pub host_key: String,
}

impl SshServer {
    pub const SSHD: &'static str = "/usr/sbin/sshd";

    fn start(dir: &Path, addr: Ipv4Addr) -> Result<Self, String> {
        assert!(
            Path::new(Self::SSHD).is_file(),
            "{} is missing: install openssh-server (scripts/install-deps.sh)",
            Self::SSHD
        );
        // sshd's privilege separation needs this directory; Debian's service unit creates it
        // at boot, which never happened in a container.
        std::fs::create_dir_all("/run/sshd").expect("create /run/sshd");
        std::fs::create_dir_all(dir).expect("create ssh dir");
        let keygen = |path: &Path, passphrase: &str, comment: &str| {
            if !path.exists() {
                run(Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", passphrase, "-C", comment, "-f"])
                    .arg(path));
            }
        };
        let host_key_file = dir.join("host_ed25519");
        let key = dir.join("id_ed25519");
        let passphrase_key = dir.join("id_ed25519_passphrase");
        keygen(&host_key_file, "", "netfix-host");
        keygen(&key, "", "netfix-client");
        keygen(&passphrase_key, KEY_PASSPHRASE, "netfix-client-passphrase");
        let public = |path: &Path| {
            let text = std::fs::read_to_string(path.with_extension("pub")).expect("read .pub");
            text.split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        };
        let host_key = public(&host_key_file);
        // Whatever the client asks for, the key only runs git-shell, which only runs
        // git-upload-pack/receive-pack/upload-archive.
        let restrict = r#"restrict,command="git-shell -c \"$SSH_ORIGINAL_COMMAND\"""#;
        std::fs::write(
            dir.join("authorized_keys"),
            format!(
                "{restrict} {}\n{restrict} {}\n",
                public(&key),
                public(&passphrase_key)
            ),
        )
        .expect("write authorized_keys");
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress {addr}:22\n\
                 HostKey {host}\n\
                 PidFile none\n\
                 AuthorizedKeysFile {keys}\n\
                 StrictModes no\n\
                 UsePAM no\n\
                 PermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 AllowUsers {SSH_USER}\n\
                 AllowTcpForwarding no\n\
                 X11Forwarding no\n\
                 PermitTTY no\n\
                 LogLevel VERBOSE\n",
                host = host_key_file.display(),
                keys = dir.join("authorized_keys").display(),
            ),
        )
        .expect("write sshd_config");
        let mut daemon = Daemon::spawn(
            "sshd",
            Command::new(Self::SSHD)
                .arg("-D")
                .arg("-e")
                .arg("-f")
                .arg(&config),
            dir.join("sshd.out"),
        );
        daemon.wait_listening(addr, 22)?;
        // sshd logs the readiness probe's connection from its own child, after the probe
        // returned: tests that count connections must start counting after that line.
        daemon.wait_output("Connection closed by")?;
        Ok(Self {
            daemon,
            key,
            passphrase_key,
            host_key,
        })
    }

    /// The `known_hosts` line for `host` (port 22).
    pub fn known_hosts_line(&self, host: &str) -> String {
        format!("{host} {}\n", self.host_key)
    }

    /// What sshd logged so far (authentications, sessions).
    pub fn log(&self) -> String {
        self.daemon.output()
    }

    /// How many connections sshd accepted so far, its readiness probe included.
    pub fn connections(&self) -> usize {
        self.log().matches("Connection from").count()
    }
}

/// Everything the network tests need, on one fresh loopback address.
pub struct NetFix {
    pub addr: Ipv4Addr,
    pub ca: TestCa,
    pub repo: TestRepo,
    pub https: HttpsServer,
    pub ssh: SshServer,
    // Last: the daemons die before their files go.
    dir: tempfile::TempDir,
}

impl NetFix {
    /// Starts the servers on a random 127.X.Y.Z, retrying on another address if one is taken.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("dcnet")
            .tempdir_in("/tmp")
            .expect("fixture dir");
        let repo = TestRepo::create(&dir.path().join("git"));
        let mut failures = Vec::new();
        for _ in 0..5 {
            let addr = random_loopback();
            let ca = TestCa::generate(&dir.path().join("pki"), addr);
            let https = match HttpsServer::start(dir.path(), addr, &ca, &repo) {
                Ok(https) => https,
                Err(err) => {
                    failures.push(err);
                    continue;
                }
            };
            let ssh = match SshServer::start(&dir.path().join("ssh"), addr) {
                Ok(ssh) => ssh,
                Err(err) => {
                    failures.push(err);
                    continue;
                }
            };
            return Self {
                addr,
                ca,
                repo,
                https,
                ssh,
                dir,
            };
        }
        panic!("no network fixture could start: {failures:#?}");
    }

    /// A scratch directory that lives as long as the fixture.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `host:port:addr` for each (host, port): curl `--resolve` / `DYNOCAP_RESOLVE` entries
    /// pointing at this fixture.
    pub fn resolve_entries(&self, targets: &[(&str, u16)]) -> Vec<String> {
        targets
            .iter()
            .map(|(host, port)| format!("{host}:{port}:{}", self.addr))
            .collect()
    }

    /// Every test name on 443, and `git.test` and `registry.npmjs.org` on 22 (the SSH server
    /// answers for both, so a wrongly allowed SSH connection to a non-git host would succeed).
    pub fn resolve_all(&self) -> String {
        let mut targets: Vec<(&str, u16)> = CERT_NAMES.iter().map(|n| (*n, 443)).collect();
        targets.extend([(GIT_HOST, 22), (NPM_HOST, 22)]);
        self.resolve_entries(&targets).join(",")
    }

    /// curl arguments reaching this fixture under its names directly, without a proxy.
    pub fn curl_direct(&self) -> Vec<String> {
        let mut args = vec![
            "--noproxy".to_owned(),
            "*".to_owned(),
            "--cacert".to_owned(),
            self.ca.ca_cert.display().to_string(),
        ];
        for entry in self.resolve_entries(&CERT_NAMES.map(|n| (n, 443))) {
            args.extend(["--resolve".to_owned(), entry]);
        }
        args
    }

    /// `https://git.test/repo.git`.
    pub fn https_repo_url(&self) -> String {
        format!("https://{GIT_HOST}/{REPO}")
    }

    /// `https://USER:TOKEN@git.test/private/repo.git`: the repository behind Basic
    /// authentication, with `token` as the password.
    pub fn private_repo_url(&self, token: &str) -> String {
        format!("https://{PRIVATE_USER}:{token}@{GIT_HOST}/private/{REPO}")
    }

    /// `https://git.test/dumb/<name>`: a repository of the git root over dumb HTTP only.
    pub fn dumb_repo_url(&self, name: &str) -> String {
        format!("https://{GIT_HOST}/dumb/{name}")
    }

    /// `https://git.test/hang/repo.git`: a server that takes the request and never answers.
    pub fn hanging_repo_url(&self) -> String {
        format!("https://{GIT_HOST}/hang/{REPO}")
    }

    /// `ssh://root@git.test/<git root>/repo.git`.
    pub fn ssh_repo_url(&self) -> String {
        format!("ssh://{SSH_USER}@{GIT_HOST}{}", self.repo.bare().display())
    }

    /// A HOME for the product holding `.ssh/known_hosts` with `git.test`'s host key (the
    /// product reads the host user's known_hosts).
    pub fn ssh_home(&self) -> PathBuf {
        let home = self.dir().join("home");
        crate::write(
            &home.join(".ssh/known_hosts"),
            &self.ssh.known_hosts_line(GIT_HOST),
        );
        home
    }

    /// The environment a `dynocap` command needs to reach this fixture through `filtered`:
    /// resolve overrides for every name and the test CA.
    pub fn product_env(&self) -> Vec<(String, String)> {
        vec![
            (product::ENV_RESOLVE.to_owned(), self.resolve_all()),
            (
                product::ENV_EXTRA_CA.to_owned(),
                self.ca.ca_cert.display().to_string(),
            ),
        ]
    }
}
