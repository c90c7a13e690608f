//! `task start --repo` end to end against the loopback fixtures of tests/support/netfix.rs,
//! for what a clone must get right beyond fetching:
//! - the host's baseline is the guest's checkout byte for byte, whatever the repository's
//!   `.gitattributes` say (`export-ignore`, `export-subst`, `eol`, `ident`), so a patch to
//!   a file `git archive` would leave out or rewrite verifies;
//! - credentials in an https URL are used for the fetch and then found nowhere: not in the
//!   record, the catalog and its WAL, logs, `ls --json`, results, the guest's `.git/config`,
//!   nor in any process's arguments or environment while the clone runs;
//! - SIGINT or SIGTERM to a start whose clone hangs ends it at once and leaves nothing; so
//!   does SIGKILL, which leaves the starter no chance to cancel (the supervisor notices);
//! - a server speaking only git's dumb HTTP protocol gives the clone a smart one gives.
//!
//! Needs root.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use dynocap_e2e::netfix::*;
use dynocap_e2e::*;
use serde_json::Value;

/// A home whose `dynocap` commands reach the fixture under its names and trust its CA.
fn home_for(fix: &NetFix) -> TestHome {
    let mut home = TestHome::new();
    for (key, value) in fix.product_env() {
        home = home.with_env(&key, &value);
    }
    home
}

fn start_repo(home: &TestHome, url: &str, flags: &[&str]) -> Value {
    let mut args = vec!["task", "start", "--repo", url];
    args.extend_from_slice(flags);
    home.json(&args)
}

/// stdout of a command that must succeed in the task.
fn ok_in(home: &TestHome, task: &str, command: &str) -> String {
    let result = home.exec_in_task(task, command, 300);
    assert_eq!(result["exitCode"], 0, "`{command}`: {result:#}");
    result["stdout"].as_str().unwrap_or_default().to_owned()
}

/// No task, no sandbox, no supervisor: the home as it was before the start.
fn assert_nothing_left(home: &TestHome) {
    let ls = home.json(&["ls"]);
    assert_eq!(ls["tasks"], serde_json::json!([]), "{ls:#}");
    assert_eq!(ls["sandboxes"], serde_json::json!([]), "{ls:#}");
    assert!(home.supervisor_pids().is_empty());
    for dir in ["sandboxes", "results"] {
        let left: Vec<_> = std::fs::read_dir(home.path().join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(
            left.is_empty(),
            "left in {dir}: {left:?}\n{}",
            left.iter()
                .map(|path| describe_leftover(home, path))
                .collect::<String>()
        );
    }
}

/// What a leftover state directory holds and what its supervisor logged, for the failure.
fn describe_leftover(home: &TestHome, path: &std::path::Path) -> String {
    let entries: Vec<String> = std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let id = path.file_name().unwrap_or_default().to_string_lossy();
    let log = std::fs::read_to_string(home.path().join("logs").join(format!("{id}.log")))
        .unwrap_or_else(|err| format!("(no log: {err})"));
    format!("{} holds {entries:?}; its log:\n{log}\n", path.display())
}

// --- the baseline is the checkout -----------------------------------------------------------

/// The files of the attributes repository and what a checkout makes of them.
const ATTRIBUTES: &str = "\
ignored.txt export-ignore
ignored-dir export-ignore
subst.txt export-subst
crlf.txt text eol=crlf
ident.txt ident
";

/// Adds `attrs.git` to the fixture's git root: a repository whose `.gitattributes` make
/// `git archive` differ from a checkout in every way it can, beside every other kind of
/// entry a checkout writes (an executable, a symlink, a submodule's empty directory).
/// Returns its head commit.
fn attributes_repo(fix: &NetFix) -> String {
    let work = fix.dir().join("attrs-work");
    let at = |p: &str| work.join(p);
    git(
        fix.dir(),
        &["init", "-q", "-b", "main", work.to_str().expect("utf-8")],
    );
    write(&at(".gitattributes"), ATTRIBUTES);
    write(&at("ignored.txt"), "left out of archives\n");
    write(&at("ignored-dir/inner.txt"), "a directory left out\n");
    write(&at("subst.txt"), "commit $Format:%H$\n");
    write(&at("crlf.txt"), "one\ntwo\n");
    write(&at("ident.txt"), "id $Id$\n");
    write(&at("plain.txt"), "plain\n");
    write(&at("run.sh"), "#!/bin/sh\necho run\n");
    chmod(&at("run.sh"), 0o755);
    std::os::unix::fs::symlink("plain.txt", at("link")).expect("symlink");
    git(&work, &["add", "-A"]);
    // A submodule without its repository: the checkout leaves an empty directory.
    git(
        &work,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{},vendor/sub", fix.repo.head),
        ],
    );
    git(&work, &["commit", "-q", "-m", "attributes"]);
    let head = git(&work, &["rev-parse", "HEAD"]).trim().to_owned();
    let bare = fix.repo.root.join("attrs.git");
    git(
        fix.dir(),
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().expect("utf-8"),
            bare.to_str().expect("utf-8"),
        ],
    );
    git(&bare, &["update-server-info"]);
    head
}

/// A shell command listing the files under `.` (but `skip`) with their SHA-256, and the
/// symlinks with their targets, sorted.
fn listing_command(skip: &str) -> String {
    format!(
        "find . -path ./{skip} -prune -o -type f -print0 | sort -z | xargs -0 sha256sum; \
         find . -path ./{skip} -prune -o -type l -printf '%p -> %l\\n' | sort"
    )
}

/// [`listing_command`] of the task's baseline copy on the host, unpacked.
fn baseline_listing(home: &TestHome, id: &str) -> String {
    let tar = home.path().join("sandboxes").join(id).join("baseline.tar");
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -xf \"$1\" && {}",
            listing_command(".dynocap-none")
        ))
        .arg("sh")
        .arg(&tar)
        .current_dir(dir.path())
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 listing")
}

#[test]
fn the_baseline_is_the_checkout_whatever_the_attributes_say() {
    if !require_root("the_baseline_is_the_checkout_whatever_the_attributes_say") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix);
    let head = attributes_repo(&fix);
    let url = format!("https://{GIT_HOST}/attrs.git");
    for history in ["head", "none", "branches"] {
        let name = format!("attrs-{history}");
        let task = start_repo(&home, &url, &["--name", &name, "--history", history]);
        // The host's baseline holds the guest's files byte for byte, and its symlinks.
        let id = task["id"].as_str().expect("a task id");
        assert_eq!(
            baseline_listing(&home, id),
            ok_in(&home, &name, &listing_command(".git")),
            "{history}"
        );
        // The checkout: every file there, as a checkout writes it.
        let files = ok_in(
            &home,
            &name,
            "find . -path ./.git -prune -o -type f -print | sort",
        );
        assert_eq!(
            files,
            "./.gitattributes\n./crlf.txt\n./ident.txt\n./ignored-dir/inner.txt\n./ignored.txt\n./plain.txt\n./run.sh\n./subst.txt\n",
        );
        assert_eq!(
            ok_in(&home, &name, "readlink link; ls -A vendor/sub; ./run.sh"),
            "plain.txt\nrun\n"
        );
        assert_eq!(ok_in(&home, &name, "cat subst.txt"), "commit $Format:%H$\n");
        assert_eq!(
            ok_in(&home, &name, "od -c crlf.txt | head -1 | tr -s ' '"),
            "0000000 o n e \\r \\n t w o \\r \\n\n"
        );
        let ident = ok_in(&home, &name, "cat ident.txt");
        assert!(
            ident.starts_with("id $Id: ") && ident.ends_with(" $\n"),
            "{ident}"
        );
        // A change to each of them shows alone and verifies, the `ident` file with its
        // `$Id: …$` as the checkout expanded it.
        ok_in(
            &home,
            &name,
            "echo more >> ignored.txt && echo more >> ignored-dir/inner.txt && \
             echo more >> subst.txt && printf 'three\\r\\n' >> crlf.txt && \
             echo more >> plain.txt && echo more >> run.sh && ln -sfn crlf.txt link && \
             echo more >> ident.txt",
        );
        let diff = home.json(&["task", "diff", &name]);
        assert_eq!(diff["files"], 8, "{diff:#}");
        let finished = home.json(&["task", "finish", &name]);
        assert_eq!(finished["verified"], true, "{history}: {finished:#}");
    }
    // The fixture's commit is the one each start reports.
    let task = start_repo(&home, &url, &["--name", "again", "--history", "head"]);
    assert_eq!(task["source"]["baseCommit"], head);
}

/// The same on the `vm` backend, where the guest is a VM of its own, in one start that takes
/// both paths at once: the attributes repository from a dumb-HTTP-only server.
#[test]
fn a_clone_in_a_vm_is_its_checkout_even_from_a_dumb_server() {
    let test = "a_clone_in_a_vm_is_its_checkout_even_from_a_dumb_server";
    let Some(home) = TestHome::on(Backend::Vm, test) else {
        return;
    };
    let fix = NetFix::start();
    let mut home = home;
    for (key, value) in fix.product_env() {
        home = home.with_env(&key, &value);
    }
    let head = attributes_repo(&fix);
    let url = fix.dumb_repo_url("attrs.git");
    let task = start_repo(&home, &url, &["--name", "vm", "--history", "head"]);
    assert_eq!(task["backend"], "vm", "{task:#}");
    assert_eq!(task["source"]["baseCommit"], head, "{task:#}");
    assert_eq!(
        ok_in(
            &home,
            "vm",
            "cat subst.txt; ls ignored-dir; git rev-list --count HEAD"
        ),
        "commit $Format:%H$\ninner.txt\n1\n"
    );
    ok_in(
        &home,
        "vm",
        "echo more >> ignored.txt && echo more >> subst.txt && ln -sfn crlf.txt link && \
         echo more >> ident.txt",
    );
    let finished = home.json(&["task", "finish", "vm"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
}

// --- credentials ----------------------------------------------------------------------------

/// Files under `dir` whose bytes contain `needle`, disk images aside: the sandboxes' (the
/// guest's own files are searched from inside it) and the empty disk templates of `cache/`
/// (made before any clone, gigabytes of zeros to read).
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                if !matches!(name, "sandboxes" | "cache") {
                    stack.push(path);
                }
            } else if kind.is_file() {
                if let Ok(bytes) = std::fs::read(&path) {
                    if bytes.windows(needle.len()).any(|w| w == needle) {
                        found.push(path);
                    }
                }
            }
        }
    }
    found
}

/// Processes (other than `except`) whose arguments or environment hold `needle`.
fn processes_holding(needle: &str, except: &[u32]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if except.contains(&pid) || pid == std::process::id() {
            continue;
        }
        for what in ["cmdline", "environ"] {
            let bytes = std::fs::read(entry.path().join(what)).unwrap_or_default();
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                found.push(format!(
                    "{pid} ({what}): {}",
                    String::from_utf8_lossy(&cmdline).replace('\0', " ")
                ));
            }
        }
    }
    found
}

/// Everything of `home` the token must not be in: its files (record.json, catalog.db and its
/// WAL, logs, results), `ls --json`, and `extra` (a command's output).
fn assert_token_nowhere(home: &TestHome, extra: &[&[u8]]) {
    let leaked = files_containing(home.path(), PRIVATE_TOKEN.as_bytes());
    assert!(leaked.is_empty(), "the token is in {leaked:?}");
    let ls = home.run(&["--json", "ls"]);
    for bytes in [&ls.stdout[..], &ls.stderr[..]]
        .into_iter()
        .chain(extra.iter().copied())
    {
        assert!(
            !String::from_utf8_lossy(bytes).contains(PRIVATE_TOKEN),
            "the token is shown: {}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn credentials_in_the_url_are_used_for_the_fetch_and_kept_nowhere() {
    if !require_root("credentials_in_the_url_are_used_for_the_fetch_and_kept_nowhere") {
        return;
    }
    let fix = NetFix::start();
    // `unreachable.test` resolves to a loopback address where nothing listens.
    let dead = loop {
        let addr = random_loopback();
        if std::net::TcpStream::connect((addr, 443)).is_err() {
            break addr;
        }
    };
    let resolve = format!("{},unreachable.test:443:{dead}", fix.resolve_all());
    let home = home_for(&fix).with_env(product::ENV_RESOLVE, &resolve);

    // A good password: the clone works, and git in the guest has no credentials afterwards.
    let url = fix.private_repo_url(PRIVATE_TOKEN);
    let out = home
        .command()
        .args([
            "--json", "task", "start", "--repo", &url, "--name", "private",
        ])
        .output()
        .expect("spawn dynocap");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let task: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(task["source"]["baseCommit"], fix.repo.head, "{task:#}");
    assert_eq!(
        task["source"]["repositoryUrl"],
        format!("https://{GIT_HOST}/private/{REPO}")
    );
    assert_eq!(
        ok_in(&home, "private", "git config --get remote.origin.url"),
        format!("https://{GIT_HOST}/private/{REPO}\n")
    );
    let found = ok_in(
        &home,
        "private",
        &format!(
            "grep -rls --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr -e '[{}]{}' / ; true",
            &PRIVATE_TOKEN[..1],
            &PRIVATE_TOKEN[1..]
        ),
    );
    assert_eq!(found, "", "the token is in the guest's files");
    ok_in(&home, "private", "echo changed >> README.md");
    let finished = home.json(&["task", "finish", "private"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    assert_token_nowhere(&home, &[&out.stdout, &out.stderr]);

    // A wrong password, and a host that does not answer: failed starts, the token nowhere.
    for (url, says) in [
        (
            fix.private_repo_url("ghp_NetfixS3cretTok3nNeverKeptWRONG"),
            "401",
        ),
        (
            format!("https://{PRIVATE_USER}:{PRIVATE_TOKEN}@unreachable.test/repo.git"),
            "unreachable.test",
        ),
    ] {
        let out = home
            .command()
            .args([
                "--json", "task", "start", "--repo", &url, "--name", "failed",
            ])
            .output()
            .expect("spawn dynocap");
        assert!(!out.status.success());
        let err: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let message = err["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(says) || message.contains("Authentication failed"),
            "{err:#}"
        );
        assert_token_nowhere(&home, &[&out.stdout, &out.stderr]);
    }

    // While a clone runs (here, one the server never answers after authenticating), no
    // process has the token in its arguments or environment: not even the command the user
    // typed it in, which blanks it in its own command line once parsed.
    let hanging = format!("https://{PRIVATE_USER}:{PRIVATE_TOKEN}@{GIT_HOST}/hang/{REPO}");
    let mut client = spawn_start(&home, &hanging, "hanging");
    wait_for_request(&fix, "/hang/");
    let holding = processes_holding(PRIVATE_TOKEN, &[]);
    let shown = std::fs::read(format!("/proc/{}/cmdline", client.id())).unwrap_or_default();
    interrupt(&mut client, libc::SIGINT);
    assert!(holding.is_empty(), "the token in processes: {holding:#?}");
    let shown = String::from_utf8_lossy(&shown).replace('\0', " ");
    assert!(
        shown.contains(&format!(
            "https://{}@{GIT_HOST}",
            "*".repeat(PRIVATE_USER.len() + 1 + PRIVATE_TOKEN.len())
        )),
        "{shown}"
    );
    assert_token_nowhere(&home, &[]);
}

// --- cancelling a start ---------------------------------------------------------------------

/// `dynocap task start --repo URL --name NAME`, in the background.
fn spawn_start(home: &TestHome, url: &str, name: &str) -> Child {
    home.command()
        .args(["--json", "task", "start", "--repo", url, "--name", name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dynocap")
}

/// Waits until the fixture got a request whose path starts with `prefix`.
fn wait_for_request(fix: &NetFix, prefix: &str) {
    assert!(
        wait_until(300, || !fix.https.requests_for(prefix).is_empty()),
        "no request for {prefix}: {:#?}",
        fix.https.requests()
    );
}

/// Sends `signal` to `child` and waits for it: it must end of that signal.
fn interrupt(child: &mut Child, signal: i32) -> std::process::Output {
    // SAFETY: kill sends a signal to our own child, which has not been waited for yet.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let status = child.wait().expect("wait for dynocap");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    use std::io::Read;
    if let Some(mut s) = child.stdout.take() {
        s.read_to_end(&mut stdout).ok();
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_end(&mut stderr).ok();
    }
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(signal),
        "{status}: {}",
        String::from_utf8_lossy(&stderr)
    );
    std::process::Output {
        status,
        stdout,
        stderr,
    }
}

#[test]
fn a_signal_ends_a_start_whose_clone_hangs_and_leaves_nothing() {
    if !require_root("a_signal_ends_a_start_whose_clone_hangs_and_leaves_nothing") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let before = fix.https.requests_for("/hang/").len();
        let mut client = spawn_start(&home, &fix.hanging_repo_url(), "hangs");
        assert!(
            wait_until(300, || fix.https.requests_for("/hang/").len() > before),
            "the clone never reached the server"
        );
        let supervisors = home.supervisor_pids();
        assert_eq!(supervisors.len(), 1, "{supervisors:?}");
        let guest: Vec<i32> = descendants(supervisors[0]);
        let out = interrupt(&mut client, signal);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cancelled"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for pid in supervisors.iter().chain(&guest) {
            assert!(
                wait_until(10, || !pid_exists(*pid)),
                "process {pid} of the cancelled start is still running"
            );
        }
        assert_nothing_left(&home);
    }
    // The name is free, and a start that is not interrupted still works.
    start_repo(&home, &fix.https_repo_url(), &["--name", "hangs"]);
}

/// Waits (generously: the machine is shared) until no process of `home` runs, and says which
/// ones still do if some never end.
fn assert_no_process_left(home: &TestHome, what: &str) {
    use dynocap_e2e::home_processes::home_processes;
    assert!(
        wait_until(120, || home_processes(home.path()).is_empty()),
        "{what}: processes of the home still run: {:#?}",
        home_processes(home.path())
    );
}

#[test]
fn a_start_whose_starter_is_killed_ends_and_leaves_nothing() {
    if !require_root("a_start_whose_starter_is_killed_ends_and_leaves_nothing") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix);
    // SIGKILL leaves the starter no chance to cancel; the supervisor notices that nobody reads
    // its ready pipe any more. During the clone (the server never answers), and right away,
    // during the boot, before the clone was even asked for.
    for wait_for_the_clone in [true, false] {
        let before = fix.https.requests_for("/hang/").len();
        let mut client = spawn_start(&home, &fix.hanging_repo_url(), "orphaned");
        if wait_for_the_clone {
            assert!(
                wait_until(300, || fix.https.requests_for("/hang/").len() > before),
                "the clone never reached the server"
            );
        } else {
            assert!(
                wait_until(300, || !home.supervisor_pids().is_empty()),
                "no supervisor started"
            );
        }
        let started: Vec<i32> = home
            .supervisor_pids()
            .into_iter()
            .flat_map(|pid| std::iter::once(pid).chain(descendants(pid)))
            .collect();
        assert!(!started.is_empty());
        interrupt(&mut client, libc::SIGKILL);
        assert_no_process_left(&home, "after the starter was killed");
        for pid in &started {
            assert!(
                !dynocap_e2e::home_processes::is_running(*pid),
                "process {pid} of the start still runs: {:?}",
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
            );
        }
        assert_nothing_left(&home);
    }
    // The name is free.
    start_repo(&home, &fix.https_repo_url(), &["--name", "orphaned"]);
}

// --- dumb HTTP ------------------------------------------------------------------------------

#[test]
fn a_dumb_http_server_gives_the_clone_a_smart_one_gives() {
    if !require_root("a_dumb_http_server_gives_the_clone_a_smart_one_gives") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix);
    let dumb = fix.dumb_repo_url(REPO);
    let smart = fix.https_repo_url();
    for history in ["head", "none", "branches"] {
        let (d, s) = (format!("dumb-{history}"), format!("smart-{history}"));
        let dumb_task = start_repo(&home, &dumb, &["--name", &d, "--history", history]);
        let smart_task = start_repo(&home, &smart, &["--name", &s, "--history", history]);
        assert_eq!(
            dumb_task["source"]["baseCommit"], fix.repo.head,
            "{dumb_task:#}"
        );
        assert_eq!(
            dumb_task["source"]["branch"],
            smart_task["source"]["branch"]
        );
        assert_eq!(dumb_task["source"]["files"], smart_task["source"]["files"]);
        // The same workspace, and the same repository in it.
        let listing =
            "find . -path ./.git -prune -o -type f -print0 | sort -z | xargs -0 sha256sum";
        assert_eq!(ok_in(&home, &d, listing), ok_in(&home, &s, listing));
        let repo_view = "git rev-parse --is-shallow-repository 2>/dev/null; \
             git rev-list --count HEAD 2>/dev/null; git branch -a 2>/dev/null; \
             git tag 2>/dev/null; git status --porcelain 2>/dev/null; ls -a";
        assert_eq!(
            ok_in(&home, &d, repo_view),
            ok_in(&home, &s, repo_view),
            "{history}"
        );
        if history != "none" {
            // Each names where it came from, the dumb one its server too (not a scratch
            // repository it may have been cloned through).
            for (task, url) in [(&d, &dumb), (&s, &smart)] {
                assert_eq!(
                    ok_in(&home, task, "git config --get remote.origin.url"),
                    format!("{url}\n")
                );
                assert_eq!(
                    ok_in(&home, task, "git reflog --format=%gs"),
                    format!("clone: from {url}\n")
                );
            }
        }
        // The same diff of the same change, and a verified patch.
        for task in [&d, &s] {
            ok_in(
                &home,
                task,
                "echo changed >> README.md && echo new > new.txt",
            );
        }
        let (dd, sd) = (
            home.json(&["task", "diff", &d]),
            home.json(&["task", "diff", &s]),
        );
        assert_eq!(dd["patch"], sd["patch"], "{history}");
        let finished = home.json(&["task", "finish", &d]);
        assert_eq!(finished["verified"], true, "{history}: {finished:#}");
    }
    // Only ever fetched as files: a smart fetch would have POSTed to upload-pack.
    let dumb_requests = fix.https.requests_for("/dumb/");
    assert!(!dumb_requests.is_empty());
    assert!(
        dumb_requests.iter().all(|r| r["method"] == "GET"),
        "{dumb_requests:#?}"
    );
}

// --- one reading of a URL ---------------------------------------------------------------------

/// A `--repo` URL is parsed once, where the CLI takes it, by the parser the MCP policy uses: a
/// shape the clone would not fetch through its proxy, or one a reader could take for another
/// host, is refused before anything starts, and a refusal never repeats a credential. Nothing
/// is fetched, so no packet is sent.
#[test]
fn urls_the_clone_would_not_fetch_are_refused_before_anything_starts() {
    let home = TestHome::new();
    let refused = [
        // Ports other than the one the egress proxy opens for the transport, or in another
        // spelling than digits without a leading zero.
        "https://git.test:8443/o/r.git",
        "ssh://git@git.test:2222/o/r.git",
        "https://git.test:22/o/r.git",
        "https://git.test:0443/o/r.git",
        "https://git.test:+443/o/r.git",
        "https://git.test:/o/r.git",
        // Hosts that are not plain DNS names.
        "https://127.0.0.1/o/r.git",
        "https://[::1]/o/r.git",
        "https://[::1]:443/o/r.git",
        "https://2130706433/o/r.git",
        "https://0x7f.1/o/r.git",
        "https://git%2etest/o/r.git",
        "https://git..test/o/r.git",
        "git@127.0.0.1:o/r.git",
        // A user part that hides the host, or one ssh would be handed as a password.
        "https://me:s3cret@git.test@evil.test/o/r.git",
        "https://@git.test/o/r.git",
        "ssh://git:s3cret@git.test/o/r.git",
        "ssh://-oProxyCommand=x@git.test/o/r.git",
        // Not one of the three shapes.
        "git.test:o/r.git",
        "https://git.test",
        "https://me:s3cret@git.test//o/r.git",
        "https://git.test#@evil.test/o/r.git",
        "https://git.test/o r.git",
        "https://git.test/o/\u{e9}.git",
        "http://git.test/o/r.git",
        "file:///srv/r.git",
        "ext::sh -c id",
        "-uhttps://git.test/o/r.git",
    ];
    for url in refused {
        // `--repo=URL`: a URL starting with '-' reaches the parser, not clap's option check.
        let out = home.run(&[
            "--json",
            "task",
            "start",
            &format!("--repo={url}"),
            "--name",
            "t",
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{url:?}: {stdout}");
        let value: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|err| panic!("{url:?}: not JSON ({err}): {stdout}"));
        assert_eq!(
            value["error"]["code"], "invalid_argument",
            "{url:?}: {value}"
        );
        let shown = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(!shown.contains("s3cret"), "{url:?}: {shown}");
    }
    assert_nothing_left(&home);
}

/// A task recorded by an earlier version with a URL today's parser refuses (here scp form
/// without a user) still lists: the record reads, the URL shows as recorded, and nothing of
/// the home is lost for it.
#[test]
fn a_task_recorded_with_a_url_the_rules_now_refuse_still_lists() {
    if !require_root("a_task_recorded_with_a_url_the_rules_now_refuse_still_lists") {
        return;
    }
    let fix = NetFix::start();
    let home = home_for(&fix);
    let task = start_repo(&home, &fix.https_repo_url(), &["--name", "old"]);
    let recorded = task["source"]["repositoryUrl"]
        .as_str()
        .expect("a recorded URL")
        .to_owned();
    let finished = home.json(&["task", "finish", "old"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    // As an earlier version could have written it: the catalog and the record file.
    let refused = "git.test:o/r.git";
    let id = task["id"].as_str().expect("a task id");
    let updated = Command::new("sqlite3")
        .arg(home.path().join("catalog.db"))
        .arg(format!(
            "UPDATE sandboxes SET detail = replace(detail, '{recorded}', '{refused}') WHERE id = '{id}'"
        ))
        .status()
        .expect("sqlite3 is installed");
    assert!(updated.success());
    let record = home.path().join("results").join(id).join("record.json");
    let text = std::fs::read_to_string(&record).expect("the record file");
    assert!(text.contains(&recorded), "{text}");
    std::fs::write(&record, text.replace(&recorded, refused)).expect("rewrite the record");

    let ls = home.json(&["ls"]);
    let listed = ls["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["name"] == "old")
        .cloned()
        .unwrap_or_else(|| panic!("the task is listed: {ls:#}"));
    assert_eq!(listed["source"]["repositoryUrl"], refused, "{listed:#}");
    assert_eq!(listed["state"], finished["state"], "{listed:#}");
}
