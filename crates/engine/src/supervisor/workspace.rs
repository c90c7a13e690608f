//! The supervisor's side of a task's workspace: bringing the project into the guest
//! (tar stream, history bundle, baseline) and taking the patch out.
//!
//! The host keeps its own copy of what it sent (`baseline.tar` in the sandbox's state
//! directory, with its offset index `baseline.tar.idx` beside it, see
//! [`dynocap_review::tar_index`]). Verification and the package.json comparison read that
//! copy, never anything the guest says the baseline was.

use std::io::Write;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dynocap_proto::{
    channel, from_payload, BaselineRequest, DiffRequest, FrameKind, ReceiveFileRequest, Request,
    Response, UnpackRequest,
};
use dynocap_review::generated::{GeneratedGroup, Project, Sieve};
use dynocap_review::patch::DEFAULT_MAX_PATCH_BYTES;

use crate::foundation::error::{Coded, Context, Error, ErrorCode, Result};
use crate::image::{SANDBOX_GID, SANDBOX_UID};
use crate::model::task_spec::Progress;
use crate::supervisor::agent_conn::{agent_error_message, agent_gone, AgentConn, AgentStream};
use crate::supervisor::import::{self, History};

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::workspace";

mod baseline_files;

pub use baseline_files::BaselineIndex;

pub const WORKSPACE: &str = "/workspace";
/// The host's copy of the imported tree, in the sandbox's state directory.
pub const BASELINE_TAR: &str = "baseline.tar";
/// Beside it: the files of the baseline the project does not track that fall under the
/// table of generated files (NUL-separated, see [`import::ImportPlan::untracked_generated`]).
pub const BASELINE_UNTRACKED: &str = "baseline.untracked";
/// The host's files of the baseline, which a fork links into its own state directory (they
/// are never written again).
pub const BASELINE_HOST_FILES: [&str; 3] = [BASELINE_TAR, "baseline.tar.idx", BASELINE_UNTRACKED];
/// Largest project the guest accepts (bytes of file content).
const MAX_IMPORT_BYTES: u64 = 64 * 1024 * 1024 * 1024;
const BUNDLE_NAME: &str = "history.bundle";

/// What an import brought.
#[derive(Debug, Clone)]
pub struct Imported {
    pub root: PathBuf,
    pub history: History,
    pub files: u64,
    pub bytes: u64,
    /// The commit `HEAD` named when the project was listed (`None`: not git, or no commit).
    pub base_commit: Option<String>,
    /// Things left out or read differently (sockets, unreadable files, files that vanished
    /// mid-read, …), whether found while listing or while reading: for the user.
    pub notes: Vec<import::Note>,
}

/// The environment variable telling a supervisor that its starter passed the project
/// directory, already checked, as descriptor [`SUPERVISOR_PROJECT_FD`].
pub const PROJECT_FD_ENV: &str = "DYNOCAP_PROJECT_FD";
/// The descriptor a supervisor inherits the project directory on (the ready pipe is 3).
pub const SUPERVISOR_PROJECT_FD: RawFd = 4;

/// The inherited project directory, from [`claim_inherited_project`] until the import.
static INHERITED_PROJECT: Mutex<Option<OwnedFd>> = Mutex::new(None);

/// Takes the project descriptor the starter passed (if it says it did: `announced`, the value
/// of [`PROJECT_FD_ENV`]), marking it close-on-exec at once: nothing the supervisor starts,
/// the guest least of all, may get a handle on a host directory. Call first thing, before
/// any child is started.
pub fn claim_inherited_project(announced: Option<std::ffi::OsString>) -> Result<()> {
    let Some(value) = announced else {
        return Ok(());
    };
    if value.to_str() != Some(&SUPERVISOR_PROJECT_FD.to_string()) {
        return Err(WorkspaceFailure::UnexpectedProjectFd {
            value: value.to_string_lossy().into_owned(),
        }
        .into());
    }
    // SAFETY: the starter dup2'ed the project directory to this number right before exec and
    // nothing in this process has used or taken it since (this runs first, once).
    let fd = unsafe { BorrowedFd::borrow_raw(SUPERVISOR_PROJECT_FD) };
    nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(WorkspaceFailure::UnusableProjectFd)?;
    // SAFETY: the descriptor is open (fcntl succeeded) and owned by nothing else in this
    // process; from here the `OwnedFd` alone closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(SUPERVISOR_PROJECT_FD) };
    *INHERITED_PROJECT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(owned);
    Ok(())
}

/// The inherited project directory, once.
fn take_inherited_project() -> Option<OwnedFd> {
    INHERITED_PROJECT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}

/// Copies the project into the guest's `/workspace` and records the baseline. With
/// `inherited`, the project is the directory descriptor the supervisor inherited (checked by
/// whoever started the task, and imported through that very descriptor); `project` is then
/// only its path as recorded. Without, `project` is resolved here.
pub async fn import(
    conn: &AgentConn,
    project: &Path,
    inherited: bool,
    history: History,
    state_dir: &Path,
    progress: &(dyn Fn(Progress) + Send + Sync),
) -> Result<Imported> {
    let dir = if inherited {
        Some(
            take_inherited_project().ok_or_else(|| WorkspaceFailure::NoInheritedProject {
                project: project.to_owned(),
            })?,
        )
    } else {
        None
    };
    let project = project.to_owned();
    let plan = tokio::task::spawn_blocking(move || match dir {
        Some(dir) => import::plan_dir(dir, history, &import::PlanOptions::default()),
        None => import::plan(&project, history),
    })
    .await
    .context("planning the import")??;
    let root = plan.root.clone();
    let mut notes = plan.notes.clone();
    let plan = std::sync::Arc::new(plan);
    // Read right after the listing, so it is the commit the imported tree sits on.
    let base_commit = {
        let plan = plan.clone();
        tokio::task::spawn_blocking(move || import::head_commit_id(&plan))
            .await
            .context("reading HEAD")??
    };
    // Packing the history is CPU-bound git work independent of the tar stream: run both at
    // once, so the import costs about as much as the slower of the two.
    let bundling = (plan.history != History::None).then(|| {
        let (plan, dir) = (plan.clone(), state_dir.to_owned());
        tokio::task::spawn_blocking(move || import::write_bundle(&plan, &dir))
    });
    let message = format!("importing {}", root.display());
    progress(Progress {
        message: message.clone(),
        done: 0,
        total: Some(plan.bytes),
    });
    let head = if plan.history == History::None {
        None
    } else {
        let plan = plan.clone();
        Some(
            tokio::task::spawn_blocking(move || import::head_name(&plan))
                .await
                .context("reading HEAD")??,
        )
    };

    let stream = conn
        .open(&Request::Unpack(UnpackRequest {
            dest: WORKSPACE.into(),
            owner_uid: SANDBOX_UID,
            owner_gid: SANDBOX_GID,
            max_bytes: MAX_IMPORT_BYTES,
        }))
        .await?;
    let input = stream.input();
    let baseline_path = state_dir.join(BASELINE_TAR);
    let (progress_tx, mut progress_rx) = tokio::sync::mpsc::channel::<(u64, u64)>(4);
    let tar_plan = plan.clone();
    let writer = tokio::task::spawn_blocking(move || -> Result<import::TarSummary> {
        let plan = tar_plan;
        let copy = std::fs::File::create(&baseline_path)
            .with_context(|| format!("creating {}", baseline_path.display()))?;
        let mut tee = Tee {
            guest: input,
            copy: std::io::BufWriter::new(copy),
        };
        let mut last_report = std::time::Instant::now();
        let summary = import::write_tar(&plan, &mut tee, &mut |done, total| {
            if last_report.elapsed() >= std::time::Duration::from_millis(200) {
                last_report = std::time::Instant::now();
                let _ = progress_tx.try_send((done, total));
            }
        })?;
        tee.copy.flush().context("writing the baseline copy")?;
        tee.guest.finish().map_err(|_| agent_gone())?;
        Ok(summary)
    });
    let mut writer = std::pin::pin!(writer);
    let written = loop {
        tokio::select! {
            Some((done, total)) = progress_rx.recv() => {
                progress(Progress { message: message.clone(), done, total: Some(total) });
            }
            joined = &mut writer => break joined.context("streaming the project").and_then(|r| r),
        }
    };
    let summary = match written {
        Ok(parts) => parts,
        Err(err) => {
            // Tell the agent to throw away what it unpacked so far; the tar stream itself
            // cannot say that it was cut short.
            let _ = stream.cancel().await;
            return Err(err);
        }
    };
    // The baseline copy is whole: index it while the guest unpacks and takes the history.
    let indexing = {
        let baseline_path = state_dir.join(BASELINE_TAR);
        tokio::task::spawn_blocking(move || index_baseline(&baseline_path))
    };
    match finish_stream(stream, "unpacking the project").await? {
        Response::Unpacked { .. } => {}
        other => return Err(unexpected("unpack", &other)),
    }
    progress(Progress {
        message,
        done: summary.bytes,
        total: Some(summary.bytes),
    });

    let bundle = match bundling {
        None => None,
        Some(bundling) => match bundling.await.context("bundling the history")?? {
            Some(path) => {
                progress(step("sending the git history"));
                send_file(conn, &path, BUNDLE_NAME).await?;
                let _ = std::fs::remove_file(&path);
                Some(BUNDLE_NAME.to_owned())
            }
            None => None,
        },
    };
    notes.extend(summary.notes);
    let with_history = bundle.is_some();
    if !plan.untracked_generated.is_empty() {
        let list = plan.untracked_generated.join("\0");
        let path = state_dir.join(BASELINE_UNTRACKED);
        dynocap_host::durable::replace(&path, list.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    progress(step("recording the baseline the diff is taken against"));
    let exclude = {
        let plan = plan.clone();
        tokio::task::spawn_blocking(move || import::local_excludes(&plan))
            .await
            .context("reading info/exclude")?
            .unwrap_or_else(|why| {
                tracing::warn!(
                    target: LOG_TARGET,
                    "the project's own ignore rules stay on the host: {why}; a file they \
                     match that the task makes shows in its diff"
                );
                None
            })
    };
    record_baseline(
        conn,
        bundle,
        if with_history { head } else { None },
        exclude,
    )
    .await?;
    // Only an accelerator (see `index_baseline`): a failure was logged, nothing to report.
    let _ = indexing.await;
    Ok(Imported {
        root,
        history: if with_history { history } else { History::None },
        files: summary.files,
        bytes: summary.bytes,
        base_commit,
        notes,
    })
}

/// Has the agent make the workspace's repository (from the history `bundle`, if any; a
/// clone's own is kept) and record the baseline every diff is taken against, ignoring what
/// `exclude` (the project's `info/exclude`) ignores as well as its `.gitignore` files.
pub async fn record_baseline(
    conn: &AgentConn,
    bundle: Option<String>,
    head: Option<String>,
    exclude: Option<String>,
) -> Result<()> {
    let stream = conn
        .open(&Request::Baseline(BaselineRequest {
            workspace: WORKSPACE.into(),
            head,
            bundle,
            owner_uid: SANDBOX_UID,
            owner_gid: SANDBOX_GID,
            exclude,
        }))
        .await?;
    match finish_stream(stream, "recording the baseline").await? {
        Response::Baseline { .. } => Ok(()),
        other => Err(unexpected("baseline", &other)),
    }
}

/// What the guest's agent looks at for a diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// What its journal saw change since the last diff: for showing, where speed matters.
    Changed,
    /// Every file: for the patch that is saved, which must not depend on what a journal of
    /// changes can see (a write through a shared mapping, say).
    Everything,
}

/// The patch baseline → current working tree, as the guest's agent computes it, in memory,
/// for showing it (`task diff`): the entries [`generated`](dynocap_review::generated) names
/// are left out as they arrive and returned as groups, the rest bounded by
/// [`DEFAULT_MAX_PATCH_BYTES`] (a `node_modules/` of hundreds of MiB does not make the diff
/// fail). Saving the work uses [`diff_into`] without a bound.
pub async fn diff(
    conn: &AgentConn,
    line_diff_budget: u64,
    project: &(dyn Project + Sync),
) -> Result<(Vec<u8>, Vec<GeneratedGroup>)> {
    let mut sieving = Sieving(Sieve::new(project, DEFAULT_MAX_PATCH_BYTES));
    match diff_into(conn, &mut sieving, None, line_diff_budget, Scan::Changed).await {
        Ok(_) => Ok(sieving.0.finish()),
        Err(_) if sieving.0.over() => Err(too_large(DEFAULT_MAX_PATCH_BYTES as u64)),
        Err(err) => Err(err),
    }
}

/// A [`Sieve`] as the sink of [`diff_into`]: a write past its bound fails, which ends the
/// agent's diff.
struct Sieving<'p>(Sieve<'p>);

impl tokio::io::AsyncWrite for Sieving<'_> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let sieve = &mut self.get_mut().0;
        sieve.push(buf);
        std::task::Poll::Ready(if sieve.over() {
            Err(std::io::Error::other("the shown diff's bound is reached"))
        } else {
            Ok(buf.len())
        })
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// A diff over the bound of a shown one: what to do instead.
fn too_large(max: u64) -> Error {
    Error::invalid(format!(
        "the diff is over the {} MiB that a diff shows; the work is not lost: task finish saves \
         the whole patch, whatever its size. To see a smaller diff, delete large files from \
         /workspace or list them in its .gitignore",
        max / (1024 * 1024)
    ))
}

/// What one file's line diff may take in a guest of `memory_mb`: a quarter of it, the rest
/// being the agent's, git's own and whatever the sandbox's processes hold. A file whose line
/// diff would take more is carried as binary (see the agent's `bigfiles`).
pub fn line_diff_budget(memory_mb: u64) -> u64 {
    memory_mb.saturating_mul(1 << 20) / 4
}

/// Streams the patch baseline → current working tree into `out` as the agent produces it,
/// and returns its size. With `max_bytes`, a larger patch is an `invalid_argument` error (the
/// agent's diff is cancelled); without, every byte the agent sends is written.
pub async fn diff_into<W>(
    conn: &AgentConn,
    out: &mut W,
    max_bytes: Option<u64>,
    line_diff_budget: u64,
    scan: Scan,
) -> Result<u64>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let mut stream = conn
        .open(&Request::Diff(DiffRequest {
            workspace: WORKSPACE.into(),
            // The bound is enforced here, where the bytes arrive, so that going over it gets
            // the host's explanation rather than the agent's.
            max_bytes: u64::MAX,
            line_diff_budget: Some(line_diff_budget),
            full_scan: scan == Scan::Everything,
        }))
        .await?;
    let mut written: u64 = 0;
    loop {
        let Some(frame) = stream.next().await else {
            return Err(agent_gone());
        };
        match frame.kind {
            FrameKind::Data => {
                if let Some((&channel::STDOUT, data)) = frame.payload.split_first() {
                    let len = u64::try_from(data.len()).unwrap_or(u64::MAX);
                    if let Some(max) = max_bytes.filter(|&max| written.saturating_add(len) > max) {
                        let _ = stream.cancel().await;
                        return Err(too_large(max));
                    }
                    if let Err(err) = out.write_all(data).await {
                        let _ = stream.cancel().await;
                        return Err(WorkspaceFailure::WritePatch(err).into());
                    }
                    written = written.saturating_add(len);
                }
            }
            FrameKind::Done => {
                return match from_payload::<Response>("diff result", &frame.payload) {
                    Ok(Response::Diff { .. }) => Ok(written),
                    Ok(other) => Err(unexpected("diff", &other)),
                    Err(err) => Err(err.into()),
                }
            }
            FrameKind::Error => return Err(agent_error("computing the diff", &frame.payload)),
            _ => {}
        }
    }
}

/// A progress report for a step that has no count of its own.
pub fn step(message: &str) -> Progress {
    Progress {
        message: message.to_owned(),
        done: 0,
        total: None,
    }
}

/// Writes the offset index beside the host's baseline copy ([`dynocap_review::tar_index`]),
/// which makes finish's verification read only the entries the patch touches. Without one,
/// verification reads every header instead: a failure here is logged, not fatal.
pub fn index_baseline(baseline_tar: &Path) {
    if let Err(err) = dynocap_review::tar_index::write_for(baseline_tar) {
        tracing::warn!(target: LOG_TARGET,
            "indexing {}: {err}; finish will read the whole baseline copy instead",
            baseline_tar.display()
        );
    }
}

/// Writes the guest-bound stream and the host's copy at once.
struct Tee<G: Write, C: Write> {
    guest: G,
    copy: C,
}

impl<G: Write, C: Write> Write for Tee<G, C> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.guest.write(buf)?;
        self.copy.write_all(&buf[..n])?;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.guest.flush()?;
        self.copy.flush()
    }
}

/// `refs/heads/NAME` when HEAD is on a branch, else the commit id.
async fn send_file(conn: &AgentConn, path: &Path, name: &str) -> Result<()> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let stream = conn
        .open(&Request::ReceiveFile(ReceiveFileRequest {
            name: name.into(),
            max_bytes: size,
        }))
        .await?;
    let input = stream.input();
    let source = path.to_owned();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let mut file = std::fs::File::open(&source)
            .with_context(|| format!("opening {}", source.display()))?;
        let mut input = input;
        std::io::copy(&mut file, &mut input).map_err(|_| agent_gone())?;
        input.finish().map_err(|_| agent_gone())
    })
    .await
    .context("sending the history")??;
    match finish_stream(stream, "receiving the history").await? {
        Response::Received { .. } => Ok(()),
        other => Err(unexpected("receive", &other)),
    }
}

/// Waits for a stream's `Done`, ignoring output; an `Error` becomes an `internal` error.
pub(crate) async fn finish_stream(mut stream: AgentStream, what: &str) -> Result<Response> {
    loop {
        let Some(frame) = stream.next().await else {
            return Err(agent_gone());
        };
        match frame.kind {
            FrameKind::Done => {
                return from_payload::<Response>("result", &frame.payload).map_err(|source| {
                    WorkspaceFailure::Result {
                        what: what.to_owned(),
                        source,
                    }
                    .into()
                })
            }
            FrameKind::Error => return Err(agent_error(what, &frame.payload)),
            _ => {}
        }
    }
}

fn agent_error(what: &str, payload: &[u8]) -> Error {
    WorkspaceFailure::InGuest {
        what: what.to_owned(),
        message: agent_error_message(payload),
    }
    .into()
}

fn unexpected(what: &str, response: &Response) -> Error {
    WorkspaceFailure::Unexpected {
        what: what.to_owned(),
        response: Box::new(response.clone()),
    }
    .into()
}

/// What failed moving the project into the guest or its changes out of it.
#[derive(Debug, thiserror::Error)]
enum WorkspaceFailure {
    #[error(
        "{PROJECT_FD_ENV}={value} names an unexpected descriptor (the starter passes \
         {SUPERVISOR_PROJECT_FD})"
    )]
    UnexpectedProjectFd { value: String },
    #[error("the inherited project descriptor {SUPERVISOR_PROJECT_FD} is unusable: {0}")]
    UnusableProjectFd(#[source] nix::errno::Errno),
    #[error(
        "the task was to be imported through an inherited descriptor, but the supervisor has \
         none for {}",
        .project.display()
    )]
    NoInheritedProject { project: PathBuf },
    #[error("writing the patch: {0}")]
    WritePatch(#[source] std::io::Error),
    /// The agent's final frame of `what` did not decode.
    #[error("{what}: {source}")]
    Result {
        what: String,
        #[source]
        source: dynocap_proto::ProtoError,
    },
    /// The agent's own account of its failure (see `agent_error_message`).
    #[error("{what} in the sandbox failed: {message}")]
    InGuest { what: String, message: String },
    #[error("the guest agent answered {what} with {response:?}")]
    Unexpected {
        what: String,
        response: Box<Response>,
    },
}

impl Coded for WorkspaceFailure {
    /// The guest failing at what the supervisor asks of it, or the supervisor's own plumbing
    /// failing, is never the caller's to fix.
    fn code(&self) -> ErrorCode {
        match self {
            Self::UnexpectedProjectFd { .. }
            | Self::UnusableProjectFd(_)
            | Self::NoInheritedProject { .. }
            | Self::WritePatch(_)
            | Self::Result { .. }
            | Self::InGuest { .. }
            | Self::Unexpected { .. } => ErrorCode::Internal,
        }
    }
}
