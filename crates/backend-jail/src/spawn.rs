//! The supervisor's half of starting a jail: preflight checks, host-side preparation
//! (layers, cgroups, channels), the clone, and the handshake with the guest init (id maps,
//! release, v2 cgroup membership while the init builds the root (it joins its v1 cgroups
//! itself), second release, wait for exec or a failure report).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::sys::wait::WaitStatus;
use nix::unistd::{Gid, Uid};

use crate::cache_disk::CacheMount;
use crate::caps;
use crate::cgroup::{CgroupSet, Layout};
use crate::child::{self, ChildEnds, ChildPlan, EXEC_CGROUP_FD};
use crate::disk::{Disk, DiskPaths};
use crate::error::JailError;
use crate::idmapped;
use crate::jail::{Jail, Storage};
use crate::layers::Layers;
use crate::newmount;
use crate::rootfs::{self, RootPlan};
use crate::seccomp;
use crate::spec::{guest_relative, JailSpec, AGENT_GUEST_PATH, CHANNEL_FD};
use crate::sync::{self, Channels, Outcome};
use crate::sys::{self, CloneResult};
use dynocap_host::IdMap;

/// Namespaces the guest gets at clone; the cgroup namespace follows once it is in its
/// cgroups (see `child`).
const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWUSER
    .union(CloneFlags::CLONE_NEWNS)
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS);

/// How long the guest init may take from release to exec.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Guest group that owns pty slaves.
const TTY_GID: u32 = 5;

const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const HINT_USERNS: &str = "user namespaces look disabled or exhausted: check \
    /proc/sys/user/max_user_namespaces, kernel.unprivileged_userns_clone (Debian) and \
    kernel.apparmor_restrict_unprivileged_userns (Ubuntu); `dynocap doctor` shows details";

pub(crate) fn spawn(spec: &JailSpec, ids: IdMap) -> Result<Jail, JailError> {
    // Its thread must be gone before the check below; the start takes the disk.
    crate::disk::finish_preparing_disk();
    match sys::thread_count() {
        Ok(1) => {}
        Ok(threads) => return Err(JailError::NotSingleThreaded { threads }),
        Err(e) => return Err(JailError::io("read", Path::new("/proc/self/status"), e)),
    }
    spec.validate()?;
    if !newmount::available() {
        return Err(JailError::sys(
            "the fd-based mount API (mount_setattr)",
            nix::errno::Errno::ENOSYS,
        )
        .hint("the jail backend needs Linux 5.12 or newer"));
    }
    let mut plan = plan(spec, &ids)?;
    let layout = Layout::discover()?;

    let (mut disk, layers, cgroups) = prepare_host_side(spec, &ids, &layout)?;
    // Unmounted when dropped, on any failure from here.
    let cache = match &spec.cache {
        Some(cache) => match CacheMount::mount(cache, &disk) {
            Ok(mounted) => Some(mounted),
            Err(e) => {
                let _ = cgroups.remove();
                undo_storage(Some(&layers), &mut disk);
                return Err(e);
            }
        },
        None => None,
    };
    if let Some(dir) = cgroups.exec_dir() {
        hand_exec_cgroup(&mut plan, dir);
    }
    plan.root.cgroups = cgroups.guest_views();
    let undo = |layers: &Layers, cgroups: &CgroupSet, disk: &mut Disk| {
        let _ = cgroups.remove();
        undo_storage(Some(layers), disk);
    };
    let (channels, host_channel, guest_channel) = match make_channels() {
        Ok(c) => c,
        Err(e) => {
            undo(&layers, &cgroups, &mut disk);
            return Err(e);
        }
    };
    // Held open across the clone, so the init inherits it; closed here when `spawn` returns.
    let idmapped_image = if spec.idmap_image {
        match idmapped::image_tree(&spec.image_root, &ids) {
            Ok(tree) => Some(tree),
            Err(e) => {
                undo(&layers, &cgroups, &mut disk);
                return Err(e);
            }
        }
    } else {
        None
    };
    plan.root.idmapped_image = idmapped_image.as_ref().map(|fd| fd.as_raw_fd());
    // As the image's: held open across the clone, closed here when `spawn` returns.
    let idmapped_layers = match &spec.layer_ids {
        Some(written) if spec.reuse_layers && *written != ids => {
            let disk_dir = DiskPaths::at(&spec.state_dir).mountpoint;
            match idmapped::layer_disk(&disk_dir, written, &ids) {
                Ok(tree) => Some((tree, disk_dir)),
                Err(e) => {
                    undo(&layers, &cgroups, &mut disk);
                    return Err(e);
                }
            }
        }
        _ => None,
    };
    plan.root.idmapped_layers = idmapped_layers
        .as_ref()
        .map(|(fd, dir)| (fd.as_raw_fd(), dir.clone()));
    // As the image's: held open across the clone, closed here when `spawn` returns.
    let mut rw_binds: Vec<(PathBuf, PathBuf)> = spec
        .rw_binds
        .iter()
        .map(|b| (b.source.clone(), b.target.clone()))
        .collect();
    if let (Some(mounted), Some(cache)) = (&cache, &spec.cache) {
        rw_binds.extend(mounted.binds(cache));
    }
    let sources: Vec<&Path> = rw_binds
        .iter()
        .map(|(source, _)| source.as_path())
        .collect();
    let rw_trees = match idmapped::read_write_trees(&sources, &ids) {
        Ok(trees) => trees,
        Err(e) => {
            undo(&layers, &cgroups, &mut disk);
            return Err(e);
        }
    };
    for (tree, (source, target)) in rw_trees.iter().zip(&rw_binds) {
        let target = match guest_relative(target) {
            Ok(target) => target,
            Err(e) => {
                undo(&layers, &cgroups, &mut disk);
                return Err(e);
            }
        };
        plan.root
            .rw_binds
            .push((tree.as_raw_fd(), source.clone(), target));
    }

    // The init joins its v1 cgroups itself (see `cgroup`), through files opened here.
    let cgroup_joins = match cgroups.self_join_files() {
        Ok(files) => files,
        Err(e) => {
            undo(&layers, &cgroups, &mut disk);
            return Err(e);
        }
    };

    // SAFETY: the process was verified single-threaded above, and the one thread started
    // since (`prepare_host_side`'s) was joined, so no other thread can hold a lock the child
    // would need; the child branch ends in child::run, which never returns.
    let cloned = unsafe { sys::clone_fork(NAMESPACES) };
    let (pid, pidfd) = match cloned {
        Ok(CloneResult::Child) => {
            let Channels {
                sync_parent,
                sync_child,
                errors_read,
                errors_write,
            } = channels;
            // Our copy of the supervisor's ends must close, or EOF could never be seen.
            drop((sync_parent, errors_read, host_channel));
            let ends = ChildEnds {
                sync: sync_child,
                errors: errors_write,
                channel: guest_channel,
                cgroup_joins,
            };
            child::run(&plan, ends)
        }
        Ok(CloneResult::Parent { pid, pidfd }) => (pid, pidfd),
        Err(errno) => {
            undo(&layers, &cgroups, &mut disk);
            return Err(JailError::sys(
                "clone into new user/mount/pid/net/ipc/uts namespaces",
                errno,
            )
            .hint(HINT_USERNS));
        }
    };
    let Channels {
        sync_parent,
        sync_child,
        errors_read,
        errors_write,
    } = channels;
    drop((sync_child, errors_write, guest_channel, cgroup_joins));

    // From here on, dropping `jail` kills the init and removes everything.
    let mut jail = Jail::new(
        spec,
        pid,
        pidfd,
        host_channel,
        ids,
        cgroups,
        Storage {
            layers,
            disk,
            cache,
        },
    );
    ids.write_for(pid)?;
    // Two releases: the init builds the guest's root while we move it into its v2 cgroups, if
    // any (it joins its v1 ones itself), and execs nothing before the second.
    sync::release(sync_parent.as_fd())
        .map_err(|e| JailError::sys("releasing the guest init", e))?;
    let joined = jail.cgroup_set().attach_rest(pid).and_then(|()| {
        sync::release(sync_parent.as_fd())
            .map_err(|e| JailError::sys("telling the guest init it is in its cgroups", e))
    });
    if let Err(e) = joined {
        // The init may have failed its setup meanwhile (and exited, hence the broken pipe):
        // its own report says what went wrong.
        return Err(
            match sync::read_outcome(errors_read.as_fd(), Duration::from_secs(2)) {
                Ok(Outcome::Failed(report)) => JailError::GuestSetup(report),
                _ => e,
            },
        );
    }
    match sync::read_outcome(errors_read.as_fd(), SETUP_TIMEOUT)
        .map_err(|e| JailError::sys("reading the guest init's error pipe", e))?
    {
        Outcome::Exec => {}
        Outcome::Failed(report) => return Err(JailError::GuestSetup(report)),
        Outcome::TimedOut => {
            return Err(JailError::Timeout {
                what: "the guest init to exec the agent",
                secs: SETUP_TIMEOUT.as_secs(),
            })
        }
    }
    if let Some(status) = jail.try_wait()? {
        return Err(JailError::GuestDied(describe(status)));
    }
    // The init no longer needs the supervisor's end once it has exec'd.
    drop(sync_parent);
    Ok(jail)
}

/// Builds what the guest needs on the host before the clone: its disk, mounted here so that
/// the guest's mount namespace (a copy of this one) sees it, the layers on it, and its
/// cgroups. The disk (a copy, a loop device, a mount) and the cgroups (a directory and limit
/// files per hierarchy) do not depend on each other and each spends most of a millisecond
/// waiting in the kernel, so a scoped thread builds the cgroups meanwhile. It is joined
/// before this returns: the clone that follows needs a single-threaded process. On failure
/// nothing is left behind.
fn prepare_host_side(
    spec: &JailSpec,
    ids: &IdMap,
    layout: &Layout,
) -> Result<(Disk, Layers, CgroupSet), JailError> {
    let create_cgroups = || {
        CgroupSet::create(
            layout,
            &spec.name,
            &spec.limits,
            ids.init_host_ids(),
            spec.exec_cgroup.as_deref(),
        )
    };
    let storage = || -> Result<(Disk, Layers), JailError> {
        let mut disk = Disk::attach(spec)?;
        match Layers::prepare(spec, ids) {
            Ok(layers) => Ok((disk, layers)),
            Err(e) => {
                undo_storage(None, &mut disk);
                Err(e)
            }
        }
    };
    let (storage, cgroups) = std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("cgroups".into())
            .spawn_scoped(scope, create_cgroups)
        {
            Ok(builder) => {
                let storage = storage();
                let cgroups = builder.join().unwrap_or_else(|_| {
                    Err(JailError::sys(
                        "the thread creating the cgroups panicked",
                        nix::errno::Errno::EIO,
                    ))
                });
                (storage, cgroups)
            }
            // No thread to spare: one after the other.
            Err(_) => (storage(), create_cgroups()),
        }
    });
    match (storage, cgroups) {
        (Ok((disk, layers)), Ok(cgroups)) => Ok((disk, layers, cgroups)),
        (Ok((mut disk, layers)), Err(e)) => {
            undo_storage(Some(&layers), &mut disk);
            Err(e)
        }
        (Err(e), Ok(cgroups)) => {
            let _ = cgroups.remove();
            Err(e)
        }
        (Err(e), Err(_)) => Err(e),
    }
}

/// Best effort, after a failed start: undoes the layers (if made), then releases the disk,
/// keeping its image if it was not made fresh for this start (a recovering task's).
fn undo_storage(layers: Option<&Layers>, disk: &mut Disk) {
    if let Some(layers) = layers {
        let _ = layers.undo_prepare();
    }
    let _ = disk.release(!disk.is_fresh());
}

/// The sync and error channels, and the agent channel (a `SOCK_STREAM` socketpair, both ends
/// close-on-exec: the init re-creates its end as fd 3 without the flag).
fn make_channels() -> Result<(Channels, std::os::fd::OwnedFd, std::os::fd::OwnedFd), JailError> {
    let channels = Channels::new().map_err(|e| JailError::sys("creating the sync channels", e))?;
    let (host, guest) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| JailError::sys("creating the agent channel socketpair", e))?;
    Ok((channels, host, guest))
}

fn cstring(what: &str, s: &str) -> Result<CString, JailError> {
    CString::new(s)
        .map_err(|_| JailError::InvalidSpec(format!("{what} contains a NUL byte: {s:?}")))
}

/// Everything the guest init will need, built before clone.
fn plan(spec: &JailSpec, ids: &IdMap) -> Result<ChildPlan, JailError> {
    let layers = Layers::at(&spec.state_dir);
    let binds = spec
        .ro_binds
        .iter()
        .map(|b| Ok((b.source.clone(), guest_relative(&b.target)?)))
        .collect::<Result<Vec<(PathBuf, PathBuf)>, JailError>>()?;
    let (tmp_bytes, shm_bytes) = rootfs::tmpfs_sizes(spec.limits.memory_bytes);
    let root = RootPlan {
        image_root: spec.image_root.clone(),
        upper: layers.upper,
        work: layers.work,
        mountpoint: layers.root,
        binds,
        agent: spec.agent_binary.clone(),
        agent_target: guest_relative(Path::new(AGENT_GUEST_PATH))?,
        tty_gid: ids.gid_to_host(TTY_GID).map(|_| TTY_GID),
        tmp_bytes,
        shm_bytes,
        // Known once the cgroups exist (see `spawn`).
        cgroups: Vec::new(),
        // Made just before the clone (see `spawn`).
        idmapped_image: None,
        idmapped_layers: None,
        // Made just before the clone too.
        rw_binds: Vec::new(),
    };
    let exe = cstring("agent path", AGENT_GUEST_PATH)?;
    let mut argv = vec![
        exe.clone(),
        cstring("argument", "--channel-fd")?,
        cstring("argument", &CHANNEL_FD.to_string())?,
    ];
    for arg in &spec.agent_args {
        argv.push(cstring("agent argument", arg)?);
    }
    let home = if ids.is_rootless() {
        "HOME=/"
    } else {
        "HOME=/root"
    };
    let envp = [PATH, home, "container=dynocap"]
        .iter()
        .map(|v| cstring("environment", v))
        .collect::<Result<_, _>>()?;
    Ok(ChildPlan {
        hostname: spec.hostname.clone(),
        root,
        uid: Uid::from_raw(ids.init_uid()),
        gid: Gid::from_raw(ids.init_gid()),
        drop_groups: !ids.is_rootless(),
        exe,
        argv,
        envp,
        seccomp: seccomp::program()?,
        caps: if spec.net_raw {
            caps::docker_default_mask()
        } else {
            caps::docker_default_mask() & !(1 << caps::CAP_NET_RAW)
        },
        exec_cgroup: None,
    })
}

/// Has the init hand the agent the cgroup delegated for its commands, as fd
/// [`EXEC_CGROUP_FD`] named on its command line beside the channel.
fn hand_exec_cgroup(plan: &mut ChildPlan, dir: &Path) {
    plan.exec_cgroup = Some(dir.to_path_buf());
    let at = plan.argv.len().min(3);
    let flag = [c"--cgroup-fd".to_owned(), fd_arg(EXEC_CGROUP_FD)];
    plan.argv.splice(at..at, flag);
}

fn fd_arg(fd: i32) -> CString {
    CString::new(fd.to_string()).expect("a number has no NUL byte")
}

fn describe(status: WaitStatus) -> String {
    match status {
        WaitStatus::Exited(_, code) => format!("exit status {code}"),
        WaitStatus::Signaled(_, signal, _) => format!("killed by {signal}"),
        other => format!("{other:?}"),
    }
}
