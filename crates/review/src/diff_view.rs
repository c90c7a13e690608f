//! What a diff shows a model: every changed file with its stats, always, and the patch text
//! bounded. A 4.7 MB patch sent whole is a 9.5 MB answer that no model can use; the header
//! (every file, every sensitive path) is small and complete, and the text holds the whole file
//! entries that fit in the bound, naming the files left out, or narrowed to the files asked
//! for.
//! The text puts first what a reviewer came for: changes to files the project has, then new
//! text files, then binary entries (generated files are taken out before, by
//! [`crate::generated`], and summarised as groups).

use serde::{Deserialize, Serialize};

use crate::patch::{self, FilePatch};

/// Patch text shown by default before the cut (64 KiB).
pub const DEFAULT_SHOWN_BYTES: usize = 64 * 1024;

/// One changed file of the header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    pub path: String,
    /// added, deleted, modified, renamed or copied.
    pub status: &'static str,
    pub additions: u64,
    pub deletions: u64,
    pub binary: bool,
}

/// The header's file list and the patch text to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub changes: Vec<Change>,
    pub patch: String,
    /// Files whose text was left out (past the bound, or not among `paths`).
    pub omitted: Vec<String>,
}

/// Which part of the patch to show.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only these files (by path).
    pub paths: Option<Vec<String>>,
    /// The header only, no patch text.
    pub stat: bool,
}

/// Cuts `patch` for showing: every wanted entry in patch order when they all fit in
/// `max_bytes`; when not, the entries that fit whole, in [`rank`] order (patch order within a
/// rank), an entry too large for the room left being skipped so that the smaller ones after
/// it still show (a regenerated lock file must not hide the edits beside it). When no text
/// entry fits whole, the head of the first one is shown up to the bound (at a line end) with a
/// marker, and it is listed as omitted too. A patch the parser refuses is shown cut at the
/// bound, with no file list.
pub fn view(patch_text: &str, max_bytes: usize, selection: &Selection) -> View {
    let Ok(files) = patch::parse(patch_text.as_bytes(), patch_text.len().max(1)) else {
        let mut end = patch_text.len().min(max_bytes);
        while !patch_text.is_char_boundary(end) {
            end -= 1;
        }
        return View {
            changes: Vec::new(),
            patch: if selection.stat {
                String::new()
            } else {
                patch_text[..end].to_owned()
            },
            omitted: Vec::new(),
        };
    };
    let sections = sections(patch_text, &files);
    let changes = files.iter().map(change).collect();
    let wanted = |file: &FilePatch<'_>| {
        !selection.stat
            && selection
                .paths
                .as_ref()
                .is_none_or(|paths| paths.iter().any(|p| p == file.path()))
    };
    let mut ordered: Vec<(&FilePatch<'_>, &str)> = files.iter().zip(sections).collect();
    let whole: usize = ordered
        .iter()
        .filter(|(file, _)| wanted(file))
        .map(|(_, text)| text.len())
        .sum();
    // Shown whole, the text is the patch as git wrote it; bounded, what matters comes first.
    if whole > max_bytes {
        ordered.sort_by_key(|(file, _)| rank(file));
    }
    // Which entries are shown whole, and which one (if any) by its head.
    let mut whole_entry = vec![false; ordered.len()];
    let mut used = 0;
    let is_text = |file: &FilePatch<'_>| rank(file) < 2;
    let first_skipped = |whole_entry: &[bool], text_only: bool| {
        ordered
            .iter()
            .zip(whole_entry)
            .position(|((file, _), whole)| wanted(file) && !whole && (!text_only || is_text(file)))
    };
    let mut head_of = None;
    for text_entries in [true, false] {
        for (at, (file, text)) in ordered.iter().enumerate() {
            if wanted(file) && is_text(file) == text_entries && used + text.len() <= max_bytes {
                whole_entry[at] = true;
                used += text.len();
            }
        }
        if used == 0 {
            // Nothing of this kind fits whole: the first entry's head (text before binary)
            // is shown, which takes the room.
            head_of = first_skipped(&whole_entry, text_entries);
            if head_of.is_some() {
                break;
            }
        }
    }
    let mut shown = String::new();
    let mut omitted = Vec::new();
    for (at, ((file, text), whole)) in ordered.iter().zip(&whole_entry).enumerate() {
        if *whole {
            shown.push_str(text);
        } else if head_of == Some(at) {
            let head = head_at_line_end(text, max_bytes);
            shown.push_str(head);
            shown.push_str(&format!(
                "[… the rest of this file's entry ({} bytes) is omitted: ask for it alone with paths …]\n",
                text.len() - head.len()
            ));
            omitted.push(file.path().to_owned());
        } else {
            omitted.push(file.path().to_owned());
        }
    }
    View {
        changes,
        patch: shown,
        omitted,
    }
}

/// Where an entry goes in a bounded view: changes to files the baseline has (0), new text
/// files (1), binary entries (2).
pub fn rank(file: &FilePatch<'_>) -> u8 {
    match (file.is_binary, file.is_new) {
        (true, _) => 2,
        (false, true) => 1,
        (false, false) => 0,
    }
}

/// The longest prefix of `text` ending at a line end and at most `max` bytes long.
fn head_at_line_end(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match text[..end].rfind('\n') {
        Some(newline) => &text[..=newline],
        None => "",
    }
}

/// The text of each file entry: from its `diff --git` line to the next one's.
fn sections<'a>(text: &'a str, files: &[FilePatch<'_>]) -> Vec<&'a str> {
    let mut starts: Vec<usize> = Vec::with_capacity(files.len());
    let mut wanted = files.iter().map(|f| f.line).peekable();
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        if wanted.peek() == Some(&(index + 1)) {
            starts.push(offset);
            wanted.next();
        }
        offset += line.len();
    }
    let mut ends: Vec<usize> = starts.iter().skip(1).copied().collect();
    ends.push(text.len());
    starts
        .iter()
        .zip(ends)
        .map(|(&start, end)| &text[start..end])
        .collect()
}

fn change(file: &FilePatch<'_>) -> Change {
    Change {
        path: file.path().to_owned(),
        status: if file.is_new {
            "added"
        } else if file.is_deleted {
            "deleted"
        } else if file.is_rename {
            "renamed"
        } else if file.is_copy {
            "copied"
        } else {
            "modified"
        },
        additions: file.additions(),
        deletions: file.deletions(),
        binary: file.is_binary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, lines: usize) -> String {
        let body: String = (0..lines).map(|i| format!("+line {i}\n")).collect();
        format!(
            "diff --git a/{name} b/{name}\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/{name}\n@@ -0,0 +1,{lines} @@\n{body}"
        )
    }

    #[test]
    fn the_header_is_whole_and_an_entry_too_large_for_the_room_is_skipped() {
        let patch = [entry("a.txt", 10), entry("b.txt", 1000), entry("c.txt", 10)].concat();
        let shown = view(&patch, 2000, &Selection::default());
        assert_eq!(shown.changes.len(), 3);
        assert_eq!(shown.changes[1].additions, 1000);
        assert_eq!(shown.changes[0].status, "added");
        // Whole entries only, at file boundaries; the one that does not fit is left out and
        // the smaller one after it still shows.
        assert_eq!(
            shown.patch,
            [entry("a.txt", 10), entry("c.txt", 10)].concat()
        );
        assert_eq!(shown.omitted, ["b.txt"]);
        let all = view(&patch, usize::MAX, &Selection::default());
        assert_eq!((all.patch.as_str(), all.omitted.len()), (patch.as_str(), 0));
    }

    /// A regenerated lock file (tracked, text, larger than the bound) sorts before the source
    /// edit: the edit shows, the lock file is named in `omitted`.
    #[test]
    fn a_large_tracked_change_does_not_hide_the_edits_after_it() {
        let lock = modified_lines("package-lock.json", 3000);
        let patch = [lock, modified("src/index.js"), entry("src/new.js", 2)].concat();
        let shown = view(&patch, 2000, &Selection::default());
        assert_eq!(
            shown.patch,
            [modified("src/index.js"), entry("src/new.js", 2)].concat()
        );
        assert_eq!(shown.omitted, ["package-lock.json"]);
    }

    /// When no text entry fits whole, the first one's head is shown rather than binary
    /// entries that would fit.
    #[test]
    fn a_text_head_goes_before_binary_entries() {
        let patch = [binary("a.bin", 300), entry("big.txt", 5000)].concat();
        let shown = view(&patch, 1000, &Selection::default());
        assert!(
            shown.patch.starts_with("diff --git a/big.txt"),
            "{}",
            shown.patch
        );
        assert!(!shown.patch.contains("GIT binary patch"), "{}", shown.patch);
        assert_eq!(shown.omitted, ["big.txt", "a.bin"]);
        // Binary entries alone: those that fit are shown whole.
        let binaries = [
            binary("a.bin", 300),
            binary("b.bin", 5000),
            binary("c.bin", 300),
        ]
        .concat();
        let shown = view(&binaries, 1000, &Selection::default());
        assert_eq!(
            shown.patch,
            [binary("a.bin", 300), binary("c.bin", 300)].concat()
        );
        assert_eq!(shown.omitted, ["b.bin"]);
    }

    #[test]
    fn paths_and_stat_narrow_the_text() {
        let patch = [entry("a.txt", 3), entry("b.txt", 3)].concat();
        let only_b = Selection {
            paths: Some(vec!["b.txt".to_owned()]),
            stat: false,
        };
        let shown = view(&patch, DEFAULT_SHOWN_BYTES, &only_b);
        assert_eq!(
            (shown.patch, shown.omitted),
            (entry("b.txt", 3), vec!["a.txt".to_owned()])
        );
        let stat = view(
            &patch,
            DEFAULT_SHOWN_BYTES,
            &Selection {
                paths: None,
                stat: true,
            },
        );
        assert!(stat.patch.is_empty() && stat.changes.len() == 2);
    }

    fn modified(name: &str) -> String {
        format!(
            "diff --git a/{name} b/{name}\nindex 1111111..2222222 100644\n--- a/{name}\n+++ b/{name}\n@@ -1 +1 @@\n-x\n+y\n"
        )
    }

    fn modified_lines(name: &str, lines: usize) -> String {
        let old: String = (0..lines).map(|i| format!("-old {i}\n")).collect();
        let new: String = (0..lines).map(|i| format!("+new {i}\n")).collect();
        format!(
            "diff --git a/{name} b/{name}\nindex 1111111..2222222 100644\n--- a/{name}\n+++ b/{name}\n@@ -1,{lines} +1,{lines} @@\n{old}{new}"
        )
    }

    fn binary(name: &str, bytes: usize) -> String {
        // Shape-checked, not decoded: `z` says 52 bytes, in 65 base85 characters.
        let data: String = (0..bytes / 66)
            .map(|_| format!("z{}\n", "0".repeat(65)))
            .collect();
        format!(
            "diff --git a/{name} b/{name}\nnew file mode 100644\nindex 0000000000000000000000000000000000000000..3333333333333333333333333333333333333333\nGIT binary patch\nliteral 3\n{data}\nliteral 0\nHcmV?d00001\n\n"
        )
    }

    #[test]
    fn tracked_changes_come_first_then_new_text_then_binary() {
        // In patch (path) order the binary entry comes first and alone fills the bound.
        let patch = [
            binary("a/__x.bin", 4000),
            entry("b/new.py", 3),
            modified("c/cli.py"),
            modified("d/test_cli.py"),
        ]
        .concat();
        let shown = view(&patch, 1000, &Selection::default());
        assert_eq!(
            shown.patch,
            [
                modified("c/cli.py"),
                modified("d/test_cli.py"),
                entry("b/new.py", 3)
            ]
            .concat()
        );
        assert_eq!(shown.omitted, ["a/__x.bin"]);
        // The header keeps patch order.
        let paths: Vec<&str> = shown.changes.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(
            paths,
            ["a/__x.bin", "b/new.py", "c/cli.py", "d/test_cli.py"]
        );
        // A bound that only the tracked changes fit in leaves the new file out, whole.
        let tracked = [modified("c/cli.py"), modified("d/test_cli.py")].concat();
        let small = view(&patch, tracked.len() + 10, &Selection::default());
        assert_eq!(small.patch, tracked);
        assert_eq!(small.omitted, ["b/new.py", "a/__x.bin"]);
    }

    #[test]
    fn one_huge_file_shows_its_head_and_says_so() {
        let patch = entry("big.txt", 5000);
        let shown = view(&patch, 300, &Selection::default());
        assert!(shown.patch.len() < 400, "{}", shown.patch.len());
        assert!(patch.starts_with(shown.patch.lines().next().unwrap()));
        assert!(shown.patch.ends_with("ask for it alone with paths …]\n"));
        assert_eq!(shown.omitted, ["big.txt"]);
    }
}
