//! The host's copy of a clone: the files git checked out, read from the workspace as they
//! are on disk and sent as a tar stream.
//!
//! The host verifies patches against this copy, and the guest's diffs are taken against the
//! same files on disk, so it must be the checkout byte for byte. `git archive` is not: it
//! honours `export-ignore` and `export-subst`, which leave out or rewrite files a checkout
//! has as they are. Reading the disk also carries over whatever the checkout itself applied
//! (`eol`, `ident`, `working-tree-encoding`), exactly as the guest sees it.
//!
//! The list of paths is git's index (`ls-files --stage`); each path is opened beneath the
//! workspace without following any symlink, so the listing cannot point the agent (root)
//! outside the workspace.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dynocap_proto::{channel, Frame, FrameKind, DATA_CHUNK};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use tokio::sync::mpsc;

use crate::fsutil;

/// One path of the index: what git checked out there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub path: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File {
        executable: bool,
    },
    Symlink,
    /// A submodule: a checkout leaves an empty directory.
    Gitlink,
}

/// Why the checkout could not be listed or sent.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    #[error("git ls-files printed an entry that is not `<mode> <object> <stage>\\t<path>`: {0:?}")]
    Listing(String),
    #[error("the clone was cancelled")]
    Cancelled,
    /// A system call on a checked-out path failed.
    #[error("{what} {}: {source}", String::from_utf8_lossy(.path))]
    Sys {
        what: &'static str,
        path: Vec<u8>,
        source: Errno,
    },
    /// Reading a checked-out path or writing its tar entry failed.
    #[error("{what} {}: {source}", String::from_utf8_lossy(.path))]
    Io {
        what: &'static str,
        path: Vec<u8>,
        source: io::Error,
    },
    #[error("the checkout did not leave a file at {}: not a file", String::from_utf8_lossy(.0))]
    NotAFile(Vec<u8>),
    #[error("the checked-out files are over the {0} bytes a clone may send")]
    TooLarge(u64),
    #[error("cannot send the checked-out files: {0}")]
    Finish(#[source] io::Error),
}

/// Parses `git ls-files -z --stage`: `<mode> <object> <stage>\t<path>\0` per entry.
pub fn parse_listing(listing: &[u8]) -> Result<Vec<Entry>, CheckoutError> {
    let mut entries = Vec::new();
    for record in listing.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let bad = || CheckoutError::Listing(String::from_utf8_lossy(record).into_owned());
        let tab = record.iter().position(|b| *b == b'\t').ok_or_else(bad)?;
        let (info, path) = (&record[..tab], &record[tab + 1..]);
        let mode = info.split(|b| *b == b' ').next().ok_or_else(bad)?;
        let kind = match mode {
            b"100644" => Kind::File { executable: false },
            b"100755" => Kind::File { executable: true },
            b"120000" => Kind::Symlink,
            b"160000" => Kind::Gitlink,
            _ => return Err(bad()),
        };
        if path.is_empty() {
            return Err(bad());
        }
        entries.push(Entry {
            kind,
            path: path.to_vec(),
        });
    }
    Ok(entries)
}

/// Writes the tar of `entries` as found beneath `workspace` into `out`: a directory entry
/// before the first path inside it, files with their bytes and mode (0644 or 0755), symlinks
/// with their target. At most `max_bytes` of file content; `cancelled` stops it between writes.
pub fn write_tar(
    workspace: &OwnedFd,
    entries: &[Entry],
    out: impl Write,
    max_bytes: u64,
    cancelled: &AtomicBool,
) -> Result<(), CheckoutError> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Deterministic);
    let mut dirs: HashSet<&[u8]> = HashSet::new();
    let mut total: u64 = 0;
    for entry in entries {
        if cancelled.load(Ordering::Relaxed) {
            return Err(CheckoutError::Cancelled);
        }
        let path = entry.path.as_slice();
        let sys = |what: &'static str| {
            move |source| CheckoutError::Sys {
                what,
                path: path.to_vec(),
                source,
            }
        };
        let io = |what: &'static str| {
            move |source| CheckoutError::Io {
                what,
                path: path.to_vec(),
                source,
            }
        };
        // Each parent directory once, before what is in it.
        for (end, _) in path.iter().enumerate().filter(|(_, b)| **b == b'/') {
            let dir = &path[..end];
            if dirs.insert(dir) {
                append_dir(&mut builder, dir).map_err(io("cannot send"))?;
            }
        }
        match entry.kind {
            Kind::Gitlink => {
                if dirs.insert(path) {
                    append_dir(&mut builder, path).map_err(io("cannot send"))?;
                }
            }
            Kind::Symlink => {
                let (parent, name) = split_parent(path);
                let dir = fsutil::open_beneath(
                    workspace.as_fd(),
                    OsStr::from_bytes(parent),
                    fsutil::dir_flags(),
                )
                .map_err(sys("cannot open the directory of"))?;
                let target = nix::fcntl::readlinkat(dir.as_fd(), OsStr::from_bytes(name))
                    .map_err(sys("cannot read the checked-out symlink"))?;
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder
                    .append_link(&mut header, as_path(path), Path::new(&target))
                    .map_err(io("cannot send"))?;
            }
            Kind::File { executable } => {
                let file = fsutil::open_beneath(
                    workspace.as_fd(),
                    OsStr::from_bytes(path),
                    OFlag::O_RDONLY | OFlag::O_NONBLOCK,
                )
                .map_err(sys("cannot open the checked-out file"))?;
                let file = std::fs::File::from(file);
                let meta = file
                    .metadata()
                    .map_err(io("cannot read the checked-out file"))?;
                if !meta.is_file() {
                    return Err(CheckoutError::NotAFile(path.to_vec()));
                }
                let size = meta.len();
                total = total.saturating_add(size);
                if total > max_bytes {
                    return Err(CheckoutError::TooLarge(max_bytes));
                }
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(if executable { 0o755 } else { 0o644 });
                header.set_size(size);
                let exact = Exact {
                    inner: file.take(size),
                    left: size,
                };
                builder
                    .append_data(&mut header, as_path(path), exact)
                    .map_err(io("cannot send"))?;
            }
        }
    }
    builder
        .into_inner()
        .and_then(|mut out| out.flush())
        .map_err(CheckoutError::Finish)
}

fn append_dir<W: Write>(builder: &mut tar::Builder<W>, dir: &[u8]) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    builder.append_data(&mut header, as_path(dir), io::empty())
}

fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

/// `a/b/c` → (`a/b`, `c`); `c` → (``, `c`).
fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(slash) => (&path[..slash], &path[slash + 1..]),
        None => (&[], path),
    }
}

/// A file's bytes, exactly as many as its header says: a file that shrank while read would
/// otherwise leave a tar whose next header is file data.
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file became shorter while it was read",
            ));
        }
        self.left -= u64::try_from(n).unwrap_or(u64::MAX).min(self.left);
        Ok(n)
    }
}

/// Sends what is written to it as the stream's STDOUT data frames, from a blocking thread.
pub struct FrameWriter {
    tx: mpsc::Sender<Frame>,
    stream: u32,
    buf: Vec<u8>,
    cancelled: Arc<AtomicBool>,
}

impl FrameWriter {
    pub fn new(tx: mpsc::Sender<Frame>, stream: u32, cancelled: Arc<AtomicBool>) -> Self {
        Self {
            tx,
            stream,
            buf: Self::fresh(),
            cancelled,
        }
    }

    fn fresh() -> Vec<u8> {
        let mut buf = Vec::with_capacity(DATA_CHUNK + 1);
        buf.push(channel::STDOUT);
        buf
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.len() <= 1 {
            return Ok(());
        }
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
        }
        let payload = std::mem::replace(&mut self.buf, Self::fresh());
        self.tx
            .blocking_send(Frame::new(self.stream, FrameKind::Data, payload))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the host is gone"))
    }
}

impl Write for FrameWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = DATA_CHUNK + 1 - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() > DATA_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_parses_each_mode_and_refuses_others() {
        let listing = b"100644 aaaa 0\tREADME.md\x00100755 bbbb 0\tbin/run\0\
120000 cccc 0\tlink\x00160000 dddd 0\tvendor/sub\0";
        let entries = parse_listing(listing).unwrap();
        assert_eq!(
            entries.iter().map(|e| e.kind).collect::<Vec<_>>(),
            [
                Kind::File { executable: false },
                Kind::File { executable: true },
                Kind::Symlink,
                Kind::Gitlink
            ]
        );
        assert_eq!(entries[3].path, b"vendor/sub");
        assert!(parse_listing(b"040000 x 0\tdir\0").is_err());
        assert!(parse_listing(b"100644 x 0 no-tab\0").is_err());
        // The text the host reads is the one it always read.
        assert_eq!(
            parse_listing(b"100644 x 0 no-tab\0")
                .expect_err("no tab")
                .to_string(),
            r#"git ls-files printed an entry that is not `<mode> <object> <stage>\t<path>`: "100644 x 0 no-tab""#
        );
        assert_eq!(
            CheckoutError::TooLarge(10).to_string(),
            "the checked-out files are over the 10 bytes a clone may send"
        );
        assert_eq!(
            CheckoutError::NotAFile(b"a/b".to_vec()).to_string(),
            "the checkout did not leave a file at a/b: not a file"
        );
    }

    #[test]
    fn the_tar_holds_the_files_as_on_disk_and_no_path_leaves_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/crlf.txt"), b"one\r\ntwo\r\n").unwrap();
        std::os::unix::fs::symlink("../elsewhere", root.join("a/up")).unwrap();
        let entries =
            parse_listing(b"100644 x 0\ta/b/crlf.txt\x00120000 x 0\ta/up\x00160000 x 0\tsub\0")
                .unwrap();
        let ws = fsutil::open_dir_nofollow(root).unwrap();
        let mut out = Vec::new();
        write_tar(&ws, &entries, &mut out, u64::MAX, &AtomicBool::new(false)).unwrap();
        let mut archive = tar::Archive::new(out.as_slice());
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            seen.push((path, entry.header().entry_type(), bytes));
        }
        let names: Vec<&str> = seen.iter().map(|(p, _, _)| p.as_str()).collect();
        assert_eq!(names, ["a", "a/b", "a/b/crlf.txt", "a/up", "sub"]);
        assert_eq!(seen[2].2, b"one\r\ntwo\r\n");
        assert!(seen[3].1.is_symlink());

        // A listed path beneath a symlink is refused, not followed.
        let escape = parse_listing(b"100644 x 0\ta/up/passwd\0").unwrap();
        let err =
            write_tar(&ws, &escape, Vec::new(), u64::MAX, &AtomicBool::new(false)).unwrap_err();
        assert!(err.to_string().contains("a/up/passwd"), "{err}");
        assert!(
            matches!(&err, CheckoutError::Sys { path, .. } if path == b"a/up/passwd"),
            "{err:?}"
        );
    }
}
