//! `sudo` inside a guest whose image opts in: the agent (guest PID 1, the guest's root) runs
//! a command as the guest's root for the sandbox user, who otherwise has no way up.
//!
//! A setuid `sudo` cannot work in a sandbox: the root filesystem is mounted `nosuid` and
//! every process runs with `no_new_privs`. So the image's `/usr/local/bin/sudo` is a link to
//! this very binary, and under that name it is a client ([`mod@client`]): it connects to the
//! broker's socket ([`SOCKET`]), sends its arguments, working directory and environment (and
//! the `VAR=value` words before the command, which set variables of the command as in sudo), and
//! passes its stdin, stdout and stderr along (`SCM_RIGHTS`); the broker ([`serve`]) checks the
//! caller's uid (`SO_PEERCRED`), starts the command as itself in the caller's directory with
//! the caller's descriptors and in the caller's command cgroup (so the command's timeout stops
//! it and all it started), and answers with its exit code. When the caller goes away (a
//! timeout killed it), the broker kills the command's process group too.
//!
//! Guest root gains nothing on the host: it is the sandbox's unprivileged host uid in the
//! sandbox's user namespace, inside the same cgroups, seccomp filter and capability bounding
//! set as everything else in the guest (see SECURITY.md).
//!
//! Wire format, client to broker: `u32` total length, then fields, each a `u32` length and its
//! bytes: the version tag (`dynocap-sudo-2`), the cwd, the argument count, the arguments, the
//! environment count, the environment entries, the assignment count, the assignments
//! (`VAR=value`, checked by both ends). All integers little-endian. Broker to client: one `i32`, the exit code
//! (128 + signal for a command killed by a signal).

mod broker;
mod client;
mod wire;

pub use broker::serve;
pub use client::{client, invoked_as_sudo};

/// The broker's socket inside the guest.
pub const SOCKET: &str = "/run/dynocap/sudo.sock";
