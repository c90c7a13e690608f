//! A small ext4 filesystem, loop-mounted for a test's `DYNOCAP_HOME` and unmounted on drop:
//! the only writer on it is the test's home, so its free space is what DynoCap set aside,
//! and it fills in seconds.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::TestHome;

pub struct SmallFs {
    pub mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    pub fn new(megabytes: u64) -> SmallFs {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("home.ext4");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).expect("mountpoint");
        let image_arg = image.to_str().expect("utf-8 path");
        run_ok("truncate", &["-s", &format!("{megabytes}M"), image_arg]);
        run_ok("mkfs.ext4", &["-q", "-F", "-m", "0", image_arg]);
        run_ok(
            "mount",
            &["-o", "loop", image_arg, mount.to_str().expect("utf-8")],
        );
        SmallFs { mount, _dir: dir }
    }

    /// A home on it, with `env` set.
    pub fn home(&self, env: &[(&str, &str)]) -> TestHome {
        env.iter().fold(
            TestHome::at(self.mount.join("home")),
            |home, (key, value)| home.with_env(key, value),
        )
    }

    /// MB free to an unprivileged writer, as `df` says.
    pub fn free_mb(&self) -> u64 {
        free_mb(&self.mount)
    }

    /// Fills every block left, from the host: large writes, then small ones, then files,
    /// until each finds no room. The files it wrote.
    pub fn fill(&self) -> Vec<PathBuf> {
        let mut ballast = Vec::new();
        for (n, bs) in ["1M", "4k"].into_iter().enumerate() {
            let path = self.mount.join(format!("ballast-{n}"));
            let _ = Command::new("dd")
                .args([
                    "if=/dev/zero",
                    &format!("of={}", path.display()),
                    &format!("bs={bs}"),
                ])
                .stderr(std::process::Stdio::null())
                .status();
            ballast.push(path);
        }
        for n in 0..10_000 {
            let path = self.mount.join(format!("ballast-file-{n}"));
            if std::fs::write(&path, b"x").is_err() {
                break;
            }
            ballast.push(path);
        }
        assert_eq!(self.free_mb(), 0, "the home's filesystem is full");
        ballast
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// MB free to an unprivileged writer on the filesystem holding `dir`, as `df` says.
pub fn free_mb(dir: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1M"])
        .arg(dir)
        .output()
        .expect("df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df prints the free MB")
}

/// Runs a setup command, which must succeed.
pub fn run_ok(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .expect("spawn a setup command");
    assert!(status.success(), "{program} {args:?}");
}
