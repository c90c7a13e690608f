//! VM benchmarks, each beside its baseline in the same run (ratios, not absolute times), under
//! the accelerator `DYNOCAP_VM_ACCEL` names (TCG unless set):
//! 1. boot-to-first-exec of a DynoCap VM sandbox (`Backend::boot`, the agent's hello, `exec
//!    true`, destroy) vs the floor: QEMU booting the same kernel and initramfs, with the same
//!    machine, accelerator, vCPUs and memory, straight to a busybox `/init` that reboots at
//!    once (`-no-reboot` turns that into QEMU's exit);
//! 2. QEMU's own resident memory beyond the guest's RAM, for an idle sandbox.
//!
//! Run with `scripts/bench.sh`, or: `DYNOCAP_AGENT=<static release agent> cargo bench -p
//! dynocap-e2e --bench vm`. Needs root and QEMU; the guest image is the one `tests/vm.rs` uses
//! (`scripts/vm-test-rootfs.sh`, or `DYNOCAP_TEST_VM_ROOTFS`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use dynocap_backend_vm::cpio::CpioWriter;
use dynocap_backend_vm::qemu;
use dynocap_e2e::bench::{report, sample};
use dynocap_engine::agent_conn::AgentConn;
use dynocap_engine::backend::{self, BootSpec};
use dynocap_engine::image::Image;
use dynocap_engine::spec::{ExecSpec, Network};

const CACHE: &str = "/var/cache/dynocap-test-images";
const MEMORY_MB: u64 = 512;
const RUNS: usize = 5;

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
    let backend = backend::select().expect("vm backend");
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
        disk_mb: Some(1024),
        pids: 1024,
        reuse_layer: false,
        id_range: 0,
        network: Network::None,
        cache_dir: cache.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    // 1. Boot to first exec.
    let sandbox = sample(RUNS, |i| {
        let mut guest = backend.boot(&spec(i)).expect("boot");
        let channel = guest.take_channel().expect("channel");
        runtime.block_on(exec_true(channel));
        guest.destroy().expect("destroy");
    });
    // The vm backend keeps its artefacts in `vm/` of the cache it is given.
    let (kernel, initrd) = artefacts(&cache.join("vm"), &rootfs);
    let floor_initrd = floor_initramfs(&initrd, &rootfs, work.path());
    let floor = sample(RUNS, |i| {
        floor_boot(
            &kernel,
            &floor_initrd,
            &accel,
            &work.path().join(format!("floor{i}.log")),
        )
    });
    println!("under {accel}, 1 vCPU, {MEMORY_MB} MiB, microvm:");
    report(
        "vm sandbox boot + exec true + destroy",
        &sandbox,
        "QEMU, same kernel and initramfs, /init reboots at once",
        &floor,
    );

    // 2. QEMU's overhead over the guest's RAM, idle after one exec.
    let mut guest = backend.boot(&spec(100)).expect("boot");
    let channel = guest.take_channel().expect("channel");
    let conn = runtime.block_on(exec_true(channel));
    std::thread::sleep(Duration::from_secs(3));
    let mem = qemu_memory(guest.pid(), MEMORY_MB * 1024);
    println!(
        "idle vm sandbox: QEMU RSS {} MiB = guest RAM {} MiB + TCG code cache {} MiB + QEMU's \
         own {} MiB (of which private anonymous {} MiB; the rest is QEMU's binary and \
         libraries, shared between sandboxes)",
        mem.rss / 1024,
        mem.guest_ram / 1024,
        mem.code_cache / 1024,
        (mem.rss - mem.guest_ram - mem.code_cache) / 1024,
        mem.own_anonymous / 1024,
    );
    drop(conn);
    guest.destroy().expect("destroy");
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

/// The kernel and the initramfs the sandboxes above booted (the newest initramfs in the
/// cache is theirs: it was just built or used).
fn artefacts(cache: &Path, rootfs: &Path) -> (PathBuf, PathBuf) {
    let kernel = dynocap_backend_vm::kernel::find(rootfs).expect("kernel");
    let initrd = std::fs::read_dir(cache)
        .expect("cache")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("initramfs-"))
        .max_by_key(|e| e.metadata().and_then(|m| m.accessed()).ok())
        .expect("an initramfs")
        .path();
    (kernel.image, initrd)
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

fn floor_boot(kernel: &Path, initrd: &Path, accel: &str, console: &Path) {
    let tcg = accel == "tcg";
    let machine = if tcg {
        "microvm,rtc=on,isa-serial=on"
    } else {
        "microvm,pic=off,pit=off,rtc=on,isa-serial=on"
    };
    let mut append = String::from("console=ttyS0 quiet panic=-1 reboot=t rdinit=/floor-init ");
    if tcg {
        append.push_str(&format!("tsc_early_khz={}", qemu::host_tsc_khz()));
    }
    let status = Command::new(qemu::QEMU)
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ])
        .args(["-M", machine, "-accel", accel])
        .args(["-cpu", if tcg { "max" } else { "host" }])
        .args(["-smp", "1", "-m", &format!("{MEMORY_MB}M")])
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

/// QEMU's resident memory, in KiB, by kind.
struct QemuMemory {
    rss: u64,
    /// The anonymous mapping of exactly the guest's RAM size.
    guest_ram: u64,
    /// TCG's translated-code buffer: the one writable and executable mapping.
    code_cache: u64,
    /// Anonymous memory that is neither of the above: QEMU's own heap, stacks, device state.
    own_anonymous: u64,
}

fn qemu_memory(pid: i32, ram_kib: u64) -> QemuMemory {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut mem = QemuMemory {
        rss: 0,
        guest_ram: 0,
        code_cache: 0,
        own_anonymous: 0,
    };
    let (mut size, mut kind) = (0, "other");
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else {
            continue;
        };
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range, permissions, offset, device, inode, path.
            let perms = words.next().unwrap_or("");
            kind = if perms.contains('x') && perms.contains('w') {
                "code"
            } else {
                "other"
            };
            continue;
        }
        let value: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        match first {
            "Size:" => size = value,
            "Rss:" => {
                mem.rss += value;
                if size == ram_kib {
                    mem.guest_ram += value;
                } else if kind == "code" {
                    mem.code_cache += value;
                }
            }
            "Anonymous:" if size != ram_kib && kind != "code" => mem.own_anonymous += value,
            _ => {}
        }
    }
    mem
}
