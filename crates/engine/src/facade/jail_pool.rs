//! The home's reflink pool (`DYNOCAP_JAIL_POOL_MB`) as the user sees it and takes it away:
//! `dynocap doctor`'s row and `dynocap jail-pool`. The pool itself, and why it exists, are
//! the host layer's (`host::jail_pool`); this adds the catalog's names for its sandboxes.
//!
//! Use an [`Engine`] on a home from `Home::without_pool`: one from `Home::from_config` makes
//! and mounts the pool first, which a look at it must not, and its removal need not.

use crate::facade::sandboxes::Engine;
use crate::foundation::error::Result;
use crate::host::jail_pool;
use crate::store::catalog::{Kind, Record};

pub use crate::host::disk_room::HEADROOM_MB;
pub use crate::host::jail_pool::{PoolRemoved, PoolRoom, PoolState, NEARLY_FULL_PERCENT};

/// A sandbox on the pool, as the catalog knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSandbox {
    pub id: String,
    /// Its name; none for a nameless task, or a directory the catalog has no record of.
    pub name: Option<String>,
    /// `task` or `raw`; none without a record.
    pub kind: Option<String>,
    /// Its state (`running`, `unsaved`, ...); none without a record.
    pub state: Option<String>,
}

/// The pool and the sandboxes on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JailPool {
    #[serde(flatten)]
    pub pool: PoolState,
    #[serde(rename = "sandboxes")]
    pub on_it: Vec<PoolSandbox>,
}

impl Engine {
    /// Whether the jail's checkpoints and forks on this home are clones (its sandboxes'
    /// filesystem shares extents: XFS with reflink, btrfs, or the reflink pool mounted on it)
    /// rather than copies of what each task wrote. Makes and mounts nothing.
    pub fn jail_disks_clone(&self) -> bool {
        let sandboxes = self.home().root().join("sandboxes");
        let dir = if sandboxes.is_dir() {
            sandboxes
        } else {
            self.home().root().to_owned()
        };
        dynocap_backend_jail::reflinks(&dir)
    }

    /// The home's reflink pool, if it is configured or made. Makes and mounts nothing.
    pub fn jail_pool(&self) -> Result<Option<JailPool>> {
        let configured = jail_pool::parse_mb(self.config().home.jail_pool_mb.as_deref())?;
        let Some(pool) = jail_pool::state(self.home().root(), configured)? else {
            return Ok(None);
        };
        let records = self.pool_records(&pool.sandboxes);
        let on_it = pool
            .sandboxes
            .iter()
            .map(|id| {
                let record = records.iter().find(|r| &r.id == id);
                PoolSandbox {
                    id: id.clone(),
                    name: record.and_then(|r| r.name.clone()),
                    kind: record.map(|r| kind(r.kind).to_owned()),
                    state: record.map(|r| r.state.as_str().to_owned()),
                }
            })
            .collect();
        Ok(Some(JailPool { pool, on_it }))
    }

    /// Removes the home's reflink pool (see `host::jail_pool::remove`): refused, naming them,
    /// while sandboxes live on it.
    pub fn jail_pool_rm(&self) -> Result<PoolRemoved> {
        let configured = jail_pool::parse_mb(self.config().home.jail_pool_mb.as_deref())?;
        let root = self.home().root();
        let ids = jail_pool::state(root, configured)?
            .map(|pool| pool.sandboxes)
            .unwrap_or_default();
        let records = self.pool_records(&ids);
        jail_pool::remove(root, configured, |id| {
            match records.iter().find(|r| r.id == id) {
                Some(r) => match &r.name {
                    Some(name) => format!("{} {name} ({id}, {})", kind(r.kind), r.state.as_str()),
                    None => format!("{} {id} ({})", kind(r.kind), r.state.as_str()),
                },
                None => format!("{id} (no record: a leftover directory)"),
            }
        })
    }

    /// The catalog's records of `ids`; none when there are no ids or the catalog cannot be
    /// read (the ids still name the sandboxes).
    fn pool_records(&self, ids: &[String]) -> Vec<Record> {
        if ids.is_empty() {
            return Vec::new();
        }
        self.catalog()
            .and_then(|catalog| catalog.list())
            .map(|records| {
                records
                    .into_iter()
                    .filter(|r| ids.contains(&r.id))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn kind(kind: Kind) -> &'static str {
    match kind {
        Kind::Task => "task",
        Kind::Raw => "raw sandbox",
    }
}
