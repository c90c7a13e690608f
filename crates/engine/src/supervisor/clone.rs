//! A `repositoryUrl` task's start: the repository is cloned by git inside the guest, through
//! the egress proxy opened to the repository's host alone (HTTPS on 443, or SSH on 22 with a
//! key read here and handed to the fetch only), and its files come back to the host as the
//! baseline copy patches are verified against. The host re-packs that copy entry by entry:
//! it is guest output, so only plain files, directories and symlinks with clean relative paths
//! are kept, within a size bound.
//!
//! The URL arrives parsed ([`GitUrl`]), its credentials (`https://user:token@host/…`) held
//! apart since the start began: the record, the catalog, logs and results only ever hold the
//! URL without them. They reach the supervisor on an inherited pipe that it reads
//! to its end at once ([`claim_inherited_credentials`]), and the guest in the clone request;
//! the guest hands them to git in a file only the fetch reads (see the agent's `clone`).

use std::io::{Read, Write};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Component, Path};
use std::sync::Mutex;

use dynocap_proto::{channel, from_payload, CloneRequest, FrameKind, Request, Response};

use crate::foundation::error::{Coded, Context, Error, ErrorCode, Result};
use crate::foundation::git_url::GitUrl;
use crate::image::{SANDBOX_GID, SANDBOX_UID};
use crate::model::task_spec::{Progress, SourceInfo};
use crate::supervisor::agent_conn::{agent_error_message, agent_gone, AgentConn};
use crate::supervisor::egress::{clone_policy, Egress};
use crate::supervisor::import::History;
use crate::supervisor::workspace::{self, BASELINE_TAR, WORKSPACE};

/// Longest a clone may take.
const CLONE_TIMEOUT_MS: u64 = 15 * 60 * 1000;
/// Published host keys of the default git hosts, used when the host user's `known_hosts` has
/// no entry for the repository's host.
const DEFAULT_KNOWN_HOSTS: &str = "\
github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl
gitlab.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAfuCHKVTjquxvt6CM6tdG4SLp1Btn/nOeHHE5UOzRdf
bitbucket.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIazEu89wgQZ4bqs3d63QSMzYVa0MuJ2e2gKTKqu+UUO
";

pub use crate::foundation::git_url::{strip_userinfo, Credentials};

/// The environment variable telling a supervisor that its starter passes a clone's
/// credentials on [`SUPERVISOR_CREDENTIALS_FD`].
pub const CREDENTIALS_FD_ENV: &str = "DYNOCAP_CLONE_CREDENTIALS_FD";
/// The descriptor a supervisor reads a clone's credentials from (the project is 4).
pub const SUPERVISOR_CREDENTIALS_FD: RawFd = 5;
/// Longest credentials a supervisor reads.
const CREDENTIALS_MAX: u64 = 16 * 1024;

/// The credentials the starter passed, from [`claim_inherited_credentials`] until the clone.
static INHERITED_CREDENTIALS: Mutex<Option<Credentials>> = Mutex::new(None);

/// A pipe holding `credentials` and then its end: the read end, for the supervisor to
/// inherit. The pipe's buffer holds them whole, so nothing waits on a reader.
pub fn credentials_pipe(credentials: &Credentials) -> Result<OwnedFd> {
    // Within the pipe's buffer (64 KiB), so the write never waits on the reader.
    if credentials.expose().len() as u64 > CREDENTIALS_MAX {
        return Err(Error::invalid(format!(
            "the repositoryUrl's credentials are over {CREDENTIALS_MAX} bytes; give shorter ones"
        )));
    }
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .context("creating the pipe for the clone's credentials")?;
    let mut write = std::fs::File::from(write);
    write
        .write_all(credentials.expose().as_bytes())
        .context("passing the clone's credentials")?;
    Ok(read)
}

/// Reads the credentials the starter passed, if it says it did (`announced`, the value of
/// [`CREDENTIALS_FD_ENV`]), to their end and closes the descriptor. Call first thing, with
/// the project's claim, before any child is started.
pub fn claim_inherited_credentials(announced: Option<std::ffi::OsString>) -> Result<()> {
    let Some(value) = announced else {
        return Ok(());
    };
    if value.to_str() != Some(&SUPERVISOR_CREDENTIALS_FD.to_string()) {
        return Err(CloneFailure::UnexpectedCredentialsFd {
            value: value.to_string_lossy().into_owned(),
        }
        .into());
    }
    // SAFETY: the starter dup2'ed the pipe's read end to this number right before exec and
    // nothing in this process has used it since (this runs first, once).
    let borrowed = unsafe { BorrowedFd::borrow_raw(SUPERVISOR_CREDENTIALS_FD) };
    nix::fcntl::fcntl(
        borrowed,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(CloneFailure::UnusableCredentialsPipe)?;
    // SAFETY: the descriptor is open (fcntl succeeded) and owned by nothing else here; from
    // now on the `File` alone closes it.
    let pipe = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(SUPERVISOR_CREDENTIALS_FD) });
    let mut text = String::new();
    pipe.take(CREDENTIALS_MAX)
        .read_to_string(&mut text)
        .context("reading the clone's credentials")?;
    *INHERITED_CREDENTIALS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Credentials::new(text));
    Ok(())
}

/// The credentials the starter passed, once.
pub fn take_inherited_credentials() -> Option<Credentials> {
    INHERITED_CREDENTIALS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}

/// `known_hosts` lines for `host`: the host user's own entries naming it, else the published
/// keys DynoCap ships for the default git hosts.
fn known_hosts_for(host: &str, user_home: Option<&Path>) -> String {
    let names = [host.to_owned(), format!("[{host}]:22")];
    let own: String = user_home
        .map(|home| home.join(".ssh/known_hosts"))
        .and_then(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_default()
        .lines()
        .filter(|line| {
            let mut fields = line.split_whitespace();
            let first = fields.next().unwrap_or_default();
            let hosts = if first.starts_with('@') {
                fields.next().unwrap_or_default()
            } else {
                first
            };
            hosts
                .split(',')
                .any(|h| names.iter().any(|n| h.eq_ignore_ascii_case(n)))
        })
        .map(|line| format!("{line}\n"))
        .collect();
    if !own.is_empty() {
        return own;
    }
    DEFAULT_KNOWN_HOSTS
        .lines()
        .filter(|line| line.split_whitespace().next() == Some(host))
        .map(|line| format!("{line}\n"))
        .collect()
}

/// What a clone authenticates with: an SSH key file, or an https URL's credentials.
#[derive(Debug, Default)]
pub struct Access<'a> {
    pub ssh_key: Option<&'a Path>,
    pub credentials: Option<Credentials>,
    /// The user's `HOME`, whose `~/.ssh/known_hosts` seeds the clone's.
    pub user_home: Option<&'a Path>,
}

/// Clones `url` into the workspace and records the baseline. The proxy is left open to the
/// git host alone; the caller sets the task's own network afterwards.
pub async fn clone_repository(
    conn: &AgentConn,
    egress: &Egress,
    url: &GitUrl,
    history: History,
    access: Access<'_>,
    state_dir: &Path,
    report: &(dyn Fn(Progress) + Send + Sync),
) -> Result<SourceInfo> {
    let Access {
        ssh_key: key_path,
        credentials,
        user_home,
    } = access;
    // A record from before credentials were split off may still hold them.
    let credentials = credentials.or_else(|| url.credentials().cloned());
    let ssh = url.is_ssh();
    let host = url.host();
    // The canonical spelling, without credentials: what git fetches and what is recorded.
    let url = url.to_string();
    let url = url.as_str();
    let ssh_key = match key_path {
        Some(path) if ssh => Some(crate::foundation::ssh_key::read(path)?),
        Some(_) => {
            return Err(Error::invalid(
                "sshKeyPath only applies to an ssh:// (or user@host:path) repositoryUrl",
            ))
        }
        None => None,
    };
    let known_hosts = ssh.then(|| known_hosts_for(host, user_home));
    if known_hosts.as_deref() == Some("") {
        return Err(CloneFailure::NoHostKey {
            host: host.to_owned(),
        }
        .into());
    }
    egress.open(conn, clone_policy(host, ssh)?).await?;
    report(workspace::step(&format!("cloning {}", strip_userinfo(url))));

    let partial = state_dir.join("clone.tar.partial");
    let request = Request::Clone(CloneRequest {
        url: url.to_owned(),
        credentials: credentials.map(|c| c.expose().to_owned()),
        dest: WORKSPACE.into(),
        history: history.as_str().into(),
        owner_uid: SANDBOX_UID,
        owner_gid: SANDBOX_GID,
        ssh_key,
        known_hosts,
        timeout_ms: CLONE_TIMEOUT_MS,
    });
    let mut stream = conn.open(&request).await?;
    let mut archive = std::fs::File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let cloned = loop {
        let Some(frame) = stream.next().await else {
            return Err(agent_gone());
        };
        match frame.kind {
            FrameKind::Data if frame.payload.first() == Some(&channel::STDOUT) => {
                archive
                    .write_all(&frame.payload[1..])
                    .context("writing the clone's files")?;
            }
            FrameKind::Done => break from_payload::<Response>("clone result", &frame.payload)?,
            FrameKind::Error => {
                let message = strip_userinfo(&agent_error_message(&frame.payload));
                let _ = std::fs::remove_file(&partial);
                let message = format!("cloning {} failed: {message}", strip_userinfo(url));
                // docs/mcp.md, "Errors": `timeout` for a start-up step that ran out of time.
                return Err(if message.contains("did not finish within") {
                    Error::timeout(message)
                } else {
                    Error::internal(message)
                });
            }
            _ => {}
        }
    };
    drop(archive);
    let Response::Cloned { commit, branch } = cloned else {
        return Err(CloneFailure::UnexpectedAnswer(Box::new(cloned)).into());
    };
    report(workspace::step(
        "recording the baseline the diff is taken against",
    ));
    let baseline_tar = state_dir.join(BASELINE_TAR);
    let repacked = {
        let (partial, baseline_tar) = (partial.clone(), baseline_tar.clone());
        tokio::task::spawn_blocking(move || {
            let repacked = repack(&partial, &baseline_tar);
            if repacked.is_ok() {
                workspace::index_baseline(&baseline_tar);
            }
            repacked
        })
        .await
        .map_err(CloneFailure::RepackPanicked)?
    };
    let _ = std::fs::remove_file(&partial);
    let (files, bytes) = repacked?;
    let head = (history == History::None)
        .then(|| branch.as_ref().map(|b| format!("refs/heads/{b}")))
        .flatten();
    workspace::record_baseline(conn, None, head, None).await?;
    Ok(SourceInfo {
        project_path: None,
        repository_url: Some(strip_userinfo(url)),
        history,
        files,
        bytes,
        skipped: Default::default(),
        base_commit: Some(commit),
        branch,
    })
}

/// Copies the guest's archive of the cloned commit into the host's baseline copy, keeping
/// only regular files, directories and symlinks under clean relative paths.
fn repack(from: &Path, to: &Path) -> Result<(u64, u64)> {
    let input = std::fs::File::open(from).context("reading the clone's files")?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(input));
    let output = std::fs::File::create(to).with_context(|| format!("creating {}", to.display()))?;
    let mut builder = tar::Builder::new(std::io::BufWriter::new(output));
    builder.mode(tar::HeaderMode::Deterministic);
    let (mut files, mut bytes) = (0u64, 0u64);
    for entry in archive.entries().map_err(CloneFailure::GuestFiles)? {
        let mut entry = entry.map_err(CloneFailure::GuestFiles)?;
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let path = entry.path().map_err(CloneFailure::GuestFiles)?.into_owned();
        if path.as_os_str().is_empty()
            || !path.components().all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(
                CloneFailure::GuestFilesRefused(format!("unsafe path {}", path.display())).into(),
            );
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode);
        if kind.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            builder
                .append_data(&mut header, &path, std::io::empty())
                .map_err(CloneFailure::GuestFiles)?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(CloneFailure::GuestFiles)?
                .ok_or_else(|| {
                    CloneFailure::GuestFilesRefused(format!(
                        "symlink {} has no target",
                        path.display()
                    ))
                })?
                .into_owned();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder
                .append_link(&mut header, &path, &target)
                .map_err(CloneFailure::GuestFiles)?;
            files += 1;
        } else if kind.is_file() {
            let size = entry.size();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(size);
            let reader: &mut dyn Read = &mut entry;
            builder
                .append_data(&mut header, &path, reader.take(size))
                .map_err(CloneFailure::GuestFiles)?;
            files += 1;
            bytes += size;
        } else {
            return Err(CloneFailure::GuestFilesRefused(format!(
                "{} is a {kind:?}, which a commit cannot hold",
                path.display()
            ))
            .into());
        }
    }
    builder
        .into_inner()
        .and_then(|mut w| w.flush())
        .context("writing the baseline copy")?;
    Ok((files, bytes))
}

/// What failed cloning a repository in the guest and taking its files as the baseline.
#[derive(Debug, thiserror::Error)]
enum CloneFailure {
    #[error(
        "{CREDENTIALS_FD_ENV}={value} names an unexpected descriptor (the starter passes \
         {SUPERVISOR_CREDENTIALS_FD})"
    )]
    UnexpectedCredentialsFd { value: String },
    #[error("the inherited credentials pipe is unusable: {0}")]
    UnusableCredentialsPipe(#[source] nix::errno::Errno),
    #[error(
        "no SSH host key is known for {host}: add it to ~/.ssh/known_hosts of the user running \
         dynocap (ssh-keyscan {host} and check the fingerprint), or use an https URL"
    )]
    NoHostKey { host: String },
    #[error("the guest agent answered a clone with {0:?}")]
    UnexpectedAnswer(Box<Response>),
    #[error("re-packing the clone panicked: {0}")]
    RepackPanicked(#[source] tokio::task::JoinError),
    /// The guest's archive of the clone could not be read or copied.
    #[error("the clone's files from the guest: {0}")]
    GuestFiles(#[source] std::io::Error),
    /// The guest's archive holds what a commit cannot (an unsafe path, a device): why.
    #[error("the clone's files from the guest: {0}")]
    GuestFilesRefused(String),
}

impl Coded for CloneFailure {
    /// All internal, as before: a missing host key is the operator's to add (the message says
    /// how), and what the guest sends is DynoCap's agent's doing or a compromised guest's.
    fn code(&self) -> ErrorCode {
        match self {
            Self::UnexpectedCredentialsFd { .. }
            | Self::UnusableCredentialsPipe(_)
            | Self::NoHostKey { .. }
            | Self::UnexpectedAnswer(_)
            | Self::RepackPanicked(_)
            | Self::GuestFiles(_)
            | Self::GuestFilesRefused(_) => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repack_keeps_files_and_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("in.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&src).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o755);
        b.append_data(&mut h, "bin/run", &b"hi"[..]).unwrap();
        b.finish().unwrap();
        drop(b);
        let out = dir.path().join("out.tar");
        assert_eq!(repack(&src, &out).unwrap(), (1, 2));

        let evil = dir.path().join("evil.tar");
        let mut raw = std::fs::File::create(&evil).unwrap();
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
        h.set_size(0);
        h.set_cksum();
        raw.write_all(h.as_bytes()).unwrap();
        raw.write_all(&[0u8; 1024]).unwrap();
        drop(raw);
        assert!(repack(&evil, &out).is_err());
    }
}
