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
//!   `eol`, `ident`) change how git reads and writes `P`;
//! - when a leading directory is a symlink within the tree, what `P` is through it: git
//!   refuses `P` either way, but says why (a symlink) only if `P` resolves. So paths beneath
//!   a symlink take another pass, up to [`MAX_LINK_HOPS`] links deep.
//!
//! Names that were not UTF-8 reach the parser as U+FFFD, so tar names are compared in that
//! same lossy form: at worst a few extra entries are extracted, never one too few.

use std::collections::HashSet;
use std::path::Path;

use crate::patch::FilePatch;

/// The attributes file git reads in each directory.
const ATTRIBUTES: &str = ".gitattributes";

/// Symlinked leading directories followed, one pass over the tar each (Linux's own limit on
/// links in one path is 40; a real tree needs one or two).
const MAX_LINK_HOPS: usize = 8;

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
        Self::from_names(
            files
                .iter()
                .flat_map(|file| file.old_path.iter().chain(&file.new_path))
                .cloned(),
        )
    }

    fn from_names(names: impl IntoIterator<Item = String>) -> Self {
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
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        if name == ATTRIBUTES && self.leading.contains(parent) {
            return true;
        }
        // Inside a named path (which the baseline has as a directory)?
        path.match_indices('/')
            .any(|(slash, _)| self.named.contains(&path[..slash]))
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

/// Extracts into `dest` the entries of `baseline_tar` that `touched` wants, with the same
/// settings (and so the same modes, links and refusals) as unpacking all of it. Returns how
/// many entries were extracted.
pub(super) fn extract(baseline_tar: &Path, touched: &Touched, dest: &Path) -> Result<u64, String> {
    // As `Archive::unpack` does: an absolute destination.
    let dest = dest
        .canonicalize()
        .map_err(|err| format!("unpacking the baseline copy: {err}"))?;
    let mut extracted = HashSet::new();
    let mut links = pass(baseline_tar, touched, &dest, &mut extracted)?;
    let mut beyond_links: Touched;
    let mut current = touched;
    for _ in 0..MAX_LINK_HOPS {
        let beyond: Vec<String> = links
            .iter()
            .flat_map(|(link, target)| current.through(link, target))
            .filter(|name| !extracted.contains(name))
            .collect();
        if beyond.is_empty() {
            break;
        }
        beyond_links = Touched::from_names(beyond);
        current = &beyond_links;
        links = pass(baseline_tar, current, &dest, &mut extracted)?;
    }
    Ok(u64::try_from(extracted.len()).unwrap_or(u64::MAX))
}

/// One pass over the tar: extracts what `touched` wants and `extracted` does not hold yet
/// (adding it there); returns the symlinks among `touched`'s leading directories, with their
/// targets.
fn pass(
    baseline_tar: &Path,
    touched: &Touched,
    dest: &Path,
    extracted: &mut HashSet<String>,
) -> Result<Vec<(String, String)>, String> {
    let tar = std::fs::File::open(baseline_tar).map_err(|err| {
        format!("the host's baseline copy is missing ({err}); the patch cannot be checked")
    })?;
    let unpacking = |err: std::io::Error| format!("unpacking the baseline copy: {err}");
    // Unbuffered: each header is one 512-byte read and then a seek past the contents; a
    // buffer would fill itself with contents only to throw them away (2x slower on 20k
    // entries).
    let mut archive = tar::Archive::new(tar);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(false);
    // Directories last, deepest first (as `Archive::unpack` does), so that a directory's mode
    // cannot stop its own entries from being written.
    let mut directories = Vec::new();
    let mut links = Vec::new();
    for entry in archive.entries_with_seek().map_err(unpacking)? {
        let mut entry = entry.map_err(unpacking)?;
        let path = {
            let bytes = entry.path_bytes();
            let bytes = bytes.strip_suffix(b"/").unwrap_or(&bytes);
            String::from_utf8_lossy(bytes).into_owned()
        };
        if !touched.wants(&path) || !extracted.insert(path.clone()) {
            continue;
        }
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::Directory {
            directories.push(entry);
            continue;
        }
        if kind.is_symlink() && touched.leading.contains(&path) {
            if let Some(target) = entry.link_name_bytes() {
                links.push((path, String::from_utf8_lossy(&target).into_owned()));
            }
        }
        entry.unpack_in(dest).map_err(unpacking)?;
    }
    directories.sort_by(|a, b| b.path_bytes().cmp(&a.path_bytes()));
    for mut dir in directories {
        dir.unpack_in(dest).map_err(unpacking)?;
    }
    Ok(links)
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
