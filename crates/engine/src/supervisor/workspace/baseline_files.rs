//! The baseline files a review judges changes against (package.json scripts, symlink
//! targets), read from the host's copy of the baseline (`baseline.tar`).
//!
//! With the tar's offset index ([`dynocap_review::tar_index`]) each lookup reads the one entry
//! asked for: O(lookups), where reading every header of a large tar is a noticeable part of
//! finish's path (docs/performance.md, "Design measurements"). Without a usable index, or once it proves wrong, every header is read once
//! and the files kept in memory. Both give the same answers: where a name occurs twice, the
//! first entry counts (as for the index, and as an unpack that does not overwrite).

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dynocap_review::tar_index::{entry_name, IndexError, TarIndex};

use crate::foundation::error::{Context, Result};

// Log lines keep the target they had before the engine's layer folders: people, the e2e
// tests and log filters read them by it.
const LOG_TARGET: &str = "dynocap_engine::workspace::baseline_files";

/// Baseline files worth keeping in memory: small, and needed to judge a change.
const INDEXED_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// The file name whose contents are kept (besides every symlink's target).
const PACKAGE_JSON: &str = "package.json";

/// The content of files in the host's baseline copy, for judging changes: a symlink's
/// target, a `package.json`'s bytes.
#[derive(Default)]
pub struct BaselineIndex {
    tar: PathBuf,
    /// Looked up entry by entry while it holds; `None` without a usable index.
    index: Option<TarIndex>,
    /// Every kept file, from one pass over the tar: set at load without an index, or on the
    /// first lookup that finds the index wrong.
    read_through: OnceLock<HashMap<String, Vec<u8>>>,
    /// The baseline's files the project does not track under the generated table, with the
    /// directories between them and their generated directory (`baseline.untracked`).
    untracked: HashSet<String>,
}

impl BaselineIndex {
    /// Through the tar's offset index when it has a sound one, else by reading every header.
    pub fn load(tar_path: &Path) -> Result<Self> {
        match TarIndex::load(tar_path) {
            Ok(index) => {
                return Ok(Self {
                    tar: tar_path.to_owned(),
                    index: Some(index),
                    read_through: OnceLock::new(),
                    untracked: untracked_beside(tar_path),
                })
            }
            Err(IndexError::Missing(_)) => {}
            Err(err) => {
                tracing::warn!(target: LOG_TARGET, "{err}; reading the baseline copy without it")
            }
        }
        Self::read_through(tar_path)
    }

    /// By reading every header of the tar, once, now.
    pub fn read_through(tar_path: &Path) -> Result<Self> {
        let files = read_all(tar_path)?;
        Ok(Self {
            tar: tar_path.to_owned(),
            index: None,
            read_through: OnceLock::from(files),
            untracked: untracked_beside(tar_path),
        })
    }

    /// Whether the baseline has anything the project tracks beneath the directory `dir`:
    /// such a directory is the project's own, never generated
    /// ([`dynocap_review::generated`]). Without a sound index the answer is yes, which keeps
    /// the files in the patch as they always were.
    pub fn tracks_beneath(&self, dir: &str) -> bool {
        match (&self.index, self.read_through.get()) {
            (Some(index), None) => index
                .beneath(dir)
                .any(|(name, _)| !self.untracked.contains(name)),
            _ => true,
        }
    }

    /// The symlink target, or the `package.json` contents, at `path` in the baseline.
    pub fn get(&self, path: &str) -> Option<Vec<u8>> {
        if let (Some(index), None) = (&self.index, self.read_through.get()) {
            match lookup(index, &self.tar, path) {
                Ok(found) => return found,
                Err(why) => tracing::warn!(target: LOG_TARGET,
                    "the baseline's index is wrong ({why}); reading the baseline copy without it"
                ),
            }
        }
        self.read_through
            .get_or_init(|| {
                read_all(&self.tar).unwrap_or_else(|err| {
                    tracing::warn!(target: LOG_TARGET, "reading the baseline copy: {err}");
                    HashMap::new()
                })
            })
            .get(path)
            .cloned()
    }
}

impl dynocap_review::generated::Project for BaselineIndex {
    fn tracks_beneath(&self, dir: &str) -> bool {
        BaselineIndex::tracks_beneath(self, dir)
    }

    fn untracked(&self, path: &str) -> bool {
        self.untracked.contains(path)
    }
}

/// The list the import wrote beside the baseline copy (see [`super::BASELINE_UNTRACKED`]);
/// empty when there is none (a plain tree, nothing untracked under the table, or a task made
/// before it was written).
fn untracked_beside(tar_path: &Path) -> HashSet<String> {
    let path = tar_path.with_file_name(super::BASELINE_UNTRACKED);
    match std::fs::read(&path) {
        Ok(list) => list
            .split(|b| *b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| String::from_utf8_lossy(name).into_owned())
            .collect(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
        Err(err) => {
            tracing::warn!(target: LOG_TARGET, "reading {}: {err}", path.display());
            HashSet::new()
        }
    }
}

/// What an entry contributes: a symlink's target, a small `package.json`'s contents.
fn kept<R: Read>(path: &str, entry: &mut tar::Entry<'_, R>) -> std::io::Result<Option<Vec<u8>>> {
    let kind = entry.header().entry_type();
    if kind.is_symlink() {
        return Ok(entry.link_name_bytes().map(|target| target.into_owned()));
    }
    if kind.is_file()
        && path.rsplit('/').next() == Some(PACKAGE_JSON)
        && entry.size() <= INDEXED_MAX_BYTES
    {
        let mut content = Vec::new();
        entry.read_to_end(&mut content)?;
        return Ok(Some(content));
    }
    Ok(None)
}

/// Every kept file of the tar, the first entry of a name counting.
fn read_all(tar_path: &Path) -> Result<HashMap<String, Vec<u8>>> {
    let file =
        std::fs::File::open(tar_path).with_context(|| format!("opening {}", tar_path.display()))?;
    // Unbuffered, seeking past the contents it does not keep: O(entries), not O(bytes) (a
    // buffer would fill itself with contents only to drop them).
    let mut archive = tar::Archive::new(file);
    let mut files = HashMap::new();
    let mut seen = HashSet::new();
    for entry in archive
        .entries_with_seek()
        .context("reading the baseline copy")?
    {
        let mut entry = entry.context("reading the baseline copy")?;
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if !seen.insert(path.clone()) {
            continue;
        }
        if let Some(content) = kept(&path, &mut entry).context("reading the baseline copy")? {
            files.insert(path, content);
        }
    }
    Ok(files)
}

/// `path`'s kept content through the index: `Ok(None)` when the tar has no such entry or
/// keeps nothing of it; `Err` when the index led to another entry or nowhere.
fn lookup(index: &TarIndex, tar_path: &Path, path: &str) -> Result<Option<Vec<u8>>, String> {
    let Some((_, offset)) = index.find(path) else {
        return Ok(None);
    };
    let mut file = std::fs::File::open(tar_path).map_err(|err| err.to_string())?;
    file.seek(SeekFrom::Start(offset))
        .map_err(|err| err.to_string())?;
    let mut archive = tar::Archive::new(file);
    let mut entries = archive.entries().map_err(|err| err.to_string())?;
    let mut entry = match entries.next() {
        Some(Ok(entry)) => entry,
        Some(Err(err)) => return Err(format!("entry {path:?} at {offset}: {err}")),
        None => return Err(format!("entry {path:?} at {offset}: no entry there")),
    };
    let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
    if entry_name(raw.as_bytes()) != path {
        return Err(format!(
            "entry {path:?} at {offset}: the entry there is {raw:?}"
        ));
    }
    if raw != path {
        // Named with a trailing `/`: a pass over the tar keeps it under that name only.
        return Ok(None);
    }
    kept(path, &mut entry).map_err(|err| format!("entry {path:?} at {offset}: {err}"))
}

#[cfg(test)]
mod tests;
