//! Unpacking hostile container-image layers into a rootfs being imported.
//!
//! A layer is a tar stream written by whoever made the image: every name is checked by
//! [`oci::classify`] (relative, no `..`), and every step below the root goes through
//! directory file descriptors opened one component at a time with `O_NOFOLLOW`, so no symlink
//! (one the layer made, or a lower layer's) is ever followed while creating or removing an
//! entry. Hard links may only name files already beneath the root (resolved the same way),
//! device nodes and fifos are not created (counted), set-id bits are cleared, and the bytes
//! and entries written are bounded, and so is how deep a layer's directories nest
//! ([`MAX_DIR_DEPTH`]). The entry bound counts every inode the layer makes and every marker
//! it leaves ([`Stats::counted`]): a directory made only as a parent of an entry the layer
//! lists is as much an entry as a listed one, or a layer could list a few files under deep
//! chains of directories it never names and make hundreds of directories (and as many paths
//! held in memory and in `layer.json`) for each entry counted.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, futimens, mkdirat, FileStat, Mode, SFlag};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};
use sha2::{Digest as _, Sha256};

use super::oci::{self, Action};
use crate::foundation::error::{Error, Result};

/// Bytes of a file's content written at once.
const COPY_BUFFER: usize = 256 << 10;

/// The deepest a directory of an image may be, in directories below the root: far beyond
/// what real images hold (the kernel's `PATH_MAX` of 4096 bytes allows few paths deeper), and
/// it bounds every later walk of the tree (assembly, removal, the vm's disk) to as many levels
/// and open descriptors. A layer nesting deeper is refused at its first entry past it, before
/// anything of that entry is made. Recipe builds make layers within the same bound.
pub(crate) const MAX_DIR_DEPTH: usize = 256;

/// Bounds on what one import may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// File content bytes, all layers together.
    pub max_bytes: u64,
    /// Entries, all layers together, as [`Stats::counted`] counts them.
    pub max_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 16 << 30,
            max_files: 2_000_000,
        }
    }
}

/// What an import wrote and what it left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub bytes: u64,
    pub files: u64,
    /// Device nodes and fifos, not created.
    pub devices_skipped: u64,
    /// Files and directories whose setuid/setgid bits were cleared.
    pub setid_cleared: u64,
    /// Whiteouts and opaque markers.
    pub whiteouts: u64,
    /// Directories made only as parents of entries, which the layers do not list. Absent
    /// from a `layer.json` written before they were counted: 0 there.
    #[serde(default)]
    pub implicit_dirs: u64,
}

impl Stats {
    /// What counts against [`Limits::max_files`]: the entries made, the directories made only
    /// as their parents, and the whiteouts and opaque markers.
    pub fn counted(&self) -> u64 {
        self.files
            .saturating_add(self.implicit_dirs)
            .saturating_add(self.whiteouts)
    }

    /// The refusal of an image whose entries went past `max_files`: what was left of
    /// `--max-files` for the layers counted in `self`.
    pub(super) fn too_many(&self, max_files: u64) -> Error {
        Error::invalid(format!(
            "the image has more files than --max-files, the bound on an image's file count, \
             allows: {} counted ({} entries, {} directories made only as their parents, {} \
             whiteouts and opaque markers) where {max_files} were left; raise --max-files if \
             the image is trusted",
            self.counted(),
            self.files,
            self.implicit_dirs,
            self.whiteouts
        ))
    }
}

/// A reader that hashes (SHA-256) and counts what passes through it.
pub struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> Hashing<R> {
    pub fn new(inner: R) -> Hashing<R> {
        Hashing {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Reads what is left, then checks the digest (and the size, when known).
    pub fn verify(mut self, what: &str, digest: &oci::Digest, size: Option<u64>) -> Result<()> {
        io::copy(&mut self, &mut io::sink())
            .map_err(|err| Error::invalid(format!("reading {what}: {err}")))?;
        let hex: String = self
            .hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if hex != digest.hex {
            return Err(Error::invalid(format!(
                "{what} does not match its digest: expected {digest}, its content is sha256:{hex}; \
                 the image is damaged or was tampered with"
            )));
        }
        if let Some(size) = size.filter(|size| *size != self.count) {
            return Err(Error::invalid(format!(
                "{what} is {} bytes, its descriptor says {size}",
                self.count
            )));
        }
        Ok(())
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// The rootfs being filled, and the running totals across layers.
pub struct Root {
    fd: OwnedFd,
    limits: Limits,
    pub stats: Stats,
    /// Set when this root is one layer's own directory in the layer store
    /// ([`super::layers`]): what the layer does to the layers below it is recorded here, for
    /// assembly, instead of being applied.
    layer: Option<RefCell<LayerRecord>>,
    /// A layer root's directories made only as parents so far ([`LayerRecord::implicit_dirs`]
    /// once done): a set, as each directory entry takes its path out, and a list would cost
    /// every entry a pass over all of them. Joined ([`joined`]), as [`Written`] is.
    implicit: RefCell<HashSet<Box<[u8]>>>,
    /// Directories [`Root::walk`] made as parents, for [`Stats::implicit_dirs`] (`walk`
    /// borrows the root shared).
    parents_made: Cell<u64>,
}

/// A path below the root, as components.
pub type Parts = Vec<Vec<u8>>;

/// What one layer does to the layers below it, which its own directory cannot hold: its
/// whiteouts and opaque directories, hard links to lower layers' files, and the directories
/// it holds only as parents of its entries (whose owner and mode are the lower layers').
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerRecord {
    pub whiteouts: JoinedPaths,
    pub opaques: JoinedPaths,
    /// (link, target): the target is in a lower layer.
    pub links: Vec<(Parts, Parts)>,
    pub implicit_dirs: JoinedPaths,
}

/// Paths held [`joined`], one allocation each however deep (a layer may hold a directory per
/// entry it is allowed, each up to [`MAX_DIR_DEPTH`] deep), and written and read as a list of
/// paths of components, as [`Parts`] are: a `layer.json` reads the same either way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinedPaths(pub Vec<Box<[u8]>>);

impl JoinedPaths {
    /// The paths as components, one at a time.
    pub fn iter(&self) -> impl Iterator<Item = Parts> + '_ {
        self.0.iter().map(|path| split(path))
    }

    /// The paths as components.
    pub fn to_parts(&self) -> Vec<Parts> {
        self.iter().collect()
    }
}

impl serde::Serialize for JoinedPaths {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        struct Components<'a>(&'a [u8]);
        impl serde::Serialize for Components<'_> {
            fn serialize<S: serde::Serializer>(
                &self,
                serializer: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                serializer.collect_seq(components(self.0))
            }
        }
        serializer.collect_seq(self.0.iter().map(|path| Components(path)))
    }
}

impl<'de> serde::Deserialize<'de> for JoinedPaths {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        struct Paths;
        impl<'de> serde::de::Visitor<'de> for Paths {
            type Value = JoinedPaths;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of paths, each a list of components")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<JoinedPaths, A::Error> {
                // One path's components at a time, joined as they come.
                let mut paths = Vec::new();
                while let Some(parts) = seq.next_element::<Parts>()? {
                    paths.push(joined(&parts));
                }
                Ok(JoinedPaths(paths))
            }
        }
        deserializer.deserialize_seq(Paths)
    }
}

/// Paths this layer has put (and their ancestors): a whiteout or opaque marker removes only
/// what lower layers left. Each path is held as its components joined by `/` ([`joined`]):
/// one allocation of its length, where components apart cost an allocation each, and a layer
/// of deep paths holds one per directory it puts or needs.
type Written = HashSet<Box<[u8]>>;

/// A path below the root as one byte string: its components joined by `/`, which no component
/// holds ([`oci::classify`] splits names on it), so [`split`] gives them back.
pub(super) fn joined(parts: &[Vec<u8>]) -> Box<[u8]> {
    parts.join(&b'/').into_boxed_slice()
}

/// The components of a [`joined`] path: none for the root (an opaque marker's directory may
/// be the root), which joins to nothing.
fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|b| *b == b'/').filter(move |_| !path.is_empty())
}

/// The components of a [`joined`] path, owned.
fn split(path: &[u8]) -> Parts {
    components(path).map(<[u8]>::to_vec).collect()
}

impl Root {
    pub fn open(path: &Path, limits: Limits) -> Result<Root> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| fs_error("opening", path.as_os_str().as_bytes(), errno))?;
        Ok(Root {
            fd,
            limits,
            stats: Stats::default(),
            layer: None,
            implicit: RefCell::default(),
            parents_made: Cell::new(0),
        })
    }

    /// A root that is one layer's own directory: whiteouts, opaque markers and hard links to
    /// files not in this layer are recorded ([`Root::into_record`]) instead of applied.
    pub fn open_layer(path: &Path, limits: Limits) -> Result<Root> {
        let mut root = Root::open(path, limits)?;
        root.layer = Some(RefCell::new(LayerRecord::default()));
        Ok(root)
    }

    /// What a layer root recorded (empty for a rootfs).
    pub fn into_record(self) -> LayerRecord {
        let Some(record) = self.layer else {
            return LayerRecord::default();
        };
        let mut record = record.into_inner();
        // Sorted, parents before their children, so `layer.json` follows the layer alone.
        let mut implicit: Vec<Box<[u8]>> = self.implicit.into_inner().into_iter().collect();
        // In component order, as `Parts` sort (`/` is not the least byte).
        implicit.sort_by(|a, b| components(a).cmp(components(b)));
        record.implicit_dirs = JoinedPaths(implicit);
        record
    }

    /// Applies one layer's tar stream. `cancel` is polled between entries.
    pub fn apply_layer(&mut self, tar: impl Read, cancel: &dyn Fn() -> Result<()>) -> Result<()> {
        let mut archive = tar::Archive::new(tar);
        let mut written = Written::new();
        let entries = archive
            .entries()
            .map_err(|err| Error::invalid(format!("reading a layer: {err}")))?;
        for entry in entries {
            cancel()?;
            let entry = entry.map_err(|err| Error::invalid(format!("reading a layer: {err}")))?;
            let path = entry.path_bytes().into_owned();
            let action = oci::classify(&path)?;
            // The directories the entry needs: its parents, and itself for a directory.
            let (dirs, parts) = match &action {
                Action::Skip => (0, None),
                Action::Whiteout { dir, .. } => (dir.len(), Some(dir)),
                Action::Opaque { dir } => (dir.len(), Some(dir)),
                Action::Put(parts) => (
                    parts.len() - usize::from(!entry.header().entry_type().is_dir()),
                    Some(parts),
                ),
            };
            if dirs > MAX_DIR_DEPTH {
                return Err(too_deep(
                    parts.map_or(&[][..], |p| &p[..]),
                    "a layer entry is",
                ));
            }
            match action {
                Action::Skip => {}
                Action::Whiteout { dir, name } => {
                    self.count_whiteout()?;
                    let mut full = dir.clone();
                    full.push(name.clone());
                    if written.contains(&joined(&full)) {
                        continue;
                    }
                    if let Some(record) = &self.layer {
                        record.borrow_mut().whiteouts.0.push(joined(&full));
                        continue;
                    }
                    if let Some(dir_fd) = self.walk(&dir, false)? {
                        remove_tree(dir_fd.as_fd(), &name)?;
                    }
                }
                Action::Opaque { dir } => {
                    self.count_whiteout()?;
                    if let Some(record) = &self.layer {
                        // Everything in this layer's directory is the layer's own.
                        record.borrow_mut().opaques.0.push(joined(&dir));
                        continue;
                    }
                    let Some(dir_fd) = self.walk(&dir, false)? else {
                        continue;
                    };
                    for name in list_dir(dir_fd.as_fd())? {
                        let mut full = dir.clone();
                        full.push(name.clone());
                        if !written.contains(&joined(&full)) {
                            remove_tree(dir_fd.as_fd(), &name)?;
                        }
                    }
                }
                Action::Put(parts) => {
                    self.put(entry, &parts)?;
                    // Longest first: a path already there has its ancestors there too, so
                    // each entry costs its new paths, not a copy of every ancestor's.
                    let path = joined(&parts);
                    let mut end = path.len();
                    for part in parts.iter().rev() {
                        if !written.insert(path[..end].into()) {
                            break;
                        }
                        // Past this component and the `/` before it.
                        end = end.saturating_sub(part.len() + 1);
                    }
                }
            }
        }
        Ok(())
    }

    /// Counts a whiteout or opaque marker, refusing one past the bound before it is recorded
    /// or applied.
    fn count_whiteout(&mut self) -> Result<()> {
        self.stats.whiteouts += 1;
        self.check_count()
    }

    /// Takes in the directories made as parents since the last call, and refuses the layer
    /// if what is counted is past [`Limits::max_files`].
    fn check_count(&mut self) -> Result<()> {
        self.stats.implicit_dirs = self.parents_made.get();
        if self.stats.counted() > self.limits.max_files {
            return Err(self.stats.too_many(self.limits.max_files));
        }
        Ok(())
    }

    /// Creates one entry at `parts`, replacing whatever a lower layer had there.
    fn put<R: Read>(&mut self, mut entry: tar::Entry<'_, R>, parts: &[Vec<u8>]) -> Result<()> {
        let header = entry.header().clone();
        let kind = header.entry_type();
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            self.stats.devices_skipped += 1;
            return Ok(());
        }
        let known = kind.is_dir()
            || kind.is_file()
            || kind.is_contiguous()
            || kind.is_gnu_sparse()
            || kind.is_symlink()
            || kind.is_hard_link();
        if !known {
            // PAX/GNU extension headers the tar reader did not fold in: nothing to create.
            return Ok(());
        }
        if kind.is_file() || kind.is_contiguous() {
            if let Some(real) = pax_sparse_size(&mut entry)? {
                if real > self.limits.max_bytes.saturating_sub(self.stats.bytes) {
                    return Err(self.too_big());
                }
                return Err(Error::invalid(format!(
                    "{} is a sparse file in GNU tar's PAX form (GNU.sparse.* keys), which \
                     DynoCap does not unpack; make the layer without --sparse",
                    display(parts)
                )));
            }
        }
        if kind.is_dir() && self.implicit.borrow_mut().remove(&joined(parts)) {
            // Made as a parent earlier in this layer and counted then: now it is an entry.
            self.parents_made
                .set(self.parents_made.get().saturating_sub(1));
        }
        self.stats.files += 1;
        self.check_count()?;
        let (parent_parts, name) = parts.split_at(parts.len() - 1);
        let name = &name[0];
        // The parents it makes count too: past the bound, the layer stops here, at most
        // `MAX_DIR_DEPTH` directories over it.
        let parent = self
            .walk(parent_parts, true)?
            .ok_or_else(|| Error::internal("a created directory vanished"))?;
        self.check_count()?;
        let parent = parent.as_fd();
        let shown = || display(parts);
        let uid = u32::try_from(header.uid().unwrap_or(0))
            .map_err(|_| Error::invalid(format!("{} has an owner out of range", shown())))?;
        let gid = u32::try_from(header.gid().unwrap_or(0))
            .map_err(|_| Error::invalid(format!("{} has a group out of range", shown())))?;
        let raw_mode = header.mode().unwrap_or(0o644);
        if raw_mode & 0o6000 != 0 {
            self.stats.setid_cleared += 1;
        }
        let existing = stat_at(parent, name)?;
        if kind.is_dir() {
            let (dir, _) = dir_here(parent, name, existing, parts)?;
            fchown(&dir, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                .map_err(|e| fs_error("chowning", &show(parts), e))?;
            fchmod(&dir, Mode::from_bits_truncate(raw_mode & 0o1777))
                .map_err(|e| fs_error("chmoding", &show(parts), e))?;
            return Ok(());
        }
        if kind.is_hard_link() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| Error::invalid(format!("the hard link {} names nothing", shown())))?
                .into_owned();
            let target = oci::entry_components(&target).map_err(|err| {
                Error::invalid(format!("the hard link {}: {}", shown(), err.message))
            })?;
            let Some((target_name, target_dir)) = target.split_last() else {
                return Err(Error::invalid(format!(
                    "the hard link {} names the root",
                    shown()
                )));
            };
            if target == parts {
                return Ok(());
            }
            let Some(source_dir) = self.hard_link_source(parts, target_dir, target_name)? else {
                if let Some(record) = &self.layer {
                    // A lower layer's file: linked when the layers are assembled, where it
                    // must exist then.
                    record
                        .borrow_mut()
                        .links
                        .push((parts.to_vec(), target.clone()));
                    return Ok(());
                }
                return Err(Error::invalid(format!(
                    "the hard link {} names {}, which is not in the image",
                    shown(),
                    display(&target)
                )));
            };
            return link_here(source_dir.as_fd(), target_name, parent, name, parts);
        }
        remove_tree(parent, name)?;
        if kind.is_symlink() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| Error::invalid(format!("the symlink {} names nothing", shown())))?
                .into_owned();
            if target.is_empty() || target.contains(&0) {
                return Err(Error::invalid(format!(
                    "the symlink {} has an empty or NUL target",
                    shown()
                )));
            }
            // The link is content: it is never followed here, and in the guest it resolves
            // inside the guest's own root.
            symlinkat(OsStr::from_bytes(&target), parent, OsStr::from_bytes(name))
                .map_err(|e| fs_error("creating the symlink", &show(parts), e))?;
            fchownat(
                parent,
                OsStr::from_bytes(name),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| fs_error("chowning", &show(parts), e))?;
            return Ok(());
        }
        let size = entry.size();
        let room = self.limits.max_bytes.saturating_sub(self.stats.bytes);
        if size > room {
            return Err(self.too_big());
        }
        let mut file = create_file(parent, name, parts)?;
        // Through a large buffer: io::copy then reads (and gunzips) straight into it and
        // writes a file in a few large writes instead of one per 8 KiB.
        let capacity = usize::try_from(size).map_or(COPY_BUFFER, |s| s.clamp(1, COPY_BUFFER));
        let mut out = io::BufWriter::with_capacity(capacity, &mut file);
        let copied = io::copy(&mut (&mut entry).take(room.saturating_add(1)), &mut out)
            .and_then(|copied| out.flush().map(|()| copied))
            .map_err(|err| Error::invalid(format!("writing {}: {err}", shown())))?;
        drop(out);
        start_writeback(&file);
        self.stats.bytes += copied;
        if self.stats.bytes > self.limits.max_bytes {
            return Err(self.too_big());
        }
        fchown(&file, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(|e| fs_error("chowning", &show(parts), e))?;
        fchmod(&file, Mode::from_bits_truncate(raw_mode & 0o777))
            .map_err(|e| fs_error("chmoding", &show(parts), e))?;
        let mtime = i64::try_from(header.mtime().unwrap_or(0)).unwrap_or(0);
        let time = TimeSpec::new(mtime, 0);
        futimens(&file, &time, &time).map_err(|e| fs_error("timestamping", &show(parts), e))?;
        Ok(())
    }

    fn too_big(&self) -> Error {
        Error::invalid(format!(
            "the image's files add up to more than {} bytes, the bound on an image's size \
             (--max-bytes)",
            self.limits.max_bytes
        ))
    }

    /// The directory holding the file the hard link `link` names (`target_dir`/`target_name`,
    /// reached without following any symlink), or `None` where that file is not in this tree.
    /// A directory is refused: no hard links to directories.
    pub(super) fn hard_link_source(
        &self,
        link: &[Vec<u8>],
        target_dir: &[Vec<u8>],
        target_name: &[u8],
    ) -> Result<Option<OwnedFd>> {
        let source_dir = self.walk(target_dir, false)?;
        let source = match &source_dir {
            Some(dir) => stat_at(dir.as_fd(), target_name)?,
            None => None,
        };
        let (Some(source_dir), Some(source)) = (source_dir, source) else {
            return Ok(None);
        };
        if is_type(source.st_mode, SFlag::S_IFDIR) {
            return Err(Error::invalid(format!(
                "the hard link {} names a directory",
                display(link)
            )));
        }
        Ok(Some(source_dir))
    }

    /// The directory at `parts`, reached one component at a time without following any
    /// symlink; missing components are created when `create`, else `None`.
    pub fn walk(&self, parts: &[Vec<u8>], create: bool) -> Result<Option<OwnedFd>> {
        let mut current = open_dir(self.fd.as_fd(), b".")
            .map_err(|e| fs_error("opening", b"the image root", e))?;
        for (depth, part) in parts.iter().enumerate() {
            let next = match open_dir(current.as_fd(), part) {
                Err(Errno::ENOENT) if create => {
                    mkdirat(
                        current.as_fd(),
                        OsStr::from_bytes(part),
                        Mode::from_bits_truncate(0o755),
                    )
                    .map_err(|e| fs_error("creating", &show(&parts[..=depth]), e))?;
                    self.parents_made.set(self.parents_made.get() + 1);
                    if self.layer.is_some() {
                        self.implicit.borrow_mut().insert(joined(&parts[..=depth]));
                    }
                    open_dir(current.as_fd(), part)
                }
                Err(Errno::ENOENT) => return Ok(None),
                other => other,
            };
            current = next.map_err(|errno| match errno {
                Errno::ELOOP | Errno::ENOTDIR => Error::invalid(format!(
                    "a layer entry goes through {}, which is a symlink or not a directory; \
                     refusing to follow it",
                    String::from_utf8_lossy(&show(&parts[..=depth]))
                )),
                errno => fs_error("opening", &show(&parts[..=depth]), errno),
            })?;
        }
        Ok(Some(current))
    }
}

/// Makes `name` in `parent` a directory, `existing` being what stands there now: anything
/// else is removed (a whole tree, never followed) and a new directory made 0700, so nothing
/// can use it before it is owned and moded. Opens it (no symlink followed) and says whether
/// it was a directory already. `path` names it in errors.
pub(super) fn dir_here(
    parent: BorrowedFd<'_>,
    name: &[u8],
    existing: Option<FileStat>,
    path: &[Vec<u8>],
) -> Result<(OwnedFd, bool)> {
    let was_dir = existing.is_some_and(|st| is_type(st.st_mode, SFlag::S_IFDIR));
    if !was_dir {
        remove_tree(parent, name)?;
        mkdirat(
            parent,
            OsStr::from_bytes(name),
            Mode::from_bits_truncate(0o700),
        )
        .map_err(|e| fs_error("creating", &show(path), e))?;
    }
    let dir = open_dir(parent, name).map_err(|e| fs_error("opening", &show(path), e))?;
    Ok((dir, was_dir))
}

/// Replaces whatever stands at `name` in `parent` by a hard link to `target_name` in
/// `source_dir` (found by [`Root::hard_link_source`]). `path` names the link in errors.
pub(super) fn link_here(
    source_dir: BorrowedFd<'_>,
    target_name: &[u8],
    parent: BorrowedFd<'_>,
    name: &[u8],
    path: &[Vec<u8>],
) -> Result<()> {
    remove_tree(parent, name)?;
    linkat(
        source_dir,
        OsStr::from_bytes(target_name),
        parent,
        OsStr::from_bytes(name),
        AtFlags::empty(),
    )
    .map_err(|e| fs_error("linking", &show(path), e))
}

/// Creates the file `name` in `parent` for writing: new (nothing may stand there, so nothing
/// is followed) and 0600 until it is owned and moded. `path` names it in errors.
/// Starts writing a file just written to its disk, without waiting: the `syncfs` that
/// installs the layer or image it is part of then finds most of their data written already,
/// instead of writing all of it while the pull or import waits. Only a head start, so an
/// error is left to that sync to report.
fn start_writeback(file: &File) {
    // SAFETY: sync_file_range takes the descriptor of `file`, open for the whole call, and
    // integers; no memory is passed.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

pub(super) fn create_file(parent: BorrowedFd<'_>, name: &[u8], path: &[Vec<u8>]) -> Result<File> {
    let fd = openat(
        parent,
        OsStr::from_bytes(name),
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| fs_error("creating", &show(path), e))?;
    Ok(File::from(fd))
}

pub(super) fn open_dir(dir: BorrowedFd<'_>, name: &[u8]) -> nix::Result<OwnedFd> {
    openat(
        dir,
        OsStr::from_bytes(name),
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

pub(super) fn stat_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
) -> Result<Option<nix::sys::stat::FileStat>> {
    match fstatat(dir, OsStr::from_bytes(name), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(errno) => Err(fs_error("reading", name, errno)),
    }
}

pub(super) fn is_type(mode: u32, kind: SFlag) -> bool {
    mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// The names in a directory (not `.` and `..`).
pub(super) fn list_dir(dir: BorrowedFd<'_>) -> Result<Vec<Vec<u8>>> {
    // The fd's /proc link names the directory already opened (without following symlinks).
    let proc = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let entries = std::fs::read_dir(&proc)
        .map_err(|err| Error::internal(format!("listing a directory of the image: {err}")))?;
    Ok(entries
        .flatten()
        .map(|e| e.file_name().as_bytes().to_vec())
        .collect())
}

/// Removes `name` in `dir` and, if a directory, everything under it, never following a
/// symlink. Nothing there is fine.
pub fn remove_tree(dir: BorrowedFd<'_>, name: &[u8]) -> Result<()> {
    let Some(st) = stat_at(dir, name)? else {
        return Ok(());
    };
    if is_type(st.st_mode, SFlag::S_IFDIR) {
        let sub = open_dir(dir, name).map_err(|e| fs_error("opening", name, e))?;
        for child in list_dir(sub.as_fd())? {
            remove_tree(sub.as_fd(), &child)?;
        }
        unlinkat(dir, OsStr::from_bytes(name), UnlinkatFlags::RemoveDir)
            .map_err(|e| fs_error("removing", name, e))
    } else {
        unlinkat(dir, OsStr::from_bytes(name), UnlinkatFlags::NoRemoveDir)
            .map_err(|e| fs_error("removing", name, e))
    }
}

pub(super) fn show(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"/".to_vec();
    out.extend(parts.join(&b'/'));
    out
}

/// The refusal of a tree nesting deeper than [`MAX_DIR_DEPTH`] at `parts` (cut short).
pub(super) fn too_deep(parts: &[Vec<u8>], what: &str) -> Error {
    let shown = &parts[..parts.len().min(MAX_DIR_DEPTH + 1)];
    Error::invalid(format!(
        "{what} more than {MAX_DIR_DEPTH} directories deep ({}…), deeper than an image may \
         be; refusing the image",
        display(shown)
    ))
}

/// A path for messages.
fn display(parts: &[Vec<u8>]) -> String {
    oci::printable(&String::from_utf8_lossy(&show(parts)))
}

pub(super) fn fs_error(doing: &str, path: &[u8], errno: Errno) -> Error {
    Error::internal(format!(
        "{doing} {} in the image being imported: {errno}",
        oci::printable(&String::from_utf8_lossy(path))
    ))
}

/// The size a sparse file in GNU tar's PAX form (`GNU.sparse.*` keys: `--sparse` with
/// `--format=posix`) says it has (`GNU.sparse.realsize`, or the 0.x forms' `GNU.sparse.size`;
/// 0 when it says none), or `None` for any other entry. The tar reader does not expand this
/// form: as it stands it is the sparse map and the data under a made-up name, so it is
/// refused, and one claiming more than the bound is refused by the bound first.
fn pax_sparse_size<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<Option<u64>> {
    let unreadable = |err: io::Error| Error::invalid(format!("reading a PAX header: {err}"));
    let Some(extensions) = entry.pax_extensions().map_err(unreadable)? else {
        return Ok(None);
    };
    let mut sparse = false;
    let mut size = 0;
    // A malformed record is passed over, as the tar reader passes it over for the path.
    for extension in extensions.flatten() {
        let key = extension.key_bytes();
        sparse |= key.starts_with(b"GNU.sparse.");
        if key == b"GNU.sparse.realsize" || key == b"GNU.sparse.size" {
            size = std::str::from_utf8(extension.value_bytes())
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(sparse.then_some(size))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// A tar built entry by entry, headers written raw so hostile names get through (the
    /// fuzz body's tests build theirs with it too).
    pub(crate) struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        pub(crate) fn new() -> Layer {
            Layer(tar::Builder::new(Vec::new()))
        }
        pub(crate) fn entry(
            mut self,
            kind: tar::EntryType,
            path: &str,
            link: &str,
            mode: u32,
            data: &[u8],
        ) -> Self {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            {
                let name = &mut header.as_old_mut().name;
                name[..path.len()].copy_from_slice(path.as_bytes());
            }
            if !link.is_empty() {
                header.set_link_name(link).expect("link");
            }
            header.set_mode(mode);
            // Owned by whoever runs the test, so it passes without root too.
            header.set_uid(u64::from(nix::unistd::geteuid().as_raw()));
            header.set_gid(u64::from(nix::unistd::getegid().as_raw()));
            header.set_size(data.len() as u64);
            header.set_cksum();
            self.0.append(&header, data).expect("append");
            self
        }
        pub(crate) fn file(self, path: &str, data: &str) -> Self {
            self.entry(tar::EntryType::Regular, path, "", 0o644, data.as_bytes())
        }
        pub(crate) fn dir(self, path: &str) -> Self {
            self.entry(tar::EntryType::Directory, path, "", 0o755, b"")
        }
        pub(crate) fn bytes(self) -> Vec<u8> {
            self.0.into_inner().expect("tar")
        }
        /// An entry whose name may be longer than a header holds (a GNU long-name entry
        /// before it, as tar writes one).
        pub(crate) fn long(mut self, kind: tar::EntryType, path: &str) -> Self {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
            header.set_uid(u64::from(nix::unistd::geteuid().as_raw()));
            header.set_gid(u64::from(nix::unistd::getegid().as_raw()));
            header.set_size(0);
            self.0
                .append_data(&mut header, path, io::empty())
                .expect("append");
            self
        }
        /// A symlink `d` to `outside`, then a file written through it: must land nowhere.
        pub(crate) fn through_symlink_to(outside: &std::path::Path) -> Self {
            Layer::new()
                .entry(
                    tar::EntryType::Symlink,
                    "d",
                    outside.to_str().expect("utf8"),
                    0o777,
                    b"",
                )
                .file("d/x", "x")
        }
    }

    fn apply(root: &mut Root, layer: Layer) -> Result<()> {
        root.apply_layer(&layer.bytes()[..], &|| Ok(()))
    }

    #[test]
    fn layers_stack_with_whiteouts_and_opaque_dirs() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut root = Root::open(tmp.path(), Limits::default()).expect("root");
        let lower = Layer::new()
            .dir("etc")
            .file("etc/keep", "k")
            .file("etc/gone", "g")
            .dir("opt")
            .file("opt/old", "o")
            .file("usr/bin/tool", "t");
        apply(&mut root, lower).expect("lower");
        let upper = Layer::new()
            .file("etc/.wh.gone", "")
            .entry(tar::EntryType::Directory, "opt", "", 0o755, b"")
            .file("opt/new", "n")
            .file("opt/.wh..wh..opq", "")
            .entry(tar::EntryType::Regular, "usr/bin/suid", "", 0o4755, b"x")
            .entry(
                tar::EntryType::Link,
                "usr/bin/tool2",
                "usr/bin/tool",
                0o755,
                b"",
            )
            .entry(tar::EntryType::Char, "dev-null", "", 0o666, b"")
            .entry(tar::EntryType::Symlink, "lib", "usr/lib", 0o777, b"");
        apply(&mut root, upper).expect("upper");
        let p = tmp.path();
        assert!(p.join("etc/keep").is_file() && !p.join("etc/gone").exists());
        assert!(p.join("opt/new").is_file() && !p.join("opt/old").exists());
        let suid = std::fs::metadata(p.join("usr/bin/suid")).expect("stat");
        assert_eq!(suid.permissions().mode() & 0o7777, 0o755);
        assert_eq!(
            suid.ino(),
            std::fs::metadata(p.join("usr/bin/suid"))
                .expect("stat")
                .ino()
        );
        assert_eq!(
            std::fs::metadata(p.join("usr/bin/tool2"))
                .expect("stat")
                .ino(),
            std::fs::metadata(p.join("usr/bin/tool"))
                .expect("stat")
                .ino()
        );
        assert!(!p.join("dev-null").exists());
        assert_eq!(root.stats.devices_skipped, 1);
        assert_eq!(root.stats.setid_cleared, 1);
    }

    /// A layer Docker made on aufs carries aufs's bookkeeping at its root: the layer
    /// unpacks (as Docker and containerd unpack it) with none of it in the image.
    #[test]
    fn aufs_bookkeeping_is_left_out() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut root = Root::open(tmp.path(), Limits::default()).expect("root");
        let layer = Layer::new()
            .entry(tar::EntryType::Directory, ".wh..wh.plnk", "", 0o700, b"")
            .file(".wh..wh.plnk/123.456", "linked")
            .entry(tar::EntryType::Directory, ".wh..wh.orph", "", 0o700, b"")
            .file(".wh..wh.aufs", "")
            .file("etc/app", "a");
        apply(&mut root, layer).expect("an aufs-made layer unpacks");
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["etc"]);
        assert_eq!(root.stats.files, 1);
    }

    /// `d/d/…` `levels` directories deep.
    fn nested(levels: usize) -> String {
        vec!["d"; levels].join("/")
    }

    /// A layer may nest directories [`MAX_DIR_DEPTH`] deep and no deeper: past that, its
    /// first entry needing a deeper directory (listed, implied by a file's path, or the
    /// directory of a whiteout or opaque marker) is refused naming the bound, and nothing
    /// past it is made. Before the bound, a layer 3000 deep took minutes to unpack and
    /// overflowed the stack when assembled.
    #[test]
    fn a_layer_nesting_past_the_depth_bound_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut within = Layer::new();
        for level in 1..=MAX_DIR_DEPTH {
            within = within.long(tar::EntryType::Directory, &nested(level));
        }
        let deepest = format!("{}/f", nested(MAX_DIR_DEPTH));
        within = within.long(tar::EntryType::Regular, &deepest);
        let mut root = Root::open(tmp.path(), Limits::default()).expect("root");
        apply(&mut root, within).expect("as deep as the bound");
        let mut dir = File::open(tmp.path()).expect("open root");
        for _ in 0..MAX_DIR_DEPTH {
            dir = File::from(open_dir(dir.as_fd(), b"d").expect("a level"));
        }
        assert!(stat_at(dir.as_fd(), b"f").expect("stat").is_some());
        let past = nested(MAX_DIR_DEPTH + 1);
        let cases = [
            (
                "a directory",
                Layer::new().long(tar::EntryType::Directory, &past),
            ),
            (
                "a file's parents",
                Layer::new().long(tar::EntryType::Regular, &format!("{past}/f")),
            ),
            (
                "a symlink's parents",
                Layer::new().long(tar::EntryType::Symlink, &format!("{past}/l")),
            ),
            (
                "a whiteout's directory",
                Layer::new().long(tar::EntryType::Regular, &format!("{past}/.wh.f")),
            ),
            (
                "an opaque directory",
                Layer::new().long(tar::EntryType::Regular, &format!("{past}/.wh..wh..opq")),
            ),
            (
                "thousands of levels",
                Layer::new().long(tar::EntryType::Regular, &format!("{}/f", nested(3000))),
            ),
        ];
        for (what, layer) in cases {
            let bytes = layer.bytes();
            for store in [false, true] {
                let tmp = tempfile::tempdir().expect("tempdir");
                let mut root = if store {
                    Root::open_layer(tmp.path(), Limits::default())
                } else {
                    Root::open(tmp.path(), Limits::default())
                }
                .expect("root");
                let err = root.apply_layer(&bytes[..], &|| Ok(())).expect_err(what);
                assert!(
                    err.message
                        .contains(&format!("more than {MAX_DIR_DEPTH} directories deep")),
                    "{what}: {err}"
                );
                assert_eq!(
                    err.code,
                    crate::foundation::error::ErrorCode::InvalidArgument
                );
                // Refused before anything of the entry was made.
                assert_eq!(
                    std::fs::read_dir(tmp.path()).expect("ls").count(),
                    0,
                    "{what}"
                );
            }
        }
        // The entry past the bound is refused where it comes, after those within it.
        let mut one_more = Layer::new();
        for level in 1..=MAX_DIR_DEPTH + 1 {
            one_more = one_more.long(tar::EntryType::Directory, &nested(level));
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut root = Root::open(tmp.path(), Limits::default()).expect("root");
        assert!(apply(&mut root, one_more).is_err());
        assert_eq!(root.stats.files, MAX_DIR_DEPTH as u64);
    }

    /// A layer root records the directories it made only as parents, in path order, less
    /// those the layer lists itself (before or after their entries).
    #[test]
    fn a_layer_records_the_directories_it_holds_only_as_parents() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut root = Root::open_layer(tmp.path(), Limits::default()).expect("root");
        let layer = Layer::new()
            .file("z/y/f", "f")
            .file("a/b/c/f", "f")
            .dir("a/b")
            .dir("m")
            .file("m/n/f", "f");
        apply(&mut root, layer).expect("apply");
        let parts =
            |path: &str| -> Parts { path.split('/').map(|p| p.as_bytes().to_vec()).collect() };
        assert_eq!(
            root.into_record().implicit_dirs.to_parts(),
            ["a", "a/b/c", "m/n", "z", "z/y"].map(parts).to_vec()
        );
    }

    #[test]
    fn hostile_entries_are_refused_and_nothing_lands_outside() {
        let outside = tempfile::tempdir().expect("tempdir");
        let cases: Vec<(&str, Layer)> = vec![
            ("dotdot", Layer::new().file("../escape", "x")),
            ("absolute", Layer::new().file("/abs", "x")),
            (
                "symlinked parent",
                Layer::through_symlink_to(outside.path()),
            ),
            ("whiteout of ..", Layer::new().file("a/.wh...", "")),
            (
                "hard link outside",
                Layer::new().entry(tar::EntryType::Link, "h", "../../etc/shadow", 0o644, b""),
            ),
            (
                "hard link absolute",
                Layer::new().entry(tar::EntryType::Link, "h", "/etc/shadow", 0o644, b""),
            ),
            (
                "hard link to nothing",
                Layer::new().entry(tar::EntryType::Link, "h", "etc/shadow", 0o644, b""),
            ),
        ];
        for (what, layer) in cases {
            let tmp = tempfile::tempdir().expect("tempdir");
            let root_dir = tmp.path().join("root");
            std::fs::create_dir(&root_dir).expect("mkdir");
            let mut root = Root::open(&root_dir, Limits::default()).expect("root");
            let err = apply(&mut root, layer).expect_err(what);
            assert!(!err.message.is_empty(), "{what}");
            assert!(!tmp.path().join("escape").exists(), "{what}");
            assert!(!tmp.path().join("h").exists(), "{what}");
            assert_eq!(
                std::fs::read_dir(outside.path()).expect("read").count(),
                0,
                "{what}"
            );
        }
    }

    #[test]
    fn bounds_name_themselves() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let limits = Limits {
            max_bytes: 10,
            max_files: 3,
        };
        let mut root = Root::open(tmp.path(), limits).expect("root");
        let err = apply(&mut root, Layer::new().file("big", "01234567890")).expect_err("bytes");
        assert!(err.message.contains("--max-bytes"), "{err}");
        let mut root = Root::open(tmp.path(), limits).expect("root");
        let many = Layer::new()
            .file("a", "")
            .file("b", "")
            .file("c", "")
            .file("d", "");
        let err = apply(&mut root, many).expect_err("files");
        assert!(err.message.contains("--max-files"), "{err}");
    }

    /// Each file under `x<i>/` and the directories `dirs[i]` names below it, none listed.
    fn unlisted_parents(dirs: &[&str]) -> Layer {
        dirs.iter()
            .enumerate()
            .fold(Layer::new(), |layer, (i, dirs)| {
                layer.file(&format!("x{i}/{dirs}/f"), "")
            })
    }

    /// Both unpack modes: into a rootfs, and into a layer's own directory of the store.
    fn both_modes(limits: Limits, layer: impl Fn() -> Layer) -> [(Result<()>, Stats); 2] {
        [false, true].map(|own| {
            let tmp = tempfile::tempdir().expect("tempdir");
            let mut root = if own {
                Root::open_layer(tmp.path(), limits)
            } else {
                Root::open(tmp.path(), limits)
            }
            .expect("root");
            let result = apply(&mut root, layer());
            (result, root.stats.clone())
        })
    }

    #[test]
    fn directories_made_only_as_parents_count_against_max_files() {
        let limits = Limits {
            max_bytes: 1 << 20,
            max_files: 10,
        };
        // 2 files and 8 directories they need (x0 a b c d, x1 a b): exactly the bound.
        for (result, stats) in both_modes(limits, || unlisted_parents(&["a/b/c/d", "a/b"])) {
            result.expect("within the bound");
            assert_eq!((stats.files, stats.implicit_dirs), (2, 8));
            assert_eq!(stats.counted(), 10);
        }
        // One directory more is one past it, though the layer lists only 2 entries.
        for (result, stats) in both_modes(limits, || unlisted_parents(&["a/b/c/d", "a/b/c"])) {
            let err = result.expect_err("past the bound");
            assert_eq!(
                err.code,
                crate::foundation::error::ErrorCode::InvalidArgument
            );
            assert!(
                err.message.contains("--max-files")
                    && err.message.contains("11 counted")
                    && err
                        .message
                        .contains("2 entries, 9 directories made only as their parents"),
                "{err}"
            );
            assert_eq!(stats.counted(), 11);
        }
        // Deep chains: the first entry past the bound stops the layer, its parents made.
        let deep = vec!["a"; 40].join("/");
        for (result, stats) in both_modes(limits, || unlisted_parents(&[&deep, &deep])) {
            result.expect_err("a chain past the bound");
            assert_eq!((stats.files, stats.implicit_dirs), (1, 41));
        }
    }

    #[test]
    fn a_directory_listed_after_its_entries_counts_once_in_a_layer() {
        let limits = Limits {
            max_bytes: 1 << 20,
            max_files: 3,
        };
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut root = Root::open_layer(tmp.path(), limits).expect("root");
        // d and d/e made as parents of the file, then listed: 3 entries, no parent-only.
        let layer = Layer::new().file("d/e/f", "").dir("d/e").dir("d");
        apply(&mut root, layer).expect("three entries");
        assert_eq!((root.stats.files, root.stats.implicit_dirs), (3, 0));
        assert!(root.into_record().implicit_dirs.0.is_empty());
    }

    #[test]
    fn whiteouts_and_opaque_markers_count_against_max_files() {
        let limits = Limits {
            max_bytes: 1 << 20,
            max_files: 3,
        };
        let markers = || {
            Layer::new()
                .file(".wh.a", "")
                .file(".wh.b", "")
                .file("o/.wh..wh..opq", "")
        };
        for (result, stats) in both_modes(limits, markers) {
            result.expect("3 markers");
            assert_eq!((stats.files, stats.whiteouts, stats.counted()), (0, 3, 3));
        }
        for (result, stats) in both_modes(limits, || markers().file("p/.wh..wh..opq", "")) {
            let err = result.expect_err("4 markers");
            assert!(
                err.message.contains("--max-files")
                    && err.message.contains("4 whiteouts and opaque markers"),
                "{err}"
            );
            assert_eq!(stats.whiteouts, 4);
        }
    }

    #[test]
    fn a_whiteout_spares_the_parents_of_what_its_own_layer_put() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut root = Root::open(tmp.path(), Limits::default()).expect("root");
        let lower = Layer::new()
            .file("d/e/old", "o")
            .file("d/x", "x")
            .file("d/ex", "x");
        apply(&mut root, lower).expect("lower");
        // d/e is this layer's (a parent of its entry): its whiteout is not of a lower layer's.
        let upper = Layer::new()
            .file("d/e/f/g", "g")
            .file("d/.wh.e", "")
            .file("d/.wh.x", "")
            .file("d/.wh.ex", "");
        apply(&mut root, upper).expect("upper");
        assert!(tmp.path().join("d/e/old").exists());
        assert!(tmp.path().join("d/e/f/g").exists());
        assert!(!tmp.path().join("d/x").exists());
        assert!(!tmp.path().join("d/ex").exists());
    }

    #[test]
    fn joined_paths_read_and_write_as_lists_of_components() {
        let parts: Vec<Parts> = vec![
            vec![],
            vec![b"usr".to_vec()],
            vec![b"usr".to_vec(), b"l\xffb".to_vec(), b"x".to_vec()],
        ];
        let written = serde_json::to_string(&parts).expect("parts");
        let paths: JoinedPaths = serde_json::from_str(&written).expect("as a layer.json has them");
        assert_eq!(paths.0[2][..], b"usr/l\xffb/x"[..]);
        assert_eq!(paths.to_parts(), parts);
        assert_eq!(serde_json::to_string(&paths).expect("paths"), written);
        let empty: JoinedPaths = serde_json::from_str("[]").expect("none");
        assert_eq!(serde_json::to_string(&empty).expect("none"), "[]");
    }

    #[test]
    fn stats_of_a_layer_stored_before_parents_counted_still_read() {
        let stored = r#"{"bytes":5,"files":2,"devicesSkipped":0,"setidCleared":1,"whiteouts":3}"#;
        let stats: Stats = serde_json::from_str(stored).expect("an older layer.json's stats");
        assert_eq!((stats.implicit_dirs, stats.counted()), (0, 5));
    }

    /// A GNU sparse entry (type `S`) of `real` bytes holding 512 stored ones at its end.
    fn gnu_sparse(name: &str, real: u64) -> Vec<u8> {
        let mut header = tar::Header::new_gnu();
        header.set_path(name).expect("name");
        header.set_entry_type(tar::EntryType::GNUSparse);
        header.set_mode(0o644);
        header.set_size(512);
        let gnu = header.as_gnu_mut().expect("gnu");
        gnu.set_real_size(real);
        gnu.sparse[0].set_offset(real - 512);
        gnu.sparse[0].set_length(512);
        header.set_cksum();
        let mut tar = header.as_bytes().to_vec();
        tar.extend([b'x'; 512]);
        tar.extend([0u8; 1024]);
        tar
    }

    /// A sparse file in GNU tar's PAX 1.0 form: `GNU.sparse.*` keys, then a regular entry
    /// holding the map and 512 stored bytes at the end of `real`.
    fn pax_sparse(name: &str, real: u64) -> Vec<u8> {
        let mut records = Vec::new();
        for (key, value) in [
            ("GNU.sparse.major", "1".to_owned()),
            ("GNU.sparse.minor", "0".to_owned()),
            ("GNU.sparse.name", name.to_owned()),
            ("GNU.sparse.realsize", real.to_string()),
        ] {
            let rest = format!(" {key}={value}\n");
            let mut len = rest.len() + 1;
            while len.to_string().len() + rest.len() != len {
                len += 1;
            }
            records.extend(format!("{len}{rest}").into_bytes());
        }
        let block = |data: &[u8]| {
            let mut out = data.to_vec();
            out.resize(data.len().div_ceil(512) * 512, 0);
            out
        };
        let header = |path: &str, kind: tar::EntryType, size: usize| {
            let mut header = tar::Header::new_ustar();
            header.set_path(path).expect("path");
            header.set_entry_type(kind);
            header.set_mode(0o644);
            header.set_size(size as u64);
            header.set_cksum();
            header.as_bytes().to_vec()
        };
        let map = block(format!("1\n{}\n512\n", real - 512).as_bytes());
        let mut tar = header("PaxHeaders/x", tar::EntryType::XHeader, records.len());
        tar.extend(block(&records));
        tar.extend(header(
            &format!("GNUSparseFile.0/{name}"),
            tar::EntryType::Regular,
            map.len() + 512,
        ));
        tar.extend(map);
        tar.extend([b'x'; 512]);
        tar.extend([0u8; 1024]);
        tar
    }

    #[test]
    fn huge_sparse_files_are_refused_by_the_size_bound_and_write_nothing() {
        for (what, tar) in [
            ("gnu", gnu_sparse("huge", 1 << 40)),
            ("pax", pax_sparse("huge", 1 << 40)),
        ] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let mut root = Root::open(tmp.path(), Limits::default()).expect("root");
            let err = root.apply_layer(&tar[..], &|| Ok(())).expect_err(what);
            assert!(err.message.contains("--max-bytes"), "{what}: {err}");
            assert_eq!(
                std::fs::read_dir(tmp.path()).expect("ls").count(),
                0,
                "{what}: nothing is made"
            );
        }
        // Within the bound: the GNU form is expanded, the PAX form refused by name.
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut root = Root::open(tmp.path(), Limits::default()).expect("root");
        root.apply_layer(&gnu_sparse("small", 4096)[..], &|| Ok(()))
            .expect("gnu sparse");
        let data = std::fs::read(tmp.path().join("small")).expect("read");
        assert_eq!(data.len(), 4096);
        assert!(data[..3584].iter().all(|b| *b == 0) && data[3584..].iter().all(|b| *b == b'x'));
        let err = root
            .apply_layer(&pax_sparse("small", 4096)[..], &|| Ok(()))
            .expect_err("pax sparse");
        assert!(err.message.contains("GNU tar's PAX form"), "{err}");
        assert!(!tmp.path().join("GNUSparseFile.0").exists());
    }

    #[test]
    fn hashing_checks_digest_and_size() {
        let data = b"hello";
        let hex: String = Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let digest = oci::Digest { hex };
        Hashing::new(&data[..])
            .verify("blob", &digest, Some(5))
            .expect("ok");
        assert!(Hashing::new(&data[..])
            .verify("blob", &digest, Some(6))
            .is_err());
        let err = Hashing::new(&b"hellO"[..])
            .verify("blob", &digest, None)
            .expect_err("mismatch");
        assert!(err.message.contains("does not match"), "{err}");
    }
}
