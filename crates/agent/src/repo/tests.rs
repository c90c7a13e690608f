//! The private repository made and reached as the sandbox user, by the real git.

use std::path::Path;

use nix::fcntl::OFlag;
use tokio::sync::mpsc;

use super::baseline::record_baseline;
use super::private::Private;
use super::request::arg_with;
use super::user_repo::{parse_head, Head};
use crate::git::{self, first_line, Git, Run};
use crate::gitguard;
use crate::spawn::{ChildSpec, ExecUser};
use crate::statedir;

/// The fallback for git older than 2.40 (Debian's 2.39 when present): no
/// `GIT_ATTR_SOURCE`, same baseline.
#[tokio::test]
async fn a_baseline_without_attr_source_support() {
    // Needs both gits of this machine (2.39 in /usr/bin, 2.47 in /usr/local/bin).
    if !Path::new("/usr/bin/git").exists() || !Path::new("/usr/local/bin/git").exists() {
        return;
    }
    crate::init::setup();
    let git = Git {
        program: c"/usr/bin/git".to_owned(),
        attr_source: false,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).expect("mkdir");
    std::fs::write(ws.join("a.txt"), "a\n").expect("write");
    let state = dir.path().join("state");
    statedir::open_state_dir(&state).expect("state dir");
    let private = Private::new(&state);
    let (_tx, mut stop) = mpsc::channel(1);
    let commit = match record_baseline(&git, &private, &ws, None, None, &mut stop).await {
        Ok(commit) => commit,
        Err(err) => panic!("{err:?}"),
    };
    // Same tree, fixed identity and date: the commit id is known in advance.
    let expected = match record_baseline(
        &Git {
            program: c"/usr/local/bin/git".to_owned(),
            attr_source: true,
        },
        &private,
        &ws,
        None,
        None,
        &mut stop,
    )
    .await
    {
        Ok(commit) => commit,
        Err(err) => panic!("{err:?}"),
    };
    assert_eq!(commit, expected);
}

/// What a process of the sandbox user may do to `pid` and to the private repository: one
/// word per thing that worked.
async fn reach_as_user(user: ExecUser, pid: i32, state: &Path) -> String {
    let state = state.display();
    let script = format!(
        "ls /proc/{pid}/fd >/dev/null 2>&1 && echo fd; \
         ls /proc/{pid}/cwd/ >/dev/null 2>&1 && echo cwd; \
         cat /proc/{pid}/environ >/dev/null 2>&1 && echo environ; \
         ls {state}/private >/dev/null 2>&1 && echo private; \
         echo 0 2>/dev/null >{state}/private/baseline.git/refs/dynocap/baseline && echo ref; \
         cat {state}/.git-exec >/dev/null 2>&1 && echo exe; \
         echo end"
    );
    let spec = ChildSpec {
        program: c"/bin/sh".to_owned(),
        argv: vec![
            c"sh".to_owned(),
            c"-c".to_owned(),
            std::ffi::CString::new(script).expect("no NUL"),
        ],
        env: crate::command::env_list([("PATH", crate::spawn::BASE_PATH)]).expect("env"),
        cwd: c"/".to_owned(),
        terminal: false,
        user: Some(user),
        stdin: None,
        cgroup: None,
        extra_group: None,
        stdio: None,
    };
    let (_tx, mut stop) = mpsc::channel(1);
    let (out, _) = crate::command::run(&spec, 1 << 20, &mut stop)
        .await
        .expect("the probe runs");
    String::from_utf8_lossy(&out).into_owned()
}

/// `/proc/<pid>/status` once the child runs `program_name`.
fn status_once_running(pid: i32, program_name: &str) -> String {
    for _ in 0..1000 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        if status.lines().next() == Some(&format!("Name:\t{program_name}")) {
            return status;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("process {pid} never ran {program_name}");
}

fn line<'a>(status: &'a str, key: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .expect("status line")
        .trim()
}

/// The guarded git runs as the sandbox user, with the git group, and neither it nor the
/// private repository can be reached by another process of that user; an ordinary
/// process of that user can be (the control, so the probe is known to work).
#[tokio::test]
async fn a_guarded_git_is_the_sandbox_user_and_out_of_its_reach() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    crate::init::setup();
    let user = ExecUser {
        uid: 1000,
        gid: 1000,
    };
    let (_tx, mut stop) = mpsc::channel(1);
    let git = git::git(&mut stop).await.expect("git");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).expect("mkdir");
    std::fs::write(ws.join("a.txt"), "a\n").expect("write");
    std::os::unix::fs::chown(&ws, Some(1000), Some(1000)).expect("chown");
    std::os::unix::fs::chown(ws.join("a.txt"), Some(1000), Some(1000)).expect("chown");
    let state = dir.path().join("state");
    let private = Private::new(&state);
    let (commit, _) = record_baseline(git, &private, &ws, Some(user), None, &mut stop)
        .await
        .expect("baseline");
    let opened = private
        .open(&git.program, git.attr_source)
        .expect("open the private repository");
    assert_eq!(opened.user, Some(user));

    // A git that waits on its standard input, so it can be looked at.
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
    let spec = git
        .spec(
            &opened.args(&ws, &["cat-file", "--batch-check"]),
            opened.run().stdin(read),
        )
        .expect("spec");
    let spawned = crate::spawn::spawn(&spec).expect("spawn git");
    let status = status_once_running(spawned.pid, ".git-exec");
    assert_eq!(line(&status, "Uid:"), "1000\t1000\t1000\t1000", "{status}");
    assert_eq!(line(&status, "Gid:"), "1000\t1000\t1000\t1000", "{status}");
    let groups = line(&status, "Groups:");
    assert!(
        groups
            .split(' ')
            .any(|g| g == gitguard::GIT_GROUP.to_string()),
        "{status}"
    );
    assert_eq!(reach_as_user(user, spawned.pid, &state).await, "end\n");
    drop(write);
    spawned.exit.await.expect("git exits");

    // The control: an ordinary process of the same user is reachable.
    let sleeper = ChildSpec {
        program: c"/bin/sleep".to_owned(),
        argv: vec![c"sleep".to_owned(), c"1000".to_owned()],
        env: Vec::new(),
        cwd: c"/".to_owned(),
        terminal: false,
        user: Some(user),
        stdin: None,
        cgroup: None,
        extra_group: None,
        stdio: None,
    };
    let spawned = crate::spawn::spawn(&sleeper).expect("spawn sleep");
    status_once_running(spawned.pid, "sleep");
    assert_eq!(
        reach_as_user(user, spawned.pid, &state).await,
        "fd\ncwd\nenviron\nend\n"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(spawned.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    spawned.exit.await.expect("sleep exits");

    // The probes could not write the baseline's ref.
    let out = git
        .run(
            &[
                arg_with("--git-dir=", &opened.git_dir),
                "rev-parse".into(),
                "refs/dynocap/baseline".into(),
            ],
            Run::new(Path::new("/")),
            &mut stop,
        )
        .await
        .expect("rev-parse");
    assert_eq!(first_line(&out), commit);
}

#[test]
fn heads_parse() {
    assert_eq!(
        parse_head("refs/heads/feature/x"),
        Ok(Head::Branch("feature/x".into()))
    );
    let id = "0123456789abcdef0123456789ABCDEF01234567";
    assert_eq!(parse_head(id), Ok(Head::Commit(id.to_ascii_lowercase())));
    for bad in [
        "refs/heads/",
        "refs/heads/-x",
        "refs/heads/a..b",
        "refs/heads/a b",
        "main",
        "refs/tags/v1",
        "0123",
    ] {
        assert!(parse_head(bad).is_err(), "{bad:?}");
    }
}
