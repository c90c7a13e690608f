//! A hostile guest: everything it writes is data to the host. Git configuration, hooks,
//! attributes and filters in the workspace never run on the host; symlinks are never followed
//! and arrive as symlinks; odd names stay inside the repository; huge trees and files do not
//! break the diff or the finish, which verifies or says exactly why not.

use dynocap_e2e::*;

#[test]
fn nothing_the_guest_writes_runs_or_is_followed_on_the_host() {
    if !require_root("nothing_the_guest_writes_runs_or_is_followed_on_the_host") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    sample_project(project.path());
    let markers = tempfile::tempdir().unwrap();
    let marker = |what: &str| markers.path().join(what).display().to_string();
    let task = home.json(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "evil",
    ]);
    let id = task["id"].as_str().unwrap().to_owned();

    // Every way git could be made to run a program, each touching a host path if it ran there.
    let script = format!(
        r#"set -e
        git config core.fsmonitor 'touch {fsmonitor}'
        git config core.hooksPath .evilhooks
        git config diff.external 'touch {external}'
        git config filter.evil.clean 'touch {clean}; cat'
        git config filter.evil.smudge 'touch {smudge}; cat'
        git config diff.evil.textconv 'touch {textconv}; cat'
        printf '* filter=evil diff=evil\n' > .gitattributes
        mkdir -p .evilhooks .husky
        for h in pre-commit post-checkout post-applypatch pre-applypatch post-merge; do
            printf '#!/bin/sh\ntouch {hook}\n' > .git/hooks/$h; chmod +x .git/hooks/$h
            cp .git/hooks/$h .evilhooks/$h
        done
        printf '#!/bin/sh\ntouch {hook}\n' > .husky/pre-commit; chmod +x .husky/pre-commit
        ln -s /etc/passwd evil
        ln -s /root/.ssh/id_rsa key
        printf 'x\n' > '..\..\escape'
        printf 'diff --git a/../../escape b/../../escape\n--- a/../../escape\n+++ b/../../escape\n@@ -0,0 +1 @@\n+pwned\n' > lying-patch.txt
        mkdir many && cd many && seq 1 100000 | xargs touch && cd ..
        truncate -s 1G sparse.bin
        echo done"#,
        fsmonitor = marker("fsmonitor"),
        external = marker("external"),
        clean = marker("clean"),
        smudge = marker("smudge"),
        textconv = marker("textconv"),
        hook = marker("hook"),
    );
    let out = home.exec_in_task("evil", &script, 300);
    assert_eq!(out["exitCode"], 0, "{out:#}");

    let diff = home.run(&["--json", "task", "diff", "evil"]);
    let diff_json: serde_json::Value = serde_json::from_slice(&diff.stdout).unwrap();
    let finished = home.json(&["task", "finish", "evil"]);
    let ran: Vec<_> = std::fs::read_dir(markers.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        ran.is_empty(),
        "guest-controlled programs ran on the host: {ran:?}"
    );
    assert!(!std::path::Path::new("/escape").exists());

    // finish verifies, or says exactly why not.
    if finished["verified"] != true {
        let why = finished["verifyError"]
            .as_str()
            .expect("an unverified finish says why");
        assert!(!why.is_empty());
    }
    let patch =
        std::fs::read_to_string(home.path().join("results").join(&id).join("patch.diff")).unwrap();
    if diff_json.get("error").is_none() {
        let flagged = diff_json["sensitivePaths"].to_string();
        for needle in [
            "\"evil\"",
            "/etc/passwd",
            "\"key\"",
            "/root/.ssh/id_rsa",
            ".gitattributes",
            ".husky/pre-commit",
        ] {
            assert!(flagged.contains(needle), "{needle} not flagged: {flagged}");
        }
        assert!(
            patch.contains("new file mode 120000"),
            "symlinks travel as symlinks"
        );
        assert!(patch.contains("lying-patch.txt"));
        assert_eq!(finished["verified"], true, "{finished:#}");
    }
}

/// Run as the sandbox user: every way it could move itself out of its command's cgroup (so
/// that a timeout would miss it) must fail. It prints each one that worked, then "checked".
/// The sandbox's cgroups show at /sys/fs/cgroup (for runtimes that read their limits), but
/// only through read-only mounts.
const LEAVE_THE_CGROUP: &str = r#"
mine=$(grep ':/exec-[0-9]*$' /proc/self/cgroup)
[ -n "$mine" ] || echo "not in a command cgroup: $(cat /proc/self/cgroup)"
grep -E ' - cgroup2? ' /proc/self/mountinfo | grep -vE '^([^ ]+ ){5}ro,' && echo "a cgroup filesystem is writable"
for f in /proc/1/fd/4/cgroup.procs /proc/1/fd/4/tasks /proc/1/fd/4/cgroup.threads \
         /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/*/cgroup.procs \
         /sys/fs/cgroup/*/*/cgroup.procs /sys/fs/cgroup/*/tasks; do
    [ -e "$f" ] && (echo $$ > "$f") 2>/dev/null && echo "moved through $f"
done
ls /proc/1/fd >/dev/null 2>&1 && echo "the agent's descriptors are readable"
mkdir -p /tmp/cg
mount -t cgroup2 none /tmp/cg 2>/dev/null && echo "mounted cgroup2"
mount -t cgroup -o pids none /tmp/cg 2>/dev/null && echo "mounted a v1 hierarchy"
unshare -Urm true 2>/dev/null && echo "made a user namespace"
unshare -C true 2>/dev/null && echo "made a cgroup namespace"
[ "$(grep ':/exec-[0-9]*$' /proc/self/cgroup)" = "$mine" ] || echo "moved: $(cat /proc/self/cgroup)"
echo checked
"#;

#[test]
fn the_sandbox_user_cannot_leave_its_command_cgroup() {
    if !require_root("the_sandbox_user_cannot_leave_its_command_cgroup") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("stay", &[]);
    let result = home.exec("stay", &[], LEAVE_THE_CGROUP);
    assert_eq!(result["stdout"], "checked\n", "{result:#}");
    assert_eq!(
        home.sh("stay", "id -u"),
        "1000\n",
        "commands run as the sandbox user"
    );
}

/// Run as the sandbox user in the workspace: `dir` (a real directory holding names that
/// exist in each target) trades places with symlinks to root-only places (renameat2's
/// RENAME_EXCHANGE: atomic, and fast enough to land between git's checks), until
/// /tmp/stop-race appears (or a bound, so a lost stop cannot hang the test).
const SWAP_DIR: &str = r#"python3 - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.mkdir("dir")
for name in ("history.bundle", "shadow", "baseline-commit", ".bashrc"):
    with open("dir/" + name, "w") as f:
        f.write("user-data\n")
links = []
for i, target in enumerate(("/var/lib/dynocap", "/etc", "/root")):
    os.symlink(target, "link%d" % i)
    links.append(b"link%d" % i)
rounds = 0
while rounds < 2000000 and not os.path.exists("/tmp/stop-race"):
    for link in links:
        for _ in range(2):
            if libc.renameat2(-100, b"dir", -100, link, 2) != 0:
                raise OSError(ctypes.get_errno(), "renameat2")
    rounds += 1
print("swapped", rounds)
PY
"#;

/// The files `SWAP_DIR` puts in `dir`, named like root-only files in the link targets.
const DECOY_NAMES: [&str; 4] = ["history.bundle", "shadow", "baseline-commit", ".bashrc"];

/// Content in `text` (a patch, or JSON holding one) that is not the decoys' own: a changed
/// file named like a decoy whose added content is anything but `user-data` (the bundle is
/// binary, so it shows as a binary patch), or a line of `/etc/shadow` under any name. The
/// race may show world-readable files of /etc (read as the sandbox user, who may read them
/// anyway): `/etc/passwd` and `/etc/group` also start a line with `root:`, but with the
/// `x` that `/etc/shadow` never has in that place.
fn root_only_content(text: &str) -> Option<String> {
    let text = text.replace("\\n", "\n");
    if let Some(line) = text
        .lines()
        .find(|line| line.starts_with("+root:") && !line.starts_with("+root:x:"))
    {
        return Some(format!("a line of /etc/shadow: {line}"));
    }
    for section in text.split("diff --git ").skip(1) {
        let header = section.lines().next().unwrap_or_default();
        if !DECOY_NAMES
            .iter()
            .any(|name| header.ends_with(&format!("/{name}")))
        {
            continue;
        }
        let foreign = section.lines().skip(1).find(|line| {
            line.starts_with("GIT binary patch")
                || (line.starts_with('+') && !line.starts_with("+++") && *line != "+user-data")
        });
        if let Some(line) = foreign {
            return Some(format!("{header}: {line}"));
        }
    }
    None
}

/// Diffs taken while the sandbox user swaps a directory of the workspace for symlinks to
/// root-only places never contain a byte of a root-only file: git over the workspace runs
/// as the sandbox user (issue 8 item 4). As guest root, about one diff in sixteen carried
/// the history bundle.
#[test]
fn a_symlink_race_during_diffs_never_reads_root_only_files() {
    if !require_root("a_symlink_race_during_diffs_never_reads_root_only_files") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    sample_project(project.path());
    home.json(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "race",
    ]);
    // The race aims at the history bundle the start shipped (in the agent's state directory,
    // which the sandbox user cannot enter), at /etc/shadow, and at /root.
    let probe = home.exec_in_task("race", "cat /var/lib/dynocap/history.bundle", 60);
    assert_ne!(probe["exitCode"], 0, "{probe:#}");

    std::thread::scope(|scope| {
        let swapper = scope.spawn(|| home.exec_in_task("race", SWAP_DIR, 600));
        let (mut succeeded, mut saw_the_directory) = (0, 0);
        for round in 0..50 {
            let out = home.run(&["--json", "task", "diff", "race"]);
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(found) = root_only_content(&text) {
                panic!("diff {round} carries root-only content ({found}):\n{text}");
            }
            if out.status.success() {
                succeeded += 1;
            }
            if text.contains("+user-data") {
                saw_the_directory += 1;
            }
        }
        let stop = home.exec_in_task("race", "touch /tmp/stop-race", 60);
        assert_eq!(stop["exitCode"], 0, "{stop:#}");
        let swapped = swapper.join().expect("the swapping exec");
        assert_eq!(swapped["exitCode"], 0, "{swapped:#}");
        // A diff may fail when a path vanishes under git (the race is meant to be hostile),
        // but some must succeed and meet the real directory, or nothing was tested.
        assert!(succeeded > 0, "no diff succeeded during the race");
        assert!(saw_the_directory > 0, "no diff met the real directory");
        eprintln!(
            "{succeeded} diffs of 50 succeeded, {saw_the_directory} met the real directory; {}",
            swapped["stdout"]
        );
    });

    let finished = home.json(&["task", "finish", "race"]);
    let patch = std::fs::read_to_string(finished["patchPath"].as_str().unwrap()).unwrap();
    if let Some(found) = root_only_content(&patch) {
        panic!("the patch carries root-only content ({found}):\n{patch}");
    }
}
