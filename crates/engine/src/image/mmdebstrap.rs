//! mmdebstrap, the tool that makes a Debian rootfs: its version (part of an image's recipe)
//! and one run of it, with its progress forwarded and a way to stop it.
//!
//! As root it runs in its own mount namespace, so the /proc, /sys and /dev it mounts in the
//! chroot vanish with it, even when it is killed: removing a dead build never meets a host
//! mount. It runs in its own process group (a Ctrl-C reaches DynoCap, which stops it) and dies
//! with the thread that started it.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::recipe::Recipe;
use crate::foundation::error::{Coded, Context, Error, ErrorCode, Result};

/// The hint every "mmdebstrap is missing" error carries.
pub const HINT: &str = "install it with `apt-get install mmdebstrap`";

/// How long mmdebstrap gets to clean up after SIGTERM before it is killed.
const TERM_GRACE: Duration = Duration::from_secs(20);

/// `mmdebstrap --version`, or the error naming how to install it.
pub fn version() -> Result<String> {
    let output = Command::new("mmdebstrap")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => MmdebstrapFailure::Missing(err),
            _ => MmdebstrapFailure::Version(err),
        })?;
    if !output.status.success() {
        return Err(MmdebstrapFailure::VersionFailed(output.status).into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Runs mmdebstrap into `rootfs`, forwarding its `I:` lines as progress.
pub(crate) fn run(
    recipe: &Recipe,
    rootfs: &Path,
    progress: &dyn Fn(&str),
    cancel: &AtomicBool,
) -> Result<()> {
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg(format!("--variant={}", recipe.variant))
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg("--format=directory")
        .arg("--verbose")
        .arg(&recipe.suite)
        .arg(rootfs)
        .arg(&recipe.mirror)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C reaches us, and we stop it (it cleans up first).
        .process_group(0);
    let root = nix::unistd::geteuid().is_root();
    if root {
        cmd.arg("--mode=root");
    }
    // SAFETY: the closure only makes raw syscalls (prctl, unshare, mount), which are
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // If this process dies (SIGKILL), mmdebstrap goes too: no orphan keeps writing
            // into a build directory the next build will remove. (The calling thread waits
            // for mmdebstrap throughout, so its exit is this process's.)
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            if root {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
                nix::mount::mount(
                    None::<&str>,
                    "/",
                    None::<&str>,
                    nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                    None::<&str>,
                )?;
            }
            Ok(())
        });
    }
    progress(&format!(
        "running mmdebstrap ({} {}, from {})",
        recipe.suite, recipe.variant, recipe.mirror
    ));
    let mut child = cmd.spawn().map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => MmdebstrapFailure::Missing(err),
        _ => MmdebstrapFailure::Start(err),
    })?;
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let mut readers = Vec::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = lines_tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        }));
    }
    drop(lines_tx);

    // The last lines, for the error of a failed build.
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut stopping_since: Option<std::time::Instant> = None;
    let status = loop {
        match lines_rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(stage) = line.strip_prefix("I: ") {
                    progress(stage);
                }
                if tail.len() == 12 {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if cancel.load(Ordering::SeqCst) {
            let group =
                nix::unistd::Pid::from_raw(-(i32::try_from(child.id()).unwrap_or(i32::MAX)));
            match stopping_since {
                None => {
                    progress("interrupted: stopping mmdebstrap");
                    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
                    stopping_since = Some(std::time::Instant::now());
                }
                Some(since) if since.elapsed() > TERM_GRACE => {
                    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
                }
                Some(_) => {}
            }
        }
        if let Some(status) = child.try_wait().context("waiting for mmdebstrap")? {
            break status;
        }
    };
    for reader in readers {
        let _ = reader.join();
    }
    if cancel.load(Ordering::SeqCst) {
        return Err(Error::internal(
            "the image build was interrupted; nothing was installed",
        ));
    }
    if !status.success() {
        let lines: Vec<_> = tail.into_iter().collect();
        return Err(MmdebstrapFailure::Failed {
            status,
            last_lines: lines.join("\n"),
        }
        .into());
    }
    Ok(())
}

/// What failed running mmdebstrap.
#[derive(Debug, thiserror::Error)]
enum MmdebstrapFailure {
    /// The program is not on `PATH` (the cause is the `NotFound` that says so).
    #[error("mmdebstrap is not installed; {HINT}")]
    Missing(#[source] std::io::Error),
    #[error("running mmdebstrap --version: {0}")]
    Version(#[source] std::io::Error),
    #[error("mmdebstrap --version failed ({0}); reinstall it: {HINT}")]
    VersionFailed(std::process::ExitStatus),
    #[error("starting mmdebstrap: {0}")]
    Start(#[source] std::io::Error),
    #[error("mmdebstrap failed ({status}); nothing was installed. Its last lines:\n{last_lines}")]
    Failed {
        status: std::process::ExitStatus,
        last_lines: String,
    },
}

impl Coded for MmdebstrapFailure {
    /// A missing or failing host tool is for the machine's operator to fix (the messages say
    /// how), as is a build that fails on the mirror or the network: never the caller's.
    fn code(&self) -> ErrorCode {
        match self {
            Self::Missing(_)
            | Self::Version(_)
            | Self::VersionFailed(_)
            | Self::Start(_)
            | Self::Failed { .. } => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_mmdebstrap_says_how_to_install_it() {
        let err = Error::from(MmdebstrapFailure::Missing(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(
            err.message,
            "mmdebstrap is not installed; install it with `apt-get install mmdebstrap`"
        );
    }
}
