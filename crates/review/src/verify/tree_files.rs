//! Regular files of the baseline written into a verification's work tree through directory
//! descriptors, as `tar::Entry::unpack_in` would write them (a new file, the header's whole
//! mode, the contents) but without its cost per entry: `unpack_in` makes sure a file cannot
//! land outside the tree by canonicalizing its parent's absolute path, one `readlink` per
//! component (11 per file under `/dev/shm/dynocap-verify-…/scratch/tree/d/`, 579 system
//! calls for a 50-file patch, the largest part of the extraction).
//!
//! Here each directory is opened once, component by component from the tree's root, with
//! `O_NOFOLLOW`, and files are created relative to it with `O_CREAT | O_EXCL | O_NOFOLLOW`:
//! nothing is ever resolved through a symlink, so nothing can land outside the tree either.
//! A path this cannot take as it is (a component that is a symlink, `.`/`..`, an absolute or
//! empty name) is left to the caller, which unpacks it the tar crate's way.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, mkdirat, Mode};

/// The work tree's directories, each opened once.
pub(super) struct TreeFiles {
    root: OwnedFd,
    /// Opened directories by their path in the tree (`a/b`, no slashes around it).
    dirs: HashMap<Vec<u8>, OwnedFd>,
}

impl TreeFiles {
    pub fn open(tree: &Path) -> std::io::Result<Self> {
        let root = nix::fcntl::open(
            tree,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            root,
            dirs: HashMap::new(),
        })
    }

    /// Writes a regular file's entry at `name` (its raw tar path), its contents written by
    /// `fill` into the new, empty file. `Ok(false)` when `name` is not a plain relative path
    /// beneath plain directories: nothing was written, and the caller unpacks the entry as
    /// the tar crate does.
    pub fn write(
        &mut self,
        name: &[u8],
        mode: u32,
        fill: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> std::io::Result<bool> {
        if !is_plain(name) {
            return Ok(false);
        }
        let (parent, file_name) = match name.iter().rposition(|&b| b == b'/') {
            Some(slash) => (&name[..slash], &name[slash + 1..]),
            None => (&name[..0], name),
        };
        let Some(dir) = self.dir(parent)? else {
            return Ok(false);
        };
        // As `unpack_in`: a new file, never one already there (nor a link in its place).
        let fd = openat(
            dir,
            OsStr::from_bytes(file_name),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let mut file = File::from(fd);
        fill(&mut file)?;
        // The header's whole mode, setuid and all, as `set_preserve_permissions(true)` keeps
        // it; set after the contents as the tar crate does.
        fchmod(file.as_fd(), Mode::from_bits_truncate(mode & 0o7777))?;
        Ok(true)
    }

    /// The directory at `path` in the tree, made (mode 0777 less the umask, as
    /// `create_dir_all` makes them) where missing. `None` if a component is not a directory
    /// of its own (a symlink, a file).
    fn dir(&mut self, path: &[u8]) -> std::io::Result<Option<BorrowedFd<'_>>> {
        if path.is_empty() {
            return Ok(Some(self.root.as_fd()));
        }
        // Each leading path (`a`, `a/b`, ...) not open yet, opened beneath the one before.
        let ends = path
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'/')
            .map(|(i, _)| i)
            .chain([path.len()]);
        for end in ends {
            if self.dirs.contains_key(&path[..end]) {
                continue;
            }
            let start = path[..end]
                .iter()
                .rposition(|&b| b == b'/')
                .map_or(0, |slash| slash + 1);
            let opened = {
                let parent = match start {
                    0 => self.root.as_fd(),
                    _ => self.dirs[&path[..start - 1]].as_fd(),
                };
                let component = OsStr::from_bytes(&path[start..end]);
                match mkdirat(parent, component, Mode::from_bits_truncate(0o777)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(errno) => return Err(errno.into()),
                }
                openat(
                    parent,
                    component,
                    OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
            };
            match opened {
                Ok(fd) => {
                    self.dirs.insert(path[..end].to_vec(), fd);
                }
                // A symlink (ELOOP) or a file (ENOTDIR) where a directory goes.
                Err(Errno::ELOOP | Errno::ENOTDIR) => return Ok(None),
                Err(errno) => return Err(errno.into()),
            }
        }
        Ok(self.dirs.get(path).map(AsFd::as_fd))
    }
}

/// A relative path of ordinary components: not empty, no leading or trailing slash, no empty,
/// `.` or `..` component.
fn is_plain(name: &[u8]) -> bool {
    !name.is_empty()
        && name
            .split(|&b| b == b'/')
            .all(|part| !part.is_empty() && part != b"." && part != b"..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn write(files: &mut TreeFiles, name: &str, contents: &str, mode: u32) -> bool {
        files
            .write(name.as_bytes(), mode, |f| f.write_all(contents.as_bytes()))
            .unwrap()
    }

    #[test]
    fn files_land_with_their_contents_and_whole_mode_in_directories_made_once() {
        let tree = tempfile::tempdir().unwrap();
        let mut files = TreeFiles::open(tree.path()).unwrap();
        assert!(write(&mut files, "top.txt", "top", 0o644));
        assert!(write(&mut files, "a/b/c/deep.sh", "#!/bin/sh\n", 0o755));
        assert!(write(&mut files, "a/b/beside", "beside", 0o4750));
        assert!(write(&mut files, "a/other/x", "x", 0o600));
        let read = |rel: &str| std::fs::read_to_string(tree.path().join(rel)).unwrap();
        let mode = |rel: &str| {
            std::fs::metadata(tree.path().join(rel))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(read("top.txt"), "top");
        assert_eq!(read("a/b/c/deep.sh"), "#!/bin/sh\n");
        assert_eq!(read("a/b/beside"), "beside");
        assert_eq!(read("a/other/x"), "x");
        assert_eq!(mode("a/b/c/deep.sh"), 0o755);
        assert_eq!(mode("a/b/beside"), 0o4750);
        assert_eq!(mode("top.txt"), 0o644);
        let mut opened: Vec<_> = files.dirs.keys().cloned().collect();
        opened.sort();
        let expected: Vec<Vec<u8>> = ["a", "a/b", "a/b/c", "a/other"]
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect();
        assert_eq!(opened, expected);
    }

    #[test]
    fn an_existing_file_is_not_overwritten() {
        let tree = tempfile::tempdir().unwrap();
        let mut files = TreeFiles::open(tree.path()).unwrap();
        assert!(write(&mut files, "d/f", "first", 0o644));
        let err = files
            .write(b"d/f", 0o644, |f| f.write_all(b"second"))
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(
            std::fs::read_to_string(tree.path().join("d/f")).unwrap(),
            "first"
        );
    }

    #[test]
    fn nothing_is_written_through_a_symlink_or_for_an_odd_name() {
        let tree = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), tree.path().join("link")).unwrap();
        std::fs::write(tree.path().join("file"), "").unwrap();
        let mut files = TreeFiles::open(tree.path()).unwrap();
        for name in [
            "link/escaped",
            "link/deeper/escaped",
            "file/below",
            "../escaped",
            "a/../escaped",
            "./x",
            "/abs",
            "trailing/",
            "double//slash",
            "",
        ] {
            assert!(
                !write(&mut files, name, "no", 0o644),
                "{name:?} was written"
            );
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // A file's place taken by a symlink: not followed either.
        std::os::unix::fs::symlink(outside.path().join("target"), tree.path().join("f2")).unwrap();
        assert!(files.write(b"f2", 0o644, |f| f.write_all(b"no")).is_err());
        assert!(!outside.path().join("target").exists());
    }

    #[test]
    fn non_utf8_names_are_written_as_they_are() {
        let tree = tempfile::tempdir().unwrap();
        let mut files = TreeFiles::open(tree.path()).unwrap();
        assert!(files
            .write(b"d\xff/n\xfe", 0o644, |f| f.write_all(b"raw"))
            .unwrap());
        let path = tree
            .path()
            .join(OsStr::from_bytes(b"d\xff"))
            .join(OsStr::from_bytes(b"n\xfe"));
        assert_eq!(std::fs::read_to_string(path).unwrap(), "raw");
    }
}
