//! The jail scenarios. Each runs in a fresh, single-threaded process (see `main` in
//! tests/jail.rs) and panics on failure.

use std::io::BufRead;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dynocap_backend_jail::{
    cleanup_leftovers, docker_default_mask, probe, Jail, JailError, JailSpec, RoBind,
};
use dynocap_host::{ROOT_MODE_COUNT, ROOT_MODE_HOST_BASE};

use crate::fixture::{cgroup_file, host_uid, pids_in_ns, read_trimmed, sh_ok, Fixture, Guest};

/// (name, function) of every scenario.
pub const ALL: &[(&str, fn())] = &[
    ("isolation", isolation),
    ("seccomp", seccomp),
    ("filesystem", filesystem),
    ("idmapped_image", idmapped_image),
    ("memory_limit", memory_limit),
    ("pids_limit", pids_limit),
    ("cpu_limit", cpu_limit),
    ("destroy_leaves_nothing", destroy_leaves_nothing),
    ("disk_made_ahead", disk_made_ahead),
    ("disk_still_being_made_ahead", disk_still_being_made_ahead),
    (
        "disk_made_ahead_from_the_spare",
        disk_made_ahead_from_the_spare,
    ),
    (
        "kill_then_destroy_leaves_nothing",
        kill_then_destroy_leaves_nothing,
    ),
    ("exec_cgroup_delegation", exec_cgroup_delegation),
    ("supervisor_death", supervisor_death),
    ("setup_errors", setup_errors),
    ("single_thread_required", single_thread_required),
    ("script_agent", script_agent),
    (
        "unprivileged_caller_gets_a_hint",
        unprivileged_caller_gets_a_hint,
    ),
    (
        "rootless_with_delegated_cgroups",
        rootless_with_delegated_cgroups,
    ),
    ("probe_reports_ready", probe_reports_ready),
];

fn isolation() {
    let fx = Fixture::new();
    let spec = fx.spec("iso-test");
    let mut guest = Guest::spawn(&spec);
    let host_pid = guest.jail().pid().as_raw();
    let f = guest.facts();
    let fact = |k: &str| f.get(k).cloned().unwrap_or_default();

    assert_eq!(fact("pid"), "1", "the agent is PID 1");
    assert_eq!(fact("cmdline1"), "/.dynocap/agent");
    assert_eq!(fact("ppid"), "0", "no parent visible in the pid namespace");
    assert_eq!(fact("procs"), "1", "only guest processes in /proc");
    assert_eq!(
        fact("fds"),
        "0,1,2,3,4",
        "exactly stdio, the channel and the delegated cgroup at exec"
    );
    assert_eq!(fact("fd0"), "/dev/null");
    assert_eq!(fact("uid_map"), "0 1000000 65536");
    assert_eq!(fact("gid_map"), "0 1000000 65536");
    assert_eq!(fact("Uid"), "0 0 0 0");
    assert_eq!(fact("Groups"), "", "supplementary groups cleared");
    assert_eq!(fact("hostname"), "iso-test");
    // Renamed from outside: by a thread started for the call, then by one started ahead (a
    // warm-pool sandbox's claim). The host keeps its own name.
    let host_name = nix::unistd::gethostname().expect("host name");
    guest.jail().set_hostname("renamed-once").expect("rename");
    assert_eq!(guest.facts()["hostname"], "renamed-once");
    guest
        .jail
        .as_mut()
        .expect("jail")
        .prepare_rename()
        .expect("start the renaming thread");
    guest.jail().set_hostname("renamed-ahead").expect("rename");
    assert_eq!(guest.facts()["hostname"], "renamed-ahead");
    guest.jail().set_hostname("renamed-again").expect("rename");
    assert_eq!(guest.facts()["hostname"], "renamed-again");
    assert_eq!(nix::unistd::gethostname().expect("host name"), host_name);
    assert_eq!(fact("netdevs"), "lo", "only loopback");
    assert_eq!(fact("lo"), "up");
    assert_eq!(fact("NoNewPrivs"), "1");
    assert_eq!(fact("Seccomp"), "2");
    let docker = format!("{:016x}", docker_default_mask());
    assert_eq!(fact("CapBnd"), docker);
    assert_eq!(fact("CapEff"), docker);
    assert_eq!(fact("CapPrm"), docker);
    assert_eq!(fact("CapInh"), "0000000000000000");
    assert_eq!(fact("CapAmb"), "0000000000000000");
    for line in fact("cgroup").split(' ') {
        assert!(
            line.ends_with(":/"),
            "cgroup namespace root expected, got {line}"
        );
    }
    assert_eq!(
        fact("env"),
        "HOME,PATH,container",
        "no supervisor environment leaks"
    );

    // Host view: the guest runs as the mapped id, never host root, in its own namespaces.
    assert_eq!(host_uid(host_pid), Some(ROOT_MODE_HOST_BASE));
    let own_userns = std::fs::read_link("/proc/self/ns/user").expect("ns");
    let guest_userns = std::fs::read_link(format!("/proc/{host_pid}/ns/user")).expect("ns");
    assert_ne!(own_userns, guest_userns);
    assert_eq!(guest.jail().id_map().to_host(0), Some(ROOT_MODE_HOST_BASE));
    for dir in guest.jail().cgroup_paths() {
        let procs = read_trimmed(&dir.join("cgroup.procs"));
        assert!(
            procs.split_whitespace().any(|p| p == host_pid.to_string()),
            "{} lacks the init",
            dir.display()
        );
        assert!(dir.ends_with("dynocap/iso-test"), "{}", dir.display());
    }
    guest.destroy();
}

fn seccomp() {
    let fx = Fixture::new();
    let mut guest = Guest::spawn(&fx.spec("seccomp-test"));
    let expect = |guest: &mut Guest, probe: &str, want: &str| {
        let (status, result) = guest.probe(probe);
        assert_eq!(
            (status.as_str(), result.as_str()),
            ("exit=0", want),
            "probe {probe}"
        );
    };
    expect(&mut guest, "mount", "EPERM");
    expect(&mut guest, "umount", "EPERM");
    expect(&mut guest, "unshare-user", "EPERM");
    expect(&mut guest, "unshare-net", "EPERM");
    expect(&mut guest, "unshare-files", "ok");
    expect(&mut guest, "clone-newuser", "EPERM");
    expect(&mut guest, "fork", "ok");
    expect(&mut guest, "clone3", "ENOSYS");
    expect(&mut guest, "setns", "EPERM");
    expect(&mut guest, "keyctl", "EPERM");
    expect(&mut guest, "bpf", "EPERM");
    expect(&mut guest, "io_uring", "EPERM");
    expect(&mut guest, "userfaultfd", "EPERM");
    expect(&mut guest, "personality 0x40000", "EPERM");
    expect(&mut guest, "personality 0xffffffff", "ok");
    expect(&mut guest, "tiocsti", "EPERM");
    expect(&mut guest, "vsock", "EPERM");
    expect(&mut guest, "chroot", "ok");

    // x32 syscall numbers: killed (SIGSYS = 31), never EPERM or executed.
    let (status, result) = guest.probe("x32");
    assert_eq!(status, "signal=31", "x32 getpid: {result}");

    // The i386 ABI (int 0x80) fails the arch check and is killed, if the kernel has it at all.
    let host = Command::new(std::env::current_exe().expect("exe"))
        .args(["guest-probe", "i386"])
        .output()
        .expect("host i386 probe");
    let (status, result) = guest.probe("i386");
    if host.status.success() {
        assert_eq!(status, "signal=31", "i386 getpid in the guest: {result}");
    } else {
        println!(
            "note: no IA32 emulation on this kernel ({:?}); guest got {status}",
            host.status
        );
        assert_ne!(status, "exit=0");
    }

    // The util-linux tools fail too.
    let (status, out) = guest.sh("unshare -U true");
    assert_ne!(status, "exit=0", "unshare -U must fail: {out}");
    let (status, out) = guest.sh("unshare -r true");
    assert_ne!(status, "exit=0", "unshare -r must fail: {out}");
    guest.destroy();
}

fn filesystem() {
    let fx = Fixture::new();
    let spec = fx.spec("fs-test");
    let mut guest = Guest::spawn(&spec);
    let upper = fx.state.join("disk/upper");

    // Writes land in the upper layer, never in the image.
    sh_ok(&mut guest, "echo hello > /newfile && cat /newfile");
    assert_eq!(read_trimmed(&upper.join("newfile")), "hello");
    assert!(!fx.image.join("newfile").exists());

    // Image files (host root's, unmapped in the guest) and read-only binds are unwritable.
    let (status, out) = guest.sh("echo x >> /etc/motd");
    assert_ne!(status, "exit=0", "{out}");
    assert_eq!(read_trimmed(&fx.image.join("etc/motd")), "image file");
    let (status, out) = guest.sh("touch /usr/dynocap-test-file");
    assert_ne!(status, "exit=0", "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(!Path::new("/usr/dynocap-test-file").exists());
    let (status, out) = guest.sh("echo x > /.dynocap/agent");
    assert_ne!(status, "exit=0", "{out}");
    let mounts = sh_ok(&mut guest, "cat /proc/self/mountinfo");
    let usr = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/usr"))
        .unwrap_or_else(|| panic!("no /usr mount in {mounts}"));
    assert!(
        usr.split(' ').nth(5).is_some_and(|o| o.starts_with("ro,")),
        "{usr}"
    );
    // (The masks on /proc entries are checked below; the covers on /sys, one per top-level
    // directory of this kernel's sysfs, right after.)
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| !p.starts_with("/proc/") && !p.starts_with("/sys/"))
        .collect();
    points.sort_unstable();
    assert_eq!(
        points,
        [
            "/",
            "/.dynocap/agent",
            "/dev",
            "/dev/full",
            "/dev/null",
            "/dev/pts",
            "/dev/random",
            "/dev/shm",
            "/dev/tty",
            "/dev/urandom",
            "/dev/zero",
            "/etc/ld.so.cache",
            "/proc",
            "/sys",
            "/tmp",
            "/usr"
        ],
        "exactly the jail's mounts, none of the host's"
    );

    // /sys: each top-level directory of the sysfs covered by a tmpfs, and only the allowlist
    // bound back from the sysfs (its mountinfo root, field 4), besides the cgroups.
    let mut shown: Vec<&str> = mounts
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|p| p.starts_with("/sys/")))
        .filter(|l| {
            l.split(" - ")
                .nth(1)
                .is_some_and(|f| f.starts_with("sysfs "))
        })
        .filter_map(|l| l.split(' ').nth(3))
        .collect();
    shown.sort_unstable();
    let allowed = [
        "/class/net",
        "/devices/system/cpu",
        "/devices/system/node",
        "/devices/virtual/net",
        "/kernel/mm",
    ];
    assert!(
        shown.iter().all(|root| allowed.contains(root)) && shown.contains(&"/devices/system/cpu"),
        "{shown:?}"
    );
    let listing = sh_ok(
        &mut guest,
        "find /sys/block /sys/dev/block /sys/firmware /sys/bus -mindepth 1 | wc -l; ls /sys/class",
    );
    assert_eq!(
        listing.split_whitespace().collect::<Vec<_>>(),
        ["0", "block", "net"]
    );

    // /tmp and /dev/shm: writable tmpfs with the sticky bit.
    let out = sh_ok(
        &mut guest,
        "touch /tmp/t /dev/shm/s && stat -c '%a %u' /tmp /dev/shm",
    );
    assert_eq!(out.lines().collect::<Vec<_>>(), ["1777 0", "1777 0"]);

    // /dev: the bound nodes work, pts is private, the symlinks exist.
    let out = sh_ok(
        &mut guest,
        "echo x > /dev/null && head -c 16 /dev/urandom | wc -c && head -c 4 /dev/zero | wc -c",
    );
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["16", "4"]);
    assert_eq!(sh_ok(&mut guest, "readlink /dev/ptmx").trim(), "pts/ptmx");
    sh_ok(
        &mut guest,
        "test -c /dev/pts/ptmx && test -L /dev/fd && test -L /dev/stdin",
    );
    let listing = sh_ok(&mut guest, "ls /dev | tr '\\n' ' '");
    assert_eq!(
        listing.trim(),
        "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero"
    );

    // /proc: host-revealing entries masked, sysctls read-only.
    let masked = "for f in timer_list kcore keys sched_debug partitions diskstats swaps cmdline \
                  interrupts; do [ -e /proc/$f ] && cat /proc/$f; done | wc -c";
    assert_eq!(sh_ok(&mut guest, masked).trim(), "0");
    let masked = "find /proc/acpi /proc/fs /proc/bus /proc/sys/dev -mindepth 1 2>/dev/null | wc -l";
    assert_eq!(sh_ok(&mut guest, masked).trim(), "0");
    let (status, out) = guest.sh("echo 1 > /proc/sys/net/ipv4/ip_forward");
    assert_ne!(status, "exit=0", "{out}");
    assert!(out.contains("Read-only file system"), "{out}");

    // The agent will need terminals: a pty pair can be opened on the private devpts.
    let (status, result) = guest.probe("pty");
    assert_eq!((status.as_str(), result.as_str()), ("exit=0", "/dev/pts/0"));

    // Nothing of the host's home or root is visible.
    assert_eq!(sh_ok(&mut guest, "ls -A /root").trim(), "");
    assert_eq!(sh_ok(&mut guest, "ls -A /home").trim(), "sandbox");
    sh_ok(&mut guest, "test ! -e /root/.cargo && test ! -e /work");

    // Guest dirs: owned by their guest ids inside, by the mapped ids on the host.
    let out = sh_ok(
        &mut guest,
        "stat -c '%u:%g %a' /home/sandbox /workspace / /root /etc",
    );
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "1000:1000 755",
            "1000:1000 755",
            "0:0 755",
            "0:0 700",
            "65534:65534 755"
        ],
        "guest dirs and / are the guest's; image dirs are host root's (nobody)"
    );
    sh_ok(&mut guest, "echo x > /root/.profile");
    let meta = std::fs::metadata(upper.join("home/sandbox")).expect("stat");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        ROOT_MODE_HOST_BASE + 1000
    );
    // Guest root can hand files to the sandbox user (CAP_CHOWN over mapped ids).
    sh_ok(
        &mut guest,
        "touch /workspace/f && chown 1000:1000 /workspace/f",
    );
    guest.destroy();
    assert!(!upper.exists(), "destroy removes the upper layer");
}

/// A built image (a whole rootfs owned by host root) shown through the guest's id map: the
/// guest's root owns its files and changes them in the upper layer; the image never changes,
/// and the idmapped mount exists only in the guest's mount namespace.
fn idmapped_image() {
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::new();
    let owned = fx.image.join("home/user-file");
    std::fs::write(&owned, "user's\n").expect("write");
    std::os::unix::fs::chown(&owned, Some(1000), Some(1000)).expect("chown");
    let mut spec = fx.spec("idmap-test");
    spec.idmap_image = true;
    let mut guest = Guest::spawn(&spec);
    assert_eq!(
        sh_ok(&mut guest, "stat -c %u:%g /etc /etc/motd /home/user-file"),
        "0:0\n0:0\n1000:1000\n"
    );
    sh_ok(&mut guest, "echo changed >> /etc/motd");
    assert_eq!(sh_ok(&mut guest, "cat /etc/motd"), "image file\nchanged\n");
    assert_eq!(read_trimmed(&fx.image.join("etc/motd")), "image file");
    let copied = std::fs::metadata(fx.state.join("disk/upper/etc/motd")).expect("copied up");
    let init_uid = host_uid(guest.jail().pid().as_raw()).expect("init uid");
    assert_eq!(copied.uid(), init_uid, "owned by the guest root's host uid");
    assert_ne!(init_uid, 0);
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let image = fx.image.to_string_lossy();
    assert!(!host_mounts.contains(image.as_ref()), "{host_mounts}");
    guest.destroy();
}

fn memory_limit() {
    let fx = Fixture::new();
    let mut spec = fx.spec("mem-test");
    spec.limits.memory_bytes = 256 << 20;
    let mut guest = Guest::spawn(&spec);
    let limit = if let Some(v1) = guest
        .jail()
        .cgroup_paths()
        .iter()
        .map(|d| d.join("memory.limit_in_bytes"))
        .find(|p| p.exists())
    {
        let memsw = v1.with_file_name("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            assert_eq!(
                read_trimmed(&memsw),
                (256u64 << 20).to_string(),
                "no swap on top"
            );
        }
        read_trimmed(&v1)
    } else {
        read_trimmed(&cgroup_file(guest.jail(), "memory.max"))
    };
    assert_eq!(limit, (256u64 << 20).to_string());

    let (status, result) = guest.probe("alloc 2048");
    assert_eq!(
        status, "signal=9",
        "allocating 2 GiB under 256 MiB must be OOM-killed: {result}"
    );
    // The agent itself survives.
    assert_eq!(guest.facts().get("pid").map(String::as_str), Some("1"));
    let (status, result) = guest.probe("alloc 64");
    assert_eq!(
        (status.as_str(), result.as_str()),
        ("exit=0", "survived 16384")
    );
    guest.destroy();
}

fn pids_limit() {
    let fx = Fixture::new();
    let mut spec = fx.spec("pids-test");
    spec.limits.pids = 32;
    let mut guest = Guest::spawn(&spec);
    assert_eq!(read_trimmed(&cgroup_file(guest.jail(), "pids.max")), "32");
    let (status, result) = guest.probe("forkloop");
    assert_eq!(status, "exit=0", "{result}");
    let forked: usize = result
        .strip_prefix("forked=")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("bad forkloop result {result}"));
    assert!(forked < 32, "{result}");
    assert!(result.ends_with("error=EAGAIN"), "{result}");
    // Room again afterwards.
    sh_ok(&mut guest, "true");
    guest.destroy();
}

fn cpu_limit() {
    let fx = Fixture::new();
    let mut spec = fx.spec("cpu-test");
    spec.limits.cpu_millis = 500;
    let mut guest = Guest::spawn(&spec);
    let jail = guest.jail();
    let stat_file = if let Some(quota) = jail
        .cgroup_paths()
        .iter()
        .map(|d| d.join("cpu.cfs_quota_us"))
        .find(|p| p.exists())
    {
        assert_eq!(read_trimmed(&quota), "50000");
        assert_eq!(
            read_trimmed(&quota.with_file_name("cpu.cfs_period_us")),
            "100000"
        );
        quota.with_file_name("cpu.stat")
    } else {
        let max = cgroup_file(jail, "cpu.max");
        assert_eq!(read_trimmed(&max), "50000 100000");
        max.with_file_name("cpu.stat")
    };
    // A busy loop gets throttled.
    let (status, _) = guest.probe("spin 1000");
    assert_eq!(status, "exit=0");
    let stat = read_trimmed(&stat_file);
    let throttled: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(throttled > 0, "no throttling recorded: {stat}");
    guest.destroy();
}

/// Loop devices bound to a file under `dir`: (device, backing file as the kernel names it).
fn loops_under(dir: &Path) -> Vec<(String, String)> {
    let prefix = dir.display().to_string();
    std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten()
        .filter_map(|entry| {
            let device = entry.file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
            let backing = backing.trim_end().to_owned();
            backing.starts_with(&prefix).then_some((device, backing))
        })
        .collect()
}

/// Waits (10 s at most) for no loop device to be bound to a file under `dir`.
fn no_loops_left_under(dir: &Path, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !loops_under(dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{when}: loop devices still bound: {:?}",
            loops_under(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The mount table line of this process's mount on `target`, if any.
fn own_mount_on(target: &Path) -> Option<String> {
    let target = target.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .find(|line| line.split(' ').nth(4) == Some(target.as_str()))
        .map(str::to_owned)
}

/// Makes a disk ahead as a standby does, on a thread of its own, and waits until it is made:
/// what its image is.
fn make_disk_ahead(templates: &Path, bytes: u64, what: &str) -> std::fs::Metadata {
    dynocap_backend_jail::start_preparing_disk(templates.to_path_buf(), bytes)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    dynocap_backend_jail::prepared_disk_image()
        .unwrap_or_else(|| panic!("{what}: no disk was made (its error is printed above)"))
}

/// A fixture whose disk templates directory (returned) holds the formatted template for
/// `bytes` and nothing else: made by making a disk ahead, then releasing it.
fn fixture_with_a_template(bytes: u64) -> (Fixture, PathBuf) {
    let fx = Fixture::new();
    let templates = fx.tmp.path().join("disks");
    make_disk_ahead(&templates, bytes, "making the template");
    dynocap_backend_jail::release_prepared_disk();
    no_loops_left_under(&templates, "after releasing the first disk");
    (fx, templates)
}

/// A disk made ahead (as a standby supervisor makes it) is taken by the next start of its
/// size: until then it is named nowhere and mounted in no namespace; then its image is the
/// state dir's `disk.img` and its filesystem holds the guest's layer. One of another size is
/// released, loop device and all, and the start makes its own.
fn disk_made_ahead() {
    let fx = Fixture::new();
    let templates = fx.tmp.path().join("disks");
    let bytes: u64 = 64 << 20;
    let made = make_disk_ahead(&templates, bytes, "making a disk ahead");
    // Nothing but the template is named in the templates directory...
    let images: Vec<String> = std::fs::read_dir(&templates)
        .expect("templates")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".img"))
        .collect();
    assert_eq!(images.len(), 1, "{images:?}");
    // ...and the disk made ahead is an unnamed file on a loop device, mounted nowhere.
    let bound = loops_under(&templates);
    let [(device, backing)] = bound.as_slice() else {
        panic!("one loop device expected: {bound:?}");
    };
    assert!(backing.ends_with("(deleted)"), "{backing}");
    let mounted_anywhere = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("mountinfo")).ok())
        .any(|table| table.contains(&format!(" /dev/{device} ")));
    assert!(!mounted_anywhere, "/dev/{device} shows in a mount table");

    let mut spec = fx.spec("ahead-test");
    spec.disk_bytes = Some(bytes);
    spec.disk_templates = Some(templates.clone());
    let mut guest = Guest::spawn(&spec);
    assert!(
        dynocap_backend_jail::prepared_disk_image().is_none(),
        "the start took it"
    );
    // The very file made ahead. Neither the loop device's number nor the inode's tells: a
    // start that released the disk made ahead and made its own gets the device and the inode
    // number just freed. The birth time does.
    let named = std::fs::metadata(fx.state.join("disk.img")).expect("the image is named");
    let identity = |meta: &std::fs::Metadata| {
        (
            std::os::unix::fs::MetadataExt::ino(meta),
            meta.created().expect("birth time (statx)"),
        )
    };
    assert_eq!(
        identity(&named),
        identity(&made),
        "disk.img is not the disk made ahead"
    );
    let line = own_mount_on(&fx.state.join("disk")).expect("the disk is mounted");
    assert!(
        line.contains(&format!(" /dev/{device} "))
            && line.contains("nosuid")
            && line.contains("nodev")
            && line.contains("no_prefetch_block_bitmaps"),
        "{line}"
    );
    sh_ok(
        &mut guest,
        "head -c 1048576 /dev/zero > /root/made-ahead && sync",
    );
    let written = std::fs::metadata(fx.state.join("disk/upper/root/made-ahead"))
        .expect("the guest's file is on the disk made ahead");
    assert_eq!(written.len(), 1 << 20);
    guest.destroy();
    assert!(
        !fx.state.join("disk.img").exists(),
        "destroy removes the image"
    );
    no_loops_left_under(&templates, "after destroy");

    // Made ahead for 64 MiB, started with 128: released at the start, which makes its own.
    make_disk_ahead(&templates, bytes, "making a disk ahead again");
    let other = Fixture::new();
    let mut spec = other.spec("ahead-other");
    spec.disk_bytes = Some(128 << 20);
    spec.disk_templates = Some(templates.clone());
    let guest = Guest::spawn(&spec);
    assert!(dynocap_backend_jail::prepared_disk_image().is_none());
    let bound = loops_under(&templates);
    assert!(
        bound
            .iter()
            .all(|(_, backing)| !backing.ends_with("(deleted)")),
        "the disk made ahead is still bound: {bound:?}"
    );
    assert_eq!(
        std::fs::metadata(other.state.join("disk.img"))
            .expect("disk.img")
            .len(),
        128 << 20
    );
    guest.destroy();
    no_loops_left_under(&templates, "after the second destroy");

    // A start without a disk limit releases it too, before its guest is cloned.
    make_disk_ahead(&templates, bytes, "making a disk ahead a third time");
    let plain = Fixture::new();
    let guest = Guest::spawn(&plain.spec("ahead-plain"));
    assert!(dynocap_backend_jail::prepared_disk_image().is_none());
    no_loops_left_under(&templates, "after a start without a disk limit");
    guest.destroy();
}

/// A start that comes while the disk is still being made ahead (a CLI `run` hands its standby
/// the order milliseconds after the standby starts) waits for that disk and takes it, rather
/// than making a second one beside it, and clones its guest from one thread again.
fn disk_still_being_made_ahead() {
    let bytes: u64 = 64 << 20;
    // The template first: the making raced below is then what every standby does (a copy, a
    // loop device, a mount), not the first-ever format.
    let (fx, templates) = fixture_with_a_template(bytes);

    dynocap_backend_jail::start_preparing_disk(templates.clone(), bytes)
        .expect("starting to make a disk ahead");
    let mut spec = fx.spec("ahead-racing");
    spec.disk_bytes = Some(bytes);
    spec.disk_templates = Some(templates.clone());
    let mut guest = Guest::spawn(&spec);
    assert!(dynocap_backend_jail::prepared_disk_image().is_none());
    // A disk made ahead is bound under the templates directory with its unnamed path; one the
    // start made itself is bound as the state dir's `disk.img`.
    let bound = loops_under(&templates);
    let [(device, backing)] = bound.as_slice() else {
        panic!("one disk made ahead expected: {bound:?}");
    };
    assert!(backing.ends_with("(deleted)"), "{backing}");
    let line = own_mount_on(&fx.state.join("disk")).expect("the disk is mounted");
    assert!(
        line.contains(&format!(" /dev/{device} ")),
        "the start did not mount the disk made ahead: {line}"
    );
    sh_ok(&mut guest, "echo written > /root/on-the-disk && sync");
    assert!(fx.state.join("disk/upper/root/on-the-disk").exists());
    guest.destroy();
    no_loops_left_under(&templates, "after destroy");
}

/// Where a teardown left a spare (a copy already on the host's disk), a disk made ahead is
/// that spare, bound and mounted where it lies. Released unused, it stays the spare, free
/// again once its loop device lets go; the next disk made ahead takes it once more, and the
/// start names it `disk.img`, where its guest finds it empty.
fn disk_made_ahead_from_the_spare() {
    let bytes: u64 = 64 << 20;
    let (fx, templates) = fixture_with_a_template(bytes);
    assert!(
        dynocap_backend_jail::make_spare_disk(&templates, bytes).expect("making a spare"),
        "no spare was made"
    );
    let spare_path = std::fs::read_dir(templates.join("spares"))
        .expect("spares")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|ext| ext == "img"))
        .expect("the spare");
    let identity = |meta: &std::fs::Metadata| {
        (
            std::os::unix::fs::MetadataExt::ino(meta),
            meta.created().expect("birth time (statx)"),
        )
    };
    let spare = identity(&std::fs::metadata(&spare_path).expect("the spare"));

    let made = make_disk_ahead(&templates, bytes, "making a disk ahead from the spare");
    assert_eq!(
        identity(&made),
        spare,
        "the disk made ahead is not the spare"
    );
    let bound = loops_under(&templates);
    assert_eq!(
        bound.iter().map(|(_, b)| b.as_str()).collect::<Vec<_>>(),
        [spare_path.display().to_string()],
        "the spare is bound where it lies"
    );
    dynocap_backend_jail::release_prepared_disk();
    no_loops_left_under(&templates, "after releasing the spare");
    assert_eq!(
        identity(&std::fs::metadata(&spare_path).expect("still the spare")),
        spare
    );

    let made = make_disk_ahead(
        &templates,
        bytes,
        "making a disk ahead from the spare again",
    );
    assert_eq!(
        identity(&made),
        spare,
        "the released spare was not taken again"
    );
    let mut spec = fx.spec("ahead-spare");
    spec.disk_bytes = Some(bytes);
    spec.disk_templates = Some(templates.clone());
    let mut guest = Guest::spawn(&spec);
    assert_eq!(
        identity(&std::fs::metadata(fx.state.join("disk.img")).expect("disk.img")),
        spare,
        "disk.img is not the spare"
    );
    assert!(!spare_path.exists(), "the spare is the sandbox's now");
    assert_eq!(loops_under(&templates), [], "bound under its new name only");
    sh_ok(
        &mut guest,
        "test -z \"$(ls -A /root)\" && echo on-the-spare > /root/f && sync",
    );
    assert!(fx.state.join("disk/upper/root/f").exists());
    guest.destroy();
    no_loops_left_under(&fx.state, "after destroy");
}

fn destroy_leaves_nothing() {
    ends_leaving_nothing("destroy-test", false);
}

/// The supervisor's path: `kill` (before its reply) leaves no guest process, and holds the
/// guest's mount namespace, whose unmounting the teardown then does; `destroy` after it
/// leaves nothing, that namespace included.
fn kill_then_destroy_leaves_nothing() {
    ends_leaving_nothing("kill-test", true);
}

fn ends_leaving_nothing(name: &str, kill_first: bool) {
    let fx = Fixture::new();
    let mut guest = Guest::spawn(&fx.spec(name));
    sh_ok(
        &mut guest,
        "for i in 1 2 3; do setsid sleep 1000 >/dev/null 2>&1 & done; true",
    );
    let host_pid = guest.jail().pid().as_raw();
    let ns = std::fs::read_link(format!("/proc/{host_pid}/ns/pid"))
        .expect("ns")
        .to_string_lossy()
        .into_owned();
    let in_ns = pids_in_ns(&ns);
    assert!(
        in_ns.len() >= 4,
        "init and 3 sleepers expected, got {in_ns:?}"
    );
    let cgroups = guest.jail().cgroup_paths();
    // The init is in each of its cgroups, whichever way it got there (by itself into v1
    // leaves, moved by the supervisor into v2 ones).
    for dir in &cgroups {
        let members = read_trimmed(&dir.join("cgroup.procs"));
        assert!(
            members.lines().any(|pid| pid == host_pid.to_string()),
            "the init {host_pid} is not in {}: {members:?}",
            dir.display()
        );
    }
    let mounts = std::fs::read_link(format!("/proc/{host_pid}/ns/mnt")).expect("mnt ns");
    let held = || {
        std::fs::read_dir("/proc/self/fd")
            .expect("own fds")
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == mounts))
    };
    if kill_first {
        guest.jail.as_mut().expect("jail").kill().expect("kill");
        assert_eq!(
            pids_in_ns(&ns),
            Vec::<i32>::new(),
            "processes survived kill"
        );
        for &pid in &in_ns {
            assert_eq!(host_uid(pid), None, "guest process {pid} survived kill");
        }
        assert!(
            held(),
            "kill let the guest's mount namespace go: {mounts:?}"
        );
    }
    guest.destroy();
    assert!(
        !held(),
        "destroy kept the guest's mount namespace: {mounts:?}"
    );

    assert_eq!(
        pids_in_ns(&ns),
        Vec::<i32>::new(),
        "processes survived destroy"
    );
    for pid in in_ns {
        assert_eq!(host_uid(pid), None, "guest process {pid} still exists");
    }
    // No process runs as a jail host id any more, unless it belongs to another jail (other
    // test suites may run theirs meanwhile): none may be in this jail's cgroup.
    let range = ROOT_MODE_HOST_BASE..ROOT_MODE_HOST_BASE + ROOT_MODE_COUNT;
    let ours: Vec<i32> = std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| host_uid(pid).is_some_and(|uid| range.contains(&uid)))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(&format!("dynocap/{name}")))
        })
        .collect();
    assert_eq!(
        ours,
        Vec::<i32>::new(),
        "processes with jail host ids survived destroy"
    );
    for dir in cgroups {
        assert!(!dir.exists(), "{} survived destroy", dir.display());
    }
    for layer in ["disk/upper", "disk/work", "disk/root", "disk", "root"] {
        assert!(!fx.state.join(layer).exists(), "{layer} survived destroy");
    }
}

/// Run by the sandbox user (uid 1000) inside cgroup `a/b` below the delegated one, which it
/// reaches through the agent's fd 4 (inherited here on purpose: the real agent never lets a
/// command have it). Prints every way out that worked; nothing, if the delegation is right.
const ESCAPE_SCRIPT: &str = r#"
cg=/proc/self/fd/4
for f in cgroup.procs tasks cgroup.threads a/cgroup.procs a/tasks a/b/cgroup.procs; do
    [ -e "$cg/$f" ] || continue
    if (echo $$ > "$cg/$f") 2>/dev/null; then echo "moved through $f"; fi
done
mkdir "$cg/mine" 2>/dev/null && echo "made a cgroup"
grep -q ':/a/b$' /proc/self/cgroup || echo "left a/b: $(cat /proc/self/cgroup)"
setsid sleep 1000 </dev/null >/dev/null 2>&1 &
"#;

/// The cgroup delegated for the agent's commands, in each hierarchy it can be in: the guest's
/// root creates cgroups below it and moves processes in, the sandbox user cannot move out or
/// create any, nobody in the guest can write its limit files or reach its parent, and destroy
/// removes whatever the guest made below it.
fn exec_cgroup_delegation() {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mounted = |fs: &str, option: &str| {
        mounts.lines().any(|l| {
            l.split_once(" - ").is_some_and(|(_, after)| {
                let mut f = after.split(' ');
                f.next() == Some(fs) && f.nth(1).is_some_and(|o| o.contains(option))
            })
        })
    };
    let fx = Fixture::new();
    std::fs::write(fx.image.join("etc/escape.sh"), ESCAPE_SCRIPT).expect("script");
    for (choice, available) in [
        ("v2", mounted("cgroup2", "")),
        ("freezer", mounted("cgroup", "freezer")),
        ("pids", mounted("cgroup", "pids")),
    ] {
        if !available {
            println!("note: no {choice} hierarchy mounted; its delegation is not tested");
            continue;
        }
        delegation_in(&fx, &format!("deleg-{choice}"), choice);
    }
}

fn delegation_in(fx: &Fixture, name: &str, hierarchy: &str) {
    use std::os::unix::fs::MetadataExt;
    let spec = JailSpec {
        exec_cgroup: Some(hierarchy.to_owned()),
        ..fx.spec(name)
    };
    let mut guest = Guest::spawn(&spec);
    let owner = |p: &Path| std::fs::metadata(p).map(|m| m.uid()).expect("stat");
    let delegated: Vec<_> = guest
        .jail()
        .cgroup_paths()
        .into_iter()
        .filter(|dir| owner(dir) == ROOT_MODE_HOST_BASE)
        .collect();
    let [dir] = &delegated[..] else {
        panic!("{name}: one cgroup is the guest root's, found {delegated:?}");
    };
    assert_eq!(owner(&dir.join("cgroup.procs")), ROOT_MODE_HOST_BASE);
    let limit = ["pids.max", "cgroup.max.descendants", "freezer.state"]
        .iter()
        .find(|f| dir.join(f).exists())
        .expect("a file the guest must not write");
    assert_eq!(owner(&dir.join(limit)), 0, "{limit} stays host root's");

    let cg = "/proc/self/fd/4";
    sh_ok(&mut guest, &format!("mkdir {cg}/a {cg}/a/b"));
    let (status, out) = guest.sh(&format!("echo 1 > {cg}/{limit}"));
    assert_ne!(
        status, "exit=0",
        "{name}: the guest root wrote {limit}: {out}"
    );
    // `..` stops at the delegated cgroup: the sandbox's own name, a sibling there, is unseen.
    assert_eq!(
        sh_ok(
            &mut guest,
            &format!("test -d {cg}/../a && test ! -e {cg}/../{name} && echo contained")
        ),
        "contained
"
    );
    let out = sh_ok(
        &mut guest,
        &format!(
            "echo $$ > {cg}/a/b/cgroup.procs && exec setpriv --reuid 1000 --regid 1000              --clear-groups /bin/sh /etc/escape.sh"
        ),
    );
    assert_eq!(out, "", "{name}: the sandbox user got out");
    let nested = dir.join("a/b");
    let survivor = read_trimmed(&nested.join("cgroup.procs"));
    assert!(!survivor.is_empty(), "{name}: the sleeper runs in a/b");

    guest.destroy();
    assert!(!dir.exists(), "{name}: {} survived destroy", dir.display());
    for pid in survivor.split_whitespace() {
        let pid: i32 = pid.parse().expect("pid");
        assert_eq!(
            host_uid(pid),
            None,
            "{name}: process {pid} survived destroy"
        );
    }
}

/// Role of the helper process in `supervisor_death`: spawn a jail, report its pid, wait to
/// be killed.
pub fn spawner_role() -> i32 {
    let image = std::env::var_os("DYNOCAP_JAIL_IMAGE").expect("image");
    let state = std::env::var_os("DYNOCAP_JAIL_STATE").expect("state");
    let fx = Fixture::at(image.into(), state.into());
    let mut jail = Jail::spawn(&fx.spec("orphan-test")).expect("spawn");
    let _channel = jail.take_channel();
    println!("pid={}", jail.pid());
    std::mem::forget(jail); // Never destroyed: this process gets SIGKILLed.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn supervisor_death() {
    let fx = Fixture::new();
    let mut spawner = Command::new(std::env::current_exe().expect("exe"))
        .env("DYNOCAP_JAIL_ROLE", "spawner")
        .env("DYNOCAP_JAIL_IMAGE", &fx.image)
        .env("DYNOCAP_JAIL_STATE", &fx.state)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawner");
    let mut line = String::new();
    std::io::BufReader::new(spawner.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("pid line");
    let pid: i32 = line
        .trim()
        .strip_prefix("pid=")
        .and_then(|p| p.parse().ok())
        .expect("pid");
    let pidfd = pidfd_open(pid);
    let cgroup_leaves: Vec<_> = ["cpu", "memory", "pids", "unified"]
        .iter()
        .map(|h| {
            Path::new("/sys/fs/cgroup")
                .join(h)
                .join("dynocap/orphan-test")
        })
        .filter(|p| p.exists())
        .collect();
    assert!(!cgroup_leaves.is_empty());

    spawner.kill().expect("SIGKILL the supervisor");
    spawner.wait().expect("reap the supervisor");
    assert!(
        wait_readable(pidfd.as_fd(), Duration::from_secs(10)),
        "guest survived its supervisor"
    );

    cleanup_leftovers("orphan-test", &fx.state).expect("cleanup_leftovers");
    for leaf in &cgroup_leaves {
        assert!(!leaf.exists(), "{} left after cleanup", leaf.display());
    }
    assert!(!fx.state.exists(), "the emptied state dir is removed");
    // Idempotent.
    cleanup_leftovers("orphan-test", &fx.state).expect("second cleanup");
}

fn setup_errors() {
    let fx = Fixture::new();

    // A missing bind source is refused before anything is created.
    let mut spec = fx.spec("err-test");
    spec.ro_binds.push(RoBind {
        source: "/nonexistent/dir".into(),
        target: "/opt".into(),
    });
    let err = Jail::spawn(&spec).expect_err("missing source");
    println!("missing source error: {err}");
    assert!(err.to_string().contains("/nonexistent/dir"), "{err}");
    assert!(!fx.state.join("disk/upper").exists());

    // A failure inside the guest init comes back as a readable message, and nothing is left.
    let mut spec = fx.spec("err-test");
    spec.ro_binds.push(RoBind {
        source: "/usr/share".into(),
        target: "/etc/motd".into(),
    });
    let err = Jail::spawn(&spec).expect_err("directory onto a file");
    let text = err.to_string();
    println!("guest setup error: {text}");
    assert!(matches!(err, JailError::GuestSetup(_)), "{text}");
    assert!(
        text.contains("/usr/share") && text.contains("/etc/motd"),
        "{text}"
    );
    assert!(
        !fx.state.join("disk/upper").exists(),
        "layers left after a failed spawn"
    );
    assert!(
        !Path::new("/sys/fs/cgroup/pids/dynocap/err-test").exists(),
        "cgroup left after a failed spawn"
    );
    assert!(!Path::new("/sys/fs/cgroup/unified/dynocap/err-test").exists());

    // A leftover cgroup is reported with the way out, which works.
    let leftover = Path::new("/sys/fs/cgroup/pids/dynocap/err-test");
    std::fs::create_dir_all(leftover).expect("fake leftover");
    let err = Jail::spawn(&fx.spec("err-test")).expect_err("leftover");
    println!("leftover error: {err}");
    assert!(err.to_string().contains("cleanup_leftovers"), "{err}");
    // The disk and its layers were built beside the failing cgroups, and are gone with them.
    assert!(
        !fx.state.join("disk/upper").exists(),
        "layers left after the cgroups failed"
    );
    assert!(
        !Path::new("/sys/fs/cgroup/memory/dynocap/err-test").exists(),
        "a cgroup of another hierarchy left after the cgroups failed"
    );
    cleanup_leftovers("err-test", &fx.state).expect("cleanup");
    std::fs::create_dir_all(&fx.state).expect("state dir again");
    let mut guest = Guest::spawn(&fx.spec("err-test"));
    assert_eq!(guest.facts().get("pid").map(String::as_str), Some("1"));
    guest.destroy();

    // Invalid names and limits.
    let mut spec = fx.spec("../escape");
    assert!(matches!(Jail::spawn(&spec), Err(JailError::InvalidSpec(_))));
    spec.name = "ok".into();
    spec.limits.cpu_millis = 0;
    assert!(matches!(Jail::spawn(&spec), Err(JailError::InvalidSpec(_))));
}

fn single_thread_required() {
    let fx = Fixture::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let _ = rx.recv();
    });
    let err = Jail::spawn(&fx.spec("thread-test")).expect_err("must refuse");
    assert!(
        matches!(err, JailError::NotSingleThreaded { threads: 2 }),
        "{err}"
    );
    drop(tx);
    thread.join().expect("join");
    assert!(!fx.state.join("disk/upper").exists());
}

fn script_agent() {
    let fx = Fixture::new();
    let script = fx.tmp.path().join("agent.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"hello $* uid=$(id -u) host=$(hostname)\" >&3\nread line <&3\n",
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let mut spec = fx.spec("script-test");
    spec.agent_binary = script;
    spec.agent_args = vec!["extra".into()];
    let mut jail = Jail::spawn(&spec).expect("spawn");
    let stream = std::os::unix::net::UnixStream::from(jail.take_channel().expect("channel"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut line = String::new();
    std::io::BufReader::new(&stream)
        .read_line(&mut line)
        .expect("hello");
    assert_eq!(
        line.trim(),
        "hello --channel-fd 3 --cgroup-fd 4 extra uid=0 host=script-test"
    );
    jail.destroy().expect("destroy");
}

fn unprivileged_caller_gets_a_hint() {
    let fx = Fixture::new();
    // Let an unprivileged user reach the fixture.
    for dir in [fx.tmp.path(), fx.state.as_path()] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    std::os::unix::fs::chown(&fx.state, Some(65534), Some(65534)).expect("chown");
    let out = Command::new(std::env::current_exe().expect("exe"))
        .env("DYNOCAP_JAIL_ROLE", "unprivileged")
        .env("DYNOCAP_JAIL_IMAGE", &fx.image)
        .env("DYNOCAP_JAIL_STATE", &fx.state)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("unprivileged child");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("cannot create cgroup /sys/fs/cgroup/"),
        "{text}"
    );
    assert!(text.contains("run the supervisor as root"), "{text}");
}

/// Role of the helper in `unprivileged_caller_gets_a_hint`: try, print the error.
pub fn unprivileged_role() -> i32 {
    let image = std::env::var_os("DYNOCAP_JAIL_IMAGE").expect("image");
    let state = std::env::var_os("DYNOCAP_JAIL_STATE").expect("state");
    let fx = Fixture::at(image.into(), state.into());
    let mut spec = fx.spec("rootless-test");
    spec.guest_dirs.clear();
    match Jail::spawn(&spec) {
        Ok(jail) => {
            let _ = jail.destroy();
            println!("unexpectedly spawned");
            1
        }
        Err(e) => {
            println!("{e}");
            0
        }
    }
}

fn probe_reports_ready() {
    let report = probe();
    println!("{report:#?}");
    assert!(report.ready(), "{report:#?}");
}

fn pidfd_open(pid: i32) -> OwnedFd {
    dynocap_cgroup::pidfd::pidfd_open(nix::unistd::Pid::from_raw(pid))
        .unwrap_or_else(|err| panic!("pidfd_open({pid}) failed: {err}"))
}

fn wait_readable(fd: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16)).unwrap_or(0) > 0 {
            return true;
        }
    }
    false
}

/// The cgroup parents `dynocap/` of the v1 cpu, memory and pids hierarchies, chowned to an
/// unprivileged user for the guard's lifetime (how an administrator delegates them).
struct Delegated(Vec<(std::path::PathBuf, u32, u32)>);

impl Delegated {
    fn to(uid: u32) -> Delegated {
        let mut saved = Vec::new();
        for controller in ["cpu", "memory", "pids"] {
            let dir = Path::new("/sys/fs/cgroup").join(controller).join("dynocap");
            if !dir.parent().is_some_and(Path::is_dir) {
                continue;
            }
            std::fs::create_dir_all(&dir).expect("dynocap cgroup");
            let meta = std::fs::metadata(&dir).expect("stat");
            use std::os::unix::fs::MetadataExt;
            saved.push((dir.clone(), meta.uid(), meta.gid()));
            for entry in [dir.clone(), dir.join("cgroup.procs")] {
                std::os::unix::fs::chown(&entry, Some(uid), Some(uid)).expect("chown");
            }
        }
        Delegated(saved)
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        for (dir, uid, gid) in &self.0 {
            let _ = std::os::unix::fs::chown(dir, Some(*uid), Some(*gid));
            let _ = std::os::unix::fs::chown(dir.join("cgroup.procs"), Some(*uid), Some(*gid));
        }
    }
}

fn rootless_with_delegated_cgroups() {
    if !Path::new("/sys/fs/cgroup/pids").is_dir() {
        println!("note: no v1 pids hierarchy; delegation test needs the v1 layout");
        return;
    }
    let fx = Fixture::new();
    for dir in [fx.tmp.path(), fx.state.as_path()] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    std::os::unix::fs::chown(&fx.state, Some(65534), Some(65534)).expect("chown");
    let delegated = Delegated::to(65534);
    let out = Command::new(std::env::current_exe().expect("exe"))
        .env("DYNOCAP_JAIL_ROLE", "rootless")
        .env("DYNOCAP_JAIL_IMAGE", &fx.image)
        .env("DYNOCAP_JAIL_STATE", &fx.state)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("rootless child");
    drop(delegated);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("rootless ok"), "{text}");
}

/// Role of the helper in `rootless_with_delegated_cgroups`: a full jail as an unprivileged
/// user (uid 65534), whose ids appear as guest 1000.
pub fn rootless_role() -> i32 {
    let image = std::env::var_os("DYNOCAP_JAIL_IMAGE").expect("image");
    let state = std::env::var_os("DYNOCAP_JAIL_STATE").expect("state");
    let fx = Fixture::at(image.into(), state.into());
    let mut spec = fx.spec("rootless-ok");
    // Only guest 1000 exists: the image's root-owned /root cannot be given to anyone.
    spec.guest_dirs = vec![dynocap_backend_jail::GuestDir {
        path: "/workspace".into(),
        uid: 1000,
        gid: 1000,
        mode: 0o755,
    }];
    let mut guest = Guest::spawn(&spec);
    assert!(guest.jail().id_map().is_rootless());
    assert_eq!(guest.jail().id_map().to_host(1000), Some(65534));
    let f = guest.facts();
    let fact = |k: &str| f.get(k).cloned().unwrap_or_default();
    assert_eq!(fact("pid"), "1");
    assert_eq!(fact("uid_map"), "1000 65534 1");
    assert_eq!(fact("Uid"), "1000 1000 1000 1000");
    assert_eq!(fact("hostname"), "rootless-ok");
    assert_eq!(fact("lo"), "up");
    assert_eq!(fact("Seccomp"), "2");
    assert_eq!(fact("NoNewPrivs"), "1");
    assert_eq!(fact("CapBnd"), format!("{:016x}", docker_default_mask()));
    assert_eq!(
        fact("CapEff"),
        "0000000000000000",
        "a non-root guest init keeps no capabilities"
    );
    sh_ok(&mut guest, "echo hi > /workspace/f && echo t > /tmp/t");
    assert_eq!(read_trimmed(&fx.state.join("disk/upper/workspace/f")), "hi");
    let (status, result) = guest.probe("mount");
    assert_eq!((status.as_str(), result.as_str()), ("exit=0", "EPERM"));
    let cgroups = guest.jail().cgroup_paths();
    guest.destroy();
    for dir in cgroups {
        assert!(!dir.exists(), "{} survived destroy", dir.display());
    }
    println!("rootless ok");
    0
}
