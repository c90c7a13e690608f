//! The offset index of a baseline tar (`baseline.tar.idx` beside `baseline.tar`): for each
//! entry's name, where its first header starts, so that verification reads the few entries a
//! patch touches instead of every header of the tar (reading every header of a large tar
//! costs a noticeable part of verification however they are read; the index costs one read
//! of a few hundred KiB).
//!
//! Names are spelled as verification compares them: lossy UTF-8, without a trailing `/`.
//! Where a name occurs twice, the first occurrence is indexed (an unpack keeps the first one
//! too: it does not overwrite). The offset is that of the entry's first header, GNU long-name
//! and PAX headers included, so a reader started there sees the whole entry.
//!
//! The index is an accelerator, never the authority: it records the tar's length and a
//! checksum of itself, and a reader checks that the entry found at an offset has the name it
//! was looked up by. A missing, stale or damaged index is reported as such, and the caller
//! reads the tar itself instead.
//!
//! Layout (little-endian): `MAGIC`, the tar's length (u64), the entry count (u64), one
//! 16-byte record per entry sorted by name bytes (header offset u64, name start u32, name
//! length u32, the start counted from the beginning of the names), the names, and a checksum
//! of everything before it (u64).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Format and version; a reader refuses any other.
const MAGIC: &[u8; 8] = b"DCTIDX1\n";
const HEADER_LEN: usize = 8 + 8 + 8;
const RECORD_LEN: usize = 16;
const CHECKSUM_LEN: usize = 8;
/// Tar blocks: contents are padded to a multiple of this.
const BLOCK: u64 = 512;

/// Where the index of `tar` lives: beside it, `<name>.idx`.
pub fn index_path(tar: &Path) -> PathBuf {
    let mut name = tar.as_os_str().to_owned();
    name.push(".idx");
    PathBuf::from(name)
}

/// Why an index cannot be used; the caller then reads the tar itself.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// No index: its write failed, or someone removed it.
    #[error("{} does not exist", .0.display())]
    Missing(PathBuf),
    /// It was made for another tar (or the tar changed since).
    #[error("{} was made for a tar of {indexed} bytes, the tar has {actual}", .path.display())]
    Stale {
        path: PathBuf,
        indexed: u64,
        actual: u64,
    },
    /// Not an index of this format, cut short, or altered.
    #[error("{} is damaged: {why}", .path.display())]
    Damaged { path: PathBuf, why: &'static str },
    #[error("reading {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The entries of a tar by name. Built by [`write_for`], read by [`TarIndex::load`].
#[derive(Debug)]
pub struct TarIndex {
    /// The whole index file, checked.
    bytes: Vec<u8>,
    count: usize,
}

impl TarIndex {
    /// Reads and checks the index of `tar` (see the module doc for what is checked).
    pub fn load(tar: &Path) -> Result<Self, IndexError> {
        let path = index_path(tar);
        let io = |source| IndexError::Io {
            path: path.clone(),
            source,
        };
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(IndexError::Missing(path))
            }
            Err(err) => return Err(io(err)),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let actual = std::fs::metadata(tar).map_err(io)?.len();
        Self::from_bytes(bytes, actual).map_err(|why| match why {
            Defect::Stale(indexed) => IndexError::Stale {
                path,
                indexed,
                actual,
            },
            Defect::Damaged(why) => IndexError::Damaged { path, why },
        })
    }

    /// Checks the index `bytes` of a tar of `tar_len` bytes (see the module doc for what is
    /// checked): [`load`](Self::load) without the files.
    pub(crate) fn from_bytes(bytes: Vec<u8>, tar_len: u64) -> Result<Self, Defect> {
        if bytes.len() < HEADER_LEN + CHECKSUM_LEN || !bytes.starts_with(MAGIC) {
            return Err(Defect::Damaged("not an index of this format"));
        }
        let body = bytes.len() - CHECKSUM_LEN;
        if checksum(&bytes[..body]) != read_u64(&bytes, body) {
            return Err(Defect::Damaged("its checksum does not match"));
        }
        let indexed = read_u64(&bytes, 8);
        if indexed != tar_len {
            return Err(Defect::Stale(indexed));
        }
        let count = usize::try_from(read_u64(&bytes, 16))
            .map_err(|_| Defect::Damaged("its entry count is too large"))?;
        let names_start = count
            .checked_mul(RECORD_LEN)
            .and_then(|records| records.checked_add(HEADER_LEN))
            .filter(|&start| start <= body)
            .ok_or(Defect::Damaged("its records run past its end"))?;
        // One pass over all the names, then each name's ends on character boundaries: each
        // name is UTF-8 (a check per name took most of a load of 20,000 entries).
        let names = std::str::from_utf8(&bytes[names_start..body])
            .map_err(|_| Defect::Damaged("a name is not UTF-8"))?;
        let mut previous: Option<&str> = None;
        for i in 0..count {
            let (start, len) = name_range(&bytes, i);
            let name = start
                .checked_add(len)
                .and_then(|end| names.get(start..end))
                .ok_or(Defect::Damaged(
                    "a name runs past its end or splits a character",
                ))?;
            // Lookups are binary searches: an unsorted index would miss entries silently.
            if previous.is_some_and(|p| p >= name) {
                return Err(Defect::Damaged("its names are not sorted"));
            }
            previous = Some(name);
            // A header lies within the tar. Readers seek and read where the index says, and
            // an offset the file cannot have (past 2^63 a read fails outright) would blame the
            // tar rather than the index.
            let offset = read_u64(&bytes, record(i));
            if offset.checked_add(BLOCK).is_none_or(|end| end > tar_len) {
                return Err(Defect::Damaged(
                    "an entry's offset lies past the end of the tar",
                ));
            }
        }
        Ok(Self { bytes, count })
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The entry named `name`: its name as the index holds it, and its header offset.
    pub fn find(&self, name: &str) -> Option<(&str, u64)> {
        let i = self.first_at_or_after(name.as_bytes());
        (i < self.count && self.name_bytes(i) == name.as_bytes())
            .then(|| (self.name(i), self.offset(i)))
    }

    /// Every entry strictly beneath the directory `dir` (names starting with `dir/`), with
    /// its offset; `dir` empty means every entry.
    pub fn beneath<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a str, u64)> + 'a {
        let prefix = if dir.is_empty() {
            Vec::new()
        } else {
            format!("{dir}/").into_bytes()
        };
        let first = self.first_at_or_after(&prefix);
        (first..self.count)
            .take_while(move |&i| self.name_bytes(i).starts_with(&prefix))
            .map(|i| (self.name(i), self.offset(i)))
    }

    /// The first record whose name is not below `name`.
    fn first_at_or_after(&self, name: &[u8]) -> usize {
        let (mut low, mut high) = (0, self.count);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.name_bytes(mid) < name {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    fn offset(&self, i: usize) -> u64 {
        read_u64(&self.bytes, record(i))
    }

    fn name_bytes(&self, i: usize) -> &[u8] {
        let (start, len) = name_range(&self.bytes, i);
        let names = HEADER_LEN + self.count * RECORD_LEN;
        // In range: `from_bytes` checked every name against the end of the names.
        &self.bytes[names + start..names + start + len]
    }

    fn name(&self, i: usize) -> &str {
        // `from_bytes` checked that every name is UTF-8.
        std::str::from_utf8(self.name_bytes(i)).unwrap_or_default()
    }
}

/// Where record `i` starts.
fn record(i: usize) -> usize {
    HEADER_LEN + i * RECORD_LEN
}

/// Where record `i` of the index `bytes` says its name is: start (from the beginning of the
/// names) and length.
fn name_range(bytes: &[u8], i: usize) -> (usize, usize) {
    let at = record(i) + 8;
    let start = read_u32(bytes, at);
    let len = read_u32(bytes, at + 4);
    (
        usize::try_from(start).unwrap_or(usize::MAX),
        usize::try_from(len).unwrap_or(usize::MAX),
    )
}

/// Why index bytes are not a usable index of the tar at hand ([`TarIndex::from_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Defect {
    /// Made for a tar of this many bytes.
    Stale(u64),
    /// Not an index of this format, cut short, or altered: why.
    Damaged(&'static str),
}

/// An entry's name as the index and verification spell it: lossy UTF-8, no trailing `/`.
pub fn entry_name(raw: &[u8]) -> String {
    let raw = raw.strip_suffix(b"/").unwrap_or(raw);
    String::from_utf8_lossy(raw).into_owned()
}

/// Reads every header of `tar` (seeking past contents) and writes its index beside it, through
/// a temporary name so that a reader never sees half an index. A tar the index cannot
/// describe (sparse entries) gets none; that is not an error for the tar.
pub fn write_for(tar: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(tar)?;
    let tar_len = file.metadata()?.len();
    let Some(entries) = scan(file)? else {
        return Ok(());
    };
    let bytes = encode(entries, tar_len)?;
    let path = index_path(tar);
    let partial = {
        let mut name = path.as_os_str().to_owned();
        name.push(".partial");
        PathBuf::from(name)
    };
    let written = (|| {
        let mut out = std::fs::File::create(&partial)?;
        out.write_all(&bytes)?;
        std::fs::rename(&partial, &path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// Writes an index of `entries` (name, offset) for `tar` as it is, whatever the tar holds: for
/// tests of what readers do with an index that is well-formed but wrong.
#[cfg(any(test, feature = "fixtures"))]
pub fn write_entries(tar: &Path, entries: Vec<(String, u64)>) -> std::io::Result<()> {
    let tar_len = std::fs::metadata(tar)?.len();
    std::fs::write(index_path(tar), encode(entries, tar_len)?)
}

/// `(name, first header offset)` of every entry in tar order, or `None` for a tar with an
/// entry whose contents' length in the archive the reader cannot tell (sparse files).
pub(crate) fn scan(file: std::fs::File) -> std::io::Result<Option<Vec<(String, u64)>>> {
    // Unbuffered: one 512-byte read per header, then a seek past the contents.
    let mut archive = tar::Archive::new(file);
    let mut entries = Vec::new();
    // An entry's long-name and PAX headers sit between the end of the previous entry's
    // contents and its own header: its first header is where the previous one ended.
    let mut next_start = 0u64;
    for entry in archive.entries_with_seek()? {
        let entry = entry?;
        if entry.header().entry_type() == tar::EntryType::GNUSparse {
            return Ok(None);
        }
        entries.push((entry_name(&entry.path_bytes()), next_start));
        let padded = entry.size().div_ceil(BLOCK) * BLOCK;
        next_start = entry.raw_file_position() + padded;
    }
    Ok(Some(entries))
}

pub(crate) fn encode(mut entries: Vec<(String, u64)>, tar_len: u64) -> std::io::Result<Vec<u8>> {
    let too_large = || std::io::Error::other("the tar's names are too large to index");
    // Stable: among equal names the first in tar order stays first, and is the one kept.
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    entries.dedup_by(|later, first| later.0 == first.0);
    let names_len: usize = entries.iter().map(|(name, _)| name.len()).sum();
    let mut bytes =
        Vec::with_capacity(HEADER_LEN + entries.len() * RECORD_LEN + names_len + CHECKSUM_LEN);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&tar_len.to_le_bytes());
    let count = u64::try_from(entries.len()).map_err(|_| too_large())?;
    bytes.extend_from_slice(&count.to_le_bytes());
    let mut start = 0u32;
    for (name, offset) in &entries {
        let len = u32::try_from(name.len()).map_err(|_| too_large())?;
        bytes.extend_from_slice(&offset.to_le_bytes());
        bytes.extend_from_slice(&start.to_le_bytes());
        bytes.extend_from_slice(&len.to_le_bytes());
        start = start.checked_add(len).ok_or_else(too_large)?;
    }
    for (name, _) in &entries {
        bytes.extend_from_slice(name.as_bytes());
    }
    let sum = checksum(&bytes);
    bytes.extend_from_slice(&sum.to_le_bytes());
    Ok(bytes)
}

/// FNV-1a over 8-byte words (then the tail byte by byte): catches a damaged or cut file,
/// cheaply (an index of 20,000 entries is about 700 KiB). Not a defence against a forger:
/// the index lives in the host's own state directory, which the guest cannot write.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut value = [0u8; 8];
        value.copy_from_slice(word);
        hash = (hash ^ u64::from_le_bytes(value)).wrapping_mul(PRIME);
    }
    for &byte in words.remainder() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(PRIME);
    }
    hash
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut value = [0u8; 8];
    value.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(value)
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut value = [0u8; 4];
    value.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(value)
}

#[cfg(test)]
mod tests;

/// Test tars: appends a directory entry `name` (GNU header, 0755).
#[cfg(any(test, feature = "fixtures"))]
pub fn append_test_dir(builder: &mut tar::Builder<std::fs::File>, name: &str) {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    builder
        .append_data(&mut header, name, std::io::empty())
        .expect("append a directory to a test tar");
}
