//! Which cgroup files apply a [`Limits`] value, per controller and cgroup version.
//!
//! | limit  | v1                                                            | v2                       |
//! |--------|---------------------------------------------------------------|--------------------------|
//! | cpu    | `cpu.cfs_period_us` = 100000, `cpu.cfs_quota_us` = millis*100 | `cpu.max` = "quota 100000" |
//! | memory | dynocap-host's `cgroup::memory` (the bound over all sandboxes writes by the same table) | the same |
//! | pids   | `pids.max`                                                    | `pids.max`               |

pub(crate) use dynocap_host::cgroup::memory::{memory_settings, Setting, SwapFacts};

use crate::error::JailError;
use crate::spec::Limits;
use dynocap_host::cgroup::{CgroupVersion, Controller};

/// CFS period: 100 ms, the kernel default.
pub(crate) const CFS_PERIOD_US: u64 = 100_000;

fn set(file: &'static str, value: impl ToString) -> Setting {
    Setting::new(file, value)
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
