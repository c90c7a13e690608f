//! Process-level set-up that an init has to do: the guest's API filesystems when the agent
//! boots a VM as PID 1, child-subreaper status otherwise, and sane stdio descriptors.
//!
//! In the jail backend the host has already mounted /proc, /dev and /tmp and installed a
//! seccomp filter that forbids mount(2), so every mount here is conditional and a failure is
//! logged, never fatal: a PID 1 that exits takes the guest with it.

use std::collections::HashSet;
use std::path::Path;

use nix::mount::MsFlags;

/// One filesystem the VM guest needs before anything else runs.
struct MountSpec {
    source: &'static str,
    target: &'static str,
    fstype: &'static str,
    flags: MsFlags,
    data: Option<&'static str>,
}

fn guest_mounts() -> [MountSpec; 6] {
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    [
        MountSpec {
            source: "proc",
            target: "/proc",
            fstype: "proc",
            flags: nosuid_nodev | MsFlags::MS_NOEXEC,
            data: None,
        },
        MountSpec {
            source: "sysfs",
            target: "/sys",
            fstype: "sysfs",
            flags: nosuid_nodev | MsFlags::MS_NOEXEC,
            data: None,
        },
        MountSpec {
            source: "devtmpfs",
            target: "/dev",
            fstype: "devtmpfs",
            flags: MsFlags::MS_NOSUID,
            data: Some("mode=0755"),
        },
        MountSpec {
            source: "devpts",
            target: "/dev/pts",
            fstype: "devpts",
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            data: Some("newinstance,ptmxmode=0666,mode=0620"),
        },
        MountSpec {
            source: "tmpfs",
            target: "/tmp",
            fstype: "tmpfs",
            flags: nosuid_nodev,
            data: Some("mode=1777"),
        },
        MountSpec {
            source: "tmpfs",
            target: "/run",
            fstype: "tmpfs",
            flags: nosuid_nodev,
            data: Some("mode=0755"),
        },
    ]
}

/// Prepares the process for its role. Never fails: problems are logged.
pub fn setup() {
    if nix::unistd::getpid().as_raw() == 1 {
        // A missing /proc/self means nobody prepared this root (the VM case); in the jail the
        // host did it all and seccomp would refuse our mount calls anyway.
        if !Path::new("/proc/self").exists() {
            mount_guest_filesystems();
        }
    } else if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        // Without it, orphans of our commands would escape to the real init and the agent could
        // not see (or kill) them.
        log!("cannot become a child subreaper: {err}");
    }
}

fn mount_guest_filesystems() {
    for spec in guest_mounts() {
        // Re-read each time: /proc/self/mountinfo only exists once proc is mounted.
        let mounted = mounted_targets();
        if mounted.contains(spec.target) {
            continue;
        }
        if let Err(err) = std::fs::create_dir_all(spec.target) {
            log!("cannot create {}: {err}", spec.target);
            continue;
        }
        if let Err(err) = nix::mount::mount(
            Some(spec.source),
            spec.target,
            Some(spec.fstype),
            spec.flags,
            spec.data,
        ) {
            log!("cannot mount {} on {}: {err}", spec.fstype, spec.target);
        }
    }
}

/// The mount points of this process's namespace, from `/proc/self/mountinfo` (none when it
/// cannot be read).
pub(crate) fn mounted_targets() -> HashSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse_mount_points(&text))
        .unwrap_or_default()
}

/// Mount points (field 5) of a `/proc/self/mountinfo` text, with the kernel's octal escapes
/// (`\040` for a space, …) decoded.
fn parse_mount_points(mountinfo: &str) -> HashSet<String> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_octal)
        .collect()
}

fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let Some(&[b'\\', a, b, c]) = bytes.get(i..i + 4) {
            if [a, b, c].iter().all(|d| (b'0'..=b'7').contains(d)) {
                // Three octal digits fit in u8 as long as the first is 0-3, which the
                // kernel's escapes always satisfy; anything else stays literal.
                let value =
                    u32::from(a - b'0') * 64 + u32::from(b - b'0') * 8 + u32::from(c - b'0');
                if let Ok(value) = u8::try_from(value) {
                    out.push(value);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Opens /dev/null on any of descriptors 0-2 that is closed, so that later descriptors (pipes,
/// the pty) never land on 0-2 and get clobbered when a child's stdio is set up.
pub fn ensure_stdio_open() {
    for fd in 0..3 {
        // SAFETY: the borrow only lives for this fcntl call; on a closed number it fails with
        // EBADF and touches nothing.
        let probe = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        if nix::fcntl::fcntl(probe, nix::fcntl::FcntlArg::F_GETFD).is_ok() {
            continue;
        }
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            // open(2) returns the lowest free number, which is `fd`; keep it open for good.
            Ok(file) => std::mem::forget(file),
            Err(err) => log!("descriptor {fd} is closed and /dev/null cannot be opened: {err}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_mount_points_are_parsed_and_unescaped() {
        let text = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                    23 1 0:5 / /dev rw - devtmpfs udev rw\n\
                    40 23 0:40 / /mnt/with\\040space rw - tmpfs tmpfs rw\n";
        let points = parse_mount_points(text);
        assert!(points.contains("/proc"));
        assert!(points.contains("/dev"));
        assert!(points.contains("/mnt/with space"));
        assert!(!points.contains("/tmp"));
    }

    #[test]
    fn unescape_leaves_malformed_escapes_alone() {
        assert_eq!(unescape_octal("a\\04"), "a\\04");
        assert_eq!(unescape_octal("a\\x41b"), "a\\x41b");
        assert_eq!(unescape_octal("\\134"), "\\");
    }

    #[test]
    fn own_mounts_are_visible() {
        assert!(mounted_targets().contains("/proc"));
    }

    #[test]
    fn guest_mount_table_covers_the_api_filesystems() {
        let targets: Vec<_> = guest_mounts().iter().map(|m| m.target).collect();
        assert_eq!(
            targets,
            ["/proc", "/sys", "/dev", "/dev/pts", "/tmp", "/run"]
        );
    }
}
