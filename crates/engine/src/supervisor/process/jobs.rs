//! Job requests on a control connection: a job started on a connection of the supervisor's
//! own (served as any client's is, so a job is logged, annotated and cut off as an exec is),
//! listed once it outlives its call, waited on, queried and killed
//! ([`crate::supervisor::jobs`]).

use std::time::Duration;

use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::foundation::error::Error;
use crate::model::spec::ExecSpec;
use crate::supervisor::control::ControlReply;
use crate::supervisor::jobs::{JobQuery, JOB_WAIT_MAX_SECONDS};

use super::state::*;

/// Starts `spec` as a job and answers once it ended or `wait_ms` passed. A client that goes
/// away before that cancelled its call: the job is killed, as an exec's command is.
pub(super) async fn start_job(
    spec: ExecSpec,
    wait_ms: u64,
    shared: &Shared,
    main_loop: &MainLoop,
    reader: &mut BufReader<OwnedReadHalf>,
    write: &mut OwnedWriteHalf,
) -> ControlReply {
    if let Some(ending) = shared.ending.get() {
        return ControlReply::Error(Error::conflict(ending.clone()));
    }
    let spec = match shared.with_image_config(spec) {
        Ok(spec) => spec,
        Err(err) => return ControlReply::Error(err),
    };
    let (ours, theirs) = match UnixStream::pair() {
        Ok(pair) => pair,
        Err(err) => {
            return ControlReply::Error(Error::internal(format!(
                "cannot open a connection for a job: {err}"
            )))
        }
    };
    let job = match shared.jobs.add(&spec, wait_ms == 0) {
        Ok(job) => job,
        Err(err) => return ControlReply::Error(err),
    };
    if main_loop.connect.send(theirs).await.is_err() {
        shared.jobs.release(&job);
        return ControlReply::Error(Error::conflict("the sandbox is ending"));
    }
    if wait_ms == 0 {
        shared.jobs.list_job(&job);
    }
    let report_progress = spec.report_progress;
    tokio::spawn(job.clone().drive(ours, spec));
    let client_gone = async {
        let mut byte = [0u8; 1];
        let _ = reader.read(&mut byte).await;
    };
    tokio::select! {
        _ = job.wait(wait(wait_ms), report_progress.then_some(write)) => {}
        () = client_gone, if wait_ms > 0 => {
            job.kill();
            job.wait(Duration::from_secs(30), None).await;
        }
    }
    // Still running, it outlived its call: a job from now on. Ended, its Exec object is the
    // answer and nothing else keeps it.
    if job.is_running() {
        shared.jobs.list_job(&job);
    }
    let report = job.report(Some((0, 0)));
    shared.jobs.release(&job);
    ControlReply::Job(Box::new(report))
}

/// A job's state and output since the query's offsets, after a kill or a wait if asked.
pub(super) async fn query_job(query: JobQuery, shared: &Shared) -> ControlReply {
    let job = match shared.jobs.get(&query.job) {
        Ok(job) => job,
        Err(err) => return ControlReply::Error(err),
    };
    if query.kill && job.is_running() {
        job.kill();
        // The kill grace, then the agent's answer.
        job.wait(Duration::from_secs(30), None).await;
    } else if query.wait_ms > 0 {
        job.wait(wait(query.wait_ms), None).await;
    }
    let offsets = (query.stdout_offset, query.stderr_offset);
    ControlReply::Job(Box::new(match query.page_bytes {
        0 => job.report(Some(offsets)),
        max => job.page(offsets, max),
    }))
}

fn wait(ms: u64) -> Duration {
    Duration::from_millis(ms).min(Duration::from_secs(JOB_WAIT_MAX_SECONDS))
}
