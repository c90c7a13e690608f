//! Guest images: the read-only root a sandbox starts from.
//!
//! The default image `host` is a small skeleton (a minimal `/etc`, mountpoints) plus the host's
//! system directories bound read-only. It never contains or binds a home directory. Built
//! images (`dynocap image build debian`, see [`store`] and [`build`]) are whole root
//! filesystems and provide the same [`Image`] shape with no host binds.
//!
//! A sandbox record names its image by [`ImageRef`] (name and content id), resolved once when
//! the sandbox is created: a later build of a newer image never changes a sandbox's root,
//! and a recovery boot gets the very same lower layer.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

pub(crate) use failure::ImageFailure;

use crate::foundation::error::{Context, Error, Result};
use crate::host::home::Home;
pub use crate::model::image_ref::{ImageRef, KernelRef, DEFAULT_IMAGE};

pub mod build;
mod customise;
pub mod devcontainer;
mod failure;
#[doc(hidden)]
pub mod fuzzing;
pub mod import;
pub mod layers;
mod mmdebstrap;
pub mod oci;
pub mod pull;
pub mod recipe;
pub mod recipe_layer;
pub mod run_config;
mod sandbox_user;
pub mod store;
pub mod unpack;

pub use sandbox_user::{SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID};
/// Where the agent keeps its private state (the agent's own default).
pub const AGENT_STATE_DIR: &str = "/var/lib/dynocap";

/// What a backend needs to build a guest root.
#[derive(Debug, Clone)]
pub struct Image {
    pub name: String,
    /// The read-only lower layer.
    pub root: PathBuf,
    /// Host paths bound read-only into the guest: (host source, guest target).
    pub ro_binds: Vec<(PathBuf, PathBuf)>,
    /// The root is a whole filesystem owned by host root (a built image), which a backend
    /// shows to the guest as owned by the guest's root (the jail: an idmapped lower layer).
    pub owned_by_host_root: bool,
    /// The sandbox user may run commands as the guest's root through the agent's `sudo`
    /// broker. Only images that opt in; the `host` image never does. The image's `sudo` is a
    /// link to `/.dynocap/agent`, so a backend must put the agent there.
    pub guest_sudo: bool,
    /// A built image's content id (`None` for `host`): the key for whatever a backend derives
    /// from the image and caches (a disk image, an initramfs).
    pub id: Option<String>,
    /// The kernel a backend that boots one (the vm) boots this image with: the image's own,
    /// or, for an image that carries none (an imported container image), the kernel of the
    /// newest image on this host that has one (`dynocap image build debian`).
    pub kernel: Option<KernelFiles>,
}

/// A kernel shipped inside an image's rootfs (host paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFiles {
    /// The root filesystem it is in: the booted image's own, or the image that lends it.
    pub root: PathBuf,
    /// e.g. `6.1.0-50-cloud-amd64`.
    pub release: String,
    /// `rootfs/boot/vmlinuz-<release>`.
    pub vmlinuz: PathBuf,
    /// `rootfs/boot/initrd.img-<release>`, Debian's own initramfs, if present.
    pub initrd: Option<PathBuf>,
    /// `rootfs/lib/modules/<release>`.
    pub modules: PathBuf,
}

/// The error for an image that is not on this host; `on_host` names the images that are.
fn not_built(name: &str, on_host: &[String]) -> Error {
    let mut here = vec![format!("{DEFAULT_IMAGE} (the default)")];
    for other in on_host {
        if !here.contains(other) {
            here.push(other.clone());
        }
    }
    let here = here.join(", ");
    if store::is_reference(name) {
        return Error::invalid(format!(
            "image \"{name}\" is not on this host; pull it with `dynocap image pull {name}` \
             (images here: {here})"
        ));
    }
    if name == "auto" {
        return Error::invalid(format!(
            "image \"auto\" (the image the project's devcontainer.json names) is for `task \
             start` of a project; name an image here (images here: {here})"
        ));
    }
    if recipe::BUILDABLE.contains(&name) {
        Error::invalid(format!(
            "image \"{name}\" is not built; build it with `dynocap image build {name}` \
             (images here: {here})"
        ))
    } else {
        Error::invalid(format!(
            "there is no image named \"{}\" on this host (images here: {here}); make it with \
             `dynocap image pull`, `image import` or `image build` (`dynocap image build \
             debian` makes the debian image)",
            oci::printable(name),
        ))
    }
}

/// Resolves an image name to what a new sandbox records: `host`, or the newest build of a
/// built image.
pub fn resolve(home: &Home, name: &str) -> Result<ImageRef> {
    if name == DEFAULT_IMAGE {
        return Ok(ImageRef::host());
    }
    let store = store::ImageStore::for_home(home, None);
    let images = store.list()?;
    let names = || {
        images
            .iter()
            .map(|i| i.name().to_owned())
            .collect::<Vec<_>>()
    };
    if !store::is_name(name) && !store::is_reference(name) {
        return Err(not_built(name, &names()));
    }
    match images.iter().rev().find(|i| i.name() == name) {
        Some(image) => Ok(ImageRef::built(name, image.id())),
        None => Err(not_built(name, &names())),
    }
}

/// Resolves the image named to lend its kernel (`--kernel NAME`): the newest build of a
/// built image that carries a kernel.
pub fn resolve_kernel(home: &Home, name: &str) -> Result<KernelRef> {
    let found = resolve(home, name)?;
    let built = found
        .id
        .as_ref()
        .and_then(|id| store::ImageStore::for_home(home, None).get(&found.name, id));
    match built {
        Some(built) if kernel_files(&built).is_some() => Ok(KernelRef {
            name: found.name,
            id: built.id().to_owned(),
        }),
        _ => Err(Error::invalid(format!(
            "image \"{}\" carries no kernel to boot a vm with; name an image that has one \
             (`dynocap image ls` shows each image's kernel; `dynocap image build debian` \
             makes one)",
            oci::printable(name)
        ))),
    }
}

/// Opens the image a record names, for booting.
pub fn open(home: &Home, image: &ImageRef) -> Result<Image> {
    let Some(id) = &image.id else {
        return host_image(&home.images_dir());
    };
    let built = store::ImageStore::for_home(home, None)
        .get(&image.name, id)
        .ok_or_else(|| ImageFailure::Gone {
            name: image.name.clone(),
            short_id: build::short(id).to_owned(),
            images_dir: home.images_dir(),
        })?;
    Ok(Image {
        name: built.name().to_owned(),
        root: built.rootfs(),
        ro_binds: Vec::new(),
        owned_by_host_root: true,
        guest_sudo: built.meta.guest_sudo,
        id: Some(built.id().to_owned()),
        kernel: match &image.kernel {
            Some(named) => Some(named_kernel(home, named)?),
            None => kernel_files(&built).or_else(|| lent_kernel(home)),
        },
    })
}

/// The kernel of the image a record names to lend it (see [`resolve_kernel`]).
fn named_kernel(home: &Home, named: &KernelRef) -> Result<KernelFiles> {
    store::ImageStore::for_home(home, None)
        .get(&named.name, &named.id)
        .as_ref()
        .and_then(kernel_files)
        .ok_or_else(|| {
            ImageFailure::Gone {
                name: named.name.clone(),
                short_id: build::short(&named.id).to_owned(),
                images_dir: home.images_dir(),
            }
            .into()
        })
}

/// What the config of the image a record names asks of its commands (nothing for `host`, a
/// built image, or an image that is gone: booting it reports that).
pub fn run_config(home: &Home, image: &ImageRef) -> run_config::RunConfig {
    let built = image
        .id
        .as_ref()
        .and_then(|id| store::ImageStore::for_home(home, None).get(&image.name, id));
    let Some((config, rootfs)) = built.and_then(|b| b.meta.config.clone().zip(Some(b.rootfs())))
    else {
        return run_config::RunConfig::default();
    };
    let mut run = run_config::RunConfig::from_config(&config, &mut |skipped| {
        tracing::warn!("image {}: not applied: {skipped}", image.name)
    });
    if let Some(dir) = &run.working_dir {
        if !in_image(&rootfs, dir) {
            tracing::warn!(
                "image {}: its WorkingDir {dir:?} is not a directory in it; commands start in \
                 their usual directory",
                image.name
            );
            run.working_dir = None;
        }
    }
    run
}

/// Whether `dir` (absolute) is a directory of the image at `rootfs`, as far as the host can
/// tell without following the image's links: a component that is a link is left for the
/// guest to resolve (an image's links are its own business inside the guest, never the
/// host's to follow).
fn in_image(rootfs: &Path, dir: &str) -> bool {
    let mut path = rootfs.to_owned();
    for part in dir.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." {
            return false;
        }
        path.push(part);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_symlink() => return true,
            Ok(meta) if meta.is_dir() => {}
            _ => return false,
        }
    }
    true
}

/// Where the guest agent looks for the programs it runs itself, git among them (the
/// agent's `spawn::BASE_PATH`, relative to the image's root).
const GUEST_BASE_PATH: &[&str] = &[
    "usr/local/sbin",
    "usr/local/bin",
    "usr/sbin",
    "usr/bin",
    "sbin",
    "bin",
];

/// Whether the image a record names has an executable `program` where the guest agent looks
/// for it ([`GUEST_BASE_PATH`]), its links resolved inside the image (`openat2` with
/// `RESOLVE_IN_ROOT`: never the host's files). `None` when it cannot tell: the `host` image,
/// an image that is gone (booting it says so), or a kernel without `openat2`.
pub fn has_program(home: &Home, image: &ImageRef, program: &str) -> Option<bool> {
    use nix::errno::Errno;
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    use std::os::fd::AsFd;
    let id = image.id.as_ref()?;
    let built = store::ImageStore::for_home(home, None).get(&image.name, id)?;
    let root = fs::File::open(built.rootfs()).ok()?;
    for dir in GUEST_BASE_PATH {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        match openat2(root.as_fd(), &Path::new(dir).join(program), how) {
            Ok(fd) => {
                let meta = nix::sys::stat::fstat(&fd).ok()?;
                let mode = meta.st_mode;
                if mode & libc::S_IFMT == libc::S_IFREG && mode & 0o111 != 0 {
                    return Some(true);
                }
            }
            Err(Errno::ENOSYS | Errno::EPERM) => return None,
            Err(_) => {}
        }
    }
    Some(false)
}

/// The kernel inside `built`, if it has one.
fn kernel_files(built: &store::BuiltImage) -> Option<KernelFiles> {
    let (vmlinuz, modules) = built.kernel_path().zip(built.modules_dir())?;
    Some(KernelFiles {
        root: built.rootfs(),
        release: built.meta.kernel.clone().unwrap_or_default(),
        vmlinuz,
        initrd: built.initrd_path(),
        modules,
    })
}

/// The image whose kernel a vm boots `image` with when it carries none of its own (a
/// container image): the newest image on this host that has one. Recorded when the sandbox
/// is created, as its image is, so that a recovery boots the same kernel and `image rm`
/// knows the sandbox needs that image. `None` for an image with a kernel of its own, for
/// `host`, and when no image here has one (the boot then says what to build).
pub fn lent_kernel_ref(home: &Home, image: &ImageRef) -> Option<KernelRef> {
    let id = image.id.as_ref()?;
    if kernel_files(&store::ImageStore::for_home(home, None).get(&image.name, id)?).is_some() {
        return None;
    }
    kernel_lender(home).map(|lender| KernelRef {
        name: lender.name().to_owned(),
        id: lender.id().to_owned(),
    })
}

/// The newest image on this host that has a kernel: the one that lends it.
fn kernel_lender(home: &Home) -> Option<store::BuiltImage> {
    let images = store::ImageStore::for_home(home, None).list().ok()?;
    // Oldest first.
    images
        .into_iter()
        .rev()
        .find(|image| kernel_files(image).is_some())
}

/// For an image without a kernel: the kernel of the newest image on this host that has one
/// (a record made before the lender was recorded).
/// Container images carry no kernel; DynoCap's guest kernel (the debian image's) boots them.
fn lent_kernel(home: &Home) -> Option<KernelFiles> {
    kernel_lender(home).as_ref().and_then(kernel_files)
}

/// Bump when the skeleton's content changes, so old skeletons are rebuilt.
const HOST_IMAGE_REVISION: &str = "4";

/// Top-level system directories taken from the host. On a merged-/usr system most are
/// symlinks into /usr and are reproduced as symlinks.
const HOST_SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Host directories under /etc that system tools need, bound read-only when present: TLS
/// certificates, and Debian's alternatives (`/usr/bin/awk` is a link through
/// `/etc/alternatives`). None of them holds secrets.
const HOST_ETC_BINDS: &[&str] = &["etc/ssl/certs", "etc/ca-certificates", "etc/alternatives"];

/// Host files under /etc bound read-only when present, onto an empty file the skeleton holds:
/// the dynamic linker's cache, so that the host's programs find their libraries in the guest
/// as on the host. Without it every dynamically linked program searched the default
/// directories for each of its libraries (a dozen failed lookups for `sh` alone, on every
/// command), and found none in the directories that `/etc/ld.so.conf.d` adds (`/usr/local/lib`
/// and the like). It lists library paths, nothing secret.
const HOST_ETC_FILE_BINDS: &[&str] = &["etc/ld.so.cache"];

/// Prepares (once) and returns the `host` image under `images_dir`.
///
/// Each revision of the skeleton lives in its own directory and is never changed once
/// installed: running sandboxes use it as their overlay's lower layer, which must not change
/// under them. Concurrent starts serialise on a lock file while one of them builds it.
pub fn host_image(images_dir: &Path) -> Result<Image> {
    let dir = images_dir.join("host");
    let root = dir.join(format!("rootfs-r{HOST_IMAGE_REVISION}"));
    if !root.is_dir() {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let lock_path = dir.join(".lock");
        let lock_file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, source)| ImageFailure::Lock {
                path: lock_path.clone(),
                source,
            })?;
        // Another start may have built it while we waited for the lock.
        if !root.is_dir() {
            build_host_skeleton(&dir, &root)?;
        }
    }

    // Each bound at the same path in the guest as on the host.
    let dirs = HOST_SYSTEM_DIRS
        .iter()
        .chain(HOST_ETC_BINDS)
        .map(|rel| Path::new("/").join(rel))
        .filter(|host| is_real_dir(host));
    // The skeleton has the file to bind onto if the host had it when it was built.
    let files = HOST_ETC_FILE_BINDS
        .iter()
        .filter(|rel| is_regular_file(&root.join(rel)))
        .map(|rel| Path::new("/").join(rel))
        .filter(|host| is_regular_file(host));
    let ro_binds = dirs.chain(files).map(|host| (host.clone(), host)).collect();
    Ok(Image {
        name: DEFAULT_IMAGE.into(),
        root,
        ro_binds,
        owned_by_host_root: false,
        guest_sudo: false,
        id: None,
        kernel: None,
    })
}

fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path)
        .map(|m| m.is_dir())
        .unwrap_or(false)
}

fn is_regular_file(path: &Path) -> bool {
    fs::symlink_metadata(path)
        .map(|m| m.is_file())
        .unwrap_or(false)
}

/// Builds the skeleton in a staging directory and renames it into place, so a crash mid-build
/// never leaves a half-made image that later sandboxes would use. Callers hold the lock.
fn build_host_skeleton(dir: &Path, root: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let staging = dir.join(format!("rootfs.new-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    let mk = |rel: &str, mode: u32| -> Result<()> {
        let path = staging.join(rel);
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", path.display()))
    };
    mk("", 0o755)?;
    for rel in [
        "etc", "proc", "dev", "sys", "run", "home", "var", "var/tmp", "root", ".dynocap", "etc/ssl",
    ] {
        mk(rel, 0o755)?;
    }
    mk("tmp", 0o1777)?;
    mk("var/tmp", 0o1777)?;
    mk("root", 0o700)?;

    for name in HOST_SYSTEM_DIRS {
        let host = Path::new("/").join(name);
        let target = staging.join(name);
        match fs::symlink_metadata(&host) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link =
                    fs::read_link(&host).with_context(|| format!("reading {}", host.display()))?;
                symlink(&link, &target)
                    .with_context(|| format!("creating {}", target.display()))?;
            }
            Ok(meta) if meta.is_dir() => mk(name, 0o755)?,
            _ => {}
        }
    }
    for rel in HOST_ETC_BINDS {
        if is_real_dir(&Path::new("/").join(rel)) {
            mk(rel, 0o755)?;
        }
    }
    // Binds need their mountpoint's parent in the image.
    mk("etc/ssl", 0o755)?;
    // The agent binary is bound onto this file, and the host's files onto these.
    write_file(&staging.join(".dynocap/agent"), "", 0o755)?;
    for rel in HOST_ETC_FILE_BINDS {
        if is_regular_file(&Path::new("/").join(rel)) {
            write_file(&staging.join(rel), "", 0o644)?;
        }
    }

    let files: &[(&str, String, u32)] = &[
        (
            "etc/passwd",
            format!(
                "root:x:0:0:root:/root:/bin/sh\n\
                 sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:DynoCap sandbox user:{SANDBOX_HOME}:/bin/sh\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
            0o644,
        ),
        (
            "etc/group",
            format!("root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"),
            0o644,
        ),
        ("etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".into(), 0o644),
        // The guest has no network by default; an empty resolver config makes lookups fail
        // fast instead of timing out against a nameserver it cannot reach.
        ("etc/resolv.conf", "# DynoCap: no DNS inside the sandbox unless its network mode provides it\n".into(), 0o644),
        ("etc/nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n".into(), 0o644),
        ("etc/shells", "/bin/sh\n/bin/bash\n".into(), 0o644),
    ];
    for (rel, content, mode) in files {
        write_file(&staging.join(rel), content, *mode)?;
    }

    fs::rename(&staging, root).map_err(|source| {
        ImageFailure::InstallSkeleton {
            root: root.to_owned(),
            source,
        }
        .into()
    })
}

fn write_file(path: &Path, content: &str, mode: u32) -> Result<()> {
    fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skeleton_has_no_home_and_binds_only_system_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let image = host_image(dir.path()).unwrap();
        let passwd = fs::read_to_string(image.root.join("etc/passwd")).unwrap();
        assert!(passwd.contains("sandbox:x:1000:1000"));
        assert!(fs::read_dir(image.root.join("home"))
            .unwrap()
            .next()
            .is_none());
        for (host, guest) in &image.ro_binds {
            assert_eq!(host, guest);
            assert!(
                !host.starts_with("/home") && !host.starts_with("/root"),
                "{host:?}"
            );
        }
        assert!(image.ro_binds.iter().any(|(h, _)| h == Path::new("/usr")));
        // A second call reuses the skeleton.
        let again = host_image(dir.path()).unwrap();
        assert_eq!(again.root, image.root);
    }

    #[test]
    fn a_missing_image_is_told_with_the_images_here_and_how_to_get_it() {
        let here = vec![
            "registry.test:5000/team/app:1".to_owned(),
            "tool".to_owned(),
        ];
        let msg = not_built("nosuch", &here).message;
        assert!(
            msg.contains("no image named \"nosuch\"")
                && msg.contains("host (the default), registry.test:5000/team/app:1, tool")
                && msg.contains("dynocap image pull")
                && msg.contains("makes the debian image"),
            "{msg}"
        );
        let msg = not_built("registry.test:5000/team/other:1", &here).message;
        assert!(
            msg.contains("`dynocap image pull registry.test:5000/team/other:1`"),
            "{msg}"
        );
        let msg = not_built("auto", &here).message;
        assert!(msg.contains("task"), "{msg}");
        let msg = not_built("debian", &[]).message;
        assert!(msg.contains("`dynocap image build debian`"), "{msg}");
    }

    #[test]
    fn a_program_is_looked_for_inside_the_image_its_links_resolved_there() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home")).unwrap();
        let id = "ab".repeat(32);
        fake_build(&home, &id, "2026-01-01T00:00:00Z");
        let image = resolve(&home, "debian").unwrap();
        let root = home.images_dir().join("debian").join(&id).join("rootfs");
        // A link to the host's own git (present on any machine that runs these tests, as
        // DynoCap needs it) is resolved inside the image, where nothing is.
        fs::create_dir_all(root.join("usr/local/bin")).unwrap();
        symlink("/usr/bin/git", root.join("usr/local/bin/git")).unwrap();
        // A merged /usr: bin is a link.
        symlink("usr/bin", root.join("bin")).unwrap();
        assert_eq!(has_program(&home, &image, "git"), Some(false));
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::write(root.join("usr/bin/git"), "").unwrap();
        assert_eq!(
            has_program(&home, &image, "git"),
            Some(false),
            "not executable"
        );
        fs::set_permissions(root.join("usr/bin/git"), fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(has_program(&home, &image, "git"), Some(true));
        fs::remove_file(root.join("usr/bin/git")).unwrap();
        fs::create_dir_all(root.join("usr/libexec")).unwrap();
        fs::write(root.join("usr/libexec/git"), "").unwrap();
        fs::set_permissions(
            root.join("usr/libexec/git"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        // Through the merged /bin, to an absolute link the image's root anchors.
        fs::remove_file(root.join("usr/local/bin/git")).unwrap();
        symlink("/usr/libexec/git", root.join("usr/bin/git")).unwrap();
        assert_eq!(has_program(&home, &image, "git"), Some(true));
        assert_eq!(has_program(&home, &ImageRef::host(), "git"), None);
    }

    /// Installs a fake built image (metadata and an empty rootfs with a kernel's files).
    fn fake_build(home: &Home, id: &str, created: &str) {
        let dir = home.images_dir().join("debian").join(id);
        fs::create_dir_all(dir.join("rootfs/boot")).unwrap();
        fs::create_dir_all(dir.join("rootfs/lib/modules/6.1.0-9-cloud-amd64")).unwrap();
        fs::write(dir.join("rootfs/boot/vmlinuz-6.1.0-9-cloud-amd64"), "").unwrap();
        let meta = store::ImageMeta {
            name: "debian".into(),
            id: id.into(),
            created: created.into(),
            size_bytes: 0,
            suite: "bookworm".into(),
            packages: vec![],
            kernel: Some("6.1.0-9-cloud-amd64".into()),
            guest_sudo: true,
            source: None,
            config: None,
            layers: vec![],
        };
        fs::write(
            dir.join(store::META_FILE),
            serde_json::to_string(&meta).unwrap(),
        )
        .unwrap();
    }

    #[test]
    fn an_image_without_a_kernel_boots_with_the_newest_image_kernel_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home")).unwrap();
        // An imported image: a rootfs and no kernel.
        let id = "3".repeat(64);
        let imported = home.images_dir().join("tiny").join(&id);
        fs::create_dir_all(imported.join("rootfs/bin")).unwrap();
        let meta = store::ImageMeta {
            name: "tiny".into(),
            id: id.clone(),
            created: "2026-01-01T00:00:00Z".into(),
            size_bytes: 0,
            suite: String::new(),
            packages: vec![],
            kernel: None,
            guest_sudo: false,
            source: None,
            config: None,
            layers: vec![],
        };
        fs::write(
            imported.join(store::META_FILE),
            serde_json::to_string(&meta).unwrap(),
        )
        .unwrap();
        let tiny = ImageRef::built("tiny", id);
        assert_eq!(
            open(&home, &tiny).unwrap().kernel,
            None,
            "nothing to lend yet"
        );
        assert_eq!(lent_kernel_ref(&home, &tiny), None);

        let (old, new) = ("1".repeat(64), "2".repeat(64));
        fake_build(&home, &old, "2026-01-01T00:00:00Z");
        fake_build(&home, &new, "2026-02-01T00:00:00Z");
        let image = open(&home, &tiny).unwrap();
        assert_eq!(image.root, imported.join("rootfs"), "its own root");
        let lent = image.kernel.expect("a kernel lent by the newest debian");
        let lender = home.images_dir().join("debian").join(&new).join("rootfs");
        assert_eq!(lent.root, lender);
        assert_eq!(
            lent.vmlinuz,
            lender.join("boot/vmlinuz-6.1.0-9-cloud-amd64")
        );

        // What a new sandbox's record keeps: the lender, by id.
        let recorded = lent_kernel_ref(&home, &tiny).expect("a lender");
        assert_eq!(
            (recorded.name.as_str(), recorded.id.as_str()),
            ("debian", new.as_str())
        );
        assert_eq!(
            lent_kernel_ref(&home, &ImageRef::built("debian", old.clone())),
            None
        );
        assert_eq!(lent_kernel_ref(&home, &ImageRef::host()), None);

        // A kernel the person names: that image's, not the newest one's.
        let err = resolve_kernel(&home, "tiny").unwrap_err();
        assert!(err.message.contains("carries no kernel"), "{err}");
        let err = resolve_kernel(&home, "host").unwrap_err();
        assert!(err.message.contains("carries no kernel"), "{err}");
        let named = resolve_kernel(&home, "debian").unwrap();
        assert_eq!(named.id, new, "the newest build of the image named");
        let mut with_old = tiny.clone();
        with_old.kernel = Some(KernelRef {
            name: "debian".into(),
            id: old.clone(),
        });
        let image = open(&home, &with_old).unwrap();
        assert_eq!(image.root, imported.join("rootfs"), "still its own root");
        let old_root = home.images_dir().join("debian").join(&old).join("rootfs");
        assert_eq!(image.kernel.expect("the named kernel").root, old_root);
        // Gone from the host: said, never another kernel instead.
        fs::remove_dir_all(home.images_dir().join("debian").join(&old)).unwrap();
        let err = open(&home, &with_old).unwrap_err();
        assert!(err.message.contains("is gone"), "{err}");
    }

    #[test]
    fn a_record_names_the_newest_build_and_boots_exactly_that_one() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home")).unwrap();
        let err = resolve(&home, "debian").unwrap_err();
        assert!(err.message.contains("dynocap image build debian"), "{err}");
        let err = resolve(&home, "../etc").unwrap_err();
        assert!(err.message.contains("no image named"), "{err}");
        assert_eq!(resolve(&home, "host").unwrap(), ImageRef::host());

        let (old, new) = ("1".repeat(64), "2".repeat(64));
        fake_build(&home, &old, "2026-01-01T00:00:00Z");
        fake_build(&home, &new, "2026-02-01T00:00:00Z");
        let picked = resolve(&home, "debian").unwrap();
        assert_eq!(picked.id.as_deref(), Some(new.as_str()));

        // A record keeps its id: the older build is what it boots, whatever is newer.
        let image = open(&home, &ImageRef::built("debian", old.clone())).unwrap();
        let rootfs = home.images_dir().join("debian").join(&old).join("rootfs");
        assert_eq!(image.root, rootfs);
        assert!(image.ro_binds.is_empty() && image.owned_by_host_root && image.guest_sudo);
        assert_eq!(image.id.as_deref(), Some(old.as_str()));
        let kernel = image.kernel.expect("kernel");
        assert_eq!(
            kernel.vmlinuz,
            rootfs.join("boot/vmlinuz-6.1.0-9-cloud-amd64")
        );
        assert_eq!(
            kernel.modules,
            rootfs.join("lib/modules/6.1.0-9-cloud-amd64")
        );
        assert_eq!(kernel.initrd, None);

        let host = open(&home, &ImageRef::host()).unwrap();
        assert!(!host.guest_sudo && !host.owned_by_host_root && host.kernel.is_none());

        let gone = ImageRef::built("debian", "3".repeat(64));
        let err = open(&home, &gone).unwrap_err();
        assert!(err.message.contains("dynocap image build debian"), "{err}");
    }

    #[test]
    fn concurrent_first_starts_build_the_skeleton_once() {
        let dir = tempfile::tempdir().unwrap();
        let roots: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| host_image(dir.path())))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap().root)
                .collect()
        });
        assert!(roots.windows(2).all(|w| w[0] == w[1]));
        let leftovers: Vec<_> = fs::read_dir(dir.path().join("host"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("rootfs.new"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
