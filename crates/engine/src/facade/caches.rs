//! The projects' package caches as `dynocap cache` shows and clears them (the caches
//! themselves are the host layer's `project_cache`): each cache with its project, size, last
//! use and the tasks of that project the catalog holds; removing one, refused while a live
//! task of its project has it.

use serde::Serialize;

use crate::facade::sandboxes::{find, rfc3339, Engine};
use crate::foundation::error::{Error, Result};
use crate::foundation::git_url::GitUrl;
use crate::host::home::Home;
use crate::host::project_cache::{self, CacheInfo, ProjectKey};
use crate::model::task_spec::{Source, TaskDetail};
use crate::store::catalog::{Catalog, Kind, Record};
use crate::supervisor::import::ProjectDir;

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

    /// The cache of `target`'s project: a cache's id or its project as [`Engine::caches`]
    /// lists it, else a task's (name or id), else a project named as `task start` names one
    /// (a directory, relative, through symlinks or with a trailing `/`, resolved as the
    /// import resolves it; or a repository URL, in any spelling of the same repository).
    pub fn cache_of(&self, target: &str) -> Result<CacheEntry> {
        let caches = self.caches()?;
        let matching: Vec<&CacheEntry> = caches
            .iter()
            .filter(|c| c.id == target || c.project.as_deref() == Some(target))
            .collect();
        if let [one] = matching[..] {
            return Ok(one.clone());
        }
        if let Some(record) = self.catalog()?.find(target)? {
            if record.kind == Kind::Task {
                return task_cache_in(caches, &record)?.ok_or_else(|| {
                    Error::not_found(format!(
                        "task \"{target}\"'s project has no package cache (none was made, or \
                         it was removed)"
                    ))
                });
            }
        }
        if let Some(key) = project_named(target) {
            let id = key.id();
            return caches.into_iter().find(|c| c.id == id).ok_or_else(|| {
                Error::not_found(format!(
                    "the project {} has no package cache; `dynocap cache ls` lists them",
                    key.project
                ))
            });
        }
        Err(Error::not_found(format!(
            "no package cache is for \"{target}\"; `dynocap cache ls` lists them (an id, a \
             project directory, a repository, or a task's name)"
        )))
    }

    /// The cache of the project of the task `task` (name or id), whether or not that task
    /// itself had it (a `--no-cache` task's project may have one): `None` when the project
    /// has none, or `task` is a raw sandbox. Unlike [`Engine::cache_of`], `task` is only ever
    /// read as a task, never as a cache's id or project.
    pub fn task_cache(&self, task: &str) -> Result<Option<CacheEntry>> {
        let record = find(&*self.catalog()?, task)?;
        if record.kind != Kind::Task {
            return Ok(None);
        }
        task_cache_in(self.caches()?, &record)
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
        // A guest may have it still where the catalog says none runs (a supervisor ending
        // after its record did, a start not yet recorded): its lock says so, and is held
        // while the cache goes, so no guest takes it meanwhile.
        let mut removed = Vec::new();
        for cache in chosen {
            if !project_cache::remove_unheld(self.home().root(), &cache.id)?
                && project_cache::caches_dir(self.home().root())
                    .join(&cache.id)
                    .exists()
            {
                let done = if removed.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (removed before it: {})",
                        removed
                            .iter()
                            .map(|c: &CacheEntry| c.project.as_deref().unwrap_or(&c.id).to_owned())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(Error::conflict(format!(
                    "the package cache of {} is held by a sandbox's supervisor still (a task \
                     starting or ending); try again once it is done{done}",
                    cache.project.as_deref().unwrap_or(&cache.id)
                )));
            }
            removed.push(cache);
        }
        Ok(CacheRmResult { removed })
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

/// The cache of `record`'s (a task's) project, among `caches`.
fn task_cache_in(caches: Vec<CacheEntry>, record: &Record) -> Result<Option<CacheEntry>> {
    let detail = TaskDetail::from_json(record.detail.as_deref())?;
    // The project's, from where the task came from; else the cache it had (an earlier
    // version named its project otherwise, or today's rules no longer read its source).
    let ids = [
        ProjectKey::for_source(&detail.start.source).map(|key| key.id()),
        detail.cache,
    ];
    Ok(ids
        .into_iter()
        .flatten()
        .find_map(|id| caches.iter().find(|c| c.id == id).cloned()))
}

/// The project `target` names as `task start` would take it: an existing directory (made
/// absolute against the working directory, then opened as a task's import opens it, every
/// symlink resolved), else a repository URL. `None` for anything else.
fn project_named(target: &str) -> Option<ProjectKey> {
    let path = std::path::Path::new(target);
    if let Ok(absolute) = std::path::absolute(path) {
        if let Ok(dir) = ProjectDir::open(&absolute) {
            return ProjectKey::for_source(&Source::ProjectPath(dir.path().to_path_buf()));
        }
    }
    let url = GitUrl::parse(target).ok()?;
    ProjectKey::for_source(&Source::RepositoryUrl(url))
}

/// A task start's hold on the package cache it is about to make for a new project: dropped
/// armed (the start failed, or was dropped before it finished), it removes that cache when
/// no task in the catalog names it and no guest has it, so a start that never became a task
/// (a mistyped repository, an unreadable project) leaves no image with its whole size set
/// aside on the host. A cache that was there before the start is never its to remove.
pub(crate) struct NewCacheGuard {
    home: Home,
    /// The cache this start makes; `None` once the start succeeded, or when it makes none.
    id: Option<String>,
}

impl NewCacheGuard {
    /// Before a start that gives its task the cache `id` (if any).
    pub(crate) fn new(home: &Home, id: Option<&str>) -> Self {
        let new = id.filter(|id| {
            let dir = project_cache::caches_dir(home.root()).join(id);
            matches!(std::fs::symlink_metadata(dir), Err(err) if err.kind() == std::io::ErrorKind::NotFound)
        });
        Self {
            home: home.clone(),
            id: new.map(str::to_owned),
        }
    }

    /// The start made its task: the cache is the project's from now on.
    pub(crate) fn disarm(mut self) {
        self.id = None;
    }
}

impl Drop for NewCacheGuard {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        // Another start of the project at once has a record naming it from its beginning.
        let Ok(records) = Catalog::open(&self.home).and_then(|catalog| catalog.list()) else {
            return;
        };
        let named = records.iter().filter(|r| r.kind == Kind::Task).any(|r| {
            TaskDetail::from_json(r.detail.as_deref())
                .is_ok_and(|detail| detail.cache.as_deref() == Some(id.as_str()))
        });
        if named {
            return;
        }
        match project_cache::remove_unheld(self.home.root(), &id) {
            Ok(true) => tracing::info!(
                "removed the package cache {id} that a failed task start made for its project"
            ),
            Ok(false) => {}
            Err(err) => tracing::warn!(
                "removing the package cache {id} that a failed task start made: {err}"
            ),
        }
    }
}
