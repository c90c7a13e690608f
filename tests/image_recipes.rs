//! `dynocap image build NAME --from BASE` end to end: a tiny static-busybox image the test
//! makes and imports is the base; a recipe's `--run` (writing a file, deleting a base file),
//! `--env` and `--copy` steps run inside a jail sandbox of it, and a sandbox of the new image
//! sees exactly their result; the same recipe again (and as a TOML file) is up to date; a
//! failing step fails the build naming the step and its exit code, with nothing left behind.

use std::path::{Path, PathBuf};

use dynocap_e2e::{require_root, TestHome};
use serde_json::json;
use sha2::{Digest, Sha256};

fn busybox(test: &str) -> Option<PathBuf> {
    let found = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        if std::env::var_os("CI").is_some() {
            panic!("{test}: needs busybox-static, and CI must have it");
        }
        eprintln!("SKIPPED {test}: needs busybox-static (apt-get install busybox-static)");
    }
    found
}

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One layer: busybox with the applets the steps use, a minimal /etc, a file to delete.
fn base_layer(busybox: &Path) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |kind: tar::EntryType, path: &str, link: &str, mode: u32, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        if link.is_empty() {
            tar.append_data(&mut header, path, data).expect("append");
        } else {
            tar.append_link(&mut header, path, link).expect("append");
        }
    };
    use tar::EntryType::{Directory, Regular, Symlink};
    add(Directory, "bin", "", 0o755, b"");
    let bytes = std::fs::read(busybox).expect("read busybox");
    add(Regular, "bin/busybox", "", 0o755, &bytes);
    add(Directory, "etc", "", 0o755, b"");
    add(
        Regular,
        "etc/passwd",
        "",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\n",
    );
    add(Regular, "etc/group", "", 0o644, b"root:x:0:\n");
    add(Directory, "data", "", 0o755, b"");
    add(Regular, "data/gone.txt", "", 0o644, b"gone");
    add(Regular, "data/kept.txt", "", 0o644, b"kept\n");
    for applet in [
        "sh", "ls", "cat", "env", "id", "stat", "test", "echo", "sleep", "sync", "mkdir",
        "dirname", "rm", "chown", "chmod", "pwd", "mkfifo", "cp", "ln", "readlink",
    ] {
        add(Symlink, &format!("bin/{applet}"), "busybox", 0o777, b"");
    }
    tar.into_inner().expect("tar")
}

/// Writes a one-layer OCI image layout of `layer` at `dir`.
fn write_oci(dir: &Path, layer: &[u8]) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("mkdir");
    let put = |data: &[u8]| {
        let hex = sha256(data);
        std::fs::write(blobs.join(&hex), data).expect("write blob");
        hex
    };
    let layer_hex = put(layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin", "BASE_VAR=base"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_hex}")]},
    }))
    .expect("json");
    let config_hex = put(&config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{config_hex}"), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": format!("sha256:{layer_hex}"), "size": layer.len()}],
    }))
    .expect("json");
    let manifest_hex = put(&manifest);
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": format!("sha256:{manifest_hex}"), "size": manifest.len()}],
        }))
        .expect("json"),
    )
    .expect("write index");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("write");
}

fn layer_count(home: &TestHome) -> usize {
    std::fs::read_dir(home.path().join("images/.store/layers/sha256"))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

fn image_ids(home: &TestHome, name: &str) -> Vec<String> {
    home.json(&["image", "ls"])["images"]
        .as_array()
        .expect("images")
        .iter()
        .filter(|i| i["name"] == name)
        .map(|i| i["id"].as_str().expect("id").to_owned())
        .collect()
}

#[test]
fn a_recipe_builds_an_image_from_an_imported_base_on_the_jail() {
    let test = "a_recipe_builds_an_image_from_an_imported_base_on_the_jail";
    if !require_root(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("bb-oci");
    write_oci(&layout, &base_layer(&busybox));
    home.json(&[
        "image",
        "import",
        layout.to_str().expect("utf8"),
        "--name",
        "bb",
    ]);
    let conf = work.path().join("app.conf");
    std::fs::write(&conf, "setting = 1\n").expect("write");
    let copy = format!("{}:/etc/app/app.conf", conf.display());
    // Beside the file and the deletion, what the layer rules must neutralise: a fifo, a
    // setuid copy of busybox and a symlink out of the root (kept as a link, never followed).
    let run = "echo made > /etc/made && rm /data/gone.txt && echo \"mode=$APP_MODE\" && \
               mkfifo /etc/fifo && cp /bin/busybox /bin/suidbox && chmod 4755 /bin/suidbox && \
               ln -s ../../../etc/passwd /etc/up";
    let recipe = [
        "image",
        "build",
        "app",
        "--from",
        "bb",
        "--copy",
        &copy,
        "--env",
        "APP_MODE=test",
        "--run",
        run,
    ];

    let out = home.run(&recipe);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "build failed: {stderr}");
    assert!(
        stderr.contains("mode=test"),
        "the step's output is streamed and sees --env: {stderr}"
    );
    assert!(
        stderr.contains("device nodes, fifos or sockets"),
        "{stderr}"
    );
    let ids = image_ids(&home, "app");
    assert_eq!(ids.len(), 1);
    assert!(
        home.json(&["ps"])["sandboxes"]
            .as_array()
            .is_none_or(|s| s.is_empty()),
        "the build sandbox is gone"
    );

    home.sandbox("box", &["--image", "app", "--backend", "jail"]);
    assert_eq!(home.sh("box", "cat /etc/made"), "made\n");
    assert_eq!(home.sh("box", "stat -c %u:%g /etc/made"), "0:0\n");
    assert_eq!(
        home.sh("box", "test -e /data/gone.txt || echo deleted"),
        "deleted\n",
        "the step's deletion is a whiteout in the new layer"
    );
    assert_eq!(home.sh("box", "cat /data/kept.txt"), "kept\n");
    assert_eq!(home.sh("box", "test -e /etc/fifo || echo none"), "none\n");
    assert_eq!(home.sh("box", "stat -c %a /bin/suidbox"), "755\n");
    assert_eq!(home.sh("box", "readlink /etc/up"), "../../../etc/passwd\n");
    assert_eq!(home.sh("box", "cat /etc/app/app.conf"), "setting = 1\n");
    assert_eq!(home.sh("box", "echo $APP_MODE $BASE_VAR"), "test base\n");
    home.json(&["destroy", "box"]);

    // Nothing changed: nothing runs.
    let again = home.run(&recipe);
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(
        again.status.success() && said.contains("up to date"),
        "{said}"
    );
    assert_eq!(image_ids(&home, "app"), ids);

    // The same recipe from a TOML file (the flags' order: copies, env, runs) is the same id.
    let file = work.path().join("recipe.toml");
    std::fs::write(
        &file,
        format!(
            "from = \"bb\"\n[[step]]\ncopy = \"app.conf:/etc/app/app.conf\"\n\
             [[step]]\nenv = \"APP_MODE=test\"\n[[step]]\nrun = {}\n",
            toml_string(run)
        ),
    )
    .expect("write");
    let built = home.json(&[
        "image",
        "build",
        "app",
        "--file",
        file.to_str().expect("utf8"),
    ]);
    assert_eq!(built["origin"], "present", "{built:#}");
    assert_eq!(built["image"]["id"], ids[0].as_str());
    std::fs::write(&file, "from = \"bb\"\nnetwrok = \"nat\"\n").expect("write");
    let err = home.json_err(&[
        "image",
        "build",
        "x",
        "--file",
        file.to_str().expect("utf8"),
    ]);
    assert!(
        err["message"]
            .as_str()
            .unwrap_or_default()
            .contains("netwrok"),
        "{err:#}"
    );

    // A failing step: named with its exit code, and nothing is left.
    let layers = layer_count(&home);
    let out = home.run(&[
        "image",
        "build",
        "broken",
        "--from",
        "bb",
        "--run",
        "echo partial > /etc/partial",
        "--run",
        "echo about to fail; exit 7",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("about to fail"), "{stderr}");
    assert!(
        stderr.contains("step 2/2 (--run echo about to fail; exit 7) exited with code 7"),
        "{stderr}"
    );
    assert!(image_ids(&home, "broken").is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(home.path().join("images/broken"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name())
                .filter(|n| n != ".build.lock")
                .collect()
        })
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(layer_count(&home), layers, "no stray layer");
    assert!(
        home.json(&["ps"])["sandboxes"]
            .as_array()
            .is_none_or(|s| s.is_empty()),
        "the build sandbox is gone"
    );
}

#[test]
fn a_stopped_build_leaves_no_sandbox_and_no_image() {
    let test = "a_stopped_build_leaves_no_sandbox_and_no_image";
    if !require_root(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("bb-oci");
    write_oci(&layout, &base_layer(&busybox));
    home.json(&[
        "image",
        "import",
        layout.to_str().expect("utf8"),
        "--name",
        "bb",
    ]);
    let mut build = home
        .command()
        .args([
            "image", "build", "slow", "--from", "bb", "--run", "sleep 60",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = std::time::Instant::now();
    loop {
        let ps = home.json(&["ps"]);
        if ps["sandboxes"].as_array().is_some_and(|s| !s.is_empty()) {
            break;
        }
        assert!(started.elapsed().as_secs() < 30, "no build sandbox: {ps:#}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The step is running (or about to): stop the build as Ctrl-C would.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(build.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("kill");
    let status = build.wait().expect("wait");
    assert!(!status.success());
    assert!(
        started.elapsed().as_secs() < 30,
        "the build stopped without waiting for its step"
    );
    assert!(image_ids(&home, "slow").is_empty());
    assert!(
        home.json(&["ps"])["sandboxes"]
            .as_array()
            .is_none_or(|s| s.is_empty()),
        "the build sandbox is gone"
    );
}

/// A recipe's image boots on the vm too (built on the jail, with the debian image's kernel as
/// an imported image does): the step's file is there and the deleted base file is not.
#[test]
fn a_recipe_built_image_boots_in_a_vm() {
    let test = "a_recipe_built_image_boots_in_a_vm";
    if !require_root(test) || !dynocap_e2e::images::require_mmdebstrap(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let (home, _) = dynocap_e2e::images::debian_home();
    // Under TCG: these machines have no usable KVM (see tests/vm.rs).
    let home = home.with_env("DYNOCAP_VM_ACCEL", "tcg");
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("bb-oci");
    write_oci(&layout, &base_layer(&busybox));
    home.json(&[
        "image",
        "import",
        layout.to_str().expect("utf8"),
        "--name",
        "bb",
    ]);
    home.json(&[
        "image",
        "build",
        "app",
        "--from",
        "bb",
        "--env",
        "APP_MODE=vm",
        "--run",
        "echo made > /etc/made && rm /data/gone.txt",
    ]);
    let info = home.json(&["run", "appvm", "--image", "app", "--backend", "vm"]);
    assert_eq!(info["backend"], "vm", "{info:#}");
    assert_eq!(
        home.sh(
            "appvm",
            "cat /etc/made; test -e /data/gone.txt || echo deleted; echo $APP_MODE"
        ),
        "made\ndeleted\nvm\n"
    );
    home.json(&["destroy", "appvm"]);
}

/// The debian image keeps its rootfs whole: a recipe on it makes that rootfs a layer once,
/// and the recipe's own layer goes on top; the result has the base's kernel. The recipe is a
/// file whose steps run in its order: point apt at a flat repository the test serves over
/// HTTPS on loopback, `apt` a package from it through the `filtered` proxy, then change files.
#[test]
fn a_recipe_file_with_apt_builds_on_the_debian_image() {
    use dynocap_e2e::netfix::{NetFix, OTHER_HOST};
    let test = "a_recipe_file_with_apt_builds_on_the_debian_image";
    if !require_root(test) || !dynocap_e2e::images::require_mmdebstrap(test) {
        return;
    }
    let fix = NetFix::start();
    dynocap_e2e::images::flat_apt_repository(
        &fix.dir().join("www/apt"),
        fix.dir(),
        "dynocap-served",
        "served over https",
    );
    let (mut home, debian) = dynocap_e2e::images::debian_home();
    for (key, value) in fix.product_env() {
        home = home.with_env(&key, &value);
    }
    let work = tempfile::tempdir().expect("tempdir");
    let file = work.path().join("recipe.toml");
    // Only the fixture's repository: nothing may try deb.debian.org from a test.
    let sources = "rm -f /etc/apt/sources.list && \
        echo 'deb [trusted=yes] https://other.test/apt ./' > /etc/apt/sources.list.d/fixture.list && \
        printf 'Acquire::https::CaInfo \"%s\";\\n' \"$SSL_CERT_FILE\" > /etc/apt/apt.conf.d/90fixture-ca";
    let recipe = format!(
        "from = \"debian\"\nnetwork = \"filtered\"\nallow-hosts = [\"{OTHER_HOST}\"]\n\
         [[step]]\nrun = {}\n[[step]]\napt = [\"dynocap-served\"]\n\
         [[step]]\nrun = \"echo made > /etc/made && rm /etc/debian_version\"\n",
        toml_string(sources)
    );
    std::fs::write(&file, recipe).expect("write");
    let built = home.json(&[
        "image",
        "build",
        "deb-app",
        "--file",
        file.to_str().expect("utf8"),
    ]);
    assert_eq!(built["origin"], "built", "{built:#}");
    assert_eq!(
        built["image"]["kernel"], debian["image"]["kernel"],
        "{built:#}"
    );
    home.sandbox("deb", &["--image", "deb-app", "--backend", "jail"]);
    assert_eq!(
        home.sh(
            "deb",
            "cat /etc/made; test -e /etc/debian_version || echo deleted; sudo id -u; dynocap-served"
        ),
        "made\ndeleted\n0\nserved over https\n"
    );
    home.json(&["destroy", "deb"]);
}

fn toml_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}
