//! apt's downloads kept in the project's package cache. A task's sandbox has the project's apt
//! cache bound on `/var/cache/apt/archives`, but two things of the image would leave it empty:
//! the `apt` command deletes what it downloaded once installed (Debian's default for it,
//! `Binary::apt::APT::Keep-Downloaded-Packages`), and registries' Debian and Ubuntu images
//! carry a `docker-clean` hook that removes `/var/cache/apt/archives/*.deb` after every
//! dpkg run. So while the cache is bound, the agent (guest root) tells apt, in a file of the
//! guest's own configuration, to keep its downloads, in a directory of the cache that the
//! hook's pattern does not reach; without the cache the file is removed, so an image built in
//! one sandbox never carries it to another.

use std::collections::HashSet;
use std::path::Path;

/// Where the project's apt cache is bound.
const ARCHIVES: &str = "/var/cache/apt/archives";
/// apt's archive directory while the cache is bound: inside it, out of `docker-clean`'s
/// `/var/cache/apt/archives/*.deb`.
const KEPT: &str = "/var/cache/apt/archives/dynocap";
const CONF_DIR: &str = "/etc/apt/apt.conf.d";
/// Read after the image's own files (apt reads them in name order, the last setting wins).
const CONF_FILE: &str = "/etc/apt/apt.conf.d/zz-dynocap-package-cache";

/// Points apt's downloads at the project's cache when `mounted` (this namespace's mount
/// points, [`crate::init::mounted_targets`]) shows it bound, or removes that setting when it
/// is not. Returns what was changed or could not be, for the agent's log; an image without
/// apt changes nothing.
pub fn keep_downloads(mounted: &HashSet<String>) -> Vec<String> {
    let mut said = Vec::new();
    if !Path::new(CONF_DIR).is_dir() {
        return said;
    }
    if !mounted.contains(ARCHIVES) {
        if let Err(err) = crate::fsutil::remove_if_regular(Path::new(CONF_FILE)) {
            said.push(format!("apt: cannot remove {CONF_FILE}: {err}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_keeps_downloads_out_of_the_hooks_pattern() {
        let conf = conf();
        assert!(conf.contains("Dir::Cache::Archives \"/var/cache/apt/archives/dynocap/\";"));
        assert!(conf.contains("Binary::apt::APT::Keep-Downloaded-Packages \"true\";"));
        // docker-clean's pattern: the kept directory is below it, not matched by it.
        assert!(KEPT.starts_with(ARCHIVES) && !KEPT.ends_with(".deb"));
    }
}
