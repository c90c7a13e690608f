//! Jobs: commands that outlive the call that started them. A job is an ordinary exec that the
//! supervisor runs on a connection of its own, so it goes on when its caller stops waiting
//! (an MCP client's request timeout, `background`), until its own timeout, a kill, or the
//! sandbox's end. Its whole output is kept on the host, bounded per sandbox
//! ([`JOB_OUTPUT_BOUND`]: past it the oldest ended jobs' output is forgotten to make room, and
//! only when none holds any are new bytes counted, not kept), and is read back from any
//! offset as a bounded head and tail, as exec results are.
//!
//! Every MCP exec starts as a job, and most end within their call. Such a command is not a job
//! to anyone: its call answers with its Exec object, no id is shown, nothing lists it. So a job
//! holds its output in memory ([`MEMORY_BOUND`]) and is only *listed* (given its id, its output
//! moved to files in the sandbox's state directory, entered in [`RUNNING_FILE`]) once it
//! outlives its call or starts in the background; one that ends within its call is forgotten
//! when the call has answered. Two files and two rewrites of the running list per exec were
//! 5–10 % of an MCP run + exec + destroy cycle (docs/performance.md).
//!
//! A restore executes the supervisor anew; the jobs it ended, and those that had ended
//! before, go on as ended jobs of the new one ([`Jobs::hand_over`]): their ids, output and
//! place in the bound are the sandbox's for its life, and a task's end saves their output
//! with the others'. A supervisor killed outright keeps an index of its listed jobs
//! ([`INDEX_FILE`]), by which the recovery of its task saves their output too
//! ([`Jobs::recovered`]).
//!
//! Output is guest data: it is stored and sliced, never interpreted. Job ids are made here
//! (`job-N`), are never part of a path, and name jobs of this sandbox only: each sandbox's
//! supervisor holds its own jobs and answers only on its own socket.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{watch, Notify};

use crate::foundation::error::{Error, Result};
use crate::foundation::excerpt::Excerpt;
use crate::model::output::OutputChannel;
pub use crate::model::sandbox_info::RunningJob;
use crate::model::spec::{ExecSpec, OutputEncoding};
use crate::model::task_spec::JobLog;
use crate::model::task_spec::Progress;
use crate::supervisor::control::{read_message, write_message, ControlReply, ControlRequest};
use crate::supervisor::exec::{sanitize_line, ExecResult};

/// Output of all of a sandbox's jobs kept on the host, both streams together. A job's output
/// that would go past it makes room first: the oldest ended jobs' output is forgotten, whole
/// jobs, until it fits ([`Job::make_room`]); those jobs stay listed with their state, their
/// forgotten bytes counted as dropped. Only when no ended job holds output (running jobs
/// never lose output to each other) are the new bytes counted in the job's
/// `stdoutDropped`/`stderrDropped`, not kept.
pub const JOB_OUTPUT_BOUND: u64 = 256 * 1024 * 1024;

/// Listed jobs of one sandbox running at once: a background start beyond it is refused.
/// Commands within their calls (every MCP exec starts as a job) have their own bound,
/// [`MAX_IN_CALL_JOBS`], so background servers and watchers never refuse an `ls`.
pub const MAX_RUNNING_JOBS: usize = 16;

/// Jobs of one sandbox running within their calls, not listed: an exec beyond it is refused.
/// One that outlives its call is listed even past [`MAX_RUNNING_JOBS`] (killing it, or
/// dropping its output, would lose what it did), so a sandbox runs at most
/// `MAX_RUNNING_JOBS + MAX_IN_CALL_JOBS` jobs in all, listed or not: an exec is refused
/// once that many run.
pub const MAX_IN_CALL_JOBS: usize = 16;

/// Jobs a sandbox remembers; starting one more forgets the oldest that ended (and its output).
const MAX_KEPT_JOBS: usize = 64;

/// Output a job not yet listed holds in memory, both streams together; past it (a command that
/// prints a lot within its call) its output goes to its files before it is listed.
const MEMORY_BOUND: usize = 256 * 1024;

/// The longest a job request waits for its job's end before answering.
pub const JOB_WAIT_MAX_SECONDS: u64 = 600;

/// How often a caller waiting on a job hears how it goes.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);

/// Characters of a job's command shown in listings.
const COMMAND_SHOWN: usize = 200;

/// The directory of a sandbox's jobs, in its state directory.
pub const JOBS_DIR: &str = "jobs";

/// The file in a sandbox's jobs directory that holds the number the next listed job takes.
///
/// A restore executes the supervisor anew ([`crate::supervisor::process`]), and a new
/// supervisor numbered its jobs from `job-1` again: a caller still holding an id of a job the
/// restore ended then read another command's output under it. Numbers go on from this file
/// instead, so an id names one job for the sandbox's life.
const NEXT_ID_FILE: &str = "next-id";

/// The file in a sandbox's jobs directory that lists its running jobs, for `ps` and `ls`.
///
/// `ps` and `ls` read the catalog, never a supervisor: asking each running one would make a
/// listing as slow as its slowest supervisor, and a stopped (SIGSTOP) or wedged one would
/// hold it up. So the supervisor writes this small file (at most [`MAX_RUNNING_JOBS`] +
/// [`MAX_IN_CALL_JOBS`] entries) whenever a job is listed or a listed job ends, replacing it
/// whole by a rename, and listings read it only for a sandbox the catalog says is running: a
/// reader never waits on anyone, and a dead supervisor's stale file is not read once its
/// record is no longer running.
pub const RUNNING_FILE: &str = "running.json";

/// The file in a sandbox's jobs directory through which a supervisor executed anew for a
/// restore hands its listed jobs on to the next ([`Jobs::hand_over`]): their ids, states and
/// where their kept output is. Without it the new supervisor knew none of them: their output,
/// still on the host, was neither readable by their ids nor saved with the task's logs, and
/// not counted in [`JOB_OUTPUT_BOUND`] either.
const HANDED_OVER_FILE: &str = "handed-over.json";

/// The most of [`HANDED_OVER_FILE`] read. An entry is bounded: its command, error and the
/// guest's network refusals (16 at most, host and reason bounded) take a few KiB, up to
/// ~70 KiB where every character needs JSON's `\u` escape; [`MAX_KEPT_JOBS`] of those stay
/// well below it, so a hostile guest's strings cannot push the file past it.
const HANDED_OVER_MAX: u64 = 16 * 1024 * 1024;

/// The file in a sandbox's jobs directory that indexes its listed jobs: each one's id, the
/// sequence number that names its output files, whether it ended. A supervisor killed outright
/// (SIGKILL) leaves its task `unsaved`, and the recovery that `task finish` runs creates no
/// jobs of its own: without this index nothing mapped the output files to job ids, and the
/// recovered task's results had none of its jobs' output. The supervisor replaces it whole by
/// a rename whenever a job is listed, ends, or is forgotten ([`Board::index`]); the recovery
/// reads it defensively ([`Jobs::recovered`]).
const INDEX_FILE: &str = "index.json";

/// The most of [`INDEX_FILE`] read, and the most entries taken from it: listed jobs are at
/// most [`MAX_KEPT_JOBS`] plus those running.
const INDEX_MAX: u64 = 1024 * 1024;
const INDEX_MAX_ENTRIES: usize = MAX_KEPT_JOBS + MAX_RUNNING_JOBS + MAX_IN_CALL_JOBS;

/// The running jobs listed in the jobs directory `dir`, with how long each has run by now.
/// No file, or one that does not read: none (a listing never fails on it).
pub fn read_running(dir: &std::path::Path) -> Vec<RunningJob> {
    let Ok(text) = std::fs::read(dir.join(RUNNING_FILE)) else {
        return Vec::new();
    };
    let mut jobs: Vec<RunningJob> = serde_json::from_slice(&text).unwrap_or_default();
    let now = chrono::Utc::now();
    for job in &mut jobs {
        job.running_seconds = chrono::DateTime::parse_from_rfc3339(&job.started_at)
            .ok()
            .and_then(|started| (now - started.with_timezone(&chrono::Utc)).to_std().ok())
            .map_or(0, |ran| ran.as_secs());
    }
    jobs
}

/// The supervisor's side of [`RUNNING_FILE`] and [`INDEX_FILE`]. Neither lock is held while
/// another of this module's locks is taken (the closures only change the lists and read a
/// job's end), so they nest under any of them.
struct Board {
    path: PathBuf,
    running: Mutex<Vec<RunningJob>>,
    index_path: PathBuf,
    index: Mutex<Vec<Indexed>>,
}

/// A listed job in [`INDEX_FILE`]. Its output files are its `seq`'s in the jobs directory: no
/// path is ever read from the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Indexed {
    job: String,
    seq: u64,
    command: String,
    started_at: String,
    /// It ended before the supervisor did; one that had not was cut off by its death.
    ended: bool,
    /// Bytes of stdout and of stderr not kept, as of its listing, its end or its output's
    /// eviction (what a running job dropped since it was listed is not counted).
    dropped: [u64; 2],
}

impl Board {
    fn new(dir: &std::path::Path) -> Self {
        Self {
            path: dir.join(RUNNING_FILE),
            running: Mutex::new(Vec::new()),
            index_path: dir.join(INDEX_FILE),
            index: Mutex::new(Vec::new()),
        }
    }

    /// Changes the list and, when `change` says it changed it, rewrites the file while holding
    /// it, so writes land in order.
    fn change(&self, change: impl FnOnce(&mut Vec<RunningJob>) -> bool) {
        let mut running = lock(&self.running);
        if !change(&mut running) {
            return;
        }
        if let Err(err) = replace_json(&self.path, &*running) {
            // Only listings miss it: the jobs themselves go on.
            tracing::warn!(
                "updating the running jobs' list {}: {err}",
                self.path.display()
            );
        }
    }

    /// Changes the index of listed jobs as [`Board::change`] does the running ones.
    fn index(&self, change: impl FnOnce(&mut Vec<Indexed>) -> bool) {
        let mut index = lock(&self.index);
        if !change(&mut index) {
            return;
        }
        if let Err(err) = replace_json(&self.index_path, &*index) {
            // Only a recovery after the supervisor's death would miss these jobs' output.
            tracing::warn!(
                "updating the jobs' index {}: {err}",
                self.index_path.display()
            );
        }
    }
}

/// Replaces the file at `path` with `value`'s JSON whole, by a rename: a reader, or a
/// supervisor killed midway, never leaves half a file.
fn replace_json(path: &std::path::Path, value: &impl Serialize) -> std::io::Result<()> {
    let partial = path.with_extension("json.partial");
    let text = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobState {
    Running,
    /// Ended by itself: see its exit code or signal.
    Exited,
    /// Ended by a kill request.
    Killed,
    /// Ended by its own `timeoutSeconds`.
    TimedOut,
    /// Could not run, or was cut off by the sandbox's end: see `error`.
    Failed,
}

/// A job request ([`ControlRequest::Job`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobQuery {
    pub job: String,
    /// Wait up to this long for the job to end (at most [`JOB_WAIT_MAX_SECONDS`]).
    #[serde(default)]
    pub wait_ms: u64,
    /// Output from these byte offsets of each stream on (what the last answer's offsets said).
    #[serde(default)]
    pub stdout_offset: u64,
    #[serde(default)]
    pub stderr_offset: u64,
    /// Kill the job first (SIGTERM, SIGKILL after the grace), then answer once it ended.
    #[serde(default)]
    pub kill: bool,
    /// Not 0: the output from the offsets as it is, at most this many bytes of each stream
    /// (and [`PAGE_MAX`]), never cut into a head and a tail and base64-encoded whatever the
    /// job's encoding, with the offsets where those bytes end: a reader that must have every
    /// byte (`dynocap job --follow`) pages through it.
    #[serde(default)]
    pub page_bytes: u64,
}

/// The most a [`JobQuery::page_bytes`] answer carries of each stream.
pub const PAGE_MAX: u64 = 1024 * 1024;

/// A job as a job request answers it: its state and its output since the offsets asked for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobReport {
    pub job: String,
    pub state: JobState,
    pub command: String,
    pub started_at: String,
    pub duration_ms: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    /// The output since the offsets asked for: its head and tail when longer than the job's
    /// `maxOutputBytes`, encoded as the job's `outputEncoding`.
    pub stdout: String,
    pub stderr: String,
    /// Bytes between the head and the tail were left out of `stdout` or `stderr`.
    pub truncated: bool,
    /// Where the next request's output starts: the bytes kept so far.
    pub stdout_offset: u64,
    pub stderr_offset: u64,
    /// Bytes not kept: past the sandbox's bound on kept job output ([`JOB_OUTPUT_BOUND`]),
    /// or kept once and forgotten to make room for newer jobs' output (`output_evicted`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stdout_dropped: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stderr_dropped: u64,
    /// The ended job's kept output was forgotten to make room for newer jobs' output within
    /// [`JOB_OUTPUT_BOUND`]: its bytes are counted in `stdout_dropped`/`stderr_dropped`, and
    /// its state, exit code and Exec object stay.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_evicted: bool,
    /// Why a `failed` job failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Error>,
    /// The ended command's Exec object (its output bounded as an exec's is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<ExecResult>>,
    /// `stdout` and `stderr` are a page ([`JobQuery::page_bytes`]): base64, whole. A
    /// supervisor of an earlier build ignores the ask and answers without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paged: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a job ended.
#[derive(Debug, Clone)]
enum Ended {
    Done(Box<ExecResult>),
    Failed(Error),
    /// Under the supervisor before a restore ([`HANDED_OVER_FILE`]): what it said of it.
    Before(Box<HandedOver>),
}

/// A listed job as a supervisor executed anew for a restore hands it on
/// ([`HANDED_OVER_FILE`]). Its output files are its `seq`'s in the jobs directory: no path
/// is ever read from the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HandedOver {
    job: String,
    seq: u64,
    command: String,
    started_at: String,
    duration_ms: u64,
    /// Never `running`: one the restore cut off is `failed`, with the error saying so.
    state: JobState,
    exit_code: Option<i32>,
    signal: Option<String>,
    error: Option<Error>,
    /// Bytes of stdout and of stderr kept in its files, and not kept.
    kept: [u64; 2],
    dropped: [u64; 2],
    /// Its output was forgotten to make room for newer jobs' ([`Job::make_room`]).
    #[serde(default)]
    output_evicted: bool,
    /// How its output is read back: its exec's `maxOutputBytes` and `outputEncoding`.
    max_output_bytes: u64,
    output_encoding: OutputEncoding,
    /// An ended job's Exec object without its output (which its files hold): what its
    /// reports say beyond the exit (`oomKilled`, `diskError`, `networkRefusals`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Box<ExecResult>>,
}

/// Where a stream's output goes.
enum Sink {
    /// Memory, until the job is listed or outgrows [`MEMORY_BOUND`].
    Memory(Vec<u8>),
    File(std::fs::File),
    /// Nowhere: its file could not be made or written (or the job was forgotten).
    Closed,
}

/// One stream's output and how much of it there is.
struct Kept {
    sink: Sink,
    /// The file holding the stream's `kept` bytes, once it has one.
    path: Option<PathBuf>,
    kept: u64,
    dropped: u64,
}

impl Kept {
    fn new() -> Self {
        Self {
            sink: Sink::Memory(Vec::new()),
            path: None,
            kept: 0,
            dropped: 0,
        }
    }

    fn in_memory(&self) -> usize {
        match &self.sink {
            Sink::Memory(held) => held.len(),
            _ => 0,
        }
    }
}

/// One job.
pub struct Job {
    /// `job-N`, given when the job is listed ([`Jobs::list_job`]).
    id: OnceLock<String>,
    /// Names its output files: every job has one, listed or not.
    seq: u64,
    /// Where its output files go.
    dir: PathBuf,
    command: String,
    started_at: String,
    started: Instant,
    limit: usize,
    encoding: OutputEncoding,
    terminal: bool,
    streams: Mutex<[Kept; 2]>,
    end: watch::Sender<Option<Ended>>,
    kill: Notify,
    killed: AtomicBool,
    progress: Mutex<Option<Progress>>,
    /// How long it ran, set as it ends: a report of an ended job without an Exec object
    /// (`failed`) says this, not the time since it started.
    ran: OnceLock<Duration>,
    /// Its kept output was forgotten to make room for newer jobs' ([`Job::make_room`]); set
    /// under its streams' lock, with the bytes moved to `dropped`.
    evicted: AtomicBool,
    /// The sandbox's kept job output, shared by its jobs.
    total: Arc<AtomicU64>,
    /// The sandbox's jobs ([`Jobs::list`]), where a job whose output meets the bound finds the
    /// ended ones to forget the output of. Weak: the list holds its jobs.
    jobs: Weak<JobList>,
    /// The sandbox's list of running jobs, which the job leaves when it ends.
    board: Arc<Board>,
}

/// A sandbox's jobs, oldest first.
type JobList = Mutex<Vec<Arc<Job>>>;

/// A sandbox's jobs.
pub struct Jobs {
    dir: PathBuf,
    /// The next listed job's number.
    next: AtomicU64,
    /// The next job's [`Job::seq`].
    seq: AtomicU64,
    list: Arc<JobList>,
    total: Arc<AtomicU64>,
    board: Arc<Board>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Jobs {
    /// Jobs whose output goes under `dir` (created when output first goes to files). A
    /// supervisor executed anew for a restore takes on, as ended jobs, those the one before
    /// handed over ([`Jobs::hand_over`]), their output counted in [`JOB_OUTPUT_BOUND`] again;
    /// any other output file there belongs to no job it knows and is removed, so what the
    /// bound counts is what the host keeps.
    pub fn new(dir: PathBuf) -> Self {
        let first = std::fs::read_to_string(dir.join(NEXT_ID_FILE))
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .filter(|n| *n >= 1)
            .unwrap_or(1);
        let total = Arc::new(AtomicU64::new(0));
        let board = Arc::new(Board::new(&dir));
        let list: Arc<JobList> = Arc::new(Mutex::new(Vec::new()));
        let taken: Vec<Arc<Job>> = take_handed_over(&dir, first)
            .into_iter()
            .map(|handed| Job::handed_over(&dir, handed, &total, &list, &board))
            .collect();
        remove_strays(&dir, &taken);
        // A new supervisor runs no job yet: the one before may have left its jobs listed
        // there, cut off by the restore before their ends were written.
        match std::fs::remove_file(dir.join(RUNNING_FILE)) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => tracing::warn!(
                "removing the running jobs' list in {}: {err}",
                dir.display()
            ),
            _ => {}
        }
        // The index is the new supervisor's from here: the jobs it took on, or none.
        if taken.is_empty() {
            match std::fs::remove_file(dir.join(INDEX_FILE)) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!("removing the jobs' index in {}: {err}", dir.display())
                }
                _ => {}
            }
        } else {
            let entries: Vec<Indexed> = taken.iter().map(|job| job.indexed()).collect();
            board.index(|index| {
                *index = entries;
                true
            });
        }
        let seq = taken.iter().map(|job| job.seq).max().unwrap_or(0) + 1;
        *lock(&list) = taken;
        Self {
            next: AtomicU64::new(first),
            seq: AtomicU64::new(seq),
            list,
            total,
            board,
            dir,
        }
    }

    /// The jobs a supervisor killed outright left in `dir`, for the recovery of its task's
    /// work ([`INDEX_FILE`]): ended jobs, each with the output its files hold, and the ones
    /// its death cut off (those it had not seen end). Nothing in `dir` is changed: the
    /// recovery only copies their output into the task's results ([`save_logs`]).
    pub fn recovered(dir: PathBuf) -> (Self, Vec<RunningJob>) {
        let board = Arc::new(Board::new(&dir));
        let total = Arc::new(AtomicU64::new(0));
        let list: Arc<JobList> = Arc::new(Mutex::new(Vec::new()));
        let mut cut_off = Vec::new();
        let jobs: Vec<Arc<Job>> = read_index(&dir)
            .into_iter()
            .map(|entry| {
                if !entry.ended {
                    cut_off.push(RunningJob {
                        job: entry.job.clone(),
                        command: entry.command.clone(),
                        started_at: entry.started_at.clone(),
                        running_seconds: 0,
                    });
                }
                // What its files hold is what was kept: nothing has written them since.
                let kept = [0, 1].map(|i| {
                    std::fs::symlink_metadata(dir.join(output_name(entry.seq, i)))
                        .ok()
                        .filter(std::fs::Metadata::is_file)
                        .map_or(0, |meta| meta.len())
                });
                let handed = HandedOver {
                    job: entry.job,
                    seq: entry.seq,
                    command: entry.command,
                    started_at: entry.started_at,
                    duration_ms: 0,
                    state: JobState::Failed,
                    exit_code: None,
                    signal: None,
                    error: Some(Error::internal(
                        "the sandbox's supervisor was killed; its output up to then is kept",
                    )),
                    kept,
                    dropped: entry.dropped,
                    output_evicted: false,
                    max_output_bytes: crate::model::spec::EXEC_OUTPUT_LIMIT,
                    output_encoding: OutputEncoding::Utf8,
                    result: None,
                };
                Job::handed_over(&dir, handed, &total, &list, &board)
            })
            .collect();
        let seq = jobs.iter().map(|job| job.seq).max().unwrap_or(0) + 1;
        *lock(&list) = jobs;
        let recovered = Self {
            next: AtomicU64::new(1),
            seq: AtomicU64::new(seq),
            list,
            total,
            board,
            dir,
        };
        (recovered, cut_off)
    }

    /// Before this supervisor executes itself anew for a restore to `label`: records its
    /// listed jobs ([`HANDED_OVER_FILE`]) for the next to take on. Those in `cut_off` (the
    /// restore's `jobsEnded`), and any not yet seen to end, are recorded as the restore
    /// ended them. A record that cannot be written is logged: the next supervisor then
    /// removes their output, as it would any it does not know.
    pub fn hand_over(&self, cut_off: &[RunningJob], label: &str) {
        let handed: Vec<HandedOver> = lock(&self.list)
            .iter()
            .filter(|job| job.is_listed())
            .map(|job| {
                let report = job.report(None);
                let ended_by_restore = report.state == JobState::Running
                    || cut_off.iter().any(|c| c.job == report.job);
                let (kept, dropped) = {
                    let streams = lock(&job.streams);
                    (
                        [streams[0].kept, streams[1].kept],
                        [streams[0].dropped, streams[1].dropped],
                    )
                };
                let output_evicted = report.output_evicted;
                let result = report
                    .result
                    .filter(|_| !ended_by_restore)
                    .map(|mut result| {
                        result.stdout = None;
                        result.stderr = None;
                        result.transcript = None;
                        result
                    });
                let (state, exit_code, signal, error) = if ended_by_restore {
                    let error = Error::conflict(format!(
                        "the task was restored to its checkpoint {label:?} while this job ran, \
                         which ended it; its output up to then is kept"
                    ));
                    (JobState::Failed, None, None, Some(error))
                } else {
                    (report.state, report.exit_code, report.signal, report.error)
                };
                HandedOver {
                    job: report.job,
                    seq: job.seq,
                    command: report.command,
                    started_at: report.started_at,
                    duration_ms: report.duration_ms,
                    state,
                    exit_code,
                    signal,
                    error,
                    kept,
                    dropped,
                    output_evicted,
                    max_output_bytes: job.limit as u64,
                    output_encoding: job.encoding,
                    result,
                }
            })
            .collect();
        let path = self.dir.join(HANDED_OVER_FILE);
        let written = serde_json::to_vec(&handed)
            .map_err(std::io::Error::other)
            .and_then(|text| {
                std::fs::create_dir_all(&self.dir)?;
                dynocap_host::durable::replace(&path, &text)
            });
        if let Err(err) = written {
            tracing::warn!(
                "recording the jobs for the restored supervisor in {}: {err}; their output \
                 will not be kept",
                path.display()
            );
        }
    }

    /// A new job for `spec`, not started yet (see [`Job::drive`]) and not listed: its output
    /// stays in memory until [`Jobs::list_job`] or [`Jobs::release`]. A `background` one is
    /// listed at once and counts against [`MAX_RUNNING_JOBS`]; any other, within its call,
    /// against [`MAX_IN_CALL_JOBS`].
    pub fn add(&self, spec: &ExecSpec, background: bool) -> Result<Arc<Job>> {
        let mut list = lock(&self.list);
        let listed: Vec<&str> = list
            .iter()
            .filter(|job| job.is_listed() && job.is_running())
            .map(|job| job.id())
            .collect();
        let in_call = list
            .iter()
            .filter(|job| !job.is_listed() && job.is_running())
            .count();
        let kill_one = "kill one (dynocap_job with kill: true, or `dynocap job NAME JOB --kill`) \
                        or wait for one to end";
        if background && listed.len() >= MAX_RUNNING_JOBS {
            return Err(Error::conflict(format!(
                "this sandbox already runs {} jobs ({}), the most it runs in the background at \
                 once: {kill_one}",
                listed.len(),
                listed.join(", ")
            )));
        }
        if !background && in_call >= MAX_IN_CALL_JOBS {
            return Err(Error::conflict(format!(
                "this sandbox already runs {in_call} commands within their calls, the most it \
                 runs at once besides its jobs; wait for one to answer"
            )));
        }
        if !background && listed.len() + in_call >= MAX_RUNNING_JOBS + MAX_IN_CALL_JOBS {
            return Err(Error::conflict(format!(
                "this sandbox already runs {} jobs ({}) and {in_call} commands within their \
                 calls, the most it runs at once: {kill_one}",
                listed.len(),
                listed.join(", ")
            )));
        }
        // A job not listed belongs to a call still answering, which releases it itself.
        while list.len() >= MAX_KEPT_JOBS {
            let Some(oldest) = list
                .iter()
                .position(|job| job.is_listed() && !job.is_running())
            else {
                break;
            };
            let forgotten = list.remove(oldest);
            forgotten.forget();
            self.board.index(|index| {
                index.retain(|entry| entry.job != forgotten.id());
                true
            });
        }
        let (end, _) = watch::channel(None);
        let job = Arc::new(Job {
            id: OnceLock::new(),
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            dir: self.dir.clone(),
            command: sanitize_line(&spec.command, COMMAND_SHOWN),
            started_at: crate::model::sandbox_info::rfc3339(chrono::Utc::now()),
            started: Instant::now(),
            limit: usize::try_from(spec.max_output_bytes).unwrap_or(usize::MAX),
            encoding: spec.output_encoding,
            terminal: spec.terminal,
            streams: Mutex::new([Kept::new(), Kept::new()]),
            end,
            kill: Notify::new(),
            killed: AtomicBool::new(false),
            progress: Mutex::new(None),
            ran: OnceLock::new(),
            evicted: AtomicBool::new(false),
            total: self.total.clone(),
            jobs: Arc::downgrade(&self.list),
            board: self.board.clone(),
        });
        list.push(job.clone());
        Ok(job)
    }

    /// Makes `job` a job to everyone: it outlived its call, or starts in the background. It
    /// gets its id, its output moves to its files, and it enters [`RUNNING_FILE`] unless it
    /// has ended meanwhile. Listing a listed job does nothing.
    pub fn list_job(&self, job: &Arc<Job>) {
        if job.is_listed() {
            return;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let _ = job.id.set(format!("job-{n}"));
        job.spill(&mut lock(&job.streams));
        self.save_next_id(n + 1);
        // Read before the index's lock is taken (see Board); whether it ended is read under
        // it, as its end marks it (Job::set_ended): either way the index ends up saying so.
        let mut entry = job.indexed();
        self.board.index(|index| {
            entry.ended = !job.is_running();
            index.push(entry);
            true
        });
        // Under the board's lock, as the job's end removes it (Job::set_ended): either the end
        // came first and nothing is entered, or the end removes what is entered here.
        self.board.change(|running| {
            if !job.is_running() {
                return false;
            }
            running.push(RunningJob {
                job: job.id().to_owned(),
                command: job.command.clone(),
                started_at: job.started_at.clone(),
                running_seconds: 0,
            });
            true
        });
    }

    /// Records the number the next listed job takes ([`NEXT_ID_FILE`]).
    fn save_next_id(&self, next: u64) {
        let path = self.dir.join(NEXT_ID_FILE);
        let partial = path.with_extension("partial");
        let written = std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::write(&partial, format!("{next}\n")))
            .and_then(|()| std::fs::rename(&partial, &path));
        if let Err(err) = written {
            // Only a restore would then number from an earlier id.
            tracing::warn!("recording the next job id in {}: {err}", path.display());
        }
    }

    /// The call that started `job` has answered: a job it did not list ended within it (its
    /// Exec object carried the output) or never started, and is forgotten with its output.
    pub fn release(&self, job: &Arc<Job>) {
        if job.is_listed() {
            return;
        }
        lock(&self.list).retain(|other| !Arc::ptr_eq(other, job));
        job.forget();
    }

    /// The job `id` of this sandbox.
    pub fn get(&self, id: &str) -> Result<Arc<Job>> {
        let list = lock(&self.list);
        if let Some(job) = list.iter().find(|job| job.is_listed() && job.id() == id) {
            return Ok(job.clone());
        }
        let known: Vec<&str> = list
            .iter()
            .filter(|job| job.is_listed())
            .map(|job| job.id())
            .collect();
        // Every number below the next was given to a listed job, which this sandbox then
        // remembered until its [`MAX_KEPT_JOBS`] later ones pushed it out (across restores
        // too: see [`Jobs::hand_over`]). Only in the form a supervisor gives (`job-N`, no
        // sign, no leading zero): `job-01` or `job-+1` never was an id, so it is unknown.
        let forgotten = id
            .strip_prefix("job-")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| {
                n >= 1 && n < self.next.load(Ordering::Relaxed) && id == format!("job-{n}")
            });
        if forgotten {
            return Err(Error::not_found(format!(
                "{id} is no longer kept: a sandbox remembers its last {MAX_KEPT_JOBS} jobs and \
                 forgets the oldest that ended, with its output, as another starts; its jobs \
                 are {}",
                match known.len() {
                    0 => "none".to_owned(),
                    _ => known.join(", "),
                }
            )));
        }
        Err(Error::not_found(format!(
            "this sandbox has no job \"{}\"{}",
            sanitize_line(id, 64),
            match known.len() {
                0 => "; it has none".to_owned(),
                _ => format!("; its jobs are {}", known.join(", ")),
            }
        )))
    }

    /// Every job this sandbox remembers, oldest first, without output: not even an ended
    /// one's Exec object, whose output (up to a megabyte a stream each) would put the whole
    /// list past a control line's bound.
    pub fn list(&self) -> Vec<JobReport> {
        lock(&self.list)
            .iter()
            .filter(|job| job.is_listed())
            .map(|job| JobReport {
                result: None,
                ..job.report(None)
            })
            .collect()
    }

    /// The jobs still running, with how long each has run.
    pub fn running(&self) -> Vec<RunningJob> {
        lock(&self.list)
            .iter()
            .filter(|job| job.is_listed() && job.is_running())
            .map(|job| RunningJob {
                job: job.id().to_owned(),
                command: job.command.clone(),
                started_at: job.started_at.clone(),
                running_seconds: job.started.elapsed().as_secs(),
            })
            .collect()
    }

    /// Where each job's kept output is and how much of it there is, for [`save_logs`]: taken
    /// under each job's lock, so a copy made from it never reads half a write.
    pub fn kept_output(&self, cut_off: &[RunningJob]) -> Vec<KeptOutput> {
        lock(&self.list)
            .iter()
            .filter(|job| job.is_listed())
            .map(|job| {
                let streams = lock(&job.streams);
                KeptOutput {
                    job: job.id().to_owned(),
                    command: job.command.clone(),
                    started_at: job.started_at.clone(),
                    cut_off: cut_off.iter().any(|listed| listed.job == job.id()),
                    streams: [0, 1]
                        .map(|i| (streams[i].path.clone(), streams[i].kept, streams[i].dropped)),
                }
            })
            .collect()
    }
}

/// A listed job as one of this module's records in a jobs directory names it
/// ([`HANDED_OVER_FILE`], [`INDEX_FILE`]): what [`read_record`] checks of each entry.
trait Recorded: serde::de::DeserializeOwned {
    /// Its id and sequence number.
    fn id(&self) -> (&str, u64);
    /// Its start and command, which [`read_record`] puts back in the form this module gives
    /// them.
    fn shown(&mut self) -> (&mut String, &mut String);
}

impl Recorded for HandedOver {
    fn id(&self) -> (&str, u64) {
        (&self.job, self.seq)
    }
    fn shown(&mut self) -> (&mut String, &mut String) {
        (&mut self.started_at, &mut self.command)
    }
}

impl Recorded for Indexed {
    fn id(&self) -> (&str, u64) {
        (&self.job, self.seq)
    }
    fn shown(&mut self) -> (&mut String, &mut String) {
        (&mut self.started_at, &mut self.command)
    }
}

/// The entries of the record at `path` (`what`, for the log) that hold, the latest `keep`.
/// The file is the supervisor's own, but read as any file on the host: more than `max` bytes,
/// or not one record, and none is read; an entry is left out unless its id is one this module
/// makes (`job-N`, with `numbered(N)`), its sequence number is above 0 and no other entry's,
/// and its start is a time. No file: none.
fn read_record<T: Recorded>(
    path: &std::path::Path,
    what: &str,
    max: u64,
    numbered: impl Fn(u64) -> bool,
    keep: usize,
) -> Vec<T> {
    let mut text = Vec::new();
    let read = std::fs::File::open(path).and_then(|file| file.take(max + 1).read_to_end(&mut text));
    match read {
        Ok(_) if text.len() as u64 > max => {
            tracing::warn!(
                "{what} {} takes more than {max} bytes; none is taken",
                path.display()
            );
            return Vec::new();
        }
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(err) => {
            tracing::warn!("reading {what} {}: {err}", path.display());
            return Vec::new();
        }
    }
    let entries: Vec<T> = match serde_json::from_slice(&text) {
        Ok(entries) => entries,
        Err(err) => {
            tracing::warn!("{what} {}: {err}", path.display());
            return Vec::new();
        }
    };
    let mut taken: Vec<T> = Vec::new();
    for mut entry in entries {
        let (job, seq) = entry.id();
        let ours = job
            .strip_prefix("job-")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| numbered(n) && job == format!("job-{n}"));
        let fresh = !taken.iter().any(|other| {
            let (other_job, other_seq) = other.id();
            other_job == job || other_seq == seq
        });
        let (started_at, command) = entry.shown();
        let started = chrono::DateTime::parse_from_rfc3339(started_at).ok();
        let (true, Some(started), true, true) = (ours, started, seq >= 1, fresh) else {
            let (job, seq) = entry.id();
            tracing::warn!(
                "a job in {what} {} does not hold (id {:?}, sequence {seq}); it is left out",
                path.display(),
                sanitize_line(job, 64),
            );
            continue;
        };
        *started_at = crate::model::sandbox_info::rfc3339(started.with_timezone(&chrono::Utc));
        *command = sanitize_line(command, COMMAND_SHOWN);
        taken.push(entry);
    }
    let extra = taken.len().saturating_sub(keep);
    taken.drain(..extra);
    taken
}

/// The jobs the supervisor before a restore handed over in `dir` ([`HANDED_OVER_FILE`]),
/// taking the file away: at most [`MAX_KEPT_JOBS`], the latest, each with an id this sandbox
/// gave (`job-N`, N below `next`, the next id to give); one that does not hold is left out
/// ([`read_record`]: its output is then removed as a stray's).
fn take_handed_over(dir: &std::path::Path, next: u64) -> Vec<HandedOver> {
    let path = dir.join(HANDED_OVER_FILE);
    let mut taken: Vec<HandedOver> = read_record(
        &path,
        "the jobs handed over in",
        HANDED_OVER_MAX,
        |n| (1..next).contains(&n),
        MAX_KEPT_JOBS,
    );
    // Its news is taken: a later supervisor hears only from one that restores again.
    match std::fs::remove_file(&path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!("removing {}: {err}", path.display())
        }
        _ => {}
    }
    for entry in &mut taken {
        entry.max_output_bytes = entry
            .max_output_bytes
            .clamp(1, crate::model::spec::EXEC_OUTPUT_LIMIT);
        if entry.state == JobState::Running {
            entry.state = JobState::Failed;
        }
    }
    taken
}

/// The name of a job's output file in its jobs directory: stream 0 is stdout, 1 stderr.
fn output_name(seq: u64, stream: usize) -> String {
    format!("{seq}.{}", if stream == 0 { "stdout" } else { "stderr" })
}

/// The listed jobs in `dir`'s [`INDEX_FILE`], those that hold ([`read_record`]), the latest
/// [`INDEX_MAX_ENTRIES`]. No file, or one that does not read: none (a recovery saves the
/// task's work all the same).
fn read_index(dir: &std::path::Path) -> Vec<Indexed> {
    read_record(
        &dir.join(INDEX_FILE),
        "the jobs' index",
        INDEX_MAX,
        |n| n >= 1,
        INDEX_MAX_ENTRIES,
    )
}

/// Removes the output files in `dir` of no job in `known`: a job's that ended within its call
/// before a restore, or one whose hand-over was lost. Only the names output files take
/// (`N.stdout`, `N.stderr`) are touched.
fn remove_strays(dir: &std::path::Path, known: &[Arc<Job>]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((seq, suffix)) = name.to_str().and_then(|name| name.split_once('.')) else {
            continue;
        };
        let is_output = matches!(suffix, "stdout" | "stderr")
            && !seq.is_empty()
            && seq.bytes().all(|b| b.is_ascii_digit());
        if !is_output || known.iter().any(|job| job.seq.to_string() == seq) {
            continue;
        }
        if let Err(err) = std::fs::remove_file(entry.path()) {
            tracing::warn!(
                "removing {}, output of no job: {err}",
                entry.path().display()
            );
        }
    }
}

/// One job's kept output ([`Jobs::kept_output`]): each stream's file (none when it had nothing
/// to keep), bytes kept, bytes dropped.
pub struct KeptOutput {
    job: String,
    command: String,
    started_at: String,
    cut_off: bool,
    streams: [(Option<PathBuf>, u64, u64); 2],
}

/// Copies each job's whole kept output into `dir` (a task's results: `<job>.stdout`,
/// `<job>.stderr`) and says where it is. The copies are bounded as the kept output is
/// ([`JOB_OUTPUT_BOUND`] for all of a sandbox's jobs); what was never kept is counted in
/// the log's `stdoutDropped`/`stderrDropped`. A copy that fails is logged and counted as
/// dropped: the task's work is saved all the same.
pub fn save_logs(dir: &std::path::Path, kept: Vec<KeptOutput>) -> Vec<JobLog> {
    if kept.is_empty() {
        return Vec::new();
    }
    if let Err(err) = std::fs::create_dir_all(dir) {
        tracing::warn!(
            "creating {}: {err}; the jobs' output is not saved",
            dir.display()
        );
    }
    kept.into_iter()
        .map(|job| {
            // Job ids are made by this module (`job-N`): safe as file names.
            let out = dir.join(format!("{}.stdout", job.job));
            let err = dir.join(format!("{}.stderr", job.job));
            let [stdout, stderr] = [0, 1].map(|i| {
                let (source, kept, dropped) = &job.streams[i];
                let target = if i == 0 { &out } else { &err };
                match copy_prefix(source.as_deref(), target, *kept) {
                    Ok(()) => (*kept, *dropped),
                    Err(why) => {
                        tracing::warn!(
                            "saving {}'s output into {}: {why}",
                            job.job,
                            target.display()
                        );
                        (0, dropped + kept)
                    }
                }
            });
            JobLog {
                job: job.job,
                command: job.command,
                started_at: job.started_at,
                cut_off: job.cut_off,
                stdout_path: out.display().to_string(),
                stderr_path: err.display().to_string(),
                stdout_bytes: stdout.0,
                stderr_bytes: stderr.0,
                stdout_dropped: stdout.1,
                stderr_dropped: stderr.1,
            }
        })
        .collect()
}

/// The first `len` bytes of `source` (none: an empty stream) into a new `target`, synced.
fn copy_prefix(
    source: Option<&std::path::Path>,
    target: &std::path::Path,
    len: u64,
) -> std::io::Result<()> {
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(target)?;
    let copied = match source {
        Some(source) => std::io::copy(&mut std::fs::File::open(source)?.take(len), &mut to)?,
        None => 0,
    };
    if copied != len {
        return Err(std::io::Error::other(format!(
            "{copied} of {len} bytes were there to copy"
        )));
    }
    to.sync_all()
}

impl Job {
    /// A job `handed` over by the supervisor before a restore ([`take_handed_over`]): ended,
    /// listed, its output in its files in `dir`, counted in `total`. A file shorter than the
    /// record says holds what it holds (the rest counted as dropped); one longer, written to
    /// after the record was made, is cut to it.
    fn handed_over(
        dir: &std::path::Path,
        handed: HandedOver,
        total: &Arc<AtomicU64>,
        jobs: &Arc<JobList>,
        board: &Arc<Board>,
    ) -> Arc<Job> {
        let streams = [0, 1].map(|i| {
            let path = dir.join(format!(
                "{}.{}",
                handed.seq,
                if i == 0 { "stdout" } else { "stderr" }
            ));
            let on_disk = std::fs::symlink_metadata(&path)
                .ok()
                .filter(std::fs::Metadata::is_file)
                .map(|meta| meta.len());
            let kept = handed.kept[i].min(on_disk.unwrap_or(0));
            if on_disk.is_some_and(|len| len > kept) {
                let cut = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|file| file.set_len(kept));
                if let Err(err) = cut {
                    tracing::warn!("cutting {} to its kept output: {err}", path.display());
                }
            }
            total.fetch_add(kept, Ordering::Relaxed);
            Kept {
                sink: Sink::Closed,
                path: on_disk.map(|_| path),
                kept,
                dropped: handed.dropped[i].saturating_add(handed.kept[i] - kept),
            }
        });
        let id = OnceLock::new();
        let _ = id.set(handed.job.clone());
        let evicted = AtomicBool::new(handed.output_evicted);
        let (end, _) = watch::channel(None);
        Arc::new(Job {
            id,
            seq: handed.seq,
            dir: dir.to_path_buf(),
            command: handed.command.clone(),
            started_at: handed.started_at.clone(),
            started: Instant::now(),
            limit: usize::try_from(handed.max_output_bytes).unwrap_or(usize::MAX),
            encoding: handed.output_encoding,
            terminal: false,
            streams: Mutex::new(streams),
            end: {
                end.send_replace(Some(Ended::Before(Box::new(handed))));
                end
            },
            kill: Notify::new(),
            killed: AtomicBool::new(false),
            progress: Mutex::new(None),
            ran: OnceLock::new(),
            evicted,
            total: total.clone(),
            jobs: Arc::downgrade(jobs),
            board: board.clone(),
        })
    }

    /// The job's id; empty until it is listed.
    pub fn id(&self) -> &str {
        self.id.get().map_or("", String::as_str)
    }

    fn is_listed(&self) -> bool {
        self.id.get().is_some()
    }

    pub fn is_running(&self) -> bool {
        self.end.borrow().is_none()
    }

    /// Runs the job's command as an exec request on `stream`, whose other end a connection
    /// handler serves, keeping its output until it ends. A kill closes the request's writing
    /// side, which cancels the command as a client that goes away does.
    pub async fn drive(self: Arc<Self>, stream: UnixStream, spec: ExecSpec) {
        let spec = ExecSpec {
            report_progress: true,
            stream_output: !spec.terminal,
            ..spec
        };
        let ended = self.exchange(stream, spec).await;
        self.set_ended(ended);
    }

    /// Records the job's end: waiters see it, listings no longer show it running.
    fn set_ended(&self, ended: Ended) {
        // Before the end is seen: whoever sees it finds how long the job ran.
        let _ = self.ran.set(self.started.elapsed());
        self.end.send_replace(Some(ended));
        // The id is read under the board's lock: see Jobs::list_job.
        self.board.change(|running| {
            let Some(id) = self.id.get() else {
                return false;
            };
            let before = running.len();
            running.retain(|listed| &listed.job != id);
            running.len() != before
        });
        self.reindex();
    }

    /// Updates the job's entry in the index: whether it ended, what it dropped.
    fn reindex(&self) {
        let Some(id) = self.id.get() else {
            return;
        };
        let now = self.indexed();
        self.board.index(|index| {
            let Some(entry) = index.iter_mut().find(|entry| &entry.job == id) else {
                return false;
            };
            entry.ended = now.ended;
            entry.dropped = now.dropped;
            true
        });
    }

    /// The job's entry in [`INDEX_FILE`], as it stands.
    fn indexed(&self) -> Indexed {
        let dropped = {
            let streams = lock(&self.streams);
            [streams[0].dropped, streams[1].dropped]
        };
        Indexed {
            job: self.id().to_owned(),
            seq: self.seq,
            command: self.command.clone(),
            started_at: self.started_at.clone(),
            ended: !self.is_running(),
            dropped,
        }
    }

    async fn exchange(&self, stream: UnixStream, spec: ExecSpec) -> Ended {
        let (read, mut write) = stream.into_split();
        if let Err(err) = write_message(&mut write, &ControlRequest::Exec { spec }).await {
            return Ended::Failed(err);
        }
        let mut reader = BufReader::new(read);
        let mut write = Some(write);
        loop {
            let message = tokio::select! {
                message = read_message::<ControlReply, _>(&mut reader) => message,
                () = self.kill.notified(), if write.is_some() => {
                    self.killed.store(true, Ordering::Relaxed);
                    if let Some(mut write) = write.take() {
                        let _ = write.shutdown().await;
                    }
                    continue;
                }
            };
            match message {
                Ok(Some(ControlReply::Output(chunk))) => self.keep(chunk.channel, &chunk.data),
                Ok(Some(ControlReply::Progress(report))) => *lock(&self.progress) = Some(report),
                Ok(Some(ControlReply::Exec(result))) => {
                    if self.terminal {
                        self.keep_transcript(&result);
                    }
                    return Ended::Done(Box::new(result));
                }
                Ok(Some(ControlReply::Error(err))) => return Ended::Failed(err),
                Ok(Some(_)) => {
                    return Ended::Failed(Error::internal("unexpected answer to a job's exec"))
                }
                Ok(None) => {
                    return Ended::Failed(Error::internal("a job's exec ended without an answer"))
                }
                Err(err) => return Ended::Failed(err),
            }
        }
    }

    /// Appends guest output to its stream, within the sandbox's bound.
    fn keep(&self, channel: OutputChannel, data: &[u8]) {
        let index = match channel {
            OutputChannel::Stdout => 0,
            OutputChannel::Stderr => 1,
        };
        let len = data.len() as u64;
        // Reserved before the streams' lock is taken: making room takes other jobs' locks
        // (see Job::make_room). A forget of this job meanwhile closes its sink, and the
        // reservation is then given back below as any bytes not written are.
        let mut room = reserve(&self.total, len);
        if room < len {
            room += self.make_room(len - room);
        }
        let mut streams = lock(&self.streams);
        let keep = usize::try_from(room).unwrap_or(data.len()).min(data.len());
        if matches!(streams[index].sink, Sink::Memory(_))
            && streams[0].in_memory() + streams[1].in_memory() + keep > MEMORY_BOUND
        {
            self.spill(&mut streams);
        }
        let stream = &mut streams[index];
        let written = match &mut stream.sink {
            Sink::Memory(held) => {
                held.extend_from_slice(&data[..keep]);
                true
            }
            Sink::File(file) => file.write_all(&data[..keep]).is_ok(),
            Sink::Closed => false,
        };
        if written {
            stream.kept += keep as u64;
            stream.dropped += len - keep as u64;
        } else {
            // A host file that cannot be written: the job's output from here is dropped.
            stream.sink = Sink::Closed;
            self.total.fetch_sub(keep as u64, Ordering::Relaxed);
            stream.dropped += len;
        }
    }

    /// Reserves up to `want` bytes in the sandbox's bound, forgetting the output of its oldest
    /// ended listed jobs, whole jobs, oldest first, until they fit or no ended job holds any;
    /// the bytes reserved. Running jobs never lose kept output to each other: a job's output
    /// past the bound while only running jobs hold it is dropped, counted, as before.
    ///
    /// It cannot deadlock: the only nesting of these locks anywhere is the list's, then a
    /// job's streams' (here, in [`Jobs::add`], [`Jobs::hand_over`], [`Jobs::kept_output`]),
    /// never the other way round: [`Job::keep`] calls this before it takes its own streams'
    /// lock, and no code takes the list's lock while holding a streams' lock. The jobs
    /// forgotten are ended ones (their streams are no longer written), never this one.
    fn make_room(&self, want: u64) -> u64 {
        let Some(jobs) = self.jobs.upgrade() else {
            return 0;
        };
        let list = lock(&jobs);
        let mut reserved = 0;
        for job in list.iter() {
            // Bytes others' output gave back since (an ended job released or forgotten).
            reserved += reserve(&self.total, want - reserved);
            if reserved == want {
                break;
            }
            if std::ptr::eq(Arc::as_ptr(job), self) || !job.is_listed() || job.is_running() {
                continue;
            }
            job.evict();
        }
        if reserved < want {
            reserved += reserve(&self.total, want - reserved);
        }
        reserved
    }

    /// Forgets an ended job's kept output to make room for newer jobs' ([`Job::make_room`]):
    /// its bytes are counted as dropped, it stays listed with its state, and its report says
    /// why its output is gone.
    fn evict(&self) {
        let mut streams = lock(&self.streams);
        if streams.iter().all(|stream| stream.kept == 0) {
            return;
        }
        for stream in streams.iter_mut() {
            stream.dropped += stream.kept;
        }
        self.evicted.store(true, Ordering::Relaxed);
        self.forget_locked(&mut streams);
        drop(streams);
        self.reindex();
    }

    /// Moves what the streams hold in memory to their files, where their output goes from
    /// now on. A file that cannot be made or written drops its stream's output, counted: the
    /// job has not been listed yet, so no caller has seen offsets that would now go back.
    fn spill(&self, streams: &mut [Kept; 2]) {
        for (stream, suffix) in streams.iter_mut().zip(["stdout", "stderr"]) {
            let Sink::Memory(held) = &stream.sink else {
                continue;
            };
            let path = self.dir.join(format!("{}.{suffix}", self.seq));
            let made = std::fs::create_dir_all(&self.dir)
                .and_then(|()| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(true)
                        .write(true)
                        .open(&path)
                })
                .and_then(|mut file| file.write_all(held).map(|()| file));
            match made {
                Ok(file) => {
                    stream.sink = Sink::File(file);
                    stream.path = Some(path);
                }
                Err(err) => {
                    tracing::warn!(
                        "keeping a job's output in {}: {err}; its output is dropped",
                        path.display()
                    );
                    let _ = std::fs::remove_file(&path);
                    stream.sink = Sink::Closed;
                    self.total.fetch_sub(stream.kept, Ordering::Relaxed);
                    stream.dropped += stream.kept;
                    stream.kept = 0;
                }
            }
        }
    }

    /// A terminal command streams nothing: its rendered transcript is its output, kept at its end.
    fn keep_transcript(&self, result: &ExecResult) {
        let Some(text) = &result.transcript else {
            return;
        };
        let bytes = match self.encoding {
            OutputEncoding::Utf8 => text.as_bytes().to_vec(),
            OutputEncoding::Base64 => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .unwrap_or_default()
            }
        };
        self.keep(OutputChannel::Stdout, &bytes);
    }

    /// Asks the job to stop; [`Job::wait`] then sees it end.
    pub fn kill(&self) {
        self.kill.notify_one();
    }

    /// Waits up to `limit` for the job to end; whether it has. While it waits, `progress`
    /// hears how the command goes every few seconds.
    pub async fn wait(&self, limit: Duration, mut progress: Option<&mut OwnedWriteHalf>) -> bool {
        let mut ended = self.end.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        loop {
            if ended.borrow_and_update().is_some() {
                return true;
            }
            tokio::select! {
                changed = ended.changed() => if changed.is_err() { return !self.is_running() },
                () = tokio::time::sleep_until(deadline) => return !self.is_running(),
                _ = ticks.tick() => {
                    let report = lock(&self.progress).clone();
                    if let (Some(write), Some(report)) = (progress.as_deref_mut(), report) {
                        let _ = write_message(write, &ControlReply::Progress(report)).await;
                    }
                }
            }
        }
    }

    /// The job's state, with its output since `offsets` (stdout, stderr) when asked for.
    pub fn report(&self, offsets: Option<(u64, u64)>) -> JobReport {
        let ended = self.end.borrow().clone();
        let (mut stdout_kept, mut stderr_kept, stdout_dropped, stderr_dropped, output_evicted) = {
            let streams = lock(&self.streams);
            (
                streams[0].kept,
                streams[1].kept,
                streams[0].dropped,
                streams[1].dropped,
                self.evicted.load(Ordering::Relaxed),
            )
        };
        // A running job's text ends at its last whole character: the bytes of one it has
        // begun are left for the next poll, which reads them from the offset answered here
        // whole. Cut there, a caller following the offsets got U+FFFD twice for one "é".
        if ended.is_none() && matches!(self.encoding, OutputEncoding::Utf8) {
            stdout_kept -= self.unfinished_char(0, stdout_kept);
            stderr_kept -= self.unfinished_char(1, stderr_kept);
        }
        let (mut stdout, mut stderr, mut truncated) = (String::new(), String::new(), false);
        if let Some((from_out, from_err)) = offsets {
            let (out, cut_out) = self.read(0, from_out, stdout_kept, self.limit);
            let (err, cut_err) = self.read(1, from_err, stderr_kept, self.limit);
            stdout = self.encode(out);
            stderr = self.encode(err);
            truncated = cut_out || cut_err;
        }
        let mut report = JobReport {
            job: self.id().to_owned(),
            state: JobState::Running,
            command: self.command.clone(),
            started_at: self.started_at.clone(),
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            exit_code: None,
            signal: None,
            stdout,
            stderr,
            truncated,
            stdout_offset: stdout_kept,
            stderr_offset: stderr_kept,
            stdout_dropped,
            stderr_dropped,
            output_evicted,
            error: None,
            result: None,
            paged: false,
        };
        match ended {
            None => {}
            Some(Ended::Done(result)) => {
                report.state = if self.killed.load(Ordering::Relaxed) {
                    JobState::Killed
                } else if result.timed_out {
                    JobState::TimedOut
                } else {
                    JobState::Exited
                };
                report.exit_code = result.exit_code;
                report.signal = result.signal.clone();
                report.duration_ms = result.duration_ms;
                report.result = Some(result);
            }
            Some(Ended::Failed(err)) => {
                report.state = JobState::Failed;
                report.error = Some(err);
                if let Some(ran) = self.ran.get() {
                    report.duration_ms = u64::try_from(ran.as_millis()).unwrap_or(u64::MAX);
                }
            }
            Some(Ended::Before(handed)) => {
                report.state = handed.state;
                report.exit_code = handed.exit_code;
                report.signal = handed.signal;
                report.duration_ms = handed.duration_ms;
                report.error = handed.error;
                report.result = handed.result;
            }
        }
        report
    }

    /// The job's state with its output from `offsets` as it is, at most `max` bytes of each
    /// stream ([`JobQuery::page_bytes`]), base64-encoded; the offsets where they end.
    pub fn page(&self, offsets: (u64, u64), max: u64) -> JobReport {
        use base64::Engine as _;
        let mut report = self.report(None);
        let kept = {
            let streams = lock(&self.streams);
            [streams[0].kept, streams[1].kept]
        };
        let max = max.clamp(1, PAGE_MAX);
        let mut pages = [offsets.0, offsets.1]
            .into_iter()
            .enumerate()
            .map(|(index, from)| {
                let from = from.min(kept[index]);
                let to = kept[index].min(from.saturating_add(max));
                let limit = usize::try_from(to - from).unwrap_or(usize::MAX);
                let (bytes, _) = self.read(index, from, to, limit);
                let end = from + bytes.len() as u64;
                (base64::engine::general_purpose::STANDARD.encode(bytes), end)
            });
        if let (Some(out), Some(err)) = (pages.next(), pages.next()) {
            (report.stdout, report.stdout_offset) = out;
            (report.stderr, report.stderr_offset) = err;
        }
        report.truncated = false;
        report.paged = true;
        report
    }

    /// How many of the first `kept` bytes of a stream, at their end, begin a UTF-8
    /// character not yet whole.
    fn unfinished_char(&self, index: usize, kept: u64) -> u64 {
        let from = kept.saturating_sub(3);
        let path = {
            let streams = lock(&self.streams);
            if let Sink::Memory(held) = &streams[index].sink {
                let at =
                    |offset: u64| usize::try_from(offset).map_or(held.len(), |n| n.min(held.len()));
                return unfinished_char(&held[at(from)..at(kept)]) as u64;
            }
            streams[index].path.clone()
        };
        let mut tail = [0u8; 3];
        let len = usize::try_from(kept - from).unwrap_or(0);
        let read = path
            .and_then(|path| std::fs::File::open(path).ok())
            .is_some_and(|file| {
                use std::os::unix::fs::FileExt as _;
                file.read_exact_at(&mut tail[..len], from).is_ok()
            });
        if read {
            unfinished_char(&tail[..len]) as u64
        } else {
            0
        }
    }

    /// Bytes `from..to` of a stream, as a head and tail within `limit`.
    fn read(&self, index: usize, from: u64, to: u64, limit: usize) -> (Vec<u8>, bool) {
        let mut excerpt = Excerpt::new(limit);
        let from = from.min(to);
        let path = {
            let streams = lock(&self.streams);
            if let Sink::Memory(held) = &streams[index].sink {
                let at =
                    |offset: u64| usize::try_from(offset).map_or(held.len(), |n| n.min(held.len()));
                excerpt.push(&held[at(from)..at(to)]);
                let cut = excerpt.truncated();
                return (excerpt.into_bytes(), cut);
            }
            streams[index].path.clone()
        };
        if let Some(mut file) = path.and_then(|path| std::fs::File::open(path).ok()) {
            if file.seek(SeekFrom::Start(from)).is_ok() {
                let mut left = to - from;
                let mut buf = vec![0u8; 64 * 1024];
                while left > 0 {
                    let want = usize::try_from(left).unwrap_or(buf.len()).min(buf.len());
                    match file.read(&mut buf[..want]) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            excerpt.push(&buf[..n]);
                            left -= n as u64;
                        }
                    }
                }
            }
        }
        let cut = excerpt.truncated();
        (excerpt.into_bytes(), cut)
    }

    fn encode(&self, bytes: Vec<u8>) -> String {
        match self.encoding {
            OutputEncoding::Utf8 => String::from_utf8_lossy(&bytes).into_owned(),
            OutputEncoding::Base64 => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.encode(bytes)
            }
        }
    }

    /// Drops a job's output, its files with it, giving its room back to the sandbox's bound.
    fn forget(&self) {
        self.forget_locked(&mut lock(&self.streams));
    }

    fn forget_locked(&self, streams: &mut [Kept; 2]) {
        for stream in streams.iter_mut() {
            stream.sink = Sink::Closed;
            if let Some(path) = stream.path.take() {
                let _ = std::fs::remove_file(path);
            }
            self.total.fetch_sub(stream.kept, Ordering::Relaxed);
            stream.kept = 0;
        }
    }
}

/// Takes up to `want` bytes of the room left in the sandbox's bound (`total` is what its jobs
/// keep); the bytes taken.
fn reserve(total: &AtomicU64, want: u64) -> u64 {
    match total.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
        Some(total + want.min(JOB_OUTPUT_BOUND.saturating_sub(total)))
    }) {
        Ok(before) | Err(before) => want.min(JOB_OUTPUT_BOUND.saturating_sub(before)),
    }
}

/// The bytes at the end of `tail` that begin a UTF-8 character it does not finish: 0 when it
/// ends on a whole character or on bytes that start none.
fn unfinished_char(tail: &[u8]) -> usize {
    for back in 1..=tail.len().min(3) {
        let byte = tail[tail.len() - back];
        if byte & 0xc0 == 0x80 {
            continue;
        }
        let needs = match byte {
            0xc2..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf4 => 4,
            _ => return 0,
        };
        return if back < needs { back } else { 0 };
    }
    0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Paged, the output comes whole and as it is, from offset to offset, however long.
    #[test]
    fn a_paged_reader_gets_every_byte() {
        use base64::Engine as _;
        let decode = |text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap()
        };
        for listed in [false, true] {
            let (_dir, _jobs, job) = a_job(listed);
            // Far past the job's bound of 16 bytes a read, and not UTF-8.
            let whole: Vec<u8> = (0..1000u32).map(|n| (n % 251) as u8).collect();
            job.keep(OutputChannel::Stdout, &whole);
            job.keep(OutputChannel::Stderr, b"\xff");
            assert!(job.report(Some((0, 0))).truncated);
            let (mut got, mut offsets) = (Vec::new(), (0, 0));
            loop {
                let page = job.page(offsets, 300);
                assert!(!page.truncated);
                let bytes = decode(&page.stdout);
                assert!(bytes.len() <= 300);
                got.extend_from_slice(&bytes);
                if offsets.1 == 0 {
                    assert_eq!(decode(&page.stderr), b"\xff");
                }
                offsets = (page.stdout_offset, page.stderr_offset);
                if bytes.is_empty() {
                    break;
                }
            }
            assert_eq!(got, whole, "listed {listed}");
            assert_eq!(offsets, (1000, 1));
        }
    }

    #[test]
    fn a_character_not_yet_whole_is_left_for_the_next_poll() {
        assert_eq!(unfinished_char(b"ab\xc3"), 1);
        assert_eq!(unfinished_char("ab\u{e9}".as_bytes()), 0);
        assert_eq!(unfinished_char(b"\xe2\x82"), 2);
        assert_eq!(unfinished_char(b"\xf0\x9f\x98"), 3);
        assert_eq!(unfinished_char(b"a\x80\x80"), 0);
        assert_eq!(unfinished_char(b""), 0);
        // Followed from its offsets while it runs, a job's text comes whole ("é" split
        // between two writes), in memory and once in its files.
        for listed in [false, true] {
            let (_dir, _jobs, job) = a_job(listed);
            job.keep(OutputChannel::Stdout, b"ab\xc3");
            job.keep(OutputChannel::Stderr, b"\xe2\x82");
            let first = job.report(Some((0, 0)));
            assert_eq!(
                (first.stdout.as_str(), first.stdout_offset),
                ("ab", 2),
                "listed {listed}"
            );
            assert_eq!((first.stderr.as_str(), first.stderr_offset), ("", 0));
            job.keep(OutputChannel::Stdout, b"\xa9\n");
            job.keep(OutputChannel::Stderr, b"\xac");
            let next = job.report(Some((first.stdout_offset, first.stderr_offset)));
            assert_eq!((next.stdout.as_str(), next.stdout_offset), ("\u{e9}\n", 5));
            assert_eq!((next.stderr.as_str(), next.stderr_offset), ("\u{20ac}", 3));
        }
    }

    /// A job of `true` on a board of its own (its directory and board returned to be kept);
    /// `listed`: made a job to everyone, its output then in its files rather than in memory,
    /// for the tests that read output the same from both places.
    fn a_job(listed: bool) -> (tempfile::TempDir, Jobs, Arc<Job>) {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        let job = jobs.add(&spec("true"), false).unwrap();
        if listed {
            jobs.list_job(&job);
        }
        (dir, jobs, job)
    }

    fn spec(command: &str) -> ExecSpec {
        ExecSpec::new(command, None, "/", vec![], Some(5), false)
            .unwrap()
            .with_output(16, OutputEncoding::Utf8)
            .unwrap()
    }

    #[test]
    fn output_is_read_from_offsets_as_head_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        let job = jobs.add(&spec("true"), false).unwrap();
        job.keep(OutputChannel::Stdout, b"hello\n");
        jobs.list_job(&job);
        assert_eq!(job.id(), "job-1");
        let report = job.report(Some((0, 0)));
        assert_eq!(report.state, JobState::Running);
        assert_eq!(
            (report.stdout.as_str(), report.stdout_offset),
            ("hello\n", 6)
        );
        job.keep(
            OutputChannel::Stdout,
            b"0123456789abcdefghijklmnopqrstuvwxyz\n",
        );
        let report = job.report(Some((6, 0)));
        assert!(report.truncated, "{report:?}");
        assert!(report.stdout.starts_with("0123"), "{report:?}");
        assert!(report.stdout.contains("bytes omitted"), "{report:?}");
        assert_eq!(report.stdout_offset, 43);
        // An offset past what is kept reads nothing.
        let report = job.report(Some((1000, 1000)));
        assert_eq!((report.stdout.as_str(), report.stderr.as_str()), ("", ""));
    }

    /// A supervisor executed anew (a restore) numbers jobs on from where the last stopped.
    #[test]
    fn ids_go_on_across_a_new_supervisor() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        for id in ["job-1", "job-2"] {
            let job = jobs.add(&spec("true"), false).unwrap();
            jobs.list_job(&job);
            assert_eq!(job.id(), id);
        }
        drop(jobs);
        let again = Jobs::new(dir.path().join("jobs"));
        let job = again.add(&spec("true"), false).unwrap();
        again.list_job(&job);
        assert_eq!(job.id(), "job-3");
        // Nothing was handed over (no restore recorded them): the ids before are gone.
        let err = again.get("job-1").err().unwrap();
        assert_eq!(err.code, crate::foundation::error::ErrorCode::NotFound);
        assert!(err.message.contains("job-1 is no longer kept"), "{err}");
        assert!(err.message.ends_with("its jobs are job-3"), "{err}");
        let err = again.get("job-9").err().unwrap();
        assert!(err.message.contains("has no job \"job-9\""), "{err}");
    }

    /// An id not in the form a supervisor gives is unknown, never "no longer kept", though
    /// its digits name a number this sandbox gave.
    #[test]
    fn a_malformed_id_is_unknown_not_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        for _ in 0..2 {
            let job = jobs.add(&spec("true"), false).unwrap();
            jobs.list_job(&job);
        }
        assert_eq!(jobs.get("job-1").unwrap().id(), "job-1");
        for id in ["job-01", "job-+1", "job-001", "job-1 "] {
            let err = jobs.get(id).err().unwrap();
            assert_eq!(err.code, crate::foundation::error::ErrorCode::NotFound);
            assert!(
                err.message
                    .starts_with(&format!("this sandbox has no job \"{id}\"")),
                "{id}: {err}"
            );
            assert!(err.message.ends_with("its jobs are job-1, job-2"), "{err}");
        }
    }

    fn exited(code: i32) -> Ended {
        Ended::Done(Box::new(ExecResult {
            exit_code: Some(code),
            signal: None,
            timed_out: false,
            duration_ms: 7,
            stdout: Some(String::new()),
            stderr: Some(String::new()),
            transcript: None,
            truncated: false,
            oom_killed: false,
            disk_error: None,
            network_refusals: Vec::new(),
            network_refusals_omitted: 0,
        }))
    }

    /// A restore hands the jobs on to the supervisor executed anew: one that had ended keeps
    /// its state and exit code, one the restore cut off is failed saying so, both with their
    /// output, read by their ids, counted in the bound and saved at the task's end; output
    /// of no job it knows is removed, and a new job's files never overwrite theirs.
    #[test]
    fn a_restore_hands_its_jobs_on_with_their_output() {
        let dir = tempfile::tempdir().unwrap();
        let jobs_dir = dir.path().join("jobs");
        let jobs = Jobs::new(jobs_dir.clone());
        let done = jobs.add(&spec("printf"), true).unwrap();
        jobs.list_job(&done);
        let binary: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        done.keep(OutputChannel::Stdout, &binary);
        done.keep(OutputChannel::Stderr, b"warning\n");
        let Ended::Done(mut result) = exited(3) else {
            unreachable!("exited() is a Done")
        };
        result.stdout = Some("head of the output".into());
        result.oom_killed = true;
        result.disk_error = Some("the sandbox's disk is full".into());
        result.network_refusals = vec![dynocap_netproxy::NetworkRefusal {
            host: "pypi.org".into(),
            port: 443,
            reason: "not on the allowlist".into(),
            count: 2,
            fix: None,
        }];
        done.set_ended(Ended::Done(result));
        let cut = jobs.add(&spec("sleep 300"), true).unwrap();
        jobs.list_job(&cut);
        cut.keep(OutputChannel::Stdout, b"started\n");
        // Within its call when the restore came: its call answered, nobody has its output.
        let in_call = jobs.add(&spec("yes"), false).unwrap();
        in_call.keep(OutputChannel::Stdout, &vec![b'y'; MEMORY_BOUND + 1]);
        assert!(jobs_dir.join("3.stdout").exists());
        let cut_off = jobs.running();
        assert_eq!(cut_off.len(), 1);
        jobs.hand_over(&cut_off, "ready");
        let total = jobs.total.load(Ordering::Relaxed) - (MEMORY_BOUND as u64 + 1);
        drop(jobs);

        assert_eq!(read_running(&jobs_dir).len(), 1);
        let again = Jobs::new(jobs_dir.clone());
        assert!(!jobs_dir.join(HANDED_OVER_FILE).exists(), "taken once");
        assert!(read_running(&jobs_dir).is_empty(), "none runs yet");
        assert!(!jobs_dir.join("3.stdout").exists(), "a stray is removed");
        assert_eq!(again.total.load(Ordering::Relaxed), total);
        let old = again.get("job-1").unwrap();
        assert!(!old.is_running());
        let report = old.page((0, 0), PAGE_MAX);
        assert_eq!(
            (report.state, report.exit_code, report.duration_ms),
            (JobState::Exited, Some(3), 7)
        );
        use base64::Engine as _;
        let decode = |text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap()
        };
        assert_eq!(decode(&report.stdout), binary);
        assert_eq!(decode(&report.stderr), b"warning\n");
        // What its Exec object said beyond the exit, without the output its files hold.
        let result = report
            .result
            .expect("an ended job's Exec object is handed on");
        assert!(result.oom_killed);
        assert_eq!(
            result.disk_error.as_deref(),
            Some("the sandbox's disk is full")
        );
        assert_eq!(result.network_refusals.len(), 1);
        assert_eq!(result.network_refusals[0].host, "pypi.org");
        assert_eq!((result.stdout, result.stderr), (None, None));
        let report = again.get("job-2").unwrap().report(Some((0, 0)));
        assert_eq!((report.state, report.exit_code), (JobState::Failed, None));
        assert!(
            report.result.is_none(),
            "cut off by the restore: no Exec object"
        );
        assert_eq!(report.stdout, "started\n");
        let error = report.error.unwrap().message;
        assert!(
            error.contains("restored to its checkpoint \"ready\""),
            "{error}"
        );
        assert_eq!(report.command, "sleep 300");
        // A new job goes on from the ids and files before.
        let new = again.add(&spec("echo new"), true).unwrap();
        again.list_job(&new);
        new.keep(OutputChannel::Stdout, b"new\n");
        assert_eq!(new.id(), "job-3");
        assert!(again.running().iter().all(|job| job.job == "job-3"));
        // The task's end saves them all, byte for byte.
        let results = dir.path().join("results");
        let logs = save_logs(&results, again.kept_output(&again.running()));
        let ids: Vec<&str> = logs.iter().map(|log| log.job.as_str()).collect();
        assert_eq!(ids, ["job-1", "job-2", "job-3"]);
        assert_eq!(std::fs::read(results.join("job-1.stdout")).unwrap(), binary);
        assert_eq!(
            std::fs::read(results.join("job-2.stdout")).unwrap(),
            b"started\n"
        );
        assert_eq!(
            std::fs::read(results.join("job-3.stdout")).unwrap(),
            b"new\n"
        );
        // A second restore hands them on again.
        again.hand_over(&again.running(), "later");
        drop(again);
        let third = Jobs::new(jobs_dir.clone());
        let report = third.get("job-1").unwrap().report(None);
        assert_eq!(
            (report.state, report.exit_code),
            (JobState::Exited, Some(3))
        );
        let report = third.get("job-3").unwrap().report(Some((0, 0)));
        assert_eq!(
            (report.state, report.stdout.as_str()),
            (JobState::Failed, "new\n")
        );
        // Handed-over jobs are forgotten as any ended one, their files with them.
        for _ in 0..MAX_KEPT_JOBS - 3 {
            let job = third.add(&spec("true"), true).unwrap();
            third.list_job(&job);
            job.set_ended(exited(0));
        }
        let job = third.add(&spec("true"), true).unwrap();
        third.list_job(&job);
        let err = third.get("job-1").err().unwrap();
        assert!(err.message.contains("job-1 is no longer kept"), "{err}");
        assert!(!jobs_dir.join("1.stdout").exists());
        assert!(third.get("job-2").is_ok());
    }

    /// The hand-over file is read as any file on the host: an entry that does not hold is
    /// not taken (and its output is removed), sizes are those of the files, and a file too
    /// large is not read.
    #[test]
    fn a_hand_over_is_read_defensively() {
        let dir = tempfile::tempdir().unwrap();
        let jobs_dir = dir.path().join("jobs");
        std::fs::create_dir_all(&jobs_dir).unwrap();
        std::fs::write(jobs_dir.join(NEXT_ID_FILE), "5\n").unwrap();
        let entry = |job: &str, seq: u64, kept: u64| {
            serde_json::json!({
                "job": job, "seq": seq, "command": "echo \u{1b}[2J", "startedAt":
                "2026-01-01T00:00:00Z", "durationMs": 1, "state": "running", "exitCode": null,
                "signal": null, "error": null, "kept": [kept, 0], "dropped": [0, 2],
                "maxOutputBytes": 0, "outputEncoding": "utf8"
            })
        };
        let entries = serde_json::json!([
            entry("job-1", 1, 100),
            entry("job-1", 2, 1),
            entry("job-2", 1, 1),
            entry("job-3", 0, 1),
            entry("job-5", 5, 1),
            entry("job-03", 6, 1),
            entry("../job-4", 7, 1),
            entry("job-4", 4, 2),
        ]);
        std::fs::write(
            jobs_dir.join(HANDED_OVER_FILE),
            serde_json::to_vec(&entries).unwrap(),
        )
        .unwrap();
        for seq in [1, 2, 4, 5, 6, 7] {
            std::fs::write(jobs_dir.join(format!("{seq}.stdout")), b"abcd").unwrap();
        }
        std::fs::write(jobs_dir.join("notes.txt"), b"not output").unwrap();
        let jobs = Jobs::new(jobs_dir.clone());
        let ids: Vec<String> = jobs.list().into_iter().map(|job| job.job).collect();
        assert_eq!(ids, ["job-1", "job-4"]);
        // Kept is what the file holds (4 of 100 bytes): the rest is counted as dropped.
        let report = jobs.get("job-1").unwrap().report(Some((0, 0)));
        assert_eq!(report.state, JobState::Failed);
        assert_eq!((report.stdout_offset, report.stdout_dropped), (4, 96));
        assert_eq!((report.stderr_offset, report.stderr_dropped), (0, 2));
        assert!(!report.command.contains('\u{1b}'), "{:?}", report.command);
        // maxOutputBytes 0 reads as 1: a head and a tail of it, not nothing.
        assert!(report.truncated);
        // A file longer than its record is cut to it.
        assert_eq!(std::fs::read(jobs_dir.join("4.stdout")).unwrap(), b"ab");
        assert_eq!(jobs.total.load(Ordering::Relaxed), 6);
        for seq in [2, 5, 6, 7] {
            assert!(!jobs_dir.join(format!("{seq}.stdout")).exists(), "{seq}");
        }
        assert!(jobs_dir.join("notes.txt").exists());
        // Too large a file is not read: nothing is taken, and the output goes.
        std::fs::write(
            jobs_dir.join(HANDED_OVER_FILE),
            vec![b' '; usize::try_from(HANDED_OVER_MAX).unwrap() + 1],
        )
        .unwrap();
        drop(jobs);
        let jobs = Jobs::new(jobs_dir.clone());
        assert!(jobs.list().is_empty());
        assert!(!jobs_dir.join("1.stdout").exists());
    }

    /// Background jobs have a bound of their own, which in-call execs never meet: a 17th
    /// background start is refused saying how to free one, an exec within its call is not;
    /// in-call execs have their own bound, and one that outlives its call is listed past the
    /// background bound, within the bound on all of them.
    #[test]
    fn background_jobs_never_refuse_an_exec_within_its_call() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        let background: Vec<_> = (0..MAX_RUNNING_JOBS)
            .map(|_| {
                let job = jobs.add(&spec("sleep 300"), true).unwrap();
                jobs.list_job(&job);
                job
            })
            .collect();
        let err = jobs.add(&spec("sleep 300"), true).err().unwrap();
        assert_eq!(err.code, crate::foundation::error::ErrorCode::Conflict);
        assert!(
            err.message.contains("dynocap_job with kill: true")
                && err.message.contains("dynocap job NAME JOB --kill")
                && err.message.contains("job-16"),
            "{err}"
        );
        let in_call: Vec<_> = (0..MAX_IN_CALL_JOBS)
            .map(|_| jobs.add(&spec("ls"), false).unwrap())
            .collect();
        let err = jobs.add(&spec("ls"), false).err().unwrap();
        assert!(err.message.contains("wait for one to answer"), "{err}");
        // One outlives its call: listed, the 17th, never killed nor its output dropped.
        in_call[0].keep(OutputChannel::Stdout, b"still going\n");
        jobs.list_job(&in_call[0]);
        assert_eq!(jobs.running().len(), MAX_RUNNING_JOBS + 1);
        assert_eq!(in_call[0].report(Some((0, 0))).stdout, "still going\n");
        // Its slot within calls is free, but all of them together are at their bound.
        let err = jobs.add(&spec("ls"), false).err().unwrap();
        assert!(err.message.contains("dynocap job NAME JOB --kill"), "{err}");
        background[0].set_ended(exited(0));
        let ls = jobs.add(&spec("ls"), false).unwrap();
        ls.set_ended(exited(0));
        jobs.release(&ls);
        // Still 16 listed ones running (the 17th in place of the one that ended).
        assert!(jobs.add(&spec("sleep 300"), true).is_err());
    }

    #[test]
    fn ids_name_this_sandboxs_jobs_only() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        let err = jobs.get("job-1").err().unwrap();
        assert_eq!(err.code, crate::foundation::error::ErrorCode::NotFound);
        let job = jobs.add(&spec("true"), false).unwrap();
        assert!(jobs.get("job-1").is_err(), "a job not listed has no id yet");
        jobs.list_job(&job);
        assert!(jobs.get("job-1").is_ok());
        let err = jobs.get("../job-1").err().unwrap();
        assert!(err.message.contains("its jobs are job-1"), "{err}");
    }

    #[test]
    fn the_list_carries_no_output_of_ended_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        let job = jobs.add(&spec("echo"), false).unwrap();
        job.keep(OutputChannel::Stdout, b"out\n");
        jobs.list_job(&job);
        let result = ExecResult {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            duration_ms: 1,
            stdout: Some("x".repeat(1024 * 1024)),
            stderr: Some(String::new()),
            transcript: None,
            truncated: false,
            oom_killed: false,
            disk_error: None,
            network_refusals: Vec::new(),
            network_refusals_omitted: 0,
        };
        job.set_ended(Ended::Done(Box::new(result)));
        let listed = jobs.list();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].state, listed[0].exit_code),
            (JobState::Exited, Some(0))
        );
        assert!(listed[0].result.is_none() && listed[0].stdout.is_empty());
        // Asked for itself, the ended job still has its Exec object and its output.
        let report = job.report(Some((0, 0)));
        assert!(report.result.is_some());
        assert_eq!(report.stdout, "out\n");
    }

    #[test]
    fn listings_read_the_running_jobs_from_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let jobs_dir = dir.path().join("jobs");
        assert!(read_running(&jobs_dir).is_empty());
        let jobs = Jobs::new(jobs_dir.clone());
        let first = jobs.add(&spec("sleep 100"), false).unwrap();
        let second = jobs.add(&spec("make -j2"), false).unwrap();
        // Running within their calls, they are no one's jobs yet.
        assert!(!jobs_dir.exists());
        jobs.list_job(&first);
        jobs.list_job(&second);
        let listed = read_running(&jobs_dir);
        let ids: Vec<(&str, &str)> = listed
            .iter()
            .map(|job| (job.job.as_str(), job.command.as_str()))
            .collect();
        assert_eq!(ids, [("job-1", "sleep 100"), ("job-2", "make -j2")]);
        assert!(listed[0].started_at.ends_with('Z'), "{listed:?}");
        first.set_ended(Ended::Failed(Error::internal("cut off")));
        let listed = read_running(&jobs_dir);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].job, "job-2");
        // A file that does not read lists nothing rather than failing the listing.
        std::fs::write(jobs_dir.join(RUNNING_FILE), b"{not json").unwrap();
        assert!(read_running(&jobs_dir).is_empty());
    }

    #[test]
    fn a_tasks_end_saves_each_jobs_whole_output_and_says_which_it_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        let ended = jobs.add(&spec("echo done"), false).unwrap();
        jobs.list_job(&ended);
        // Far more than a job report's 16-byte excerpt: the saved file has all of it.
        let whole = "line of output\n".repeat(1000);
        ended.keep(OutputChannel::Stdout, whole.as_bytes());
        let running = jobs.add(&spec("sleep 100"), false).unwrap();
        jobs.list_job(&running);
        // One that ended within its call is not the task's job: no log of it.
        let quick = jobs.add(&spec("true"), false).unwrap();
        quick.keep(OutputChannel::Stdout, b"quick\n");
        quick.set_ended(Ended::Failed(Error::internal("ended")));
        // Past the bound while only running jobs hold output: dropped, counted.
        jobs.total.store(JOB_OUTPUT_BOUND - 3, Ordering::Relaxed);
        running.keep(OutputChannel::Stderr, b"errors");
        ended.set_ended(Ended::Failed(Error::internal("ended")));
        let cut_off = jobs.running();
        assert_eq!(cut_off.len(), 1);
        assert_eq!(cut_off[0].job, "job-2");
        let results = dir.path().join("results").join("jobs");
        let logs = save_logs(&results, jobs.kept_output(&cut_off));
        assert_eq!(logs.len(), 2);
        assert!(!logs[0].cut_off && logs[1].cut_off, "{logs:?}");
        let saved = std::fs::read_to_string(results.join("job-1.stdout")).unwrap();
        assert_eq!(saved, whole);
        assert_eq!(logs[0].stdout_bytes, whole.len() as u64);
        assert_eq!(std::fs::read(results.join("job-2.stderr")).unwrap(), b"err");
        assert_eq!((logs[1].stderr_bytes, logs[1].stderr_dropped), (3, 3));
        assert_eq!(
            logs[1].stdout_path,
            results.join("job-2.stdout").display().to_string()
        );
        // A sandbox that ran no job saves nothing, not even the directory.
        let none = Jobs::new(dir.path().join("none"));
        assert!(save_logs(&dir.path().join("empty"), none.kept_output(&[])).is_empty());
        assert!(!dir.path().join("empty").exists());
    }

    #[test]
    fn a_job_within_its_call_stays_in_memory_until_it_outlives_it() {
        let dir = tempfile::tempdir().unwrap();
        let jobs_dir = dir.path().join("jobs");
        let jobs = Jobs::new(jobs_dir.clone());
        // Ended within its call: no file, no listing, forgotten once its call answered.
        let quick = jobs.add(&spec("echo quick"), false).unwrap();
        quick.keep(OutputChannel::Stdout, b"quick\n");
        assert_eq!(quick.report(Some((0, 0))).stdout, "quick\n");
        quick.set_ended(Ended::Failed(Error::internal("ended")));
        jobs.release(&quick);
        assert!(!jobs_dir.exists());
        assert!(jobs.list().is_empty());
        assert_eq!(jobs.total.load(Ordering::Relaxed), 0);
        // Outliving its call: what it held goes to its files, offsets unchanged, and it is
        // listed; releasing a listed job keeps it.
        let long = jobs.add(&spec("make"), false).unwrap();
        long.keep(OutputChannel::Stdout, b"building\n");
        long.keep(OutputChannel::Stderr, b"warning\n");
        jobs.list_job(&long);
        jobs.release(&long);
        assert_eq!(long.id(), "job-1");
        long.keep(OutputChannel::Stdout, b"linked\n");
        assert_eq!(read_running(&jobs_dir)[0].job, "job-1");
        let report = long.report(Some((9, 0)));
        assert_eq!(
            (report.stdout.as_str(), report.stdout_offset),
            ("linked\n", 16)
        );
        assert_eq!(report.stderr, "warning\n");
        let on_disk = |suffix: &str| std::fs::read(jobs_dir.join(format!("2.{suffix}"))).unwrap();
        assert_eq!(on_disk("stdout"), b"building\nlinked\n");
        assert_eq!(on_disk("stderr"), b"warning\n");
        // A command that prints more than memory holds within its call goes to files early,
        // still unlisted, and they go with it when it is released.
        let chatty = jobs.add(&spec("yes"), false).unwrap();
        let chunk = vec![b'y'; MEMORY_BOUND / 2 + 1];
        chatty.keep(OutputChannel::Stdout, &chunk);
        assert!(!jobs_dir.join("3.stdout").exists());
        chatty.keep(OutputChannel::Stdout, &chunk);
        assert_eq!(
            std::fs::metadata(jobs_dir.join("3.stdout")).unwrap().len(),
            2 * chunk.len() as u64
        );
        chatty.set_ended(Ended::Failed(Error::internal("ended")));
        jobs.release(&chatty);
        assert!(!jobs_dir.join("3.stdout").exists());
        assert_eq!(jobs.list().len(), 1);
    }

    /// A listed job that ended and printed `stdout` and `stderr`.
    fn ended_job(jobs: &Jobs, stdout: &[u8], stderr: &[u8]) -> Arc<Job> {
        let job = jobs.add(&spec("make"), true).unwrap();
        jobs.list_job(&job);
        job.keep(OutputChannel::Stdout, stdout);
        job.keep(OutputChannel::Stderr, stderr);
        job.set_ended(exited(2));
        job
    }

    /// At the bound, the oldest ended jobs' output makes room for a new job's, whole jobs,
    /// oldest first and no more than needed; they stay listed, their bytes counted as
    /// dropped, saying why. Running jobs never lose output to each other: with only them
    /// holding output, new bytes are dropped as before.
    #[test]
    fn ended_jobs_output_makes_room_for_newer_jobs_output() {
        let dir = tempfile::tempdir().unwrap();
        let jobs_dir = dir.path().join("jobs");
        let jobs = Jobs::new(jobs_dir.clone());
        let oldest = ended_job(&jobs, &[b'a'; 100], b"warnings\n");
        let older = ended_job(&jobs, &[b'b'; 50], b"");
        let running = jobs.add(&spec("sleep 300"), true).unwrap();
        jobs.list_job(&running);
        running.keep(OutputChannel::Stdout, &[b'r'; 20]);
        // As if other output filled the bound up to 30 bytes.
        jobs.total.store(JOB_OUTPUT_BOUND - 30, Ordering::Relaxed);
        let new = jobs.add(&spec("cargo build"), true).unwrap();
        jobs.list_job(&new);
        new.keep(OutputChannel::Stdout, &[b'n'; 100]);
        let report = new.report(None);
        assert_eq!((report.stdout_offset, report.stdout_dropped), (100, 0));
        // The oldest ended job's output made room, the next one's was not needed.
        let report = oldest.report(Some((0, 0)));
        assert!(report.output_evicted, "{report:?}");
        assert_eq!(
            (report.state, report.exit_code),
            (JobState::Exited, Some(2))
        );
        assert!(report.result.is_some());
        assert_eq!((report.stdout_offset, report.stdout_dropped), (0, 100));
        assert_eq!((report.stderr_offset, report.stderr_dropped), (0, 9));
        assert_eq!((report.stdout.as_str(), report.stderr.as_str()), ("", ""));
        assert!(!jobs_dir.join("1.stdout").exists() && !jobs_dir.join("1.stderr").exists());
        assert_eq!(jobs.get("job-1").unwrap().report(None).stdout_dropped, 100);
        let report = older.report(Some((0, 0)));
        assert!(!report.output_evicted);
        assert!(report.stdout.starts_with('b'), "{report:?}");
        assert_eq!(report.stdout_offset, 50);
        assert_eq!(
            jobs.total.load(Ordering::Relaxed),
            JOB_OUTPUT_BOUND - 30 - (100 + 9) + 100
        );
        // More than the ended jobs hold: the next one's output goes too, the running one's
        // stays, and what still does not fit is dropped.
        new.keep(OutputChannel::Stderr, &[b'e'; 200]);
        let report = new.report(None);
        assert_eq!((report.stderr_offset, report.stderr_dropped), (89, 111));
        assert!(older.report(None).output_evicted);
        running.keep(OutputChannel::Stdout, b"more");
        let report = running.report(Some((0, 0)));
        assert!(!report.output_evicted);
        assert_eq!((report.stdout_offset, report.stdout_dropped), (20, 4));
        assert_eq!(jobs.total.load(Ordering::Relaxed), JOB_OUTPUT_BOUND);
        // The list says so, and the task's end counts their bytes as dropped.
        let listed = jobs.list();
        let evicted: Vec<&str> = listed
            .iter()
            .filter(|job| job.output_evicted)
            .map(|job| job.job.as_str())
            .collect();
        assert_eq!(evicted, ["job-1", "job-2"]);
        let logs = save_logs(&dir.path().join("results"), jobs.kept_output(&[]));
        assert_eq!(
            (
                logs[0].stdout_bytes,
                logs[0].stdout_dropped,
                logs[0].stderr_dropped
            ),
            (0, 100, 9)
        );
        assert_eq!((logs[1].stdout_bytes, logs[1].stdout_dropped), (0, 50));
        assert!(std::fs::read(dir.path().join("results/job-1.stdout"))
            .unwrap()
            .is_empty());
        // A restore hands them on as they are.
        jobs.hand_over(&jobs.running(), "ready");
        drop((oldest, older, running, new, jobs));
        let again = Jobs::new(jobs_dir);
        let report = again.get("job-1").unwrap().report(None);
        assert!(report.output_evicted);
        assert_eq!(
            (report.state, report.stdout_dropped),
            (JobState::Exited, 100)
        );
        assert!(!again.get("job-4").unwrap().report(None).output_evicted);
    }

    /// Jobs that keep output past the bound while others start, are listed, read and saved
    /// do not deadlock: making room takes the list's lock, then ended jobs' streams', as
    /// every other path does.
    #[test]
    fn making_room_while_jobs_come_and_go_does_not_deadlock() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Arc::new(Jobs::new(dir.path().join("jobs")));
        jobs.total.store(JOB_OUTPUT_BOUND - 1000, Ordering::Relaxed);
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let jobs = jobs.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let job = ended_job(&jobs, &[b'x'; 700], b"");
                        job.report(Some((0, 0)));
                    }
                })
            })
            .collect();
        for _ in 0..200 {
            let job = jobs.add(&spec("true"), false).unwrap();
            job.keep(OutputChannel::Stdout, &[b'y'; 300]);
            let _ = save_logs(&dir.path().join("results"), jobs.kept_output(&[]));
            job.set_ended(exited(0));
            jobs.release(&job);
        }
        for writer in writers {
            writer.join().unwrap();
        }
        // Every job's output, kept or forgotten, is accounted for.
        let kept: u64 = jobs
            .list()
            .iter()
            .map(|job| job.stdout_offset + job.stderr_offset)
            .sum();
        assert_eq!(
            jobs.total.load(Ordering::Relaxed),
            JOB_OUTPUT_BOUND - 1000 + kept
        );
    }

    /// A supervisor killed outright leaves an index of its listed jobs, by which the recovery
    /// saves each one's output under its id: those it had not seen end are cut off, an
    /// evicted one's bytes are counted as dropped, a forgotten or unlisted one is not there.
    #[test]
    fn a_recovery_saves_the_killed_supervisors_jobs_output() {
        let dir = tempfile::tempdir().unwrap();
        let jobs_dir = dir.path().join("jobs");
        let jobs = Jobs::new(jobs_dir.clone());
        // Past the bound before any job ended (so nothing made room): dropped, counted.
        let late = jobs.add(&spec("yes"), false).unwrap();
        jobs.total.store(JOB_OUTPUT_BOUND - 2, Ordering::Relaxed);
        late.keep(OutputChannel::Stderr, b"abcd");
        jobs.total.store(2, Ordering::Relaxed);
        let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
        let ended = ended_job(&jobs, &binary, b"warning\n");
        let running = jobs.add(&spec("make -j2"), true).unwrap();
        jobs.list_job(&running);
        running.keep(OutputChannel::Stdout, b"building\n");
        let evicted = ended_job(&jobs, b"old output", b"");
        evicted.evict();
        jobs.list_job(&late);
        let in_call = jobs.add(&spec("ls"), false).unwrap();
        in_call.keep(OutputChannel::Stdout, b"not a job\n");
        // As a SIGKILL leaves them: nothing handed over, nothing released.
        let (recovered, cut_off) = Jobs::recovered(jobs_dir.clone());
        let ids: Vec<&str> = cut_off.iter().map(|job| job.job.as_str()).collect();
        assert_eq!(ids, ["job-2", "job-4"]);
        assert_eq!(cut_off[0].command, "make -j2");
        let results = dir.path().join("results");
        let logs = save_logs(&results, recovered.kept_output(&cut_off));
        let ids: Vec<&str> = logs.iter().map(|log| log.job.as_str()).collect();
        assert_eq!(ids, ["job-1", "job-2", "job-3", "job-4"]);
        assert_eq!(std::fs::read(results.join("job-1.stdout")).unwrap(), binary);
        assert_eq!(
            std::fs::read(results.join("job-1.stderr")).unwrap(),
            b"warning\n"
        );
        assert!(!logs[0].cut_off && logs[1].cut_off);
        assert_eq!(
            std::fs::read(results.join("job-2.stdout")).unwrap(),
            b"building\n"
        );
        assert_eq!((logs[2].stdout_bytes, logs[2].stdout_dropped), (0, 10));
        assert_eq!((logs[3].stderr_bytes, logs[3].stderr_dropped), (2, 2));
        // Nothing in the jobs directory was changed.
        assert!(jobs_dir.join(INDEX_FILE).exists());
        // A job forgotten past the 64 kept leaves the index with its output.
        for _ in 0..MAX_KEPT_JOBS {
            let job = jobs.add(&spec("true"), true).unwrap();
            jobs.list_job(&job);
            job.set_ended(exited(0));
        }
        let (recovered, _) = Jobs::recovered(jobs_dir.clone());
        assert!(recovered.get("job-1").is_err());
        assert_eq!(recovered.list().len(), jobs.list().len());
        // A new supervisor (a start, never a recovery's) has an index of its own.
        drop((ended, running, late, evicted, in_call, jobs));
        let _new = Jobs::new(jobs_dir.clone());
        assert!(!jobs_dir.join(INDEX_FILE).exists());
    }

    /// The index is read as any file on the host: entries that do not hold are left out.
    #[test]
    fn a_jobs_index_is_read_defensively() {
        let dir = tempfile::tempdir().unwrap();
        let jobs_dir = dir.path().join("jobs");
        std::fs::create_dir_all(&jobs_dir).unwrap();
        let entry = |job: &str, seq: u64| {
            serde_json::json!({
                "job": job, "seq": seq, "command": "echo \u{1b}[2J",
                "startedAt": "2026-01-01T00:00:00Z", "ended": true, "dropped": [0, 0]
            })
        };
        let entries = serde_json::json!([
            entry("job-1", 1),
            entry("job-1", 2),
            entry("job-2", 1),
            entry("job-3", 0),
            entry("job-03", 3),
            entry("../job-4", 4),
            entry("job-5", 5),
        ]);
        std::fs::write(
            jobs_dir.join(INDEX_FILE),
            serde_json::to_vec(&entries).unwrap(),
        )
        .unwrap();
        std::fs::write(jobs_dir.join("5.stdout"), b"five\n").unwrap();
        // A link is no output file: not followed.
        std::os::unix::fs::symlink("/etc/hostname", jobs_dir.join("1.stdout")).unwrap();
        let (recovered, cut_off) = Jobs::recovered(jobs_dir.clone());
        assert!(cut_off.is_empty());
        let kept = recovered.kept_output(&[]);
        let ids: Vec<&str> = kept.iter().map(|job| job.job.as_str()).collect();
        assert_eq!(ids, ["job-1", "job-5"]);
        assert!(!kept[0].command.contains('\u{1b}'));
        let logs = save_logs(&dir.path().join("results"), kept);
        assert_eq!((logs[0].stdout_bytes, logs[1].stdout_bytes), (0, 5));
        std::fs::write(jobs_dir.join(INDEX_FILE), b"{not json").unwrap();
        assert!(Jobs::recovered(jobs_dir.clone()).1.is_empty());
        assert!(Jobs::recovered(jobs_dir).0.list().is_empty());
    }

    /// A job that failed ran as long as it ran: its duration does not grow with each report.
    #[test]
    fn an_ended_jobs_duration_is_fixed_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        let job = jobs.add(&spec("sleep 300"), true).unwrap();
        jobs.list_job(&job);
        std::thread::sleep(Duration::from_millis(20));
        job.set_ended(Ended::Failed(Error::internal("the sandbox ended")));
        let first = job.report(None);
        assert_eq!(first.state, JobState::Failed);
        assert!(first.duration_ms >= 20, "{first:?}");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(job.report(None).duration_ms, first.duration_ms);
        assert_eq!(jobs.list()[0].duration_ms, first.duration_ms);
    }

    #[test]
    fn output_past_the_sandboxs_bound_is_counted_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(dir.path().join("jobs"));
        let job = jobs.add(&spec("true"), false).unwrap();
        jobs.total.store(JOB_OUTPUT_BOUND - 4, Ordering::Relaxed);
        job.keep(OutputChannel::Stderr, b"12345678");
        let report = job.report(None);
        assert_eq!((report.stderr_offset, report.stderr_dropped), (4, 4));
        job.keep(OutputChannel::Stdout, b"more");
        let report = job.report(None);
        assert_eq!((report.stdout_offset, report.stdout_dropped), (0, 4));
    }
}
