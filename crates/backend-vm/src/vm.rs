//! [`Vm`]: one running guest as the supervisor holds it — QEMU's process and pidfd, the host
//! end of the agent channel, the QMP connection — and its files in `<state_dir>/vm/`.

use std::fs;
use std::io::Read as _;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::Value;

use crate::accel::AccelChoice;
use crate::error::{Result, VmError};
use crate::qemu::{self, Accel, Machine, QemuConfig};
use crate::qmp::Qmp;
use crate::{accel, console, disk, initramfs, kernel, vmlinux};

/// Everything the backend needs to boot one guest.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// The guest's hostname: letters, digits, `-`, `_` and `.` only (it goes on the kernel
    /// command line).
    pub hostname: String,
    /// The image's root directory: the disk's content, and its kernel and modules.
    pub rootfs: PathBuf,
    /// Where the kernel to boot and its modules are (`boot/vmlinuz-<v>`, `lib/modules/<v>`)
    /// when the image carries none (a container image): another image's root. `None`: the
    /// image's own.
    pub kernel_root: Option<PathBuf>,
    /// The image's content id, for a built image (immutable once built): the key of its base
    /// disk in the cache, found without walking the rootfs. `None` keys it by a walk.
    pub image_id: Option<String>,
    /// The sandbox's state directory; the VM's files go in its `vm/`.
    pub state_dir: PathBuf,
    /// The backend's content-addressed cache (initramfs, base disks, KVM probes).
    pub cache_dir: PathBuf,
    /// The static `dynocap-agent`.
    pub agent_binary: PathBuf,
    /// The agent's arguments after `--channel-path` (no whitespace in any).
    pub agent_args: Vec<String>,
    pub cpus: u32,
    pub memory_mb: u64,
    /// The disk's size, which its filesystem is made to fill.
    pub disk_bytes: u64,
    /// Boot over the disk layer a stopped guest kept, instead of a fresh one.
    pub reuse_disk: bool,
    /// KVM or TCG, or as the KVM probe says ([`accel::choose`]).
    pub accel: AccelChoice,
    /// How long the guest may take to reach the agent.
    pub boot_timeout: Duration,
    /// For a supervisor running as root: the host uid and gid QEMU runs as once its files are
    /// open (the sandbox's own id range, as the jail's guest root has), chrooted into an
    /// empty directory. `None` keeps QEMU as the invoking user.
    pub run_as: Option<(u32, u32)>,
    /// `Some(resolver)`: network `nat`. The guest gets a NIC on QEMU's user networking and
    /// QEMU a network namespace of its own (root only), `/proc/<`[`Vm::pid`]`>/ns/net`, which
    /// the caller connects to the world once `boot` returns (see [`QemuConfig::nat`]).
    pub nat_dns: Option<std::net::Ipv4Addr>,
    /// A task's package cache disk (see [`qemu::CacheDisk`]).
    pub cache_disk: Option<qemu::CacheDisk>,
}

/// The VM's files inside the sandbox's state directory.
#[derive(Debug, Clone)]
pub struct VmPaths {
    pub dir: PathBuf,
    pub disk: PathBuf,
    pub console_log: PathBuf,
    pub qemu_log: PathBuf,
    pub pid_file: PathBuf,
    /// The empty directory a root-started QEMU chroots into.
    pub empty: PathBuf,
    /// Where a `nat` guest's network namespace is bound while pasta joins it.
    pub netns: PathBuf,
}

impl VmPaths {
    pub fn at(state_dir: &Path) -> Self {
        let dir = state_dir.join("vm");
        Self {
            disk: dir.join("disk.qcow2"),
            console_log: dir.join("console.log"),
            qemu_log: dir.join("qemu.log"),
            pid_file: dir.join("qemu.pid"),
            empty: dir.join("empty"),
            netns: dir.join("netns"),
            dir,
        }
    }
}

/// Prunes the cache ([`crate::cache_gc`]) on a thread of its own, off the boot's path: this
/// guest holds its files open, and its layer names its base.
fn prune_cache_aside(cache_dir: &Path, state_dir: &Path) {
    let Some(sandboxes_dir) = state_dir.parent().map(Path::to_path_buf) else {
        return;
    };
    let cache_dir = cache_dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("vm-cache-prune".into())
        .spawn(move || {
            // Every sandbox of the home: its state directory holds its layer, if it has one.
            let layers: Vec<PathBuf> = fs::read_dir(&sandboxes_dir)
                .into_iter()
                .flatten()
                .flatten()
                .flat_map(|entry| crate::layers::layer_files(&entry.path()))
                .collect();
            for path in crate::cache_gc::prune(&cache_dir, &layers, SystemTime::now()) {
                tracing::info!("removed {} from the vm cache: unused", path.display());
            }
        });
    if let Err(err) = spawned {
        tracing::warn!("not pruning the vm cache: {err}");
    }
}

/// A running guest.
pub struct Vm {
    child: Child,
    pidfd: OwnedFd,
    channel: Option<OwnedFd>,
    /// A second descriptor of our end of the channel, kept after the channel is handed out:
    /// shutting it down is how a stop asks the agent to sync the disk and end the VM.
    channel_ctl: OwnedFd,
    /// Copies the console into its log; ends when QEMU exits.
    console_relay: Option<std::thread::JoinHandle<()>>,
    qmp: Qmp,
    paths: VmPaths,
    accel: Accel,
}

impl Vm {
    /// Builds what is missing (initramfs, base disk, the sandbox's layer), starts QEMU and
    /// returns once the agent has spoken on the channel. On failure nothing keeps running and
    /// the error carries the last lines of the console and of QEMU's own log.
    pub fn boot(spec: &VmSpec) -> Result<Vm> {
        Self::boot_with(spec, false)
    }

    /// [`Vm::boot`], or with `paused` (over the kept disk) a QEMU whose guest does not start,
    /// returned at once: one that loads a saved guest (see [`crate::migrate`]).
    pub(crate) fn boot_with(spec: &VmSpec, paused: bool) -> Result<Vm> {
        validate(spec)?;
        if paused && !spec.reuse_disk {
            return Err(VmError::InvalidSpec(
                "a saved guest resumes over the disk saved with it, not a fresh one".into(),
            ));
        }
        let kernel = kernel::find(spec.kernel_root.as_deref().unwrap_or(&spec.rootfs))?;
        let accel = accel::choose(spec.accel, &spec.cache_dir, &kernel.image)?;
        let machine = machine(&spec.cache_dir)?;
        let modules = kernel::needed_modules(&kernel, machine)?;
        let initrd = initramfs::get(&spec.cache_dir, &spec.agent_binary, &modules)?;
        let paths = VmPaths::at(&spec.state_dir);
        fs::create_dir_all(&paths.dir).map_err(|err| VmError::io("creating", &paths.dir, err))?;
        let fresh_disk = !spec.reuse_disk;
        if spec.reuse_disk {
            if !paths.disk.is_file() {
                return Err(VmError::InvalidSpec(format!(
                    "no kept disk at {} to boot over",
                    paths.disk.display()
                )));
            }
            crate::layers::sweep(&paths.dir);
        } else {
            let base = disk::base_image(
                &spec.cache_dir,
                &spec.rootfs,
                spec.image_id.as_deref(),
                spec.disk_bytes,
            )?;
            let _ = fs::remove_file(&paths.disk);
            // A fresh disk is a task's own, reserved as any (see `layers`' `UNRESERVED`).
            let _ = fs::remove_file(paths.dir.join(crate::layers::UNRESERVED));
            disk::create_layer(&spec.cache_dir, &base, &paths.disk, spec.disk_bytes)?;
        }
        let tsc_khz = (machine == Machine::Microvm && accel == Accel::Tcg).then(qemu::host_tsc_khz);
        let config = QemuConfig {
            machine,
            accel,
            cpus: spec.cpus,
            memory_mb: spec.memory_mb,
            kernel: boot_kernel(&spec.cache_dir, &kernel, machine)?,
            initrd,
            cmdline: qemu::kernel_cmdline(
                &spec.hostname,
                &spec.agent_args,
                tsc_khz,
                spec.nat_dns,
                spec.cache_disk.as_ref().map(|c| c.spots.as_str()),
            ),
            disk: paths.disk.clone(),
            seccomp: true,
            drop_to: match spec.run_as {
                Some((uid, gid)) => Some(qemu::Confinement::in_empty_dir(&paths.empty, uid, gid)?),
                None => None,
            },
            nat: spec.nat_dns,
            cache_disk: spec.cache_disk.clone(),
        };
        let booted = start(&config, &paths, spec.boot_timeout, paused);
        if booted.is_err() && fresh_disk {
            let _ = fs::remove_file(&paths.disk);
        }
        if booted.is_ok() {
            prune_cache_aside(&spec.cache_dir, &spec.state_dir);
        }
        booted
    }

    /// The QMP connection, for what [`crate::migrate`] asks of QEMU.
    pub(crate) fn qmp(&mut self) -> &mut Qmp {
        &mut self.qmp
    }

    /// The host end of the agent channel (taken once).
    pub fn take_channel(&mut self) -> Option<OwnedFd> {
        self.channel.take()
    }

    /// Readable once QEMU has exited.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    pub fn accel(&self) -> Accel {
        self.accel
    }

    pub fn paths(&self) -> &VmPaths {
        &self.paths
    }

    /// Freezes the guest's writable disk layer, the guest going on on a new one above it: see
    /// [`crate::layers::snapshot_layer`].
    pub fn snapshot_layer(&mut self) -> Result<crate::layers::FrozenLayer> {
        crate::layers::snapshot_layer(&mut self.qmp, &self.paths)
    }

    /// [`crate::layers::release_dropped`], once the guest runs again after a freeze made
    /// while it was paused.
    pub fn release_dropped(&mut self, dropped: crate::layers::DroppedFd) -> Result<()> {
        crate::layers::release_dropped(&mut self.qmp, dropped)
    }

    /// A `nat` guest's network namespace (QEMU's), bound to a file for as long as the
    /// returned guard lives: what the caller hands pasta (see [`crate::netns`]).
    pub fn netns_file(&self) -> Result<crate::netns::NetnsFile> {
        crate::netns::NetnsFile::bind(self.pid(), &self.paths.netns)
    }

    /// Waits for the console relay to copy what QEMU wrote (QEMU has exited).
    pub(crate) fn join_console(&mut self) {
        if let Some(relay) = self.console_relay.take() {
            let _ = relay.join();
        }
    }

    /// Kills QEMU at once (the guest with it) and reaps it; the files stay for
    /// [`Vm::destroy`].
    pub fn kill(&mut self) -> Result<()> {
        match self.child.kill() {
            Ok(()) => {}
            // Already exited: nothing left to kill.
            Err(err) if err.kind() == std::io::ErrorKind::InvalidInput => {}
            Err(err) => return Err(VmError::Unavailable(format!("killing QEMU: {err}"))),
        }
        self.child
            .wait()
            .map(drop)
            .map_err(|err| VmError::Unavailable(format!("reaping QEMU: {err}")))
    }

    /// Stops the guest at once and removes its files, its disk layer included: nothing in
    /// the guest is worth a clean shutdown.
    pub fn destroy(mut self) -> Result<()> {
        self.kill()?;
        remove_files(&self.paths, false)
    }

    /// Stops the guest with what it wrote on its disk, and keeps the disk layer for a later
    /// boot over it.
    pub fn stop_keeping_disk(mut self) -> Result<()> {
        self.stop_cleanly();
        remove_files(&self.paths, true)
    }

    /// Closes the channel: the agent syncs the guest's filesystems and reboots, which
    /// `-no-reboot` makes QEMU's exit. A guest that does not go in time gets QMP `quit`
    /// (QEMU flushes its own caches to the layer), then SIGKILL.
    fn stop_cleanly(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&self.channel_ctl),
            nix::sys::socket::Shutdown::Both,
        );
        if !wait_readable(self.pidfd.as_fd(), Duration::from_secs(60)) {
            let _ = self.qmp.execute("quit", Duration::from_secs(5));
            if !wait_readable(self.pidfd.as_fd(), Duration::from_secs(10)) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }

    /// What QEMU was doing when the agent had not answered after `waited`: its run state, the
    /// vCPUs' instruction pointers and halt flags, and how much CPU QEMU itself used. A guest
    /// stuck in a loop, one halted waiting for an interrupt, and a QEMU that never ran the
    /// guest read differently. Each question has a short deadline; what cannot be learnt is
    /// left out.
    fn state_at_timeout(&mut self, waited: Duration) -> String {
        const ASK: Duration = Duration::from_secs(2);
        let mut parts = Vec::new();
        if let Ok(status) = self.qmp.execute("query-status", ASK) {
            if let Some(status) = status.get("status").and_then(Value::as_str) {
                parts.push(format!("QEMU's run state: {}", sanitize(status)));
            }
        }
        let registers = self.qmp.execute_with(
            "human-monitor-command",
            Some(serde_json::json!({ "command-line": "info registers -a" })),
            ASK,
        );
        if let Some(cpus) = registers
            .ok()
            .as_ref()
            .and_then(Value::as_str)
            .map(vcpu_summary)
        {
            if !cpus.is_empty() {
                parts.push(format!("vCPUs: {cpus}"));
            }
        }
        if let Some(seconds) = cpu_seconds(self.child.id()) {
            parts.push(format!(
                "QEMU used {seconds:.1} s of CPU in the {} s it waited",
                waited.as_secs()
            ));
        }
        if parts.is_empty() {
            "(QEMU's state at the timeout could not be read)".to_owned()
        } else {
            format!("--- at the timeout: {} ---", parts.join("; "))
        }
    }
}

/// `RIP=… HLT=…` of each vCPU in QEMU's `info registers` text (guest-controlled values, so
/// only hex digits and the flag are kept).
fn vcpu_summary(text: &str) -> String {
    let field = |line: &str, key: &str| -> Option<String> {
        let value = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix(key))?;
        Some(
            value
                .chars()
                .filter(char::is_ascii_hexdigit)
                .take(16)
                .collect(),
        )
    };
    let mut cpus = Vec::new();
    let mut rip = None;
    for line in text.lines() {
        if let Some(value) = field(line, "RIP=") {
            rip = Some(value);
        }
        if let Some(halted) = field(line, "HLT=") {
            cpus.push(format!(
                "RIP={} HLT={halted}",
                rip.take().unwrap_or_else(|| "?".to_owned())
            ));
        }
    }
    cpus.iter()
        .enumerate()
        .map(|(i, cpu)| format!("{i}: {cpu}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The fields of `/proc/<pid>/stat` after the command name, from field 3 (the state) on.
/// The name is in parentheses and may hold spaces or parentheses itself: fields are counted
/// after its last `)`.
fn stat_after_name(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    Some(after_name.split_whitespace().map(str::to_owned).collect())
}

/// User plus system CPU time of process `pid`, in seconds, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = stat_after_name(pid)?;
    let mut fields = stat.iter();
    // Fields 14 and 15 of stat(5) (utime, stime) are the 12th and 13th after the name.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = u64::try_from(ticks).ok().filter(|&t| t > 0)?;
    Some((utime + stime) as f64 / ticks as f64)
}

fn sanitize(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(40)
        .collect()
}

impl Drop for Vm {
    /// A `Vm` dropped without `destroy` (an error path) must not leave QEMU running.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The file QEMU boots for `kernel` on `machine`: on microvm the kernel's ELF through its PVH
/// entry where it has one ([`vmlinux`]), else (and on q35, where this path is not exercised)
/// the image's bzImage. The benchmark's floor boots the same file.
pub fn boot_kernel(cache_dir: &Path, kernel: &kernel::Kernel, machine: Machine) -> Result<PathBuf> {
    match machine {
        Machine::Microvm => vmlinux::boot_file(cache_dir, &kernel.image),
        Machine::Q35 => Ok(kernel.image.clone()),
    }
}

fn validate(spec: &VmSpec) -> Result<()> {
    let host_ok = !spec.hostname.is_empty()
        && spec.hostname.len() <= 63
        && spec
            .hostname
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if !host_ok {
        return Err(VmError::InvalidSpec(format!(
            "hostname {:?} must be 1-63 letters, digits, '-', '_' or '.'",
            spec.hostname
        )));
    }
    if let Some(arg) = spec
        .agent_args
        .iter()
        .find(|a| a.is_empty() || a.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(VmError::InvalidSpec(format!(
            "agent argument {arg:?} cannot go on a kernel command line"
        )));
    }
    if spec.cpus == 0 || spec.memory_mb < 64 || spec.disk_bytes == 0 {
        return Err(VmError::InvalidSpec(format!(
            "{} vCPUs, {} MiB and a {}-byte disk cannot boot a guest",
            spec.cpus, spec.memory_mb, spec.disk_bytes
        )));
    }
    Ok(())
}

/// `microvm` where this QEMU has it, else `q35`.
/// The machine type this QEMU offers: microvm where it has it, else q35. Asking QEMU
/// (`-M help`) is a slow process start, so the answer is recorded in the cache per
/// QEMU binary, as the KVM probe's is; every supervisor boots one guest and would otherwise
/// ask again.
fn machine(cache_dir: &Path) -> Result<Machine> {
    let mut key = crate::cache::Key::new("dynocap-qemu-machine-1");
    accel::add_file(&mut key, &accel::qemu_path()?)?;
    let recorded =
        crate::cache::get_or_build(cache_dir, &format!("machine-{}", key.hex()), |tmp| {
            let machine = ask_machine()?;
            crate::cache::write_new(tmp, machine_name(machine).as_bytes())
        })?;
    let text =
        fs::read_to_string(&recorded).map_err(|err| VmError::io("reading", &recorded, err))?;
    match text.as_str() {
        "microvm" => Ok(Machine::Microvm),
        "q35" => Ok(Machine::Q35),
        _ => {
            // Not written by us: ask again rather than trust it.
            let _ = fs::remove_file(&recorded);
            ask_machine()
        }
    }
}

fn machine_name(machine: Machine) -> &'static str {
    match machine {
        Machine::Microvm => "microvm",
        Machine::Q35 => "q35",
    }
}

/// Asks QEMU which machine types it has.
fn ask_machine() -> Result<Machine> {
    let output = std::process::Command::new(qemu::QEMU)
        .args(["-M", "help"])
        .output()
        .map_err(|err| {
            VmError::Unavailable(format!(
                "cannot run {} ({err}); install it with `apt-get install qemu-system-x86`",
                qemu::QEMU
            ))
        })?;
    if !output.status.success() {
        return Err(VmError::Unavailable(format!(
            "`{} -M help` failed ({}): {}",
            qemu::QEMU,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(
        if text
            .lines()
            .any(|l| l.split_whitespace().next() == Some("microvm"))
        {
            Machine::Microvm
        } else {
            Machine::Q35
        },
    )
}

fn start(config: &QemuConfig, paths: &VmPaths, timeout: Duration, paused: bool) -> Result<Vm> {
    let pair = |what: &str| {
        UnixStream::pair()
            .map_err(|err| VmError::Unavailable(format!("creating the {what} socketpair: {err}")))
    };
    let (channel, channel_qemu) = pair("agent channel")?;
    let (qmp, qmp_qemu) = pair("QMP")?;
    let (console, console_qemu) = pair("console")?;
    let console_relay = console::relay(console, &paths.console_log)?;
    // QEMU's ends are closed here once it has its copies: its exit is then the relay's end.
    let mut child = qemu::spawn_with(
        config,
        &OwnedFd::from(channel_qemu),
        &OwnedFd::from(qmp_qemu),
        &OwnedFd::from(console_qemu),
        paused,
        &paths.qemu_log,
    )?;
    let pid = child.id();
    let pidfd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(err) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err);
        }
    };
    let _ = fs::write(&paths.pid_file, pid.to_string());
    let channel = OwnedFd::from(channel);
    let channel_ctl = match channel.try_clone() {
        Ok(fd) => fd,
        Err(err) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(VmError::Unavailable(format!(
                "duplicating the channel: {err}"
            )));
        }
    };
    let vm = Vm {
        child,
        pidfd,
        channel: Some(channel),
        channel_ctl,
        console_relay: Some(console_relay),
        qmp: Qmp::new(qmp)?,
        paths: paths.clone(),
        accel: config.accel,
    };
    if paused {
        // Its guest is loaded, then started, by the caller.
        return Ok(vm);
    }
    wait_for_agent(vm, timeout)
}

/// Waits until the agent's first bytes (its hello) are on the channel, without reading them:
/// the supervisor reads the hello itself.
fn wait_for_agent(mut vm: Vm, timeout: Duration) -> Result<Vm> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let state = vm.state_at_timeout(timeout);
            let _ = vm.kill();
            vm.join_console();
            let tail = format!("{state}\n{}", tail(&vm.paths));
            drop(vm);
            return Err(VmError::Boot {
                reason: format!("the agent did not answer within {}s", timeout.as_secs()),
                tail,
            });
        }
        let channel = vm
            .channel
            .as_ref()
            .expect("the channel is only taken after boot");
        let mut fds = [
            PollFd::new(channel.as_fd(), PollFlags::POLLIN),
            PollFd::new(vm.pidfd.as_fd(), PollFlags::POLLIN),
        ];
        let wait =
            PollTimeout::try_from(left.min(Duration::from_secs(1))).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, wait) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(err) => {
                return Err(VmError::Unavailable(format!(
                    "waiting for the guest: {err}"
                )));
            }
        }
        let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
        let qemu_exited = ready(&fds[1]);
        // Readable may also mean end-of-file: QEMU closing its end as it exits.
        let agent_spoke = ready(&fds[0]) && has_data(channel);
        if agent_spoke {
            return Ok(vm);
        }
        if qemu_exited || ready(&fds[0]) {
            // Give an exiting QEMU a moment to finish, so its status is in the error.
            if !qemu_exited {
                wait_readable(vm.pidfd.as_fd(), Duration::from_secs(10));
            }
            let _ = vm.child.kill();
            let status = vm.child.wait().map(|s| s.to_string()).unwrap_or_default();
            vm.join_console();
            let tail = tail(&vm.paths);
            return Err(VmError::Boot {
                reason: format!("QEMU exited ({status}) before the agent answered"),
                tail,
            });
        }
    }
}

/// Whether at least one byte waits on `socket` (a peek: the bytes stay for the reader).
fn has_data(socket: &OwnedFd) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut byte = [0_u8; 1];
    matches!(
        recv(
            std::os::fd::AsRawFd::as_raw_fd(socket),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
        ),
        Ok(n) if n > 0
    )
}

fn pidfd_open(pid: u32) -> Result<OwnedFd> {
    let raw = libc::pid_t::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| VmError::Unavailable(format!("pid {pid} is not a process id")))?;
    rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).map_err(|err| {
        VmError::Unavailable(format!(
            "pidfd_open({pid}): {} (Linux 5.3 or later is needed)",
            std::io::Error::from(err)
        ))
    })
}

fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
}

/// The last lines of the guest console and of QEMU's stderr, for an error message. Guest
/// output is hostile data: control characters are replaced.
pub fn tail(paths: &VmPaths) -> String {
    let mut out = String::new();
    for (label, path, lines) in [
        ("guest console", &paths.console_log, 25),
        ("qemu", &paths.qemu_log, 10),
    ] {
        let text = last_lines(path, lines);
        if !text.is_empty() {
            out.push_str(&format!(
                "--- last lines of the {label} ({}) ---\n",
                path.display()
            ));
            out.push_str(&text);
        }
    }
    if out.is_empty() {
        out.push_str("(the guest console and QEMU's log are empty)");
    }
    out
}

fn last_lines(path: &Path, lines: usize) -> String {
    const WINDOW: u64 = 64 * 1024;
    let Ok(mut file) = fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = std::io::Seek::seek(
        &mut file,
        std::io::SeekFrom::Start(len.saturating_sub(WINDOW)),
    );
    let mut bytes = Vec::new();
    let _ = file.take(WINDOW).read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| {
            let clean: String = l
                .chars()
                .map(|c| if c.is_control() && c != '\t' { '?' } else { c })
                .collect();
            clean + "\n"
        })
        .collect()
}

fn remove_files(paths: &VmPaths, keep_disk: bool) -> Result<()> {
    // A supervisor killed while pasta was joining the namespace left it bound.
    crate::netns::unbind(&paths.netns);
    if !keep_disk {
        return match fs::remove_dir_all(&paths.dir) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                Err(VmError::io("removing", &paths.dir, err))
            }
            _ => Ok(()),
        };
    }
    let _ = fs::remove_file(&paths.pid_file);
    Ok(())
}

/// How long a leftover QEMU may take to die after SIGKILL. Its exit releases the disk
/// layer's lock, which a guest booted over the kept layer next needs.
const LEFTOVER_EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// Stops a QEMU that a dead supervisor left (normally PR_SET_PDEATHSIG or the guest's own
/// exit has ended it already, but a QEMU that dropped privileges has no parent-death signal
/// and a wedged guest does not exit) and removes the VM's files, its disk layer unless
/// `keep_disk`. Idempotent.
pub fn cleanup_leftovers(state_dir: &Path, keep_disk: bool) -> Result<()> {
    let paths = VmPaths::at(state_dir);
    stop_leftover_qemu(&paths)?;
    remove_files(&paths, keep_disk)
}

/// Kills the QEMU named by the pid file, if it is still this sandbox's, and waits until it is
/// gone. The pidfd is taken before the check, so a pid reused meanwhile is never signalled.
fn stop_leftover_qemu(paths: &VmPaths) -> Result<()> {
    let Some(pid) = fs::read_to_string(&paths.pid_file)
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
    else {
        return Ok(());
    };
    let Ok(pidfd) = pidfd_open(pid) else {
        // Gone already.
        return Ok(());
    };
    // Only a QEMU of this sandbox: its command line names this sandbox's disk.
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let disk = paths.disk.as_os_str().as_encoded_bytes();
    if !cmdline.windows(disk.len()).any(|w| w == disk) {
        // A process that is exiting gives back its memory, and its command line reads empty
        // or cut short: a QEMU already killed (the dead supervisor's session is swept first)
        // may still be tearing down its threads and guest memory, holding the disk's lock.
        // Waiting on the pidfd signals nothing, so it is safe whoever the pid names now.
        if is_qemu(pid) && is_exiting(pid) {
            wait_for_exit(pid, &pidfd, paths)?;
        }
        return Ok(());
    }
    match rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL) {
        // ESRCH: it exited between the check and the signal.
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(err) => {
            return Err(VmError::io(
                "killing the leftover QEMU of",
                &paths.dir,
                err.into(),
            ))
        }
    }
    wait_for_exit(pid, &pidfd, paths)
}

/// `PF_EXITING` of `<linux/sched.h>`: the process has begun to exit.
const PF_EXITING: u64 = 0x4;

/// Whether process `pid` has begun to exit (or is gone).
fn is_exiting(pid: u32) -> bool {
    let Some(stat) = stat_after_name(pid) else {
        return true;
    };
    // Field 9 of stat(5): state, ppid, pgrp, session, tty, tpgid, then the flags.
    stat.get(6)
        .and_then(|flags| flags.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING != 0)
}

/// Whether process `pid` runs a QEMU system emulator, by its name (readable while it exits).
fn is_qemu(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.starts_with("qemu-system"))
}

/// Waits (at most [`LEFTOVER_EXIT_TIMEOUT`]) for the process of `pidfd` to exit.
fn wait_for_exit(pid: u32, pidfd: &OwnedFd, paths: &VmPaths) -> Result<()> {
    if wait_readable(pidfd.as_fd(), LEFTOVER_EXIT_TIMEOUT) {
        return Ok(());
    }
    Err(VmError::io(
        "waiting for the leftover QEMU of",
        &paths.dir,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "QEMU (pid {pid}) is still alive {} s after SIGKILL",
                LEFTOVER_EXIT_TIMEOUT.as_secs()
            ),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QEMU already killed but still exiting (a dead supervisor's session is swept before
    /// its sandbox is cleaned up) is waited for, although its command line, given back with
    /// its memory, no longer names the disk: the next guest needs the disk's lock it holds.
    /// The stand-in is python under QEMU's name, holding 1 GiB, whose release makes its exit
    /// take a while.
    #[test]
    fn a_killed_qemu_still_exiting_is_waited_for() {
        // The interpreter itself, not a launcher script (pyenv's shims dispatch on the name
        // they were started by, which here is QEMU's).
        let python = std::process::Command::new("python3")
            .args([
                "-c",
                "import os, sys; print(os.path.realpath(sys.executable))",
            ])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        let Some(python) = python else {
            assert!(std::env::var_os("CI").is_none(), "python3 is needed");
            eprintln!("SKIPPED a_killed_qemu_still_exiting_is_waited_for: no python3");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let qemu = dir.path().join("qemu-system-x86_64");
        // A link, not a copy: python finds its library through the link's target, and the
        // kernel names the process after the path it was started by.
        std::os::unix::fs::symlink(&python, &qemu).unwrap();
        let paths = VmPaths::at(&dir.path().join("state"));
        fs::create_dir_all(&paths.dir).unwrap();
        let mut child = std::process::Command::new(&qemu)
            .args([
                "-c",
                "import time\n\
                 held = bytearray(1 << 30)\n\
                 for i in range(0, len(held), 4096): held[i] = 1\n\
                 time.sleep(600)",
            ])
            .arg(&paths.disk)
            .spawn()
            .unwrap();
        let pid = child.id();
        let resident_kib = || {
            fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_default()
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kib| kib.trim().trim_end_matches(" kB").parse::<u64>().ok())
                .unwrap_or(0)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while resident_kib() < 900 << 10 {
            assert!(
                std::time::Instant::now() < deadline,
                "the stand-in never filled its memory: {:?}",
                child.try_wait()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        fs::write(&paths.pid_file, child.id().to_string()).unwrap();
        let state = || stat_after_name(pid).expect("our unreaped child's stat")[0].clone();

        // Killed as the session sweep kills it: from here its command line may read empty.
        child.kill().unwrap();
        stop_leftover_qemu(&paths).unwrap();
        // Our own child: exited means a zombie until we reap it.
        assert_eq!(state(), "Z", "returned while the QEMU was still exiting");
        child.wait().unwrap();
    }

    /// QEMU is asked once per binary: the answer is recorded, read back, and a record that is
    /// not one of ours is replaced by asking again.
    #[test]
    fn the_machine_type_is_asked_once_and_recorded() {
        if accel::qemu_path().is_err() {
            eprintln!("SKIPPED the_machine_type_is_asked_once_and_recorded: no QEMU here");
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        let asked = ask_machine().expect("QEMU answers -M help");
        assert_eq!(machine(cache.path()).unwrap(), asked);
        let records: Vec<_> = fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(
            fs::read_to_string(&records[0]).unwrap(),
            machine_name(asked)
        );
        assert_eq!(machine(cache.path()).unwrap(), asked, "read back");
        fs::write(&records[0], "garbage").unwrap();
        assert_eq!(machine(cache.path()).unwrap(), asked, "asked again");
        assert_eq!(
            machine(cache.path()).unwrap(),
            asked,
            "and recorded again: {}",
            fs::read_to_string(&records[0]).unwrap_or_default()
        );
    }

    fn spec() -> VmSpec {
        VmSpec {
            hostname: "box-1".into(),
            rootfs: "/nonexistent".into(),
            kernel_root: None,
            image_id: None,
            state_dir: "/nonexistent".into(),
            cache_dir: "/nonexistent".into(),
            agent_binary: "/nonexistent".into(),
            agent_args: vec!["--home".into(), "/home/sandbox".into()],
            cpus: 1,
            memory_mb: 256,
            disk_bytes: 1 << 30,
            reuse_disk: false,
            accel: AccelChoice::Tcg,
            boot_timeout: Duration::from_secs(1),
            run_as: None,
            nat_dns: None,
            cache_disk: None,
        }
    }

    #[test]
    fn specs_that_cannot_go_on_a_kernel_command_line_are_refused() {
        assert!(validate(&spec()).is_ok());
        for bad in ["", "a b", "a\nb", "x=1 init=/bin/sh", &"a".repeat(64)] {
            let mut s = spec();
            s.hostname = bad.into();
            assert!(validate(&s).is_err(), "{bad:?}");
        }
        let mut s = spec();
        s.agent_args.push("--home /x".into());
        assert!(validate(&s).is_err());
        let mut s = spec();
        s.memory_mb = 16;
        assert!(validate(&s).is_err());
    }

    #[test]
    fn the_vcpu_summary_keeps_each_cpus_rip_and_halt_flag_and_nothing_else() {
        let text = "CPU#0\nRAX=0000000000000000 RBX=ffffffff82a0c940\n\
                    RIP=ffffffff81a17a0b RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1\n\
                    CPU#1\nRIP=00007f\x1b[2Jzz RFL=00000202 HLT=0\n";
        assert_eq!(
            vcpu_summary(text),
            "0: RIP=ffffffff81a17a0b HLT=1, 1: RIP=00007f2 HLT=0"
        );
        assert_eq!(vcpu_summary("no registers here"), "");
    }

    #[test]
    fn cpu_seconds_reads_a_processs_own_time() {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            std::hint::black_box(0u64.wrapping_add(1));
        }
        let seconds = cpu_seconds(std::process::id()).expect("our own stat");
        assert!(seconds >= 0.1, "{seconds}");
        assert_eq!(cpu_seconds(u32::MAX), None);
    }

    #[test]
    fn the_tail_keeps_the_last_lines_and_defuses_control_characters() {
        let dir = tempfile::tempdir().unwrap();
        let paths = VmPaths::at(dir.path());
        fs::create_dir_all(&paths.dir).unwrap();
        let console: String = (0..100).map(|i| format!("line {i}\n")).collect();
        fs::write(&paths.console_log, console + "panic\x1b[2J\n").unwrap();
        let tail = tail(&paths);
        assert!(tail.contains("line 99\npanic?[2J\n"), "{tail}");
        assert!(!tail.contains("line 70\n"), "{tail}");
        assert!(!tail.contains("qemu"));
    }
}
