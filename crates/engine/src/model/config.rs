//! What the person running DynoCap configured: every `DYNOCAP_*` setting the engine obeys,
//! built once by the binary at its edge (from its flags and environment) and passed down. The
//! engine itself reads no environment variable for its configuration.
//!
//! A setting is kept as given (`None` when unset) and read where it is used, with the error a
//! bad value has always had, at the moment it has always had it: a mistyped
//! `DYNOCAP_BACKEND` fails the start that needs a backend, not `dynocap ls`.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::foundation::error::{Error, Result};
use crate::model::backend_choice::BackendChoice;
use crate::model::image_ref::DEFAULT_IMAGE;

/// A project package cache's size when `DYNOCAP_CACHE_MB` is unset: room for a large
/// project's downloads (a Rust workspace's registry, a Python project's wheels), held on the
/// host for as long as the cache is kept.
pub const CACHE_MB_DEFAULT: u64 = 2048;
/// The smallest cache: ext4 with its journal and a few downloads.
pub const CACHE_MB_MIN: u64 = 32;
/// The largest cache (1 TiB).
pub const CACHE_MB_MAX: u64 = 1 << 20;

/// Everything the engine is configured with. `Config::default()` is a host with no variable
/// set.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Where the state lives.
    pub home: HomeConfig,
    /// `DYNOCAP_BACKEND`: `jail`, `vm` or `auto` (unset or empty: `auto`) for new sandboxes.
    pub backend: Option<String>,
    /// `DYNOCAP_DISK_LIMIT`: `on` (unset or empty: on) or `off` (the jail writes to the
    /// host's filesystem without a limit).
    pub disk_limit: Option<String>,
    /// `DYNOCAP_VM_ACCEL`: `kvm`, `tcg` or unset, as `dynocap doctor` explains it (the vm
    /// backend's crate applies it).
    pub vm_accel: Option<String>,
    /// `DYNOCAP_EXEC_CGROUP`: `freezer`, `v2` or `pids` forces the hierarchy each command of
    /// a jail runs in; unset, the best one the host has (the jail's crate applies it).
    pub exec_cgroup: Option<String>,
    /// The images new sandboxes boot and how they are built.
    pub images: ImagesConfig,
    /// `DYNOCAP_AGENT`: the guest agent binary (unset or empty: `dynocap-agent` beside the
    /// running executable).
    pub agent: Option<PathBuf>,
    /// `DYNOCAP_BIN`: the executable run as `supervise` (unset or empty: the running one).
    pub supervisor_exe: Option<PathBuf>,
    /// `DYNOCAP_WARM_POOL`: raw sandboxes kept booted, 0 to [`POOL_MAX`] (unset: no pool).
    pub warm_pool: Option<OsString>,
    /// The host ceilings (`DYNOCAP_MAX_*`).
    pub ceilings: CeilingsConfig,
    /// What `filtered` sandboxes may reach, and how.
    pub egress: EgressConfig,
    /// `DYNOCAP_CACHES`: `0` or `off` keeps no package caches per project (unset, empty,
    /// `1` or `on`: tasks share their project's caches).
    pub caches: Option<String>,
    /// `DYNOCAP_CACHE_MB`: the size of a project's package cache, set aside on the home's
    /// filesystem when the cache is made (unset or empty: [`CACHE_MB_DEFAULT`]).
    pub cache_mb: Option<String>,
}

/// Where the state directory is: the first of these that is set and not empty.
#[derive(Debug, Clone, Default)]
pub struct HomeConfig {
    /// `DYNOCAP_HOME`.
    pub dynocap_home: Option<PathBuf>,
    /// `XDG_DATA_HOME`: the state is in its `dynocap`.
    pub xdg_data_home: Option<PathBuf>,
    /// `HOME`: the state is in its `.local/share/dynocap`. The user's own
    /// `~/.ssh/known_hosts` there also seeds a clone's.
    pub user_home: Option<PathBuf>,
    /// `DYNOCAP_JAIL_POOL_MB`: the size of the home's reflink pool (see `host::jail_pool`),
    /// none without one.
    pub jail_pool_mb: Option<String>,
}

/// The images' settings.
#[derive(Debug, Clone, Default)]
pub struct ImagesConfig {
    /// `DYNOCAP_IMAGE`: the image a start that names none boots (unset or blank: `host`).
    pub default: Option<String>,
    /// `DYNOCAP_IMAGE_CACHE`: a directory sharing built images between homes.
    pub cache: Option<PathBuf>,
    /// `DYNOCAP_DEBIAN_MIRROR`: the mirror an image build and the guest's apt use (unset or
    /// blank: Debian's).
    pub debian_mirror: Option<String>,
    /// `DYNOCAP_REGISTRIES`: `,`-separated registry hosts (`host`, `host:port`, `*.domain`)
    /// `dynocap image pull` may use (unset: none).
    pub registries: Option<String>,
    /// The user's Docker config file (`$DOCKER_CONFIG/config.json`, else
    /// `~/.docker/config.json`): credentials for a pull given none.
    pub docker_config: Option<PathBuf>,
    /// `DYNOCAP_PULL_IDLE_TIMEOUT` as given: how long a registry may send nothing before a
    /// pull gives up (checked by the pull).
    pub pull_idle_timeout: Option<String>,
}

/// The host ceilings as given, each a whole number above 0 (unset: a default from the
/// machine, see the facade's `ceilings`).
#[derive(Debug, Clone, Default)]
pub struct CeilingsConfig {
    /// `DYNOCAP_MAX_CPUS`.
    pub cpus: Option<OsString>,
    /// `DYNOCAP_MAX_MEMORY_MB`.
    pub memory_mb: Option<OsString>,
    /// `DYNOCAP_MAX_SANDBOXES`.
    pub sandboxes: Option<OsString>,
    /// `DYNOCAP_MAX_DISK_MB`.
    pub disk_mb: Option<OsString>,
    /// `DYNOCAP_MAX_TTL_SECONDS`.
    pub ttl_seconds: Option<OsString>,
}

/// The egress settings.
#[derive(Debug, Clone, Default)]
pub struct EgressConfig {
    /// `DYNOCAP_EGRESS_ALLOW`: `,`-separated hosts every `filtered` sandbox may reach.
    pub allow: Option<String>,
    /// `DYNOCAP_RESOLVE`: `host:port:address[,…]` name overrides for the egress proxy.
    pub resolve: Option<String>,
    /// `DYNOCAP_EXTRA_CA`: a PEM file joining the guest's CA bundle (empty: none).
    pub extra_ca: Option<PathBuf>,
    /// `DYNOCAP_MCP_GIT_HOSTS`: `,`-separated git hosts (unset: [`DEFAULT_GIT_HOSTS`]; set
    /// but empty: none).
    pub git_hosts: Option<String>,
}

/// The variable that sets the pool's size.
pub const POOL_ENV: &str = "DYNOCAP_WARM_POOL";
/// The most sandboxes a pool keeps: each holds a supervisor, a guest and a disk.
pub const POOL_MAX: usize = 16;
/// Git hosts a task's own remotes may add to its allowlist when `DYNOCAP_MCP_GIT_HOSTS` is
/// unset (the MCP server's default list of clone hosts).
pub const DEFAULT_GIT_HOSTS: &str = "github.com,gitlab.com,bitbucket.org";

impl Config {
    /// `DYNOCAP_BACKEND`; `auto` when it is unset or empty.
    pub fn backend_choice(&self) -> Result<BackendChoice> {
        match self.backend.as_deref() {
            None | Some("") => Ok(BackendChoice::Auto),
            Some(name) => BackendChoice::parse(name).ok_or_else(|| {
                Error::invalid(format!(
                    "DYNOCAP_BACKEND={name} is not a backend; use {}",
                    BackendChoice::VALUES
                ))
            }),
        }
    }

    /// Whether the jail's disks are limited (`DYNOCAP_DISK_LIMIT`).
    pub fn disk_limit(&self) -> Result<bool> {
        disk_limit(self.disk_limit.as_deref())
    }

    /// Whether tasks get their project's package caches (`DYNOCAP_CACHES`).
    pub fn caches(&self) -> Result<bool> {
        match self.caches.as_deref().map(str::trim) {
            None | Some("" | "1" | "on") => Ok(true),
            Some("0" | "off") => Ok(false),
            Some(other) => Err(Error::invalid(format!(
                "DYNOCAP_CACHES={other} is not valid; use 1 or on (the default: tasks keep \
                 their project's package caches) or 0 or off (no caches)"
            ))),
        }
    }

    /// The size of a new project package cache in bytes (`DYNOCAP_CACHE_MB`).
    pub fn cache_bytes(&self) -> Result<u64> {
        let text = match self.cache_mb.as_deref().map(str::trim) {
            None | Some("") => return Ok(CACHE_MB_DEFAULT << 20),
            Some(text) => text,
        };
        match text.parse::<u64>() {
            Ok(mb) if (CACHE_MB_MIN..=CACHE_MB_MAX).contains(&mb) => Ok(mb << 20),
            _ => Err(Error::invalid(format!(
                "DYNOCAP_CACHE_MB={text} is not a cache size; set it to a whole number of MB \
                 from {CACHE_MB_MIN} to {CACHE_MB_MAX}, or unset it for {CACHE_MB_DEFAULT}"
            ))),
        }
    }

    /// How many sandboxes the warm pool should hold: 0 (no pool) when unset.
    pub fn pool_target(&self) -> Result<usize> {
        let Some(value) = &self.warm_pool else {
            return Ok(0);
        };
        let text = value.to_string_lossy();
        match text.trim().parse::<usize>() {
            Ok(n) if n <= POOL_MAX => Ok(n),
            _ => Err(Error::invalid(format!(
                "{POOL_ENV}={text} is not a pool size; set it to a number from 0 to {POOL_MAX}, \
                 or unset it for no warm pool"
            ))),
        }
    }
}

/// Whether the jail's disks are limited, by the value of `DYNOCAP_DISK_LIMIT`.
pub fn disk_limit(value: Option<&str>) -> Result<bool> {
    match value {
        None | Some("") | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => Err(Error::invalid(format!(
            "DYNOCAP_DISK_LIMIT={other} is not valid; use on (the default) or off (no disk \
             limit: sandboxes write to the host's filesystem)"
        ))),
    }
}

impl ImagesConfig {
    /// The image name a start uses when its caller names none: `DYNOCAP_IMAGE`, else `host`.
    pub fn default_name(&self) -> String {
        self.default
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .unwrap_or(DEFAULT_IMAGE)
            .to_owned()
    }

    /// `DYNOCAP_IMAGE_CACHE`, when set and not empty.
    pub fn cache_dir(&self) -> Option<PathBuf> {
        self.cache.clone().filter(|p| !p.as_os_str().is_empty())
    }
}

impl EgressConfig {
    /// `DYNOCAP_MCP_GIT_HOSTS`, or its default when unset.
    pub fn git_hosts(&self) -> &str {
        self.git_hosts.as_deref().unwrap_or(DEFAULT_GIT_HOSTS)
    }

    /// `DYNOCAP_EXTRA_CA`, when set and not empty.
    pub fn extra_ca(&self) -> Option<PathBuf> {
        self.extra_ca.clone().filter(|p| !p.as_os_str().is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_size_is_checked() {
        let mut config = Config {
            warm_pool: Some("3".into()),
            ..Config::default()
        };
        assert_eq!(config.pool_target().unwrap(), 3);
        for bad in ["17", "-1", "two"] {
            config.warm_pool = Some(bad.into());
            let err = config.pool_target().unwrap_err();
            assert!(err.message.contains(POOL_ENV), "{err}");
        }
        config.warm_pool = None;
        assert_eq!(config.pool_target().unwrap(), 0);
    }

    #[test]
    fn unset_and_empty_take_the_defaults() {
        let mut config = Config::default();
        assert_eq!(config.backend_choice().unwrap(), BackendChoice::Auto);
        assert!(config.disk_limit().unwrap());
        assert_eq!(config.images.default_name(), DEFAULT_IMAGE);
        assert_eq!(config.egress.git_hosts(), DEFAULT_GIT_HOSTS);
        config.backend = Some(String::new());
        config.disk_limit = Some(String::new());
        config.images.default = Some("  ".into());
        config.egress.git_hosts = Some(String::new());
        assert_eq!(config.backend_choice().unwrap(), BackendChoice::Auto);
        assert!(config.disk_limit().unwrap());
        assert_eq!(config.images.default_name(), DEFAULT_IMAGE);
        assert_eq!(config.egress.git_hosts(), "");
    }

    #[test]
    fn bad_values_name_their_variable() {
        let config = Config {
            backend: Some("qemu".into()),
            disk_limit: Some("maybe".into()),
            ..Config::default()
        };
        let err = config.backend_choice().unwrap_err();
        assert!(err.message.contains("DYNOCAP_BACKEND=qemu"), "{err}");
        let err = config.disk_limit().unwrap_err();
        assert!(err.message.contains("DYNOCAP_DISK_LIMIT=maybe"), "{err}");
        assert!(!Config {
            disk_limit: Some("off".into()),
            ..Config::default()
        }
        .disk_limit()
        .unwrap());
    }
}
