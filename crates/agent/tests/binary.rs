//! The built `dynocap-agent` binary, driven as the jail backend drives it: one end of a
//! socketpair passed as `--channel-fd 3`, frames spoken over the other end.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dynocap_proto::{
    channel, from_payload, to_payload, ExecRequest, Frame, FrameDecoder, FrameKind, Hello, Request,
    Response, PROTOCOL_VERSION,
};

const AGENT: &str = env!("CARGO_BIN_EXE_dynocap-agent");

struct Host {
    sock: UnixStream,
    decoder: FrameDecoder,
}

impl Host {
    /// Half-closes the host's end, as the supervisor does at shutdown: the agent must then
    /// exit 0, within a deadline.
    fn end_and_expect_a_clean_exit(&self, child: &mut Child) {
        self.sock
            .shutdown(std::net::Shutdown::Write)
            .expect("half-close");
        let status = wait_with_deadline(child, Duration::from_secs(30));
        assert_eq!(status.code(), Some(0));
    }

    fn send(&mut self, frame: &Frame) {
        self.sock
            .write_all(&frame.encode().expect("encode"))
            .expect("send");
    }

    fn recv(&mut self) -> Frame {
        let mut buf = [0_u8; 65536];
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("well-formed frames") {
                return frame;
            }
            let n = self.sock.read(&mut buf).expect("read");
            assert!(n > 0, "agent closed the channel");
            self.decoder.push(&buf[..n]);
        }
    }
}

/// Starts the agent with `theirs` as descriptor 3.
/// The agent with `extra` arguments, its channel on descriptor 3.
fn agent_command(extra: &[&str]) -> Command {
    let mut cmd = Command::new(AGENT);
    cmd.args(["--channel-fd", "3"]).args(extra);
    cmd
}

fn start_agent(theirs: &UnixStream, extra: &[&str]) -> Child {
    spawn_with_fd3(agent_command(extra), theirs)
}

/// Starts `cmd` with one end of a socketpair as its descriptor 3: the host's end, read with a
/// deadline, and the child.
fn connect(cmd: Command) -> (Host, Child) {
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let child = spawn_with_fd3(cmd, &theirs);
    drop(theirs);
    ours.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let host = Host {
        sock: ours,
        decoder: FrameDecoder::new(),
    };
    (host, child)
}

/// Spawns `cmd` with `theirs` as its descriptor 3.
fn spawn_with_fd3(mut cmd: Command, theirs: &UnixStream) -> Child {
    let raw = theirs.as_raw_fd();
    cmd.stdin(Stdio::null());
    // SAFETY: the hook only calls dup2/fcntl, which are async-signal-safe, on a descriptor that
    // stays open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if raw == 3 {
                // dup2 onto itself would keep close-on-exec.
                if libc::fcntl(3, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn the agent")
}

/// Runs an exec and returns its stdout and final response.
fn run(host: &mut Host, stream: u32, command: &str) -> (String, Response) {
    let exec = ExecRequest {
        command: command.into(),
        cwd: "/".into(),
        env: vec![],
        timeout_ms: 30_000,
        terminal: false,
        output_limit: 1 << 20,
        kill_grace_ms: 100,
        output_window: false,
    };
    host.send(&Frame::new(
        stream,
        FrameKind::Open,
        to_payload(&Request::Exec(exec)),
    ));
    let mut stdout = Vec::new();
    loop {
        let frame = host.recv();
        assert_eq!(frame.stream, stream);
        match frame.kind {
            FrameKind::Data if frame.payload[0] == channel::STDOUT => {
                stdout.extend_from_slice(&frame.payload[1..]);
            }
            FrameKind::Done => {
                let response = from_payload::<Response>("response", &frame.payload).expect("exit");
                return (String::from_utf8(stdout).expect("utf-8"), response);
            }
            FrameKind::Data | FrameKind::Eof => {}
            other => panic!("unexpected {other:?}: {frame:?}"),
        }
    }
}

fn wait_with_deadline(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let until = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            Instant::now() < until,
            "agent did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serves_a_socketpair_and_exits_cleanly_on_eof() {
    let (mut host, mut child) = connect(agent_command(&["--home", "/tmp"]));

    let hello = host.recv();
    assert_eq!((hello.stream, hello.kind), (0, FrameKind::Hello));
    let hello: Hello = from_payload("hello", &hello.payload).expect("hello");
    assert_eq!(hello.protocol, PROTOCOL_VERSION);

    host.send(&Frame::new(1, FrameKind::Open, to_payload(&Request::Ping)));
    let pong = host.recv();
    assert_eq!((pong.stream, pong.kind), (1, FrameKind::Done));
    assert_eq!(
        from_payload::<Response>("response", &pong.payload).expect("pong"),
        Response::Pong
    );

    // The channel must not leak into commands: only 0-2 are open in the shell. (No pipeline:
    // the shell would hold pipe ends of its own while `ls` looks.)
    let (stdout, exit) = run(&mut host, 2, "echo $HOME; ls -1 /proc/$$/fd");
    assert!(
        matches!(exit, Response::Exit(ref e) if e.exit_code == Some(0)),
        "{exit:?}"
    );
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("/tmp"));
    let fds: Vec<&str> = lines.collect();
    assert_eq!(fds, ["0", "1", "2"], "{stdout:?}");

    host.end_and_expect_a_clean_exit(&mut child);
}

#[test]
fn a_framing_error_is_fatal() {
    let (mut ours, theirs) = UnixStream::pair().expect("socketpair");
    let mut child = start_agent(&theirs, &[]);
    drop(theirs);
    ours.write_all(&[0xff; 16]).expect("garbage");
    let status = wait_with_deadline(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(1));
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["--bogus"][..],
        &[],
        &["--channel-fd", "987654"],
        &["--channel-path", "/nonexistent/port"],
    ] {
        let out = Command::new(AGENT)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?} should explain itself");
    }
}

/// As PID 1 of a fresh pid namespace (the jail's situation), orphans come to the agent
/// itself. Skipped where pid namespaces cannot be created.
#[test]
fn as_pid_1_it_reaps_orphans_and_ends_cleanly() {
    let probe = Command::new("unshare")
        .args(["--fork", "--pid", "--mount-proc", "true"])
        .output();
    if !probe.is_ok_and(|out| out.status.success()) {
        eprintln!("skipped: cannot create a pid namespace here");
        return;
    }
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--fork",
        "--pid",
        "--mount-proc",
        AGENT,
        "--channel-fd",
        "3",
    ]);
    let (mut host, mut child) = connect(cmd);
    assert_eq!(host.recv().kind, FrameKind::Hello);

    let command =
        "echo $PPID; sh -c 'sleep 0.2 >/dev/null 2>&1 &'; setsid sleep 1000 >/dev/null 2>&1 &";
    let (stdout, _) = run(&mut host, 1, command);
    assert_eq!(stdout, "1\n");
    // Once the orphaned sleep has exited, no zombie may remain in the namespace.
    let until = Instant::now() + Duration::from_secs(20);
    for stream in 2.. {
        let list_zombies = "sleep 0.3; cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"'";
        let (zombies, _) = run(&mut host, stream, list_zombies);
        if zombies.is_empty() {
            break;
        }
        assert!(Instant::now() < until, "zombies remain: {zombies}");
    }
    // EOF: the agent kills everything left (the setsid sleep too) and exits 0.
    host.end_and_expect_a_clean_exit(&mut child);
}

/// A flow-controlled exec sends no more output than its window until the host returns
/// credit, the channel stays free for other streams meanwhile, and every byte still comes.
#[test]
fn a_windowed_exec_waits_for_credit_without_stalling_the_channel() {
    use dynocap_proto::exec_window;

    let (mut host, mut child) = connect(agent_command(&["--home", "/tmp"]));
    assert_eq!(host.recv().kind, FrameKind::Hello);

    const TOTAL: usize = 20_000_000;
    let exec = ExecRequest {
        command: format!("head -c {TOTAL} /dev/zero"),
        cwd: "/".into(),
        env: vec![],
        timeout_ms: 120_000,
        terminal: false,
        output_limit: u64::MAX,
        kill_grace_ms: 100,
        output_window: true,
    };
    host.send(&Frame::new(
        1,
        FrameKind::Open,
        to_payload(&Request::Exec(exec.clone())),
    ));
    // No credit returned yet: while another command runs for a second (ample time for 20 MB
    // without a window), everything that comes fits the window, and the other command's end
    // comes through.
    let other = ExecRequest {
        command: "sleep 1".into(),
        output_window: false,
        ..exec.clone()
    };
    host.send(&Frame::new(
        2,
        FrameKind::Open,
        to_payload(&Request::Exec(other)),
    ));
    let (mut received, mut used) = (0, 0);
    loop {
        let frame = host.recv();
        if frame.stream == 2 {
            match frame.kind {
                FrameKind::Eof => continue,
                FrameKind::Done => break,
                other => panic!("unexpected {other:?}: {frame:?}"),
            }
        }
        assert_eq!((frame.stream, frame.kind), (1, FrameKind::Data));
        received += frame.payload.len() - 1;
        used += exec_window::cost(frame.payload.len() - 1);
        assert!(used <= exec_window::WINDOW, "{used} beyond the window");
    }
    assert!(received < TOTAL, "the exec waited for credit");

    // Credit back as the output is taken: all of it arrives.
    host.send(&exec_window::grant(1, used));
    let mut owed = 0;
    let exit = loop {
        let frame = host.recv();
        assert_eq!(frame.stream, 1);
        match frame.kind {
            FrameKind::Data => {
                received += frame.payload.len() - 1;
                owed += exec_window::cost(frame.payload.len() - 1);
                if owed >= exec_window::GRANT_BATCH {
                    host.send(&exec_window::grant(1, std::mem::take(&mut owed)));
                }
            }
            FrameKind::Eof => {}
            FrameKind::Done => {
                break from_payload::<Response>("response", &frame.payload).expect("exit")
            }
            other => panic!("unexpected {other:?}: {frame:?}"),
        }
    };
    assert!(
        matches!(exit, Response::Exit(ref e) if e.exit_code == Some(0) && !e.truncated),
        "{exit:?}"
    );
    assert_eq!(received, TOTAL, "every byte came");

    host.end_and_expect_a_clean_exit(&mut child);
}

/// One file request on `stream`: its result, or the refusal's message.
fn file_op(
    host: &mut Host,
    stream: u32,
    op: dynocap_proto::files::FileOp,
) -> Result<dynocap_proto::files::FileResult, String> {
    let request = dynocap_proto::files::FileRequest {
        cwd: "/".into(),
        op,
    };
    host.send(&Frame::new(
        stream,
        FrameKind::Open,
        to_payload(&Request::File(request)),
    ));
    let frame = host.recv();
    assert_eq!(frame.stream, stream);
    match frame.kind {
        FrameKind::Done => match from_payload::<Response>("response", &frame.payload) {
            Ok(Response::File(result)) => Ok(result),
            other => panic!("not a file result: {other:?}"),
        },
        FrameKind::Error => Err(
            from_payload::<dynocap_proto::ErrorBody>("error", &frame.payload)
                .expect("error body")
                .message,
        ),
        other => panic!("unexpected {other:?}: {frame:?}"),
    }
}

/// The file operations of a sandbox whose user is not the agent's run as that user in a
/// process of their own: the agent's own `/proc` entries (its descriptors, its root, its
/// memory map), which the kernel opens to any thread of the agent whatever its
/// credentials, are refused as they are to that user's commands, and what a write creates
/// belongs to that user.
#[test]
fn file_operations_cannot_reach_into_the_agents_own_proc_entries() {
    use dynocap_proto::files::{FileOp, FileResult};
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (the agent switches to another user)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (mut host, mut child) = connect(agent_command(&["--exec-user", "65534:65534"]));
    assert_eq!(host.recv().kind, FrameKind::Hello);
    let agent = child.id();
    let list = |path: String| FileOp::List {
        path,
        depth: 1,
        offset: 0,
    };
    let refused = file_op(&mut host, 1, list(format!("/proc/{agent}/fd"))).unwrap_err();
    assert!(refused.contains("Permission denied"), "{refused}");
    let refused = file_op(&mut host, 2, list(format!("/proc/{agent}/root/"))).unwrap_err();
    assert!(refused.contains("Permission denied"), "{refused}");
    let read = |path: String| FileOp::Read {
        path,
        offset: 0,
        length: 100,
    };
    let refused = file_op(&mut host, 3, read(format!("/proc/{agent}/maps"))).unwrap_err();
    assert!(refused.contains("Permission denied"), "{refused}");
    // /proc/self is the operation's own, as it is `cat`'s.
    let own = FileOp::Read {
        path: "/proc/self/status".into(),
        offset: 0,
        length: 64 * 1024,
    };
    let FileResult::Read { data, .. } = file_op(&mut host, 4, own).expect("own status") else {
        panic!("not a read")
    };
    let status = String::from_utf8_lossy(&data);
    assert!(
        status.contains("\nPid:\t") && !status.contains(&format!("\nPid:\t{agent}\n")),
        "{status}"
    );
    let made = dir.path().join("made");
    let written = file_op(
        &mut host,
        5,
        FileOp::Write {
            path: made.to_string_lossy().into_owned(),
            content: b"x".to_vec(),
            mode: None,
            create_dirs: false,
        },
    )
    .expect("write");
    assert!(matches!(written, FileResult::Written { created: true, .. }));
    let meta = std::fs::metadata(&made).expect("made");
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    host.end_and_expect_a_clean_exit(&mut child);
}

/// An edit that grows a file, or a write of a whole file, on a full disk is refused with the
/// file as it was (and a new file not left behind): its room is taken before a byte changes
/// (before, the edit stopped part-way and left the file cut, new text over old, and the write
/// left it empty). The helper is run as the agent runs it, in a mount namespace of its own
/// with a 64 KiB tmpfs that the test fills.
#[test]
fn an_edit_or_write_refused_on_a_full_disk_leaves_the_file_as_it_was() {
    use dynocap_proto::files::{FileOp, FileRequest};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (a tmpfs in a mount namespace)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let original = dir.path().join("original");
    std::fs::write(
        &original,
        format!("{}MARK{}", "A".repeat(8000), "B".repeat(8000)),
    )
    .expect("original");
    let in_mnt = |name: &str| mnt.join(name).to_string_lossy().into_owned();
    let ops = [
        FileOp::Edit {
            path: in_mnt("f"),
            old_text: "MARK".into(),
            new_text: "N".repeat(20_000),
            replace_all: false,
        },
        FileOp::Write {
            path: in_mnt("f"),
            content: vec![b'W'; 40_000],
            mode: None,
            create_dirs: false,
        },
        FileOp::Write {
            path: in_mnt("new"),
            content: vec![b'W'; 40_000],
            mode: None,
            create_dirs: false,
        },
    ];
    let mut helpers = String::new();
    for (n, op) in ops.into_iter().enumerate() {
        let request = dir.path().join(format!("request{n}.json"));
        let json = FileRequest {
            cwd: "/".into(),
            op,
        }
        .to_json()
        .expect("json");
        std::fs::write(&request, json).expect("request");
        helpers.push_str(&format!(
            "{AGENT} file-op 0:0 < {} && echo && ",
            request.display()
        ));
    }
    let script = format!(
        "mount -t tmpfs -o size=64k none {mnt} && cp {original} {mnt}/f \
         && {{ dd if=/dev/zero of={mnt}/fill bs=1k 2>/dev/null; true; }} \
         && {helpers} cmp {original} {mnt}/f && test ! -e {mnt}/new && echo same",
        mnt = mnt.display(),
        original = original.display(),
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.matches("No space left on device").count() == 3 && stdout.ends_with("same\n"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
