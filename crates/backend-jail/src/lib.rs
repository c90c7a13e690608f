//! DynoCap's jail backend: runs the guest agent as PID 1 of fresh user, mount, pid, network,
//! IPC, UTS and cgroup namespaces, on an overlay root, inside cgroup limits, with Docker's
//! default capabilities, `no_new_privs` and a seccomp allowlist.
//!
//! The engine calls [`Jail::spawn`] with a [`JailSpec`], talks to the agent over
//! [`Jail::take_channel`], watches [`Jail::pidfd`], and ends with [`Jail::destroy`];
//! [`cleanup_leftovers`] repairs after a supervisor that died, [`probe()`] reports what the
//! machine supports.
//!
//! How a jail comes up (supervisor on the left, guest init on the right):
//!
//! ```text
//! validate spec, private mount ns, state/disk.img
//! (a copy of a formatted template) + loop + mount on state/disk,
//! create state/{disk/upper,disk/work,root},
//! cgroups dynocap/<name> + limits, channels
//! [idmap_image: detached idmapped image mount]
//! open the v1 cgroups' tasks files
//! clone(NEWUSER|NEWNS|NEWPID|NEWNET|NEWIPC|NEWUTS) ──► joins its v1 cgroups ("0" > tasks),
//! write uid_map/gid_map,                             waits on the sync socket
//! release ─────────────────────────────────────────► / rslave, open host paths,
//! join it to v2 cgroups (meanwhile)                  become guest root, overlay + /proc
//!                                                    /dev /tmp + binds, pivot_root,
//!                                                    hostname, lo up, fds,
//! release ─────────────────────────────────────────► unshare(NEWCGROUP), caps,
//!                                                    no_new_privs, seccomp,
//!                                                    pdeathsig, execve(agent)
//! error pipe: EOF = running, text = failure ◄────────┘
//! ```
//!
//! # What the caller must do
//!
//! - Call [`Jail::spawn`] while the process has one thread (before any async runtime), from a
//!   thread that lives as long as the sandbox (the guest dies with that thread:
//!   `PR_SET_PDEATHSIG`).
//! - Not reap children it did not start (no `waitpid(-1)`, `SIGCHLD` not `SIG_IGN`):
//!   [`Jail::destroy`] reaps the init. Watch [`Jail::pidfd`] for the guest's death.
//! - Give the process fds 1 and 2 it is happy for the guest to inherit (its log): a pipe is
//!   safer than a log file, which the guest could truncate.
//! - Run as root for the full id range (guest `0..65536` on a host range of the pool from
//!   `1_000_000`: [`Jail::spawn_with_ids`]); an
//!   unprivileged caller gets one id (guest 1000) and needs `dynocap/` cgroup parents
//!   delegated to it.
//! - Know that an image owned by host root shows as `nobody` in the guest and is read-only to
//!   guest root there, unless [`JailSpec::idmap_image`] shows it through the guest's id map
//!   (a whole rootfs such as a built Debian image; root only); directories the guest must own
//!   (its `/root`, `/home/<user>`, `/workspace`) are created with [`JailSpec::guest_dirs`]. Bind targets must exist in the
//!   image when their parent is one of its (unwritable) directories.
//! - After a supervisor crash, call [`cleanup_leftovers`] before reusing the name.
//!
//! Module map: [`spec`](JailSpec) (what is asked), `spawn` + `child` (the two halves above),
//! `rootfs`/`resolve`/`newmount` (the filesystem), `idmapped` (a built image's lower
//! layer), `cgroup` (limits), `caps`, `seccomp`, `net`, `sync` (clone handshake), `disk` +
//! `disk_template` + `layers` + `remove` (state dir), `jail` (the handle), `cleanup`,
//! `probe`. The user namespace's id map, pasta for `nat`, the host's cgroup layout and the
//! memory bound over all sandboxes are dynocap-host's, which the vm backend's side shares.

mod cache_disk;
mod caps;
mod cgroup;
mod checkpoint;
mod child;
mod cleanup;
mod disk;
mod disk_template;
mod error;
mod failure;
mod idmapped;
mod jail;
mod layers;
mod net;
mod newmount;
mod pool;
mod probe;
mod remove;
mod resolve;
mod rootfs;
mod seccomp;
mod spawn;
mod spec;
mod sync;
mod sys;
mod sysview;
mod uts;

pub use cache_disk::{cache_failure, cache_room, CacheRoom};
pub use caps::{docker_default_mask, DOCKER_DEFAULT};
pub use cgroup::{CgroupLayoutKind, CgroupVersion, Controller, PARENT as CGROUP_PARENT};
pub use checkpoint::{
    allocated_bytes, copy_sparse, is_clone, mark_clone, reflinks, snapshot_disk, thaw_leftover,
};
pub use cleanup::{cleanup_leftovers, cleanup_leftovers_keeping_layers};
pub use disk::{
    disk_failure, disk_image, prepared_disk_image, release_prepared_disk, start_preparing_disk,
    sync_disk,
};
pub use disk_template::make_spare as make_spare_disk;
// dynocap-host's types in this crate's API: a jail's id map ([`Jail::spawn_with_ids`]) and
// what [`probe`] reports. The rest of the host's systems (pasta, the id ranges, the memory bound
// over all sandboxes) its users take from dynocap-host itself.
pub use dynocap_host::cgroup::{CgroupProbe, ControllerProbe};
pub use dynocap_host::{Check, IdMap};
pub use error::JailError;
pub use jail::Jail;
pub use pool::{
    check_pool_mountpoint, format_pool, mount_pool, pool_holders, pool_mounted, unmount_pool,
    PoolHolder,
};
pub use probe::{probe, Probe};
pub use spec::{
    CacheSpec, CacheSpot, GuestDir, JailSpec, Limits, RoBind, RwBind, AGENT_GUEST_PATH, CHANNEL_FD,
};
