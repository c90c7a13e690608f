//! `dynocap task apply` end to end through the CLI: a finished task's verified patch lands on a
//! new branch of the user's repository, exactly as the agent left its tree (binary file,
//! symlink, executable bit, deletion, rename), as one commit on the task's base commit, while
//! the user's branch, index and working tree stay byte for byte as they were; and every
//! refusal (unfinished, unverified, edited patch, sensitive paths, existing branch,
//! uncommitted work in the way) changes nothing.

use std::collections::BTreeMap;
use std::path::Path;

use dynocap_e2e::*;
use serde_json::Value;

/// What the agent does, in the task and (to build the expected tree) on a host checkout.
const AGENT_SCRIPT: &str = "set -e
    printf 'pub fn answer() -> u32 { 42 }\\n' > src/lib.rs
    printf '\\000\\001\\002binary\\377' > blob.bin
    ln -s src/lib.rs link
    chmod +x build.sh
    rm old.txt
    mv rename-me.txt renamed.txt";

/// A clean repository on `main` with what the script changes, plus uncommitted work of the
/// user's that the patch does not touch (a modified file, an untracked one).
fn project(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    write(&dir.join("src/lib.rs"), "pub fn answer() -> u32 { 41 }\n");
    write(&dir.join("old.txt"), "to be deleted\n");
    let long: String = (0..40)
        .map(|i| format!("line {i} of a file to rename\n"))
        .collect();
    write(&dir.join("rename-me.txt"), &long);
    write(&dir.join("build.sh"), "#!/bin/sh\necho build\n");
    write(&dir.join("notes.md"), "committed notes\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    write(&dir.join("notes.md"), "the user's uncommitted edit\n");
    write(&dir.join("scratch.txt"), "the user's untracked file\n");
}

fn start(home: &TestHome, project: &Path, name: &str) -> Value {
    let project = project.to_str().expect("utf-8 temp path");
    home.json(&["task", "start", project, "--name", name])
}

/// Everything of the user's repository `task apply` must leave alone: where HEAD is, the
/// index file's bytes, the status, and every file of the working tree (type, mode, bytes).
fn user_state(dir: &Path) -> (String, String, Vec<u8>, String, BTreeMap<String, String>) {
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    (
        git(dir, &["symbolic-ref", "HEAD"]),
        git(dir, &["rev-parse", "HEAD"]),
        std::fs::read(dir.join(".git/index")).expect("read the index"),
        // No optional locks: a status that refreshes the index would change its bytes.
        git(
            dir,
            &[
                "--no-optional-locks",
                "status",
                "--porcelain=v1",
                "--untracked-files=all",
            ],
        ),
        files,
    )
}

fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        if rel == ".git" {
            continue;
        }
        let meta = path.symlink_metadata().expect("lstat");
        let what = if meta.file_type().is_symlink() {
            format!("link {:?}", std::fs::read_link(&path).unwrap())
        } else if meta.is_dir() {
            walk(root, &path, files);
            "dir".to_owned()
        } else {
            format!(
                "{:o} {:?}",
                meta.permissions().mode(),
                std::fs::read(&path).unwrap()
            )
        };
        files.insert(rel, what);
    }
}

fn branches(dir: &Path) -> String {
    git(dir, &["for-each-ref", "--format=%(refname)", "refs/heads/"])
}

#[test]
fn a_verified_patch_lands_exactly_on_a_new_branch_and_nothing_else_moves() {
    if !require_root("a_verified_patch_lands_exactly_on_a_new_branch_and_nothing_else_moves") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    project(repo);
    let base = git(repo, &["rev-parse", "HEAD"]).trim().to_owned();

    let task = start(&home, repo, "land");
    assert_eq!(task["source"]["baseCommit"], base, "{task:#}");
    let err = home.json_err(&["task", "apply", "land"]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("run `dynocap task finish land` first"),
        "{err:#}"
    );
    home.task_sh("land", AGENT_SCRIPT);
    let finished = home.json(&["task", "finish", "land"]);
    assert_eq!(finished["verified"], true, "{finished:#}");

    // The user commits nothing meanwhile, but the branch they are on moves on.
    write(&repo.join("later.txt"), "a commit after the task started\n");
    git(repo, &["add", "later.txt"]);
    git(repo, &["commit", "-q", "-m", "later"]);
    let before = user_state(repo);
    let branches_before = branches(repo);

    // Sensitive paths (the symlink, the executable bit) need accepting; the refusal lists them.
    let err = home.json_err(&["task", "apply", "land"]);
    assert_eq!(err["code"], "policy_denied", "{err:#}");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("link (symlink)"), "{message}");
    assert!(message.contains("build.sh (exec-bit)"), "{message}");
    assert!(message.contains("--accept-sensitive"), "{message}");

    // Uncommitted work on a path the patch touches: modified, or untracked where it creates.
    write(
        &repo.join("src/lib.rs"),
        "pub fn answer() -> u32 { 40 + 1 }\n",
    );
    write(&repo.join("renamed.txt"), "in the way\n");
    let err = home.json_err(&["task", "apply", "land", "--accept-sensitive"]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("src/lib.rs (modified, not committed)"),
        "{message}"
    );
    assert!(message.contains("renamed.txt (untracked)"), "{message}");
    assert!(
        !message.contains("notes.md"),
        "untouched work is no conflict: {message}"
    );
    // Put back by hand: a checkout would rewrite the index.
    write(&repo.join("src/lib.rs"), "pub fn answer() -> u32 { 41 }\n");
    std::fs::remove_file(repo.join("renamed.txt")).unwrap();
    assert_eq!(user_state(repo), before);
    assert_eq!(branches(repo), branches_before, "a refusal made a branch");

    let applied = home.json(&["task", "apply", "land", "--accept-sensitive"]);
    assert_eq!(applied["branch"], "dynocap/land", "{applied:#}");
    assert_eq!(applied["baseCommit"], base);
    let commit = applied["commit"].as_str().unwrap();
    assert_eq!(git(repo, &["rev-parse", "dynocap/land"]).trim(), commit);
    assert_eq!(git(repo, &["rev-parse", "dynocap/land^"]).trim(), base);
    assert_eq!(
        git(
            repo,
            &["rev-list", "--count", &format!("{base}..dynocap/land")]
        )
        .trim(),
        "1"
    );
    let files: Vec<&str> = applied["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    for path in [
        "src/lib.rs",
        "blob.bin",
        "link",
        "build.sh",
        "old.txt",
        "renamed.txt",
    ] {
        assert!(files.contains(&path), "{path} not in {files:?}");
    }
    let accepted = applied["sensitivePathsAccepted"].to_string();
    assert!(
        accepted.contains("\"link\"") && accepted.contains("exec-bit"),
        "{accepted}"
    );
    let message = git(repo, &["log", "-1", "--format=%B", "dynocap/land"]);
    assert!(message.contains("\"land\""), "{message}");
    assert!(message.contains(task["id"].as_str().unwrap()), "{message}");
    assert!(message.contains("link (symlink)"), "{message}");
    assert!(message.contains("build.sh (exec-bit)"), "{message}");

    // Exactly the agent's tree: the same script on a checkout of the base commit.
    let expected = tempfile::tempdir().unwrap();
    git(
        expected.path(),
        &["clone", "-q", repo.to_str().unwrap(), "."],
    );
    git(expected.path(), &["checkout", "-q", &base]);
    let out = std::process::Command::new("sh")
        .args(["-c", AGENT_SCRIPT])
        .current_dir(expected.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    git(expected.path(), &["add", "-A"]);
    let expected_tree = git(expected.path(), &["write-tree"]);
    assert_eq!(
        git(repo, &["rev-parse", "dynocap/land^{tree}"]),
        expected_tree,
        "{}",
        git(
            repo,
            &["diff", "--stat", expected_tree.trim(), "dynocap/land"]
        )
    );
    assert_eq!(
        git(repo, &["ls-tree", "dynocap/land", "link", "build.sh"]),
        git(
            expected.path(),
            &["ls-tree", expected_tree.trim(), "link", "build.sh"]
        )
    );

    // The user's branch, index and working tree are as they were.
    assert_eq!(user_state(repo), before);

    // An existing branch is never moved; another name works.
    let err = home.json_err(&["task", "apply", "land", "--accept-sensitive"]);
    assert_eq!(err["code"], "conflict", "{err:#}");
    assert!(
        err["message"].as_str().unwrap().contains("already exists")
            && err["message"].as_str().unwrap().contains("--branch"),
        "{err:#}"
    );
    assert_eq!(git(repo, &["rev-parse", "dynocap/land"]).trim(), commit);
    let text = home.run(&[
        "task",
        "apply",
        "land",
        "--accept-sensitive",
        "--branch",
        "again",
    ]);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let shown = String::from_utf8_lossy(&text.stdout);
    assert!(shown.contains("on the new branch again"), "{shown}");
    assert_eq!(git(repo, &["rev-parse", "again^{tree}"]), expected_tree);

    // --to: a clone of the project takes the branch instead; the project is left alone.
    let clone = tempfile::tempdir().unwrap();
    git(clone.path(), &["clone", "-q", repo.to_str().unwrap(), "."]);
    let to = home.json(&[
        "task",
        "apply",
        "land",
        "--accept-sensitive",
        "--to",
        clone.path().to_str().unwrap(),
    ]);
    assert_eq!(
        to["repository"].as_str().unwrap(),
        clone.path().canonicalize().unwrap().to_str().unwrap()
    );
    assert_eq!(
        git(clone.path(), &["rev-parse", "dynocap/land^{tree}"]),
        expected_tree
    );

    // A patch edited since the task finished no longer stands for its review.
    let patch = finished["patchPath"].as_str().unwrap();
    let mut text = std::fs::read_to_string(patch).unwrap();
    text.push_str("diff --git a/extra b/extra\nnew file mode 100644\n--- /dev/null\n+++ b/extra\n@@ -0,0 +1 @@\n+sneaked in\n");
    std::fs::write(patch, text).unwrap();
    let err = home.json_err(&[
        "task",
        "apply",
        "land",
        "--accept-sensitive",
        "--branch",
        "edited",
    ]);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("changed since the task finished"),
        "{err:#}"
    );
    assert!(!branches(repo).contains("edited"));
    assert_eq!(user_state(repo), before);
}

#[test]
fn an_unverified_patch_or_a_project_without_a_commit_is_refused() {
    if !require_root("an_unverified_patch_or_a_project_without_a_commit_is_refused") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    project(repo.path());
    start(&home, repo.path(), "escape");
    // A name the host's review refuses: the patch is saved, but not verified.
    home.task_sh("escape", "printf 'pwned\\n' > 'x\\..\\..\\evil'");
    let finished = home.json(&["task", "finish", "escape"]);
    assert_eq!(finished["verified"], false, "{finished:#}");
    let before = branches(repo.path());
    for flags in [&[][..], &["--accept-sensitive"][..]] {
        let mut args = vec!["task", "apply", "escape"];
        args.extend_from_slice(flags);
        let err = home.json_err(&args);
        assert_eq!(err["code"], "conflict", "{err:#}");
        assert!(
            err["message"].as_str().unwrap().contains("did not verify"),
            "{err:#}"
        );
    }
    assert_eq!(branches(repo.path()), before);

    // A project that is not a git repository has no commit to branch from.
    let plain = tempfile::tempdir().unwrap();
    write(&plain.path().join("a.txt"), "a\n");
    start(&home, plain.path(), "plain");
    home.task_sh("plain", "printf 'b\\n' > a.txt");
    home.json(&["task", "finish", "plain"]);
    let err = home.json_err(&["task", "apply", "plain"]);
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("no commit to branch from"), "{message}");
    assert!(message.contains("git apply"), "{message}");

    let err = home.json_err(&["task", "apply", "escap"]);
    assert_eq!(err["code"], "not_found", "{err:#}");
}

#[test]
fn applying_runs_nothing_the_repository_names() {
    if !require_root("applying_runs_nothing_the_repository_names") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    git(repo, &["init", "-q", "-b", "main"]);
    write(&repo.join("a.txt"), "a\n");
    write(&repo.join(".gitattributes"), "* filter=evil diff=evil\n");
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "base"]);
    // Every program a repository's own config or hooks can name, each leaving a marker.
    let markers = tempfile::tempdir().unwrap();
    let marker = |what: &str| markers.path().join(what).display().to_string();
    let script = |name: &str, what: &str| {
        let path = repo.join(".git/hooks").join(name);
        write(&path, &format!("#!/bin/sh\ntouch {}\ncat\n", marker(what)));
        chmod(&path, 0o755);
        path.display().to_string()
    };
    for hook in [
        "reference-transaction",
        "post-commit",
        "pre-commit",
        "post-checkout",
    ] {
        script(hook, hook);
    }
    let filter = script("filter", "filter");
    let gpg = script("gpg", "gpg");
    let fsmonitor = script("fsmonitor", "fsmonitor");
    for (key, value) in [
        ("filter.evil.clean", filter.as_str()),
        ("filter.evil.smudge", filter.as_str()),
        ("filter.evil.process", filter.as_str()),
        ("diff.evil.textconv", filter.as_str()),
        ("core.fsmonitor", fsmonitor.as_str()),
        ("commit.gpgSign", "true"),
        ("gpg.program", gpg.as_str()),
    ] {
        git(repo, &["config", key, value]);
    }

    start(&home, repo, "quiet");
    home.task_sh("quiet", "printf 'b\\n' > a.txt");
    home.json(&["task", "finish", "quiet"]);
    let applied = home.json(&["task", "apply", "quiet"]);
    let ran: Vec<String> = std::fs::read_dir(markers.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        ran.is_empty(),
        "git ran programs the repository names: {ran:?}"
    );
    assert_eq!(applied["branch"], "dynocap/quiet");
    assert_eq!(
        git(repo, &["cat-file", "blob", "dynocap/quiet:a.txt"]),
        "b\n"
    );
}

/// `--branch` takes exactly the names `git check-ref-format --branch` takes: each name git
/// refuses (HEAD first: it used to make `refs/heads/HEAD`) is refused as `invalid_argument`
/// with the rule it breaks, and leaves every ref and the user's state as they were; `@{-1}`,
/// which git reads as the branch checked out before, is refused by name; a good name works.
#[test]
fn a_branch_name_git_refuses_is_refused_and_makes_nothing() {
    if !require_root("a_branch_name_git_refuses_is_refused_and_makes_nothing") {
        return;
    }
    let home = TestHome::new();
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    git(repo, &["init", "-q", "-b", "main"]);
    write(&repo.join("a.txt"), "a\n");
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "base"]);
    // `@{-1}` is `side` from here on.
    git(repo, &["checkout", "-q", "-b", "side"]);
    git(repo, &["checkout", "-q", "main"]);
    start(&home, repo, "names");
    home.task_sh("names", "printf 'b\\n' > a.txt");
    home.json(&["task", "finish", "names"]);
    let before = user_state(repo);
    let refs = || git(repo, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let refs_before = refs();

    for (name, says) in [
        ("HEAD", "it is HEAD"),
        ("-x", "starts with '-'"),
        ("a..b", "contains '..'"),
        ("fix.lock", "\".lock\""),
        ("x@{1}", "'@{'"),
        ("a b", "contains a space"),
        ("dir/", "'/'"),
        ("end.", "ends with '.'"),
        ("what?", "'?'"),
        ("", "it is empty"),
        ("@{-1}", "\"side\""),
    ] {
        let arg = format!("--branch={name}");
        let err = home.json_err(&["task", "apply", "names", &arg]);
        assert_eq!(err["code"], "invalid_argument", "{name:?}: {err:#}");
        let message = err["message"].as_str().unwrap();
        assert!(
            message.contains(says) && message.contains("--branch"),
            "{name:?}: {message}"
        );
        assert_eq!(refs(), refs_before, "{name:?} changed a ref");
    }
    assert!(
        !repo.join(".git/refs/heads/HEAD").exists(),
        "a refused name left refs/heads/HEAD"
    );
    assert_eq!(user_state(repo), before);

    // Names git takes, HEAD-like ones included, still work.
    for name in ["HEAD-fix", "feature/HEAD"] {
        let applied = home.json(&["task", "apply", "names", "--branch", name]);
        assert_eq!(applied["branch"], name, "{applied:#}");
        assert_eq!(
            git(repo, &["cat-file", "blob", &format!("{name}:a.txt")]),
            "b\n"
        );
    }
    assert_eq!(user_state(repo), before);
}
