//! When `git apply --check` gives the verdict a real `git apply` would, so that verification
//! need not write the patch's result (as many files again as it extracted: a large share of
//! its time).
//!
//! A real apply runs the very checks `--check` runs, in the same words, and then writes: it
//! removes every old file (a failure there is only a warning) and creates every new one.
//! Only that creation can refuse what the checks passed (`create_one_file` in git's
//! `apply.c`), and only where the created path meets something in its way:
//! - an existing directory at the path: git replaces it only if it is empty;
//! - a leading directory that is not a directory (`ENOTDIR`), a file or a symlink;
//! - a leading directory it may not write in (`EACCES`);
//! - a path the patch itself writes in the way of another (`x` and `x/y`, or one path twice),
//!   or a symlink it creates before a path beneath it (checked again at write time);
//! - a submodule (gitlink) entry, created as a directory.
//!
//! [`DryRun::of`] rules out what the patch alone can tell, [`DryRun::suffices_in`] what the
//! extracted tree can: whenever either finds such a meeting, or cannot tell, the patch is
//! applied for real.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::patch::FilePatch;

/// The modes a `--check` alone may judge: regular files and symlinks.
const PLAIN_MODES: [u32; 3] = [0o100644, 0o100755, 0o120000];

/// The paths of a patch whose verdict `git apply --check` can give, as far as the patch
/// alone tells.
#[derive(Debug)]
pub struct DryRun {
    /// Every path the patch names, old and new, each once.
    paths: Vec<String>,
}

impl DryRun {
    /// `Ok` when the patch alone leaves `--check` able to give the verdict; `Err` says why a
    /// real apply must: a path it cannot look up in the tree as it is, a mode other than a
    /// file's or a symlink's, or two of its paths in each other's way.
    pub fn of(files: &[FilePatch<'_>]) -> Result<Self, String> {
        let mut paths = HashSet::new();
        for file in files {
            for mode in [file.old_mode, file.new_mode].into_iter().flatten() {
                if !PLAIN_MODES.contains(&mode) {
                    return Err(format!("{} has mode {mode:o}", file.path()));
                }
            }
            // A rename or copy names two paths; a change names one, twice.
            let mut named: Vec<&String> = file.old_path.iter().chain(&file.new_path).collect();
            named.dedup();
            for path in named {
                if !is_plain(path) {
                    return Err(format!("{path:?} is not a plain path"));
                }
                if !paths.insert(path.as_str()) {
                    return Err(format!("{path} is named by two entries"));
                }
            }
        }
        for path in &paths {
            if let Some(ancestor) = leading(path).find(|dir| paths.contains(dir)) {
                return Err(format!(
                    "{path} is beneath {ancestor}, which the patch names too"
                ));
            }
        }
        Ok(Self {
            paths: paths.into_iter().map(str::to_owned).collect(),
        })
    }

    /// `Ok` when nothing in `tree` (the extracted baseline entries) stands in the way of
    /// writing the patch's paths; `Err` says what does, or what could not be looked at.
    pub fn suffices_in(&self, tree: &Path) -> Result<(), String> {
        // Whether each leading directory looked at is a directory git may write in; shared
        // by the paths beneath it.
        let mut writable: HashMap<&str, bool> = HashMap::new();
        for path in &self.paths {
            for dir in leading(path) {
                let usable = match writable.get(dir) {
                    Some(&usable) => usable,
                    None => {
                        let usable = match lookup(tree, dir)? {
                            // Git makes it (and what lies beneath): nothing more to look at.
                            None => break,
                            Some(meta) => {
                                meta.is_dir() && meta.permissions().mode() & 0o300 == 0o300
                            }
                        };
                        writable.insert(dir, usable);
                        usable
                    }
                };
                if !usable {
                    return Err(format!(
                        "{dir}, a leading directory of {path}, is not a directory git may write in"
                    ));
                }
            }
            if lookup(tree, path)?.is_some_and(|meta| meta.is_dir()) {
                return Err(format!("{path} is a directory"));
            }
        }
        Ok(())
    }
}

/// What `path` (plain, relative) is in `tree`, not following a symlink at its end; `None`
/// when nothing is there. Its leading directories were looked at first, so none is a
/// symlink.
fn lookup(tree: &Path, path: &str) -> Result<Option<std::fs::Metadata>, String> {
    match std::fs::symlink_metadata(tree.join(path)) {
        Ok(meta) => Ok(Some(meta)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(format!("looking at {path}: {err}")),
    }
}

/// The leading directories of `path`, outermost first (`a`, `a/b` for `a/b/c`).
fn leading(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(move |(slash, _)| &path[..slash])
}

/// Whether `path` can be looked up in the tree as it is: relative, every component a name
/// (not empty, `.` or `..`), and its bytes the ones on disk (a name that was not UTF-8
/// reaches the parser with U+FFFD in its place).
fn is_plain(path: &str) -> bool {
    !path.is_empty()
        && !path.contains(['\u{fffd}', '\0'])
        && path
            .split('/')
            .all(|component| !matches!(component, "" | "." | ".."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(old: Option<&str>, new: Option<&str>) -> FilePatch<'static> {
        FilePatch {
            old_path: old.map(str::to_owned),
            new_path: new.map(str::to_owned),
            old_mode: None,
            new_mode: None,
            is_new: old.is_none(),
            is_deleted: new.is_none(),
            is_rename: old.is_some() && new.is_some() && old != new,
            is_copy: false,
            is_binary: false,
            hunks: Vec::new(),
            line: 1,
        }
    }

    fn changed(path: &str) -> FilePatch<'static> {
        file(Some(path), Some(path))
    }

    #[test]
    fn a_patch_of_separate_files_and_symlinks_is_judged_by_check() {
        let mut link = file(None, Some("docs/link"));
        link.new_mode = Some(0o120000);
        let mut exec = changed("bin/run");
        (exec.old_mode, exec.new_mode) = (Some(0o100644), Some(0o100755));
        let files = [
            changed("src/a.rs"),
            changed("src/b.rs"),
            file(Some("old/x"), Some("new/x")),
            file(Some("gone"), None),
            link,
            exec,
        ];
        let dry = DryRun::of(&files).unwrap();
        assert_eq!(dry.paths.len(), 7);
    }

    #[test]
    fn paths_in_each_others_way_need_a_real_apply() {
        for (files, says) in [
            (
                vec![file(None, Some("x")), file(None, Some("x/y"))],
                "beneath x",
            ),
            (vec![file(None, Some("x/y/z")), changed("x")], "beneath x"),
            (
                vec![file(Some("x"), None), file(None, Some("x"))],
                "two entries",
            ),
            (
                vec![file(Some("a"), Some("x")), file(None, Some("x/y"))],
                "beneath x",
            ),
        ] {
            let err = DryRun::of(&files).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn submodules_and_odd_names_need_a_real_apply() {
        let mut gitlink = file(None, Some("vendor/lib"));
        gitlink.new_mode = Some(0o160000);
        assert!(DryRun::of(&[gitlink]).unwrap_err().contains("mode 160000"));
        for name in ["a/../b", "./a", "a//b", "/abs", "a/", "caf\u{fffd}"] {
            let err = DryRun::of(&[file(None, Some(name))]).unwrap_err();
            assert!(err.contains("not a plain path"), "{name}: {err}");
        }
    }

    #[test]
    fn what_stands_in_the_tree_decides_the_rest() {
        let tree = tempfile::tempdir().unwrap();
        let root = tree.path();
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::write(root.join("src/a.rs"), "a\n").unwrap();
        std::fs::write(root.join("file"), "f\n").unwrap();
        std::fs::create_dir_all(root.join("full/inner")).unwrap();
        std::fs::create_dir(root.join("empty")).unwrap();
        std::os::unix::fs::symlink("src", root.join("link")).unwrap();
        std::fs::create_dir(root.join("locked")).unwrap();
        std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o555))
            .unwrap();
        let judge = |files: &[FilePatch<'_>]| DryRun::of(files).unwrap().suffices_in(root);

        // Nothing in the way: files beside files, new directories, a missing file.
        judge(&[changed("src/a.rs"), file(None, Some("src/deep/new"))]).unwrap();
        judge(&[file(None, Some("brand/new/dirs/f"))]).unwrap();
        judge(&[changed("missing.rs")]).unwrap();
        // A symlink replaced, not written through.
        judge(&[changed("link")]).unwrap();

        for (files, says) in [
            (
                vec![file(None, Some("file/x"))],
                "file, a leading directory",
            ),
            (
                vec![file(None, Some("link/x"))],
                "link, a leading directory",
            ),
            (vec![file(None, Some("full"))], "full is a directory"),
            (vec![file(None, Some("empty"))], "empty is a directory"),
            (
                vec![file(None, Some("locked/x"))],
                "locked, a leading directory",
            ),
            (
                vec![file(None, Some("locked/sub/x"))],
                "locked, a leading directory",
            ),
        ] {
            let err = judge(&files).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
