//! Verification extracts only what the patch touches and reaches the verdict a full unpack
//! of the baseline would (the full unpack is kept here as the reference).

use std::path::Path;
use std::process::Command;

use dynocap_review::fixtures::{fixture, make_baseline, sections, tar_of};
use dynocap_review::tar_index;

use super::*;

/// The verification as it was before it extracted only the touched entries and let
/// `--check` judge: the whole baseline unpacked, then the patch applied for real.
fn verify_by_full_unpack(baseline_tar: &Path, patch: &Path, scratch: &Path) -> Result<(), String> {
    let result = (|| {
        let bytes = std::fs::read(patch).unwrap();
        if bytes.is_empty() {
            return Ok(());
        }
        let scratch_dir = Scratch::make(scratch)?;
        let apply = scratch_dir.start_git(Apply::Write)?;
        let mut archive = tar::Archive::new(std::io::BufReader::new(
            std::fs::File::open(baseline_tar).unwrap(),
        ));
        archive.set_preserve_permissions(true);
        archive.set_overwrite(false);
        archive
            .unpack(scratch_dir.tree())
            .map_err(|err| format!("unpacking the baseline copy: {err}"))?;
        apply.finish(&bytes)
    })();
    let _ = std::fs::remove_dir_all(scratch);
    result
}

/// Asserts that `patch` gets the same verdict, in the same words, from a full unpack, from
/// the touched entries found by reading the tar through and from those found through its
/// index; returns it.
fn same_verdict(baseline: &Path, patch: &[u8], dir: &Path) -> Result<(), String> {
    let path = dir.join("p.diff");
    std::fs::write(&path, patch).unwrap();
    let _ = std::fs::remove_file(tar_index::index_path(baseline));
    let scanned = verify(baseline, &path, &dir.join("scratch-touched"));
    tar_index::write_for(baseline).unwrap();
    let indexed = verify(baseline, &path, &dir.join("scratch-indexed"));
    let full = verify_by_full_unpack(baseline, &path, &dir.join("scratch-full"));
    let shown = String::from_utf8_lossy(patch);
    assert_eq!(scanned, full, "verdicts differ for\n{shown}");
    assert_eq!(indexed, full, "verdicts (indexed) differ for\n{shown}");
    scanned
}

#[test]
fn a_matching_patch_verifies_and_a_stale_one_explains_itself() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("base.tar");
    let mut builder = tar::Builder::new(std::fs::File::create(&tar).unwrap());
    let mut header = tar::Header::new_gnu();
    header.set_size(6);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "a.txt", &b"hello\n"[..])
        .unwrap();
    builder.finish().unwrap();
    drop(builder);
    let good = dir.path().join("good.diff");
    std::fs::write(
        &good,
        "diff --git a/a.txt b/a.txt\nindex ce01362..cc628cc 100644\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-hello\n+world\n",
    )
    .unwrap();
    verify(&tar, &good, &dir.path().join("s1")).unwrap();
    assert!(
        !dir.path().join("s1").exists(),
        "scratch moved out of the way"
    );

    let stale = dir.path().join("stale.diff");
    std::fs::write(
        &stale,
        "diff --git a/a.txt b/a.txt\nindex ce01362..cc628cc 100644\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-other\n+world\n",
    )
    .unwrap();
    let err = verify(&tar, &stale, &dir.path().join("s2")).unwrap_err();
    assert!(err.contains("does not apply"), "{err}");

    let empty = dir.path().join("empty.diff");
    std::fs::write(&empty, "").unwrap();
    verify(&tar, &empty, &dir.path().join("s3")).unwrap();
}

/// The scratch directory's name is free as soon as a verification returns, and what it held
/// is removed (off the caller's path) whatever the verdict.
#[test]
fn the_scratch_directory_is_removed_after_each_verification() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, patch) = fixture(dir.path());
    tar_index::write_for(&baseline).unwrap();
    let path = dir.path().join("p.diff");
    std::fs::write(&path, &patch).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let scratch = work.join("verify");
    // Twice in a row on one name, and a refusal.
    verify(&baseline, &path, &scratch).unwrap();
    assert!(!scratch.exists());
    verify(&baseline, &path, &scratch).unwrap();
    assert!(!scratch.exists());
    std::fs::write(&path, b"diff --git a/a.txt b/a.txt\nindex 1111111..2222222 100644\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-nope\n+uno\n").unwrap();
    verify(&baseline, &path, &scratch).unwrap_err();
    assert!(!scratch.exists());
    // The removals run on threads of their own: wait for them (bounded, not timed).
    for _ in 0..1000 {
        if std::fs::read_dir(&work).unwrap().next().is_none() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let left: Vec<_> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    panic!("left behind: {left:?}");
}

/// The fixture patch and a stale one, against the fixture baseline with its index missing,
/// damaged, made for another tar, or sound in form but leading to the wrong entries or past
/// the tar: each time the verdict a full unpack gives.
#[test]
fn a_missing_damaged_or_wrong_index_gives_the_full_unpack_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, patch) = fixture(dir.path());
    let good_patch = dir.path().join("good.diff");
    std::fs::write(&good_patch, &patch).unwrap();
    let stale_patch = dir.path().join("stale.diff");
    std::fs::write(
        &stale_patch,
        b"diff --git a/a.txt b/a.txt\nindex 1111111..2222222 100644\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-not one\n+uno\n",
    )
    .unwrap();
    let index_path = tar_index::index_path(&baseline);
    tar_index::write_for(&baseline).unwrap();
    let sound = std::fs::read(&index_path).unwrap();
    let mut flipped = sound.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 1;
    // Each name at the next name's offset: a well-formed index that leads astray.
    let index = TarIndex::load(&baseline).unwrap();
    let entries: Vec<(String, u64)> = index.beneath("").map(|(n, o)| (n.to_owned(), o)).collect();
    let shifted: Vec<(String, u64)> = entries
        .iter()
        .zip(entries.iter().cycle().skip(1))
        .map(|((name, _), (_, offset))| (name.clone(), *offset))
        .collect();
    let cases: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("missing", None),
        ("cut short", Some(sound[..sound.len() - 9].to_vec())),
        ("a flipped bit", Some(flipped)),
    ];
    let check = |what: &str| {
        for patch in [&good_patch, &stale_patch] {
            let full = verify_by_full_unpack(&baseline, patch, &dir.path().join("full"));
            let verdict = verify(&baseline, patch, &dir.path().join("scratch"));
            assert_eq!(verdict, full, "{what}, {}", patch.display());
        }
    };
    for (what, bytes) in cases {
        match bytes {
            None => std::fs::remove_file(&index_path).unwrap(),
            Some(bytes) => std::fs::write(&index_path, bytes).unwrap(),
        }
        check(what);
    }
    tar_index::write_entries(&baseline, shifted).unwrap();
    TarIndex::load(&baseline).expect("the shifted index is well-formed");
    check("entries at the wrong offsets");
    // Offsets no header of the tar can have, for a file both patches read: past its end, and
    // past 2^63, where reading fails outright instead of finding nothing.
    let tar_len = std::fs::metadata(&baseline).unwrap().len();
    for (what, offset) in [
        ("an offset past the end", tar_len),
        ("an offset past 2^63", 1 << 63),
    ] {
        let moved = entries
            .iter()
            .map(|(name, at)| (name.clone(), if name == "a.txt" { offset } else { *at }))
            .collect();
        tar_index::write_entries(&baseline, moved).unwrap();
        check(what);
    }
    // Made for another tar.
    std::fs::write(&index_path, &sound).unwrap();
    let mut longer = std::fs::read(&baseline).unwrap();
    longer.extend_from_slice(&[0; 512]);
    std::fs::write(&baseline, longer).unwrap();
    check("stale");
}

#[test]
fn the_whole_patch_and_each_entry_verify_as_with_a_full_unpack() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, patch) = fixture(dir.path());
    same_verdict(&baseline, &patch, dir.path()).unwrap();
    let sections = sections(&patch);
    assert!(sections.len() >= 9, "{}", sections.len());
    for section in &sections {
        same_verdict(&baseline, section, dir.path()).unwrap();
    }
}

/// Every entry of the fixture patch against baselines that differ where it looks: each named
/// path missing, a file where a leading directory should be, a non-empty directory where a
/// new file goes, a symlinked leading directory, attributes that change how a file reads.
#[test]
fn every_entry_against_altered_baselines_gets_the_full_unpack_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let (_, patch) = fixture(dir.path());
    let sections = sections(&patch);
    let original = dir.path().join("original");
    std::fs::create_dir_all(&original).unwrap();
    make_baseline(&original);

    type Alter = Box<dyn Fn(&Path)>;
    let mut alterations: Vec<(String, Alter)> = Vec::new();
    for name in [
        "a.txt",
        "gone.txt",
        "script.sh",
        "link",
        "bin.bin",
        "src/lib.rs",
        "dir with space/f \"q\".txt",
        "\u{fc}/na\u{ef}ve.txt",
    ] {
        alterations.push((
            format!("{name} missing"),
            Box::new(move |root: &Path| std::fs::remove_file(root.join(name)).unwrap()),
        ));
    }
    alterations.push((
        "a file where the new file's directory goes".into(),
        Box::new(|root: &Path| std::fs::write(root.join("new"), b"in the way\n").unwrap()),
    ));
    alterations.push((
        "a non-empty directory where the copy goes".into(),
        Box::new(|root: &Path| {
            std::fs::create_dir_all(root.join("a-copy.txt/inner")).unwrap();
            std::fs::write(root.join("a-copy.txt/inner/x"), b"x\n").unwrap();
        }),
    ));
    alterations.push((
        "an empty directory where the copy goes".into(),
        Box::new(|root: &Path| std::fs::create_dir_all(root.join("a-copy.txt")).unwrap()),
    ));
    alterations.push((
        "a symlink as a leading directory".into(),
        Box::new(|root: &Path| {
            std::fs::rename(root.join("dir with space"), root.join("real dir")).unwrap();
            std::os::unix::fs::symlink("real dir", root.join("dir with space")).unwrap();
        }),
    ));
    alterations.push((
        "a chain of symlinks as a leading directory".into(),
        Box::new(|root: &Path| {
            std::fs::rename(root.join("dir with space"), root.join("real dir")).unwrap();
            std::os::unix::fs::symlink("real dir", root.join("mid")).unwrap();
            std::os::unix::fs::symlink("mid", root.join("dir with space")).unwrap();
        }),
    ));
    alterations.push((
        "a symlink out of the tree as a leading directory".into(),
        Box::new(|root: &Path| {
            std::fs::remove_dir_all(root.join("dir with space")).unwrap();
            std::os::unix::fs::symlink("/nonexistent-dynocap", root.join("dir with space"))
                .unwrap();
        }),
    ));
    alterations.push((
        "the new file already exists".into(),
        Box::new(|root: &Path| {
            std::fs::create_dir_all(root.join("new/deep")).unwrap();
            std::fs::write(root.join("new/deep/file.txt"), b"new\n").unwrap();
        }),
    ));
    alterations.push((
        // Attributes that would have git read CRLF files as LF: they play no part, so the LF
        // patch applies to neither, whether the whole baseline is there or a part.
        "CRLF files the patch edits, marked text by attributes".into(),
        Box::new(|root: &Path| {
            std::fs::write(root.join(".gitattributes"), b"*.txt text\n").unwrap();
            std::fs::write(
                root.join("dir with space/f \"q\".txt"),
                b"quoted\r\nname\r\n",
            )
            .unwrap();
            std::fs::write(root.join("\u{fc}/.gitattributes"), b"*.txt -text\n").unwrap();
            std::fs::write(root.join("\u{fc}/na\u{ef}ve.txt"), b"utf-8\r\nname\r\n").unwrap();
        }),
    ));

    let mut failures = 0;
    for (what, alter) in &alterations {
        let root = dir.path().join("altered");
        let _ = std::fs::remove_dir_all(&root);
        let copied = Command::new("cp")
            .args(["-a", "--"])
            .arg(&original)
            .arg(&root)
            .status()
            .unwrap();
        assert!(copied.success());
        alter(&root);
        let baseline = tar_of(&root, &dir.path().join("altered.tar"));
        for section in &sections {
            let verdict = std::panic::catch_unwind(|| same_verdict(&baseline, section, dir.path()));
            match verdict {
                Ok(Err(_)) => failures += 1,
                Ok(Ok(())) => {}
                Err(panic) => {
                    eprintln!("with {what}:");
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
    // The alterations do make entries fail (every missing file at least once), so the
    // comparison above compared refusals too, not only successes.
    assert!(failures >= 10, "only {failures} refusals");
}

/// The guest diffs without attributes, so its patch holds a checkout's bytes: `$Id: …$`
/// expanded, CRLF kept. Such a patch verifies whatever the baseline's `.gitattributes` say,
/// and one written against the attributes' folded form does not.
#[test]
fn attributes_in_the_baseline_do_not_change_how_a_patch_reads() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let id = "$Id: 0123456789abcdef0123456789abcdef01234567 $";
    std::fs::write(
        root.join(".gitattributes"),
        "*.id ident\n*.crlf text eol=lf\n*.enc working-tree-encoding=UTF-16\n",
    )
    .unwrap();
    std::fs::write(root.join("sub/.gitattributes"), "*.txt ident text\n").unwrap();
    std::fs::write(root.join("a.id"), format!("id {id}\n")).unwrap();
    std::fs::write(root.join("b.crlf"), "one\r\ntwo\r\n").unwrap();
    std::fs::write(root.join("c.enc"), "plain\n").unwrap();
    std::fs::write(root.join("sub/d.txt"), format!("{id}\r\n")).unwrap();
    let baseline = tar_of(&root, &dir.path().join("base.tar"));
    let faithful = format!(
        "diff --git a/a.id b/a.id\nindex 1111111..2222222 100644\n--- a/a.id\n+++ b/a.id\n@@ -1 +1,2 @@\n id {id}\n+more\n\
         diff --git a/b.crlf b/b.crlf\nindex 1111111..2222222 100644\n--- a/b.crlf\n+++ b/b.crlf\n@@ -1,2 +1,3 @@\n one\r\n two\r\n+three\r\n\
         diff --git a/c.enc b/c.enc\nindex 1111111..2222222 100644\n--- a/c.enc\n+++ b/c.enc\n@@ -1 +1,2 @@\n plain\n+more\n\
         diff --git a/sub/d.txt b/sub/d.txt\nindex 1111111..2222222 100644\n--- a/sub/d.txt\n+++ b/sub/d.txt\n@@ -1 +1,2 @@\n {id}\r\n+more\r\n"
    );
    same_verdict(&baseline, faithful.as_bytes(), dir.path()).unwrap();
    let folded = "diff --git a/a.id b/a.id\nindex 1111111..2222222 100644\n--- a/a.id\n+++ b/a.id\n@@ -1 +1,2 @@\n id $Id$\n+more\n";
    let err = same_verdict(&baseline, folded.as_bytes(), dir.path()).unwrap_err();
    assert!(err.contains("a.id"), "{err}");
}

#[test]
fn a_patch_against_a_file_missing_from_the_baseline_fails_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, _) = fixture(dir.path());
    let patch = b"diff --git a/nowhere.txt b/nowhere.txt\nindex 0000000..1111111 100644\n\
--- a/nowhere.txt\n+++ b/nowhere.txt\n@@ -1 +1 @@\n-old\n+new\n";
    let err = same_verdict(&baseline, patch, dir.path()).unwrap_err();
    assert!(err.contains("does not apply"), "{err}");
    assert!(err.contains("nowhere.txt"), "{err}");
}

#[test]
fn an_unreadable_patch_is_not_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, _) = fixture(dir.path());
    let path = dir.path().join("bad.diff");
    std::fs::write(&path, b"not a patch\n").unwrap();
    let err = verify(&baseline, &path, &dir.path().join("s")).unwrap_err();
    assert!(err.contains("cannot be read"), "{err}");
}

#[test]
fn only_a_bounded_text_patch_is_verified_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (_, patch) = fixture(dir.path());
    let with_binary = patch::parse(&patch, patch.len()).unwrap();
    assert!(with_binary.iter().any(|file| file.is_binary));
    assert_eq!(in_memory::budget(&with_binary, patch.len()), None);

    let text: Vec<u8> = sections(&patch)
        .into_iter()
        .filter(|section| {
            let section = String::from_utf8_lossy(section);
            !section.contains("GIT binary patch") && !section.contains("Binary files")
        })
        .flatten()
        .collect();
    let files = patch::parse(&text, text.len()).unwrap();
    let budget = in_memory::budget(&files, text.len()).expect("a small text patch qualifies");
    assert!(budget > 0);
    assert_eq!(in_memory::budget(&files, usize::MAX), None, "too large");
}

/// A patch entry creating `path` (mode `mode`) with `contents` (one line, no newline).
fn creation(path: &str, mode: &str, contents: &str) -> String {
    format!(
        "diff --git a/{path} b/{path}\nnew file mode {mode}\nindex 0000000..1111111\n\
--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+{contents}\n\\ No newline at end of file\n"
    )
}

/// A patch entry deleting the fixture's `gone.txt`.
const DELETE_GONE: &str = "diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\n\
index 1111111..0000000\n--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-to be deleted\n";

/// The refusals only writing the result finds (a `--check` passes them all), and their
/// neighbours that apply, each get a real apply's verdict in its words: `--check` judges
/// only where nothing stands in the way of the writes.
#[test]
fn what_only_writing_finds_gets_the_full_unpack_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, _) = fixture(dir.path());
    let file = |path: &str| creation(path, "100644", "x");
    let refused = [
        ("a new file beneath a file", file("a.txt/inner")),
        ("a new file where a non-empty directory is", file("filler")),
        (
            "a new file beneath another new file",
            file("made") + &file("made/inner"),
        ),
        (
            "a new file beneath a symlink the patch makes",
            creation("made-link", "120000", "filler") + &file("made-link/inner"),
        ),
    ];
    let applies = [
        ("a new file beside the others", file("src/new.rs")),
        ("a new file in new directories", file("fresh/deep/new.rs")),
        (
            "a new file beneath a file the patch deletes",
            DELETE_GONE.to_owned() + &file("gone.txt/inner"),
        ),
    ];
    for (what, patch) in &refused {
        let dry = DryRun::of(&patch::parse(patch.as_bytes(), patch.len()).unwrap());
        let err = same_verdict(&baseline, patch.as_bytes(), dir.path())
            .expect_err(&format!("{what} is refused"));
        assert!(err.contains("does not apply"), "{what}: {err}");
        // Each is a case the dry run must send to a real apply: by the patch alone, or by
        // the tree it meets.
        if let Ok(dry) = dry {
            let tree = dir.path().join("unpacked");
            let _ = std::fs::remove_dir_all(&tree);
            std::fs::create_dir_all(&tree).unwrap();
            tar::Archive::new(std::fs::File::open(&baseline).unwrap())
                .unpack(&tree)
                .unwrap();
            assert!(dry.suffices_in(&tree).is_err(), "{what}");
        }
    }
    for (what, patch) in &applies {
        same_verdict(&baseline, patch.as_bytes(), dir.path())
            .unwrap_or_else(|err| panic!("{what}: {err}"));
    }
    // The plain one is judged by `--check` alone.
    let plain = file("src/new.rs");
    let dry = DryRun::of(&patch::parse(plain.as_bytes(), plain.len()).unwrap()).unwrap();
    dry.suffices_in(&dir.path().join("repo")).unwrap();
}

/// A small deterministic generator (xorshift64*): the same cases on every run.
struct Cases(u64);

impl Cases {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let value = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33;
        usize::try_from(value).unwrap() % n
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.below(of.len())]
    }
}

/// The contents of every file of the generated baselines.
const CONTENTS: &str = "one\ntwo\n";

/// Builds under `root` a random baseline over the paths `a`, `a/b`, `a/b/c`, `d`, `d/e` and
/// `f`: each a file, a directory (of the paths beneath it), a symlink, or nothing; returns
/// what it made, for a message.
fn random_tree(cases: &mut Cases, root: &Path) -> Vec<String> {
    fn make(cases: &mut Cases, root: &Path, path: &str, children: &[&str], made: &mut Vec<String>) {
        let full = root.join(path);
        match cases.below(if children.is_empty() { 3 } else { 4 }) {
            0 => {}
            1 => {
                std::fs::write(&full, CONTENTS).unwrap();
                made.push(format!("{path} file"));
            }
            2 => {
                let target = cases.pick(&["f", "d", "../outside", "a/b"]);
                std::os::unix::fs::symlink(target, &full).unwrap();
                made.push(format!("{path} -> {target}"));
            }
            _ => {
                std::fs::create_dir(&full).unwrap();
                made.push(format!("{path}/"));
                for child in children {
                    let grandchildren: &[&str] = if *child == "b" { &["c"] } else { &[] };
                    make(cases, root, &format!("{path}/{child}"), grandchildren, made);
                }
            }
        }
    }
    let mut made = Vec::new();
    make(cases, root, "a", &["b"], &mut made);
    make(cases, root, "d", &["e"], &mut made);
    make(cases, root, "f", &[], &mut made);
    made
}

/// A random patch entry: half the time an edit or a deletion of one of the baseline's files
/// (`made`, as [`random_tree`] lists them), which applies unless another entry is in its
/// way; else, at one of the tree's paths or a new one beneath them, a new file, a new
/// symlink, an edit or a deletion of a file holding [`CONTENTS`].
fn random_entry(cases: &mut Cases, made: &[String]) -> String {
    let files: Vec<&str> = made
        .iter()
        .filter_map(|what| what.strip_suffix(" file"))
        .collect();
    let fitting = !files.is_empty() && cases.below(2) == 0;
    let path = if fitting {
        cases.pick(&files)
    } else {
        cases.pick(&[
            "a", "a/b", "a/b/c", "a/new", "d", "d/e", "d/e/new", "f", "f/new",
        ])
    };
    let kind = if fitting {
        2 + cases.below(2)
    } else {
        cases.below(4)
    };
    match kind {
        0 => creation(path, "100644", "x"),
        1 => creation(path, "120000", "f"),
        2 => format!(
            "diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n\
+++ b/{path}\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n"
        ),
        _ => format!(
            "diff --git a/{path} b/{path}\ndeleted file mode 100644\nindex 1111111..0000000\n\
--- a/{path}\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-one\n-two\n"
        ),
    }
}

/// Random baselines of files, directories and symlinks in each other's way, and random
/// patches of one to three entries over them: every verdict, in its words, is the full
/// unpack's, through a `--check` and through a real apply alike.
#[test]
fn random_patches_over_random_trees_get_the_full_unpack_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases = Cases(0x5eed_d1ff_c0de_0001);
    let (mut applied, mut refused, mut judged_by_check) = (0, 0, 0);
    for case in 0..300 {
        let root = dir.path().join("tree");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir(&root).unwrap();
        let made = random_tree(&mut cases, &root);
        let baseline = tar_of(&root, &dir.path().join("random.tar"));
        let entries = 1 + cases.below(3);
        let patch: String = (0..entries)
            .map(|_| random_entry(&mut cases, &made))
            .collect();
        let shown = format!("case {case}: baseline {made:?}");
        let verdict =
            std::panic::catch_unwind(|| same_verdict(&baseline, patch.as_bytes(), dir.path()))
                .unwrap_or_else(|panic| {
                    eprintln!("{shown}");
                    std::panic::resume_unwind(panic)
                });
        match verdict {
            Ok(()) => applied += 1,
            Err(_) => refused += 1,
        }
        let files = patch::parse(patch.as_bytes(), patch.len()).unwrap();
        if DryRun::of(&files).is_ok_and(|dry| dry.suffices_in(&root).is_ok()) {
            judged_by_check += 1;
        }
    }
    // Both verdicts, and both ways of reaching them, were compared.
    assert!(
        applied >= 20 && refused >= 20,
        "{applied} applied, {refused} refused"
    );
    assert!(
        (20..=130).contains(&judged_by_check),
        "{judged_by_check} of 150 judged by --check"
    );
}

/// An edit beneath a chain of symlinks (`a` -> `d` -> `f`) whose middle link the patch names
/// too: the chain is followed to its end all the same, so that git says why it cannot read
/// the file as it would in a checkout (`f` is a file: "Not a directory").
#[test]
fn a_link_the_patch_names_is_still_followed_beneath_another() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f"), CONTENTS).unwrap();
    std::os::unix::fs::symlink("f", root.join("d")).unwrap();
    std::os::unix::fs::symlink("d", root.join("a")).unwrap();
    let baseline = tar_of(&root, &dir.path().join("chain.tar"));
    let edit = "diff --git a/a/b b/a/b\nindex 1111111..2222222 100644\n--- a/a/b\n\
+++ b/a/b\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n";
    let patch = creation("d", "100644", "x") + edit;
    let err = same_verdict(&baseline, patch.as_bytes(), dir.path()).unwrap_err();
    assert!(err.contains("a/b: Not a directory"), "{err}");
}
