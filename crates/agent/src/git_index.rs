//! The paths a git index file lists (format versions 2, 3 and 4), read by the agent itself:
//! a diff from the journal needs to know which changed paths are tracked, and asking git
//! (`git check-ignore`, `git ls-files` with pathspecs) costs a pass over the whole index per
//! path.
//!
//! The file is the private index, written by git runs of the sandbox user; it is read as
//! untrusted bytes: every length is checked, and anything unexpected is an error, after which
//! the diff scans the whole workspace instead.

use std::collections::BTreeSet;

/// Bytes of an entry before its object id: ctime, mtime, dev, ino, mode, uid, gid, size.
const STAT_BYTES: usize = 40;
/// Where an entry's size is: after ctime, mtime, dev, ino, mode, uid and gid.
const SIZE_AT: usize = 36;
/// The flags' bits holding the name's length (0xFFF: 0xFFF or more).
const NAME_MASK: u16 = 0x0FFF;
/// The flag of an entry with a second flags word (version 3 and later).
const EXTENDED: u16 = 0x4000;

/// What a diff needs to know of an index: which of some paths it tracks, and the size of its
/// largest file.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Survey {
    pub tracked: BTreeSet<Vec<u8>>,
    /// The largest size an entry records. Git keeps the low 32 bits of a size; a file of
    /// 4 GiB or more shows as less, and no diff in a sandbox's memory can hold it anyway.
    pub largest: u64,
}

/// Bytes that are not an index git wrote, and the first flaw found in them.
#[derive(Debug, PartialEq, Eq)]
pub struct NotAnIndex(pub Flaw);

/// What is wrong with bytes read as an index.
#[derive(Debug, PartialEq, Eq)]
pub enum Flaw {
    TooShort,
    NoSignature,
    Version(u32),
    TooManyEntries,
    MoreEntriesThanBytes,
    OutOfOrder,
    EntryCut,
    ExtendedInVersion2,
    BadPrefixLength,
    PrefixTooLong,
    UnterminatedName,
    NameCut,
}

// Written out rather than derived with thiserror: the fuzz target compiles this file on its
// own, with no dependency.
impl std::fmt::Display for NotAnIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the private index is not one git wrote: {}", self.0)
    }
}

impl std::error::Error for NotAnIndex {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl std::fmt::Display for Flaw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            Flaw::TooShort => "it is too short",
            Flaw::NoSignature => "no DIRC signature",
            Flaw::Version(version) => return write!(f, "version {version}"),
            Flaw::TooManyEntries => "too many entries",
            Flaw::MoreEntriesThanBytes => "more entries than the file can hold",
            Flaw::OutOfOrder => "its entries are out of order",
            Flaw::EntryCut => "an entry is cut short",
            Flaw::ExtendedInVersion2 => "an extended entry in a version 2 index",
            Flaw::BadPrefixLength => "a bad prefix length",
            Flaw::PrefixTooLong => "a prefix longer than the previous name",
            Flaw::UnterminatedName => "an unterminated name",
            Flaw::NameCut => "a name is cut short",
        };
        f.write_str(what)
    }
}

impl std::error::Error for Flaw {}

/// Every path an index whose object ids are `oid_len` bytes long lists, and its largest entry.
pub fn every_path(index: &[u8], oid_len: usize) -> Result<Survey, NotAnIndex> {
    let mut survey = Survey::default();
    for_each_entry(index, oid_len, |path, size| {
        survey.largest = survey.largest.max(u64::from(size));
        // In order: each insert lands at the end of the tree.
        if survey.tracked.last().map(Vec::as_slice) != Some(path) {
            survey.tracked.insert(path.to_vec());
        }
    })?;
    Ok(survey)
}

/// Calls `visit` with each entry's path and recorded size, in the index's order.
fn for_each_entry(
    index: &[u8],
    oid_len: usize,
    mut visit: impl FnMut(&[u8], u32),
) -> Result<(), NotAnIndex> {
    let fail = NotAnIndex;
    let header = index.get(..12).ok_or_else(|| fail(Flaw::TooShort))?;
    if &header[..4] != b"DIRC" {
        return Err(fail(Flaw::NoSignature));
    }
    let version = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if !(2..=4).contains(&version) {
        return Err(fail(Flaw::Version(version)));
    }
    let count = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
    let count = usize::try_from(count).map_err(|_| fail(Flaw::TooManyEntries))?;
    // Each entry takes at least STAT_BYTES + oid + flags: a count the file cannot hold is
    // refused before anything is done with it.
    if count > index.len() / (STAT_BYTES + oid_len + 2) {
        return Err(fail(Flaw::MoreEntriesThanBytes));
    }
    let mut at = 12;
    // Version 4 names are built on the previous one.
    let mut name: Vec<u8> = Vec::new();
    // The previous entry's name, to check the order (the same name twice is a conflict's
    // stages, which a diff's index never has, but they are in order too).
    let mut previous: Vec<u8> = Vec::new();
    let mut in_order = |path: &[u8]| -> Result<(), NotAnIndex> {
        if path < previous.as_slice() {
            return Err(fail(Flaw::OutOfOrder));
        }
        previous.clear();
        previous.extend_from_slice(path);
        Ok(())
    };
    for _ in 0..count {
        let start = at;
        let flags_at = start + STAT_BYTES + oid_len;
        let flags = index
            .get(flags_at..flags_at + 2)
            .ok_or_else(|| fail(Flaw::EntryCut))?;
        let flags = u16::from_be_bytes([flags[0], flags[1]]);
        let size = &index[start + SIZE_AT..start + SIZE_AT + 4];
        let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]);
        let mut name_at = flags_at + 2;
        if flags & EXTENDED != 0 {
            if version < 3 {
                return Err(fail(Flaw::ExtendedInVersion2));
            }
            name_at += 2;
        }
        if version == 4 {
            // The previous name less `strip` bytes, then a NUL-terminated suffix.
            let (strip, used) = varint(index.get(name_at..).unwrap_or_default())
                .ok_or_else(|| fail(Flaw::BadPrefixLength))?;
            let keep = name
                .len()
                .checked_sub(strip)
                .ok_or_else(|| fail(Flaw::PrefixTooLong))?;
            let suffix_at = name_at + used;
            let suffix_len =
                nul_at(index, suffix_at).ok_or_else(|| fail(Flaw::UnterminatedName))?;
            name.truncate(keep);
            name.extend_from_slice(&index[suffix_at..suffix_at + suffix_len]);
            at = suffix_at + suffix_len + 1;
            in_order(&name)?;
            visit(&name, size);
        } else {
            let len = match flags & NAME_MASK {
                NAME_MASK => nul_at(index, name_at).ok_or_else(|| fail(Flaw::UnterminatedName))?,
                len => usize::from(len),
            };
            let path = index
                .get(name_at..name_at + len)
                .ok_or_else(|| fail(Flaw::NameCut))?;
            // Entries are padded with 1 to 8 NULs to a multiple of 8 bytes.
            at = start + ((name_at - start + len + 8) & !7);
            if at > index.len() {
                return Err(fail(Flaw::EntryCut));
            }
            in_order(path)?;
            visit(path, size);
        }
    }
    Ok(())
}

/// Git's offset varint: 7 bits a byte, high bit set on all but the last, each continuation
/// adding one. Returns the value and the bytes it took.
fn varint(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut value: usize = 0;
    for (used, &byte) in bytes.iter().enumerate().take(10) {
        if used > 0 {
            value = value.checked_add(1)?.checked_mul(128)?;
        }
        value = value.checked_add(usize::from(byte & 0x7f))?;
        if byte & 0x80 == 0 {
            return Some((value, used + 1));
        }
    }
    None
}

/// Length of the NUL-terminated string at `at`.
fn nul_at(bytes: &[u8], at: usize) -> Option<usize> {
    bytes.get(at..)?.iter().position(|&byte| byte == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn paths(index: &[u8], oid_len: usize) -> Result<HashSet<Vec<u8>>, NotAnIndex> {
        let mut found = HashSet::new();
        for_each_entry(index, oid_len, |path, _| {
            found.insert(path.to_vec());
        })?;
        Ok(found)
    }
    // Through the agent's own spawn path: its reaper takes every child of the test process.
    use crate::test_support::sh;

    /// Paths that exercise the padding (names of every length modulo 8), nesting, and names
    /// sharing prefixes (version 4's compression).
    fn names() -> Vec<String> {
        let mut names: Vec<String> = [
            "a",
            "abcdef",
            "abcdefg",
            "abcdefgh",
            "dir/sub/file",
            "dir/sub/filf",
            "dir/z",
            "zz",
        ]
        .iter()
        .map(|name| (*name).to_owned())
        .collect();
        names.push("with space/and:colon*".to_owned());
        names
    }

    async fn index_of(version: &str, intent_to_add: bool) -> (Vec<u8>, HashSet<Vec<u8>>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = names();
        for name in &names {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, name).expect("write");
        }
        sh(
            dir.path(),
            &format!("git init -q && git config index.version {version} && git add -A"),
        )
        .await;
        let mut expected: HashSet<Vec<u8>> = names.into_iter().map(String::into_bytes).collect();
        if intent_to_add {
            std::fs::write(dir.path().join("later"), "later").expect("write");
            sh(dir.path(), "git add -N later").await;
            expected.insert(b"later".to_vec());
        }
        let bytes = std::fs::read(dir.path().join(".git/index")).expect("read index");
        (bytes, expected)
    }

    #[tokio::test]
    async fn every_version_git_writes_reads_back_its_paths() {
        for (version, intent_to_add) in [("2", false), ("3", true), ("4", false), ("4", true)] {
            let (bytes, expected) = index_of(version, intent_to_add).await;
            assert_eq!(
                u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes")),
                version.parse::<u32>().expect("a number"),
                "git wrote the version asked for"
            );
            assert_eq!(
                paths(&bytes, 20).expect("read"),
                expected,
                "version {version}"
            );
            let every = every_path(&bytes, 20).expect("read");
            assert_eq!(
                every.tracked.into_iter().collect::<HashSet<_>>(),
                expected,
                "version {version}"
            );
            // Each file holds its own name: the longest name is the largest file.
            let longest = names().iter().map(String::len).max().expect("names");
            assert_eq!(every.largest, u64::try_from(longest).expect("small"));
        }
    }

    /// A name of 0xFFF bytes or more has 0xFFF in its flags and ends at its NUL. No
    /// filesystem path is that long, so the entry is written by hand.
    #[test]
    fn a_name_longer_than_its_length_field_ends_at_its_nul() {
        let long = vec![b'n'; 5000];
        let mut index = b"DIRC".to_vec();
        index.extend_from_slice(&2u32.to_be_bytes());
        index.extend_from_slice(&1u32.to_be_bytes());
        let start = index.len();
        index.extend_from_slice(&[0; STAT_BYTES + 20]);
        index.extend_from_slice(&NAME_MASK.to_be_bytes());
        index.extend_from_slice(&long);
        let padded = (STAT_BYTES + 20 + 2 + long.len() + 8) & !7;
        index.resize(start + padded, 0);
        index.extend_from_slice(&[0; 20]); // the checksum
        assert_eq!(paths(&index, 20).expect("read"), HashSet::from([long]));
    }

    #[tokio::test]
    async fn damaged_indexes_are_errors_not_panics() {
        let (bytes, _) = index_of("2", false).await;
        for cut in [0, 5, 12, 60, 100, bytes.len() / 2] {
            assert!(paths(&bytes[..cut], 20).is_err(), "cut at {cut}");
        }
        let mut wrong = bytes.clone();
        wrong[0] = b'X';
        assert!(paths(&wrong, 20).unwrap_err().to_string().contains("DIRC"));
        assert_eq!(
            paths(&wrong, 20).unwrap_err().to_string(),
            "the private index is not one git wrote: no DIRC signature"
        );
        // Two entries swapped: the merge with the candidates would miss one.
        let (one, _) = index_of("2", false).await;
        let first = 12;
        let entry_len = |at: usize| {
            let len = usize::from(u16::from_be_bytes([one[at + 60], one[at + 61]]) & NAME_MASK);
            (62 + len + 8) & !7
        };
        let (a_len, b_len) = (entry_len(first), entry_len(first + entry_len(first)));
        let mut swapped = one.clone();
        swapped[first..first + b_len].copy_from_slice(&one[first + a_len..first + a_len + b_len]);
        swapped[first + b_len..first + a_len + b_len].copy_from_slice(&one[first..first + a_len]);
        assert!(paths(&swapped, 20)
            .unwrap_err()
            .to_string()
            .contains("out of order"));
        assert_eq!(paths(&swapped, 20), Err(NotAnIndex(Flaw::OutOfOrder)));
        let mut huge = bytes.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(paths(&huge, 20)
            .unwrap_err()
            .to_string()
            .contains("more entries"));
        // Every byte flipped in turn: an error or some set of paths, never a panic.
        let (v4, _) = index_of("4", false).await;
        for at in 12..v4.len().min(600) {
            let mut flipped = v4.clone();
            flipped[at] ^= 0xff;
            let _ = paths(&flipped, 20);
        }
    }

    #[test]
    fn varints_are_gits() {
        assert_eq!(varint(&[0x00]), Some((0, 1)));
        assert_eq!(varint(&[0x7f]), Some((127, 1)));
        // 128 is 0x80 0x00 in git's offset encoding.
        assert_eq!(varint(&[0x80, 0x00]), Some((128, 2)));
        assert_eq!(varint(&[0x80]), None);
        assert_eq!(varint(&[0xff; 12]), None);
    }
}
