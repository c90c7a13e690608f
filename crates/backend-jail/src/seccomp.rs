//! The guest's seccomp filter: Docker's default profile turned into a denylist that answers
//! `EPERM`, for x86_64 only.
//!
//! Layout of the installed BPF program:
//!
//! 1. seccompiler's arch check: anything but `AUDIT_ARCH_X86_64` (the i386 `int 0x80` ABI)
//!    is killed (`SECCOMP_RET_KILL_PROCESS`);
//! 2. our guard, spliced in right after it:
//!    - syscall numbers with the x32 bit (`nr | 0x40000000`) are killed: the x32 ABI shares
//!      `AUDIT_ARCH_X86_64`, so a denylist keyed on x86_64 numbers would otherwise let
//!      `0x40000000 | __NR_mount` straight through (libseccomp emits the same check);
//!      `nr == -1` is let through, as libseccomp does: it is how a tracer skips a syscall,
//!      and the kernel answers it with `ENOSYS`;
//!    - `clone3` gets `ENOSYS`: its flags live in memory a filter cannot read, so it cannot
//!      be screened for namespace flags; `ENOSYS` makes glibc fall back to `clone`, which can;
//! 3. seccompiler's rules: each denied syscall (optionally with argument conditions) returns
//!    `EPERM`, everything else is allowed.
//!
//! The guest has no `CAP_SYS_ADMIN`, so most of what is denied would fail anyway; the filter
//! is the second wall, and the only one for calls gated on the user namespace the guest
//! could otherwise create (nested user namespaces give back every capability).

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

use crate::error::JailError;

/// Syscalls denied whatever their arguments, with the reason for each group. Syscalls the
/// kernel no longer implements (`create_module`, `query_module`, `get_kernel_syms`) need no
/// entry: they answer `ENOSYS` anyway.
const DENIED: &[(&str, &[libc::c_long])] = &[
    (
        // The read-only binds and the pivot_root'ed root are only as strong as the guest's
        // inability to mount or unmount.
        "reshaping the mount tree",
        &[
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_fsopen,
            libc::SYS_fsconfig,
            libc::SYS_fsmount,
            libc::SYS_fspick,
            libc::SYS_open_tree,
            libc::SYS_move_mount,
            libc::SYS_mount_setattr,
            SYS_OPEN_TREE_ATTR,
        ],
    ),
    ("joining other namespaces", &[libc::SYS_setns]),
    (
        "loading kernel code",
        &[
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_delete_module,
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
        ],
    ),
    (
        // Not namespaced: they act on the whole host.
        "host-wide state (swap, reboot, clocks, accounting, quotas, kernel log)",
        &[
            libc::SYS_swapon,
            libc::SYS_swapoff,
            libc::SYS_reboot,
            libc::SYS_settimeofday,
            libc::SYS_clock_settime,
            libc::SYS_clock_adjtime,
            libc::SYS_adjtimex,
            libc::SYS_acct,
            libc::SYS_quotactl,
            libc::SYS_quotactl_fd,
            libc::SYS_syslog,
            libc::SYS_lookup_dcookie,
            libc::SYS_vhangup,
        ],
    ),
    (
        "obsolete interfaces nobody needs",
        &[
            libc::SYS_uselib,
            libc::SYS_sysfs,
            libc::SYS__sysctl,
            libc::SYS_nfsservctl,
        ],
    ),
    ("raw I/O port access", &[libc::SYS_iopl, libc::SYS_ioperm]),
    (
        "kernel keyrings (not namespaced: keys of other users and containers)",
        &[libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key],
    ),
    (
        // Large, frequently exploited kernel surfaces that build tools do not need.
        "eBPF, userfaultfd, perf, io_uring, fanotify",
        &[
            libc::SYS_bpf,
            libc::SYS_userfaultfd,
            libc::SYS_perf_event_open,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_fanotify_init,
        ],
    ),
    (
        // open_by_handle_at bypasses path lookup (the "shocker" container breakout).
        "file handles",
        &[libc::SYS_open_by_handle_at, libc::SYS_name_to_handle_at],
    ),
    (
        "reaching into other processes beyond ptrace",
        &[libc::SYS_pidfd_getfd, libc::SYS_process_madvise],
    ),
];

/// `open_tree_attr` (Linux 6.15), not yet in libc: `open_tree` plus `mount_setattr` in one.
const SYS_OPEN_TREE_ATTR: libc::c_long = 467;

/// Namespace flags that `clone` may not carry. `CLONE_NEWTIME` (0x80) is not among them: in
/// `clone`'s flags that bit belongs to the exit signal; it is only meaningful to `unshare`
/// and `clone3`.
const CLONE_NS_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
];

/// `unshare` may not carry these (the clone set plus `CLONE_NEWTIME`); unsharing files, fs
/// or sysvsem stays allowed.
const UNSHARE_NS_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWTIME,
];

/// Personalities Docker allows: PER_LINUX, PER_LINUX32, UNAME26 with either, and the query
/// value 0xffffffff. Others (e.g. READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE) are denied.
const ALLOWED_PERSONALITIES: &[u64] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// ioctls denied on any fd: pushing input into a terminal (`TIOCSTI`; the classic escape
/// through a shared tty) and `TIOCLINUX` (same via the console's selection buffer). The
/// request is compared as 32 bits, as the kernel does (the upper half is ignored by it).
const DENIED_IOCTLS: &[u64] = &[0x5412, 0x541c];

/// `AF_VSOCK` talks to the hypervisor and is not network-namespaced.
const AF_VSOCK: u64 = 40;

/// Syscalls with x32's bit set belong to the x32 ABI.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Classic BPF opcodes (linux/filter.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
/// Offsets into `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// `AUDIT_ARCH_X86_64`: EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// The kernel's limit on a classic BPF program.
const BPF_MAXINSNS: usize = 4096;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// seccompiler keys rules by i64; x86_64's `c_long` is one.
fn number(nr: libc::c_long) -> i64 {
    nr
}

/// Flag tests: one rule per flag, each matching when that bit is set.
fn any_flag_rules(
    flags: &[libc::c_int],
    len: SeccompCmpArgLen,
) -> Result<Vec<SeccompRule>, JailError> {
    flags
        .iter()
        .map(|&flag| {
            let bit = u64::from(flag.unsigned_abs());
            let cond = SeccompCondition::new(0, len.clone(), SeccompCmpOp::MaskedEq(bit), bit)
                .map_err(seccomp_err)?;
            SeccompRule::new(vec![cond]).map_err(seccomp_err)
        })
        .collect()
}

/// One rule per value: matches when argument `arg` equals one of `values`.
fn equals_rules(arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, JailError> {
    values
        .iter()
        .map(|&v| {
            let cond = SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)
                .map_err(seccomp_err)?;
            SeccompRule::new(vec![cond]).map_err(seccomp_err)
        })
        .collect()
}

fn seccomp_err(e: impl std::fmt::Display) -> JailError {
    JailError::Seccomp(e.to_string())
}

/// The seccompiler part: the denylist (step 3 in the module doc).
fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, JailError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_why, syscalls) in DENIED {
        for &nr in *syscalls {
            // An empty rule list means: deny whatever the arguments.
            rules.insert(number(nr), Vec::new());
        }
    }
    rules.insert(
        number(libc::SYS_clone),
        any_flag_rules(CLONE_NS_FLAGS, SeccompCmpArgLen::Qword)?,
    );
    rules.insert(
        number(libc::SYS_unshare),
        any_flag_rules(UNSHARE_NS_FLAGS, SeccompCmpArgLen::Dword)?,
    );
    let not_allowed_persona = ALLOWED_PERSONALITIES
        .iter()
        .map(|&p| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(seccomp_err)?;
    rules.insert(
        number(libc::SYS_personality),
        vec![SeccompRule::new(not_allowed_persona).map_err(seccomp_err)?],
    );
    rules.insert(number(libc::SYS_ioctl), equals_rules(1, DENIED_IOCTLS)?);
    rules.insert(number(libc::SYS_socket), equals_rules(0, &[AF_VSOCK])?);
    Ok(rules)
}

/// Builds the complete program (arch check, x32/clone3 guard, denylist).
pub(crate) fn program() -> Result<BpfProgram, JailError> {
    let filter = SeccompFilter::new(
        rules()?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM.unsigned_abs()),
        TargetArch::x86_64,
    )
    .map_err(seccomp_err)?;
    let compiled: BpfProgram = filter.try_into().map_err(seccomp_err)?;
    splice_guard(compiled)
}

/// Inserts the x32 and clone3 guard right after seccompiler's arch check, after verifying
/// that the program starts the way this code expects (seccompiler is pinned, but a layout
/// change must fail loudly rather than produce a wrong filter).
fn splice_guard(mut program: BpfProgram) -> Result<BpfProgram, JailError> {
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let expected_head = [
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, kill),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ];
    if program.get(..expected_head.len()) != Some(&expected_head[..]) {
        return Err(JailError::Seccomp(
            "seccompiler's program does not start with the expected x86_64 arch check; \
             the x32 guard cannot be placed"
                .to_owned(),
        ));
    }
    let clone3 = u32::try_from(libc::SYS_clone3).map_err(seccomp_err)?;
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS.unsigned_abs();
    let guard = [
        stmt(BPF_LD_W_ABS, DATA_NR),
        // nr >= 0x40000000: x32 (or junk). Fall through to the -1 test; else skip 2.
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 2),
        jump(BPF_JMP_JEQ_K, u32::MAX, 1, 0),
        stmt(BPF_RET_K, kill),
        jump(BPF_JMP_JEQ_K, clone3, 0, 1),
        stmt(BPF_RET_K, enosys),
    ];
    // Index 3 is where seccompiler's arch check jumps on success: the guard runs first. No
    // earlier jump crosses this point, so no offset needs fixing.
    program.splice(3..3, guard);
    if program.len() > BPF_MAXINSNS {
        return Err(JailError::Seccomp(format!(
            "the filter has {} instructions; the kernel accepts {BPF_MAXINSNS}",
            program.len()
        )));
    }
    Ok(program)
}

/// Installs `program` on the calling thread (which must be the only one). Sets
/// `PR_SET_NO_NEW_PRIVS` first, as an unprivileged filter requires.
pub(crate) fn install(program: &BpfProgram) -> Result<(), String> {
    seccompiler::apply_filter(program).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | 1;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | 38;
    const I386: u32 = 3 | 0x4000_0000;

    /// A classic-BPF interpreter for the instructions seccompiler and the guard emit, run
    /// over a `struct seccomp_data`.
    fn run(program: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_le_bytes());
        }
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let ins = &program[pc];
            let k = ins.k;
            let branch = |cond: bool| 1 + usize::from(if cond { ins.jt } else { ins.jf });
            pc += match ins.code {
                0x20 => {
                    let at = k as usize;
                    acc = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"));
                    1
                }
                0x05 => 1 + k as usize,
                0x15 => branch(acc == k),
                0x25 => branch(acc > k),
                0x35 => branch(acc >= k),
                0x45 => branch(acc & k != 0),
                0x54 => {
                    acc &= k;
                    1
                }
                0x06 => return k,
                other => panic!("opcode {other:#x} not modelled"),
            };
        }
    }

    fn nr32(nr: libc::c_long) -> u32 {
        u32::try_from(nr).expect("syscall number")
    }

    fn flag(f: libc::c_int) -> u64 {
        u64::from(f.unsigned_abs())
    }

    fn x86(nr: libc::c_long, args: [u64; 6]) -> u32 {
        let prog = program().expect("program");
        run(&prog, AUDIT_ARCH_X86_64, nr32(nr), args)
    }

    fn x86_0(nr: libc::c_long) -> u32 {
        x86(nr, [0; 6])
    }

    #[test]
    fn program_layout() {
        let prog = program().expect("program");
        assert_eq!(prog[0], stmt(BPF_LD_W_ABS, DATA_ARCH));
        assert_eq!(prog[1], jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0));
        assert_eq!(prog[2], stmt(BPF_RET_K, KILL));
        assert_eq!(prog[3], stmt(BPF_LD_W_ABS, DATA_NR));
        assert_eq!(prog[4], jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 2));
        assert_eq!(prog[6], stmt(BPF_RET_K, KILL));
        assert_eq!(prog[8], stmt(BPF_RET_K, ENOSYS));
        assert_eq!(prog[9], stmt(BPF_LD_W_ABS, DATA_NR));
        assert!(prog.len() < BPF_MAXINSNS);
    }

    #[test]
    fn other_architectures_are_killed() {
        let prog = program().expect("program");
        // i386's getpid (20) and x86_64's read (0) alike.
        assert_eq!(run(&prog, I386, 20, [0; 6]), KILL);
        assert_eq!(run(&prog, I386, 0, [0; 6]), KILL);
    }

    #[test]
    fn x32_is_killed_and_minus_one_passes() {
        let prog = program().expect("program");
        let x32 =
            |nr: libc::c_long| run(&prog, AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | nr32(nr), [0; 6]);
        assert_eq!(x32(libc::SYS_getpid), KILL);
        assert_eq!(x32(libc::SYS_mount), KILL);
        assert_eq!(run(&prog, AUDIT_ARCH_X86_64, u32::MAX, [0; 6]), ALLOW);
    }

    #[test]
    fn ordinary_syscalls_are_allowed() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_chroot,
            libc::SYS_ptrace,
            libc::SYS_sethostname,
            libc::SYS_close_range,
        ] {
            assert_eq!(x86_0(nr), ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn denylist_answers_eperm() {
        for (_, syscalls) in DENIED {
            for &nr in *syscalls {
                assert_eq!(x86_0(nr), EPERM, "syscall {nr}");
            }
        }
        assert_eq!(x86_0(libc::SYS_clone3), ENOSYS);
    }

    #[test]
    fn clone_and_unshare_only_without_namespaces() {
        let fork_like =
            (libc::SIGCHLD | libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) as u64;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS) as u64;
        assert_eq!(x86(libc::SYS_clone, [fork_like, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(x86(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]), ALLOW);
        // An exit signal of 0x80-something must not be mistaken for CLONE_NEWTIME.
        assert_eq!(x86(libc::SYS_clone, [0x80 | 0x11, 0, 0, 0, 0, 0]), ALLOW);
        for &ns in CLONE_NS_FLAGS {
            let flags = fork_like | flag(ns);
            assert_eq!(
                x86(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]),
                EPERM,
                "clone {ns:#x}"
            );
        }
        // High bits above 32 do not hide a namespace flag.
        let sneaky = (1u64 << 40) | libc::CLONE_NEWUSER as u64;
        assert_eq!(x86(libc::SYS_clone, [sneaky, 0, 0, 0, 0, 0]), EPERM);

        assert_eq!(
            x86(libc::SYS_unshare, [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            x86(libc::SYS_unshare, [libc::CLONE_FS as u64, 0, 0, 0, 0, 0]),
            ALLOW
        );
        for &ns in UNSHARE_NS_FLAGS {
            assert_eq!(
                x86(libc::SYS_unshare, [flag(ns), 0, 0, 0, 0, 0]),
                EPERM,
                "unshare {ns:#x}"
            );
        }
    }

    #[test]
    fn personality_ioctl_socket_conditions() {
        for &p in ALLOWED_PERSONALITIES {
            assert_eq!(
                x86(libc::SYS_personality, [p, 0, 0, 0, 0, 0]),
                ALLOW,
                "persona {p:#x}"
            );
        }
        // READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE
        for p in [0x0400000u64, 0x0040000] {
            assert_eq!(
                x86(libc::SYS_personality, [p, 0, 0, 0, 0, 0]),
                EPERM,
                "persona {p:#x}"
            );
        }
        assert_eq!(x86(libc::SYS_ioctl, [0, 0x5412, 0, 0, 0, 0]), EPERM);
        // The kernel truncates the request to 32 bits, so must the filter.
        assert_eq!(
            x86(libc::SYS_ioctl, [0, (1 << 32) | 0x5412, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            x86(libc::SYS_ioctl, [0, 0x5401 /* TCGETS */, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(x86(libc::SYS_socket, [40, 1, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            x86(libc::SYS_socket, [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            x86(libc::SYS_socket, [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]),
            ALLOW
        );
    }

    #[test]
    fn layout_check_rejects_unknown_programs() {
        assert!(splice_guard(vec![stmt(BPF_RET_K, ALLOW)]).is_err());
    }
}
