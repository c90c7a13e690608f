//! Renaming a guest's host from outside: the guest itself may not (no `CAP_SYS_ADMIN`, and
//! seccomp refuses `sethostname`). A thread of ours joins the guest's UTS namespace for the
//! call, so that nothing else of this process changes namespace.
//!
//! A warm-pool sandbox is renamed when it is claimed, on the path of its caller's `run`, where
//! starting that thread was a sizeable share of the supervisor's part. So the thread
//! can be started ahead ([`Renamer::start`]), while the sandbox waits idle, already in the
//! namespace; [`rename_once`] is the same thing for a single call.

use std::fs::File;
use std::path::PathBuf;
use std::sync::mpsc;

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::unistd::Pid;

use crate::error::JailError;

type Reply = mpsc::SyncSender<Result<(), JailError>>;

/// A thread inside a guest's UTS namespace, waiting for hostnames to set. It ends when this
/// is dropped.
#[derive(Debug)]
pub(crate) struct Renamer {
    requests: mpsc::Sender<(String, Reply)>,
}

impl Renamer {
    /// Starts the thread in the UTS namespace of the guest whose init is `init` (our
    /// unreaped child, so its pid cannot name another process).
    pub fn start(init: Pid) -> Result<Self, JailError> {
        let uts = open_namespace(init)?;
        let (requests, received) = mpsc::channel::<(String, Reply)>();
        std::thread::Builder::new()
            .name("guest-uts".into())
            .spawn(move || {
                let joined = nix::sched::setns(&uts, CloneFlags::CLONE_NEWUTS);
                drop(uts);
                for (hostname, reply) in received {
                    let done = match joined {
                        Ok(()) => set(&hostname),
                        Err(errno) => Err(not_joined(errno)),
                    };
                    let _ = reply.send(done);
                }
            })
            .map_err(|e| JailError::sys("starting the hostname thread", errno_of(&e)))?;
        Ok(Self { requests })
    }

    /// Sets the guest's hostname, through the waiting thread.
    pub fn rename(&self, hostname: &str) -> Result<(), JailError> {
        let gone = || JailError::sys("the hostname thread is gone", Errno::EIO);
        let (reply, answer) = mpsc::sync_channel(1);
        self.requests
            .send((hostname.to_owned(), reply))
            .map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

/// Sets the hostname of the guest whose init is `init` with a thread started for this call.
pub(crate) fn rename_once(init: Pid, hostname: &str) -> Result<(), JailError> {
    let uts = open_namespace(init)?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(&uts, CloneFlags::CLONE_NEWUTS).map_err(not_joined)?;
                set(hostname)
            })
            .join()
            .unwrap_or_else(|_| Err(JailError::sys("the hostname thread panicked", Errno::EIO)))
    })
}

fn open_namespace(init: Pid) -> Result<File, JailError> {
    let path = PathBuf::from(format!("/proc/{init}/ns/uts"));
    File::open(&path).map_err(|e| JailError::io("open", &path, e))
}

fn set(hostname: &str) -> Result<(), JailError> {
    nix::unistd::sethostname(hostname)
        .map_err(|e| JailError::sys(format!("setting the hostname {hostname}"), e))
}

fn not_joined(errno: Errno) -> JailError {
    JailError::sys("joining the guest's UTS namespace", errno)
}

fn errno_of(err: &std::io::Error) -> Errno {
    err.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}
