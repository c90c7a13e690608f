//! What a guest can see and do: not host root, no host home, only its own processes, only
//! loopback, no mounts or new namespaces, no_new_privs and seccomp in force.

use dynocap_e2e::*;

#[test]
fn isolation_facts_inside_the_guest() {
    if !require_root("isolation_facts_inside_the_guest") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("iso", &[]);

    // Guest uid 1000 is an unprivileged host uid, and guest root is not host root.
    let uid_map = home.sh("iso", "cat /proc/self/uid_map");
    let first: Vec<u64> = uid_map
        .split_whitespace()
        .take(3)
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(first[0], 0);
    assert_ne!(first[1], 0, "guest root maps to host root: {uid_map}");
    assert_eq!(home.sh("iso", "id -u; id -g"), "1000\n1000\n");

    // No host home directory.
    std::fs::write("/root/.dynocap-canary", "secret").ok();
    let homes = home.exec("iso", &[], "ls -A /root /home; cat /root/.dynocap-canary");
    assert!(
        !homes["stdout"].as_str().unwrap().contains("canary"),
        "{homes}"
    );
    assert_ne!(homes["exitCode"], 0);
    assert_eq!(home.sh("iso", "ls -A /home"), "sandbox\n");

    // Only guest processes: PID 1 is the agent.
    let ps = home.sh("iso", "ps -eo pid=,comm=");
    let first_line = ps.lines().next().unwrap().trim().to_owned();
    assert!(
        first_line.starts_with("1 ") && first_line.contains("agent"),
        "{ps}"
    );
    assert!(ps.lines().count() <= 4, "host processes visible: {ps}");

    // Only loopback, and it is up.
    let interfaces: Vec<String> = home
        .sh("iso", "cat /proc/net/dev")
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|name| name.trim().to_owned())
        .collect();
    assert_eq!(interfaces, ["lo"]);
    let link = home.sh("iso", "ip -o link show lo");
    assert!(link.contains("UP"), "loopback is up: {link}");
    // Tools behind Debian's alternatives work (/usr/bin/awk -> /etc/alternatives/awk).
    assert_eq!(home.sh("iso", "echo a:b | awk -F: '{print $2}'"), "b\n");

    // Mounts and new user namespaces are refused; bpf is refused by seccomp.
    assert_ne!(
        home.exec("iso", &[], "mount -t tmpfs none /tmp")["exitCode"],
        0
    );
    let unshare = home.exec("iso", &[], "unshare -U true");
    assert_ne!(unshare["exitCode"], 0, "{unshare}");
    let bpf = home.sh("iso", "perl -e 'syscall(321, 0, 0, 0); print $!+0'");
    assert_eq!(bpf, "1", "bpf fails with EPERM");
    // The x32 ABI (syscall number | 0x40000000) kills the process.
    let x32 = home.exec("iso", &[], "exec perl -e 'syscall(0x40000027)'");
    assert_eq!(x32["signal"], "SIGSYS", "{x32}");

    let status = home.sh("iso", "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");

    // The host's system directories are read-only.
    assert_ne!(home.exec("iso", &[], "touch /usr/bin/evil")["exitCode"], 0);
    let _ = std::fs::remove_file("/root/.dynocap-canary");
}

/// The seccomp filter is an allowlist: syscalls nobody listed fail, whether the old denylist
/// named them or not (`kcmp`, `get_mempolicy` worked before), a number no kernel has yet gets
/// ENOSYS, and the ordinary workload (sh, git, python) still runs under it.
#[test]
fn syscalls_outside_the_allowlist_fail_and_the_workload_runs() {
    if !require_root("syscalls_outside_the_allowlist_fail_and_the_workload_runs") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("sc", &[]);
    // Each call with harmless arguments: what matters is the errno the filter gives.
    let probe = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(256)
calls = {
    "kexec_load": (246, 0, 0, 0, 0),
    "open_by_handle_at": (304, -100, ctypes.addressof(buf), 0),
    "name_to_handle_at": (303, -100, ctypes.addressof(buf), ctypes.addressof(buf), ctypes.addressof(buf), 0),
    "bpf": (321, 0, 0, 0),
    "userfaultfd": (323, 0),
    "perf_event_open": (298, ctypes.addressof(buf), 0, -1, -1, 0),
    "keyctl": (250, 0, -3, 0),
    "add_key": (248, 0, 0, 0, 0, 0),
    "io_uring_setup": (425, 1, ctypes.addressof(buf)),
    "mount": (165, 0, 0, 0, 0, 0),
    "unshare_newuser": (272, 0x10000000),
    "clone_newns": (56, 0x00020000 | 17, 0, 0, 0, 0),
    "setns": (308, 0, 0),
    "kcmp": (312, os.getpid(), os.getpid(), 0, 0, 0),
    "get_mempolicy": (239, 0, 0, 0, 0, 0),
    "sethostname": (170, ctypes.addressof(buf), 1),
    "clone3": (435, 0, 0),
    "made_up_1000": (1000,),
}
for name, (nr, *args) in calls.items():
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    code = errno.errorcode.get(ctypes.get_errno(), "0") if ret == -1 else "ok"
    print(f"{name}={code}")
"#;
    let out = home.sh("sc", &format!("python3 -c '{probe}'"));
    let results: std::collections::BTreeMap<&str, &str> = out
        .lines()
        .filter_map(|line| line.split_once('='))
        .collect();
    for (name, want) in [
        ("kexec_load", "EPERM"),
        ("open_by_handle_at", "EPERM"),
        ("name_to_handle_at", "EPERM"),
        ("bpf", "EPERM"),
        ("userfaultfd", "EPERM"),
        ("perf_event_open", "EPERM"),
        ("keyctl", "EPERM"),
        ("add_key", "EPERM"),
        ("io_uring_setup", "EPERM"),
        ("mount", "EPERM"),
        ("unshare_newuser", "EPERM"),
        ("clone_newns", "EPERM"),
        ("setns", "EPERM"),
        ("kcmp", "EPERM"),
        ("get_mempolicy", "EPERM"),
        ("sethostname", "EPERM"),
        ("clone3", "ENOSYS"),
        ("made_up_1000", "ENOSYS"),
    ] {
        assert_eq!(results.get(name).copied(), Some(want), "{name}: {out}");
    }

    // The ordinary workload: a shell pipeline, git with a commit, python with threads and a
    // subprocess, sockets on loopback, a pty.
    let work = home.sh(
        "sc",
        "set -e; cd /tmp && git init -q w && cd w && echo hi > f && git add f && \
         git -c user.email=a@b -c user.name=a commit -qm one && git log --oneline | wc -l; \
         python3 -c 'import threading, subprocess, socket, os, pty, tempfile
t = threading.Thread(target=lambda: None); t.start(); t.join()
print(subprocess.run([\"sh\", \"-c\", \"echo sub\"], capture_output=True, text=True).stdout.strip())
s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); c = socket.create_connection(s.getsockname()); print(\"tcp\")
m, sl = pty.openpty(); print(os.ttyname(sl).startswith(\"/dev/pts/\"))'",
    );
    assert_eq!(work, "1\nsub\ntcp\nTrue\n");
}

/// Every live sandbox maps its guest ids to its own host range, so what one guest owns is
/// owned by ids no other guest holds.
#[test]
fn live_sandboxes_get_disjoint_host_id_ranges() {
    if !require_root("live_sandboxes_get_disjoint_host_id_ranges") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("ida", &[]);
    home.sandbox("idb", &[]);
    let range = |name: &str| -> (u32, u32) {
        let map = home.sh(name, "cat /proc/1/uid_map");
        let fields: Vec<u32> = map.split_whitespace().map(|v| v.parse().unwrap()).collect();
        assert_eq!(fields.len(), 3, "one mapping line: {map}");
        assert_eq!(fields[0], 0, "{map}");
        assert_eq!(home.sh(name, "cat /proc/1/gid_map"), map, "gids as uids");
        (fields[1], fields[1] + fields[2])
    };
    let (a, b) = (range("ida"), range("idb"));
    assert!(a.1 <= b.0 || b.1 <= a.0, "ranges overlap: {a:?} {b:?}");
    for r in [a, b] {
        assert!(
            GUEST_UID_POOL.contains(&r.0) && r.1 <= GUEST_UID_POOL.end,
            "{r:?}"
        );
    }

    // A file the sandbox user writes in one belongs, on the host, to a uid outside the other's
    // map; and the state directory records the range.
    home.sh("ida", "echo mine > /home/sandbox/owned");
    let state = home.path().join("sandboxes").join(home.sandbox_id("ida"));
    // The upper layer lives on the sandbox's own disk, mounted in its supervisor's mount
    // namespace only: look at it through that namespace.
    let supervisor: i32 = sqlite(
        home.path(),
        "SELECT supervisor_pid FROM sandboxes WHERE name = 'ida'",
    )
    .trim()
    .parse()
    .unwrap();
    let in_namespace = std::path::PathBuf::from(format!("/proc/{supervisor}/root"))
        .join(state.strip_prefix("/").unwrap());
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(in_namespace.join("disk/upper/home/sandbox/owned")).unwrap(),
    );
    assert_eq!(owner, a.0 + 1000);
    assert!(!(b.0..b.1).contains(&owner), "{owner} inside {b:?}");
    let index: u32 = std::fs::read_to_string(state.join("idrange"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(a.0, 1_000_000 + index * 65_536);

    // A destroyed sandbox's range goes back to the pool; a live one's is never handed out.
    home.json(&["destroy", "ida"]);
    assert!(
        wait_until(20, || !state.exists()),
        "the state dir goes with the sandbox"
    );
    home.sandbox("idc", &[]);
    let c = range("idc");
    assert_eq!(c, a, "the freed range is reused");
    assert_ne!(c, range("idb"));
}

fn sqlite(home: &std::path::Path, query: &str) -> String {
    let out = std::process::Command::new("sqlite3")
        .arg(home.join("catalog.db"))
        .arg(query)
        .output()
        .expect("sqlite3 is installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The guest's /sys: its own network namespace's sysfs, read-only everywhere, runc's masks in
/// place, and the sandbox's cgroups at /sys/fs/cgroup, where runtimes size themselves.
#[test]
fn sysfs_is_read_only_masked_and_shows_the_sandboxs_limits() {
    if !require_root("sysfs_is_read_only_masked_and_shows_the_sandboxs_limits") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("sys", &["--cpus", "1", "--memory-mb", "300"]);

    // Every mount at or below /sys is read-only, nosuid, nodev and noexec.
    let mounts = home.sh(
        "sys",
        "awk '$5 == \"/sys\" || index($5, \"/sys/\") == 1 { print $5, $6 }' /proc/self/mountinfo",
    );
    assert!(
        mounts.lines().count() >= 3,
        "sysfs, a mask, cgroups: {mounts}"
    );
    for line in mounts.lines() {
        let options: Vec<&str> = line.split_whitespace().nth(1).unwrap().split(',').collect();
        for flag in ["ro", "nosuid", "nodev", "noexec"] {
            assert!(options.contains(&flag), "{flag} missing: {line}\n{mounts}");
        }
    }
    let fs_type = home.sh("sys", "stat -f -c %T /sys");
    assert_eq!(fs_type, "sysfs\n");

    // Writes fail, to sysfs and to the cgroup files alike.
    for path in [
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/fs/cgroup/new-file",
        "/sys/class/net/lo/mtu",
    ] {
        let write = home.exec("sys", &[], &format!("echo 1 > {path}"));
        assert_ne!(write["exitCode"], 0, "{path}: {write}");
    }

    // Only the guest's network interfaces.
    assert_eq!(home.sh("sys", "ls /sys/class/net"), "lo\n");

    // Masked: firmware tables and the energy counters.
    assert_eq!(home.sh("sys", "ls -A /sys/firmware | wc -l"), "0\n");
    assert_eq!(home.sh("sys", "stat -f -c %T /sys/firmware"), "tmpfs\n");

    // The memory limit, where a v2 (memory.max) or v1 (memory/memory.limit_in_bytes) reader
    // looks for it.
    let memory = home.sh(
        "sys",
        "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    );
    assert_eq!(memory.trim(), (300u64 << 20).to_string());

    // CPUs the way the JVM computes them: quota / period from cpu.max (v2) or the CFS files
    // (v1), rounded up.
    let cpus = home.sh(
        "sys",
        "if [ -f /sys/fs/cgroup/cpu.max ]; then read quota period < /sys/fs/cgroup/cpu.max; \
         else quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us); \
         period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us); fi; \
         echo $(( (quota + period - 1) / period ))",
    );
    assert_eq!(cpus, "1\n");
}

/// A host whose own /sys is partly hidden (a container runtime masks /sys/firmware) cannot
/// give a user namespace a new sysfs: the sandbox starts without /sys, and the supervisor's
/// log says why.
#[test]
fn a_host_hiding_part_of_its_sys_runs_sandboxes_without_one() {
    if !require_root("a_host_hiding_part_of_its_sys_runs_sandboxes_without_one") {
        return;
    }
    let home = TestHome::new();
    // dynocap (and the supervisor it starts) in a mount namespace of its own, with
    // /sys/firmware covered as Docker covers it; nothing changes on the host.
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o ro none /sys/firmware && exec "$@""#)
        .arg("sh")
        .arg(dynocap_bin())
        .args(["--json", "run", "nosys"])
        .env("DYNOCAP_HOME", home.path())
        .env_remove("DYNOCAP_BACKEND")
        .output()
        .expect("unshare is installed (util-linux)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(home.sh("nosys", "ls -A /sys | wc -l"), "0\n");
    assert_eq!(home.sh("nosys", "echo works"), "works\n");
    let id = home.sandbox_id("nosys");
    let log = std::fs::read_to_string(home.log_path(&id)).expect("the supervisor's log");
    assert!(log.contains("the guest has no /sys"), "{log}");
}

/// Nothing in a guest's /sys or /proc names its host: not the paths of the homes (its own or
/// another's), not the disk image of another home's sandbox (which the host's loop devices
/// name), not the host's block devices, not the machine's DMI identifiers; and the covers
/// that hide them stay, even for the guest's root. The guest's own tools still work.
#[test]
fn a_guest_sees_no_host_device_path_or_identifier() {
    let test = "a_guest_sees_no_host_device_path_or_identifier";
    if !require_root(test) || !dynocap_e2e::images::require_mmdebstrap(test) {
        return;
    }
    // A debian guest, whose sudo gives the search the guest's root too, and a sandbox of
    // another home, whose disk image sits on a host loop device while the search runs.
    let (home, _) = dynocap_e2e::images::debian_home();
    home.sandbox("seer", &["--image", "debian"]);
    let other = TestHome::new();
    other.sandbox("other", &[]);
    let facts = dynocap_e2e::host_view::HostFacts::read();
    let other_disk = facts
        .loop_backing_files
        .iter()
        .find(|file| file.starts_with(&*other.path().to_string_lossy()))
        .unwrap_or_else(|| panic!("no host loop device holds the other home's disk: {facts:?}"));

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
    let devices: std::collections::BTreeSet<String> = facts.block_devices.iter().cloned().collect();
    eprintln!("searching for {anywhere:?}, devices {devices:?}; the other disk is {other_disk}");

    for (guest, searcher, as_root) in [
        (&home, "seer", false),
        (&home, "seer", true),
        (&other, "other", false),
    ] {
        let search = dynocap_e2e::host_view::search(guest, searcher, as_root, &anywhere, &devices);
        eprintln!(
            "{searcher} (root: {as_root}): {} names, {} files read, found {:?}",
            search.names, search.files, search.found
        );
        assert!(
            search.found.is_empty(),
            "{searcher} (root: {as_root}) sees the host: {:#?}",
            search.found
        );
    }

    // Nothing to list, and nothing the guest's root can uncover: no unmount, no new sysfs.
    assert_eq!(
        home.sh("seer", "ls -A /sys/block /sys/dev/block /sys/class/block"),
        "/sys/block:\n\n/sys/class/block:\n\n/sys/dev/block:\n"
    );
    for undo in [
        "sudo umount /sys/block",
        "sudo umount -l /sys/devices",
        "sudo mount -t sysfs sysfs /mnt",
        "sudo umount /proc/partitions",
    ] {
        let result = home.exec("seer", &[], undo);
        assert_ne!(result["exitCode"], 0, "{undo}: {result}");
    }
    assert_eq!(
        home.sh("seer", "ls -A /sys/block | wc -l; wc -c < /proc/partitions"),
        "0\n0\n"
    );

    // The guest's tools: its own mounts and disk, its processes, memory and CPUs.
    let tools = home.sh(
        "seer",
        "df -P / | tail -1 | awk '{print $6}'; mount | grep -c ' on / '; findmnt -n -o TARGET /; \
         lsblk && echo lsblk ok; nproc; lscpu | grep -c '^CPU(s):'",
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(tools, format!("/\n1\n/\nlsblk ok\n{cpus}\n1\n"), "{tools}");
    let procps = other.sh(
        "other",
        "ps -e -o comm= | grep -c agent; top -b -n 1 | grep -c '^Tasks:'; \
         free -m | grep -c '^Mem:'",
    );
    assert_eq!(procps, "1\n1\n1\n");
}
