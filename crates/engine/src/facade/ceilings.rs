//! Host ceilings: limits the person running DynoCap sets in the environment and no caller can
//! exceed. The spec's ranges (spec.rs) say what a value may be at all; a ceiling says what this
//! host grants, because an MCP caller may be a prompt-injected model asking for every CPU and
//! all the memory. A request above a ceiling is `policy_denied`, naming the variable.

use crate::foundation::error::{Error, ErrorCode, Result};
use crate::foundation::terms::Param;
use crate::host::memory::total_memory_mb;
use crate::model::config::CeilingsConfig;
use crate::model::spec::{CPUS_MAX, MEMORY_MB_DEFAULT, MEMORY_MB_MAX, TASK_CPUS_DEFAULT, TTL_MAX};
use crate::store::catalog::Record;

pub const MAX_CPUS: &str = "DYNOCAP_MAX_CPUS";
pub const MAX_MEMORY_MB: &str = "DYNOCAP_MAX_MEMORY_MB";
pub const MAX_SANDBOXES: &str = "DYNOCAP_MAX_SANDBOXES";
pub const MAX_DISK_MB: &str = "DYNOCAP_MAX_DISK_MB";
pub const MAX_TTL_SECONDS: &str = "DYNOCAP_MAX_TTL_SECONDS";

/// Live sandboxes and tasks together, unless the host says otherwise.
pub const SANDBOXES_DEFAULT: u64 = 64;
/// Disk one sandbox may ask for, unless the host says otherwise: room for a large build
/// beside the default disk. What a start gets is bounded by the free space as well, which its
/// disk reserves (see `disk_room`).
pub const DISK_MB_DEFAULT: u64 = 10_240;

/// The effective ceilings: the host's variables, else defaults taken from the machine (its
/// CPUs, half its memory), never below the spec's defaults for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ceilings {
    pub cpus: u64,
    /// Per sandbox and for all live sandboxes together.
    pub memory_mb: u64,
    pub sandboxes: u64,
    pub disk_mb: u64,
    pub ttl_seconds: u64,
}

/// The machine facts the defaults derive from, apart so tests can choose them.
#[derive(Debug, Clone, Copy)]
pub struct HostFacts {
    pub cpus: u64,
    pub memory_mb: u64,
}

impl HostFacts {
    /// The machine's facts, read once per process: every `run` and task start is checked
    /// against them, and reading them takes five files of /proc and the cgroup tree.
    pub fn probe() -> Self {
        static FACTS: std::sync::OnceLock<HostFacts> = std::sync::OnceLock::new();
        *FACTS.get_or_init(|| {
            // The CPUs this process may use (affinity and cgroup quota included): what a
            // sandbox can actually get, so a larger request would only over-commit.
            let cpus = std::thread::available_parallelism()
                .map(|n| n.get() as u64)
                .unwrap_or(1);
            Self {
                cpus,
                memory_mb: total_memory_mb().unwrap_or(MEMORY_MB_MAX),
            }
        })
    }
}

impl Ceilings {
    /// The ceilings `config` sets, else this machine's defaults. An unusable value is an
    /// error naming the variable, never silently replaced by a default: a typo must not lift
    /// a limit.
    pub fn from_config(config: &CeilingsConfig) -> Result<Self> {
        Self::from_lookup(HostFacts::probe(), |name| {
            match name {
                MAX_CPUS => &config.cpus,
                MAX_MEMORY_MB => &config.memory_mb,
                MAX_SANDBOXES => &config.sandboxes,
                MAX_DISK_MB => &config.disk_mb,
                MAX_TTL_SECONDS => &config.ttl_seconds,
                _ => &None,
            }
            .clone()
        })
    }

    pub fn from_lookup(
        facts: HostFacts,
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Self> {
        let var = |name: &str, default: u64| -> Result<u64> {
            match lookup(name) {
                None => Ok(default),
                Some(value) => parse(name, &value),
            }
        };
        // The defaults never fall below what a request with every value left out asks for:
        // a one-CPU or small host must still start a default task.
        Ok(Self {
            cpus: var(MAX_CPUS, facts.cpus.max(u64::from(TASK_CPUS_DEFAULT)))?,
            memory_mb: var(MAX_MEMORY_MB, (facts.memory_mb / 2).max(MEMORY_MB_DEFAULT))?,
            sandboxes: var(MAX_SANDBOXES, SANDBOXES_DEFAULT)?,
            disk_mb: var(MAX_DISK_MB, DISK_MB_DEFAULT)?,
            ttl_seconds: var(MAX_TTL_SECONDS, TTL_MAX)?,
        })
    }

    /// `(variable, effective value, unit)` for display (`dynocap doctor`). A ceiling above the
    /// spec's own maximum shows that maximum: it is what a caller can actually get.
    pub fn entries(&self) -> [(&'static str, u64, &'static str); 5] {
        [
            (
                MAX_CPUS,
                self.cpus.min(u64::from(CPUS_MAX)),
                "CPUs per sandbox",
            ),
            (
                MAX_MEMORY_MB,
                self.memory_mb.min(MEMORY_MB_MAX),
                "MB per sandbox and for all live sandboxes together",
            ),
            (MAX_SANDBOXES, self.sandboxes, "live sandboxes and tasks"),
            (MAX_DISK_MB, self.disk_mb, "MB of disk per sandbox"),
            (
                MAX_TTL_SECONDS,
                self.ttl_seconds.min(TTL_MAX),
                "seconds of lifetime",
            ),
        ]
    }

    /// Refuses one sandbox's own request above a ceiling. `disk_mb` is `None` where the
    /// request has no disk size.
    pub fn check_request(
        &self,
        cpus: u32,
        memory_mb: u64,
        ttl_seconds: u64,
        disk_mb: Option<u64>,
    ) -> Result<()> {
        above(MAX_CPUS, Param::Cpus, u64::from(cpus), self.cpus)?;
        above(MAX_MEMORY_MB, Param::MemoryMb, memory_mb, self.memory_mb)?;
        above(
            MAX_TTL_SECONDS,
            Param::TtlSeconds,
            ttl_seconds,
            self.ttl_seconds,
        )?;
        if let Some(disk_mb) = disk_mb {
            above(MAX_DISK_MB, Param::DiskMb, disk_mb, self.disk_mb)?;
        }
        Ok(())
    }

    /// Whether the live sandboxes, warm pool included, are within the count ceiling.
    pub fn hold_for(&self, live: &[Record]) -> bool {
        live.iter().filter(|r| r.state.is_live()).count() as u64 <= self.sandboxes
    }

    /// Whether `count` more sandboxes fit beside the live ones, warm pool included (for
    /// topping the pool up: it only takes room nobody uses).
    pub fn admits_beside(&self, live: &[Record], count: u64) -> bool {
        let live = live.iter().filter(|r| r.state.is_live()).count() as u64;
        live.saturating_add(count) <= self.sandboxes
    }

    /// Refuses a new sandbox when the live ones already use up the count. Memory is not
    /// summed here: each sandbox's limit bounds that sandbox, and what all of them really use
    /// together is bounded by the kernel (see [`crate::Engine::bound_sandboxes_memory`]), so
    /// idle sandboxes overcommit their limits. The warm pool does not count: it makes room
    /// (see `Engine::shrink_pool_to_ceilings`).
    pub fn check_admission(&self, live: &[Record]) -> Result<()> {
        let count = live
            .iter()
            .filter(|r| r.state.is_live() && !r.state.is_pool())
            .count() as u64;
        if count >= self.sandboxes {
            return Err(denied(format!(
                "{count} sandboxes and tasks are live and the host allows {} \
                 ({MAX_SANDBOXES}={}); destroy or finish one first",
                self.sandboxes, self.sandboxes
            )));
        }
        Ok(())
    }
}

fn parse(name: &str, value: &std::ffi::OsStr) -> Result<u64> {
    let text = value.to_string_lossy();
    match text.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::invalid(format!(
            "{name}={text:?} is not a usable ceiling: set it to a whole number above 0, or \
             unset it for the default"
        ))),
    }
}

fn above(var: &str, param: Param, value: u64, ceiling: u64) -> Result<()> {
    if value > ceiling {
        return Err(Error::worded(ErrorCode::PolicyDenied, |s| {
            format!(
                "{} {value} is above the host's ceiling {ceiling} ({var}={ceiling}); ask for \
                 at most {ceiling}, or have the person running DynoCap raise {var}",
                s.param(param)
            )
        }));
    }
    Ok(())
}

fn denied(message: String) -> Error {
    Error::new(ErrorCode::PolicyDenied, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::ffi::OsString;

    const FACTS: HostFacts = HostFacts {
        cpus: 2,
        memory_mb: 23_552,
    };

    fn with(vars: &[(&str, &str)]) -> Result<Ceilings> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        Ceilings::from_lookup(FACTS, |name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_come_from_the_host() {
        let c = with(&[]).unwrap();
        assert_eq!(
            (c.cpus, c.memory_mb, c.sandboxes, c.disk_mb, c.ttl_seconds),
            (2, 11_776, 64, 10_240, 86_400)
        );
    }

    #[test]
    fn defaults_still_admit_a_default_request_on_a_small_host() {
        let tiny = HostFacts {
            cpus: 1,
            memory_mb: 1_000,
        };
        let c = Ceilings::from_lookup(tiny, |_| None).unwrap();
        assert_eq!((c.cpus, c.memory_mb), (2, 1_024));
        c.check_request(2, 1_024, 1_800, None).unwrap();
    }

    #[test]
    fn variables_raise_or_lower_and_bad_values_are_named() {
        let c = with(&[(MAX_CPUS, "8"), (MAX_MEMORY_MB, " 512 ")]).unwrap();
        assert_eq!((c.cpus, c.memory_mb), (8, 512));
        for bad in ["0", "-1", "lots", "", "1.5"] {
            for var in [
                MAX_CPUS,
                MAX_MEMORY_MB,
                MAX_SANDBOXES,
                MAX_DISK_MB,
                MAX_TTL_SECONDS,
            ] {
                let err = with(&[(var, bad)]).unwrap_err();
                assert_eq!(err.code, ErrorCode::InvalidArgument);
                assert!(err.message.starts_with(var), "{err}");
            }
        }
    }

    #[test]
    fn requests_above_a_ceiling_are_denied_naming_the_variable() {
        let c = with(&[]).unwrap();
        c.check_request(2, 11_776, 86_400, Some(10_240)).unwrap();
        for (err, var) in [
            (c.check_request(64, 1024, 60, None), MAX_CPUS),
            (c.check_request(1, 1_048_576, 60, None), MAX_MEMORY_MB),
            (c.check_request(1, 1024, 60, Some(10_241)), MAX_DISK_MB),
        ]
        .map(|(r, v)| (r.err(), v))
        {
            let err = err.unwrap_or_else(|| panic!("{var} not enforced"));
            assert_eq!(err.code, ErrorCode::PolicyDenied);
            assert!(err.message.contains(var), "{err}");
        }
        let short = with(&[(MAX_TTL_SECONDS, "600")]).unwrap();
        let err = short.check_request(1, 64, 601, None).unwrap_err();
        assert!(err.message.contains("DYNOCAP_MAX_TTL_SECONDS=600"), "{err}");
    }

    fn record(state: crate::store::catalog::State, memory_mb: u64) -> Record {
        let now = chrono::Utc::now();
        Record {
            id: "sbx-x".into(),
            kind: crate::store::catalog::Kind::Raw,
            name: None,
            state,
            backend: "jail".into(),
            network: crate::model::spec::Network::None,
            cpus: 1,
            memory_mb,
            disk_mb: 10_240,
            ttl_seconds: 60,
            created_at: now,
            expires_at: now,
            supervisor: None,
            note: None,
            detail: None,
            egress: None,
            image: crate::image::ImageRef::host(),
        }
    }

    #[test]
    fn the_count_bounds_new_sandboxes_and_memory_limits_overcommit() {
        use crate::store::catalog::State;
        let c = with(&[(MAX_MEMORY_MB, "1000"), (MAX_SANDBOXES, "2")]).unwrap();
        // Limits add up past the memory ceiling: the kernel bounds what they really use.
        let one = [record(State::Running, 1000)];
        c.check_admission(&one).unwrap();
        // Ended sandboxes do not count.
        let ended = [record(State::Destroyed, 900), record(State::Finished, 900)];
        c.check_admission(&ended).unwrap();
        let two = [record(State::Running, 100), record(State::Starting, 100)];
        let err = c.check_admission(&two).unwrap_err();
        assert_eq!(err.code, ErrorCode::PolicyDenied);
        assert!(err.message.contains("DYNOCAP_MAX_SANDBOXES=2"), "{err}");
        // The pool makes room: its members do not count against a caller's start.
        let pooled = [record(State::Running, 100), record(State::Pooled, 100)];
        c.check_admission(&pooled).unwrap();
        assert!(!c.hold_for(&[
            record(State::Running, 1),
            record(State::Pooled, 1),
            record(State::Warming, 1)
        ]));
    }
}
