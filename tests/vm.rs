//! The `vm` backend end to end, at the engine's `Backend` seam: a real QEMU guest booting
//! Debian's cloud kernel with the static agent as PID 1, under TCG (`DYNOCAP_VM_ACCEL=tcg`
//! unless the environment says otherwise).
//!
//! The guest image is the small busybox rootfs that `scripts/vm-test-rootfs.sh` builds into
//! `/var/cache/dynocap-test-images/busybox-cloud` (or `DYNOCAP_TEST_VM_ROOTFS`). The agent is
//! `DYNOCAP_AGENT`, which must be the static musl build. Without `qemu-system-x86_64` the
//! tests skip with the reason, except in CI, where that is a failure.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dynocap_engine::agent_conn::AgentConn;
use dynocap_engine::backend::{self, BootSpec};
use dynocap_engine::image::Image;
use dynocap_engine::spec::{ExecSpec, Network};

const CACHE: &str = "/var/cache/dynocap-test-images";

/// What every test needs, or `None` (after saying why) when this machine cannot run them.
struct VmEnv {
    rootfs: PathBuf,
    agent: PathBuf,
    cache: PathBuf,
}

fn vm_env(test: &str) -> Option<VmEnv> {
    if !dynocap_e2e::backend::require_qemu(test) {
        return None;
    }
    if !dynocap_e2e::require_root(test) {
        return None;
    }
    let rootfs = match std::env::var_os("DYNOCAP_TEST_VM_ROOTFS") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir = Path::new(CACHE).join("busybox-cloud");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/vm-test-rootfs.sh");
            let status = Command::new(&script)
                .arg(&dir)
                .status()
                .expect("run scripts/vm-test-rootfs.sh");
            assert!(status.success(), "{} failed", script.display());
            dir
        }
    };
    let agent = std::env::var_os("DYNOCAP_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            dynocap_e2e::bin_dir().join("../x86_64-unknown-linux-musl/debug/dynocap-agent")
        });
    assert!(
        agent.is_file(),
        "{test}: the static agent {} is missing: `cargo build --target x86_64-unknown-linux-musl -p dynocap-agent` and set DYNOCAP_AGENT to it",
        agent.display()
    );
    if std::env::var_os("DYNOCAP_VM_ACCEL").is_none() {
        // SAFETY (edition 2021: set_var is safe): every test sets the same value before any
        // of them boots, and nothing in the test process reads it concurrently with a change.
        std::env::set_var("DYNOCAP_VM_ACCEL", "tcg");
    }
    Some(VmEnv {
        rootfs,
        agent,
        cache: Path::new(CACHE).join("vm-cache"),
    })
}

fn boot_spec(env: &VmEnv, rootfs: &Path, agent: &Path, state: &Path, name: &str) -> BootSpec {
    BootSpec {
        id: format!("sbx-{name}"),
        hostname: name.into(),
        image: Image {
            name: "busybox-test".into(),
            root: rootfs.to_owned(),
            ro_binds: Vec::new(),
            owned_by_host_root: true,
            guest_sudo: false,
            id: None,
            kernel: None,
        },
        state_dir: state.to_owned(),
        agent_binary: agent.to_owned(),
        cpus: 1,
        memory_mb: 512,
        disk_mb: 2048,
        disk_limit: None,
        // vm_env set it (tcg unless the caller chose).
        vm_accel: std::env::var("DYNOCAP_VM_ACCEL").ok(),
        exec_cgroup: None,
        pids: 1024,
        reuse_layer: false,
        id_range: 0,
        layer_id_range: None,
        network: Network::None,
        extra_ca: None,
        project_cache: None,
        cache_dir: env.cache.clone(),
    }
}

fn vm_backend() -> Box<dyn backend::Backend> {
    // SAFETY (edition 2021): as in vm_env.
    std::env::set_var("DYNOCAP_BACKEND", "vm");
    let config = dynocap_engine::Config {
        backend: Some("vm".into()),
        ..Default::default()
    };
    let backend = backend::select(&config).expect("DYNOCAP_BACKEND=vm selects the vm backend");
    assert_eq!(backend.name(), "vm");
    backend
}

/// A runtime on this thread, for talking to a guest's agent.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The connection to the agent on `channel`, once it has said hello.
async fn agent_conn(channel: OwnedFd) -> AgentConn {
    let std_stream = std::os::unix::net::UnixStream::from(channel);
    std_stream.set_nonblocking(true).expect("nonblocking");
    let stream = tokio::net::UnixStream::from_std(std_stream).expect("register the channel");
    let (read, write) = stream.into_split();
    let (conn, hello) = AgentConn::start(read, write, Duration::from_secs(120))
        .await
        .expect("the agent says hello");
    eprintln!("agent hello: {hello:?}");
    conn
}

/// Runs `command` through the agent on `channel` and returns (exit code, stdout).
fn exec(channel: OwnedFd, command: &str) -> (Option<i32>, String) {
    runtime().block_on(async move {
        let conn = agent_conn(channel).await;
        let spec = ExecSpec::new(command, None, "/", Vec::new(), Some(60), false).expect("spec");
        let result = dynocap_engine::exec::run(&conn, &spec, std::future::pending(), None, None)
            .await
            .expect("exec");
        (result.exit_code, result.stdout.unwrap_or_default())
    })
}

fn alive(pid: i32) -> bool {
    // A zombie has no cmdline; count only a process that still runs.
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

#[test]
fn a_raw_vm_boots_runs_commands_as_the_agent_said_and_is_destroyed() {
    let Some(env) = vm_env("vm boot/exec/destroy") else {
        return;
    };
    let backend = vm_backend();
    let state = tempfile::tempdir().expect("state dir");
    let spec = boot_spec(&env, &env.rootfs, &env.agent, state.path(), "vm-box_1");
    let started = Instant::now();
    let mut guest = backend.boot(&spec).expect("boot");
    eprintln!("boot to agent hello under TCG: {:.2?}", started.elapsed());
    let pid = guest.pid();
    assert!(alive(pid));
    // Started as root, QEMU runs as the sandbox's range's first host id, chrooted.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid");
    assert_eq!(
        uid_line.split_whitespace().nth(1),
        Some("1000000"),
        "{uid_line}"
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/root")).expect("root"),
        state.path().join("vm/empty")
    );
    let channel = guest.take_channel().expect("channel");
    let (code, out) = exec(
        channel,
        "uname -r; cat /proc/1/comm; hostname; id -u; df -k / | tail -1; ls -ld /home/sandbox",
    );
    eprintln!("{out}");
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let kernel = std::fs::read_dir(env.rootfs.join("boot"))
        .expect("boot dir")
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("vmlinuz-")
                .map(str::to_owned)
        })
        .next()
        .expect("a kernel");
    assert_eq!(lines[0], kernel, "the image's kernel runs the guest");
    assert_eq!(
        lines[1], "agent",
        "PID 1 is the agent, re-executed from /.dynocap/agent"
    );
    assert_eq!(lines[2], "vm-box_1");
    assert_eq!(lines[3], "1000", "commands run as the sandbox user");
    // The root filesystem was grown to the disk's size (2 GiB), far past the base image.
    let size_kib: u64 = lines[4]
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("df size");
    assert!(size_kib > 1_800_000, "root is {size_kib} KiB: {}", lines[4]);
    assert!(lines[5].contains("sandbox"), "{}", lines[5]);

    let vm_dir = state.path().join("vm");
    assert!(vm_dir.join("disk.qcow2").is_file());
    assert!(
        std::fs::read_to_string(vm_dir.join("console.log"))
            .expect("console log")
            .contains("dynocap-agent: vm boot: /dev/vda mounted"),
        "the console goes to the sandbox's state directory"
    );
    guest.destroy().expect("destroy");
    assert!(!alive(pid), "QEMU is gone after destroy");
    assert!(!vm_dir.exists(), "destroy removes the VM's files");
}

/// Not a test of its own: the child process of the SIGKILL test, which boots a guest as a
/// supervisor does, prints QEMU's pid and waits to be killed.
#[test]
fn sigkill_helper() {
    let Some(state) = std::env::var_os("DYNOCAP_VM_TEST_HELPER_STATE") else {
        return;
    };
    let env = vm_env("sigkill helper").expect("the parent checked the environment");
    let backend = vm_backend();
    let spec = boot_spec(&env, &env.rootfs, &env.agent, Path::new(&state), "doomed");
    let guest = backend.boot(&spec).expect("boot");
    println!("QEMU_PID={}", guest.pid());
    std::thread::sleep(Duration::from_secs(3600));
    drop(guest);
}

#[test]
fn sigkill_of_the_supervisor_leaves_no_qemu() {
    let Some(_env) = vm_env("vm supervisor SIGKILL") else {
        return;
    };
    let state = tempfile::tempdir().expect("state dir");
    let mut child = Command::new(std::env::current_exe().expect("test exe"))
        .args([
            "sigkill_helper",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DYNOCAP_VM_TEST_HELPER_STATE", state.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the helper");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let qemu: i32 = loop {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).expect("read");
        assert!(
            n > 0,
            "the helper exited without booting: {:?}",
            child.wait()
        );
        // libtest prints "test sigkill_helper ... " on the same line.
        if let Some(pid) = line.split("QEMU_PID=").nth(1) {
            break pid.trim().parse().expect("pid");
        }
    };
    assert!(alive(qemu));
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(qemu).expect("a positive pid"),
        rustix::process::PidfdFlags::empty(),
    )
    .expect("pidfd_open");
    child.kill().expect("SIGKILL the supervisor");
    let _ = child.wait();
    // QEMU is not our child: its pidfd becomes readable when it exits. The bound only keeps a
    // broken build from hanging the suite.
    let mut fds = [nix_poll(&pidfd)];
    // SAFETY: fds is a valid array of one pollfd for the duration of the call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 60_000) };
    assert_eq!(ready, 1, "QEMU {qemu} outlived its supervisor");
    assert!(!alive(qemu));
}

fn nix_poll(fd: &OwnedFd) -> libc::pollfd {
    libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd()),
        events: libc::POLLIN,
        revents: 0,
    }
}

#[test]
fn a_boot_that_fails_shows_the_guest_console() {
    let Some(env) = vm_env("vm failed boot") else {
        return;
    };
    let backend = vm_backend();
    let state = tempfile::tempdir().expect("state dir");
    // An /init the kernel cannot run (a script, and the initramfs has no shell): the kernel
    // panics with "No working init found", which the error must show.
    let bad_agent = state.path().join("not-an-agent");
    std::fs::write(&bad_agent, "#!/bin/sh\nexit 1\n").expect("write");
    let spec = boot_spec(
        &env,
        &env.rootfs,
        &bad_agent,
        &state.path().join("s"),
        "broken",
    );
    let err = backend
        .boot(&spec)
        .err()
        .expect("the boot fails")
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("did not boot"), "{err}");
    assert!(err.contains("guest console"), "{err}");
    assert!(err.contains("No working init found"), "{err}");
}

/// A guest that boots but never answers (its `/init` is busybox's init, which has nothing to
/// start in the initramfs) fails at the boot timeout with what QEMU was doing then: its run
/// state, where each vCPU was, and how much CPU QEMU used. A boot that hangs with a quiet
/// console otherwise says nothing at all.
#[test]
fn a_boot_that_never_answers_says_what_qemu_was_doing() {
    let Some(env) = vm_env("vm boot that never answers") else {
        return;
    };
    let busybox = env.rootfs.join("bin/busybox");
    assert!(busybox.is_file(), "the test image has a static busybox");
    let state = tempfile::tempdir().expect("state dir");
    let spec = dynocap_backend_vm::VmSpec {
        hostname: "silent".into(),
        rootfs: env.rootfs.clone(),
        kernel_root: None,
        image_id: None,
        state_dir: state.path().to_owned(),
        cache_dir: env.cache.clone(),
        agent_binary: busybox,
        agent_args: Vec::new(),
        cpus: 1,
        memory_mb: 256,
        disk_bytes: 1 << 30,
        reuse_disk: false,
        accel: dynocap_backend_vm::AccelChoice::Tcg,
        boot_timeout: Duration::from_secs(15),
        run_as: None,
        nat_dns: None,
        cache_disk: None,
    };
    let err = dynocap_backend_vm::Vm::boot(&spec)
        .err()
        .expect("a guest that never answers does not boot")
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("did not answer within 15s"), "{err}");
    assert!(err.contains("QEMU's run state: running"), "{err}");
    assert!(err.contains("vCPUs: 0: RIP="), "{err}");
    assert!(err.contains("s of CPU in the 15 s it waited"), "{err}");
}

#[test]
fn a_bad_kernel_fails_with_qemus_reason() {
    let Some(env) = vm_env("vm bad kernel") else {
        return;
    };
    let backend = vm_backend();
    let state = tempfile::tempdir().expect("state dir");
    // A rootfs whose "kernel" is garbage; the drivers are declared built in, so nothing else
    // is missing.
    let rootfs = state.path().join("rootfs");
    let modules = rootfs.join("lib/modules/9.9.9");
    std::fs::create_dir_all(&modules).expect("mkdir");
    std::fs::create_dir_all(rootfs.join("boot")).expect("mkdir");
    std::fs::write(rootfs.join("boot/vmlinuz-9.9.9"), vec![0x5a_u8; 4096]).expect("write");
    std::fs::write(
        modules.join("modules.builtin"),
        "kernel/drivers/block/virtio_blk.ko\nkernel/drivers/char/virtio_console.ko\n\
         kernel/fs/ext4/ext4.ko\nkernel/drivers/virtio/virtio_mmio.ko\n\
         kernel/drivers/net/virtio_net.ko\n",
    )
    .expect("write");
    let mut spec = boot_spec(
        &env,
        &rootfs,
        &env.agent,
        &state.path().join("s"),
        "badkernel",
    );
    // This rootfs is new on every run: keep its base disk out of the shared cache.
    spec.cache_dir = state.path().join("cache");
    let err = backend
        .boot(&spec)
        .err()
        .expect("the boot fails")
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("QEMU exited"), "{err}");
    assert!(err.contains("last lines of the qemu"), "{err}");
    assert!(
        !state.path().join("s/vm/disk.qcow2").exists(),
        "a failed boot leaves no disk behind"
    );
}

#[test]
fn a_kept_disk_boots_again_with_the_guests_files() {
    let Some(env) = vm_env("vm kept disk") else {
        return;
    };
    let backend = vm_backend();
    let state = tempfile::tempdir().expect("state dir");
    let mut spec = boot_spec(&env, &env.rootfs, &env.agent, state.path(), "keeper");
    let mut guest = backend.boot(&spec).expect("boot");
    let channel = guest.take_channel().expect("channel");
    // The supervisor still holds the channel when it stops a guest: so does this test.
    let held = channel.try_clone().expect("dup");
    // No sync: stopping with the disk kept must get the guest's page cache onto it.
    let (code, out) = exec(channel, "echo unsaved-work > /home/sandbox/work");
    assert_eq!(code, Some(0), "{out}");
    guest.stop_keeping_layer().expect("stop keeping the disk");
    drop(held);
    assert!(state.path().join("vm/disk.qcow2").is_file());

    // A recovery boot over the kept disk sees the file.
    spec.reuse_layer = true;
    let mut guest = backend.boot(&spec).expect("boot over the kept disk");
    let channel = guest.take_channel().expect("channel");
    let (code, out) = exec(channel, "cat /home/sandbox/work");
    assert_eq!((code, out.trim()), (Some(0), "unsaved-work"));
    guest.destroy().expect("destroy");
    backend
        .cleanup_leftovers(&spec.id, state.path())
        .expect("cleanup is idempotent");
}

/// The KVM probe boots a kernel taken from an image; started as root, its QEMU must be as
/// confined as a sandbox's. It is watched while it runs: its command line must ask for the
/// probe's own id and empty root, and once QEMU drops (after opening its files, before the
/// guest runs) it must be that id in that root. Where `/dev/kvm` refuses the vCPU's setup
/// (QEMU aborts on an MSR it cannot set, as on some of these paravirtual hosts), QEMU ends
/// before the drop, with no guest code run; then the probe must have said no.
#[test]
fn a_root_started_kvm_probe_runs_as_its_own_id_in_an_empty_root() {
    let test = "a_root_started_kvm_probe_runs_as_its_own_id_in_an_empty_root";
    let Some(env) = vm_env(test) else {
        return;
    };
    if !Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED {test}: no /dev/kvm here, so DynoCap never probes KVM");
        return;
    }
    let kernel = dynocap_backend_vm::kernel::find(&env.rootfs).expect("the test image's kernel");
    // A path of this test's own, to tell its QEMU from any other.
    let scratch = tempfile::tempdir().expect("tempdir");
    let probe_kernel = scratch.path().join("vmlinuz-probe-test");
    std::fs::copy(&kernel.image, &probe_kernel).expect("copy the kernel");
    let cache = scratch.path().join("cache");
    let probing = {
        let (kernel, cache) = (probe_kernel.clone(), cache.clone());
        std::thread::spawn(move || {
            dynocap_backend_vm::probe::kvm_boots(&kernel, Duration::from_secs(8), &cache)
        })
    };
    // Its QEMU boots the test's copy of the kernel or the PVH ELF made from it in the test's
    // cache: either way a path under `scratch`.
    let marker = scratch.path().as_os_str().as_encoded_bytes().to_vec();
    let mut seen = None;
    while seen.is_none() && !probing.is_finished() {
        seen = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .find_map(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                cmdline
                    .windows(marker.len())
                    .any(|w| w == marker.as_slice())
                    .then_some((pid, cmdline))
            });
        std::thread::sleep(Duration::from_millis(5));
    }
    let Some((qemu, cmdline)) = seen else {
        let verdict = probing.join().expect("probe thread");
        eprintln!(
            "SKIPPED {test}: the probe's QEMU ended before it could be watched ({verdict:?})"
        );
        return;
    };
    // It drops once its files are open; until then it is root.
    let uid = |pid: i32| -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("Uid:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut dropped = None;
    while Instant::now() < deadline {
        match uid(qemu) {
            Some(0) => std::thread::sleep(Duration::from_millis(5)),
            Some(other) => {
                dropped = Some((other, std::fs::read_link(format!("/proc/{qemu}/root"))));
                break;
            }
            None => break,
        }
    }
    let verdict = probing.join().expect("probe thread");
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    let ids = format!("{0}:{0}", dynocap_backend_vm::probe::PROBE_ID);
    let probe_root = cache.join("probe-root");
    let asks = |flag: &str, value: &str| args.windows(2).any(|w| w[0] == flag && w[1] == value);
    assert!(
        asks("-runas", &ids) && asks("-chroot", probe_root.to_str().expect("utf-8 path")),
        "the probe's QEMU is not told to drop to {ids} in {}: {args:?}",
        probe_root.display()
    );
    let Some((id, root)) = dropped else {
        assert!(
            matches!(verdict, Ok(false)),
            "the probe's QEMU (pid {qemu}) ended as root, yet the probe says {verdict:?}"
        );
        eprintln!(
            "{test}: QEMU stopped at KVM's vCPU setup here, before its drop (and before any \
             guest code); its command line asked for the drop, and the probe said no"
        );
        return;
    };
    assert_eq!(id, dynocap_backend_vm::probe::PROBE_ID);
    assert_eq!(
        root.expect("its root").as_path(),
        cache.join("probe-root"),
        "chrooted into the probe's empty root"
    );
    assert!(verdict.is_ok(), "{verdict:?}");
}

/// After a boot, the cache keeps each kind's three most recently used artefacts and anything
/// used within a day, and loses the rest; a base disk that a kept layer in the home still
/// names stays however old. A private cache, so other tests' boots (which prune the shared
/// one) cannot change what this test sees.
#[test]
fn a_boot_prunes_long_unused_artefacts_but_not_a_base_a_kept_layer_needs() {
    let Some(mut env) = vm_env("vm cache pruning") else {
        return;
    };
    let backend = vm_backend();
    let home = tempfile::tempdir().expect("home");
    env.cache = home.path().join("cache");
    let cache = env.cache.join("vm");
    std::fs::create_dir_all(&cache).expect("cache dir");
    let days_ago =
        |days: u64| std::time::SystemTime::now() - Duration::from_secs(days * 24 * 60 * 60);
    let fake = |name: &str, days: u64| {
        let path = cache.join(name);
        std::fs::write(&path, name).expect("write a fake artefact");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(days_ago(days)))
            .expect("date the fake artefact");
        path
    };
    let mut kept = Vec::new();
    let mut pruned = Vec::new();
    for (prefix, suffix) in [
        ("initramfs-", ".cpio"),
        ("vmlinux-", ".elf"),
        ("base-", ".ext4"),
    ] {
        // With this boot's own artefact the newest, the two next-newest stay.
        kept.push(fake(&format!("{prefix}fake30{suffix}"), 30));
        kept.push(fake(&format!("{prefix}fake31{suffix}"), 31));
        pruned.push(fake(&format!("{prefix}fake40{suffix}"), 40));
        pruned.push(fake(&format!("{prefix}fake41{suffix}"), 41));
    }
    // Older than all of them, but a kept task layer in the home is over it.
    let needed = fake("base-needed.ext4", 50);
    let sandboxes = home.path().join("sandboxes");
    let kept_layer = sandboxes.join("task-kept/vm/disk.qcow2");
    std::fs::create_dir_all(kept_layer.parent().unwrap()).expect("kept layer dir");
    let made = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&needed)
        .arg(&kept_layer)
        .arg("1M")
        .output()
        .expect("run qemu-img");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );

    let state = sandboxes.join("sbx-pruner");
    let spec = boot_spec(&env, &env.rootfs, &env.agent, &state, "pruner");
    let guest = backend.boot(&spec).expect("boot");
    // The pruning runs beside the boot, off its path: wait for it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while pruned.iter().any(|p| p.exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<_> = pruned.iter().filter(|p| p.exists()).collect();
    assert!(left.is_empty(), "not pruned: {left:?}");
    let lost: Vec<_> = kept
        .iter()
        .chain([&needed])
        .filter(|p| !p.exists())
        .collect();
    assert!(lost.is_empty(), "pruned but should stay: {lost:?}");
    // This boot's own artefacts are there, and were just marked used.
    let kinds = |prefix: &str| {
        std::fs::read_dir(&cache)
            .expect("list the cache")
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(prefix) && !name.contains("fake") && !name.contains("needed")
            })
            .count()
    };
    assert_eq!(kinds("initramfs-"), 1);
    assert_eq!(kinds("base-"), 1);
    guest.destroy().expect("destroy");
}

/// A VM guest runs its own kernel on the devices QEMU gives it (a virtio disk, a
/// virtio-serial port; no SMBIOS on microvm, QEMU's own ACPI tables), so nothing in its
/// /sys or /proc can name the host: not the homes' paths, not the disk image of a sandbox of
/// another home on a host loop device, not the host's own block devices or DMI identifiers.
/// The search runs through the real `dynocap` binary as the sandbox user and as the guest's
/// root (`sudo`); the guest's tools see its own disk.
#[test]
fn a_vm_guest_sees_no_host_device_path_or_identifier() {
    let test = "a_vm_guest_sees_no_host_device_path_or_identifier";
    let Some(home) = dynocap_e2e::TestHome::on(dynocap_e2e::Backend::Vm, test) else {
        return;
    };
    home.sandbox("seer", &[]);
    // A jail sandbox of another home: its disk image is on a host loop device meanwhile.
    let other = dynocap_e2e::TestHome::new();
    other.sandbox("other", &[]);
    let facts = dynocap_e2e::host_view::HostFacts::read();
    assert!(
        facts
            .loop_backing_files
            .iter()
            .any(|file| file.starts_with(&*other.path().to_string_lossy())),
        "no host loop device holds the other home's disk: {facts:?}"
    );

    // The guest's own disk, and nothing else: no loop device, no backing file.
    let own = home.sh(
        "seer",
        "ls /sys/block; cat /sys/block/*/loop/backing_file 2>/dev/null; \
         lsblk -dn -o NAME; df -P / | tail -1 | awk '{print $6}'",
    );
    assert_eq!(own, "vda\nvda\n/\n", "{own}");
    let mut anywhere = std::collections::BTreeSet::new();
    for path in [home.path(), other.path()] {
        anywhere.insert(path.to_string_lossy().into_owned());
    }
    for file in &facts.loop_backing_files {
        anywhere.insert(file.trim_end_matches(" (deleted)").to_owned());
    }
    anywhere.insert(home.sandbox_id("seer"));
    anywhere.insert(other.sandbox_id("other"));
    anywhere.extend(facts.dmi_identifiers.iter().cloned());
    // A host device named as the guest's own virtio disk (a host that is itself a VM has a
    // `vda` too) is not the host's: the check above says what the guest's `vda` is.
    let devices: std::collections::BTreeSet<String> = facts
        .block_devices
        .iter()
        .filter(|name| name.as_str() != "vda")
        .cloned()
        .collect();
    eprintln!("searching for {anywhere:?}, devices {devices:?}");
    // As the guest's root only: it reads everything the sandbox user can (the jail's test
    // searches as both), and a second walk of the VM's /sys under TCG would double the cost.
    let search = dynocap_e2e::host_view::search(&home, "seer", true, &anywhere, &devices);
    eprintln!(
        "seer (root): {} names, {} files read, found {:?}",
        search.names, search.files, search.found
    );
    assert!(
        search.found.is_empty(),
        "the VM guest (root) sees the host: {:#?}",
        search.found
    );
}

/// The file requests on the vm backend: the guest's agent performs them as the sandbox user
/// (files it writes are that user's; a root-only file, reached through a symlink, is refused
/// by the guest's kernel), exactly as on the jail backend.
#[test]
fn vm_file_requests_act_as_the_sandbox_user() {
    use dynocap_engine::files::{FileOp, FileRequest, FileResult};
    let Some(env) = vm_env("vm file requests") else {
        return;
    };
    let backend = vm_backend();
    let state = tempfile::tempdir().expect("state dir");
    let spec = boot_spec(&env, &env.rootfs, &env.agent, state.path(), "vm-files");
    let mut guest = backend.boot(&spec).expect("boot");
    let channel = guest.take_channel().expect("channel");
    runtime().block_on(async move {
        let conn = agent_conn(channel).await;
        let file = |op| {
            dynocap_engine::supervisor::files::run(
                &conn,
                FileRequest {
                    cwd: "/home/sandbox".into(),
                    op,
                },
            )
        };
        let blob: Vec<u8> = (0..=255u8).chain(*b"\"\\\n").collect();
        let wrote = file(FileOp::Write {
            path: "d/blob".into(),
            content: blob.clone(),
            mode: None,
            create_dirs: true,
        })
        .await
        .expect("write");
        assert!(
            matches!(
                wrote,
                FileResult::Written {
                    created: true,
                    mode: 0o644,
                    ..
                }
            ),
            "{wrote:?}"
        );
        let read = file(FileOp::Read {
            path: "/home/sandbox/d/blob".into(),
            offset: 0,
            length: 1 << 20,
        })
        .await
        .expect("read");
        assert!(
            matches!(&read, FileResult::Read { data, .. } if *data == blob),
            "{read:?}"
        );
        let spec = ExecSpec::new(
            "stat -c %u /home/sandbox/d/blob; ln -s /proc/1/environ /home/sandbox/env",
            None,
            "/",
            Vec::new(),
            Some(60),
            false,
        )
        .expect("spec");
        let owner = dynocap_engine::exec::run(&conn, &spec, std::future::pending(), None, None)
            .await
            .expect("exec");
        assert_eq!(owner.stdout.as_deref(), Some("1000\n"), "{owner:?}");
        let refused = file(FileOp::Read {
            path: "env".into(),
            offset: 0,
            length: 100,
        })
        .await
        .expect_err("PID 1's environment is root's");
        assert!(refused.message.contains("Permission denied"), "{refused}");
        let refused = file(FileOp::Write {
            path: "/etc/dynocap-test".into(),
            content: b"x".to_vec(),
            mode: None,
            create_dirs: false,
        })
        .await
        .expect_err("/etc is root's");
        assert!(refused.message.contains("Permission denied"), "{refused}");
    });
    guest.destroy().expect("destroy");
}
