//! The `vm` backend behind the [`Backend`] trait: each guest is a QEMU microVM booting the
//! image's own kernel (crate `dynocap-backend-vm`). Selected with `DYNOCAP_BACKEND=vm`;
//! `DYNOCAP_VM_ACCEL=kvm|tcg` (handed down in the boot spec) chooses the accelerator (see
//! that crate's `accel`).
//!
//! Network `nat`: QEMU runs in a network namespace of its own with user networking (slirp),
//! and the jail's pasta ([`crate::host::usernet`]) serves that namespace exactly as it serves a
//! jail's, with the same `prohibit` routes for the host's own addresses. Those routes live
//! in the namespace, out of the guest kernel's reach: guest root can rewrite the guest's
//! routes and use raw sockets, and every packet still becomes a socket of QEMU's (an
//! unprivileged uid, no `CAP_NET_ADMIN` there) that pasta carries out. Slirp's alias for
//! "the host's loopback" leads to the namespace's own, empty loopback.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dynocap_backend_vm::{AccelChoice, Vm, VmError, VmPaths, VmSpec};

use super::{agent_args, Backend, BootSpec, Guest, LayerSync, LayeredDisk, OomCounter, Readiness};
use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::host::usernet;
use crate::model::spec::Network;

/// How long a guest may take from QEMU's start to the agent's first word. TCG on a loaded
/// 2-core machine takes seconds; a minute and a half more is for a machine far busier.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

pub struct VmBackend;

struct VmGuest {
    /// Shared with the disk's freeze handle ([`VmLayers`]); taken out when the guest ends.
    vm: SharedVm,
    /// QEMU's pidfd (a copy: the guest's own is behind the lock) and pid, and the VM's files.
    pidfd: OwnedFd,
    pid: i32,
    paths: VmPaths,
    /// The layer's virtual size, for its reservation.
    disk_bytes: u64,
    /// Whether the guest's writable layers have the disk's room set aside on the host: a task
    /// started fresh's do, a fork's do not (`dynocap_backend_vm::layers`' `UNRESERVED`).
    reserved: bool,
    /// The guest's memory: what a live save's state file may take on the host.
    memory_bytes: u64,
    /// A live fork's resumed guest: the hostname its agent rejoins under.
    rejoin: Option<String>,
    /// pasta, for a `nat` guest.
    usernet: Option<dynocap_host::UserNet>,
    /// The hold on the project's cache disk while this guest has it read-write.
    _cache_lock: Option<std::fs::File>,
}

/// The backend's name, as records and `--backend` spell it.
pub const NAME: &str = "vm";

impl Backend for VmBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn start_check(
        &self,
        config: &crate::model::config::Config,
        chosen: bool,
    ) -> Option<Readiness> {
        Some(super::vm_ready::start_check(config, chosen))
    }

    fn chosen_note(&self) -> Option<&'static str> {
        Some("whether VMs start here: the vm backend check")
    }

    fn boot(&self, spec: &BootSpec) -> Result<Box<dyn Guest>> {
        if !spec.image.ro_binds.is_empty() {
            return Err(Error::invalid(format!(
                "the vm backend cannot boot the image \"{}\": it is made of the host's own \
                 directories; build a guest image with `dynocap image build debian` and start \
                 the sandbox with it",
                spec.image.name
            )));
        }
        // An image without a kernel of its own (a container image) boots with the one the
        // image layer found for it on this host; with none at all, the vm crate's kernel
        // search says what to build.
        let kernel_root = spec
            .image
            .kernel
            .as_ref()
            .map(|kernel| kernel.root.clone())
            .filter(|root| *root != spec.image.root);
        let nat = spec.network == Network::Nat;
        if nat {
            // Checked before anything is built: a missing pasta leaves no sandbox behind.
            // Root is needed anyway: QEMU's own network namespace.
            usernet::available()?;
        }
        // A task's package caches: the project's cache image as a second disk, one guest's
        // at a time (its kernel mounts it); while another guest of the project has it, this
        // one goes without: a copy-on-write layer over it would take host room nothing set
        // aside.
        let cache = match &spec.project_cache {
            // A live fork's guest has the copy of its parent's (see `vm_live`).
            Some(_) if super::vm_live::resuming(spec) => None,
            Some(cache) => {
                let with_apt = spec.image.root.join("var/cache/apt/archives").is_dir();
                let disk = cache.vm_disk(with_apt)?;
                if disk.is_none() {
                    tracing::warn!(
                        "no package caches: another guest of the project has its cache image {}",
                        cache.image().display()
                    );
                }
                disk
            }
            None => None,
        };
        let vm_spec = VmSpec {
            hostname: spec.hostname.clone(),
            rootfs: spec.image.root.clone(),
            kernel_root,
            image_id: spec.image.id.clone(),
            state_dir: spec.state_dir.clone(),
            // Beside the jail's `disks/`: initramfs archives, base disks, KVM probe answers.
            cache_dir: spec.cache_dir.join("vm"),
            agent_binary: spec.agent_binary.clone(),
            // The same arguments as the jail's, the sudo broker included where the image
            // offers one (its `sudo` links to the agent the first stage installs).
            agent_args: agent_args(&spec.image),
            cpus: spec.cpus,
            memory_mb: spec.memory_mb,
            // The layer's virtual size bounds what the guest can write, whatever
            // DYNOCAP_DISK_LIMIT says (that switch is about the jail's loop mounts).
            disk_bytes: spec.disk_mb << 20,
            reuse_disk: spec.reuse_layer,
            accel: AccelChoice::parse(spec.vm_accel.as_deref()).map_err(vm_error)?,
            boot_timeout: BOOT_TIMEOUT,
            run_as: run_as(spec.id_range)?,
            nat_dns: nat.then_some(usernet::DNS_FORWARD),
            cache_disk: cache
                .as_ref()
                .map(|cache| dynocap_backend_vm::qemu::CacheDisk {
                    image: cache.image.clone(),
                    throwaway: false,
                    spots: cache.spots.clone(),
                }),
        };
        let (vm, resumed) = super::vm_live::boot_or_resume(&vm_spec).map_err(vm_error)?;
        // The guest has only just reached its agent; nothing in it has run yet that could
        // want the network. On failure `vm` is dropped, which kills QEMU.
        let usernet = if nat {
            let netns = vm.netns_file().map_err(vm_error)?;
            let usernet = usernet::start_in(netns.path(), &spec.state_dir)?;
            // pasta has joined the namespace and the prohibit routes are in: the file goes.
            drop(netns);
            Some(usernet)
        } else {
            None
        };
        tracing::info!(
            "vm guest: QEMU pid {} ({:?}), console log {}",
            vm.pid(),
            vm.accel(),
            vm.paths().console_log.display()
        );
        let pidfd = vm
            .pidfd()
            .try_clone_to_owned()
            .map_err(|err| Error::internal(format!("copying QEMU's pidfd: {err}")))?;
        Ok(Box::new(VmGuest {
            pidfd,
            pid: vm.pid(),
            paths: vm.paths().clone(),
            vm: Arc::new(Mutex::new(Some(vm))),
            disk_bytes: vm_spec.disk_bytes,
            reserved: !dynocap_backend_vm::layers::is_unreserved(&VmPaths::at(&spec.state_dir).dir),
            memory_bytes: vm_spec.memory_mb.saturating_mul(1 << 20),
            rejoin: resumed.then(|| spec.hostname.clone()),
            usernet,
            _cache_lock: cache.map(|cache| cache.lock),
        }))
    }

    fn cleanup_leftovers(&self, id: &str, state_dir: &Path) -> Result<()> {
        dynocap_backend_vm::cleanup_leftovers(state_dir, false).map_err(|source| {
            VmFailure::Cleanup {
                id: id.to_owned(),
                source,
            }
            .into()
        })
    }

    fn cleanup_keeping_layer(&self, id: &str, state_dir: &Path) -> Result<()> {
        dynocap_backend_vm::cleanup_leftovers(state_dir, true).map_err(|source| {
            VmFailure::CleanupKeepingLayer {
                id: id.to_owned(),
                source,
            }
            .into()
        })
    }
}

/// Started as root, QEMU drops to the host ids of the sandbox's range that the jail gives its
/// guest root: distinct per live sandbox, owning nothing on the host.
fn run_as(id_range: u32) -> Result<Option<(u32, u32)>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let map = dynocap_host::IdMap::root_mode_at(id_range).map_err(VmFailure::HostIds)?;
    Ok(Some((map.uids.host, map.gids.host)))
}

/// What the caller can fix (an image that cannot boot as a VM, a spec out of bounds) is
/// `invalid_argument`. What only the machine's operator can fix (no QEMU, KVM that does not
/// boot the kernel with no `DYNOCAP_VM_ACCEL` to say what else to use, a missing host tool)
/// is `internal`, with the crate's message saying what to install or set; so is any other
/// failure.
fn vm_error(err: VmError) -> Error {
    match err {
        VmError::Image(_) | VmError::InvalidSpec(_) => VmFailure::Refused(err).into(),
        VmError::Unavailable(_) => VmFailure::Unavailable(err).into(),
        other => VmFailure::Boot(other).into(),
    }
}

/// What failed in the vm backend, with the vm crate's error as the cause.
#[derive(Debug, thiserror::Error)]
enum VmFailure {
    /// The image or the spec, which the caller can change (see [`vm_error`]).
    #[error("{0}")]
    Refused(#[source] VmError),
    /// No QEMU, no accelerator that boots, a missing host tool: the operator's to fix.
    #[error("this machine cannot run the VM: {0}")]
    Unavailable(#[source] VmError),
    #[error("booting the vm: {0}")]
    Boot(#[source] VmError),
    #[error("choosing QEMU's host ids: {0}")]
    HostIds(#[source] dynocap_host::HostError),
    #[error("cleaning up sandbox {id}: {source}")]
    Cleanup {
        id: String,
        #[source]
        source: VmError,
    },
    #[error("stopping what is left of sandbox {id}: {source}")]
    CleanupKeepingLayer {
        id: String,
        #[source]
        source: VmError,
    },
    #[error("killing the vm: {0}")]
    Kill(#[source] VmError),
    #[error("destroying the vm: {0}")]
    Destroy(#[source] VmError),
    #[error("stopping the vm: {0}")]
    StopKeepingDisk(#[source] VmError),
    #[error("freezing the vm's disk layer: {0}")]
    Freeze(#[source] VmError),
}

impl Coded for VmFailure {
    fn code(&self) -> ErrorCode {
        match self {
            Self::Refused(_) => ErrorCode::InvalidArgument,
            Self::Unavailable(_)
            | Self::Boot(_)
            | Self::HostIds(_)
            | Self::Cleanup { .. }
            | Self::CleanupKeepingLayer { .. }
            | Self::Kill(_)
            | Self::Destroy(_)
            | Self::StopKeepingDisk(_)
            | Self::Freeze(_) => ErrorCode::Internal,
        }
    }
}

/// A guest's [`Vm`], which its disk's freeze handle reaches too; `None` once the guest ended.
type SharedVm = Arc<Mutex<Option<Vm>>>;

fn lock(vm: &SharedVm) -> MutexGuard<'_, Option<Vm>> {
    // A panic while holding it leaves the Vm as whole as any error path does.
    vm.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn gone() -> Error {
    Error::internal("the vm has ended")
}

impl VmGuest {
    /// The room the guest's writable layer may fill on the host, reserved or not.
    fn layer_room(&self) -> crate::host::disk_room::DiskRoom {
        crate::host::disk_room::DiskRoom {
            image: self.paths.disk.clone(),
            bytes: self.disk_bytes,
            layout: crate::host::disk_room::Layout::Growing,
        }
    }

    /// The Vm, taken out for the guest's end.
    fn take_vm(&self) -> Result<Vm> {
        lock(&self.vm).take().ok_or_else(gone)
    }
}

impl Drop for VmGuest {
    /// A guest dropped without its end (an error path) must not leave QEMU running, whoever
    /// still holds the freeze handle.
    fn drop(&mut self) {
        drop(lock(&self.vm).take());
    }
}

/// The vm's [`LayeredDisk`]: freezes go through the guest's QMP (see
/// `dynocap_backend_vm::layers`), and the new writable layer of a task whose layers are
/// reserved gets the disk's room reserved as the first one had at boot (the frozen one gives
/// its reservation back); a fork's new layer, as its first, sets nothing aside.
struct VmLayers {
    vm: SharedVm,
    room: crate::host::disk_room::DiskRoom,
    reserved: bool,
}

impl LayeredDisk for VmLayers {
    /// The new layer's room is set aside right after the switch; a caller checks
    /// [`freeze_cost`](LayeredDisk::freeze_cost) against the free space first, so that only
    /// a race with another writer on the host's filesystem makes it fail.
    fn freeze(&self) -> Result<(String, u64)> {
        let frozen = lock(&self.vm)
            .as_mut()
            .ok_or_else(gone)?
            .snapshot_layer()
            .map_err(VmFailure::Freeze)?;
        if self.reserved {
            self.room.reserve()?;
        }
        Ok((frozen.name, frozen.bytes))
    }
    fn freeze_cost(&self) -> u64 {
        freeze_cost(&self.room, self.reserved)
    }
}

/// What freezing the writable layer `room` describes takes from the host's free space: its
/// data stays (the frozen layer keeps its length), its room past that goes back (see
/// `dynocap_backend_vm::layers`'s `seal`) and, when the layers are `reserved`, the new layer
/// sets aside the whole room again. An unreserved layer's freeze takes nothing: what it holds
/// is on the host's disk already, and the new layer holds nothing yet.
fn freeze_cost(room: &crate::host::disk_room::DiskRoom, reserved: bool) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    if !reserved {
        return 0;
    }
    let whole = crate::host::disk_room::reserved_bytes(room.bytes, room.layout);
    match std::fs::metadata(&room.image) {
        Ok(meta) => meta
            .len()
            .saturating_add(whole)
            .saturating_sub(meta.blocks().saturating_mul(512)),
        Err(_) => whole,
    }
}

impl Guest for VmGuest {
    fn take_channel(&mut self) -> Option<OwnedFd> {
        lock(&self.vm).as_mut().and_then(Vm::take_channel)
    }
    fn network_exit_fd(&self) -> Option<BorrowedFd<'_>> {
        usernet::exit_fd(&self.usernet)
    }
    fn network_exit(&mut self) -> String {
        usernet::exit_of_any(&mut self.usernet)
    }
    /// QEMU's namespace is bound to a file again for the new pasta to join, as at boot.
    fn restart_network(&mut self) -> Result<()> {
        let Some(usernet) = self.usernet.as_mut() else {
            return Err(Error::internal(
                "this guest has no network process to restart",
            ));
        };
        let netns = lock(&self.vm)
            .as_ref()
            .ok_or_else(gone)?
            .netns_file()
            .map_err(vm_error)?;
        usernet::restart(usernet, netns.path())
    }
    fn end_network(&mut self) -> Result<()> {
        usernet::stop(&mut self.usernet)
    }
    fn exit_fd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }
    fn pid(&self) -> i32 {
        self.pid
    }
    /// `None` for a fork's guest: its layers set nothing aside (see [`VmGuest::reserved`]).
    fn disk_room(&self) -> Option<crate::host::disk_room::DiskRoom> {
        self.reserved.then(|| self.layer_room())
    }
    /// Refused before the pause when the host cannot back what the save makes: the frozen
    /// layer's data and the parent's new layer ([`freeze_cost`]), the guest's memory in the
    /// state file and the fork's copy of the package cache disk. The fork's own layer sets
    /// nothing aside, as any fork's.
    fn save_live(&mut self, fork_dir: &Path) -> Result<super::LiveSaved> {
        let room = self.layer_room();
        let needed = freeze_cost(&room, self.reserved).saturating_add(self.memory_bytes);
        let saved = super::vm_live::save(
            lock(&self.vm).as_mut().ok_or_else(gone)?,
            fork_dir,
            &self.paths.dir,
            needed,
        )?;
        // The parent goes on on a new layer, whose room is reserved as the first one's was.
        if self.reserved {
            room.reserve()?;
        }
        Ok(saved)
    }
    fn rejoin_as(&self) -> Option<&str> {
        self.rejoin.as_deref()
    }
    fn layered_disk(&self) -> Option<Arc<dyn LayeredDisk>> {
        Some(Arc::new(VmLayers {
            vm: Arc::clone(&self.vm),
            room: self.layer_room(),
            reserved: self.reserved,
        }))
    }
    /// A VM's vCPUs and memory are fixed when QEMU starts and its hostname lives in the
    /// guest kernel, out of the host's reach: a booted VM cannot become its claimer's.
    fn claim(&self, _hostname: &str, _cpus: u32, _memory_mb: u64) -> Result<()> {
        Err(Error::conflict(
            "a vm sandbox cannot be claimed from the warm pool (its vCPUs, memory and hostname \
             are fixed at boot); unset DYNOCAP_WARM_POOL for the vm backend",
        ))
    }
    fn kill(&mut self) -> Result<()> {
        let network = crate::host::usernet::stop(&mut self.usernet);
        if let Some(vm) = lock(&self.vm).as_mut() {
            vm.kill().map_err(VmFailure::Kill)?;
        }
        network
    }
    fn destroy(mut self: Box<Self>) -> Result<()> {
        let network = crate::host::usernet::stop(&mut self.usernet);
        self.take_vm()?.destroy().map_err(VmFailure::Destroy)?;
        network
    }
    /// The guest kernel counts its own OOM kills; the host sees none of them.
    fn oom_counter(&self) -> OomCounter {
        OomCounter::GuestKernel
    }
    /// The disk is a device of the guest's kernel, which caches what is written to it.
    fn layer_sync(&self) -> LayerSync {
        LayerSync::GuestKernel
    }
    /// A VM's RAM is fixed when QEMU starts; the guest kernel never OOM-kills the agent (PID
    /// 1), so saving runs within the sandbox's own memory.
    fn raise_memory_limit(&self, _bytes: u64) -> Result<()> {
        Err(Error::internal("a vm's memory cannot be raised after boot"))
    }
    fn stop_keeping_layer(mut self: Box<Self>) -> Result<()> {
        let network = crate::host::usernet::stop(&mut self.usernet);
        self.take_vm()?
            .stop_keeping_disk()
            .map_err(VmFailure::StopKeepingDisk)?;
        network
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_caller_can_fix_is_invalid_argument_the_rest_internal() {
        let err = vm_error(VmError::Image("the image has no kernel".into()));
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert_eq!(err.message, "the image has no kernel");
        let err = vm_error(VmError::InvalidSpec("0 vCPUs".into()));
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert_eq!(err.message, "invalid vm spec: 0 vCPUs");
        let err = vm_error(VmError::Unavailable("install qemu".into()));
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, "this machine cannot run the VM: install qemu");
        let err = Error::from(VmFailure::Kill(VmError::Unavailable("gone".into())));
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, "killing the vm: gone");
    }
}
