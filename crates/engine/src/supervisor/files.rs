//! File operations in the guest ([`dynocap_proto::files`]): the request to the agent, which
//! performs it as the sandbox user, and the host's check of the answer, which is guest data:
//! sizes, counts and paths are held to the protocol's bounds before anything else sees them.

use dynocap_proto::files::{
    FileOp, FileRequest, FileResult, PutItem, MAX_LIST_ENTRIES, MAX_PATH, MAX_READ, MAX_WRITE,
};
use dynocap_proto::{from_payload, FrameKind, Request, Response};

use crate::foundation::error::{Error, Result};
use crate::supervisor::agent_conn::{agent_error_message, agent_gone, AgentConn};

/// Longest name or symlink target of a listed entry that is passed on.
const MAX_ENTRY_TEXT: usize = MAX_PATH;

/// Asks the agent for `request` and checks its answer. A refusal by the guest (no such file,
/// permission denied, an ambiguous edit) is the caller's `invalid_argument`, with the guest's
/// words made safe to show.
pub async fn run(conn: &AgentConn, request: FileRequest) -> Result<FileResult> {
    check_request(&request)?;
    let op = request.op.clone();
    let mut stream = conn.open(&Request::File(request)).await?;
    let result = loop {
        let Some(frame) = stream.next().await else {
            return Err(agent_gone());
        };
        match frame.kind {
            FrameKind::Done => {
                break match from_payload::<Response>("file result", &frame.payload) {
                    Ok(Response::File(result)) => result,
                    Ok(other) => {
                        return Err(Error::internal(format!(
                            "the guest agent answered a file {} with {other:?}",
                            op.name()
                        )))
                    }
                    Err(err) => {
                        return Err(Error::internal(format!(
                            "the guest agent's answer to a file {} is malformed: {err}",
                            op.name()
                        )))
                    }
                };
            }
            FrameKind::Error => {
                return Err(Error::invalid(agent_error_message(&frame.payload)));
            }
            _ => {}
        }
    };
    check_result(&op, result)
}

fn check_request(request: &FileRequest) -> Result<()> {
    let path = request.op.path();
    if path.is_empty() || path.len() > MAX_PATH || path.contains('\0') {
        return Err(Error::invalid(format!(
            "path must be 1 to {MAX_PATH} bytes without NUL"
        )));
    }
    match &request.op {
        FileOp::Write { content, .. } if content.len() > MAX_WRITE => Err(Error::invalid(
            format!("a write carries at most {MAX_WRITE} bytes; write a larger file in pieces (or copy it in with dynocap cp)"),
        )),
        FileOp::Put { rel, item, .. } => {
            let plain = |part: &str| !part.is_empty() && part != "." && part != "..";
            if rel.len() > MAX_PATH || rel.contains('\0') || !rel.split('/').all(plain) {
                return Err(Error::invalid(format!(
                    "{rel:?} is not a relative path of plain names"
                )));
            }
            match item {
                PutItem::File { content, .. } if content.len() > MAX_WRITE => Err(
                    Error::invalid(format!("a piece of a copy carries at most {MAX_WRITE} bytes")),
                ),
                PutItem::Symlink { target }
                    if target.is_empty() || target.len() > MAX_PATH || target.contains('\0') =>
                {
                    Err(Error::invalid(format!(
                        "a symlink's target is 1 to {MAX_PATH} bytes without NUL"
                    )))
                }
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// Holds the guest's answer to the request's own bounds; an answer that breaks them, or is
/// not the answer to this kind of request, is the guest's fault and is refused whole.
fn check_result(op: &FileOp, result: FileResult) -> Result<FileResult> {
    let bad = |why: &str| {
        Err(Error::internal(format!(
            "the guest agent's answer to a file {} was refused: {why}",
            op.name()
        )))
    };
    let path_ok = |path: &str| path.len() <= MAX_PATH;
    match (&op, &result) {
        (
            FileOp::Read { offset, length, .. },
            FileResult::Read {
                path,
                data,
                offset: got_offset,
                total_size,
            },
        ) => {
            let most = (*length).min(MAX_READ);
            if got_offset != offset || data.len() as u64 > most || !path_ok(path) {
                return bad("it does not match the read asked for");
            }
            // An empty answer past the end is the right one.
            if !data.is_empty() && (data.len() as u64).saturating_add(*offset) > *total_size {
                return bad("it holds more bytes than the file's size");
            }
        }
        (FileOp::Write { content, .. }, FileResult::Written { path, bytes, .. }) => {
            if *bytes != content.len() as u64 || !path_ok(path) {
                return bad("it does not match the write asked for");
            }
        }
        (FileOp::Put { item, .. }, FileResult::Written { path, bytes, .. }) => {
            let sent = match item {
                PutItem::File { content, .. } => content.len() as u64,
                _ => 0,
            };
            if *bytes != sent || !path_ok(path) {
                return bad("it does not match the copy asked for");
            }
        }
        (FileOp::Edit { .. }, FileResult::Edited { path, .. }) => {
            if !path_ok(path) {
                return bad("its path is too long");
            }
        }
        (FileOp::List { .. }, FileResult::Listed { path, entries, .. }) => {
            if entries.len() > MAX_LIST_ENTRIES as usize || !path_ok(path) {
                return bad("it lists more entries than asked for");
            }
            let long = |text: &str| text.len() > MAX_ENTRY_TEXT;
            if entries.iter().any(|entry| {
                long(&entry.name)
                    || entry.target.as_deref().is_some_and(long)
                    || entry.error.as_deref().is_some_and(long)
                    || !matches!(entry.kind.as_str(), "file" | "dir" | "symlink" | "other")
            }) {
                return bad("an entry is malformed");
            }
        }
        _ => return bad("it answers another kind of request"),
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_beyond_the_request_is_refused() {
        let op = FileOp::Read {
            path: "a".into(),
            offset: 0,
            length: 4,
        };
        let answer = |len: usize, total: u64| FileResult::Read {
            path: "/a".into(),
            data: vec![0; len],
            offset: 0,
            total_size: total,
        };
        assert!(check_result(&op, answer(4, 10)).is_ok());
        assert!(check_result(&op, answer(5, 10)).is_err());
        assert!(check_result(&op, answer(4, 3)).is_err());
        let past_end = FileOp::Read {
            path: "a".into(),
            offset: 100,
            length: 4,
        };
        let empty = FileResult::Read {
            path: "/a".into(),
            data: Vec::new(),
            offset: 100,
            total_size: 10,
        };
        assert!(check_result(&past_end, empty).is_ok());
        let listed = FileResult::Listed {
            path: "/".into(),
            entries: Vec::new(),
            left_off: 0,
        };
        assert!(check_result(&op, listed).is_err());
    }

    #[test]
    fn a_put_below_its_directory_only_and_answered_for_what_it_sent() {
        let put = |rel: &str, item: PutItem| FileRequest {
            cwd: "/".into(),
            op: FileOp::Put {
                path: "/tmp".into(),
                rel: rel.into(),
                item,
            },
        };
        let dir = || PutItem::Dir { mode: None };
        assert!(check_request(&put("a/b", dir())).is_ok());
        for bad in ["", "..", "a/../b", "/a", "a//b", "a/.", "a\0b"] {
            assert!(check_request(&put(bad, dir())).is_err(), "{bad:?}");
        }
        let link = PutItem::Symlink {
            target: String::new(),
        };
        assert!(check_request(&put("a", link)).is_err());
        let piece = PutItem::File {
            content: vec![1, 2, 3],
            offset: 0,
            mode: None,
        };
        let written = |bytes: u64| FileResult::Written {
            path: "/tmp/a".into(),
            bytes,
            created: true,
            mode: 0o644,
        };
        let op = put("a", piece).op;
        assert!(check_result(&op, written(3)).is_ok());
        assert!(check_result(&op, written(4)).is_err());
    }
}
