//! Built images for the tests: one Debian image per machine, shared by every test home.
//!
//! A build downloads ~150 MB and takes minutes, so tests point `DYNOCAP_IMAGE_CACHE` at one
//! directory that outlives the run ([`cache_dir`]). The first `dynocap image build debian`
//! of a run builds into it (or finds it there from an earlier run: the cache is keyed by the
//! recipe's content id, so a changed recipe never reuses a stale image); every other home
//! copies the image from it with hard links, in seconds.
//!
//! Also what a home's image store holds, for tests that check what a failed build, import
//! or pull left behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::TestHome;

/// The shared cache: `DYNOCAP_TEST_IMAGE_CACHE`, else `/var/cache/dynocap-test-images`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("DYNOCAP_TEST_IMAGE_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || PathBuf::from("/var/cache/dynocap-test-images"),
            PathBuf::from,
        )
}

/// Whether image tests can run: mmdebstrap installed. A missing one skips the test outside
/// CI and fails it in CI (scripts/install-deps.sh installs it).
pub fn require_mmdebstrap(test: &str) -> bool {
    let found = std::process::Command::new("mmdebstrap")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if found {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs mmdebstrap (apt-get install mmdebstrap), and CI must have it");
    }
    eprintln!("SKIPPED {test}: needs mmdebstrap (apt-get install mmdebstrap)");
    false
}

/// A test home using the shared cache.
pub fn cached_home() -> TestHome {
    TestHome::new().with_env("DYNOCAP_IMAGE_CACHE", &cache_dir().to_string_lossy())
}

/// A home with the debian image built (from the shared cache when it has it); returns the
/// home and the build's JSON (`{image, origin}`).
pub fn debian_home() -> (TestHome, Value) {
    let home = cached_home();
    let built = home.json(&["image", "build", "debian"]);
    (home, built)
}

/// A flat apt repository at `repo` holding one small package, `package` 1.0, whose command
/// `/usr/bin/<package>` prints `says`: built with dpkg-deb and dpkg-scanpackages (its files
/// staged in `work`), unsigned (the guest's source line says `trusted=yes`), with a Release
/// file listing the index's hash.
pub fn flat_apt_repository(repo: &Path, work: &Path, package: &str, says: &str) {
    let pkg = work.join("pkg");
    crate::write(
        &pkg.join("DEBIAN/control"),
        &format!(
            "Package: {package}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.com>\n\
             Description: a test package\n"
        ),
    );
    let command = pkg.join("usr/bin").join(package);
    crate::write(&command, &format!("#!/bin/sh\necho {says}\n"));
    crate::chmod(&command, 0o755);
    std::fs::create_dir_all(repo).expect("mkdir the repository");
    let run = |cmd: &mut Command| {
        let out = cmd.output().expect("spawn");
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&pkg)
        .arg(repo.join(format!("{package}_1.0_all.deb"))));
    let packages = run(Command::new("dpkg-scanpackages")
        .args(["--multiversion", "."])
        .current_dir(repo));
    std::fs::write(repo.join("Packages"), &packages).expect("write Packages");
    let sum =
        String::from_utf8(run(Command::new("sha256sum").arg(repo.join("Packages")))).expect("utf8");
    let hash = sum.split_whitespace().next().expect("hash");
    let date = String::from_utf8(run(Command::new("date").args(["-Ru"]))).expect("utf8");
    std::fs::write(
        repo.join("Release"),
        format!(
            "Origin: dynocap-test\nLabel: dynocap-test\nDate: {}\nSHA256:\n {hash} {} Packages\n",
            date.trim(),
            packages.len()
        ),
    )
    .expect("write Release");
}

/// Entries of `images/<name>/` in `home` other than the build lock: images or leftovers.
pub fn store_entries(home: &TestHome, name: &str) -> Vec<String> {
    std::fs::read_dir(home.path().join("images").join(name))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != ".build.lock")
                .collect()
        })
        .unwrap_or_default()
}

/// What unpacking and downloading left in `home`'s shared store: layers being unpacked
/// (`layers/.tmp-*`) and blobs being downloaded (`blobs/.partial-*`). Empty once a pull or
/// import has ended, however it ended.
pub fn store_leftovers(home: &TestHome) -> Vec<String> {
    let store = home.path().join("images/.store");
    let mut found = Vec::new();
    for (dir, prefix) in [("layers", ".tmp-"), ("blobs", ".partial-")] {
        if let Ok(entries) = std::fs::read_dir(store.join(dir)) {
            found.extend(
                entries
                    .flatten()
                    .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
                    .filter(|n| n.starts_with(&format!("{dir}/{prefix}"))),
            );
        }
    }
    found
}

/// The disk space the files under `path` take (their allocated blocks, so a sparse file
/// counts what it holds, not its length); symlinks are not followed.
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        if let Ok(entries) = std::fs::read_dir(path) {
            total += entries
                .flatten()
                .map(|e| allocated_bytes(&e.path()))
                .sum::<u64>();
        }
    }
    total
}
