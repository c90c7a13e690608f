//! Test support shared by this crate's tests and the engine's verification tests: a baseline
//! with a little of everything a patch can touch, the patch the real `git` makes of changes to
//! it, and the tar the import would write of it. Built only for tests (the `fixtures`
//! feature), never into the product.
// A fixture that cannot be made fails the test that asked for it.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs the test's own (unhardened) git to build fixtures; returns stdout.
fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args([
            "-c",
            "commit.gpgSign=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A tar of `root` (without `.git`) as the import writes it: parents before children, links
/// not followed.
pub fn tar_of(root: &Path, out: &Path) -> PathBuf {
    fn walk(builder: &mut tar::Builder<std::fs::File>, root: &Path, rel: &Path) {
        let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            let rel = rel.join(&name);
            if rel == Path::new(".git") {
                continue;
            }
            let full = root.join(&rel);
            builder.append_path_with_name(&full, &rel).unwrap();
            if std::fs::symlink_metadata(&full).unwrap().is_dir() {
                walk(builder, root, &rel);
            }
        }
    }
    let mut builder = tar::Builder::new(std::fs::File::create(out).unwrap());
    builder.follow_symlinks(false);
    walk(&mut builder, root, Path::new(""));
    builder.finish().unwrap();
    out.to_owned()
}

/// The baseline of the fixtures: a little of everything a patch can touch, and files it does
/// not touch.
pub fn make_baseline(root: &Path) {
    let write = |rel: &str, data: &[u8]| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    };
    write("a.txt", b"one\ntwo\nthree\nfour\nfive\nsix\nseven\n");
    write("gone.txt", b"to be deleted\n");
    write("script.sh", b"#!/bin/sh\necho hi\n");
    write(
        "src/lib.rs",
        b"fn a() {}\nfn b() {}\nfn c() {}\nfn d() {}\nfn e() {}\n",
    );
    write("src/.gitattributes", b"*.rs text eol=lf\n");
    write(".gitattributes", b"*.bin binary\n");
    write("dir with space/f \"q\".txt", b"quoted\nname\n");
    write("\u{fc}/na\u{ef}ve.txt", b"utf-8\nname\n");
    write(
        "bin.bin",
        &(0u8..=255).cycle().take(3000).collect::<Vec<_>>(),
    );
    // Larger than what the indexed extraction reads with a header in one go.
    let big: String = (0..4000).map(|i| format!("line {i:05}\n")).collect();
    write("big.txt", big.as_bytes());
    write("target.txt", b"link target\n");
    std::os::unix::fs::symlink("target.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("src", root.join("srclink")).unwrap();
    for i in 0..40 {
        write(
            &format!("filler/{i:02}.txt"),
            format!("filler {i}\n").as_bytes(),
        );
    }
}

/// The changes of the fixture patch: a rename with edits, a copy, a deletion, a mode change,
/// a retargeted symlink, a binary edit, quoted and UTF-8 names, a new file in a new directory.
fn make_changes(root: &Path) {
    std::fs::rename(root.join("src/lib.rs"), root.join("src/core.rs")).unwrap();
    std::fs::write(
        root.join("src/core.rs"),
        b"fn a() {}\nfn b() {}\nfn c() {}\nfn d() {}\nfn e2() {}\n",
    )
    .unwrap();
    std::fs::copy(root.join("a.txt"), root.join("a-copy.txt")).unwrap();
    std::fs::remove_file(root.join("gone.txt")).unwrap();
    std::fs::set_permissions(
        root.join("script.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::remove_file(root.join("link")).unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
    let mut binary = std::fs::read(root.join("bin.bin")).unwrap();
    binary[100] ^= 0xff;
    std::fs::write(root.join("bin.bin"), binary).unwrap();
    let big = std::fs::read_to_string(root.join("big.txt")).unwrap();
    std::fs::write(
        root.join("big.txt"),
        big.replace("line 02000\n", "line 2000!\n"),
    )
    .unwrap();
    std::fs::write(root.join("dir with space/f \"q\".txt"), b"quoted\nname!\n").unwrap();
    std::fs::write(root.join("\u{fc}/na\u{ef}ve.txt"), b"utf-8\nname!\n").unwrap();
    std::fs::create_dir_all(root.join("new/deep")).unwrap();
    std::fs::write(root.join("new/deep/file.txt"), b"new\n").unwrap();
}

/// A repository with the baseline committed and the changes staged; returns the patch the
/// guest would produce (`git diff --binary`, renames and copies found).
pub fn fixture(dir: &Path) -> (PathBuf, Vec<u8>) {
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    make_baseline(&repo);
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "base"]);
    let baseline = tar_of(&repo, &dir.join("baseline.tar"));
    make_changes(&repo);
    git(&repo, &["add", "-A"]);
    let patch = git(
        &repo,
        &[
            "diff",
            "--cached",
            "--binary",
            "--full-index",
            "-M",
            "-C",
            "--find-copies-harder",
            "--src-prefix=a/",
            "--dst-prefix=b/",
        ],
    );
    (baseline, patch)
}

/// The patch's `diff --git` sections, one patch each.
pub fn sections(patch: &[u8]) -> Vec<Vec<u8>> {
    let text = patch.to_vec();
    let mut starts: Vec<usize> = (0..text.len())
        .filter(|&i| (i == 0 || text[i - 1] == b'\n') && text[i..].starts_with(b"diff --git "))
        .collect();
    starts.push(text.len());
    starts
        .windows(2)
        .map(|w| text[w[0]..w[1]].to_vec())
        .collect()
}
