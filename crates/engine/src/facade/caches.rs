//! The projects' package caches as `dynocap cache` shows and clears them (the caches
//! themselves are the host layer's `project_cache`): each cache with its project, size, last
//! use and the tasks of that project the catalog holds; removing one, refused while a live
//! task of its project has it.

use serde::Serialize;

use crate::facade::sandboxes::{find, rfc3339, Engine};
use crate::foundation::error::{Error, Result};
use crate::host::project_cache::{self, CacheInfo};
use crate::model::task_spec::TaskDetail;
use crate::store::catalog::{Kind, Record};

/// One project's cache, as `dynocap cache ls` lists it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheEntry {
    /// The cache's id: its directory's name under `caches/`.
    pub id: String,
    /// `path` or `repository`; `null` when its `project.json` is unreadable.
    pub kind: Option<String>,
    /// The canonical project directory, or the repository as `host/path`.
    pub project: Option<String>,
    /// Where it is on the host.
    pub path: String,
    /// Bytes its files take on the host's disk.
    pub bytes: u64,
    /// When a task of the project last started with it (RFC 3339).
    pub last_used: Option<String>,
    /// The tasks of the project the catalog holds (names, else ids), live or finished.
    pub tasks: Vec<String>,
    /// The live ones among them, which have it now.
    pub in_use_by: Vec<String>,
}

/// What `dynocap cache rm` removed.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheRmResult {
    pub removed: Vec<CacheEntry>,
}

impl Engine {
    /// Every project's cache in this home.
    pub fn caches(&self) -> Result<Vec<CacheEntry>> {
        let records = self.catalog()?.list()?;
        project_cache::list(self.home().root())?
            .into_iter()
            .map(|info| Ok(self.entry(info, &records)))
            .collect()
    }

    /// The cache of `target`'s project: a task's (name or id), or a cache's id or project
    /// (its directory or `host/path`), as [`Engine::caches`] lists it.
    pub fn cache_of(&self, target: &str) -> Result<CacheEntry> {
        let caches = self.caches()?;
        let matching: Vec<&CacheEntry> = caches
            .iter()
            .filter(|c| c.id == target || c.project.as_deref() == Some(target))
            .collect();
        if let [one] = matching[..] {
            return Ok(one.clone());
        }
        let catalog = self.catalog()?;
        if let Ok(record) = find(&catalog, target) {
            if record.kind == Kind::Task {
                let detail = TaskDetail::from_json(record.detail.as_deref())?;
                let Some(id) = detail.cache else {
                    return Err(Error::not_found(format!(
                        "task \"{target}\" was started without package caches"
                    )));
                };
                return caches.into_iter().find(|c| c.id == id).ok_or_else(|| {
                    Error::not_found(format!(
                        "the package cache of task \"{target}\"'s project is gone already"
                    ))
                });
            }
        }
        Err(Error::not_found(format!(
            "no package cache is for \"{target}\"; `dynocap cache ls` lists them (an id, a \
             project directory, a repository as host/path, or a task's name)"
        )))
    }

    /// Removes the cache of `target` (see [`Engine::cache_of`]), or every cache (`None`).
    /// Refused for a cache a live task has.
    pub fn cache_rm(&self, target: Option<&str>) -> Result<CacheRmResult> {
        let chosen = match target {
            Some(target) => vec![self.cache_of(target)?],
            None => self.caches()?,
        };
        if let Some(busy) = chosen.iter().find(|c| !c.in_use_by.is_empty()) {
            return Err(Error::conflict(format!(
                "the package cache of {} is in use by the running task(s) {}; finish them first",
                busy.project.as_deref().unwrap_or(&busy.id),
                busy.in_use_by.join(", ")
            )));
        }
        for cache in &chosen {
            project_cache::remove(self.home().root(), &cache.id)?;
        }
        Ok(CacheRmResult { removed: chosen })
    }

    fn entry(&self, info: CacheInfo, records: &[Record]) -> CacheEntry {
        let mut tasks = Vec::new();
        let mut in_use_by = Vec::new();
        for record in records.iter().filter(|r| r.kind == Kind::Task) {
            let Ok(detail) = TaskDetail::from_json(record.detail.as_deref()) else {
                continue;
            };
            if detail.cache.as_deref() != Some(info.id.as_str()) {
                continue;
            }
            let name = record.name.clone().unwrap_or_else(|| record.id.clone());
            if record.state.is_live() {
                in_use_by.push(name.clone());
            }
            tasks.push(name);
        }
        CacheEntry {
            path: project_cache::caches_dir(self.home().root())
                .join(&info.id)
                .display()
                .to_string(),
            kind: info.key.as_ref().map(|k| k.kind.clone()),
            project: info.key.map(|k| k.project),
            bytes: info.bytes,
            last_used: info
                .last_used
                .map(|t| rfc3339(chrono::DateTime::<chrono::Utc>::from(t))),
            id: info.id,
            tasks,
            in_use_by,
        }
    }
}
