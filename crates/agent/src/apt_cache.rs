//! apt's downloads kept in the project's package cache. A task's sandbox has the project's apt
//! cache bound on `/var/cache/apt/archives`, but two things of the image would leave it empty:
//! the `apt` command deletes what it downloaded once installed (Debian's default for it,
//! `Binary::apt::APT::Keep-Downloaded-Packages`), and registries' Debian and Ubuntu images
//! carry a `docker-clean` hook that removes `/var/cache/apt/archives/*.deb` after every
//! dpkg run. So while the cache is bound, the agent (guest root) tells apt, in a file of the
//! guest's own configuration, to keep its downloads, in a directory of the cache that the
//! hook's pattern does not reach; without the cache the file is removed, so an image built in
//! one sandbox never carries it to another.

use std::path::Path;

/// Where the project's apt cache is bound.
const ARCHIVES: &str = "/var/cache/apt/archives";
/// apt's archive directory while the cache is bound: inside it, out of `docker-clean`'s
/// `/var/cache/apt/archives/*.deb`.
const KEPT: &str = "/var/cache/apt/archives/dynocap";
const CONF_DIR: &str = "/etc/apt/apt.conf.d";
/// Read after the image's own files (apt reads them in name order, the last setting wins).
const CONF_FILE: &str = "/etc/apt/apt.conf.d/zz-dynocap-package-cache";

/// Points apt's downloads at the project's cache when `mountinfo` (this process's
/// `/proc/self/mountinfo`) shows it bound, or removes that setting when it is not. Returns
/// what was changed or could not be, for the agent's log; an image without apt changes
/// nothing.
pub fn keep_downloads(mountinfo: &str) -> Vec<String> {
    let mut said = Vec::new();
    if !Path::new(CONF_DIR).is_dir() {
        return said;
    }
    if !is_mount_point(mountinfo, ARCHIVES) {
        if std::fs::symlink_metadata(CONF_FILE).is_ok_and(|meta| meta.is_file()) {
            if let Err(err) = std::fs::remove_file(CONF_FILE) {
                said.push(format!("apt: cannot remove {CONF_FILE}: {err}"));
            }
        }
        return said;
    }
    // Root's own, as apt's archive directory is; never through a link the cache holds.
    match std::fs::symlink_metadata(KEPT) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            said.push(format!(
                "apt: {KEPT} is not a directory, so apt's downloads are not kept in the cache"
            ));
            return said;
        }
        Err(_) => {
            if let Err(err) = std::fs::create_dir(KEPT) {
                said.push(format!("apt: cannot make {KEPT}: {err}"));
                return said;
            }
        }
    }
    if let Err(err) = crate::fsutil::replace_file(Path::new(CONF_FILE), conf().as_bytes()) {
        said.push(format!("apt: cannot write {CONF_FILE}: {err}"));
    }
    said
}

fn conf() -> String {
    format!(
        "// DynoCap: {ARCHIVES} is the project's package cache, kept between its tasks;\n\
         // apt keeps what it downloads there, out of reach of images' clean-up hooks.\n\
         Dir::Cache::Archives \"{KEPT}/\";\n\
         APT::Keep-Downloaded-Packages \"true\";\n\
         Binary::apt::APT::Keep-Downloaded-Packages \"true\";\n"
    )
}

/// Whether `path` is the mount point of a line of `mountinfo` (its fifth field).
fn is_mount_point(mountinfo: &str, path: &str) -> bool {
    mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_seen_only_where_it_is_bound() {
        let bound = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                     41 22 254:16 /apt /var/cache/apt/archives rw - ext4 /dev/vdb rw\n";
        assert!(is_mount_point(bound, ARCHIVES));
        let elsewhere = "22 1 254:0 / / rw - ext4 /dev/vda rw\n\
                         41 22 254:16 /apt /var/cache/apt/archives/x rw - ext4 /dev/vdb rw\n\
                         42 22 254:16 /y /var/cache/apt rw - ext4 /dev/vdb rw\n";
        assert!(!is_mount_point(elsewhere, ARCHIVES));
    }

    #[test]
    fn the_setting_keeps_downloads_out_of_the_hooks_pattern() {
        let conf = conf();
        assert!(conf.contains("Dir::Cache::Archives \"/var/cache/apt/archives/dynocap/\";"));
        assert!(conf.contains("Binary::apt::APT::Keep-Downloaded-Packages \"true\";"));
        // docker-clean's pattern: the kept directory is below it, not matched by it.
        assert!(KEPT.starts_with(ARCHIVES) && !KEPT.ends_with(".deb"));
    }
}
