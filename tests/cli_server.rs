//! The command server (`dynocap-core cli-server`, see crates/client): a command the `dynocap`
//! client hands to it behaves as the same command in a `dynocap-core` of its own — output,
//! exit code, Ctrl-C, a closed pipe, a client that dies — and the server comes and goes with
//! its home, its binary, its environment and its idle time.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use dynocap_e2e::bench::command_servers;
use dynocap_e2e::{pid_exists, require_root, wait_until, TestHome};

/// Runs commands until the home has a server (the first command of a home runs without one
/// and starts it); its pid.
fn server_of(home: &TestHome) -> i32 {
    the_one_server(
        home,
        "the home's own clients",
        || {
            let _ = home.run(&["ps"]);
        },
        |_| true,
    )
}

/// Runs `client` (a command of `what`) until exactly one of the home's servers that `pick`
/// accepts is left, with its socket in place; its pid. A client that finds no socket yet
/// starts a server as well, and either may win the socket's lock, so the server is the one
/// left once its socket exists.
fn the_one_server(
    home: &TestHome,
    what: &str,
    mut client: impl FnMut(),
    pick: impl Fn(i32) -> bool,
) -> i32 {
    let mut found = Vec::new();
    assert!(
        wait_until(30, || {
            client();
            found = command_servers(home.path())
                .into_iter()
                .filter(|(pid, _)| pick(*pid))
                .collect();
            found.len() == 1 && found[0].1.exists()
        }),
        "not exactly one listening command server for {what} in {}: {found:?}",
        home.path().display()
    );
    found[0].0
}

fn direct(home: &TestHome, args: &[&str]) -> Output {
    home.command()
        .env("DYNOCAP_CLI_SERVER", "0")
        .args(args)
        .output()
        .expect("spawn dynocap")
}

/// The identities (`pipe:[N]`, `/dev/pts/3`) of `pid`'s open descriptors.
fn open_files(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|target| target.display().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `server` holds the stdout pipe of `client` (spawned with it piped): the proof
/// that the server, not a process of the client's own, runs its command. The pipe is named
/// from this end: the client's own descriptor 1 may be elsewhere for a moment (a wrapper
/// shell's redirection).
fn assert_served(server: i32, client: &Child) {
    use std::os::fd::AsRawFd;
    let ours = client
        .stdout
        .as_ref()
        .expect("the client's stdout is piped");
    let client_stdout = std::fs::read_link(format!("/proc/self/fd/{}", ours.as_raw_fd()))
        .expect("the client's stdout")
        .display()
        .to_string();
    assert!(
        wait_until(30, || open_files(server).contains(&client_stdout)),
        "the server {server} never held the client's stdout {client_stdout}"
    );
}

/// How many of the sandbox's processes have a command line that `pattern` (a grep regex)
/// matches; the lister's own is left out.
fn guest_processes(home: &TestHome, name: &str, pattern: &str) -> usize {
    let script = format!(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null \
         | grep -v grep | grep -c '{pattern}' || true"
    );
    home.sh(name, &script).trim().parse().unwrap_or(usize::MAX)
}

fn spawn_exec(home: &TestHome, name: &str, command: &str) -> Child {
    home.command()
        .args(["exec", name, "--", command])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dynocap exec")
}

/// A sandbox `name` running `sleep SECONDS` through a served `exec`: the server's pid and
/// the client, once the sleep runs in the guest.
fn served_sleep(home: &TestHome, name: &str, seconds: u32) -> (i32, Child) {
    let server = server_of(home);
    home.sandbox(name, &[]);
    let client = spawn_exec(home, name, &format!("sleep {seconds}"));
    assert_served(server, &client);
    let running = format!("^sleep {seconds}");
    assert!(wait_until(30, || guest_processes(home, name, &running) == 1));
    (server, client)
}

#[test]
fn served_commands_print_what_their_own_process_prints() {
    if !require_root("served_commands_print_what_their_own_process_prints") {
        return;
    }
    let home = TestHome::new();
    let server = server_of(&home);
    let run = home.run(&["run", "same"]);
    assert!(run.status.success(), "{run:?}");
    let table = String::from_utf8_lossy(&run.stdout);
    assert!(
        table.starts_with("NAME") && table.contains("same "),
        "{table}"
    );
    // Served (the server holds the client's stdout while it runs the command).
    let mut probe = spawn_exec(&home, "same", "sleep 1");
    assert_served(server, &probe);
    assert!(probe.wait().expect("wait").success());

    let cases: &[&[&str]] = &[
        &["exec", "same", "--", "printf out; printf err >&2; exit 7"],
        &["exec", "same", "--", "printf '\\033[31mred\\033[0m\\n'"],
        &[
            "exec",
            "same",
            "--raw",
            "--",
            "printf '\\033[31mred\\033[0m\\n'",
        ],
        &["exec", "same", "--tty", "--", "echo on a screen"],
        &["exec", "same", "--timeout", "1", "--", "sleep 5"],
        &["exec", "same", "--", "kill -TERM $$"],
        &["exec", "same", "--env", "NOEQUALS", "--", "true"],
        &["exec", "nosuch", "--", "true"],
        &["--json", "exec", "nosuch", "--", "true"],
        &["destroy", "nosuch"],
        &["--json", "destroy", "nosuch"],
        &["ps"],
        &["--json", "ps"],
        &["run", "same"],
        &["--json", "run", "bad name!"],
    ];
    for args in cases {
        let served = home.run(args);
        let own = direct(&home, args);
        assert_eq!(
            (served.status.code(), served.status.signal()),
            (own.status.code(), own.status.signal()),
            "{args:?}: exit status"
        );
        assert_eq!(
            String::from_utf8_lossy(&served.stdout),
            String::from_utf8_lossy(&own.stdout),
            "{args:?}: stdout"
        );
        assert_eq!(
            String::from_utf8_lossy(&served.stderr),
            String::from_utf8_lossy(&own.stderr),
            "{args:?}: stderr"
        );
    }
    let destroyed = home.json(&["destroy", "same"]);
    assert_eq!(destroyed["destroyed"], "same");
    // Commands the server does not serve run in a process of their own, as before.
    let listing = home.run(&["ls"]);
    assert!(listing.status.success(), "{listing:?}");
    assert_eq!(
        command_servers(home.path()).len(),
        1,
        "still the one server"
    );
}

#[test]
fn ctrl_c_ends_a_served_exec_and_its_command_in_the_sandbox() {
    if !require_root("ctrl_c_ends_a_served_exec_and_its_command_in_the_sandbox") {
        return;
    }
    let home = TestHome::new();
    let (server, mut client) = served_sleep(&home, "interrupted", 301);
    nix_kill(client.id(), libc::SIGINT);
    let status = client.wait().expect("wait");
    assert_eq!(
        status.signal(),
        Some(libc::SIGINT),
        "ends of SIGINT, as a shell expects: {status:?}"
    );
    assert!(
        wait_until(30, || guest_processes(&home, "interrupted", "^sleep 301")
            == 0),
        "the command still runs in the sandbox"
    );
    // The server lives on, and serves the next command.
    assert!(home
        .run(&["exec", "interrupted", "--", "true"])
        .status
        .success());
    let servers: Vec<i32> = command_servers(home.path())
        .iter()
        .map(|(pid, _)| *pid)
        .collect();
    assert_eq!(servers, vec![server]);
}

#[test]
fn ctrl_c_ends_a_served_exec_whose_output_nobody_reads() {
    if !require_root("ctrl_c_ends_a_served_exec_whose_output_nobody_reads") {
        return;
    }
    let home = TestHome::new();
    let server = server_of(&home);
    home.sandbox("flooding", &[]);
    // The pipe fills, and the server's write for this command waits for room that never
    // comes: the signal must still end it.
    let mut client = spawn_exec(&home, "flooding", "exec cat /dev/zero");
    assert_served(server, &client);
    assert!(wait_until(30, || guest_processes(
        &home,
        "flooding",
        "^cat /dev/zero"
    ) == 1));
    std::thread::sleep(Duration::from_millis(300));
    nix_kill(client.id(), libc::SIGINT);
    let status = client.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
    assert!(
        wait_until(30, || guest_processes(&home, "flooding", "^cat /dev/zero")
            == 0),
        "the flood outlived its client's Ctrl-C"
    );
}

#[test]
fn a_client_killed_mid_command_takes_its_command_with_it() {
    if !require_root("a_client_killed_mid_command_takes_its_command_with_it") {
        return;
    }
    let home = TestHome::new();
    let (server, mut client) = served_sleep(&home, "orphan", 302);
    client.kill().expect("SIGKILL the client");
    let _ = client.wait();
    assert!(
        wait_until(30, || guest_processes(&home, "orphan", "^sleep 302") == 0),
        "the command of a dead client still runs"
    );
    // Its stdout is no longer held by the server: a reader sees its end.
    assert!(wait_until(10, || {
        !open_files(server).iter().any(|f| f.starts_with("pipe:"))
    }));
}

#[test]
fn a_server_killed_mid_command_says_so_and_its_command_ends() {
    if !require_root("a_server_killed_mid_command_says_so_and_its_command_ends") {
        return;
    }
    let home = TestHome::new();
    let (server, client) = served_sleep(&home, "stranded", 305);
    nix_kill(u32::try_from(server).expect("pid"), libc::SIGKILL);
    let out = client.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the command server ended before the command did")
            && stderr.contains("DYNOCAP_CLI_SERVER=0"),
        "{stderr}"
    );
    assert!(
        wait_until(30, || guest_processes(&home, "stranded", "^sleep 305") == 0),
        "the command outlived its server"
    );
    // The next command starts a new server.
    assert_ne!(server_of(&home), server);
}

#[test]
fn a_closed_output_pipe_ends_the_command_with_141_served_or_not() {
    if !require_root("a_closed_output_pipe_ends_the_command_with_141_served_or_not") {
        return;
    }
    let home = TestHome::new();
    let server = server_of(&home);
    home.sandbox("piped", &[]);
    for served in [true, false] {
        let marker = if served { "marker303" } else { "marker304" };
        let mut command = home.command();
        if !served {
            command.env("DYNOCAP_CLI_SERVER", "0");
        }
        let mut client = command
            .args([
                "exec",
                "piped",
                "--",
                &format!("while :; do echo {marker}; done"),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        if served {
            assert_served(server, &client);
        }
        let mut head = [0u8; 64];
        client
            .stdout
            .as_mut()
            .expect("stdout")
            .read_exact(&mut head)
            .expect("the command's output");
        drop(client.stdout.take());
        let status = client.wait().expect("wait");
        assert_eq!(status.code(), Some(141), "served: {served}: {status:?}");
        assert!(
            wait_until(30, || guest_processes(&home, "piped", marker) == 0),
            "served: {served}: the command runs on for nobody"
        );
    }
}

#[test]
fn concurrent_clients_each_get_their_own_output() {
    if !require_root("concurrent_clients_each_get_their_own_output") {
        return;
    }
    let home = TestHome::new();
    server_of(&home);
    home.sandbox("shared", &[]);
    let clients: Vec<(usize, Child)> = (0..12)
        .map(|i| {
            (
                i,
                spawn_exec(
                    &home,
                    "shared",
                    &format!("sleep 0.2; echo client {i}; exit {i}"),
                ),
            )
        })
        .collect();
    for (i, client) in clients {
        let out = client.wait_with_output().expect("wait");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("client {i}\n")
        );
        assert_eq!(out.status.code(), i32::try_from(i).ok());
    }
}

/// The server's children that are supervisors standing by (or were, and now supervise a
/// sandbox: a handed-over standby keeps its command line).
fn standby_children(server: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`: the fields after the last `)`.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(server) && String::from_utf8_lossy(&cmdline).contains("--standby-fd")
        })
        .collect()
}

/// The server keeps a supervisor standing by across its commands, as the MCP server does:
/// a served `run` goes to the one it started in the lull after the last start, not to a
/// process it spawns while its client waits, and the next one stands by after it.
#[test]
fn a_served_run_takes_the_supervisor_the_server_keeps_standing_by() {
    if !require_root("a_served_run_takes_the_supervisor_the_server_keeps_standing_by") {
        return;
    }
    let home = TestHome::new();
    let server = server_of(&home);
    let first = home.run(&["run", "first"]);
    assert!(first.status.success(), "{first:?}");
    let idle_standby = |home: &TestHome| -> Vec<i32> {
        let supervising = home.supervisor_pids();
        standby_children(server)
            .into_iter()
            .filter(|pid| !supervising.contains(pid))
            .collect()
    };
    let mut standing_by = Vec::new();
    assert!(
        wait_until(20, || {
            standing_by = idle_standby(&home);
            standing_by.len() == 1
        }),
        "no supervisor standing by after a served run: {standing_by:?}"
    );
    let second = home.run(&["run", "second"]);
    assert!(second.status.success(), "{second:?}");
    assert_eq!(
        home.supervisor_pid("second"),
        Some(standing_by[0]),
        "the served run did not take the standby"
    );
    assert!(
        wait_until(20, || idle_standby(&home).len() == 1),
        "no next standby after the run that took the last"
    );
    for name in ["first", "second"] {
        let destroyed = home.run(&["destroy", name]);
        assert!(destroyed.status.success(), "{destroyed:?}");
    }
}

#[test]
fn the_server_leaves_with_its_home_or_when_idle_and_comes_back_on_demand() {
    if !require_root("the_server_leaves_with_its_home_or_when_idle") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("dc")
        .tempdir_in("/tmp")
        .expect("temp");
    let path = dir.path().join("home");
    {
        let home = TestHome::at(path.clone());
        let server = server_of(&home);
        std::fs::remove_dir_all(&path).expect("remove the home");
        assert!(
            wait_until(10, || !Path::new(&format!("/proc/{server}")).exists()
                || command_servers(&path).is_empty()),
            "the server outlived its home"
        );
    }
    let home = TestHome::new().with_env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "1");
    let first = server_of(&home);
    assert!(
        wait_until(15, || command_servers(home.path()).is_empty()),
        "an idle server stayed"
    );
    assert!(
        !home
            .path()
            .join("run")
            .read_dir()
            .expect("run/")
            .flatten()
            .any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.ends_with(".sock") || name.ends_with(".lock")
            }),
        "an idle server removes its socket and its lock file"
    );
    let second = server_of(&home);
    assert_ne!(first, second);
}

#[test]
fn clients_unlike_the_server_never_reach_it() {
    if !require_root("clients_unlike_the_server_never_reach_it") {
        return;
    }
    // Another environment: another server.
    let home = TestHome::new().with_env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "5");
    server_of(&home);
    let mut other = Vec::new();
    assert!(wait_until(30, || {
        let _ = home.command().env("SOME_SETTING", "1").arg("ps").output();
        other = command_servers(home.path());
        other.len() == 2
    }));
    // Switched off: no server, and none started.
    let quiet = TestHome::new().with_env("DYNOCAP_CLI_SERVER", "0");
    for _ in 0..3 {
        assert!(quiet.run(&["ps"]).status.success());
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(command_servers(quiet.path()).is_empty());

    // A new build of dynocap-core (a new file, as installs and cargo make it): a new server;
    // the old one runs none of the new build's commands.
    let bin = tempfile::tempdir().expect("temp bin");
    let built = dynocap_e2e::bin_dir();
    for file in ["dynocap", "dynocap-core"] {
        std::fs::copy(built.join(file), bin.path().join(file)).expect("copy");
    }
    let installed = TestHome::new().with_env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "5");
    let client = |home: &TestHome| {
        let run = || {
            Command::new(bin.path().join("dynocap"))
                .env("DYNOCAP_HOME", home.path())
                .env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "5")
                .arg("ps")
                .output()
                .expect("spawn the installed client")
        };
        // A process this test binary's other threads fork between the copy above and their
        // exec holds the copy's write descriptor a moment, and exec meanwhile fails with
        // ETXTBSY (the client says "Text file busy"): a race of the test's own copying, not
        // of what is tested. Such a start is tried again; any other outcome is the answer.
        let mut out = run();
        for _ in 0..50 {
            if !String::from_utf8_lossy(&out.stderr).contains("Text file busy") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            out = run();
        }
        out
    };
    let served = |out: Output| {
        assert!(
            out.status.success(),
            "the installed client's ps: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let mut before = Vec::new();
    assert!(wait_until(30, || {
        served(client(&installed));
        before = command_servers(installed.path());
        !before.is_empty()
    }));
    let replacement = bin.path().join("dynocap-core.new");
    std::fs::copy(built.join("dynocap-core"), &replacement).expect("copy");
    std::fs::rename(&replacement, bin.path().join("dynocap-core")).expect("replace");
    let mut after = Vec::new();
    assert!(wait_until(30, || {
        served(client(&installed));
        after = command_servers(installed.path());
        after.len() == 2
    }));
    assert!(after.iter().any(|(_, socket)| socket != &before[0].1));
}

/// `dynocap ARGS` for `home`, started through `wrapper` (a program and its arguments that
/// change what the client's process inherits, then run the rest of their command line).
fn wrapped(home: &TestHome, wrapper: &[String], args: &[&str]) -> Command {
    let client = home.command();
    let mut command = Command::new(&wrapper[0]);
    command
        .args(&wrapper[1..])
        .arg(client.get_program())
        .args(args);
    for (key, value) in client.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    command
}

/// A cgroup of its own in the first cgroup hierarchy mounted, removed on drop (once the
/// processes the test put in it are gone).
struct ScratchCgroup(std::path::PathBuf);

impl ScratchCgroup {
    fn new() -> Self {
        let hierarchy = ["pids", "freezer", "cpu", "unified", ""]
            .iter()
            .map(|name| Path::new("/sys/fs/cgroup").join(name))
            .find(|dir| dir.join("cgroup.procs").exists())
            .expect("a cgroup hierarchy mounted under /sys/fs/cgroup");
        // One per test that makes one, several tests running at once in this process.
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = hierarchy.join(format!("dynocap-test-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).expect("make a cgroup");
        Self(dir)
    }
}

impl Drop for ScratchCgroup {
    fn drop(&mut self) {
        let _ = wait_until(10, || std::fs::remove_dir(&self.0).is_ok());
    }
}

/// A client that starts its command with other limits, priorities, groups or cgroup than the
/// server's must not have it run there: it reaches a server of its own, started by a client
/// like it and so running its commands as the client's own process would.
#[test]
fn a_served_command_runs_with_its_clients_limits_priority_groups_and_cgroup() {
    if !require_root("a_served_command_runs_with_its_clients_limits_priority_groups_and_cgroup") {
        return;
    }
    let cgroup = ScratchCgroup::new();
    let home = TestHome::new().with_env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "20");
    let default_server = server_of(&home);
    home.sandbox("s", &[]);
    fn proc_file(pid: i32, name: &str) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/{name}")).unwrap_or_default()
    }
    fn nice(pid: i32) -> String {
        let stat = proc_file(pid, "stat");
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        after_name
            .split_whitespace()
            .nth(16)
            .unwrap_or("")
            .to_owned()
    }
    let words = |list: &[&str]| list.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    let join_cgroup = format!(
        "echo $$ > {}/cgroup.procs && exec \"$@\"",
        cgroup.0.display()
    );
    type Has = Box<dyn Fn(i32) -> bool>;
    let cgroup_name = cgroup.0.file_name().unwrap().to_string_lossy().into_owned();
    let variants: Vec<(&str, Vec<String>, Has)> = vec![
        (
            "nice 7",
            words(&["nice", "-n", "7"]),
            Box::new(move |pid| nice(pid) == "7"),
        ),
        (
            "the idle I/O class",
            words(&["ionice", "-c", "3"]),
            Box::new(move |pid| {
                let shown = Command::new("ionice")
                    .args(["-p", &pid.to_string()])
                    .output()
                    .expect("run ionice");
                String::from_utf8_lossy(&shown.stdout).trim() == "idle"
            }),
        ),
        (
            "1000 open files",
            words(&["prlimit", "--nofile=1000:1000"]),
            Box::new(move |pid| {
                proc_file(pid, "limits")
                    .lines()
                    .any(|line| line.starts_with("Max open files") && line.contains(" 1000 "))
            }),
        ),
        (
            "supplementary group 4242",
            words(&["setpriv", "--groups", "4242"]),
            Box::new(move |pid| {
                proc_file(pid, "status")
                    .lines()
                    .any(|line| line.starts_with("Groups:") && line.contains("4242"))
            }),
        ),
        (
            "another cgroup",
            words(&["sh", "-c", &join_cgroup, "sh"]),
            Box::new(move |pid| proc_file(pid, "cgroup").contains(&cgroup_name)),
        ),
    ];
    let default_has = |has: &Has| has(default_server);
    for (what, wrapper, has) in &variants {
        assert!(!default_has(has), "the default server already has {what}");
        // The first such client finds no server for itself, runs its command in a process of
        // its own and starts one; a later one is served by it.
        let server = the_one_server(
            &home,
            what,
            || {
                let ran = wrapped(&home, wrapper, &["ps"]).output().expect("spawn");
                assert!(ran.status.success(), "{what}: {ran:?}");
            },
            has,
        );
        assert_ne!(server, default_server, "{what}");
        let client = wrapped(&home, wrapper, &["exec", "s", "--", "sleep 2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the exec");
        assert_served(server, &client);
        let done = client.wait_with_output().expect("wait for the exec");
        assert!(done.status.success(), "{what}: {done:?}");
        // The test's own clients still reach their server, which this also keeps from its
        // idle end on a slow machine.
        assert!(home.run(&["ps"]).status.success(), "after {what}");
        assert!(
            pid_exists(default_server),
            "the default server ended after {what}"
        );
    }
    // The server of the test's own clients is still the one it was, as it was.
    assert_eq!(server_of(&home), default_server);
    assert!(variants.iter().all(|(_, _, has)| !default_has(has)));
}

fn nix_kill(pid: u32, signal: i32) {
    let pid = i32::try_from(pid).expect("pid");
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid}");
}

/// The home's one listening server: its pid and socket.
fn listening_server(home: &TestHome) -> (i32, std::path::PathBuf) {
    let pid = server_of(home);
    let socket = command_servers(home.path())
        .into_iter()
        .find(|(server, _)| *server == pid)
        .map(|(_, socket)| socket)
        .expect("the server's socket");
    (pid, socket)
}

/// `dynocap-test-client SOCKET MODE...` with the environment of the home's clients, started
/// through `wrapper` (nothing, or a program that changes what the client inherits and then
/// runs the rest of its command line); what it printed: the server's answer.
fn test_client(home: &TestHome, wrapper: &[&str], socket: &Path, mode: &[&str]) -> String {
    let program = env!("CARGO_BIN_EXE_dynocap-test-client");
    let mut words: Vec<String> = wrapper.iter().map(|w| (*w).to_owned()).collect();
    words.push(program.to_owned());
    words.push(socket.display().to_string());
    words.extend(mode.iter().map(|w| (*w).to_owned()));
    let client = home.command();
    let mut command = Command::new(&words[0]);
    command.args(&words[1..]);
    for (key, value) in client.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let out = command.output().expect("spawn dynocap-test-client");
    assert!(out.status.success(), "{words:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The server's log: each refusal is said there, with its reason.
fn server_log(home: &TestHome) -> String {
    std::fs::read_to_string(home.path().join("run/cli-server.log")).unwrap_or_default()
}

/// The real attack on a command server: a process with less authority than the server
/// (fewer capabilities, `no_new_privs`, another namespace, other limits, a seccomp filter)
/// connects straight to its socket, whose name it need not compute, and asks it to run a
/// command. The server reads the client's attributes from the kernel and refuses; the same
/// request from a process like the server is served, before and after.
#[test]
fn a_client_with_other_authority_at_the_servers_own_socket_is_refused() {
    if !require_root("a_client_with_other_authority_at_the_servers_own_socket_is_refused") {
        return;
    }
    let home = TestHome::new().with_env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "120");
    let (server, socket) = listening_server(&home);
    let ps = ["request", "dynocap", "ps"];
    let served = test_client(&home, &[], &socket, &ps);
    assert!(
        served.starts_with("accepted\nNAME") && served.ends_with("exited 0\n"),
        "a client like the server is served: {served}"
    );
    let cgroup = ScratchCgroup::new();
    let procs = cgroup.0.join("cgroup.procs");
    let procs = procs.to_str().expect("the scratch cgroup's path is UTF-8");
    // perl, not sh: a POSIX shell drops the variables whose names are not shell names
    // (cargo's CARGO_BIN_EXE_dynocap-test-client), and the server would refuse the client for
    // its environment before it looked at its cgroup.
    let join_cgroup = "open(my $f, '>', shift) or die $!; print $f $$; close $f or die $!; \
                       exec @ARGV or die $!";
    let shapes: Vec<(&str, Vec<&str>, &[&str], &str)> = vec![
        (
            "every capability dropped and no_new_privs",
            vec![
                "setpriv",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
            ],
            &ps,
            "CapPrm",
        ),
        (
            "every capability dropped",
            vec!["setpriv", "--inh-caps=-all", "--bounding-set=-all"],
            &ps,
            "CapPrm",
        ),
        (
            "no_new_privs",
            vec!["setpriv", "--no-new-privs"],
            &ps,
            "NoNewPrivs",
        ),
        (
            "a user namespace mapping root",
            vec!["unshare", "-U", "--map-user=0"],
            &ps,
            "user namespace",
        ),
        (
            "at most 5 processes",
            vec!["prlimit", "--nproc=5"],
            &ps,
            "limits",
        ),
        (
            "an allow-all seccomp filter",
            vec![],
            &["seccomp-request", "dynocap", "ps"],
            "Seccomp",
        ),
        (
            "a mount namespace",
            vec!["unshare", "-m"],
            &ps,
            "mnt namespace",
        ),
        (
            "a network namespace",
            vec!["unshare", "-n"],
            &ps,
            "net namespace",
        ),
        (
            "a pid namespace",
            vec!["unshare", "-p", "-f"],
            &ps,
            "pid namespace",
        ),
        ("nice 5", vec!["nice", "-n", "5"], &ps, "nice"),
        (
            "another cgroup",
            vec!["perl", "-e", join_cgroup, procs],
            &ps,
            "cgroup",
        ),
    ];
    for (what, wrapper, mode, reason) in &shapes {
        let answer = test_client(&home, wrapper, &socket, mode);
        assert_eq!(answer, "not-served\n", "{what}");
        let log = server_log(&home);
        let last = log.lines().last().unwrap_or_default();
        assert!(
            last.contains("a client refused") && last.contains(reason),
            "{what}: the log says why, naming {reason}: {log}"
        );
    }
    // The one server, serving on.
    assert_eq!(listening_server(&home).0, server);
    let served = test_client(&home, &[], &socket, &ps);
    assert!(served.ends_with("exited 0\n"), "{served}");
    eprintln!("the server's refusals:\n{}", server_log(&home));
}

/// Each request the server cannot read is refused, its descriptors closed, and the server
/// serves the next client as before.
#[test]
fn malformed_requests_are_refused_and_the_server_keeps_serving() {
    if !require_root("malformed_requests_are_refused_and_the_server_keeps_serving") {
        return;
    }
    let home = TestHome::new().with_env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "120");
    let (server, socket) = listening_server(&home);
    let shapes: &[(&[&str], &str, &str)] = &[
        (&["fds", "1"], "not-served\n", "1 descriptors"),
        (&["fds", "2"], "not-served\n", "2 descriptors"),
        (&["fds", "3"], "not-served\n", "3 descriptors"),
        (&["fds", "200"], "not-served\n", "200 descriptors"),
        (
            &["go-fds", "0"],
            "accepted\nnot-served\n",
            "Go with 0 descriptors",
        ),
        (
            &["go-fds", "1"],
            "accepted\nnot-served\n",
            "Go with 1 descriptors",
        ),
        (
            &["go-fds", "3"],
            "accepted\nnot-served\n",
            "Go with 3 descriptors",
        ),
        (
            &["go-fds", "64"],
            "accepted\nnot-served\n",
            "Go with 64 descriptors",
        ),
        (&["truncated"], "not-served\n", "truncated"),
        (&["oversized-length"], "not-served\n", "truncated"),
        (
            &["garbage"],
            "not-served\n",
            "not a dynocap command request",
        ),
        (&["too-large"], "not-served\n", "a message larger than"),
        (&["silent"], "not-served\n", "no request within"),
    ];
    for (mode, answered, reason) in shapes {
        let answer = test_client(&home, &[], &socket, mode);
        assert_eq!(answer, *answered, "{mode:?}");
        let log = server_log(&home);
        assert!(
            log.lines().last().unwrap_or_default().contains(reason),
            "{mode:?}: {log}"
        );
        // Its descriptors are not kept: the server holds nothing of the test client's.
        let served = test_client(&home, &[], &socket, &["request", "dynocap", "ps"]);
        assert!(served.ends_with("exited 0\n"), "after {mode:?}: {served}");
    }
    // A client that gives up once accepted (it sends no `Go`): nothing runs.
    let answer = test_client(&home, &[], &socket, &["no-go", "dynocap", "run", "nogo"]);
    assert_eq!(answer, "accepted\n");
    let listing = home.run(&["ps"]);
    assert!(
        !String::from_utf8_lossy(&listing.stdout).contains("nogo"),
        "{listing:?}"
    );
    assert_eq!(listening_server(&home).0, server);
    // Only the listener, the lock, the log, the runtime's and the standard ones are left.
    let held = open_files(server);
    assert!(held.len() < 16, "the server keeps descriptors: {held:?}");
}

/// A server that is stopped: a command it was running ends with an error after the client's
/// deadline (and ends there once the server runs again); new commands pass it by and run
/// in processes of their own.
#[test]
fn a_stopped_server_holds_up_no_client() {
    if !require_root("a_stopped_server_holds_up_no_client") {
        return;
    }
    let home = TestHome::new()
        .with_env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "120")
        .with_env("DYNOCAP_CLI_SERVER_DEADLINE_MS", "1000");
    let server = server_of(&home);
    home.sandbox("held", &[]);
    // Its output to a file: the stopped server keeps the descriptors it was given until it
    // runs again, so a pipe would not end when the client does.
    let output = tempfile::NamedTempFile::new().expect("output file");
    let mut client = home
        .command()
        .args(["--json", "exec", "held", "--", "sleep 307"])
        .stdout(output.reopen().expect("reopen"))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the exec");
    let held = output.path().display().to_string();
    assert!(
        wait_until(30, || open_files(server).contains(&held)),
        "the server never held the client's stdout {held}"
    );
    assert!(wait_until(30, || guest_processes(
        &home,
        "held",
        "^sleep 307"
    ) == 1));
    nix_kill(u32::try_from(server).expect("pid"), libc::SIGSTOP);
    let status = client.wait().expect("wait");
    assert_eq!(status.code(), Some(1), "{status:?}");
    let printed = std::fs::read(output.path()).expect("read the output");
    let error: serde_json::Value =
        serde_json::from_slice(&printed).expect("a JSON error object on stdout");
    assert_eq!(error["error"]["code"], "internal", "{error}");
    let message = error["error"]["message"].as_str().expect("message");
    assert!(
        message.contains(&format!(
            "the command server (pid {server}) has not answered"
        )),
        "{message}"
    );
    // Meanwhile every command runs without it.
    for args in [
        &["ps"][..],
        &["exec", "held", "--", "true"],
        &["run", "beside"],
        &["destroy", "beside"],
    ] {
        let ran = home.run(args);
        assert!(ran.status.success(), "{args:?}: {ran:?}");
    }
    nix_kill(u32::try_from(server).expect("pid"), libc::SIGCONT);
    assert!(
        wait_until(30, || guest_processes(&home, "held", "^sleep 307") == 0),
        "the abandoned command ends once its server runs again"
    );
    assert_eq!(server_of(&home), server, "and the server serves on");
}

/// A client that connected to a socket whose listener never answers (a server stuck, or not
/// a server at all) runs its command itself after its deadline.
#[test]
fn a_server_that_never_answers_is_given_up_on_within_the_deadline() {
    if !require_root("a_server_that_never_answers_is_given_up_on_within_the_deadline") {
        return;
    }
    let home = TestHome::new()
        .with_env("DYNOCAP_CLI_SERVER_IDLE_SECONDS", "120")
        .with_env("DYNOCAP_CLI_SERVER_DEADLINE_MS", "500");
    let (server, socket) = listening_server(&home);
    // Killed, its socket left behind for another listener to take.
    nix_kill(u32::try_from(server).expect("pid"), libc::SIGKILL);
    assert!(wait_until(10, || command_servers(home.path()).is_empty()));
    let mut silent = Command::new(env!("CARGO_BIN_EXE_dynocap-test-client"))
        .arg(&socket)
        .arg("listen-silent")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the silent listener");
    let mut ready = [0u8; 10];
    silent
        .stdout
        .as_mut()
        .expect("piped")
        .read_exact(&mut ready)
        .expect("listening");
    let ps = home.run(&["--json", "ps"]);
    let _ = silent.kill();
    let _ = silent.wait();
    assert!(ps.status.success(), "{ps:?}");
    let listing: serde_json::Value = serde_json::from_slice(&ps.stdout).expect("JSON");
    assert!(listing.is_array() || listing.is_object(), "{listing}");
}

/// `--json` asks for a JSON error object whatever goes wrong, the loss of the server that
/// ran the command included.
#[test]
fn a_server_killed_mid_command_gives_a_json_error_with_json() {
    if !require_root("a_server_killed_mid_command_gives_a_json_error_with_json") {
        return;
    }
    let home = TestHome::new();
    let server = server_of(&home);
    home.sandbox("cut", &[]);
    let client = home
        .command()
        .args(["--json", "exec", "cut", "--", "sleep 306"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the exec");
    assert_served(server, &client);
    assert!(wait_until(30, || guest_processes(
        &home,
        "cut",
        "^sleep 306"
    ) == 1));
    nix_kill(u32::try_from(server).expect("pid"), libc::SIGKILL);
    let out = client.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let error: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("a JSON error object on stdout");
    assert_eq!(error["error"]["code"], "internal", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("the command server ended before the command did")),
        "{error}"
    );
}

/// Runs `dynocap ARGS` for `home` from `cwd`, with `env` on top of the home's own.
fn from_dir(home: &TestHome, cwd: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    home.command()
        .current_dir(cwd)
        .envs(env.iter().copied())
        .args(args)
        .output()
        .expect("spawn dynocap")
}

#[test]
fn a_relative_home_is_the_commands_directorys_and_no_server_makes_another() {
    if !require_root("a_relative_home_is_the_commands_directorys") {
        return;
    }
    let home = TestHome::new();
    let cwd = home.path();
    // A name of its own, so that a stray directory at `/` is this test's to see and remove.
    let relative = format!("dc-relative-home-{}", std::process::id());
    let stray = Path::new("/").join(&relative);
    for _ in 0..4 {
        let out = from_dir(&home, cwd, &[("DYNOCAP_HOME", &relative)], &["ps"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let made_at_root = stray.exists();
    if made_at_root {
        let _ = std::fs::remove_dir_all(&stray);
    }
    assert!(
        !made_at_root,
        "a command server made the relative home {relative} at / instead of in the command's directory"
    );
    assert!(
        cwd.join(&relative).join("run").is_dir(),
        "the home is where the command ran"
    );
    assert!(
        wait_until(10, || command_servers(&cwd.join(&relative)).is_empty()),
        "a server listens for a relative home"
    );
}

#[test]
fn a_relative_agent_path_is_refused_by_the_command_and_never_served() {
    if !require_root("a_relative_agent_path_is_refused_by_the_command_and_never_served") {
        return;
    }
    let home = TestHome::new();
    let env = [("DYNOCAP_AGENT", "dynocap-agent")];
    // Commands that a server would serve: none may be, since the server works from `/`,
    // where the path names another file than in the command's directory.
    for _ in 0..3 {
        let out = from_dir(&home, home.path(), &env, &["ps"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        wait_until(10, || command_servers(home.path()).is_empty()),
        "a command server serves an environment with a relative DYNOCAP_AGENT"
    );
    let out = from_dir(
        &home,
        home.path(),
        &env,
        &["run", "relagent", "--ttl", "60"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("DYNOCAP_AGENT=dynocap-agent is a relative path")
            && stderr.contains("absolute path"),
        "{stderr}"
    );
}
