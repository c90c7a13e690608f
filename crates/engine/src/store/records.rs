//! Record files: every sandbox and task record, also stored as JSON beside its data — a task's
//! in `results/<id>/record.json`, a raw sandbox's in `sandboxes/<id>/record.json`.
//!
//! They are the source of truth that survives a lost or damaged catalog: the catalog writes a
//! record's file whenever it changes the record, and `dynocap doctor --repair` (or opening a
//! new, empty catalog) rebuilds the catalog from them. A file is replaced atomically (a temp
//! file in the same directory, fsync, rename, fsync of the directory), so a reader or a crash
//! sees the old record or the new one, never half of each.
//!
//! Format: `{"format": 1, "record": {…}}`, the record in camelCase with its `detail` embedded
//! as JSON. A newer format is refused rather than misread.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::foundation::error::{Coded, Context, ErrorCode, Result};
use crate::host::home::{Home, RECORD_FILE};
use crate::store::catalog::{Kind, Record};

/// The record file format this build writes and the newest it reads.
pub const FORMAT: u32 = 1;

/// A record is a few KiB (a task's detail holds its result); anything far larger is not one.
const MAX_RECORD_BYTES: u64 = 4 << 20;

#[derive(Serialize)]
struct FileOut<'a> {
    format: u32,
    record: &'a Record,
}

/// Read first, so that a newer format is refused as such rather than reported as damage.
#[derive(Deserialize)]
struct FormatOnly {
    format: u32,
}

#[derive(Deserialize)]
struct FileIn {
    record: Record,
}

/// Writes `record`'s file (its path follows from its kind and id), creating its own directory
/// (mode 0700) if needed and replacing any previous version atomically. Only that directory:
/// the home's `results/` or `sandboxes/` must exist, so that a supervisor ending after its
/// home was deleted fails here instead of making the home again.
pub fn save(home: &Home, record: &Record) -> Result<()> {
    check_id(&record.id)?;
    let path = home.record_path(record.kind, &record.id);
    let dir = path
        .parent()
        .expect("a record path is DIR/record.json, so it has a parent");
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => {
            return Err(RecordFailure::CreateDir {
                dir: dir.to_owned(),
                home: home.root().to_owned(),
                source: err,
            }
            .into())
        }
    }
    let mut text = serde_json::to_vec_pretty(&FileOut {
        format: FORMAT,
        record,
    })
    .with_context(|| format!("encoding the record {}", record.id))?;
    text.push(b'\n');
    // A task's record outlives the machine (its results are the product); a raw sandbox's
    // dies with its guest, which a power loss ends anyway, so it skips the fsyncs that would
    // otherwise sit on the path of every `run` and `destroy`.
    let written = match record.kind {
        Kind::Task => dynocap_host::durable::replace(&path, &text),
        Kind::Raw => dynocap_host::durable::replace_unsynced(&path, &text),
    };
    written.map_err(|source| {
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => RecordFailure::DiskFull {
                home: home.root().to_owned(),
                path,
                source,
            },
            _ => RecordFailure::Write { path, source },
        }
        .into()
    })
}

/// Reads one record file.
pub fn load(path: &Path) -> Result<Record> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("reading the record file {}", path.display()))?;
    let size = file
        .metadata()
        .with_context(|| format!("reading the record file {}", path.display()))?
        .len();
    if size > MAX_RECORD_BYTES {
        return Err(RecordFailure::TooLarge {
            path: path.to_owned(),
            size,
        }
        .into());
    }
    let mut text = Vec::new();
    file.take(MAX_RECORD_BYTES)
        .read_to_end(&mut text)
        .with_context(|| format!("reading the record file {}", path.display()))?;
    let damaged = |source: serde_json::Error| RecordFailure::Damaged {
        path: path.to_owned(),
        source,
    };
    let format = serde_json::from_slice::<FormatOnly>(&text)
        .map_err(damaged)?
        .format;
    if format > FORMAT {
        return Err(RecordFailure::NewerFormat {
            path: path.to_owned(),
            format,
        }
        .into());
    }
    Ok(serde_json::from_slice::<FileIn>(&text)
        .map_err(damaged)?
        .record)
}

/// Every record file under `results/` and `sandboxes/`, each with its record or why it could
/// not be read. A file whose record does not belong where it lies (another id, another kind)
/// counts as unreadable: a rebuild must not bind a name from a misplaced copy. Sorted by path.
pub fn scan(home: &Home) -> Result<Vec<(PathBuf, Result<Record>)>> {
    let mut found = Vec::new();
    for kind in [Kind::Task, Kind::Raw] {
        let parent = home.records_root(kind);
        let entries = match std::fs::read_dir(&parent) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(RecordFailure::List {
                    dir: parent,
                    source,
                }
                .into())
            }
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", parent.display()))?;
            let is_dir = entry
                .file_type()
                .with_context(|| format!("listing {}", parent.display()))?
                .is_dir();
            let name = entry.file_name();
            let Some(id) = name.to_str().filter(|_| is_dir) else {
                continue;
            };
            let path = entry.path().join(RECORD_FILE);
            match std::fs::symlink_metadata(&path) {
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                _ => {}
            }
            let record = load(&path).and_then(|record| belongs_here(record, kind, id, &path));
            found.push((path, record));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// Removes a record's file (gone already is fine) and its directory if that leaves it empty.
pub(crate) fn remove(home: &Home, kind: Kind, id: &str) -> Result<()> {
    check_id(id)?;
    let path = home.record_path(kind, id);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(RecordFailure::Remove { path, source }.into()),
    }
    if let Some(dir) = path.parent() {
        // Not empty means someone still keeps data there; leave it to them.
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

fn belongs_here(record: Record, kind: Kind, id: &str, path: &Path) -> Result<Record> {
    if record.kind == kind && record.id == id {
        return Ok(record);
    }
    Err(RecordFailure::Misplaced {
        path: path.to_owned(),
        found: format!("{} {}", record.kind.as_str(), record.id),
        expected: format!("{} {id}", kind.as_str()),
    }
    .into())
}

/// Ids become directory names: only what `new_id` makes (and nothing that walks the tree).
fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(RecordFailure::BadId { id: id.to_owned() }.into())
    }
}

/// What failed with a record file.
#[derive(Debug, thiserror::Error)]
enum RecordFailure {
    #[error(
        "cannot create {} ({source}); was the home {} deleted?",
        .dir.display(),
        .home.display()
    )]
    CreateDir {
        dir: PathBuf,
        home: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the disk holding {} is full (No space left on device), so the record file {} cannot be \
         written; free space there (or point DYNOCAP_HOME at a larger disk) and try again",
        .home.display(),
        .path.display()
    )]
    DiskFull {
        home: PathBuf,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the record file {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the record file {} is {size} bytes, far more than a record holds; it is not one of \
         DynoCap's",
        .path.display()
    )]
    TooLarge { path: PathBuf, size: u64 },
    #[error("the record file {} is damaged ({source})", .path.display())]
    Damaged {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the record file {} was written by a newer dynocap (format {format}, this one reads up \
         to {FORMAT}); upgrade dynocap",
        .path.display()
    )]
    NewerFormat { path: PathBuf, format: u32 },
    #[error("listing {}: {source}", .dir.display())]
    List {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("removing {}: {source}", .path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `found` and `expected` are "KIND ID".
    #[error(
        "the record file {} describes {found}, not the {expected} its directory is named for; it \
         was copied or moved there by hand",
        .path.display()
    )]
    Misplaced {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error(
        "refusing to store a record with the id {id:?}: ids are letters, digits, '-', '_' and \
         '.', and do not start with '.'"
    )]
    BadId { id: String },
}

impl Coded for RecordFailure {
    /// Record files are DynoCap's own: whatever is wrong with one (or with the disk under
    /// it) is no caller's doing. A bad id is a bug, since only `new_id` makes them.
    fn code(&self) -> ErrorCode {
        match self {
            Self::CreateDir { .. }
            | Self::DiskFull { .. }
            | Self::Write { .. }
            | Self::TooLarge { .. }
            | Self::Damaged { .. }
            | Self::NewerFormat { .. }
            | Self::List { .. }
            | Self::Remove { .. }
            | Self::Misplaced { .. }
            | Self::BadId { .. } => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Network;
    use crate::store::catalog::{ProcessId, State};
    use std::os::unix::fs::PermissionsExt;

    fn home() -> (tempfile::TempDir, Home) {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::at(dir.path().to_owned()).expect("home");
        (dir, home)
    }

    fn task(id: &str) -> Record {
        let at = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .expect("valid time")
                .with_timezone(&chrono::Utc)
        };
        Record {
            id: id.into(),
            kind: Kind::Task,
            name: Some("fix-bug".into()),
            state: State::Running,
            backend: "jail".into(),
            network: Network::None,
            cpus: 2,
            memory_mb: 1024,
            disk_mb: 10_240,
            ttl_seconds: 1800,
            created_at: at("2025-01-02T03:04:05Z"),
            expires_at: at("2025-01-02T03:34:05Z"),
            supervisor: Some(ProcessId {
                pid: 4242,
                start_ticks: 987_654,
            }),
            note: Some("a note \"quoted\"\nand a newline".into()),
            detail: Some(r#"{"start":{"b":[1,2]},"source":null,"result":{"x":"y"}}"#.into()),
            egress: None,
            image: crate::model::image_ref::ImageRef::host(),
        }
    }

    /// A supervisor ending after its home was deleted (`rm -rf`) writes its last record into
    /// nothing: the home is not made again around it.
    #[test]
    fn a_record_is_not_saved_into_a_deleted_home() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("home");
        let home = Home::at(root.clone()).expect("home");
        std::fs::remove_dir_all(&root).expect("delete the home");
        let err = save(&home, &task("task-abc123")).expect_err("no home to save into");
        assert!(err.message.contains("deleted"), "{err}");
        assert!(!root.exists(), "the deleted home was made again");
    }

    /// Whatever is wrong with a record file is `internal`, never the caller's to fix.
    #[test]
    fn record_failures_are_internal() {
        let (_dir, home) = home();
        let err = save(&home, &task("../escape")).expect_err("a path as an id");
        assert_eq!(err.code, crate::ErrorCode::Internal);
        assert!(err
            .message
            .starts_with("refusing to store a record with the id \"../escape\""));
        let path = home.record_path(Kind::Task, "task-big");
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        let file = std::fs::File::create(&path).expect("create");
        file.set_len(MAX_RECORD_BYTES + 1).expect("size");
        let err = load(&path).expect_err("too large");
        assert_eq!(err.code, crate::ErrorCode::Internal);
        assert!(err
            .message
            .ends_with("far more than a record holds; it is not one of DynoCap's"));
    }

    #[test]
    fn a_record_round_trips_with_its_detail_embedded_as_json() {
        let (_dir, home) = home();
        let record = task("task-abc123");
        save(&home, &record).expect("save");
        let path = home.results_dir("task-abc123").join(RECORD_FILE);
        assert_eq!(load(&path).expect("load"), record);

        let text = std::fs::read_to_string(&path).expect("read");
        let json: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(json["format"], 1);
        let fields = &json["record"];
        assert_eq!(fields["kind"], "task");
        assert_eq!(fields["state"], "running");
        assert_eq!(fields["memoryMB"], 1024);
        assert_eq!(fields["ttlSeconds"], 1800);
        assert_eq!(fields["createdAt"], "2025-01-02T03:04:05Z");
        assert_eq!(fields["supervisor"]["startTicks"], 987_654);
        assert_eq!(
            fields["detail"]["result"]["x"], "y",
            "detail is JSON, not a string"
        );

        let mut raw = task("sbx-xyz");
        raw.kind = Kind::Raw;
        raw.detail = None;
        raw.supervisor = None;
        save(&home, &raw).expect("save raw");
        let raw_path = home.sandbox_dir("sbx-xyz").join(RECORD_FILE);
        assert_eq!(load(&raw_path).expect("load raw"), raw);
    }

    #[test]
    fn saving_again_replaces_the_file_whole_and_leaves_no_temp_files() {
        let (_dir, home) = home();
        let mut record = task("task-r");
        save(&home, &record).expect("first");
        record.state = State::Finished;
        record.detail = None;
        save(&home, &record).expect("second");
        let dir = home.results_dir("task-r");
        let path = dir.join(RECORD_FILE);
        assert_eq!(load(&path).expect("load").state, State::Finished);
        let names: Vec<String> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![RECORD_FILE.to_owned()], "no temp file left");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!((mode(&dir), mode(&path)), (0o700, 0o600));

        // A reader holding the old file keeps the old content: the new one is a new inode.
        let mut old = std::fs::File::open(&path).expect("open");
        record.state = State::Expired;
        save(&home, &record).expect("third");
        let mut text = String::new();
        old.read_to_string(&mut text).expect("read old");
        assert!(text.contains("\"finished\""), "{text}");
        assert_eq!(load(&path).expect("load").state, State::Expired);
    }

    #[test]
    fn scan_reports_unreadable_and_misplaced_files_and_skips_bare_directories() {
        let (_dir, home) = home();
        save(&home, &task("task-good")).expect("save");
        std::fs::create_dir_all(home.results_dir("task-bare")).expect("bare dir");
        std::fs::create_dir_all(home.results_dir("task-bad")).expect("dir");
        std::fs::write(home.results_dir("task-bad").join(RECORD_FILE), "{\"form").expect("write");
        std::fs::create_dir_all(home.results_dir("task-moved")).expect("dir");
        std::fs::copy(
            home.results_dir("task-good").join(RECORD_FILE),
            home.results_dir("task-moved").join(RECORD_FILE),
        )
        .expect("copy");
        let newer = serde_json::json!({ "format": 99, "record": {} }).to_string();
        std::fs::create_dir_all(home.sandbox_dir("sbx-new")).expect("dir");
        std::fs::write(home.sandbox_dir("sbx-new").join(RECORD_FILE), newer).expect("write");

        let found = scan(&home).expect("scan");
        let summary: Vec<(String, std::result::Result<String, String>)> = found
            .iter()
            .map(|(path, record)| {
                let dir = path.parent().and_then(Path::file_name).expect("dir name");
                let outcome = match record {
                    Ok(r) => Ok(r.id.clone()),
                    Err(e) => Err(e.message.clone()),
                };
                (dir.to_string_lossy().into_owned(), outcome)
            })
            .collect();
        assert_eq!(summary.len(), 4, "{summary:?}");
        assert_eq!(summary[0].0, "task-bad");
        assert!(summary[0]
            .1
            .as_ref()
            .is_err_and(|e| e.contains("is damaged")));
        assert_eq!(summary[1], ("task-good".into(), Ok("task-good".into())));
        assert_eq!(summary[2].0, "task-moved");
        assert!(summary[2]
            .1
            .as_ref()
            .is_err_and(|e| e.contains("not the task task-moved")));
        assert_eq!(summary[3].0, "sbx-new");
        assert!(summary[3]
            .1
            .as_ref()
            .is_err_and(|e| e.contains("newer dynocap")));
    }

    /// A record of a pre-release DynoCap lacks fields every record has now: it is reported,
    /// not read with a disk size or an image it never had.
    #[test]
    fn a_record_without_its_disk_or_image_is_not_read() {
        let (_dir, home) = home();
        save(&home, &task("task-old")).expect("save");
        let path = home.results_dir("task-old").join(RECORD_FILE);
        let full: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        for field in ["diskMB", "image"] {
            let mut old = full.clone();
            old["record"]
                .as_object_mut()
                .expect("a record object")
                .remove(field)
                .expect("the field is written");
            std::fs::write(&path, old.to_string()).expect("write");
            let err = load(&path).expect_err("a record without it is refused");
            assert!(
                err.message.contains(&path.display().to_string())
                    && err.message.contains(&format!("missing field `{field}`")),
                "{err}"
            );
        }
    }

    #[test]
    fn remove_deletes_the_file_and_an_emptied_directory_only() {
        let (_dir, home) = home();
        let mut raw = task("sbx-a");
        raw.kind = Kind::Raw;
        save(&home, &raw).expect("save");
        remove(&home, Kind::Raw, "sbx-a").expect("remove");
        assert!(!home.sandbox_dir("sbx-a").exists());
        remove(&home, Kind::Raw, "sbx-a").expect("removing twice is fine");

        save(&home, &raw).expect("save");
        std::fs::create_dir(home.sandbox_dir("sbx-a").join("upper")).expect("mkdir");
        remove(&home, Kind::Raw, "sbx-a").expect("remove");
        assert!(
            home.sandbox_dir("sbx-a").join("upper").exists(),
            "data kept"
        );
    }

    #[test]
    fn ids_that_would_walk_the_tree_are_refused() {
        let (_dir, home) = home();
        for id in ["", "../x", "a/b", ".hidden", "x\n"] {
            let mut record = task("task-ok");
            record.id = id.into();
            assert!(save(&home, &record).is_err(), "{id:?}");
        }
    }
}
