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
