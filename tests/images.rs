//! Guest images end to end: `dynocap image build|ls|rm`, sandboxes and tasks on the debian
//! image, root inside the guest through the agent's `sudo` (and never in the host image),
//! and builds that stop half-way leaving nothing behind.
//!
//! The debian image is built once per machine into a shared cache (support/images.rs); the
//! first run of this file takes minutes, later ones reuse it.

use std::path::Path;
use std::process::{Command, Stdio};

use dynocap_e2e::images::{debian_home, require_mmdebstrap};
use dynocap_e2e::{
    descendants, processes_in_guest_uid_range, require_root, sample_project, wait_until, TestHome,
};

fn ready(test: &str) -> bool {
    require_root(test) && require_mmdebstrap(test)
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn build_ls_and_rm() {
    if !ready("build_ls_and_rm") {
        return;
    }
    let (home, built) = debian_home();
    assert!(
        ["built", "cache"].contains(&built["origin"].as_str().expect("origin")),
        "{built:#}"
    );
    let id = built["image"]["id"].as_str().expect("id").to_owned();
    assert_eq!(id.len(), 64, "{built:#}");
    // Content-addressed: the same recipe again is the same image, already there.
    let again = home.json(&["image", "build", "debian"]);
    assert_eq!(again["origin"], "present");
    assert_eq!(again["image"]["id"], id.as_str());

    let listed = home.json(&["image", "ls"]);
    let images = listed["images"].as_array().expect("images");
    assert_eq!(images.len(), 1, "{listed:#}");
    let image = &images[0];
    assert_eq!(image["name"], "debian");
    assert!(
        image["sizeBytes"].as_u64().expect("size") > 100 << 20,
        "{image:#}"
    );
    assert_eq!(image["usedBy"].as_array().expect("usedBy").len(), 0);
    // What the vm backend needs is inside: a kernel and its modules.
    let kernel = image["kernel"].as_str().expect("a kernel is inside");
    let rootfs = Path::new(image["path"].as_str().expect("path")).join("rootfs");
    assert!(rootfs.join(format!("boot/vmlinuz-{kernel}")).is_file());
    assert!(rootfs.join(format!("lib/modules/{kernel}")).is_dir());
    let text = String::from_utf8(home.run(&["image", "ls"]).stdout).expect("utf8");
    assert!(
        text.contains("debian") && text.contains(&id[..12]) && text.contains(kernel),
        "{text}"
    );

    let removed = home.json(&["image", "rm", "debian"]);
    assert_eq!(removed["removed"]["id"], id.as_str());
    assert_eq!(
        home.json(&["image", "ls"])["images"]
            .as_array()
            .expect("images")
            .len(),
        0
    );
    assert!(entries(&home.path().join("images/debian"))
        .iter()
        .all(|e| e.starts_with('.')));
    let err = home.json_err(&["image", "rm", "debian"]);
    assert_eq!(err["code"], "not_found", "{err:#}");
}

#[test]
fn a_debian_sandbox_runs_debian() {
    if !ready("a_debian_sandbox_runs_debian") {
        return;
    }
    let (home, built) = debian_home();
    let info = home.sandbox("deb", &["--image", "debian"]);
    assert_eq!(info["image"], "debian");
    assert_eq!(info["imageId"], built["image"]["id"]);
    assert!(home.sh("deb", "cat /etc/debian_version").starts_with("12."));
    let python = home.exec(
        "deb",
        &[],
        "python3 -c 'import sys; print(sys.version_info[0])'",
    );
    assert_eq!(python["exitCode"], 0, "{python:#}");
    assert_eq!(python["stdout"], "3\n");
    assert_eq!(home.sh("deb", "id -u"), "1000\n");
    // The image's files belong to the guest's root, not to nobody.
    assert_eq!(
        home.sh("deb", "stat -c %U:%G /usr/bin/apt-get /etc"),
        "root:root\nroot:root\n"
    );
    let ps = home.json(&["ps"]);
    assert_eq!(ps["sandboxes"][0]["image"], "debian", "{ps:#}");
    let listing = home.json(&["ls"]);
    assert_eq!(listing["sandboxes"][0]["image"], "debian", "{listing:#}");
    let table = String::from_utf8(home.run(&["ps"]).stdout).expect("utf8");
    assert!(
        table.contains("IMAGE") && table.contains("debian"),
        "{table}"
    );
}

#[test]
fn sudo_gives_guest_root_and_the_host_sees_an_unprivileged_uid() {
    if !ready("sudo_gives_guest_root_and_the_host_sees_an_unprivileged_uid") {
        return;
    }
    let (home, _) = debian_home();
    home.sandbox("root", &["--image", "debian"]);
    assert_eq!(home.sh("root", "sudo id -u"), "0\n");
    assert_eq!(
        home.sh("root", "sudo -u root sh -c 'id -un; pwd; echo $HOME'"),
        "root\n/\n/root\n"
    );
    // The caller's directory, stdin and exit code come through.
    assert_eq!(
        home.sh("root", "cd /tmp && echo in | sudo sh -c 'pwd; cat'"),
        "/tmp\nin\n"
    );
    let failed = home.exec("root", &[], "sudo sh -c 'echo oops >&2; exit 7'");
    assert_eq!(failed["exitCode"], 7, "{failed:#}");
    assert_eq!(failed["stderr"], "oops\n");
    // Guest root still cannot reach into the agent (its PID 1): no ptrace, no memory, no fds.
    for probe in [
        "cat /proc/1/environ",
        "readlink /proc/1/fd/0",
        "cat /proc/1/mem",
    ] {
        let result = home.exec("root", &[], &format!("sudo {probe}"));
        assert_ne!(result["exitCode"], 0, "{probe}: {result:#}");
    }
    let missing = home.exec("root", &[], "sudo no-such-program");
    assert_eq!(missing["exitCode"], 127, "{missing:#}");

    // Root-only changes: /etc, and dpkg installing a package (built here, offline).
    let denied = home.exec("root", &[], "echo x > /etc/dynocap-test");
    assert_ne!(
        denied["exitCode"], 0,
        "the sandbox user must not write /etc: {denied:#}"
    );
    home.sh("root", "echo hello | sudo tee /etc/dynocap-test >/dev/null");
    assert_eq!(home.sh("root", "cat /etc/dynocap-test"), "hello\n");
    home.sh(
        "root",
        "set -e; cd /tmp; mkdir -p pkg/DEBIAN pkg/usr/bin; \
         printf 'Package: dynocap-hello\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@example.com>\\nDescription: test\\n' > pkg/DEBIAN/control; \
         printf '#!/bin/sh\\necho hello from a package\\n' > pkg/usr/bin/dynocap-hello; chmod 755 pkg/usr/bin/dynocap-hello; \
         dpkg-deb --root-owner-group --build pkg hello.deb >/dev/null",
    );
    let install = home.exec(
        "root",
        &[],
        "cd /tmp && sudo apt-get install -y -q ./hello.deb",
    );
    assert_eq!(install["exitCode"], 0, "{install:#}");
    assert_eq!(home.sh("root", "dynocap-hello"), "hello from a package\n");
    assert!(home
        .sh("root", "dpkg -s dynocap-hello")
        .contains("Status: install ok installed"));

    // On the host, the guest's root is an unprivileged uid of the sandbox's range: the
    // agent's own, and a command run through sudo has it too.
    home.sh("root", "sudo sleep 3007 >/dev/null 2>&1 &");
    let is_probe = |pid: i32, name: &str| {
        name == "sleep"
            && std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c == b"sleep\x003007\x00")
    };
    let mut found = Vec::new();
    assert!(
        wait_until(10, || {
            found = processes_in_guest_uid_range();
            found.iter().any(|(pid, _, name)| is_probe(*pid, name))
        }),
        "the sudo'd sleep never showed up: {found:?}"
    );
    // Other tests' sandboxes run agents too: the sleep's parent is this sandbox's agent.
    let (sleep_pid, sleep_uid) = found
        .iter()
        .find(|(pid, _, name)| is_probe(*pid, name))
        .map(|(pid, uid, _)| (*pid, *uid))
        .expect("sleep");
    let status = std::fs::read_to_string(format!("/proc/{sleep_pid}/status")).expect("status");
    let parent: i32 = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("PPid");
    let agent_uid = found
        .iter()
        .find(|(pid, _, name)| *pid == parent && name == "agent")
        .map(|(_, uid, _)| *uid)
        .unwrap_or_else(|| panic!("sleep's parent {parent} is not an agent: {found:?}"));
    assert_eq!(sleep_uid, agent_uid, "{found:?}");
    assert_ne!(sleep_uid, 0);
    home.json(&["destroy", "root"]);
}

#[test]
fn a_timeout_stops_what_sudo_started_daemons_included() {
    if !ready("a_timeout_stops_what_sudo_started_daemons_included") {
        return;
    }
    let (home, _) = debian_home();
    home.sandbox("cut", &["--image", "debian"]);
    // The daemon leaves the command's process group and session; only the command's cgroup,
    // which the sudo'd command joins, still holds it.
    let result = home.exec(
        "cut",
        &["--timeout", "3"],
        "sudo sh -c 'setsid sleep 301 </dev/null >/dev/null 2>&1 & echo started; sleep 100'",
    );
    assert_eq!(result["timedOut"], true, "{result:#}");
    assert_eq!(result["stdout"], "started\n", "{result:#}");
    let left = home.exec("cut", &[], "ps -eo args | grep -c '^sleep 301' || true");
    assert_eq!(
        left["stdout"], "0\n",
        "the daemon outlived the timeout: {left:#}"
    );
}

/// The host image's programs find their libraries through the host's linker cache, as on
/// the host: without it each dynamically linked program searched a dozen directories per
/// library, and missed the directories `/etc/ld.so.conf.d` adds.
#[test]
fn the_host_image_uses_the_hosts_linker_cache() {
    if !require_root("the_host_image_uses_the_hosts_linker_cache") {
        return;
    }
    if !Path::new("/etc/ld.so.cache").is_file() {
        eprintln!("SKIPPED the_host_image_uses_the_hosts_linker_cache: this host has no /etc/ld.so.cache (not a glibc system)");
        return;
    }
    let home = TestHome::new();
    home.sandbox("linker", &[]);
    let lookup = home.sh("linker", "LD_DEBUG=libs /bin/true 2>&1");
    assert!(
        lookup.contains("search cache=/etc/ld.so.cache") && !lookup.contains("search path="),
        "the guest's dynamic linker does not use the cache:\n{lookup}"
    );
    let host_listing = Command::new("ldconfig")
        .arg("-p")
        .output()
        .expect("ldconfig -p on the host");
    let guest_listing = home.sh("linker", "ldconfig -p");
    assert_eq!(
        guest_listing,
        String::from_utf8_lossy(&host_listing.stdout),
        "the guest's linker cache is not the host's"
    );
    // Bound read-only: not even the guest's root may change what the host's programs load.
    let write = home.exec("linker", &[], "echo x >> /etc/ld.so.cache");
    assert_ne!(write["exitCode"], 0, "{write:#}");
}

#[test]
fn sudo_in_the_host_image_gives_no_root() {
    if !require_root("sudo_in_the_host_image_gives_no_root") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("plain", &[]);
    let result = home.exec("plain", &[], "sudo id -u");
    assert_ne!(result["exitCode"], 0, "{result:#}");
    assert_ne!(result["stdout"], "0\n", "{result:#}");
    // No broker runs in the host image.
    let socket = home.exec("plain", &[], "test -e /run/dynocap/sudo.sock");
    assert_ne!(socket["exitCode"], 0, "{socket:#}");
}

#[test]
fn a_task_on_the_debian_image() {
    if !ready("a_task_on_the_debian_image") {
        return;
    }
    let (home, _) = debian_home();
    let project = tempfile::tempdir().expect("project");
    sample_project(project.path());
    let path = project.path().to_str().expect("utf8");
    let task = home.json(&[
        "task", "start", path, "--name", "debtask", "--image", "debian",
    ]);
    assert_eq!(task["image"], "debian", "{task:#}");
    assert!(home
        .task_sh("debtask", "cat /etc/debian_version")
        .starts_with("12."));
    home.task_sh(
        "debtask",
        "python3 -c \"open('src/lib.rs','w').write('pub fn answer() -> u32 { 40 + 2 }\\n')\"",
    );
    let diff = home.json(&["task", "diff", "debtask"]);
    assert!(
        diff["patch"]
            .as_str()
            .expect("patch")
            .contains("+pub fn answer() -> u32 { 40 + 2 }"),
        "{diff:#}"
    );
    let listing = home.json(&["ls"]);
    assert_eq!(listing["tasks"][0]["image"], "debian", "{listing:#}");
    let finished = home.json(&["task", "finish", "debtask"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    assert_eq!(finished["files"], 1, "{finished:#}");
}

#[test]
fn a_missing_image_names_the_build_command() {
    if !require_root("a_missing_image_names_the_build_command") {
        return;
    }
    let home = TestHome::new();
    let err = home.json_err(&["run", "nope", "--image", "debian"]);
    assert_eq!(err["code"], "invalid_argument", "{err:#}");
    let message = err["message"].as_str().expect("message");
    assert!(message.contains("dynocap image build debian"), "{message}");
    let err = home.json_err(&["run", "nope", "--image", "alpine"]);
    assert!(
        err["message"]
            .as_str()
            .expect("message")
            .contains("no image named"),
        "{err:#}"
    );
    // DYNOCAP_IMAGE (the MCP server's default) is checked the same way.
    let defaulted = TestHome::new().with_env("DYNOCAP_IMAGE", "debian");
    let err = defaulted.json_err(&["run", "nope"]);
    assert!(err["message"]
        .as_str()
        .expect("message")
        .contains("dynocap image build debian"));
    assert_eq!(
        home.json(&["ps"])["sandboxes"]
            .as_array()
            .expect("list")
            .len(),
        0
    );
}

#[test]
fn a_missing_mmdebstrap_names_the_package_to_install() {
    if !require_root("a_missing_mmdebstrap_names_the_package_to_install") {
        return;
    }
    let home = TestHome::new();
    let out = home
        .command()
        .env("PATH", home.path())
        .args(["--json", "image", "build", "debian"])
        .output()
        .expect("spawn dynocap");
    assert!(!out.status.success());
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let message = value["error"]["message"].as_str().expect("message");
    assert!(message.contains("apt-get install mmdebstrap"), "{message}");
    assert!(entries(&home.path().join("images")).is_empty());
}

#[test]
fn rm_is_refused_while_a_sandbox_uses_the_image() {
    if !ready("rm_is_refused_while_a_sandbox_uses_the_image") {
        return;
    }
    let (home, _) = debian_home();
    home.sandbox("user", &["--image", "debian"]);
    let err = home.json_err(&["image", "rm", "debian"]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    assert!(
        err["message"].as_str().expect("message").contains("user"),
        "{err:#}"
    );
    let listed = home.json(&["image", "ls"]);
    assert_eq!(listed["images"][0]["usedBy"][0], "user", "{listed:#}");
    // Still there and still working.
    assert!(home
        .sh("user", "cat /etc/debian_version")
        .starts_with("12."));
    home.json(&["destroy", "user"]);
    home.json(&["image", "rm", "debian"]);
}

/// Starts `dynocap image build debian` in a home with no cache (so mmdebstrap really runs)
/// and waits until mmdebstrap has started writing the rootfs.
fn build_until_mmdebstrap_runs(home: &TestHome) -> (std::process::Child, i32) {
    let child = home
        .command()
        .env_remove("DYNOCAP_IMAGE_CACHE")
        .args(["image", "build", "debian"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dynocap");
    let parent = i32::try_from(child.id()).expect("pid");
    let mut mmdebstrap = None;
    let started = wait_until(120, || {
        mmdebstrap = descendants(parent).into_iter().find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "mmdebstrap")
        });
        let tmp = entries(&home.path().join("images/debian"))
            .into_iter()
            .find(|e| e.starts_with(".tmp-"));
        mmdebstrap.is_some()
            && tmp.is_some_and(|t| {
                !entries(&home.path().join("images/debian").join(t).join("rootfs")).is_empty()
            })
    });
    assert!(started, "mmdebstrap never started writing the rootfs");
    (child, mmdebstrap.expect("pid"))
}

fn assert_nothing_left(home: &TestHome) {
    let left: Vec<_> = entries(&home.path().join("images/debian"))
        .into_iter()
        .filter(|e| e != ".build.lock")
        .collect();
    assert!(left.is_empty(), "a stopped build left {left:?}");
    assert_eq!(
        home.json(&["image", "ls"])["images"]
            .as_array()
            .expect("images")
            .len(),
        0
    );
}

#[test]
fn an_interrupted_build_leaves_nothing() {
    if !ready("an_interrupted_build_leaves_nothing") {
        return;
    }
    // mmdebstrap killed: the build fails and cleans up.
    let home = TestHome::new();
    let (mut child, mmdebstrap) = build_until_mmdebstrap_runs(&home);
    Command::new("kill")
        .args(["-KILL", &mmdebstrap.to_string()])
        .status()
        .expect("kill");
    let status = child.wait().expect("wait");
    assert!(!status.success());
    assert_nothing_left(&home);

    // Ctrl-C (SIGINT to dynocap): it stops mmdebstrap and cleans up.
    let (mut child, mmdebstrap) = build_until_mmdebstrap_runs(&home);
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    let status = child.wait().expect("wait");
    assert!(!status.success());
    assert!(wait_until(30, || !Path::new(&format!(
        "/proc/{mmdebstrap}"
    ))
    .exists()));
    assert_nothing_left(&home);

    // dynocap itself killed: mmdebstrap dies with it, and the next build removes the dead
    // build's directory before anything else.
    let (mut child, mmdebstrap) = build_until_mmdebstrap_runs(&home);
    child.kill().expect("kill");
    child.wait().expect("wait");
    assert!(wait_until(30, || !Path::new(&format!(
        "/proc/{mmdebstrap}"
    ))
    .exists()));
    let (mut child, _) = build_until_mmdebstrap_runs(&home);
    let dead: Vec<_> = entries(&home.path().join("images/debian"))
        .into_iter()
        .filter(|e| e.starts_with(".tmp-"))
        .collect();
    assert_eq!(
        dead.len(),
        1,
        "the dead build's directory is still there: {dead:?}"
    );
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    child.wait().expect("wait");
    assert_nothing_left(&home);
}

/// A flat apt repository holding one small package, under the fixture's HTTPS server at
/// `https://other.test/apt/`.
fn serve_apt_repository(fix: &dynocap_e2e::netfix::NetFix) {
    dynocap_e2e::images::flat_apt_repository(
        &fix.dir().join("www/apt"),
        fix.dir(),
        "dynocap-served",
        "served over https",
    );
}

#[test]
fn sudo_apt_get_install_through_the_filtered_proxy() {
    use dynocap_e2e::netfix::{NetFix, OTHER_HOST};
    if !ready("sudo_apt_get_install_through_the_filtered_proxy") {
        return;
    }
    let fix = NetFix::start();
    serve_apt_repository(&fix);
    let (mut home, _) = debian_home();
    for (key, value) in fix.product_env() {
        home = home.with_env(&key, &value);
    }
    home.sandbox(
        "apt",
        &[
            "--image",
            "debian",
            "--network",
            "filtered",
            "--allow-host",
            OTHER_HOST,
        ],
    );
    // Only the fixture's repository: nothing may try deb.debian.org from a test. apt trusts
    // the test CA through the bundle the agent writes for DYNOCAP_EXTRA_CA, and reaches the
    // server through the proxy settings every command gets (sudo keeps them).
    home.sh(
        "apt",
        "sudo rm -f /etc/apt/sources.list && \
         echo 'deb [trusted=yes] https://other.test/apt ./' | sudo tee /etc/apt/sources.list.d/fixture.list >/dev/null && \
         printf 'Acquire::https::CaInfo \"%s\";\\n' \"$SSL_CERT_FILE\" | sudo tee /etc/apt/apt.conf.d/90fixture-ca >/dev/null",
    );
    let update = home.exec("apt", &["--timeout", "120"], "sudo apt-get update");
    assert_eq!(update["exitCode"], 0, "{update:#}");
    let install = home.exec(
        "apt",
        &["--timeout", "120"],
        "sudo apt-get install -y -q dynocap-served",
    );
    assert_eq!(install["exitCode"], 0, "{install:#}");
    assert_eq!(home.sh("apt", "dynocap-served"), "served over https\n");
    assert!(
        fix.https.requests().iter().any(|r| r["status"] == 200
            && r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/dynocap-served_1.0_all.deb"))),
        "the package did not come from the fixture: {:?}",
        fix.https.requests()
    );
}

#[test]
fn an_unsaved_debian_task_is_recovered_on_its_own_image() {
    if !ready("an_unsaved_debian_task_is_recovered_on_its_own_image") {
        return;
    }
    let (home, _) = debian_home();
    let project = tempfile::tempdir().expect("project");
    sample_project(project.path());
    let path = project.path().to_str().expect("utf8");
    home.json(&["task", "start", path, "--name", "kept", "--image", "debian"]);
    home.task_sh(
        "kept",
        "echo root-work | sudo tee /etc/kept >/dev/null; echo kept-work > notes.txt",
    );
    let out = Command::new("sqlite3")
        .arg(home.path().join("catalog.db"))
        .arg("SELECT supervisor_pid FROM sandboxes WHERE name = 'kept'")
        .output()
        .expect("sqlite3");
    let supervisor: i32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a supervisor pid");
    Command::new("kill")
        .args(["-KILL", &supervisor.to_string()])
        .status()
        .expect("kill");
    assert!(wait_until(30, || {
        let listing = home.json(&["ls"]);
        listing["tasks"][0]["state"] == "unsaved"
    }));
    // Its kept layer sits on this image: removing the image is refused until it is saved.
    let err = home.json_err(&["image", "rm", "debian"]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    let finished = home.json(&["task", "finish", "kept"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    let patch =
        std::fs::read_to_string(finished["patchPath"].as_str().expect("patchPath")).expect("patch");
    assert!(patch.contains("+kept-work"), "{patch}");
    home.json(&["image", "rm", "debian"]);
}

/// A build whose output's reader went away (`dynocap image build debian 2>&1 | head -1`)
/// still ends with its image in the home, then exits 141 as SIGPIPE would have ended it: its
/// progress lines on stderr used to panic the build's thread and abandon the build.
#[test]
fn a_build_whose_reader_went_away_finishes_then_exits_141() {
    if !ready("a_build_whose_reader_went_away_finishes_then_exits_141") {
        return;
    }
    // The shared cache holds the image after this; the build below copies it, printing its
    // progress line.
    let (_, built) = debian_home();
    let home = dynocap_e2e::images::cached_home();
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let status = home
        .command()
        .args(["image", "build", "debian"])
        .stdout(writer.try_clone().expect("dup the pipe"))
        .stderr(writer)
        .status()
        .expect("spawn dynocap");
    assert_eq!(status.code(), Some(141), "{status:?}");
    let listed = home.json(&["image", "ls"]);
    assert!(
        listed["images"]
            .as_array()
            .expect("images")
            .iter()
            .any(|i| i["name"] == "debian" && i["id"] == built["image"]["id"]),
        "the build finished: {listed:#}\nbuilt: {built:#}"
    );
}
