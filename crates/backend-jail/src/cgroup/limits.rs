//! Which cgroup files apply a [`Limits`] value, per controller and cgroup version.
//!
//! | limit  | v1                                                            | v2                       |
//! |--------|---------------------------------------------------------------|--------------------------|
//! | cpu    | `cpu.cfs_period_us` = 100000, `cpu.cfs_quota_us` = millis*100 | `cpu.max` = "quota 100000" |
//! | memory | `memory.limit_in_bytes`, then `memory.memsw.limit_in_bytes` (same value: no swap) when swap accounting exists, else `memory.swappiness` = 0 | `memory.max`, `memory.swap.max` = 0 |
//! | pids   | `pids.max`                                                    | `pids.max`               |

use std::path::Path;

use super::layout::{CgroupVersion, Controller};
use crate::error::JailError;
use crate::spec::Limits;

/// CFS period: 100 ms, the kernel default.
pub(crate) const CFS_PERIOD_US: u64 = 100_000;

/// One write into a cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Setting {
    pub file: &'static str,
    pub value: String,
}

fn set(file: &'static str, value: impl ToString) -> Setting {
    Setting {
        file,
        value: value.to_string(),
    }
}

/// What the host offers for swap, which decides how "no swap" is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SwapFacts {
    /// The cgroup has a swap limit file (`memory.memsw.*` on v1, `memory.swap.max` on v2).
    pub swap_file: bool,
    /// Some swap device is active (`/proc/swaps` lists one).
    pub swap_active: bool,
}

impl SwapFacts {
    /// Looks at the cgroup directory `dir` and `/proc/swaps`.
    pub fn probe(version: CgroupVersion, dir: &Path) -> SwapFacts {
        let file = match version {
            CgroupVersion::V1 => "memory.memsw.limit_in_bytes",
            CgroupVersion::V2 => "memory.swap.max",
        };
        let swap_active = std::fs::read_to_string("/proc/swaps")
            .map(|s| s.lines().count() > 1)
            .unwrap_or(false);
        SwapFacts {
            swap_file: dir.join(file).exists(),
            swap_active,
        }
    }
}

/// The writes, in order, that apply `limits` for `controller`.
pub(crate) fn settings(
    version: CgroupVersion,
    controller: Controller,
    limits: &Limits,
    swap: SwapFacts,
) -> Result<Vec<Setting>, JailError> {
    // Validated ranges keep these products far below u64::MAX.
    let quota_us = limits.cpu_millis.saturating_mul(CFS_PERIOD_US / 1000);
    let memory = limits.memory_bytes;
    Ok(match (version, controller) {
        (CgroupVersion::V1, Controller::Cpu) => vec![
            set("cpu.cfs_period_us", CFS_PERIOD_US),
            set("cpu.cfs_quota_us", quota_us),
        ],
        (CgroupVersion::V2, Controller::Cpu) => {
            vec![set("cpu.max", format!("{quota_us} {CFS_PERIOD_US}"))]
        }
        (version, Controller::Memory) => memory_settings(version, memory, swap)?,
        (_, Controller::Pids) => vec![set("pids.max", limits.pids)],
    })
}

/// The writes, in order, that bound a cgroup's memory to `memory` bytes and its swap to none:
/// a sandbox's own limit, and the bound over all sandboxes together (see `shared`).
pub(crate) fn memory_settings(
    version: CgroupVersion,
    memory: u64,
    swap: SwapFacts,
) -> Result<Vec<Setting>, JailError> {
    Ok(match version {
        CgroupVersion::V1 => {
            let mut writes = vec![set("memory.limit_in_bytes", memory)];
            if swap.swap_file {
                // memory+swap equal to memory: not one byte of swap.
                writes.push(set("memory.memsw.limit_in_bytes", memory));
            } else {
                writes.push(set("memory.swappiness", 0));
            }
            writes
        }
        CgroupVersion::V2 => {
            let mut writes = vec![set("memory.max", memory)];
            if swap.swap_file {
                writes.push(set("memory.swap.max", 0));
            } else if swap.swap_active {
                return Err(JailError::LimitUnavailable {
                    limit: "memory",
                    reason: "swap is active but cgroup v2 has no memory.swap.max (swap \
                             accounting is off), so the guest could swap without bound; boot \
                             with swapaccount=1 or turn swap off"
                        .to_owned(),
                });
            }
            writes
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        cpu_millis: 1500,
        memory_bytes: 256 << 20,
        pids: 64,
    };
    const WITH_SWAP_FILE: SwapFacts = SwapFacts {
        swap_file: true,
        swap_active: true,
    };
    const NO_SWAP_FILE: SwapFacts = SwapFacts {
        swap_file: false,
        swap_active: false,
    };

    fn files(v: CgroupVersion, c: Controller, swap: SwapFacts) -> Vec<(String, String)> {
        settings(v, c, &LIMITS, swap)
            .expect("settings")
            .into_iter()
            .map(|s| (s.file.to_owned(), s.value))
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn v1_values() {
        use CgroupVersion::V1;
        assert_eq!(
            files(V1, Controller::Cpu, NO_SWAP_FILE),
            pairs(&[
                ("cpu.cfs_period_us", "100000"),
                ("cpu.cfs_quota_us", "150000")
            ])
        );
        assert_eq!(
            files(V1, Controller::Memory, WITH_SWAP_FILE),
            pairs(&[
                ("memory.limit_in_bytes", "268435456"),
                ("memory.memsw.limit_in_bytes", "268435456")
            ])
        );
        assert_eq!(
            files(V1, Controller::Memory, NO_SWAP_FILE),
            pairs(&[
                ("memory.limit_in_bytes", "268435456"),
                ("memory.swappiness", "0")
            ])
        );
        assert_eq!(
            files(V1, Controller::Pids, NO_SWAP_FILE),
            pairs(&[("pids.max", "64")])
        );
    }

    #[test]
    fn v2_values() {
        use CgroupVersion::V2;
        assert_eq!(
            files(V2, Controller::Cpu, NO_SWAP_FILE),
            pairs(&[("cpu.max", "150000 100000")])
        );
        assert_eq!(
            files(V2, Controller::Memory, WITH_SWAP_FILE),
            pairs(&[("memory.max", "268435456"), ("memory.swap.max", "0")])
        );
        assert_eq!(
            files(V2, Controller::Memory, NO_SWAP_FILE),
            pairs(&[("memory.max", "268435456")])
        );
        let unbounded_swap = SwapFacts {
            swap_file: false,
            swap_active: true,
        };
        assert!(settings(V2, Controller::Memory, &LIMITS, unbounded_swap).is_err());
    }
}
