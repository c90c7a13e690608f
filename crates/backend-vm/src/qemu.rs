//! QEMU's command line, and starting QEMU so that it cannot outlive its supervisor.
//!
//! The agent channel, QMP and the serial console are socketpair ends QEMU inherits as fds 3,
//! 4 and 5 (`-chardev socket,fd=N`): no socket paths to race on or clean up, and the channel is connected before
//! the guest opens its port (a virtio-serial port with no host side reads as end-of-file).
//!
//! A `nat` guest gets a NIC on QEMU's user networking (slirp), with QEMU started in a network
//! namespace of its own: slirp's connections are sockets there, and the caller decides where
//! that namespace leads (see [`QemuConfig::nat`]).

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::error::{Result, VmError};

/// The QEMU binary.
pub const QEMU: &str = "qemu-system-x86_64";
/// The name the agent looks for among the guest's virtio-serial ports.
pub const PORT_NAME: &str = "dynocap";
/// The fds QEMU finds its two sockets on.
const CHANNEL_FD: RawFd = 3;
const QMP_FD: RawFd = 4;
const CONSOLE_FD: RawFd = 5;

/// The guest's side of user networking: slirp's network, the guest's address in it, and the
/// gateway (slirp itself). Everything the guest sends to the gateway goes out through slirp.
pub const NAT_NETWORK: &str = "10.0.2.0/24";
pub const NAT_GUEST_ADDR: &str = "10.0.2.15/24";
pub const NAT_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machine {
    /// Minimal machine: no PCI, no firmware beyond qboot, virtio-mmio devices.
    Microvm,
    /// The fallback: a full PC with virtio-pci devices.
    Q35,
}

/// Everything the command line is made from.
#[derive(Debug, Clone)]
pub struct QemuConfig {
    pub machine: Machine,
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mb: u64,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    pub disk: PathBuf,
    /// `-sandbox on`: QEMU's seccomp filter (a QEMU built without seccomp refuses it).
    pub seccomp: bool,
    /// For a QEMU started as root: the host uid and gid it drops to once its files are open,
    /// and the empty directory it chroots into (Firecracker's jailer does the same).
    pub drop_to: Option<Confinement>,
    /// `Some(resolver)`: a `nat` guest. It gets a virtio NIC on QEMU's user networking
    /// (`-netdev user`) and `resolver` as its DNS server, and QEMU starts in a network
    /// namespace of its own (which needs root): slirp's alias for the host's loopback then
    /// reaches that namespace's empty loopback, and the guest's connections leave by whatever
    /// the caller attaches to it. `None`: no NIC at all.
    pub nat: Option<Ipv4Addr>,
    /// A task's package cache disk, attached as a second virtio disk with the serial the
    /// guest finds it by (see the agent's `vm_cache`).
    pub cache_disk: Option<CacheDisk>,
}

/// A project's package cache disk: a raw ext4 image only guests mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDisk {
    pub image: PathBuf,
    /// Another guest has the image: this one writes to a throwaway copy-on-write layer
    /// (QEMU's `snapshot=on`), which goes with the guest, and leaves the image as it is.
    pub throwaway: bool,
    /// What the kernel command line's `dynocap.cache=` tells the guest: `name:path` entries.
    pub spots: String,
}

/// The virtio serial the guest finds the cache disk by.
pub const CACHE_SERIAL: &str = "dynocap-cache";

/// Where a root-started QEMU goes after opening its files.
#[derive(Debug, Clone)]
pub struct Confinement {
    pub uid: u32,
    pub gid: u32,
    pub chroot: PathBuf,
}

impl Confinement {
    /// Drops to `uid:gid` in `dir`, created empty, root-owned and read-only if missing.
    pub fn in_empty_dir(dir: &Path, uid: u32, gid: u32) -> Result<Confinement> {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(VmError::io("creating", dir, err)),
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
            .map_err(|err| VmError::io("making read-only", dir, err))?;
        Ok(Confinement {
            uid,
            gid,
            chroot: dir.to_owned(),
        })
    }
}

/// The arguments that confine QEMU: its seccomp filter (`-sandbox`), and for a root-started
/// QEMU the ids it drops to and the directory it chroots into once its files are open.
pub fn confinement_args(seccomp: bool, drop_to: Option<&Confinement>) -> Vec<OsString> {
    let mut args = Vec::new();
    if seccomp {
        // QEMU 7.2 installs its filter before `-runas` drops privileges, so a dropping QEMU
        // must still be allowed setuid/setgid; once it runs as an unprivileged uid without
        // capabilities, that call can no longer raise anything.
        let sandbox = if drop_to.is_some() {
            "on,obsolete=deny,spawn=deny,resourcecontrol=deny"
        } else {
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
        };
        push(&mut args, &["-sandbox", sandbox]);
    }
    if let Some(confine) = drop_to {
        let ids = format!("{}:{}", confine.uid, confine.gid);
        push(&mut args, &["-runas", &ids]);
        args.push("-chroot".into());
        args.push(confine.chroot.clone().into());
    }
    args
}

/// The kernel command line: console on the serial port, a panic (PID 1 exiting) stops the VM,
/// the agent's settings as `dynocap.*` (the kernel keeps dotted words away from init), and
/// after `--` the agent's own arguments. A `nat` guest (`nat_dns`) is told its address, its
/// gateway and its resolver (`dynocap.net=ADDR/PREFIX,GATEWAY,RESOLVER`).
///
/// `tsc_khz`: under TCG on microvm the kernel has nothing to calibrate the TSC against (no
/// HPET, no ACPI PM timer) and stalls; TCG's guest TSC is the host's, so the host's rate is
/// the right answer to give it.
pub fn kernel_cmdline(
    hostname: &str,
    agent_args: &[String],
    tsc_khz: Option<u64>,
    nat_dns: Option<Ipv4Addr>,
    cache_spots: Option<&str>,
) -> String {
    let mut line = kernel_flags(tsc_khz);
    line.push(' ');
    if let Some(dns) = nat_dns {
        line.push_str(&format!(
            "dynocap.net={NAT_GUEST_ADDR},{NAT_GATEWAY},{dns} "
        ));
    }
    if let Some(spots) = cache_spots {
        line.push_str(&format!("dynocap.cache={spots} "));
    }
    line.push_str(&format!(
        "dynocap.root=/dev/vda dynocap.port={PORT_NAME} dynocap.hostname={hostname} -- --vm-boot"
    ));
    for arg in agent_args {
        line.push(' ');
        line.push_str(arg);
    }
    line
}

/// The kernel's own options, without DynoCap's settings: what any guest of this backend boots
/// with (the benchmark's floor boots with exactly these).
pub fn kernel_flags(tsc_khz: Option<u64>) -> String {
    let mut line = String::from("console=ttyS0 quiet panic=-1 reboot=t random.trust_cpu=on");
    if let Some(khz) = tsc_khz {
        line.push_str(&format!(" tsc_early_khz={khz}"));
    }
    line
}

/// The host's TSC rate in kHz, measured once against CLOCK_MONOTONIC over 50 ms.
pub fn host_tsc_khz() -> u64 {
    static KHZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *KHZ.get_or_init(|| {
        let start = std::time::Instant::now();
        // SAFETY: rdtsc reads a counter; it has no preconditions on x86_64.
        let t0 = unsafe { std::arch::x86_64::_rdtsc() };
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: as above.
        let t1 = unsafe { std::arch::x86_64::_rdtsc() };
        let micros = u64::try_from(start.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        t1.saturating_sub(t0).saturating_mul(1000) / micros
    })
}

/// TCG's translated-code buffer, in MiB. QEMU 7.2's default for system emulation is 1 GiB,
/// which the guest's workload fills over time and which then stays resident: up to a GiB
/// more per sandbox. A boot to the agent's first exec translates about 48 MiB, so 64 MiB
/// holds it without a flush; past that QEMU flushes the buffer and translates again (time,
/// not memory). KVM has no such buffer.
const TCG_CODE_BUFFER_MIB: u32 = 64;

/// The machine QEMU emulates, before any kernel, disk or channel: the same for a sandbox and
/// for the benchmark's floor.
pub fn machine_args(machine: Machine, accel: Accel, cpus: u32, memory_mb: u64) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let machine = match (machine, accel) {
        // Under KVM the guest keeps time with kvmclock and needs no legacy PIC or PIT. The RTC
        // stays in every case: without it the guest's clock starts in 1970 and TLS fails.
        (Machine::Microvm, Accel::Kvm) => "microvm,pic=off,pit=off,rtc=on,isa-serial=on",
        // Under TCG the kernel calibrates the TSC against the PIT; without it boot stalls.
        (Machine::Microvm, Accel::Tcg) => "microvm,rtc=on,isa-serial=on",
        (Machine::Q35, _) => "q35",
    };
    push(
        &mut args,
        &[
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ],
    );
    push(&mut args, &["-M", machine]);
    match accel {
        Accel::Kvm => push(&mut args, &["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => {
            let tcg = format!("tcg,tb-size={TCG_CODE_BUFFER_MIB}");
            push(&mut args, &["-accel", &tcg, "-cpu", "max"]);
        }
    }
    let smp = cpus.to_string();
    let mem = format!("{memory_mb}M");
    push(&mut args, &["-smp", &smp, "-m", &mem]);
    args
}

/// QEMU's arguments (without the program name).
pub fn argv(config: &QemuConfig) -> Vec<OsString> {
    let mut args = machine_args(config.machine, config.accel, config.cpus, config.memory_mb);
    let bus = match config.machine {
        Machine::Microvm => "device",
        Machine::Q35 => "pci",
    };
    args.extend(confinement_args(config.seccomp, config.drop_to.as_ref()));
    args.push("-kernel".into());
    args.push(config.kernel.clone().into());
    args.push("-initrd".into());
    args.push(config.initrd.clone().into());
    args.push("-append".into());
    args.push(config.cmdline.clone().into());
    // The console: the guest's serial port, to a socket the host relays into a bounded log.
    let console = format!("socket,id=console,fd={CONSOLE_FD}");
    push(
        &mut args,
        &["-chardev", &console, "-serial", "chardev:console"],
    );
    // The root disk. The guest's discards are ignored: a task's layer has its room reserved
    // on the host for the sandbox's life (see the engine's `disk_room`), and a discard passed
    // down would punch it out of the file, for a later write to find the host full. A fork's
    // layer reserves nothing (see `layers`' module doc) and meets a full host as ENOSPC:
    // QEMU's default for a write error (`werror=enospc`) is to pause the guest, which its
    // agent and every command in it would wait on without a word. Reported instead, as an
    // I/O error on the guest's disk, its write or `fsync` fails and its ext4 stops taking
    // writes (mounted `errors=remount-ro`; the agent's disk health check names it). A read
    // error is the guest's too (`rerror=report`, the default, said here for the reader).
    args.push("-drive".into());
    args.push(opt_path(
        "if=none,id=root,format=qcow2,cache=writeback,discard=ignore,werror=report,\
         rerror=report,file=",
        &config.disk,
    ));
    let blk = format!("virtio-blk-{bus},drive=root");
    let serial = format!("virtio-serial-{bus}");
    let channel = format!("socket,id=agent,fd={CHANNEL_FD}");
    let qmp = format!("socket,id=qmp,fd={QMP_FD}");
    push(&mut args, &["-device", &blk]);
    if let Some(cache) = &config.cache_disk {
        let snapshot = if cache.throwaway { ",snapshot=on" } else { "" };
        args.push("-drive".into());
        args.push(opt_path(
            &format!("if=none,id=cache,format=raw,cache=writeback,discard=ignore{snapshot},file="),
            &cache.image,
        ));
        let dev = format!("virtio-blk-{bus},drive=cache,serial={CACHE_SERIAL}");
        push(&mut args, &["-device", &dev]);
    }
    // The agent channel.
    push(&mut args, &["-device", &serial, "-chardev", &channel]);
    let port = format!("virtserialport,chardev=agent,name={PORT_NAME}");
    push(&mut args, &["-device", &port]);
    // Control.
    push(
        &mut args,
        &["-chardev", &qmp, "-mon", "chardev=qmp,mode=control"],
    );
    // Network `none` (and `filtered`, which goes over the agent channel): -nodefaults
    // leaves the VM without a NIC.
    if config.nat.is_some() {
        // No host forwards, no SMB or TFTP: only the guest's own outgoing connections. IPv4
        // only: slirp's IPv6 would give the guest a second way out to keep an eye on.
        let netdev = format!("user,id=net,ipv6=off,net={NAT_NETWORK},host={NAT_GATEWAY}");
        let nic = format!("virtio-net-{bus},netdev=net");
        push(&mut args, &["-netdev", &netdev, "-device", &nic]);
    }
    args
}

fn push(args: &mut Vec<OsString>, items: &[&str]) {
    args.extend(items.iter().map(OsString::from));
}

/// `prefix` followed by `path`, with commas doubled as QEMU's option syntax wants.
fn opt_path(prefix: &str, path: &Path) -> OsString {
    let mut out = OsString::from(prefix);
    out.push(path.as_os_str().to_string_lossy().replace(',', ",,"));
    out
}

/// Starts QEMU with `channel` as fd 3, `qmp` as fd 4 and `console` as fd 5, stdin from
/// /dev/null, stdout inherited, stderr to `stderr_log`; a `nat` guest's QEMU in a new network
/// namespace (its pid names it: `/proc/PID/ns/net`).
///
/// QEMU must not outlive the supervisor. It gets SIGKILL when the thread that started it dies
/// (PR_SET_PDEATHSIG; the supervisor starts it from its main thread). The kernel clears that
/// setting when QEMU's credentials change, as they do under `-runas`, so a dropped QEMU has a
/// second way down, which every QEMU has anyway: the supervisor's death closes the agent
/// channel, the agent (PID 1) exits on end-of-file, the guest kernel panics, and `-no-reboot`
/// turns the panic's reboot into QEMU's exit. A guest too wedged for that is killed by
/// whoever repairs the lost sandbox ([`crate::cleanup_leftovers`], by the pid file).
pub fn spawn(
    config: &QemuConfig,
    channel: &OwnedFd,
    qmp: &OwnedFd,
    console: &OwnedFd,
    stderr_log: &Path,
) -> Result<Child> {
    spawn_with(config, channel, qmp, console, false, stderr_log)
}

/// [`spawn`], and with `paused` a QEMU whose guest does not start (`-S`): one that loads a
/// saved guest before it runs (see [`crate::migrate`]).
pub fn spawn_with(
    config: &QemuConfig,
    channel: &OwnedFd,
    qmp: &OwnedFd,
    console: &OwnedFd,
    paused: bool,
    stderr_log: &Path,
) -> Result<Child> {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(stderr_log)
        .map_err(|err| VmError::io("opening", stderr_log, err))?;
    // Above anything dup2 writes to, so neither source is overwritten before it is copied.
    let high = |fd: &OwnedFd| {
        let raw = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(64))
            .map_err(|err| VmError::Unavailable(format!("duplicating a socket for QEMU: {err}")))?;
        // SAFETY: F_DUPFD_CLOEXEC just returned this new descriptor; nothing else owns it.
        Ok::<_, VmError>(unsafe { OwnedFd::from_raw_fd(raw) })
    };
    let (channel_src, qmp_src, console_src) = (high(channel)?, high(qmp)?, high(console)?);
    let (channel_raw, qmp_raw, console_raw) = (
        channel_src.as_raw_fd(),
        qmp_src.as_raw_fd(),
        console_src.as_raw_fd(),
    );
    let supervisor = std::process::id();
    let own_netns = config.nat.is_some();
    let mut command = Command::new(QEMU);
    command.args(argv(config));
    if paused {
        command.arg("-S");
    }
    command.stdin(Stdio::null()).stderr(Stdio::from(stderr));
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe system calls (prctl, getppid, unshare, dup2, _exit); it allocates
    // nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The supervisor may have died before the prctl: then nobody would kill us.
            if u32::try_from(libc::getppid()).ok() != Some(supervisor) {
                libc::_exit(1);
            }
            // Before `-runas` drops the privilege this takes. QEMU has no CAP_NET_ADMIN in
            // the namespace once it runs as the sandbox's uid: it cannot change its routes.
            if own_netns && libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // dup2 clears close-on-exec on the copies, so QEMU inherits exactly these three.
            if libc::dup2(channel_raw, CHANNEL_FD) < 0
                || libc::dup2(qmp_raw, QMP_FD) < 0
                || libc::dup2(console_raw, CONSOLE_FD) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|err| {
        if err.kind() == std::io::ErrorKind::NotFound {
            VmError::Unavailable(format!(
                "{QEMU} is not installed; install it with `apt-get install qemu-system-x86`"
            ))
        } else {
            VmError::Unavailable(format!("starting {QEMU}: {err}"))
        }
    })?;
    drop((channel_src, qmp_src, console_src));
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(machine: Machine, accel: Accel) -> QemuConfig {
        QemuConfig {
            machine,
            accel,
            cpus: 2,
            memory_mb: 512,
            kernel: "/img/boot/vmlinuz-6.1".into(),
            initrd: "/cache/initramfs-ab.cpio".into(),
            cmdline: kernel_cmdline(
                "box",
                &["--home".into(), "/home/sandbox".into()],
                Some(2_300_000),
                None,
                None,
            ),
            disk: "/state/vm,1/disk.qcow2".into(),
            seccomp: true,
            drop_to: None,
            nat: None,
            cache_disk: None,
        }
    }

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// The value following `flag`, for each time `flag` appears.
    fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn microvm_under_tcg() {
        let args = strings(&argv(&config(Machine::Microvm, Accel::Tcg)));
        for flag in ["-nodefaults", "-no-user-config", "-no-reboot"] {
            assert!(args.iter().any(|a| a == flag), "{flag} missing");
        }
        assert_eq!(values(&args, "-M"), ["microvm,rtc=on,isa-serial=on"]);
        assert_eq!(values(&args, "-accel"), ["tcg,tb-size=64"]);
        assert_eq!(values(&args, "-cpu"), ["max"]);
        assert_eq!(values(&args, "-smp"), ["2"]);
        assert_eq!(values(&args, "-m"), ["512M"]);
        assert_eq!(values(&args, "-kernel"), ["/img/boot/vmlinuz-6.1"]);
        assert_eq!(values(&args, "-initrd"), ["/cache/initramfs-ab.cpio"]);
        let devices = values(&args, "-device");
        assert_eq!(
            devices,
            [
                "virtio-blk-device,drive=root",
                "virtio-serial-device",
                "virtserialport,chardev=agent,name=dynocap"
            ]
        );
        // No NIC of any kind: network `none`.
        assert!(!args
            .iter()
            .any(|a| a.contains("netdev") || a.contains("-net")));
        // The comma in the disk's path is escaped.
        assert!(values(&args, "-drive")[0].ends_with("file=/state/vm,,1/disk.qcow2"));
        assert_eq!(
            values(&args, "-chardev"),
            [
                "socket,id=console,fd=5",
                "socket,id=agent,fd=3",
                "socket,id=qmp,fd=4"
            ]
        );
        assert_eq!(
            values(&args, "-sandbox"),
            ["on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]
        );
        assert!(values(&args, "-runas").is_empty());
        let append = values(&args, "-append")[0];
        assert!(append.starts_with("console=ttyS0 "));
        assert!(append.contains(" tsc_early_khz=2300000 "));
        assert!(
            append.contains(" dynocap.root=/dev/vda dynocap.port=dynocap dynocap.hostname=box ")
        );
        assert!(append.ends_with(" -- --vm-boot --home /home/sandbox"));
    }

    #[test]
    fn q35_under_kvm_uses_pci_devices() {
        let mut config = config(Machine::Q35, Accel::Kvm);
        config.seccomp = false;
        let args = strings(&argv(&config));
        assert_eq!(values(&args, "-M"), ["q35"]);
        assert_eq!(values(&args, "-accel"), ["kvm"]);
        assert_eq!(values(&args, "-cpu"), ["host"]);
        assert!(values(&args, "-device").contains(&"virtio-blk-pci,drive=root"));
        assert!(values(&args, "-device").contains(&"virtio-serial-pci"));
        assert!(values(&args, "-sandbox").is_empty());
    }

    #[test]
    fn a_root_started_qemu_drops_to_its_ids_in_an_empty_chroot() {
        let mut config = config(Machine::Microvm, Accel::Tcg);
        config.drop_to = Some(Confinement {
            uid: 1_065_536,
            gid: 1_065_536,
            chroot: "/state/vm/empty".into(),
        });
        let args = strings(&argv(&config));
        assert_eq!(values(&args, "-runas"), ["1065536:1065536"]);
        assert_eq!(values(&args, "-chroot"), ["/state/vm/empty"]);
        assert_eq!(
            values(&args, "-sandbox"),
            ["on,obsolete=deny,spawn=deny,resourcecontrol=deny"]
        );
    }

    #[test]
    fn a_nat_guest_gets_a_user_network_nic_and_is_told_its_addresses() {
        let mut config = config(Machine::Microvm, Accel::Tcg);
        let dns = Ipv4Addr::new(169, 254, 1, 1);
        config.nat = Some(dns);
        config.cmdline = kernel_cmdline("box", &[], None, Some(dns), None);
        let args = strings(&argv(&config));
        assert_eq!(
            values(&args, "-netdev"),
            ["user,id=net,ipv6=off,net=10.0.2.0/24,host=10.0.2.2"]
        );
        assert!(values(&args, "-device").contains(&"virtio-net-device,netdev=net"));
        let append = values(&args, "-append")[0];
        assert!(
            append.contains(" dynocap.net=10.0.2.15/24,10.0.2.2,169.254.1.1 "),
            "{append}"
        );
        // Settings stay before `--`, where the agent reads them.
        assert!(
            append.find("dynocap.net=") < append.find(" -- "),
            "{append}"
        );
    }

    #[test]
    fn the_host_tsc_rate_is_plausible() {
        // Between 100 MHz and 10 GHz: the measurement is wrong by orders of magnitude or not.
        let khz = host_tsc_khz();
        assert!((100_000..10_000_000).contains(&khz), "{khz} kHz");
    }
}
