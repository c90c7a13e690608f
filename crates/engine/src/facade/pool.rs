//! The warm pool (`DYNOCAP_WARM_POOL=N`): up to N raw sandboxes kept booted, nameless and
//! without network, so that `run` claims one (giving it its name, limits and TTL) instead of
//! booting a guest while the caller waits. Whoever notices the pool short (a `run`, the MCP
//! server at start) boots replacements without waiting for them.
//!
//! Pool sandboxes are ordinary raw sandboxes in two extra states: `warming` while booting,
//! `pooled` once ready. They are listed nowhere, expire after the default TTL if nobody
//! claims them, and a supervisor that dies leaves them to the next reconcile, which removes
//! them. Only a `run` whose sandbox could have come from the pool claims one: no network, the
//! default disk (its size is fixed when the disk is made), the same backend.

use crate::facade::sandboxes::{remove_leftovers, Engine, Keep, Via};
use crate::foundation::error::Result;
use crate::model::spec::{Network, RunSpec};
use crate::store::catalog::{Kind, Record, State};
use crate::supervisor::control::{Claim, ControlReply, ControlRequest};
use crate::supervisor::process::Mode;

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::pool";

pub use crate::model::config::{POOL_ENV, POOL_MAX};

/// The sandbox every pool member is booted as.
fn pool_spec() -> RunSpec {
    RunSpec::raw("pool", None, None, None, None, None)
        .expect("the defaults are a valid raw sandbox spec")
}

/// Whether a sandbox asked for by `spec` can be a claimed pool member.
fn fits(spec: &RunSpec) -> bool {
    spec.network == Network::None
        && spec.allow_hosts.is_empty()
        // The pool boots with the image's own kernel or the one lent.
        && spec.kernel.is_none()
        && spec.disk_mb == pool_spec().disk_mb
}

/// What the pool holds now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    pub target: usize,
    pub warming: usize,
    pub ready: usize,
}

impl Engine {
    /// Boots sandboxes, without waiting for them, until the pool holds its target (booting
    /// ones count). Returns how many it started.
    pub fn top_up_pool(&self) -> Result<usize> {
        let target = self.config().pool_target()?;
        // Only a backend whose idle guests can become a caller's keeps a pool.
        if target == 0 || !crate::backend::select(self.config())?.keeps_a_warm_pool() {
            return Ok(0);
        }
        let catalog = self.catalog()?;
        let pool = pool_spec();
        // The pool only takes room under the host's ceilings that nobody uses.
        let ceilings = crate::facade::ceilings::Ceilings::from_config(&self.config().ceilings)?;
        self.bound_sandboxes_memory(&ceilings)?;
        self.reconcile(&catalog)?;
        let live = catalog.list()?;
        let pooled = live.iter().filter(|r| r.state.is_pool()).count();
        let mut room: usize = 0;
        while pooled + room < target {
            let more = room as u64 + 1;
            if !ceilings.admits_beside(&live, more) {
                break;
            }
            room += 1;
        }
        let added = catalog.top_up_pool(pooled + room, || {
            let mut record = self.new_record(
                Kind::Raw,
                None,
                pool.network,
                pool.cpus,
                pool.memory_mb,
                pool.disk_mb,
                pool.ttl_seconds,
                None,
                None,
                None,
            )?;
            record.state = State::Warming;
            Ok(record)
        })?;
        for record in &added {
            if let Err(err) = self.spawn_supervisor(
                &catalog,
                &record.id,
                Mode::Start,
                Via::Spawn(Default::default()),
                true,
            ) {
                // Nothing runs for it: the record goes at once rather than at the next reconcile.
                let _ = catalog.delete(&record.id);
                return Err(err);
            }
        }
        Ok(added.len())
    }

    /// After a caller's sandbox started: the pool gives up the room it took under the
    /// host's ceilings, then refills what room is left. For callers that must not fail
    /// because of the pool: a problem is logged, and the next start tries again.
    pub async fn rebalance_pool(&self) {
        if !matches!(self.config().pool_target(), Ok(n) if n > 0) {
            return;
        }
        if let Err(err) = self.shrink_pool_to_ceilings().await {
            tracing::warn!(target: LOG_TARGET, "making room in the warm pool: {err}");
        }
        if let Err(err) = self.top_up_pool() {
            tracing::warn!(target: LOG_TARGET, "topping up the warm pool: {err}");
        }
    }

    /// Blocks the calling thread until the home has served no request for a moment (see
    /// `activity`), or a few seconds passed; at once when there is no pool. For a caller that
    /// answered a `run` first and refills after ([`Engine::run_leaving_pool`]): the client may
    /// send its next call at once, and the refill's own work (catalog transactions, a
    /// supervisor's fork, exec and start-up) would run beside it on a small machine.
    pub fn wait_for_lull(&self) {
        if matches!(self.config().pool_target(), Ok(n) if n > 0) {
            crate::host::activity::wait_for_quiet(
                self.home(),
                crate::host::activity::QUIET,
                crate::host::activity::MAX_WAIT,
            );
        }
    }

    /// Claims a booted pool sandbox for `spec`, if the pool has one and `spec` fits it.
    /// A pool sandbox that cannot be claimed (its supervisor died) is removed, and `None`
    /// tells the caller to boot one.
    pub(crate) async fn claim_from_pool(&self, spec: &RunSpec) -> Result<Option<Record>> {
        if self.config().pool_target()? == 0 || !fits(spec) {
            return Ok(None);
        }
        let catalog = self.catalog()?;
        let now = chrono::Utc::now();
        let ttl = chrono::TimeDelta::seconds(i64::try_from(spec.ttl_seconds).unwrap_or(i64::MAX));
        // The pool boots the default image; a sandbox of another image is booted afresh.
        let image_name = spec
            .image
            .clone()
            .unwrap_or_else(|| self.config().images.default_name());
        let backend = match spec.backend {
            Some(choice) => crate::backend::select_as(self.config(), choice, &image_name)?,
            None => crate::backend::select_for(self.config(), &image_name)?,
        }
        .name();
        let mut image = crate::image::resolve(self.home(), &image_name)?;
        // As the pool's records have it (see `new_record`).
        image.kernel = self.recorded_kernel(&image, backend);
        let Some(record) = catalog.claim_pooled(backend, &image, |record| {
            record.name = Some(spec.name.clone());
            record.state = State::Running;
            record.cpus = spec.cpus;
            record.memory_mb = spec.memory_mb;
            record.ttl_seconds = spec.ttl_seconds;
            record.created_at = now;
            record.expires_at = now + ttl;
        })?
        else {
            return Ok(None);
        };
        let claim = Claim {
            hostname: spec.name.clone(),
            cpus: spec.cpus,
            memory_mb: spec.memory_mb,
            ttl_seconds: spec.ttl_seconds,
            expires_unix: record.expires_at.timestamp(),
        };
        match self.call(&record, &ControlRequest::Claim(claim)).await {
            Ok(ControlReply::Claimed) => Ok(Some(record)),
            outcome => {
                let why = match outcome {
                    Ok(ControlReply::Error(err)) | Err(err) => err.message,
                    Ok(other) => format!("unexpected reply {other:?}"),
                };
                tracing::warn!(target: LOG_TARGET,
                    "warm-pool sandbox {} could not be claimed: {why}",
                    record.id
                );
                // Its record already says `running`, so this ends it from here.
                self.end_pool_member(&catalog, &record).await?;
                Ok(None)
            }
        }
    }

    /// Ends pool sandboxes, booting ones first, until the live sandboxes are within the
    /// host's ceilings again: the pool yields the room a caller's sandbox took.
    pub async fn shrink_pool_to_ceilings(&self) -> Result<()> {
        let ceilings = crate::facade::ceilings::Ceilings::from_config(&self.config().ceilings)?;
        let catalog = self.catalog()?;
        loop {
            let live = catalog.list()?;
            if ceilings.hold_for(&live) {
                return Ok(());
            }
            let Some(victim) = live
                .iter()
                .filter(|r| r.state.is_pool())
                .min_by_key(|r| r.state == State::Pooled)
            else {
                return Ok(());
            };
            self.end_pool_member(&catalog, victim).await?;
        }
    }

    /// Ends one pool sandbox: its supervisor destroys a ready one; a booting one (or one that
    /// does not answer) is ended from here.
    async fn end_pool_member(
        &self,
        catalog: &crate::store::catalog::Catalog,
        record: &Record,
    ) -> Result<()> {
        let destroyed = record.state == State::Pooled
            && matches!(
                self.call(record, &ControlRequest::Destroy).await,
                Ok(ControlReply::Destroyed)
            );
        if !destroyed {
            self.kill_supervisor(record).await;
            remove_leftovers(self.home(), &record.id, &record.backend, Keep::Nothing)?;
            catalog.delete(&record.id)?;
        }
        Ok(())
    }

    /// What the pool holds now.
    pub fn pool_status(&self) -> Result<PoolStatus> {
        let catalog = self.catalog()?;
        self.reconcile(&catalog)?;
        let records = catalog.list()?;
        let count = |state| records.iter().filter(|r| r.state == state).count();
        Ok(PoolStatus {
            target: self.config().pool_target()?,
            warming: count(State::Warming),
            ready: count(State::Pooled),
        })
    }

    /// Ends every pool sandbox (booting or ready); returns how many.
    pub async fn drain_pool(&self) -> Result<usize> {
        let catalog = self.catalog()?;
        let pooled: Vec<Record> = catalog
            .list()?
            .into_iter()
            .filter(|r| r.state.is_pool())
            .collect();
        for record in &pooled {
            self.end_pool_member(&catalog, record).await?;
        }
        Ok(pooled.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_specs_the_pool_could_have_made_fit() {
        let plain = RunSpec::raw("a", None, Some(60), Some(2), Some(2048), None).unwrap();
        assert!(
            fits(&plain),
            "name, ttl, cpus and memory are applied at claim time"
        );
        let filtered = RunSpec::raw("a", Some("filtered"), None, None, None, None).unwrap();
        assert!(!fits(&filtered));
        let disk = RunSpec::raw("a", None, None, None, None, Some(4096)).unwrap();
        assert!(!fits(&disk), "a disk's size is fixed when it is made");
    }
}
