//! How guest uids/gids map to host ids ([`IdMap`]), and writing that map into a new user
//! namespace (`/proc/<pid>/{setgroups,uid_map,gid_map}`).
//!
//! Two modes:
//! - **root** (the supervisor runs as host root): guest ids `0..65536` map to one range of
//!   the pool, host `1_000_000 + i * 65536 ..` for the range index `i` the engine allocated
//!   to the sandbox (as Podman's `--userns=auto` does). Guest root is never host root; host
//!   ids below the pool (the host's own users) do not exist in the guest, so host files show
//!   as `nobody`.
//! - **rootless** (an unprivileged supervisor): the kernel allows mapping only the caller's
//!   own ids, which appear as guest `1000:1000`; `setgroups` is denied (required before an
//!   unprivileged `gid_map` write, and it means the guest cannot drop the caller's
//!   supplementary groups).
//!
//! Distinct ranges keep live sandboxes apart even past their namespaces: a guest that
//! escapes its mount tree still finds every other sandbox's files owned by ids it does not
//! hold, and cannot signal or ptrace their processes.

use std::path::PathBuf;

use nix::unistd::{getegid, geteuid, Pid};

use crate::error::{HostError, HINT_PRIVILEGE};

/// First host id of the range guest ids map to when the supervisor runs as root.
pub const ROOT_MODE_HOST_BASE: u32 = 1_000_000;
/// Number of guest ids mapped when the supervisor runs as root.
pub const ROOT_MODE_COUNT: u32 = 65_536;
/// How many ranges the root-mode pool holds: host ids `1_000_000..1_074_741_824`, below
/// 2^31 so no tool that stores a uid in a signed 32-bit int (or the kernel's `(uid_t)-1`
/// "no change" value) ever meets one.
pub const ROOT_MODE_RANGES: u32 = 16_384;
/// Guest uid and gid the caller's own ids appear as when the supervisor is unprivileged.
pub const ROOTLESS_GUEST_ID: u32 = 1000;

/// One contiguous mapping: guest ids `guest..guest+count` are host ids `host..host+count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// First id inside the namespace.
    pub guest: u32,
    /// First id outside.
    pub host: u32,
    /// How many ids.
    pub count: u32,
}

impl IdRange {
    fn to_host(self, guest: u32) -> Option<u32> {
        let offset = guest.checked_sub(self.guest)?;
        (offset < self.count).then(|| self.host + offset)
    }

    fn to_guest(self, host: u32) -> Option<u32> {
        let offset = host.checked_sub(self.host)?;
        (offset < self.count).then(|| self.guest + offset)
    }

    /// The `/proc/<pid>/uid_map` line for this range.
    fn map_line(self) -> String {
        format!("{} {} {}\n", self.guest, self.host, self.count)
    }
}

/// How guest ids map to host ids for one jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// The uid mapping.
    pub uids: IdRange,
    /// The gid mapping.
    pub gids: IdRange,
    rootless: bool,
}

impl IdMap {
    /// The map a jail spawned by this process gets: root mode when the effective uid is 0,
    /// else rootless.
    pub fn for_current_process() -> IdMap {
        let uid = geteuid();
        if uid.is_root() {
            IdMap::root_mode()
        } else {
            IdMap::rootless(uid.as_raw(), getegid().as_raw())
        }
    }

    /// As [`IdMap::for_current_process`], with root mode on range `index` of the pool
    /// (see [`IdMap::root_mode_at`]); a rootless map has no pool and ignores it.
    pub fn for_current_process_in_range(index: u32) -> Result<IdMap, HostError> {
        let uid = geteuid();
        if uid.is_root() {
            IdMap::root_mode_at(index)
        } else {
            Ok(IdMap::rootless(uid.as_raw(), getegid().as_raw()))
        }
    }

    /// Guest `0..65536` on host `1_000_000..1_065_536` (range 0 of the pool).
    pub fn root_mode() -> IdMap {
        IdMap::root_mode_range(0)
    }

    /// Guest `0..65536` on host `1_000_000 + index * 65536 ..`; `index` must be below
    /// [`ROOT_MODE_RANGES`].
    pub fn root_mode_at(index: u32) -> Result<IdMap, HostError> {
        if index >= ROOT_MODE_RANGES {
            return Err(HostError::IdRangeOutsidePool {
                index,
                pool: ROOT_MODE_RANGES,
            });
        }
        Ok(IdMap::root_mode_range(index))
    }

    fn root_mode_range(index: u32) -> IdMap {
        let range = IdRange {
            guest: 0,
            // Cannot overflow: index < ROOT_MODE_RANGES keeps this below 2^31.
            host: ROOT_MODE_HOST_BASE + index * ROOT_MODE_COUNT,
            count: ROOT_MODE_COUNT,
        };
        IdMap {
            uids: range,
            gids: range,
            rootless: false,
        }
    }

    /// The caller's `host_uid`/`host_gid` as guest 1000:1000, nothing else mapped.
    pub fn rootless(host_uid: u32, host_gid: u32) -> IdMap {
        let one = |host| IdRange {
            guest: ROOTLESS_GUEST_ID,
            host,
            count: 1,
        };
        IdMap {
            uids: one(host_uid),
            gids: one(host_gid),
            rootless: true,
        }
    }

    /// The map of an idmapped mount that shows files written under `from`'s host ids as
    /// `to`'s: on disk (inside) `from`'s host ids, seen (outside) as `to`'s, guest id for
    /// guest id. How a jail shows a disk whose files another sandbox wrote (a fork's) as its
    /// own without changing a byte of it. `None` when the two do not map the same guest ids
    /// (a rootless map, or ranges of different sizes).
    pub fn between(from: &IdMap, to: &IdMap) -> Option<IdMap> {
        let same_guests = |a: IdRange, b: IdRange| a.guest == b.guest && a.count == b.count;
        if from.rootless || to.rootless || !same_guests(from.uids, to.uids) {
            return None;
        }
        if !same_guests(from.gids, to.gids) {
            return None;
        }
        let moved = |a: IdRange, b: IdRange| IdRange {
            guest: a.host,
            host: b.host,
            count: a.count,
        };
        Some(IdMap {
            uids: moved(from.uids, to.uids),
            gids: moved(from.gids, to.gids),
            rootless: false,
        })
    }

    /// The host uid a guest uid is, if it is mapped.
    pub fn to_host(&self, guest_uid: u32) -> Option<u32> {
        self.uids.to_host(guest_uid)
    }

    /// The host gid a guest gid is, if it is mapped.
    pub fn gid_to_host(&self, guest_gid: u32) -> Option<u32> {
        self.gids.to_host(guest_gid)
    }

    /// The guest uid a host uid appears as, if it is mapped.
    pub fn to_guest(&self, host_uid: u32) -> Option<u32> {
        self.uids.to_guest(host_uid)
    }

    /// The guest gid a host gid appears as, if it is mapped.
    pub fn gid_to_guest(&self, host_gid: u32) -> Option<u32> {
        self.gids.to_guest(host_gid)
    }

    /// True when only the caller's own ids are mapped (unprivileged supervisor).
    pub fn is_rootless(&self) -> bool {
        self.rootless
    }

    /// Guest uid the agent runs as: 0 in root mode, 1000 when rootless.
    pub fn init_uid(&self) -> u32 {
        if self.rootless {
            ROOTLESS_GUEST_ID
        } else {
            0
        }
    }

    /// Guest gid the agent runs as.
    pub fn init_gid(&self) -> u32 {
        self.init_uid()
    }

    /// Host uid/gid that own what the guest init owns: the overlay's upper and work dirs.
    pub fn init_host_ids(&self) -> (u32, u32) {
        // The init ids lie inside their ranges by construction: the fallbacks are never taken.
        (
            self.to_host(self.init_uid()).unwrap_or(self.uids.host),
            self.gid_to_host(self.init_gid()).unwrap_or(self.gids.host),
        )
    }

    /// Writes the map for the (not yet running) child `pid` that owns a fresh user namespace.
    pub fn write_for(&self, pid: Pid) -> Result<(), HostError> {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let write = |file: &str, content: &str| {
            let path = proc_dir.join(file);
            // One write(2): the kernel accepts a map only in a single write.
            std::fs::write(&path, content).map_err(|e| {
                HostError::io(&format!("write {content:?} to"), &path, e).hint(HINT_PRIVILEGE)
            })
        };
        if self.rootless {
            write("setgroups", "deny")?;
        }
        write("uid_map", &self.uids.map_line())?;
        write("gid_map", &self.gids.map_line())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_mode_never_maps_host_root() {
        let map = IdMap::root_mode();
        assert_eq!(map.to_host(0), Some(1_000_000));
        assert_eq!(map.to_host(1000), Some(1_001_000));
        assert_eq!(map.to_host(65_535), Some(1_065_535));
        assert_eq!(map.to_host(65_536), None);
        assert_eq!(map.to_guest(0), None);
        assert_eq!(map.to_guest(1_000_000), Some(0));
        assert_eq!(map.init_uid(), 0);
        assert_eq!(map.init_host_ids(), (1_000_000, 1_000_000));
        assert_eq!(map.uids.map_line(), "0 1000000 65536\n");
    }

    #[test]
    fn a_map_between_ranges_shows_one_ranges_files_as_the_others() {
        let from = IdMap::root_mode_at(3).expect("range 3");
        let to = IdMap::root_mode_at(7).expect("range 7");
        let between = IdMap::between(&from, &to).expect("same guests");
        for guest in [0, 1000, 65_535] {
            let on_disk = from.to_host(guest).expect("mapped");
            // The mount's "inside" is what the disk holds; "outside" what the jail sees.
            assert_eq!(between.to_host(on_disk), to.to_host(guest), "{guest}");
            assert_eq!(
                between.gid_to_host(on_disk),
                to.gid_to_host(guest),
                "{guest}"
            );
        }
        assert_eq!(between.to_host(from.to_host(0).expect("mapped") - 1), None);
        assert_eq!(
            between.uids.map_line(),
            format!(
                "{} {} 65536\n",
                1_000_000 + 3 * 65_536,
                1_000_000 + 7 * 65_536
            )
        );
        assert_eq!(IdMap::between(&from, &IdMap::rootless(1000, 1000)), None);
        assert_eq!(IdMap::between(&IdMap::rootless(1000, 1000), &to), None);
    }

    #[test]
    fn pool_ranges_are_disjoint_and_bounded() {
        let first = IdMap::root_mode_at(0).expect("range 0");
        assert_eq!(first, IdMap::root_mode());
        let second = IdMap::root_mode_at(1).expect("range 1");
        assert_eq!(second.to_host(0), Some(1_065_536));
        assert_eq!(second.to_guest(1_065_535), None);
        assert_eq!(first.to_guest(1_065_536), None);
        let last = IdMap::root_mode_at(ROOT_MODE_RANGES - 1).expect("last range");
        let top = last.to_host(ROOT_MODE_COUNT - 1).expect("mapped");
        assert!(top < 1 << 31, "{top}");
        assert_eq!(last.uids.map_line(), format!("0 {} 65536\n", top - 65_535));
        let outside = IdMap::root_mode_at(ROOT_MODE_RANGES).expect_err("outside the pool");
        assert_eq!(
            outside.to_string(),
            "invalid jail spec: id range 16384 is outside the pool of 16384 ranges"
        );
        assert!(IdMap::root_mode_at(u32::MAX).is_err());
    }

    #[test]
    fn rootless_maps_only_the_caller() {
        let map = IdMap::rootless(1234, 5678);
        assert_eq!(map.to_host(1000), Some(1234));
        assert_eq!(map.gid_to_host(1000), Some(5678));
        assert_eq!(map.to_host(0), None);
        assert_eq!(map.to_host(1001), None);
        assert_eq!(map.init_uid(), 1000);
        assert_eq!(map.init_host_ids(), (1234, 5678));
        assert_eq!(map.gids.map_line(), "1000 5678 1\n");
    }
}
