//! The journal of a task's workspace: which paths changed since the last diff, so that a diff
//! updates the private index for those paths alone instead of looking at every file again.
//!
//! An inotify watch on every directory of the workspace, read by a thread of its own, turns
//! events into two sets of workspace-relative paths: *paths* (anything but a directory:
//! created, written, truncated, chmodded, removed or renamed) and *trees* (directories to
//! look at whole: made, removed or renamed, with a `.gitignore` or `.gitattributes` that
//! changed, or holding a nested repository). A new directory is watched before it is listed,
//! so a file made in it while the watch is being set up is seen either way.
//!
//! Nothing under a `.git` is watched: the workspace's own repository is not part of the diff,
//! and a nested repository's state is looked at whole on every diff (its directory is always
//! among the trees), which is what git does with it.
//!
//! When the journal cannot vouch for what it holds, it says so and the diff scans everything:
//! more paths changed than a scan costs, or the workspace's own ignore rules changed
//! ([`Since::Everything`]); the kernel's queue overflowed, or the workspace itself was moved
//! or removed ([`Since::Unknown`], after which a new journal starts). Its blind spots, which
//! the full scan of `task finish` covers: a write through a shared mapping after the file's
//! descriptor was closed, and a write through a hard link whose other name is outside the
//! workspace. Both can only hide a change from `task diff`, never add one to a patch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};

use crate::fsutil;

/// Deepest directory watched; deeper trees make the journal give up rather than miss them.
const MAX_DEPTH: usize = fsutil::MAX_REMOVE_DEPTH;

/// Why the workspace cannot be watched, or a directory in it no longer can (the journal then
/// loses track, and says this).
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    #[error("cannot open {}: {source}", path.display())]
    OpenWorkspace { path: PathBuf, source: io::Error },
    #[error("cannot start inotify: {0}")]
    Inotify(#[source] Errno),
    #[error("cannot duplicate the inotify descriptor: {0}")]
    DupInotify(#[source] io::Error),
    #[error("cannot duplicate a descriptor: {0}")]
    DupRoot(#[source] io::Error),
    #[error("cannot create a pipe: {0}")]
    Pipe(#[source] Errno),
    #[error("cannot start the journal's thread: {0}")]
    Thread(#[source] io::Error),
    #[error("cannot open {}: {source}", show(rel))]
    Open { rel: Vec<u8>, source: Errno },
    #[error("{} is nested deeper than {MAX_DEPTH}", show(.0))]
    TooDeep(Vec<u8>),
    #[error("the workspace has more than {0} directories")]
    TooManyDirectories(usize),
    #[error("cannot watch {}: {source}", show(rel))]
    Watch { rel: Vec<u8>, source: Errno },
    #[error("cannot list {}: {source}", show(rel))]
    List { rel: Vec<u8>, source: Errno },
}

/// What a watch reports: every change to a directory's entries and to the files in it.
fn watch_mask() -> AddWatchFlags {
    AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        // Not IN_DONT_FOLLOW: the watch is set through `/proc/self/fd/N`, a link to follow.
        | AddWatchFlags::IN_ONLYDIR
}

/// What changed in the workspace since the journal was last read, as workspace-relative
/// paths (no leading or trailing `/`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Changed {
    /// Entries that are not directories, or were not when they changed.
    pub paths: BTreeSet<Vec<u8>>,
    /// Directories to look at whole. Never the workspace itself: that is [`Since::Everything`].
    pub trees: BTreeSet<Vec<u8>>,
}

impl Changed {
    fn len(&self) -> usize {
        self.paths.len() + self.trees.len()
    }
}

/// The answer of [`Journal::take`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Since {
    Changed(Changed),
    /// The whole workspace must be looked at (why, for the log); the journal goes on.
    Everything(String),
    /// The journal lost track (why, for the log): start another.
    Unknown(String),
}

/// How much a journal takes on before it gives up on details.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Directories watched at most. Each watch pins its directory's inode in the kernel; a
    /// workspace with more (a large `node_modules`) is scanned whole on every diff.
    pub watches: usize,
    /// Paths remembered at most between two diffs; past that, one scan costs less than
    /// handing git that many names.
    pub changed: usize,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        watches: 50_000,
        changed: 20_000,
    };
}

/// What the journal has recorded since it was last taken.
#[derive(Default)]
struct Record {
    changed: Changed,
    /// Directories holding a `.git`: looked at whole on every diff.
    nested: BTreeSet<Vec<u8>>,
    everything: Option<String>,
    lost: Option<String>,
    max_changed: usize,
}

impl Record {
    fn lose(&mut self, why: String) {
        if self.lost.is_none() {
            self.lost = Some(why);
        }
        self.changed = Changed::default();
    }

    fn everything(&mut self, why: String) {
        if self.everything.is_none() {
            self.everything = Some(why);
        }
        self.changed = Changed::default();
    }

    fn path(&mut self, path: Vec<u8>) {
        if self.everything.is_none() {
            self.changed.paths.insert(path);
            self.check_size();
        }
    }

    fn tree(&mut self, path: Vec<u8>) {
        if path.is_empty() {
            return self.everything("the workspace's own ignore or attribute rules changed".into());
        }
        if self.everything.is_none() {
            self.changed.trees.insert(path);
            self.check_size();
        }
    }

    fn check_size(&mut self) {
        if self.changed.len() > self.max_changed {
            self.everything(format!(
                "more than {} paths changed since the last diff",
                self.max_changed
            ));
        }
    }
}

/// The watches and the record, under one lock: whoever holds it reads what is queued, so a
/// [`Journal::take`] answers for every change that finished before it.
struct State {
    watcher: Watcher,
    record: Record,
}

impl State {
    /// Applies every queued event.
    fn drain(&mut self) {
        while self.record.lost.is_none() {
            match self.watcher.inotify.read_events() {
                Ok(events) => {
                    for event in events {
                        self.watcher.apply(&mut self.record, event);
                    }
                }
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => {}
                Err(err) => self.record.lose(format!("cannot read events: {err}")),
            }
        }
    }
}

/// A running journal of one workspace. Dropping it stops the watching thread and removes
/// its watches.
pub(crate) struct Journal {
    state: Arc<Mutex<State>>,
    /// Closing it (on drop) wakes the thread, which then ends.
    _stop: OwnedFd,
}

impl Journal {
    /// Watches every directory under `workspace`, then returns: every change from then on is
    /// recorded. Fails when the workspace is too large to watch or inotify is unavailable.
    pub fn start(workspace: &Path, limits: Limits) -> Result<Journal, JournalError> {
        let root =
            fsutil::open_dir_nofollow(workspace).map_err(|source| JournalError::OpenWorkspace {
                path: workspace.to_owned(),
                source,
            })?;
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
            .map_err(JournalError::Inotify)?;
        // The thread waits on its own descriptor of the instance, without the lock.
        let ready = inotify
            .as_fd()
            .try_clone_to_owned()
            .map_err(JournalError::DupInotify)?;
        let mut state = State {
            watcher: Watcher {
                inotify,
                root,
                by_wd: HashMap::new(),
                by_path: BTreeMap::new(),
                max_watches: limits.watches,
            },
            record: Record {
                max_changed: limits.changed,
                ..Record::default()
            },
        };
        let top = state
            .watcher
            .root
            .try_clone()
            .map_err(JournalError::DupRoot)?;
        state
            .watcher
            .watch_dir(&mut state.record, top, Vec::new(), 0)?;
        let (stop_read, stop_write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(JournalError::Pipe)?;
        let state = Arc::new(Mutex::new(state));
        let shared = Arc::clone(&state);
        std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || follow(&shared, &ready, &stop_read))
            .map_err(JournalError::Thread)?;
        Ok(Journal {
            state,
            _stop: stop_write,
        })
    }

    /// What changed since the journal started or was last taken, and forgets it: what
    /// changes from now on is in the next answer.
    pub fn take(&self) -> Since {
        let mut state = lock(&self.state);
        state.drain();
        let record = &mut state.record;
        if let Some(why) = &record.lost {
            return Since::Unknown(why.clone());
        }
        if let Some(why) = record.everything.take() {
            return Since::Everything(why);
        }
        let mut changed = std::mem::take(&mut record.changed);
        changed.trees.extend(record.nested.iter().cloned());
        // A tree is looked at whole, subdirectories included: one beneath another is covered
        // by it. Whether a directory made inside a new one shows as a tree of its own depends
        // on whether it came before the new one was watched (in its listing) or after (an
        // event); the answer does not.
        let all_trees = changed.trees.clone();
        changed
            .trees
            .retain(|tree| !ancestors(tree).any(|dir| all_trees.contains(dir)));
        let nested = &record.nested;
        // Inside a tree, or inside a nested repository, a path is looked at with its tree.
        // (A file that became a directory is both; its tree covers it.)
        changed.paths.retain(|path| {
            !changed.trees.contains(path)
                && !ancestors(path).any(|dir| changed.trees.contains(dir) || nested.contains(dir))
        });
        Since::Changed(changed)
    }
}

/// The journal of the workspace the baseline was recorded in, or why there is none.
#[derive(Default)]
pub(crate) enum Tracker {
    /// No baseline yet in this connection, or the last diff failed: the next diff scans
    /// everything, and starts a journal first.
    #[default]
    Idle,
    Running(Journal),
    /// The workspace cannot be watched (why was logged): every diff scans it whole.
    Off,
}

impl Tracker {
    /// A journal of `workspace`, or why there cannot be one (logged).
    pub fn started(workspace: &Path) -> Tracker {
        match Journal::start(workspace, Limits::DEFAULT) {
            Ok(journal) => Tracker::Running(journal),
            Err(why) => {
                log!("every diff scans the whole workspace: {why}");
                Tracker::Off
            }
        }
    }

    /// What a diff must look at: what changed since the last one, or `None` for everything
    /// (asked for with `full_scan`, or when the journal cannot tell). Starts a journal when
    /// there is none, before the diff's scan, so that a change during the scan is in the
    /// next answer.
    pub fn changes(&mut self, workspace: &Path, full_scan: bool) -> Option<Changed> {
        match self {
            Tracker::Running(journal) => match journal.take() {
                Since::Changed(changed) if !full_scan => return Some(changed),
                Since::Changed(_) => return None,
                Since::Everything(why) => {
                    log!("the diff scans the whole workspace: {why}");
                    return None;
                }
                Since::Unknown(why) => {
                    log!("the diff scans the whole workspace and watches it again: {why}");
                }
            },
            Tracker::Idle => {}
            Tracker::Off => return None,
        }
        *self = Tracker::started(workspace);
        None
    }
}

/// The thread: applies events as they come, so the kernel's queue does not overflow between
/// two diffs, until the journal is dropped or loses track.
fn follow(state: &Mutex<State>, ready: &OwnedFd, stop: &OwnedFd) {
    loop {
        let mut fds = [
            PollFd::new(ready.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(err) => {
                return lock(state)
                    .record
                    .lose(format!("cannot wait for events: {err}"))
            }
        }
        if fds[1].any().unwrap_or(true) {
            return;
        }
        let mut state = lock(state);
        state.drain();
        if state.record.lost.is_some() {
            return;
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while applying events leaves sets of paths, still a superset of nothing lost;
    // the journal is dropped with the agent's request anyway.
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The proper ancestors of a relative path, nearest first (`a/b/c` → `a/b`, `a`).
fn ancestors(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.iter()
        .enumerate()
        .rev()
        .filter(|&(_, &byte)| byte == b'/')
        .map(move |(at, _)| &path[..at])
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    path.extend_from_slice(dir);
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

/// The inotify instance and which directory each watch is on.
struct Watcher {
    inotify: Inotify,
    /// The workspace, from which every directory is opened without following a symlink.
    root: OwnedFd,
    by_wd: HashMap<WatchDescriptor, Vec<u8>>,
    by_path: BTreeMap<Vec<u8>, WatchDescriptor>,
    max_watches: usize,
}

impl Watcher {
    fn apply(&mut self, record: &mut Record, event: InotifyEvent) {
        let mask = event.mask;
        if mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            return record.lose("the kernel's queue of events overflowed".into());
        }
        let Some(dir) = self.by_wd.get(&event.wd).cloned() else {
            // A watch already forgotten (its directory was moved or removed).
            return;
        };
        if mask.contains(AddWatchFlags::IN_IGNORED) {
            self.forget_watch(event.wd);
            if dir.is_empty() {
                record.lose("the workspace was removed or unmounted".into());
            }
            return;
        }
        let Some(name) = event.name else {
            // An event on the directory itself: only the workspace's own matters, its
            // entries' are seen by their parents.
            if dir.is_empty()
                && mask.intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF)
            {
                record.lose("the workspace was moved or removed".into());
            }
            return;
        };
        let name = name.as_bytes();
        let path = join(&dir, name);
        let appeared = mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
        let went = mask.intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM);
        if name == b".git" {
            if dir.is_empty() {
                return; // the workspace's own repository
            }
            // The directory becomes, or stops being, a repository of its own.
            if appeared {
                record.nested.insert(dir.clone());
            }
            if went {
                record.nested.remove(&dir);
                // Its files were not watched while it was a repository.
                if let Err(why) = self.watch_tree(record, dir.clone()) {
                    return record.lose(why.to_string());
                }
            }
            return record.tree(dir);
        }
        if mask.contains(AddWatchFlags::IN_ISDIR) {
            if went {
                self.forget_tree(&path, mask.contains(AddWatchFlags::IN_MOVED_FROM));
                record.nested.retain(|nested| {
                    nested != &path && !ancestors(nested).any(|dir| dir == path.as_slice())
                });
            }
            if appeared {
                if let Err(why) = self.watch_tree(record, path.clone()) {
                    return record.lose(why.to_string());
                }
            }
            if appeared || went {
                record.tree(path);
            }
            return;
        }
        if name == b".gitignore" || name == b".gitattributes" {
            // What git ignores, or how it reads files, changed for the whole directory.
            record.tree(dir);
        }
        record.path(path);
    }

    /// Watches `rel` and every directory beneath it, recording nested repositories.
    fn watch_tree(&mut self, record: &mut Record, rel: Vec<u8>) -> Result<(), JournalError> {
        let dir = match self.open(&rel) {
            Ok(dir) => dir,
            // Gone again, or no longer a directory: the event that said so is queued.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(()),
            Err(source) => return Err(JournalError::Open { rel, source }),
        };
        let depth = rel.iter().filter(|&&byte| byte == b'/').count() + usize::from(!rel.is_empty());
        self.watch_dir(record, dir, rel, depth)
    }

    fn watch_dir(
        &mut self,
        record: &mut Record,
        dir: OwnedFd,
        rel: Vec<u8>,
        depth: usize,
    ) -> Result<(), JournalError> {
        if depth > MAX_DEPTH {
            return Err(JournalError::TooDeep(rel));
        }
        if self.by_wd.len() >= self.max_watches {
            return Err(JournalError::TooManyDirectories(self.max_watches));
        }
        // Through the descriptor: a path would follow a symlink swapped in meanwhile.
        let proc_path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let wd = self
            .inotify
            .add_watch(proc_path.as_str(), watch_mask())
            .map_err(|source| JournalError::Watch {
                rel: rel.clone(),
                source,
            })?;
        if let Some(old) = self.by_wd.insert(wd, rel.clone()) {
            // The same directory under a new name (it was moved here).
            self.by_path.remove(&old);
        }
        self.by_path.insert(rel.clone(), wd);
        // Listed after the watch is set: an entry made meanwhile is in the listing or in
        // an event, and the trees of the diff cover both.
        for (name, kind) in fsutil::entries(dir.as_fd()).map_err(|source| JournalError::List {
            rel: rel.clone(),
            source,
        })? {
            if name.to_bytes() == b".git" {
                if !rel.is_empty() {
                    record.nested.insert(rel.clone());
                }
                continue;
            }
            if !matches!(kind, None | Some(Type::Directory)) {
                continue;
            }
            let child = match fsutil::open_dir_at(dir.as_fd(), &name) {
                Ok(child) => child,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(source) => {
                    return Err(JournalError::Open {
                        rel: join(&rel, name.to_bytes()),
                        source,
                    })
                }
            };
            self.watch_dir(record, child, join(&rel, name.to_bytes()), depth + 1)?;
        }
        Ok(())
    }

    /// Opens the workspace-relative directory `rel`, following no symlink on the way.
    fn open(&self, rel: &[u8]) -> nix::Result<OwnedFd> {
        fsutil::open_beneath(
            self.root.as_fd(),
            OsStr::from_bytes(rel),
            fsutil::dir_flags(),
        )
    }

    /// Stops watching `rel` and what is beneath it. A directory moved away keeps its watches
    /// in the kernel until they are removed; a removed one loses them by itself.
    fn forget_tree(&mut self, rel: &[u8], remove_watches: bool) {
        let mut below = rel.to_vec();
        below.push(b'/');
        let mut end = rel.to_vec();
        end.push(b'/' + 1);
        let mut gone: Vec<Vec<u8>> = self
            .by_path
            .range(below..end)
            .map(|(path, _)| path.clone())
            .collect();
        gone.push(rel.to_vec());
        for path in gone {
            if let Some(wd) = self.by_path.remove(&path) {
                self.by_wd.remove(&wd);
                if remove_watches {
                    // It fails only for a watch the kernel dropped already.
                    let _ = self.inotify.rm_watch(wd);
                }
            }
        }
    }

    fn forget_watch(&mut self, wd: WatchDescriptor) {
        if let Some(path) = self.by_wd.remove(&wd) {
            if self.by_path.get(&path) == Some(&wd) {
                self.by_path.remove(&path);
            }
        }
    }
}

fn show(rel: &[u8]) -> String {
    if rel.is_empty() {
        return "the workspace".into();
    }
    format!("/workspace/{}", String::from_utf8_lossy(rel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn set(items: &[&str]) -> BTreeSet<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    fn changed(paths: &[&str], trees: &[&str]) -> Since {
        Since::Changed(Changed {
            paths: set(paths),
            trees: set(trees),
        })
    }

    /// Writes a file from a thread with a descriptor table of its own, so that the file is
    /// closed for good when this returns. A file written through the shared table can be
    /// closed much later: a process that another test's thread forks meanwhile inherits the
    /// descriptor and holds it until it execs, and the close's event (`IN_CLOSE_WRITE`,
    /// rightly a change) would land in a later take. A child process would do as well but
    /// cannot be waited for here: the reaper thread, once a test has started it, reaps every
    /// child of the test binary.
    fn write(path: impl AsRef<Path>, contents: &str) -> std::io::Result<()> {
        let path = path.as_ref().to_path_buf();
        let contents = contents.to_owned();
        std::thread::spawn(move || {
            // A private copy of the descriptor table, which the thread's exit drops.
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FILES)?;
            fs::write(path, contents)
        })
        .join()
        .map_err(|_| std::io::Error::other("the writing thread panicked"))?
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for path in ["src/lib", "docs", "deep/a/b/c"] {
            fs::create_dir_all(dir.path().join(path)).expect("mkdir");
        }
        for path in [
            "README",
            "src/main.rs",
            "src/lib/mod.rs",
            "docs/guide.md",
            "deep/a/b/c/f",
        ] {
            write(dir.path().join(path), path).expect("write");
        }
        dir
    }

    fn start(root: &Path) -> Journal {
        Journal::start(root, Limits::DEFAULT).expect("start the journal")
    }

    #[test]
    fn files_written_made_removed_and_renamed_are_paths() {
        let dir = tree();
        let root = dir.path();
        let journal = start(root);
        assert_eq!(journal.take(), changed(&[], &[]));
        write(root.join("src/main.rs"), "changed").expect("write");
        write(root.join("docs/new.md"), "new").expect("write");
        fs::remove_file(root.join("README")).expect("rm");
        fs::rename(root.join("deep/a/b/c/f"), root.join("src/lib/g")).expect("mv");
        std::os::unix::fs::symlink("main.rs", root.join("src/link")).expect("ln -s");
        // Every change that finished before the take is in it.
        assert_eq!(
            journal.take(),
            changed(
                &[
                    "src/main.rs",
                    "docs/new.md",
                    "README",
                    "deep/a/b/c/f",
                    "src/lib/g",
                    "src/link"
                ],
                &[]
            )
        );
        // Taken means forgotten; the next change is all the next answer holds.
        fs::set_permissions(
            root.join("docs/guide.md"),
            fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        assert_eq!(journal.take(), changed(&["docs/guide.md"], &[]));
        let file = fs::OpenOptions::new()
            .write(true)
            .open(root.join("src/lib/mod.rs"))
            .expect("open");
        file.set_len(0).expect("truncate");
        assert_eq!(journal.take(), changed(&["src/lib/mod.rs"], &[]));
    }

    #[test]
    fn directories_made_moved_or_removed_are_trees_and_stay_watched() {
        let dir = tree();
        let root = dir.path();
        let journal = start(root);
        fs::create_dir_all(root.join("new/inner")).expect("mkdir");
        write(root.join("new/inner/x"), "x").expect("write");
        fs::rename(root.join("deep/a"), root.join("moved")).expect("mv");
        fs::remove_dir_all(root.join("docs")).expect("rm -r");
        // What happened inside them goes with the trees.
        assert_eq!(
            journal.take(),
            changed(&[], &["new", "deep/a", "moved", "docs"])
        );
        // The new directory's child and the moved tree are watched under their new names.
        write(root.join("new/inner/y"), "y").expect("write");
        write(root.join("moved/b/c/f"), "changed").expect("write");
        assert_eq!(
            journal.take(),
            changed(&["new/inner/y", "moved/b/c/f"], &[])
        );
        // Directories made and removed inside watched ones are trees too, each covered by
        // the tree above it: one answer whichever events the kernel gave.
        fs::create_dir_all(root.join("new/inner/later/deeper")).expect("mkdir");
        fs::create_dir(root.join("moved/b/fresh")).expect("mkdir");
        assert_eq!(
            journal.take(),
            changed(&[], &["new/inner/later", "moved/b/fresh"])
        );
        fs::remove_dir_all(root.join("new")).expect("rm -r");
        assert_eq!(journal.take(), changed(&[], &["new"]));
        // A directory moved out of the workspace is no longer watched.
        let outside = tempfile::tempdir().expect("tempdir");
        fs::rename(root.join("moved"), outside.path().join("moved")).expect("mv");
        assert_eq!(journal.take(), changed(&[], &["moved"]));
        write(outside.path().join("moved/b/c/f"), "again").expect("write");
        assert_eq!(journal.take(), changed(&[], &[]));
    }

    #[test]
    fn an_ignore_or_attributes_file_makes_its_directory_a_tree() {
        let dir = tree();
        let root = dir.path();
        let journal = start(root);
        write(root.join("src/.gitignore"), "*.o\n").expect("write");
        write(root.join("deep/a/.gitattributes"), "* -text\n").expect("write");
        assert_eq!(journal.take(), changed(&[], &["src", "deep/a"]));
        // The workspace's own: everything, and the journal goes on.
        write(root.join(".gitignore"), "*.o\n").expect("write");
        assert!(matches!(journal.take(), Since::Everything(why) if why.contains("ignore")));
        write(root.join("README"), "changed").expect("write");
        assert_eq!(journal.take(), changed(&["README"], &[]));
    }

    #[test]
    fn git_directories_are_not_watched_and_nested_repositories_are_trees() {
        let dir = tree();
        let root = dir.path();
        fs::create_dir_all(root.join(".git/objects")).expect("mkdir");
        fs::create_dir_all(root.join("vendor/dep/.git")).expect("mkdir");
        write(root.join("vendor/dep/file"), "x").expect("write");
        let journal = start(root);
        write(root.join(".git/objects/x"), "x").expect("write");
        write(root.join(".git/index"), "x").expect("write");
        write(root.join("vendor/dep/.git/HEAD"), "x").expect("write");
        write(root.join("vendor/dep/file"), "y").expect("write");
        write(root.join("README"), "changed").expect("write");
        // The nested repository is looked at whole on every diff, whatever happened in it.
        assert_eq!(journal.take(), changed(&["README"], &["vendor/dep"]));
        assert_eq!(journal.take(), changed(&[], &["vendor/dep"]));
        // Made a repository later: a tree too, and paths in it go with it.
        fs::create_dir(root.join("src/.git")).expect("mkdir");
        write(root.join("src/main.rs"), "changed").expect("write");
        assert_eq!(journal.take(), changed(&[], &["src", "vendor/dep"]));
        // No longer one: a tree this once, then its files are paths again.
        fs::remove_dir(root.join("src/.git")).expect("rmdir");
        assert_eq!(journal.take(), changed(&[], &["src", "vendor/dep"]));
        write(root.join("src/main.rs"), "again").expect("write");
        assert_eq!(journal.take(), changed(&["src/main.rs"], &["vendor/dep"]));
    }

    #[test]
    fn too_many_changes_mean_everything_and_the_journal_goes_on() {
        let dir = tree();
        let root = dir.path();
        let limits = Limits {
            changed: 10,
            ..Limits::DEFAULT
        };
        let journal = Journal::start(root, limits).expect("start");
        for n in 0..=10 {
            write(root.join(n.to_string()), "").expect("write");
        }
        assert!(matches!(journal.take(), Since::Everything(why) if why.contains("paths changed")));
        write(root.join("README"), "changed").expect("write");
        assert_eq!(journal.take(), changed(&["README"], &[]));
    }

    #[test]
    fn an_overflowed_queue_or_a_moved_workspace_lose_track() {
        let dir = tree();
        let root = dir.path().join("ws");
        fs::create_dir(&root).expect("mkdir");
        let journal = start(&root);
        let queue: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .expect("max_queued_events")
            .trim()
            .parse()
            .expect("a number");
        {
            // Nothing reads the queue while the lock is held.
            // Identical events in a row are merged, so each is of another file.
            let _held = lock(&journal.state);
            for n in 0..=queue {
                fs::File::create(root.join(n.to_string())).expect("create");
            }
        }
        assert!(matches!(journal.take(), Since::Unknown(why) if why.contains("overflowed")));

        let journal = start(&root);
        fs::rename(&root, dir.path().join("elsewhere")).expect("mv");
        assert!(matches!(journal.take(), Since::Unknown(why) if why.contains("moved")));
    }

    #[test]
    fn a_workspace_with_too_many_directories_is_not_watched() {
        let dir = tree();
        let limits = Limits {
            watches: 3,
            ..Limits::DEFAULT
        };
        let err = Journal::start(dir.path(), limits).err().expect("refused");
        assert!(matches!(err, JournalError::TooManyDirectories(3)), "{err}");
        assert_eq!(err.to_string(), "the workspace has more than 3 directories");
    }

    #[test]
    fn ancestors_are_nearest_first() {
        let found: Vec<&[u8]> = ancestors(b"a/b/c").collect();
        assert_eq!(found, vec![&b"a/b"[..], &b"a"[..]]);
        assert_eq!(ancestors(b"a").count(), 0);
        assert_eq!(ancestors(b"").count(), 0);
    }
}
