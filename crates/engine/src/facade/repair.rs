//! Rebuilding a damaged catalog from the record files (`dynocap doctor --repair`).
//!
//! Under the catalog lock held exclusively (no other process opens or writes the catalog
//! meanwhile), the damaged `catalog.db` and its `-wal` and `-shm` are moved aside, never
//! deleted, and a new catalog is built from the record files. A healthy catalog is left as it
//! is: a repair never discards records that only the catalog knows (those of a dynocap older
//! than record files). Marking records whose supervisor died is the caller's next step, the
//! same reconciliation every command does.

use std::path::{Path, PathBuf};

use crate::foundation::error::{Context, Result};
use crate::host::home::Home;
use crate::store::catalog::{self, Record};
use crate::store::catalog_file::{self, classify, suffixed, CatalogFailure, Failure, Import};
use crate::store::catalog_lock;

/// What `repair` found and did.
#[derive(Debug)]
pub struct RepairReport {
    pub catalog: PathBuf,
    /// What was wrong with the catalog; `None` when it was healthy and left alone.
    pub damage: Option<String>,
    /// Where the damaged files went (the catalog first, then its `-wal` and `-shm`).
    pub moved_aside: Vec<PathBuf>,
    /// The records in the catalog: restored ones after a rebuild, all of them otherwise.
    pub records: Vec<Record>,
    /// Record files that could not be used, and why.
    pub skipped: Vec<(PathBuf, String)>,
    /// Names bound in more than one record file: (id that lost it, name, id that kept it).
    pub released_names: Vec<(String, String, String)>,
}

impl RepairReport {
    pub fn repaired(&self) -> bool {
        self.damage.is_some()
    }
}

/// Checks the catalog and, if it is damaged, missing or empty, rebuilds it from the record
/// files. Refuses to touch a catalog that is merely busy or written by a newer dynocap.
pub fn repair(home: &Home) -> Result<RepairReport> {
    let path = home.catalog_path();
    let lock = catalog_lock::Exclusive::acquire(home)?;
    let damage = if std::fs::symlink_metadata(&path)
        .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    {
        "it was missing".to_owned()
    } else {
        match check(home, &lock) {
            Ok(Checked::Healthy(records)) => {
                return Ok(RepairReport {
                    catalog: path,
                    damage: None,
                    moved_aside: Vec::new(),
                    records,
                    skipped: Vec::new(),
                    released_names: Vec::new(),
                })
            }
            // SQLite takes an empty file for a new database: it was just filled.
            Ok(Checked::WasEmpty(import)) => {
                return Ok(report(path, "it was empty", Vec::new(), import))
            }
            Err(failure) if failure.calls_for_repair() => failure.reason(),
            Err(failure) => return Err(failure.into_error(&path)),
        }
    };
    let moved_aside = move_aside(&path)?;
    let (_, import) = catalog_file::connect(home, &lock).map_err(|f| f.into_error(&path))?;
    let import = import.ok_or_else(|| CatalogFailure::Reappeared {
        path: path.clone(),
        lock: home.catalog_lock_path(),
    })?;
    Ok(report(path, &damage, moved_aside, import))
}

fn report(
    catalog: PathBuf,
    damage: &str,
    moved_aside: Vec<PathBuf>,
    import: Import,
) -> RepairReport {
    RepairReport {
        catalog,
        damage: Some(damage.to_owned()),
        moved_aside,
        records: import.restored,
        skipped: import.skipped,
        released_names: import.released_names,
    }
}

enum Checked {
    Healthy(Vec<Record>),
    WasEmpty(Import),
}

/// Opens the catalog and reads all of it: SQLite's structural check, then every record.
fn check(home: &Home, lock: &catalog_lock::Exclusive) -> Result<Checked, Failure> {
    let (connected, import) = catalog_file::connect(home, lock)?;
    if let Some(import) = import {
        return Ok(Checked::WasEmpty(import));
    }
    let verdict: String = connected
        .conn
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .map_err(classify)?;
    if verdict != "ok" {
        return Err(Failure::Damaged(verdict));
    }
    catalog::list_rows(&connected.conn)
        .map(Checked::Healthy)
        .map_err(classify)
}

/// Renames the catalog's files to `catalog.db.damaged-<UTC time>` (plus `-wal`, `-shm`), so
/// SQLite still opens them together for a post-mortem. The `-wal` and `-shm` go first: a new
/// catalog must never meet the old WAL, which SQLite would replay into it.
fn move_aside(path: &Path) -> Result<Vec<PathBuf>> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let mut base = suffixed(path, &format!(".damaged-{stamp}"));
    let mut n = 1;
    while ["", "-wal", "-shm"]
        .iter()
        .any(|suffix| std::fs::symlink_metadata(suffixed(&base, suffix)).is_ok())
    {
        n += 1;
        base = suffixed(path, &format!(".damaged-{stamp}-{n}"));
    }
    let mut moved = Vec::new();
    for suffix in ["-wal", "-shm", ""] {
        let from = suffixed(path, suffix);
        if std::fs::symlink_metadata(&from).is_err() {
            continue;
        }
        let to = suffixed(&base, suffix);
        std::fs::rename(&from, &to).with_context(|| {
            format!(
                "moving the damaged {} aside to {}",
                from.display(),
                to.display()
            )
        })?;
        moved.push(to);
    }
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))?;
    }
    // The catalog itself first, as the report lists it.
    if let Some(at) = moved.iter().position(|p| *p == base) {
        let catalog = moved.remove(at);
        moved.insert(0, catalog);
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::spec::Network;
    use crate::store::catalog::{Catalog, Kind, State};

    fn populated() -> (tempfile::TempDir, Home, Vec<Record>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::at(dir.path().to_owned()).expect("home");
        let catalog = Catalog::open(&home).expect("open");
        let now = chrono::Utc::now();
        for (id, kind, name) in [("task-a", Kind::Task, "a"), ("sbx-b", Kind::Raw, "b")] {
            catalog
                .insert(&Record {
                    id: id.into(),
                    kind,
                    name: Some(name.into()),
                    state: State::Running,
                    backend: "jail".into(),
                    network: Network::None,
                    cpus: 1,
                    memory_mb: 512,
                    disk_mb: 256,
                    ttl_seconds: 600,
                    created_at: now,
                    expires_at: now,
                    supervisor: None,
                    note: None,
                    detail: None,
                    egress: None,
                    image: crate::image::ImageRef::host(),
                })
                .expect("insert");
        }
        catalog
            .set_state("task-a", State::Finished, Some("done"))
            .expect("finish");
        let records = catalog.list().expect("list");
        (dir, home, records)
    }

    #[test]
    fn a_damaged_catalog_is_moved_aside_and_rebuilt_from_the_record_files() {
        let (_dir, home, before) = populated();
        let path = home.catalog_path();
        std::fs::write(&path, vec![0xa5u8; 8192]).expect("damage");
        std::fs::write(suffixed(&path, "-wal"), b"junk").expect("junk wal");
        let bad = home.results_dir("task-bad");
        std::fs::create_dir_all(&bad).expect("dir");
        std::fs::write(bad.join(crate::host::home::RECORD_FILE), "not json").expect("bad file");

        let report = repair(&home).expect("repair");
        assert!(report.repaired());
        assert_eq!(report.damage.as_deref(), Some("file is not a database"));
        assert_eq!(report.records, before);
        assert_eq!(report.skipped.len(), 1);
        assert!(
            report.skipped[0].1.contains("is damaged"),
            "{:?}",
            report.skipped
        );
        let aside = &report.moved_aside[0];
        let aside_name = aside
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(
            aside_name.starts_with("catalog.db.damaged-"),
            "{aside_name}"
        );
        assert_eq!(
            report.moved_aside[1..],
            [suffixed(aside, "-wal"), suffixed(aside, "-shm")],
            "the WAL and shared-memory index go with it"
        );
        assert_eq!(
            std::fs::read(suffixed(aside, "-wal")).expect("wal kept"),
            b"junk"
        );

        let catalog = Catalog::open(&home).expect("reopen");
        assert_eq!(catalog.list().expect("list"), before);
        assert_eq!(
            catalog.find("a").expect("find").map(|r| r.id),
            Some("task-a".into())
        );

        // Again at once: nothing to do, and a second damage gets a distinct name.
        assert!(!repair(&home).expect("healthy").repaired());
        drop(catalog);
        for file in ["-wal", "-shm"] {
            std::fs::remove_file(suffixed(&path, file)).expect("rm sidecar");
        }
        std::fs::write(&path, vec![0xa5u8; 8192]).expect("damage again");
        let again = repair(&home).expect("repair again");
        assert_ne!(again.moved_aside[0], *aside);
    }

    #[test]
    fn a_healthy_catalog_is_left_alone() {
        let (_dir, home, before) = populated();
        let inode = std::fs::metadata(home.catalog_path()).expect("stat");
        let report = repair(&home).expect("repair");
        assert_eq!(report.damage, None);
        assert!(report.moved_aside.is_empty());
        assert_eq!(report.records, before);
        use std::os::unix::fs::MetadataExt;
        let after = std::fs::metadata(home.catalog_path()).expect("stat");
        assert_eq!(after.ino(), inode.ino(), "the same file");
    }

    #[test]
    fn an_empty_or_missing_catalog_is_filled() {
        let (_dir, home, before) = populated();
        let path = home.catalog_path();
        std::fs::write(&path, b"").expect("empty");
        let report = repair(&home).expect("repair");
        assert_eq!(report.damage.as_deref(), Some("it was empty"));
        assert!(report.moved_aside.is_empty());
        assert_eq!(report.records, before);

        std::fs::remove_file(&path).expect("rm");
        let report = repair(&home).expect("repair");
        assert_eq!(report.damage.as_deref(), Some("it was missing"));
        assert_eq!(report.records, before);
    }

    #[test]
    fn a_catalog_from_a_newer_dynocap_is_not_touched() {
        let (_dir, home, _) = populated();
        rusqlite::Connection::open(home.catalog_path())
            .expect("open")
            .pragma_update(None, "user_version", 99)
            .expect("bump");
        let err = repair(&home).expect_err("refused");
        assert!(err.message.contains("newer dynocap"), "{err}");
        assert!(home.catalog_path().exists());
    }
}
