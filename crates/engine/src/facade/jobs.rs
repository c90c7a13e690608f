//! The client API for jobs ([`crate::supervisor::jobs`]): an exec that becomes a job when its
//! caller stops waiting, and the requests that follow, list and kill a sandbox's jobs. Raw
//! sandboxes and tasks alike; a job is reached only through its own sandbox's supervisor.

use std::time::Duration;

use crate::facade::sandboxes::{find, unexpected, Engine, Interim};
use crate::foundation::error::{Error, Result};
use crate::foundation::terms::Piece;
use crate::model::sandbox_info::RunningJob;
use crate::model::spec::ExecSpec;
use crate::model::task_spec::Progress;
use crate::store::catalog::{Kind, Record, State};
use crate::supervisor::control::{ControlReply, ControlRequest};
use crate::supervisor::jobs::{read_running, JobQuery, JobReport, JOBS_DIR};

impl Engine {
    /// Runs a command in a live sandbox of the given kind as a job: answers once it ended or
    /// `wait` passed (zero: at once, a background start), reporting progress meanwhile. The
    /// command goes on past the answer, until its own timeout, a kill or the sandbox's end.
    pub async fn exec_job(
        &self,
        kind: Kind,
        name: &str,
        spec: &ExecSpec,
        wait: Duration,
        progress: Option<&(dyn Fn(Progress) + Send + Sync)>,
    ) -> Result<JobReport> {
        let record = self.live_record(name, kind)?;
        let spec = ExecSpec {
            report_progress: progress.is_some(),
            stream_output: false,
            ..spec.clone()
        };
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let interim = Interim {
            progress,
            output: None,
        };
        job_reply(
            self.call_with(
                &record,
                &ControlRequest::StartJob { spec, wait_ms },
                interim,
            )
            .await?,
        )
    }

    /// A job of the live sandbox or task `name`: its state and output since the offsets.
    pub async fn job(&self, name: &str, query: &JobQuery) -> Result<JobReport> {
        let record = self
            .live_any(name)
            .map_err(|err| self.saved_job_output(name, &query.job, err))?;
        job_reply(
            self.call(&record, &ControlRequest::Job(query.clone()))
                .await?,
        )
    }

    /// The jobs of the live sandbox or task `name`, without output, oldest first.
    pub async fn jobs(&self, name: &str) -> Result<Vec<JobReport>> {
        let record = self.live_any(name)?;
        match self.call(&record, &ControlRequest::Jobs).await? {
            ControlReply::Jobs(list) => Ok(list),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }

    /// The running jobs of a sandbox or task that listings show: read from the file its
    /// supervisor keeps ([`crate::supervisor::jobs::RUNNING_FILE`], which says why), and
    /// only while the catalog says it runs.
    pub(crate) fn running_jobs(&self, record: &Record) -> Vec<RunningJob> {
        if record.state != State::Running {
            return Vec::new();
        }
        read_running(&self.home().sandbox_dir(&record.id).join(JOBS_DIR))
    }

    /// `err` (the task no longer runs) with where the task's end saved job `job`'s whole
    /// output, when it did: the job cannot be asked any more, but its output is there.
    fn saved_job_output(&self, name: &str, job: &str, mut err: Error) -> Error {
        // A job id is `job-N`, made by a supervisor; anything else is never part of a path.
        let well_formed = job
            .strip_prefix("job-")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        let record = self.catalog().ok().and_then(|c| find(&c, name).ok());
        let Some(record) = record.filter(|r| well_formed && r.kind == Kind::Task) else {
            return err;
        };
        let saved = self.home().results_dir(&record.id).join(JOBS_DIR);
        let stdout = saved.join(format!("{job}.stdout"));
        if !stdout.is_file() {
            return err;
        }
        let note = format!(
            "; {job}'s whole output, as the task's end left it, is saved in {} and {job}.stderr \
             beside it",
            stdout.display()
        );
        err.message.push_str(&note);
        if let Some(words) = err.words.as_mut() {
            words.push(Piece::Text(note));
        }
        err
    }

    fn live_any(&self, name: &str) -> Result<Record> {
        let kind = find(&*self.catalog()?, name)?.kind;
        self.live_record(name, kind)
    }
}

fn job_reply(reply: ControlReply) -> Result<JobReport> {
    match reply {
        ControlReply::Job(report) => Ok(*report),
        ControlReply::Error(err) => Err(err),
        other => Err(unexpected(&other)),
    }
}
