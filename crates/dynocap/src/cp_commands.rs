//! `dynocap cp NAME:GUESTPATH HOSTPATH` and `dynocap cp HOSTPATH NAME:GUESTPATH`: copies out
//! of and into a sandbox or task, with `docker cp`'s rules for the destination. The guest is walked through the file operations of
//! [`dynocap_engine::files`] (each done by the agent as the sandbox user, so the guest's own
//! permissions decide what can be read), and what it answers is hostile data: every name is
//! one plain component, every host file is created relative to a directory descriptor with
//! `O_NOFOLLOW`, nothing existing at a name the copy makes is followed when it is a symlink,
//! guest symlinks are recreated as symlinks (their targets kept as written, never followed),
//! devices, FIFOs and sockets are skipped with a note, set-id bits are cleared, and bytes and
//! entries are bounded. A copy in sends each entry as one `put`, which the agent makes as
//! the sandbox user without following a symlink below the destination.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dynocap_engine::files::{FileEntry, FileOp, FileResult, PutItem, MAX_READ, MAX_WRITE};
use dynocap_engine::{Engine, Error};
use nix::errno::Errno;
use nix::fcntl::renameat;
use nix::fcntl::{open, openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{fchown, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

use crate::cli::CpArgs;
use crate::output::{print_json, warnln};

/// Deepest directory a copy descends into: each level holds one open descriptor.
const MAX_DEPTH: usize = 128;
/// Longest name of one entry (the host's own limit).
const MAX_NAME: usize = 255;

/// The refusal of `NAME:` with no path, saying what to write.
const EMPTY_GUEST_PATH: &str = "the guest path after NAME: is empty; write one, such as \
    box:/tmp/out or box:. (a relative path is in a task's /workspace, a raw sandbox's /)";

/// One side of a copy: `NAME:PATH` is in a sandbox, anything else on the host (a host path
/// with a colon is written `./a:b`, as with docker).
#[derive(Debug, PartialEq, Eq)]
enum Side {
    Guest { name: String, path: String },
    Host(PathBuf),
}

fn side(arg: &str) -> Side {
    match arg.split_once(':') {
        Some((name, path)) if !name.is_empty() && !name.contains('/') => Side::Guest {
            name: name.to_owned(),
            path: path.to_owned(),
        },
        _ => Side::Host(PathBuf::from(arg)),
    }
}

/// Both sides of a copy, or why they are not one: `-`, which `docker cp` takes for a tar
/// archive on stdin or stdout, is refused rather than taken for a host file of that name.
fn sides(source: &str, destination: &str) -> Result<(Side, Side), Error> {
    if source == "-" || destination == "-" {
        return Err(Error::invalid(
            "dynocap cp does not read or write a tar archive through - as docker cp does: \
             name a host file or directory (a host file named - is written ./-), or run tar \
             in the sandbox with dynocap exec",
        ));
    }
    Ok((side(source), side(destination)))
}

pub async fn cp(engine: &Engine, json: bool, args: CpArgs) -> Result<ExitCode, Error> {
    let bounds = Bounds {
        bytes: args.max_bytes,
        entries: args.max_entries,
    };
    let (report, to) = match sides(&args.source, &args.destination)? {
        (Side::Guest { name, path }, Side::Host(dest)) => (
            copy_out(engine, &name, &path, &dest, bounds).await?,
            shown(&dest),
        ),
        (Side::Host(src), Side::Guest { name, path }) => (
            copy_in(engine, &name, &src, &path, bounds).await?,
            format!("{name}:{path}"),
        ),
        _ => {
            return Err(Error::invalid(
                "one side of dynocap cp is NAME:PATH in a sandbox and the other a host path \
                 (a host path with a colon is written ./a:b)",
            ))
        }
    };
    for note in &report.notes {
        warnln!("dynocap: {note}");
    }
    if json {
        print_json(&serde_json::json!({
            "files": report.files,
            "directories": report.dirs,
            "symlinks": report.symlinks,
            "bytes": report.bytes,
            "skipped": report.notes,
        }));
    } else {
        warnln!(
            "dynocap: copied {} files, {} directories and {} symlinks ({} bytes) to {to}",
            report.files,
            report.dirs,
            report.symlinks,
            report.bytes,
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Clone, Copy)]
struct Bounds {
    bytes: u64,
    entries: u64,
}

#[derive(Debug, Default)]
struct Report {
    files: u64,
    dirs: u64,
    symlinks: u64,
    bytes: u64,
    entries: u64,
    notes: Vec<String>,
}

impl Report {
    /// Counts one more entry of the copy, refused past `bounds.entries`.
    fn count_entry(&mut self, bounds: Bounds) -> Result<(), Error> {
        self.entries += 1;
        if self.entries > bounds.entries {
            return Err(too_many(bounds));
        }
        Ok(())
    }

    /// Entries the copy may still make.
    fn room(&self, bounds: Bounds) -> u64 {
        bounds.entries.saturating_sub(self.entries)
    }
}

fn too_many(bounds: Bounds) -> Error {
    Error::invalid(format!(
        "the copy holds more than {} entries (the bound --max-entries sets); it stopped there",
        bounds.entries
    ))
}

/// A name from the guest that may be created on the host: one component, never `.` or `..`.
fn check_name(name: &str) -> Result<&str, Error> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.len() > MAX_NAME
    {
        return Err(Error::invalid(format!(
            "the guest named an entry {name:?}, which is not one plain file name; nothing \
             more is copied"
        )));
    }
    Ok(name)
}

fn host_error(doing: &str, path: &Path, errno: Errno) -> Error {
    let why = match errno {
        Errno::ELOOP => {
            "it is a symlink, which dynocap cp never follows inside a destination".to_owned()
        }
        errno => errno.desc().to_owned(),
    };
    Error::invalid(format!("{doing} {}: {why}", shown(path)))
}

/// A path in a message, quoted and with control characters escaped: it holds guest names,
/// which are hostile text on a terminal.
fn shown(path: &Path) -> String {
    format!("{path:?}")
}

fn guest_join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

async fn copy_out(
    engine: &Engine,
    name: &str,
    path: &str,
    dest: &Path,
    bounds: Bounds,
) -> Result<Report, Error> {
    if path.is_empty() {
        return Err(Error::invalid(EMPTY_GUEST_PATH));
    }
    // `SRC/.` copies the directory's contents rather than the directory.
    let contents_only = path == "." || path.ends_with("/.");
    let gpath = match path.strip_suffix("/.") {
        Some("") => "/",
        Some(dir) => dir,
        None => path,
    };
    let listed = engine
        .file(
            name,
            FileOp::List {
                path: gpath.to_owned(),
                depth: 1,
                offset: 0,
            },
        )
        .await;
    let is_dir = match &listed {
        Ok(_) => true,
        Err(list_err) => {
            if contents_only {
                return Err(list_err.clone());
            }
            // Not a directory, or unreadable: a read says which, in the guest's words.
            if let Err(read_err) = engine
                .file(
                    name,
                    FileOp::Read {
                        path: gpath.to_owned(),
                        offset: 0,
                        length: 0,
                    },
                )
                .await
            {
                return Err(if read_err.to_string().contains("is a directory") {
                    list_err.clone()
                } else {
                    read_err
                });
            }
            false
        }
    };
    let base = Path::new(gpath)
        .file_name()
        .and_then(OsStr::to_str)
        .unwrap_or("");
    let dest_meta = std::fs::metadata(dest);
    let named_dir = dest.as_os_str().to_string_lossy().ends_with('/');
    // The destination's parent and the name made in it; None: the copy fills `dest` itself.
    let (parent, made): (PathBuf, Option<String>) = match (&dest_meta, is_dir) {
        (Ok(meta), true) if meta.is_dir() && (contents_only || base.is_empty()) => {
            (dest.to_owned(), None)
        }
        (Ok(meta), _) if meta.is_dir() => (dest.to_owned(), Some(check_name(base)?.to_owned())),
        (Ok(_), true) => {
            return Err(Error::invalid(format!(
                "cannot copy a directory over the file {}",
                shown(dest)
            )))
        }
        (Err(err), _) if err.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::invalid(format!("{}: {err}", shown(dest))))
        }
        (Err(_), false) if named_dir => {
            return Err(Error::invalid(format!(
                "the destination directory {} does not exist",
                shown(dest)
            )))
        }
        _ => {
            let Some(last) = dest.file_name().and_then(OsStr::to_str) else {
                return Err(Error::invalid(format!(
                    "the destination {} names no file",
                    shown(dest)
                )));
            };
            let parent = match dest.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
                _ => PathBuf::from("."),
            };
            (parent, Some(check_name(last)?.to_owned()))
        }
    };
    // The destination the user named is followed as any path they give is; below it,
    // nothing is.
    let parent_fd = open(
        &parent,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| host_error("cannot open the destination", &parent, errno))?;
    let mut copy = Copy {
        engine,
        name,
        bounds,
        report: Report::default(),
    };
    match (made, is_dir) {
        (None, _) => {
            let Ok(FileResult::Listed {
                entries, left_off, ..
            }) = listed
            else {
                return Err(Error::internal("the listing of the source went missing"));
            };
            copy.fill_dir(parent_fd, &parent, gpath, entries, left_off)
                .await?;
        }
        (Some(made), true) => {
            let Ok(FileResult::Listed {
                entries, left_off, ..
            }) = listed
            else {
                return Err(Error::internal("the listing of the source went missing"));
            };
            let (fd, created) = make_dir(parent_fd.as_fd(), &made, &parent.join(&made))?;
            copy.report.dirs += 1;
            copy.fill_dir(fd, &parent.join(&made), gpath, entries, left_off)
                .await?;
            if created {
                // The guest's mode, set last so that a read-only directory could be filled.
                let mode = copy.mode_of(gpath, "dir").await.unwrap_or(0o755);
                finish_dir(parent_fd.as_fd(), &made, &parent.join(&made), mode)?;
            }
        }
        (Some(made), false) => {
            copy.count_entry()?;
            copy.file(parent_fd.as_fd(), &made, &parent.join(&made), gpath, None)
                .await?;
        }
    }
    Ok(copy.report)
}

/// One directory being filled: its descriptor, where it is, and what is left to copy in it.
struct Frame {
    fd: OwnedFd,
    host: PathBuf,
    guest: String,
    /// The page of its listing being copied (at most
    /// [`dynocap_engine::files::MAX_LIST_ENTRIES`] entries).
    entries: std::vec::IntoIter<FileEntry>,
    /// Where its next page starts, when the guest said more entries follow.
    next_page: Option<u64>,
    /// The subdirectory being filled, whose mode is set when it is done.
    pending: Option<(String, u32, bool)>,
}

struct Copy<'a> {
    engine: &'a Engine,
    name: &'a str,
    bounds: Bounds,
    report: Report,
}

impl Copy<'_> {
    fn count_entry(&mut self) -> Result<(), Error> {
        self.report.count_entry(self.bounds)
    }

    /// One page of the guest directory `gpath`'s entries, from `offset`, and how many follow.
    async fn list(&self, gpath: &str, offset: u64) -> Result<(Vec<FileEntry>, u64), Error> {
        match self
            .engine
            .file(
                self.name,
                FileOp::List {
                    path: gpath.to_owned(),
                    depth: 1,
                    offset,
                },
            )
            .await?
        {
            FileResult::Listed {
                entries, left_off, ..
            } => Ok((entries, left_off)),
            _ => Err(Error::internal(
                "the guest answered a listing with another result",
            )),
        }
    }

    /// Copies the guest directory `gpath` (whose first page of entries is `entries`, with
    /// `left_off` more) into the open host directory `fd`, depth first, holding one
    /// descriptor and one page of entries per level: a directory of any size is copied in
    /// bounded memory, and only `--max-entries` stops a copy.
    async fn fill_dir(
        &mut self,
        fd: OwnedFd,
        host: &Path,
        gpath: &str,
        entries: Vec<FileEntry>,
        left_off: u64,
    ) -> Result<(), Error> {
        let mut stack = vec![Frame {
            fd,
            host: host.to_owned(),
            guest: gpath.to_owned(),
            next_page: next_page(0, &entries, left_off),
            entries: entries.into_iter(),
            pending: None,
        }];
        loop {
            let depth = stack.len();
            let Some(frame) = stack.last_mut() else {
                break;
            };
            let Some(entry) = frame.entries.next() else {
                if let Some(offset) = frame.next_page {
                    let (entries, left_off) = self.list(&frame.guest, offset).await?;
                    if entries.is_empty() && left_off > 0 {
                        return Err(Error::invalid(format!(
                            "the guest listed no entries of {:?} from {offset} on, yet said \
                             {left_off} follow; nothing more is copied",
                            frame.guest
                        )));
                    }
                    frame.next_page = next_page(offset, &entries, left_off);
                    frame.entries = entries.into_iter();
                    continue;
                }
                stack.pop();
                if let Some(parent) = stack.last_mut() {
                    if let Some((made, mode, true)) = parent.pending.take() {
                        finish_dir(parent.fd.as_fd(), &made, &parent.host.join(&made), mode)?;
                    }
                }
                continue;
            };
            self.count_entry()?;
            let name = check_name(&entry.name)?.to_owned();
            let host_path = frame.host.join(&name);
            if entry.not_utf8 {
                // Its name as listed is not its name in the guest (or its target is not its
                // target): nothing can be read or made faithfully under it.
                self.report.notes.push(format!(
                    "skipped {}: its guest name or symlink target is not UTF-8, which dynocap \
                     cp does not copy",
                    shown(&host_path)
                ));
                continue;
            }
            let guest_path = guest_join(&frame.guest, &name);
            match entry.kind.as_str() {
                "file" => {
                    self.file(
                        frame.fd.as_fd(),
                        &name,
                        &host_path,
                        &guest_path,
                        Some(entry.mode),
                    )
                    .await?;
                }
                "dir" => {
                    if depth >= MAX_DEPTH {
                        return Err(Error::invalid(format!(
                            "{} is more than {MAX_DEPTH} directories deep; dynocap cp stops there",
                            shown(&host_path)
                        )));
                    }
                    let (sub, created) = make_dir(frame.fd.as_fd(), &name, &host_path)?;
                    self.report.dirs += 1;
                    frame.pending = Some((name, entry.mode, created));
                    let (entries, left_off) = self.list(&guest_path, 0).await?;
                    stack.push(Frame {
                        fd: sub,
                        host: host_path,
                        guest: guest_path,
                        next_page: next_page(0, &entries, left_off),
                        entries: entries.into_iter(),
                        pending: None,
                    });
                }
                "symlink" => {
                    let Some(target) = entry.target.filter(|t| !t.is_empty() && !t.contains('\0'))
                    else {
                        return Err(Error::invalid(format!(
                            "the guest gave the symlink {} no usable target",
                            shown(&host_path)
                        )));
                    };
                    // The target is data: the link is made, never followed or resolved.
                    symlinkat(target.as_str(), frame.fd.as_fd(), name.as_str()).map_err(
                        |errno| host_error("cannot create the symlink", &host_path, errno),
                    )?;
                    self.report.symlinks += 1;
                }
                _ => self.report.notes.push(format!(
                    "skipped {}: a device, FIFO or socket, which dynocap cp does not copy",
                    shown(&host_path)
                )),
            }
        }
        Ok(())
    }

    /// Copies the guest file `gpath` to `name` in `dir`, in reads of at most [`MAX_READ`]
    /// bytes, and gives it `mode` without set-id bits (the guest's, when not given). The bytes
    /// go to a new file beside `name`, renamed over it once whole: a copy that stops (a bound,
    /// the sandbox gone) leaves a file already there as it was, and no part of the new one.
    async fn file(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &str,
        host: &Path,
        gpath: &str,
        mode: Option<u32>,
    ) -> Result<(), Error> {
        // Something already there is replaced only when it is a plain file.
        let existing = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if !is_type(st.st_mode, SFlag::S_IFREG) => {
                return Err(Error::invalid(format!(
                    "{} exists and is not a plain file (a symlink, directory or device); \
                     dynocap cp does not write through or over it",
                    shown(host)
                )))
            }
            Ok(st) => Some(st),
            Err(Errno::ENOENT) => None,
            Err(errno) => return Err(host_error("cannot look at", host, errno)),
        };
        let temp = PartialFile::create(dir, host)?;
        let mut out = File::from(
            temp.fd
                .try_clone()
                .map_err(|err| Error::invalid(format!("cannot write {}: {err}", shown(host))))?,
        );
        let mut offset = 0u64;
        let mut guest_mode = mode;
        loop {
            let result = self
                .engine
                .file(
                    self.name,
                    FileOp::Read {
                        path: gpath.to_owned(),
                        offset,
                        length: MAX_READ,
                    },
                )
                .await?;
            let FileResult::Read {
                data, total_size, ..
            } = result
            else {
                return Err(Error::internal(
                    "the guest answered a read with another result",
                ));
            };
            if data.is_empty() {
                break;
            }
            self.report.bytes = self.report.bytes.saturating_add(data.len() as u64);
            if self.report.bytes > self.bounds.bytes {
                return Err(Error::invalid(format!(
                    "the copy is larger than {} bytes (the bound --max-bytes sets); it stopped \
                     at {}, which was left as it was",
                    self.bounds.bytes,
                    shown(host)
                )));
            }
            out.write_all(&data)
                .map_err(|err| Error::invalid(format!("cannot write {}: {err}", shown(host))))?;
            offset += data.len() as u64;
            if offset >= total_size {
                break;
            }
        }
        if guest_mode.is_none() {
            guest_mode = self.mode_of(gpath, "file").await;
        }
        let mode = guest_mode.unwrap_or(0o644) & 0o777;
        fchmod(out.as_fd(), Mode::from_bits_truncate(mode))
            .map_err(|errno| host_error("cannot set the mode of", host, errno))?;
        if let Some(st) = existing {
            // The file it replaces keeps its owner where this user may give it (root may).
            let _ = fchown(
                out.as_fd(),
                Some(Uid::from_raw(st.st_uid)),
                Some(Gid::from_raw(st.st_gid)),
            );
        }
        temp.install(name)?;
        self.report.files += 1;
        Ok(())
    }

    /// The mode of a named source of `kind`, from a listing of its directory; None when it
    /// is not listed there (a directory too large to list whole).
    async fn mode_of(&self, gpath: &str, kind: &str) -> Option<u32> {
        let path = Path::new(gpath);
        let base = path.file_name()?.to_str()?;
        let dir = match path.parent()?.to_str()? {
            "" => ".",
            dir => dir,
        };
        // A page cap, since the guest says how many follow: 100 pages are the 200,000 entries
        // the agent's walk reads at most.
        let mut offset = Some(0);
        for _ in 0..100 {
            let from = offset?;
            let (entries, left_off) = self.list(dir, from).await.ok()?;
            offset = next_page(from, &entries, left_off);
            if let Some(entry) = entries
                .into_iter()
                .find(|entry| entry.name == base && entry.kind == kind)
            {
                return Some(entry.mode);
            }
        }
        None
    }
}

/// Where the page after `entries` (listed from `offset`) starts, when `left_off` more follow.
/// A file being copied out, under a name of its own in the destination's directory until
/// [`PartialFile::install`] renames it over its real name; removed when dropped before.
struct PartialFile<'a> {
    dir: BorrowedFd<'a>,
    fd: OwnedFd,
    name: String,
    host: PathBuf,
    installed: bool,
}

impl<'a> PartialFile<'a> {
    /// A new file in `dir` (`host` is the name it will have, for messages), made exclusively,
    /// so nothing there is opened or written through.
    fn create(dir: BorrowedFd<'a>, host: &Path) -> Result<Self, Error> {
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = format!(
            ".dynocap-cp-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let fd = openat(
            dir,
            name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|errno| host_error("cannot create", host, errno))?;
        Ok(Self {
            dir,
            fd,
            name,
            host: host.to_owned(),
            installed: false,
        })
    }

    /// Renames the whole file over `name`: the entry there (a plain file, checked before; a
    /// rename never writes through a link swapped in since) is replaced at once.
    fn install(mut self, name: &str) -> Result<(), Error> {
        renameat(self.dir, self.name.as_str(), self.dir, name)
            .map_err(|errno| host_error("cannot put in place", &self.host, errno))?;
        self.installed = true;
        Ok(())
    }
}

impl Drop for PartialFile<'_> {
    fn drop(&mut self) {
        if !self.installed {
            let _ = unlinkat(self.dir, self.name.as_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

fn next_page(offset: u64, entries: &[FileEntry], left_off: u64) -> Option<u64> {
    (left_off > 0).then(|| offset + entries.len() as u64)
}

fn is_type(mode: u32, kind: SFlag) -> bool {
    mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// Makes (or enters, when a real directory is already there) the directory `name` in `dir`;
/// a symlink there is refused, never followed. Says whether it made it.
fn make_dir(dir: BorrowedFd<'_>, name: &str, host: &Path) -> Result<(OwnedFd, bool), Error> {
    let created = match mkdirat(dir, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(errno) => return Err(host_error("cannot create the directory", host, errno)),
    };
    let fd = openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| match errno {
        Errno::ENOTDIR | Errno::ELOOP => Error::invalid(format!(
            "{} exists and is not a directory (or is a symlink); dynocap cp does not write \
             through or over it",
            shown(host)
        )),
        errno => host_error("cannot open", host, errno),
    })?;
    Ok((fd, created))
}

/// Gives a directory the copy made its guest mode without set-id bits.
fn finish_dir(dir: BorrowedFd<'_>, name: &str, host: &Path, mode: u32) -> Result<(), Error> {
    let fd = openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| host_error("cannot open", host, errno))?;
    fchmod(&fd, Mode::from_bits_truncate(mode & 0o1777))
        .map_err(|errno| host_error("cannot set the mode of", host, errno))
}

/// Copies the host file or directory `src` (the user's own; a symlink is followed only when
/// it is `src` itself) into the sandbox `name` at `gdest`, as the sandbox user: each entry
/// is one [`FileOp::Put`], which the agent makes without following a symlink below the
/// destination.
async fn copy_in(
    engine: &Engine,
    name: &str,
    src: &Path,
    gdest: &str,
    bounds: Bounds,
) -> Result<Report, Error> {
    if gdest.is_empty() {
        return Err(Error::invalid(EMPTY_GUEST_PATH));
    }
    let src_text = src.as_os_str().to_string_lossy();
    let contents_only = src_text == "." || src_text.ends_with("/.");
    let meta =
        std::fs::metadata(src).map_err(|err| Error::invalid(format!("{}: {err}", shown(src))))?;
    if !meta.is_dir() && !meta.is_file() {
        return Err(Error::invalid(format!(
            "{} is neither a file nor a directory",
            shown(src)
        )));
    }
    let listed = engine
        .file(
            name,
            FileOp::List {
                path: gdest.to_owned(),
                depth: 1,
                offset: 0,
            },
        )
        .await;
    let dest_is_dir = listed.is_ok();
    let base = src.file_name().and_then(OsStr::to_str).unwrap_or("");
    let (root, made) = if dest_is_dir && meta.is_dir() && (contents_only || base.is_empty()) {
        (gdest.to_owned(), None)
    } else if dest_is_dir {
        (gdest.to_owned(), Some(check_name(base)?.to_owned()))
    } else {
        if gdest.ends_with('/') && !meta.is_dir() {
            // The guest's own words say which: missing, or not a directory.
            let why = listed.err().map(|err| err.message).unwrap_or_default();
            return Err(Error::invalid(format!(
                "the destination {name}:{gdest} ends with / but is no directory to copy \
                 into: {why}"
            )));
        }
        let path = Path::new(gdest.trim_end_matches('/'));
        let last = path.file_name().and_then(OsStr::to_str).unwrap_or("");
        let parent = match path.parent().and_then(Path::to_str) {
            Some("") | None if gdest.starts_with('/') => "/",
            Some("") | None => ".",
            Some(parent) => parent,
        };
        (parent.to_owned(), Some(check_name(last)?.to_owned()))
    };
    let mut copy = CopyIn {
        engine,
        name,
        root,
        bounds,
        report: Report::default(),
    };
    match made {
        None => copy.fill_dir(src, "").await?,
        Some(made) if meta.is_dir() => {
            let created = copy.put_dir(&made, None).await?;
            copy.fill_dir(src, &made).await?;
            if created {
                copy.put_dir(&made, Some(meta.mode())).await?;
            }
        }
        // The source named is followed as any path typed is (the docs say so of both ways).
        Some(made) => {
            use std::os::unix::fs::OpenOptionsExt as _;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(src)
                .map_err(|err| Error::invalid(format!("cannot open {}: {err}", shown(src))))?;
            copy.file(file, src, &made).await?
        }
    }
    Ok(copy.report)
}

struct CopyIn<'a> {
    engine: &'a Engine,
    name: &'a str,
    /// The guest directory every entry is made under.
    root: String,
    bounds: Bounds,
    report: Report,
}

fn rel_join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_owned()
    } else {
        format!("{rel}/{name}")
    }
}

impl CopyIn<'_> {
    fn count_entry(&mut self) -> Result<(), Error> {
        self.report.count_entry(self.bounds)
    }

    async fn put(&self, rel: &str, item: PutItem) -> Result<FileResult, Error> {
        self.engine
            .file(
                self.name,
                FileOp::Put {
                    path: self.root.clone(),
                    rel: rel.to_owned(),
                    item,
                },
            )
            .await
    }

    /// Makes (or enters) the guest directory `rel`, or sets its mode: whether it made it.
    async fn put_dir(&mut self, rel: &str, mode: Option<u32>) -> Result<bool, Error> {
        if mode.is_none() {
            self.count_entry()?;
            self.report.dirs += 1;
        }
        let result = self
            .put(
                rel,
                PutItem::Dir {
                    mode: mode.map(|m| m & 0o1777),
                },
            )
            .await?;
        Ok(matches!(result, FileResult::Written { created: true, .. }))
    }

    /// Copies the entries of the host directory `dir` into the guest directory `rel`, depth
    /// first; symlinks are copied as symlinks, anything but files, directories and symlinks
    /// is skipped with a note. `dir` (named by the user) is opened as any path is; below it
    /// every entry is looked at, opened and descended into relative to its directory's
    /// descriptor without following a symlink, so a directory swapped for a symlink while the
    /// copy runs is not followed out of the tree (docker cp's CVE-2018-15664 the other way
    /// round).
    async fn fill_dir(&mut self, dir: &Path, rel: &str) -> Result<(), Error> {
        // Each level: its descriptor, its host path (for messages), its guest path, its
        // entries left, and the directory made below it whose mode is set once it is filled.
        type Level = (
            OwnedFd,
            PathBuf,
            String,
            std::vec::IntoIter<std::ffi::OsString>,
            Option<(String, u32)>,
        );
        let top = open(
            dir,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| host_error("cannot open", dir, errno))?;
        let entries = self.sorted_entries(&top, dir)?;
        let mut stack: Vec<Level> = vec![(
            top,
            dir.to_owned(),
            rel.to_owned(),
            entries.into_iter(),
            None,
        )];
        loop {
            let depth = stack.len();
            let Some((fd, host, rel, entries, _)) = stack.last_mut() else {
                break;
            };
            let Some(name) = entries.next() else {
                stack.pop();
                if let Some((_, _, _, _, pending)) = stack.last_mut() {
                    if let Some((made, mode)) = pending.take() {
                        self.put_dir(&made, Some(mode)).await?;
                    }
                }
                continue;
            };
            let path = host.join(&name);
            let rel = rel.clone();
            let Some(name) = name.to_str() else {
                self.report
                    .notes
                    .push(format!("skipped {}: its name is not UTF-8", shown(&path)));
                continue;
            };
            let child = rel_join(&rel, check_name(name)?);
            let st = fstatat(&*fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|errno| host_error("cannot look at", &path, errno))?;
            if is_type(st.st_mode, SFlag::S_IFDIR) {
                if depth >= MAX_DEPTH {
                    return Err(Error::invalid(format!(
                        "{} is more than {MAX_DEPTH} directories deep; dynocap cp stops there",
                        shown(&path)
                    )));
                }
                let sub = openat(
                    &*fd,
                    name,
                    OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|errno| host_error("cannot open", &path, errno))?;
                let created = self.put_dir(&child, None).await?;
                let entries = self.sorted_entries(&sub, &path)?;
                if let Some(level) = stack.last_mut() {
                    level.4 = created.then(|| (child.clone(), st.st_mode & 0o7777));
                }
                stack.push((sub, path, child, entries.into_iter(), None));
            } else if is_type(st.st_mode, SFlag::S_IFREG) {
                let file = openat(
                    &*fd,
                    name,
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|errno| host_error("cannot open", &path, errno))?;
                self.file(File::from(file), &path, &child).await?;
            } else if is_type(st.st_mode, SFlag::S_IFLNK) {
                self.count_entry()?;
                let target = nix::fcntl::readlinkat(&*fd, name)
                    .map_err(|errno| host_error("cannot read the symlink", &path, errno))?;
                let Some(target) = target.to_str() else {
                    self.report
                        .notes
                        .push(format!("skipped {}: its target is not UTF-8", shown(&path)));
                    continue;
                };
                self.put(
                    &child,
                    PutItem::Symlink {
                        target: target.to_owned(),
                    },
                )
                .await?;
                self.report.symlinks += 1;
            } else {
                self.report.notes.push(format!(
                    "skipped {}: a device, FIFO or socket, which dynocap cp does not copy",
                    shown(&path)
                ));
            }
        }
        Ok(())
    }

    /// Sends the open host file `file` (at `path`, for messages) to the guest file `rel` in
    /// pieces of at most [`MAX_WRITE`] bytes; its mode (without set-id bits) goes with the last
    /// piece.
    async fn file(&mut self, mut file: File, path: &Path, rel: &str) -> Result<(), Error> {
        use std::io::Read as _;
        self.count_entry()?;
        let meta = file
            .metadata()
            .map_err(|err| Error::invalid(format!("{}: {err}", shown(path))))?;
        if !meta.is_file() {
            return Err(Error::invalid(format!(
                "{} is not a plain file",
                shown(path)
            )));
        }
        let mode = meta.mode() & 0o777;
        let mut offset = 0u64;
        loop {
            let mut piece = Vec::with_capacity(MAX_WRITE);
            (&mut file)
                .take(MAX_WRITE as u64)
                .read_to_end(&mut piece)
                .map_err(|err| Error::invalid(format!("cannot read {}: {err}", shown(path))))?;
            let last = piece.len() < MAX_WRITE;
            self.report.bytes = self.report.bytes.saturating_add(piece.len() as u64);
            if self.report.bytes > self.bounds.bytes {
                return Err(Error::invalid(format!(
                    "the copy is larger than {} bytes (the bound --max-bytes sets); it stopped \
                     in {}",
                    self.bounds.bytes,
                    shown(path)
                )));
            }
            let len = piece.len() as u64;
            self.put(
                rel,
                PutItem::File {
                    content: piece,
                    offset,
                    mode: last.then_some(mode),
                },
            )
            .await?;
            offset += len;
            if last {
                break;
            }
        }
        self.report.files += 1;
        Ok(())
    }
}

/// A host directory's entries, in name order.
impl CopyIn<'_> {
    /// The entries of the open host directory `dir` (at `path`, for messages), sorted: read
    /// whole (to sort them), so a directory with more entries than the copy may still make is
    /// refused as it is read, before the copy's memory grows past its bound.
    fn sorted_entries(&self, dir: &OwnedFd, path: &Path) -> Result<Vec<std::ffi::OsString>, Error> {
        use std::os::unix::ffi::OsStrExt as _;
        let room = self.report.room(self.bounds);
        let listing_error = |errno: Errno| host_error("cannot list", path, errno);
        let mut reader = nix::dir::Dir::from_fd(
            dir.try_clone()
                .map_err(|err| Error::invalid(format!("cannot list {}: {err}", shown(path))))?,
        )
        .map_err(listing_error)?;
        let mut entries = Vec::new();
        for entry in reader.iter() {
            let entry = entry.map_err(listing_error)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if entries.len() as u64 >= room {
                return Err(too_many(self.bounds));
            }
            entries.push(OsStr::from_bytes(name).to_owned());
        }
        entries.sort();
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_and_names() {
        assert_eq!(
            side("box:/etc/hosts"),
            Side::Guest {
                name: "box".into(),
                path: "/etc/hosts".into()
            }
        );
        assert_eq!(side("./a:b"), Side::Host(PathBuf::from("./a:b")));
        assert_eq!(side("/x"), Side::Host(PathBuf::from("/x")));
        assert_eq!(side(":x"), Side::Host(PathBuf::from(":x")));
        // docker cp's tar stream is refused, not taken for a file named "-"; ./- is one.
        for (source, destination) in [("-", "box:/tmp"), ("box:/etc/hosts", "-")] {
            let err = sides(source, destination).err().map(|e| e.to_string());
            assert!(
                err.as_deref().unwrap_or_default().contains("tar archive"),
                "{err:?}"
            );
        }
        assert!(matches!(
            sides("box:/etc/hosts", "./-"),
            Ok((Side::Guest { .. }, Side::Host(_)))
        ));
        for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&"x".repeat(256)).is_err());
        assert!(check_name("ok .name").is_ok());
    }

    #[test]
    fn an_existing_symlink_is_neither_entered_nor_written_through() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap_or_else(|e| panic!("{e}"));
        let inside = dir.path().join("in");
        std::fs::create_dir(&inside).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&outside, inside.join("d")).unwrap_or_else(|e| panic!("{e}"));
        let fd = open(&inside, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty())
            .unwrap_or_else(|e| panic!("{e}"));
        let err = make_dir(fd.as_fd(), "d", &inside.join("d"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("not a directory (or is a symlink)"), "{err}");
        assert!(finish_dir(fd.as_fd(), "d", &inside.join("d"), 0o777).is_err());
        let (sub, created) =
            make_dir(fd.as_fd(), "new", &inside.join("new")).unwrap_or_else(|e| panic!("{e}"));
        assert!(created);
        drop(sub);
        assert!(std::fs::read_dir(&outside)
            .unwrap_or_else(|e| panic!("{e}"))
            .next()
            .is_none());
    }
}
