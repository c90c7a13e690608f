//! The guest kernel's count of OOM kills, for a guest that has a kernel of its own (a VM):
//! the host cannot see inside it, so the supervisor asks the agent before and after a command
//! to tell the command that the memory limit killed part of it.

/// The `oom_kill` line of `/proc/vmstat`; `None` where it cannot be read (a kernel older
/// than 4.13 has no such line).
pub fn oom_kills() -> Option<u64> {
    parse(&std::fs::read_to_string("/proc/vmstat").ok()?)
}

fn parse(vmstat: &str) -> Option<u64> {
    vmstat
        .lines()
        .find_map(|line| line.strip_prefix("oom_kill "))
        .and_then(|count| count.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_oom_kill_line_only() {
        let text = "nr_free_pages 12\noom_kill_other 9\noom_kill 3\npgfault 77\n";
        assert_eq!(parse(text), Some(3));
        assert_eq!(parse("nr_free_pages 12\n"), None);
        assert_eq!(parse("oom_kill many\n"), None);
    }

    #[test]
    fn this_kernel_counts_them() {
        // Every kernel these tests run on is newer than 4.13.
        assert!(oom_kills().is_some());
    }
}
