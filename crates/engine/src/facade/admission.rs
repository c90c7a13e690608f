//! The host's word on a new sandbox before anything is made: its own values against the
//! ceilings, the live count, the room its disk reserves, and the memory bound of all
//! sandboxes together.

use crate::facade::ceilings::{Ceilings, MAX_MEMORY_MB};
use crate::foundation::error::{Error, ErrorCode, Result};
use crate::model::spec::MEMORY_MB_MAX;

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::admission";

impl crate::Engine {
    /// The host's ceilings for a new sandbox or task: its own values, then the live total.
    /// Called first thing by `run` and `task_start`, before anything is created.
    ///
    /// Two starts racing between this check and their catalog insert can both pass; the
    /// window is a few milliseconds in one process, so the bound holds for ordinary use.
    pub(crate) fn admit(
        &self,
        cpus: u32,
        memory_mb: u64,
        disk_mb: u64,
        ttl_seconds: u64,
    ) -> Result<()> {
        self.admit_setting_aside(cpus, memory_mb, disk_mb, ttl_seconds, disk_mb)
    }

    /// [`admit`](Self::admit) for a sandbox whose disk of `disk_mb` sets `reserved_mb` aside
    /// on the host when it starts: a vm fork's, and a jail fork's clone, set nothing aside
    /// (see `disk_room`), and are admitted with the headroom free only.
    pub(crate) fn admit_setting_aside(
        &self,
        cpus: u32,
        memory_mb: u64,
        disk_mb: u64,
        ttl_seconds: u64,
        reserved_mb: u64,
    ) -> Result<()> {
        let ceilings = Ceilings::from_config(&self.config().ceilings)?;
        ceilings.check_request(cpus, memory_mb, ttl_seconds, Some(disk_mb))?;
        let catalog = self.catalog()?;
        // Records whose supervisor died are not live any more; count only the real ones.
        self.reconcile(&catalog)?;
        ceilings.check_admission(&catalog.list()?)?;
        crate::host::disk_room::check_room(self.home().root(), reserved_mb)?;
        self.bound_sandboxes_memory(&ceilings)
    }

    /// Bounds what all sandboxes use together to the memory ceiling, in the cgroup every
    /// sandbox's is under (dynocap-host's `bound_all_sandboxes_memory`): written before each
    /// start, so the ceiling in force is the one of the latest start. A caller that may not
    /// write it (an unprivileged user given delegated cgroup parents) leaves the bound to
    /// whoever delegated them, and a host without a memory controller has none; the log says
    /// so either way.
    pub(crate) fn bound_sandboxes_memory(&self, ceilings: &Ceilings) -> Result<()> {
        let bytes = ceilings
            .memory_mb
            .min(MEMORY_MB_MAX)
            .saturating_mul(1 << 20);
        match dynocap_host::bound_all_sandboxes_memory(bytes) {
            Ok(dynocap_host::SharedBound::Applied) => Ok(()),
            Ok(dynocap_host::SharedBound::NotApplied(why)) => {
                tracing::warn!(target: LOG_TARGET,
                    "the memory of all sandboxes together is not bounded by DynoCap: {why}"
                );
                Ok(())
            }
            Err(err) => Err(Error::new(
                ErrorCode::PolicyDenied,
                format!("bounding the memory of all sandboxes to {MAX_MEMORY_MB}: {err}"),
            )),
        }
    }
}
