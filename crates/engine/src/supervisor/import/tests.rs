//! Import tests against real git repositories built in temporary directories.

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;

use super::beneath::{self, Resolver};
use super::*;

/// Runs the test's own (unhardened) git to build fixtures; returns stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "-c",
            "init.defaultBranch=main",
        ])
        .args([
            "-c",
            "protocol.file.allow=always",
            "-c",
            "commit.gpgSign=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn new_repo(dir: &Path) {
    fs::create_dir_all(dir).expect("mkdir repo");
    git(dir, &["init", "-q"]);
}

fn write(path: &Path, content: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir parent");
    }
    fs::write(path, content).expect("write file");
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    File { mode: u32, data: Vec<u8> },
    Dir,
    Link(Vec<u8>),
}

fn file(mode: u32, data: &str) -> Item {
    Item::File {
        mode,
        data: data.as_bytes().to_vec(),
    }
}

fn link(target: &str) -> Item {
    Item::Link(target.as_bytes().to_vec())
}

/// Parses an import tar, checking the invariants every entry must meet.
fn untar(bytes: &[u8]) -> BTreeMap<Vec<u8>, Item> {
    let mut archive = tar::Archive::new(bytes);
    let mut items = BTreeMap::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let header = entry.header().clone();
        assert!(header.as_gnu().is_some(), "GNU headers only");
        assert_eq!(header.uid().expect("uid"), 0);
        assert_eq!(header.gid().expect("gid"), 0);
        assert_eq!(header.mtime().expect("mtime"), 0);
        assert_eq!(header.username_bytes().unwrap_or_default(), b"");
        assert_eq!(header.groupname_bytes().unwrap_or_default(), b"");
        let mut path = entry.path_bytes().into_owned();
        assert!(!path.starts_with(b"/"), "absolute path {path:?}");
        let mode = header.mode().expect("mode");
        let item = match header.entry_type() {
            tar::EntryType::Regular => {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).expect("read data");
                Item::File { mode, data }
            }
            tar::EntryType::Directory => {
                assert_eq!(mode, 0o755);
                assert_eq!(path.pop(), Some(b'/'), "directory names end in /");
                Item::Dir
            }
            tar::EntryType::Symlink => {
                Item::Link(entry.link_name_bytes().expect("link name").into_owned())
            }
            other => panic!("unexpected entry type {other:?} for {path:?}"),
        };
        assert!(
            beneath::is_plain_relative(&path),
            "not a plain path: {path:?}"
        );
        if let Some(slash) = path.iter().rposition(|b| *b == b'/') {
            assert_eq!(
                items.get(&path[..slash]),
                Some(&Item::Dir),
                "parent of {path:?} comes first"
            );
        }
        assert!(
            items.insert(path.clone(), item).is_none(),
            "duplicate {path:?}"
        );
    }
    items
}

fn tar_of(plan: &ImportPlan) -> (BTreeMap<Vec<u8>, Item>, TarSummary) {
    let mut out = Vec::new();
    let mut last = (0, 0);
    let summary = write_tar(plan, &mut out, &mut |done, total| {
        assert!(done <= total);
        last = (done, total);
    })
    .expect("write tar");
    assert_eq!(last.0, summary.bytes, "final progress is all bytes");
    (untar(&out), summary)
}

/// Just the non-directory items, by path string.
fn files_of(items: &BTreeMap<Vec<u8>, Item>) -> BTreeMap<String, Item> {
    items
        .iter()
        .filter(|(_, item)| **item != Item::Dir)
        .map(|(path, item)| (String::from_utf8_lossy(path).into_owned(), item.clone()))
        .collect()
}

fn expect_files(items: &BTreeMap<Vec<u8>, Item>, expected: &[(&str, Item)]) {
    let expected: BTreeMap<String, Item> = expected
        .iter()
        .map(|(p, i)| ((*p).to_owned(), i.clone()))
        .collect();
    assert_eq!(files_of(items), expected);
}

fn no_git_anywhere(items: &BTreeMap<Vec<u8>, Item>) {
    for path in items.keys() {
        assert!(
            !path.split(|b| *b == b'/').any(|c| c == b".git"),
            "a .git came: {path:?}"
        );
    }
}

#[test]
fn git_tree_brings_tracked_and_unignored_untracked_as_they_are_now() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    write(&repo.join(".gitignore"), "node_modules/\n.env\ntarget/\n");
    write(&repo.join("a.txt"), "committed\n");
    write(&repo.join("gone.txt"), "deleted in the work tree\n");
    write(&repo.join("dir/b.txt"), "b\n");
    write(&repo.join("forced.log"), "tracked though ignored\n");
    write(&repo.join(".git/info/exclude"), "*.log\n");
    git(&repo, &["add", "-A"]);
    git(&repo, &["add", "-f", "forced.log"]);
    git(&repo, &["commit", "-qm", "one"]);
    write(&repo.join("a.txt"), "edited, not committed\n");
    fs::remove_file(repo.join("gone.txt")).expect("rm");
    write(&repo.join("new.txt"), "untracked\n");
    write(&repo.join("dir/c.txt"), "untracked too\n");
    write(&repo.join("staged.txt"), "staged only\n");
    git(&repo, &["add", "staged.txt"]);
    write(&repo.join("node_modules/x/index.js"), "ignored\n");
    write(&repo.join(".env"), "SECRET=1\n");
    write(&repo.join("target/debug/app"), "ignored\n");
    write(&repo.join("other.log"), "excluded by info/exclude\n");

    let plan = plan(&repo, History::Branches).expect("plan");
    assert!(plan.is_git);
    assert_eq!(plan.root, repo.canonicalize().expect("canonical"));
    assert_eq!(plan.history, History::Branches);
    assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    let (items, summary) = tar_of(&plan);
    expect_files(
        &items,
        &[
            (".gitignore", file(0o644, "node_modules/\n.env\ntarget/\n")),
            ("a.txt", file(0o644, "edited, not committed\n")),
            ("dir/b.txt", file(0o644, "b\n")),
            ("dir/c.txt", file(0o644, "untracked too\n")),
            ("forced.log", file(0o644, "tracked though ignored\n")),
            ("new.txt", file(0o644, "untracked\n")),
            ("staged.txt", file(0o644, "staged only\n")),
        ],
    );
    no_git_anywhere(&items);
    assert_eq!(plan.files, 7);
    assert_eq!(summary.files, 7);
    assert_eq!(plan.bytes, summary.bytes);
    assert!(summary.notes.is_empty(), "{:?}", summary.notes);
}

/// The rules of the project's `info/exclude` are read for the guest (its diffs leave out what
/// the listing left out); a plain tree or a repository without the file has none, and one too
/// large is left behind, said why.
#[test]
fn local_excludes_are_the_repositorys_info_exclude() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    write(&repo.join("a.txt"), "a\n");
    let _ = fs::remove_file(repo.join(".git/info/exclude"));
    assert_eq!(
        local_excludes(&plan(&repo, History::None).expect("plan")),
        Ok(None)
    );
    write(&repo.join(".git/info/exclude"), "*.log\n__pycache__/\n");
    let planned = plan(&repo, History::None).expect("plan");
    assert_eq!(
        local_excludes(&planned),
        Ok(Some("*.log\n__pycache__/\n".to_owned()))
    );
    write(
        &repo.join(".git/info/exclude"),
        &"x".repeat(usize::try_from(MAX_LOCAL_EXCLUDES).expect("usize") + 1),
    );
    let err = local_excludes(&plan(&repo, History::None).expect("plan")).expect_err("too large");
    assert!(
        err.contains("info/exclude is") && err.contains("bytes"),
        "{err}"
    );
    let plain = tmp.path().join("plain");
    write(&plain.join("a.txt"), "a\n");
    assert_eq!(
        local_excludes(&plan(&plain, History::None).expect("plan")),
        Ok(None)
    );
}

/// The untracked files that come under the generated table are listed (with the directories
/// between each and its generated directory), for the diff to treat the task's changes to
/// them as generated; tracked, ignored and other untracked files are not, nor is anything of
/// a plain tree.
#[test]
fn untracked_files_under_the_generated_table_are_listed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    write(&repo.join(".gitignore"), "ignored/\n");
    write(&repo.join("kept/__pycache__/notes.txt"), "tracked\n");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "one"]);
    write(&repo.join("kept/__pycache__/new.pyc"), "untracked\n");
    write(&repo.join("pkg/__pycache__/sub/a.pyc"), "untracked\n");
    write(&repo.join("lib/x.pyc"), "untracked\n");
    write(&repo.join("notes.md"), "untracked, not generated\n");
    write(&repo.join("ignored/__pycache__/b.pyc"), "ignored\n");
    let planned = plan(&repo, History::None).expect("plan");
    assert_eq!(
        planned.untracked_generated,
        [
            "kept/__pycache__/new.pyc",
            "lib/x.pyc",
            "pkg/__pycache__/sub",
            "pkg/__pycache__/sub/a.pyc"
        ]
    );
    fs::remove_dir_all(repo.join(".git")).expect("rm .git");
    assert!(plan(&repo, History::None)
        .expect("plan")
        .untracked_generated
        .is_empty());
}

#[test]
fn symlinks_come_as_symlinks_and_are_never_traversed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let outside = tmp.path().join("outside");
    write(&outside.join("secret.txt"), "outside the project\n");
    let home_key = format!(
        "{}/.ssh/id_rsa",
        std::env::var("HOME").unwrap_or_else(|_| "/root".into())
    );
    let long_target = format!("{}/{}", "d".repeat(60), "t".repeat(80));

    for git_repo in [true, false] {
        let repo = tmp.path().join(if git_repo { "git" } else { "plain" });
        if git_repo {
            new_repo(&repo);
        }
        write(&repo.join("real/file.txt"), "inside\n");
        symlink("/etc/passwd", repo.join("evil")).expect("symlink");
        symlink(&home_key, repo.join("key")).expect("symlink");
        symlink("/etc", repo.join("etcdir")).expect("symlink");
        symlink(&outside, repo.join("outdir")).expect("symlink");
        symlink("real", repo.join("inner")).expect("symlink");
        symlink("../../outside/secret.txt", repo.join("real/up")).expect("symlink");
        symlink(&long_target, repo.join("long")).expect("symlink");
        if git_repo {
            git(&repo, &["add", "evil", "real"]);
            git(&repo, &["commit", "-qm", "links"]);
        }

        let plan = plan(&repo, History::Head).expect("plan");
        assert_eq!(plan.is_git, git_repo);
        let (items, summary) = tar_of(&plan);
        expect_files(
            &items,
            &[
                ("etcdir", link("/etc")),
                ("evil", link("/etc/passwd")),
                ("inner", link("real")),
                ("key", link(&home_key)),
                ("long", link(&long_target)),
                ("outdir", link(&outside.to_string_lossy())),
                ("real/file.txt", file(0o644, "inside\n")),
                ("real/up", link("../../outside/secret.txt")),
            ],
        );
        assert_eq!(summary.files, 8);
        assert!(summary.notes.is_empty(), "{:?}", summary.notes);
    }
}

#[test]
fn only_the_exec_bit_of_the_mode_is_kept() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    for (name, mode) in [
        ("plain", 0o644),
        ("private", 0o600),
        ("script", 0o755),
        ("owner-x", 0o700),
        ("setuid", 0o4755),
        ("group-x", 0o654),
    ] {
        write(&repo.join(name), name);
        chmod(&repo.join(name), mode);
    }
    let (items, _) = tar_of(&plan(&repo, History::None).expect("plan"));
    expect_files(
        &items,
        &[
            ("group-x", file(0o644, "group-x")),
            ("owner-x", file(0o755, "owner-x")),
            ("plain", file(0o644, "plain")),
            ("private", file(0o644, "private")),
            ("script", file(0o755, "script")),
            ("setuid", file(0o755, "setuid")),
        ],
    );
}

#[test]
fn a_plain_directory_is_walked_whole_without_any_git_dir() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("project");
    write(&root.join("src/main.rs"), "fn main() {}\n");
    write(
        &root.join("node_modules/x.js"),
        "comes: no git, no ignore rules\n",
    );
    write(&root.join(".gitignore"), "node_modules/\n");
    fs::create_dir_all(root.join("empty/deeper")).expect("mkdir");
    // A nested repository and a stray .git file: neither .git comes.
    new_repo(&root.join("vendored"));
    write(&root.join("vendored/lib.rs"), "// lib\n");
    write(&root.join("stray/.git"), "gitdir: /elsewhere\n");
    write(&root.join("stray/.GIT/config"), "[core]\n");
    write(&root.join("stray/ok.txt"), "ok\n");
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .expect("mkfifo");
    let _socket = std::os::unix::net::UnixListener::bind(root.join("sock")).expect("bind");

    let plan = plan(&root, History::Branches).expect("plan");
    assert!(!plan.is_git);
    assert_eq!(plan.history, History::None);
    assert_eq!(write_bundle(&plan, tmp.path()).expect("no bundle"), None);
    let mut notes: Vec<String> = plan.notes.iter().map(ToString::to_string).collect();
    notes.sort();
    assert_eq!(
        notes,
        [
            "fifo: a fifo, not imported (fifos, sockets and devices never are)",
            "sock: a socket, not imported (fifos, sockets and devices never are)"
        ]
    );
    let (items, _) = tar_of(&plan);
    expect_files(
        &items,
        &[
            (".gitignore", file(0o644, "node_modules/\n")),
            (
                "node_modules/x.js",
                file(0o644, "comes: no git, no ignore rules\n"),
            ),
            ("src/main.rs", file(0o644, "fn main() {}\n")),
            ("stray/ok.txt", file(0o644, "ok\n")),
            ("vendored/lib.rs", file(0o644, "// lib\n")),
        ],
    );
    assert_eq!(
        items.get(&b"empty/deeper"[..]),
        Some(&Item::Dir),
        "empty directories come"
    );
    no_git_anywhere(&items);
    assert!(!items.keys().any(|p| p.starts_with(b"stray/.GIT")));
}

#[test]
fn non_utf8_names_come_byte_for_byte() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tracked = OsStr::from_bytes(b"caf\xe9.txt");
    let untracked = OsStr::from_bytes(b"dir\xff/\xfe\xfd");
    for git_repo in [true, false] {
        let repo = tmp.path().join(if git_repo { "git" } else { "plain" });
        fs::create_dir_all(&repo).expect("mkdir");
        if git_repo {
            new_repo(&repo);
        }
        fs::write(repo.join(tracked), "latin-1\n").expect("write");
        fs::create_dir(repo.join(OsStr::from_bytes(b"dir\xff"))).expect("mkdir");
        fs::write(repo.join(untracked), "binary name\n").expect("write");
        if git_repo {
            let status = Command::new("git")
                .current_dir(&repo)
                .args(["-c", "user.name=t", "-c", "user.email=t@e", "add", "--"])
                .arg(tracked)
                .status()
                .expect("git add");
            assert!(status.success());
            git(&repo, &["commit", "-qm", "latin"]);
        }
        let (items, _) = tar_of(&plan(&repo, History::None).expect("plan"));
        assert_eq!(
            items.get(tracked.as_bytes()),
            Some(&Item::File {
                mode: 0o644,
                data: b"latin-1\n".to_vec()
            })
        );
        assert_eq!(
            items.get(untracked.as_bytes()),
            Some(&Item::File {
                mode: 0o644,
                data: b"binary name\n".to_vec()
            })
        );
        assert_eq!(items.get(&b"dir\xff"[..]), Some(&Item::Dir));
        assert_eq!(items.len(), 3);
    }
}

#[test]
fn a_linked_worktree_is_imported_only_with_its_main_repository_beneath_the_project() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let main = tmp.path().join("main");
    new_repo(&main);
    write(&main.join("shared.txt"), "v1\n");
    git(&main, &["add", "-A"]);
    git(&main, &["commit", "-qm", "base"]);
    let wt = main.join("trees/wt");
    git(
        &main,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "feature",
            &wt.to_string_lossy(),
        ],
    );
    write(&wt.join("feature.txt"), "on feature\n");
    git(&wt, &["add", "feature.txt"]);
    git(&wt, &["commit", "-qm", "feature"]);
    write(&wt.join("scratch.txt"), "untracked in the worktree\n");

    // The worktree alone: its `.git` file points into main/.git/worktrees, outside it.
    let err = plan(&wt, History::Head).expect_err("points outside");
    let text = err.to_string();
    assert!(
        text.contains(&format!("{}", wt.join(".git").display()))
            && text.contains(&format!("{}", main.join(".git/worktrees/wt").display())),
        "{text}"
    );
    assert_eq!(
        crate::foundation::error::Error::from(err).code,
        crate::foundation::error::ErrorCode::InvalidArgument
    );

    // A project holding both: everything git reads is beneath it, and the worktree comes
    // as a nested repository listed by its own git.
    let plan = plan(&main, History::Head).expect("plan");
    let (items, _) = tar_of(&plan);
    expect_files(
        &items,
        &[
            ("shared.txt", file(0o644, "v1\n")),
            ("trees/wt/feature.txt", file(0o644, "on feature\n")),
            (
                "trees/wt/scratch.txt",
                file(0o644, "untracked in the worktree\n"),
            ),
            ("trees/wt/shared.txt", file(0o644, "v1\n")),
        ],
    );
    no_git_anywhere(&items);
    let bundle = write_bundle(&plan, tmp.path())
        .expect("bundle")
        .expect("history");
    let fetched = fetch_bundle(&tmp.path().join("fresh"), &bundle);
    assert!(has_object(&fetched, &git(&main, &["rev-parse", "main"])));
}

#[test]
fn submodules_come_as_plain_files_without_their_git() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let upstream = tmp.path().join("upstream");
    new_repo(&upstream);
    write(&upstream.join("lib.c"), "int lib;\n");
    write(&upstream.join(".gitignore"), "*.o\n");
    git(&upstream, &["add", "-A"]);
    git(&upstream, &["commit", "-qm", "lib"]);

    let repo = tmp.path().join("repo");
    new_repo(&repo);
    write(&repo.join("main.c"), "int main;\n");
    git(&repo, &["add", "main.c"]);
    git(
        &repo,
        &[
            "submodule",
            "add",
            "-q",
            &upstream.to_string_lossy(),
            "libs/sub",
        ],
    );
    git(&repo, &["commit", "-qm", "with submodule"]);
    write(&repo.join("libs/sub/lib.c"), "int lib; /* edited */\n");
    write(&repo.join("libs/sub/new.c"), "untracked in the submodule\n");
    write(&repo.join("libs/sub/lib.o"), "ignored by the submodule\n");
    assert!(
        repo.join("libs/sub/.git").is_file(),
        "the submodule has a .git file"
    );
    // An untracked nested repository is listed by its own git too.
    let nested = repo.join("nested");
    new_repo(&nested);
    write(&nested.join("n.txt"), "nested\n");
    write(&nested.join(".gitignore"), "skip/\n");
    write(&nested.join("skip/x"), "ignored in nested\n");

    let plan = plan(&repo, History::None).expect("plan");
    let (items, _) = tar_of(&plan);
    let gitmodules = fs::read_to_string(repo.join(".gitmodules")).expect("gitmodules");
    expect_files(
        &items,
        &[
            (".gitmodules", file(0o644, &gitmodules)),
            ("libs/sub/.gitignore", file(0o644, "*.o\n")),
            ("libs/sub/lib.c", file(0o644, "int lib; /* edited */\n")),
            (
                "libs/sub/new.c",
                file(0o644, "untracked in the submodule\n"),
            ),
            ("main.c", file(0o644, "int main;\n")),
            ("nested/.gitignore", file(0o644, "skip/\n")),
            ("nested/n.txt", file(0o644, "nested\n")),
        ],
    );
    no_git_anywhere(&items);
}

#[test]
fn an_uninitialised_submodule_comes_as_an_empty_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let upstream = tmp.path().join("upstream");
    new_repo(&upstream);
    write(&upstream.join("lib.c"), "int lib;\n");
    git(&upstream, &["add", "-A"]);
    git(&upstream, &["commit", "-qm", "lib"]);
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    git(
        &repo,
        &["submodule", "add", "-q", &upstream.to_string_lossy(), "sub"],
    );
    git(&repo, &["commit", "-qm", "with submodule"]);
    git(&repo, &["submodule", "deinit", "-q", "-f", "sub"]);
    let (items, _) = tar_of(&plan(&repo, History::None).expect("plan"));
    assert_eq!(items.get(&b"sub"[..]), Some(&Item::Dir));
    assert!(!items.keys().any(|p| p.starts_with(b"sub/")));
}

/// Appends configuration that runs `touch <marker>` from every place git might run a program.
fn arm_hostile_repo(repo: &Path, marker: &Path) {
    let touch = format!("touch {}", marker.display());
    let hooks = repo.join(".git/evil-hooks");
    fs::create_dir_all(&hooks).expect("mkdir hooks");
    for hook in [
        "pre-commit",
        "post-checkout",
        "post-index-change",
        "reference-transaction",
        "fsmonitor-watchman",
        "pre-auto-gc",
    ] {
        for dir in [&hooks, &repo.join(".git/hooks")] {
            let path = dir.join(hook);
            fs::write(&path, format!("#!/bin/sh\n{touch}\n")).expect("hook");
            chmod(&path, 0o755);
        }
    }
    let config = format!(
        "[core]\n\tfsmonitor = {touch}\n\thooksPath = {hooks}\n\tpager = {touch}\n\tsshCommand = {touch}\n\
         \taskPass = {touch}\n\talternateRefsCommand = {touch}\n\tuntrackedCache = true\n\
         [filter \"x\"]\n\tclean = {touch}\n\tsmudge = {touch}\n\tprocess = {touch}\n\trequired = true\n\
         [diff \"x\"]\n\ttextconv = {touch}\n\tcommand = {touch}\n[diff]\n\texternal = {touch}\n\
         [credential]\n\thelper = !{touch}\n[gpg]\n\tprogram = {touch}\n[log]\n\tshowSignature = true\n\
         [gc]\n\tauto = 1\n[uploadpack]\n\tpackObjectsHook = {touch}\n",
        hooks = hooks.display()
    );
    let mut existing = fs::read_to_string(repo.join(".git/config")).expect("config");
    existing.push_str(&config);
    fs::write(repo.join(".git/config"), existing).expect("write config");
    fs::write(repo.join(".git/info/attributes"), "* filter=x diff=x\n").expect("attributes");
}

#[test]
fn a_hostile_repository_config_runs_nothing_during_import() {
    for program in ["/usr/local/bin/git", "/usr/bin/git"] {
        if !Path::new(program).exists() {
            continue;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = tmp.path().join("repo");
        new_repo(&repo);
        write(&repo.join(".gitattributes"), "* filter=x diff=x\n");
        write(&repo.join("a.txt"), "a\n");
        write(&repo.join("sub/b.txt"), "b\n");
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-qm", "one"]);
        git(&repo, &["branch", "other"]);
        // Dirty content, so that anything comparing the work tree would need the clean filter.
        write(&repo.join("a.txt"), "a, edited\n");
        write(&repo.join("untracked.txt"), "u\n");
        let marker = tmp.path().join("pwned");
        arm_hostile_repo(&repo, &marker);

        let options = PlanOptions {
            git: Some(program.into()),
            ..PlanOptions::default()
        };
        for history in [History::Branches, History::Head] {
            let plan = plan_with(&repo, history, &options).expect("plan");
            let (items, _) = tar_of(&plan);
            assert_eq!(
                items.get(&b"a.txt"[..]),
                Some(&file(0o644, "a, edited\n")),
                "content as is, unfiltered"
            );
            let dir = tmp.path().join(history.as_str());
            fs::create_dir(&dir).expect("mkdir");
            assert!(write_bundle(&plan, &dir).expect("bundle").is_some());
            assert!(
                !marker.exists(),
                "{program}: the import ran a program the repository named"
            );
        }

        // The same repository does run its programs under plain git: the test is meaningful.
        let _ = Command::new(program)
            .current_dir(&repo)
            .args(["status"])
            .output()
            .expect("git status");
        assert!(
            marker.exists(),
            "{program}: unhardened git status should have run the hostile config"
        );
    }
}

/// `git bundle list-heads`, one "<oid> <ref>" per line, sorted as git lists them.
fn heads(bundle: &Path) -> Vec<String> {
    let tmp = bundle.parent().expect("parent");
    git(tmp, &["bundle", "list-heads", &bundle.to_string_lossy()])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Fetches every head of `bundle` into a fresh repository at `dir`.
fn fetch_bundle(dir: &Path, bundle: &Path) -> PathBuf {
    new_repo(dir);
    git(
        dir,
        &[
            "fetch",
            "-q",
            &bundle.to_string_lossy(),
            "refs/heads/*:refs/remotes/b/*",
        ],
    );
    dir.to_path_buf()
}

fn has_object(repo: &Path, oid: &str) -> bool {
    Command::new("git")
        .current_dir(repo)
        .args(["cat-file", "-e", oid.trim()])
        .status()
        .expect("cat-file")
        .success()
}

/// A repository with history in every place that must not come.
struct Histories {
    main: String,
    main_parent: String,
    feature: String,
    stash: String,
    dangling: String,
    reflog_only: String,
    remote_only: String,
    tag_only: String,
}

fn repo_with_histories(repo: &Path) -> Histories {
    new_repo(repo);
    write(&repo.join("f"), "1\n");
    git(repo, &["add", "f"]);
    git(repo, &["commit", "-qm", "one"]);
    let main_parent = git(repo, &["rev-parse", "HEAD"]);
    write(&repo.join("f"), "2\n");
    git(repo, &["commit", "-qam", "two"]);
    let main = git(repo, &["rev-parse", "HEAD"]);

    git(repo, &["checkout", "-q", "-b", "feature"]);
    write(&repo.join("g"), "feature\n");
    git(repo, &["add", "g"]);
    git(repo, &["commit", "-qm", "feature"]);
    let feature = git(repo, &["rev-parse", "HEAD"]);

    write(&repo.join("g"), "reflog only\n");
    git(repo, &["commit", "-qam", "soon only in the reflog"]);
    let reflog_only = git(repo, &["rev-parse", "HEAD"]);
    git(repo, &["reset", "-q", "--hard", "HEAD~1"]);

    let tree = git(repo, &["rev-parse", "HEAD^{tree}"]);
    let dangling = git(repo, &["commit-tree", "-m", "dangling", tree.trim()]);
    let remote_only = git(
        repo,
        &[
            "commit-tree",
            "-m",
            "remote",
            "-p",
            main.trim(),
            tree.trim(),
        ],
    );
    git(
        repo,
        &["update-ref", "refs/remotes/origin/x", remote_only.trim()],
    );
    let tag_only = git(repo, &["commit-tree", "-m", "tagged", tree.trim()]);
    git(repo, &["tag", "lonely", tag_only.trim()]);
    git(repo, &["tag", "on-main", main.trim()]);

    git(repo, &["checkout", "-q", "main"]);
    write(&repo.join("f"), "stashed edit\n");
    git(repo, &["stash", "-q"]);
    let stash = git(repo, &["rev-parse", "refs/stash"]);
    Histories {
        main,
        main_parent,
        feature,
        stash,
        dangling,
        reflog_only,
        remote_only,
        tag_only,
    }
}

#[test]
fn a_branches_bundle_has_every_local_branch_and_nothing_else() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    let h = repo_with_histories(&repo);
    let plan = plan(&repo, History::Branches).expect("plan");
    assert_eq!(plan.history, History::Branches);
    let bundle = write_bundle(&plan, tmp.path())
        .expect("bundle")
        .expect("history");
    assert_eq!(bundle, tmp.path().join("history.bundle"));
    assert!(matches!(
        write_bundle(&plan, tmp.path()),
        Err(ImportError::BundleExists(_))
    ));

    let mut listed = heads(&bundle);
    listed.sort();
    let mut expected = [
        format!("{} HEAD", h.main.trim()),
        format!("{} refs/heads/feature", h.feature.trim()),
        format!("{} refs/heads/main", h.main.trim()),
    ];
    expected.sort();
    assert_eq!(listed, expected);

    let fresh = fetch_bundle(&tmp.path().join("fresh"), &bundle);
    for present in [&h.main, &h.main_parent, &h.feature] {
        assert!(has_object(&fresh, present), "{present} should come");
    }
    for (what, absent) in [
        ("stash", &h.stash),
        ("dangling", &h.dangling),
        ("reflog-only", &h.reflog_only),
        ("remote-only", &h.remote_only),
        ("tag-only", &h.tag_only),
    ] {
        assert!(!has_object(&fresh, absent), "the {what} commit came");
    }
}

#[test]
fn a_head_bundle_has_only_heads_history() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    let h = repo_with_histories(&repo);
    let plan = plan(&repo, History::Head).expect("plan");
    let bundle = write_bundle(&plan, tmp.path())
        .expect("bundle")
        .expect("history");
    assert_eq!(
        heads(&bundle),
        [
            format!("{} HEAD", h.main.trim()),
            format!("{} refs/heads/main", h.main.trim())
        ]
    );
    let fresh = fetch_bundle(&tmp.path().join("fresh"), &bundle);
    assert!(has_object(&fresh, &h.main) && has_object(&fresh, &h.main_parent));
    for absent in [
        &h.feature,
        &h.stash,
        &h.dangling,
        &h.reflog_only,
        &h.remote_only,
        &h.tag_only,
    ] {
        assert!(!has_object(&fresh, absent), "{absent} came");
    }

    // Detached: HEAD alone.
    git(&repo, &["checkout", "-q", "--detach", h.main_parent.trim()]);
    let plan = super::plan(&repo, History::Head).expect("plan");
    let dir = tmp.path().join("detached");
    fs::create_dir(&dir).expect("mkdir");
    let bundle = write_bundle(&plan, &dir).expect("bundle").expect("history");
    assert_eq!(heads(&bundle), [format!("{} HEAD", h.main_parent.trim())]);
    let fresh = tmp.path().join("fresh-detached");
    new_repo(&fresh);
    git(
        &fresh,
        &[
            "fetch",
            "-q",
            &bundle.to_string_lossy(),
            "HEAD:refs/heads/x",
        ],
    );
    assert!(has_object(&fresh, &h.main_parent));
    assert!(!has_object(&fresh, &h.main));
}

#[test]
fn a_repository_without_commits_has_no_history() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    write(&repo.join("first.txt"), "not committed yet\n");
    for history in [History::Branches, History::Head] {
        let plan = plan(&repo, history).expect("plan");
        assert!(plan.is_git);
        assert_eq!(plan.history, History::None);
        assert_eq!(write_bundle(&plan, tmp.path()).expect("no bundle"), None);
        let (items, _) = tar_of(&plan);
        expect_files(&items, &[("first.txt", file(0o644, "not committed yet\n"))]);
    }
}

#[test]
fn bad_project_paths_are_refused_with_the_fix() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("missing");
    let err = plan(&missing, History::None).expect_err("missing");
    assert_eq!(
        err.to_string(),
        format!("project path {} does not exist", missing.display())
    );
    let engine_err = crate::foundation::error::Error::from(err);
    assert_eq!(
        engine_err.code,
        crate::foundation::error::ErrorCode::InvalidArgument
    );

    let a_file = tmp.path().join("file");
    write(&a_file, "x");
    let err = plan(&a_file, History::None).expect_err("not a dir");
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a directory; give the project's root directory",
            a_file.display()
        )
    );

    // A symlink to a directory is resolved once; the plan's root is the real directory.
    let real = tmp.path().join("real");
    write(&real.join("x"), "x");
    symlink(&real, tmp.path().join("alias")).expect("symlink");
    let plan = plan(&tmp.path().join("alias"), History::None).expect("plan");
    assert_eq!(plan.root, real.canonicalize().expect("canonical"));

    // A broken `.git` is not silently read as a plain tree.
    let broken = tmp.path().join("broken");
    write(&broken.join(".git"), "gitdir: .git-missing\n");
    let err = super::plan(&broken, History::None).expect_err("broken repo");
    assert!(err.to_string().contains("points to .git-missing"), "{err}");
    fs::create_dir(broken.join(".git-missing")).expect("mkdir");
    let err = super::plan(&broken, History::None).expect_err("broken repo");
    assert!(err.to_string().contains("git cannot read"), "{err}");
}

#[test]
fn changes_between_plan_and_read_are_never_followed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let outside = tmp.path().join("outside");
    write(&outside.join("b.txt"), "outside secret\n");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    write(&repo.join("a.txt"), "a\n");
    write(&repo.join("dir/b.txt"), "b\n");
    write(&repo.join("gone.txt"), "soon gone\n");
    write(&repo.join("grows.txt"), "small\n");
    symlink("/etc/hostname", repo.join("was-link")).expect("symlink");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "one"]);

    let plan = plan(&repo, History::None).expect("plan");
    // Swap a file for a symlink, a directory for a symlink to a directory outside, a symlink
    // for a file; delete one; grow one.
    fs::remove_file(repo.join("a.txt")).expect("rm");
    symlink("/etc/passwd", repo.join("a.txt")).expect("symlink");
    fs::rename(repo.join("dir"), tmp.path().join("moved")).expect("mv");
    symlink(&outside, repo.join("dir")).expect("symlink");
    fs::remove_file(repo.join("was-link")).expect("rm");
    write(&repo.join("was-link"), "now a file\n");
    fs::remove_file(repo.join("gone.txt")).expect("rm");
    write(&repo.join("grows.txt"), "grown since the plan\n");

    let (items, summary) = tar_of(&plan);
    expect_files(
        &items,
        &[("grows.txt", file(0o644, "grown since the plan\n"))],
    );
    let mut notes: Vec<String> = summary.notes.iter().map(ToString::to_string).collect();
    notes.sort();
    assert_eq!(
        notes,
        [
            "a.txt: changed type while being imported, not imported",
            "dir/b.txt: a directory in its path is a symlink, not followed",
            "gone.txt: removed while being imported",
            "was-link: changed type while being imported, not imported",
        ]
    );
}

#[test]
fn a_tracked_path_under_a_now_symlinked_directory_is_not_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let outside = tmp.path().join("outside");
    write(&outside.join("f.txt"), "outside secret\n");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    write(&repo.join("d/f.txt"), "tracked\n");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "one"]);
    fs::remove_dir_all(repo.join("d")).expect("rm");
    symlink(&outside, repo.join("d")).expect("symlink");

    let plan = plan(&repo, History::None).expect("plan");
    assert_eq!(
        plan.notes,
        [Note {
            path: "d/f.txt".into(),
            kind: NoteKind::SymlinkInPath
        }]
    );
    let (items, _) = tar_of(&plan);
    expect_files(&items, &[("d", link(&outside.to_string_lossy()))]);
}

#[test]
fn a_nested_repository_git_cannot_read_comes_as_plain_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    write(&repo.join("top.txt"), "top\n");
    // A directory with a broken `.git` file: git does not take it for a repository.
    write(
        &repo.join("broken/.git"),
        "gitdir: /nonexistent/modules/x\n",
    );
    write(&repo.join("broken/file.txt"), "in broken\n");
    // A directory whose `.git` git takes for a repository, but whose index is garbage.
    new_repo(&repo.join("bad-index"));
    write(&repo.join("bad-index/kept.txt"), "kept\n");
    write(&repo.join("bad-index/.git/index"), "not an index");

    let plan = plan(&repo, History::None).expect("plan");
    let (items, _) = tar_of(&plan);
    expect_files(
        &items,
        &[
            ("bad-index/kept.txt", file(0o644, "kept\n")),
            ("broken/file.txt", file(0o644, "in broken\n")),
            ("top.txt", file(0o644, "top\n")),
        ],
    );
    no_git_anywhere(&items);
    assert_eq!(plan.notes.len(), 1, "{:?}", plan.notes);
    assert_eq!(plan.notes[0].path, Path::new("bad-index"));
    assert!(
        matches!(plan.notes[0].kind, NoteKind::ReadAsPlainTree(_)),
        "{:?}",
        plan.notes
    );
}

#[test]
fn a_repository_that_makes_git_block_times_out() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A git dir whose HEAD is a fifo: git blocks opening it.
    let repo = tmp.path().join("repo");
    let fake = repo.join("fake-git-dir");
    fs::create_dir_all(fake.join("objects")).expect("mkdir");
    fs::create_dir_all(fake.join("refs")).expect("mkdir");
    nix::unistd::mkfifo(
        &fake.join("HEAD"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .expect("mkfifo");
    write(&repo.join(".git"), &format!("gitdir: {}\n", fake.display()));
    write(&repo.join("a"), "a\n");
    let options = PlanOptions {
        git_timeout: Duration::from_millis(500),
        ..PlanOptions::default()
    };
    let started = Instant::now();
    let err = plan_with(&repo, History::Head, &options).expect_err("times out");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(err.to_string().contains("did not finish within"), "{err}");
    assert_eq!(
        crate::foundation::error::Error::from(err).code,
        crate::foundation::error::ErrorCode::Timeout
    );
}

#[test]
fn opening_beneath_the_root_never_resolves_a_symlink() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    write(&root.join("real/file"), "x");
    symlink("real", root.join("inner")).expect("symlink");
    symlink("/etc", root.join("etc")).expect("symlink");
    symlink("real/file", root.join("to-file")).expect("symlink");
    let root_fd = nix::fcntl::open(
        &root,
        OFlag::O_PATH | OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .expect("open root");
    for resolver in [Resolver::Auto, Resolver::Walk] {
        let open =
            |rel: &[u8], flags| beneath::open(root_fd.as_fd(), rel, flags, resolver).map(drop);
        assert_eq!(open(b"real/file", OFlag::O_RDONLY), Ok(()));
        assert_eq!(
            open(b"inner/file", OFlag::O_RDONLY),
            Err(Errno::ELOOP),
            "{resolver:?}"
        );
        assert_eq!(
            open(b"etc/passwd", OFlag::O_RDONLY),
            Err(Errno::ELOOP),
            "{resolver:?}"
        );
        assert_eq!(
            open(b"inner/file", OFlag::O_PATH),
            Err(Errno::ELOOP),
            "{resolver:?}"
        );
        assert_eq!(
            open(b"to-file", OFlag::O_RDONLY),
            Err(Errno::ELOOP),
            "{resolver:?}"
        );
        assert_eq!(
            open(b"real/file/x", OFlag::O_RDONLY),
            Err(Errno::ENOTDIR),
            "{resolver:?}"
        );
        assert_eq!(
            open(b"nope/file", OFlag::O_RDONLY),
            Err(Errno::ENOENT),
            "{resolver:?}"
        );
        for bad in [
            &b"../root/real/file"[..],
            b"/etc/passwd",
            b"real/../real/file",
            b"./real/file",
            b"real//file",
            b"real/",
        ] {
            assert_eq!(open(bad, OFlag::O_RDONLY), Err(Errno::EINVAL), "{bad:?}");
        }
        let probe = beneath::Probe::new(root_fd.as_fd(), b"to-file", resolver).expect("probe link");
        assert_eq!(probe.kind(), beneath::Kind::Symlink);
        assert_eq!(probe.read_link(), Ok(b"real/file".to_vec()));
        assert!(matches!(
            beneath::open_regular(root_fd.as_fd(), b"to-file", resolver),
            Err(beneath::OpenFileError::NotRegular)
        ));
    }
}

#[test]
fn the_walk_fallback_imports_the_same_tree() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("project");
    write(&root.join("a/b/c.txt"), "c\n");
    symlink("/etc", root.join("a/etc")).expect("symlink");
    write(&root.join("x"), "x\n");
    let auto = tar_of(&plan(&root, History::None).expect("plan")).0;
    let walk = tar_of(
        &plan_resolving(
            &root,
            History::None,
            &PlanOptions::default(),
            Resolver::Walk,
        )
        .expect("plan"),
    )
    .0;
    assert_eq!(auto, walk);
    expect_files(
        &walk,
        &[
            ("a/b/c.txt", file(0o644, "c\n")),
            ("a/etc", link("/etc")),
            ("x", file(0o644, "x\n")),
        ],
    );
}

#[test]
fn long_names_and_targets_survive_and_gnu_tar_agrees() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("project");
    let deep = format!("{}/{}/{}", "a".repeat(90), "b".repeat(90), "c".repeat(90));
    write(&root.join(&deep).join("file.txt"), "deep\n");
    let target = format!("../{}", "t".repeat(250));
    symlink(&target, root.join("link")).expect("symlink");
    let plan = plan(&root, History::None).expect("plan");
    let (items, _) = tar_of(&plan);
    expect_files(
        &items,
        &[
            (&*format!("{deep}/file.txt"), file(0o644, "deep\n")),
            ("link", link(&target)),
        ],
    );

    if Path::new("/usr/bin/tar").exists() || Path::new("/bin/tar").exists() {
        let mut out = Vec::new();
        write_tar(&plan, &mut out, &mut |_, _| {}).expect("tar");
        let archive = tmp.path().join("import.tar");
        fs::write(&archive, &out).expect("write archive");
        let dest = tmp.path().join("extracted");
        fs::create_dir(&dest).expect("mkdir");
        let status = Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&dest)
            .status()
            .expect("tar -x");
        assert!(status.success());
        assert_eq!(
            fs::read_to_string(dest.join(&deep).join("file.txt")).expect("read"),
            "deep\n"
        );
        assert_eq!(
            fs::read_link(dest.join("link")).expect("readlink"),
            Path::new(&target)
        );
    }
}

#[test]
fn a_file_that_shrinks_while_read_is_padded() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("f");
    write(&path, "abc");
    let (mut done, mut calls) = (0, 0);
    let mut progress = |_: u64, _: u64| calls += 1;
    let mut reader = super::tarball::FileReader::new(
        fs::File::open(&path).expect("open"),
        10,
        &mut done,
        10,
        &mut progress,
    );
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut out).expect("read");
    assert!(reader.shrank());
    assert_eq!(out, b"abc\0\0\0\0\0\0\0");
    drop(reader);
    assert_eq!(done, 10);
}

/// Fails the one write that crosses `fail_at` bytes, then accepts writes again.
struct FlakyWriter {
    written: Vec<u8>,
    fail_at: usize,
    failed: bool,
}

impl std::io::Write for FlakyWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.failed && self.written.len() + buf.len() > self.fail_at {
            self.failed = true;
            return Err(std::io::Error::other("disk full"));
        }
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_failed_stream_does_not_end_like_a_complete_archive() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("project");
    for n in 0..10 {
        write(&root.join(format!("f{n}")), "x");
    }
    let plan = plan(&root, History::None).expect("plan");
    let mut out = FlakyWriter {
        written: Vec::new(),
        fail_at: 4 * 512,
        failed: false,
    };
    let err = write_tar(&plan, &mut out, &mut |_, _| {}).expect_err("write fails");
    assert!(
        err.to_string()
            .starts_with("writing the import stream failed: disk full"),
        "{err}"
    );
    assert_eq!(
        out.written.len(),
        4 * 512,
        "nothing written after the failure (no end-of-archive blocks)"
    );
}

#[test]
fn five_thousand_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    new_repo(&repo);
    for dir in 0..50 {
        for n in 0..100 {
            write(
                &repo.join(format!("d{dir:02}/f{n:03}.txt")),
                &format!("{dir} {n}\n"),
            );
        }
    }
    git(&repo, &["add", "d0*", "d1*"]);
    git(&repo, &["commit", "-qm", "some"]);
    let started = Instant::now();
    let plan = plan(&repo, History::Branches).expect("plan");
    let planned = started.elapsed();
    let mut out = Vec::new();
    let summary = write_tar(&plan, &mut out, &mut |_, _| {}).expect("tar");
    eprintln!(
        "5,000 files: plan {planned:?}, plan+tar {:?}, {} bytes of tar",
        started.elapsed(),
        out.len()
    );
    assert_eq!(plan.files, 5_000);
    assert_eq!(summary.files, 5_000);
    assert_eq!(untar(&out).len(), 5_050);
}

#[test]
fn a_note_shows_control_characters_in_its_path_escaped() {
    let note = Note {
        path: PathBuf::from("evil\n2026-01-01T00:00:00Z forged\x1b[2J"),
        kind: NoteKind::Vanished,
    };
    assert_eq!(
        note.to_string(),
        "evil\\n2026-01-01T00:00:00Z forged\\u{1b}[2J: removed while being imported"
    );
}

/// A repository outside the project, with a commit whose file the guest must never see.
fn outside_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("elsewhere");
    new_repo(&repo);
    write(&repo.join("secret.txt"), "outside history\n");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "secret"]);
    repo
}

fn refused(project: &Path, expected: &[&str]) {
    for history in [History::Branches, History::None] {
        let err = plan(project, history).expect_err("refused");
        let text = err.to_string();
        for part in expected {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        assert_eq!(
            crate::foundation::error::Error::from(err).code,
            crate::foundation::error::ErrorCode::InvalidArgument,
            "{text}"
        );
    }
}

#[test]
fn git_pointers_out_of_the_project_are_refused_naming_file_and_target() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let outside = outside_repo(tmp.path());
    let outside_git = outside.join(".git");
    let shown = outside_git.display().to_string();

    // A `.git` file, absolute and relative (climbing out with `..`).
    let p = tmp.path().join("abs");
    write(&p.join(".git"), &format!("gitdir: {shown}\n"));
    refused(&p, &[&p.join(".git").display().to_string(), &shown]);
    let p = tmp.path().join("rel");
    write(&p.join(".git"), "gitdir: ../elsewhere/.git\n");
    refused(&p, &["../elsewhere/.git"]);

    // A `..` after a symlinked directory inside the project climbs from the link's target.
    let p = tmp.path().join("via-link");
    fs::create_dir_all(p.join("real/.git-store")).expect("mkdir");
    symlink(outside.join("x"), p.join("hop")).expect("symlink");
    fs::create_dir_all(outside.join("x")).expect("mkdir");
    write(&p.join(".git"), "gitdir: hop/../.git\n");
    refused(&p, &["hop/../.git"]);

    // A real git directory in the project whose `commondir` points out.
    let p = tmp.path().join("common");
    new_repo(&p);
    write(&p.join(".git/commondir"), &format!("{shown}\n"));
    refused(
        &p,
        &[&p.join(".git/commondir").display().to_string(), &shown],
    );

    // Alternates, either kind.
    for name in ["alternates", "http-alternates"] {
        let p = tmp.path().join(name);
        new_repo(&p);
        write(
            &p.join(".git/objects/info").join(name),
            &format!("{shown}/objects\n"),
        );
        refused(&p, &[&format!("objects/info/{name}"), "alternates"]);
    }

    // A symlink anywhere inside the git directory (here: its object store).
    let p = tmp.path().join("linked-objects");
    new_repo(&p);
    fs::remove_dir_all(p.join(".git/objects")).expect("rm objects");
    symlink(outside_git.join("objects"), p.join(".git/objects")).expect("symlink");
    refused(
        &p,
        &[&p.join(".git/objects").display().to_string(), "symlink"],
    );

    // A nested repository (a submodule's `.git` file) pointing out refuses the import too.
    let p = tmp.path().join("nested");
    new_repo(&p);
    write(&p.join("a.txt"), "a\n");
    write(&p.join("sub/.git"), &format!("gitdir: {shown}\n"));
    write(&p.join("sub/b.txt"), "b\n");
    refused(&p, &[&p.join("sub/.git").display().to_string(), &shown]);
}

#[test]
fn a_submodule_whose_git_dir_is_in_the_superproject_imports() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let p = tmp.path().join("super");
    new_repo(&p);
    write(&p.join("top.txt"), "top\n");
    // What `git submodule absorbgitdirs` leaves: the module's git dir under .git/modules.
    let module = p.join(".git/modules/sub");
    new_repo(&p.join("sub"));
    write(&p.join("sub/inner.txt"), "inner\n");
    fs::create_dir_all(p.join(".git/modules")).expect("mkdir modules");
    fs::rename(p.join("sub/.git"), &module).expect("absorb");
    write(&p.join("sub/.git"), "gitdir: ../.git/modules/sub\n");
    git(&p.join("sub"), &["config", "core.worktree", "../../../sub"]);
    let plan = plan(&p, History::None).expect("plan");
    let (items, _) = tar_of(&plan);
    expect_files(
        &items,
        &[
            ("sub/inner.txt", file(0o644, "inner\n")),
            ("top.txt", file(0o644, "top\n")),
        ],
    );
}
