//! The cgroup primitives the guest agent (per-command cgroups inside the delegated sandbox
//! cgroup) and the jail backend (the sandbox's cgroups on the host) both need, in one place:
//!
//! - [`CgroupDir`]: a cgroup directory held by a descriptor: its version (v1 or v2, from the
//!   filesystem's magic), which files it offers, reading and writing them, making and removing
//!   children (a child that still has processes is [`Removal::Busy`], not an error), its
//!   processes ([`CgroupDir::pids`]) and its `cgroup.events` (`populated`, `frozen`: [`CgroupDir::event`]).
//! - [`signal_pinned`]: signals the processes of a cgroup without ever reaching a process that
//!   reused a pid: each is pinned with a pidfd first and signalled only if the cgroup still
//!   lists it after pinning. [`pidfd`] has the two calls, in nix's types.
//! - [`parse_pids`]: the `cgroup.procs` format.
//!
//! Why its own crate, not a feature of dynocap-host: the agent is built static for musl and
//! must stay small, and dynocap-host is the host's (pasta, the id range pool, getifaddrs): a
//! crate with nothing but these primitives, whose dependencies are std, nix and rustix,
//! keeps that line a Cargo fact rather than a feature flag someone must remember to leave off.
//! No async runtime either: the agent's waits between kill rounds stay its own (tokio).
//!
//! What stayed apart, because the two sides differ in purpose, not in spelling:
//! - Discovering the host's hierarchies (v1, v2 or a hybrid, from mountinfo), the `dynocap`
//!   parent, the limit files and the memory bound over all sandboxes: dynocap-host and the
//!   jail. The agent never looks for a hierarchy: it is handed one delegated directory.
//! - Delegation (chowning a sandbox cgroup to the guest's root) and the guest's view of
//!   `/sys/fs/cgroup`: the jail's alone.
//! - How a whole cgroup is killed. The agent picks one method per delegated cgroup
//!   (`cgroup.kill`, a v2 freeze, or rounds of SIGKILL; never a v1 freeze, which would outlive
//!   an agent killed mid-way) and waits between rounds without blocking its runtime. The jail
//!   kills a sandbox's leaves in every hierarchy at once, thawing v1 freezers an agent left
//!   frozen, walking the guest-made tree below by path with a bound on its size. They share
//!   the steps ([`CgroupDir::write`] of `cgroup.kill`, [`signal_pinned`], [`parse_pids`]), not
//!   the loop.
//! - The jail's teardown walks paths (it holds none of the guest-made children open), with
//!   its own retry on EBUSY; the agent removes its own children by fd ([`CgroupDir::rmdir`]).

mod dir;
pub mod pidfd;
mod signal;

pub use dir::{CgroupDir, Removal, Version};
pub use signal::{signal_pinned, Unpinned};

use nix::unistd::Pid;

/// The pids a `cgroup.procs` (or `tasks`) file lists; anything not a number is skipped.
pub fn parse_pids(text: &str) -> Vec<Pid> {
    text.split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .map(Pid::from_raw)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_are_read_one_a_line() {
        assert_eq!(
            parse_pids("12\n345\n"),
            [Pid::from_raw(12), Pid::from_raw(345)]
        );
        assert!(parse_pids("").is_empty());
    }
}
