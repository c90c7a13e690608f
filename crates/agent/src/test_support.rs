//! Helpers the agent's unit tests share. Every helper process goes through the agent's own
//! spawn path and reaper: `std::process::Command::wait` would race the reaper thread that
//! another test started, which takes every child of the test process.

use std::ffi::CString;
use std::path::Path;

use tokio::sync::mpsc;

use crate::command::{self, env_list};
use crate::spawn::ChildSpec;

/// Runs a shell script as the test process's user, with a git environment that ignores the
/// machine's configuration and accepts repositories owned by others. Panics on failure.
pub(crate) async fn sh(cwd: &Path, script: &str) -> String {
    let (out, finished) = sh_status(cwd, script).await;
    assert!(
        finished.success(),
        "{script}: {}\n{}",
        finished.describe(),
        String::from_utf8_lossy(&out)
    );
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) async fn sh_status(cwd: &Path, script: &str) -> (Vec<u8>, command::Finished) {
    let spec = ChildSpec {
        program: c"/bin/sh".to_owned(),
        argv: vec![
            c"sh".to_owned(),
            c"-c".to_owned(),
            CString::new(script).expect("no NUL"),
        ],
        env: env_list([
            ("PATH", crate::spawn::BASE_PATH),
            ("HOME", "/nonexistent"),
            ("LC_ALL", "C"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            // Looking must not rewrite the user's index as root.
            ("GIT_OPTIONAL_LOCKS", "0"),
            ("GIT_CONFIG_COUNT", "1"),
            ("GIT_CONFIG_KEY_0", "safe.directory"),
            ("GIT_CONFIG_VALUE_0", "*"),
            ("GIT_AUTHOR_NAME", "Tester"),
            ("GIT_AUTHOR_EMAIL", "tester@example.com"),
            ("GIT_COMMITTER_NAME", "Tester"),
            ("GIT_COMMITTER_EMAIL", "tester@example.com"),
        ])
        .expect("env"),
        cwd: CString::new(cwd.to_string_lossy().into_owned()).expect("no NUL"),
        terminal: false,
        user: None,
        stdin: None,
        cgroup: None,
        extra_group: None,
        stdio: None,
    };
    let (_stop_tx, mut stop) = mpsc::channel(1);
    match command::run(&spec, 256 * 1024 * 1024, &mut stop).await {
        Ok(result) => result,
        Err(err) => panic!("{script}: {err:?}"),
    }
}
