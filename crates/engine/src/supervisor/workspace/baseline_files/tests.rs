//! Lookups through the tar's offset index answer as a read-through of every header does.

use std::path::Path;

use dynocap_review::tar_index;

use super::*;

const LONG_DIR: &str =
    "a-directory-name-long-enough-that-the-path-needs-a-gnu-long-name-header/and-deeper-still";

/// A tar with kept and unkept entries of every kind, long names and targets, a package.json
/// too large to keep, and a name that occurs twice; returns every name in it.
fn baseline(path: &Path) -> Vec<String> {
    let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
    let mut names = Vec::new();
    let dir = tar_index::append_test_dir;
    dir(&mut builder, "app");
    dir(&mut builder, LONG_DIR);
    let file = |builder: &mut tar::Builder<std::fs::File>, name: &str, content: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(content.len() as u64);
        builder.append_data(&mut header, name, content).unwrap();
    };
    file(
        &mut builder,
        "package.json",
        br#"{"scripts":{"test":"jest"}}"#,
    );
    file(&mut builder, "app/package.json", br#"{"name":"app"}"#);
    file(&mut builder, "app/main.js", b"console.log(1)\n");
    file(
        &mut builder,
        &format!("{LONG_DIR}/package.json"),
        b"{\"long\":true}",
    );
    let big = vec![b' '; usize::try_from(INDEXED_MAX_BYTES).unwrap() + 1];
    file(&mut builder, "big/package.json", &big);
    // The same name again: the first entry counts.
    file(&mut builder, "app/package.json", br#"{"name":"second"}"#);
    let link = |builder: &mut tar::Builder<std::fs::File>, kind, name: &str, target: &str| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(0o777);
        header.set_size(0);
        builder.append_link(&mut header, name, target).unwrap();
    };
    link(
        &mut builder,
        tar::EntryType::Symlink,
        "app/current",
        "main.js",
    );
    let long_target = format!("../{LONG_DIR}/package.json");
    link(
        &mut builder,
        tar::EntryType::Symlink,
        &format!("{LONG_DIR}/up"),
        &long_target,
    );
    link(
        &mut builder,
        tar::EntryType::Link,
        "app/hard/package.json",
        "package.json",
    );
    builder.finish().unwrap();
    let archive_names = {
        let mut archive = tar::Archive::new(std::fs::File::open(path).unwrap());
        archive
            .entries()
            .unwrap()
            .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
            .collect::<Vec<_>>()
    };
    names.extend(archive_names);
    names.extend(["absent", "app/absent/package.json", "big", ""].map(String::from));
    names
}

fn assert_same_answers(tar: &Path, names: &[String], loaded: &BaselineIndex) {
    let reference = BaselineIndex::read_through(tar).unwrap();
    for name in names {
        assert_eq!(loaded.get(name), reference.get(name), "{name:?}");
    }
}

#[test]
fn lookups_through_the_index_answer_as_a_read_through() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("baseline.tar");
    let names = baseline(&tar);
    tar_index::write_for(&tar).unwrap();
    let loaded = BaselineIndex::load(&tar).unwrap();
    assert!(loaded.index.is_some(), "the index is used");
    assert_same_answers(&tar, &names, &loaded);
    assert!(
        loaded.read_through.get().is_none(),
        "no lookup read the tar through"
    );
    // What the answers are, so that two empty answers cannot pass for agreement.
    assert_eq!(
        loaded.get("app/package.json").unwrap(),
        br#"{"name":"app"}"#
    );
    assert_eq!(loaded.get("app/current").unwrap(), b"main.js");
    assert_eq!(
        loaded.get(&format!("{LONG_DIR}/up")).unwrap(),
        format!("../{LONG_DIR}/package.json").as_bytes()
    );
    assert_eq!(
        loaded.get(&format!("{LONG_DIR}/package.json")).unwrap(),
        b"{\"long\":true}"
    );
    assert_eq!(loaded.get("big/package.json"), None, "too large to keep");
    assert_eq!(loaded.get("app/main.js"), None, "not a package.json");
    assert_eq!(loaded.get("app/hard/package.json"), None, "a hard link");
    assert_eq!(loaded.get("absent"), None);
}

#[test]
fn without_a_usable_index_every_header_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("baseline.tar");
    let names = baseline(&tar);

    let missing = BaselineIndex::load(&tar).unwrap();
    assert!(missing.index.is_none());
    assert_same_answers(&tar, &names, &missing);

    tar_index::write_for(&tar).unwrap();
    let idx = tar_index::index_path(&tar);
    let mut bytes = std::fs::read(&idx).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&idx, bytes).unwrap();
    let damaged = BaselineIndex::load(&tar).unwrap();
    assert!(damaged.index.is_none(), "a damaged index is not used");
    assert_same_answers(&tar, &names, &damaged);
}

#[test]
fn an_index_that_leads_elsewhere_gives_way_to_a_read_through() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("baseline.tar");
    let names = baseline(&tar);
    // Well-formed, checksummed, and wrong: every name points at the first entry.
    let wrong = names
        .iter()
        .filter(|name| !name.is_empty())
        .map(|name| (tar_index::entry_name(name.as_bytes()), 0))
        .collect();
    tar_index::write_entries(&tar, wrong).unwrap();
    let loaded = BaselineIndex::load(&tar).unwrap();
    assert!(loaded.index.is_some(), "it passes the checks at load");
    assert_eq!(loaded.get("app/current").unwrap(), b"main.js");
    assert!(
        loaded.read_through.get().is_some(),
        "the tar was read through"
    );
    assert_same_answers(&tar, &names, &loaded);
}
