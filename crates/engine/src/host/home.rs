//! Where DynoCap keeps its state on the host (`DYNOCAP_HOME`) and the layout inside it.

use std::path::{Path, PathBuf};

use crate::foundation::error::{Coded, Context, ErrorCode, Result};
use crate::model::config::HomeConfig;
use crate::model::lifecycle::Kind;

/// The name of a record file inside its record's directory.
pub const RECORD_FILE: &str = "record.json";
/// The directory of the tasks' results, in the home.
const RESULTS: &str = "results";

/// The results directory of the task `id` in the home at `root`, for a caller that holds
/// only the root (see [`Home::results_dir`]).
pub fn task_results_dir(root: &Path, id: &str) -> PathBuf {
    root.join(RESULTS).join(id)
}

/// The state directory and the paths derived from it.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// `DYNOCAP_HOME`, else `$XDG_DATA_HOME/dynocap`, else `~/.local/share/dynocap`.
    pub fn from_config(config: &HomeConfig) -> Result<Self> {
        let home = Self::locate(config)?;
        if let Some(mb) = crate::host::jail_pool::parse_mb(config.jail_pool_mb.as_deref())? {
            crate::host::jail_pool::ensure(&home.root, mb)?;
        }
        Ok(home)
    }

    /// The home [`Home::from_config`] gives, without making or mounting its reflink pool: for
    /// what only looks at the home (`dynocap doctor`) or takes the pool away (`dynocap
    /// jail-pool rm`).
    pub fn without_pool(config: &HomeConfig) -> Result<Self> {
        Self::locate(config)
    }

    fn locate(config: &HomeConfig) -> Result<Self> {
        let given = |dir: &Option<PathBuf>| dir.clone().filter(|v| !v.as_os_str().is_empty());
        if let Some(dir) = given(&config.dynocap_home) {
            return Self::at(dir);
        }
        if let Some(dir) = given(&config.xdg_data_home) {
            return Self::at(dir.join("dynocap"));
        }
        let home = given(&config.user_home).ok_or_else(|| {
            crate::Error::internal("neither DYNOCAP_HOME nor HOME is set; set DYNOCAP_HOME to a directory for DynoCap's state")
        })?;
        Self::at(home.join(".local/share/dynocap"))
    }

    /// Uses `root` as the state directory, creating it (mode 0700) if needed.
    pub fn at(root: PathBuf) -> Result<Self> {
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir()
                .context("reading the working directory")?
                .join(root)
        };
        for dir in [
            root.clone(),
            root.join("run"),
            root.join("sandboxes"),
            root.join("logs"),
            root.join("results"),
        ] {
            create_private_dir(&dir)?;
        }
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn catalog_path(&self) -> PathBuf {
        self.root.join("catalog.db")
    }
    /// Serialises creating, initialising and repairing the catalog across processes (flock).
    pub fn catalog_lock_path(&self) -> PathBuf {
        self.root.join("catalog.lock")
    }
    /// A task's results (`patch.diff`, `exec.jsonl`, `summary.json`, its record file); kept
    /// after the task ends, until `rm --purge`.
    pub fn results_dir(&self, id: &str) -> PathBuf {
        task_results_dir(&self.root, id)
    }
    /// The directory holding one subdirectory per record of `kind`: `results/` for tasks,
    /// `sandboxes/` for raw sandboxes.
    pub fn records_root(&self, kind: Kind) -> PathBuf {
        match kind {
            Kind::Task => self.root.join(RESULTS),
            Kind::Raw => self.root.join("sandboxes"),
        }
    }
    /// Where a record's file lives: beside a task's results (kept until `rm --purge`), or in
    /// a raw sandbox's state directory (which goes when the sandbox does).
    pub fn record_path(&self, kind: Kind, id: &str) -> PathBuf {
        self.records_root(kind).join(id).join(RECORD_FILE)
    }
    pub fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }
    /// What backends build once and reuse, keyed by content (formatted disk templates).
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }
    /// Per-sandbox runtime state (overlay upper layer and friends); removed on destroy.
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.records_root(Kind::Raw).join(id)
    }
    /// The supervisor's log; kept after the sandbox is gone, so a lost sandbox can be diagnosed.
    pub fn supervisor_log(&self, id: &str) -> PathBuf {
        self.root.join("logs").join(format!("{id}.log"))
    }
    pub fn control_socket(&self, id: &str) -> PathBuf {
        self.root.join("run").join(format!("{id}.sock"))
    }
}

fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(source) => Err(HomeFailure::CreateStateDir {
            dir: dir.to_owned(),
            source,
        }
        .into()),
    }
}

/// What failed laying out the state directory.
#[derive(Debug, thiserror::Error)]
enum HomeFailure {
    #[error(
        "cannot create state directory {}: {source}; set DYNOCAP_HOME to a writable directory",
        .dir.display()
    )]
    CreateStateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Coded for HomeFailure {
    /// Where DynoCap keeps its state is the operator's choice, not a caller's.
    fn code(&self) -> ErrorCode {
        match self {
            Self::CreateStateDir { .. } => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_files_sit_beside_the_data_they_describe() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = Home::at(dir.path().to_owned()).expect("home");
        assert_eq!(
            home.results_dir("task-1"),
            home.records_root(Kind::Task).join("task-1")
        );
        assert_eq!(
            home.record_path(Kind::Task, "task-1"),
            home.results_dir("task-1").join(RECORD_FILE)
        );
        assert_eq!(
            home.record_path(Kind::Raw, "sbx-1"),
            home.sandbox_dir("sbx-1").join(RECORD_FILE)
        );
        assert!(
            home.records_root(Kind::Task).is_dir(),
            "created with the home"
        );
    }
}
