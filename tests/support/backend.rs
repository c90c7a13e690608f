//! Which backend a test's sandboxes run on. The end-to-end tests are written once and run on
//! each backend through [`TestHome::on`]: a `jail` home is a plain [`TestHome`]; a `vm` home
//! boots every sandbox as a QEMU guest of the built `debian` image (the image tests' shared
//! build, see [`crate::images`]), under TCG unless `DYNOCAP_VM_ACCEL` says otherwise, with the
//! static agent.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::small_fs::SmallFs;
use crate::{bin_dir, images, require_root, TestHome};

/// A backend the tests run on (`DYNOCAP_BACKEND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Jail,
    Vm,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Jail => "jail",
            Backend::Vm => "vm",
        }
    }
}

impl TestHome {
    /// A home whose sandboxes run on `backend`, or `None` (after saying why) where this
    /// machine cannot run it; in CI a missing requirement is a failure instead.
    pub fn on(backend: Backend, test: &str) -> Option<TestHome> {
        if !require_root(test) {
            return None;
        }
        match backend {
            Backend::Jail => Some(TestHome::new()),
            Backend::Vm => vm_home(test),
        }
    }
}

/// Whether QEMU is installed; says why `test` is skipped when not (and fails it in CI,
/// which installs QEMU).
pub fn require_qemu(test: &str) -> bool {
    let have_qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_qemu {
        let why = "qemu-system-x86_64 is not installed (scripts/install-deps.sh installs it)";
        assert!(std::env::var_os("CI").is_none(), "{test}: {why}");
        eprintln!("SKIPPED {test}: {why}");
    }
    have_qemu
}

fn vm_home(test: &str) -> Option<TestHome> {
    vm_home_from(test, images::cached_home())
}

/// A vm home as [`TestHome::on`] makes one, at `path` (on a filesystem of the test's own,
/// say: the debian image is copied there, the vm cache stays shared). `None` (the test is
/// skipped) where [`TestHome::on`] skips.
pub fn vm_home_at(test: &str, path: PathBuf) -> Option<TestHome> {
    if !require_root(test) {
        return None;
    }
    let home = TestHome::at(path).with_env(
        "DYNOCAP_IMAGE_CACHE",
        &images::cache_dir().to_string_lossy(),
    );
    vm_home_from(test, home)
}

/// A vm home on a small ext4 of `megabytes` of its own ([`SmallFs`]), for a test of what
/// DynoCap sets aside on the host, without package caches (their room would stand beside the
/// disks it measures). `None` (the test skips, saying why) as [`vm_home_at`]. Bind it as
/// `let (fs, home) = …`: the home goes first, then its filesystem.
pub fn vm_home_on_small_fs(test: &str, megabytes: u64) -> Option<(SmallFs, TestHome)> {
    if !require_root(test) {
        return None;
    }
    let fs = SmallFs::new(megabytes);
    let home = vm_home_at(test, fs.mount.join("home"))?.with_env("DYNOCAP_CACHES", "0");
    Some((fs, home))
}

fn vm_home_from(test: &str, home: TestHome) -> Option<TestHome> {
    if !require_qemu(test) {
        return None;
    }
    if !images::require_mmdebstrap(test) {
        return None;
    }
    // A VM's agent is its PID 1 on a kernel with no libc around it: the static build.
    let agent = std::env::var_os("DYNOCAP_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| bin_dir().join("../x86_64-unknown-linux-musl/debug/dynocap-agent"));
    assert!(
        agent.is_file(),
        "{test}: the static agent {} is missing: `cargo build --target x86_64-unknown-linux-musl -p dynocap-agent` and set DYNOCAP_AGENT to it",
        agent.display()
    );
    let accel = std::env::var("DYNOCAP_VM_ACCEL").unwrap_or_else(|_| "tcg".to_owned());
    home.json(&["image", "build", "debian"]);
    let home = home
        .with_env("DYNOCAP_BACKEND", Backend::Vm.name())
        .with_env("DYNOCAP_VM_ACCEL", &accel)
        .with_env("DYNOCAP_IMAGE", "debian")
        .with_env("DYNOCAP_AGENT", &agent.to_string_lossy());
    // The base disk made from the image (hundreds of MB, seconds to write) and the initramfs
    // are keyed by content and never replaced once made: every home shares one cache, the
    // one tests/vm.rs uses, instead of making its own.
    let shared = images::cache_dir().join("vm-cache/vm");
    std::fs::create_dir_all(&shared).expect("create the shared vm cache");
    let cache = home.path().join("cache");
    std::fs::create_dir_all(&cache).expect("create the home's cache");
    std::os::unix::fs::symlink(&shared, cache.join("vm")).expect("link the shared vm cache");
    Some(home)
}
