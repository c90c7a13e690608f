//! File operations the host asks of the agent ([`crate::Request::File`]): read a window of a
//! file, write one, replace one exact text in one, list a directory. The agent performs them
//! as the sandbox user, so the guest's own permissions decide what may be touched.
//!
//! Every size here is bounded so that a request and its answer each fit in one frame, and the
//! host checks an answer against the same bounds: the guest is not trusted to keep them.

use serde::{Deserialize, Serialize};

/// Most bytes one read returns (its answer, in base64 inside JSON, stays well under a frame).
pub const MAX_READ: u64 = 512 * 1024;
/// Most bytes one write or edit carries (its request, in base64 inside JSON, fits a frame).
pub const MAX_WRITE: usize = 512 * 1024;
/// Largest file an edit rewrites: the agent holds it in memory twice.
pub const MAX_EDIT_FILE: u64 = 8 * 1024 * 1024;
/// Deepest listing.
pub const MAX_LIST_DEPTH: u32 = 8;
/// Most entries one listing returns; the rest are counted in `left_off`.
pub const MAX_LIST_ENTRIES: u32 = 2000;
/// Longest path the host sends or accepts back.
pub const MAX_PATH: usize = 4096;

/// See [`crate::Request::File`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRequest {
    /// A relative `path` is taken from here (the task's workspace, a raw sandbox's `/`).
    pub cwd: String,
    pub op: FileOp,
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum FileOp {
    /// Up to `length` (at most [`MAX_READ`]) bytes from `offset`.
    Read {
        path: String,
        offset: u64,
        length: u64,
    },
    /// Replace the file's content (created when absent, with `mode`, default 0644).
    Write {
        path: String,
        #[serde(with = "base64_bytes")]
        content: Vec<u8>,
        mode: Option<u32>,
        create_dirs: bool,
    },
    /// Replace `old_text` by `new_text`: it must occur exactly once, or at least once with
    /// `replace_all`.
    Edit {
        path: String,
        old_text: String,
        new_text: String,
        replace_all: bool,
    },
    /// The entries under a directory, `depth` levels down (1: its own entries), from the
    /// `offset`-th on in the listing's order (names sorted bytewise, a directory's entries
    /// right after it): a directory with more than [`MAX_LIST_ENTRIES`] is read page by page.
    List {
        path: String,
        depth: u32,
        #[serde(default)]
        offset: u64,
    },
    /// One entry of a copy into the guest (`dynocap cp`): `rel` (`/`-separated plain names)
    /// under the directory `path`, whose components are walked without following a symlink.
    /// Answered with [`FileResult::Written`].
    Put {
        path: String,
        rel: String,
        item: PutItem,
    },
}

/// What a [`FileOp::Put`] makes.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum PutItem {
    /// A directory (an existing one is entered); `mode`, when given, is set on it.
    Dir { mode: Option<u32> },
    /// A piece of a file: at offset 0 the file is created or emptied (never through a
    /// symlink), later pieces go at their offset. `mode`, given with the last piece, is set
    /// once the content is in (so that a read-only file can be written in pieces).
    File {
        #[serde(with = "base64_bytes")]
        content: Vec<u8>,
        offset: u64,
        mode: Option<u32>,
    },
    /// A symlink to `target`, which is written as it is and never followed.
    Symlink { target: String },
}

impl std::fmt::Debug for PutItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir { mode } => f.debug_struct("Dir").field("mode", mode).finish(),
            Self::File {
                content,
                offset,
                mode,
            } => f
                .debug_struct("File")
                .field("bytes", &content.len())
                .field("offset", offset)
                .field("mode", mode)
                .finish(),
            Self::Symlink { target } => f.debug_struct("Symlink").field("target", target).finish(),
        }
    }
}

impl FileOp {
    pub fn path(&self) -> &str {
        match self {
            Self::Read { path, .. }
            | Self::Write { path, .. }
            | Self::Edit { path, .. }
            | Self::List { path, .. }
            | Self::Put { path, .. } => path,
        }
    }

    /// The operation's name, as logs show it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read",
            Self::Write { .. } => "write",
            Self::Edit { .. } => "edit",
            Self::List { .. } => "list",
            Self::Put { .. } => "put",
        }
    }
}

/// Content stays out of logs: only its size shows.
impl std::fmt::Debug for FileOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read {
                path,
                offset,
                length,
            } => f
                .debug_struct("Read")
                .field("path", path)
                .field("offset", offset)
                .field("length", length)
                .finish(),
            Self::Write {
                path,
                content,
                mode,
                create_dirs,
            } => f
                .debug_struct("Write")
                .field("path", path)
                .field("bytes", &content.len())
                .field("mode", mode)
                .field("create_dirs", create_dirs)
                .finish(),
            Self::Edit {
                path,
                old_text,
                new_text,
                replace_all,
            } => f
                .debug_struct("Edit")
                .field("path", path)
                .field("old_bytes", &old_text.len())
                .field("new_bytes", &new_text.len())
                .field("replace_all", replace_all)
                .finish(),
            Self::List {
                path,
                depth,
                offset,
            } => f
                .debug_struct("List")
                .field("path", path)
                .field("depth", depth)
                .field("offset", offset)
                .finish(),
            Self::Put { path, rel, item } => f
                .debug_struct("Put")
                .field("path", path)
                .field("rel", rel)
                .field("item", item)
                .finish(),
        }
    }
}

/// The answer to a [`FileRequest`], in `Done(Response::File)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum FileResult {
    Read {
        /// The absolute path that was read.
        path: String,
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
        offset: u64,
        /// The file's size when it was read.
        total_size: u64,
    },
    Written {
        path: String,
        bytes: u64,
        /// The file did not exist before.
        created: bool,
        mode: u32,
    },
    Edited {
        path: String,
        replacements: u64,
        /// The file's size after the edit.
        size: u64,
    },
    Listed {
        path: String,
        entries: Vec<FileEntry>,
        /// Entries beyond [`MAX_LIST_ENTRIES`] that were not listed.
        left_off: u64,
    },
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileEntry {
    /// Relative to the listed directory, `/`-separated.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// A symlink's target, as it is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The directory was not descended into (unreadable to the sandbox user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The entry's own name, or a symlink's target, is not UTF-8: `name` and `target` show
    /// U+FFFD for the bytes that are not, so they name no file and no request can reach it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_utf8: bool,
}

/// What the agent's helper process for one file operation (`dynocap-agent file-op`) prints
/// on its stdout: the operation's result, or why it was refused. The helper is the agent's
/// own binary on both ends, so this never crosses to the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum HelperAnswer {
    Done(FileResult),
    Refused(String),
}

impl FileRequest {
    /// The request as the helper reads it on its stdin.
    pub fn to_json(&self) -> Result<Vec<u8>, String> {
        serde_json::to_vec(self).map_err(|err| err.to_string())
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|err| err.to_string())
    }
}

impl HelperAnswer {
    pub fn to_json(&self) -> Result<Vec<u8>, String> {
        serde_json::to_vec(self).map_err(|err| err.to_string())
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|err| err.to_string())
    }
}

mod base64_bytes {
    use base64::Engine as _;

    pub fn serialize<S: serde::Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        let text: String = serde::Deserialize::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_travel_as_base64_and_debug_hides_content() {
        let op = FileOp::Write {
            path: "a".into(),
            content: vec![0, 255, b'"', b'\\'],
            mode: Some(0o600),
            create_dirs: false,
        };
        let json = serde_json::to_string(&op).unwrap_or_default();
        assert!(json.contains("\"AP8iXA==\""), "{json}");
        let back: FileOp = serde_json::from_str(&json).unwrap_or(FileOp::List {
            path: String::new(),
            depth: 0,
            offset: 0,
        });
        assert_eq!(back, op);
        assert!(!format!("{op:?}").contains("AP8"));
    }
}
