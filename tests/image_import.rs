//! `dynocap image import` end to end: an OCI image layout and a `docker save` archive that
//! the test makes itself (a static busybox in three layers, with a whiteout, an opaque
//! directory, a device node and a setuid file), imported, listed, booted on the jail and
//! removed; hostile layers refused with nothing written outside the store; and an import
//! killed half-way leaving nothing listed, the next one succeeding.

use std::path::Path;
use std::process::Command;

use dynocap_e2e::images::{allocated_bytes, store_entries, store_leftovers};
use dynocap_e2e::oci::{
    image_config, nested_layer, oci_layer, require_busybox as busybox, sha256, sparse_gnu_layer,
    sparse_pax_layer, Layer, Layout, OciLayer,
};
use dynocap_e2e::{require_root, TestHome};
use serde_json::{json, Value};

/// The base: busybox and its applets, a minimal /etc, and files the upper layers remove.
fn base_layer(busybox: &Path) -> Vec<u8> {
    Layer::busybox_root(busybox)
        .dir("opt")
        .file("opt/lower-a", "a")
        .file("opt/lower-b", "b")
        .dir("data")
        .file("data/gone.txt", "gone")
        .file("data/kept.txt", "kept\n")
        .applets(&[
            "sh", "ls", "cat", "env", "pwd", "id", "stat", "test", "echo", "sleep",
        ])
        .bytes()
}

fn upper_layer() -> Vec<u8> {
    Layer::new()
        .file("data/.wh.gone.txt", "")
        .dir("opt")
        .file("opt/.wh..wh..opq", "")
        .file("opt/upper", "u")
        .dir("top")
        .file("top/hello.txt", "from the top layer\n")
        .entry(
            tar::EntryType::Regular,
            "bin/suid",
            "",
            0o4755,
            b"#!/bin/sh\n",
        )
        .dir("dev")
        .entry(tar::EntryType::Char, "dev/evil", "", 0o666, b"")
        .bytes()
}

/// The config's `WorkingDir`, and a tool only the config's `PATH` finds.
fn third_layer() -> Vec<u8> {
    Layer::new()
        .dir("work")
        .file("top/third.txt", "three\n")
        .dir("tools")
        .dir("tools/bin")
        .entry(
            tar::EntryType::Regular,
            "tools/bin/mytool",
            "",
            0o755,
            b"#!/bin/sh\necho tool ran\n",
        )
        .bytes()
}

/// The image's run config: a `PATH` that finds the third layer's tool, an Env and a
/// `WorkingDir` the sandbox must apply.
fn run_config() -> Value {
    json!({
        "Env": ["PATH=/tools/bin:/bin", "GREETING=hello", "HOME=/root"],
        "WorkingDir": "/work",
        "Cmd": ["/bin/sh"],
    })
}

fn config(diff_ids: &[String]) -> Vec<u8> {
    image_config("amd64", run_config(), diff_ids)
}

/// Writes an OCI image layout of `layers` at `dir`; returns the layers' blob digests.
fn write_oci(dir: &Path, layers: &[OciLayer]) -> Vec<String> {
    Layout::image(dir, layers, run_config()).1
}

/// Writes a classic `docker save` archive of `layers` at `path`.
fn write_docker(path: &Path, layers: &[Vec<u8>]) {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
    let config = config(&diff_ids);
    let config_name = format!("{}.json", sha256(&config));
    let mut archive = tar::Builder::new(Vec::new());
    let add = |archive: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]| {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        archive
            .append_data(&mut header, name, data)
            .expect("append");
    };
    add(&mut archive, &config_name, &config);
    let mut names = Vec::new();
    for (n, layer) in layers.iter().enumerate() {
        let name = format!("{n}/layer.tar");
        // A layer that comes again (the same diff id) is written once, the later one a
        // symlink to it, as Docker's `docker save` writes it.
        match layers[..n].iter().position(|earlier| earlier == layer) {
            Some(first) => {
                let mut header = tar::Header::new_ustar();
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                header.set_mode(0o777);
                archive
                    .append_link(&mut header, &name, format!("../{first}/layer.tar"))
                    .expect("append link");
            }
            None => add(&mut archive, &name, layer),
        }
        names.push(name);
    }
    let manifest = serde_json::to_vec(&json!([
        {"Config": config_name, "RepoTags": ["tiny:1"], "Layers": names}
    ]))
    .expect("json");
    add(&mut archive, "manifest.json", &manifest);
    std::fs::write(path, archive.into_inner().expect("tar")).expect("write archive");
}

/// `dynocap image import PATH --name NAME`, which must succeed.
fn import(home: &TestHome, path: &Path, name: &str) -> Value {
    home.json(&[
        "image",
        "import",
        path.to_str().expect("utf8"),
        "--name",
        name,
    ])
}

/// `dynocap image import PATH --name NAME`, which must fail: its error object.
fn import_err(home: &TestHome, path: &Path, name: &str) -> Value {
    home.json_err(&[
        "image",
        "import",
        path.to_str().expect("utf8"),
        "--name",
        name,
    ])
}

fn images(home: &TestHome) -> Vec<Value> {
    home.json(&["image", "ls"])["images"]
        .as_array()
        .expect("images")
        .clone()
}

#[test]
fn oci_layout_and_docker_archive_import_and_boot_on_the_jail() {
    let test = "oci_layout_and_docker_archive_import_and_boot_on_the_jail";
    if !require_root(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("tiny-oci");
    write_oci(
        &layout,
        &[
            oci_layer(base_layer(&busybox), true),
            oci_layer(upper_layer(), false),
            oci_layer(third_layer(), true),
        ],
    );

    let imported = import(&home, &layout, "tiny");
    assert_eq!(imported["origin"], "imported", "{imported:#}");
    assert_eq!(imported["stats"]["devicesSkipped"], 1, "{imported:#}");
    assert_eq!(imported["stats"]["setidCleared"], 1, "{imported:#}");
    let id = imported["image"]["id"].as_str().expect("id").to_owned();
    let again = import(&home, &layout, "tiny");
    assert_eq!(
        again["origin"], "present",
        "the same image again is already there"
    );
    assert_eq!(again["image"]["id"], id.as_str());

    let listed = images(&home);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    let source = &listed[0]["source"];
    assert_eq!(source["format"], "oci-layout", "{listed:#?}");
    assert_eq!(source["path"], layout.to_str().expect("utf8"));
    assert!(source["manifestDigest"]
        .as_str()
        .expect("digest")
        .starts_with("sha256:"));
    let table = String::from_utf8(home.run(&["image", "ls"]).stdout).expect("utf8");
    assert!(
        table.contains("tiny") && table.contains("imported"),
        "{table}"
    );
    // The config is recorded (Entrypoint/Cmd never run).
    let meta: Value = serde_json::from_slice(
        &std::fs::read(Path::new(listed[0]["path"].as_str().expect("path")).join("image.json"))
            .expect("image.json"),
    )
    .expect("json");
    assert_eq!(meta["config"]["WorkingDir"], "/work", "{meta:#}");
    assert_eq!(meta["config"]["Env"][1], "GREETING=hello", "{meta:#}");
    assert_eq!(meta["config"]["Cmd"][0], "/bin/sh", "{meta:#}");

    let info = home.sandbox("box", &["--image", "tiny", "--backend", "jail"]);
    assert_eq!(info["image"], "tiny", "{info:#}");
    assert_eq!(
        home.sh("box", "cat /top/hello.txt /top/third.txt"),
        "from the top layer\nthree\n"
    );
    assert_eq!(
        home.sh("box", "test -e /data/gone.txt || echo gone"),
        "gone\n"
    );
    assert_eq!(home.sh("box", "cat /data/kept.txt"), "kept\n");
    assert_eq!(
        home.sh("box", "ls /opt"),
        "upper\n",
        "the opaque dir hides the lower entries"
    );
    assert_eq!(
        home.sh("box", "stat -c %a /bin/suid"),
        "755\n",
        "set-id bits cleared"
    );
    assert_eq!(home.sh("box", "test -e /dev/evil || echo none"), "none\n");
    assert_eq!(home.sh("box", "id -u; id -un"), "1000\nsandbox\n");
    assert_eq!(home.sh("box", "test -d /work && echo dir"), "dir\n");
    // The config's Env and WorkingDir apply: its PATH finds its tool, a command given no cwd
    // starts in its WorkingDir, and the sandbox user's HOME stays DynoCap's.
    assert_eq!(
        home.sh("box", "mytool; pwd; echo $GREETING $HOME"),
        "tool ran\n/work\nhello /home/sandbox\n"
    );
    let given = home.exec(
        "box",
        &["--cwd", "/", "--env", "GREETING=mine"],
        "pwd; echo $GREETING",
    );
    assert_eq!(given["stdout"], "/\nmine\n", "{given:#}");
    let job = home.json(&[
        "exec",
        "box",
        "--background",
        "--",
        "mytool > /tmp/job.out; pwd >> /tmp/job.out",
    ]);
    assert!(job["job"].is_string(), "{job:#}");
    assert_eq!(
        home.sh("box", "for i in $(seq 50); do test -s /tmp/job.out && grep -q / /tmp/job.out && break; sleep 0.1; done; cat /tmp/job.out"),
        "tool ran\n/work\n",
        "a job gets the image's Env and WorkingDir too"
    );
    let inspected = home.json(&["image", "inspect", "tiny"]);
    assert_eq!(
        inspected["image"]["config"]["Cmd"][0], "/bin/sh",
        "{inspected:#}"
    );
    let text = String::from_utf8(home.run(&["image", "inspect", "tiny"]).stdout).expect("utf8");
    assert!(
        text.contains("working dir (raw sandboxes): /work")
            && text.contains("cmd (not run): [\"/bin/sh\"]"),
        "{text}"
    );

    let refused = home.json_err(&["image", "rm", "tiny"]);
    assert_eq!(refused["code"], "conflict", "{refused:#}");
    // The host image is no stored image: said so, not "no image named host".
    let host = home.json_err(&["image", "rm", "host"]);
    assert_eq!(host["code"], "invalid_argument", "{host:#}");
    assert!(
        host["message"]
            .as_str()
            .unwrap()
            .contains("nothing to remove"),
        "{host:#}"
    );
    home.json(&["destroy", "box"]);

    // The same image as a classic docker save archive.
    let archive = work.path().join("Tiny_Docker.tar");
    write_docker(
        &archive,
        &[base_layer(&busybox), upper_layer(), third_layer()],
    );
    let docker = home.json(&["image", "import", archive.to_str().expect("utf8")]);
    assert_eq!(
        docker["image"]["name"], "tiny-docker",
        "named from the file: {docker:#}"
    );
    assert_eq!(docker["image"]["source"]["format"], "docker-archive");
    let rootfs = Path::new(docker["image"]["path"].as_str().expect("path")).join("rootfs");
    assert!(rootfs.join("top/third.txt").is_file());
    assert!(!rootfs.join("data/gone.txt").exists());
    home.sandbox("box2", &["--image", "tiny-docker", "--backend", "jail"]);
    assert_eq!(
        home.sh("box2", "ls /opt; cat /top/hello.txt"),
        "upper\nfrom the top layer\n"
    );
    home.json(&["destroy", "box2"]);

    // Newer Docker's save: the OCI layout inside the tar (with its own manifest.json).
    let newer = work.path().join("newer.tar");
    let mut archive = tar::Builder::new(Vec::new());
    archive
        .append_dir_all(".", &layout)
        .expect("tar the layout");
    let mut header = tar::Header::new_ustar();
    let manifest = br#"[{"Config":"blobs/sha256/x","Layers":[]}]"#;
    header.set_size(manifest.len() as u64);
    header.set_mode(0o644);
    archive
        .append_data(&mut header, "manifest.json", &manifest[..])
        .expect("append");
    std::fs::write(&newer, archive.into_inner().expect("tar")).expect("write");
    let inside = home.json(&["image", "import", newer.to_str().expect("utf8")]);
    assert_eq!(inside["image"]["name"], "newer", "{inside:#}");
    assert!(
        inside["image"]["source"]["manifestDigest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "read as the OCI layout it holds: {inside:#}"
    );
    let rootfs = Path::new(inside["image"]["path"].as_str().expect("path")).join("rootfs");
    assert!(rootfs.join("top/third.txt").is_file() && !rootfs.join("opt/lower-a").exists());

    home.json(&["image", "rm", "tiny"]);
    home.json(&["image", "rm", "tiny-docker"]);
    home.json(&["image", "rm", "newer"]);
    assert!(images(&home).is_empty());
}

/// A classic `docker save` archive of an image with a layer twice (the empty layer, say):
/// Docker writes the second `layer.tar` as a symlink to the first, which the import reads as
/// that member; a symlinked member naming anything outside the archive names nothing.
#[test]
fn a_docker_archive_with_a_repeated_layer_imports() {
    let test = "a_docker_archive_with_a_repeated_layer_imports";
    if !require_root(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    let empty = Layer::new().bytes();
    let archive = work.path().join("repeated.tar");
    write_docker(
        &archive,
        &[base_layer(&busybox), empty.clone(), upper_layer(), empty],
    );
    let listing = Command::new("tar")
        .arg("tvf")
        .arg(&archive)
        .output()
        .expect("tar");
    assert!(
        String::from_utf8_lossy(&listing.stdout).contains("3/layer.tar -> ../1/layer.tar"),
        "the archive holds the link Docker writes"
    );
    let imported = import(&home, &archive, "repeated");
    let rootfs = Path::new(imported["image"]["path"].as_str().expect("path")).join("rootfs");
    assert!(rootfs.join("bin/busybox").is_file() && rootfs.join("opt/upper").is_file());

    // A member linked outside the archive (or to a host path) is not read: the layer it
    // stands for is missing.
    for target in ["../../../../etc/passwd", "/etc/passwd"] {
        let mut tar = tar::Builder::new(Vec::new());
        let original = std::fs::read(&archive).expect("read");
        let mut old = tar::Archive::new(&original[..]);
        for entry in old.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let path = entry.path().expect("path").into_owned();
            let mut header = entry.header().clone();
            if path == Path::new("3/layer.tar") {
                tar.append_link(&mut header, &path, target).expect("link");
            } else {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).expect("read");
                tar.append_data(&mut header, &path, &data[..])
                    .expect("append");
            }
        }
        let hostile = work.path().join("hostile.tar");
        std::fs::write(&hostile, tar.into_inner().expect("tar")).expect("write");
        let err = import_err(&home, &hostile, "bad");
        assert!(
            err["message"]
                .as_str()
                .expect("message")
                .contains("3/layer.tar, which is not in it"),
            "{target}: {err:#}"
        );
        assert!(store_entries(&home, "bad").is_empty(), "{target}");
    }
    home.json(&["image", "rm", "repeated"]);
    assert!(images(&home).is_empty());
}

/// A layer may nest directories 256 deep: such an image imports whole and is removed whole.
/// One nesting thousands deep (which aborted the import, its assembly overflowing the stack)
/// is refused naming the bound, leaving nothing listed or stored of it.
#[test]
fn a_layer_nested_past_the_depth_bound_is_refused_and_one_within_it_imports() {
    let test = "a_layer_nested_past_the_depth_bound_is_refused_and_one_within_it_imports";
    if !require_root(test) {
        return;
    }
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    for levels in [257, 3000] {
        let layout = work.path().join(format!("deep{levels}"));
        write_oci(&layout, &[oci_layer(nested_layer(levels), true)]);
        let err = import_err(&home, &layout, "deep");
        assert_eq!(err["code"], "invalid_argument", "{levels}: {err:#}");
        let message = err["message"].as_str().expect("message");
        assert!(
            message.contains("more than 256 directories deep") && message.contains("/d/d/d"),
            "{levels}: {err:#}"
        );
        assert!(images(&home).is_empty(), "{levels}");
        assert!(store_entries(&home, "deep").is_empty(), "{levels}");
        assert!(
            store_leftovers(&home).is_empty(),
            "{levels}: {:?}",
            store_leftovers(&home)
        );
    }
    let layout = work.path().join("deep256");
    write_oci(&layout, &[oci_layer(nested_layer(256), true)]);
    let imported = import(&home, &layout, "deep");
    let rootfs = Path::new(imported["image"]["path"].as_str().expect("path")).join("rootfs");
    let deepest = rootfs.join(vec!["d"; 256].join("/")).join("f");
    assert_eq!(
        std::fs::read_to_string(&deepest).expect("the deepest file"),
        "deep\n"
    );
    home.json(&["image", "rm", "deep"]);
    assert!(images(&home).is_empty());
    assert!(!rootfs.exists());
    assert!(
        std::fs::read_dir(home.path().join("images/.store/layers/sha256"))
            .map_or(0, |dir| dir.count())
            == 0,
        "the layer is freed with its image"
    );
}

#[test]
fn hostile_layers_are_refused_and_nothing_lands_outside() {
    let test = "hostile_layers_are_refused_and_nothing_lands_outside";
    if !require_root(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let outside_path = outside.path().to_str().expect("utf8").to_owned();
    let base = base_layer(&busybox);
    let mut huge = tar::Header::new_gnu();
    huge.as_old_mut().name[..4].copy_from_slice(b"huge");
    huge.set_entry_type(tar::EntryType::Regular);
    huge.set_mode(0o644);
    huge.set_size(1 << 40);
    huge.set_cksum();
    let mut bomb = huge.as_bytes().to_vec();
    bomb.extend(vec![0u8; 1024]);

    let cases: Vec<(&str, Vec<OciLayer>, &[&str], &str)> = vec![
        (
            "dotdot",
            vec![oci_layer(Layer::new().file("../escape", "x").bytes(), true)],
            &[],
            "\"..\"",
        ),
        (
            "absolute",
            vec![oci_layer(
                Layer::new().file("/abs-escape", "x").bytes(),
                false,
            )],
            &[],
            "absolute",
        ),
        (
            "symlinked parent",
            vec![oci_layer(
                Layer::new()
                    .symlink("d", &outside_path)
                    .file("d/x", "x")
                    .bytes(),
                false,
            )],
            &[],
            "symlink",
        ),
        (
            // Across layers: the lower layer's symlink is not replaced by a directory of the
            // upper layer's entry (which would hide all it led to), nor followed.
            "symlinked parent from a lower layer",
            vec![
                oci_layer(Layer::new().symlink("d", &outside_path).bytes(), false),
                oci_layer(Layer::new().file("d/x", "x").bytes(), false),
            ],
            &[],
            "symlink",
        ),
        (
            "whiteout of ..",
            vec![oci_layer(
                Layer::new().file("etc/.wh...", "").bytes(),
                false,
            )],
            &[],
            "whiteout",
        ),
        (
            "hard link to the host's shadow",
            vec![oci_layer(
                Layer::new()
                    .entry(tar::EntryType::Link, "shadow", "/etc/shadow", 0o644, b"")
                    .bytes(),
                false,
            )],
            &[],
            "absolute",
        ),
        (
            "hard link outside",
            vec![oci_layer(
                Layer::new()
                    .entry(
                        tar::EntryType::Link,
                        "shadow",
                        "../../../../etc/shadow",
                        0o644,
                        b"",
                    )
                    .bytes(),
                false,
            )],
            &[],
            "\"..\"",
        ),
        (
            "a bomb past the bound",
            vec![oci_layer(
                Layer::new()
                    .entry(
                        tar::EntryType::Regular,
                        "big",
                        "",
                        0o644,
                        &vec![0u8; 3 << 20],
                    )
                    .bytes(),
                true,
            )],
            &["--max-bytes", "4000000"],
            "--max-bytes",
        ),
        (
            "a huge header",
            vec![oci_layer(bomb, false)],
            &[],
            "--max-bytes",
        ),
        (
            "a huge GNU sparse file",
            vec![oci_layer(sparse_gnu_layer("sparse", 1 << 40), true)],
            &[],
            "--max-bytes",
        ),
        (
            "a huge PAX sparse file",
            vec![oci_layer(sparse_pax_layer("sparse", 1 << 40), true)],
            &[],
            "--max-bytes",
        ),
        (
            "a GNU sparse file past a small bound",
            vec![oci_layer(sparse_gnu_layer("sparse", 64 << 20), false)],
            &["--max-bytes", "4000000"],
            "--max-bytes",
        ),
        (
            "a PAX sparse file within the bound",
            vec![oci_layer(sparse_pax_layer("sparse", 1 << 20), false)],
            &[],
            "GNU tar's PAX form",
        ),
        (
            "zstd",
            vec![OciLayer {
                tar: Layer::new().file("z", "z").bytes(),
                gzip: false,
                media_type: Some("application/vnd.oci.image.layer.v1.tar+zstd"),
            }],
            &[],
            "zstd",
        ),
    ];
    for (n, (what, layers, flags, says)) in cases.into_iter().enumerate() {
        let layout = work.path().join(format!("case{n}"));
        let mut all = vec![oci_layer(base.clone(), true)];
        all.extend(layers);
        write_oci(&layout, &all);
        let mut args = vec![
            "image",
            "import",
            layout.to_str().expect("utf8"),
            "--name",
            "bad",
        ];
        args.extend_from_slice(flags);
        let err = home.json_err(&args);
        assert!(
            err["message"].as_str().expect("message").contains(says),
            "{what}: {err:#}"
        );
        assert!(images(&home).is_empty(), "{what}");
        assert!(
            store_entries(&home, "bad").is_empty(),
            "{what}: {:?}",
            store_entries(&home, "bad")
        );
        assert!(
            store_leftovers(&home).is_empty(),
            "{what}: {:?}",
            store_leftovers(&home)
        );
    }
    // The base every refused import unpacked before its bad layer went into the store all
    // the same, so the next import of an image on that base does not unpack it again.
    let base_in_store = home
        .path()
        .join("images/.store/layers/sha256")
        .join(sha256(&base));
    assert!(
        base_in_store.join("tree/bin/busybox").is_file(),
        "{base_in_store:?}"
    );
    // Nothing was written past a bound: the bombs claimed a TiB, the home holds the base.
    let used = allocated_bytes(home.path());
    assert!(used < 64 << 20, "the home takes {used} bytes");

    // A blob whose bytes do not match its digest.
    let layout = work.path().join("tampered");
    let digests = write_oci(
        &layout,
        &[
            oci_layer(base.clone(), true),
            oci_layer(upper_layer(), false),
        ],
    );
    let blob = layout.join("blobs/sha256").join(&digests[1]);
    let mut bytes = std::fs::read(&blob).expect("read");
    let at = bytes.len() / 3;
    bytes[at] ^= 0xff;
    std::fs::write(&blob, bytes).expect("write");
    let err = import_err(&home, &layout, "bad");
    assert!(
        err["message"]
            .as_str()
            .expect("message")
            .contains("does not match its digest"),
        "{err:#}"
    );
    assert!(images(&home).is_empty());

    // A layout whose blob is a symlink to a host file is refused, not read.
    let layout = work.path().join("symlinked-blob");
    let digests = write_oci(&layout, &[oci_layer(base.clone(), true)]);
    let blob = layout.join("blobs/sha256").join(&digests[0]);
    let host_copy = work.path().join("host-file");
    std::fs::rename(&blob, &host_copy).expect("move the blob out");
    std::os::unix::fs::symlink(&host_copy, &blob).expect("symlink");
    let err = import_err(&home, &layout, "bad");
    assert!(
        err["message"]
            .as_str()
            .expect("message")
            .contains("symlink"),
        "{err:#}"
    );
    assert!(images(&home).is_empty());

    // An image for another platform (a layout of one manifest, its config arm64) is refused
    // as a pull refuses it, not imported to fail with "exec format error" in the sandbox.
    let arm_dir = work.path().join("arm64");
    let arm = Layout::new(&arm_dir);
    let manifest = arm.manifest(&[oci_layer(base.clone(), true)], "arm64", run_config());
    arm.index(vec![manifest.descriptor]);
    let err = import_err(&home, &arm_dir, "bad");
    assert!(
        err["message"]
            .as_str()
            .expect("message")
            .contains("is for linux/arm64"),
        "{err:#}"
    );
    assert!(images(&home).is_empty());

    assert_eq!(std::fs::read_dir(outside.path()).expect("read").count(), 0);
    for escaped in ["/abs-escape", "/escape", "/tmp/escape", "/shadow"] {
        assert!(!Path::new(escaped).exists(), "{escaped}");
    }
    assert!(!home.path().join("images/escape").exists() && !home.path().join("escape").exists());
}

#[test]
fn an_interrupted_import_leaves_nothing_and_the_next_succeeds() {
    let test = "an_interrupted_import_leaves_nothing_and_the_next_succeeds";
    if !require_root(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("tiny");
    write_oci(
        &layout,
        &[
            oci_layer(base_layer(&busybox), true),
            oci_layer(upper_layer(), false),
        ],
    );
    let path = layout.to_str().expect("utf8");
    let out = home
        .command()
        .env("DYNOCAP_FAILPOINTS", "image.import.layer2=kill")
        .args(["--json", "image", "import", path])
        .output()
        .expect("spawn");
    assert!(!out.status.success());
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = store_entries(&home, "tiny");
    assert!(
        left.len() == 1 && left[0].starts_with(".tmp-"),
        "killed mid-unpack: {left:?}"
    );
    assert!(
        images(&home).is_empty(),
        "a half-made import is never listed"
    );

    let imported = home.json(&["image", "import", path]);
    assert_eq!(imported["origin"], "imported", "{imported:#}");
    let left = store_entries(&home, "tiny");
    assert_eq!(
        left,
        [imported["image"]["id"].as_str().expect("id")],
        "the leftover is gone"
    );
    assert_eq!(images(&home).len(), 1);
}

/// A layer with the host's `git` and the libraries `ldd` names, so that a task (whose
/// baseline is a git commit inside the guest) can start on the image.
fn git_layer() -> Vec<u8> {
    let git = Path::new("/usr/bin/git");
    let ldd = std::process::Command::new("ldd")
        .arg(git)
        .output()
        .expect("ldd");
    let mut layer = Layer::new().entry(
        tar::EntryType::Regular,
        "usr/bin/git",
        "",
        0o755,
        &std::fs::read(git).expect("read git"),
    );
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let Some(lib) = line
            .split_whitespace()
            .find(|word| word.starts_with('/'))
            .map(Path::new)
        else {
            continue;
        };
        let rel = lib.strip_prefix("/").expect("absolute");
        layer = layer.entry(
            tar::EntryType::Regular,
            rel.to_str().expect("utf8"),
            "",
            0o755,
            &std::fs::read(lib).expect("read library"),
        );
    }
    layer.bytes()
}

#[test]
fn a_task_starts_on_an_imported_image() {
    let test = "a_task_starts_on_an_imported_image";
    if !require_root(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let home = TestHome::new();
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("withgit");
    write_oci(
        &layout,
        &[
            oci_layer(base_layer(&busybox), true),
            oci_layer(git_layer(), true),
        ],
    );
    home.json(&["image", "import", layout.to_str().expect("utf8")]);
    let project = dynocap_e2e::one_commit_project("hello.txt", "hello\n");
    let started = home.json(&[
        "task",
        "start",
        project.path().to_str().expect("utf8"),
        "--image",
        "withgit",
        "--name",
        "t",
    ]);
    assert_eq!(started["image"], "withgit", "{started:#}");
    assert_eq!(
        home.task_sh(
            "t",
            "pwd; cat hello.txt; echo more > new.txt; echo $GREETING"
        ),
        "/workspace\nhello\nhello\n",
        "a task starts in /workspace whatever WorkingDir says, with the image's Env"
    );
    let diff = String::from_utf8(home.run(&["task", "diff", "t"]).stdout).expect("utf8");
    assert!(diff.contains("+more"), "{diff}");
    home.json(&["rm", "t", "--force", "--purge"]);

    // --image auto: the project's devcontainer.json (JSON with comments) names the image.
    let dot = project.path().join(".devcontainer");
    std::fs::create_dir(&dot).expect("mkdir");
    std::fs::write(
        dot.join("devcontainer.json"),
        "// made by the test\n{\n  \"name\": \"x\", /* the image */ \"image\": \"withgit\",\n}\n",
    )
    .expect("write");
    let auto = |name: &str| {
        home.json(&[
            "task",
            "start",
            project.path().to_str().expect("utf8"),
            "--image",
            "auto",
            "--name",
            name,
        ])
    };
    let chosen = auto("a1");
    assert_eq!(chosen["image"], "withgit", "{chosen:#}");
    let note = chosen["imageNote"].as_str().expect("imageNote");
    assert!(note.contains(".devcontainer/devcontainer.json"), "{note}");
    assert_eq!(
        home.task_sh("a1", "pwd; echo $GREETING"),
        "/workspace\nhello\n"
    );
    home.json(&["rm", "a1", "--force", "--purge"]);
    // One that is built from a Dockerfile: the default image, and why.
    std::fs::write(
        dot.join("devcontainer.json"),
        r#"{"build": {"dockerfile": "Dockerfile"}}"#,
    )
    .expect("write");
    let fallback = auto("a2");
    assert_eq!(fallback["image"], "host", "{fallback:#}");
    let note = fallback["imageNote"].as_str().expect("imageNote");
    assert!(note.contains("Dockerfile build is needed"), "{note}");
    home.json(&["rm", "a2", "--force", "--purge"]);
}

/// A container image carries no kernel: on the vm backend it boots with the kernel of the
/// debian image built on the same host (or of the image `--kernel` names), its own files as
/// the root.
#[test]
fn an_imported_image_boots_in_a_vm_with_the_debian_images_kernel() {
    let test = "an_imported_image_boots_in_a_vm_with_the_debian_images_kernel";
    if !require_root(test) || !dynocap_e2e::images::require_mmdebstrap(test) {
        return;
    }
    let Some(busybox) = busybox(test) else { return };
    let (home, _) = dynocap_e2e::images::debian_home();
    let kernel = images(&home)
        .iter()
        .find(|image| image["name"] == "debian")
        .and_then(|image| image["kernel"].as_str().map(str::to_owned))
        .expect("the debian image has a kernel");
    // Under TCG: these machines have no usable KVM (see tests/vm.rs).
    let home = home.with_env("DYNOCAP_VM_ACCEL", "tcg");
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("tiny-oci");
    write_oci(
        &layout,
        &[
            oci_layer(base_layer(&busybox), true),
            oci_layer(upper_layer(), false),
        ],
    );
    import(&home, &layout, "tiny");
    let info = home.json(&["run", "tinyvm", "--image", "tiny", "--backend", "vm"]);
    assert_eq!(info["backend"], "vm", "{info:#}");
    assert_eq!(info["image"], "tiny", "{info:#}");
    assert_eq!(
        home.sh("tinyvm", "cat /top/hello.txt"),
        "from the top layer\n"
    );
    assert_eq!(
        home.sh("tinyvm", "test -e /data/gone.txt || echo whited-out"),
        "whited-out\n"
    );
    assert_eq!(
        home.sh("tinyvm", "pwd; echo $GREETING"),
        "/\nhello\n",
        "the image's Env applies on the vm too; its WorkingDir /work is not in these layers"
    );
    let release = home.sh("tinyvm", "busybox uname -r");
    assert_eq!(release.trim(), kernel, "the debian image's kernel runs it");
    // The lender is recorded with the sandbox: a recovery boots the same kernel, and the
    // debian image is in use while the sandbox needs it.
    assert_eq!(info["kernel"], "debian", "{info:#}");
    let err = home.json_err(&["image", "rm", "debian"]);
    let message = err["message"].as_str().unwrap_or_default();
    assert!(message.contains("in use by tinyvm"), "{err:#}");
    home.json(&["destroy", "tinyvm"]);

    // A kernel the person names: that image's, though another image with a kernel is newer
    // (a recipe on debian keeps debian's kernel).
    home.json(&[
        "image", "build", "kern2", "--from", "debian", "--env", "K=2",
    ]);
    let refused = |args: &[&str], says: &str| {
        let err = home.json_err(args);
        assert_eq!(err["code"], "invalid_argument", "{err:#}");
        let message = err["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{args:?}: {err:#}");
    };
    let tiny = ["run", "named", "--image", "tiny"];
    refused(
        &[&tiny[..], &["--backend", "jail", "--kernel", "debian"]].concat(),
        "add --backend vm",
    );
    let project = work.path().join("project");
    std::fs::create_dir_all(&project).expect("mkdir project");
    std::fs::write(project.join("README"), "a project\n").expect("write README");
    let project = project.to_string_lossy().into_owned();
    refused(
        &[
            "task",
            "start",
            &project,
            "--name",
            "kt",
            "--image",
            "tiny",
            "--backend",
            "jail",
            "--kernel",
            "debian",
        ],
        "add --backend vm",
    );
    refused(
        &[&tiny[..], &["--backend", "vm", "--kernel", "tiny"]].concat(),
        "image \"tiny\" carries no kernel",
    );
    refused(
        &[&tiny[..], &["--backend", "vm", "--kernel", "nosuch"]].concat(),
        "no image named \"nosuch\"",
    );
    let info = home.json(&[&tiny[..], &["--backend", "vm", "--kernel", "debian"]].concat());
    assert_eq!(info["kernel"], "debian", "{info:#}");
    assert_eq!(home.sh("named", "busybox uname -r").trim(), kernel);
    // The newer image lends nothing to it: it goes; the named one stays in use.
    home.json(&["image", "rm", "kern2"]);
    let err = home.json_err(&["image", "rm", "debian"]);
    let message = err["message"].as_str().unwrap_or_default();
    assert!(message.contains("in use by named"), "{err:#}");
    home.json(&["destroy", "named"]);
}
