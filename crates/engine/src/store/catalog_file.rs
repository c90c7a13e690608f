//! The catalog's files on disk (`catalog.db` and SQLite's `-wal` and `-shm` beside it): opening
//! them, creating a new catalog once under the catalog lock, and turning what goes wrong into
//! an error that names the file and the remedy.
//!
//! A new (or empty) catalog is filled from the record files (`records.rs`), so losing the
//! catalog loses nothing that a record file still describes. There is one schema,
//! [`catalog::SCHEMA_VERSION`]: a catalog of an earlier pre-release DynoCap is refused as it
//! is, never changed, since no release ever wrote one.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode as Sqlite, TransactionBehavior};

use crate::foundation::error::{Coded, Error, ErrorCode};
use crate::host::home::Home;
use crate::store::catalog::{self, Record};
use crate::store::catalog_lock::{self, LOCK_TIMEOUT};
use crate::store::records;

/// How long SQLite waits for another connection's write to finish.
const BUSY_TIMEOUT: Duration = LOCK_TIMEOUT;

/// The first pause of a connection that finds the catalog locked; each next one is twice as
/// long, up to [`LONGEST_BUSY_PAUSE`].
const FIRST_BUSY_PAUSE: Duration = Duration::from_micros(50);
/// The longest pause between two tries of a locked catalog.
const LONGEST_BUSY_PAUSE: Duration = Duration::from_millis(10);

/// Pages the WAL may grow to before the commit that passes it copies them into the main file
/// (SQLite's default is 1000). A process that opens the catalog while no other has it open
/// rebuilds the WAL's index by reading every frame, under a lock that makes any other
/// process opening it meanwhile wait: `run` from the CLI and the supervisor it starts both
/// do, every time. A WAL of a few MB made that rebuild a noticeable part of a `run`, and
/// SQLite's own busy handler turned the other's wait into longer sleeps still. Short, the WAL
/// costs a checkpoint (two syncs) every few dozen writes instead.
pub(crate) const WAL_AUTOCHECKPOINT_PAGES: i64 = 128;

/// What the remedy for a damaged catalog is, in every message that reports one.
pub(crate) const REPAIR_HINT: &str =
    "run `dynocap doctor --repair` to rebuild it from the results and sandbox directories";

/// Why a catalog operation failed, before it becomes an [`Error`] that names the catalog.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The files are damaged (or are not files); a repair rebuilds them.
    Damaged(String),
    /// This user may not open the files (permissions, read-only filesystem).
    Inaccessible(String),
    /// Another process kept the database locked for longer than the busy timeout.
    Busy(String),
    /// Any other SQLite failure, with what was being done.
    Sqlite(String),
    /// A complete error already (a name conflict, a record file that could not be written).
    Other(Error),
}

impl Failure {
    /// Whether the catalog files themselves are the problem, so that moving them aside and
    /// rebuilding from the record files is the remedy.
    pub(crate) fn calls_for_repair(&self) -> bool {
        matches!(self, Self::Damaged(_) | Self::Inaccessible(_))
    }

    /// What was wrong, without the remedy (for a repair report).
    pub(crate) fn reason(&self) -> String {
        match self {
            Self::Damaged(reason)
            | Self::Inaccessible(reason)
            | Self::Busy(reason)
            | Self::Sqlite(reason) => reason.clone(),
            Self::Other(err) => err.message.clone(),
        }
    }

    pub(crate) fn into_error(self, catalog: &Path) -> Error {
        let path = catalog.to_owned();
        match self {
            Self::Damaged(reason) => CatalogFailure::Damaged { path, reason }.into(),
            Self::Inaccessible(reason) => CatalogFailure::Inaccessible { path, reason }.into(),
            Self::Busy(reason) => CatalogFailure::Busy { path, reason }.into(),
            Self::Sqlite(reason) => CatalogFailure::Sqlite { path, reason }.into(),
            Self::Other(err) => err,
        }
    }
}

/// What is wrong with the catalog's files, as the person running DynoCap reads it. The
/// SQLite error is already text here: [`classify`] sorted it by remedy.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CatalogFailure {
    #[error("the catalog {} is damaged ({reason}); {REPAIR_HINT}", .path.display())]
    Damaged { path: PathBuf, reason: String },
    #[error(
        "the catalog {} cannot be used ({reason}); give this user read and write access to it \
         and its directory, or {REPAIR_HINT}",
        .path.display()
    )]
    Inaccessible { path: PathBuf, reason: String },
    #[error(
        "the catalog {} stayed locked by another dynocap process for over {}s ({reason}); \
         retry, and if this persists look for a stuck dynocap process",
        .path.display(),
        BUSY_TIMEOUT.as_secs()
    )]
    Busy { path: PathBuf, reason: String },
    #[error("the catalog {}: {reason}", .path.display())]
    Sqlite { path: PathBuf, reason: String },
    #[error(
        "the catalog {} was written by a newer dynocap (schema {version}, this one knows {}); \
         upgrade dynocap",
        .path.display(),
        catalog::SCHEMA_VERSION
    )]
    NewerSchema { path: PathBuf, version: i64 },
    /// `found` is "schema N", or "an unversioned schema" for the builds before versions.
    #[error(
        "the catalog {} was written by a pre-release DynoCap ({found}; this one reads only \
         schema {}), and this DynoCap cannot read or upgrade it; it was left unchanged. Finish \
         or remove its sandboxes and tasks with that version, then move {} (DYNOCAP_HOME) \
         aside or point DYNOCAP_HOME at a new directory",
        .path.display(),
        catalog::SCHEMA_VERSION,
        .path.parent().unwrap_or(.path).display()
    )]
    PreRelease { path: PathBuf, found: String },
    #[error(
        "the catalog {} cannot use write-ahead logging (its journal mode stays {mode}); put \
         DYNOCAP_HOME on a local filesystem",
        .path.display()
    )]
    NoWal { path: PathBuf, mode: String },
    #[error(
        "the catalog {} kept being replaced while this process tried to write to it; retry",
        .path.display()
    )]
    KeptBeingReplaced { path: PathBuf },
    /// A repair moved the catalog aside and found a new one in its place: `lock` is the lock
    /// the other process did not take.
    #[error(
        "{} reappeared while it was being rebuilt: a dynocap that does not take {} is \
         running; stop it and repair again",
        .path.display(),
        .lock.display()
    )]
    Reappeared { path: PathBuf, lock: PathBuf },
}

impl Coded for CatalogFailure {
    /// The catalog is DynoCap's own state: what is wrong with it is for the person running
    /// DynoCap to fix (the messages say how), never a caller's request.
    fn code(&self) -> ErrorCode {
        match self {
            Self::Damaged { .. }
            | Self::Inaccessible { .. }
            | Self::Busy { .. }
            | Self::Sqlite { .. }
            | Self::NewerSchema { .. }
            | Self::PreRelease { .. }
            | Self::NoWal { .. }
            | Self::KeptBeingReplaced { .. }
            | Self::Reappeared { .. } => ErrorCode::Internal,
        }
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Self::Other(err)
    }
}

/// Sorts a SQLite error by what the user can do about it.
pub(crate) fn classify(err: rusqlite::Error) -> Failure {
    match &err {
        rusqlite::Error::SqliteFailure(failure, _) => match failure.code {
            Sqlite::DatabaseCorrupt | Sqlite::NotADatabase | Sqlite::SystemIoFailure => {
                Failure::Damaged(err.to_string())
            }
            Sqlite::CannotOpen | Sqlite::PermissionDenied | Sqlite::ReadOnly => {
                Failure::Inaccessible(err.to_string())
            }
            Sqlite::DatabaseBusy | Sqlite::DatabaseLocked => Failure::Busy(err.to_string()),
            _ => Failure::Sqlite(err.to_string()),
        },
        // A row this build cannot read back: written by hand or by a broken build.
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => {
            Failure::Damaged(format!("a record in it cannot be read: {err}"))
        }
        _ => Failure::Sqlite(err.to_string()),
    }
}

/// Which file a path is, as `fs::metadata` sees it: a replaced catalog is a new inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileIdentity {
    dev: u64,
    ino: u64,
}

impl FileIdentity {
    pub(crate) fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// An open catalog and which file it is.
pub(crate) struct Connected {
    pub(crate) conn: Connection,
    pub(crate) identity: FileIdentity,
}

impl Connected {
    /// Whether `path` still names the file this connection has open. After a repair it names
    /// the rebuilt catalog, and writes to the old one would be lost.
    pub(crate) fn is_current(&self, path: &Path) -> bool {
        FileIdentity::of(path) == Some(self.identity)
    }
}

/// What filling a new catalog from the record files did.
#[derive(Debug, Default)]
pub(crate) struct Import {
    /// The records now in the catalog, oldest first.
    pub restored: Vec<Record>,
    /// Record files that could not be used, and why.
    pub skipped: Vec<(PathBuf, String)>,
    /// Names bound in more than one record file: (id that lost it, name, id that kept it).
    /// The newest record keeps the name; the others are restored without one.
    pub released_names: Vec<(String, String, String)>,
}

/// Opens the catalog, creating it first if needed. Almost every open finds it made, and only
/// has to keep a repair from moving it aside meanwhile: the catalog lock shared does that, and
/// lets processes open at once (a CLI `run` and the supervisor it starts do). Only a catalog
/// to create takes the lock exclusively, so that processes opening a fresh home at once
/// create it once, in turn.
pub(crate) fn open(home: &Home) -> Result<Connected, Failure> {
    {
        let shared = catalog_lock::Shared::acquire(home)?;
        if let Some(connected) = connect_current(home, &shared)? {
            return Ok(connected);
        }
    }
    let lock = catalog_lock::Exclusive::acquire(home)?;
    Ok(connect(home, &lock)?.0)
}

/// The catalog, if it exists, is in WAL mode and has this build's schema: `None` when it needs
/// creating, which only a holder of the exclusive lock may do. That cannot happen while the
/// shared lock is held, so what this sees stays true.
fn connect_current(
    home: &Home,
    _lock: &catalog_lock::Shared,
) -> Result<Option<Connected>, Failure> {
    let path = home.catalog_path();
    preflight(&path)?;
    if !path.exists() {
        return Ok(None);
    }
    // Never creates the file: only the exclusive path does.
    let flags = rusqlite::OpenFlags::default() - rusqlite::OpenFlags::SQLITE_OPEN_CREATE;
    let conn = match Connection::open_with_flags(&path, flags) {
        Ok(conn) => conn,
        // Removed since the check by something other than dynocap (a repair needs the lock
        // exclusive): the exclusive path makes it anew, or says why it cannot.
        Err(rusqlite::Error::SqliteFailure(err, _)) if err.code == Sqlite::CannotOpen => {
            return Ok(None)
        }
        Err(err) => return Err(classify(err)),
    };
    if configure(&conn, &path)? == Schema::Missing || !in_wal_mode(&conn)? {
        return Ok(None);
    }
    finish_connect(conn, &path).map(Some)
}

/// [`open`] for a caller that already holds the lock; also tells what was imported when the
/// catalog was new (`None`: it was not).
pub(crate) fn connect(
    home: &Home,
    _lock: &catalog_lock::Exclusive,
) -> Result<(Connected, Option<Import>), Failure> {
    let path = home.catalog_path();
    preflight(&path)?;
    let mut conn = Connection::open(&path).map_err(classify)?;
    // Before anything that writes (the switch to WAL): a refused catalog stays as it was.
    let schema = configure(&conn, &path)?;
    ensure_wal(&conn, &path)?;
    let imported = match schema {
        Schema::Missing => {
            let imported = create(&mut conn, home)?;
            checkpoint(&conn);
            Some(imported)
        }
        Schema::Current => None,
    };
    Ok((finish_connect(conn, &path)?, imported))
}

/// What an opened catalog file holds, once [`configure`] has refused any other schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Schema {
    /// No schema yet: a new or empty file, to create and fill from the record files.
    Missing,
    /// [`catalog::SCHEMA_VERSION`].
    Current,
}

/// Sets up a new connection (no checkpoint on close, the busy timeout) and reads the schema
/// version, refusing any but this build's. It only reads: a refused catalog is left as it is.
fn configure(conn: &Connection, path: &Path) -> Result<Schema, Failure> {
    // Closing never checkpoints, so it never deletes the `-wal` and `-shm` either: SQLite
    // does both by file name, which would destroy the evidence of a damaged catalog (a
    // failed open closes too). Writers checkpoint instead (`Catalog::write_raw`).
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(classify)?;
    conn.busy_handler(Some(wait_while_busy)).map_err(classify)?;
    // The first read: it checks the header and picks up the WAL, if there is one.
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(classify)?;
    if version > catalog::SCHEMA_VERSION {
        return Err(Failure::Other(
            CatalogFailure::NewerSchema {
                path: path.to_owned(),
                version,
            }
            .into(),
        ));
    }
    if version == catalog::SCHEMA_VERSION {
        return Ok(Schema::Current);
    }
    // The builds before schema versions left `user_version` at 0 beside their table.
    let has_table = version == 0
        && conn
            .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sandboxes'")
            .and_then(|mut stmt| stmt.exists([]))
            .map_err(classify)?;
    if version == 0 && !has_table {
        return Ok(Schema::Missing);
    }
    Err(Failure::Other(pre_release(path, version)))
}

/// The refusal of a catalog written by an earlier pre-release DynoCap (schema `found`, 0 for
/// the builds before schema versions): this one has no upgrade from it.
fn pre_release(path: &Path, found: i64) -> Error {
    let found = match found {
        0 => "an unversioned schema".to_owned(),
        found => format!("schema {found}"),
    };
    CatalogFailure::PreRelease {
        path: path.to_owned(),
        found,
    }
    .into()
}

/// SQLite's busy handler: pauses before the next try of a locked catalog, or gives up (false)
/// once the pauses add up to [`BUSY_TIMEOUT`]. SQLite's own (`busy_timeout`) sleeps 1 ms
/// first and 2 ms next, far longer than what it usually waits for here: another process
/// rebuilding the WAL's index or committing a write, each a fraction of a millisecond.
fn wait_while_busy(tries_before: i32) -> bool {
    match busy_pause(u32::try_from(tries_before).unwrap_or(0)) {
        Some(pause) => {
            std::thread::sleep(pause);
            true
        }
        None => false,
    }
}

/// The pause before try `tries_before + 1` of a locked catalog: doubling from
/// [`FIRST_BUSY_PAUSE`] up to [`LONGEST_BUSY_PAUSE`], `None` once the pauses before it add
/// up to [`BUSY_TIMEOUT`].
fn busy_pause(tries_before: u32) -> Option<Duration> {
    // The pauses double for `doubling` tries, then stay at the longest.
    let doubling = (LONGEST_BUSY_PAUSE.as_micros() / FIRST_BUSY_PAUSE.as_micros())
        .next_power_of_two()
        .ilog2();
    let (doubled, longest) = if tries_before <= doubling {
        (tries_before, 0)
    } else {
        (doubling, tries_before - doubling)
    };
    // 1 + 2 + … + 2^(doubled - 1) first pauses, then the longest ones.
    let waited = FIRST_BUSY_PAUSE * ((1 << doubled) - 1) + LONGEST_BUSY_PAUSE * longest;
    (waited < BUSY_TIMEOUT).then(|| (FIRST_BUSY_PAUSE * (1 << doubled)).min(LONGEST_BUSY_PAUSE))
}

/// The settings of a connection to a ready catalog, and which file it has open.
fn finish_connect(conn: Connection, path: &Path) -> Result<Connected, Failure> {
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(classify)?;
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)
        .map_err(classify)?;
    let identity = FileIdentity::of(path)
        .ok_or_else(|| Failure::Damaged("it disappeared right after it was opened".to_owned()))?;
    Ok(Connected { conn, identity })
}

/// Copies what the WAL holds into the main file, so that a damaged WAL loses as little as
/// possible. Passive: it never waits, and when readers hold it back the next write catches up.
pub(crate) fn checkpoint(conn: &Connection) {
    let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
}

/// Refuses, with the reason, catalog files that SQLite would misuse or hang on: a directory,
/// a FIFO, a file this user may not write.
fn preflight(path: &Path) -> Result<(), Failure> {
    let sidecars = [
        (path.to_owned(), None),
        (suffixed(path, "-wal"), Some("write-ahead log")),
        (suffixed(path, "-shm"), Some("shared-memory index")),
    ];
    for (file, role) in sidecars {
        let whose = |what: &str| match role {
            None => format!("it is {what}"),
            Some(role) => format!("its {role} {} is {what}", file.display()),
        };
        let meta = match std::fs::metadata(&file) {
            Ok(meta) => meta,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(Failure::Inaccessible(format!("{}: {err}", file.display()))),
        };
        if meta.is_dir() {
            return Err(Failure::Damaged(whose("a directory, not a file")));
        }
        if !meta.is_file() {
            return Err(Failure::Damaged(whose("not a regular file")));
        }
        // Asked, not tried by opening: closing a descriptor of a file drops every POSIX lock
        // this process holds on it, and SQLite's own connections in this process (the
        // server's) hold theirs on the `-shm`. Without its lock there, the next process to
        // open the catalog took itself for the only one and reset the `-shm` under the
        // server's mapping, which died of SIGBUS.
        if let Err(errno) = nix::unistd::faccessat(
            nix::fcntl::AT_FDCWD,
            &file,
            nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
            nix::fcntl::AtFlags::AT_EACCESS,
        ) {
            let err = std::io::Error::from_raw_os_error(errno as i32);
            return Err(Failure::Inaccessible(format!("{}: {err}", file.display())));
        }
    }
    Ok(())
}

fn in_wal_mode(conn: &Connection) -> Result<bool, Failure> {
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .map_err(classify)?;
    Ok(mode.eq_ignore_ascii_case("wal"))
}

/// `path` with `suffix` appended to its file name: `catalog.db` → `catalog.db-wal`.
pub(crate) fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Switches to WAL unless the catalog already is. Only the first opener of a new catalog
/// switches, under the catalog lock: every other process opening it waits for that lock, so
/// none holds the database lock the switch needs (SQLite does not wait for it).
fn ensure_wal(conn: &Connection, path: &Path) -> Result<(), Failure> {
    if in_wal_mode(conn)? {
        return Ok(());
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(classify)?;
    if mode.eq_ignore_ascii_case("wal") {
        Ok(())
    } else {
        Err(Failure::Other(
            CatalogFailure::NoWal {
                path: path.to_owned(),
                mode,
            }
            .into(),
        ))
    }
}

/// Creates the schema and fills it from the record files, in one transaction.
fn create(conn: &mut Connection, home: &Home) -> Result<Import, Failure> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(classify)?;
    tx.execute_batch(catalog::SCHEMA).map_err(classify)?;
    let imported = import(&tx, home)?;
    tx.pragma_update(None, "user_version", catalog::SCHEMA_VERSION)
        .map_err(classify)?;
    tx.commit().map_err(classify)?;
    Ok(imported)
}

/// Inserts every readable record file into a new catalog. Names stay bound as the files say;
/// a name bound in two files (a crash between a release and a new start) stays with the
/// newest record.
fn import(conn: &Connection, home: &Home) -> Result<Import, Failure> {
    let mut report = Import::default();
    let mut found = Vec::new();
    for (path, record) in records::scan(home)? {
        match record {
            Ok(record) => found.push((path, record)),
            Err(err) => report.skipped.push((path, err.message)),
        }
    }
    found.sort_by(|(_, a), (_, b)| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    let mut ids = HashSet::new();
    // Bound name → the record holding it.
    let mut names: HashMap<String, String> = HashMap::new();
    for (path, mut record) in found {
        if !ids.insert(record.id.clone()) {
            report.skipped.push((
                path,
                format!("another record file also describes {}", record.id),
            ));
            continue;
        }
        if let Some(name) = record.name.clone() {
            if let Some(holder) = names.get(&name) {
                report
                    .released_names
                    .push((record.id.clone(), name, holder.clone()));
                record.name = None;
                records::save(home, &record)?;
            } else {
                names.insert(name, record.id.clone());
            }
        }
        catalog::insert_row(conn, &record)?;
        report.restored.push(record);
    }
    report.restored.reverse();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses start short, double up to the longest, and stop once they add up to the
    /// busy timeout.
    #[test]
    fn busy_pauses_double_to_the_longest_then_end_at_the_timeout() {
        assert_eq!(busy_pause(0), Some(FIRST_BUSY_PAUSE));
        assert_eq!(busy_pause(1), Some(FIRST_BUSY_PAUSE * 2));
        assert_eq!(busy_pause(2), Some(FIRST_BUSY_PAUSE * 4));
        let pauses: Vec<Duration> = (0..).map_while(busy_pause).collect();
        assert!(pauses.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(pauses.last(), Some(&LONGEST_BUSY_PAUSE));
        let total: Duration = pauses.iter().sum();
        assert!(
            total >= BUSY_TIMEOUT && total < BUSY_TIMEOUT + LONGEST_BUSY_PAUSE,
            "{total:?}"
        );
        // Each pause is what the ones before it left out of the sum.
        let mut waited = Duration::ZERO;
        for (tries, pause) in pauses.iter().enumerate() {
            assert!(waited < BUSY_TIMEOUT, "try {tries} after {waited:?}");
            waited += *pause;
        }
        assert_eq!(busy_pause(u32::MAX), None);
    }

    /// What `ensure_wal` relies on: after the first read, a new connection to a WAL catalog
    /// knows it is one, so later openers never attempt the switch.
    #[test]
    fn a_new_connection_sees_wal_after_its_first_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::at(dir.path().to_owned()).expect("home");
        drop(open(&home).expect("create"));
        let conn = Connection::open(home.catalog_path()).expect("open");
        let _: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .expect("read");
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |row| row.get(0))
            .expect("query");
        assert_eq!(mode, "wal");
    }

    #[test]
    fn errors_are_sorted_by_what_the_user_can_do() {
        let sqlite =
            |code: i32| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        assert!(
            matches!(classify(sqlite(11)), Failure::Damaged(_)),
            "SQLITE_CORRUPT"
        );
        assert!(
            matches!(classify(sqlite(26)), Failure::Damaged(_)),
            "SQLITE_NOTADB"
        );
        assert!(
            matches!(classify(sqlite(14)), Failure::Inaccessible(_)),
            "SQLITE_CANTOPEN"
        );
        assert!(
            matches!(classify(sqlite(8)), Failure::Inaccessible(_)),
            "SQLITE_READONLY"
        );
        assert!(
            matches!(classify(sqlite(5)), Failure::Busy(_)),
            "SQLITE_BUSY"
        );
        let path = Path::new("/h/catalog.db");
        let busy = classify(sqlite(5)).into_error(path).message;
        assert!(busy.contains("/h/catalog.db stayed locked"), "{busy}");
        assert!(!busy.contains("--repair"), "busy is not damage: {busy}");
    }
}
