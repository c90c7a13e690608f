//! Reading a local project for import (host side; the guest's agent unpacks what this writes).
//!
//! Three steps, each a function:
//!
//! 1. [`plan`] resolves the project directory once, decides whether it is a git work tree, and
//!    lists what comes: for a git work tree, the files git tracks plus the untracked files it
//!    does not ignore (`git ls-files --cached --others --exclude-standard`), with submodules
//!    and nested repositories listed by their own git; otherwise every file of the tree. No
//!    file content is read yet.
//! 2. [`write_tar`] reads the listed files *now* — the copy is the state at that moment — and
//!    writes a tar stream (GNU format, no pax) for the guest to unpack.
//! 3. [`write_bundle`] writes the chosen git history as a bundle file.
//!
//! The project may have been prepared by a hostile party (a cloned repository, or a tree a
//! prompt-injected agent wrote). So: git runs hardened ([`crate::host::hardened_git`]) and only as
//! plumbing that runs no program the repository names; git's output only ever names paths,
//! and every path is opened from a descriptor of the project root, beneath it, with no symlink
//! resolved anywhere (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`). Git itself reads
//! only beneath the root too: before it runs on a work tree, `gitdir` checks that the git
//! directory (and where a `.git` file or `commondir` points) lies beneath the root, holds no
//! symlink and names no alternates, and git starts in the work tree's descriptor, not a path.
//! The root is opened once ([`ProjectDir`], or [`plan`] here): whoever checked that descriptor
//! checked what is imported. Symlinks come as symlinks, whatever they point to; a `.git` (file
//! or directory, at any depth) never comes.

mod beneath;
mod gitdir;
mod tarball;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat};

use crate::host::hardened_git::{GitError, HardenedGit};
use beneath::{Kind, Probe, Resolver};

pub use crate::model::import_notes::{History, Note, NoteKind, Special};
pub use tarball::{write_tar, TarSummary};

/// Knobs of [`plan_with`]; [`plan`] uses the defaults. The plan keeps them for
/// [`write_bundle`].
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// The git binary (default: `git` in `PATH`).
    pub git: Option<OsString>,
    /// An ignore file applied on top of the repository's own rules (`core.excludesFile`). The
    /// import reads no global git config, so the user's global ignore file only counts if the
    /// caller names it here (e.g. `~/.config/git/ignore` of the user who asked).
    pub excludes_file: Option<PathBuf>,
    /// Longest any one git command may run (a crafted repository can make git block).
    /// Default: [`GIT_TIMEOUT`].
    pub git_timeout: Duration,
}

/// Default for [`PlanOptions::git_timeout`]: long enough to bundle a very large repository.
pub const GIT_TIMEOUT: Duration = Duration::from_secs(600);

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            git: None,
            excludes_file: None,
            git_timeout: GIT_TIMEOUT,
        }
    }
}

/// What an import of one project brings, as listed by [`plan`].
#[derive(Debug)]
pub struct ImportPlan {
    /// The project directory, canonical (every symlink in the given path resolved, once).
    pub root: PathBuf,
    /// The root is a git work tree (its `.git` is a directory or a `.git` file git accepts).
    pub is_git: bool,
    /// The history that will come: the one asked for, or [`History::None`] when the project is
    /// not a git repository or has nothing to bundle (no commit yet).
    pub history: History,
    /// Regular files and symlinks listed.
    pub files: u64,
    /// Their sizes (a symlink counts its target's length).
    pub bytes: u64,
    /// Things found but left out, and why.
    pub notes: Vec<Note>,
    /// The files that come untracked (git does not track them, nor ignore them) under the
    /// table of generated files ([`dynocap_review::generated`]), such as the `__pycache__/`
    /// of a local test run, and the directories between each and its generated directory:
    /// the project does not own them, so the task's changes to them are generated too.
    /// Sorted; empty for a plain tree.
    pub untracked_generated: Vec<String>,
    /// Sorted by path bytes, so a directory precedes what it holds; unique.
    entries: Vec<Entry>,
    /// The root, opened once (`O_PATH`): every later read resolves beneath this descriptor.
    root_fd: OwnedFd,
    resolver: Resolver,
    options: PlanOptions,
}

impl ImportPlan {
    /// What comes, sorted by path.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
}

/// One thing that comes: a path relative to the project root, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: PathBuf,
    pub kind: EntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file; `size` as listed (the archive has the size at reading time).
    File { executable: bool, size: u64 },
    /// A symlink and its target, byte for byte (as listed; the archive has it as read).
    Symlink { target: PathBuf },
    /// A directory that comes even if empty (plain trees, submodule directories). Parents of
    /// other entries come anyway.
    Dir,
}

/// Why an import step failed. Messages name the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("project path {} does not exist", .0.display())]
    NotFound(PathBuf),
    #[error("{} is not a directory; give the project's root directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("cannot read {}: {source}; check that the user running dynocap may read it", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{} is a git repository, and importing it needs git: {source}", root.display())]
    GitMissing { root: PathBuf, source: GitError },
    #[error(
        "{} is a git repository that git cannot read: {source}; run `git status` there to see \
         why, or remove its .git to import it as plain files",
        root.display()
    )]
    Git { root: PathBuf, source: GitError },
    #[error("cannot write the history bundle {}: {source}; check the directory is writable and has space", path.display())]
    Bundle { path: PathBuf, source: GitError },
    #[error(
        "{} points to {target}, which is not a directory beneath the project {} reached \
         without symlinks; the import only reads git data inside the project. Import the \
         repository it points to instead, or remove the file to import the files alone",
        file.display(), root.display()
    )]
    GitOutside {
        file: PathBuf,
        target: String,
        root: PathBuf,
    },
    #[error(
        "{} names other object stores (git alternates), which the import never reads; run \
         `git repack -a -d` and remove the file, or import a clone made without --shared",
        .0.display()
    )]
    Alternates(PathBuf),
    #[error("{} {why}; the import refuses this git directory", path.display())]
    GitLayout { path: PathBuf, why: String },
    #[error("{} already exists; give write_bundle an empty directory", .0.display())]
    BundleExists(PathBuf),
    #[error("writing the import stream failed: {0}")]
    Write(io::Error),
    #[error("internal error: refusing to put {0:?} into the archive: not a plain relative path")]
    UnsafePath(PathBuf),
    /// A fault a test injected ([`crate::foundation::failpoint`]).
    #[error("{0}")]
    Fault(crate::foundation::error::Error),
}

impl From<ImportError> for crate::foundation::error::Error {
    fn from(err: ImportError) -> Self {
        match err {
            ImportError::NotFound(_)
            | ImportError::NotADirectory(_)
            | ImportError::GitOutside { .. }
            | ImportError::Alternates(_)
            | ImportError::GitLayout { .. } => Self::invalid(err.to_string()),
            ImportError::Git {
                source: GitError::TimedOut { .. },
                ..
            }
            | ImportError::Bundle {
                source: GitError::TimedOut { .. },
                ..
            } => Self::timeout(err.to_string()),
            ImportError::Fault(err) => err,
            _ => Self::internal(err.to_string()),
        }
    }
}

/// A project directory opened once (`O_PATH | O_DIRECTORY`, symlinks in the given path
/// resolved by that one open). Whoever checks the project checks this descriptor's path, and
/// the import reads through the descriptor: a path renamed or swapped for a symlink after the
/// open changes neither what was checked nor what is imported.
#[derive(Debug)]
pub struct ProjectDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl ProjectDir {
    /// Opens `path` (absolute). Errors name the path: missing, not a directory, unreadable.
    pub fn open(path: &Path) -> Result<Self, ImportError> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|err| match err {
            Errno::ENOENT => ImportError::NotFound(path.to_path_buf()),
            Errno::ENOTDIR => ImportError::NotADirectory(path.to_path_buf()),
            err => ImportError::Read {
                path: path.to_path_buf(),
                source: err.into(),
            },
        })?;
        let path = descriptor_path(fd.as_fd()).map_err(|source| ImportError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self { fd, path })
    }

    /// Where the directory was when opened, every symlink resolved (the kernel's name for it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// Nested repositories (submodules of submodules, …) deeper than this are left out.
const MAX_NESTING: usize = 16;

/// Lists what an import of `project` brings; see [`plan_with`].
pub fn plan(project: &Path, history: History) -> Result<ImportPlan, ImportError> {
    plan_with(project, history, &PlanOptions::default())
}

/// Resolves `project` (an existing directory; symlinks in the path are resolved here, once,
/// and the directory is opened: everything later reads through that descriptor) and lists
/// what comes. Reads no file content.
pub fn plan_with(
    project: &Path,
    history: History,
    options: &PlanOptions,
) -> Result<ImportPlan, ImportError> {
    plan_resolving(project, history, options, Resolver::Auto)
}

fn plan_resolving(
    project: &Path,
    history: History,
    options: &PlanOptions,
    resolver: Resolver,
) -> Result<ImportPlan, ImportError> {
    let root = project
        .canonicalize()
        .map_err(|err| match err.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => ImportError::NotFound(project.to_path_buf()),
            _ => ImportError::Read {
                path: project.to_path_buf(),
                source: err,
            },
        })?;
    let root_fd = open_root(&root).map_err(|err| match err {
        Errno::ENOTDIR => ImportError::NotADirectory(project.to_path_buf()),
        Errno::ENOENT => ImportError::NotFound(project.to_path_buf()),
        err => ImportError::Read {
            path: root.clone(),
            source: err.into(),
        },
    })?;
    plan_from(root_fd, root, history, options, resolver)
}

/// Lists what an import of the directory `dir` brings: a descriptor (`O_PATH |
/// O_DIRECTORY` is enough) that whoever checked the project opened, once. Nothing names the
/// project by path any more: its path (for messages and the task's source) is read from the
/// descriptor, and every read and every git goes through it, so the directory that was
/// checked is the one imported, whatever is renamed or swapped meanwhile.
pub fn plan_dir(
    dir: OwnedFd,
    history: History,
    options: &PlanOptions,
) -> Result<ImportPlan, ImportError> {
    let root = descriptor_path(dir.as_fd()).map_err(|source| ImportError::Read {
        path: PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())),
        source,
    })?;
    let stat = fstat(&dir).map_err(|err| ImportError::Read {
        path: root.clone(),
        source: err.into(),
    })?;
    if beneath::kind_of(&stat) != Kind::Dir {
        return Err(ImportError::NotADirectory(root));
    }
    plan_from(dir, root, history, options, Resolver::Auto)
}

/// The path the kernel has for an open descriptor (what `/proc/self/fd/N` links to).
pub fn descriptor_path(fd: BorrowedFd<'_>) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn plan_from(
    root_fd: OwnedFd,
    root: PathBuf,
    history: History,
    options: &PlanOptions,
    resolver: Resolver,
) -> Result<ImportPlan, ImportError> {
    let mut lister = Lister {
        root: &root,
        root_fd: &root_fd,
        options,
        resolver,
        entries: BTreeMap::new(),
        notes: Vec::new(),
        untracked_generated: std::collections::BTreeSet::new(),
        visited: HashSet::new(),
    };
    let is_git = if lister.has_git(b"") {
        gitdir::check(root_fd.as_fd(), &root, b"", resolver)?;
        let git = hardened(options, root_fd.as_fd());
        check_repo(&git).map_err(|source| git_error(&root, source))?;
        let listing = ls_files(&git).map_err(|source| git_error(&root, source))?;
        lister.add_listing(&listing, &[], 0)?;
        true
    } else {
        lister.list_plain(Vec::new())?;
        false
    };
    let history = if is_git {
        effective_history(&hardened(options, root_fd.as_fd()), history)
            .map_err(|source| git_error(&root, source))?
    } else {
        History::None
    };

    let Lister {
        entries,
        notes,
        untracked_generated,
        ..
    } = lister;
    let (mut files, mut bytes) = (0u64, 0u64);
    let entries: Vec<Entry> = entries
        .into_iter()
        .map(|(path, kind)| {
            match &kind {
                EntryKind::File { size, .. } => {
                    files += 1;
                    bytes = bytes.saturating_add(*size);
                }
                EntryKind::Symlink { target } => {
                    files += 1;
                    bytes = bytes.saturating_add(len_u64(target.as_os_str().len()));
                }
                EntryKind::Dir => {}
            }
            Entry {
                path: PathBuf::from(OsString::from_vec(path)),
                kind,
            }
        })
        .collect();
    Ok(ImportPlan {
        root,
        is_git,
        history,
        files,
        bytes,
        notes,
        untracked_generated: untracked_generated.into_iter().collect(),
        entries,
        root_fd,
        resolver,
        options: options.clone(),
    })
}

/// Writes the history `plan.history` asks for as a git bundle at `dir/history.bundle` and
/// returns its path; `None` when no history comes. `dir` must be a directory only the caller
/// writes to (a fresh temporary directory). Git makes the bundle from the repository's own
/// object store (for a linked worktree, the main repository's), with only the chosen refs and
/// what they reach: never the stash, reflogs, remote-tracking refs, tags, or unreachable
/// objects.
///
/// - [`History::Branches`]: every `refs/heads/*`, plus `HEAD` if it names a commit.
/// - [`History::Head`]: `HEAD`, plus the branch it is on (if not detached).
pub fn write_bundle(plan: &ImportPlan, dir: &Path) -> Result<Option<PathBuf>, ImportError> {
    if !plan.is_git || plan.history == History::None {
        return Ok(None);
    }
    let path = dir.join("history.bundle");
    match path.symlink_metadata() {
        Ok(_) => return Err(ImportError::BundleExists(path)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(ImportError::Read { path, source: err }),
    }
    let git = hardened(&plan.options, plan.root_fd.as_fd());
    let git_err = |source| git_error(&plan.root, source);
    let head = head_commit(&git).map_err(git_err)?;
    let mut revs: Vec<OsString> = Vec::new();
    match plan.history {
        History::Branches => {
            revs.push("--branches".into());
            if head {
                revs.push("HEAD".into());
            }
        }
        History::Head => {
            if !head {
                return Ok(None);
            }
            revs.push("HEAD".into());
            if let Some(branch) = head_branch(&git).map_err(git_err)? {
                revs.push(branch);
            }
        }
        History::None => return Ok(None),
    }
    let bundle_error = |source| ImportError::Bundle {
        path: path.clone(),
        source,
    };
    // The bundle only crosses to the guest on this machine, where CPU is scarcer than bytes.
    // Objects already packed in the project are copied as they are, deltas included; loose
    // ones are deflated with fast zlib and stored whole, without a delta search. At the
    // defaults (level 6, a window of 10) a freshly committed 21 MB tree took 1.1 s to bundle;
    // level 1 brought that to 0.59 s, and no delta search to 0.30 s (for a bundle of 6.6 MB
    // instead of 3.4), all of it on the start's critical path.
    let packing = git
        .config("pack.compression", "1")
        .config("pack.window", "0")
        .args(["bundle", "create", "--quiet"])
        .arg(&path)
        .args(revs)
        .spawn()
        .map_err(bundle_error)?;
    // Fault tests stop or kill the supervisor here, while git packs (an error drops `packing`,
    // which kills git).
    crate::foundation::failpoint::hit("import.bundle-packing").map_err(ImportError::Fault)?;
    packing.finish().map_err(bundle_error)?;
    Ok(Some(path))
}

/// Largest `info/exclude` taken to the guest: far above any hand-written one.
const MAX_LOCAL_EXCLUDES: u64 = 1024 * 1024;

/// The repository's own ignore rules kept in its git directory (`info/exclude`, found as
/// git finds it), which the listing honoured: handed to the guest, they keep a file the
/// project ignores so out of the task's patch when the task makes one, as a `.gitignore`'s
/// rules do. `None` when the project is not a git work tree or has no such file; one that
/// cannot be read, is larger than [`MAX_LOCAL_EXCLUDES`] or is not UTF-8 is left behind,
/// and said why (the caller logs it).
pub fn local_excludes(plan: &ImportPlan) -> Result<Option<String>, String> {
    use std::io::Read as _;
    if !plan.is_git {
        return Ok(None);
    }
    let out = hardened(&plan.options, plan.root_fd.as_fd())
        .args(["rev-parse", "--git-path", "info/exclude"])
        .run()
        .map_err(|err| format!("cannot locate info/exclude: {err}"))?;
    let path = out.strip_suffix(b"\n").unwrap_or(&out);
    // Relative to the root git ran in, or absolute (a git directory elsewhere beneath it).
    let root = plan.root.as_os_str().as_bytes();
    let rel = match path.strip_prefix(root) {
        Some(rest) if path.starts_with(b"/") => rest.strip_prefix(b"/").unwrap_or(rest),
        _ if path.starts_with(b"/") => {
            return Err(format!(
                "{} is outside the project",
                String::from_utf8_lossy(path)
            ))
        }
        _ => path,
    };
    let shown = || plan.root.join(OsStr::from_bytes(rel)).display().to_string();
    let (file, size, _) = match beneath::open_regular(plan.root_fd.as_fd(), rel, plan.resolver) {
        Ok(opened) => opened,
        Err(beneath::OpenFileError::Errno(Errno::ENOENT | Errno::ENOTDIR)) => return Ok(None),
        Err(_) => {
            return Err(format!(
                "{} is not a regular file beneath the project",
                shown()
            ))
        }
    };
    if size > MAX_LOCAL_EXCLUDES {
        return Err(format!(
            "{} is {size} bytes, more than the {MAX_LOCAL_EXCLUDES} taken",
            shown()
        ));
    }
    let mut text = Vec::new();
    file.take(MAX_LOCAL_EXCLUDES)
        .read_to_end(&mut text)
        .map_err(|err| format!("cannot read {}: {err}", shown()))?;
    String::from_utf8(text)
        .map(Some)
        .map_err(|_| format!("{} is not UTF-8", shown()))
}

/// The ref `HEAD` is on (`refs/heads/...`), or the commit it names when detached: the
/// baseline the guest's history starts from.
pub fn head_name(plan: &ImportPlan) -> Result<String, ImportError> {
    let git = hardened(&plan.options, plan.root_fd.as_fd());
    let git_err = |source| git_error(&plan.root, source);
    if let Some(branch) = head_branch(&git).map_err(git_err)? {
        return Ok(branch.to_string_lossy().into_owned());
    }
    let out = git
        .args(["rev-parse", "--verify", "HEAD"])
        .run()
        .map_err(git_err)?;
    Ok(String::from_utf8_lossy(&out).trim().to_owned())
}

/// The commit `HEAD` names (its full id), `None` when the project is not a git work tree or
/// has no commit yet: the commit the imported tree was taken on top of, which `task apply`
/// later branches from.
pub fn head_commit_id(plan: &ImportPlan) -> Result<Option<String>, ImportError> {
    if !plan.is_git {
        return Ok(None);
    }
    let git = hardened(&plan.options, plan.root_fd.as_fd());
    let out = git
        .args(["rev-parse", "--quiet", "--verify", "HEAD^{commit}"])
        .output()
        .map_err(|source| git_error(&plan.root, source))?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok(
        (out.status.success() && id.bytes().all(|b| b.is_ascii_hexdigit()) && !id.is_empty())
            .then_some(id),
    )
}

/// A hardened git for the work tree `dir` (a descriptor beneath the root; its git directory
/// checked by [`gitdir::check`] first).
fn hardened(options: &PlanOptions, dir: BorrowedFd<'_>) -> HardenedGit {
    let mut git = HardenedGit::in_dir_fd(dir).timeout(options.git_timeout);
    if let Some(program) = &options.git {
        git = git.program(program);
    }
    if let Some(excludes) = &options.excludes_file {
        git = git.config("core.excludesFile", excludes.as_os_str());
    }
    git
}

/// A failure of git on the repository at `root`: git missing, or git refusing the repository.
fn git_error(root: &Path, source: GitError) -> ImportError {
    match source {
        GitError::Spawn { .. } => ImportError::GitMissing {
            root: root.to_path_buf(),
            source,
        },
        source => ImportError::Git {
            root: root.to_path_buf(),
            source,
        },
    }
}

/// Opens the canonical `root` `O_PATH | O_DIRECTORY`, resolving it from `/` with no symlink
/// followed: had one been swapped into the path since `canonicalize`, this fails.
fn open_root(root: &Path) -> Result<OwnedFd, Errno> {
    let slash = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let rel = root
        .as_os_str()
        .as_bytes()
        .strip_prefix(b"/")
        .ok_or(Errno::EINVAL)?;
    beneath::open(
        slash.as_fd(),
        rel,
        OFlag::O_PATH | OFlag::O_DIRECTORY,
        Resolver::Auto,
    )
}

/// Fails unless git accepts `git`'s repository and work tree.
fn check_repo(git: &HardenedGit) -> Result<(), GitError> {
    git.clone()
        .args(["rev-parse", "--is-inside-work-tree"])
        .run()
        .map(drop)
}

/// The raw, NUL-separated output of the two `ls-files` the import runs.
struct Listing {
    /// `--cached --stage`: `<mode> <object> <stage>\t<path>` records.
    cached: Vec<u8>,
    /// `--others --exclude-standard`: paths; a nested repository as `<dir>/`.
    others: Vec<u8>,
}

fn ls_files(git: &HardenedGit) -> Result<Listing, GitError> {
    Ok(Listing {
        cached: git
            .clone()
            .args(["ls-files", "-z", "--cached", "--stage"])
            .run()?,
        others: git
            .clone()
            .args(["ls-files", "-z", "--others", "--exclude-standard"])
            .run()?,
    })
}

/// Whether `HEAD` names a commit (false for an unborn branch).
fn head_commit(git: &HardenedGit) -> Result<bool, GitError> {
    let out = git
        .clone()
        .args(["rev-parse", "--quiet", "--verify", "HEAD^{commit}"])
        .output()?;
    Ok(out.status.success())
}

/// The branch `HEAD` is on (`refs/heads/…`), `None` when detached.
fn head_branch(git: &HardenedGit) -> Result<Option<OsString>, GitError> {
    let out = git
        .clone()
        .args(["symbolic-ref", "--quiet", "HEAD"])
        .output()?;
    if !out.status.success() {
        return Ok(None);
    }
    let name = out.stdout.strip_suffix(b"\n").unwrap_or(&out.stdout);
    let plain =
        name.starts_with(b"refs/heads/") && name.iter().all(|b| b.is_ascii_graphic() || *b >= 0x80);
    Ok(plain.then(|| OsStr::from_bytes(name).to_os_string()))
}

/// The history that will actually come: `None` when there is no commit to bundle.
fn effective_history(git: &HardenedGit, asked: History) -> Result<History, GitError> {
    let has_any = match asked {
        History::None => return Ok(History::None),
        History::Head => head_commit(git)?,
        History::Branches => {
            head_commit(git)?
                || !git
                    .clone()
                    .args([
                        "for-each-ref",
                        "--count=1",
                        "--format=%(objectname)",
                        "refs/heads/",
                    ])
                    .run()?
                    .is_empty()
        }
    };
    Ok(if has_any { asked } else { History::None })
}

fn len_u64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// `.git` in any letter case: never imported, never descended into.
fn is_dot_git(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b".git")
}

fn join(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    if prefix.is_empty() {
        return name.to_vec();
    }
    let mut path = Vec::with_capacity(prefix.len() + 1 + name.len());
    path.extend_from_slice(prefix);
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

fn path_of(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(bytes))
}

/// The listing in progress.
struct Lister<'a> {
    root: &'a Path,
    root_fd: &'a OwnedFd,
    options: &'a PlanOptions,
    resolver: Resolver,
    entries: BTreeMap<Vec<u8>, EntryKind>,
    notes: Vec<Note>,
    /// See [`ImportPlan::untracked_generated`].
    untracked_generated: std::collections::BTreeSet<String>,
    /// (device, inode) of directories walked, against bind-mount loops.
    visited: HashSet<(libc::dev_t, libc::ino_t)>,
}

impl Lister<'_> {
    fn note(&mut self, path: &[u8], kind: NoteKind) {
        self.notes.push(Note {
            path: path_of(path),
            kind,
        });
    }

    /// Whether `<root>/<dir>/.git` is a directory or a regular file (a `gitdir:` file); a
    /// symlinked `.git` is not trusted to be one.
    fn has_git(&self, dir: &[u8]) -> bool {
        Probe::new(self.root_fd.as_fd(), &join(dir, b".git"), self.resolver)
            .is_ok_and(|probe| matches!(probe.kind(), Kind::Dir | Kind::File { .. }))
    }

    /// Adds what `git ls-files` listed for the work tree at `prefix` (relative to the root).
    fn add_listing(
        &mut self,
        listing: &Listing,
        prefix: &[u8],
        depth: usize,
    ) -> Result<(), ImportError> {
        let Listing { cached, others } = listing;
        // path → is a repository of its own (gitlink, or an untracked `dir/` git reports).
        let mut listed: BTreeMap<&[u8], bool> = BTreeMap::new();
        for record in cached.split(|b| *b == 0).filter(|r| !r.is_empty()) {
            // "<mode> <object> <stage>\t<path>"
            let Some(tab) = record.iter().position(|b| *b == b'\t') else {
                continue;
            };
            let (meta, path) = (&record[..tab], &record[tab + 1..]);
            let gitlink = meta.starts_with(b"160000 ");
            *listed.entry(path).or_default() |= gitlink;
        }
        let mut untracked: HashSet<&[u8]> = HashSet::new();
        for path in others.split(|b| *b == 0).filter(|r| !r.is_empty()) {
            match path.strip_suffix(b"/") {
                Some(dir) => *listed.entry(dir).or_default() = true,
                None => {
                    listed.entry(path).or_default();
                    untracked.insert(path);
                }
            }
        }

        for (path, nested) in listed {
            if !beneath::is_plain_relative(path) {
                self.note(&join(prefix, path), NoteKind::UnsafeName);
                continue;
            }
            if path.split(|b| *b == b'/').any(is_dot_git) {
                // A `.git` never comes (git lists one inside a directory it does not take for
                // a repository, e.g. a `.git` file pointing nowhere).
                continue;
            }
            let full = join(prefix, path);
            let Some(probe) = self.probe(&full)? else {
                continue;
            };
            match probe.kind() {
                Kind::Dir if nested => self.list_nested(full, depth)?,
                // A tracked path that is now a directory: what it holds comes via `--others`.
                Kind::Dir => {}
                kind => {
                    if untracked.contains(path) {
                        self.untracked(&full);
                    }
                    self.add(full, kind, || probe.read_link());
                }
            }
        }
        Ok(())
    }

    /// Records `path`, which comes untracked, when it is under the table of generated files,
    /// with the directories between it and its generated directory.
    fn untracked(&mut self, path: &[u8]) {
        let Ok(path) = std::str::from_utf8(path) else {
            return;
        };
        let Some(matched) = dynocap_review::generated::rule_for(path) else {
            return;
        };
        // A rule on file names (`*.pyc`) has no directory: the file's own are the project's.
        if let Some(dir) = matched.dir {
            for (at, _) in path.match_indices('/').filter(|(at, _)| *at > dir.len()) {
                self.untracked_generated.insert(path[..at].to_owned());
            }
        }
        self.untracked_generated.insert(path.to_owned());
    }

    /// A submodule or nested repository at `dir`: listed by its own git, its `.git` left out.
    fn list_nested(&mut self, dir: Vec<u8>, depth: usize) -> Result<(), ImportError> {
        if depth + 1 >= MAX_NESTING {
            self.note(&dir, NoteKind::TooDeep);
            return Ok(());
        }
        self.entries.insert(dir.clone(), EntryKind::Dir);
        if !self.has_git(&dir) {
            // An uninitialised submodule (empty), or a directory git took for one.
            return self.list_plain(dir);
        }
        gitdir::check(self.root_fd.as_fd(), self.root, &dir, self.resolver)?;
        let work_tree = self.root.join(OsStr::from_bytes(&dir));
        let work_fd = beneath::open(
            self.root_fd.as_fd(),
            &dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            self.resolver,
        )
        .map_err(|err| self.read_error(&dir, err))?;
        let git = hardened(self.options, work_fd.as_fd());
        match check_repo(&git).and_then(|()| ls_files(&git)) {
            Ok(listing) => self.add_listing(&listing, &dir, depth + 1),
            Err(GitError::Failed { stderr, .. }) => {
                let why = stderr.lines().next().unwrap_or_default().to_owned();
                self.note(&dir, NoteKind::ReadAsPlainTree(why));
                self.list_plain(dir)
            }
            Err(err) => Err(git_error(&work_tree, err)),
        }
    }

    /// Probes a listed path. `None` (after a note where useful) when it cannot come.
    fn probe(&mut self, path: &[u8]) -> Result<Option<Probe>, ImportError> {
        match Probe::new(self.root_fd.as_fd(), path, self.resolver) {
            Ok(probe) => Ok(Some(probe)),
            // Listed by git but deleted in the work tree (or its directory is now a file).
            Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(None),
            Err(Errno::ELOOP) => {
                self.note(path, NoteKind::SymlinkInPath);
                Ok(None)
            }
            Err(Errno::EACCES | Errno::EPERM) => {
                self.note(path, NoteKind::PermissionDenied);
                Ok(None)
            }
            Err(Errno::ENAMETOOLONG) => {
                self.note(path, NoteKind::UnsafeName);
                Ok(None)
            }
            Err(err) => Err(ImportError::Read {
                path: self.root.join(OsStr::from_bytes(path)),
                source: err.into(),
            }),
        }
    }

    /// Records a non-directory; `read_link` reads the target when it is a symlink.
    fn add(
        &mut self,
        path: Vec<u8>,
        kind: Kind,
        read_link: impl FnOnce() -> Result<Vec<u8>, Errno>,
    ) {
        match kind {
            Kind::File { executable, size } => {
                self.entries
                    .insert(path, EntryKind::File { executable, size });
            }
            Kind::Symlink => match read_link() {
                Ok(target) => {
                    self.entries.insert(
                        path,
                        EntryKind::Symlink {
                            target: PathBuf::from(OsString::from_vec(target)),
                        },
                    );
                }
                Err(Errno::ENOENT) => {}
                Err(_) => self.note(&path, NoteKind::PermissionDenied),
            },
            Kind::Special(special) => self.note(&path, NoteKind::Special(special)),
            Kind::Dir => {}
        }
    }

    /// Walks the directory at `start` (relative; empty for the root) and everything under it,
    /// never following a symlink and never entering a `.git`.
    fn list_plain(&mut self, start: Vec<u8>) -> Result<(), ImportError> {
        let mut pending = vec![start];
        while let Some(dir_path) = pending.pop() {
            let dir = match beneath::open(
                self.root_fd.as_fd(),
                &dir_path,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                self.resolver,
            ) {
                Ok(dir) => dir,
                Err(Errno::ENOENT | Errno::ENOTDIR) => continue,
                Err(Errno::ELOOP) => {
                    self.note(&dir_path, NoteKind::SymlinkInPath);
                    continue;
                }
                Err(Errno::EACCES | Errno::EPERM) => {
                    self.note(&dir_path, NoteKind::PermissionDenied);
                    continue;
                }
                Err(err) => return Err(self.read_error(&dir_path, err)),
            };
            let stat = fstat(&dir).map_err(|err| self.read_error(&dir_path, err))?;
            if !self.visited.insert((stat.st_dev, stat.st_ino)) {
                continue;
            }
            let names =
                beneath::read_dir_names(&dir).map_err(|err| self.read_error(&dir_path, err))?;
            for name in names.into_iter().filter(|name| !is_dot_git(name)) {
                let path = join(&dir_path, &name);
                let stat = match fstatat(&dir, name.as_slice(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(stat) => stat,
                    Err(Errno::ENOENT) => continue,
                    Err(err) => return Err(self.read_error(&path, err)),
                };
                match beneath::kind_of(&stat) {
                    Kind::Dir => {
                        self.entries.insert(path.clone(), EntryKind::Dir);
                        pending.push(path);
                    }
                    // `dir` is a real directory beneath the root and `name` one component:
                    // `readlinkat` reads the link itself, following nothing.
                    kind => self.add(path, kind, || {
                        readlinkat(&dir, name.as_slice()).map(OsStringExt::into_vec)
                    }),
                }
            }
        }
        Ok(())
    }

    fn read_error(&self, path: &[u8], err: Errno) -> ImportError {
        ImportError::Read {
            path: self.root.join(OsStr::from_bytes(path)),
            source: err.into(),
        }
    }
}

/// Largest `.git/config` read for its remotes.
const GIT_CONFIG_MAX: u64 = 256 * 1024;

/// The URLs of the project's git remotes (`[remote "…"] url = …` in `.git/config`), read
/// beneath the project's descriptor without following a symlink. A project without a plain
/// `.git` directory, or an unreadable config, has none. Only read for its hosts: the values
/// are never run or fetched from here.
pub fn remote_urls(project: &ProjectDir) -> Vec<String> {
    let Ok((file, size, _)) =
        beneath::open_regular(project.as_fd(), b".git/config", beneath::Resolver::Auto)
    else {
        return Vec::new();
    };
    if size > GIT_CONFIG_MAX {
        return Vec::new();
    }
    let mut text = String::new();
    if std::io::Read::read_to_string(&mut std::io::Read::take(file, GIT_CONFIG_MAX), &mut text)
        .is_err()
    {
        return Vec::new();
    }
    let mut in_remote = false;
    let mut urls = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_remote = line.to_ascii_lowercase().starts_with("[remote ");
            continue;
        }
        if !in_remote {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            let key = key.trim().to_ascii_lowercase();
            if key == "url" || key == "pushurl" {
                urls.push(value.trim().trim_matches('"').to_owned());
            }
        }
    }
    urls
}
