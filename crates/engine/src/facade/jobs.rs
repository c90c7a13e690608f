//! The client API for jobs ([`crate::supervisor::jobs`]): an exec that becomes a job when its
//! caller stops waiting, and the requests that follow, list and kill a sandbox's jobs. Raw
//! sandboxes and tasks alike; a job is reached only through its own sandbox's supervisor.

use std::time::Duration;

use crate::facade::sandboxes::{find, unexpected, Engine, Interim};
use crate::foundation::error::Result;
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
        let record = self.live_any(name)?;
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
