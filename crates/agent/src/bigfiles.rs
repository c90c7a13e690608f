//! Large files in a diff: which changed files are big enough that the diff must carry them as
//! binary, and the attributes file that tells git so.
//!
//! A line diff needs memory in proportion to the number of lines (git's xdiff keeps a record
//! per line): a 78 MB file of ten million short lines takes 1.4 GB, more than a sandbox's
//! memory limit, and the OOM-killed diff would lose the patch that saves the agent's work.
//! As binary, git deflates the blob whole, in memory proportional to its size. Git's own
//! `core.bigFileThreshold` does not change how `git diff` treats text, so the files over
//! [`BIG_FILE_BYTES`] are listed, by exact path, in the private repository's
//! `info/attributes` as `binary` before each diff.

/// Files larger than this (either side of the change) are diffed as binary.
pub const BIG_FILE_BYTES: u64 = 8 * 1024 * 1024;

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
/// trusted, and the worst outcome of a short list is a text diff).
pub fn parse_raw(raw: &[u8]) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut fields = raw.split(|&b| b == 0);
    while let (Some(meta), Some(path)) = (fields.next(), fields.next()) {
        let Some(meta) = meta.strip_prefix(b":") else {
            break;
        };
        let Ok(meta) = std::str::from_utf8(meta) else {
            break;
        };
        let parts: Vec<&str> = meta.split(' ').collect();
        let [old_mode, new_mode, old_id, new_id, _status] = parts[..] else {
            break;
        };
        let blob = |mode: &str, id: &str| {
            (matches!(mode, "100644" | "100755") && crate::git::is_object_id(id))
                .then(|| id.to_owned())
        };
        changes.push(Change {
            old_blob: blob(old_mode, old_id),
            new_blob: blob(new_mode, new_id),
            path: path.to_vec(),
        });
    }
    changes
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
    fn raw_records_give_regular_file_blobs_only() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let zero = "0".repeat(40);
        let raw = format!(
            ":100644 100644 {a} {b} M\0src/x.rs\0:000000 100755 {zero} {b} A\0run.sh\0:120000 120000 {a} {b} M\0link\0:160000 160000 {a} {b} M\0sub\0"
        );
        let changes = parse_raw(raw.as_bytes());
        assert_eq!(changes.len(), 4);
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
        assert!(parse_raw(b"garbage\0x\0").is_empty());
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
    fn sizes_parse_and_skip_missing_objects() {
        let sizes = parse_sizes(b"abc 12\ndef missing\n");
        assert_eq!(sizes.get("abc"), Some(&12));
        assert_eq!(sizes.len(), 1);
    }
}
