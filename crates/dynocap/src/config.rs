//! Every setting, read once at this binary's edge: each `DYNOCAP_*` variable is an argument of
//! its own whose only source is its variable (clap's `env`), gathered into [`Settings`]: the
//! engine's [`Config`] and this binary's own (logging, the MCP server's host policy, the
//! command server's idle time), each passed down to what uses it. Neither the engine nor the
//! modules of this binary read a variable themselves.
//!
//! Every process of this binary builds it the same way from the environment it was given:
//! the command or MCP server a person starts, the command server (whose clients must share
//! its environment), and the supervisors the engine re-executes (which inherit the starter's
//! environment whole). Values are kept as given: the engine checks them where it uses them,
//! with the messages a bad value has always had (see the engine's `config`).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;
use dynocap_engine::config::{CeilingsConfig, EgressConfig, HomeConfig, ImagesConfig};
use dynocap_engine::{Config, Error};

/// The variables, each an argument from its variable alone: none has a command-line flag, and none shows
/// in `--help` (docs/configuration.md lists them).
#[derive(Debug, Parser)]
#[command(no_binary_name = true, disable_help_flag = true)]
struct Variables {
    #[arg(long, hide = true, env = "DYNOCAP_HOME")]
    dynocap_home: Option<OsString>,
    #[arg(long, hide = true, env = "XDG_DATA_HOME")]
    xdg_data_home: Option<OsString>,
    #[arg(long, hide = true, env = "HOME")]
    user_home: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_JAIL_POOL_MB")]
    jail_pool_mb: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_BACKEND")]
    backend: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_DISK_LIMIT")]
    disk_limit: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_VM_ACCEL")]
    vm_accel: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_EXEC_CGROUP")]
    exec_cgroup: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_IMAGE")]
    image: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_IMAGE_CACHE")]
    image_cache: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_DEBIAN_MIRROR")]
    debian_mirror: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_REGISTRIES")]
    registries: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_PULL_IDLE_TIMEOUT")]
    pull_idle_timeout: Option<OsString>,
    /// Docker's own variable: where the user's Docker config file is (for `image pull`).
    #[arg(long, hide = true, env = "DOCKER_CONFIG")]
    docker_config: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_AGENT")]
    agent: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_BIN")]
    bin: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_WARM_POOL")]
    warm_pool: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MAX_CPUS")]
    max_cpus: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MAX_MEMORY_MB")]
    max_memory_mb: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MAX_SANDBOXES")]
    max_sandboxes: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MAX_DISK_MB")]
    max_disk_mb: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MAX_TTL_SECONDS")]
    max_ttl_seconds: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_EGRESS_ALLOW")]
    egress_allow: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_RESOLVE")]
    resolve: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_EXTRA_CA")]
    extra_ca: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_CACHES")]
    caches: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_CACHE_MB")]
    cache_mb: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_GIT_HOSTS")]
    mcp_git_hosts: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_ROOTS")]
    mcp_roots: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_ALLOW_FILTERED")]
    mcp_allow_filtered: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_ALLOW_NAT")]
    mcp_allow_nat: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_ALLOW_SSH_KEY")]
    mcp_allow_ssh_key: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_ALLOW_PUBLISH")]
    mcp_allow_publish: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_IMAGES")]
    mcp_images: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_EGRESS_ALLOW")]
    mcp_egress_allow: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_LOG")]
    mcp_log: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_MCP_WAIT_SECONDS")]
    mcp_wait_seconds: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_LOG")]
    log: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_LOG_FORMAT")]
    log_format: Option<OsString>,
    #[arg(long, hide = true, env = "DYNOCAP_CLI_SERVER_IDLE_SECONDS")]
    cli_server_idle_seconds: Option<OsString>,
}

/// What this process's environment sets: the engine's configuration and this binary's own.
#[derive(Debug, Clone)]
pub struct Settings {
    pub engine: Config,
    /// How the long-lived processes log (`DYNOCAP_LOG`, `DYNOCAP_LOG_FORMAT`).
    pub log: crate::logging::Settings,
    pub mcp: McpSettings,
    /// `DYNOCAP_CLI_SERVER_IDLE_SECONDS`, as given: the command server checks it and says
    /// in its log when it is not a number of seconds.
    pub cli_server_idle: Option<OsString>,
}

impl Settings {
    /// The variables set to a relative path. Each process reads such a path against its own
    /// working directory, so a process that works elsewhere than the command it serves (the
    /// command server works from `/`) would use another home, agent or file than that
    /// command's own process: the command server refuses to serve such an environment.
    pub fn relative_paths(&self) -> Vec<&'static str> {
        let config = &self.engine;
        [
            ("DYNOCAP_HOME", &config.home.dynocap_home),
            ("XDG_DATA_HOME", &config.home.xdg_data_home),
            ("HOME", &config.home.user_home),
            ("DYNOCAP_IMAGE_CACHE", &config.images.cache),
            ("DOCKER_CONFIG", &config.images.docker_config),
            ("DYNOCAP_AGENT", &config.agent),
            ("DYNOCAP_BIN", &config.supervisor_exe),
            ("DYNOCAP_EXTRA_CA", &config.egress.extra_ca),
        ]
        .into_iter()
        .filter(|(_, path)| {
            path.as_deref()
                .is_some_and(|path| !path.as_os_str().is_empty() && path.is_relative())
        })
        .map(|(name, _)| name)
        .collect()
    }
}

/// The MCP server's host policy and log file, as given: the server checks each value when it
/// starts and says in its log what it did with one it did not understand.
#[derive(Debug, Clone, Default)]
pub struct McpSettings {
    pub roots: Option<String>,
    pub allow_filtered: Option<String>,
    pub allow_nat: Option<String>,
    pub allow_ssh_key: Option<String>,
    /// `DYNOCAP_MCP_ALLOW_PUBLISH`: callers may open port forwards.
    pub allow_publish: Option<String>,
    /// `DYNOCAP_MCP_IMAGES`: the images a caller may name (unset: those on the host).
    pub images: Option<String>,
    /// `DYNOCAP_MCP_EGRESS_ALLOW`: the hosts a caller's `allowHosts` may add.
    pub egress_allow: Option<String>,
    /// `DYNOCAP_MCP_LOG`: `1` also logs to the home's `logs/mcp.log`.
    pub log: Option<String>,
    /// `DYNOCAP_MCP_WAIT_SECONDS`: how long an exec call waits before answering with its job.
    pub wait_seconds: Option<String>,
}

/// A text setting; one that is not UTF-8 counts as unset, as it always has.
fn text(value: Option<OsString>) -> Option<String> {
    value.and_then(|v| v.into_string().ok())
}

fn path(value: Option<OsString>) -> Option<PathBuf> {
    value.map(PathBuf::from)
}

/// A text setting that is unset when empty or blank.
fn nonblank(value: Option<OsString>) -> Option<String> {
    text(value).filter(|v| !v.trim().is_empty())
}

/// The settings this process's environment gives.
pub fn from_env() -> Result<Settings, Error> {
    // Parsed from no arguments: every value comes from the environment.
    let s = Variables::try_parse_from(std::iter::empty::<OsString>())
        .map_err(|err| Error::internal(format!("reading the configuration: {err}")))?;
    let log = crate::logging::Settings::parse(
        nonblank(s.log).as_deref(),
        nonblank(s.log_format).as_deref(),
    );
    let mcp = McpSettings {
        roots: text(s.mcp_roots),
        allow_filtered: text(s.mcp_allow_filtered),
        allow_nat: text(s.mcp_allow_nat),
        allow_ssh_key: text(s.mcp_allow_ssh_key),
        allow_publish: text(s.mcp_allow_publish),
        images: text(s.mcp_images),
        egress_allow: text(s.mcp_egress_allow),
        log: text(s.mcp_log),
        wait_seconds: nonblank(s.mcp_wait_seconds),
    };
    // Docker's rule: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
    let docker_config = path(s.docker_config)
        .filter(|p| !p.as_os_str().is_empty())
        .or_else(|| path(s.user_home.clone()).map(|h| h.join(".docker")))
        .map(|dir| dir.join("config.json"));
    let engine = Config {
        home: HomeConfig {
            dynocap_home: path(s.dynocap_home),
            xdg_data_home: path(s.xdg_data_home),
            user_home: path(s.user_home),
            jail_pool_mb: text(s.jail_pool_mb),
        },
        backend: text(s.backend),
        disk_limit: text(s.disk_limit),
        vm_accel: text(s.vm_accel),
        exec_cgroup: text(s.exec_cgroup),
        images: ImagesConfig {
            default: text(s.image),
            cache: path(s.image_cache),
            debian_mirror: text(s.debian_mirror),
            registries: text(s.registries),
            docker_config,
            pull_idle_timeout: text(s.pull_idle_timeout),
        },
        agent: path(s.agent),
        supervisor_exe: path(s.bin),
        warm_pool: s.warm_pool,
        ceilings: CeilingsConfig {
            cpus: s.max_cpus,
            memory_mb: s.max_memory_mb,
            sandboxes: s.max_sandboxes,
            disk_mb: s.max_disk_mb,
            ttl_seconds: s.max_ttl_seconds,
        },
        egress: EgressConfig {
            allow: text(s.egress_allow),
            resolve: text(s.resolve),
            extra_ca: path(s.extra_ca),
            git_hosts: text(s.mcp_git_hosts),
        },
        caches: text(s.caches),
        cache_mb: text(s.cache_mb),
    };
    Ok(Settings {
        engine,
        log,
        mcp,
        cli_server_idle: s.cli_server_idle_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_the_environment_alone() {
        // Parsing from a fake environment would need clap's internals; what can be checked
        // without touching this process's environment is that the definition is sound and
        // that no argument takes a value from the command line by position.
        use clap::CommandFactory;
        let command = Variables::command();
        command.clone().debug_assert();
        for arg in command.get_arguments() {
            assert!(arg.get_env().is_some(), "{} has no variable", arg.get_id());
            assert!(!arg.is_positional(), "{}", arg.get_id());
        }
    }

    #[test]
    fn relative_paths_name_their_variables() {
        let mut settings = Settings {
            engine: Config::default(),
            log: crate::logging::Settings::parse(None, None),
            mcp: McpSettings::default(),
            cli_server_idle: None,
        };
        settings.engine.home.dynocap_home = Some(PathBuf::from("/abs/home"));
        settings.engine.home.user_home = Some(PathBuf::from(""));
        assert!(settings.relative_paths().is_empty());
        settings.engine.home.dynocap_home = Some(PathBuf::from("state"));
        settings.engine.agent = Some(PathBuf::from("./dynocap-agent"));
        settings.engine.images.docker_config = Some(PathBuf::from("/root/.docker/config.json"));
        assert_eq!(settings.relative_paths(), ["DYNOCAP_HOME", "DYNOCAP_AGENT"]);
    }

    #[test]
    fn docs_list_every_setting() {
        use clap::CommandFactory;
        let docs = include_str!("../../../docs/configuration.md");
        for arg in Variables::command().get_arguments() {
            let name = arg.get_env().and_then(|n| n.to_str()).unwrap_or_default();
            assert!(
                docs.contains(&format!("`{name}`")) || docs.contains(&format!("${name}")),
                "docs/configuration.md does not name {name}"
            );
        }
    }
}
