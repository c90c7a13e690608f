//! File operations in a live sandbox or task, as its sandbox user: what the MCP file tools
//! call. A relative path is taken from the workspace of a task, from `/` in a raw sandbox
//! (where commands start by default).

pub use dynocap_proto::files::{
    FileEntry, FileOp, FileRequest, FileResult, PutItem, MAX_LIST_DEPTH, MAX_LIST_ENTRIES,
    MAX_READ, MAX_WRITE,
};

use crate::facade::sandboxes::{find, unexpected, Engine};
use crate::foundation::error::Result;
use crate::store::catalog::Kind;
use crate::supervisor::control::{ControlReply, ControlRequest};

/// Where a task's relative paths start.
pub const TASK_CWD: &str = "/workspace";
/// Where a raw sandbox's relative paths start.
pub const RAW_CWD: &str = "/";

impl Engine {
    /// Performs `op` in the sandbox or task `name`, as its sandbox user.
    pub async fn file(&self, name: &str, op: FileOp) -> Result<FileResult> {
        let kind = find(&*self.catalog()?, name)?.kind;
        let record = self.live_record(name, kind)?;
        let cwd = match kind {
            Kind::Task => TASK_CWD,
            Kind::Raw => RAW_CWD,
        };
        let request = ControlRequest::File {
            request: FileRequest {
                cwd: cwd.to_owned(),
                op,
            },
        };
        match self.call(&record, &request).await? {
            ControlReply::File(result) => Ok(result),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }
}
