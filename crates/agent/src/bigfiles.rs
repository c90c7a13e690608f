//! Large files in a diff: which changed files would take too much memory to diff line by line
//! and must be carried as binary, and the attributes file that tells git so.
//!
//! A line diff needs memory for both sides' bytes plus a record per line (git's xdiff): a
//! 10 MB file of five million one-byte lines takes 415 MB to diff against a copy of itself,
//! more than a small sandbox has, and the OOM-killed diff would lose the patch that saves the
//! agent's work. As binary, git deflates the blob whole, in memory proportional to its size.
//! So each change is estimated ([`line_diff_bytes`]) against a budget the host gives, a share
//! of the sandbox's memory; lines are counted only where the sizes alone cannot rule the
//! budget out ([`may_exceed`]). A 9 MB source file of 260k lines stays a readable text diff.
//! Git's own `core.bigFileThreshold` does not change how `git diff` treats text, so the files
//! over budget are listed, by exact path, in the private repository's `info/attributes` as
//! `binary` before each diff.
//!
//! A blob's line count never changes (its id is its content), so counts are remembered
//! ([`LineCounts`]): each diff counts only the blobs no earlier one did. Without that, every
//! diff of a task that touched a 9 MB file streamed both of its versions through a count
//! again (200 ms of a 330 ms diff).

use std::collections::HashMap;

/// Memory git's line diff takes per line of either side beyond the bytes themselves: xdiff's
/// record and hash entry (about 40 bytes with git 2.39 on x86-64: 415 MB for 2 × 5 million
/// lines of 10 MB each), rounded up.
pub const LINE_RECORD_BYTES: u64 = 64;

/// The budget of one file's line diff when the host names none: what the smallest sandbox
/// (64 MiB) can spare.
pub const DEFAULT_LINE_DIFF_BUDGET: u64 = 16 << 20;

/// One side of a change: its blob's size and, once counted, its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Side {
    pub bytes: u64,
    pub lines: Option<u64>,
}

/// What a line diff of `sides` takes at most: their bytes, and a record per line (every byte
/// a line where the lines were not counted).
pub fn line_diff_bytes(sides: &[Side]) -> u64 {
    sides.iter().fold(0_u64, |total, side| {
        let lines = side.lines.unwrap_or(side.bytes);
        total
            .saturating_add(side.bytes)
            .saturating_add(lines.saturating_mul(LINE_RECORD_BYTES))
    })
}

/// Whether a change with these sides might exceed `budget`, so that its lines are worth
/// counting (sides whose bytes alone exceed it go binary without a count).
pub fn may_exceed(sides: &[Side], budget: u64) -> bool {
    let bytes = sides.iter().fold(0_u64, |t, s| t.saturating_add(s.bytes));
    bytes <= budget && line_diff_bytes(sides) > budget
}

/// Whether no change between files of at most `old_largest` and `new_largest` bytes can take
/// more than `budget`, lines uncounted: then no file needs sizing or counting at all.
pub fn none_can_exceed(old_largest: u64, new_largest: u64, budget: u64) -> bool {
    let side = |bytes| Side { bytes, lines: None };
    line_diff_bytes(&[side(old_largest), side(new_largest)]) <= budget
}

/// Line counts by blob id, remembered across diffs. Bounded: when full it starts over (a
/// count is cheap to take again, and a task touching this many large files is rare).
#[derive(Debug, Default)]
pub struct LineCounts {
    counts: std::sync::Mutex<HashMap<String, u64>>,
}

impl LineCounts {
    /// Most blob ids remembered.
    pub const CAPACITY: usize = 16_384;

    /// The remembered counts among `ids`, and the ids still to count.
    pub fn split(&self, ids: &[String]) -> (HashMap<String, u64>, Vec<String>) {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mut known = HashMap::new();
        let mut unknown = Vec::new();
        for id in ids {
            match counts.get(id) {
                Some(&lines) => {
                    known.insert(id.clone(), lines);
                }
                None => unknown.push(id.clone()),
            }
        }
        (known, unknown)
    }

    /// Remembers `counted`.
    pub fn remember(&self, counted: &HashMap<String, u64>) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.len() + counted.len() > Self::CAPACITY {
            counts.clear();
        }
        counts.extend(counted.iter().map(|(id, &lines)| (id.clone(), lines)));
    }
}

/// Counts the lines of each blob in `git cat-file --batch` output as it streams by, without
/// keeping any blob: `<id> blob <size>\n<size bytes>\n` per object, `<id> missing\n` for
/// none. Output that breaks the format ends the counting (it comes from the guest's git:
/// data, not trusted; an uncounted blob counts as every byte a line).
#[derive(Debug, Default)]
pub struct BatchLineCounter {
    header: Vec<u8>,
    /// The object being read: its id, bytes left, lines so far.
    body: Option<(String, u64, u64)>,
    /// The newline after an object's bytes is due.
    trailer: bool,
    broken: bool,
    counts: HashMap<String, u64>,
}

impl BatchLineCounter {
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() && !self.broken {
            if self.trailer {
                self.trailer = false;
                if data[0] != b'\n' {
                    self.broken = true;
                    return;
                }
                data = &data[1..];
                continue;
            }
            if let Some((id, left, lines)) = &mut self.body {
                let take = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                let count = data[..take].iter().filter(|&&b| b == b'\n').count();
                *lines += u64::try_from(count).unwrap_or(u64::MAX);
                *left -= u64::try_from(take).unwrap_or(u64::MAX);
                data = &data[take..];
                if *left == 0 {
                    self.counts.insert(std::mem::take(id), *lines);
                    self.body = None;
                    self.trailer = true;
                }
                continue;
            }
            let Some(end) = data.iter().position(|&b| b == b'\n') else {
                self.header.extend_from_slice(data);
                // A header is an id and a size; anything longer is not one.
                self.broken = self.header.len() > 256;
                return;
            };
            self.header.extend_from_slice(&data[..end]);
            data = &data[end + 1..];
            let header = std::mem::take(&mut self.header);
            self.start_object(&header);
        }
    }

    fn start_object(&mut self, header: &[u8]) {
        let text = String::from_utf8_lossy(header);
        let fields: Vec<&str> = text.split(' ').collect();
        match fields[..] {
            [_, "missing"] => {}
            [id, "blob", size] if crate::git::is_object_id(id) => match size.parse::<u64>() {
                Ok(0) => {
                    self.counts.insert(id.to_owned(), 0);
                    self.trailer = true;
                }
                Ok(size) => self.body = Some((id.to_owned(), size, 0)),
                Err(_) => self.broken = true,
            },
            _ => self.broken = true,
        }
    }

    /// The lines of every blob read whole.
    pub fn counts(self) -> HashMap<String, u64> {
        self.counts
    }
}

/// One entry of `git diff --raw -z --no-abbrev --no-renames`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The baseline's blob, if the path held a regular file there.
    pub old_blob: Option<String>,
    /// The work tree's blob, if the path holds a regular file now.
    pub new_blob: Option<String>,
    pub path: Vec<u8>,
}

/// Parses `:<old mode> <new mode> <old id> <new id> <status>\0<path>\0` records. Only regular
/// files (modes 100644 and 100755) have blobs worth sizing: symlinks are short and gitlinks
/// are commits. Malformed input ends the list (it comes from the guest's git: data, not
/// trusted): the records before it, and whether the input ended right after the last record
/// (`false`: a path may be missing, which sizing can live with, as a text diff at worst, and
/// a split diff cannot).
pub fn parse_raw(raw: &[u8]) -> (Vec<Change>, bool) {
    let mut changes = Vec::new();
    let mut fields = raw.split(|&b| b == 0);
    loop {
        let (meta, path) = match (fields.next(), fields.next()) {
            (Some(meta), Some(path)) => (meta, path),
            // The empty field after the last NUL, or empty input.
            (Some(b""), None) => return (changes, true),
            _ => return (changes, false),
        };
        let Some(change) = parse_record(meta, path) else {
            return (changes, false);
        };
        changes.push(change);
    }
}

fn parse_record(meta: &[u8], path: &[u8]) -> Option<Change> {
    let meta = std::str::from_utf8(meta.strip_prefix(b":")?).ok()?;
    let parts: Vec<&str> = meta.split(' ').collect();
    let [old_mode, new_mode, old_id, new_id, _status] = parts[..] else {
        return None;
    };
    if path.is_empty() {
        return None;
    }
    let blob = |mode: &str, id: &str| {
        (matches!(mode, "100644" | "100755") && crate::git::is_object_id(id)).then(|| id.to_owned())
    };
    Some(Change {
        old_blob: blob(old_mode, old_id),
        new_blob: blob(new_mode, new_id),
        path: path.to_vec(),
    })
}

/// The `info/attributes` content marking `paths` as binary, each matched exactly: anchored at
/// the root, glob characters escaped, and the whole pattern C-quoted so that spaces, quotes,
/// newlines and any other byte survive git's line-based parser.
pub fn attributes<'a>(paths: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for path in paths {
        out.extend_from_slice(b"\"/");
        for &byte in path {
            match byte {
                // Escaped for the pattern matcher, then that backslash (and a backslash
                // itself) escaped for C quoting.
                b'*' | b'?' | b'[' => {
                    out.extend_from_slice(b"\\\\");
                    out.push(byte);
                }
                b'\\' => out.extend_from_slice(b"\\\\\\\\"),
                b'"' => out.extend_from_slice(b"\\\""),
                0x20..=0x7e => out.push(byte),
                other => out.extend_from_slice(format!("\\{other:03o}").as_bytes()),
            }
        }
        out.extend_from_slice(b"\" binary\n");
    }
    out
}

/// Parses `git cat-file --batch-check='%(objectname) %(objectsize)'` output.
pub fn parse_sizes(out: &[u8]) -> std::collections::HashMap<String, u64> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|line| {
            let (id, size) = line.split_once(' ')?;
            Some((id.to_owned(), size.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_rule_out_a_large_line_diff_only_when_every_byte_may_be_a_line() {
        let budget = 65 * 1000;
        assert!(none_can_exceed(600, 400, budget));
        assert!(!none_can_exceed(600, 401, budget));
        assert!(!none_can_exceed(u64::MAX, 0, budget));
        assert!(none_can_exceed(0, 0, 0));
    }

    #[test]
    fn raw_records_give_regular_file_blobs_only() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let zero = "0".repeat(40);
        let raw = format!(
            ":100644 100644 {a} {b} M\0src/x.rs\0:000000 100755 {zero} {b} A\0run.sh\0:120000 120000 {a} {b} M\0link\0:160000 160000 {a} {b} M\0sub\0"
        );
        let (changes, complete) = parse_raw(raw.as_bytes());
        assert_eq!(changes.len(), 4);
        assert!(complete);
        assert_eq!(changes[0].old_blob.as_deref(), Some(a.as_str()));
        assert_eq!(changes[1].old_blob, None, "an all-zero id is not a blob");
        assert_eq!(changes[1].new_blob.as_deref(), Some(b.as_str()));
        assert_eq!(
            (changes[2].old_blob.as_ref(), changes[2].new_blob.as_ref()),
            (None, None)
        );
        assert_eq!(
            (changes[3].old_blob.as_ref(), changes[3].new_blob.as_ref()),
            (None, None)
        );
        assert_eq!(parse_raw(b"garbage\0x\0"), (Vec::new(), false));
        assert_eq!(parse_raw(b""), (Vec::new(), true));
        // Cut short, or followed by anything but a record: not the whole list.
        let cut = parse_raw(&raw.as_bytes()[..raw.len() - 1]);
        assert_eq!(
            (cut.0.len(), cut.1),
            (4, false),
            "the last path may be cut short"
        );
        let followed = parse_raw(format!("{raw}garbage\0x\0").as_bytes());
        assert_eq!((followed.0.len(), followed.1), (4, false));
        let pathless = parse_raw(format!(":100644 100644 {a} {b} M\0").as_bytes());
        assert_eq!(pathless, (Vec::new(), false));
    }

    #[test]
    fn patterns_match_exactly_the_named_path() {
        let text = attributes([&b"dir/we*ird [x] \"q\"\\.txt"[..], &b"new\nline\xff"[..]]);
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "\"/dir/we\\\\*ird \\\\[x] \\\"q\\\"\\\\\\\\.txt\" binary\n\"/new\\012line\\377\" binary\n"
        );
    }

    #[test]
    fn the_estimate_counts_bytes_and_a_record_per_line() {
        let counted = Side {
            bytes: 1000,
            lines: Some(10),
        };
        assert_eq!(line_diff_bytes(&[counted]), 1000 + 10 * LINE_RECORD_BYTES);
        let uncounted = Side {
            bytes: 1000,
            lines: None,
        };
        assert_eq!(
            line_diff_bytes(&[counted, uncounted]),
            2000 + 1010 * LINE_RECORD_BYTES
        );
        // Small enough whatever the lines: not worth counting.
        let small = Side {
            bytes: 100,
            lines: None,
        };
        assert!(!may_exceed(&[small, small], 200 * (1 + LINE_RECORD_BYTES)));
        assert!(may_exceed(
            &[small, small],
            200 * (1 + LINE_RECORD_BYTES) - 1
        ));
        // Over the budget by its bytes alone: binary without a count.
        assert!(!may_exceed(&[small, small], 199));
    }

    #[test]
    fn batch_output_is_counted_across_any_split() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let c = "c".repeat(40);
        let stream =
            format!("{a} blob 6\nx\ny\nz\n\n{c} missing\n{b} blob 0\n\n{c} blob 5\nno nl\n");
        for chunk in 1..stream.len() {
            let mut counter = BatchLineCounter::default();
            for piece in stream.as_bytes().chunks(chunk) {
                counter.feed(piece);
            }
            let counts = counter.counts();
            assert_eq!(counts.get(&a), Some(&3), "chunk {chunk}");
            assert_eq!(counts.get(&b), Some(&0), "chunk {chunk}");
            assert_eq!(
                counts.get(&c),
                Some(&0),
                "chunk {chunk}: 'no nl' has no newline"
            );
            assert_eq!(counts.len(), 3);
        }
    }

    #[test]
    fn remembered_counts_are_not_counted_again_and_the_memo_stays_bounded() {
        let memo = LineCounts::default();
        let ids = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let (known, unknown) = memo.split(&ids(&["a", "b"]));
        assert!(known.is_empty());
        assert_eq!(unknown, ids(&["a", "b"]));
        memo.remember(&HashMap::from([("a".to_string(), 7)]));
        let (known, unknown) = memo.split(&ids(&["a", "b"]));
        assert_eq!(known, HashMap::from([("a".to_string(), 7)]));
        assert_eq!(unknown, ids(&["b"]));
        // Full: it starts over rather than growing.
        let many: HashMap<String, u64> = (0..LineCounts::CAPACITY as u64)
            .map(|i| (format!("id{i}"), i))
            .collect();
        memo.remember(&many);
        let (_, unknown) = memo.split(&ids(&["a"]));
        assert_eq!(unknown, ids(&["a"]));
        let (known, _) = memo.split(&ids(&["id5"]));
        assert_eq!(known.get("id5"), Some(&5));
    }

    #[test]
    fn broken_batch_output_stops_the_count() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let mut counter = BatchLineCounter::default();
        // The byte after a's body must be a newline; after that nothing is trusted.
        counter.feed(format!("{a} blob 2\n\n\nX{b} blob 1\n\n\n").as_bytes());
        let counts = counter.counts();
        assert_eq!(counts.get(&a), Some(&2));
        assert_eq!(counts.get(&b), None);
        let mut counter = BatchLineCounter::default();
        counter.feed(b"not a header\n");
        counter.feed(format!("{a} blob 1\n\n\n").as_bytes());
        assert!(counter.counts().is_empty());
        let mut counter = BatchLineCounter::default();
        counter.feed(&[b'x'; 300]);
        counter.feed(format!("\n{a} blob 1\n\n\n").as_bytes());
        assert!(counter.counts().is_empty());
    }

    #[test]
    fn sizes_parse_and_skip_missing_objects() {
        let sizes = parse_sizes(b"abc 12\ndef missing\n");
        assert_eq!(sizes.get("abc"), Some(&12));
        assert_eq!(sizes.len(), 1);
    }
}
