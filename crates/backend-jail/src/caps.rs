//! Capabilities of the guest init: Docker's default set, everything else dropped from the
//! bounding set so no descendant (setuid binary, file capabilities) can regain it.
//!
//! Sets after [`restrict`]: bounding = permitted = effective = the Docker set; inheritable
//! and ambient = empty. Inheritable is empty as in runc since CVE-2022-24769: a non-empty
//! inheritable set lets a non-root process gain capabilities by exec'ing a binary carrying
//! inheritable file capabilities.
//!
//! Permitted must equal the bounding set: guest root's exec recomputes
//! permitted = bounding set, and the kernel clears `PR_SET_PDEATHSIG` at exec whenever the
//! new permitted set is not a subset of the old one.
//!
//! These are capabilities *in the jail's user namespace*: they act only on objects that
//! namespace owns (its mounts, network, hostname) and on files owned by mapped ids.

use nix::errno::Errno;

/// (number, name) of each capability Docker grants by default.
pub const DOCKER_DEFAULT: &[(u32, &str)] = &[
    (0, "CAP_CHOWN"),
    (1, "CAP_DAC_OVERRIDE"),
    (3, "CAP_FOWNER"),
    (4, "CAP_FSETID"),
    (5, "CAP_KILL"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (8, "CAP_SETPCAP"),
    (10, "CAP_NET_BIND_SERVICE"),
    (13, "CAP_NET_RAW"),
    (18, "CAP_SYS_CHROOT"),
    (27, "CAP_MKNOD"),
    (29, "CAP_AUDIT_WRITE"),
    (31, "CAP_SETFCAP"),
];

/// Raw and packet sockets: dropped for a guest on user-mode networking
/// ([`crate::JailSpec::net_raw`]).
pub(crate) const CAP_NET_RAW: u32 = 13;

/// The Docker default set as a bit mask (bit n = capability n), as `/proc/<pid>/status`
/// prints it in `CapBnd`.
pub fn docker_default_mask() -> u64 {
    DOCKER_DEFAULT
        .iter()
        .fold(0, |mask, (cap, _)| mask | (1u64 << cap))
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Highest capability number this kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        // 40 (CAP_CHECKPOINT_RESTORE) is the highest as of Linux 6.x; PR_CAPBSET_DROP
        // answers EINVAL past the real end, which `restrict` tolerates.
        .unwrap_or(63)
}

/// Reduces this thread's capabilities to `keep` (see the module doc). Needs `CAP_SETPCAP`
/// in the current user namespace (the jail's init has all capabilities there).
pub(crate) fn restrict(keep: u64) -> Result<(), (String, Errno)> {
    for cap in 0..=last_cap() {
        if keep & (1u64 << cap) != 0 {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes a capability number; no memory is passed.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if ret != 0 {
            match Errno::last() {
                // Past the kernel's last capability.
                Errno::EINVAL => break,
                e => {
                    return Err((
                        format!("dropping capability {cap} from the bounding set"),
                        e,
                    ))
                }
            }
        }
    }

    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let halves = [
        u32::try_from(keep & 0xffff_ffff).unwrap_or(0),
        u32::try_from(keep >> 32).unwrap_or(0),
    ];
    let data = halves.map(|bits| CapData {
        effective: bits,
        permitted: bits,
        inheritable: 0,
    });
    // SAFETY: capset reads a version-3 header and two CapData structs (the v3 layout);
    // both live on our stack for the duration of the call.
    let ret =
        unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if ret != 0 {
        return Err((
            "setting effective/permitted/inheritable capabilities".to_owned(),
            Errno::last(),
        ));
    }

    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::c_ulong::try_from(libc::PR_CAP_AMBIENT_CLEAR_ALL).unwrap_or(4),
            0,
            0,
            0,
        )
    };
    if ret != 0 {
        return Err(("clearing ambient capabilities".to_owned(), Errno::last()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_mask_value() {
        // The CapBnd value `docker run` shows.
        assert_eq!(docker_default_mask(), 0xa804_25fb);
        assert_eq!(DOCKER_DEFAULT.len(), 14);
    }
}
