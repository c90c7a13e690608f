//! DynoCap's customisation of a fresh rootfs, and what `image.json` says about the result.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::recipe::Recipe;
use super::sandbox_user::{SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID};
use super::store::{tree_size, ImageMeta};
use crate::foundation::error::{Context, Result};

/// DynoCap's changes to the fresh rootfs: no trace of the build host (hostname, resolver),
/// the sandbox user, the agent's mountpoint, `sudo` as the agent's broker client, and apt
/// sources over HTTPS (the only thing the `filtered` network's proxy carries).
pub(crate) fn customise(rootfs: &Path, recipe: &Recipe) -> Result<()> {
    let write = |rel: &str, content: &str, mode: u32| -> Result<()> {
        let path = rootfs.join(rel);
        // A symlink left by a package (resolv.conf often is one) is replaced, never followed.
        let _ = fs::remove_file(&path);
        fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", path.display()))
    };
    let append = |rel: &str, line: &str| -> Result<()> {
        let path = rootfs.join(rel);
        let mut text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let user = line.split(':').next().unwrap_or_default();
        if text.lines().any(|l| l.split(':').next() == Some(user)) {
            return Ok(());
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(line);
        text.push('\n');
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
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
        .with_context(|| format!("creating {}", sudo.display()))?;
    Ok(())
}

/// The metadata of a customised rootfs.
pub(crate) fn describe(rootfs: &Path, recipe: &Recipe, id: &str) -> ImageMeta {
    ImageMeta {
        name: recipe.name.clone(),
        id: id.to_owned(),
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        size_bytes: tree_size(rootfs),
        suite: recipe.suite.clone(),
        packages: recipe.packages.clone(),
        kernel: kernel_release(rootfs),
        guest_sudo: true,
        source: None,
        config: None,
        layers: Vec::new(),
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
        let recipe = Recipe::for_name("debian", "mmdebstrap 1.3.5", None).expect("recipe");

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
}
