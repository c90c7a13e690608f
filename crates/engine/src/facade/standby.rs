//! A supervisor started ahead of need. A long-lived caller (the MCP server, and the CLI's
//! command server through a [`SharedStandby`]) keeps one process of
//! `dynocap supervise --standby-fd` idle beside it, holding no sandbox, record or
//! namespace. A raw sandbox's start hands it the sandbox's id, ready pipe and log over a
//! socket, instead of waiting for a new process to exec, load, initialise its runtime and
//! parse its arguments, a sizeable part of a cold MCP `run` (docs/performance.md, "Design
//! measurements").
//!
//! The server's standby (`--prepare-disk`) also makes the default sandbox's disk while it
//! waits (see `backend::start_preparing_default_start` and the jail's `start_preparing_disk`):
//! the spare a teardown left or an unnamed copy, on a loop device, mounted detached, freed by
//! the kernel if the standby dies (a spare stays the spare). The start that
//! takes the standby takes the disk, and no longer waits for the loop device and the mount,
//! which were most of what was left of a cold MCP `run`.
//!
//! The CLI's `run` starts one too, first thing, if there is none (a `dynocap-core` of its
//! own, or the command server's first `run`), so that the supervisor's process start
//! overlaps the checks and the catalog work that come before the hand-over. Its order comes
//! within milliseconds, so the disk is made on a thread of its own, beside the wait for the
//! order and the work after it, and the start waits only for what is left of it.
//!
//! The standby ends on its own when the caller does: the caller's end of the socket closes
//! and the standby's wait for an order reads end-of-file. Once it has an order it is that
//! sandbox's supervisor, exactly as a freshly spawned one, in a session of its own.
//!
//! The server's next standby starts in the lull after the calls that used the last one (see
//! `activity`), not beside them: a process start forks, which on cgroup v1 waits for the
//! machine-wide lock that the new sandbox's boot takes to move its guest between cgroups,
//! and shares this small machine's two CPUs with the boot and the client's next calls:
//! started while the sandbox booted, it slowed the `run` + `exec` + `destroy` cycle it was
//! meant to speed up.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

use crate::facade::sandboxes::Engine;
use crate::store::catalog::Kind;

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::standby";

/// The descriptor a standby reads its order from.
pub const STANDBY_ORDERS_FD: RawFd = 3;

/// The longest id an order may carry; real ones are `sbx-` and twelve characters.
const MAX_ID_LEN: usize = 64;

/// How long the home must have served no request before the next standby starts. Calls of
/// one burst (a script's `run`, `exec`, `destroy`) come within milliseconds of each other;
/// an agent's calls come seconds apart, so the standby is up long before the next `run`.
const REFILL_QUIET: Duration = Duration::from_millis(50);
/// The longest the next standby waits for that: a home never quiet still gets one.
const REFILL_MAX_WAIT: Duration = Duration::from_secs(2);

/// An idle supervisor, and the socket that gives it its sandbox.
#[derive(Debug)]
pub struct Standby {
    orders: OwnedFd,
    pid: libc::pid_t,
}

impl Standby {
    /// Starts `command` (`dynocap supervise --home H`, with the caller's environment) as a
    /// standby: in a session of its own, stdio on `/dev/null` until its order brings the
    /// sandbox's log, and reaped in the background like every supervisor. With
    /// `prepare_disk`, it makes the default start's disk on a thread from its start (for a
    /// caller whose start has the default disk, if any).
    pub fn start(mut command: Command, prepare_disk: bool) -> io::Result<Standby> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let null = OwnedFd::from(
            std::fs::File::options()
                .read(true)
                .write(true)
                .open("/dev/null")?,
        );
        command
            .arg("--standby-fd")
            .arg(STANDBY_ORDERS_FD.to_string());
        if prepare_disk {
            command.arg("--prepare-disk");
        }
        let child = crate::host::spawn::spawn(
            &command,
            &crate::host::spawn::Stdio {
                stdin: &null,
                stdout: &null,
                stderr: &null,
            },
            &[(theirs.as_raw_fd(), STANDBY_ORDERS_FD)],
            crate::host::spawn::Detach::Session,
        )?;
        let pid =
            libc::pid_t::try_from(child.id()).expect("a pid fits pid_t: the kernel gave it as one");
        child.reap_in_background();
        Ok(Standby { orders: ours, pid })
    }

    /// Hands the standby sandbox `id`, with the write end of its ready pipe and its log
    /// (the standby's stdout and stderr from then on). An error means the standby is gone
    /// (or never started) and the caller spawns a supervisor instead.
    pub fn hand_over(self, id: &str, ready: BorrowedFd<'_>, log: BorrowedFd<'_>) -> io::Result<()> {
        let fds = [ready.as_raw_fd(), log.as_raw_fd()];
        let sent = sendmsg::<()>(
            self.orders.as_raw_fd(),
            &[IoSlice::new(id.as_bytes())],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        if sent != id.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the standby supervisor took part of its order",
            ));
        }
        Ok(())
    }

    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }
}

/// What a standby is told to do: supervise sandbox `id`, reporting on `ready`, logging to
/// `log`. Both descriptors arrive close-on-exec.
#[derive(Debug)]
pub struct Order {
    pub id: String,
    pub ready: OwnedFd,
    pub log: OwnedFd,
}

/// Waits for the order on `orders`: `None` when the caller went away without giving one.
/// Anything but one well-formed order (an id, two descriptors, nothing cut off) is an error,
/// and every descriptor that came with it is closed.
pub fn await_order(orders: BorrowedFd<'_>) -> io::Result<Option<Order>> {
    let mut id = [0u8; MAX_ID_LEN + 1];
    let mut space = nix::cmsg_space!([RawFd; 3]);
    let (len, flags, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut id)];
        match recvmsg::<()>(
            orders.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for cmsg in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        // SAFETY: the kernel just installed these descriptors in this
                        // process for this message; nothing else refers to them.
                        fds.extend(
                            received
                                .into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                break (msg.bytes, msg.flags, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(err) => return Err(err.into()),
        }
    };
    if len == 0 && fds.is_empty() {
        return Ok(None);
    }
    let malformed = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("malformed standby order: {what}"),
        )
    };
    if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(malformed("cut off"));
    }
    let id = std::str::from_utf8(&id[..len]).map_err(|_| malformed("the id is not UTF-8"))?;
    let plausible = Kind::of_id(id).is_some()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !plausible {
        return Err(malformed(&format!("{id:?} is not a sandbox id")));
    }
    let Ok([ready, log]) = <[OwnedFd; 2]>::try_from(fds) else {
        return Err(malformed("it must bring two descriptors"));
    };
    Ok(Some(Order {
        id: id.to_owned(),
        ready,
        log,
    }))
}

/// An engine's standby, if it keeps one.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    wanted: AtomicBool,
    held: Mutex<Option<Standby>>,
    /// A refill is waiting for its lull: at most one does.
    refilling: AtomicBool,
}

impl Slot {
    fn take(&self) -> Option<Standby> {
        self.held.lock().ok()?.take()
    }

    /// Starts a standby with `command` unless the slot holds one; with `prepare_disk`, it
    /// makes the default start's disk ahead.
    fn fill(&self, command: Command, prepare_disk: bool) {
        let Ok(mut held) = self.held.lock() else {
            return;
        };
        if held.is_some() {
            return;
        }
        match Standby::start(command, prepare_disk) {
            Ok(standby) => *held = Some(standby),
            Err(err) => tracing::warn!(target: LOG_TARGET, "starting a standby supervisor: {err}"),
        }
    }
}

/// A standby slot that outlives the engines using it, for a long-lived process that makes an
/// engine per request (the CLI's command server, whose commands each open the catalog anew):
/// one supervisor stands by across its commands, as the MCP server's does across its calls,
/// and ends with the process.
#[derive(Debug, Clone, Default)]
pub struct SharedStandby(Arc<Slot>);

impl SharedStandby {
    /// A slot that keeps a standby from the first start that takes one on (each start's
    /// [`Engine::replenish_standby`] refills it in the next lull) if `keep`; otherwise one
    /// that holds only what a `run` starts for itself.
    pub fn new(keep: bool) -> Self {
        let slot = Slot::default();
        slot.wanted.store(keep, Ordering::Relaxed);
        Self(Arc::new(slot))
    }
}

impl Engine {
    /// Makes this engine's standby `shared`'s: what it starts there stays for the next
    /// engine given the same slot, instead of ending with this one.
    pub fn use_shared_standby(&mut self, shared: &SharedStandby) {
        self.set_standby_slot(Arc::clone(&shared.0));
    }

    /// Keeps a supervisor standing by from now on, for the raw sandboxes this engine starts:
    /// for a long-lived caller (the MCP server). Each start that takes it starts the next.
    pub fn keep_a_standby_supervisor(&self) {
        self.standby_slot().wanted.store(true, Ordering::Relaxed);
        self.fill_standby_slot();
    }

    /// For a caller about to start raw sandbox `spec` (the CLI's `run`): starts its
    /// supervisor now, as a standby, so that the process's start overlaps the checks and
    /// catalog work before the hand-over instead of following them, and so does the making of
    /// its disk if `spec` has the default one. Not when a warm pool may serve the start: a
    /// claim needs no supervisor. An unused standby ends with this process.
    pub fn start_a_standby_supervisor(&self, spec: &crate::model::spec::RunSpec) {
        if !matches!(self.config().pool_target(), Ok(0)) {
            return;
        }
        let default_disk = spec.image.is_none()
            && spec.backend.is_none()
            && spec.disk_mb == crate::model::spec::DISK_MB_DEFAULT;
        self.standby_slot()
            .fill(self.supervisor_command(), default_disk);
    }

    /// After a start that took the standby or went without one: starts the next standby,
    /// if this engine keeps one, once the home has been quiet for [`REFILL_QUIET`], on a
    /// thread of its own. The start under way counts as activity. Failures are logged: a
    /// start without a standby spawns its supervisor.
    pub(crate) fn replenish_standby(&self) {
        let slot = Arc::clone(self.standby_slot());
        if !slot.wanted.load(Ordering::Relaxed) || slot.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        crate::host::activity::note(self.home());
        let (home, command) = (self.home().clone(), self.supervisor_command());
        let waiting = Arc::clone(&slot);
        let spawned = std::thread::Builder::new()
            .name("standby-refill".into())
            .spawn(move || {
                crate::host::activity::wait_for_quiet(&home, REFILL_QUIET, REFILL_MAX_WAIT);
                waiting.fill(command, true);
                waiting.refilling.store(false, Ordering::Release);
            });
        if let Err(err) = spawned {
            tracing::warn!(target: LOG_TARGET, "starting a standby supervisor: cannot start its thread: {err}");
            slot.refilling.store(false, Ordering::Release);
        }
    }

    /// A server's standby waits seconds for its order, and makes the default disk meanwhile.
    fn fill_standby_slot(&self) {
        self.standby_slot().fill(self.supervisor_command(), true);
    }

    /// The standby, if this engine keeps one and has one; the caller hands it a sandbox
    /// ([`Standby::hand_over`]) or drops it, which ends it.
    pub(crate) fn take_standby(&self) -> Option<Standby> {
        self.standby_slot().take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    fn send(socket: &OwnedFd, payload: &[u8], fds: &[RawFd]) {
        let cmsgs = [ControlMessage::ScmRights(fds)];
        sendmsg::<()>(
            socket.as_raw_fd(),
            &[IoSlice::new(payload)],
            if fds.is_empty() { &[] } else { &cmsgs },
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .unwrap();
    }

    #[test]
    fn an_order_brings_the_id_and_working_descriptors() {
        let (ours, theirs) = pair();
        let (ready_read, ready_write) = nix::unistd::pipe().unwrap();
        let (log_read, log_write) = nix::unistd::pipe().unwrap();
        let standby = Standby {
            orders: ours,
            pid: 42,
        };
        standby
            .hand_over("sbx-abc123def456", ready_write.as_fd(), log_write.as_fd())
            .unwrap();
        drop((ready_write, log_write));
        let order = await_order(theirs.as_fd()).unwrap().expect("an order");
        assert_eq!(order.id, "sbx-abc123def456");
        let cloexec = |fd: &OwnedFd| {
            nix::fcntl::FdFlag::from_bits_truncate(
                nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap(),
            )
            .contains(nix::fcntl::FdFlag::FD_CLOEXEC)
        };
        assert!(cloexec(&order.ready) && cloexec(&order.log));
        std::fs::File::from(order.ready)
            .write_all(b"ready")
            .unwrap();
        std::fs::File::from(order.log).write_all(b"log").unwrap();
        let read_all = |fd: OwnedFd| {
            let mut text = String::new();
            std::fs::File::from(fd).read_to_string(&mut text).unwrap();
            text
        };
        assert_eq!(read_all(ready_read), "ready");
        assert_eq!(read_all(log_read), "log");
    }

    #[test]
    fn a_caller_gone_without_an_order_dismisses_the_standby() {
        let (ours, theirs) = pair();
        drop(ours);
        assert!(await_order(theirs.as_fd()).unwrap().is_none());
    }

    #[test]
    fn a_standby_gone_fails_the_hand_over() {
        let (ours, theirs) = pair();
        drop(theirs);
        let (_read, write) = nix::unistd::pipe().unwrap();
        let standby = Standby {
            orders: ours,
            pid: 1,
        };
        let err = standby
            .hand_over("sbx-abc123def456", write.as_fd(), write.as_fd())
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPIPE));
    }

    #[test]
    fn malformed_orders_are_refused_and_their_descriptors_closed() {
        let cases: [(&[u8], usize, &str); 5] = [
            (b"sbx-abc123def456", 1, "two descriptors"),
            (b"sbx-abc123def456", 3, "two descriptors"),
            (b"../../etc/passwd", 2, "not a sandbox id"),
            (b"sbx-\xff", 2, "not UTF-8"),
            (&[b'a'; MAX_ID_LEN + 10], 2, "cut off"),
        ];
        for (payload, copies, expected) in cases {
            let (ours, theirs) = pair();
            // The order brings copies of a pipe's write end; once ours is closed too, the
            // read end sees end-of-file only if the refused order left no copy open.
            let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
            send(&ours, payload, &vec![write.as_raw_fd(); copies]);
            drop(write);
            let err = await_order(theirs.as_fd()).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
            let mut byte = [0u8; 1];
            assert_eq!(
                nix::unistd::read(&read, &mut byte),
                Ok(0),
                "{expected}: a descriptor of the refused order was left open"
            );
        }
    }
    fn holds_a_standby(engine: &Engine) -> bool {
        engine.standby_slot().held.lock().unwrap().is_some()
    }

    /// The next standby starts once the home is quiet, not beside the calls that used the
    /// last one; a home that never goes quiet still gets one after [`REFILL_MAX_WAIT`].
    #[test]
    fn the_next_standby_waits_for_a_lull() {
        let dir = tempfile::tempdir().unwrap();
        let home = crate::host::home::Home::at(dir.path().to_owned()).unwrap();
        // `true` stands in for `dynocap supervise`: the slot's bookkeeping is under test.
        let engine =
            Engine::with_supervisor_exe(home.clone(), "/bin/true".into(), Default::default());
        engine.keep_a_standby_supervisor();
        assert!(holds_a_standby(&engine), "the first standby starts at once");

        drop(engine.take_standby());
        let taken = std::time::Instant::now();
        // The refill notes the start it follows as activity, so it waits a moment at least.
        engine.replenish_standby();
        // A marker in the future reads as a request served just now, for as long as it lasts.
        let hour = Duration::from_secs(3600);
        crate::host::activity::note_at(&home, std::time::SystemTime::now() + hour);
        // Asked again while one waits: no second refill (whose note of activity would end
        // the busy spell above and start a standby too soon).
        engine.replenish_standby();
        std::thread::sleep(REFILL_MAX_WAIT / 2);
        if taken.elapsed() < REFILL_MAX_WAIT {
            assert!(
                !holds_a_standby(&engine),
                "a standby started in a busy home"
            );
        }
        let deadline = taken + REFILL_MAX_WAIT * 5;
        while !holds_a_standby(&engine) {
            assert!(
                std::time::Instant::now() < deadline,
                "no standby after the longest wait"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(taken.elapsed() >= REFILL_MAX_WAIT, "{:?}", taken.elapsed());

        // Quiet for an hour: the next one starts without waiting that long.
        drop(engine.take_standby());
        while engine.standby_slot().refilling.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(10));
        }
        crate::host::activity::note_at(&home, std::time::SystemTime::now() - hour);
        let taken = std::time::Instant::now();
        engine.replenish_standby();
        while !holds_a_standby(&engine) {
            assert!(
                taken.elapsed() < REFILL_MAX_WAIT * 5,
                "no standby in a quiet home"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
