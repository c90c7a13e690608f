//! What a task's import brings of a project's history, and what it leaves out, as a task's
//! result reports it.

use std::fmt;
use std::path::PathBuf;

/// How much git history a `projectPath` import brings (the `history` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum History {
    /// Every local branch (`refs/heads/*`), plus `HEAD`.
    Branches,
    /// `HEAD` only: its branch, or the detached commit, and its ancestors.
    Head,
    /// No history.
    None,
}

impl History {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Branches => "branches",
            Self::Head => "head",
            Self::None => "none",
        }
    }
}

/// File types that are never imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Unknown,
}

impl Special {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fifo => "a fifo",
            Self::Socket => "a socket",
            Self::CharDevice => "a character device",
            Self::BlockDevice => "a block device",
            Self::Unknown => "a file of unknown type",
        }
    }
}

/// Something left out of the import (or, for [`NoteKind::ReadAsPlainTree`], read differently).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Relative to the project root.
    pub path: PathBuf,
    pub kind: NoteKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoteKind {
    /// Fifos, sockets, devices never come.
    Special(Special),
    /// A directory on the way to it is a symlink (not followed).
    SymlinkInPath,
    /// Not readable by this process.
    PermissionDenied,
    /// Git listed a name that is not a plain relative path (`..`, a leading `/`, …: a crafted
    /// index), or one too long to open.
    UnsafeName,
    /// It changed type between listing and reading (e.g. a file swapped for a symlink).
    Changed,
    /// It was listed but is gone by the time it was read.
    Vanished,
    /// It shrank while being read; the archive has it padded with zero bytes (as GNU tar does).
    Shrank,
    /// A nested repository git could not read (message); its directory was read as a plain
    /// tree instead (ignored files included).
    ReadAsPlainTree(String),
    /// Repositories nested deeper than this are left out.
    TooDeep,
}

impl NoteKind {
    /// What happened to the path, in words (the path itself not included).
    pub fn reason(&self) -> String {
        match self {
            Self::Special(special) => format!(
                "{}, not imported (fifos, sockets and devices never are)",
                special.as_str()
            ),
            Self::SymlinkInPath => "a directory in its path is a symlink, not followed".into(),
            Self::PermissionDenied => {
                "permission denied, not imported (the user running dynocap cannot read it)".into()
            }
            Self::UnsafeName => "not a plain relative path, not imported".into(),
            Self::Changed => "changed type while being imported, not imported".into(),
            Self::Vanished => "removed while being imported".into(),
            Self::Shrank => "shrank while being read, padded with zero bytes".into(),
            Self::ReadAsPlainTree(why) => format!(
                "git could not read this nested repository ({why}); imported as plain files"
            ),
            Self::TooDeep => "repositories nested too deep, not imported".into(),
        }
    }
}

/// A line for logs and messages. The path is the project's, which a hostile party may have
/// named: its control characters are shown escaped, so it cannot forge log lines.
impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.path.to_string_lossy().chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        write!(f, ": {}", self.kind.reason())
    }
}
