//! `dynocap image build NAME --from BASE` end to end: a tiny static-busybox image the test
//! makes and imports is the base; a recipe's `--run` (writing a file, deleting a base file),
//! `--env` and `--copy` steps run inside a jail sandbox of it, and a sandbox of the new image
//! sees exactly their result; the same recipe again (and as a TOML file) is up to date; a
//! failing step fails the build naming the step and its exit code, with nothing left behind.
//! A `--copy` of a host directory copies it whole (modes, nested directories, symlinks as
//! symlinks wherever they point, never followed on the host), refuses one holding a FIFO, and
//! is part of the recipe's id: a changed file rebuilds, a touched one does not. A large single
//! file arrives whole and is bounded by --max-bytes; a directory made again hides the base's
//! entries; a recipe named as its base is refused unless the base is pinned by id.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use dynocap_e2e::images::store_entries;
use dynocap_e2e::oci::{oci_layer, require_busybox, Layer, Layout};
use dynocap_e2e::{require_root, TestHome};
use serde_json::json;

/// One layer: busybox with the applets the steps use, a minimal /etc, a file to delete.
fn base_layer(busybox: &Path) -> Vec<u8> {
    Layer::busybox_root(busybox)
        .dir("data")
        .file("data/gone.txt", "gone")
        .file("data/kept.txt", "kept\n")
        .applets(&[
            "sh", "ls", "cat", "env", "id", "stat", "test", "echo", "sleep", "sync", "mkdir",
            "dirname", "rm", "chown", "chmod", "pwd", "mkfifo", "cp", "ln", "readlink",
        ])
        .bytes()
}

/// Imports the base as `bb`: a one-layer (uncompressed) OCI layout of [`base_layer`] written
/// under `work`, its config's Env a `BASE_VAR` the recipes' images must keep.
fn import_base(home: &TestHome, busybox: &Path, work: &Path) {
    let layout = work.join("bb-oci");
    Layout::image(
        &layout,
        &[oci_layer(base_layer(busybox), false)],
        json!({"Env": ["PATH=/bin", "BASE_VAR=base"]}),
    );
    home.json(&[
        "image",
        "import",
        layout.to_str().expect("utf8"),
        "--name",
        "bb",
    ]);
}

/// A fresh home with the base imported as `bb`, and a work directory; `None` when `test`
/// skips (not root, no busybox).
fn home_with_base(test: &str) -> Option<(TestHome, tempfile::TempDir)> {
    if !require_root(test) {
        return None;
    }
    let busybox = require_busybox(test)?;
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    import_base(&home, &busybox, work.path());
    Some((home, work))
}

/// The build's sandbox is gone once the build has ended, however it ended.
fn assert_no_sandbox(home: &TestHome) {
    assert!(
        home.json(&["ps"])["sandboxes"]
            .as_array()
            .is_none_or(|s| s.is_empty()),
        "the build sandbox is gone"
    );
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
    let Some((home, work)) = home_with_base(test) else {
        return;
    };
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
    assert_no_sandbox(&home);

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

    // The copied file made executable, its content the same: a new image, the file's mode
    // in it.
    let chmod = |mode: u32| {
        std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod")
    };
    chmod(0o755);
    let rebuilt = home.json(&recipe);
    assert_eq!(rebuilt["origin"], "built", "{rebuilt:#}");
    assert_ne!(rebuilt["image"]["id"], ids[0].as_str());
    let copied =
        Path::new(rebuilt["image"]["path"].as_str().expect("path")).join("rootfs/etc/app/app.conf");
    assert_eq!(
        std::fs::metadata(&copied).expect("stat").mode() & 0o7777,
        0o755,
        "{}",
        copied.display()
    );
    chmod(0o644);
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
    let leftovers = store_entries(&home, "broken");
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(layer_count(&home), layers, "no stray layer");
    assert_no_sandbox(&home);
}

#[test]
fn a_stopped_build_leaves_no_sandbox_and_no_image() {
    let test = "a_stopped_build_leaves_no_sandbox_and_no_image";
    let Some((home, _work)) = home_with_base(test) else {
        return;
    };
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
    assert_no_sandbox(&home);
}

/// `--timeout` bounds the whole build: out of range it is refused before anything starts; it
/// is not part of the recipe (a rebuild with another is up to date); the build sandbox lives
/// the bound plus the layer's margin; and the steps share it, so a step after a slow one is
/// given only what is left, and one that runs out fails naming the step, its seconds and the
/// fix, leaving nothing behind. (The one real timeout takes the shortest bound, 60 s.)
#[test]
fn the_build_timeout_bounds_all_steps_together() {
    let test = "the_build_timeout_bounds_all_steps_together";
    let Some((home, _work)) = home_with_base(test) else {
        return;
    };
    for (bad, said) in [
        (
            "59",
            "--timeout 59 is below the minimum 60; use a value from 60 to 86400",
        ),
        (
            "86401",
            "--timeout 86401 is above the maximum 86400; use a value from 60 to 86400",
        ),
    ] {
        let out = home.run(&[
            "image",
            "build",
            "bounded",
            "--from",
            "bb",
            "--run",
            "true",
            "--timeout",
            bad,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(said), "{stderr}");
    }
    assert!(image_ids(&home, "bounded").is_empty());
    assert_no_sandbox(&home);

    let quick = [
        "image",
        "build",
        "bounded",
        "--from",
        "bb",
        "--run",
        "echo ok > /ok",
    ];
    let built = home.json(&[&quick[..], &["--timeout", "120"]].concat());
    assert_eq!(built["origin"], "built", "{built:#}");
    let again = home.json(&[&quick[..], &["--timeout", "86400"]].concat());
    assert_eq!(again["origin"], "present", "{again:#}");
    assert_eq!(again["image"]["id"], built["image"]["id"]);

    let layers = layer_count(&home);
    let build = home
        .command()
        .args([
            "image",
            "build",
            "slowpoke",
            "--from",
            "bb",
            "--timeout",
            "60",
            "--run",
            "sleep 3",
            "--run",
            "sleep 120",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // The sandbox lives the build's bound plus the margin for making the layer.
    let started = std::time::Instant::now();
    let sandbox = loop {
        let ps = home.json(&["ps"]);
        if let Some(sandbox) = ps["sandboxes"].as_array().and_then(|s| s.first()) {
            break sandbox.clone();
        }
        assert!(started.elapsed().as_secs() < 30, "no build sandbox: {ps:#}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(sandbox["ttlSeconds"], 60 + 900, "{sandbox:#}");
    let out = build.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let (_, after) = stderr
        .split_once("step 2/2 (--run sleep 120) timed out after ")
        .unwrap_or_else(|| panic!("{stderr}"));
    let (given, rest) = after
        .split_once(" s ")
        .unwrap_or_else(|| panic!("{stderr}"));
    let given: u64 = given.parse().unwrap_or_else(|_| panic!("{stderr}"));
    // Step 1 slept 3 s of the 60: step 2 was given what was left, not 60 s of its own.
    assert!((1..=57).contains(&given), "{stderr}");
    assert!(
        rest.starts_with(
            "(what was left of the build's 60 s); nothing was built; give the build more time \
             with --timeout SECONDS (up to 86400, default 3600) or `timeout = SECONDS` in a \
             --file recipe"
        ),
        "{stderr}"
    );
    assert!(image_ids(&home, "slowpoke").is_empty());
    assert_eq!(layer_count(&home), layers, "no stray layer");
    assert_no_sandbox(&home);
}

/// A build's sandbox lives as long as its bound, so a host whose TTL ceiling
/// (`DYNOCAP_MAX_TTL_SECONDS`) is below the bound refuses it: the refusal names the build's
/// `--timeout` (the build has no `--ttl`) and the ceiling, and a build within the ceiling goes
/// through, its sandbox living no longer than the ceiling.
#[test]
fn a_build_bound_above_the_hosts_ttl_ceiling_names_timeout() {
    let test = "a_build_bound_above_the_hosts_ttl_ceiling_names_timeout";
    let Some((home, _work)) = home_with_base(test) else {
        return;
    };
    let home = home.with_env("DYNOCAP_MAX_TTL_SECONDS", "600");
    let build = [
        "image",
        "build",
        "capped",
        "--from",
        "bb",
        "--run",
        "echo ok > /ok",
    ];
    for extra in [&[][..], &["--timeout", "601"][..]] {
        let out = home.run(&[&build[..], extra].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("policy_denied"), "{stderr}");
        assert!(
            stderr.contains("above the host's ceiling 600 (DYNOCAP_MAX_TTL_SECONDS=600)"),
            "{stderr}"
        );
        assert!(
            stderr.contains("give the build --timeout 600 or less"),
            "{stderr}"
        );
        assert!(!stderr.contains("--ttl"), "{stderr}");
    }
    assert!(image_ids(&home, "capped").is_empty());
    assert_no_sandbox(&home);
    let built = home.json(&[&build[..], &["--timeout", "600"]].concat());
    assert_eq!(built["origin"], "built", "{built:#}");
    assert_no_sandbox(&home);
}

/// A recipe's image boots on the vm too (built on the jail, with the debian image's kernel as
/// an imported image does): the step's file is there and the deleted base file is not.
#[test]
fn a_recipe_built_image_boots_in_a_vm() {
    let test = "a_recipe_built_image_boots_in_a_vm";
    if !require_root(test) || !dynocap_e2e::images::require_mmdebstrap(test) {
        return;
    }
    let Some(busybox) = require_busybox(test) else {
        return;
    };
    let (home, _) = dynocap_e2e::images::debian_home();
    // Under TCG: these machines have no usable KVM (see tests/vm.rs).
    let home = home.with_env("DYNOCAP_VM_ACCEL", "tcg");
    let work = tempfile::tempdir().expect("tempdir");
    import_base(&home, &busybox, work.path());
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

#[test]
fn a_copied_directory_keeps_modes_and_links_and_its_content_is_the_id() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let test = "a_copied_directory_keeps_modes_and_links_and_its_content_is_the_id";
    let Some((home, work)) = home_with_base(test) else {
        return;
    };
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("bin")).expect("mkdir");
    std::fs::create_dir_all(tree.join("conf/private")).expect("mkdir");
    std::fs::write(tree.join("bin/run.sh"), "#!/bin/sh\necho run\n").expect("write");
    std::fs::write(tree.join("conf/app.conf"), "setting = 1\n").expect("write");
    std::fs::write(tree.join("conf/private/key"), "k\n").expect("write");
    std::fs::write(tree.join("empty"), "").expect("write");
    let secret = work.path().join("secret");
    std::fs::write(&secret, "host only\n").expect("write");
    symlink("bin/run.sh", tree.join("run")).expect("symlink");
    symlink("../secret", tree.join("up")).expect("symlink");
    symlink(&secret, tree.join("abs")).expect("symlink");
    symlink("/etc", tree.join("etc-link")).expect("symlink");
    let mode = |path: &str, mode: u32| {
        let path = if path.is_empty() {
            tree.clone()
        } else {
            tree.join(path)
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    mode("", 0o755);
    mode("bin", 0o755);
    mode("conf/app.conf", 0o644);
    mode("empty", 0o644);
    mode("bin/run.sh", 0o4755);
    mode("conf/private/key", 0o600);
    mode("conf/private", 0o751);
    // A directory the sandbox user may not write: filled before its mode is set.
    mode("conf", 0o555);
    let copy = format!("{}:/opt/app", tree.display());
    let recipe = ["image", "build", "tree", "--from", "bb", "--copy", &copy];
    let built = home.json(&recipe);
    assert_eq!(built["origin"], "built", "{built:#}");
    assert_no_sandbox(&home);

    home.sandbox("box", &["--image", "tree", "--backend", "jail"]);
    let listing = home.sh(
        "box",
        "cd /opt/app && for p in . bin conf conf/private; do echo \"$p $(stat -c '%a %u:%g' $p)\"; \
         done; for p in bin/run.sh conf/app.conf conf/private/key empty; do \
         echo \"$p $(stat -c '%a %u:%g %s' $p)\"; done",
    );
    assert_eq!(
        listing,
        ". 755 0:0\nbin 755 0:0\nconf 555 0:0\nconf/private 751 0:0\nbin/run.sh 755 0:0 19\n\
         conf/app.conf 644 0:0 12\nconf/private/key 600 0:0 2\nempty 644 0:0 0\n",
        "modes kept (set-id cleared), owned by the guest's root"
    );
    assert_eq!(home.sh("box", "/opt/app/run"), "run\n");
    assert_eq!(
        home.sh(
            "box",
            "cd /opt/app && for l in run up abs etc-link; do test -L $l && readlink $l; done"
        ),
        format!("bin/run.sh\n../secret\n{}\n/etc\n", secret.display())
    );
    assert_eq!(
        home.sh("box", "cat /opt/app/up /opt/app/abs 2>/dev/null; echo end"),
        "end\n",
        "no link brought its host target in"
    );
    home.json(&["destroy", "box"]);

    // Unchanged (a file touched, its content the same): up to date, nothing runs.
    let ids = image_ids(&home, "tree");
    assert_eq!(ids.len(), 1);
    std::fs::write(tree.join("empty"), "").expect("touch");
    let again = home.json(&recipe);
    assert_eq!(again["origin"], "present", "{again:#}");
    // The same from a recipe file, the path relative to it.
    let file = work.path().join("recipe.toml");
    std::fs::write(&file, "from = \"bb\"\n[[step]]\ncopy = \"tree:/opt/app\"\n").expect("write");
    let from_file = home.json(&[
        "image",
        "build",
        "tree",
        "--file",
        file.to_str().expect("utf8"),
    ]);
    assert_eq!(from_file["origin"], "present", "{from_file:#}");
    assert_eq!(from_file["image"]["id"], ids[0].as_str());

    // A changed file: a new image with the new content.
    mode("conf", 0o755);
    std::fs::write(tree.join("conf/app.conf"), "setting = 2\n").expect("write");
    let rebuilt = home.json(&recipe);
    assert_eq!(rebuilt["origin"], "built", "{rebuilt:#}");
    assert_ne!(rebuilt["image"]["id"], ids[0].as_str());
    home.sandbox("box2", &["--image", "tree", "--backend", "jail"]);
    assert_eq!(
        home.sh("box2", "cat /opt/app/conf/app.conf"),
        "setting = 2\n"
    );
    home.json(&["destroy", "box2"]);

    // A FIFO in the directory refuses the build before anything runs, naming it.
    let fifo = tree.join("conf/pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
    let err = home.json_err(&["image", "build", "fifo", "--from", "bb", "--copy", &copy]);
    let message = err["message"].as_str().expect("message");
    assert!(
        message.contains("conf/pipe is a FIFO, which a copy does not copy"),
        "{err:#}"
    );
    assert!(image_ids(&home, "fifo").is_empty());
    assert!(store_entries(&home, "fifo").is_empty());
    assert_no_sandbox(&home);
}

/// The entries of `home`'s `images/`, sorted.
fn images_dir_entries(home: &TestHome) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(home.path().join("images"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `image rm` of a recipe's image leaves nothing of its name (no build lock, no directory)
/// and no layer only it used, while the base keeps its own and a rebuild works; a build
/// killed outright (SIGKILL, so it cannot destroy its sandbox) has its sandbox destroyed by
/// the next build, which is not blocked by it; and once every image is removed, nothing is
/// left but the shared layer store's lock.
#[test]
fn image_rm_and_a_killed_build_leave_nothing_behind() {
    let test = "image_rm_and_a_killed_build_leave_nothing_behind";
    let Some((home, _work)) = home_with_base(test) else {
        return;
    };
    let base_layers = layer_count(&home);
    let recipe = [
        "image",
        "build",
        "app",
        "--from",
        "bb",
        "--run",
        "echo made > /etc/made",
    ];
    let built = home.json(&recipe);
    assert_eq!(built["origin"], "built", "{built:#}");
    assert_eq!(layer_count(&home), base_layers + 1);
    home.json(&["image", "rm", "app"]);
    assert!(
        !home.path().join("images/app").exists(),
        "images/app is left: {:?}",
        std::fs::read_dir(home.path().join("images/app"))
            .map(|rd| rd.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    assert_eq!(
        layer_count(&home),
        base_layers,
        "the recipe's layer is freed"
    );
    let images = home.json(&["image", "ls"]);
    let listed = images["images"].as_array().expect("images");
    assert_eq!(listed.len(), 1, "{images:#}");
    assert_eq!(listed[0]["name"], "bb");
    assert_eq!(listed[0]["sharedBytes"], 0, "{images:#}");
    let again = home.json(&recipe);
    assert_eq!(again["origin"], "built", "{again:#}");
    assert_eq!(again["image"]["id"], built["image"]["id"]);

    // Killed mid-step: its sandbox runs on, holding the base.
    let mut slow = home
        .command()
        .args([
            "image",
            "build",
            "slow",
            "--from",
            "bb",
            "--run",
            "sleep 600",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let mut waited = 0;
    while home.json(&["ps"])["sandboxes"]
        .as_array()
        .is_none_or(|s| s.is_empty())
    {
        assert!(waited < 300, "no build sandbox");
        waited += 1;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    slow.kill().expect("SIGKILL");
    slow.wait().expect("wait");
    assert_eq!(
        home.json(&["ps"])["sandboxes"]
            .as_array()
            .map_or(0, Vec::len),
        1,
        "a killed build cannot destroy its sandbox itself"
    );
    let built = home.json(&[
        "image",
        "build",
        "slow",
        "--from",
        "bb",
        "--run",
        "echo quick",
    ]);
    assert_eq!(built["origin"], "built", "{built:#}");
    assert_no_sandbox(&home);

    // Killed while it makes the layer: a half-made build directory and the sandbox are left,
    // and the next build of the name removes both and builds.
    let killed = home
        .command()
        .env("DYNOCAP_FAILPOINTS", "image.recipe.layer=kill")
        .args([
            "image",
            "build",
            "late",
            "--from",
            "bb",
            "--run",
            "echo late",
        ])
        .output()
        .expect("spawn");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&killed.status),
        Some(libc::SIGKILL),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    let left = store_entries(&home, "late");
    assert!(
        left.len() == 1 && left[0].starts_with(".tmp-"),
        "killed mid-layer: {left:?}"
    );
    let built = home.json(&[
        "image",
        "build",
        "late",
        "--from",
        "bb",
        "--run",
        "echo late",
    ]);
    assert_eq!(built["origin"], "built", "{built:#}");
    assert_eq!(
        store_entries(&home, "late"),
        vec![built["image"]["id"].as_str().expect("id").to_owned()]
    );
    assert_no_sandbox(&home);

    for name in ["late", "slow", "app", "bb"] {
        home.json(&["image", "rm", name]);
    }
    assert_eq!(images_dir_entries(&home), vec![".store".to_owned()]);
    let mut store: Vec<String> = std::fs::read_dir(home.path().join("images/.store"))
        .expect("read")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    store.sort();
    assert!(
        store
            .iter()
            .all(|n| ["lock", "layers", "blobs"].contains(&n.as_str())),
        "{store:?}"
    );
    assert_eq!(layer_count(&home), 0);
}

/// The base's apt sources in the extra-CA test: plain HTTP, as Debian's images have them.
const SOURCES: &str = "deb http://deb.debian.org/debian bookworm main\n";

/// A recipe built while `DYNOCAP_EXTRA_CA` names a CA, on `nat` and on `filtered`: its steps
/// trust the CA (the agent joined it into the guest's bundle), but the image keeps the bundle
/// its recipe made, without it, and none of the agent's anchor file; so a sandbox of the image
/// started once the CA is no longer configured trusts only what the image itself does, and
/// one started while it is configured trusts it again. Likewise the `filtered` build's apt
/// sources, which its agent switched to `https://` for the proxy: the image keeps its base's.
#[test]
fn a_built_image_keeps_none_of_the_hosts_extra_ca() {
    let test = "a_built_image_keeps_none_of_the_hosts_extra_ca";
    if !require_root(test) {
        return;
    }
    let Some(busybox) = require_busybox(test) else {
        return;
    };
    let work = tempfile::tempdir().expect("tempdir");
    let host_ca = dynocap_e2e::netfix::TestCa::generate(
        &work.path().join("host-ca"),
        std::net::Ipv4Addr::LOCALHOST,
    );
    let system_ca = dynocap_e2e::netfix::TestCa::for_names(
        &work.path().join("system-ca"),
        &["system.example"],
        std::net::Ipv4Addr::LOCALHOST,
        "An image's own CA",
    );
    let system = std::fs::read_to_string(&system_ca.ca_cert).expect("read");
    let host = std::fs::read_to_string(&host_ca.ca_cert).expect("read");
    // A line of the host CA's base64: in a bundle only if the certificate is.
    let host_line = host.lines().nth(1).expect("a PEM body").to_owned();
    let bundle = "etc/ssl/certs/ca-certificates.crt";
    let layer = Layer::busybox_root(&busybox)
        .dir("etc/ssl")
        .dir("etc/ssl/certs")
        .file(bundle, &system)
        .dir("usr")
        .dir("usr/local")
        .dir("usr/local/share")
        .dir("usr/local/share/ca-certificates")
        .dir("etc/apt")
        .file("etc/apt/sources.list", SOURCES)
        .applets(&["sh", "grep", "cat", "echo", "test", "sync"])
        .bytes();
    let layout = work.path().join("oci");
    Layout::image(
        &layout,
        &[oci_layer(layer, false)],
        json!({"Env": ["PATH=/bin"]}),
    );
    let home = TestHome::new().with_env(
        dynocap_e2e::netfix::product::ENV_EXTRA_CA,
        host_ca.ca_cert.to_str().expect("utf8"),
    );
    home.json(&[
        "image",
        "import",
        layout.to_str().expect("utf8"),
        "--name",
        "certs",
    ]);
    for network in ["nat", "filtered"] {
        let name = format!("trust-{network}");
        let built = home.json(&[
            "image",
            "build",
            &name,
            "--from",
            "certs",
            "--network",
            network,
            "--run",
            "grep -c BEGIN /etc/ssl/certs/ca-certificates.crt > /etc/during; \
             cat /etc/apt/sources.list > /etc/sources-during; echo made > /etc/made",
        ]);
        let rootfs = Path::new(built["image"]["path"].as_str().expect("path")).join("rootfs");
        let read = |rel: &str| std::fs::read_to_string(rootfs.join(rel)).unwrap_or_default();
        assert_eq!(
            read("etc/during"),
            "2\n",
            "{network}: the build's steps trust the host's CA"
        );
        assert_eq!(read("etc/made"), "made\n");
        if network == "filtered" {
            assert_eq!(
                read("etc/sources-during"),
                SOURCES.replace("http://", "https://"),
                "the proxy carries HTTPS only: the build's apt uses https://"
            );
        }
        assert_eq!(
            read("etc/apt/sources.list"),
            SOURCES,
            "{network}: the image's apt sources are its base's"
        );
        let baked = read(bundle);
        assert!(
            !baked.contains(&host_line),
            "{network}: the image's bundle keeps the host's extra CA:\n{baked}"
        );
        assert_eq!(baked, system, "{network}: the bundle is the recipe's");
        assert!(
            !rootfs
                .join("usr/local/share/ca-certificates/dynocap-extra-ca.crt")
                .exists(),
            "{network}: the agent's anchor file is baked in"
        );
    }
    // A `none` build's sandbox is given no extra CA: what its recipe puts in the bundle, the
    // same certificate included, is the recipe's and stays.
    let copy = format!("{}:/tmp/corp.pem", host_ca.ca_cert.display());
    let built = home.json(&[
        "image",
        "build",
        "trust-none",
        "--from",
        "certs",
        "--copy",
        &copy,
        "--run",
        "cat /tmp/corp.pem >> /etc/ssl/certs/ca-certificates.crt",
    ]);
    let rootfs = Path::new(built["image"]["path"].as_str().expect("path")).join("rootfs");
    let baked = std::fs::read_to_string(rootfs.join(bundle)).expect("read");
    assert_eq!(
        baked,
        format!("{system}{host}"),
        "none: the recipe's own bundle"
    );

    // Sandboxes of the image: without the CA configured it is not trusted; with it, it is.
    let out = home
        .command()
        .env_remove(dynocap_e2e::netfix::product::ENV_EXTRA_CA)
        .args(["run", "plain", "--image", "trust-nat", "--network", "nat"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        home.sh("plain", "grep -c BEGIN /etc/ssl/certs/ca-certificates.crt"),
        "1\n"
    );
    home.sandbox("trusting", &["--image", "trust-nat", "--network", "nat"]);
    assert_eq!(
        home.sh(
            "trusting",
            "grep -c BEGIN /etc/ssl/certs/ca-certificates.crt"
        ),
        "2\n"
    );
}

/// A recipe whose base is named by the name it makes would build on its own last result each
/// time (a new layer on every run, never up to date): refused before anything starts, saying
/// how to pin the base. Pinned by its id, the base is fixed and the same recipe is up to date.
#[test]
fn a_recipe_named_as_its_base_is_refused_unless_the_base_is_pinned() {
    let test = "a_recipe_named_as_its_base_is_refused_unless_the_base_is_pinned";
    let Some((home, _work)) = home_with_base(test) else {
        return;
    };
    let base = image_ids(&home, "bb");
    let err = home.json_err(&["image", "build", "bb", "--from", "bb", "--run", "true"]);
    let message = err["message"].as_str().unwrap_or_default();
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    assert!(
        message.contains("--from bb names the image this recipe makes")
            && message.contains(&format!("--from {}", &base[0][..12])),
        "{err:#}"
    );
    assert_eq!(image_ids(&home, "bb"), base, "nothing was built");
    assert_no_sandbox(&home);

    let pinned = [
        "image",
        "build",
        "bb",
        "--from",
        &base[0][..12],
        "--run",
        "echo 1 > /n",
    ];
    assert_eq!(home.json(&pinned)["origin"], "built");
    assert_eq!(home.json(&pinned)["origin"], "present");
    assert_eq!(image_ids(&home, "bb").len(), 2);
}

/// A single file larger than one piece of the file protocol is copied in pieces and put
/// together whole, byte for byte; one larger than `--max-bytes` allows an image is refused
/// before the build starts, naming the flag.
#[test]
fn a_large_copied_file_arrives_whole_and_is_bounded_by_max_bytes() {
    let test = "a_large_copied_file_arrives_whole_and_is_bounded_by_max_bytes";
    let Some((home, work)) = home_with_base(test) else {
        return;
    };
    // Three pieces and a bit, no two alike, so a piece out of order shows.
    let content: Vec<u8> = (0..(3 * 512 * 1024 + 4321) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let big = work.path().join("big.bin");
    std::fs::write(&big, &content).expect("write");
    let copy = format!("{}:/opt/big.bin", big.display());

    let err = home.json_err(&[
        "image",
        "build",
        "big",
        "--from",
        "bb",
        "--copy",
        &copy,
        "--max-bytes",
        "1000000",
    ]);
    let message = err["message"].as_str().unwrap_or_default();
    // Refused as listed, before the build's sandbox starts (not by the layer's unpacking).
    assert!(
        message.contains("--max-bytes")
            && message.contains(&format!("big.bin: it is {} bytes", content.len())),
        "{err:#}"
    );
    assert!(image_ids(&home, "big").is_empty());
    assert_no_sandbox(&home);

    let built = home.json(&["image", "build", "big", "--from", "bb", "--copy", &copy]);
    assert_eq!(built["origin"], "built", "{built:#}");
    let copied =
        Path::new(built["image"]["path"].as_str().expect("path")).join("rootfs/opt/big.bin");
    let got = std::fs::read(&copied).expect("the copied file");
    assert!(
        got == content,
        "{} differs ({} bytes)",
        copied.display(),
        got.len()
    );
    assert_no_sandbox(&home);
}

/// A directory a step removes and makes again is opaque in the sandbox's overlay: the built
/// layer says so (`.wh..wh..opq`), so the image has only the new directory's entries, none of
/// the base's.
#[test]
fn a_directory_made_again_hides_the_bases_entries() {
    let test = "a_directory_made_again_hides_the_bases_entries";
    let Some((home, _work)) = home_with_base(test) else {
        return;
    };
    let built = home.json(&[
        "image",
        "build",
        "fresh",
        "--from",
        "bb",
        "--run",
        "rm -rf /data && mkdir /data && echo new > /data/new",
    ]);
    assert_eq!(built["origin"], "built", "{built:#}");
    home.sandbox("box", &["--image", "fresh", "--backend", "jail"]);
    assert_eq!(home.sh("box", "ls /data"), "new\n");
    home.json(&["destroy", "box"]);
}
