//! The index finds every entry of the tar it was made from, at the offset a reader must start
//! at, and refuses to be used for another tar or when damaged.

use std::io::{Seek, SeekFrom};

use super::*;

/// A tar with short and long names (GNU long-name headers), directories, a symlink, a
/// duplicate name and contents of sizes around the block size.
fn sample_tar(path: &Path) -> Vec<String> {
    let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
    let long_dir = "d".repeat(120);
    let long_file = format!("{long_dir}/{}", "f".repeat(150));
    let mut names = Vec::new();
    let add_dir = append_test_dir;
    let add_file = |builder: &mut tar::Builder<std::fs::File>, name: &str, size: usize| {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(size as u64);
        let data = vec![b'x'; size];
        builder.append_data(&mut header, name, &data[..]).unwrap();
    };
    add_dir(&mut builder, "a");
    names.push("a".to_owned());
    for (i, size) in [0usize, 1, 511, 512, 513, 4096].into_iter().enumerate() {
        let name = format!("a/f{i}");
        add_file(&mut builder, &name, size);
        names.push(name);
    }
    add_dir(&mut builder, &long_dir);
    names.push(long_dir.clone());
    add_file(&mut builder, &long_file, 700);
    names.push(long_file);
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    builder.append_link(&mut link, "ab", "a").unwrap();
    names.push("ab".to_owned());
    add_file(&mut builder, "z", 10);
    names.push("z".to_owned());
    // The same name again, later: the first one is the one an unpack keeps.
    add_file(&mut builder, "a/f1", 3);
    builder.finish().unwrap();
    names
}

/// The name and size of the entry whose first header is at `offset`.
fn entry_at(tar: &Path, offset: u64) -> (String, u64) {
    let mut file = std::fs::File::open(tar).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    let mut archive = tar::Archive::new(file);
    let entry = archive.entries().unwrap().next().unwrap().unwrap();
    (entry_name(&entry.path_bytes()), entry.size())
}

#[test]
fn every_entry_is_found_at_its_first_header() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("t.tar");
    let names = sample_tar(&tar);
    write_for(&tar).unwrap();
    let index = TarIndex::load(&tar).unwrap();
    assert_eq!(index.len(), names.len());
    for name in &names {
        let (found, offset) = index.find(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(found, name);
        assert_eq!(entry_at(&tar, offset).0, *name, "at {offset}");
    }
    // The first of two entries with one name: size 1, not the later 3.
    let (_, offset) = index.find("a/f1").unwrap();
    assert_eq!(entry_at(&tar, offset).1, 1);
    assert!(index.find("a/f").is_none());
    assert!(index.find("nothing").is_none());
    assert!(index.find("").is_none());
}

#[test]
fn beneath_lists_a_directory_and_nothing_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("t.tar");
    let names = sample_tar(&tar);
    write_for(&tar).unwrap();
    let index = TarIndex::load(&tar).unwrap();
    let under_a: Vec<&str> = index.beneath("a").map(|(name, _)| name).collect();
    assert_eq!(under_a, ["a/f0", "a/f1", "a/f2", "a/f3", "a/f4", "a/f5"]);
    // `ab` starts with `a` but is not beneath it.
    assert!(index.beneath("a/f1").next().is_none());
    assert_eq!(index.beneath("").count(), names.len());
    for (name, offset) in index.beneath("") {
        assert_eq!(entry_at(&tar, offset).0, name);
    }
}

#[test]
fn no_index_is_reported_as_missing() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("t.tar");
    sample_tar(&tar);
    let err = TarIndex::load(&tar).unwrap_err();
    assert!(matches!(err, IndexError::Missing(_)), "{err}");
    assert!(err.to_string().contains("t.tar.idx"), "{err}");
}

#[test]
fn an_index_of_another_tar_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("t.tar");
    sample_tar(&tar);
    write_for(&tar).unwrap();
    let mut bytes = std::fs::read(&tar).unwrap();
    bytes.extend_from_slice(&[0; 1024]);
    std::fs::write(&tar, bytes).unwrap();
    let err = TarIndex::load(&tar).unwrap_err();
    assert!(matches!(err, IndexError::Stale { .. }), "{err}");
}

#[test]
fn a_damaged_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("t.tar");
    sample_tar(&tar);
    write_for(&tar).unwrap();
    let path = index_path(&tar);
    let good = std::fs::read(&path).unwrap();
    let mut flipped = good.clone();
    flipped[HEADER_LEN + 3] ^= 0x40;
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("cut short", good[..good.len() / 2].to_vec()),
        ("a flipped bit", flipped),
    ];
    let mut other_magic = good.clone();
    other_magic[..8].copy_from_slice(b"DCTIDX9\n");
    cases.push(("another format", other_magic));
    for (what, bytes) in cases {
        std::fs::write(&path, bytes).unwrap();
        let err = TarIndex::load(&tar).unwrap_err();
        assert!(matches!(err, IndexError::Damaged { .. }), "{what}: {err}");
        assert!(err.to_string().contains("is damaged"), "{what}: {err}");
    }
}

/// Writes the checksum of an index altered in place: what a writer with a bug would seal.
fn reseal(index: &mut [u8]) {
    let body = index.len() - CHECKSUM_LEN;
    let sum = checksum(&index[..body]);
    index[body..].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn records_that_lie_about_their_names_are_refused_even_with_a_good_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("t.tar");
    sample_tar(&tar);
    let len = std::fs::metadata(&tar).unwrap().len();
    // Unsorted names: a binary search would miss entries.
    let bytes = encode(vec![("b".into(), 0), ("a".into(), 512)], len).unwrap();
    let mut unsorted = bytes.clone();
    // Swap the two one-byte names in place, then re-seal.
    let names = HEADER_LEN + 2 * RECORD_LEN;
    unsorted.swap(names, names + 1);
    reseal(&mut unsorted);
    let err = TarIndex::from_bytes(unsorted, len).map(|_| ()).unwrap_err();
    assert!(matches!(err, Defect::Damaged("its names are not sorted")));

    // A name past the end of the names.
    let mut past = bytes;
    let at = HEADER_LEN + RECORD_LEN + 8;
    past[at..at + 4].copy_from_slice(&7u32.to_le_bytes());
    reseal(&mut past);
    let err = TarIndex::from_bytes(past, len).map(|_| ()).unwrap_err();
    assert!(matches!(
        err,
        Defect::Damaged("a name runs past its end or splits a character")
    ));

    // Names that are UTF-8 together but not each: "é" cut after its first byte.
    let mut split = encode(vec![("a".into(), 0), ("\u{e9}".into(), 512)], len).unwrap();
    let at = HEADER_LEN + RECORD_LEN + 12;
    split[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    reseal(&mut split);
    let err = TarIndex::from_bytes(split, len).map(|_| ()).unwrap_err();
    assert!(matches!(
        err,
        Defect::Damaged("a name runs past its end or splits a character")
    ));
}

/// Offsets no header of the tar can have, in a well-formed, sealed index: past the end, in the
/// last block, and past 2^63, where a read fails outright (verification then blamed the tar,
/// where it reads the tar through for any other wrong offset).
#[test]
fn offsets_past_the_tar_are_refused_even_with_a_good_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("t.tar");
    sample_tar(&tar);
    let len = std::fs::metadata(&tar).unwrap().len();
    for offset in [len, len - BLOCK + 1, 1 << 63, u64::MAX] {
        let bytes = encode(vec![("a".into(), 0), ("b".into(), offset)], len).unwrap();
        let err = TarIndex::from_bytes(bytes, len).map(|_| ()).unwrap_err();
        assert_eq!(
            err,
            Defect::Damaged("an entry's offset lies past the end of the tar"),
            "{offset}"
        );
    }
    let last = encode(vec![("a".into(), 0), ("b".into(), len - BLOCK)], len).unwrap();
    TarIndex::from_bytes(last, len).expect("the last block can hold a header");
}

#[test]
fn an_empty_tar_gets_an_empty_index() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("t.tar");
    tar::Builder::new(std::fs::File::create(&tar).unwrap())
        .finish()
        .unwrap();
    write_for(&tar).unwrap();
    let index = TarIndex::load(&tar).unwrap();
    assert!(index.is_empty());
    assert!(index.find("a").is_none());
    assert_eq!(index.beneath("").count(), 0);
}
