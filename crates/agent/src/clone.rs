//! `Clone`: a task's repository fetched by git inside the guest, as the sandbox user, through
//! the egress listener (HTTPS through the proxy; SSH through `dynocap-agent proxy-connect` as
//! ssh's ProxyCommand).
//!
//! An SSH key, and the credentials of an https URL, live only for the fetch: in a fresh 0700
//! directory on the guest's /tmp (a tmpfs, so never on a disk), owned by the sandbox user, and
//! removed when git ends, whatever happened. They are never in an argument or an environment
//! value, only their path is; git is given the URL without credentials, so the clone's
//! `.git/config` has none either. Nothing else runs in the guest during the clone: the host
//! serves no command before the start ends.
//!
//! A server that speaks only git's dumb HTTP protocol cannot serve a shallow fetch. For
//! history `head` the whole branch is then fetched into a scratch repository in the workspace,
//! and the workspace is cloned from it at depth 1, so that the result is the one a smart
//! server gives (one commit, the same `origin`); the scratch repository is removed.

use std::ffi::{CStr, CString};
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dynocap_proto::redact::strip_userinfo;
use dynocap_proto::{CloneRequest, Response};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::{fchown, Gid, Uid};
use tokio::sync::mpsc;

use crate::checkout_tar;
use crate::command::{stop_requested, RunError};
use crate::config::Config;
use crate::fsutil;
use crate::git::{self, Run};
use crate::outbox::Outbox;
use crate::process_group::Stop;
use crate::spawn::ExecUser;

/// Why a `Clone` failed; what it had put in the destination is removed then.
#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    #[error(
        "the clone needs the egress listener, which is not running; the host must start it first"
    )]
    NoEgress,
    #[error("history {0:?} is not head, branches or none")]
    History(String),
    #[error("credentials are only handed to an https clone")]
    CredentialsNotHttps,
    #[error("the clone's URL or credentials are malformed")]
    MalformedCredentials,
    #[error("cannot create {}: {source}", path.display())]
    CreateDest { path: PathBuf, source: io::Error },
    /// The destination (or the workspace beneath it) could not be opened.
    #[error("{0}")]
    OpenDest(#[source] io::Error),
    #[error("cannot open {}: {source}", path.display())]
    OpenCheckout { path: PathBuf, source: io::Error },
    #[error("{0}")]
    ListDest(#[source] Errno),
    #[error("{} is not empty; a clone needs an empty directory", .0.display())]
    DestNotEmpty(PathBuf),
    #[error("cannot empty {}: {source}", path.display())]
    Empty { path: PathBuf, source: io::Error },
    #[error("cannot create the fetch's private directory: {0}")]
    CreateFetchDir(#[source] io::Error),
    #[error("cannot open the fetch's private directory: {0}")]
    OpenFetchDir(#[source] io::Error),
    #[error("cannot write the fetch's {name}: {source}")]
    WriteSecret {
        name: &'static str,
        source: io::Error,
    },
    #[error("cannot hand the fetch's files to uid {uid}: {source}")]
    Chown { uid: u32, source: Errno },
    #[error("cannot find the agent binary for ssh's proxy: {0}")]
    AgentBinary(#[source] io::Error),
    #[error("{} is not UTF-8", .0.display())]
    PathNotUtf8(PathBuf),
    #[error("{0} was cancelled")]
    Cancelled(&'static str),
    /// Git could not run, or ran and failed. The text is stripped of any URL userinfo, in
    /// case git echoed one.
    #[error("{}", strip_userinfo(&.0.to_string()))]
    Git(#[source] RunError),
    #[error("the clone did not finish within {0}s; it was stopped")]
    TimedOut(u64),
    #[error("internal error: {0}")]
    Worker(#[source] tokio::task::JoinError),
    #[error("cannot put the clone in place: {0}")]
    MoveUp(#[source] io::Error),
    #[error("cannot put the clone in place: {0}")]
    MoveUpSys(#[source] Errno),
    #[error(
        "cannot put the clone in place: the repository has an entry named like the scratch clone"
    )]
    ScratchNameTaken,
    #[error("cannot rewrite the clone's reflogs: {0}")]
    Reflogs(#[source] io::Error),
    #[error("cannot rewrite the clone's reflogs: {0}")]
    ReflogsSys(#[source] Errno),
    #[error("the clone's HEAD is not a commit: {0:?}")]
    HeadNotACommit(String),
    #[error(transparent)]
    Listing(#[from] checkout_tar::CheckoutError),
    #[error("cannot remove the clone's history: {0}")]
    RemoveHistory(#[source] io::Error),
    #[error("sending the cloned files to the host was cancelled")]
    SendCancelled,
    #[error("internal error sending the cloned files: {0}")]
    SendWorker(#[source] tokio::task::JoinError),
    #[error("sending the cloned files to the host: {0}")]
    Send(#[source] checkout_tar::CheckoutError),
}

impl CloneError {
    /// Whether git said the server speaks only the dumb HTTP protocol, which cannot fetch
    /// shallow.
    fn is_dumb_no_shallow(&self) -> bool {
        matches!(self, CloneError::Git(_)) && self.to_string().contains(DUMB_NO_SHALLOW)
    }
}

/// A fresh private directory for one fetch's secrets, removed on drop.
struct FetchDir {
    path: PathBuf,
}

impl FetchDir {
    fn create(owner: ExecUser) -> Result<Self, CloneError> {
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
            .map_err(CloneError::CreateFetchDir)?;
        let dir = Self { path };
        let fd = fsutil::open_dir_nofollow(&dir.path).map_err(CloneError::OpenFetchDir)?;
        chown(&fd, owner)?;
        Ok(dir)
    }

    /// Writes `content` to `name` in the directory, readable by the owner only.
    fn write(
        &self,
        name: &'static str,
        content: &str,
        owner: ExecUser,
    ) -> Result<PathBuf, CloneError> {
        let fail = |source| CloneError::WriteSecret { name, source };
        let path = self.path.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(fail)?;
        file.write_all(content.as_bytes()).map_err(fail)?;
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

fn chown(fd: &OwnedFd, owner: ExecUser) -> Result<(), CloneError> {
    fchown(
        fd.as_fd(),
        Some(Uid::from_raw(owner.uid)),
        Some(Gid::from_raw(owner.gid)),
    )
    .map_err(|source| CloneError::Chown {
        uid: owner.uid,
        source,
    })
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
/// Largest index listing read of a clone (`ls-files --stage`, about 60 bytes a file).
const LISTING_MAX: usize = 512 << 20;
/// What git says when a shallow fetch meets a server speaking only the dumb HTTP protocol.
const DUMB_NO_SHALLOW: &str = "dumb http transport does not support shallow";

pub async fn clone(
    req: CloneRequest,
    config: &Config,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<Response, CloneError> {
    let owner = ExecUser {
        uid: req.owner_uid,
        gid: req.owner_gid,
    };
    let user = (owner.uid != nix::unistd::geteuid().as_raw()).then_some(owner);
    let proxy = proxy_address(config).ok_or(CloneError::NoEgress)?;
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
    if let Some(userinfo) = &req.credentials {
        let store = fetch.write("credentials", &credential_line(&req.url, userinfo)?, owner)?;
        // Git's own `store` helper reads the file; it is the only helper (the empty value
        // above clears any other).
        settings.push(format!(
            "credential.helper=store --file={}",
            shell_quote(&store)
        ));
    }
    if ssh {
        let agent = std::env::current_exe().map_err(CloneError::AgentBinary)?;
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

    let shallow = match req.history.as_str() {
        "head" | "none" => true,
        "branches" => false,
        other => return Err(CloneError::History(other.to_owned())),
    };

    let git = git::git(stop)
        .await
        .map_err(|err| describe(err, "the clone"))?;
    let fetcher = Fetcher {
        git,
        user,
        settings,
        env: run_env,
    };
    let deadline = Duration::from_millis(req.timeout_ms);
    let cloned = tokio::time::timeout(deadline, async {
        let first = fetcher.clone_into(&req.url, &dest, shallow, stop).await;
        match first {
            Err(err) if shallow && err.is_dumb_no_shallow() => {
                log!("the server speaks only dumb HTTP; fetching the branch whole");
                clean(&dest)?;
                fetcher
                    .clone_whole_then_shallow(&req.url, &dest, owner, stop)
                    .await
            }
            other => other,
        }
    })
    .await;
    // The secrets go before anything else happens, whatever the outcome.
    drop(fetch);
    let outcome = match cloned {
        Err(_) => Err(CloneError::TimedOut(deadline.as_secs())),
        Ok(Err(err)) => Err(err),
        Ok(Ok(())) => finish(git, &dest, user, &req.history, stream, outbox, stop).await,
    };
    if outcome.is_err() {
        if let Err(err) = clean(&dest) {
            log!("cleaning up the failed clone: {err}");
        }
    }
    outcome
}

/// Empties the clone's destination.
fn clean(dest: &Path) -> Result<(), CloneError> {
    let fd = fsutil::open_dir_nofollow(dest).map_err(CloneError::OpenDest)?;
    fsutil::remove_contents(fd.as_fd()).map_err(|source| CloneError::Empty {
        path: dest.to_owned(),
        source,
    })
}

/// The line of git's credential store for `url`'s host: `https://USERINFO@HOST`. Git matches
/// it by protocol and host; a userinfo without a password gets an empty one, so that git
/// does not ask for one (it cannot: there is no terminal).
fn credential_line(url: &str, userinfo: &str) -> Result<String, CloneError> {
    let rest = url
        .strip_prefix("https://")
        .ok_or(CloneError::CredentialsNotHttps)?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.contains('@') || userinfo.contains(['\n', '\r', '/', '@']) {
        return Err(CloneError::MalformedCredentials);
    }
    let userinfo = if userinfo.contains(':') {
        userinfo.to_owned()
    } else {
        format!("{userinfo}:")
    };
    Ok(format!("https://{userinfo}@{host}\n"))
}

/// Runs the clone's gits, as the sandbox user, with the fetch's settings.
struct Fetcher<'a> {
    git: &'a git::Git,
    user: Option<ExecUser>,
    settings: Vec<String>,
    env: Vec<(&'static str, String)>,
}

impl Fetcher<'_> {
    fn run<'p>(&self, cwd: &'p Path) -> Run<'p> {
        let mut run = Run::new(cwd).user(self.user);
        for setting in &self.settings {
            run = run.config(setting.clone());
        }
        for (key, value) in &self.env {
            run = run.env(key, value.clone());
        }
        run
    }

    /// Runs git in `cwd` with extra `-c` settings; git's failure is its message.
    async fn git(
        &self,
        cwd: &Path,
        extra: &[&str],
        args: &[String],
        stop: &mut mpsc::Receiver<Stop>,
    ) -> Result<(), CloneError> {
        let mut run = self.run(cwd);
        for setting in extra {
            run = run.config(*setting);
        }
        match self.git.run_status(args, run, stop).await {
            Err(err) => Err(describe(err, "the clone")),
            Ok((_, finished)) if !finished.success() => Err(CloneError::Git(RunError::GitFailed {
                subcommand: git::subcommand(args),
                outcome: finished.describe(),
            })),
            Ok(_) => Ok(()),
        }
    }

    /// `git clone` of `url` into `dest`: the default branch alone at depth 1 (`shallow`), or
    /// every branch with its whole history.
    async fn clone_into(
        &self,
        url: &str,
        dest: &Path,
        shallow: bool,
        stop: &mut mpsc::Receiver<Stop>,
    ) -> Result<(), CloneError> {
        let mut args: Vec<String> = vec!["clone".into(), "--quiet".into()];
        if shallow {
            args.extend(["--depth".into(), "1".into(), "--single-branch".into()]);
        } else {
            args.push("--no-single-branch".into());
        }
        args.extend(["--".into(), url.to_owned(), path_arg(dest)?]);
        self.git(Path::new("/"), &[], &args, stop).await
    }

    /// For a server that cannot fetch shallow: the default branch whole into a scratch bare
    /// repository in `dest`, cloned from there at depth 1 into a second scratch directory
    /// whose entries then move up into `dest`, `origin` pointing at `url` again. The result
    /// is the shallow clone a smart server gives.
    async fn clone_whole_then_shallow(
        &self,
        url: &str,
        dest: &Path,
        owner: ExecUser,
        stop: &mut mpsc::Receiver<Stop>,
    ) -> Result<(), CloneError> {
        let tag = format!(
            ".dynocap-dumb-{}-{}",
            std::process::id(),
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
                .map(|t| t.tv_nsec())
                .unwrap_or(0)
        );
        let whole = dest.join(format!("{tag}.git"));
        let shallow = dest.join(&tag);
        let args = vec![
            "clone".into(),
            "--quiet".into(),
            "--bare".into(),
            "--single-branch".into(),
            "--".into(),
            url.to_owned(),
            path_arg(&whole)?,
        ];
        self.git(Path::new("/"), &[], &args, stop).await?;
        let args = vec![
            "clone".into(),
            "--quiet".into(),
            "--depth".into(),
            "1".into(),
            "--single-branch".into(),
            "--".into(),
            format!("file://{}", path_arg(&whole)?),
            path_arg(&shallow)?,
        ];
        self.git(Path::new("/"), &["protocol.file.allow=always"], &args, stop)
            .await?;
        let args = vec![
            "remote".into(),
            "set-url".into(),
            "origin".into(),
            "--".into(),
            url.to_owned(),
        ];
        self.git(&shallow, &[], &args, stop).await?;
        let (dest, whole_name, shallow_name) = (
            dest.to_path_buf(),
            CString::new(format!("{tag}.git")).expect("a name without NUL"),
            CString::new(tag).expect("a name without NUL"),
        );
        let scratch_url = format!("file://{}", path_arg(&whole)?);
        let url = url.to_owned();
        tokio::task::spawn_blocking(move || {
            move_up(&dest, &whole_name, &shallow_name, owner)?;
            name_the_source_in_reflogs(&dest, &scratch_url, &url)
        })
        .await
        .map_err(CloneError::Worker)?
    }
}

/// Removes the scratch bare repository `whole` from `dest` and moves every entry of the
/// scratch clone `shallow` up into `dest`, then removes `shallow`. Renames within one
/// directory tree: nothing is copied, nothing is followed.
fn move_up(dest: &Path, whole: &CStr, shallow: &CStr, owner: ExecUser) -> Result<(), CloneError> {
    let fail = CloneError::MoveUpSys;
    let dest_fd = fsutil::open_dir_nofollow(dest).map_err(CloneError::MoveUp)?;
    fsutil::remove_at(dest_fd.as_fd(), whole).map_err(CloneError::MoveUp)?;
    let from = fsutil::open_dir_at(dest_fd.as_fd(), shallow).map_err(fail)?;
    for name in fsutil::list_dir(from.as_fd()).map_err(fail)? {
        if name.as_c_str() == shallow {
            return Err(CloneError::ScratchNameTaken);
        }
        nix::fcntl::renameat(
            from.as_fd(),
            name.as_c_str(),
            dest_fd.as_fd(),
            name.as_c_str(),
        )
        .map_err(fail)?;
    }
    drop(from);
    nix::unistd::unlinkat(
        dest_fd.as_fd(),
        shallow,
        nix::unistd::UnlinkatFlags::RemoveDir,
    )
    .map_err(fail)?;
    chown(&dest_fd, owner)
}

/// The second clone's reflog entries say `clone: from file://<scratch>`; a clone from the
/// server says `clone: from <url>`. Rewrites the first into the second in every log under
/// `.git/logs`, which git made moments ago (nothing else runs in the guest); each file is
/// opened beneath the workspace without following a symlink.
fn name_the_source_in_reflogs(dest: &Path, scratch_url: &str, url: &str) -> Result<(), CloneError> {
    let fail = CloneError::ReflogsSys;
    let dest_fd = fsutil::open_dir_nofollow(dest).map_err(CloneError::Reflogs)?;
    let mut dirs = vec![PathBuf::from(".git/logs")];
    while let Some(dir) = dirs.pop() {
        let dir_fd =
            match fsutil::open_beneath(dest_fd.as_fd(), dir.as_os_str(), fsutil::dir_flags()) {
                Ok(fd) => fd,
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(err) => return Err(fail(err)),
            };
        for (name, kind) in fsutil::entries(dir_fd.as_fd()).map_err(fail)? {
            let rel = dir.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
            match kind {
                Some(nix::dir::Type::Directory) => dirs.push(rel),
                Some(nix::dir::Type::File) => {
                    let fd = fsutil::open_beneath(dest_fd.as_fd(), rel.as_os_str(), OFlag::O_RDWR)
                        .map_err(fail)?;
                    let mut file = std::fs::File::from(fd);
                    let mut text = Vec::new();
                    file.read_to_end(&mut text).map_err(CloneError::Reflogs)?;
                    let rewritten = replace_all(&text, scratch_url.as_bytes(), url.as_bytes());
                    if rewritten != text {
                        file.set_len(0).map_err(CloneError::Reflogs)?;
                        file.write_all_at(&rewritten, 0)
                            .map_err(CloneError::Reflogs)?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// `haystack` with every `from` replaced by `to`.
fn replace_all(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(at) = rest.windows(from.len()).position(|w| w == from) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(to);
        rest = &rest[at + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

fn path_arg(path: &Path) -> Result<String, CloneError> {
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| CloneError::PathNotUtf8(path.to_owned()))
}

/// A git run's failure as the clone reports it: a cancel names `what` was cancelled.
fn describe(err: RunError, what: &'static str) -> CloneError {
    match err {
        RunError::Cancelled => CloneError::Cancelled(what),
        err => CloneError::Git(err),
    }
}

/// The destination: created for the owner, or an empty directory already there.
fn prepare_dest(dest: &Path, owner: ExecUser) -> Result<(), CloneError> {
    match std::fs::DirBuilder::new().mode(0o755).create(dest) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(CloneError::CreateDest {
                path: dest.to_owned(),
                source,
            })
        }
    }
    let fd = fsutil::open_dir_nofollow(dest).map_err(CloneError::OpenDest)?;
    let entries = fsutil::list_dir(fd.as_fd()).map_err(CloneError::ListDest)?;
    if !entries.is_empty() {
        return Err(CloneError::DestNotEmpty(dest.to_owned()));
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
) -> Result<Response, CloneError> {
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
        return Err(CloneError::HeadNotACommit(commit));
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
    // The host's copy is the checkout as it is on disk (see `checkout_tar`).
    let mut listing = Run::new(dest).user(user);
    listing.cap = LISTING_MAX;
    let listing = git
        .run(&["ls-files", "-z", "--stage"], listing, stop)
        .await
        .map_err(|err| describe(err, "listing the cloned files"))?;
    let entries = checkout_tar::parse_listing(&listing)?;
    drop(listing);
    send_checkout(dest, entries, stream, outbox, stop).await?;
    if history == "none" {
        let fd = fsutil::open_dir_nofollow(dest).map_err(CloneError::OpenDest)?;
        let name = CString::new(".git").expect("a literal without NUL");
        fsutil::remove_at(fd.as_fd(), &name).map_err(CloneError::RemoveHistory)?;
    }
    Ok(Response::Cloned { commit, branch })
}

/// Sends the checked-out `entries` beneath `dest` to the host as a tar, from the blocking
/// pool; a stop request ends it between writes.
async fn send_checkout(
    dest: &Path,
    entries: Vec<checkout_tar::Entry>,
    stream: u32,
    outbox: &Outbox,
    stop: &mut mpsc::Receiver<Stop>,
) -> Result<(), CloneError> {
    let workspace = fsutil::open_dir_nofollow(dest).map_err(|source| CloneError::OpenCheckout {
        path: dest.to_owned(),
        source,
    })?;
    let cancelled = Arc::new(AtomicBool::new(false));
    let writer = checkout_tar::FrameWriter::new(outbox.sender(), stream, Arc::clone(&cancelled));
    let flag = Arc::clone(&cancelled);
    let mut sending = tokio::task::spawn_blocking(move || {
        checkout_tar::write_tar(&workspace, &entries, writer, ARCHIVE_MAX, &flag)
    });
    let sent = tokio::select! {
        sent = &mut sending => sent,
        () = stop_requested(stop) => {
            cancelled.store(true, Ordering::Relaxed);
            let _ = sending.await;
            return Err(CloneError::SendCancelled);
        }
    };
    sent.map_err(CloneError::SendWorker)?
        .map_err(CloneError::Send)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credential_line_names_the_host_and_always_a_password() {
        assert_eq!(
            credential_line("https://git.example/o/r.git", "me:t%40k").unwrap(),
            "https://me:t%40k@git.example\n"
        );
        // A token alone is a user with an empty password: git asks for nothing more.
        assert_eq!(
            credential_line("https://git.example", "ghp_x").unwrap(),
            "https://ghp_x:@git.example\n"
        );
        for (url, userinfo) in [
            ("ssh://git.example/r", "me:x"),
            ("https://a@git.example/r", "me:x"),
            ("https://git.example/r", "me:x\nhttps://evil"),
            ("https:///r", "me:x"),
        ] {
            assert!(
                credential_line(url, userinfo).is_err(),
                "{url} {userinfo:?}"
            );
        }
        assert_eq!(
            credential_line("ssh://git.example/r", "me:x")
                .unwrap_err()
                .to_string(),
            "credentials are only handed to an https clone"
        );
    }
}
