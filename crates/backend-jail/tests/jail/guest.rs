//! The test binary's guest side. Bound in as `/.dynocap/agent`, it is the jail's PID 1: it
//! answers line commands on fd 3 with facts about its world (`facts`), shell runs (`sh`) and
//! probes (`probe`: the same binary re-run as a child, so that a probe the seccomp filter
//! kills takes only itself down). Probes print `result=<errno name|ok|value>`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

use nix::errno::Errno;

/// Renders how a child ended: `exit=N` or `signal=N`.
pub fn status_of(output: &Output) -> String {
    match (output.status.code(), output.status.signal()) {
        (Some(code), _) => format!("exit={code}"),
        (None, Some(sig)) => format!("signal={sig}"),
        _ => "unknown".to_owned(),
    }
}

/// Open fds among 0..64, found without opening any.
fn open_fds() -> Vec<i32> {
    (0..64)
        // SAFETY: F_GETFD only queries flags of a number; unused numbers give EBADF.
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0)
        .collect()
}

/// Entry point when run as `/.dynocap/agent --channel-fd 3 ...`.
pub fn agent_main(args: &[String]) -> i32 {
    let fds_at_start = open_fds();
    assert_eq!(
        args.get(1..3),
        Some(&["--channel-fd".to_owned(), "3".to_owned()][..])
    );
    // SAFETY: fd 3 is the channel the jail handed us; nothing else in this process owns it.
    let stream = unsafe { UnixStream::from_raw_fd(3) };
    let mut writer = stream.try_clone().expect("clone channel");
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        let Ok(line) = line else { break };
        let (cmd, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let reply = match cmd {
            "facts" => facts(&fds_at_start),
            "sh" => {
                let out = Command::new("/bin/sh").arg("-c").arg(rest).output();
                match out {
                    Ok(out) => format!(
                        "status={}\n{}{}",
                        status_of(&out),
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                    Err(e) => format!("status=spawn-error\n{e}"),
                }
            }
            "probe" => {
                let out = Command::new("/.dynocap/agent")
                    .arg("guest-probe")
                    .args(rest.split_whitespace())
                    .output();
                match out {
                    Ok(out) => format!(
                        "status={}\n{}{}",
                        status_of(&out),
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                    Err(e) => format!("status=spawn-error\n{e}"),
                }
            }
            "exit" => {
                let _ = writer.write_all(b"3\nbye");
                return 0;
            }
            other => format!("unknown command {other}"),
        };
        let framed = format!("{}\n{reply}", reply.len());
        if writer.write_all(framed.as_bytes()).is_err() {
            break;
        }
    }
    0
}

fn status_fields() -> BTreeMap<String, String> {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| {
            (
                k.to_owned(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect()
}

fn lo_flags() -> String {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return format!("socket: {}", Errno::last());
    }
    // SAFETY: zeroed ifreq is valid; SIOCGIFFLAGS fills the flags for the named interface.
    let flags = unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        let ret = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        libc::close(fd);
        if ret < 0 {
            return format!("ioctl: {}", Errno::last());
        }
        req.ifr_ifru.ifru_flags
    };
    let up = libc::c_short::try_from(libc::IFF_UP).unwrap_or(1);
    if flags & up != 0 {
        "up".to_owned()
    } else {
        "down".to_owned()
    }
}

fn facts(fds_at_start: &[i32]) -> String {
    let mut out = BTreeMap::new();
    let join = |v: Vec<String>| v.join(",");
    out.insert("pid", std::process::id().to_string());
    out.insert(
        "fds",
        join(fds_at_start.iter().map(i32::to_string).collect()),
    );
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|e| format!("error: {e}"))
    };
    out.insert("uid_map", read("/proc/self/uid_map"));
    out.insert("gid_map", read("/proc/self/gid_map"));
    out.insert("hostname", read("/proc/sys/kernel/hostname"));
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    out.insert("procs", join(pids.iter().map(u32::to_string).collect()));
    let cmdline = std::fs::read("/proc/1/cmdline").unwrap_or_default();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    out.insert("cmdline1", String::from_utf8_lossy(argv0).into_owned());
    let netdevs: Vec<String> = std::fs::read_to_string("/proc/net/dev")
        .unwrap_or_default()
        .lines()
        .skip(2)
        .filter_map(|l| Some(l.split_once(':')?.0.trim().to_owned()))
        .collect();
    out.insert("netdevs", join(netdevs));
    out.insert("lo", lo_flags());
    let status = status_fields();
    for key in [
        "NoNewPrivs",
        "Seccomp",
        "CapBnd",
        "CapEff",
        "CapPrm",
        "CapInh",
        "CapAmb",
        "Uid",
        "Gid",
        "Groups",
    ] {
        out.insert(key, status.get(key).cloned().unwrap_or_default());
    }
    out.insert("cgroup", read("/proc/self/cgroup"));
    let mut env: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    env.sort();
    out.insert("env", join(env));
    out.insert(
        "fd0",
        std::fs::read_link("/proc/self/fd/0")
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
    );
    out.insert("ppid", nix::unistd::getppid().to_string());
    out.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

fn errno_result(ret: libc::c_long) -> String {
    if ret < 0 {
        format!("{:?}", Errno::last())
    } else {
        "ok".to_owned()
    }
}

fn int_result(ret: libc::c_int) -> String {
    errno_result(libc::c_long::from(ret))
}

/// i386 `getpid` through `int 0x80`: the 32-bit ABI, which the filter's arch check kills.
fn int80_getpid() -> i64 {
    let ret: i64;
    // SAFETY: i386 getpid (20) takes no arguments and touches no memory; the kernel's compat
    // entry may clobber r8-r11, declared as outputs.
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inlateout("rax") 20i64 => ret,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            options(nostack)
        );
    }
    ret
}

/// Entry point for `guest-probe <name> [arg]`; prints `result=...`.
pub fn probe_main(args: &[String]) -> i32 {
    let name = args.get(2).map(String::as_str).unwrap_or_default();
    let arg = args.get(3).map(String::as_str).unwrap_or_default();
    let result = match name {
        "mount" => errno_of(nix::mount::mount(
            Some("none"),
            "/tmp",
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )),
        "umount" => errno_of(nix::mount::umount2(
            "/usr",
            nix::mount::MntFlags::MNT_DETACH,
        )),
        "unshare-user" => errno_of(nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)),
        "unshare-net" => errno_of(nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)),
        "unshare-files" => errno_of(nix::sched::unshare(nix::sched::CloneFlags::CLONE_FILES)),
        "setns" => match std::fs::File::open("/proc/self/ns/net") {
            Ok(f) => errno_of(nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)),
            Err(e) => format!("open: {e}"),
        },
        "chroot" => errno_of(nix::unistd::chroot("/")),
        "clone-newuser" => raw_clone(libc::c_long::from(libc::CLONE_NEWUSER | libc::SIGCHLD)),
        "fork" => raw_clone(libc::c_long::from(libc::SIGCHLD)),
        "clone3" => {
            // struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, ...
            let mut clone_args = [0u64; 11];
            clone_args[4] = 17; // SIGCHLD
            let size = std::mem::size_of_val(&clone_args);
            // SAFETY: clone3 reads `size` bytes of clone_args from a live local array.
            let ret = unsafe { libc::syscall(libc::SYS_clone3, clone_args.as_mut_ptr(), size) };
            exit_if_child(ret);
            errno_result(ret)
        }
        // SAFETY: KEYCTL_GET_KEYRING_ID (0) of the session keyring, no pointers.
        "keyctl" => errno_result(unsafe { libc::syscall(libc::SYS_keyctl, 0i64, -3i64, 0i64) }),
        // SAFETY: BPF_MAP_CREATE with a NULL attr: fails before reading memory.
        "bpf" => errno_result(unsafe { libc::syscall(libc::SYS_bpf, 0i64, 0usize, 0u32) }),
        "io_uring" => {
            let mut params = [0u8; 120];
            // SAFETY: io_uring_setup reads/writes a 120-byte io_uring_params in a live local.
            errno_result(unsafe {
                libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr())
            })
        }
        // SAFETY: userfaultfd takes only flags.
        "userfaultfd" => errno_result(unsafe { libc::syscall(libc::SYS_userfaultfd, 0i64) }),
        "personality" => {
            let persona = u64::from_str_radix(arg.trim_start_matches("0x"), 16).unwrap_or(0);
            // SAFETY: personality takes a plain integer.
            errno_result(unsafe { libc::syscall(libc::SYS_personality, persona) })
        }
        "tiocsti" => {
            let c = b'x';
            // SAFETY: TIOCSTI reads one byte from a live local.
            int_result(unsafe { libc::ioctl(0, libc::TIOCSTI, &c) })
        }
        // SAFETY: plain socket(2).
        "vsock" => int_result(unsafe { libc::socket(40, libc::SOCK_STREAM, 0) }),
        // SAFETY: getpid with the x32 bit set: takes no arguments.
        "x32" => errno_result(unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) }),
        "i386" => format!("returned {}", int80_getpid()),
        "alloc" => {
            let mib: usize = arg.parse().unwrap_or(1);
            // Every page written, so it is really charged to the cgroup.
            let v = vec![1u8; mib << 20];
            let sum: u64 = v.iter().step_by(4096).map(|&b| u64::from(b)).sum();
            format!("survived {sum}")
        }
        "forkloop" => forkloop(),
        "pty" => pty(),
        "spin" => {
            // Two busy threads: well over a 0.5-CPU quota even on a loaded 2-core machine.
            let millis = arg.parse().unwrap_or(1000);
            let until = std::time::Instant::now() + std::time::Duration::from_millis(millis);
            let spin = move || {
                let mut n = 0u64;
                while std::time::Instant::now() < until {
                    n = n.wrapping_add(1);
                }
                n
            };
            let other = std::thread::spawn(spin);
            let n = spin().wrapping_add(other.join().unwrap_or(0));
            format!("spun {n}")
        }
        other => format!("unknown probe {other}"),
    };
    println!("result={result}");
    0
}

fn errno_of<T>(r: nix::Result<T>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("{e:?}"),
    }
}

/// fork-style raw clone with `flags`; the child exits at once.
fn raw_clone(flags: libc::c_long) -> String {
    // SAFETY: clone with a NULL stack behaves like fork; the child only calls _exit.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    exit_if_child(ret);
    if ret > 0 {
        let pid = libc::pid_t::try_from(ret).unwrap_or(-1);
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
    errno_result(ret)
}

fn exit_if_child(ret: libc::c_long) {
    if ret == 0 {
        // SAFETY: leaving the forked child without running anything of the parent's.
        unsafe { libc::_exit(0) }
    }
}

/// Opens a pseudo-terminal pair the way a terminal emulator does; reports the slave's name.
fn pty() -> String {
    // SAFETY: posix_openpt/grantpt/unlockpt take an fd; ptsname_r writes into a live local
    // buffer whose length is passed; open takes the NUL-terminated name it wrote.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master < 0 {
            return format!("posix_openpt: {:?}", Errno::last());
        }
        if libc::grantpt(master) != 0 || libc::unlockpt(master) != 0 {
            return format!("grantpt/unlockpt: {:?}", Errno::last());
        }
        let mut name = [0 as libc::c_char; 64];
        if libc::ptsname_r(master, name.as_mut_ptr(), name.len()) != 0 {
            return format!("ptsname_r: {:?}", Errno::last());
        }
        let slave = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if slave < 0 {
            return format!("open slave: {:?}", Errno::last());
        }
        std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

/// Forks children that wait, until fork fails; reports how many and why.
fn forkloop() -> String {
    let mut children = Vec::new();
    let failure = loop {
        if children.len() >= 4096 {
            break "no failure".to_owned();
        }
        // SAFETY: this probe process is single-threaded; the child only calls pause/_exit.
        match unsafe { libc::fork() } {
            0 => loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            },
            -1 => break format!("{:?}", Errno::last()),
            pid => children.push(pid),
        }
    };
    let forked = children.len();
    for pid in children {
        // SAFETY: signalling and reaping our own children.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    format!("forked={forked} error={failure}")
}
