//! VM benchmarks, each beside its baseline in the same run (ratios, not absolute times), under
//! the accelerator `DYNOCAP_VM_ACCEL` names (TCG unless set):
//! 1. boot-to-first-exec of a DynoCap VM sandbox (`Backend::boot`, the agent's hello, `exec
//!    true`, destroy) vs the floor: QEMU booting the same kernel file (`vm::boot_kernel`: the
//!    PVH ELF where the kernel has one, as the sandbox does) and initramfs, with the same
//!    machine arguments (`qemu::machine_args`) and kernel flags (`qemu::kernel_flags`), straight
//!    to a busybox `/init` that reboots at once (`-no-reboot` turns that into QEMU's exit). The
//!    two alternate, one sample each in turn, so the shared machine's load falls on both;
//! 2. QEMU's memory beyond the guest's RAM, for two idle sandboxes side by side, from each
//!    QEMU's `/proc/PID/smaps`: the guest's RAM (the anonymous mapping of exactly its size)
//!    and TCG's code buffer (the one writable and executable mapping) are set apart; the rest
//!    is counted as private anonymous memory (heap, device and TCG state, QEMU's copies of the
//!    initramfs and, for a bzImage, of the kernel) and as PSS of file-backed mappings (QEMU's
//!    binary and libraries, and the PVH kernel ELF QEMU loads from a mapping of the file).
//!
//!    The < 30 MiB target is judged on the private anonymous memory: it is what every further
//!    sandbox costs, and the host can only reclaim it by swapping. File-backed pages are the
//!    host's page cache, one copy for all sandboxes booting the same kernel with the same
//!    QEMU, clean and dropped under memory pressure; their PSS (each page divided among the
//!    processes mapping it) is reported beside it, and the kernel file's resident size apart.
//!
//! Run with `scripts/bench.sh`, or: `DYNOCAP_AGENT=<static release agent> cargo bench -p
//! dynocap-e2e --bench vm`. Needs root and QEMU; the guest image is the one `tests/vm.rs` uses
//! (`scripts/vm-test-rootfs.sh`, or `DYNOCAP_TEST_VM_ROOTFS`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dynocap_backend_vm::cpio::CpioWriter;
use dynocap_backend_vm::qemu::{self, Accel, Machine};
use dynocap_backend_vm::{initramfs, kernel, vm};
use dynocap_e2e::bench::report;
use dynocap_engine::agent_conn::AgentConn;
use dynocap_engine::backend::{self, BootSpec};
use dynocap_engine::image::Image;
use dynocap_engine::spec::{ExecSpec, Network};

const CACHE: &str = "/var/cache/dynocap-test-images";
const MEMORY_MB: u64 = 512;
const RUNS: usize = 7;

fn main() {
    let agent = PathBuf::from(
        std::env::var_os("DYNOCAP_AGENT").expect("set DYNOCAP_AGENT to the static release agent"),
    );
    let rootfs = match std::env::var_os("DYNOCAP_TEST_VM_ROOTFS") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir = Path::new(CACHE).join("busybox-cloud");
            let status = Command::new(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/vm-test-rootfs.sh"),
            )
            .arg(&dir)
            .status()
            .expect("run scripts/vm-test-rootfs.sh");
            assert!(status.success(), "vm-test-rootfs.sh failed");
            dir
        }
    };
    if std::env::var_os("DYNOCAP_VM_ACCEL").is_none() {
        std::env::set_var("DYNOCAP_VM_ACCEL", "tcg");
    }
    std::env::set_var("DYNOCAP_BACKEND", "vm");
    let accel = std::env::var("DYNOCAP_VM_ACCEL").expect("set above");
    let config = dynocap_engine::Config {
        backend: Some("vm".into()),
        ..Default::default()
    };
    let backend = backend::select(&config).expect("vm backend");
    let work = tempfile::tempdir().expect("temp dir");
    let cache = Path::new(CACHE).join("vm-cache");
    let spec = |i: usize| BootSpec {
        id: format!("sbx-bench-{i}"),
        hostname: format!("bench-{i}"),
        image: Image {
            name: "busybox-test".into(),
            root: rootfs.clone(),
            ro_binds: Vec::new(),
            owned_by_host_root: true,
            guest_sudo: false,
            id: None,
            kernel: None,
        },
        state_dir: work.path().join(format!("s{i}")),
        agent_binary: agent.clone(),
        cpus: 1,
        memory_mb: MEMORY_MB,
        disk_mb: 1024,
        disk_limit: None,
        vm_accel: Some(accel.clone()),
        exec_cgroup: None,
        pids: 1024,
        reuse_layer: false,
        id_range: 0,
        layer_id_range: None,
        network: Network::None,
        extra_ca: None,
        project_cache: None,
        cache_dir: cache.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let accel = match accel.as_str() {
        "tcg" => Accel::Tcg,
        "kvm" => Accel::Kvm,
        other => panic!("DYNOCAP_VM_ACCEL={other}: the bench knows tcg and kvm"),
    };

    // 1. Boot to first exec. A first boot builds the cached artefacts (base disk, initramfs)
    // and is not counted; the floor boots the initramfs it built.
    let boot_exec_destroy = |i: usize| {
        let mut guest = backend.boot(&spec(i)).expect("boot");
        let channel = guest.take_channel().expect("channel");
        runtime.block_on(exec_true(channel));
        guest.destroy().expect("destroy");
    };
    boot_exec_destroy(RUNS);
    let kernel = kernel::find(&rootfs).expect("kernel");
    let modules = kernel::needed_modules(&kernel, Machine::Microvm).expect("modules");
    // The vm backend keeps its artefacts in `vm/` of the cache it is given.
    let initrd = initramfs::get(&cache.join("vm"), &agent, &modules).expect("initramfs");
    let boot_kernel =
        vm::boot_kernel(&cache.join("vm"), &kernel, Machine::Microvm).expect("boot kernel");
    let floor_initrd = floor_initramfs(&initrd, &rootfs, work.path());
    let (mut sandbox, mut floor) = (Vec::new(), Vec::new());
    for i in 0..RUNS {
        let start = Instant::now();
        boot_exec_destroy(i);
        sandbox.push(start.elapsed());
        let start = Instant::now();
        floor_boot(
            &boot_kernel,
            &floor_initrd,
            accel,
            &work.path().join(format!("floor{i}.log")),
        );
        floor.push(start.elapsed());
    }
    // Each sandbox sample and the floor sample right after it saw about the same load: the
    // median of their ratios is steadier than the ratio of the medians on a shared machine.
    let mut pairs: Vec<f64> = sandbox
        .iter()
        .zip(&floor)
        .map(|(s, f)| s.as_secs_f64() / f.as_secs_f64())
        .collect();
    pairs.sort_by(f64::total_cmp);
    sandbox.sort();
    floor.sort();
    println!(
        "under {accel:?}, 1 vCPU, {MEMORY_MB} MiB, microvm, {RUNS} runs each, alternating; kernel \
         file {}:",
        boot_kernel.display()
    );
    report(
        "vm sandbox boot + exec true + destroy",
        &sandbox,
        "QEMU, same kernel, initramfs, machine and kernel flags, /init reboots at once",
        &floor,
    );
    println!(
        "  median of the {RUNS} adjacent sandbox/floor pairs' ratios: {:.2}x (min {:.2}x, max {:.2}x)",
        pairs[RUNS / 2],
        pairs[0],
        pairs[RUNS - 1]
    );

    // 2. QEMU's memory beyond the guest's RAM: two sandboxes, idle after one exec each.
    let mut guests = Vec::new();
    let mut conns = Vec::new();
    for i in [100, 101] {
        let mut guest = backend.boot(&spec(i)).expect("boot");
        let channel = guest.take_channel().expect("channel");
        conns.push(runtime.block_on(exec_true(channel)));
        guests.push(guest);
    }
    std::thread::sleep(Duration::from_secs(3));
    let mems: Vec<QemuMemory> = guests
        .iter()
        .map(|g| qemu_memory(g.pid(), MEMORY_MB * 1024, &boot_kernel))
        .collect();
    let mean = |f: fn(&QemuMemory) -> u64| mems.iter().map(f).sum::<u64>() / 1024 / 2;
    println!(
        "idle vm sandbox, mean of 2 side by side: QEMU's RSS {} MiB = guest RAM touched {} MiB + \
         TCG code buffer {} MiB (bounded by tb-size; none under KVM) + the rest {} MiB RSS",
        mean(|m| m.rss),
        mean(|m| m.guest_ram),
        mean(|m| m.code_cache),
        mean(|m| m.rss - m.guest_ram - m.code_cache),
    );
    println!(
        "QEMU's own memory beyond guest RAM and the code buffer, per sandbox: {} MiB private \
         anonymous (the target's measure: heap, device and TCG state, QEMU's copies of the \
         initramfs and of a bzImage kernel) + {} MiB PSS of file-backed mappings shared \
         between the sandboxes' QEMUs (binary, libraries; the kernel file: {} MiB resident, \
         page cache) = {} MiB PSS ({} MiB with the code buffer)",
        mean(|m| m.rest_anonymous),
        mean(|m| m.rest_pss - m.rest_anonymous),
        mean(|m| m.kernel_rss),
        mean(|m| m.rest_pss),
        mean(|m| m.rest_pss + m.code_cache),
    );
    drop(conns);
    for guest in guests {
        guest.destroy().expect("destroy");
    }
}

/// Waits for the agent's hello, runs `true`, and returns the connection (kept by the caller
/// so the guest stays idle but connected).
async fn exec_true(channel: std::os::fd::OwnedFd) -> AgentConn {
    let stream = std::os::unix::net::UnixStream::from(channel);
    stream.set_nonblocking(true).expect("nonblocking");
    let stream = tokio::net::UnixStream::from_std(stream).expect("register");
    let (read, write) = stream.into_split();
    let (conn, _hello) = AgentConn::start(read, write, Duration::from_secs(120))
        .await
        .expect("hello");
    let spec = ExecSpec::new("true", None, "/", Vec::new(), Some(60), false).expect("spec");
    let result = dynocap_engine::exec::run(&conn, &spec, std::future::pending(), None, None)
        .await
        .expect("exec");
    assert_eq!(result.exit_code, Some(0));
    conn
}

/// The sandbox's initramfs with busybox and an `/floor-init` that reboots, appended as a
/// second archive (the kernel unpacks concatenated archives in order).
fn floor_initramfs(initrd: &Path, rootfs: &Path, dir: &Path) -> PathBuf {
    let mut bytes = std::fs::read(initrd).expect("initramfs");
    let busybox = std::fs::read(rootfs.join("bin/busybox")).expect("busybox");
    let mut extra = CpioWriter::new(Vec::new());
    extra.dir("bin", 0o755).expect("cpio");
    extra.file("bin/busybox", 0o755, &busybox).expect("cpio");
    extra
        .file(
            "floor-init",
            0o755,
            b"#!/bin/busybox sh\n/bin/busybox reboot -f\n",
        )
        .expect("cpio");
    bytes.extend(extra.finish().expect("cpio"));
    let path = dir.join("floor.cpio");
    std::fs::write(&path, bytes).expect("write");
    path
}

fn floor_boot(kernel: &Path, initrd: &Path, accel: Accel, console: &Path) {
    let tsc_khz = (accel == Accel::Tcg).then(qemu::host_tsc_khz);
    let append = format!("{} rdinit=/floor-init", qemu::kernel_flags(tsc_khz));
    let status = Command::new(qemu::QEMU)
        .args(qemu::machine_args(Machine::Microvm, accel, 1, MEMORY_MB))
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &append])
        .arg("-chardev")
        .arg(format!("file,id=console,path={}", console.display()))
        .args(["-serial", "chardev:console"])
        .stdin(Stdio::null())
        .status()
        .expect("run QEMU");
    assert!(
        status.success(),
        "the floor VM failed: see {}",
        console.display()
    );
}

/// QEMU's memory, in KiB, by kind.
struct QemuMemory {
    rss: u64,
    /// The anonymous mapping of exactly the guest's RAM size: the RAM the guest touched.
    guest_ram: u64,
    /// TCG's translated-code buffer: the one writable and executable mapping.
    code_cache: u64,
    /// Everything else, as PSS: pages shared with other processes count by their share.
    rest_pss: u64,
    /// Everything else that is anonymous: QEMU's heap, stacks, device and TCG state.
    rest_anonymous: u64,
    /// The resident pages of the mapped kernel file (a PVH ELF QEMU loads from a mapping).
    kernel_rss: u64,
}

fn qemu_memory(pid: i32, ram_kib: u64, kernel: &Path) -> QemuMemory {
    let kernel = kernel.canonicalize().expect("kernel path");
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut mem = QemuMemory {
        rss: 0,
        guest_ram: 0,
        code_cache: 0,
        rest_pss: 0,
        rest_anonymous: 0,
        kernel_rss: 0,
    };
    let (mut size, mut code, mut anonymous_mapping, mut kernel_mapping) = (0, false, false, false);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else {
            continue;
        };
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range, permissions, offset, device, inode, path.
            let perms = words.next().unwrap_or("");
            code = perms.contains('x') && perms.contains('w');
            // The inode: 0 for anonymous memory.
            anonymous_mapping = words.nth(2).unwrap_or("0") == "0";
            kernel_mapping = words.next().map(Path::new) == Some(kernel.as_path());
            continue;
        }
        let value: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        let guest_ram = anonymous_mapping && size == ram_kib;
        match first {
            "Size:" => size = value,
            "Rss:" => {
                mem.rss += value;
                if guest_ram {
                    mem.guest_ram += value;
                } else if code {
                    mem.code_cache += value;
                }
                if kernel_mapping {
                    mem.kernel_rss += value;
                }
            }
            "Pss:" if !guest_ram && !code => mem.rest_pss += value,
            "Anonymous:" if !guest_ram && !code => mem.rest_anonymous += value,
            _ => {}
        }
    }
    mem
}
