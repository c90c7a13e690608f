//! `dynocap image build`: a Debian rootfs made with mmdebstrap, customised for DynoCap, and
//! installed into the store by one atomic rename.
//!
//! A build happens in `images/<name>/.tmp-*` under the store's build lock. Whatever stops it
//! (a failed download, `mmdebstrap` killed, Ctrl-C, a crash of this process) leaves no image
//! behind: the temporary directory is removed on the way out, or, if this process died, by
//! the next build, which holds the same lock and so knows no other build is using it.
//! mmdebstrap runs in its own mount namespace (as root) so the /proc, /sys and /dev it mounts
//! in the chroot vanish with it, even when it is killed: removing a dead build never meets a
//! host mount.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::recipe::Recipe;
use super::store::{tree_size, BuiltImage, ImageMeta, ImageStore, META_FILE, TMP_PREFIX};
use crate::error::{Context, Error, Result};
use crate::image::{SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID};

/// The hint every "mmdebstrap is missing" error carries.
pub const MMDEBSTRAP_HINT: &str = "install it with `apt-get install mmdebstrap`";

/// How long mmdebstrap gets to clean up after SIGTERM before it is killed.
const TERM_GRACE: Duration = Duration::from_secs(20);

/// Where the built image came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This store already had it.
    Present,
    /// Copied from `DYNOCAP_IMAGE_CACHE`.
    Cache,
    /// Built now by mmdebstrap.
    Built,
}

/// A finished build.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub image: BuiltImage,
    pub origin: Origin,
}

/// `mmdebstrap --version`, or the error naming how to install it.
pub fn mmdebstrap_version() -> Result<String> {
    let output = Command::new("mmdebstrap")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => {
                Error::internal(format!("mmdebstrap is not installed; {MMDEBSTRAP_HINT}"))
            }
            _ => Error::internal(format!("running mmdebstrap --version: {err}")),
        })?;
    if !output.status.success() {
        return Err(Error::internal(format!(
            "mmdebstrap --version failed ({}); reinstall it: {MMDEBSTRAP_HINT}",
            output.status
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Builds image `name` (or finds it built), reporting progress lines to `progress`. Setting
/// `cancel` stops the build; it then leaves nothing behind and returns an error.
pub fn build(
    store: &ImageStore,
    name: &str,
    progress: &dyn Fn(&str),
    cancel: &AtomicBool,
) -> Result<Outcome> {
    let version = mmdebstrap_version()?;
    let recipe = Recipe::for_name(name, &version).ok_or_else(|| {
        Error::invalid(format!(
            "there is no recipe for an image named \"{name}\"; images that can be built: {}",
            super::recipe::BUILDABLE.join(", ")
        ))
    })?;
    let id = recipe.id();
    if let Some(image) = store.get(name, &id) {
        return Ok(Outcome {
            image,
            origin: Origin::Present,
        });
    }
    // With a shared cache, its lock is taken first (always in this order: cache, then
    // store): concurrent builds in many homes then make one mmdebstrap run, and the others
    // copy its result.
    let cache = store.cache().filter(|cache| !same_dir(cache, store.dir()));
    let cache_lock = match cache {
        Some(cache) => Some(BuildLock::take(&cache.join(name), progress)?),
        None => None,
    };
    let parent = store.dir().join(name);
    let _lock = BuildLock::take(&parent, progress)?;
    // Another build may have installed it while we waited.
    if let Some(image) = store.get(name, &id) {
        return Ok(Outcome {
            image,
            origin: Origin::Present,
        });
    }
    remove_dead_builds(&parent)?;
    let staging = Staging::new(&parent)?;

    let cached = cache
        .map(|cache| ImageStore::at(cache.to_owned(), None))
        .and_then(|cache| cache.get(name, &id));
    let origin = if let Some(cached) = cached {
        progress(&format!(
            "copying image {} from {}",
            short(&id),
            cached.dir.display()
        ));
        copy_image(&cached.dir, &staging.path)?;
        Origin::Cache
    } else {
        run_mmdebstrap(&recipe, &staging.path.join("rootfs"), progress, cancel)?;
        progress("customising the rootfs for DynoCap");
        customise(&staging.path.join("rootfs"), &recipe)?;
        let meta = describe(&staging.path.join("rootfs"), &recipe, &id);
        let json = serde_json::to_string_pretty(&meta).expect("image metadata always serialises");
        fs::write(staging.path.join(META_FILE), json + "\n").context(format_args!(
            "writing {}",
            staging.path.join(META_FILE).display()
        ))?;
        Origin::Built
    };
    if cancel.load(Ordering::SeqCst) {
        return Err(Error::internal(
            "the image build was interrupted; nothing was installed",
        ));
    }
    let target = store.image_dir(name, &id);
    staging.install(&target)?;
    let image = store.get(name, &id).ok_or_else(|| {
        Error::internal(format!(
            "the image installed at {} cannot be read back",
            target.display()
        ))
    })?;
    if let (Origin::Built, Some(cache), Some(_)) = (origin, cache, &cache_lock) {
        if let Err(err) = publish(cache, &image) {
            progress(&format!(
                "warning: not shared into {}: {err}",
                cache.display()
            ));
        }
    }
    Ok(Outcome { image, origin })
}

/// Whether two paths name one directory (a cache set to the store itself is no cache: its
/// lock would be taken twice).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Copies a built image into the shared cache. Callers hold the cache's build lock.
fn publish(cache: &Path, image: &BuiltImage) -> Result<()> {
    let cache_store = ImageStore::at(cache.to_owned(), None);
    if cache_store.get(image.name(), image.id()).is_some() {
        return Ok(());
    }
    let parent = cache.join(image.name());
    remove_dead_builds(&parent)?;
    let staging = Staging::new(&parent)?;
    copy_image(&image.dir, &staging.path)?;
    staging.install(&cache_store.image_dir(image.name(), image.id()))
}

/// The first 12 characters of an id, as `image ls` shows it.
pub fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// The store's one-build-at-a-time lock (`images/<name>/.build.lock`, flock).
struct BuildLock {
    _lock: nix::fcntl::Flock<fs::File>,
}

impl BuildLock {
    fn take(parent: &Path, progress: &dyn Fn(&str)) -> Result<BuildLock> {
        fs::create_dir_all(parent).context(format_args!("creating {}", parent.display()))?;
        let path = parent.join(".build.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .context(format_args!("opening {}", path.display()))?;
        let file = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        {
            Ok(lock) => return Ok(BuildLock { _lock: lock }),
            Err((file, nix::errno::Errno::EWOULDBLOCK)) => file,
            Err((_, err)) => {
                return Err(Error::internal(format!(
                    "locking {}: {err}",
                    path.display()
                )))
            }
        };
        progress("waiting for another build of this image to finish");
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, err)| Error::internal(format!("locking {}: {err}", path.display())))?;
        Ok(BuildLock { _lock: lock })
    }
}

/// A build directory that removes itself unless installed.
struct Staging {
    path: PathBuf,
    installed: bool,
}

impl Staging {
    fn new(parent: &Path) -> Result<Staging> {
        let path = parent.join(format!(
            "{TMP_PREFIX}{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        fs::create_dir(&path).context(format_args!("creating {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .context(format_args!("setting the mode of {}", path.display()))?;
        Ok(Staging {
            path,
            installed: false,
        })
    }

    /// Renames the build into place: the image appears whole or not at all.
    fn install(mut self, target: &Path) -> Result<()> {
        fs::rename(&self.path, target).context(format_args!(
            "installing the image {} at {}",
            self.path.display(),
            target.display()
        ))?;
        self.installed = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.installed {
            if let Err(err) = remove_build_dir(&self.path) {
                tracing::warn!("{err}");
            }
        }
    }
}

/// Removes the `.tmp-*` directories of builds that died. Callers hold the build lock, so no
/// live build owns any of them.
fn remove_dead_builds(parent: &Path) -> Result<()> {
    let entries = fs::read_dir(parent).context(format_args!("reading {}", parent.display()))?;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            remove_build_dir(&entry.path())?;
        }
    }
    Ok(())
}

/// Removes a build (or removed image) directory. No mount can be inside it: mmdebstrap's
/// mounts live in its own mount namespace (see the module doc).
pub(crate) fn remove_build_dir(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(Error::internal(format!(
            "removing {}: {err}; remove it by hand",
            path.display()
        ))),
    }
}

/// Copies an image directory (rootfs and metadata), hard-linking files where the two stores
/// share a filesystem: the files are never written, so sharing their inodes is safe.
fn copy_image(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from.join(META_FILE), to.join(META_FILE))
        .context(format_args!("copying {}", from.join(META_FILE).display()))?;
    let source = from.join("rootfs");
    let target = to.join("rootfs");
    let copy = |link: bool| {
        let mut cmd = Command::new("cp");
        cmd.arg(if link { "-al" } else { "-a" })
            .arg("--")
            .arg(&source)
            .arg(&target)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.output()
    };
    let linked = copy(true).context("running cp")?;
    if linked.status.success() {
        return Ok(());
    }
    // Another filesystem: hard links are impossible, copy the bytes.
    remove_build_dir(&target)?;
    let copied = copy(false).context("running cp")?;
    if copied.status.success() {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "copying {} to {}: {}",
            source.display(),
            target.display(),
            String::from_utf8_lossy(&copied.stderr).trim()
        )))
    }
}

/// Runs mmdebstrap into `rootfs`, forwarding its `I:` lines as progress.
fn run_mmdebstrap(
    recipe: &Recipe,
    rootfs: &Path,
    progress: &dyn Fn(&str),
    cancel: &AtomicBool,
) -> Result<()> {
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg(format!("--variant={}", recipe.variant))
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg("--format=directory")
        .arg("--verbose")
        .arg(&recipe.suite)
        .arg(rootfs)
        .arg(&recipe.mirror)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C reaches us, and we stop it (it cleans up first).
        .process_group(0);
    let root = nix::unistd::geteuid().is_root();
    if root {
        cmd.arg("--mode=root");
    }
    // SAFETY: the closure only makes raw syscalls (prctl, unshare, mount), which are
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // If this process dies (SIGKILL), mmdebstrap goes too: no orphan keeps writing
            // into a build directory the next build will remove. (The calling thread waits
            // for mmdebstrap throughout, so its exit is this process's.)
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            if root {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
                nix::mount::mount(
                    None::<&str>,
                    "/",
                    None::<&str>,
                    nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                    None::<&str>,
                )?;
            }
            Ok(())
        });
    }
    progress(&format!(
        "running mmdebstrap ({} {}, from {})",
        recipe.suite, recipe.variant, recipe.mirror
    ));
    let mut child = cmd.spawn().map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => {
            Error::internal(format!("mmdebstrap is not installed; {MMDEBSTRAP_HINT}"))
        }
        _ => Error::internal(format!("starting mmdebstrap: {err}")),
    })?;
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let mut readers = Vec::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = lines_tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        }));
    }
    drop(lines_tx);

    // The last lines, for the error of a failed build.
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut stopping_since: Option<std::time::Instant> = None;
    let status = loop {
        match lines_rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(stage) = line.strip_prefix("I: ") {
                    progress(stage);
                }
                if tail.len() == 12 {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if cancel.load(Ordering::SeqCst) {
            let group =
                nix::unistd::Pid::from_raw(-(i32::try_from(child.id()).unwrap_or(i32::MAX)));
            match stopping_since {
                None => {
                    progress("interrupted: stopping mmdebstrap");
                    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
                    stopping_since = Some(std::time::Instant::now());
                }
                Some(since) if since.elapsed() > TERM_GRACE => {
                    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
                }
                Some(_) => {}
            }
        }
        if let Some(status) = child.try_wait().context("waiting for mmdebstrap")? {
            break status;
        }
    };
    for reader in readers {
        let _ = reader.join();
    }
    if cancel.load(Ordering::SeqCst) {
        return Err(Error::internal(
            "the image build was interrupted; nothing was installed",
        ));
    }
    if !status.success() {
        let lines: Vec<_> = tail.into_iter().collect();
        return Err(Error::internal(format!(
            "mmdebstrap failed ({status}); nothing was installed. Its last lines:\n{}",
            lines.join("\n")
        )));
    }
    Ok(())
}

/// DynoCap's changes to the fresh rootfs: no trace of the build host (hostname, resolver),
/// the sandbox user, the agent's mountpoint, `sudo` as the agent's broker client, and apt
/// sources over HTTPS (the only thing the `filtered` network's proxy carries).
fn customise(rootfs: &Path, recipe: &Recipe) -> Result<()> {
    let write = |rel: &str, content: &str, mode: u32| -> Result<()> {
        let path = rootfs.join(rel);
        // A symlink left by a package (resolv.conf often is one) is replaced, never followed.
        let _ = fs::remove_file(&path);
        fs::write(&path, content).context(format_args!("writing {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .context(format_args!("setting the mode of {}", path.display()))
    };
    let append = |rel: &str, line: &str| -> Result<()> {
        let path = rootfs.join(rel);
        let mut text =
            fs::read_to_string(&path).context(format_args!("reading {}", path.display()))?;
        let user = line.split(':').next().unwrap_or_default();
        if text.lines().any(|l| l.split(':').next() == Some(user)) {
            return Ok(());
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(line);
        text.push('\n');
        fs::write(&path, text).context(format_args!("writing {}", path.display()))
    };
    write("etc/hostname", "dynocap\n", 0o644)?;
    write(
        "etc/hosts",
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        0o644,
    )?;
    write(
        "etc/resolv.conf",
        "# DynoCap: no DNS inside the sandbox unless its network mode provides it\n",
        0o644,
    )?;
    let mut sources = format!(
        "deb {mirror} {suite} main\ndeb {mirror} {suite}-updates main\n",
        mirror = recipe.guest_mirror,
        suite = recipe.suite
    );
    if recipe.guest_mirror == "https://deb.debian.org/debian" {
        sources.push_str(&format!(
            "deb https://deb.debian.org/debian-security {}-security main\n",
            recipe.suite
        ));
    }
    write("etc/apt/sources.list", &sources, 0o644)?;
    append(
        "etc/passwd",
        &format!(
            "sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:DynoCap sandbox user:{SANDBOX_HOME}:/bin/bash"
        ),
    )?;
    append("etc/group", &format!("sandbox:x:{SANDBOX_GID}:"))?;
    append("etc/shadow", "sandbox:!:20000:0:99999:7:::")?;
    append("etc/gshadow", "sandbox:!::")?;
    fs::create_dir_all(rootfs.join(".dynocap")).context("creating /.dynocap in the rootfs")?;
    write(".dynocap/agent", "", 0o755)?;
    // `sudo` is the agent itself under another name: it asks the agent (guest PID 1, the
    // guest's root) to run the command. Only images that opt in have this link.
    let sudo = rootfs.join("usr/local/bin/sudo");
    let _ = fs::remove_file(&sudo);
    std::os::unix::fs::symlink("/.dynocap/agent", &sudo)
        .context(format_args!("creating {}", sudo.display()))?;
    Ok(())
}

/// The metadata of a customised rootfs.
fn describe(rootfs: &Path, recipe: &Recipe, id: &str) -> ImageMeta {
    ImageMeta {
        name: recipe.name.clone(),
        id: id.to_owned(),
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        size_bytes: tree_size(rootfs),
        suite: recipe.suite.clone(),
        packages: recipe.packages.clone(),
        kernel: kernel_release(rootfs),
        guest_sudo: true,
    }
}

/// The release of the newest `/boot/vmlinuz-*` in a rootfs.
pub(crate) fn kernel_release(rootfs: &Path) -> Option<String> {
    let mut releases: Vec<String> = fs::read_dir(rootfs.join("boot"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("vmlinuz-"))
                .map(str::to_owned)
        })
        .collect();
    releases.sort_by_key(|r| natural_key(r));
    releases.pop()
}

/// Sort key comparing digit runs as numbers (`6.1.0-10` after `6.1.0-9`).
fn natural_key(text: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            key.push((rest[..digits].parse().unwrap_or(u64::MAX), String::new()));
            rest = &rest[digits..];
        } else {
            let other = rest.bytes().take_while(|b| !b.is_ascii_digit()).count();
            key.push((0, rest[..other].to_owned()));
            rest = &rest[other..];
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn customising_removes_host_traces_and_adds_the_sandbox_user() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        for dir in ["etc/apt", "usr/local/bin", "boot"] {
            fs::create_dir_all(root.join(dir)).expect("mkdir");
        }
        fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n").expect("write");
        fs::write(root.join("etc/group"), "root:x:0:\n").expect("write");
        fs::write(root.join("etc/shadow"), "root:*:1::::::\n").expect("write");
        fs::write(root.join("etc/gshadow"), "root:*::\n").expect("write");
        fs::write(root.join("etc/hostname"), "buildhost\n").expect("write");
        std::os::unix::fs::symlink(
            "/run/systemd/resolve/stub-resolv.conf",
            root.join("etc/resolv.conf"),
        )
        .expect("symlink");
        fs::write(root.join("boot/vmlinuz-6.1.0-9-cloud-amd64"), "").expect("write");
        fs::write(root.join("boot/vmlinuz-6.1.0-10-cloud-amd64"), "").expect("write");
        let recipe = Recipe::for_name("debian", "mmdebstrap 1.3.5").expect("recipe");

        customise(root, &recipe).expect("customise");
        customise(root, &recipe).expect("customising twice changes nothing more");

        let read = |rel: &str| fs::read_to_string(root.join(rel)).expect("read");
        assert_eq!(read("etc/hostname"), "dynocap\n");
        assert!(!read("etc/resolv.conf").contains("nameserver"));
        assert!(!fs::symlink_metadata(root.join("etc/resolv.conf"))
            .expect("stat")
            .is_symlink());
        assert_eq!(read("etc/passwd").matches("sandbox:x:1000:1000").count(), 1);
        assert_eq!(read("etc/shadow").matches("sandbox:!").count(), 1);
        assert!(read("etc/apt/sources.list")
            .lines()
            .all(|l| l.starts_with("deb https://")));
        assert_eq!(
            fs::read_link(root.join("usr/local/bin/sudo")).expect("link"),
            Path::new("/.dynocap/agent")
        );
        assert_eq!(
            kernel_release(root).as_deref(),
            Some("6.1.0-10-cloud-amd64")
        );
    }

    #[test]
    fn dead_builds_are_removed_and_installed_images_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let id = "d".repeat(64);
        fs::create_dir_all(tmp.path().join(".tmp-1-abc/rootfs/etc")).expect("mkdir");
        fs::create_dir_all(tmp.path().join(&id).join("rootfs")).expect("mkdir");
        remove_dead_builds(tmp.path()).expect("clean");
        assert!(!tmp.path().join(".tmp-1-abc").exists());
        assert!(tmp.path().join(&id).exists());
    }

    #[test]
    fn a_cache_that_is_the_store_itself_is_recognised() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = tmp.path().join("images");
        fs::create_dir_all(&store).expect("mkdir");
        std::os::unix::fs::symlink(&store, tmp.path().join("alias")).expect("symlink");
        assert!(same_dir(&store, &tmp.path().join("alias")));
        assert!(same_dir(&store, &tmp.path().join("images/../images")));
        assert!(!same_dir(&store, tmp.path()));
    }

    #[test]
    fn an_unfinished_staging_dir_removes_itself() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = {
            let staging = Staging::new(tmp.path()).expect("staging");
            fs::create_dir_all(staging.path.join("rootfs/usr")).expect("mkdir");
            staging.path.clone()
        };
        assert!(!path.exists());
        let staging = Staging::new(tmp.path()).expect("staging");
        let target = tmp.path().join("e".repeat(64));
        staging.install(&target).expect("install");
        assert!(target.is_dir());
    }
}
