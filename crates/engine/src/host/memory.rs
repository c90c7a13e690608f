//! The host's memory, as the kernel reports it: what the ceilings default to and what bounds
//! a supervisor's own allowance. Here rather than beside the ceilings because the supervisor,
//! a layer below them, reads it too.

/// MemTotal from /proc/meminfo, in MiB.
pub(crate) fn total_memory_mb() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}
