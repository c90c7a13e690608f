//! The server's scenarios: the real server loop, in process, spoken to over an in-memory
//! duplex stream exactly as the host speaks to it, running real commands. They live here, in
//! the binary's unit tests, rather than in `crates/agent/tests/`, because they need what the
//! binary does not offer from outside: a state directory of their own per test (the binary
//! has a fixed one), the agent's spawn path and reaper for their helper processes, and the
//! private records they check (the index memo, the state directory's mode). The [`Host`]
//! harness is shared with the task requests' scenarios in [`tasks`].
//!
//! The test process is made a child subreaper (as the agent is when it is not PID 1), so
//! orphans come back to it and the reaper thread reaps them. Timing bounds are generous: the
//! machine running these has two noisy cores.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dynocap_proto::{
    channel, from_payload, to_payload, ErrorBody, ExecExit, ExecRequest, Frame, FrameKind,
    FrameReader, Hello, Request, Response, PROTOCOL_VERSION,
};
use tokio::io::{AsyncWriteExt, DuplexStream, WriteHalf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{Streams, RECENT_STREAMS};
use crate::config::Config;
use crate::init;
use crate::server::{self, Ended};

mod tasks;

/// Upper bound for any single exchange; only hit when something is broken.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// The host side of an in-process agent.
pub(crate) struct Host {
    writer: tokio::sync::Mutex<WriteHalf<DuplexStream>>,
    routes: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Frame>>>>,
    next_id: AtomicU32,
    hello: Hello,
    server: JoinHandle<Ended>,
}

/// How a stream went, as seen by the host.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) terminal: Vec<u8>,
    pub(crate) eofs: Vec<u8>,
    pub(crate) done: Option<Response>,
    pub(crate) error: Option<String>,
}

impl Outcome {
    pub(crate) fn exit(&self) -> &ExecExit {
        match &self.done {
            Some(Response::Exit(exit)) => exit,
            other => panic!("expected an exit, got {other:?} (error {:?})", self.error),
        }
    }

    pub(crate) fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub(crate) fn error(&self) -> &str {
        self.error
            .as_deref()
            .unwrap_or_else(|| panic!("expected an Error frame, got {self:?}"))
    }
}

pub(crate) struct StreamRx {
    rx: mpsc::UnboundedReceiver<Frame>,
}

impl StreamRx {
    pub(crate) async fn next(&mut self) -> Frame {
        tokio::time::timeout(PATIENCE, self.rx.recv())
            .await
            .expect("a frame within the patience limit")
            .expect("router alive")
    }

    /// Reads until the stream's last frame.
    pub(crate) async fn collect(mut self) -> Outcome {
        let mut outcome = Outcome::default();
        loop {
            let frame = self.next().await;
            match frame.kind {
                FrameKind::Data => {
                    let (chan, bytes) = frame.payload.split_first().expect("channel byte");
                    assert!(outcome.done.is_none());
                    match *chan {
                        channel::STDOUT => outcome.stdout.extend_from_slice(bytes),
                        channel::STDERR => outcome.stderr.extend_from_slice(bytes),
                        channel::TERMINAL => outcome.terminal.extend_from_slice(bytes),
                        other => panic!("data on unexpected channel {other}"),
                    }
                }
                FrameKind::Eof => outcome.eofs.push(frame.payload[0]),
                FrameKind::Done => {
                    outcome.done =
                        Some(from_payload("response", &frame.payload).expect("response"));
                    return outcome;
                }
                FrameKind::Error => {
                    let body: ErrorBody =
                        from_payload("error", &frame.payload).expect("error body");
                    outcome.error = Some(body.message);
                    return outcome;
                }
                other => panic!("unexpected {other:?} frame"),
            }
        }
    }
}

impl Host {
    pub(crate) async fn start(config: Config) -> Host {
        init::setup();
        let (host, guest) = tokio::io::duplex(256 * 1024);
        let (guest_r, guest_w) = tokio::io::split(guest);
        let server = tokio::spawn(server::serve(guest_r, guest_w, config));
        let (host_r, host_w) = tokio::io::split(host);
        let mut reader = FrameReader::new(host_r);
        let first = reader
            .read_frame()
            .await
            .expect("read")
            .expect("hello frame");
        assert_eq!((first.stream, first.kind), (0, FrameKind::Hello));
        let hello: Hello = from_payload("hello", &first.payload).expect("hello");

        let routes: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Frame>>>> = Arc::default();
        let table = Arc::clone(&routes);
        tokio::spawn(async move {
            while let Ok(Some(frame)) = reader.read_frame().await {
                let route = table.lock().expect("routes").get(&frame.stream).cloned();
                match route {
                    Some(tx) => {
                        let _ = tx.send(frame);
                    }
                    None => panic!("frame for a stream nobody opened: {frame:?}"),
                }
            }
        });
        Host {
            writer: tokio::sync::Mutex::new(host_w),
            routes,
            next_id: AtomicU32::new(1),
            hello,
            server,
        }
    }

    pub(crate) async fn send(&self, frame: Frame) {
        let bytes = frame.encode().expect("encodable");
        self.writer
            .lock()
            .await
            .write_all(&bytes)
            .await
            .expect("agent reads");
    }

    pub(crate) fn listen(&self, id: u32) -> StreamRx {
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes.lock().expect("routes").insert(id, tx);
        StreamRx { rx }
    }

    pub(crate) fn new_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) async fn open_raw(&self, id: u32, payload: Vec<u8>) -> StreamRx {
        let rx = self.listen(id);
        self.send(Frame::new(id, FrameKind::Open, payload)).await;
        rx
    }

    pub(crate) async fn open(&self, request: &Request) -> (u32, StreamRx) {
        let id = self.new_id();
        (id, self.open_raw(id, to_payload(request)).await)
    }

    pub(crate) async fn exec(&self, req: ExecRequest) -> Outcome {
        self.open(&Request::Exec(req)).await.1.collect().await
    }

    /// Half-closes the channel, as a host that goes away does, and waits for the server.
    pub(crate) async fn close(self) -> Ended {
        self.writer.lock().await.shutdown().await.expect("shutdown");
        tokio::time::timeout(PATIENCE, self.server)
            .await
            .expect("server ends")
            .expect("join")
    }
}

pub(crate) fn req(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: "/".into(),
        env: vec![],
        timeout_ms: 0,
        terminal: false,
        output_limit: 16 * 1024 * 1024,
        kill_grace_ms: 100,
        output_window: false,
    }
}

/// Fields of /proc/PID/stat after the command name: state, ppid, pgrp, …
fn proc_stat(pid: i32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

fn processes_in_group(pgid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            proc_stat(pid).is_some_and(|f| f.get(2).map(String::as_str) == Some(&pgid.to_string()))
        })
        .collect()
}

async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn first_line_pid(outcome: &Outcome) -> i32 {
    outcome
        .stdout()
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("pid on the first line")
}

#[tokio::test]
async fn hello_then_ping() {
    let host = Host::start(Config::default()).await;
    assert_eq!(host.hello.protocol, PROTOCOL_VERSION);
    assert_eq!(host.hello.agent_version, env!("CARGO_PKG_VERSION"));
    let outcome = host.open(&Request::Ping).await.1.collect().await;
    assert_eq!(outcome.done, Some(Response::Pong));
    assert!(matches!(host.close().await, Ended::Eof));
}

#[tokio::test]
async fn oom_kills_are_the_kernels_count() {
    let host = Host::start(Config::default()).await;
    // The agent's kernel here is the host's, whose count other tests' OOM kills may raise
    // at any time: the answer lies between a reading before and one after.
    let before = crate::vmstat::oom_kills().expect("this kernel counts OOM kills");
    let outcome = host.open(&Request::OomKills).await.1.collect().await;
    let after = crate::vmstat::oom_kills().expect("this kernel counts OOM kills");
    let Some(Response::OomKills { count: Some(count) }) = outcome.done else {
        panic!("not a count: {:?}", outcome.done);
    };
    assert!(
        (before..=after).contains(&count),
        "{before} <= {count} <= {after}"
    );
    assert!(matches!(host.close().await, Ended::Eof));
}

#[tokio::test]
async fn exit_codes_and_signals() {
    let host = Host::start(Config::default()).await;
    let ok = host.exec(req("true")).await;
    assert_eq!(
        (ok.exit().exit_code, ok.exit().signal.as_deref()),
        (Some(0), None)
    );
    assert!(!ok.exit().timed_out && !ok.exit().cancelled && !ok.exit().truncated);
    assert_eq!(ok.eofs, [channel::STDOUT, channel::STDERR]);

    let three = host.exec(req("exit 3")).await;
    assert_eq!(three.exit().exit_code, Some(3));

    let killed = host.exec(req("kill -9 $$")).await;
    assert_eq!(killed.exit().exit_code, None);
    assert_eq!(killed.exit().signal.as_deref(), Some("SIGKILL"));
}

#[tokio::test]
async fn stdout_and_stderr_are_separate() {
    let host = Host::start(Config::default()).await;
    let outcome = host.exec(req("echo out; echo err >&2; echo more")).await;
    assert_eq!(outcome.stdout(), "out\nmore\n");
    assert_eq!(outcome.stderr, b"err\n");
    assert_eq!(outcome.exit().exit_code, Some(0));
}

#[tokio::test]
async fn cwd_and_environment_are_honoured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cwd = dir
        .path()
        .canonicalize()
        .expect("canonical")
        .to_string_lossy()
        .into_owned();
    let host = Host::start(Config {
        exec_user: None,
        home: Some("/home/tester".into()),
        ..Config::default()
    })
    .await;
    let mut request =
        req(r#"pwd; echo "$FOO"; echo "$HOME $USER $LOGNAME $LANG $TERM"; echo "$PATH""#);
    request.cwd = cwd.clone();
    request.env = vec![
        ("FOO".into(), "bar baz".into()),
        ("LANG".into(), "en_US.UTF-8".into()),
    ];
    let outcome = host.exec(request).await;
    assert_eq!(
        outcome.stdout(),
        format!(
            "{cwd}\nbar baz\n/home/tester sandbox sandbox en_US.UTF-8 dumb\n{}\n",
            crate::spawn::BASE_PATH
        )
    );
}

#[tokio::test]
async fn bad_requests_get_error_frames() {
    let host = Host::start(Config::default()).await;
    let mut request = req("true");
    request.cwd = "/nonexistent/dir".into();
    let outcome = host.exec(request).await;
    assert_eq!(
        outcome.error(),
        "working directory /nonexistent/dir does not exist in the sandbox"
    );

    let mut request = req("true");
    request.env = vec![("A=B".into(), "x".into())];
    assert!(host
        .exec(request)
        .await
        .error()
        .contains("environment variable name"));

    let long = req(&"x".repeat(dynocap_proto::MAX_COMMAND_LEN + 1));
    assert!(host.exec(long).await.error().contains("limit"));
}

#[tokio::test]
async fn output_is_capped_per_channel() {
    let host = Host::start(Config::default()).await;
    let mut request = req("head -c 10485760 /dev/zero; head -c 10 /dev/zero >&2");
    request.output_limit = 1024 * 1024;
    let outcome = host.exec(request).await;
    assert_eq!(outcome.stdout.len(), 1024 * 1024);
    assert_eq!(outcome.stderr.len(), 10);
    assert!(outcome.exit().truncated);
    assert_eq!(outcome.exit().exit_code, Some(0));
}

#[tokio::test]
async fn extreme_timeouts_are_harmless() {
    let host = Host::start(Config::default()).await;
    let mut request = req("echo ok");
    request.timeout_ms = u64::MAX;
    request.kill_grace_ms = u64::MAX;
    let outcome = host.exec(request.clone()).await;
    assert_eq!(outcome.stdout(), "ok\n");
    assert!(!outcome.exit().timed_out);

    // A cancel with an endless grace period still ends the exec when SIGTERM works.
    request.command = "echo $$; exec sleep 100".into();
    let (id, mut rx) = host.open(&Request::Exec(request)).await;
    rx.next().await;
    host.send(Frame::new(id, FrameKind::Cancel, vec![])).await;
    let exit = rx.collect().await;
    assert_eq!(exit.exit().signal.as_deref(), Some("SIGTERM"));
}

#[tokio::test]
async fn zero_output_limit_sends_nothing() {
    let host = Host::start(Config::default()).await;
    let mut request = req("echo hidden; echo also >&2");
    request.output_limit = 0;
    let outcome = host.exec(request).await;
    assert!(outcome.stdout.is_empty() && outcome.stderr.is_empty());
    assert!(outcome.exit().truncated);
}

#[tokio::test]
async fn stdin_is_dev_null() {
    let host = Host::start(Config::default()).await;
    let mut request = req("cat; readlink /proc/$$/fd/0");
    request.timeout_ms = 30_000;
    let outcome = host.exec(request).await;
    assert!(!outcome.exit().timed_out);
    assert_eq!(outcome.stdout(), "/dev/null\n");
}

#[tokio::test]
async fn timeout_kills_the_whole_group() {
    let host = Host::start(Config::default()).await;
    let mut request = req("echo $$; trap '' TERM; sleep 100 & sleep 100");
    request.timeout_ms = 500;
    request.kill_grace_ms = 200;
    let started = Instant::now();
    let outcome = host.exec(request).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    let exit = outcome.exit();
    assert!(exit.timed_out && !exit.cancelled);
    assert_eq!(exit.signal.as_deref(), Some("SIGKILL"));
    assert!(exit.duration_ms >= 500);
    let pgid = first_line_pid(&outcome);
    assert!(
        eventually(Duration::from_secs(5), || processes_in_group(pgid)
            .is_empty())
        .await,
        "group {pgid} survived: {:?}",
        processes_in_group(pgid)
    );
}

#[tokio::test]
async fn a_background_child_holding_stdout_does_not_hold_the_exec() {
    let host = Host::start(Config::default()).await;
    let started = Instant::now();
    let outcome = host.exec(req("echo $$; sleep 30 & echo hi")).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        outcome.stdout().ends_with("\nhi\n"),
        "{:?}",
        outcome.stdout()
    );
    assert_eq!(outcome.exit().exit_code, Some(0));
    // Tidy up the sleeper, which rightly outlives its exec.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(first_line_pid(&outcome)),
        nix::sys::signal::SIGKILL,
    );
}

/// The exec returns when the command exits, not when its background job does, and keeps
/// everything the command wrote; the background job keeps running.
#[tokio::test]
async fn an_exec_that_backgrounds_a_job_returns_its_output_and_leaves_the_job_running() {
    let host = Host::start(Config::default()).await;
    let outcome = host
        .exec(req("echo $$; echo a; sleep 30 & echo b; echo $! >&2"))
        .await;
    let lines: Vec<String> = outcome.stdout().lines().map(str::to_owned).collect();
    assert_eq!(lines.get(1..), Some(&["a".to_owned(), "b".to_owned()][..]));
    assert_eq!(outcome.exit().exit_code, Some(0));
    let sleeper: i32 = String::from_utf8_lossy(&outcome.stderr)
        .trim()
        .parse()
        .expect("the sleeper's pid on stderr");
    // Alive, not a zombie: the exec ended without stopping it.
    assert!(
        proc_stat(sleeper).is_some_and(|f| f.first().map(String::as_str) != Some("Z")),
        "the background job was stopped with its exec"
    );
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(first_line_pid(&outcome)),
        nix::sys::signal::SIGKILL,
    );
}

/// What the command wrote right before exiting is never lost, however much, though a
/// background job still holds the pipe.
#[tokio::test]
async fn output_written_right_before_exit_is_drained_in_full() {
    let host = Host::start(Config::default()).await;
    for _ in 0..5 {
        let outcome = host
            .exec(req(
                "echo $$; head -c 1000000 /dev/zero | tr '\\0' x; sleep 5 &",
            ))
            .await;
        assert_eq!(outcome.exit().exit_code, Some(0));
        let stdout = outcome.stdout();
        let (pid, body) = stdout.split_once('\n').expect("the pid line");
        assert_eq!(body.len(), 1_000_000);
        assert!(body.bytes().all(|b| b == b'x'));
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid.parse().expect("a pid")),
            nix::sys::signal::SIGKILL,
        );
    }
}

/// The same through a terminal, whose output reaches the master through the tty layer.
#[tokio::test]
async fn terminal_output_written_right_before_exit_is_drained_in_full() {
    let host = Host::start(Config::default()).await;
    for _ in 0..3 {
        // The job ignores the SIGHUP the session leader's exit sends, so it holds the terminal.
        let mut request =
            req("head -c 200000 /dev/zero | tr '\\0' x; (trap '' HUP; exec sleep 5) &");
        request.terminal = true;
        let outcome = host.exec(request).await;
        assert_eq!(outcome.exit().exit_code, Some(0));
        let xs = outcome.terminal.iter().filter(|&&b| b == b'x').count();
        assert_eq!(xs, 200_000);
    }
}

#[tokio::test]
async fn a_background_child_that_keeps_writing_does_not_hold_the_exec() {
    let host = Host::start(Config::default()).await;
    let started = Instant::now();
    let outcome = host
        .exec(req(
            "echo $$; (while :; do echo x; sleep 0.01; done) & echo hi",
        ))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(outcome.exit().exit_code, Some(0));
    assert!(outcome.stdout().contains("hi\n"), "{:?}", outcome.stdout());
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(first_line_pid(&outcome)),
        nix::sys::signal::SIGKILL,
    );
}

#[tokio::test]
async fn terminal_mode_uses_a_24x80_pty() {
    let host = Host::start(Config::default()).await;
    let mut request = req("printf 'abc\\rX\\n'; stty size; tput cols; test -t 0 && echo tty-in");
    request.terminal = true;
    let outcome = host.exec(request).await;
    let text = String::from_utf8_lossy(&outcome.terminal).into_owned();
    assert!(text.contains("abc\rX"), "{text:?}");
    assert!(text.contains("24 80"), "{text:?}");
    assert!(
        text.contains("\n80\r\n") || text.contains("\r\n80\r"),
        "{text:?}"
    );
    assert!(text.contains("tty-in"), "{text:?}");
    assert!(outcome.stdout.is_empty() && outcome.stderr.is_empty());
    assert_eq!(outcome.eofs, [channel::TERMINAL]);
    assert_eq!(outcome.exit().exit_code, Some(0));
}

#[tokio::test]
async fn a_hundred_concurrent_execs() {
    let host = Arc::new(Host::start(Config::default()).await);
    let mut receivers = Vec::new();
    for i in 0..100 {
        let request = req(&format!(
            "echo task-{i}; sleep 0.2; echo err-{i} >&2; exit {}",
            i % 7
        ));
        receivers.push((i, host.open(&Request::Exec(request)).await.1));
    }
    let mut joins = tokio::task::JoinSet::new();
    for (i, rx) in receivers {
        joins.spawn(async move { (i, rx.collect().await) });
    }
    let mut seen = 0;
    while let Some(joined) = joins.join_next().await {
        let (i, outcome) = joined.expect("join");
        assert_eq!(outcome.stdout(), format!("task-{i}\n"));
        assert_eq!(outcome.stderr, format!("err-{i}\n").into_bytes());
        assert_eq!(outcome.exit().exit_code, Some(i % 7));
        seen += 1;
    }
    assert_eq!(seen, 100);
}

#[tokio::test]
async fn protocol_violations_are_answered_and_serving_goes_on() {
    let host = Host::start(Config::default()).await;
    let id = host.new_id();
    assert!(host
        .open_raw(id, b"{not json".to_vec())
        .await
        .collect()
        .await
        .error()
        .contains("malformed request"));
    // The same id works once the failed open is answered.
    let outcome = host
        .open_raw(id, to_payload(&Request::Ping))
        .await
        .collect()
        .await;
    assert_eq!(outcome.done, Some(Response::Pong));

    let id = host.new_id();
    let unknown_field = br#"{"exec":{"command":"true","bogus":1}}"#.to_vec();
    assert!(host
        .open_raw(id, unknown_field)
        .await
        .collect()
        .await
        .error()
        .contains("bogus"));

    let control = host
        .open_raw(0, to_payload(&Request::Ping))
        .await
        .collect()
        .await;
    assert!(control.error().contains("control stream"));

    let id = host.new_id();
    let mut rx = host.listen(id);
    host.send(Frame::new(id, FrameKind::Cancel, vec![])).await;
    assert_eq!(rx.next().await.kind, FrameKind::Error);
    host.send(Frame::new(id, FrameKind::Data, vec![0, b'x']))
        .await;
    assert_eq!(rx.next().await.kind, FrameKind::Error);

    // A duplicate open is refused; the stream already running is unaffected.
    let (id, mut first) = host
        .open(&Request::Exec(req("echo started; sleep 0.5; echo done")))
        .await;
    let frame = first.next().await;
    assert_eq!(frame.payload, b"\x01started\n");
    host.send(Frame::new(id, FrameKind::Open, to_payload(&Request::Ping)))
        .await;
    let duplicate = first.next().await;
    assert_eq!(duplicate.kind, FrameKind::Error);
    let body: ErrorBody = from_payload("error", &duplicate.payload).expect("body");
    assert!(body.message.contains("already open"), "{}", body.message);
    let rest = first.collect().await;
    assert_eq!(rest.stdout(), "done\n");
    assert_eq!(rest.exit().exit_code, Some(0));

    let outcome = host.open(&Request::Ping).await.1.collect().await;
    assert_eq!(outcome.done, Some(Response::Pong));
}

#[tokio::test]
async fn cancel_stops_a_running_exec() {
    let host = Host::start(Config::default()).await;
    let (id, mut rx) = host
        .open(&Request::Exec(req("echo $$; exec sleep 100")))
        .await;
    let first = rx.next().await;
    let pgid: i32 = String::from_utf8_lossy(&first.payload[1..])
        .trim()
        .parse()
        .expect("pid");
    let started = Instant::now();
    host.send(Frame::new(id, FrameKind::Cancel, vec![])).await;
    let outcome = rx.collect().await;
    assert!(started.elapsed() < Duration::from_secs(20));
    let exit = outcome.exit();
    assert!(exit.cancelled && !exit.timed_out);
    assert_eq!(exit.signal.as_deref(), Some("SIGTERM"));
    assert!(
        eventually(Duration::from_secs(5), || processes_in_group(pgid)
            .is_empty())
        .await
    );
    // A late cancel for the finished stream is not an error.
    host.send(Frame::new(id, FrameKind::Cancel, vec![])).await;
    assert_eq!(
        host.open(&Request::Ping).await.1.collect().await.done,
        Some(Response::Pong)
    );
}

#[tokio::test]
async fn orphans_are_reaped() {
    let host = Host::start(Config::default()).await;
    // The inner shell exits at once, so `sleep` is orphaned and reparented to us.
    let outcome = host
        .exec(req("sh -c 'sleep 0.3 >/dev/null 2>&1 & echo $!'"))
        .await;
    let orphan = first_line_pid(&outcome);
    let gone = eventually(Duration::from_secs(10), || proc_stat(orphan).is_none()).await;
    assert!(gone, "orphan {orphan} still there: {:?}", proc_stat(orphan));
    let our_zombies: Vec<i32> = std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            proc_stat(pid).is_some_and(|f| f[0] == "Z" && f[1] == std::process::id().to_string())
        })
        .collect();
    // Other tests may have a child exiting right now; only a lasting zombie is a failure.
    for pid in our_zombies {
        let lasting = || matches!(proc_stat(pid), Some(f) if f[0] == "Z");
        assert!(
            eventually(Duration::from_secs(5), || !lasting()).await,
            "zombie {pid} stays"
        );
    }
}

#[tokio::test]
async fn commands_run_as_the_exec_user() {
    if !nix::unistd::getuid().is_root() {
        return;
    }
    let host = Host::start(Config {
        exec_user: Some(crate::spawn::ExecUser {
            uid: 65534,
            gid: 65534,
        }),
        home: None,
        ..Config::default()
    })
    .await;
    // A host protects the agent from the OOM killer; commands must not inherit that. Lowering
    // needs CAP_SYS_RESOURCE, which a container may not grant: then only check it stays put.
    let oom = if std::fs::write("/proc/self/oom_score_adj", "-100").is_ok() {
        "0".to_owned()
    } else {
        std::fs::read_to_string("/proc/self/oom_score_adj")
            .expect("read")
            .trim()
            .to_owned()
    };
    let outcome = host
        .exec(req("id -u; id -g; id -G; cat /proc/self/oom_score_adj"))
        .await;
    assert_eq!(outcome.stdout(), format!("65534\n65534\n65534\n{oom}\n"));
}

#[tokio::test]
async fn channel_eof_kills_running_execs() {
    let host = Host::start(Config::default()).await;
    let (_id, mut rx) = host
        .open(&Request::Exec(req("echo $$; trap '' TERM; sleep 100")))
        .await;
    let first = rx.next().await;
    let pgid: i32 = String::from_utf8_lossy(&first.payload[1..])
        .trim()
        .parse()
        .expect("pid");
    assert!(matches!(host.close().await, Ended::Eof));
    assert!(
        eventually(Duration::from_secs(5), || processes_in_group(pgid)
            .is_empty())
        .await
    );
}

#[tokio::test]
async fn a_framing_error_ends_serving() {
    init::setup();
    let (mut host, guest) = tokio::io::duplex(1024);
    let (guest_r, guest_w) = tokio::io::split(guest);
    let server = tokio::spawn(server::serve(guest_r, guest_w, Config::default()));
    host.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 1])
        .await
        .expect("write");
    let ended = tokio::time::timeout(PATIENCE, server)
        .await
        .expect("ends")
        .expect("join");
    assert!(
        matches!(ended, Ended::Broken(dynocap_proto::ProtoError::Frame(_))),
        "{ended:?}"
    );
}

#[test]
fn finished_streams_are_remembered_boundedly() {
    let mut streams = Streams::default();
    let (tx, _rx) = mpsc::channel(1);
    streams.open(1, tx.clone());
    assert!(streams.known(1));
    streams.finish(1);
    assert!(streams.known(1) && !streams.active.contains_key(&1));
    // Reusing an id makes it active again and forgets it as finished.
    streams.open(1, tx);
    assert!(streams.active.contains_key(&1));
    assert!(!streams.recent_set.contains(&1));
    for id in 10..10 + u32::try_from(RECENT_STREAMS).expect("small") + 5 {
        streams.finish(id);
    }
    assert_eq!(streams.recent.len(), RECENT_STREAMS);
    assert_eq!(streams.recent_set.len(), RECENT_STREAMS);
    assert!(!streams.known(10));
}
