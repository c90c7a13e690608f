//! The host processes that belong to a test home, found without its catalog: whatever names
//! the home in its command line, environment, working directory, root or open files. That is
//! every process a sandbox of the home runs on the host (its supervisor logs into the home, a
//! jail's processes have their root under it, QEMU, pasta and the host's git name paths in it),
//! and no other, since each test home is a fresh temporary directory.

use std::path::Path;

/// A process of the home: its pid and command line (for the failure message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeProcess {
    pub pid: i32,
    pub command: String,
}

/// The live (not zombie) processes that name `home`, this test process excepted.
pub fn home_processes(home: &Path) -> Vec<HomeProcess> {
    let needle = home.to_string_lossy().into_owned();
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me || is_zombie(pid) {
            continue;
        }
        if names(pid, &needle) {
            let command = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
                .unwrap_or_default();
            found.push(HomeProcess { pid, command });
        }
    }
    found
}

/// True while `pid` is a process that runs: neither gone nor a zombie waiting to be reaped
/// (a container's init may reap late).
pub fn is_running(pid: i32) -> bool {
    !is_zombie(pid)
}

/// True when `pid` is a zombie, or gone.
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = stat.get(stat.rfind(')')? + 2..)?.to_owned();
            rest.chars().next()
        })
        .is_none_or(|state| matches!(state, 'Z' | 'X'))
}

fn names(pid: i32, needle: &str) -> bool {
    let contains = |bytes: &[u8]| {
        bytes
            .windows(needle.len())
            .any(|window| window == needle.as_bytes())
    };
    for file in ["cmdline", "environ"] {
        if std::fs::read(format!("/proc/{pid}/{file}")).is_ok_and(|raw| contains(&raw)) {
            return true;
        }
    }
    let links = ["cwd", "root"]
        .into_iter()
        .map(|link| format!("/proc/{pid}/{link}"))
        .chain(
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|fd| fd.path().to_string_lossy().into_owned()),
        );
    for link in links {
        if std::fs::read_link(&link)
            .is_ok_and(|target| contains(target.as_os_str().as_encoded_bytes()))
        {
            return true;
        }
    }
    false
}
