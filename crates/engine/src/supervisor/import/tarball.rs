//! The import's tar stream: what [`super::plan`] listed, read now, as GNU tar entries.
//!
//! Entries are relative paths of plain components (checked again here: anything else is a bug
//! and aborts the stream), each directory before what it holds. Regular files are `0644` or
//! `0755` (the owner's exec bit decides, as in git), directories `0755`, symlinks carry their
//! target byte for byte; uid/gid 0, no user or group names, mtime 0. Long names and link
//! targets use GNU `L`/`K` records; no pax headers are written.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use tar::{Builder, EntryType, Header};

use super::beneath::{self, Kind, OpenFileError, Probe, Resolver};
use super::{len_u64, path_of, EntryKind, ImportError, ImportPlan, Note, NoteKind};

/// Longest link target a header holds; longer ones go in a GNU `K` record.
const LINK_NAME_FIELD: usize = 100;

/// Progress is reported after every entry and every this many bytes inside a file.
const PROGRESS_STEP: u64 = 8 << 20;

/// What [`write_tar`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TarSummary {
    /// Regular files and symlinks written.
    pub files: u64,
    /// Their sizes as read (a symlink counts its target's length).
    pub bytes: u64,
    /// Listed entries that changed between [`super::plan`] and reading, and what was done.
    pub notes: Vec<Note>,
}

/// Writes the project as a tar stream to `out`, reading every file now. `progress(done,
/// total)` is called now and then with bytes read so far and the plan's total (raised to
/// `done` if files grew since the plan). Returns what was written; entries that vanished or
/// changed type since the plan are left out with a note, never followed. On error the stream
/// stops where it is, without the end-of-archive blocks: the caller must tell the reader the
/// import failed (a reader may take a truncated archive for a complete one).
pub fn write_tar(
    plan: &ImportPlan,
    out: impl Write,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TarSummary, ImportError> {
    // Fault tests stop the supervisor here, between listing and reading, to change the tree;
    // nothing is written yet, so a failure here cannot look like a complete archive.
    crate::foundation::failpoint::hit("import.tar-streaming").map_err(ImportError::Fault)?;
    let mut writer = TarWriter {
        plan,
        builder: Builder::new(Gate { out, open: true }),
        dirs: HashSet::new(),
        summary: TarSummary::default(),
        done: 0,
        progress,
        resolver: plan.resolver,
    };
    writer.report();
    for entry in plan.entries() {
        if let Err(err) = writer.entry(entry.path.as_os_str().as_bytes(), &entry.kind) {
            // The builder writes the end-of-archive blocks when dropped; a failed stream must
            // not end like a complete (shorter) archive.
            writer.builder.get_mut().open = false;
            return Err(err);
        }
    }
    let mut out = writer.builder.into_inner().map_err(ImportError::Write)?;
    out.flush().map_err(ImportError::Write)?;
    Ok(writer.summary)
}

/// The output, which can be shut so nothing more reaches it.
struct Gate<W> {
    out: W,
    open: bool,
}

impl<W: Write> Write for Gate<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.open {
            self.out.write(buf)
        } else {
            Err(io::Error::other("the import stream was abandoned"))
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

struct TarWriter<'a, W: Write> {
    plan: &'a ImportPlan,
    builder: Builder<Gate<W>>,
    /// Directories already written.
    dirs: HashSet<Vec<u8>>,
    summary: TarSummary,
    done: u64,
    progress: &'a mut dyn FnMut(u64, u64),
    resolver: Resolver,
}

impl<W: Write> TarWriter<'_, W> {
    fn report(&mut self) {
        (self.progress)(self.done, self.plan.bytes.max(self.done));
    }

    fn note(&mut self, path: &[u8], kind: NoteKind) {
        self.summary.notes.push(Note {
            path: path_of(path),
            kind,
        });
    }

    fn entry(&mut self, path: &[u8], kind: &EntryKind) -> Result<(), ImportError> {
        if !beneath::is_plain_relative(path) {
            return Err(ImportError::UnsafePath(path_of(path)));
        }
        self.parents(path)?;
        match kind {
            EntryKind::Dir => self.dir(path)?,
            EntryKind::File { .. } => self.file(path)?,
            EntryKind::Symlink { .. } => self.symlink(path)?,
        }
        self.report();
        Ok(())
    }

    /// Writes the directories leading to `path` that are not written yet.
    fn parents(&mut self, path: &[u8]) -> Result<(), ImportError> {
        for (at, _) in path.iter().enumerate().filter(|(_, b)| **b == b'/') {
            let parent = &path[..at];
            if !self.dirs.contains(parent) {
                self.dir(parent)?;
            }
        }
        Ok(())
    }

    fn dir(&mut self, path: &[u8]) -> Result<(), ImportError> {
        if !self.dirs.insert(path.to_vec()) {
            return Ok(());
        }
        let mut name = path.to_vec();
        name.push(b'/');
        let mut header = header(EntryType::Directory, 0o755, 0);
        self.builder
            .append_data(
                &mut header,
                Path::new(OsStr::from_bytes(&name)),
                io::empty(),
            )
            .map_err(ImportError::Write)
    }

    fn file(&mut self, path: &[u8]) -> Result<(), ImportError> {
        let (file, size, executable) =
            match beneath::open_regular(self.plan.root_fd.as_fd(), path, self.resolver) {
                Ok(opened) => opened,
                Err(OpenFileError::NotRegular) => {
                    self.note(path, NoteKind::Changed);
                    return Ok(());
                }
                Err(OpenFileError::Errno(err)) => return self.skip_or_fail(path, err),
            };
        let mut header = header(
            EntryType::Regular,
            if executable { 0o755 } else { 0o644 },
            size,
        );
        let mut reader = FileReader::new(
            file,
            size,
            &mut self.done,
            self.plan.bytes,
            &mut *self.progress,
        );
        let appended =
            self.builder
                .append_data(&mut header, Path::new(OsStr::from_bytes(path)), &mut reader);
        let (shrank, read_error) = (reader.shrank(), reader.error.take());
        if let Some(source) = read_error {
            return Err(ImportError::Read {
                path: self.plan.root.join(OsStr::from_bytes(path)),
                source,
            });
        }
        appended.map_err(ImportError::Write)?;
        if shrank {
            self.note(path, NoteKind::Shrank);
        }
        self.summary.files += 1;
        self.summary.bytes = self.summary.bytes.saturating_add(size);
        Ok(())
    }

    fn symlink(&mut self, path: &[u8]) -> Result<(), ImportError> {
        let probe = match Probe::new(self.plan.root_fd.as_fd(), path, self.resolver) {
            Ok(probe) => probe,
            Err(err) => return self.skip_or_fail(path, err),
        };
        if probe.kind() != Kind::Symlink {
            self.note(path, NoteKind::Changed);
            return Ok(());
        }
        let target = match probe.read_link() {
            Ok(target) => target,
            Err(err) => return self.skip_or_fail(path, err),
        };
        let mut header = header(EntryType::Symlink, 0o777, 0);
        if target.len() > LINK_NAME_FIELD {
            // GNU long link record: the target, NUL-terminated, before the entry's header.
            let mut long = header_for_long_name(b'K', len_u64(target.len() + 1));
            long.set_cksum();
            let data = target.as_slice().chain(&[0u8][..]);
            self.builder
                .append(&long, data)
                .map_err(ImportError::Write)?;
            header
                .set_link_name_literal(&target[..LINK_NAME_FIELD])
                .map_err(ImportError::Write)?;
        } else {
            header
                .set_link_name_literal(&target)
                .map_err(ImportError::Write)?;
        }
        self.builder
            .append_data(&mut header, Path::new(OsStr::from_bytes(path)), io::empty())
            .map_err(ImportError::Write)?;
        self.summary.files += 1;
        let len = len_u64(target.len());
        self.summary.bytes = self.summary.bytes.saturating_add(len);
        self.done = self.done.saturating_add(len);
        Ok(())
    }

    /// An entry that cannot be opened now: gone or unreadable is a note, anything else fails.
    fn skip_or_fail(&mut self, path: &[u8], err: Errno) -> Result<(), ImportError> {
        let kind = match err {
            Errno::ENOENT | Errno::ENOTDIR => NoteKind::Vanished,
            Errno::ELOOP => NoteKind::SymlinkInPath,
            Errno::EACCES | Errno::EPERM => NoteKind::PermissionDenied,
            err => {
                return Err(ImportError::Read {
                    path: self.plan.root.join(OsStr::from_bytes(path)),
                    source: err.into(),
                })
            }
        };
        self.note(path, kind);
        Ok(())
    }
}

/// A header with everything but the path (and link name) set: fixed owner and time.
fn header(entry_type: EntryType, mode: u32, size: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(entry_type);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(size);
    header
}

/// The header of a GNU long-name (`L`) or long-link (`K`) record of `size` bytes.
fn header_for_long_name(entry_type: u8, size: u64) -> Header {
    let mut header = header(EntryType::new(entry_type), 0o644, size);
    if let Some(gnu) = header.as_gnu_mut() {
        let name = b"././@LongLink";
        gnu.name[..name.len()].copy_from_slice(name);
    }
    header
}

/// Reads exactly `remaining` bytes of a file: stops there if the file grew, pads with zeros if
/// it shrank (the header already promised the size). Keeps the first read error for the
/// caller (the tar builder only sees a generic failure) and reports progress.
pub(super) struct FileReader<'a> {
    file: std::fs::File,
    remaining: u64,
    shrank: bool,
    error: Option<io::Error>,
    done: &'a mut u64,
    total: u64,
    since_report: u64,
    progress: &'a mut dyn FnMut(u64, u64),
}

impl<'a> FileReader<'a> {
    pub(super) fn new(
        file: std::fs::File,
        size: u64,
        done: &'a mut u64,
        total: u64,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> Self {
        Self {
            file,
            remaining: size,
            shrank: false,
            error: None,
            done,
            total,
            since_report: 0,
            progress,
        }
    }

    /// The file ended before the size it had when opened.
    pub(super) fn shrank(&self) -> bool {
        self.shrank
    }
}

impl Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = usize::try_from(self.remaining).map_or(buf.len(), |r| r.min(buf.len()));
        if want == 0 {
            return Ok(0);
        }
        let got = if self.shrank {
            0
        } else {
            loop {
                match self.file.read(&mut buf[..want]) {
                    Ok(n) => break n,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) => {
                        let kind = err.kind();
                        self.error = Some(err);
                        return Err(io::Error::new(kind, "reading a project file failed"));
                    }
                }
            }
        };
        let n = if got == 0 {
            self.shrank = true;
            buf[..want].fill(0);
            want
        } else {
            got
        };
        let n64 = len_u64(n);
        self.remaining -= n64;
        *self.done = self.done.saturating_add(n64);
        self.since_report += n64;
        if self.since_report >= PROGRESS_STEP {
            self.since_report = 0;
            (self.progress)(*self.done, self.total.max(*self.done));
        }
        Ok(n)
    }
}
