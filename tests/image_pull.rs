//! `dynocap image pull` end to end against a real registry: Debian's `docker-registry` (the
//! CNCF distribution registry) on a fresh 127.X address with a test CA, with and without
//! htpasswd authentication, holding images the test makes itself (a static busybox and small
//! layers, written as OCI layouts and pushed with `skopeo copy`). Pull by tag and by digest,
//! a manifest list resolved to linux/amd64, a second image on the same base fetching only its
//! own layer (its files hard links to the base's), credentials refused and read from a Docker
//! config file, Bearer token authentication through a token server of its own
//! (tests/support/token_server.py), registries outside `DYNOCAP_REGISTRIES` refused, a pull
//! killed half-way leaving no image and resuming, hostile layers refused (a huge sparse file by the size
//! bound), a registry that stalls (a Python server that accepts and sends nothing, stops
//! half-way through a blob, or trickles it) ending the pull after `DYNOCAP_PULL_IDLE_TIMEOUT`
//! with nothing half-made and a slow but steady registry completing it, and a pulled image
//! booted in a jail.

use std::io::Write;
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dynocap_e2e::images::{allocated_bytes, store_entries, store_leftovers};
use dynocap_e2e::netfix::{random_loopback, TestCa};
use dynocap_e2e::oci::{
    busybox_path, huge_header_layer, oci_layer, sparse_gnu_layer, sparse_pax_layer, Layer, Layout,
    OciLayer,
};
use dynocap_e2e::{require_root, TestHome};
use serde_json::{json, Value};

const NAME: &str = "registry.test";
/// The token server's name (Bearer authentication), on the registry's address.
const AUTH_NAME: &str = "auth.registry.test";
const AUTH_PORT: u16 = 5001;
const PORT: u16 = 5000;
const USER: &str = "puller";
const PASSWORD: &str = "right-horse-battery";

fn tools_present(test: &str) -> bool {
    let missing: Vec<&str> = [
        "/usr/bin/docker-registry",
        "/usr/bin/skopeo",
        "/usr/bin/htpasswd",
    ]
    .into_iter()
    .filter(|p| !Path::new(p).exists())
    .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs {missing:?} (scripts/install-deps.sh), and CI must have them");
    }
    eprintln!("SKIPPED {test}: needs {missing:?} (scripts/install-deps.sh)");
    false
}

fn base_layer() -> Vec<u8> {
    let busybox = busybox_path().expect("busybox-static (scripts/install-deps.sh)");
    Layer::busybox_root(&busybox)
        .applets(&["sh", "ls", "cat", "echo", "test", "stat", "id"])
        .bytes()
}

/// An image manifest of gzip `layers` for `arch` in `layout`: its descriptor.
fn manifest(layout: &Layout, layers: &[Vec<u8>], arch: &str) -> Value {
    let layers: Vec<OciLayer> = layers.iter().map(|l| oci_layer(l.clone(), true)).collect();
    layout
        .manifest(
            &layers,
            arch,
            json!({"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]}),
        )
        .descriptor
}

/// A layout at `dir` of one amd64 image of gzip `layers`.
fn image(dir: &Path, layers: &[Vec<u8>]) -> Layout {
    let layout = Layout::new(dir);
    let manifest = manifest(&layout, layers, "amd64");
    layout.index(vec![manifest]);
    layout
}

/// A `docker-registry` on a fresh loopback address, TLS with a test CA, htpasswd auth or none.
struct Registry {
    addr: Ipv4Addr,
    ca: TestCa,
    certs: PathBuf,
    auth: bool,
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    fn start(auth: bool) -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("dcreg")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let addr = random_loopback();
        let ca = TestCa::for_names(
            &dir.path().join("pki"),
            &[NAME, AUTH_NAME],
            addr,
            "DynoCap registry test CA",
        );
        // skopeo's certificate directory: every *.crt in it is a CA.
        let certs = dir.path().join("certs");
        std::fs::create_dir_all(&certs).expect("mkdir");
        std::fs::copy(&ca.ca_cert, certs.join("ca.crt")).expect("copy ca");
        let auth_yaml = if auth {
            let out = Command::new("htpasswd")
                .args(["-Bbn", USER, PASSWORD])
                .output()
                .expect("htpasswd");
            assert!(out.status.success());
            std::fs::write(dir.path().join("htpasswd"), &out.stdout).expect("write");
            format!(
                "auth:\n  htpasswd:\n    realm: dynocap-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            )
        } else {
            String::new()
        };
        let child = serve(dir.path(), addr, &ca, &auth_yaml);
        Registry {
            addr,
            ca,
            certs,
            auth,
            child,
            dir,
        }
    }

    /// Serves the same storage again, with `auth_yaml` as its `auth:` section.
    fn restart(&mut self, auth_yaml: &str) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = serve(self.dir.path(), self.addr, &self.ca, auth_yaml);
    }

    /// Pushes the layout (all its manifests) as `repo:tag`; returns the pushed manifest digest.
    fn push(&self, layout: &Layout, repo_tag: &str) -> String {
        let digest_file = layout.dir.join("pushed-digest");
        let mut cmd = Command::new("skopeo");
        cmd.args([
            "copy",
            "--all",
            "--preserve-digests",
            "--quiet",
            "--dest-cert-dir",
        ])
        .arg(&self.certs)
        .arg("--digestfile")
        .arg(&digest_file);
        if self.auth {
            cmd.args(["--dest-creds", &format!("{USER}:{PASSWORD}")]);
        }
        let out = cmd
            .arg(format!("oci:{}", layout.dir.display()))
            .arg(format!("docker://{}:{PORT}/{repo_tag}", self.addr))
            .output()
            .expect("skopeo");
        assert!(
            out.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(digest_file)
            .expect("digest")
            .trim()
            .to_owned()
    }

    /// A home whose pulls may use this registry (by its name, resolved to its address).
    fn home(&self) -> TestHome {
        TestHome::new()
            .with_env("DYNOCAP_REGISTRIES", &format!("{NAME}:{PORT}"))
            .with_env("DYNOCAP_RESOLVE", &format!("{NAME}:{PORT}:{}", self.addr))
            .with_env("DYNOCAP_EXTRA_CA", self.ca.ca_cert.to_str().expect("utf8"))
            // No Docker config of the machine's own.
            .with_env("DOCKER_CONFIG", "/nonexistent")
    }
}

/// Starts `docker-registry` on `addr`:[`PORT`] with its storage in `dir`, TLS from `ca`, and
/// `auth_yaml` (empty: none); returns once it listens.
fn serve(dir: &Path, addr: Ipv4Addr, ca: &TestCa, auth_yaml: &str) -> Child {
    let config = format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
         http:\n  addr: {addr}:{PORT}\n  tls:\n    certificate: {}\n    key: {}\n{auth_yaml}",
        dir.join("data").display(),
        ca.server_cert.display(),
        ca.server_key.display(),
    );
    let config_path = dir.join("config.yml");
    std::fs::write(&config_path, config).expect("write config");
    let child = Command::new("/usr/bin/docker-registry")
        .arg("serve")
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn docker-registry");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect((addr, PORT)).is_err() {
        assert!(Instant::now() < deadline, "the registry did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn reference(repo_tag: &str) -> String {
    format!("{NAME}:{PORT}/{repo_tag}")
}

/// `dynocap --json image pull ARGS` with `password` on its standard input: (success, JSON).
fn pull_with_password(home: &TestHome, args: &[&str], password: &str) -> (bool, Value) {
    let mut child = home
        .command()
        .args(["--json", "image", "pull"])
        .args(args)
        .args(["--username", USER, "--password-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{password}\n").as_bytes())
        .expect("write password");
    let out = child.wait_with_output().expect("wait");
    let value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no JSON: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.success(), value)
}

/// Asserts that the error `err` (the `error` object of a `--json` refusal) says `needle`,
/// showing the whole error when it does not.
fn assert_says(err: &Value, needle: &str) {
    assert!(
        err["message"].as_str().expect("msg").contains(needle),
        "{err:#}"
    );
}

/// Asserts that no file of `home` holds the registry's password: credentials given on the
/// command line or read from a Docker config are used for the pull, never stored.
fn assert_password_not_stored(home: &TestHome) {
    let found = Command::new("grep")
        .args(["-rl", PASSWORD])
        .arg(home.path())
        .output()
        .expect("grep");
    assert!(
        found.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&found.stdout)
    );
}

/// `dynocap --json image pull ARGS` with the failpoint `failpoint` (`NAME=kill`) set: asserts
/// that the pull died of SIGKILL there, as a pull killed half-way by the user or the OOM
/// killer would.
fn pull_killed_at(home: &TestHome, failpoint: &str, args: &[&str]) {
    let out = home
        .command()
        .env("DYNOCAP_FAILPOINTS", failpoint)
        .args(["--json", "image", "pull"])
        .args(args)
        .output()
        .expect("spawn");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn images(home: &TestHome) -> Vec<Value> {
    home.json(&["image", "ls"])["images"]
        .as_array()
        .expect("images")
        .clone()
}

fn rootfs(image: &Value) -> PathBuf {
    Path::new(image["path"].as_str().expect("path")).join("rootfs")
}

#[test]
fn pull_shares_layers_authenticates_and_boots_on_the_jail() {
    let test = "pull_shares_layers_authenticates_and_boots_on_the_jail";
    if !require_root(test) || !tools_present(test) {
        return;
    }
    let registry = Registry::start(true);
    let work = tempfile::tempdir().expect("tempdir");
    let base_layers = vec![
        base_layer(),
        Layer::new()
            .dir("base")
            .file("base/marker", "base\n")
            .bytes(),
    ];
    let mut app_layers = base_layers.clone();
    app_layers.push(
        Layer::new()
            .dir("top")
            .file("top/hello.txt", "from the app layer\n")
            .bytes(),
    );
    registry.push(
        &image(&work.path().join("base"), &base_layers),
        "team/base:1",
    );
    let app_digest = registry.push(&image(&work.path().join("app"), &app_layers), "team/app:1");
    let base_ref = reference("team/base:1");
    let app_ref = reference("team/app:1");

    // A registry the host did not list is refused, the variable named.
    let home = registry.home();
    let err = TestHome::new()
        .with_env("DYNOCAP_REGISTRIES", "other.example")
        .json_err(&["image", "pull", &base_ref]);
    assert_says(&err, "DYNOCAP_REGISTRIES");

    // Anonymous, and a wrong password: refused, saying so; nothing stored.
    let err = home.json_err(&["image", "pull", &base_ref]);
    let message = err["message"].as_str().expect("msg");
    assert!(
        message.contains("credentials") || message.contains("401"),
        "{err:#}"
    );
    let (ok, wrong) = pull_with_password(&home, &[&base_ref], "wrong");
    assert!(!ok, "{wrong:#}");
    assert!(
        wrong["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("credentials"),
        "{wrong:#}"
    );
    assert!(images(&home).is_empty());
    // A Docker config that leaves the registry to a credential helper: the helper is not run,
    // and the refusal names it and the flags to use instead.
    let helper = work.path().join("helper");
    std::fs::create_dir_all(&helper).expect("mkdir");
    std::fs::write(
        helper.join("config.json"),
        json!({"auths": {format!("{NAME}:{PORT}"): {}}, "credsStore": "desktop"}).to_string(),
    )
    .expect("write");
    let out = home
        .command()
        .env("DOCKER_CONFIG", &helper)
        .args(["--json", "image", "pull", &base_ref])
        .output()
        .expect("spawn");
    assert!(!out.status.success());
    let err: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let message = err["error"]["message"].as_str().expect("msg");
    assert!(
        message.contains("docker-credential-desktop") && message.contains("--password-stdin"),
        "{err:#}"
    );

    // The right one on standard input.
    let (ok, base) = pull_with_password(&home, &[&base_ref], PASSWORD);
    assert!(ok, "{base:#}");
    assert_eq!(base["origin"], "pulled", "{base:#}");
    assert_eq!(base["transfer"]["blobsDownloaded"], 2, "{base:#}");
    assert_eq!(base["image"]["name"], base_ref.as_str(), "{base:#}");
    assert_eq!(base["image"]["source"]["format"], "registry", "{base:#}");

    // The app, with credentials from a Docker config file: only its own layer is fetched.
    let docker = work.path().join("docker");
    std::fs::create_dir_all(&docker).expect("mkdir");
    let auth = base64_encode(format!("{USER}:{PASSWORD}").as_bytes());
    std::fs::write(
        docker.join("config.json"),
        json!({"auths": {format!("{NAME}:{PORT}"): {"auth": auth}}}).to_string(),
    )
    .expect("write");
    let home = home.with_env("DOCKER_CONFIG", docker.to_str().expect("utf8"));
    let app = home.json(&["image", "pull", &app_ref]);
    assert_eq!(app["transfer"]["blobsDownloaded"], 1, "{app:#}");
    assert_eq!(app["transfer"]["layersPresent"], 2, "{app:#}");
    // The base's files are the same inodes in both images: stored once.
    let ino = |image: &Value, path: &str| {
        std::fs::metadata(rootfs(image).join(path))
            .expect("stat")
            .ino()
    };
    assert_eq!(
        ino(&base["image"], "bin/busybox"),
        ino(&app["image"], "bin/busybox")
    );
    let listed = images(&home);
    assert_eq!(listed.len(), 2, "{listed:#?}");
    for image in &listed {
        assert!(
            image["sharedBytes"].as_u64().expect("shared") > 500_000,
            "{image:#}"
        );
    }
    let table = String::from_utf8(home.run(&["image", "ls"]).stdout).expect("utf8");
    assert!(
        table.contains(&format!("pulled {app_ref}")) && table.contains("SHARED"),
        "{table}"
    );
    // Nothing of the credentials is in the store.
    assert_password_not_stored(&home);

    // By digest, under a name of its own: nothing downloaded again.
    let by_digest = home.json(&[
        "image",
        "pull",
        &format!("{NAME}:{PORT}/team/app@{app_digest}"),
        "--name",
        "app",
    ]);
    assert_eq!(by_digest["transfer"]["blobsDownloaded"], 0, "{by_digest:#}");
    assert_eq!(by_digest["image"]["name"], "app");

    // Booted in a jail by its reference.
    let info = home.sandbox("box", &["--image", &app_ref, "--backend", "jail"]);
    assert_eq!(info["image"], app_ref.as_str(), "{info:#}");
    assert_eq!(
        home.sh("box", "cat /top/hello.txt /base/marker"),
        "from the app layer\nbase\n"
    );
    assert_eq!(
        home.sh(
            "box",
            "/usr/local/bin/sudo sh -c 'echo new > /base/marker' 2>&1; cat /base/marker"
        ),
        "new\n"
    );
    // The guest's write went to its own layer: the shared file is as it was.
    assert_eq!(
        std::fs::read_to_string(rootfs(&base["image"]).join("base/marker")).expect("read"),
        "base\n"
    );
    let err = home.json_err(&["image", "rm", &app_ref]);
    assert_says(&err, "in use");
    home.json(&["destroy", "box"]);

    // Removing images frees the layers nothing else uses.
    let layers = home.path().join("images/.store/layers/sha256");
    let count = || std::fs::read_dir(&layers).expect("layers").count();
    assert_eq!(count(), 3);
    home.json(&["image", "rm", "app"]);
    home.json(&["image", "rm", &app_ref]);
    assert_eq!(count(), 2, "the app's own layer is freed, the base's kept");
    home.json(&["image", "rm", &base_ref]);
    assert_eq!(count(), 0);
}

fn base64_encode(data: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn a_manifest_list_resolves_to_amd64_and_a_killed_pull_resumes() {
    let test = "a_manifest_list_resolves_to_amd64_and_a_killed_pull_resumes";
    if !require_root(test) || !tools_present(test) {
        return;
    }
    let registry = Registry::start(false);
    let work = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(&work.path().join("multi"));
    let arm = manifest(
        &layout,
        &[Layer::new().file("arch", "arm64\n").bytes()],
        "arm64",
    );
    let amd = manifest(
        &layout,
        &[
            base_layer(),
            Layer::new().file("arch", "amd64\n").bytes(),
            Layer::new().file("extra", "x\n").bytes(),
        ],
        "amd64",
    );
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [arm, amd],
    }))
    .expect("json");
    let index_hex = layout.put(&index);
    layout.index(vec![
        json!({"mediaType": "application/vnd.oci.image.index.v1+json",
                             "digest": format!("sha256:{index_hex}"), "size": index.len()}),
    ]);
    registry.push(&layout, "team/multi:1");
    let multi = reference("team/multi:1");
    let home = registry.home();

    // Killed once layer 2's blob is stored: no image, no half-written blob; the next pull
    // uses what was finished and completes.
    pull_killed_at(&home, "image.pull.layer2=kill", &[&multi]);
    assert!(images(&home).is_empty(), "a killed pull lists nothing");
    let blobs = home.path().join("images/.store/blobs/sha256");
    assert!(
        std::fs::read_dir(&blobs).expect("blobs").count() >= 1,
        "layer 2's blob is kept"
    );
    let pulled = home.json(&["image", "pull", &multi]);
    let t = &pulled["transfer"];
    assert!(t["blobsResumed"].as_u64().expect("n") >= 1, "{pulled:#}");
    assert_eq!(
        t["blobsResumed"].as_u64().expect("n")
            + t["blobsDownloaded"].as_u64().expect("n")
            + t["layersPresent"].as_u64().expect("n"),
        3,
        "{pulled:#}"
    );
    assert_eq!(
        std::fs::read_dir(&blobs).expect("blobs").count(),
        0,
        "unpacked blobs are let go"
    );
    let partials: Vec<_> = std::fs::read_dir(home.path().join("images/.store/blobs"))
        .expect("blobs")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".partial"))
        .collect();
    assert!(partials.is_empty(), "{partials:?}");
    let root = rootfs(&pulled["image"]);
    assert_eq!(
        std::fs::read_to_string(root.join("arch")).expect("arch"),
        "amd64\n"
    );
    assert!(root.join("extra").is_file() && root.join("bin/busybox").is_file());

    // Killed with every layer stored and the image assembled, just before the rename that
    // installs it: nothing more is listed, and the next pull installs it from the stored
    // layers alone, leaving no build directory behind.
    pull_killed_at(
        &home,
        "image.pull.install=kill",
        &["--name", "again", &multi],
    );
    assert_eq!(images(&home).len(), 1, "a killed install lists nothing new");
    let again = home.json(&["image", "pull", "--name", "again", &multi]);
    let t = &again["transfer"];
    assert_eq!(t["layersPresent"], 3, "{again:#}");
    assert_eq!(t["blobsDownloaded"], 0, "{again:#}");
    assert_eq!(images(&home).len(), 2);
    let entries = store_entries(&home, "again");
    assert_eq!(entries.len(), 1, "only the installed image: {entries:?}");
    assert!(store_leftovers(&home).is_empty());
}

#[test]
fn hostile_layers_from_a_registry_are_refused_or_neutralised() {
    let test = "hostile_layers_from_a_registry_are_refused_or_neutralised";
    if !require_root(test) || !tools_present(test) {
        return;
    }
    let registry = Registry::start(false);
    let work = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let home = registry.home();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("traversal", Layer::new().file("../escape", "x").bytes()),
        (
            "whiteout-dotdot",
            Layer::new().dir("a").file("a/.wh...", "").bytes(),
        ),
        (
            "symlinked-parent",
            Layer::new()
                .entry(
                    tar::EntryType::Symlink,
                    "d",
                    outside.path().to_str().expect("utf8"),
                    0o777,
                    b"",
                )
                .file("d/x", "x")
                .bytes(),
        ),
    ];
    for (what, layer) in cases {
        registry.push(
            &image(&work.path().join(what), &[base_layer(), layer]),
            &format!("evil/{what}:1"),
        );
        let err = home.json_err(&["image", "pull", &reference(&format!("evil/{what}:1"))]);
        assert!(
            !err["message"].as_str().expect("msg").is_empty(),
            "{what}: {err:#}"
        );
    }
    assert_eq!(std::fs::read_dir(outside.path()).expect("ls").count(), 0);
    assert!(!home.path().join("images/.store/escape").exists());
    assert!(images(&home).is_empty());
    // Files far larger than the bound on an image's size, in a few KiB of layer: refused by
    // the bound, naming it, before anything of them is written.
    let bombs: Vec<(&str, Vec<u8>)> = vec![
        ("huge-header", huge_header_layer("huge", 1 << 40)),
        ("sparse-gnu", sparse_gnu_layer("sparse", 1 << 40)),
        ("sparse-pax", sparse_pax_layer("sparse", 1 << 40)),
    ];
    for (what, layer) in bombs {
        registry.push(
            &image(&work.path().join(what), &[base_layer(), layer]),
            &format!("evil/{what}:1"),
        );
        let err = home.json_err(&["image", "pull", &reference(&format!("evil/{what}:1"))]);
        assert!(
            err["message"]
                .as_str()
                .expect("msg")
                .contains("--max-bytes"),
            "{what}: {err:#}"
        );
        assert!(images(&home).is_empty(), "{what}");
        let leftovers = store_leftovers(&home);
        assert!(leftovers.is_empty(), "{what}: {leftovers:?}");
    }
    let used = allocated_bytes(home.path());
    assert!(used < 64 << 20, "the home takes {used} bytes");
    // A device node and a set-id file are left out and cleared, and said so.
    let devices = Layer::new()
        .dir("dev")
        .entry(tar::EntryType::Char, "dev/evil", "", 0o666, b"")
        .entry(tar::EntryType::Regular, "suid", "", 0o4755, b"#!/bin/sh\n")
        .bytes();
    registry.push(
        &image(&work.path().join("dev"), &[base_layer(), devices]),
        "evil/dev:1",
    );
    let pulled = home.json(&["image", "pull", &reference("evil/dev:1")]);
    assert_eq!(pulled["stats"]["devicesSkipped"], 1, "{pulled:#}");
    assert_eq!(pulled["stats"]["setidCleared"], 1, "{pulled:#}");
    let root = rootfs(&pulled["image"]);
    assert!(!root.join("dev/evil").exists());
    assert_eq!(
        std::fs::metadata(root.join("suid")).expect("stat").mode() & 0o7777,
        0o755
    );
}

/// `tests/support/stalling_registry.py` on a fresh loopback address, port [`PORT`]: `silent`
/// (accepts, sends nothing) or `blob` (serves `layout` over TLS but stops half-way through blob
/// `stall`).
struct StallingRegistry {
    addr: Ipv4Addr,
    child: Child,
}

impl Drop for StallingRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl StallingRegistry {
    fn start(args: &[&str]) -> StallingRegistry {
        let addr = random_loopback();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("support/stalling_registry.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(args[0])
            .arg(addr.to_string())
            .arg(PORT.to_string())
            .args(&args[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect((addr, PORT)).is_err() {
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!("the stalling registry exited: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the stalling registry did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        StallingRegistry { addr, child }
    }
}

/// Bytes gzip cannot shrink, so that half a blob is half its content.
fn noise(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_u32;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}

/// `dynocap --json image pull REF` with `env` on top of the home's: (success, JSON, how long).
fn pull_with(home: &TestHome, reference: &str, env: &[(&str, &str)]) -> (bool, Value, Duration) {
    let started = Instant::now();
    let out = home
        .command()
        .envs(env.iter().copied())
        .args(["--json", "image", "pull", reference])
        .output()
        .expect("spawn");
    let took = started.elapsed();
    let value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no JSON: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.success(), value, took)
}

#[test]
fn a_stalled_registry_ends_the_pull_and_a_healthy_one_completes_it() {
    let test = "a_stalled_registry_ends_the_pull_and_a_healthy_one_completes_it";
    if !require_root(test) || !tools_present(test) {
        return;
    }
    let registry = Registry::start(false);
    let work = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(&work.path().join("stall"));
    let layers: Vec<OciLayer> = [
        base_layer(),
        Layer::new().file("small", "small\n").bytes(),
        Layer::new()
            .entry(
                tar::EntryType::Regular,
                "noise",
                "",
                0o644,
                &noise(512 << 10),
            )
            .bytes(),
    ]
    .into_iter()
    .map(|l| oci_layer(l, true))
    .collect();
    let manifest = layout.manifest(
        &layers,
        "amd64",
        json!({"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]}),
    );
    let stalled_blob = format!("sha256:{}", manifest.layer_digests[2]);
    layout.index(vec![manifest.descriptor]);
    registry.push(&layout, "team/stall:1");
    let stall_ref = reference("team/stall:1");
    let home = registry.home().with_env("DYNOCAP_PULL_IDLE_TIMEOUT", "2");
    let resolve_to = |addr: Ipv4Addr| format!("{NAME}:{PORT}:{addr}");
    let nothing_half_made = |what: &str| {
        assert!(images(&home).is_empty(), "{what}: an image is listed");
        let leftovers = store_leftovers(&home);
        assert!(leftovers.is_empty(), "{what}: {leftovers:?}");
    };
    // A pull from a registry that stalls: it fails, and well before the 20 s it could wait.
    let failed_pull = |addr: Ipv4Addr| {
        let (ok, out, took) =
            pull_with(&home, &stall_ref, &[("DYNOCAP_RESOLVE", &resolve_to(addr))]);
        assert!(!ok, "{out:#}");
        assert!(took < Duration::from_secs(20), "the pull took {took:?}");
        out
    };

    // Accepts the connection and sends nothing (not even its TLS handshake).
    let silent = StallingRegistry::start(&["silent"]);
    let out = failed_pull(silent.addr);
    let message = out["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("sent nothing for 2 s") && message.contains("DYNOCAP_PULL_IDLE_TIMEOUT"),
        "{out:#}"
    );
    nothing_half_made("silent");

    // Serves the manifest, the config and two layers, then stops half-way through the third.
    let certs = &registry.ca;
    let stalling = StallingRegistry::start(&[
        "blob",
        certs.server_cert.to_str().expect("utf8"),
        certs.server_key.to_str().expect("utf8"),
        layout.dir.to_str().expect("utf8"),
        &stalled_blob,
    ]);
    let out = failed_pull(stalling.addr);
    let message = out["error"]["message"].as_str().expect("message");
    assert!(
        message.contains(&stalled_blob) && message.contains("sent nothing for 2 s"),
        "{out:#}"
    );
    nothing_half_made("mid-blob");
    let blobs = home.path().join("images/.store/blobs/sha256");
    assert!(
        !blobs.join(&manifest.layer_digests[2]).exists(),
        "the stalled blob is not kept as if whole"
    );
    let layers_dir = home.path().join("images/.store/layers/sha256");
    for layer in std::fs::read_dir(&layers_dir).expect("layers").flatten() {
        assert!(
            layer.path().join("layer.json").is_file(),
            "{}: a layer in the store is whole",
            layer.path().display()
        );
    }

    // Sends the third layer a hundred bytes a second: alive to every read, too slow to go
    // on with; the error says how slow and what to raise.
    let blob_from = |rate: &str| {
        StallingRegistry::start(&[
            "blob",
            certs.server_cert.to_str().expect("utf8"),
            certs.server_key.to_str().expect("utf8"),
            layout.dir.to_str().expect("utf8"),
            &stalled_blob,
            rate,
        ])
    };
    let trickling = blob_from("100");
    let out = failed_pull(trickling.addr);
    let message = out["error"]["message"].as_str().expect("message");
    assert!(
        message.contains(&stalled_blob)
            && message.contains(NAME)
            && message.contains("bytes/s")
            && message.contains("raise DYNOCAP_PULL_IDLE_TIMEOUT (now 2 s)"),
        "{out:#}"
    );
    nothing_half_made("trickle");
    drop(trickling);

    // Slow but steady (200 kB/s, the floor being 64 KiB per 2 s): the pull completes, from
    // the layers finished before.
    let steady = blob_from("200000");
    let (ok, pulled, _) = pull_with(
        &home,
        &stall_ref,
        &[("DYNOCAP_RESOLVE", &resolve_to(steady.addr))],
    );
    assert!(ok, "{pulled:#}");
    let t = &pulled["transfer"];
    assert!(t["layersPresent"].as_u64().expect("n") >= 1, "{pulled:#}");
    assert!(t["blobsDownloaded"].as_u64().expect("n") >= 1, "{pulled:#}");
    assert_eq!(
        t["layersPresent"].as_u64().expect("n")
            + t["blobsDownloaded"].as_u64().expect("n")
            + t["blobsResumed"].as_u64().expect("n"),
        3,
        "{pulled:#}"
    );
    let root = rootfs(&pulled["image"]);
    assert_eq!(
        std::fs::read(root.join("noise")).expect("noise"),
        noise(512 << 10)
    );
    assert_eq!(images(&home).len(), 1);
    assert!(store_leftovers(&home).is_empty());

    // A registry that sends a layer's download to a plain-HTTP address (an internal
    // service, say): the pull never connects there, whatever host it names, and says why.
    let internal = random_loopback();
    let listener = std::net::TcpListener::bind((internal, 8080)).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let redirecting = StallingRegistry::start(&[
        "redirect",
        certs.server_cert.to_str().expect("utf8"),
        certs.server_key.to_str().expect("utf8"),
        layout.dir.to_str().expect("utf8"),
        &stalled_blob,
        &format!("http://{internal}:8080/latest/meta-data"),
    ]);
    let fresh = registry.home();
    let (ok, out, _) = pull_with(
        &fresh,
        &stall_ref,
        &[("DYNOCAP_RESOLVE", &resolve_to(redirecting.addr))],
    );
    assert!(!ok, "{out:#}");
    let message = out["error"]["message"].as_str().expect("message");
    assert!(
        message.contains(&format!("http://{internal}:8080, over plain HTTP")),
        "{out:#}"
    );
    assert!(
        listener
            .accept()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "the pull connected to the plain-HTTP address"
    );
    assert!(images(&fresh).is_empty() && store_leftovers(&fresh).is_empty());
    drop(redirecting);

    // A value that is not whole seconds is refused, naming the variable.
    let err = home
        .with_env("DYNOCAP_PULL_IDLE_TIMEOUT", "soon")
        .json_err(&["image", "pull", &stall_ref]);
    assert_says(&err, "DYNOCAP_PULL_IDLE_TIMEOUT");
}

/// What a user gets wrong is told with its fix, and a recipe builds on a pulled base: a tag
/// the registry lacks is `not_found` naming the reference, a list of arm64 images only says
/// it has none for linux/amd64, a registry of a CA not given names `DYNOCAP_EXTRA_CA` and one
/// not answering at its address names `DYNOCAP_RESOLVE`; `debian`, `auto` and `host` name
/// no pulled image (each already means another one where an image is chosen); a task on an
/// image without git is refused before anything is made, naming git and the raw sandbox that
/// needs none, and one whose project names that image (`--image auto`) starts on the default
/// image, its note saying why; `run --image auto` says it is for a task's project. A recipe on the pulled base
/// runs its step in a jail of it and makes a layer of what the step wrote, none of DynoCap's
/// own files (`/run/dynocap`, where the agent's sudo socket is) among it.
#[test]
fn mistakes_are_told_with_the_fix_and_a_recipe_builds_on_a_pulled_base() {
    let test = "mistakes_are_told_with_the_fix_and_a_recipe_builds_on_a_pulled_base";
    if !require_root(test) || !tools_present(test) {
        return;
    }
    let registry = Registry::start(false);
    let work = tempfile::tempdir().expect("tempdir");
    registry.push(
        &image(&work.path().join("base"), &[base_layer()]),
        "team/base:1",
    );
    let base_ref = reference("team/base:1");
    let home = registry.home().with_env("DYNOCAP_CACHES", "0");

    let err = home.json_err(&["image", "pull", &reference("team/base:nope")]);
    assert_eq!(err["code"], "not_found", "{err:#}");
    let message = err["message"].as_str().expect("msg");
    assert!(
        message.contains(&format!("has no image {}", reference("team/base:nope")))
            && message.contains("tag"),
        "{err:#}"
    );
    // A registry whose CA the host did not give, and one that does not answer at the address
    // its name resolves to: each says what to set.
    let pull_err = |var: &str, value: &str| -> String {
        let out = home
            .command()
            .env(var, value)
            .args(["--json", "image", "pull", &base_ref])
            .output()
            .expect("spawn");
        assert!(!out.status.success());
        let err: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        err["error"]["message"].as_str().expect("msg").to_owned()
    };
    let message = pull_err("DYNOCAP_EXTRA_CA", "");
    assert!(
        message.contains("certificate") && message.contains("set DYNOCAP_EXTRA_CA"),
        "{message}"
    );
    let closed = random_loopback();
    let message = pull_err("DYNOCAP_RESOLVE", &format!("{NAME}:{PORT}:{closed}"));
    assert!(
        message.contains(&format!("could not connect to {NAME}:{PORT}"))
            && message.contains("DYNOCAP_RESOLVE"),
        "{message}"
    );
    // A list of platforms without linux/amd64 is no unknown image: it says what it lacks
    // and the platforms it has.
    let layout = Layout::new(&work.path().join("arm"));
    let arm = manifest(
        &layout,
        &[Layer::new().file("arch", "arm64\n").bytes()],
        "arm64",
    );
    let list = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [arm],
    }))
    .expect("json");
    let list_hex = layout.put(&list);
    layout.index(vec![json!({
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "digest": format!("sha256:{list_hex}"), "size": list.len()
    })]);
    registry.push(&layout, "team/arm:1");
    let err = home.json_err(&["image", "pull", &reference("team/arm:1")]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    assert_says(&err, "(linux/arm64), none for linux/amd64");
    // Docker's short forms and a missing tag are told as the reference to write.
    for (short, full) in [
        ("debian:12", "docker.io/library/debian:12"),
        ("team/tool:1", "docker.io/team/tool:1"),
    ] {
        let err = home.json_err(&["image", "pull", short]);
        assert_eq!(err["code"], "invalid_argument", "{err:#}");
        assert_says(&err, full);
    }
    let untagged = reference("team/arm");
    let err = home.json_err(&["image", "pull", &untagged]);
    assert_says(&err, &format!("{untagged}:latest"));
    // A registry named without a dot but with a port (a compose service) is one, as Docker
    // reads it: this one is refused only for not being in the variable.
    let err = home.json_err(&["image", "pull", "registry:5000/team/tool:1"]);
    assert_says(&err, "registry registry:5000 is not in DYNOCAP_REGISTRIES");
    for name in ["debian", "auto", "host"] {
        let err = home.json_err(&["image", "pull", &base_ref, "--name", name]);
        assert_eq!(err["code"], "invalid_argument", "{err:#}");
        let message = err["message"].as_str().expect("msg");
        assert!(
            message.contains("already means") && message.contains("--name"),
            "{name}: {err:#}"
        );
    }
    assert!(images(&home).is_empty());
    home.json(&["image", "pull", &base_ref]);

    let project = dynocap_e2e::one_commit_project("README.md", "hi\n");
    let path = project.path().to_str().expect("utf8");
    let err = home.json_err(&[
        "task",
        "start",
        path,
        "--image",
        &base_ref,
        "--disk-mb",
        "128",
    ]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    let message = err["message"].as_str().expect("msg");
    assert!(
        message.contains("has no git")
            && message.contains(&format!("dynocap run --image {base_ref}")),
        "{err:#}"
    );
    let listed = home.json(&["ls"]);
    assert_eq!(listed["tasks"], json!([]), "{listed:#}");
    assert_eq!(listed["sandboxes"], json!([]), "{listed:#}");
    home.assert_only_sandbox_dirs(&[]);
    // Named by the project instead (`--image auto`): the task starts on the default image, and
    // its note says why.
    let dot = project.path().join(".devcontainer");
    std::fs::create_dir(&dot).expect("mkdir");
    std::fs::write(
        dot.join("devcontainer.json"),
        json!({ "image": base_ref }).to_string(),
    )
    .expect("write");
    let task = home.json(&[
        "task",
        "start",
        path,
        "--image",
        "auto",
        "--name",
        "dc",
        "--disk-mb",
        "128",
    ]);
    assert_eq!(task["image"], "host", "{task:#}");
    let note = task["imageNote"].as_str().expect("imageNote");
    assert!(
        note.contains(&base_ref) && note.contains("no git"),
        "{task:#}"
    );
    home.json(&["rm", "dc", "--force", "--purge"]);
    let err = home.json_err(&["run", "x", "--image", "auto", "--disk-mb", "128"]);
    assert_says(&err, "task start");

    let err = home.json_err(&[
        "image", "build", "auto", "--from", &base_ref, "--run", "true",
    ]);
    assert_says(&err, "already means");
    let out = home.run(&[
        "image",
        "build",
        "tool",
        "--from",
        &base_ref,
        "--run",
        "echo built > /built",
        "--disk-mb",
        "128",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("left out"),
        "nothing of the step was left out: {stderr}"
    );
    let tool = images(&home)
        .into_iter()
        .find(|i| i["name"] == "tool")
        .expect("the built image is listed");
    assert_eq!(tool["source"]["format"], "recipe", "{tool:#}");
    let root = rootfs(&tool);
    assert_eq!(
        std::fs::read_to_string(root.join("built")).expect("the step's file"),
        "built\n"
    );
    assert!(
        !root.join("run/dynocap").exists(),
        "DynoCap's own directory is no part of it"
    );
    home.sandbox(
        "box",
        &["--image", "tool", "--backend", "jail", "--disk-mb", "128"],
    );
    assert_eq!(home.sh("box", "cat /built"), "built\n");
    home.json(&["destroy", "box"]);
}

/// `tests/support/token_server.py` on the registry's address, port [`AUTH_PORT`]: Bearer
/// tokens signed with a key of its own, for `user`:`password` (anything) or anonymous (`pull`
/// under `pub/` only).
struct TokenServer {
    child: Child,
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn token_authentication_pulls_public_and_private_repositories() {
    let test = "token_authentication_pulls_public_and_private_repositories";
    if !require_root(test) || !tools_present(test) {
        return;
    }
    // The images go in with no authentication (skopeo would have to find the token server by
    // its name, which only DynoCap's DYNOCAP_RESOLVE knows); then the same storage is served
    // behind token authentication, as Docker Hub and most registries are.
    let mut registry = Registry::start(false);
    let work = tempfile::tempdir().expect("tempdir");
    let layout = image(&work.path().join("tool"), &[base_layer()]);
    registry.push(&layout, "pub/tool:1");
    registry.push(&layout, "team/tool:1");
    let signer_key = work.path().join("signer.key");
    let signer_cert = work.path().join("signer.pem");
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout"])
        .arg(&signer_key)
        .arg("-out")
        .arg(&signer_cert)
        .args(["-days", "2", "-subj", "/CN=dynocap test token signer"])
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    registry.restart(&format!(
        "auth:\n  token:\n    realm: https://{AUTH_NAME}:{AUTH_PORT}/token\n    service: {NAME}\n    \
         issuer: dynocap-test\n    rootcertbundle: {}\n",
        signer_cert.display()
    ));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("support/token_server.py");
    let _tokens = TokenServer {
        child: Command::new("python3")
            .arg(script)
            .arg(registry.addr.to_string())
            .arg(AUTH_PORT.to_string())
            .arg(&registry.ca.server_cert)
            .arg(&registry.ca.server_key)
            .arg(&signer_key)
            .arg(&signer_cert)
            .args([NAME, USER, PASSWORD])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect((registry.addr, AUTH_PORT)).is_err() {
        assert!(Instant::now() < deadline, "the token server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let both = |home: TestHome| {
        home.with_env(
            "DYNOCAP_RESOLVE",
            &format!(
                "{NAME}:{PORT}:{addr},{AUTH_NAME}:{AUTH_PORT}:{addr}",
                addr = registry.addr
            ),
        )
    };
    let home = both(registry.home());

    // The token server is another host: outside DYNOCAP_REGISTRIES the pull is refused,
    // naming it.
    let err = home.json_err(&["image", "pull", &reference("pub/tool:1")]);
    assert_says(&err, &format!("needed {AUTH_NAME}:{AUTH_PORT}"));
    let home = home.with_env(
        "DYNOCAP_REGISTRIES",
        &format!("{NAME}:{PORT},{AUTH_NAME}:{AUTH_PORT}"),
    );
    // Anonymous: a token for the public repository; none that opens the private one.
    let public = home.json(&["image", "pull", &reference("pub/tool:1")]);
    assert_eq!(public["origin"], "pulled", "{public:#}");
    let err = home.json_err(&["image", "pull", &reference("team/tool:1")]);
    assert_says(&err, "credentials");
    let (ok, wrong) = pull_with_password(&home, &[&reference("team/tool:1")], "wrong");
    assert!(!ok, "{wrong:#}");
    // The right password gets the token server's token, and the pull.
    let (ok, private) = pull_with_password(&home, &[&reference("team/tool:1")], PASSWORD);
    assert!(ok, "{private:#}");
    assert_eq!(private["transfer"]["layersPresent"], 1, "{private:#}");
    assert_password_not_stored(&home);
    home.sandbox(
        "box",
        &["--image", &reference("team/tool:1"), "--disk-mb", "64"],
    );
    assert_eq!(
        home.sh("box", "echo from the private image"),
        "from the private image\n"
    );
    home.json(&["destroy", "box"]);
}

/// `dynocap run` and `task start` pull an `--image` reference the host lacks (`--pull
/// missing`, the default), with the pull's progress on stderr; `--pull never` keeps the error
/// that says how to pull it; `--pull always` pulls again and boots the tag's new image; a
/// registry `DYNOCAP_REGISTRIES` does not allow is refused naming it, and a name that is no
/// reference is never pulled.
#[test]
fn run_and_task_start_pull_a_missing_reference() {
    let test = "run_and_task_start_pull_a_missing_reference";
    if !require_root(test) || !tools_present(test) {
        return;
    }
    let registry = Registry::start(false);
    let work = tempfile::tempdir().expect("tempdir");
    let version = |v: &str| {
        vec![
            base_layer(),
            Layer::new()
                .dir("release")
                .file("release/version", &format!("{v}\n"))
                .bytes(),
        ]
    };
    let first = registry.push(
        &image(&work.path().join("v1"), &version("one")),
        "team/tool:1",
    );
    let tool = reference("team/tool:1");
    let home = registry.home();
    let run = |name: &str, extra: &[&str]| {
        home.command()
            .args(["--json", "run", name, "--image", &tool, "--backend", "jail"])
            .args(extra)
            .output()
            .expect("run")
    };

    let never = run("never", &["--pull", "never"]);
    assert!(!never.status.success());
    let err: Value = serde_json::from_slice(&never.stdout).expect("json");
    assert_says(&err["error"], "not on this host");
    assert_says(&err["error"], &format!("dynocap image pull {tool}"));
    assert!(images(&home).is_empty(), "--pull never pulls nothing");

    let pulled = run("box", &[]);
    let stderr = String::from_utf8_lossy(&pulled.stderr);
    assert!(pulled.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("pulling {tool}")), "{stderr}");
    assert_eq!(home.sh("box", "cat /release/version"), "one\n");
    let listed = images(&home);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["source"]["manifestDigest"], first.as_str());

    // The tag moves on: missing boots what the host has, always pulls the new one.
    let second = registry.push(
        &image(&work.path().join("v2"), &version("two")),
        "team/tool:1",
    );
    assert_ne!(first, second);
    let kept = run("kept", &[]);
    let stderr = String::from_utf8_lossy(&kept.stderr);
    assert!(kept.status.success(), "{stderr}");
    assert!(!stderr.contains("pulling"), "{stderr}");
    assert_eq!(home.sh("kept", "cat /release/version"), "one\n");
    let again = run("again", &["--pull", "always"]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("pulling {tool} again")),
        "{stderr}"
    );
    assert_eq!(home.sh("again", "cat /release/version"), "two\n");
    assert!(
        images(&home)
            .iter()
            .any(|i| i["source"]["manifestDigest"] == second.as_str()),
        "{:#?}",
        images(&home)
    );

    // task start pulls too (then refuses this image for having no git, as it would any).
    registry.push(
        &image(&work.path().join("v3"), &version("three")),
        "team/tool:3",
    );
    let project = work.path().join("project");
    std::fs::create_dir_all(&project).expect("mkdir");
    std::fs::write(project.join("README"), "hi\n").expect("write");
    let task_tool = reference("team/tool:3");
    let project_arg = project.to_str().expect("utf8");
    let never = home.json_err(&[
        "task",
        "start",
        project_arg,
        "--image",
        &task_tool,
        "--pull",
        "never",
    ]);
    assert_says(&never, "not on this host");
    let out = home
        .command()
        .args(["task", "start", project_arg, "--image", &task_tool])
        .output()
        .expect("task start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("pulling {task_tool}")), "{stderr}");
    assert!(
        images(&home)
            .iter()
            .any(|i| i["name"] == task_tool.as_str()),
        "task start pulled the image: {stderr}"
    );

    // --image auto: --pull never leaves the image the project names unpulled, the note
    // saying so; --pull always pulls it again though the host has it (busybox has no git,
    // so the task then runs on the default image, the note saying why).
    registry.push(
        &image(&work.path().join("v5"), &version("five")),
        "team/tool:5",
    );
    let auto_tool = reference("team/tool:5");
    let auto_project = dynocap_e2e::one_commit_project("README.md", "hi\n");
    std::fs::write(
        auto_project.path().join(".devcontainer.json"),
        json!({ "image": auto_tool }).to_string(),
    )
    .expect("write");
    let auto_path = auto_project.path().to_str().expect("utf8");
    let task = home.json(&[
        "task", "start", auto_path, "--image", "auto", "--pull", "never", "--name", "nopull",
    ]);
    assert_eq!(task["image"], "host", "{task:#}");
    let note = task["imageNote"].as_str().expect("imageNote");
    assert!(note.contains("--pull never"), "{task:#}");
    assert!(!images(&home)
        .iter()
        .any(|i| i["name"] == auto_tool.as_str()));
    home.json(&["rm", "nopull", "--force", "--purge"]);
    home.json(&["image", "pull", &auto_tool]);
    registry.push(
        &image(&work.path().join("v6"), &version("six")),
        "team/tool:5",
    );
    let out = home
        .command()
        .args([
            "--json",
            "task",
            "start",
            auto_path,
            "--image",
            "auto",
            "--pull",
            "always",
            "--name",
            "autoagain",
        ])
        .output()
        .expect("task start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("pulling {auto_tool} again")),
        "{stderr}"
    );
    let versions: Vec<Value> = images(&home)
        .into_iter()
        .filter(|i| i["name"] == auto_tool.as_str())
        .collect();
    assert_eq!(
        versions.len(),
        2,
        "the tag's new image is pulled: {versions:#?}"
    );
    home.json(&["rm", "autoagain", "--force", "--purge"]);

    // DYNOCAP_IMAGE naming a reference: a start without --image pulls it alike.
    registry.push(
        &image(&work.path().join("v4"), &version("four")),
        "team/tool:4",
    );
    let default_tool = reference("team/tool:4");
    let out = home
        .command()
        .env("DYNOCAP_IMAGE", &default_tool)
        .args(["--json", "run", "defaulted", "--backend", "jail"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("pulling {default_tool}")),
        "{stderr}"
    );
    assert_eq!(home.sh("defaulted", "cat /release/version"), "four\n");

    // A registry the host does not allow, and a name that is no reference.
    let refused = home
        .command()
        .env("DYNOCAP_REGISTRIES", "elsewhere.example")
        .args([
            "--json",
            "run",
            "refused",
            "--image",
            &reference("team/tool:9"),
        ])
        .output()
        .expect("run");
    assert!(!refused.status.success());
    let err: Value = serde_json::from_slice(&refused.stdout).expect("json");
    assert_says(&err["error"], "DYNOCAP_REGISTRIES");
    let err = home.json_err(&["run", "local", "--image", "host", "--pull", "always"]);
    assert_says(&err, "registry reference");
}
