//! The overlay's host side: `state_dir/disk/{upper,work}` (on the sandbox's disk, see
//! `disk`) and `state_dir/root`, prepared before the guest starts, and the guest directories
//! pre-created in the upper layer.
//!
//! Ownership matters because the guest's root is an unprivileged host id:
//! - `upper/` (the merged root's own inode) and `work/` belong to the host id of the guest
//!   init, so the guest's root can create files at `/` and the overlay can use its workdir;
//! - a guest directory belongs to the host ids its guest ids map to; parents it needs belong
//!   to the guest init, with the image's mode where the image has them (0755 otherwise).
//!   Never the image's owner: that is host root, unmapped in the guest, and overlayfs in a
//!   user namespace refuses to look up upper-layer inodes whose owner is unmapped;
//! - overlayfs reads a merged directory (upper + lower) with the mounter's credentials, the
//!   guest's root. A guest directory (or parent) over an image directory that id cannot read (the
//!   image's `/root`, host root's 0700) would be unlistable, so it is made opaque
//!   (`user.overlay.opaque=y`): it replaces the image's directory, whose contents the guest
//!   could not have read anyway.

use std::fs;
use std::io;
use std::os::unix::fs::{lchown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::disk::DiskPaths;
use crate::error::JailError;
use crate::remove::remove_tree;
use crate::spec::{guest_relative, GuestDir, JailSpec};
use dynocap_host::IdMap;

/// Paths of the overlay directories inside a state dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layers {
    pub upper: PathBuf,
    pub work: PathBuf,
    pub root: PathBuf,
    /// `upper/` was made by this start (not a kept layer booted again), so undoing the start
    /// may delete it.
    fresh_upper: bool,
}

/// The writable layer, overlayfs's scratch directory and the guest root's mount point, at the
/// top of the sandbox's disk. A fresh disk has them already, empty (see `disk`'s format), which
/// spares a start the first directory creations on a newly mounted filesystem (its bitmaps
/// read, a block allocated). The mount point is on the disk rather than in the state dir for
/// the same reason: a start then creates no inode on the host's filesystem for it, and a
/// teardown deletes none. On an ext4 without a journal, which skips every recently deleted
/// inode while it looks for a free one, each such inode cost up to a millisecond of a start
/// (docs/performance.md, "Design measurements").
pub(crate) const UPPER: &str = "upper";
pub(crate) const WORK: &str = "work";
pub(crate) const ROOT: &str = "root";

const HINT_LEFTOVER: &str =
    "the state dir still holds a previous sandbox; call cleanup_leftovers(name, state_dir) first";

impl Layers {
    /// Where the layers of a sandbox using `state_dir` live: on its disk, mount point included.
    pub fn at(state_dir: &Path) -> Layers {
        let disk = DiskPaths::at(state_dir).mountpoint;
        Layers {
            upper: disk.join(UPPER),
            work: disk.join(WORK),
            root: disk.join(ROOT),
            fresh_upper: true,
        }
    }

    fn all(&self) -> [&Path; 3] {
        [&self.upper, &self.work, &self.root]
    }

    /// Creates the layer directories and the guest directories. On error nothing is left.
    /// With [`JailSpec::reuse_layers`], keeps the existing `upper/` and makes the rest anew.
    pub fn prepare(spec: &JailSpec, ids: &IdMap) -> Result<Layers, JailError> {
        if spec.reuse_layers {
            return Self::prepare_over_kept(spec, ids);
        }
        let layers = Layers::at(&spec.state_dir);
        let mut made = Vec::new();
        let result = (|| {
            for dir in layers.all() {
                match fs::create_dir(dir) {
                    Ok(()) => made.push(dir),
                    // The fresh disk's own, empty: nothing of a previous sandbox.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && is_empty_dir(dir) => {}
                    Err(e) => {
                        let err = JailError::io("create", dir, e);
                        return Err(if dir.exists() {
                            err.hint(HINT_LEFTOVER)
                        } else {
                            err
                        });
                    }
                }
            }
            let image = fs::metadata(&spec.image_root)
                .map_err(|e| JailError::io("stat", &spec.image_root, e))?;
            let (uid, gid) = ids.init_host_ids();
            // "/" in the guest: the image root's mode, owned by the guest's root.
            own(&layers.upper, uid, gid, image.mode() & 0o7777)?;
            own(&layers.work, uid, gid, 0o700)?;
            own(
                &layers.root,
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
                0o755,
            )?;
            for dir in &spec.guest_dirs {
                create_guest_dir(&layers.upper, &spec.image_root, dir, ids)?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(layers),
            Err(e) => {
                for dir in made {
                    // Best effort: the original error is the one to report.
                    let _ = remove_tree(dir);
                }
                Err(e)
            }
        }
    }

    /// A kept `upper/` with fresh `work/` (overlayfs leaves its scratch there) and `root/`.
    fn prepare_over_kept(spec: &JailSpec, ids: &IdMap) -> Result<Layers, JailError> {
        let layers = Layers {
            fresh_upper: false,
            ..Layers::at(&spec.state_dir)
        };
        match fs::symlink_metadata(&layers.upper) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(JailError::InvalidSpec(format!(
                    "{} is not a directory; there is no kept layer to boot over",
                    layers.upper.display()
                )))
            }
            Err(e) => {
                return Err(JailError::io("use the kept layer", &layers.upper, e)
                    .hint("the sandbox's upper layer is gone; nothing is left to recover"))
            }
        }
        let result = (|| {
            for dir in [&layers.work, &layers.root] {
                match remove_tree(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(JailError::io("remove", dir, e)),
                }
                fs::create_dir(dir).map_err(|e| JailError::io("create", dir, e))?;
            }
            // overlayfs's scratch belongs to the guest's root as the overlay sees it: through
            // the idmapped disk of a layer written under other ids (see `spawn`), those ids.
            let (uid, gid) = spec.layer_ids.as_ref().unwrap_or(ids).init_host_ids();
            own(&layers.work, uid, gid, 0o700)?;
            own(
                &layers.root,
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
                0o755,
            )
        })();
        match result {
            Ok(()) => Ok(layers),
            Err(e) => {
                let _ = layers.remove_scratch();
                Err(e)
            }
        }
    }

    /// Deletes the three layer directories and everything in them (guest data included,
    /// without following its symlinks). Returns what could not be removed.
    pub fn remove(&self) -> Vec<String> {
        remove_dirs(&self.all())
    }

    /// Deletes `work/` and `root/` but keeps `upper/`, the guest's files: what a stopped
    /// sandbox whose work was not saved leaves behind.
    pub fn remove_scratch(&self) -> Vec<String> {
        remove_dirs(&[&self.work, &self.root])
    }

    /// Whether `upper/` was made by this start rather than kept from a stopped guest.
    pub fn is_fresh(&self) -> bool {
        self.fresh_upper
    }

    /// Undoes [`Layers::prepare`] after a failed start: everything, except a kept `upper/`.
    pub fn undo_prepare(&self) -> Vec<String> {
        if self.fresh_upper {
            self.remove()
        } else {
            self.remove_scratch()
        }
    }
}

fn remove_dirs(dirs: &[&Path]) -> Vec<String> {
    dirs.iter()
        .filter_map(|dir| match remove_tree(dir) {
            Ok(()) => None,
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => Some(format!("cannot remove {}: {e}", dir.display())),
        })
        .collect()
}

fn own(path: &Path, uid: u32, gid: u32, mode: u32) -> Result<(), JailError> {
    lchown(path, Some(uid), Some(gid))
        .map_err(|e| JailError::io(&format!("chown {uid}:{gid}"), path, e))?;
    // After chown, which may clear set-id bits.
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| JailError::io(&format!("chmod {mode:o}"), path, e))
}

/// What the image has at a path, for the purpose of creating a guest dir over it.
fn image_entry(
    image_root: &Path,
    rel: &Path,
    guest: &GuestDir,
) -> Result<Option<fs::Metadata>, JailError> {
    let path = image_root.join(rel);
    match fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(JailError::InvalidSpec(format!(
            "guest_dir {}: /{} is a symlink in the image; name the directory it points to",
            guest.path.display(),
            rel.display()
        ))),
        Ok(meta) if !meta.is_dir() => Err(JailError::InvalidSpec(format!(
            "guest_dir {}: /{} is not a directory in the image",
            guest.path.display(),
            rel.display()
        ))),
        Ok(meta) => Ok(Some(meta)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(JailError::io("stat", &path, e)),
    }
}

/// Whether `path` is a directory (not a symlink to one) with nothing in it.
fn is_empty_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir())
        && fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_none())
}

fn create_guest_dir(
    upper: &Path,
    image_root: &Path,
    dir: &GuestDir,
    ids: &IdMap,
) -> Result<(), JailError> {
    let unmapped = |what: &str, id: u32| {
        JailError::InvalidSpec(format!(
            "guest_dir {}: guest {what} {id} has no host id in this jail's id map ({})",
            dir.path.display(),
            if ids.is_rootless() {
                "an unprivileged supervisor maps only guest 1000"
            } else {
                "guest ids 0..65536 are mapped"
            }
        ))
    };
    let uid = ids
        .to_host(dir.uid)
        .ok_or_else(|| unmapped("uid", dir.uid))?;
    let gid = ids
        .gid_to_host(dir.gid)
        .ok_or_else(|| unmapped("gid", dir.gid))?;
    let rel = guest_relative(&dir.path)?;
    let (init_uid, init_gid) = ids.init_host_ids();

    let mut prefix = PathBuf::new();
    let names: Vec<_> = rel.iter().collect();
    let Some((_, parents)) = names.split_last() else {
        return Err(JailError::InvalidSpec(
            "a guest_dir names the guest root".to_owned(),
        ));
    };
    for name in parents {
        prefix.push(name);
        let target = upper.join(&prefix);
        let lower = image_entry(image_root, &prefix, dir)?;
        if fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        fs::create_dir(&target).map_err(|e| JailError::io("create", &target, e))?;
        if lower
            .as_ref()
            .is_some_and(|meta| !listable_by(meta, init_uid, init_gid))
        {
            make_opaque(&target)?;
        }
        let mode = lower.map_or(0o755, |meta| meta.mode() & 0o7777);
        own(&target, init_uid, init_gid, mode)?;
    }
    let lower = image_entry(image_root, &rel, dir)?;
    let target = upper.join(&rel);
    match fs::create_dir(&target) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && target.is_dir() => {}
        Err(e) => return Err(JailError::io("create", &target, e)),
    }
    if lower.is_some_and(|meta| !listable_by(&meta, init_uid, init_gid)) {
        make_opaque(&target)?;
    }
    own(&target, uid, gid, dir.mode)
}

/// Whether a process with exactly these host ids (no supplementary groups, no capabilities
/// over the inode) may list and enter the directory.
fn listable_by(meta: &fs::Metadata, uid: u32, gid: u32) -> bool {
    let mode = meta.mode();
    let needed = if meta.uid() == uid {
        0o500
    } else if meta.gid() == gid {
        0o050
    } else {
        0o005
    };
    mode & needed == needed
}

/// Marks an upper directory opaque: the overlay shows none of the lower directory's entries.
fn make_opaque(dir: &Path) -> Result<(), JailError> {
    let path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
        .map_err(|_| JailError::InvalidSpec(format!("{} contains a NUL byte", dir.display())))?;
    let value = b"y";
    // SAFETY: path is NUL-terminated, the name a static C string, value a live 1-byte buffer
    // whose length is passed.
    let ret = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(JailError::io(
            "set user.overlay.opaque on",
            dir,
            io::Error::last_os_error(),
        )
        .hint("the state dir's filesystem must support user extended attributes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Limits;

    fn spec(image: &Path, state: &Path, guest_dirs: Vec<GuestDir>) -> JailSpec {
        JailSpec {
            name: "t".into(),
            hostname: "t".into(),
            image_root: image.into(),
            ro_binds: vec![],
            rw_binds: vec![],
            cache: None,
            state_dir: state.into(),
            guest_dirs,
            agent_binary: "/bin/true".into(),
            agent_args: vec![],
            limits: Limits {
                cpu_millis: 1000,
                memory_bytes: 1 << 30,
                pids: 10,
            },
            reuse_layers: false,
            layer_ids: None,
            disk_bytes: None,
            disk_templates: None,
            net_raw: true,
            idmap_image: false,
            exec_cgroup: None,
        }
    }

    fn me() -> IdMap {
        // Ids this test process can chown to whether or not it runs as root.
        IdMap::rootless(
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    }

    #[test]
    fn prepares_and_removes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let image = tmp.path().join("image");
        fs::create_dir_all(image.join("home")).expect("mkdir");
        fs::set_permissions(image.join("home"), fs::Permissions::from_mode(0o751)).expect("chmod");
        let state = tmp.path().join("state");
        fs::create_dir_all(state.join("disk")).expect("mkdir");
        let dirs = vec![
            GuestDir {
                path: "/home/sandbox".into(),
                uid: 1000,
                gid: 1000,
                mode: 0o750,
            },
            GuestDir {
                path: "/workspace/a".into(),
                uid: 1000,
                gid: 1000,
                mode: 0o700,
            },
        ];
        let s = spec(&image, &state, dirs);
        let layers = Layers::prepare(&s, &me()).expect("prepare");
        let mode = |p: &str| fs::metadata(layers.upper.join(p)).expect("stat").mode() & 0o7777;
        assert_eq!(mode("home"), 0o751, "parent keeps the image's mode");
        assert_eq!(mode("home/sandbox"), 0o750);
        assert_eq!(mode("workspace"), 0o755);
        assert_eq!(mode("workspace/a"), 0o700);
        assert_eq!(
            fs::metadata(&layers.work).expect("work").mode() & 0o777,
            0o700
        );

        // A second prepare on the same state dir is refused with the cleanup hint.
        let err = Layers::prepare(&s, &me()).expect_err("reuse");
        assert!(err.to_string().contains("cleanup_leftovers"), "{err}");

        assert!(layers.remove().is_empty());
        assert!(!layers.upper.exists() && !layers.work.exists() && !layers.root.exists());
    }

    #[test]
    fn a_fresh_disks_empty_layer_dirs_are_taken_and_anything_in_them_is_a_leftover() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let image = tmp.path().join("image");
        fs::create_dir_all(&image).expect("mkdir");
        let state = tmp.path().join("state");
        // As a freshly formatted disk has them (see `disk`'s format).
        let disk = state.join("disk");
        for dir in [UPPER, WORK] {
            fs::create_dir_all(disk.join(dir)).expect("mkdir");
        }
        let s = spec(&image, &state, vec![]);
        let layers = Layers::prepare(&s, &me()).expect("prepare over the disk's own");
        assert_eq!(
            fs::metadata(&layers.work).expect("work").mode() & 0o777,
            0o700,
            "taken over and owned as if made"
        );
        assert!(layers.remove().is_empty());

        // Anything in them is not a fresh disk's: another sandbox's data is never reused.
        for dir in [UPPER, WORK] {
            fs::create_dir_all(disk.join(dir)).expect("mkdir");
        }
        fs::write(disk.join(UPPER).join("left"), "over").expect("write");
        let err = Layers::prepare(&s, &me()).expect_err("a used upper");
        assert!(err.to_string().contains("cleanup_leftovers"), "{err}");
        assert!(
            disk.join(UPPER).join("left").exists(),
            "a refused prepare deletes nothing"
        );
        // A symlink in a layer's place is no directory of the disk's either.
        fs::remove_dir_all(disk.join(UPPER)).expect("rm");
        std::os::unix::fs::symlink(tmp.path(), disk.join(UPPER)).expect("symlink");
        let err = Layers::prepare(&s, &me()).expect_err("a symlinked upper");
        assert!(err.to_string().contains("cleanup_leftovers"), "{err}");
    }

    #[test]
    fn refuses_symlinked_parents_and_unmapped_ids_and_cleans_up() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let image = tmp.path().join("image");
        fs::create_dir_all(image.join("var/home")).expect("mkdir");
        std::os::unix::fs::symlink("var/home", image.join("home")).expect("symlink");
        let state = tmp.path().join("state");
        fs::create_dir_all(state.join("disk")).expect("mkdir");

        let linked = vec![GuestDir {
            path: "/home/x".into(),
            uid: 1000,
            gid: 1000,
            mode: 0o755,
        }];
        let err = Layers::prepare(&spec(&image, &state, linked), &me()).expect_err("symlink");
        assert!(err.to_string().contains("symlink"), "{err}");
        assert!(
            !state.join("disk/upper").exists(),
            "partial state left behind"
        );

        let unmapped = vec![GuestDir {
            path: "/x".into(),
            uid: 0,
            gid: 0,
            mode: 0o755,
        }];
        let err = Layers::prepare(&spec(&image, &state, unmapped), &me()).expect_err("unmapped");
        assert!(err.to_string().contains("no host id"), "{err}");
        assert!(!state.join("disk/upper").exists());
    }
}
