//! The part of the baseline a patch can see: which entries of the host's `baseline.tar` a
//! `git apply` of a given patch reads, and extracting just those (one pass over the tar,
//! seeking past the contents of everything else), so that verification costs O(patch) rather
//! than O(project).
//!
//! `git apply` (without `--index`) looks at the work tree only through the paths the patch
//! names, so the verdict on a subset of the baseline equals the verdict on all of it when the
//! subset holds, for every path `P` the patch names (old and new names alike):
//! - `P` itself, whatever it is (file, symlink, directory), or nothing if the baseline has none;
//! - every leading directory of `P`: git refuses to write beyond a symlink and cannot create
//!   `a/b` where `a` is a file;
//! - everything under `P` when `P` is a directory: git replaces a directory by a file only if
//!   it is empty;
//! - when a leading directory is a symlink within the tree, what `P` is through it: git
//!   refuses `P` either way, but says why (a symlink) only if `P` resolves. So paths beneath
//!   a symlink take another pass, up to [`MAX_LINK_HOPS`] links deep.
//!
//! Names that were not UTF-8 reach the parser as U+FFFD, so tar names are compared in that
//! same lossy form: at worst a few extra entries are extracted, never one too few.

use std::collections::{HashMap, HashSet};
use std::io::{Seek, SeekFrom};
use std::path::Path;

use super::tree_files::TreeFiles;
use crate::patch::FilePatch;
use crate::tar_index::{entry_name, TarIndex};

/// Symlinked leading directories followed, one pass over the tar each (Linux's own limit on
/// links in one path is 40; a real tree needs one or two).
const MAX_LINK_HOPS: usize = 8;

/// The baseline paths a patch's `git apply` reads (see the module doc).
#[derive(Debug, Default)]
pub struct Touched {
    /// Every path the patch names, old and new.
    named: HashSet<String>,
    /// Every leading directory of a named path (`""` is the root).
    leading: HashSet<String>,
}

impl Touched {
    pub fn of(files: &[FilePatch<'_>]) -> Self {
        Self::from_names(
            files
                .iter()
                .flat_map(|file| file.old_path.iter().chain(&file.new_path))
                .cloned(),
        )
    }

    pub(crate) fn from_names(names: impl IntoIterator<Item = String>) -> Self {
        let mut touched = Touched::default();
        touched.leading.insert(String::new());
        for name in names {
            for (slash, _) in name.match_indices('/') {
                touched.leading.insert(name[..slash].to_owned());
            }
            touched.named.insert(name);
        }
        touched
    }

    /// Whether the tar entry `path` (lossy, without a trailing `/`) is one a `git apply` of
    /// the patch can read.
    fn wants(&self, path: &str) -> bool {
        if self.named.contains(path) || self.leading.contains(path) {
            return true;
        }
        // Inside a named path (which the baseline has as a directory)?
        path.match_indices('/')
            .any(|(slash, _)| self.named.contains(&path[..slash]))
    }

    /// The entries of `index` that [`wants`](Self::wants) would pick out of a pass over the
    /// whole tar (possibly some twice), found by lookups: O(patch), not O(tar).
    fn lookup<'a>(&'a self, index: &'a TarIndex) -> impl Iterator<Item = (&'a str, u64)> + 'a {
        let exact = self
            .named
            .iter()
            .chain(&self.leading)
            .filter_map(|name| index.find(name));
        let beneath = self
            .named
            .iter()
            .filter(|name| !name.is_empty())
            .flat_map(|name| index.beneath(name));
        exact.chain(beneath)
    }

    /// The named paths beneath the symlink `link` (pointing to `target`), spelled through
    /// its target instead; none when the target leaves the tree.
    fn through(&self, link: &str, target: &str) -> Vec<String> {
        let parent = link.rsplit_once('/').map_or("", |(parent, _)| parent);
        let Some(resolved) = resolve(parent, target) else {
            return Vec::new();
        };
        let prefix = format!("{link}/");
        self.named
            .iter()
            .filter_map(|name| name.strip_prefix(&prefix))
            .map(|rest| {
                if resolved.is_empty() {
                    rest.to_owned()
                } else {
                    format!("{resolved}/{rest}")
                }
            })
            .collect()
    }
}

/// `target` read from directory `dir` (both relative to the tree's root), `.` and `..`
/// resolved; `None` if it is absolute or climbs out of the tree.
fn resolve(dir: &str, target: &str) -> Option<String> {
    if target.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = dir.split('/').filter(|c| !c.is_empty()).collect();
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

/// Where the entries come from: the tar's offset index, or a pass over every header.
pub enum Source<'a> {
    Indexed(&'a TarIndex),
    Scan,
}

/// Why an extraction failed.
#[derive(Debug)]
pub enum Failure {
    /// The index led somewhere else than it said: read the tar without it.
    IndexWrong(String),
    /// The baseline itself cannot be read or unpacked: the verdict, in words for the user.
    Baseline(String),
    /// The entries' contents would take more than the budget given.
    OverBudget,
}

/// What the extracted contents may take, in bytes (`None`: no bound).
#[derive(Debug, Clone, Copy)]
pub struct Budget(pub Option<u64>);

impl Budget {
    /// Counts `entry`'s contents against the budget before it is written.
    fn spend<R: std::io::Read>(&mut self, entry: &tar::Entry<'_, R>) -> Result<(), Failure> {
        self.spend_bytes(entry.size())
    }

    /// Gives back what [`spend_bytes`](Self::spend_bytes) took for contents not written.
    fn refund(&mut self, size: u64) {
        if let Some(left) = &mut self.0 {
            *left = left.saturating_add(size);
        }
    }

    /// Counts `size` bytes of contents against the budget before they are written.
    fn spend_bytes(&mut self, size: u64) -> Result<(), Failure> {
        if let Some(left) = &mut self.0 {
            *left = left.checked_sub(size).ok_or(Failure::OverBudget)?;
        }
        Ok(())
    }
}

/// Extracts into `dest` the entries of `baseline_tar` that `touched` wants, with the same
/// settings (and so the same modes, links and refusals) as unpacking all of it, stopping at
/// the first entry whose contents would exceed `budget`. Returns how many entries were
/// extracted.
pub fn extract(
    baseline_tar: &Path,
    source: &Source<'_>,
    touched: &Touched,
    dest: &Path,
    mut budget: Budget,
) -> Result<u64, Failure> {
    // As `Archive::unpack` does: an absolute destination.
    let dest = dest
        .canonicalize()
        .map_err(|err| Failure::Baseline(format!("unpacking the baseline copy: {err}")))?;
    let tar = std::fs::File::open(baseline_tar).map_err(|err| {
        Failure::Baseline(format!(
            "the host's baseline copy is missing ({err}); the patch cannot be checked"
        ))
    })?;
    let mut files = TreeFiles::open(&dest).map_err(|err| Failure::Baseline(unpacking(err)))?;
    let mut extracted = HashSet::new();
    let mut pass = |touched: &Touched, extracted: &mut HashSet<String>| {
        let mut out = Out {
            dest: &dest,
            files: &mut files,
            budget: &mut budget,
            buffer: Vec::new(),
        };
        match source {
            Source::Indexed(index) => pass_indexed(&tar, index, touched, extracted, &mut out),
            Source::Scan => pass_scan(&tar, touched, extracted, &mut out),
        }
    };
    // Every symlink extracted so far, with its target: one a later pass leads through may
    // have been extracted by an earlier one (named there, or a leading directory of another
    // path), and is not read again.
    let mut symlinks: HashMap<String, String> =
        pass(touched, &mut extracted)?.into_iter().collect();
    let mut beyond_links: Touched;
    let mut current = touched;
    for _ in 0..MAX_LINK_HOPS {
        let beyond: Vec<String> = current
            .leading
            .iter()
            .filter_map(|dir| symlinks.get_key_value(dir))
            .flat_map(|(link, target)| current.through(link, target))
            .filter(|name| !extracted.contains(name))
            .collect();
        if beyond.is_empty() {
            break;
        }
        beyond_links = Touched::from_names(beyond);
        current = &beyond_links;
        symlinks.extend(pass(current, &mut extracted)?);
    }
    Ok(u64::try_from(extracted.len()).unwrap_or(u64::MAX))
}

fn unpacking(err: std::io::Error) -> String {
    format!("unpacking the baseline copy: {err}")
}

/// Where a pass writes what it extracts, and what it may spend.
struct Out<'a> {
    dest: &'a Path,
    files: &'a mut TreeFiles,
    budget: &'a mut Budget,
    /// Reused by [`write_regular_at`].
    buffer: Vec<u8>,
}

impl Out<'_> {
    /// Writes a non-directory entry: a regular file through [`TreeFiles`], anything else (and
    /// a file whose path it cannot take as it is) as `unpack_in` does.
    fn write<R: std::io::Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), Failure> {
        let baseline = |err| Failure::Baseline(unpacking(err));
        if entry.header().entry_type() == tar::EntryType::Regular {
            let mode = entry.header().mode().map_err(baseline)?;
            let name = entry.path_bytes().into_owned();
            let size = entry.size();
            if self.write_regular(&name, entry, mode, size)? {
                return Ok(());
            }
        }
        self.budget.spend(entry)?;
        entry.unpack_in(self.dest).map(drop).map_err(baseline)
    }

    /// Writes a regular file of `size` bytes through [`TreeFiles`], counted against the
    /// budget. `Ok(false)`: a path the tree writer does not take as it is; nothing was
    /// written or counted.
    fn write_regular(
        &mut self,
        name: &[u8],
        contents: &mut impl std::io::Read,
        mode: u32,
        size: u64,
    ) -> Result<bool, Failure> {
        self.write_regular_with(name, mode, size, |file| {
            std::io::copy(contents, file).map(drop)
        })
    }

    /// [`write_regular`](Self::write_regular), the contents written by `fill`.
    fn write_regular_with(
        &mut self,
        name: &[u8],
        mode: u32,
        size: u64,
        fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
    ) -> Result<bool, Failure> {
        self.budget.spend_bytes(size)?;
        let written = self.files.write(name, mode, fill).map_err(|err| {
            Failure::Baseline(unpacking(std::io::Error::new(
                err.kind(),
                format!("{}: {err}", String::from_utf8_lossy(name)),
            )))
        })?;
        if !written {
            self.budget.refund(size);
        }
        Ok(written)
    }
}

/// A tar reader over the whole file from its current position, set as `Archive::unpack`
/// would be (but for timestamps).
fn archive(tar: &std::fs::File) -> tar::Archive<&std::fs::File> {
    // Unbuffered: each header is one 512-byte read; a buffer would fill itself with contents
    // only to throw them away, which made reading a large tar's headers slower.
    let mut archive = tar::Archive::new(tar);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(false);
    // `git apply` without `--index` compares no timestamps: setting each file's is a system
    // call per entry for nothing.
    archive.set_preserve_mtime(false);
    archive
}

/// One pass over the tar: extracts what `touched` wants and `extracted` does not hold yet
/// (adding it there); returns the symlinks it extracted, with their targets.
fn pass_scan(
    tar: &std::fs::File,
    touched: &Touched,
    extracted: &mut HashSet<String>,
    out: &mut Out<'_>,
) -> Result<Vec<(String, String)>, Failure> {
    let baseline = |err| Failure::Baseline(unpacking(err));
    (&*tar).rewind().map_err(baseline)?;
    let mut archive = archive(tar);
    // Directories last, deepest first (as `Archive::unpack` does), so that a directory's mode
    // cannot stop its own entries from being written.
    let mut directories = Vec::new();
    let mut links = Vec::new();
    for entry in archive.entries_with_seek().map_err(baseline)? {
        let mut entry = entry.map_err(baseline)?;
        let path = entry_name(&entry.path_bytes());
        if !touched.wants(&path) || !extracted.insert(path.clone()) {
            continue;
        }
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::Directory {
            directories.push(entry);
            continue;
        }
        if kind.is_symlink() {
            if let Some(target) = entry.link_name_bytes() {
                links.push((path, String::from_utf8_lossy(&target).into_owned()));
            }
        }
        out.write(&mut entry)?;
    }
    directories.sort_by(|a, b| b.path_bytes().cmp(&a.path_bytes()));
    for mut dir in directories {
        dir.unpack_in(out.dest).map_err(baseline)?;
    }
    Ok(links)
}

/// [`pass_scan`] through the index: only the wanted entries' headers are read, in tar order.
fn pass_indexed(
    tar: &std::fs::File,
    index: &TarIndex,
    touched: &Touched,
    extracted: &mut HashSet<String>,
    out: &mut Out<'_>,
) -> Result<Vec<(String, String)>, Failure> {
    let mut wanted: Vec<(u64, &str)> = touched
        .lookup(index)
        .filter(|(name, _)| !extracted.contains(*name))
        .map(|(name, offset)| (offset, name))
        .collect();
    // In tar order, as a pass over the tar meets them (and each once).
    wanted.sort_unstable();
    wanted.dedup();
    let mut directories = Vec::new();
    let mut links = Vec::new();
    for &(offset, name) in &wanted {
        if !extracted.insert(name.to_owned()) {
            continue;
        }
        if write_regular_at(tar, offset, name, out)? {
            continue;
        }
        let kind = with_entry_at(tar, offset, name, |entry| {
            let kind = entry.header().entry_type();
            if kind == tar::EntryType::Directory {
                return Ok(kind);
            }
            if kind.is_symlink() {
                if let Some(target) = entry.link_name_bytes() {
                    links.push((
                        name.to_owned(),
                        String::from_utf8_lossy(&target).into_owned(),
                    ));
                }
            }
            out.write(entry)?;
            Ok(kind)
        })?;
        if kind == tar::EntryType::Directory {
            directories.push((name, offset));
        }
    }
    directories.sort_unstable_by(|a, b| b.0.cmp(a.0));
    for (name, offset) in directories {
        with_entry_at(tar, offset, name, |entry| {
            entry
                .unpack_in(out.dest)
                .map_err(|err| Failure::Baseline(unpacking(err)))
                .map(|_| ())
        })?;
    }
    Ok(links)
}

/// How much of the tar [`write_regular_at`] reads at an entry's offset: its header and
/// contents up to this size, which most source files fit.
const SMALL_READ: usize = 32 << 10;

/// Writes the entry at `offset` if it is a regular file named `name` whose header stands alone
/// (no long-name or extended header before it): one `pread` for the header and contents that
/// fit [`SMALL_READ`] with it, a copy within the kernel for larger contents, where the tar
/// crate's reader takes a seek and a read for the header and a read and a write per 8 KiB of
/// contents. `Ok(false)`: not such an entry, nothing was written (the tar crate's reader
/// takes it, and checks it as it always did).
fn write_regular_at(
    tar: &std::fs::File,
    offset: u64,
    name: &str,
    out: &mut Out<'_>,
) -> Result<bool, Failure> {
    use std::os::unix::fs::FileExt;
    let wrong = |why: String| Failure::IndexWrong(format!("entry {name:?} at {offset}: {why}"));
    out.buffer.resize(SMALL_READ, 0);
    let mut read = 0;
    while read < 512 {
        match tar.read_at(&mut out.buffer[read..], offset + read as u64) {
            Ok(0) => return Err(wrong("the tar ends there".to_owned())),
            Ok(n) => read += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(Failure::Baseline(unpacking(err))),
        }
    }
    let Some(header) = tar_header(&out.buffer[..512]) else {
        return Ok(false);
    };
    if header.entry_type() != tar::EntryType::Regular {
        return Ok(false);
    }
    let (Ok(size), Ok(mode)) = (header.entry_size(), header.mode()) else {
        return Ok(false);
    };
    let path = header.path_bytes().into_owned();
    if entry_name(&path) != name {
        return Err(wrong(format!("the entry there is {:?}", entry_name(&path))));
    }
    let in_buffer = usize::try_from(size)
        .ok()
        .and_then(|size| size.checked_add(512))
        .filter(|&end| end <= read);
    if let Some(end) = in_buffer {
        // The buffer is lent out while the file is written from it.
        let buffer = std::mem::take(&mut out.buffer);
        let written = out.write_regular(&path, &mut &buffer[512..end], mode, size);
        out.buffer = buffer;
        return written;
    }
    let tar_len = tar
        .metadata()
        .map_err(|err| Failure::Baseline(unpacking(err)))?
        .len();
    if (offset + 512)
        .checked_add(size)
        .is_none_or(|end| end > tar_len)
    {
        return Err(wrong(format!(
            "its {size} bytes run past the end of the tar"
        )));
    }
    out.write_regular_with(&path, mode, size, |file| {
        copy_range(tar, offset + 512, size, file)
    })
}

/// Copies `len` bytes of `from` at `offset` to the end of `to`, within the kernel where it
/// can (`copy_file_range`), else through a buffer.
fn copy_range(
    from: &std::fs::File,
    offset: u64,
    len: u64,
    to: &mut std::fs::File,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let ended = || {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the tar ended inside an entry",
        )
    };
    let mut at = i64::try_from(offset).map_err(std::io::Error::other)?;
    let mut left = len;
    while left > 0 {
        let chunk = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
        match nix::fcntl::copy_file_range(from, Some(&mut at), &*to, None, chunk) {
            Ok(0) => return Err(ended()),
            Ok(n) => left -= u64::try_from(n).unwrap_or(left),
            Err(nix::errno::Errno::EINTR) => {}
            // Not between these files (another kernel, another file system's rules): the
            // same bytes through a buffer.
            Err(
                nix::errno::Errno::EXDEV
                | nix::errno::Errno::ENOSYS
                | nix::errno::Errno::EINVAL
                | nix::errno::Errno::EOPNOTSUPP,
            ) => break,
            Err(err) => return Err(err.into()),
        }
    }
    let mut buffer = vec![0u8; usize::try_from(left.min(1 << 20)).unwrap_or(1 << 20)];
    let mut at = u64::try_from(at).map_err(std::io::Error::other)?;
    while left > 0 {
        let want = usize::try_from(left.min(buffer.len() as u64)).unwrap_or(buffer.len());
        let n = from.read_at(&mut buffer[..want], at)?;
        if n == 0 {
            return Err(ended());
        }
        std::io::Write::write_all(to, &buffer[..n])?;
        at += n as u64;
        left -= n as u64;
    }
    Ok(())
}

/// A header block as the tar crate's reader accepts one (a valid checksum), or `None`.
fn tar_header(block: &[u8]) -> Option<&tar::Header> {
    let header = tar::Header::from_byte_slice(block);
    let sum: u32 = block[..148]
        .iter()
        .chain(&block[156..])
        .map(|&b| u32::from(b))
        .sum::<u32>()
        + 8 * 32;
    (header.cksum().ok()? == sum).then_some(header)
}

/// Runs `f` on the entry whose first header is at `offset`, checking that it is `name`.
fn with_entry_at<T>(
    tar: &std::fs::File,
    offset: u64,
    name: &str,
    f: impl FnOnce(&mut tar::Entry<'_, &std::fs::File>) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let wrong = |why: String| Failure::IndexWrong(format!("entry {name:?} at {offset}: {why}"));
    (&*tar)
        .seek(SeekFrom::Start(offset))
        .map_err(|err| wrong(err.to_string()))?;
    let mut archive = archive(tar);
    let mut entries = archive.entries().map_err(|err| wrong(err.to_string()))?;
    let mut entry = match entries.next() {
        Some(Ok(entry)) => entry,
        Some(Err(err)) => return Err(wrong(err.to_string())),
        None => return Err(wrong("no entry there".to_owned())),
    };
    let found = entry_name(&entry.path_bytes());
    if found != name {
        return Err(wrong(format!("the entry there is {found:?}")));
    }
    f(&mut entry)
}

#[cfg(test)]
mod tests {
    use super::resolve;

    #[test]
    fn link_targets_resolve_within_the_tree_only() {
        assert_eq!(resolve("a/b", "c").as_deref(), Some("a/b/c"));
        assert_eq!(resolve("a/b", "../c/./d").as_deref(), Some("a/c/d"));
        assert_eq!(resolve("", "real dir").as_deref(), Some("real dir"));
        assert_eq!(resolve("a", "..").as_deref(), Some(""));
        assert_eq!(resolve("a", "../.."), None);
        assert_eq!(resolve("a", "/etc"), None);
    }
}
