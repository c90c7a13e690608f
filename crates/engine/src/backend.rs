//! The seam between the supervisor and the ways of booting a guest. A backend boots a guest
//! whose PID 1 is `dynocap-agent` and hands back a byte stream to it; everything else (exec,
//! import, diff, egress) goes through the agent, so it behaves the same on every backend.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::image::{Image, AGENT_STATE_DIR, SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID};
use crate::spec::Network;
use crate::usernet;

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
    /// The guest's disk (its writable layer); `None` for a sandbox recorded before disks had a
    /// size, whose kept layer is used as it is.
    pub disk_mb: Option<u64>,
    pub pids: u64,
    /// Boot over the writable layer a stopped guest of this sandbox kept (recovering a task
    /// whose work was not saved), instead of a fresh one.
    pub reuse_layer: bool,
    /// The sandbox's host id range (see [`crate::idpool`]); the same for every guest booted
    /// over one state directory.
    pub id_range: u32,
    /// The guest's network. A recovery boot ([`BootSpec::reuse_layer`]) gets `None` whatever
    /// the sandbox asked for: it only saves work.
    pub network: Network,
}

/// A running guest.
pub trait Guest: Send {
    /// The host end of the agent channel (taken once).
    fn take_channel(&mut self) -> Option<OwnedFd>;
    /// Becomes readable when the guest has died (a pidfd for the jail).
    fn exit_fd(&self) -> BorrowedFd<'_>;
    /// Host pid of the guest's init (or its VMM), for logs and diagnostics.
    fn pid(&self) -> i32;
    /// Readies an idle warm-pool guest for [`Guest::claim`], so that the claim, which is on
    /// its caller's path, does less.
    fn prepare_claim(&mut self) -> Result<()> {
        Ok(())
    }
    /// Sets aside on the host's filesystem the room the guest's disk may fill (see
    /// `disk_room`): after a boot, and for a warm-pool guest when it is claimed. Nothing to do
    /// for a guest whose disk is the host's own filesystem (disk limits off).
    fn reserve_disk(&self) -> Result<()>;
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
    fn layer_sync(&self) -> LayerSync {
        LayerSync::HostMount
    }
    /// Raises the guest's memory limit to `bytes` (never lowers it), for saving its work.
    fn raise_memory_limit(&self, bytes: u64) -> Result<()>;
    /// Stops the guest and releases its processes and resources, but keeps its writable layer
    /// (the agent's files) for a later guest to boot over ([`BootSpec::reuse_layer`]).
    fn stop_keeping_layer(self: Box<Self>) -> Result<()>;
    /// A `nat` guest's pasta ([`crate::usernet`]): a pidfd, readable once pasta has exited.
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
}

/// Where a guest's writes wait before they reach the host's disk, so that a task's work is
/// there after every command, whatever dies next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerSync {
    /// In the host's own page cache: the supervisor mounted the disk ([`sync_layer`]).
    HostMount,
    /// In the guest kernel's page cache, out of the host's reach: the agent syncs them to
    /// its virtual disk ([`dynocap_proto::Request::Sync`]), whose flush QEMU writes through
    /// to the host's file.
    GuestKernel,
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
    /// Removes whatever a sandbox whose supervisor died left behind. Idempotent.
    fn cleanup_leftovers(&self, id: &str, state_dir: &std::path::Path) -> Result<()>;
    /// As [`Backend::cleanup_leftovers`], but keeps the writable layer for a later guest.
    fn cleanup_keeping_layer(&self, id: &str, state_dir: &std::path::Path) -> Result<()>;
}

/// The backend a new sandbox asks for: the CLI's `--backend`, else `DYNOCAP_BACKEND`, else
/// `auto` (the best one this machine supports for the sandbox's image, see
/// [`crate::backend_auto`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    Jail,
    Vm,
    Auto,
}

impl BackendChoice {
    /// The values a choice is written as, for messages.
    pub const VALUES: &'static str = "jail, vm or auto";

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "jail" => Some(Self::Jail),
            "vm" => Some(Self::Vm),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }

    /// `DYNOCAP_BACKEND`; `auto` when it is unset or empty.
    pub fn from_env() -> Result<Self> {
        match std::env::var("DYNOCAP_BACKEND").ok().as_deref() {
            None | Some("") => Ok(Self::Auto),
            Some(name) => Self::parse(name).ok_or_else(|| {
                Error::invalid(format!(
                    "DYNOCAP_BACKEND={name} is not a backend; use {}",
                    Self::VALUES
                ))
            }),
        }
    }
}

/// Selects the backend for the default image: `DYNOCAP_BACKEND` if set, else (`auto`) the
/// best one this machine supports for it ([`crate::backend_auto`]).
pub fn select() -> Result<Box<dyn Backend>> {
    select_for(&crate::image::default_name())
}

/// Selects the backend for a new sandbox of the image named `image`, as `DYNOCAP_BACKEND`
/// says.
pub fn select_for(image: &str) -> Result<Box<dyn Backend>> {
    select_as(BackendChoice::from_env()?, image)
}

/// Selects the backend `choice` names for a new sandbox of the image named `image`.
pub fn select_as(choice: BackendChoice, image: &str) -> Result<Box<dyn Backend>> {
    match choice {
        BackendChoice::Jail => Ok(Box::new(JailBackend)),
        BackendChoice::Vm => Ok(Box::new(crate::vm_backend::VmBackend)),
        BackendChoice::Auto => {
            // Without a home there is no built image, so nothing a VM could boot.
            let auto = crate::home::Home::from_env()
                .map(|home| crate::backend_auto::choose(&home, image).backend);
            match auto {
                Ok("vm") => Ok(Box::new(crate::vm_backend::VmBackend)),
                _ => Ok(Box::new(JailBackend)),
            }
        }
    }
}

/// The backend a sandbox's record names: its guest is booted and cleaned up by the backend
/// it was created on, whatever `DYNOCAP_BACKEND` says now.
pub fn by_name(name: &str) -> Result<Box<dyn Backend>> {
    match name {
        "jail" => Ok(Box::new(JailBackend)),
        "vm" => Ok(Box::new(crate::vm_backend::VmBackend)),
        other => Err(Error::internal(format!(
            "the record names the backend \"{other}\", which this build does not have"
        ))),
    }
}

/// Writes what the guest wrote through to the host's disk, where a host crash cannot lose it
/// (the room is the disk's already: see `disk_room`). Blocking; call it from the supervisor,
/// which mounted the disk.
pub fn sync_layer(state_dir: &std::path::Path) -> Result<()> {
    dynocap_backend_jail::sync_disk(state_dir)
        .map_err(|err| Error::internal(format!("saving the sandbox's files: {err}")))
}

/// What went wrong with the jail's disk, if anything (see the jail's `disk_failure`).
/// Blocking; call it from the supervisor, which mounted the disk.
pub fn disk_failure(state_dir: &std::path::Path) -> Option<String> {
    dynocap_backend_jail::disk_failure(state_dir)
}

/// Linux namespaces, overlay root, seccomp, cgroups (crate `dynocap-backend-jail`).
pub struct JailBackend;

struct JailGuest {
    jail: dynocap_backend_jail::Jail,
    /// pasta, for a `nat` guest.
    usernet: Option<dynocap_backend_jail::UserNet>,
    /// The disk templates and this guest's disk size, for the spare its teardown leaves the
    /// next start of that size (see `dynocap_backend_jail::make_spare_disk`).
    spare_disk: Option<(std::path::PathBuf, u64)>,
    /// The disk's image and size, for its reservation; `None` without a disk limit.
    disk: Option<(std::path::PathBuf, u64)>,
}

impl Backend for JailBackend {
    fn name(&self) -> &'static str {
        "jail"
    }

    fn boot(&self, spec: &BootSpec) -> Result<Box<dyn Guest>> {
        use dynocap_backend_jail::{GuestDir, JailSpec, Limits, RoBind};
        let nat = spec.network == Network::Nat;
        let mut ro_binds: Vec<RoBind> = spec
            .image
            .ro_binds
            .iter()
            .map(|(source, target)| RoBind {
                source: source.clone(),
                target: target.clone(),
            })
            .collect();
        if nat {
            // Checked before anything is built: a missing pasta leaves no sandbox behind.
            usernet::available()?;
            ro_binds.push(RoBind {
                source: usernet::write_resolv_conf(&spec.state_dir)?,
                target: "/etc/resolv.conf".into(),
            });
        }
        let jail_spec = JailSpec {
            name: spec.id.clone(),
            hostname: spec.hostname.clone(),
            image_root: spec.image.root.clone(),
            ro_binds,
            state_dir: spec.state_dir.clone(),
            guest_dirs: vec![
                GuestDir {
                    path: SANDBOX_HOME.into(),
                    uid: SANDBOX_UID,
                    gid: SANDBOX_GID,
                    mode: 0o755,
                },
                // The agent's private state (baseline repository, received files): guest
                // root only, so nothing the sandbox user runs can read or move the baseline.
                GuestDir {
                    path: AGENT_STATE_DIR.into(),
                    uid: 0,
                    gid: 0,
                    mode: 0o700,
                },
            ],
            agent_binary: spec.agent_binary.clone(),
            agent_args: agent_args(&spec.image),
            limits: Limits {
                cpu_millis: u64::from(spec.cpus) * 1000,
                memory_bytes: spec.memory_mb * 1024 * 1024,
                pids: spec.pids,
            },
            reuse_layers: spec.reuse_layer,
            disk_bytes: disk_bytes(spec.disk_mb)?,
            disk_templates: Some(disk_templates(&spec.cache_dir)),
            net_raw: !nat,
            idmap_image: spec.image.owned_by_host_root,
        };
        let ids = dynocap_backend_jail::IdMap::for_current_process_in_range(spec.id_range)
            .map_err(|err| Error::internal(format!("choosing the jail's host ids: {err}")))?;
        let jail = dynocap_backend_jail::Jail::spawn_with_ids(&jail_spec, ids)
            .map_err(|err| Error::internal(format!("booting the jail: {err}")))?;
        // On failure the jail is dropped, which tears it down: no sandbox is left behind.
        let usernet = if nat {
            Some(usernet::start(jail.pid(), &spec.state_dir)?)
        } else {
            None
        };
        let spare_disk = jail_spec.disk_templates.clone().zip(jail_spec.disk_bytes);
        let disk = jail_spec
            .disk_bytes
            .map(|bytes| (dynocap_backend_jail::disk_image(&spec.state_dir), bytes));
        Ok(Box::new(JailGuest {
            jail,
            usernet,
            spare_disk,
            disk,
        }))
    }

    fn cleanup_leftovers(&self, id: &str, state_dir: &std::path::Path) -> Result<()> {
        dynocap_backend_jail::cleanup_leftovers(id, state_dir)
            .map_err(|err| Error::internal(format!("cleaning up sandbox {id}: {err}")))
    }

    fn cleanup_keeping_layer(&self, id: &str, state_dir: &std::path::Path) -> Result<()> {
        dynocap_backend_jail::cleanup_leftovers_keeping_layers(id, state_dir)
            .map_err(|err| Error::internal(format!("stopping what is left of sandbox {id}: {err}")))
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

/// For a supervisor standing by (see `standby`): starts making ahead, on a thread of its
/// own, what the default start of a raw sandbox needs of this machine and nothing of the
/// sandbox: on the jail backend, its disk (see the jail's `start_preparing_disk`), which the
/// start then waits for and takes if it is of that size. Nothing to do where the default
/// start would make none (the vm backend, disk limits off).
pub fn start_preparing_default_start(home: &crate::home::Home) -> Result<()> {
    if select_for(&crate::image::default_name())?.name() != "jail" {
        return Ok(());
    }
    let Some(bytes) = disk_bytes(None)? else {
        return Ok(());
    };
    dynocap_backend_jail::start_preparing_disk(disk_templates(&home.cache_dir()), bytes)
        .map_err(|err| Error::internal(format!("making a disk ahead: {err}")))
}

/// Where the jail's formatted empty disks are kept, under the home's cache.
fn disk_templates(cache_dir: &std::path::Path) -> PathBuf {
    cache_dir.join("disks")
}

/// The jail's disk size: `disk_mb`, unless the person running DynoCap turned disk limits off
/// (`DYNOCAP_DISK_LIMIT=off`, for rootless use where a loop mount is impossible). A fresh
/// sandbox recorded without a size gets the default.
fn disk_bytes(disk_mb: Option<u64>) -> Result<Option<u64>> {
    match std::env::var("DYNOCAP_DISK_LIMIT").ok().as_deref() {
        None | Some("") | Some("on") => {
            Ok(Some(disk_mb.unwrap_or(crate::spec::DISK_MB_DEFAULT) << 20))
        }
        Some("off") => Ok(None),
        Some(other) => Err(Error::invalid(format!(
            "DYNOCAP_DISK_LIMIT={other} is not valid; use on (the default) or off (no disk \
             limit: sandboxes write to the host's filesystem)"
        ))),
    }
}

impl Guest for JailGuest {
    fn take_channel(&mut self) -> Option<OwnedFd> {
        self.jail.take_channel()
    }
    fn network_exit_fd(&self) -> Option<BorrowedFd<'_>> {
        self.usernet.as_ref().and_then(|u| u.exit_fd())
    }
    fn network_exit(&mut self) -> String {
        self.usernet
            .as_mut()
            .map_or_else(|| "no network process".to_owned(), usernet::exit_of)
    }
    fn restart_network(&mut self) -> Result<()> {
        let netns = PathBuf::from(format!("/proc/{}/ns/net", self.jail.pid()));
        match self.usernet.as_mut() {
            Some(usernet) => usernet::restart(usernet, &netns),
            None => Err(Error::internal(
                "this guest has no network process to restart",
            )),
        }
    }
    fn end_network(&mut self) -> Result<()> {
        usernet::stop(&mut self.usernet)
    }
    fn exit_fd(&self) -> BorrowedFd<'_> {
        self.jail.pidfd()
    }
    fn pid(&self) -> i32 {
        self.jail.pid().as_raw()
    }
    fn prepare_claim(&mut self) -> Result<()> {
        // The claim renames the guest: its thread waits in the guest's UTS namespace.
        self.jail
            .prepare_rename()
            .map_err(|err| Error::internal(format!("starting the hostname thread: {err}")))
    }
    fn reserve_disk(&self) -> Result<()> {
        match &self.disk {
            Some((image, bytes)) if image.exists() => {
                crate::disk_room::reserve(image, *bytes, crate::disk_room::Layout::Fixed)
            }
            // A kept layer from a start without a limit: the host's filesystem holds it.
            _ => Ok(()),
        }
    }
    fn claim(&self, hostname: &str, cpus: u32, memory_mb: u64) -> Result<()> {
        self.jail
            .set_limits(&dynocap_backend_jail::Limits {
                cpu_millis: u64::from(cpus) * 1000,
                memory_bytes: memory_mb * 1024 * 1024,
                pids: crate::spec::PIDS_LIMIT,
            })
            .map_err(|err| Error::internal(format!("applying the claimed limits: {err}")))?;
        self.jail
            .set_hostname(hostname)
            .map_err(|err| Error::internal(format!("naming the claimed sandbox: {err}")))?;
        // A pool guest booted at the lowest priority (its supervisor's); its init leads its
        // own process group, which is all of the idle guest. Best effort, as the lowering was.
        // SAFETY: setpriority sets a scheduling value; no memory is involved.
        unsafe {
            libc::setpriority(libc::PRIO_PGRP, self.jail.pid().as_raw().unsigned_abs(), 0);
        }
        Ok(())
    }
    fn kill(&mut self) -> Result<()> {
        let network = crate::usernet::stop(&mut self.usernet);
        self.jail
            .kill()
            .map_err(|err| Error::internal(format!("killing the jail: {err}")))?;
        network
    }
    fn destroy(mut self: Box<Self>) -> Result<()> {
        let network = crate::usernet::stop(&mut self.usernet);
        self.jail
            .destroy()
            .map_err(|err| Error::internal(format!("destroying the jail: {err}")))?;
        // After the reply (a teardown's place), so the next start's disk is ready and flushed
        // without anyone waiting for it. Best effort: without a spare, a start copies.
        if let Some((templates, bytes)) = &self.spare_disk {
            if let Err(err) = dynocap_backend_jail::make_spare_disk(templates, *bytes) {
                tracing::warn!("leaving a spare disk for the next start: {err}");
            }
        }
        network
    }
    fn oom_counter(&self) -> OomCounter {
        self.jail
            .cgroup_paths()
            .into_iter()
            .find_map(|dir| {
                ["memory.events", "memory.oom_control"]
                    .iter()
                    .map(|file| dir.join(file))
                    .find(|path| path.is_file())
            })
            .map_or(OomCounter::None, OomCounter::HostFile)
    }
    fn raise_memory_limit(&self, bytes: u64) -> Result<()> {
        self.jail
            .raise_memory_limit(bytes)
            .map_err(|err| Error::internal(format!("raising the guest's memory limit: {err}")))
    }
    fn stop_keeping_layer(mut self: Box<Self>) -> Result<()> {
        let network = crate::usernet::stop(&mut self.usernet);
        self.jail
            .stop_keeping_layers()
            .map_err(|err| Error::internal(format!("stopping the jail: {err}")))?;
        network
    }
}
