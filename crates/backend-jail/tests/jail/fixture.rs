//! Host-side test helpers: a tiny image (mountpoint dirs, merged-/usr symlinks, /etc files)
//! in a private temp dir, a default spec binding the host's /usr, and [`Guest`], which talks
//! to the test agent over the jail's channel.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dynocap_backend_jail::{GuestDir, Jail, JailSpec, Limits, RoBind};

/// A temp dir holding `image/` and `state/`.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub image: PathBuf,
    pub state: PathBuf,
}

fn mkdir(path: &Path, mode: u32) {
    std::fs::create_dir_all(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

impl Fixture {
    /// Builds the image. The temp dir is 0700 root: the jail must cope with a state dir the
    /// guest's (unprivileged) root cannot reach by path.
    pub fn new() -> Fixture {
        let tmp = tempfile::Builder::new()
            .prefix("dynocap-jail-test-")
            .tempdir()
            .expect("tempdir");
        let image = tmp.path().join("image");
        for dir in ["usr", "proc", "dev", "tmp", "etc", "home", "var/tmp"] {
            mkdir(&image.join(dir), 0o755);
        }
        mkdir(&image.join("root"), 0o700);
        for (link, target) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            symlink(target, image.join(link)).expect("symlink");
        }
        std::fs::write(
            image.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/sh\n",
        )
        .expect("passwd");
        std::fs::write(
            image.join("etc/group"),
            "root:x:0:\ntty:x:5:\nsandbox:x:1000:\n",
        )
        .expect("group");
        std::fs::write(image.join("etc/motd"), "image file\n").expect("motd");
        std::fs::write(image.join("etc/ld.so.cache"), b"").expect("ld.so.cache mountpoint");
        let state = tmp.path().join("state");
        mkdir(&state, 0o700);
        Fixture { tmp, image, state }
    }

    /// A fixture made by another process (paths passed in the environment).
    pub fn at(image: PathBuf, state: PathBuf) -> Fixture {
        Fixture {
            tmp: tempfile::tempdir().expect("tempdir"),
            image,
            state,
        }
    }

    /// A spec running this test binary as the agent.
    pub fn spec(&self, name: &str) -> JailSpec {
        JailSpec {
            name: name.to_owned(),
            hostname: name.to_owned(),
            image_root: self.image.clone(),
            ro_binds: vec![
                RoBind {
                    source: "/usr".into(),
                    target: "/usr".into(),
                },
                RoBind {
                    source: "/etc/ld.so.cache".into(),
                    target: "/etc/ld.so.cache".into(),
                },
            ],
            rw_binds: vec![],
            cache: None,
            state_dir: self.state.clone(),
            guest_dirs: vec![
                // The image's /root belongs to host root, which is nobody in the guest: give
                // the guest's root its home.
                GuestDir {
                    path: "/root".into(),
                    uid: 0,
                    gid: 0,
                    mode: 0o700,
                },
                GuestDir {
                    path: "/home/sandbox".into(),
                    uid: 1000,
                    gid: 1000,
                    mode: 0o755,
                },
                GuestDir {
                    path: "/workspace".into(),
                    uid: 1000,
                    gid: 1000,
                    mode: 0o755,
                },
            ],
            agent_binary: std::env::current_exe().expect("current_exe"),
            agent_args: vec![],
            limits: Limits {
                cpu_millis: 1000,
                memory_bytes: 512 << 20,
                pids: 256,
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
}

/// A spawned jail plus a client for the test agent.
pub struct Guest {
    pub jail: Option<Jail>,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Guest {
    pub fn spawn(spec: &JailSpec) -> Guest {
        let mut jail = Jail::spawn(spec).unwrap_or_else(|e| panic!("spawn {}: {e}", spec.name));
        let stream = UnixStream::from(jail.take_channel().expect("channel"));
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        let writer = stream.try_clone().expect("clone");
        Guest {
            jail: Some(jail),
            reader: BufReader::new(stream),
            writer,
        }
    }

    pub fn jail(&self) -> &Jail {
        self.jail.as_ref().expect("jail")
    }

    /// Sends a command, returns the agent's reply.
    pub fn call(&mut self, command: &str) -> String {
        self.writer
            .write_all(format!("{command}\n").as_bytes())
            .expect("send");
        let mut len = String::new();
        self.reader.read_line(&mut len).expect("reply length");
        let len: usize = len
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("bad reply header {len:?} for {command}"));
        let mut body = vec![0u8; len];
        self.reader.read_exact(&mut body).expect("reply body");
        String::from_utf8_lossy(&body).into_owned()
    }

    /// `facts` as a map.
    pub fn facts(&mut self) -> BTreeMap<String, String> {
        self.call("facts")
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// Runs a shell command; returns (status line, output).
    pub fn sh(&mut self, command: &str) -> (String, String) {
        split_status(&self.call(&format!("sh {command}")))
    }

    /// Runs a probe; returns (status, result value).
    pub fn probe(&mut self, probe: &str) -> (String, String) {
        let (status, out) = split_status(&self.call(&format!("probe {probe}")));
        let result = out
            .lines()
            .find_map(|l| l.strip_prefix("result="))
            .unwrap_or_default()
            .to_owned();
        (status, result)
    }

    pub fn destroy(mut self) {
        let jail = self.jail.take().expect("jail");
        jail.destroy().expect("destroy");
    }
}

fn split_status(reply: &str) -> (String, String) {
    let (first, rest) = reply.split_once('\n').unwrap_or((reply, ""));
    (
        first.trim_start_matches("status=").to_owned(),
        rest.to_owned(),
    )
}

/// Asserts the shell command succeeded and returns its output.
pub fn sh_ok(guest: &mut Guest, command: &str) -> String {
    let (status, out) = guest.sh(command);
    assert_eq!(status, "exit=0", "`{command}` failed: {out}");
    out
}

/// The leaf among the jail's cgroups that has `file`.
pub fn cgroup_file(jail: &Jail, file: &str) -> PathBuf {
    jail.cgroup_paths()
        .into_iter()
        .map(|dir| dir.join(file))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no cgroup of the jail has {file}"))
}

pub fn read_trimmed(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// `Uid:` of a host process, if it exists.
pub fn host_uid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Host pids whose pid namespace is `ns` (as `readlink /proc/<pid>/ns/pid` prints it).
pub fn pids_in_ns(ns: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                .map(|l| l.to_string_lossy() == ns)
                .unwrap_or(false)
        })
        .collect()
}
