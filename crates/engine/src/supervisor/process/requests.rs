//! One control connection: the request read, served against the guest, answered.

use tokio::io::BufReader;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::backend::LayerSync;
use crate::foundation::error::Error;
use crate::model::task_spec::Progress;
use crate::supervisor::control::{
    read_message, write_message, ControlReply, ControlRequest, OutputChannel, OutputChunk,
};
use crate::supervisor::exec;

use super::disk::*;
use super::failure::*;
use super::network::*;
use super::state::*;

/// Serves one control connection.
/// Sends what DynoCap says about a command to a client that prints the output stream (not the
/// result's stderr), as stderr.
async fn stream_note<W: tokio::io::AsyncWrite + Unpin>(write: &mut W, note: &str) {
    let chunk = OutputChunk {
        channel: OutputChannel::Stderr,
        data: note.as_bytes().to_vec(),
    };
    let _ = write_message(write, &ControlReply::Output(chunk)).await;
}

/// Adds `note` to the end of a command's stderr and transcript.
fn append_note(done: &mut exec::ExecResult, note: &str) {
    for text in [&mut done.stderr, &mut done.transcript]
        .into_iter()
        .flatten()
    {
        text.push_str(note);
    }
}

pub(super) async fn handle_client(stream: UnixStream, shared: &Shared, main_loop: &MainLoop) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let request = match read_message::<ControlRequest, _>(&mut reader).await {
        Ok(Some(request)) => request,
        Ok(None) => return,
        Err(err) => {
            let _ = write_message(&mut write, &ControlReply::Error(err)).await;
            return;
        }
    };
    crate::host::activity::note(&shared.home);
    let conn = &shared.conn;
    let task = shared.task.as_ref();
    let reply = match request {
        ControlRequest::Ping => {
            ControlReply::from_result(conn.ping().await, |()| ControlReply::Pong)
        }
        ControlRequest::Exec { spec } => 'exec: {
            let _serving = ServingExec::begin(&shared.execs);
            let spec = match shared.with_image_config(spec) {
                Ok(spec) => spec,
                Err(err) => break 'exec ControlReply::Error(err),
            };
            // The client closing its end (or sending anything more) cancels the command.
            let client_gone = async {
                let mut byte = [0u8; 1];
                let _ = tokio::io::AsyncReadExt::read(&mut reader, &mut byte).await;
            };
            let started_at = chrono::Utc::now();
            tracing::debug!(target: LOG_TARGET,
                "exec: {} bytes of command in {}, timeout {}s",
                spec.command.len(),
                spec.cwd,
                spec.timeout_seconds
            );
            let kills_before = shared.oom.kills(conn).await;
            // Progress lines and streamed output go out on this connection while the command
            // runs. Output waits for the client (bounded queue); progress is a few small lines.
            let (progress_tx, mut progress_rx) = mpsc::unbounded_channel::<Progress>();
            let report: &(dyn Fn(Progress) + Send + Sync) = &move |p: Progress| {
                let _ = progress_tx.send(p);
            };
            let (output_tx, mut output_rx) = mpsc::channel::<OutputChunk>(STREAM_QUEUE_CHUNKS);
            // Open before the command starts, closed once it has ended: the proxy records a
            // refusal before its client hears of it, so what ended the command is in here.
            let refusals = shared.egress.as_ref().map(|egress| egress.refusal_window());
            let run = exec::run(
                conn,
                &spec,
                client_gone,
                spec.report_progress.then_some(report),
                (spec.stream_output && !spec.terminal).then_some(&output_tx),
            );
            tokio::pin!(run);
            let result = loop {
                tokio::select! {
                    result = &mut run => break result,
                    Some(p) = progress_rx.recv() => {
                        let _ = write_message(&mut write, &ControlReply::Progress(p)).await;
                    }
                    Some(chunk) = output_rx.recv() => {
                        let _ = write_message(&mut write, &ControlReply::Output(chunk)).await;
                    }
                }
            };
            // Output queued before the end goes out before the final reply.
            while let Ok(chunk) = output_rx.try_recv() {
                let _ = write_message(&mut write, &ControlReply::Output(chunk)).await;
            }
            let refused = refusals.map(dynocap_netproxy::RefusalWindow::close);
            let result = match result {
                Ok(done) => {
                    let done = shared.oom.annotate(conn, done, kills_before).await;
                    Ok(match refused {
                        Some(list) => done.with_refusals(list),
                        None => done,
                    })
                }
                Err(err) => Err(err),
            };
            let result = match (result, shared.network_lost.get()) {
                (Ok(done), Some(lost)) => {
                    if spec.stream_output {
                        stream_note(&mut write, &network_note(lost)).await;
                    }
                    Ok(with_network_note(done, lost))
                }
                (result, _) => result,
            };
            if spec.stream_output && result.as_ref().is_ok_and(|done| done.oom_killed) {
                // A streaming client prints the stream, not the result's stderr: tell it there.
                stream_note(&mut write, &shared.oom.note()).await;
            }
            // A task's work is on the host's disk when the command returns; a raw sandbox's
            // files do not outlive the machine, but its failed disk is still the command's
            // error (a jail's is read on the host, a VM's asked of its kernel).
            // A guest going away (its sandbox ending, a restore stopping it, its agent gone)
            // is not asked: the request would fail, and its failure would read as the disk's.
            let guest_gone = shared.ending.get().is_some() || conn.is_closed();
            let synced = match (task, &shared.layer_sync) {
                (_, LayerSync::GuestKernel) if guest_gone => Ok(()),
                (Some(_), how) => sync_layer(how.clone(), &shared.conn).await,
                (None, LayerSync::GuestKernel) => guest_disk_health(&shared.conn).await,
                (None, LayerSync::HostMount(_)) => Ok(()),
            };
            let result = match (result, check_disk(shared, synced).await) {
                (Ok(mut done), Some(failure)) => {
                    let note = disk_failure_note(&failure);
                    if spec.stream_output {
                        stream_note(&mut write, &note).await;
                    }
                    append_note(&mut done, &note);
                    done.disk_error = Some(failure);
                    Ok(done)
                }
                (result, _) => result,
            };
            // A full package cache is told beside the command's output, where the package
            // manager's own error says only "No space left on device".
            let result = match (result, cache_full(shared).await) {
                (Ok(mut done), Some(full)) => {
                    let note = format!("\ndynocap: {full}.\n");
                    if spec.stream_output {
                        stream_note(&mut write, &note).await;
                    }
                    append_note(&mut done, &note);
                    Ok(done)
                }
                (result, _) => result,
            };
            // A command cut off by the sandbox's end is told why, not that the agent is gone.
            let result = match (result, shared.ending.get()) {
                (Err(_), Some(ending)) => Err(Error::conflict(ending.clone())),
                (result, _) => result,
            };
            match &result {
                Ok(done) => tracing::debug!(target: LOG_TARGET,
                    "exec ended in {}ms: exit code {:?}, signal {:?}, timed out {}",
                    done.duration_ms,
                    done.exit_code,
                    done.signal,
                    done.timed_out
                ),
                Err(err) => tracing::debug!(target: LOG_TARGET, "exec failed: {err}"),
            }
            if let Some(task) = task {
                task.log_exec(&spec, started_at, &result);
            }
            ControlReply::from_result(result, ControlReply::Exec)
        }
        ControlRequest::Diff => match task {
            Some(task) => {
                let diff = conn.while_responsive(task.diff(conn)).await.and_then(|r| r);
                let diff = match diff {
                    // On a failed disk the failure is the answer, and what to do about it.
                    Err(err) => Err(match check_disk(shared, Ok(())).await {
                        Some(failure) => ProcessFailure::DiffOnFailedDisk {
                            failure,
                            taking: err,
                        }
                        .into(),
                        None => err,
                    }),
                    ok => ok,
                };
                ControlReply::from_result(diff, ControlReply::Diff)
            }
            None => {
                ControlReply::Error(Error::conflict("diff is for tasks; this is a raw sandbox"))
            }
        },
        ControlRequest::Checkpoint { .. }
        | ControlRequest::Checkpoints
        | ControlRequest::DeleteCheckpoint { .. }
        | ControlRequest::Restore { .. }
        | ControlRequest::SeedFork { .. }
            if task.is_none() =>
        {
            ControlReply::Error(Error::conflict(
                "checkpoints, restores and forks are for tasks; this is a raw sandbox",
            ))
        }
        ControlRequest::Checkpoint { label } => super::checkpoints::create(shared, label).await,
        ControlRequest::Checkpoints => super::checkpoints::list(shared).await,
        ControlRequest::DeleteCheckpoint { label } => {
            super::checkpoints::delete(shared, label).await
        }
        ControlRequest::SeedFork {
            fork_id,
            checkpoint,
        } => super::checkpoints::seed_fork(shared, fork_id, checkpoint).await,
        ControlRequest::SeedLiveFork { fork_id } => {
            super::live_fork::seed(shared, main_loop, fork_id).await
        }
        ControlRequest::Restore { label } => {
            match super::checkpoints::check_restore(shared, &label) {
                Ok(()) => {
                    // The main loop replies once the guest is stopped and the disk restored.
                    let _ = main_loop
                        .end
                        .send((EndRequest::Restore(label), write))
                        .await;
                    return;
                }
                Err(err) => ControlReply::Error(err),
            }
        }
        ControlRequest::Finish { .. } if task.is_none() => ControlReply::Error(Error::conflict(
            "finish is for tasks; destroy a raw sandbox instead",
        )),
        ControlRequest::Destroy | ControlRequest::Finish { .. } => {
            let kind = if let ControlRequest::Finish { include_generated } = request {
                if include_generated {
                    // Asked by any finish call: the save that follows is shared.
                    if let Some(task) = task {
                        task.include_generated
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                EndRequest::Finish
            } else {
                EndRequest::Destroy
            };
            // The main loop replies once teardown is complete.
            let _ = main_loop.end.send((kind, write)).await;
            return;
        }
        ControlRequest::StartJob { spec, wait_ms } => {
            super::jobs::start_job(spec, wait_ms, shared, main_loop, &mut reader, &mut write).await
        }
        ControlRequest::Job(query) => super::jobs::query_job(query, shared).await,
        ControlRequest::Jobs => ControlReply::Jobs(shared.jobs.list()),
        ControlRequest::Forward(request) => {
            ControlReply::from_result(shared.forwards.add(&request).await, ControlReply::Forward)
        }
        ControlRequest::Unforward { guest_port } => ControlReply::from_result(
            shared.forwards.remove(guest_port).await,
            ControlReply::Forward,
        ),
        ControlRequest::Forwards => ControlReply::Forwards(shared.forwards.list().await),
        ControlRequest::File { request } => super::files::serve_file(request, shared).await,
        ControlRequest::Claim(claim) => {
            let _ = main_loop.claim.send((claim, write)).await;
            return;
        }
    };
    let _ = write_message(&mut write, &reply).await;
}
