//! The SQLite catalog: one row per sandbox (raw or task) with its settings, state and the
//! supervisor that owns it. Every process (CLI, MCP server, supervisors) opens it on its own;
//! WAL mode and a busy timeout let them share it.
//!
//! The catalog is an index: every change to a record is also written to the record's file
//! (`records.rs`) inside the same write transaction, so that a damaged or lost catalog can be
//! rebuilt (`dynocap doctor --repair`). A catalog replaced by a repair under a live process
//! (a supervisor keeps its catalog for the sandbox's life) is noticed and reopened before the
//! next operation, so no write lands in the old file.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use serde::{Deserialize, Serialize};

use crate::foundation::error::{Error, Result};
use crate::host::home::Home;
pub use crate::model::lifecycle::{Kind, ProcessId, State};
use crate::spec::Network;
use crate::store::catalog_file::{self, classify, CatalogFailure, Connected, Failure};
use crate::store::catalog_lock;
use crate::store::records;

/// One catalog row, and the content of its record file. The serde form is JSON only: the
/// detail is embedded as the JSON it is, and timestamps are RFC 3339 to the second, as the
/// catalog keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub id: String,
    pub kind: Kind,
    pub name: Option<String>,
    pub state: State,
    pub backend: String,
    pub network: Network,
    pub cpus: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    /// Size of the sandbox's disk.
    #[serde(rename = "diskMB")]
    pub disk_mb: u64,
    pub ttl_seconds: u64,
    #[serde(with = "rfc3339")]
    pub created_at: chrono::DateTime<chrono::Utc>,
    #[serde(with = "rfc3339")]
    pub expires_at: chrono::DateTime<chrono::Utc>,
    pub supervisor: Option<ProcessId>,
    /// Why a sandbox ended up `lost`, or other notes for the user.
    pub note: Option<String>,
    /// Kind-specific JSON (a task's start spec, source and result).
    #[serde(with = "embedded_json")]
    pub detail: Option<String>,
    /// What the sandbox may reach through the egress proxy, fixed when it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::model::egress_spec::EgressSpec>,
    /// The image the sandbox boots, fixed when it was created.
    pub image: crate::model::image_ref::ImageRef,
}

/// Serde for timestamps: RFC 3339 to the second, the form the catalog stores.
mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        time: &chrono::DateTime<chrono::Utc>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::timestamp(*time))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<chrono::DateTime<chrono::Utc>, D::Error> {
        let text = String::deserialize(deserializer)?;
        chrono::DateTime::parse_from_rfc3339(&text)
            .map(|time| time.with_timezone(&chrono::Utc))
            .map_err(|err| serde::de::Error::custom(format!("timestamp {text:?}: {err}")))
    }
}

/// Serde for a JSON text kept as a string: embedded as the JSON value it is, so a record file
/// reads as one document, and read back byte for byte.
mod embedded_json {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::value::RawValue;

    pub fn serialize<S: Serializer>(
        text: &Option<String>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match text {
            None => serializer.serialize_none(),
            Some(text) => {
                let raw: &RawValue = serde_json::from_str(text).map_err(|err| {
                    serde::ser::Error::custom(format!("the record's detail is not JSON: {err}"))
                })?;
                serializer.serialize_some(raw)
            }
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<String>, D::Error> {
        let raw = Option::<Box<RawValue>>::deserialize(deserializer)?;
        Ok(raw.map(|raw| raw.get().to_owned()))
    }
}

fn timestamp(time: chrono::DateTime<chrono::Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(crate) const SCHEMA: &str = "
CREATE TABLE sandboxes (
    id               TEXT PRIMARY KEY,
    kind             TEXT NOT NULL CHECK (kind IN ('raw', 'task')),
    name             TEXT,
    state            TEXT NOT NULL,
    backend          TEXT NOT NULL,
    network          TEXT NOT NULL,
    cpus             INTEGER NOT NULL,
    memory_mb        INTEGER NOT NULL,
    ttl_seconds      INTEGER NOT NULL,
    created_at       TEXT NOT NULL,
    expires_at       TEXT NOT NULL,
    supervisor_pid   INTEGER,
    supervisor_start INTEGER,
    note             TEXT,
    detail           TEXT,
    disk_mb          INTEGER NOT NULL,
    egress           TEXT,
    image            TEXT NOT NULL
);
-- A name is bound to at most one record until it is released (raw: destroy; task: rm).
CREATE UNIQUE INDEX sandboxes_name ON sandboxes (name) WHERE name IS NOT NULL;
";

/// The schema's version, kept in SQLite's `user_version`. The only one this build reads: the
/// earlier ones were pre-release, and a catalog of one is refused (`catalog_file::configure`).
pub(crate) const SCHEMA_VERSION: i64 = 6;

const COLUMNS: &str = "id, kind, name, state, backend, network, cpus, memory_mb, ttl_seconds, \
                       created_at, expires_at, supervisor_pid, supervisor_start, note, detail, disk_mb, \
                       egress, image";

/// How hard a write works to outlive the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lasting {
    /// Checkpointed into the main file (synced) before the write returns: tasks.
    Durable,
    /// Committed to the WAL only: raw sandboxes, whose guests a power loss ends anyway.
    Volatile,
}

impl Lasting {
    fn of(kind: Kind) -> Lasting {
        match kind {
            Kind::Task => Lasting::Durable,
            Kind::Raw => Lasting::Volatile,
        }
    }
}

/// Whether a change to a record is written to its record file as well as to the catalog.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RecordFile {
    Follow,
    /// The catalog alone: for a state so short-lived that a catalog rebuilt from the file
    /// without it reaches the same end (see [`Catalog::mark_ending`]).
    Keep,
}

/// A handle on the catalog of one `DYNOCAP_HOME`.
pub struct Catalog {
    home: Home,
    path: PathBuf,
    open: Mutex<Connected>,
}

impl Catalog {
    /// Opens the catalog of `home`, creating it (from the record files, if there are any)
    /// first when needed.
    pub fn open(home: &Home) -> Result<Self> {
        let path = home.catalog_path();
        let connected = catalog_file::open(home).map_err(|failure| failure.into_error(&path))?;
        Ok(Self {
            home: home.clone(),
            path,
            open: Mutex::new(connected),
        })
    }

    /// Inserts a new record and writes its file; a name already bound is a `conflict`.
    pub fn insert(&self, record: &Record) -> Result<()> {
        self.write(Lasting::of(record.kind), |conn| {
            insert_row(conn, record)?;
            records::save(&self.home, record)?;
            Ok(())
        })
    }

    pub fn get(&self, id: &str) -> Result<Option<Record>> {
        self.read(|conn| get_row(conn, id))
    }

    /// Finds a record by id or by its bound name.
    pub fn find(&self, name_or_id: &str) -> Result<Option<Record>> {
        self.read(|conn| {
            cached_row(
                conn,
                &format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1 OR name = ?1"),
                [name_or_id],
                from_row,
            )
            .optional()
        })
    }

    pub fn list(&self) -> Result<Vec<Record>> {
        self.read(list_rows)
    }

    pub fn set_supervisor(&self, id: &str, supervisor: ProcessId) -> Result<()> {
        self.modify(id, |record| {
            record.supervisor = Some(supervisor);
            true
        })
        .map(drop)
    }

    pub fn set_state(&self, id: &str, state: State, note: Option<&str>) -> Result<()> {
        self.modify(id, |record| {
            record.state = state;
            if let Some(note) = note {
                record.note = Some(note.to_owned());
            }
            true
        })
        .map(drop)
    }

    /// Replaces the record's note (`None` clears it: the state says all).
    pub fn set_note(&self, id: &str, note: Option<&str>) -> Result<()> {
        self.modify(id, |record| {
            record.note = note.map(str::to_owned);
            true
        })
        .map(drop)
    }

    /// Moves a record from `from` to `to` only if it is still in `from`; tells whether it did.
    /// Two processes noticing the same dead supervisor thus clean it up once.
    pub fn transition(&self, id: &str, from: State, to: State, note: Option<&str>) -> Result<bool> {
        self.modify(id, |record| {
            if record.state != from {
                return false;
            }
            record.state = to;
            if let Some(note) = note {
                record.note = Some(note.to_owned());
            }
            true
        })
    }

    pub fn set_detail(&self, id: &str, detail: &str) -> Result<()> {
        self.modify(id, |record| {
            record.detail = Some(detail.to_owned());
            true
        })
        .map(drop)
    }

    /// Unbinds the record's name so it can be used again; the record itself stays.
    pub fn release_name(&self, id: &str) -> Result<()> {
        self.modify(id, |record| {
            record.name = None;
            true
        })
        .map(drop)
    }

    /// Inserts new warm-pool records (made by `make`) until the pool, booting and booted,
    /// counts `target`; returns those inserted. Counted and inserted in one transaction, so
    /// processes topping the pool up at once never overfill it.
    pub fn top_up_pool(
        &self,
        target: usize,
        make: impl Fn() -> Result<Record>,
    ) -> Result<Vec<Record>> {
        self.write(Lasting::Volatile, |conn| {
            let pooled: i64 = cached_row(
                conn,
                "SELECT COUNT(*) FROM sandboxes WHERE state IN ('warming', 'pooled')",
                [],
                |row| row.get(0),
            )
            .map_err(classify)?;
            let have = usize::try_from(pooled).unwrap_or(usize::MAX);
            let mut added = Vec::new();
            for _ in have..target {
                let record = make().map_err(Failure::Other)?;
                insert_row(conn, &record)?;
                records::save(&self.home, &record)?;
                added.push(record);
            }
            Ok(added)
        })
    }

    /// Takes the oldest booted warm-pool sandbox of `backend` and `image` for a caller: `claim` turns its
    /// record into the caller's (name, limits, times, state). `None` if the pool has none
    /// ready.
    pub fn claim_pooled(
        &self,
        backend: &str,
        image: &crate::model::image_ref::ImageRef,
        claim: impl Fn(&mut Record),
    ) -> Result<Option<Record>> {
        let image = serde_json::to_string(image).expect("an image reference always serialises");
        self.write(Lasting::Volatile, |conn| {
            let found = cached_row(
                conn,
                &format!(
                    "SELECT {COLUMNS} FROM sandboxes WHERE state = 'pooled' \
                         AND backend = ?1 AND image = ?2 ORDER BY created_at LIMIT 1"
                ),
                [backend, image.as_str()],
                from_row,
            )
            .optional()
            .map_err(classify)?;
            let Some(mut record) = found else {
                return Ok(None);
            };
            claim(&mut record);
            if let Some(name) = &record.name {
                let taken: Option<i64> = cached_row(
                    conn,
                    "SELECT 1 FROM sandboxes WHERE name = ?1",
                    [name],
                    |row| row.get(0),
                )
                .optional()
                .map_err(classify)?;
                if taken.is_some() {
                    return Err(name_taken(conn, name));
                }
            }
            update_row(conn, &record)?;
            records::save(&self.home, &record)?;
            Ok(Some(record))
        })
    }

    /// Marks a raw sandbox `destroyed` and frees its name at once, while its supervisor
    /// finishes the teardown (which then deletes the record).
    pub fn release_as_destroyed(&self, id: &str) -> Result<()> {
        self.modify(id, |record| {
            record.state = State::Destroyed;
            record.name = None;
            true
        })
        .map(drop)
    }

    /// Removes a record. A raw sandbox's record file goes with it; a task's stays with its
    /// results (`rm --purge` removes those).
    pub fn delete(&self, id: &str) -> Result<()> {
        // Deleting a task's record keeps its results and record file; the row alone goes,
        // which a repair would drop again: nothing to make durable beyond the WAL.
        self.write(Lasting::Volatile, |conn| {
            let kind: Option<String> = cached_row(
                conn,
                "SELECT kind FROM sandboxes WHERE id = ?1",
                [id],
                |row| row.get(0),
            )
            .optional()
            .map_err(classify)?;
            cached_execute(conn, "DELETE FROM sandboxes WHERE id = ?1", [id]).map_err(classify)?;
            if kind.as_deref() == Some(Kind::Raw.as_str()) {
                records::remove(&self.home, Kind::Raw, id)?;
            }
            Ok(())
        })
    }

    /// Marks a running sandbox as ending (see [`Catalog::transition`]; `false` if it was not
    /// running). A task's record file says so too, as it follows every change. A raw
    /// sandbox's file keeps `running`: its supervisor kills the guest and records it
    /// `destroyed` (or `lost`) within milliseconds, and if it dies first, a catalog rebuilt
    /// from that file finds a running sandbox whose supervisor is dead and takes it over, as
    /// it would from `ending`. Rewriting the file is a new inode and a deleted one on the
    /// home's filesystem, on the path of every `destroy` (docs/performance.md).
    pub fn mark_ending(&self, id: &str) -> Result<bool> {
        let file = match Kind::of_id(id) {
            Some(Kind::Raw) => RecordFile::Keep,
            _ => RecordFile::Follow,
        };
        self.modify_as(id, file, |record| {
            if record.state != State::Running {
                return false;
            }
            record.state = State::Ending;
            true
        })
    }

    /// Applies `change` to a record (if it says the record changes) in the catalog and in its
    /// file. If the catalog is damaged the change still goes to the record file, the source a
    /// repair rebuilds from, so a supervisor finishing a task meanwhile does not lose its end.
    fn modify(&self, id: &str, change: impl Fn(&mut Record) -> bool) -> Result<bool> {
        self.modify_as(id, RecordFile::Follow, change)
    }

    fn modify_as(
        &self,
        id: &str,
        file: RecordFile,
        change: impl Fn(&mut Record) -> bool,
    ) -> Result<bool> {
        // Raw sandboxes never outlive the machine; only tasks' changes are checkpointed.
        let lasting = Lasting::of(Kind::of_id(id).unwrap_or(Kind::Task));
        let result = self.write_raw(lasting, |conn| {
            let Some(mut record) = get_row(conn, id).map_err(classify)? else {
                return Ok(false);
            };
            if !change(&mut record) {
                return Ok(false);
            }
            update_row(conn, &record)?;
            if file == RecordFile::Follow {
                records::save(&self.home, &record)?;
            }
            Ok(true)
        });
        result.map_err(|failure| {
            if file == RecordFile::Follow && failure.calls_for_repair() {
                self.modify_record_file(id, &change);
            }
            failure.into_error(&self.path)
        })
    }

    /// Best effort: the caller reports the catalog's failure either way.
    fn modify_record_file(&self, id: &str, change: &impl Fn(&mut Record) -> bool) {
        for kind in [Kind::Task, Kind::Raw] {
            if let Ok(mut record) = records::load(&self.home.record_path(kind, id)) {
                if change(&mut record) {
                    let _ = records::save(&self.home, &record);
                }
                return;
            }
        }
    }

    fn read<T>(&self, query: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let open = self.current().map_err(|f| f.into_error(&self.path))?;
        query(&open.conn).map_err(|err| classify(err).into_error(&self.path))
    }

    fn write<T>(
        &self,
        lasting: Lasting,
        change: impl FnOnce(&Connection) -> Result<T, Failure>,
    ) -> Result<T> {
        self.write_raw(lasting, change)
            .map_err(|failure| failure.into_error(&self.path))
    }

    /// Runs `change` in one write transaction on the current catalog file, holding the
    /// catalog lock shared so that a repair cannot move the file aside meanwhile. Record
    /// files are written inside the transaction: writers are serialised, so the last file
    /// written is the last change committed.
    fn write_raw<T>(
        &self,
        lasting: Lasting,
        change: impl FnOnce(&Connection) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let mut open = self.current()?;
        let mut attempts = 0;
        let _shared = loop {
            let shared = catalog_lock::Shared::acquire(&self.home)?;
            if open.is_current(&self.path) {
                break shared;
            }
            attempts += 1;
            if attempts == 3 {
                return Err(Failure::Other(
                    CatalogFailure::KeptBeingReplaced {
                        path: self.path.clone(),
                    }
                    .into(),
                ));
            }
            // Replaced between the check and the lock: reopen (which needs the lock exclusive).
            drop(shared);
            *open = catalog_file::open(&self.home)?;
        };
        let tx = open
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(classify)?;
        let value = change(&tx)?;
        tx.commit().map_err(classify)?;
        // With `synchronous=NORMAL` a commit is consistent after any crash but not synced:
        // a task's change is copied into the main file at once (synced), so that a damaged
        // WAL cannot lose it; a raw sandbox's waits for the checkpoint SQLite runs when the
        // WAL passes `catalog_file::WAL_AUTOCHECKPOINT_PAGES`, once every few dozen writes.
        if lasting == Lasting::Durable {
            catalog_file::checkpoint(&open.conn);
        }
        Ok(value)
    }

    /// The connection, reopened first if the catalog file was replaced since it was opened.
    fn current(&self) -> Result<MutexGuard<'_, Connected>, Failure> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !open.is_current(&self.path) {
            // Dropping the old connection touches nothing at this path: connections never
            // checkpoint or delete files on close (`catalog_file::connect`).
            *open = catalog_file::open(&self.home)?;
        }
        Ok(open)
    }
}

/// Runs `statement` with the record's fields as ?1..?18, in [`COLUMNS`] order.
fn with_row<T>(record: &Record, statement: impl FnOnce(&[&dyn rusqlite::ToSql]) -> T) -> T {
    let (created, expires) = (timestamp(record.created_at), timestamp(record.expires_at));
    let pid = record.supervisor.map(|p| p.pid);
    let start = record.supervisor.map(|p| p.start_ticks);
    statement(params![
        record.id,
        record.kind.as_str(),
        record.name,
        record.state.as_str(),
        record.backend,
        record.network.as_str(),
        record.cpus,
        record.memory_mb,
        record.ttl_seconds,
        created,
        expires,
        pid,
        start,
        record.note,
        record.detail,
        record.disk_mb,
        record
            .egress
            .as_ref()
            .map(|e| serde_json::to_string(e).expect("an egress spec always serialises")),
        serde_json::to_string(&record.image).expect("an image reference always serialises"),
    ])
}

/// The refusal of a second `name`: what holds the name now, and the command (CLI) or tool
/// (MCP) that frees it.
fn name_taken(conn: &Connection, name: &str) -> Failure {
    let holder = cached_row(
        conn,
        "SELECT id, state FROM sandboxes WHERE name = ?1",
        [name],
        |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
    )
    .optional()
    .map_err(classify);
    let holder = match holder {
        Ok(found) => found.and_then(|(id, state)| Some((Kind::of_id(&id)?, State::parse(&state)?))),
        Err(failure) => return failure,
    };
    Failure::Other(name_taken_by(name, holder))
}

/// The message of [`name_taken`] for a name held by a sandbox of `holder`'s kind and state
/// (`None`: by one that could not be read).
fn name_taken_by(name: &str, holder: Option<(Kind, State)>) -> Error {
    use crate::foundation::terms::Op;
    Error::worded(crate::foundation::error::ErrorCode::Conflict, |s| {
        let taken = format!("the name \"{name}\" is already taken");
        match holder {
            Some((Kind::Raw, _)) => format!(
                "{taken} by a raw sandbox; pick another name, or destroy that sandbox first \
                 with {}",
                s.op(Op::Destroy, name)
            ),
            Some((Kind::Task, State::Unsaved)) => format!(
                "{taken} by a task that ended without saving its work; pick another name, or \
                 save its work with {} and then free the name with {} (its results are kept)",
                s.op(Op::TaskFinish, name),
                s.op(Op::Rm, name)
            ),
            Some((Kind::Task, state)) if state.is_live() => format!(
                "{taken} by a running task; pick another name, or end it with {} and then free \
                 the name with {} (its results are kept)",
                s.op(Op::TaskFinish, name),
                s.op(Op::Rm, name)
            ),
            Some((Kind::Task, state)) => format!(
                "{taken} by a {} task; pick another name, or free it with {} (the task's \
                 results are kept)",
                state.as_str(),
                s.op(Op::Rm, name)
            ),
            None => format!(
                "{taken}; pick another name, or free it with {} (a task) or {} (a raw sandbox)",
                s.op(Op::Rm, name),
                s.op(Op::Destroy, name)
            ),
        }
    })
}

pub(crate) fn insert_row(conn: &Connection, record: &Record) -> Result<(), Failure> {
    let result = with_row(record, |row| {
        cached_execute(
            conn,
            &format!("INSERT INTO sandboxes ({COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18)"),
            row,
        )
    });
    match result {
        Ok(_) => Ok(()),
        Err(rusqlite::Error::SqliteFailure(err, _))
            if err.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            Err(name_taken(conn, record.name.as_deref().unwrap_or_default()))
        }
        Err(err) => Err(classify(err)),
    }
}

/// Writes every field of `record` but its id to its row.
fn update_row(conn: &Connection, record: &Record) -> Result<(), Failure> {
    with_row(record, |row| {
        cached_execute(
            conn,
            "UPDATE sandboxes SET kind = ?2, name = ?3, state = ?4, backend = ?5, network = ?6, \
             cpus = ?7, memory_mb = ?8, ttl_seconds = ?9, created_at = ?10, expires_at = ?11, \
             supervisor_pid = ?12, supervisor_start = ?13, note = ?14, detail = ?15, disk_mb = ?16, egress = ?17, image = ?18 WHERE id = ?1",
            row,
        )
    })
    .map_err(classify)?;
    Ok(())
}

/// Runs a one-row query through the connection's statement cache. The long-lived processes
/// (the MCP server, a supervisor) ask the same few queries on every call, and SQLite's parse
/// and plan of a statement cost more than the lookup it then makes.
fn cached_row<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    row: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, row)
}

/// Runs a change through the connection's statement cache (see [`cached_row`]).
fn cached_execute<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

fn get_row(conn: &Connection, id: &str) -> rusqlite::Result<Option<Record>> {
    cached_row(
        conn,
        &format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1"),
        [id],
        from_row,
    )
    .optional()
}

pub(crate) fn list_rows(conn: &Connection) -> rusqlite::Result<Vec<Record>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM sandboxes ORDER BY created_at, id"
    ))?;
    let rows = stmt.query_map([], from_row)?;
    rows.collect()
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<Record> {
    let text = |idx: usize| -> rusqlite::Result<String> { row.get(idx) };
    let bad = |idx: usize, what: &str| {
        rusqlite::Error::FromSqlConversionFailure(
            idx,
            rusqlite::types::Type::Text,
            format!("unknown {what} in catalog").into(),
        )
    };
    let time = |idx: usize| -> rusqlite::Result<chrono::DateTime<chrono::Utc>> {
        chrono::DateTime::parse_from_rfc3339(&text(idx)?)
            .map(|t| t.with_timezone(&chrono::Utc))
            .map_err(|_| bad(idx, "timestamp"))
    };
    let pid: Option<i32> = row.get(11)?;
    let start: Option<u64> = row.get(12)?;
    Ok(Record {
        id: text(0)?,
        kind: match text(1)?.as_str() {
            "raw" => Kind::Raw,
            "task" => Kind::Task,
            _ => return Err(bad(1, "kind")),
        },
        name: row.get(2)?,
        state: State::parse(&text(3)?).ok_or_else(|| bad(3, "state"))?,
        backend: text(4)?,
        network: Network::parse(&text(5)?).map_err(|_| bad(5, "network"))?,
        cpus: row.get(6)?,
        memory_mb: row.get(7)?,
        ttl_seconds: row.get(8)?,
        created_at: time(9)?,
        expires_at: time(10)?,
        supervisor: pid
            .zip(start)
            .map(|(pid, start_ticks)| ProcessId { pid, start_ticks }),
        note: row.get(13)?,
        detail: row.get(14)?,
        disk_mb: row.get(15)?,
        egress: row
            .get::<_, Option<String>>(16)?
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|_| bad(16, "egress"))?,
        image: serde_json::from_str(&text(17)?).map_err(|_| bad(17, "image"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    fn home() -> (tempfile::TempDir, Home) {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::at(dir.path().to_owned()).expect("home");
        (dir, home)
    }

    /// A record whose kind follows its id's prefix, as `new_id` makes them.
    fn record(id: &str, name: &str) -> Record {
        let now = chrono::Utc::now();
        Record {
            id: id.into(),
            kind: if id.starts_with("task-") {
                Kind::Task
            } else {
                Kind::Raw
            },
            name: Some(name.into()),
            state: State::Starting,
            backend: "jail".into(),
            network: Network::None,
            cpus: 1,
            memory_mb: 1024,
            disk_mb: 10_240,
            ttl_seconds: 1800,
            created_at: now,
            expires_at: now,
            supervisor: None,
            note: None,
            detail: None,
            egress: None,
            image: crate::model::image_ref::ImageRef::host(),
        }
    }

    fn file_of(home: &Home, id: &str) -> Option<Record> {
        let kind = if id.starts_with("task-") {
            Kind::Task
        } else {
            Kind::Raw
        };
        records::load(&home.record_path(kind, id)).ok()
    }

    /// The frames the catalog's WAL holds now: `mxFrame` of the WAL index's header at the
    /// start of the `-shm` file (SQLite's file format, "The WAL-Index Format"), which every
    /// commit updates. Read there because asking SQLite (`wal_checkpoint`) would checkpoint.
    fn wal_frames(home: &Home) -> u32 {
        let shm = std::fs::read(catalog_file::suffixed(&home.catalog_path(), "-shm")).expect("shm");
        u32::from_ne_bytes(shm[16..20].try_into().expect("4 bytes"))
    }

    /// Raw sandboxes' writes go to the WAL only, and a process that opens the catalog alone
    /// reads every frame of it: the WAL must stay short however many sandboxes come and go.
    #[test]
    fn the_wal_stays_short_through_many_raw_writes() {
        let (_dir, home) = home();
        let catalog = Catalog::open(&home).expect("open");
        let mut longest = 0;
        for i in 0..300 {
            let id = format!("sbx-{i:012}");
            catalog
                .insert(&record(&id, &format!("n{i}")))
                .expect("insert");
            catalog.set_state(&id, State::Running, None).expect("state");
            catalog.release_as_destroyed(&id).expect("release");
            catalog.delete(&id).expect("delete");
            longest = longest.max(wal_frames(&home));
        }
        // The frames of one transaction may go past the threshold before its commit copies them.
        assert!(longest > 0, "the writes went to a WAL");
        assert!(
            i64::from(longest) <= 2 * catalog_file::WAL_AUTOCHECKPOINT_PAGES,
            "the WAL grew to {longest} frames"
        );
    }

    /// A writer that finds the catalog locked by another connection waits for it, and goes on
    /// as soon as the other commits.
    #[test]
    fn a_writer_waits_for_another_connections_write() {
        let (_dir, home) = home();
        let catalog = Catalog::open(&home).expect("open");
        let mut other = rusqlite::Connection::open(home.catalog_path()).expect("open");
        let holding = other
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .expect("lock");
        let released = Arc::new(Barrier::new(2));
        let writer = {
            let released = Arc::clone(&released);
            std::thread::spawn(move || {
                released.wait();
                catalog.insert(&record("sbx-000000000001", "waited"))
            })
        };
        released.wait();
        std::thread::sleep(Duration::from_millis(30));
        holding.commit().expect("commit");
        writer
            .join()
            .expect("writer")
            .expect("the write waited for the lock");
        assert!(Catalog::open(&home)
            .expect("open")
            .find("waited")
            .expect("find")
            .is_some());
    }

    #[test]
    fn names_are_unique_until_released() {
        let (_dir, home) = home();
        let catalog = Catalog::open(&home).unwrap();
        catalog.insert(&record("sbx-1", "web")).unwrap();
        let err = catalog.insert(&record("sbx-2", "web")).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::Conflict);
        assert!(
            file_of(&home, "sbx-2").is_none(),
            "a refused insert writes no file"
        );
        assert_eq!(catalog.find("web").unwrap().unwrap().id, "sbx-1");
        assert_eq!(
            catalog.find("sbx-1").unwrap().unwrap().name.as_deref(),
            Some("web")
        );
        catalog.delete("sbx-1").unwrap();
        catalog.insert(&record("sbx-2", "web")).unwrap();
    }

    /// The refusal says what holds the name and names what frees it, as each surface calls
    /// it: `dynocap rm NAME` / `dynocap_rm` for a task, `dynocap destroy NAME` /
    /// `dynocap_destroy` for a raw sandbox.
    #[test]
    fn a_taken_name_names_what_holds_it_and_what_frees_it() {
        let (_dir, home) = home();
        let catalog = Catalog::open(&home).unwrap();
        let mut holders = Vec::new();
        for (id, name, state) in [
            ("task-1", "done", State::Finished),
            ("task-2", "busy", State::Running),
            ("task-3", "crashed", State::Unsaved),
            ("sbx-1", "box", State::Running),
        ] {
            let mut held = record(id, name);
            held.state = state;
            catalog.insert(&held).unwrap();
            holders.push(name);
        }
        // The operations to use are terms each surface spells (the binary's `wording`).
        let refused = |id: &str, name: &str| {
            let err = catalog.insert(&record(id, name)).unwrap_err();
            assert_eq!(err.code, crate::ErrorCode::Conflict);
            err.render(|term| format!("[{}]", term.plain()))
        };
        let text = refused("task-9", "done");
        assert!(text.contains("by a finished task") && text.contains("with [rm done]"));
        let text = refused("sbx-9", "busy");
        assert!(text.contains("running task") && text.contains("[task finish busy]"));
        assert!(text.contains("[rm busy]"), "{text}");
        let text = refused("task-9", "crashed");
        assert!(text.contains("without saving its work") && text.contains("[rm crashed]"));
        assert!(text.contains("[task finish crashed]"), "{text}");
        let text = refused("task-9", "box");
        assert!(text.contains("by a raw sandbox") && text.contains("[destroy box]"));
    }

    #[test]
    fn every_change_is_written_to_the_record_file() {
        let (_dir, home) = home();
        let catalog = Catalog::open(&home).unwrap();
        let task = record("task-1", "fix");
        catalog.insert(&task).unwrap();
        assert_eq!(
            file_of(&home, "task-1").unwrap().name.as_deref(),
            Some("fix")
        );

        let me = ProcessId::of(i32::try_from(std::process::id()).unwrap()).unwrap();
        catalog.set_supervisor("task-1", me).unwrap();
        catalog
            .transition("task-1", State::Starting, State::Running, None)
            .unwrap();
        catalog.set_detail("task-1", r#"{"k":1}"#).unwrap();
        catalog
            .set_state("task-1", State::Finished, Some("done"))
            .unwrap();
        catalog.release_name("task-1").unwrap();
        let from_file = file_of(&home, "task-1").unwrap();
        assert_eq!(from_file, catalog.get("task-1").unwrap().unwrap());
        assert_eq!(
            (
                from_file.state,
                from_file.supervisor,
                from_file.note.as_deref(),
                from_file.detail.as_deref(),
                from_file.name
            ),
            (
                State::Finished,
                Some(me),
                Some("done"),
                Some(r#"{"k":1}"#),
                None
            )
        );

        // A task's file stays with its results; a raw sandbox's goes with its record.
        catalog.delete("task-1").unwrap();
        assert!(file_of(&home, "task-1").is_some());
        catalog.insert(&record("sbx-1", "box")).unwrap();
        assert!(file_of(&home, "sbx-1").is_some());
        catalog.delete("sbx-1").unwrap();
        assert!(file_of(&home, "sbx-1").is_none());
        assert!(
            !home.sandbox_dir("sbx-1").exists(),
            "its emptied directory too"
        );
    }

    /// `ending` reaches a task's record file like every change; a raw sandbox's keeps
    /// `running`, and a catalog rebuilt from it takes the sandbox over from there.
    #[test]
    fn ending_reaches_a_tasks_record_file_and_not_a_raw_sandboxs() {
        let (_dir, home) = home();
        let catalog = Catalog::open(&home).unwrap();
        for id in ["task-1", "sbx-1"] {
            catalog.insert(&record(id, id)).unwrap();
            assert!(!catalog.mark_ending(id).unwrap(), "{id} is not running yet");
            catalog
                .transition(id, State::Starting, State::Running, None)
                .unwrap();
            assert!(catalog.mark_ending(id).unwrap());
            assert!(!catalog.mark_ending(id).unwrap(), "{id} is ending already");
            assert_eq!(catalog.get(id).unwrap().unwrap().state, State::Ending);
        }
        assert_eq!(file_of(&home, "task-1").unwrap().state, State::Ending);
        assert_eq!(file_of(&home, "sbx-1").unwrap().state, State::Running);
        // The next change that is not this short-lived one brings the file up to date.
        catalog.release_as_destroyed("sbx-1").unwrap();
        let from_file = file_of(&home, "sbx-1").unwrap();
        assert_eq!((from_file.state, from_file.name), (State::Destroyed, None));
    }

    /// A catalog of an earlier pre-release schema, with one finished task in it: the builds
    /// before schema versions (`user_version` 0, no `detail`) and the last one before this
    /// (5, no `image`, in WAL mode as it kept it).
    fn pre_release_catalog(home: &Home, version: i64) {
        let conn = Connection::open(home.catalog_path()).unwrap();
        let (extra_columns, extra_values) = match version {
            0 => ("", ""),
            _ => (
                ", detail TEXT, disk_mb INTEGER, egress TEXT",
                ", NULL, 10240, NULL",
            ),
        };
        conn.execute_batch(&format!(
            "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, kind TEXT NOT NULL, name TEXT, state TEXT NOT NULL,
             backend TEXT NOT NULL, network TEXT NOT NULL, cpus INTEGER NOT NULL, memory_mb INTEGER NOT NULL,
             ttl_seconds INTEGER NOT NULL, created_at TEXT NOT NULL, expires_at TEXT NOT NULL,
             supervisor_pid INTEGER, supervisor_start INTEGER, note TEXT{extra_columns});
             INSERT INTO sandboxes VALUES ('task-old', 'task', 'old', 'finished', 'jail', 'none', 2, 1024,
             1800, '2025-01-01T00:00:00Z', '2025-01-01T00:30:00Z', NULL, NULL, NULL{extra_values});"
        ))
        .unwrap();
        if version > 0 {
            conn.pragma_update(None, "journal_mode", "WAL").unwrap();
            conn.pragma_update(None, "user_version", version).unwrap();
        }
        // Closing the last connection folds the WAL into the main file and removes it.
    }

    #[test]
    fn a_pre_release_catalog_is_refused_and_left_unchanged() {
        for (version, found) in [(0, "an unversioned schema"), (5, "schema 5")] {
            let (_dir, home) = home();
            pre_release_catalog(&home, version);
            let path = home.catalog_path();
            let before = std::fs::read(&path).unwrap();
            let refusals = [
                Catalog::open(&home).err().expect("refused by an open"),
                catalog_lock::Exclusive::acquire(&home)
                    .and_then(|lock| {
                        catalog_file::connect(&home, &lock).map_err(|f| f.into_error(&path))
                    })
                    .err()
                    .expect("refused by a repair's open"),
            ];
            for err in refusals {
                assert_eq!(err.code, crate::ErrorCode::Internal);
                let expected = format!(
                    "the catalog {} was written by a pre-release DynoCap ({found}; this one reads \
                     only schema {SCHEMA_VERSION})",
                    path.display()
                );
                assert!(err.message.starts_with(&expected), "{err}");
                assert!(
                    err.message.contains(&format!(
                        "move {} (DYNOCAP_HOME) aside",
                        home.root().display()
                    )),
                    "{err}"
                );
                assert!(
                    !err.message.contains("--repair"),
                    "a repair is no fix: {err}"
                );
            }
            assert_eq!(std::fs::read(&path).unwrap(), before, "version {version}");
            for suffix in ["-wal", "-journal"] {
                let sidecar = catalog_file::suffixed(&path, suffix);
                let len = std::fs::metadata(&sidecar).map_or(0, |meta| meta.len());
                assert_eq!(len, 0, "{} was written", sidecar.display());
            }
            assert!(
                file_of(&home, "task-old").is_none(),
                "no record file written"
            );
        }
    }

    #[test]
    fn a_catalog_of_a_newer_dynocap_is_refused() {
        let (_dir, home) = home();
        Catalog::open(&home)
            .unwrap()
            .insert(&record("sbx-1", "a"))
            .unwrap();
        Connection::open(home.catalog_path())
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let err = Catalog::open(&home).err().unwrap();
        assert!(err.message.contains("newer dynocap"), "{err}");
    }

    #[test]
    fn transition_happens_once() {
        let (_dir, home) = home();
        let catalog = Catalog::open(&home).unwrap();
        catalog.insert(&record("sbx-1", "a")).unwrap();
        assert!(catalog
            .transition("sbx-1", State::Starting, State::Lost, Some("gone"))
            .unwrap());
        assert!(!catalog
            .transition("sbx-1", State::Starting, State::Lost, None)
            .unwrap());
        let rec = catalog.get("sbx-1").unwrap().unwrap();
        assert_eq!(
            (rec.state, rec.note.as_deref()),
            (State::Lost, Some("gone"))
        );
        assert_eq!(file_of(&home, "sbx-1").unwrap(), rec);
    }

    /// Opening a fresh home from many processes at once used to fail with "database is
    /// locked" while one of them switched the new catalog to WAL.
    #[test]
    fn many_first_opens_at_once_all_succeed() {
        const OPENERS: usize = 16;
        for round in 0..10 {
            let (_dir, home) = home();
            let start = Arc::new(Barrier::new(OPENERS));
            let openers: Vec<_> = (0..OPENERS)
                .map(|i| {
                    let (home, start) = (home.clone(), Arc::clone(&start));
                    std::thread::spawn(move || -> Result<()> {
                        start.wait();
                        let catalog = Catalog::open(&home)?;
                        catalog.insert(&record(&format!("sbx-{i}"), &format!("n{i}")))
                    })
                })
                .collect();
            for (i, opener) in openers.into_iter().enumerate() {
                let result = opener.join().expect("opener thread");
                assert!(result.is_ok(), "round {round}, opener {i}: {result:?}");
            }
            assert_eq!(Catalog::open(&home).unwrap().list().unwrap().len(), OPENERS);
        }
    }

    /// Opening a made catalog waits for no writer (nor for another open): a CLI `run` and
    /// the standby supervisor it starts open it at once, and the supervisor used to sleep for
    /// the lock meanwhile. A repair (the exclusive lock) still keeps every open out.
    #[test]
    fn opening_a_made_catalog_waits_only_for_a_repair() {
        let (_dir, home) = home();
        Catalog::open(&home)
            .unwrap()
            .insert(&record("sbx-1", "a"))
            .unwrap();
        let open_in_thread = || {
            let (done, opened) = std::sync::mpsc::channel();
            let home = home.clone();
            std::thread::spawn(move || {
                let found = Catalog::open(&home).and_then(|c| c.get("sbx-1"));
                let _ = done.send(found.map(|record| record.is_some()));
            });
            opened
        };

        let writing = catalog_lock::Shared::acquire(&home).unwrap();
        let opened = open_in_thread().recv_timeout(Duration::from_secs(20));
        drop(writing);
        assert!(
            matches!(opened, Ok(Ok(true))),
            "the open waited for a writer: {opened:?}"
        );

        let repairing = catalog_lock::Exclusive::acquire(&home).unwrap();
        let opened = open_in_thread();
        assert!(
            opened.recv_timeout(Duration::from_millis(300)).is_err(),
            "the catalog was opened while a repair held it"
        );
        drop(repairing);
        let after = opened.recv_timeout(Duration::from_secs(20));
        assert!(matches!(after, Ok(Ok(true))), "{after:?}");
    }

    /// A second open in a process that has the catalog open (the server's start guard, a
    /// repair check) leaves the first connection's locks alone. Its checks used to open and
    /// close the catalog's files, and closing any descriptor of a file drops every POSIX lock
    /// the process holds on it: without its lock on the `-shm`, the next process to open the
    /// catalog reset the `-shm` under the first connection's mapping, which then died of
    /// SIGBUS (the MCP server, now and then, after a failed task start).
    #[test]
    fn another_open_leaves_the_first_connections_locks() {
        use std::os::unix::fs::MetadataExt;
        let (_dir, home) = home();
        let first = Catalog::open(&home).unwrap();
        first.insert(&record("sbx-1", "a")).unwrap();
        assert!(first.get("sbx-1").unwrap().is_some());
        let shm = catalog_file::suffixed(&home.catalog_path(), "-shm");
        let inode = std::fs::metadata(&shm).expect("the -shm exists").ino();
        let me = std::process::id().to_string();
        let locks_held = || {
            std::fs::read_to_string("/proc/locks")
                .expect("/proc/locks")
                .lines()
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.get(1) == Some(&"POSIX")
                        && fields.get(4) == Some(&me.as_str())
                        && fields
                            .get(5)
                            .and_then(|id| id.rsplit(':').next())
                            .is_some_and(|ino| ino == inode.to_string())
                })
                .count()
        };
        assert!(locks_held() > 0, "SQLite holds no lock on the -shm");
        drop(Catalog::open(&home).unwrap());
        assert!(
            locks_held() > 0,
            "a second open dropped the first connection's locks on the -shm"
        );
        assert!(first.get("sbx-1").unwrap().is_some());
    }

    /// A catalog with three records, all in its main file.
    fn populated() -> (tempfile::TempDir, Home, Vec<Record>) {
        let (dir, home) = home();
        let catalog = Catalog::open(&home).unwrap();
        for (id, name) in [("task-a", "a"), ("task-b", "b"), ("sbx-c", "c")] {
            catalog.insert(&record(id, name)).unwrap();
            // Enough bytes per record that the file spans pages a truncation can cut off.
            let filler = format!(r#"{{"filler":"{}"}}"#, ".".repeat(3000));
            catalog.set_detail(id, &filler).unwrap();
        }
        let made = catalog.list().unwrap();
        assert_eq!(made.len(), 3);
        drop(catalog);
        // Fold the WAL into the main file and remove it, so damage to one file is just that.
        let plain = Connection::open(home.catalog_path()).unwrap();
        plain
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        drop(plain);
        assert!(!catalog_file::suffixed(&home.catalog_path(), "-wal").exists());
        (dir, home, made)
    }

    fn damaged_message(home: &Home) -> String {
        let outcome = Catalog::open(home).and_then(|c| c.list());
        let err = outcome.expect_err("a damaged catalog is reported, not read");
        assert_eq!(err.code, crate::ErrorCode::Internal);
        let path = home.catalog_path().display().to_string();
        assert!(
            err.message.contains(&path) && err.message.contains("`dynocap doctor --repair`"),
            "the message names the file and the remedy: {err}"
        );
        err.message
    }

    #[test]
    fn damage_is_reported_with_the_file_and_the_remedy() {
        let (_dir, home, made) = populated();
        let path = home.catalog_path();
        let good = std::fs::read(&path).unwrap();
        assert!(
            good.len() >= 4 * 4096,
            "enough pages to truncate: {}",
            good.len()
        );
        // Each case starts from the good main file alone (a failed open may leave a WAL).
        let reset = |main: &[u8]| {
            for suffix in ["-wal", "-shm"] {
                let _ = std::fs::remove_file(catalog_file::suffixed(&path, suffix));
            }
            std::fs::write(&path, main).unwrap();
        };

        reset(&good[..good.len() / 2]);
        let msg = damaged_message(&home);
        assert!(
            msg.contains("is damaged (database disk image is malformed)"),
            "{msg}"
        );

        let noise: Vec<u8> = (0..good.len()).map(|_| rand::random::<u8>()).collect();
        reset(&noise);
        let msg = damaged_message(&home);
        assert!(msg.contains("is damaged (file is not a database)"), "{msg}");

        reset(&good);
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let msg = damaged_message(&home);
        assert!(
            msg.contains("is damaged (it is a directory, not a file)"),
            "{msg}"
        );
        std::fs::remove_dir(&path).unwrap();

        reset(&good);
        let wal = catalog_file::suffixed(&path, "-wal");
        std::fs::create_dir(&wal).unwrap();
        let msg = damaged_message(&home);
        assert!(
            msg.contains(&format!(
                "its write-ahead log {} is a directory",
                wal.display()
            )),
            "{msg}"
        );
        std::fs::remove_dir(&wal).unwrap();
        assert_eq!(Catalog::open(&home).unwrap().list().unwrap(), made);
    }

    #[test]
    fn an_empty_or_missing_catalog_is_rebuilt_from_the_record_files() {
        let (_dir, home, made) = populated();
        let path = home.catalog_path();
        std::fs::write(&path, b"").unwrap();
        assert_eq!(Catalog::open(&home).unwrap().list().unwrap(), made);
        std::fs::remove_file(&path).unwrap();
        let catalog = Catalog::open(&home).unwrap();
        assert_eq!(catalog.list().unwrap(), made);
        let err = catalog.insert(&record("sbx-d", "a")).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::Conflict, "names stay bound");
    }

    #[test]
    fn a_name_bound_twice_in_record_files_stays_with_the_newest() {
        let (_dir, home) = home();
        let mut old = record("sbx-old", "web");
        old.created_at -= chrono::TimeDelta::seconds(60);
        records::save(&home, &old).unwrap();
        records::save(&home, &record("sbx-new", "web")).unwrap();
        let catalog = Catalog::open(&home).unwrap();
        assert_eq!(catalog.find("web").unwrap().unwrap().id, "sbx-new");
        assert_eq!(catalog.get("sbx-old").unwrap().unwrap().name, None);
        assert_eq!(
            file_of(&home, "sbx-old").unwrap().name,
            None,
            "the file agrees"
        );
    }

    /// Damaged WAL or shared-memory files either read back everything or are reported as
    /// damage; never a silently different catalog.
    #[test]
    fn a_damaged_wal_or_shm_is_read_correctly_or_reported() {
        for sidecar in ["-wal", "-shm"] {
            let (_dir, home, made) = populated();
            // A live process keeps the WAL and the shared-memory index in use.
            let holder = Catalog::open(&home).unwrap();
            holder.list().unwrap();
            let file = catalog_file::suffixed(&home.catalog_path(), sidecar);
            let size = usize::try_from(std::fs::metadata(&file).unwrap().len()).unwrap();
            let noise: Vec<u8> = (0..size).map(|_| rand::random::<u8>()).collect();
            std::fs::write(&file, noise).unwrap();
            match Catalog::open(&home).and_then(|c| c.list()) {
                Ok(read) => assert_eq!(read, made, "{sidecar}"),
                Err(_) => {
                    damaged_message(&home);
                }
            }
            drop(holder);
        }
    }

    #[test]
    fn a_catalog_replaced_under_an_open_handle_is_reopened() {
        let (_dir, home, _) = populated();
        let held = Catalog::open(&home).unwrap();
        held.list().unwrap();
        // What a repair does: the old files aside, a new catalog from the record files.
        let path = home.catalog_path();
        for suffix in ["-wal", "-shm", ""] {
            let from = catalog_file::suffixed(&path, suffix);
            if from.exists() {
                std::fs::rename(
                    &from,
                    catalog_file::suffixed(&home.root().join("old.db"), suffix),
                )
                .unwrap();
            }
        }
        let fresh = Catalog::open(&home).unwrap();
        held.set_state("task-a", State::Finished, None).unwrap();
        assert_eq!(
            fresh.get("task-a").unwrap().unwrap().state,
            State::Finished,
            "the write went to the new catalog"
        );
        drop(held);
        assert!(
            catalog_file::suffixed(&path, "-wal").exists(),
            "closing the old handle left the new catalog's WAL alone"
        );
        assert_eq!(fresh.list().unwrap().len(), 3);
    }

    #[test]
    fn a_change_on_a_damaged_catalog_still_reaches_the_record_file() {
        let (_dir, home, _) = populated();
        let held = Catalog::open(&home).unwrap();
        let path = home.catalog_path();
        drop(
            std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&path)
                .unwrap(),
        );
        std::fs::write(&path, vec![0x55u8; 8192]).unwrap();
        let err = held
            .set_state("task-b", State::Expired, Some("expired after its TTL"))
            .unwrap_err();
        assert!(err.message.contains("doctor --repair"), "{err}");
        let from_file = file_of(&home, "task-b").unwrap();
        assert_eq!(
            (from_file.state, from_file.note.as_deref()),
            (State::Expired, Some("expired after its TTL"))
        );
    }
}
