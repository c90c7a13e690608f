//! A control connection's file operation ([`crate::supervisor::files`]): served against the
//! guest, its work on a task's disk as an exec's is, and logged as execs are (a task's
//! `exec.jsonl`, the supervisor's log).

use dynocap_proto::files::{FileOp, FileRequest, FileResult};

use crate::foundation::error::{Error, Result};
use crate::model::sandbox_info::rfc3339;
use crate::supervisor::control::ControlReply;
use crate::supervisor::files;

use super::disk::*;
use super::state::*;

/// Serves one file operation.
pub(super) async fn serve_file(request: FileRequest, shared: &Shared) -> ControlReply {
    let started_at = chrono::Utc::now();
    let op = request.op.clone();
    tracing::debug!(target: LOG_TARGET, "file {}: {:?} in {}", op.name(), op, request.cwd);
    let conn = &shared.conn;
    let mut result = conn
        .while_responsive(files::run(conn, request))
        .await
        .and_then(|r| r);
    // What a write or an edit changed is on a task's disk when it returns, as after an exec.
    if let (Some(_), Ok(_), FileOp::Write { .. } | FileOp::Edit { .. } | FileOp::Put { .. }) =
        (&shared.task, &result, &op)
    {
        let synced = sync_layer(shared.layer_sync.clone(), conn).await;
        if let Some(failure) = check_disk(shared, synced).await {
            result = Err(Error::internal(disk_failure_note(&failure)));
        }
    }
    let result = match (result, shared.ending.get()) {
        (Err(_), Some(ending)) => Err(Error::conflict(ending.clone())),
        (result, _) => result,
    };
    match &result {
        Ok(_) => tracing::debug!(target: LOG_TARGET, "file {} done", op.name()),
        Err(err) => tracing::debug!(target: LOG_TARGET, "file {} failed: {err}", op.name()),
    }
    if let Some(task) = &shared.task {
        log_file(task, &op, started_at, &result);
    }
    ControlReply::from_result(result, ControlReply::File)
}

/// Appends one line to a task's `exec.jsonl`: what was touched and how, never the content.
fn log_file(
    task: &TaskContext,
    op: &FileOp,
    started_at: chrono::DateTime<chrono::Utc>,
    result: &Result<FileResult>,
) {
    let mut entry = serde_json::json!({
        "startedAt": rfc3339(started_at),
        "file": op.name(),
        "path": op.path(),
    });
    let outcome = match result {
        Ok(FileResult::Read {
            path,
            data,
            offset,
            total_size,
        }) => serde_json::json!({
            "resolved": path, "offset": offset, "bytes": data.len(), "totalSize": total_size,
        }),
        Ok(FileResult::Written {
            path,
            bytes,
            created,
            mode,
        }) => serde_json::json!({
            "resolved": path, "bytes": bytes, "created": created, "mode": format!("{mode:o}"),
        }),
        Ok(FileResult::Edited {
            path,
            replacements,
            size,
        }) => serde_json::json!({
            "resolved": path, "replacements": replacements, "size": size,
        }),
        Ok(FileResult::Listed {
            path,
            entries,
            left_off,
        }) => serde_json::json!({
            "resolved": path, "entries": entries.len(), "leftOff": left_off,
        }),
        Err(err) => serde_json::json!({ "error": err.to_string() }),
    };
    if let (Some(entry), serde_json::Value::Object(outcome)) = (entry.as_object_mut(), outcome) {
        entry.extend(outcome);
    }
    task.log_line(&entry);
}
