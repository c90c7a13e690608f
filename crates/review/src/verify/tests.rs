//! Extraction takes from the baseline tar exactly the entries a patch's `git apply` can see,
//! through the index and by a pass over the tar alike, as a full unpack would write them, and
//! stops at its budget. (That the verdict on them is a full unpack's is the engine's test,
//! which runs git.)

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::touched::{self, Failure, Source, Touched};
use crate::fixtures::fixture;
use crate::patch;
use crate::tar_index::{self, TarIndex};

/// Every path under `dir`, relative, directories included.
fn listing(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(root.join(rel)).unwrap() {
            let entry = entry.unwrap();
            let rel = rel.join(entry.file_name());
            out.insert(rel.to_string_lossy().into_owned());
            if entry.file_type().unwrap().is_dir() {
                walk(root, &rel, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, Path::new(""), &mut out);
    out
}

/// [`fixture`] with the baseline's offset index written and loaded.
fn indexed_fixture(dir: &Path) -> (PathBuf, Vec<u8>, TarIndex) {
    let (baseline, patch) = fixture(dir);
    tar_index::write_for(&baseline).unwrap();
    let index = TarIndex::load(&baseline).unwrap();
    (baseline, patch, index)
}

#[test]
fn the_fixture_patch_has_every_kind_of_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (_, patch) = fixture(dir.path());
    let text = String::from_utf8_lossy(&patch);
    for marker in [
        "rename from src/lib.rs",
        "copy to a-copy.txt",
        "deleted file mode",
        "new mode 100755",
        "diff --git a/link b/link",
        "GIT binary patch",
        "\"a/dir with space/f \\\"q\\\".txt\"",
        "\\303\\274/na\\303\\257ve.txt",
        "new file mode",
    ] {
        assert!(text.contains(marker), "no {marker:?} in\n{text}");
    }
}

#[test]
fn only_the_touched_entries_are_extracted() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, patch, index) = indexed_fixture(dir.path());
    let files = patch::parse(&patch, patch.len()).unwrap();
    for (how, source) in [("scan", Source::Scan), ("index", Source::Indexed(&index))] {
        let scratch = dir.path().join(format!("scratch-{how}"));
        std::fs::create_dir_all(&scratch).unwrap();
        touched::extract(
            &baseline,
            &source,
            &Touched::of(&files),
            &scratch,
            touched::Budget(None),
        )
        .unwrap();
        let expected: BTreeSet<String> = [
            "a.txt",
            "gone.txt",
            "script.sh",
            "link",
            "bin.bin",
            "big.txt",
            "src",
            "src/lib.rs",
            "dir with space",
            "dir with space/f \"q\".txt",
            "\u{fc}",
            "\u{fc}/na\u{ef}ve.txt",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        assert_eq!(listing(&scratch), expected, "{how}");
        // Modes and link targets as a full unpack gives them.
        assert_eq!(
            std::fs::read_link(scratch.join("link")).unwrap(),
            Path::new("target.txt")
        );
        let mode = std::fs::metadata(scratch.join("script.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644, "{how}");
    }
}

#[test]
fn an_extraction_stops_at_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, patch, index) = indexed_fixture(dir.path());
    let files = patch::parse(&patch, patch.len()).unwrap();
    for (how, source) in [("scan", Source::Scan), ("index", Source::Indexed(&index))] {
        let extract = |budget| {
            let scratch = dir.path().join(format!("budget-{how}"));
            let _ = std::fs::remove_dir_all(&scratch);
            std::fs::create_dir_all(&scratch).unwrap();
            touched::extract(&baseline, &source, &Touched::of(&files), &scratch, budget)
        };
        assert!(
            matches!(extract(touched::Budget(Some(3))), Err(Failure::OverBudget)),
            "{how}"
        );
        // The fixture's touched files take a few hundred bytes: a budget of a MiB holds them.
        assert!(extract(touched::Budget(Some(1 << 20))).is_ok(), "{how}");
    }
}
