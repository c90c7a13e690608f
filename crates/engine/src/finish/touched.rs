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
//! - the `.gitattributes` of the root and of each leading directory: attributes (`text`,
//!   `eol`, `ident`) change how git reads and writes `P`.
//!
//! Names that were not UTF-8 reach the parser as U+FFFD, so tar names are compared in that
//! same lossy form: at worst a few extra entries are extracted, never one too few.

use std::collections::HashSet;
use std::path::Path;

use crate::patch::FilePatch;

/// The attributes file git reads in each directory.
const ATTRIBUTES: &str = ".gitattributes";

/// The baseline paths a patch's `git apply` reads (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Touched {
    /// Every path the patch names, old and new.
    named: HashSet<String>,
    /// Every leading directory of a named path (`""` is the root).
    leading: HashSet<String>,
}

impl Touched {
    pub fn of(files: &[FilePatch<'_>]) -> Self {
        let mut touched = Touched::default();
        touched.leading.insert(String::new());
        for name in files
            .iter()
            .flat_map(|file| file.old_path.iter().chain(&file.new_path))
        {
            for (slash, _) in name.match_indices('/') {
                touched.leading.insert(name[..slash].to_owned());
            }
            touched.named.insert(name.clone());
        }
        touched
    }

    /// Whether the tar entry `path` (as the tar spells it, maybe with a trailing `/`) is one a
    /// `git apply` of the patch can read.
    pub fn wants(&self, path: &[u8]) -> bool {
        let path = path.strip_suffix(b"/").unwrap_or(path);
        let path = String::from_utf8_lossy(path);
        if self.named.contains(path.as_ref()) || self.leading.contains(path.as_ref()) {
            return true;
        }
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path.as_ref()));
        if name == ATTRIBUTES && self.leading.contains(parent) {
            return true;
        }
        // Inside a named path (which the baseline has as a directory)?
        path.match_indices('/')
            .any(|(slash, _)| self.named.contains(&path[..slash]))
    }
}

/// Extracts into `dest` the entries of `baseline_tar` that `touched` wants, in one pass, with
/// the same settings (and so the same modes, links and refusals) as unpacking all of it.
/// Returns how many entries were extracted.
pub(super) fn extract(baseline_tar: &Path, touched: &Touched, dest: &Path) -> Result<u64, String> {
    let tar = std::fs::File::open(baseline_tar).map_err(|err| {
        format!("the host's baseline copy is missing ({err}); the patch cannot be checked")
    })?;
    let unpacking = |err: std::io::Error| format!("unpacking the baseline copy: {err}");
    let mut archive = tar::Archive::new(std::io::BufReader::new(tar));
    archive.set_preserve_permissions(true);
    archive.set_overwrite(false);
    // As `Archive::unpack` does: an absolute destination, and directories last, deepest first,
    // so that a directory's mode cannot stop its own entries from being written.
    let dest = dest.canonicalize().map_err(unpacking)?;
    let mut directories = Vec::new();
    let mut extracted = 0u64;
    for entry in archive.entries_with_seek().map_err(unpacking)? {
        let mut entry = entry.map_err(unpacking)?;
        if !touched.wants(&entry.path_bytes()) {
            continue;
        }
        extracted += 1;
        if entry.header().entry_type() == tar::EntryType::Directory {
            directories.push(entry);
        } else {
            entry.unpack_in(&dest).map_err(unpacking)?;
        }
    }
    directories.sort_by(|a, b| b.path_bytes().cmp(&a.path_bytes()));
    for mut dir in directories {
        dir.unpack_in(&dest).map_err(unpacking)?;
    }
    Ok(extracted)
}
