//! The SQLite catalog: one row per sandbox (raw or task) with its settings, state and the
//! supervisor that owns it. Every process (CLI, MCP server, supervisors) opens it on its own;
//! WAL mode and a busy timeout let them share it.

use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, Result};
use crate::spec::Network;

/// Lifecycle states, as CONTRACT.md names them (plus `starting` while a supervisor boots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Starting,
    Running,
    Finished,
    Expired,
    Destroyed,
    Lost,
    /// A task whose guest ended before its work could be saved (a dead agent, a killed
    /// supervisor, a full disk). Its writable layer is kept; `task finish` recovers it.
    Unsaved,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Expired => "expired",
            Self::Destroyed => "destroyed",
            Self::Lost => "lost",
            Self::Unsaved => "unsaved",
        }
    }

    fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "starting" => Self::Starting,
            "running" => Self::Running,
            "finished" => Self::Finished,
            "expired" => Self::Expired,
            "destroyed" => Self::Destroyed,
            "lost" => Self::Lost,
            "unsaved" => Self::Unsaved,
            _ => return None,
        })
    }

    /// A supervisor is (supposed to be) running for the sandbox.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Starting | Self::Running)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Raw,
    Task,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::Task => "task",
        }
    }
}

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
}

/// A process identity that survives pid reuse: the pid plus its start time in clock ticks
/// since boot (field 22 of /proc/PID/stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessId {
    pub pid: i32,
    pub start_ticks: u64,
}

impl ProcessId {
    pub fn of(pid: i32) -> Option<Self> {
        Some(Self {
            pid,
            start_ticks: process_start_ticks(pid)?,
        })
    }

    /// The same process is still running (not a zombie, not a reused pid).
    pub fn is_alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        let Some((state, start)) = parse_stat(&stat) else {
            return false;
        };
        state != 'Z' && state != 'X' && start == self.start_ticks
    }
}

fn process_start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, start)| start)
}

/// Returns (state, starttime) from a /proc/PID/stat line. The command name may contain
/// spaces and parentheses, so fields are counted from the last ')'.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    // starttime is field 22 overall; after "pid (comm)" the state is field 3.
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
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

pub struct Catalog {
    conn: Connection,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandboxes (
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
    detail           TEXT
);
-- A name is bound to at most one record until it is released (raw: destroy; task: rm).
CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_name ON sandboxes (name) WHERE name IS NOT NULL;
";

/// Schema revision, kept in SQLite's `user_version`. Revision 1 lacked `detail`.
const SCHEMA_VERSION: i64 = 2;

/// Brings a catalog written by an older dynocap up to [`SCHEMA_VERSION`]; refuses one written
/// by a newer dynocap rather than misreading it.
fn migrate(conn: &Connection) -> Result<()> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .context("reading the catalog version")?;
    if version > SCHEMA_VERSION {
        return Err(Error::internal(format!(
            "the catalog was written by a newer dynocap (schema {version}, this one knows {SCHEMA_VERSION}); upgrade dynocap"
        )));
    }
    let has_detail = conn
        .prepare("SELECT 1 FROM pragma_table_info('sandboxes') WHERE name = 'detail'")
        .and_then(|mut stmt| stmt.exists([]))
        .context("inspecting the catalog")?;
    if !has_detail {
        conn.execute_batch("ALTER TABLE sandboxes ADD COLUMN detail TEXT")
            .context("upgrading the catalog (adding detail)")?;
    }
    if version != SCHEMA_VERSION {
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .context("upgrading the catalog")?;
    }
    Ok(())
}

const COLUMNS: &str = "id, kind, name, state, backend, network, cpus, memory_mb, ttl_seconds, \
                       created_at, expires_at, supervisor_pid, supervisor_start, note, detail";

impl Catalog {
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)
            .context(format_args!("opening the catalog {}", path.display()))?;
        conn.busy_timeout(Duration::from_secs(30))
            .context("configuring the catalog")?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .context("enabling WAL on the catalog")?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .context("configuring the catalog")?;
        conn.execute_batch(SCHEMA)
            .context("creating the catalog schema")?;
        migrate(&conn)?;
        Ok(Self { conn })
    }

    /// Inserts a new record; a name already bound is a `conflict`.
    pub fn insert(&self, record: &Record) -> Result<()> {
        let result = self.conn.execute(
            &format!("INSERT INTO sandboxes ({COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15)"),
            params![
                record.id,
                record.kind.as_str(),
                record.name,
                record.state.as_str(),
                record.backend,
                record.network.as_str(),
                record.cpus,
                record.memory_mb,
                record.ttl_seconds,
                timestamp(record.created_at),
                timestamp(record.expires_at),
                record.supervisor.map(|p| p.pid),
                record.supervisor.map(|p| p.start_ticks),
                record.note,
                record.detail,
            ],
        );
        match result {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(err, _))
                if err.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(Error::conflict(format!(
                    "the name \"{}\" is already taken; pick another name or remove the existing one first",
                    record.name.as_deref().unwrap_or_default()
                )))
            }
            Err(err) => Err(Error::internal(format!("writing the catalog: {err}"))),
        }
    }

    pub fn get(&self, id: &str) -> Result<Option<Record>> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1"),
                [id],
                from_row,
            )
            .optional()
            .context("reading the catalog")
    }

    /// Finds a record by id or by its bound name.
    pub fn find(&self, name_or_id: &str) -> Result<Option<Record>> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1 OR name = ?1"),
                [name_or_id],
                from_row,
            )
            .optional()
            .context("reading the catalog")
    }

    pub fn list(&self) -> Result<Vec<Record>> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM sandboxes ORDER BY created_at, id"
            ))
            .context("reading the catalog")?;
        let rows = stmt
            .query_map([], from_row)
            .context("reading the catalog")?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .context("reading the catalog")
    }

    pub fn set_supervisor(&self, id: &str, supervisor: ProcessId) -> Result<()> {
        self.conn
            .execute(
                "UPDATE sandboxes SET supervisor_pid = ?2, supervisor_start = ?3 WHERE id = ?1",
                params![id, supervisor.pid, supervisor.start_ticks],
            )
            .context("writing the catalog")?;
        Ok(())
    }

    pub fn set_state(&self, id: &str, state: State, note: Option<&str>) -> Result<()> {
        self.conn
            .execute(
                "UPDATE sandboxes SET state = ?2, note = COALESCE(?3, note) WHERE id = ?1",
                params![id, state.as_str(), note],
            )
            .context("writing the catalog")?;
        Ok(())
    }

    /// Moves a record from `from` to `to` only if it is still in `from`; tells whether it did.
    /// Two processes noticing the same dead supervisor thus clean it up once.
    pub fn transition(&self, id: &str, from: State, to: State, note: Option<&str>) -> Result<bool> {
        let changed = self
            .conn
            .execute(
                "UPDATE sandboxes SET state = ?3, note = COALESCE(?4, note) WHERE id = ?1 AND state = ?2",
                params![id, from.as_str(), to.as_str(), note],
            )
            .context("writing the catalog")?;
        Ok(changed == 1)
    }

    pub fn set_detail(&self, id: &str, detail: &str) -> Result<()> {
        self.conn
            .execute(
                "UPDATE sandboxes SET detail = ?2 WHERE id = ?1",
                params![id, detail],
            )
            .context("writing the catalog")?;
        Ok(())
    }

    /// Unbinds the record's name so it can be used again; the record itself stays.
    pub fn release_name(&self, id: &str) -> Result<()> {
        self.conn
            .execute("UPDATE sandboxes SET name = NULL WHERE id = ?1", [id])
            .context("writing the catalog")?;
        Ok(())
    }

    pub fn delete(&self, id: &str) -> Result<()> {
        self.conn
            .execute("DELETE FROM sandboxes WHERE id = ?1", [id])
            .context("writing the catalog")?;
        Ok(())
    }
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, name: &str) -> Record {
        let now = chrono::Utc::now();
        Record {
            id: id.into(),
            kind: Kind::Raw,
            name: Some(name.into()),
            state: State::Starting,
            backend: "jail".into(),
            network: Network::None,
            cpus: 1,
            memory_mb: 1024,
            ttl_seconds: 1800,
            created_at: now,
            expires_at: now,
            supervisor: None,
            note: None,
            detail: None,
        }
    }

    #[test]
    fn names_are_unique_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(&dir.path().join("c.db")).unwrap();
        catalog.insert(&record("sbx-1", "web")).unwrap();
        let err = catalog.insert(&record("sbx-2", "web")).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::Conflict);
        assert_eq!(catalog.find("web").unwrap().unwrap().id, "sbx-1");
        assert_eq!(
            catalog.find("sbx-1").unwrap().unwrap().name.as_deref(),
            Some("web")
        );
        catalog.delete("sbx-1").unwrap();
        catalog.insert(&record("sbx-2", "web")).unwrap();
    }

    #[test]
    fn an_old_catalog_is_upgraded_and_a_newer_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, kind TEXT NOT NULL, name TEXT, state TEXT NOT NULL,
                 backend TEXT NOT NULL, network TEXT NOT NULL, cpus INTEGER NOT NULL, memory_mb INTEGER NOT NULL,
                 ttl_seconds INTEGER NOT NULL, created_at TEXT NOT NULL, expires_at TEXT NOT NULL,
                 supervisor_pid INTEGER, supervisor_start INTEGER, note TEXT);",
            )
            .unwrap();
        }
        let catalog = Catalog::open(&path).unwrap();
        catalog.insert(&record("sbx-1", "a")).unwrap();
        assert_eq!(catalog.list().unwrap().len(), 1);
        drop(catalog);
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let err = Catalog::open(&path).err().unwrap();
        assert!(err.message.contains("newer dynocap"), "{err}");
    }

    #[test]
    fn transition_happens_once() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(&dir.path().join("c.db")).unwrap();
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
    }

    #[test]
    fn own_process_is_alive_and_stat_parses_odd_names() {
        let me = ProcessId::of(std::process::id() as i32).unwrap();
        assert!(me.is_alive());
        assert!(!ProcessId {
            start_ticks: me.start_ticks + 1,
            ..me
        }
        .is_alive());
        let stat = "42 (a) b (c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 20";
        assert_eq!(parse_stat(stat), Some(('S', 777)));
    }
}
