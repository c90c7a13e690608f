//! Generated files end to end through the CLI: a Python project without a `.gitignore` runs
//! its tests in a task and leaves `pkg/__pycache__/*.pyc` (binary) and a `node_modules/`
//! beside real edits. `task diff` shows the edits and summarises the generated files as
//! groups; `task finish` leaves them out of the verified patch (kept in `generated.diff`) and
//! says so, or keeps them with `--include-generated`; `task apply` commits what the patch
//! holds. A `target/` the project tracks files in is the project's own: a new file there is
//! an edit like any other, and what the project ignores stays out as before.

use std::path::Path;

use dynocap_e2e::*;
use serde_json::Value;

/// What the agent does: real edits, a new text file, bytecode, a dependency, and a file in
/// the project's own `target/`.
const AGENT_SCRIPT: &str = "set -e
    printf 'def main():\\n    return 2\\n' > pkg/cli.py
    printf 'from pkg.cli import main\\n\\ndef test_main():\\n    assert main() == 2\\n' > tests/test_cli.py
    printf 'def helper():\\n    return 1\\n' > pkg/helpers.py
    mkdir -p pkg/__pycache__ node_modules/left-pad
    head -c 20000 /dev/urandom > pkg/__pycache__/cli.cpython-311.pyc
    printf '\\000\\001pyc' > pkg/__pycache__/helpers.cpython-311.pyc
    printf 'module.exports = 1;\\n' > node_modules/left-pad/index.js
    mkdir -p web/node_modules/dep && printf 'ignored\\n' > web/node_modules/dep/index.js
    printf 'new\\n' > target/bar
    printf 'changed\\n' > target/foo";

/// A committed project with no `.gitignore` at its root (one in `web/` ignores its
/// `node_modules/`), tracking a file in `target/`.
fn project(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    write(&dir.join("pkg/__init__.py"), "");
    write(&dir.join("pkg/cli.py"), "def main():\n    return 1\n");
    write(
        &dir.join("tests/test_cli.py"),
        "from pkg.cli import main\n\ndef test_main():\n    assert main() == 1\n",
    );
    write(&dir.join("target/foo"), "tracked\n");
    write(&dir.join("web/.gitignore"), "node_modules/\n");
    write(&dir.join("web/app.js"), "app();\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
}

fn groups(result: &Value) -> Vec<(String, String, u64)> {
    result["generated"]
        .as_array()
        .map(|groups| {
            groups
                .iter()
                .map(|g| {
                    (
                        g["pattern"].as_str().unwrap().to_owned(),
                        g["under"].as_str().unwrap().to_owned(),
                        g["files"].as_u64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn expected_groups() -> Vec<(String, String, u64)> {
    vec![
        ("__pycache__/".to_owned(), "pkg".to_owned(), 2),
        ("node_modules/".to_owned(), ".".to_owned(), 1),
    ]
}

/// The files of `branch` in the repository.
fn tree(repo: &Path, branch: &str) -> Vec<String> {
    git(repo, &["ls-tree", "-r", "--name-only", branch])
        .lines()
        .map(str::to_owned)
        .collect()
}

const EDITS: [&str; 5] = [
    "pkg/cli.py",
    "pkg/helpers.py",
    "target/bar",
    "target/foo",
    "tests/test_cli.py",
];

#[test]
fn generated_files_are_summarised_left_out_and_kept_when_asked() {
    if !require_root("generated_files_are_summarised_left_out_and_kept_when_asked") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    project(repo);
    let path = repo.to_str().unwrap();
    home.json(&["task", "start", path, "--name", "py"]);
    home.task_sh("py", AGENT_SCRIPT);

    let diff = home.json(&["task", "diff", "py"]);
    assert_eq!(groups(&diff), expected_groups(), "{diff:#}");
    assert_eq!(diff["files"], 5, "{diff:#}");
    let patch = diff["patch"].as_str().unwrap();
    for edit in EDITS {
        assert!(
            patch.contains(&format!("b/{edit}")),
            "{edit} not shown:\n{patch}"
        );
    }
    assert!(!patch.contains("__pycache__"), "{patch}");
    // Ignored files stay ignored: neither patched nor counted as generated.
    assert!(!patch.contains("node_modules"), "{patch}");
    assert!(!patch.contains("GIT binary patch"), "{patch}");
    let shown = String::from_utf8(home.run(&["task", "diff", "py"]).stdout).unwrap();
    assert!(shown.contains("generated files, not shown"), "{shown}");
    assert!(shown.contains("__pycache__/ under pkg: 2 files"), "{shown}");

    let finished = home.json(&["task", "finish", "py"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    assert_eq!(finished["files"], 5, "{finished:#}");
    assert_eq!(groups(&finished), expected_groups(), "{finished:#}");
    assert!(finished.get("generatedIncluded").is_none(), "{finished:#}");
    let saved = std::fs::read_to_string(finished["patchPath"].as_str().unwrap()).unwrap();
    assert!(!saved.contains("__pycache__") && !saved.contains("node_modules"));
    let left_out = std::fs::read(finished["generatedPatchPath"].as_str().unwrap()).unwrap();
    let left_out = String::from_utf8_lossy(&left_out);
    assert!(
        left_out.contains("b/pkg/__pycache__/cli.cpython-311.pyc")
            && left_out.contains("b/node_modules/left-pad/index.js"),
        "{left_out}"
    );
    // Said again by the saved result and by the diff of the ended task.
    let again = home.json(&["task", "finish", "py"]);
    assert_eq!(groups(&again), expected_groups(), "{again:#}");
    let ended = home.json(&["task", "diff", "py"]);
    assert_eq!(groups(&ended), expected_groups(), "{ended:#}");
    let human = String::from_utf8(home.run(&["task", "finish", "py"]).stdout).unwrap();
    assert!(
        human.contains("left out of the patch when the task ended") && human.contains("git apply"),
        "{human}"
    );
    // Asked for once the task has ended: too late, and said so, not silently ignored.
    let late = home.json(&["task", "finish", "py", "--include-generated"]);
    assert_eq!(late["alreadyFinished"], true, "{late:#}");
    assert!(late.get("generatedIncluded").is_none(), "{late:#}");
    let human = String::from_utf8(
        home.run(&["task", "finish", "py", "--include-generated"])
            .stdout,
    )
    .unwrap();
    assert!(
        human.contains("already ended") && !human.contains("finish with --include-generated"),
        "{human}"
    );

    // `task apply` says what it left out, in its result and in the commit's message.
    let applied = home.json(&["task", "apply", "py", "--branch", "without"]);
    assert_eq!(groups(&applied), expected_groups(), "{applied:#}");
    assert_eq!(
        applied["generatedPatchPath"], finished["generatedPatchPath"],
        "{applied:#}"
    );
    assert!(applied.get("generatedIncluded").is_none(), "{applied:#}");
    let message = git(repo, &["log", "-1", "--format=%B", "without"]);
    assert!(
        message.contains("3 generated files the task wrote")
            && message.contains("__pycache__/ under pkg")
            && message.contains("are left out of this commit"),
        "{message}"
    );
    let files = tree(repo, "without");
    for edit in EDITS {
        assert!(
            files.iter().any(|f| f == edit),
            "{edit} not applied: {files:?}"
        );
    }
    assert!(
        !files
            .iter()
            .any(|f| f.contains("__pycache__") || f.contains("node_modules")),
        "{files:?}"
    );

    // The same work, finished asking for the generated files: they are patched and applied.
    home.json(&["task", "start", path, "--name", "py2"]);
    home.task_sh("py2", AGENT_SCRIPT);
    let kept = home.json(&["task", "finish", "py2", "--include-generated"]);
    assert_eq!(kept["verified"], true, "{kept:#}");
    assert_eq!(kept["generatedIncluded"], true, "{kept:#}");
    assert_eq!(kept["files"], 8, "{kept:#}");
    assert!(kept.get("generatedPatchPath").is_none(), "{kept:#}");
    let saved = std::fs::read(kept["patchPath"].as_str().unwrap()).unwrap();
    assert!(String::from_utf8_lossy(&saved).contains("b/pkg/__pycache__/cli.cpython-311.pyc"));
    let applied = home.json(&["task", "apply", "py2", "--branch", "with"]);
    assert_eq!(applied["generatedIncluded"], true, "{applied:#}");
    assert_eq!(groups(&applied), expected_groups(), "{applied:#}");
    let human = String::from_utf8(
        home.run(&["task", "apply", "py", "--branch", "again"])
            .stdout,
    )
    .unwrap();
    assert!(
        human.contains("generated files, left out of the commit")
            && human.contains("__pycache__/ under pkg: 2 files"),
        "{human}"
    );
    let files = tree(repo, "with");
    assert!(
        files
            .iter()
            .any(|f| f == "pkg/__pycache__/cli.cpython-311.pyc")
            && files.iter().any(|f| f == "node_modules/left-pad/index.js"),
        "{files:?}"
    );
}

/// A task whose only changes are generated files: the finish offers nothing to apply, and
/// `task apply` says where the files it left out are instead of only "changed nothing".
#[test]
fn a_task_that_only_generated_files_says_where_they_are() {
    if !require_root("a_task_that_only_generated_files_says_where_they_are") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    project(repo);
    home.json(&[
        "task",
        "start",
        repo.to_str().unwrap(),
        "--name",
        "gen-only",
    ]);
    home.task_sh(
        "gen-only",
        "mkdir -p pkg/__pycache__ && printf '\\000pyc' > pkg/__pycache__/cli.cpython-311.pyc",
    );
    let out = home.run(&["task", "finish", "gen-only"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("the task changed nothing to apply") && !text.contains("dynocap task apply"),
        "{text}"
    );
    let finished = home.json(&["task", "finish", "gen-only"]);
    assert_eq!(finished["files"], 0, "{finished:#}");
    let left_out = finished["generatedPatchPath"].as_str().unwrap().to_owned();
    let err = home.json_err(&["task", "apply", "gen-only"]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("changed nothing but generated files") && message.contains(&left_out),
        "{message}"
    );
}

/// A task whose supervisor died keeps its work for `task finish` to recover; a finish that
/// asks for the generated files gets them from the recovery as from a live task.
#[test]
fn a_recovered_task_keeps_generated_files_when_asked() {
    if !require_root("a_recovered_task_keeps_generated_files_when_asked") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    project(repo.path());
    home.json(&[
        "task",
        "start",
        repo.path().to_str().unwrap(),
        "--name",
        "lost",
    ]);
    home.task_sh("lost", AGENT_SCRIPT);
    let supervisor = home
        .supervisor_pid("lost")
        .expect("a running task has a supervisor");
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(supervisor, libc::SIGKILL) }, 0);
    assert!(
        wait_until(20, || {
            let ls = home.json(&["ls"]);
            ls["tasks"].as_array().is_some_and(|tasks| {
                tasks
                    .iter()
                    .any(|t| t["name"] == "lost" && t["state"] == "unsaved")
            })
        }),
        "the task did not become unsaved"
    );
    let recovered = home.json(&["task", "finish", "lost", "--include-generated"]);
    assert_eq!(recovered["verified"], true, "{recovered:#}");
    assert_eq!(recovered["generatedIncluded"], true, "{recovered:#}");
    assert_eq!(recovered["files"], 8, "{recovered:#}");
    let saved = std::fs::read(recovered["patchPath"].as_str().unwrap()).unwrap();
    assert!(String::from_utf8_lossy(&saved).contains("b/pkg/__pycache__/cli.cpython-311.pyc"));
}

/// A project that ignores `__pycache__/` and `*.log` in its `.git/info/exclude` (not in a
/// `.gitignore`): the import leaves such files out, and so do the task's diff and patch when
/// the task makes them. They are the project's ignored files, not generated ones to count,
/// and `task apply` does not commit them.
#[test]
fn what_the_projects_info_exclude_ignores_stays_out_of_the_diff() {
    if !require_root("what_the_projects_info_exclude_ignores_stays_out_of_the_diff") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    project(repo);
    write(&repo.join(".git/info/exclude"), "__pycache__/\n*.log\n");
    write(&repo.join("host.log"), "not imported\n");
    home.json(&["task", "start", repo.to_str().unwrap(), "--name", "excl"]);
    home.task_sh(
        "excl",
        "set -e; test ! -e host.log
         printf 'def main():\\n    return 2\\n' > pkg/cli.py
         mkdir -p pkg/__pycache__ && printf '\\000pyc' > pkg/__pycache__/cli.cpython-311.pyc
         echo run > test.log",
    );
    let diff = home.json(&["task", "diff", "excl"]);
    assert!(diff.get("generated").is_none(), "{diff:#}");
    assert_eq!(diff["files"], 1, "{diff:#}");
    let patch = diff["patch"].as_str().unwrap();
    assert!(patch.contains("b/pkg/cli.py"), "{patch}");
    assert!(
        !patch.contains("__pycache__") && !patch.contains("test.log"),
        "{patch}"
    );
    let finished = home.json(&["task", "finish", "excl", "--include-generated"]);
    assert_eq!(finished["files"], 1, "{finished:#}");
    let saved = std::fs::read_to_string(finished["patchPath"].as_str().unwrap()).unwrap();
    assert!(
        !saved.contains("__pycache__") && !saved.contains("test.log"),
        "{saved}"
    );
    home.json(&["task", "apply", "excl", "--branch", "excl"]);
    // The commit changes pkg/cli.py and adds nothing.
    assert_eq!(tree(repo, "excl"), tree(repo, "main"));
    let changed = git(repo, &["diff", "--name-only", "main", "excl"]);
    assert_eq!(changed.trim(), "pkg/cli.py");
}

/// The issue's case on a working copy where the tests already ran: the project's
/// `pkg/__pycache__/` is there, neither tracked nor ignored, so it comes with the import, and
/// the task's test run rewrites it. Those changes are generated as new files are: grouped in
/// the diff, left out of the patch, and `task apply` commits the edit (it refused, the patch
/// touching the user's untracked `.pyc` files).
#[test]
fn changes_to_untracked_bytecode_the_import_brought_are_generated() {
    if !require_root("changes_to_untracked_bytecode_the_import_brought_are_generated") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    project(repo);
    write(
        &repo.join("pkg/__pycache__/cli.cpython-311.pyc"),
        "old bytecode\n",
    );
    write(
        &repo.join("pkg/__pycache__/gone.cpython-311.pyc"),
        "stale\n",
    );
    home.json(&["task", "start", repo.to_str().unwrap(), "--name", "local"]);
    home.task_sh(
        "local",
        "set -e; test -e pkg/__pycache__/cli.cpython-311.pyc
         printf 'def main():\\n    return 2\\n' > pkg/cli.py
         printf '\\000new' > pkg/__pycache__/cli.cpython-311.pyc
         rm pkg/__pycache__/gone.cpython-311.pyc
         printf '\\000pyc' > pkg/__pycache__/__init__.cpython-311.pyc",
    );
    let diff = home.json(&["task", "diff", "local"]);
    assert_eq!(
        groups(&diff),
        [("__pycache__/".to_owned(), "pkg".to_owned(), 3)],
        "{diff:#}"
    );
    assert_eq!(diff["files"], 1, "{diff:#}");
    assert!(
        !diff["patch"].as_str().unwrap().contains("__pycache__"),
        "{diff:#}"
    );
    // A fork judges its files against the same baseline, the untracked ones included.
    home.json(&["task", "fork", "local", "local-fork"]);
    let forked = home.json(&["task", "diff", "local-fork"]);
    assert_eq!(groups(&forked), groups(&diff), "{forked:#}");
    assert_eq!(forked["files"], 1, "{forked:#}");
    home.json(&["task", "finish", "local-fork"]);
    let finished = home.json(&["task", "finish", "local"]);
    assert_eq!(
        (&finished["verified"], &finished["files"]),
        (&Value::from(true), &Value::from(1)),
        "{finished:#}"
    );
    let applied = home.json(&["task", "apply", "local", "--branch", "local"]);
    assert_eq!(groups(&applied), groups(&finished), "{applied:#}");
    let changed = git(repo, &["diff", "--name-only", "main", "local"]);
    assert_eq!(changed.trim(), "pkg/cli.py");
    // The user's own bytecode is as it was.
    assert_eq!(
        std::fs::read_to_string(repo.join("pkg/__pycache__/cli.cpython-311.pyc")).unwrap(),
        "old bytecode\n"
    );
}

/// An install that leaves a `node_modules/` of about 100 MB, past the 64 MiB a shown diff
/// holds: its entries are counted as they arrive, not kept, so the diff shows the edit and
/// the group (it failed whole, naming the bound), and the finish leaves them out as always.
#[test]
fn a_generated_directory_past_the_diffs_bound_does_not_fail_the_diff() {
    if !require_root("a_generated_directory_past_the_diffs_bound_does_not_fail_the_diff") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    project(repo);
    home.json(&["task", "start", repo.to_str().unwrap(), "--name", "big"]);
    let result = home.exec_in_task(
        "big",
        "set -e; printf 'def main():\\n    return 2\\n' > pkg/cli.py
         mkdir -p node_modules/big
         for i in 1 2 3 4 5 6 7 8; do head -c 9000000 /dev/urandom | base64 > node_modules/big/f$i.js; done",
        120,
    );
    assert_eq!(result["exitCode"], 0, "{result:#}");
    let diff = home.json(&["task", "diff", "big"]);
    assert_eq!(diff["files"], 1, "{diff:#}");
    assert!(
        diff["patch"].as_str().unwrap().contains("b/pkg/cli.py"),
        "{diff:#}"
    );
    let group = &diff["generated"][0];
    assert_eq!(
        (&group["pattern"], &group["under"], &group["files"]),
        (
            &Value::from("node_modules/"),
            &Value::from("."),
            &Value::from(8)
        ),
        "{diff:#}"
    );
    assert!(
        group["patchBytes"].as_u64().unwrap() > 64 * 1024 * 1024,
        "{diff:#}"
    );
    let finished = home.json(&["task", "finish", "big"]);
    assert_eq!(
        (&finished["verified"], &finished["files"]),
        (&Value::from(true), &Value::from(1)),
        "{finished:#}"
    );
}
