//! The seam between the supervisor and the ways of booting a guest. A backend boots a guest
//! whose PID 1 is `dynocap-agent` and hands back a byte stream to it; everything else (exec,
//! import, diff, egress) goes through the agent, so it behaves the same on every backend.
//!
//! Each backend lives in a module of its own ([`jail`], [`vm`]) and is reached only through
//! the [`Backend`] and [`Guest`] traits: what differs between them (whether a booted guest can
//! be claimed, what a standby makes ahead, where a guest's writes wait to reach the host) is
//! a trait method, never a comparison of names. [`all`] is the one list of the backends this
//! build has: [`by_name`] and `dynocap doctor` go through it, and each backend answers for
//! itself whether it can run on this machine ([`Backend::machine_checks`],
//! [`Backend::start_check`]: the jail's kernel probe, `jail_ready`; the vm's boot check,
//! `vm_ready`). A new backend is a module, a line in [`all`] and one in [`BackendChoice`].
//!
//! The backend layer may import the foundation, the model, the host layer, the store and the
//! images; never the supervisor or the client facade above it.

pub mod auto;
mod jail;
mod jail_ready;
mod readiness;
mod vm;
mod vm_live;
mod vm_ready;

pub use readiness::Readiness;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::image::{Image, SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID};
pub use crate::model::backend_choice::BackendChoice;
use crate::model::config::Config;
use crate::model::spec::Network;

pub use jail::JailBackend;
pub use vm::{VmBackend, NAME as VM};

/// Everything a backend needs to boot one guest.
#[derive(Debug, Clone)]
pub struct BootSpec {
    /// Unique, stable id: names cgroups and state; never reused.
    pub id: String,
    /// The guest's hostname (the sandbox name).
    pub hostname: String,
    pub image: Image,
    pub state_dir: PathBuf,
    /// Where a backend keeps what it builds once and reuses across sandboxes (formatted disk
    /// templates, boot images), keyed by content.
    pub cache_dir: PathBuf,
    pub agent_binary: PathBuf,
    pub cpus: u32,
    pub memory_mb: u64,
    /// The guest's disk (its writable layer).
    pub disk_mb: u64,
    /// `DYNOCAP_DISK_LIMIT` as given (see [`Config::disk_limit`]): only the jail obeys it,
    /// so only the jail checks it.
    pub disk_limit: Option<String>,
    /// `DYNOCAP_VM_ACCEL` as given (see [`Config::vm_accel`]): only the vm checks it.
    pub vm_accel: Option<String>,
    /// `DYNOCAP_EXEC_CGROUP` as given (see [`Config::exec_cgroup`]): only the jail checks it.
    pub exec_cgroup: Option<String>,
    pub pids: u64,
    /// Boot over the writable layer a stopped guest of this sandbox kept (recovering a task
    /// whose work was not saved), instead of a fresh one.
    pub reuse_layer: bool,
    /// The sandbox's host id range (see [`crate::host::idpool`]); the same for every guest booted
    /// over one state directory.
    pub id_range: u32,
    /// With [`BootSpec::reuse_layer`]: the host id range the kept layer was written under when
    /// it is another sandbox's (a fork's copy of its source's disk), so the backend moves its
    /// files to this sandbox's ids. `None`: the layer is this sandbox's own.
    pub layer_id_range: Option<u32>,
    /// The guest's network. A recovery boot ([`BootSpec::reuse_layer`]) gets `None` whatever
    /// the sandbox asked for: it only saves work.
    pub network: Network,
    /// The host's extra CAs (`DYNOCAP_EXTRA_CA`, PEM) when the sandbox's egress has them. The
    /// guest's agent adds them to the system CA bundles of the guest's own image; a bundle
    /// the jail binds from the host read-only, it cannot write, so the jail binds one that
    /// holds them too over it.
    pub extra_ca: Option<String>,
    /// A task's project's package caches (see `host::project_cache`), which the guest gets
    /// read-write where pip, npm, cargo, go and apt keep their downloads; `None` for a raw
    /// sandbox, a task without caches and a recovery boot.
    pub project_cache: Option<crate::host::project_cache::ProjectCache>,
}

/// A running guest.
pub trait Guest: Send {
    /// The host end of the agent channel (taken once).
    fn take_channel(&mut self) -> Option<OwnedFd>;
    /// Becomes readable when the guest has died (a pidfd for the jail).
    fn exit_fd(&self) -> BorrowedFd<'_>;
    /// Host pid of the guest's init (or its VMM), for logs and diagnostics.
    fn pid(&self) -> i32;
    /// The guest's network namespace, opened, when the guest shares the host's kernel (a
    /// jail): the supervisor makes port forwards' connections there itself (see
    /// `supervisor::ports`). `None` for a guest with its own kernel.
    fn network_namespace(&self) -> Option<std::fs::File> {
        None
    }
    /// Readies an idle warm-pool guest for [`Guest::claim`], so that the claim, which is on
    /// its caller's path, does less.
    fn prepare_claim(&mut self) -> Result<()> {
        Ok(())
    }
    /// The room on the host's filesystem the guest's disk may fill, which the supervisor
    /// reserves (see `disk_room`): after a boot, and for a warm-pool guest when it is
    /// claimed. `None` for a guest whose disk is the host's own filesystem (disk limits off).
    fn disk_room(&self) -> Option<crate::host::disk_room::DiskRoom>;
    /// Makes a booted, idle warm-pool guest its claimer's: its hostname and limits.
    fn claim(&self, hostname: &str, cpus: u32, memory_mb: u64) -> Result<()>;
    /// Kills every process of the guest at once, leaving the rest of [`Guest::destroy`] (its
    /// cgroups, disk and files) for later: a destroyed sandbox runs nothing from this call on.
    fn kill(&mut self) -> Result<()>;
    /// Stops the guest and releases everything it held, its writable layer included.
    fn destroy(self: Box<Self>) -> Result<()>;
    /// Where the count of the guest's OOM kills is kept.
    fn oom_counter(&self) -> OomCounter;
    /// Who must flush the guest's writes for them to be on the host's disk.
    fn layer_sync(&self) -> LayerSync;
    /// Raises the guest's memory limit to `bytes` (never lowers it), for saving its work.
    fn raise_memory_limit(&self, bytes: u64) -> Result<()>;
    /// Stops the guest and releases its processes and resources, but keeps its writable layer
    /// (the agent's files) for a later guest to boot over ([`BootSpec::reuse_layer`]).
    fn stop_keeping_layer(self: Box<Self>) -> Result<()>;
    /// The guest's disk as a chain of layers whose writable top can be frozen while the guest
    /// runs (the vm's), for checkpoints and forks; `None` for a disk they copy instead (the
    /// jail's, through [`LayerSync::HostMount`]).
    fn layered_disk(&self) -> Option<Arc<dyn LayeredDisk>> {
        None
    }
    /// A `nat` guest's pasta ([`crate::host::usernet`]): a pidfd, readable once pasta has exited.
    /// `None` for a guest without one (or whose network was ended).
    fn network_exit_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// How the guest's pasta exited, reaping it ("signal: 9 (SIGKILL)").
    fn network_exit(&mut self) -> String {
        "no network process".to_owned()
    }
    /// Starts the guest's pasta again, with the configuration it first had. Call from the
    /// thread that booted the guest: pasta dies with that thread.
    fn restart_network(&mut self) -> Result<()> {
        Err(Error::internal(
            "this guest has no network process to restart",
        ))
    }
    /// Ends the guest's network for good (its pasta, if any is left).
    fn end_network(&mut self) -> Result<()> {
        Ok(())
    }
    /// Saves the running guest, its processes included, for a live fork whose state
    /// directory is `fork_dir`: its memory and devices and a copy of its disk, taken while it
    /// is paused; then it runs on. Blocking.
    fn save_live(&mut self, _fork_dir: &std::path::Path) -> Result<LiveSaved> {
        Err(Error::invalid(
            "a live fork (--live) keeps the guest's running processes, which only the vm \
             backend can save; this task runs on another backend: fork it without --live",
        ))
    }
    /// For a guest resumed from another's save ([`Guest::save_live`]): the hostname its agent,
    /// in the middle of the saved guest's session, is asked to start a new one under.
    fn rejoin_as(&self) -> Option<&str> {
        None
    }
}

/// What [`Guest::save_live`] made.
#[derive(Debug, Clone, Copy)]
pub struct LiveSaved {
    /// The saved memory and devices, in bytes.
    pub state_bytes: u64,
    /// The disk's copy, in bytes.
    pub disk_bytes: u64,
    /// How long the guest was paused.
    pub paused: std::time::Duration,
}

/// Where a guest's writes wait before they reach the host's disk, so that a task's work is
/// there after every command, whatever dies next.
#[derive(Clone)]
pub enum LayerSync {
    /// In the host's own page cache: the supervisor mounted the disk, which the handle
    /// syncs and reads the health of.
    HostMount(Arc<dyn HostDisk>),
    /// In the guest kernel's page cache, out of the host's reach: the agent syncs them to
    /// its virtual disk ([`dynocap_proto::Request::Sync`]), whose flush QEMU writes through
    /// to the host's file.
    GuestKernel,
}

/// A guest's disk mounted on the host by the supervisor. Both calls block; make them from
/// the supervisor, the process that mounted it.
pub trait HostDisk: Send + Sync {
    /// Writes what the guest wrote through to the host's disk, where a host crash cannot lose
    /// it (the room is the disk's already: see `disk_room`).
    fn sync(&self) -> Result<()>;
    /// What went wrong with the disk, if anything: errors its filesystem recorded, or its
    /// going read-only (the project's package cache's too, when the guest has one).
    fn failure(&self) -> Option<String>;
    /// What a command's result says when the project's package cache the guest has is full
    /// (see `project_cache::full_note`); `None` when it has room, or no cache.
    fn cache_full(&self) -> Option<String> {
        None
    }
    /// Copies the disk, as it is at one instant, to the new file `dest` (a checkpoint, or a
    /// fork's disk); `during` runs while the guest's writes are held, after the copy. Returns
    /// the bytes the copy holds.
    fn snapshot(
        &self,
        dest: &std::path::Path,
        during: &mut dyn FnMut() -> Result<()>,
    ) -> Result<u64>;
}

/// A running guest's disk made of copy-on-write layer files in its state directory (the vm's
/// qcow2 chain in `vm/`, see `dynocap_backend_vm::layers`). Blocking; call from a blocking
/// thread.
pub trait LayeredDisk: Send + Sync {
    /// Freezes the writable layer at this instant: it becomes read-only and shared, the guest
    /// going on on a new empty layer above it. Returns the frozen layer's file name, in
    /// `vm/` of the state directory, and the bytes it holds. What the guest's kernel has not
    /// written to its disk yet is not in it: sync the guest first.
    fn freeze(&self) -> Result<(String, u64)>;
    /// The bytes a [`freeze`](Self::freeze) now takes from the host's free space: the
    /// writable layer's data stays, as the frozen layer, and the new layer sets aside the
    /// disk's room again (a task started fresh's; a fork's layers set nothing aside, and its
    /// freeze takes nothing). Layers frozen before count nothing: they are on the host's disk
    /// already, once, however many checkpoints and forks link them.
    fn freeze_cost(&self) -> u64;
}

/// Where a guest's OOM kills are counted, so a command can be told that the memory limit
/// killed part of it (a shell reports that only as exit status 137).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OomCounter {
    /// A host file with an `oom_kill N` line: the guest's memory cgroup (`memory.events`,
    /// `memory.oom_control`).
    HostFile(PathBuf),
    /// The guest runs its own kernel, out of the host's sight: the agent reads the count
    /// there ([`dynocap_proto::Request::OomKills`]).
    GuestKernel,
    /// Nowhere.
    None,
}

pub trait Backend {
    fn name(&self) -> &'static str;
    /// Boots a guest. May require the calling process to be single-threaded.
    fn boot(&self, spec: &BootSpec) -> Result<Box<dyn Guest>>;
    /// Whether an idle booted guest can become a caller's ([`Guest::claim`]), so that a warm
    /// pool of them is worth keeping.
    fn keeps_a_warm_pool(&self) -> bool {
        false
    }
    /// For a supervisor standing by (see `standby`): starts making ahead, on a thread of its
    /// own, what the default start of a raw sandbox needs of this machine and nothing of the
    /// sandbox. Nothing by default.
    fn prepare_default_start(
        &self,
        _home: &crate::host::home::Home,
        _config: &Config,
    ) -> Result<()> {
        Ok(())
    }
    /// Gives back what [`Backend::prepare_default_start`] made and the boot did not take.
    fn release_preparations(&self) {}
    /// Removes whatever a sandbox whose supervisor died left behind. Idempotent.
    fn cleanup_leftovers(&self, id: &str, state_dir: &std::path::Path) -> Result<()>;
    /// As [`Backend::cleanup_leftovers`], but keeps the writable layer for a later guest.
    fn cleanup_keeping_layer(&self, id: &str, state_dir: &std::path::Path) -> Result<()>;
    /// What this machine must have for the backend at all (the kernel features a jail is
    /// made of), probed now: the first rows of `dynocap doctor`. None by default.
    fn machine_checks(&self) -> Vec<Readiness> {
        Vec::new()
    }
    /// Whether a sandbox of this backend starts here as `config` stands, decided as its
    /// first start decides: a row of `dynocap doctor` after the configuration's. `chosen`:
    /// `DYNOCAP_BACKEND` names this backend, so every sandbox is one of its and the row is
    /// required. None by default.
    fn start_check(&self, _config: &Config, _chosen: bool) -> Option<Readiness> {
        None
    }
    /// What `dynocap doctor` adds to "`name` (DYNOCAP_BACKEND)" when `DYNOCAP_BACKEND` names
    /// this backend: where its report says whether those sandboxes start.
    fn chosen_note(&self) -> Option<&'static str> {
        None
    }
}

/// Selects the backend for the default image: `DYNOCAP_BACKEND` if set, else (`auto`) the
/// best one this machine supports for it ([`auto`]).
pub fn select(config: &Config) -> Result<Box<dyn Backend>> {
    select_for(config, &config.images.default_name())
}

/// Selects the backend for a new sandbox of the image named `image`, as `DYNOCAP_BACKEND`
/// says.
pub fn select_for(config: &Config, image: &str) -> Result<Box<dyn Backend>> {
    select_as(config, config.backend_choice()?, image)
}

/// Selects the backend `choice` names for a new sandbox of the image named `image`.
pub fn select_as(config: &Config, choice: BackendChoice, image: &str) -> Result<Box<dyn Backend>> {
    match choice {
        BackendChoice::Jail => Ok(Box::new(JailBackend)),
        BackendChoice::Vm => Ok(Box::new(VmBackend)),
        BackendChoice::Auto => {
            // Without a home there is no built image, so nothing a VM could boot.
            let auto = crate::host::home::Home::without_pool(&config.home)
                .map(|home| auto::choose(&home, image).backend);
            match auto {
                Ok(name) => by_name(name),
                Err(_) => Ok(Box::new(JailBackend)),
            }
        }
    }
}

/// The backend a sandbox's record names: its guest is booted and cleaned up by the backend
/// it was created on, whatever `DYNOCAP_BACKEND` says now.
pub fn by_name(name: &str) -> Result<Box<dyn Backend>> {
    all()
        .into_iter()
        .find(|backend| backend.name() == name)
        .ok_or_else(|| {
            BackendFailure::Unknown {
                name: name.to_owned(),
            }
            .into()
        })
}

/// Every backend this build has, in the order `dynocap doctor` reports them: the one list of
/// them, for what concerns them all.
pub fn all() -> Vec<Box<dyn Backend>> {
    vec![Box::new(JailBackend), Box::new(VmBackend)]
}

/// For a supervisor standing by (see `standby`): starts making ahead what the default start
/// of a raw sandbox needs, on the backend that start would take.
pub fn start_preparing_default_start(
    home: &crate::host::home::Home,
    config: &Config,
) -> Result<()> {
    select(config)?.prepare_default_start(home, config)
}

/// Gives back what a standby made ahead and the boot did not take (another backend, a
/// failure): of no further use once a boot is done.
pub fn release_unused_preparations() {
    for backend in all() {
        backend.release_preparations();
    }
}

/// The agent's command line after its channel: who commands run as, and, in an image that
/// opts in, the `sudo` broker (see the agent's `sudo` module). The same for every backend.
pub fn agent_args(image: &Image) -> Vec<String> {
    let mut args = vec![
        "--exec-user".into(),
        format!("{SANDBOX_UID}:{SANDBOX_GID}"),
        "--home".into(),
        SANDBOX_HOME.into(),
    ];
    if image.guest_sudo {
        args.push("--sudo-broker".into());
    }
    args
}

/// What failed choosing a backend for a recorded sandbox (the backends' own failures are
/// theirs: `jail::JailFailure`, `vm::VmFailure`).
#[derive(Debug, thiserror::Error)]
enum BackendFailure {
    /// A record written by a build with a backend this one lacks.
    #[error("the record names the backend \"{name}\", which this build does not have")]
    Unknown { name: String },
}

impl Coded for BackendFailure {
    fn code(&self) -> ErrorCode {
        match self {
            Self::Unknown { .. } => ErrorCode::Internal,
        }
    }
}
