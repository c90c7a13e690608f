//! `Clone`: a task's repository fetched by git inside the guest, as the sandbox user, through
//! the egress listener (HTTPS through the proxy; SSH through `dynocap-agent proxy-connect` as
//! ssh's ProxyCommand).
//!
//! An SSH key lives only for the fetch: in a fresh 0700 directory on the guest's /tmp (a
//! tmpfs, so never on a disk), owned by the sandbox user, and removed when git ends, whatever
//! happened. It is never in an argument or an environment value, only its path is. Nothing
//! else runs in the guest during the clone: the host serves no command before the start ends.

use std::ffi::CString;
use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dynocap_proto::redact::strip_userinfo;
use dynocap_proto::{CloneRequest, Response};
use nix::unistd::{fchown, Gid, Uid};
use tokio::sync::mpsc;

use crate::command::RunError;
use crate::exec::Stop;
use crate::fsutil;
use crate::git::{self, Run};
use crate::server::{Config, Outbox};
use crate::spawn::ExecUser;

/// A fresh private directory for one fetch's secrets, removed on drop.
struct FetchDir {
    path: PathBuf,
}

impl FetchDir {
    fn create(owner: ExecUser) -> Result<Self, String> {
        let path = PathBuf::from(format!(
            "/tmp/.dynocap-fetch-{}-{}",
            std::process::id(),
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
                .map(|t| t.tv_nsec())
                .unwrap_or(0)
        ));
        // `create` (not recursive) fails if anything already has the name.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|err| format!("cannot create the fetch's private directory: {err}"))?;
        let dir = Self { path };
        let fd = fsutil::open_dir_nofollow(&dir.path)
            .map_err(|err| format!("cannot open the fetch's private directory: {err}"))?;
        chown(&fd, owner)?;
        Ok(dir)
    }

    /// Writes `content` to `name` in the directory, readable by the owner only.
    fn write(&self, name: &str, content: &str, owner: ExecUser) -> Result<PathBuf, String> {
        let path = self.path.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|err| format!("cannot write the fetch's {name}: {err}"))?;
        file.write_all(content.as_bytes())
            .map_err(|err| format!("cannot write the fetch's {name}: {err}"))?;
        chown(&OwnedFd::from(file), owner)?;
        Ok(path)
    }
}

impl Drop for FetchDir {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.path) {
            log!("removing the fetch's private directory: {err}");
        }
    }
}

fn chown(fd: &OwnedFd, owner: ExecUser) -> Result<(), String> {
    fchown(
        fd.as_fd(),
        Some(Uid::from_raw(owner.uid)),
        Some(Gid::from_raw(owner.gid)),
    )
    .map_err(|err| format!("cannot hand the fetch's files to uid {}: {err}", owner.uid))
}

/// Single-quotes a path for the shell that runs ssh's ProxyCommand and GIT_SSH_COMMAND.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// The `http://127.0.0.1:PORT` the egress listener serves, from commands' settings.
fn proxy_address(config: &Config) -> Option<String> {
    config
        .egress_env
        .get()
        .into_iter()
        .find(|(key, _)| key == "https_proxy")
        .map(|(_, value)| value)
}

fn has_ca_bundle(config: &Config) -> bool {
    config
        .egress_env
        .get()
        .iter()
        .any(|(key, _)| key == "GIT_SSL_CAINFO")
}

/// Largest baseline archive sent to the host: the sandbox's disk bounds it anyway.
const ARCHIVE_MAX: u64 = 64 << 30;
/// Empty trees, for `GIT_ATTR_SOURCE`: the archive must be the commit's files exactly, whatever
/// its `.gitattributes` say (`export-ignore`, `export-subst`).
const EMPTY_TREE_SHA256: &str = "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321";

pub async fn clone(
    req: CloneRequest,
    config: &Config,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Response, String> {
    let owner = ExecUser {
        uid: req.owner_uid,
        gid: req.owner_gid,
    };
    let user = (owner.uid != nix::unistd::geteuid().as_raw()).then_some(owner);
    let proxy = proxy_address(config).ok_or(
        "the clone needs the egress listener, which is not running; the host must start it first",
    )?;
    let ssh = req.url.starts_with("ssh://") || !req.url.contains("://");
    let dest = PathBuf::from(&req.dest);
    prepare_dest(&dest, owner)?;

    let fetch = FetchDir::create(owner)?;
    let mut run_env: Vec<(&'static str, String)> = Vec::new();
    let mut settings = vec![
        "protocol.https.allow=always".to_owned(),
        "protocol.ssh.allow=always".to_owned(),
        "credential.helper=".to_owned(),
        "submodule.recurse=false".to_owned(),
        format!("http.proxy={proxy}"),
    ];
    if has_ca_bundle(config) {
        settings.push(format!("http.sslCAInfo={}", crate::egress::CA_BUNDLE));
    }
    if ssh {
        let agent = std::env::current_exe()
            .map_err(|err| format!("cannot find the agent binary for ssh's proxy: {err}"))?;
        let listener = proxy.trim_start_matches("http://");
        let known_hosts = fetch.write(
            "known_hosts",
            req.known_hosts.as_deref().unwrap_or(""),
            owner,
        )?;
        let mut command = format!(
            "ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o IdentityAgent=none \
             -o StrictHostKeyChecking=yes -o UserKnownHostsFile={} -o GlobalKnownHostsFile=/dev/null \
             -o UpdateHostKeys=no -o ConnectTimeout=30 -o ProxyCommand=\"{} proxy-connect {listener} %h %p\"",
            shell_quote(&known_hosts),
            shell_quote(&agent).replace('"', "\\\""),
        );
        if let Some(key) = &req.ssh_key {
            let key = fetch.write("key", key, owner)?;
            command.push_str(&format!(" -i {}", shell_quote(&key)));
        }
        run_env.push(("GIT_SSH_COMMAND", command));
    }

    let mut args: Vec<String> = vec!["clone".into(), "--quiet".into()];
    match req.history.as_str() {
        "head" | "none" => args.extend(["--depth".into(), "1".into(), "--single-branch".into()]),
        "branches" => args.push("--no-single-branch".into()),
        other => return Err(format!("history {other:?} is not head, branches or none")),
    }
    args.extend(["--".into(), req.url.clone(), req.dest.clone()]);

    let git = git::git(stop)
        .await
        .map_err(|err| describe(err, "the clone"))?;
    let mut run = Run::new(Path::new("/")).user(user);
    for setting in settings {
        run = run.config(setting);
    }
    for (key, value) in run_env {
        run = run.env(key, value);
    }
    let deadline = Duration::from_millis(req.timeout_ms);
    let cloned = tokio::time::timeout(deadline, git.run_status(&args, run, stop)).await;
    // The key goes before anything else happens, whatever the outcome.
    drop(fetch);
    let outcome = match cloned {
        Err(_) => Err(format!(
            "the clone did not finish within {}s; it was stopped",
            deadline.as_secs()
        )),
        Ok(Err(err)) => Err(describe(err, "the clone")),
        Ok(Ok((_, finished))) if !finished.success() => Err(format!(
            "git clone failed ({})",
            strip_userinfo(&finished.describe())
        )),
        Ok(Ok(_)) => finish(git, &dest, user, &req.history, stream, outbox, stop).await,
    };
    if outcome.is_err() {
        if let Ok(fd) = fsutil::open_dir_nofollow(&dest) {
            if let Err(err) = fsutil::remove_contents(fd.as_fd()) {
                log!("cleaning up the failed clone: {err}");
            }
        }
    }
    outcome
}

fn describe(err: RunError, what: &str) -> String {
    match err {
        RunError::Cancelled => format!("{what} was cancelled"),
        RunError::Failed(message) => strip_userinfo(&message),
    }
}

/// The destination: created for the owner, or an empty directory already there.
fn prepare_dest(dest: &Path, owner: ExecUser) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(0o755).create(dest) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(format!("cannot create {}: {err}", dest.display())),
    }
    let fd = fsutil::open_dir_nofollow(dest).map_err(|err| err.to_string())?;
    let entries = fsutil::list_dir(fd.as_fd()).map_err(|err| err.to_string())?;
    if !entries.is_empty() {
        return Err(format!(
            "{} is not empty; a clone needs an empty directory",
            dest.display()
        ));
    }
    chown(&fd, owner)
}

/// Sends the host the checked-out commit's files (its copy of the baseline, to verify patches
/// against), then answers with the commit and branch; for history `none`, the clone's `.git`
/// is removed first.
async fn finish(
    git: &git::Git,
    dest: &Path,
    user: Option<ExecUser>,
    history: &str,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Response, String> {
    let commit = git
        .run(
            &["rev-parse", "--verify", "HEAD"],
            Run::new(dest).user(user),
            stop,
        )
        .await
        .map_err(|err| describe(err, "reading the cloned commit"))?;
    let commit = git::first_line(&commit);
    if !git::is_object_id(&commit) {
        return Err(format!("the clone's HEAD is not a commit: {commit:?}"));
    }
    let branch = git
        .run_status(
            &["symbolic-ref", "--quiet", "--short", "HEAD"],
            Run::new(dest).user(user),
            stop,
        )
        .await
        .ok()
        .filter(|(_, finished)| finished.success())
        .map(|(out, _)| git::first_line(&out))
        .filter(|branch| !branch.is_empty());
    let empty_tree = if commit.len() == 64 {
        EMPTY_TREE_SHA256
    } else {
        git::EMPTY_TREE_SHA1
    };
    let mut run = Run::new(dest).user(user);
    if git.attr_source {
        run = run.env("GIT_ATTR_SOURCE", empty_tree);
    }
    crate::repo::stream_git_output(
        "archive",
        git,
        &["archive", "--format=tar", commit.as_str()],
        run,
        ARCHIVE_MAX,
        stream,
        outbox,
        stop,
    )
    .await
    .map_err(|err| describe(err, "sending the cloned files to the host"))?;
    if history == "none" {
        let fd = fsutil::open_dir_nofollow(dest).map_err(|err| err.to_string())?;
        let name = CString::new(".git").expect("a literal without NUL");
        fsutil::remove_at(fd.as_fd(), &name)
            .map_err(|err| format!("cannot remove the clone's history: {err}"))?;
    }
    Ok(Response::Cloned { commit, branch })
}
