//! The guest's filesystem, built by the guest init inside its own mount namespace and then
//! made its root:
//!
//! ```text
//! /              overlay: lower = image_root (or its idmapped clone, see `idmapped`),
//!                upper = state/upper (nosuid, nodev)
//! /proc          fresh procfs of the new pid namespace (nosuid, nodev, noexec), with
//!                Docker's masked paths and every file listing host devices covered, and
//!                Docker's read-only paths re-bound read-only
//! /dev           tmpfs 0755 (nosuid, noexec) with the host's null, zero, full, random,
//!                urandom and tty bound in (no mknod in a user namespace), devpts at /dev/pts
//!                (its own instance, at most [`PTY_MAX`] ptys), tmpfs /dev/shm 1777
//!                (nosuid, nodev, noexec, sized), and the usual symlinks
//! /tmp           tmpfs 1777 (nosuid, nodev, sized)
//! /sys           sysfs of the guest's network namespace, read-only (nosuid, nodev, noexec),
//!                covered but for CPU, NUMA and memory settings and the guest's own network
//!                interfaces (see `sysview`); /sys/fs/cgroup shows the sandbox's own
//!                cgroups, bound read-only (see `CgroupSet::guest_views`)
//! <ro_binds>     recursive binds, read-only, nosuid, nodev
//! <rw_binds>     idmapped binds of host directories, read-write, nosuid, nodev
//! /.dynocap/agent  the agent binary, bound read-only
//! ```
//!
//! Host paths are opened once, early, by [`open_host`] while the init still has the
//! supervisor's host uid: the state dir may be private to it (0700), and the init loses that
//! access when it becomes the guest's root. Everything after that goes through those fds,
//! and mount targets are resolved inside the new root (see `resolve`).
//!
//! The sysfs instance belongs to the guest's network namespace, so /sys/class/net lists the
//! guest's interfaces only. Of the rest, the guest sees what runtimes and tools (`lscpu`,
//! the JVM, Go, Node) read, and no host device, firmware table or host path (see `sysview`);
//! nothing under /sys is writable, so none of it can be changed from inside. The cgroup view
//! lets a runtime size itself to the sandbox's limits, not the host's, and is read-only too:
//! the guest cannot raise a limit or move a process through it.
//!
//! The kernel refuses a new sysfs in a user namespace while part of the host's own /sys is
//! hidden under another mount (a container runtime masking /sys/firmware, for one). The guest
//! then gets no /sys rather than not starting, and the init says so on its stderr, which the
//! supervisor copies into its log.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{open, openat, OFlag};
use nix::mount::{umount2, MntFlags};
use nix::sys::stat::{fstat, Mode, SFlag};
use nix::unistd::{chdir, fchdir, pivot_root, symlinkat};

use crate::cgroup::CgroupView;
use crate::failure::{Context, Failure};
use crate::newmount::{self, FsContext, NODEV, NOEXEC, NOSUID, RDONLY};
use crate::resolve::{self, Kind};
use crate::sysview;

/// Host device nodes bound into the guest's /dev.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// /proc files hidden behind /dev/null, and directories behind an empty read-only tmpfs:
/// Docker's masks (kernel memory, timers, keys, sound and SCSI hardware), and everything else
/// that lists the host's devices or names its disks, none of which a guest's tools read:
/// - `partitions`, `diskstats`, `swaps`, `mdstat`: the host's block devices (its loop devices,
///   the disks of other sandboxes, among them), its swap files and RAID arrays by path;
/// - `cmdline`: the host kernel's boot options (`root=/dev/...`, `root=UUID=...`);
/// - `interrupts`, `consoles`, `ioports`, `iomem`: the host's devices by driver, name and
///   bus address (`nvme0q1`, `ttyS0`, `0000:00:1f.2`);
/// - `fs`: per-device directories (`fs/ext4/nvme0n1p2`, `fs/jbd2/...`);
/// - `bus`, `driver`: PCI and input devices, the RTC;
/// - `sys/dev`: CD-ROM drives, RAID and SCSI settings of the host.
///
/// `df`, `mount`, `ps`, `top`, `free` and `nproc` read none of these: the guest's own mount
/// table (`self/mountinfo`), `meminfo`, `stat`, `cpuinfo` and the processes' own files stay.
const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "partitions",
    "diskstats",
    "swaps",
    "mdstat",
    "cmdline",
    "interrupts",
    "consoles",
    "ioports",
    "iomem",
];
const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi", "fs", "bus", "driver", "sys/dev"];
/// /proc entries made read-only, as Docker does. In the jail's user namespace most of these
/// already belong to (unmapped) host root; this also freezes the namespace-owned ones
/// (e.g. the netns sysctls under sys/net). The read-only bind of `sys` is recursive, so it
/// keeps the mask on `sys/dev`.
const PROC_READ_ONLY: &[&str] = &["irq", "sys", "sysrq-trigger"];

/// Most ptys one guest's devpts hands out. Every non-initial devpts instance draws from the
/// host-wide pool of `kernel.pty.max` minus `kernel.pty.reserve` (3072 by default): without a
/// bound one sandbox can take them all and every other `exec --tty` fails with `ENOSPC`.
pub(crate) const PTY_MAX: u32 = 256;

/// Largest /tmp, and largest /dev/shm (Docker's default `--shm-size`).
const TMP_MAX_BYTES: u64 = 1 << 30;
const SHM_MAX_BYTES: u64 = 64 << 20;

/// `size=` of /tmp and /dev/shm for a guest with `memory_bytes` of memory: at most half of it
/// for /tmp and a quarter for /dev/shm, so a full tmpfs answers `ENOSPC` while the processes
/// that filled it still have memory left (tmpfs pages are charged to the guest's cgroup).
pub(crate) fn tmpfs_sizes(memory_bytes: u64) -> (u64, u64) {
    (
        (memory_bytes / 2).min(TMP_MAX_BYTES),
        (memory_bytes / 4).min(SHM_MAX_BYTES),
    )
}

/// Symlinks created in the guest's /dev: (name, target).
const DEV_LINKS: &[(&str, &str)] = &[
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// What the root is built from (all host paths absolute, targets relative to the guest root).
#[derive(Debug, Clone)]
pub(crate) struct RootPlan {
    pub image_root: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Where the overlay is attached on the host side (`state/root`).
    pub mountpoint: PathBuf,
    /// (host source, guest target relative to `/`).
    pub binds: Vec<(PathBuf, PathBuf)>,
    pub agent: PathBuf,
    /// Relative guest path of the agent (`.dynocap/agent`).
    pub agent_target: PathBuf,
    /// Guest gid owning pty slaves (`tty`, 5) if it is mapped.
    pub tty_gid: Option<u32>,
    /// `size=` of /tmp in bytes (see [`tmpfs_sizes`]).
    pub tmp_bytes: u64,
    /// `size=` of /dev/shm in bytes.
    pub shm_bytes: u64,
    /// The sandbox's cgroups, shown read-only under /sys/fs/cgroup.
    pub cgroups: Vec<CgroupView>,
    /// A detached idmapped clone of `image_root` (see `idmapped`), open in the supervisor
    /// across the clone: the lower layer instead of `image_root` itself.
    pub idmapped_image: Option<std::os::fd::RawFd>,
    /// A detached idmapped clone of the disk holding `upper` and `work` (a fork's, see
    /// `idmapped::layer_disk`), open in the supervisor across the clone, with the directory it
    /// is attached on (the disk's mount point): the overlay's upper and work are then
    /// looked up through it.
    pub idmapped_layers: Option<(std::os::fd::RawFd, PathBuf)>,
    /// Detached idmapped clones of the read-write binds' sources (see `idmapped`), open in
    /// the supervisor across the clone, with each one's host path and guest target
    /// (relative to `/`).
    pub rw_binds: Vec<(std::os::fd::RawFd, PathBuf, PathBuf)>,
}

/// A host source opened for binding.
pub(crate) struct Source {
    fd: OwnedFd,
    host: PathBuf,
    is_dir: bool,
}

/// Every host file the root needs, opened before the init drops the supervisor's uid.
pub(crate) struct HostFds {
    image: OwnedFd,
    upper: OwnedFd,
    work: OwnedFd,
    mountpoint: OwnedFd,
    binds: Vec<(Source, PathBuf)>,
    agent: Source,
    devices: Vec<(&'static str, Source)>,
    /// The sandbox's cgroup directories, with where each shows under /sys/fs/cgroup.
    cgroups: Vec<(Source, CgroupView)>,
    /// The read-write binds' mounts, with their host paths and guest targets.
    rw_binds: Vec<(OwnedFd, PathBuf, PathBuf)>,
}

fn open_dir(path: &Path) -> Result<OwnedFd, Failure> {
    open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .context(|| format!("opening {}", path.display()))
}

/// Opens a bind source, following symlinks as `mount --bind` does.
fn open_source(path: &Path) -> Result<Source, Failure> {
    let fd = open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
        .context(|| format!("opening bind source {}", path.display()))?;
    let is_dir =
        is_dir(fd.as_fd()).context(|| format!("stat of bind source {}", path.display()))?;
    Ok(Source {
        fd,
        host: path.to_owned(),
        is_dir,
    })
}

fn is_dir(fd: BorrowedFd<'_>) -> Result<bool, nix::errno::Errno> {
    let st = fstat(fd)?;
    Ok(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
}

/// Opens every host path in `plan` (see the module doc for why this happens first).
pub(crate) fn open_host(plan: &RootPlan) -> Result<HostFds, Failure> {
    if let Some((raw, disk)) = &plan.idmapped_layers {
        // SAFETY: as for the idmapped image below: the supervisor keeps this fd open until
        // after the clone, and nothing else in this process uses our copy.
        let tree = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(*raw) };
        // Attached over the disk itself in this private mount namespace: every path below
        // (the layers, the overlay's mount point) resolves through the idmapped clone, and
        // overlayfs, which clones its layers, finds them in the caller's namespace.
        newmount::attach(tree.as_fd(), open_dir(disk)?.as_fd()).context(|| {
            format!(
                "attaching the idmapped disk of the kept layer on {}",
                disk.display()
            )
        })?;
    }
    let mountpoint = open_dir(&plan.mountpoint)?;
    let image = match plan.idmapped_image {
        Some(raw) => {
            // SAFETY: the supervisor keeps this fd open until after the clone, so our copy
            // of its fd table holds it; nothing else in this process uses it.
            let tree = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
            // A detached mount cannot be an overlay layer (overlayfs clones its layers, and
            // only mounts of the caller's namespace can be cloned): attach it first, on the
            // overlay's own mountpoint, in this private mount namespace. The overlay is
            // then attached on top of it.
            newmount::attach(tree.as_fd(), mountpoint.as_fd()).context(|| {
                format!(
                    "attaching the idmapped image {} on {}",
                    plan.image_root.display(),
                    plan.mountpoint.display()
                )
            })?;
            tree
        }
        None => open_dir(&plan.image_root)?,
    };
    Ok(HostFds {
        image,
        upper: open_dir(&plan.upper)?,
        work: open_dir(&plan.work)?,
        mountpoint,
        binds: plan
            .binds
            .iter()
            .map(|(source, target)| Ok((open_source(source)?, target.clone())))
            .collect::<Result<_, Failure>>()?,
        agent: open_source(&plan.agent)?,
        devices: DEVICES
            .iter()
            .map(|name| Ok((*name, open_source(&Path::new("/dev").join(name))?)))
            .collect::<Result<_, Failure>>()?,
        cgroups: plan
            .cgroups
            .iter()
            .map(|view| Ok((open_source(&view.host)?, view.clone())))
            .collect::<Result<_, Failure>>()?,
        rw_binds: plan
            .rw_binds
            .iter()
            .map(|(raw, host, target)| {
                // SAFETY: as for the idmapped image above: the supervisor holds each of these
                // fds open across the clone, and only this code uses our copies.
                let tree = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(*raw) };
                (tree, host.clone(), target.clone())
            })
            .collect(),
    })
}

/// `/proc/self/fd/N`: how a path-taking interface (overlay's layer options) is pointed at an
/// fd. The kernel follows these magic links without checking the directories above the
/// target, which the init may no longer be allowed to search.
fn fd_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Builds the whole tree and pivots into it. On return the old root is gone.
pub(crate) fn build(plan: &RootPlan, host: &HostFds) -> Result<(), Failure> {
    let root = mount_overlay(plan, host)?;
    let root = root.as_fd();

    let proc = FsContext::new("proc").context(|| "creating a procfs instance")?;
    let proc = attach_new(root, "proc", proc, NOSUID | NODEV | NOEXEC)?;
    mask_proc(proc.as_fd(), host)?;

    mount_dev(root, plan, host)?;
    mount_sys(root, host)?;

    let tmp = tmpfs(&[("mode", "1777"), ("size", &plan.tmp_bytes.to_string())])?;
    attach_new(root, "tmp", tmp, NOSUID | NODEV)?;

    for (source, target) in &host.binds {
        bind_read_only(root, source, target, true)?;
    }
    for (tree, source, target) in &host.rw_binds {
        let what = || {
            format!(
                "binding {} read-write onto /{}",
                source.display(),
                target.display()
            )
        };
        let target_fd = resolve::mountpoint(root, target, Kind::Dir)
            .context(|| format!("creating the mountpoint /{}", target.display()))?;
        newmount::attach(tree.as_fd(), target_fd.as_fd()).context(what)?;
    }
    bind_read_only(root, &host.agent, &plan.agent_target, false)?;

    pivot(root)
}

/// Creates the overlay, attaches it on `state/root` and returns its root.
fn mount_overlay(plan: &RootPlan, host: &HostFds) -> Result<OwnedFd, Failure> {
    let what = || {
        format!(
            "mounting the overlay (lower {}, upper {}) on {}",
            plan.image_root.display(),
            plan.upper.display(),
            plan.mountpoint.display()
        )
    };
    let ctx = FsContext::new("overlay").context(what)?;
    ctx.set("lowerdir", &fd_path(host.image.as_fd()))
        .context(what)?;
    ctx.set("upperdir", &fd_path(host.upper.as_fd()))
        .context(what)?;
    ctx.set("workdir", &fd_path(host.work.as_fd()))
        .context(what)?;
    // Overlay metadata in user.overlay.* xattrs: the trusted.* namespace needs host
    // CAP_SYS_ADMIN.
    ctx.flag("userxattr").context(what)?;
    let root = ctx
        .mount(NOSUID | NODEV)
        .map_err(|(errno, log)| with_log(Failure::new(what(), errno), &log))?;
    newmount::attach(root.as_fd(), host.mountpoint.as_fd()).context(what)?;
    Ok(root)
}

pub(crate) fn with_log(failure: Failure, log: &str) -> Failure {
    if log.is_empty() {
        failure
    } else {
        Failure::message(format!("{failure} (kernel: {log})"))
    }
}

pub(crate) fn tmpfs(options: &[(&str, &str)]) -> Result<FsContext, Failure> {
    let ctx = FsContext::new("tmpfs").context(|| "creating a tmpfs instance")?;
    for (key, value) in options {
        ctx.set(key, value)
            .context(|| format!("setting tmpfs option {key}={value}"))?;
    }
    Ok(ctx)
}

/// Mounts a new filesystem instance at `rel` (a directory) inside `root`.
fn attach_new(
    root: BorrowedFd<'_>,
    rel: &str,
    ctx: FsContext,
    attrs: u64,
) -> Result<OwnedFd, Failure> {
    let what = || format!("mounting /{rel}");
    let target = resolve::mountpoint(root, Path::new(rel), Kind::Dir)
        .context(|| format!("creating the mountpoint /{rel}"))?;
    let mount = ctx
        .mount(attrs)
        .map_err(|(errno, log)| with_log(Failure::new(what(), errno), &log))?;
    newmount::attach(mount.as_fd(), target.as_fd()).context(what)?;
    Ok(mount)
}

/// Binds `source` read-only (plus nosuid, nodev) at `target` inside `root`.
fn bind_read_only(
    root: BorrowedFd<'_>,
    source: &Source,
    target: &Path,
    recursive: bool,
) -> Result<(), Failure> {
    let what = || {
        format!(
            "binding {} read-only onto /{}",
            source.host.display(),
            target.display()
        )
    };
    let kind = if source.is_dir { Kind::Dir } else { Kind::File };
    let target_fd = resolve::mountpoint(root, target, kind)
        .context(|| format!("creating the mountpoint /{}", target.display()))?;
    if is_dir(target_fd.as_fd()).context(what)? != source.is_dir {
        let (source_kind, target_kind) = if source.is_dir {
            ("a directory", "is not")
        } else {
            ("not a directory", "is one")
        };
        return Err(Failure::message(format!(
            "{}: the source is {source_kind} but the target {target_kind}",
            what()
        )));
    }
    let tree = newmount::clone_tree(source.fd.as_fd(), recursive).context(what)?;
    // Read-only before it is attached: never visible writable, submounts included.
    newmount::set_attrs(tree.as_fd(), RDONLY | NOSUID | NODEV, recursive).context(what)?;
    newmount::attach(tree.as_fd(), target_fd.as_fd()).context(what)
}

fn mount_dev(root: BorrowedFd<'_>, plan: &RootPlan, host: &HostFds) -> Result<(), Failure> {
    let ctx = tmpfs(&[("mode", "0755"), ("size", "1m"), ("nr_inodes", "4096")])?;
    let dev = attach_new(root, "dev", ctx, NOSUID | NOEXEC)?;
    let dev = dev.as_fd();

    for (name, source) in &host.devices {
        let what = || format!("binding /dev/{name} from the host");
        let node = openat(
            dev,
            *name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o666),
        )
        .context(|| format!("creating /dev/{name}"))?;
        drop(node);
        let target = openat(
            dev,
            *name,
            OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .context(what)?;
        let tree = newmount::clone_tree(source.fd.as_fd(), false).context(what)?;
        newmount::set_attrs(tree.as_fd(), NOSUID | NOEXEC, false).context(what)?;
        newmount::attach(tree.as_fd(), target.as_fd()).context(what)?;
    }

    let devpts = FsContext::new("devpts").context(|| "creating a devpts instance")?;
    // Its own instance (the only kind since Linux 4.7; explicit for older kernels): the
    // guest sees none of the host's terminals.
    devpts
        .flag("newinstance")
        .context(|| "setting devpts option newinstance")?;
    let max = PTY_MAX.to_string();
    for (key, value) in [
        ("ptmxmode", "0666"),
        ("mode", "0620"),
        ("max", max.as_str()),
    ] {
        devpts
            .set(key, value)
            .context(|| format!("setting devpts option {key}={value}"))?;
    }
    if let Some(gid) = plan.tty_gid {
        devpts
            .set("gid", &gid.to_string())
            .context(|| "setting devpts option gid")?;
    }
    attach_new(dev, "pts", devpts, NOSUID | NOEXEC)?;

    let shm = tmpfs(&[("mode", "1777"), ("size", &plan.shm_bytes.to_string())])?;
    attach_new(dev, "shm", shm, NOSUID | NODEV | NOEXEC)?;

    for (name, target) in DEV_LINKS {
        symlinkat(*target, dev, *name).context(|| format!("creating the symlink /dev/{name}"))?;
    }
    Ok(())
}

/// Applies the masks and read-only binds on the fresh /proc (see the constants).
fn mask_proc(proc: BorrowedFd<'_>, host: &HostFds) -> Result<(), Failure> {
    let Some((_, null)) = host.devices.iter().find(|(name, _)| *name == "null") else {
        return Err(Failure::message(
            "no host /dev/null to mask /proc entries with",
        ));
    };
    let present = |name: &str| match resolve::open_in_root(proc, Path::new(name)) {
        Ok(fd) => Ok(Some(fd)),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(Failure::new(format!("opening /proc/{name}"), e)),
    };
    for name in PROC_MASKED_FILES {
        if let Some(target) = present(name)? {
            let what = || format!("masking /proc/{name}");
            let tree = newmount::clone_tree(null.fd.as_fd(), false).context(what)?;
            // Not nodev: reading the masked file is reading /dev/null.
            newmount::set_attrs(tree.as_fd(), RDONLY | NOSUID | NOEXEC, false).context(what)?;
            newmount::attach(tree.as_fd(), target.as_fd()).context(what)?;
        }
    }
    for name in PROC_MASKED_DIRS {
        if let Some(target) = present(name)? {
            attach_empty(target.as_fd(), &format!("/proc/{name}"))?;
        }
    }
    for name in PROC_READ_ONLY {
        if let Some(target) = present(name)? {
            let what = || format!("making /proc/{name} read-only");
            let tree = newmount::clone_tree(target.as_fd(), true).context(what)?;
            newmount::set_attrs(tree.as_fd(), RDONLY | NOSUID | NODEV | NOEXEC, true)
                .context(what)?;
            newmount::attach(tree.as_fd(), target.as_fd()).context(what)?;
        }
    }
    Ok(())
}

/// Mounts the network namespace's sysfs read-only at /sys, covers all of it but what
/// `sysview` shows, and shows the sandbox's cgroups at /sys/fs/cgroup.
fn mount_sys(root: BorrowedFd<'_>, host: &HostFds) -> Result<(), Failure> {
    const WHAT: &str = "mounting /sys";
    let sysfs = FsContext::new("sysfs").context(|| "creating a sysfs instance")?;
    let sys = match sysfs.mount(RDONLY | NOSUID | NODEV | NOEXEC) {
        Ok(sys) => sys,
        Err((nix::errno::Errno::EPERM, log)) => {
            eprintln!(
                "jail: the guest has no /sys: the kernel refused a sysfs ({}), as it does while \
                 part of the host's /sys is hidden under another mount",
                if log.is_empty() { "EPERM" } else { &log }
            );
            return Ok(());
        }
        Err((errno, log)) => return Err(with_log(Failure::new(WHAT, errno), &log)),
    };
    let target = resolve::mountpoint(root, Path::new("sys"), Kind::Dir)
        .context(|| "creating the mountpoint /sys")?;
    newmount::attach(sys.as_fd(), target.as_fd()).context(|| WHAT)?;
    let sys = sys.as_fd();
    sysview::restrict(sys)?;
    mount_cgroup_views(sys, &host.cgroups)
}

/// Covers `target` with an empty read-only tmpfs.
fn attach_empty(target: BorrowedFd<'_>, name: &str) -> Result<(), Failure> {
    let what = || format!("masking {name}");
    let empty = tmpfs(&[("mode", "0555"), ("size", "0")])?
        .mount(RDONLY | NOSUID | NODEV | NOEXEC)
        .map_err(|(errno, log)| with_log(Failure::new(what(), errno), &log))?;
    newmount::attach(empty.as_fd(), target.as_fd()).context(what)
}

/// Binds each of the sandbox's cgroups read-only at its place under /sys/fs/cgroup: one that
/// is /sys/fs/cgroup itself directly, the others into a small tmpfs made read-only once its
/// directories exist (as Docker does on cgroup v1).
fn mount_cgroup_views(sys: BorrowedFd<'_>, views: &[(Source, CgroupView)]) -> Result<(), Failure> {
    const WHAT: &str = "showing the sandbox's cgroups at /sys/fs/cgroup";
    // The kernel makes this directory in every sysfs instance; a read-only sysfs could not
    // get it created.
    let target = resolve::open_in_root(sys, Path::new("fs/cgroup"))
        .context(|| format!("{WHAT}: opening /sys/fs/cgroup"))?;
    if let [(source, view)] = views {
        if view.guest.as_os_str().is_empty() {
            return bind_cgroup(target.as_fd(), source);
        }
    }
    let dir = tmpfs(&[("mode", "0755"), ("size", "64k"), ("nr_inodes", "64")])?
        .mount(NOSUID | NODEV | NOEXEC)
        .map_err(|(errno, log)| with_log(Failure::new(WHAT, errno), &log))?;
    newmount::attach(dir.as_fd(), target.as_fd()).context(|| WHAT)?;
    for (source, view) in views {
        let guest = &view.guest;
        let at = resolve::mountpoint(dir.as_fd(), guest, Kind::Dir)
            .context(|| format!("{WHAT}: creating /sys/fs/cgroup/{}", guest.display()))?;
        bind_cgroup(at.as_fd(), source)?;
        for alias in &view.aliases {
            symlinkat(guest, dir.as_fd(), alias.as_str())
                .context(|| format!("{WHAT}: linking /sys/fs/cgroup/{alias}"))?;
        }
    }
    newmount::set_attrs(dir.as_fd(), RDONLY | NOSUID | NODEV | NOEXEC, false)
        .context(|| format!("{WHAT}: making /sys/fs/cgroup read-only"))
}

/// Binds one cgroup directory (no submounts: a cgroup has none) read-only onto `target`.
fn bind_cgroup(target: BorrowedFd<'_>, source: &Source) -> Result<(), Failure> {
    let what = || format!("binding the cgroup {} read-only", source.host.display());
    let tree = newmount::clone_tree(source.fd.as_fd(), false).context(what)?;
    newmount::set_attrs(tree.as_fd(), RDONLY | NOSUID | NODEV | NOEXEC, false).context(what)?;
    newmount::attach(tree.as_fd(), target).context(what)
}

/// Makes `root` the root of this mount namespace and detaches the old one entirely.
fn pivot(root: BorrowedFd<'_>) -> Result<(), Failure> {
    fchdir(root).context(|| "entering the new root")?;
    // pivot_root(".", ".") stacks the old root on top of the new one, so no put_old
    // directory is needed; the detach below then drops every host mount from view.
    pivot_root(".", ".").context(|| "pivot_root into the new root")?;
    umount2(".", MntFlags::MNT_DETACH).context(|| "detaching the old root")?;
    chdir("/").context(|| "entering /")
}
