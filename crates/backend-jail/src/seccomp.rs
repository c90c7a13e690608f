//! The guest's seccomp filter: an allowlist after Docker's default profile (moby/profiles
//! `seccomp/default.json`), for x86_64 only. What is not listed answers `EPERM`, so a syscall
//! added to a future kernel is denied until someone decides it is safe.
//!
//! Layout of the installed BPF program:
//!
//! 1. the arch check: anything but `AUDIT_ARCH_X86_64` (the i386 `int 0x80` ABI) is killed
//!    (`SECCOMP_RET_KILL_PROCESS`);
//! 2. the guard:
//!    - syscall numbers with the x32 bit (`nr | 0x40000000`) are killed: the x32 ABI shares
//!      `AUDIT_ARCH_X86_64` and its numbers are not screened by the rules below (libseccomp
//!      emits the same check); `nr == -1` is let through, as libseccomp does: it is how a
//!      tracer skips a syscall, and the kernel answers it with `ENOSYS`;
//!    - `clone3` gets `ENOSYS`: its flags live in memory a filter cannot read, so it cannot
//!      be screened for namespace flags; `ENOSYS` makes glibc fall back to `clone`, which can;
//!    - numbers above the newest syscall this table knows get `ENOSYS`, as runc does: a libc
//!      built for a newer kernel probes new calls and falls back only on `ENOSYS`;
//! 3. for each syscall allowed only with given arguments, its checks as seccompiler compiles
//!    them;
//! 4. the syscalls allowed whatever their arguments, as a binary search over ranges of
//!    numbers (see [`program`]); everything else returns `EPERM`.
//!
//! Differences from Docker's profile, all narrower: no `adjtimex`/`clock_adjtime` (host
//! clock state), no `name_to_handle_at` (half of the file-handle pair), `socket` only for the
//! families a build needs, and `ioctl` without `TIOCSTI`/`TIOCLINUX`. Two calls Docker
//! allows only with `CAP_SYS_ADMIN` are allowed without their namespace flags: `unshare`
//! (files, fs, sysvsem) like `clone`. `chroot` is allowed because the guest keeps
//! `CAP_SYS_CHROOT`, as Docker's profile does for that capability.
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

// x86_64 numbers of syscalls newer than the pinned libc crate knows.
const SYS_IO_PGETEVENTS: libc::c_long = 333;
const SYS_URETPROBE: libc::c_long = 335;
const SYS_CACHESTAT: libc::c_long = 451;
const SYS_MAP_SHADOW_STACK: libc::c_long = 453;
const SYS_FUTEX_WAKE: libc::c_long = 454;
const SYS_FUTEX_WAIT: libc::c_long = 455;
const SYS_FUTEX_REQUEUE: libc::c_long = 456;
const SYS_STATMOUNT: libc::c_long = 457;
const SYS_LISTMOUNT: libc::c_long = 458;
const SYS_SETXATTRAT: libc::c_long = 463;
const SYS_GETXATTRAT: libc::c_long = 464;
const SYS_LISTXATTRAT: libc::c_long = 465;
const SYS_REMOVEXATTRAT: libc::c_long = 466;
/// `open_tree_attr` (Linux 6.15): not allowed, but the newest number this table knows, so
/// the "newer than we know" guard starts above it.
const SYS_OPEN_TREE_ATTR: libc::c_long = 467;
/// The newest syscall number the allowlist was reviewed against.
const NEWEST_KNOWN: libc::c_long = SYS_OPEN_TREE_ATTR;

/// Syscalls allowed whatever their arguments: Docker's unconditional list for x86_64 (its
/// 32-bit-only names dropped), plus `ptrace`/`process_vm_*` (allowed by Docker on kernels
/// since 4.8, whose ptrace checks are namespace-aware), `arch_prctl`/`modify_ldt` (its
/// amd64 additions) and `chroot` (granted with `CAP_SYS_CHROOT`, which the guest keeps).
const ALLOWED: &[libc::c_long] = &[
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_access,
    libc::SYS_alarm,
    libc::SYS_arch_prctl,
    libc::SYS_bind,
    libc::SYS_brk,
    SYS_CACHESTAT,
    libc::SYS_capget,
    libc::SYS_capset,
    libc::SYS_chdir,
    libc::SYS_chmod,
    libc::SYS_chown,
    libc::SYS_chroot,
    libc::SYS_clock_getres,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_connect,
    libc::SYS_copy_file_range,
    libc::SYS_creat,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_ctl_old,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_wait_old,
    libc::SYS_eventfd,
    libc::SYS_eventfd2,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_fadvise64,
    libc::SYS_fallocate,
    libc::SYS_fanotify_mark,
    libc::SYS_fchdir,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchmodat2,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_fcntl,
    libc::SYS_fdatasync,
    libc::SYS_fgetxattr,
    libc::SYS_flistxattr,
    libc::SYS_flock,
    libc::SYS_fork,
    libc::SYS_fremovexattr,
    libc::SYS_fsetxattr,
    libc::SYS_fstat,
    libc::SYS_fstatfs,
    libc::SYS_fsync,
    libc::SYS_ftruncate,
    libc::SYS_futex,
    SYS_FUTEX_REQUEUE,
    SYS_FUTEX_WAIT,
    libc::SYS_futex_waitv,
    SYS_FUTEX_WAKE,
    libc::SYS_futimesat,
    libc::SYS_getcpu,
    libc::SYS_getcwd,
    libc::SYS_getdents,
    libc::SYS_getdents64,
    libc::SYS_getegid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getgroups,
    libc::SYS_getitimer,
    libc::SYS_getpeername,
    libc::SYS_getpgid,
    libc::SYS_getpgrp,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_getpriority,
    libc::SYS_getrandom,
    libc::SYS_getresgid,
    libc::SYS_getresuid,
    libc::SYS_getrlimit,
    libc::SYS_get_robust_list,
    libc::SYS_getrusage,
    libc::SYS_getsid,
    libc::SYS_getsockname,
    libc::SYS_getsockopt,
    libc::SYS_get_thread_area,
    libc::SYS_gettid,
    libc::SYS_gettimeofday,
    libc::SYS_getuid,
    libc::SYS_getxattr,
    SYS_GETXATTRAT,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_rm_watch,
    libc::SYS_io_cancel,
    libc::SYS_io_destroy,
    libc::SYS_io_getevents,
    SYS_IO_PGETEVENTS,
    libc::SYS_ioprio_get,
    libc::SYS_ioprio_set,
    libc::SYS_io_setup,
    libc::SYS_io_submit,
    libc::SYS_kill,
    libc::SYS_landlock_add_rule,
    libc::SYS_landlock_create_ruleset,
    libc::SYS_landlock_restrict_self,
    libc::SYS_lchown,
    libc::SYS_lgetxattr,
    libc::SYS_link,
    libc::SYS_linkat,
    libc::SYS_listen,
    SYS_LISTMOUNT,
    libc::SYS_listxattr,
    SYS_LISTXATTRAT,
    libc::SYS_llistxattr,
    libc::SYS_lremovexattr,
    libc::SYS_lseek,
    libc::SYS_lsetxattr,
    libc::SYS_lstat,
    libc::SYS_madvise,
    SYS_MAP_SHADOW_STACK,
    libc::SYS_membarrier,
    libc::SYS_memfd_create,
    libc::SYS_memfd_secret,
    libc::SYS_mincore,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_mknod,
    libc::SYS_mknodat,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_mlockall,
    libc::SYS_mmap,
    libc::SYS_modify_ldt,
    libc::SYS_mprotect,
    libc::SYS_mq_getsetattr,
    libc::SYS_mq_notify,
    libc::SYS_mq_open,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_unlink,
    libc::SYS_mremap,
    libc::SYS_mseal,
    libc::SYS_msgctl,
    libc::SYS_msgget,
    libc::SYS_msgrcv,
    libc::SYS_msgsnd,
    libc::SYS_msync,
    libc::SYS_munlock,
    libc::SYS_munlockall,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_newfstatat,
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_pause,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    libc::SYS_pipe,
    libc::SYS_pipe2,
    libc::SYS_pkey_alloc,
    libc::SYS_pkey_free,
    libc::SYS_pkey_mprotect,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_prctl,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_preadv2,
    libc::SYS_prlimit64,
    libc::SYS_process_mrelease,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pselect6,
    libc::SYS_ptrace,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_pwritev2,
    libc::SYS_read,
    libc::SYS_readahead,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmmsg,
    libc::SYS_recvmsg,
    libc::SYS_remap_file_pages,
    libc::SYS_removexattr,
    SYS_REMOVEXATTRAT,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_restart_syscall,
    libc::SYS_rmdir,
    libc::SYS_rseq,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigsuspend,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_getattr,
    libc::SYS_sched_getparam,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_rr_get_interval,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setattr,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_yield,
    libc::SYS_seccomp,
    libc::SYS_select,
    libc::SYS_semctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_sendfile,
    libc::SYS_sendmmsg,
    libc::SYS_sendmsg,
    libc::SYS_sendto,
    libc::SYS_setfsgid,
    libc::SYS_setfsuid,
    libc::SYS_setgid,
    libc::SYS_setgroups,
    libc::SYS_setitimer,
    libc::SYS_setpgid,
    libc::SYS_setpriority,
    libc::SYS_setregid,
    libc::SYS_setresgid,
    libc::SYS_setresuid,
    libc::SYS_setreuid,
    libc::SYS_setrlimit,
    libc::SYS_set_robust_list,
    libc::SYS_setsid,
    libc::SYS_setsockopt,
    libc::SYS_set_thread_area,
    libc::SYS_set_tid_address,
    libc::SYS_setuid,
    libc::SYS_setxattr,
    SYS_SETXATTRAT,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_shmget,
    libc::SYS_shutdown,
    libc::SYS_sigaltstack,
    libc::SYS_signalfd,
    libc::SYS_signalfd4,
    libc::SYS_socketpair,
    libc::SYS_splice,
    libc::SYS_stat,
    libc::SYS_statfs,
    SYS_STATMOUNT,
    libc::SYS_statx,
    libc::SYS_symlink,
    libc::SYS_symlinkat,
    libc::SYS_sync,
    libc::SYS_sync_file_range,
    libc::SYS_syncfs,
    libc::SYS_sysinfo,
    libc::SYS_tee,
    libc::SYS_tgkill,
    libc::SYS_time,
    libc::SYS_timer_create,
    libc::SYS_timer_delete,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_gettime,
    libc::SYS_timer_settime,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_gettime,
    libc::SYS_timerfd_settime,
    libc::SYS_times,
    libc::SYS_tkill,
    libc::SYS_truncate,
    libc::SYS_umask,
    libc::SYS_uname,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    SYS_URETPROBE,
    libc::SYS_utime,
    libc::SYS_utimensat,
    libc::SYS_utimes,
    libc::SYS_vfork,
    libc::SYS_vmsplice,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_write,
    libc::SYS_writev,
];

/// Namespace flags that `clone` and `unshare` may not carry. `CLONE_NEWTIME` (0x80) is only
/// refused to `unshare`: in `clone`'s flags that bit belongs to the exit signal.
const CLONE_NS_FLAGS: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET;
const UNSHARE_NS_FLAGS: libc::c_int = CLONE_NS_FLAGS | libc::CLONE_NEWTIME;

/// Personalities Docker allows: PER_LINUX, PER_LINUX32, UNAME26 with either, and the query
/// value 0xffffffff. Others (e.g. READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE) are denied.
const ALLOWED_PERSONALITIES: &[u64] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// ioctls denied on any fd: pushing input into a terminal (`TIOCSTI`; the classic escape
/// through a shared tty) and `TIOCLINUX` (same via the console's selection buffer). The
/// request is compared as 32 bits, as the kernel does (the upper half is ignored by it).
const DENIED_IOCTLS: &[u64] = &[0x5412, 0x541c];

/// Socket families a build, a test suite or a package manager uses: local sockets, IP,
/// netlink (interface and route queries, `ip`), packet (raw capture, with `CAP_NET_RAW`).
/// Docker allows ~35 families; the rest (vsock, which is not network-namespaced; AF_ALG,
/// the kernel crypto API; radio and legacy protocols) are kernel surface nobody here needs.
const ALLOWED_SOCKET_FAMILIES: &[libc::c_int] = &[
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
    libc::AF_PACKET,
];

/// Syscalls with x32's bit set belong to the x32 ABI.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Classic BPF opcodes (linux/filter.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_JMP_JGT_K: u16 = 0x25;
const BPF_JMP_JA: u16 = 0x05;
const BPF_RET_K: u16 = 0x06;
/// Offsets into `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// `AUDIT_ARCH_X86_64`: EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// The kernel's limit on a classic BPF program.
const BPF_MAXINSNS: usize = 4096;

const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// seccompiler keys rules by i64; x86_64's `c_long` is one.
fn number(nr: libc::c_long) -> i64 {
    nr
}

fn condition(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, JailError> {
    SeccompCondition::new(arg, len, op, value).map_err(seccomp_err)
}

/// One rule: allowed when the flags in argument 0 carry none of `forbidden`.
fn without_flags(forbidden: libc::c_int) -> Result<Vec<SeccompRule>, JailError> {
    let mask = u64::from(forbidden.unsigned_abs());
    // Qword: a namespace bit must not hide behind junk in the upper half.
    let cond = condition(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(mask), 0)?;
    Ok(vec![SeccompRule::new(vec![cond]).map_err(seccomp_err)?])
}

/// One rule per value: allowed when argument `arg` (as 32 bits) equals one of `values`.
fn one_of(arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, JailError> {
    values
        .iter()
        .map(|&v| {
            let cond = condition(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)?;
            SeccompRule::new(vec![cond]).map_err(seccomp_err)
        })
        .collect()
}

/// One rule: allowed when argument `arg` (as 32 bits) equals none of `values`.
fn none_of(arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, JailError> {
    let conds = values
        .iter()
        .map(|&v| condition(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, v))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(vec![SeccompRule::new(conds).map_err(seccomp_err)?])
}

fn seccomp_err(e: impl std::fmt::Display) -> JailError {
    JailError::Seccomp(e.to_string())
}

/// The seccompiler part: the allowlist (step 3 in the module doc). A syscall mapped to no
/// rule is allowed whatever its arguments; one mapped to rules only when one of them matches.
fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, JailError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (number(nr), Vec::new())).collect();
    rules.insert(number(libc::SYS_clone), without_flags(CLONE_NS_FLAGS)?);
    rules.insert(number(libc::SYS_unshare), without_flags(UNSHARE_NS_FLAGS)?);
    rules.insert(
        number(libc::SYS_personality),
        one_of(0, ALLOWED_PERSONALITIES)?,
    );
    rules.insert(number(libc::SYS_ioctl), none_of(1, DENIED_IOCTLS)?);
    let families: Vec<u64> = ALLOWED_SOCKET_FAMILIES
        .iter()
        .map(|f| u64::from(f.unsigned_abs()))
        .collect();
    rules.insert(number(libc::SYS_socket), one_of(0, &families)?);
    Ok(rules)
}

/// Step 1 of the module doc, which seccompiler's programs open with too: anything but
/// `AUDIT_ARCH_X86_64` is killed.
const ARCH_CHECK: [sock_filter; 3] = [
    stmt(BPF_LD_W_ABS, DATA_ARCH),
    jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
    stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
];

/// Builds the complete program: the arch check, the guard, a block per syscall allowed only
/// with given arguments, then the unconditional allowlist as a binary search over ranges of
/// syscall numbers.
///
/// Why a search rather than one test per syscall (seccompiler's layout): when a filter is
/// installed, the kernel works out which syscalls it allows whatever their arguments by
/// running it on every syscall number, and with 300-odd tests in a row that was a noticeable
/// part of every sandbox's start; each syscall the cache does not cover (a denied one, `ioctl`,
/// `clone`) also walked the row at run time. Here any number is decided in a few dozen
/// instructions.
pub(crate) fn program() -> Result<BpfProgram, JailError> {
    let mut program = ARCH_CHECK.to_vec();
    program.extend(guard()?);
    let mut unconditional = Vec::new();
    for (nr, rules) in rules()? {
        let nr = u32::try_from(nr).map_err(seccomp_err)?;
        if rules.is_empty() {
            unconditional.push(nr);
        } else {
            program.extend(conditional_block(nr, rules)?);
        }
    }
    program.extend(allowlist_search(&ranges(unconditional)));
    if program.len() > BPF_MAXINSNS {
        return Err(JailError::Seccomp(format!(
            "the filter has {} instructions; the kernel accepts {BPF_MAXINSNS}",
            program.len()
        )));
    }
    Ok(program)
}

/// Step 2 of the module doc. Starts by loading the syscall number, and leaves it loaded for
/// what follows.
fn guard() -> Result<[sock_filter; 8], JailError> {
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let clone3 = u32::try_from(libc::SYS_clone3).map_err(seccomp_err)?;
    let unknown = u32::try_from(NEWEST_KNOWN + 1).map_err(seccomp_err)?;
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS.unsigned_abs();
    Ok([
        stmt(BPF_LD_W_ABS, DATA_NR),
        // nr >= 0x40000000: -1 or x32 (or junk); else skip to the clone3 test.
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 3),
        jump(BPF_JMP_JEQ_K, u32::MAX, 0, 1),
        stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
        stmt(BPF_RET_K, kill),
        // clone3, or a number newer than the table: ENOSYS; else on to the rules.
        jump(BPF_JMP_JEQ_K, clone3, 1, 0),
        jump(BPF_JMP_JGE_K, unknown, 0, 1),
        stmt(BPF_RET_K, enosys),
    ])
}

/// The argument checks of syscall `nr`, compiled by seccompiler (allowed when one of `rules`
/// matches, `EPERM` otherwise), behind a test that skips them for any other syscall. Expects
/// the syscall number loaded, and leaves it loaded for whatever follows.
fn conditional_block(nr: u32, rules: Vec<SeccompRule>) -> Result<Vec<sock_filter>, JailError> {
    let filter = SeccompFilter::new(
        BTreeMap::from([(i64::from(nr), rules)]),
        SeccompAction::Errno(libc::EPERM.unsigned_abs()),
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(seccomp_err)?;
    let compiled: BpfProgram = filter.try_into().map_err(seccomp_err)?;
    guarded_checks(nr, &compiled)
}

/// seccompiler's program for one syscall (`compiled`) without its head, behind a test that
/// skips it for any other syscall.
fn guarded_checks(nr: u32, compiled: &[sock_filter]) -> Result<Vec<sock_filter>, JailError> {
    // seccompiler's program opens with its arch check and the load of the number; what
    // follows only jumps within itself and ends in returns. A layout change must fail loudly
    // rather than produce a wrong filter (seccompiler is pinned).
    let mut expected_head = ARCH_CHECK.to_vec();
    expected_head.push(stmt(BPF_LD_W_ABS, DATA_NR));
    let body = match compiled.split_at_checked(expected_head.len()) {
        Some((head, body)) if head == expected_head => body,
        _ => {
            return Err(JailError::Seccomp(
                "seccompiler's program does not start with the expected x86_64 arch check; \
                 the argument checks cannot be placed"
                    .to_owned(),
            ))
        }
    };
    if body.last().map(|ins| ins.code) != Some(BPF_RET_K) {
        return Err(JailError::Seccomp(
            "seccompiler's program does not end in a return".to_owned(),
        ));
    }
    let skip = u8::try_from(body.len()).map_err(|_| {
        JailError::Seccomp(format!(
            "the argument checks of syscall {nr} take {} instructions; a skip over them takes \
             at most 255",
            body.len()
        ))
    })?;
    let mut block = vec![jump(BPF_JMP_JEQ_K, nr, 0, skip)];
    block.extend_from_slice(body);
    Ok(block)
}

/// Sorted syscall numbers as ranges of consecutive ones, each `(first, last)`.
fn ranges(mut numbers: Vec<u32>) -> Vec<(u32, u32)> {
    numbers.sort_unstable();
    numbers.dedup();
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for nr in numbers {
        match ranges.last_mut() {
            Some((_, last)) if last.checked_add(1) == Some(nr) => *last = nr,
            _ => ranges.push((nr, nr)),
        }
    }
    ranges
}

/// A binary search of the loaded syscall number over `ranges`: `ALLOW` inside one, `EPERM`
/// outside all. Only forward jumps, as classic BPF has; a jump over a subtree is an
/// unconditional one, whose offset has no 255 limit.
fn allowlist_search(ranges: &[(u32, u32)]) -> Vec<sock_filter> {
    let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM.unsigned_abs();
    match ranges {
        [] => vec![stmt(BPF_RET_K, eperm)],
        [(first, last)] => vec![
            jump(BPF_JMP_JGE_K, *first, 0, 2),
            jump(BPF_JMP_JGT_K, *last, 1, 0),
            stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
            stmt(BPF_RET_K, eperm),
        ],
        _ => {
            let middle = ranges.len() / 2;
            let below = allowlist_search(&ranges[..middle]);
            let from_middle = allowlist_search(&ranges[middle..]);
            let over_below =
                u32::try_from(below.len()).expect("a subtree of a 4096-instruction program");
            let mut code = vec![
                // At or above the middle range's first number: over the lower half.
                jump(BPF_JMP_JGE_K, ranges[middle].0, 0, 1),
                stmt(BPF_JMP_JA, over_below),
            ];
            code.extend(below);
            code.extend(from_middle);
            code
        }
    }
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
        run_counting(program, arch, nr, args).0
    }

    /// [`run`], also returning how many instructions ran to reach the verdict.
    fn run_counting(program: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_le_bytes());
        }
        let (mut acc, mut pc, mut steps) = (0u32, 0usize, 0usize);
        loop {
            let ins = &program[pc];
            let k = ins.k;
            steps += 1;
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
                0x06 => return (k, steps),
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
        assert_eq!(prog[4], jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 3));
        assert_eq!(prog[6], stmt(BPF_RET_K, ALLOW));
        assert_eq!(prog[7], stmt(BPF_RET_K, KILL));
        assert_eq!(prog[10], stmt(BPF_RET_K, ENOSYS));
        // Then the argument checks, each behind a test of its syscall number.
        assert_eq!(prog[11].code, BPF_JMP_JEQ_K);
        assert!(prog.len() < BPF_MAXINSNS);
    }

    #[test]
    fn every_syscall_is_decided_in_few_instructions() {
        // The kernel runs the filter on every number when it is installed (to cache the
        // syscalls allowed whatever their arguments), and on each uncached call: a search,
        // not a row of 300 tests.
        let prog = program().expect("program");
        let known = u32::try_from(NEWEST_KNOWN).expect("number");
        let worst = (0..=known + 8)
            .map(|nr| run_counting(&prog, AUDIT_ARCH_X86_64, nr, [0; 6]).1)
            .max()
            .expect("numbers");
        assert!(worst <= 40, "a syscall took {worst} instructions to decide");
    }

    #[test]
    fn ranges_join_consecutive_numbers() {
        assert_eq!(
            ranges(vec![5, 1, 2, 3, 9, 8, 3]),
            vec![(1, 3), (5, 5), (8, 9)]
        );
        assert_eq!(ranges(Vec::new()), Vec::<(u32, u32)>::new());
    }

    #[test]
    fn a_search_over_any_ranges_allows_exactly_them() {
        let eperm = EPERM;
        for ranges in [
            vec![],
            vec![(0, 0)],
            vec![(3, 7)],
            vec![
                (0, 2),
                (4, 4),
                (6, 9),
                (11, 11),
                (13, 20),
                (30, 31),
                (40, 40),
            ],
        ] {
            let search = allowlist_search(&ranges);
            let mut prog = vec![stmt(BPF_LD_W_ABS, DATA_NR)];
            prog.extend(search);
            for nr in 0..50 {
                let inside = ranges.iter().any(|&(a, b)| (a..=b).contains(&nr));
                let want = if inside { ALLOW } else { eperm };
                assert_eq!(
                    run(&prog, AUDIT_ARCH_X86_64, nr, [0; 6]),
                    want,
                    "{ranges:?} {nr}"
                );
            }
        }
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
    fn the_allowlist_is_allowed() {
        for &nr in ALLOWED {
            assert_eq!(x86_0(nr), ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn everything_else_is_denied() {
        // The calls behind known container escapes and kernel exploits, and some that are
        // merely not needed: none is on the list, so all answer EPERM.
        for nr in [
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_fsopen,
            libc::SYS_fsmount,
            libc::SYS_open_tree,
            libc::SYS_move_mount,
            libc::SYS_mount_setattr,
            SYS_OPEN_TREE_ATTR,
            libc::SYS_setns,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
            libc::SYS_reboot,
            libc::SYS_swapon,
            libc::SYS_settimeofday,
            libc::SYS_clock_settime,
            libc::SYS_adjtimex,
            libc::SYS_clock_adjtime,
            libc::SYS_acct,
            libc::SYS_quotactl,
            libc::SYS_syslog,
            libc::SYS_iopl,
            libc::SYS_ioperm,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
            libc::SYS_bpf,
            libc::SYS_userfaultfd,
            libc::SYS_perf_event_open,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_fanotify_init,
            libc::SYS_open_by_handle_at,
            libc::SYS_name_to_handle_at,
            libc::SYS_pidfd_getfd,
            libc::SYS_process_madvise,
            libc::SYS_kcmp,
            libc::SYS_sethostname,
            libc::SYS_setdomainname,
            libc::SYS_vhangup,
            libc::SYS_mbind,
            libc::SYS_lookup_dcookie,
            libc::SYS_uselib,
            libc::SYS__sysctl,
        ] {
            assert_eq!(x86_0(nr), EPERM, "syscall {nr}");
        }
    }

    #[test]
    fn clone3_and_newer_numbers_answer_enosys() {
        assert_eq!(x86_0(libc::SYS_clone3), ENOSYS);
        assert_eq!(x86_0(NEWEST_KNOWN + 1), ENOSYS);
        assert_eq!(x86_0(1000), ENOSYS);
        assert_eq!(x86_0(NEWEST_KNOWN), EPERM);
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
        let each_flag = |mask: libc::c_int| {
            (0..31)
                .map(move |bit| 1 << bit)
                .filter(move |b| mask & b != 0)
        };
        for ns in each_flag(CLONE_NS_FLAGS) {
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
        for ns in each_flag(UNSHARE_NS_FLAGS) {
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
        assert_eq!(x86(libc::SYS_ioctl, [0, 0x541c, 0, 0, 0, 0]), EPERM);
        // The kernel truncates the request to 32 bits, so must the filter.
        assert_eq!(
            x86(libc::SYS_ioctl, [0, (1 << 32) | 0x5412, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            x86(libc::SYS_ioctl, [0, 0x5401 /* TCGETS */, 0, 0, 0, 0]),
            ALLOW
        );
        for family in [
            40u64, /* AF_VSOCK */
            38,    /* AF_ALG */
            3,     /* AF_AX25 */
        ] {
            assert_eq!(x86(libc::SYS_socket, [family, 1, 0, 0, 0, 0]), EPERM);
        }
        for &family in ALLOWED_SOCKET_FAMILIES {
            let family = u64::from(family.unsigned_abs());
            assert_eq!(x86(libc::SYS_socket, [family, 1, 0, 0, 0, 0]), ALLOW);
        }
    }

    #[test]
    fn layout_check_rejects_unknown_programs() {
        let nr = nr32(libc::SYS_ioctl);
        assert!(guarded_checks(nr, &[stmt(BPF_RET_K, ALLOW)]).is_err());
        // The right head, then a body that does not end in a return.
        let mut compiled = vec![
            stmt(BPF_LD_W_ABS, DATA_ARCH),
            jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
            stmt(BPF_RET_K, KILL),
            stmt(BPF_LD_W_ABS, DATA_NR),
            jump(BPF_JMP_JEQ_K, nr, 0, 0),
        ];
        assert!(guarded_checks(nr, &compiled).is_err());
        compiled.push(stmt(BPF_RET_K, ALLOW));
        let block = guarded_checks(nr, &compiled).expect("a body that ends in a return");
        assert_eq!(block[0], jump(BPF_JMP_JEQ_K, nr, 0, 2));
    }
}
