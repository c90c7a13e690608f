//! Which cgroup files bound a cgroup's memory and keep it off swap, per cgroup version: the
//! one table a sandbox's own memory limit (the jail's `limits`) and the bound over all
//! sandboxes together ([`super::memory_bound`]) both write by.
//!
//! | v1 | v2 |
//! |----|----|
//! | `memory.limit_in_bytes`, then `memory.memsw.limit_in_bytes` (same value: no swap) when swap accounting exists, else `memory.swappiness` = 0 | `memory.max`, `memory.swap.max` = 0 |

use std::path::Path;

use super::layout::CgroupVersion;
use crate::error::HostError;

/// One write into a cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The file, relative to the cgroup's directory.
    pub file: &'static str,
    /// What is written to it.
    pub value: String,
}

impl Setting {
    /// `value` into `file`.
    pub fn new(file: &'static str, value: impl ToString) -> Setting {
        Setting {
            file,
            value: value.to_string(),
        }
    }
}

/// What the host offers for swap, which decides how "no swap" is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwapFacts {
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

/// The writes, in order, that bound a cgroup's memory to `memory` bytes and its swap to none:
/// a sandbox's own limit, and the bound over all sandboxes together.
pub fn memory_settings(
    version: CgroupVersion,
    memory: u64,
    swap: SwapFacts,
) -> Result<Vec<Setting>, HostError> {
    let set = Setting::new;
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
                return Err(HostError::LimitUnavailable {
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
