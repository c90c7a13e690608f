//! The VM backend's first stage: the agent as `/init` of the initramfs the host built.
//!
//! It loads the kernel modules the host put beside it (`/lib/modules/dynocap.order`, deps
//! first), mounts the sandbox's disk, grows its ext4 to the disk's size if it is smaller (the
//! host makes the base at the disk's size, so only a disk kept from a boot over an older,
//! smaller base still grows here), makes the home and state directories, brings up `lo` (and
//! a `nat` guest's NIC: [`crate::vm_net`]), names the host, binds itself read-only at
//! `/.dynocap/agent` in the new root (on a tmpfs of its own), switches root, and re-executes
//! itself there as PID 1 with the virtio-serial port as its channel. From then on the agent
//! is the same program it is in a jail.
//!
//! Settings come from the kernel command line, which only the host writes:
//! `dynocap.root=/dev/vda dynocap.port=dynocap dynocap.hostname=NAME`, and for a `nat` guest
//! `dynocap.net=ADDR/PREFIX,GATEWAY,RESOLVER`; the agent's own
//! options (`--exec-user`, `--home`) follow `--` there and reach us as arguments.

use std::convert::Infallible;
use std::ffi::{CString, OsString};
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::vm_net::NetError;

/// Why the first stage could not hand over to the agent in the new root.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("reading /proc/cmdline: {0}")]
    ReadCmdline(#[source] io::Error),
    #[error("the kernel command line has no {0}=")]
    MissingSetting(&'static str),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("reading {MODULE_ORDER}: {0}")]
    ReadModuleOrder(#[source] io::Error),
    #[error("opening {name}: {source}")]
    OpenModule { name: String, source: io::Error },
    #[error("loading the kernel module {name}: {source}")]
    LoadModule { name: String, source: Errno },
    #[error(
        "{what} {} did not appear within {}s (is its driver in the initramfs?)",
        path.display(),
        DEVICE_WAIT.as_secs()
    )]
    DeviceMissing { what: &'static str, path: PathBuf },
    #[error("no virtio-serial port named {0:?} appeared within {secs}s", secs = DEVICE_WAIT.as_secs())]
    NoPort(String),
    #[error("creating {}: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("setting the mode of {}: {source}", path.display())]
    Chmod { path: PathBuf, source: io::Error },
    #[error("handing {} to {uid}:{gid}: {source}", path.display())]
    Chown {
        path: PathBuf,
        uid: u32,
        gid: u32,
        source: io::Error,
    },
    #[error("mounting {} on {NEW_ROOT}: {source}", device.display())]
    MountRoot { device: PathBuf, source: Errno },
    #[error("setting the hostname: {0}")]
    Hostname(#[source] Errno),
    #[error("mounting a tmpfs on {}: {source}", path.display())]
    MountTmpfs { path: PathBuf, source: Errno },
    #[error("binding {INIT_PATH} onto {}: {source}", path.display())]
    BindAgent { path: PathBuf, source: Errno },
    #[error("making {} read-only: {source}", path.display())]
    ReadOnly { path: PathBuf, source: Errno },
    #[error("entering {NEW_ROOT}: {0}")]
    EnterNewRoot(#[source] io::Error),
    #[error("moving {NEW_ROOT} onto /: {0}")]
    MoveRoot(#[source] Errno),
    #[error("chroot into the new root: {0}")]
    Chroot(#[source] Errno),
    #[error("entering the new root: {0}")]
    EnterRoot(#[source] io::Error),
    #[error("an argument holds a NUL byte")]
    NulInArgument,
    #[error("executing {AGENT_PATH} in the new root: {0}")]
    ExecAgent(#[source] Errno),
}

/// Why the root filesystem could not grow to its disk's size; the boot goes on without.
#[derive(Debug, thiserror::Error)]
enum GrowError {
    #[error("opening {}: {source}", device.display())]
    OpenDevice { device: PathBuf, source: io::Error },
    #[error("BLKGETSIZE64: {0}")]
    DeviceSize(#[source] Errno),
    #[error("reading the superblock of {}: {source}", device.display())]
    ReadSuperblock { device: PathBuf, source: io::Error },
    #[error(transparent)]
    Superblock(#[from] SuperblockError),
    #[error("opening {NEW_ROOT}: {0}")]
    OpenRoot(#[source] io::Error),
    #[error("EXT4_IOC_RESIZE_FS to {blocks} blocks: {source}")]
    Resize { blocks: u64, source: Errno },
}

/// Why an ext4 superblock does not say the filesystem's size.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum SuperblockError {
    #[error("the root disk holds no ext4 superblock")]
    NoMagic,
    #[error("the superblock's block size 1024<<{0} is out of range")]
    BlockSize(u32),
}

/// The argument that selects this stage (the host puts it first after `--`).
pub const FLAG: &str = "--vm-boot";
/// Set in the second stage's environment: this agent is PID 1 of a VM. Commands never see
/// it: they get the agent's base environment, not its own.
const VM_ENV: &str = "DYNOCAP_VM_GUEST";

/// Whether this agent is PID 1 of a VM (started by this stage), not of a jail.
pub fn is_vm_guest() -> bool {
    std::env::var_os(VM_ENV).is_some()
}

/// Ends the VM cleanly: everything written reaches the disk, then a reboot, which QEMU's
/// `-no-reboot` turns into its exit. Only returns if the kernel refuses.
pub fn power_off() {
    nix::unistd::sync();
    let Err(err) = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT);
    log!("cannot stop the VM: {err}");
}

/// Where the new root is mounted before the switch.
const NEW_ROOT: &str = "/newroot";
/// The module load order the host wrote into the initramfs.
const MODULE_ORDER: &str = "/lib/modules/dynocap.order";
/// The agent's path in the new root, as in the jail.
const AGENT_PATH: &str = "/.dynocap/agent";
/// How long devices may take to appear after their drivers load (TCG is slow).
const DEVICE_WAIT: Duration = Duration::from_secs(60);
/// How often to look for them meanwhile: they usually appear within milliseconds of the
/// driver loading, and every millisecond here is one of the boot's.
const DEVICE_POLL: Duration = Duration::from_millis(2);
/// This program, as the initramfs holds it.
const INIT_PATH: &str = "/init";

/// The guest's settings from the kernel command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootParams {
    pub root: PathBuf,
    pub port: String,
    pub hostname: Option<String>,
    /// Network `nat`: the NIC's settings.
    pub nat: Option<crate::vm_net::NatConfig>,
    /// A task's package caches (`dynocap.cache`, see `vm_cache`).
    pub cache: Option<String>,
}

/// Reads `dynocap.*` settings out of a kernel command line.
pub fn parse_cmdline(cmdline: &str) -> Result<BootParams, BootError> {
    let mut root = None;
    let mut port = None;
    let mut hostname = None;
    let mut nat = None;
    let mut cache = None;
    for word in cmdline.split_whitespace() {
        if word == "--" {
            break;
        }
        match word.split_once('=') {
            Some(("dynocap.root", v)) => root = Some(PathBuf::from(v)),
            Some(("dynocap.port", v)) => port = Some(v.to_owned()),
            Some(("dynocap.hostname", v)) => hostname = Some(v.to_owned()),
            Some(("dynocap.net", v)) => nat = Some(crate::vm_net::parse_nat(v)?),
            Some(("dynocap.cache", v)) => cache = Some(v.to_owned()),
            _ => {}
        }
    }
    Ok(BootParams {
        root: root.ok_or(BootError::MissingSetting("dynocap.root"))?,
        port: port.ok_or(BootError::MissingSetting("dynocap.port"))?,
        hostname,
        nat,
        cache,
    })
}

/// Runs the first stage. Returns only on failure (success ends in `execve`); the caller exits,
/// which panics the kernel and stops the VM, and the host shows the console's last lines.
pub fn run(agent_args: Vec<OsString>) -> ExitCode {
    crate::init::setup();
    crate::init::ensure_stdio_open();
    match boot(agent_args) {
        Ok(never) => match never {},
        Err(msg) => {
            log!("vm boot failed: {msg}");
            ExitCode::from(2)
        }
    }
}

fn boot(agent_args: Vec<OsString>) -> Result<Infallible, BootError> {
    let cmdline = fs::read_to_string("/proc/cmdline").map_err(BootError::ReadCmdline)?;
    let params = parse_cmdline(&cmdline)?;
    load_modules()?;
    wait_for(&params.root, "the root disk")?;
    fs::create_dir_all(NEW_ROOT).map_err(|source| BootError::Create {
        path: NEW_ROOT.into(),
        source,
    })?;
    // An error (a write to the disk that failed, metadata found corrupt) stops all writes at
    // once rather than letting later ones report success over it: see `disk_health`.
    mount(
        Some(&params.root),
        NEW_ROOT,
        Some("ext4"),
        MsFlags::empty(),
        Some("errors=remount-ro"),
    )
    .map_err(|source| BootError::MountRoot {
        device: params.root.clone(),
        source,
    })?;
    if let Err(msg) = grow_filesystem(&params.root) {
        // The sandbox still works, only with the base image's free space.
        log!("cannot grow the root filesystem to the disk's size: {msg}");
    }
    make_guest_dirs(&agent_args)?;
    if let Some(value) = &params.cache {
        let (home, user) = home_and_user(&agent_args);
        let spots = crate::vm_cache::parse(value);
        match crate::vm_cache::mount_caches(
            &spots,
            Path::new(NEW_ROOT),
            home.as_deref(),
            user,
            DEVICE_WAIT,
        ) {
            Ok(()) => log!("vm boot: {} package caches bound", spots.len()),
            Err(why) => log!("vm boot: no package caches: {why}"),
        }
    }
    if let Err(err) = crate::vm_net::loopback_up() {
        // Only the filtered network's in-guest proxy listener needs it; say so and go on.
        log!("cannot bring up lo: {err}");
    }
    if let Some(nat) = &params.nat {
        // A `nat` sandbox without its network would fail its user later and obscurely.
        crate::vm_net::configure_nat(nat, Path::new(NEW_ROOT), DEVICE_WAIT)?;
    }
    if let Some(name) = &params.hostname {
        nix::unistd::sethostname(name).map_err(BootError::Hostname)?;
    }
    install_agent()?;
    let port = find_port(&params.port)?;
    // One line on the console, so a log shows how far a boot got.
    log!(
        "vm boot: {} mounted, channel {}; starting the agent in it",
        params.root.display(),
        port.display()
    );
    switch_root()?;
    exec_agent(&port, agent_args)
}

/// Loads each module named in the order file, skipping ones already present.
fn load_modules() -> Result<(), BootError> {
    let order = match fs::read_to_string(MODULE_ORDER) {
        Ok(text) => text,
        // A kernel with everything built in needs no modules.
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(BootError::ReadModuleOrder(err)),
    };
    for name in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = Path::new("/lib/modules").join(name);
        let file = fs::File::open(&path).map_err(|source| BootError::OpenModule {
            name: name.to_owned(),
            source,
        })?;
        match nix::kmod::finit_module(&file, c"", nix::kmod::ModuleInitFlags::empty()) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(source) => {
                return Err(BootError::LoadModule {
                    name: name.to_owned(),
                    source,
                })
            }
        }
        // The initramfs is RAM: give the module's pages back now that the kernel has a copy.
        drop(file);
        let _ = fs::remove_file(&path);
    }
    Ok(())
}

fn wait_for(path: &Path, what: &'static str) -> Result<(), BootError> {
    let deadline = Instant::now() + DEVICE_WAIT;
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(BootError::DeviceMissing {
                what,
                path: path.to_owned(),
            });
        }
        std::thread::sleep(DEVICE_POLL);
    }
    Ok(())
}

/// Grows the mounted ext4 to the whole device (online resize). The host makes every new disk's
/// filesystem at the disk's size, so this normally finds nothing to do, and says so from the
/// superblock alone: the resize ioctl even as a no-op flushes the journal, which costs a
/// boot tens of milliseconds under TCG.
fn grow_filesystem(device: &Path) -> Result<(), GrowError> {
    let dev = fs::File::open(device).map_err(|source| GrowError::OpenDevice {
        device: device.to_owned(),
        source,
    })?;
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at `bytes`;
    // `dev` is an open descriptor for the duration of the call.
    unsafe { blk_get_size64(dev.as_raw_fd(), &mut bytes) }.map_err(GrowError::DeviceSize)?;
    let mut superblock = [0_u8; 1024];
    std::os::unix::fs::FileExt::read_exact_at(&dev, &mut superblock, 1024).map_err(|source| {
        GrowError::ReadSuperblock {
            device: device.to_owned(),
            source,
        }
    })?;
    let (fs_blocks, block) = ext4_size(&superblock)?;
    let blocks: u64 = bytes / block;
    if blocks <= fs_blocks {
        return Ok(());
    }
    let root = fs::File::open(NEW_ROOT).map_err(GrowError::OpenRoot)?;
    // SAFETY: EXT4_IOC_RESIZE_FS reads one u64 through the pointer, which points at `blocks`;
    // `root` is an open descriptor on the mounted ext4 for the duration of the call.
    unsafe { ext4_resize_fs(root.as_raw_fd(), &blocks) }
        .map_err(|source| GrowError::Resize { blocks, source })?;
    Ok(())
}

/// The block count and block size an ext4 superblock (the 1024 bytes at offset 1024)
/// records.
fn ext4_size(sb: &[u8; 1024]) -> Result<(u64, u64), SuperblockError> {
    let u32_at = |at: usize| u32::from_le_bytes([sb[at], sb[at + 1], sb[at + 2], sb[at + 3]]);
    if u16::from_le_bytes([sb[0x38], sb[0x39]]) != 0xEF53 {
        return Err(SuperblockError::NoMagic);
    }
    let log = u32_at(0x18);
    if log > 6 {
        return Err(SuperblockError::BlockSize(log));
    }
    let incompat_64bit = u32_at(0x60) & 0x80 != 0;
    let high = if incompat_64bit { u32_at(0x150) } else { 0 };
    Ok((
        (u64::from(high) << 32) | u64::from(u32_at(0x4)),
        1024 << log,
    ))
}

// BLKGETSIZE64 is `_IOR(0x12, 114, size_t)`; EXT4_IOC_RESIZE_FS is `_IOW('f', 16, __u64)`.
nix::ioctl_read!(blk_get_size64, 0x12, 114, u64);
nix::ioctl_write_ptr!(ext4_resize_fs, b'f', 16, u64);

/// The sandbox user's home and the agent's state directory, which the jail backend makes on
/// the host side; a VM's disk is only reachable from inside.
fn make_guest_dirs(agent_args: &[OsString]) -> Result<(), BootError> {
    let (home, user) = home_and_user(agent_args);
    let state = Path::new(NEW_ROOT).join(
        crate::statedir::DEFAULT_STATE_DIR
            .strip_prefix('/')
            .unwrap_or(crate::statedir::DEFAULT_STATE_DIR),
    );
    make_dir(&state, 0o700, None)?;
    if let Some(home) = home {
        let home = Path::new(NEW_ROOT).join(home.strip_prefix("/").unwrap_or(&home));
        make_dir(&home, 0o755, user)?;
    }
    Ok(())
}

fn make_dir(path: &Path, mode: u32, owner: Option<(u32, u32)>) -> Result<(), BootError> {
    if path.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|source| BootError::Create {
            path: path.to_owned(),
            source,
        })?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|source| {
        BootError::Chmod {
            path: path.to_owned(),
            source,
        }
    })?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|source| {
            BootError::Chown {
                path: path.to_owned(),
                uid,
                gid,
                source,
            }
        })?;
    }
    Ok(())
}

/// `--home` and `--exec-user` out of the agent's arguments (already validated by the host;
/// stage two parses them again strictly).
fn home_and_user(args: &[OsString]) -> (Option<PathBuf>, Option<(u32, u32)>) {
    let mut home = None;
    let mut user = None;
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(arg) = it.next() {
        let (flag, value) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        let value = value.or_else(|| {
            matches!(flag.as_str(), "--home" | "--exec-user")
                .then(|| it.next())
                .flatten()
        });
        match (flag.as_str(), value) {
            ("--home", Some(v)) => home = Some(PathBuf::from(v)),
            ("--exec-user", Some(v)) => {
                user = v
                    .split_once(':')
                    .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
            }
            _ => {}
        }
    }
    (home, user)
}

/// Puts this binary at `/.dynocap/agent` in the new root, read-only, on a tmpfs of its own:
/// the disk belongs to the sandbox, so the agent must not live where the sandbox could
/// replace it. The file is the initramfs' own `/init`, bind-mounted onto an empty file
/// rather than copied: a copy of the 2 MiB binary cost the boot tens of milliseconds under
/// TCG, and the initramfs keeps it in RAM either way.
fn install_agent() -> Result<(), BootError> {
    let dir = Path::new(NEW_ROOT).join(".dynocap");
    fs::create_dir_all(&dir).map_err(|source| BootError::Create {
        path: dir.clone(),
        source,
    })?;
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(
        Some("tmpfs"),
        &dir,
        Some("tmpfs"),
        nosuid_nodev,
        Some("mode=0755"),
    )
    .map_err(|source| BootError::MountTmpfs {
        path: dir.clone(),
        source,
    })?;
    let target = dir.join("agent");
    fs::File::create(&target).map_err(|source| BootError::Create {
        path: target.clone(),
        source,
    })?;
    mount(
        Some(INIT_PATH),
        &target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| BootError::BindAgent {
        path: target.clone(),
        source,
    })?;
    // A bind mount takes the read-only flag only on a remount of itself.
    mount(
        None::<&str>,
        &target,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | nosuid_nodev,
        None::<&str>,
    )
    .map_err(|source| BootError::ReadOnly {
        path: target.clone(),
        source,
    })?;
    mount(
        None::<&str>,
        &dir,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nosuid_nodev,
        None::<&str>,
    )
    .map_err(|source| BootError::ReadOnly { path: dir, source })
}

/// The `/dev` node of the virtio-serial port named `name` (no udev here to make the
/// `/dev/virtio-ports/NAME` link).
fn find_port(name: &str) -> Result<PathBuf, BootError> {
    let class = Path::new("/sys/class/virtio-ports");
    let deadline = Instant::now() + DEVICE_WAIT;
    loop {
        if let Ok(entries) = fs::read_dir(class) {
            for entry in entries.flatten() {
                let port_name = fs::read_to_string(entry.path().join("name")).unwrap_or_default();
                if port_name.trim_end() == name {
                    let dev = Path::new("/dev").join(entry.file_name());
                    wait_for(&dev, "the agent's virtio-serial port")?;
                    return Ok(dev);
                }
            }
        }
        if Instant::now() > deadline {
            return Err(BootError::NoPort(name.to_owned()));
        }
        std::thread::sleep(DEVICE_POLL);
    }
}

/// Makes the disk the root: the API filesystems go (stage two mounts them again in the new
/// root), then the new root moves onto `/`. The initramfs' `/init` stays: it is the agent
/// the new root sees at `/.dynocap/agent` (the modules already went as they loaded).
fn switch_root() -> Result<(), BootError> {
    for target in ["/dev/pts", "/run", "/tmp", "/dev", "/sys", "/proc"] {
        let _ = umount2(target, MntFlags::MNT_DETACH);
    }
    std::env::set_current_dir(NEW_ROOT).map_err(BootError::EnterNewRoot)?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(BootError::MoveRoot)?;
    nix::unistd::chroot(".").map_err(BootError::Chroot)?;
    std::env::set_current_dir("/").map_err(BootError::EnterRoot)
}

fn exec_agent(port: &Path, agent_args: Vec<OsString>) -> Result<Infallible, BootError> {
    let cstr = |bytes: &[u8]| CString::new(bytes).map_err(|_| BootError::NulInArgument);
    let mut argv = vec![
        cstr(AGENT_PATH.as_bytes())?,
        cstr(b"--channel-path")?,
        cstr(port.as_os_str().as_bytes())?,
    ];
    for arg in &agent_args {
        argv.push(cstr(arg.as_bytes())?);
    }
    let env = [
        cstr(b"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")?,
        cstr(format!("{VM_ENV}=1").as_bytes())?,
    ];
    let path = cstr(AGENT_PATH.as_bytes())?;
    let Err(err) = nix::unistd::execve(&path, &argv, &env);
    Err(BootError::ExecAgent(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_command_line_settings_are_read() {
        let params = parse_cmdline(
            "console=ttyS0 dynocap.root=/dev/vda dynocap.port=dynocap dynocap.hostname=box-1 \
             -- --vm-boot --home /home/sandbox",
        )
        .expect("parse");
        assert_eq!(
            params,
            BootParams {
                root: "/dev/vda".into(),
                port: "dynocap".into(),
                hostname: Some("box-1".into()),
                nat: None,
                cache: None,
            }
        );
        let params = parse_cmdline(
            "dynocap.root=/dev/vda dynocap.port=p dynocap.net=10.0.2.15/24,10.0.2.2,169.254.1.1",
        )
        .expect("parse");
        assert_eq!(
            params.nat.map(|n| n.gateway),
            Some(std::net::Ipv4Addr::new(10, 0, 2, 2))
        );
        assert!(matches!(
            parse_cmdline("dynocap.root=/dev/vda dynocap.port=p dynocap.net=bad"),
            Err(BootError::Net(NetError::BadNatSetting(_)))
        ));
        // Anything after `--` is init's arguments, never settings.
        let err = parse_cmdline("dynocap.port=p -- dynocap.root=/dev/sda").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the kernel command line has no dynocap.root="
        );
        assert!(matches!(
            parse_cmdline("dynocap.root=/dev/vda"),
            Err(BootError::MissingSetting("dynocap.port"))
        ));
    }

    #[test]
    fn the_superblock_gives_the_filesystem_size() {
        let mut sb = [0_u8; 1024];
        assert_eq!(ext4_size(&sb), Err(SuperblockError::NoMagic));
        sb[0x38..0x3a].copy_from_slice(&0xEF53_u16.to_le_bytes());
        sb[0x4..0x8].copy_from_slice(&262_144_u32.to_le_bytes());
        sb[0x18..0x1c].copy_from_slice(&2_u32.to_le_bytes());
        // The high word counts only with the 64bit feature.
        sb[0x150..0x154].copy_from_slice(&1_u32.to_le_bytes());
        assert_eq!(ext4_size(&sb), Ok((262_144, 4096)));
        sb[0x60..0x64].copy_from_slice(&0x80_u32.to_le_bytes());
        assert_eq!(ext4_size(&sb), Ok(((1 << 32) + 262_144, 4096)));
        sb[0x18..0x1c].copy_from_slice(&40_u32.to_le_bytes());
        assert_eq!(ext4_size(&sb), Err(SuperblockError::BlockSize(40)));
    }

    #[test]
    fn home_and_user_come_from_the_agent_arguments() {
        let args: Vec<OsString> = ["--exec-user", "1000:1001", "--home=/home/sandbox"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            home_and_user(&args),
            (Some("/home/sandbox".into()), Some((1000, 1001)))
        );
        assert_eq!(home_and_user(&[]), (None, None));
    }
}
