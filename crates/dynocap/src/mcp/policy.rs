//! The MCP server's host security policy: which host directories a task may import
//! (`DYNOCAP_MCP_ROOTS` and the always-refused home set), which git URLs it may clone
//! (`DYNOCAP_MCP_GIT_HOSTS`), whether the caller may ask for `filtered`/`nat` networking
//! or hand over an SSH key (`DYNOCAP_MCP_ALLOW_*`), which images it may boot
//! (`DYNOCAP_MCP_IMAGES`) and which hosts it may add to a `filtered` allowlist
//! (`DYNOCAP_MCP_EGRESS_ALLOW`). The caller may be a prompt-injected model, so every decision
//! is made here, from the host's configuration, before the engine is called. SDK-free: plain
//! functions over paths and strings, unit-tested below.

use std::fmt;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use dynocap_engine::git_url::{GitUrl, GitUrlErrorKind};
use dynocap_engine::import::{ImportError, ProjectDir};
use dynocap_engine::{Config, Error, ErrorCode};
use dynocap_netproxy::HostPattern;

use crate::config::McpSettings;

pub const ENV_ROOTS: &str = "DYNOCAP_MCP_ROOTS";
pub const ENV_GIT_HOSTS: &str = "DYNOCAP_MCP_GIT_HOSTS";
pub const ENV_ALLOW_FILTERED: &str = "DYNOCAP_MCP_ALLOW_FILTERED";
pub const ENV_ALLOW_NAT: &str = "DYNOCAP_MCP_ALLOW_NAT";
pub const ENV_ALLOW_SSH_KEY: &str = "DYNOCAP_MCP_ALLOW_SSH_KEY";
pub const ENV_ALLOW_PUBLISH: &str = "DYNOCAP_MCP_ALLOW_PUBLISH";
pub const ENV_IMAGES: &str = "DYNOCAP_MCP_IMAGES";
pub const ENV_EGRESS_ALLOW: &str = "DYNOCAP_MCP_EGRESS_ALLOW";
pub const DEFAULT_GIT_HOSTS: &str = "github.com,gitlab.com,bitbucket.org";

/// SSH private keys are a few KiB; anything larger is not one.
const SSH_KEY_MAX_BYTES: u64 = 64 * 1024;
/// The image made from the host itself: always on the host (the engine's `DEFAULT_IMAGE`).
const HOST_IMAGE: &str = dynocap_engine::image::DEFAULT_IMAGE;
/// The `DYNOCAP_MCP_IMAGES` entry for every image built on this host (`dynocap image build`).
const BUILT_ENTRY: &str = "@built";
/// Longest image name or reference a caller may give (a registry reference with a digest is
/// well under it).
const IMAGE_REF_MAX: usize = 255;
/// Most `allowHosts` entries one call may give.
const ALLOW_HOSTS_MAX: usize = 64;

/// A refused request: the error code the caller gets, the rule that fired (logged), and a
/// message that says what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub rule: &'static str,
    pub message: String,
}

impl Refusal {
    fn denied(rule: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::PolicyDenied,
            rule,
            message: message.into(),
        }
    }
    fn invalid(rule: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::InvalidArgument,
            rule,
            message: message.into(),
        }
    }
    /// A malformed request noticed while applying the policy (`invalid_argument`).
    pub fn invalid_argument(rule: &'static str, message: impl Into<String>) -> Self {
        Self::invalid(rule, message)
    }

    pub fn into_error(self) -> Error {
        Error::new(self.code, self.message)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [rule {}]: {}",
            self.code.as_str(),
            self.rule,
            self.message
        )
    }
}

/// What the policy is built from: the environment and the process's situation at start.
#[derive(Debug, Clone, Default)]
pub struct PolicyInputs {
    pub roots: Option<String>,
    pub git_hosts: Option<String>,
    pub allow_filtered: Option<String>,
    pub allow_nat: Option<String>,
    pub allow_ssh_key: Option<String>,
    pub allow_publish: Option<String>,
    pub images: Option<String>,
    pub egress_allow: Option<String>,
    /// The server's working directory at start (the default root).
    pub cwd: Option<PathBuf>,
    /// `$HOME` and the passwd entry's home of the server's user.
    pub homes: Vec<PathBuf>,
    /// Every other account in the password database, and `/root` (see [`Account`]).
    pub accounts: Vec<Account>,
}

/// An account of the password database: its home, and whether it is a person's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub home: PathBuf,
    /// Root and regular users (uid 0, or uid from [`FIRST_REGULAR_UID`] up, `nobody` aside):
    /// their whole home is refused. Other system accounts have homes such as `/bin`,
    /// `/var/www` or `/var/lib/postgresql`, where projects may well live: for those, only
    /// the home itself, its ancestors and its dot directories are refused.
    pub person: bool,
}

/// The first uid `useradd` gives a regular user (`UID_MIN` in most distributions'
/// `/etc/login.defs`); a deployment with another value still has each such home's dot
/// directories refused.
pub const FIRST_REGULAR_UID: u32 = 1000;
/// `nobody`, a system account despite its high uid.
const NOBODY_UID: u32 = 65534;

/// Every account of the password database (`getpwent`: `/etc/passwd`, and the directory
/// services NSS is configured with), plus `/root` whatever the database says.
pub fn password_database() -> Vec<Account> {
    // getpwent keeps its position in process-wide state: one reader at a time.
    static READING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _reading = READING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut accounts = vec![Account {
        home: PathBuf::from("/root"),
        person: true,
    }];
    // SAFETY: setpwent/getpwent/endpwent are called under the lock above, so no other thread
    // of ours moves the database position meanwhile; each entry is copied out before the
    // next call may overwrite it, and its `pw_dir` is a NUL-terminated string when not null.
    unsafe {
        libc::setpwent();
        loop {
            let entry = libc::getpwent();
            if entry.is_null() {
                break;
            }
            let (dir, uid) = ((*entry).pw_dir, (*entry).pw_uid);
            if dir.is_null() {
                continue;
            }
            let home = std::ffi::CStr::from_ptr(dir).to_bytes();
            accounts.push(Account {
                home: PathBuf::from(std::ffi::OsStr::from_bytes(home)),
                person: uid == 0 || (uid >= FIRST_REGULAR_UID && uid != NOBODY_UID),
            });
        }
        libc::endpwent();
    }
    accounts
}

impl PolicyInputs {
    /// The seven settings (read in `config`), the working directory and the user's home
    /// directories.
    pub fn from_process(mcp: &McpSettings, config: &Config) -> Self {
        let mut homes = Vec::new();
        if let Some(home) = config
            .home
            .user_home
            .as_ref()
            .filter(|h| !h.as_os_str().is_empty())
        {
            homes.push(home.clone());
        }
        if let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::effective()) {
            homes.push(user.dir);
        }
        Self {
            roots: mcp.roots.clone(),
            git_hosts: config.egress.git_hosts.clone(),
            allow_filtered: mcp.allow_filtered.clone(),
            allow_nat: mcp.allow_nat.clone(),
            allow_ssh_key: mcp.allow_ssh_key.clone(),
            allow_publish: mcp.allow_publish.clone(),
            images: mcp.images.clone(),
            egress_allow: mcp.egress_allow.clone(),
            cwd: std::env::current_dir().ok(),
            homes,
            accounts: password_database(),
        }
    }
}

/// The directories a `projectPath` may lie in, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    Dirs(Vec<PathBuf>),
    None { reason: String },
}

/// One entry of `DYNOCAP_MCP_IMAGES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageEntry {
    /// An image by its name (`debian`, `host`, a built image's name) or a whole registry
    /// reference (`registry.example/team/tool:1`).
    Name(String),
    /// `@built`: every image built on this host with `dynocap image build` (the `debian`
    /// image, or a recipe); not one pulled or imported as it is, nor `host`.
    Built,
    /// A registry prefix ending in `/` (`registry.example/team/`): the references under it.
    Prefix(String),
}

impl fmt::Display for ImageEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) | Self::Prefix(name) => f.write_str(name),
            Self::Built => f.write_str(BUILT_ENTRY),
        }
    }
}

/// The images on this host when a call comes (`dynocap image ls`), as the image rules see
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostImages {
    /// Every image's name; a name may come more than once (a tag pulled again after it moved).
    pub names: Vec<String>,
    /// The names whose newest image was built on this host (`dynocap image build`: the
    /// `debian` image or a recipe), which `@built` admits.
    pub built: Vec<String>,
}

impl HostImages {
    /// The images `dynocap image ls` lists, oldest first, each as its name and whether it was
    /// built here. A name counts as built by its newest image only: that is the one a start
    /// by the name boots, and a name may hold images of both kinds (`dynocap image import
    /// --name tool` after `dynocap image build tool`), so one older build must not admit an
    /// import made over it.
    pub fn from_listing(listing: impl IntoIterator<Item = (String, bool)>) -> Self {
        let mut on_host = HostImages::default();
        for (name, built_here) in listing {
            on_host.built.retain(|built| *built != name);
            if built_here {
                on_host.built.push(name.clone());
            }
            on_host.names.push(name);
        }
        on_host
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

/// The host policy, fixed when the server starts.
#[derive(Debug, Clone)]
pub struct Policy {
    roots: Roots,
    /// The refused set: the server user's homes and everyone else's.
    homes: Homes,
    git_hosts: Vec<String>,
    allow_filtered: bool,
    allow_nat: bool,
    allow_ssh_key: bool,
    /// Callers may open port forwards (host listeners on 127.0.0.1).
    allow_publish: bool,
    /// `None`: unset, the images on the host are offered.
    images: Option<Vec<ImageEntry>>,
    /// The hosts `allowHosts` may add: each entry as written (for messages) and the
    /// patterns it stands for (a named registry expanded).
    egress_allow: Vec<(String, Vec<HostPattern>)>,
}

impl Policy {
    /// Builds the policy; `warn` receives one line per configuration problem (an ignored
    /// root, an unusable host entry, a flag with a value other than 0 or 1).
    pub fn new(inputs: &PolicyInputs, warn: &mut dyn FnMut(String)) -> Self {
        let mut homes = Vec::new();
        for home in &inputs.homes {
            if !home.is_absolute() {
                continue;
            }
            let lexical = normalize_lexically(home);
            if let Ok(resolved) = std::fs::canonicalize(home) {
                if !homes.contains(&resolved) {
                    homes.push(resolved);
                }
            }
            if !homes.contains(&lexical) {
                homes.push(lexical);
            }
        }
        let homes = Homes::new(homes, &inputs.accounts);
        let roots = build_roots(inputs, &homes, warn);
        let git_hosts = build_git_hosts(inputs.git_hosts.as_deref(), warn);
        let flag = |name: &str, value: &Option<String>, warn: &mut dyn FnMut(String)| -> bool {
            match value.as_deref().map(str::trim) {
                None | Some("") | Some("0") => false,
                Some("1") => true,
                Some(other) => {
                    warn(format!(
                        "{name}={other:?} is neither 0 nor 1; treating it as 0 (off)"
                    ));
                    false
                }
            }
        };
        Self {
            roots,
            homes,
            git_hosts,
            allow_filtered: flag(ENV_ALLOW_FILTERED, &inputs.allow_filtered, warn),
            allow_nat: flag(ENV_ALLOW_NAT, &inputs.allow_nat, warn),
            allow_ssh_key: flag(ENV_ALLOW_SSH_KEY, &inputs.allow_ssh_key, warn),
            allow_publish: flag(ENV_ALLOW_PUBLISH, &inputs.allow_publish, warn),
            images: inputs
                .images
                .as_deref()
                .map(|value| build_images(value, warn)),
            egress_allow: build_egress_allow(inputs.egress_allow.as_deref(), warn),
        }
    }

    #[cfg(test)]
    pub fn roots(&self) -> &Roots {
        &self.roots
    }

    #[cfg(test)]
    pub fn git_hosts(&self) -> &[String] {
        &self.git_hosts
    }

    /// One line describing the effective policy, for the start-up log.
    pub fn summary(&self) -> String {
        let roots = match &self.roots {
            Roots::Dirs(dirs) => dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
            Roots::None { .. } => "(none: every projectPath is refused)".to_owned(),
        };
        let images = match &self.images {
            None => "(unset: the images on this host)".to_owned(),
            Some(entries) if entries.is_empty() => "(none: the server's default only)".to_owned(),
            Some(entries) => join(entries),
        };
        format!(
            "roots={roots} git_hosts={} allow_filtered={} allow_nat={} allow_ssh_key={} \
             allow_publish={} images={images} egress_allow={}",
            self.git_hosts.join(","),
            u8::from(self.allow_filtered),
            u8::from(self.allow_nat),
            u8::from(self.allow_ssh_key),
            u8::from(self.allow_publish),
            self.egress_allow_shown(),
        )
    }

    /// `DYNOCAP_MCP_EGRESS_ALLOW` as the policy kept it, for messages and the log.
    fn egress_allow_shown(&self) -> String {
        if self.egress_allow.is_empty() {
            return "(none)".to_owned();
        }
        self.egress_allow
            .iter()
            .map(|(entry, _)| entry.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Checks a `projectPath` and returns the directory, opened: the path is resolved once,
    /// by that open, and what is checked is the descriptor's own path. The engine imports
    /// through the descriptor, so no later rename or symlink swap can change what comes.
    pub fn check_project_path(&self, raw: &str) -> Result<ProjectDir, Refusal> {
        if raw.is_empty() || raw.contains('\0') || !raw.starts_with('/') {
            return Err(Refusal::invalid(
                "roots.absolute",
                format!("projectPath {raw:?} must be an absolute host path, such as /srv/app"),
            ));
        }
        let dirs = match &self.roots {
            Roots::Dirs(dirs) => dirs,
            Roots::None { reason } => {
                return Err(Refusal::denied(
                    "roots.none",
                    format!(
                    "projectPath {raw} is refused: {reason}. Set {ENV_ROOTS} to the directories \
                         agents may import from (':'-separated) and restart the MCP server"
                ),
                ))
            }
        };
        let given = Path::new(raw);
        match ProjectDir::open(given) {
            Ok(dir) => {
                self.check_resolved(raw, dir.path(), dirs)?;
                Ok(dir)
            }
            Err(err) => {
                // Not opened: judge what the path names now (or its spelling, when nothing),
                // so a path outside the roots is refused like any other (no existence oracle
                // outside them), then say why it cannot be imported.
                let judged =
                    std::fs::canonicalize(given).unwrap_or_else(|_| normalize_lexically(given));
                self.check_resolved(raw, &judged, dirs)?;
                Err(match err {
                    ImportError::NotADirectory(_) => Refusal::invalid(
                        "roots.not-directory",
                        format!(
                            "projectPath {raw} is not a directory; name the project's top directory"
                        ),
                    ),
                    err => Refusal::invalid(
                        "roots.missing",
                        format!("projectPath {raw} cannot be opened: {err}"),
                    ),
                })
            }
        }
    }

    fn check_resolved(&self, raw: &str, resolved: &Path, dirs: &[PathBuf]) -> Result<(), Refusal> {
        let shown = if Path::new(raw) == resolved {
            raw.to_owned()
        } else {
            format!("{raw} (resolves to {})", resolved.display())
        };
        if let Some(why) = self.homes.refused_reason(resolved, false) {
            return Err(Refusal::denied(
                "roots.refused-home",
                format!(
                    "projectPath {shown} is refused: it {why}. Home directories (of every \
                     account), their ancestors and the dot directories in them (~/.ssh, ~/.aws, \
                     ~/.config, ...), and everything in other users' homes, are never imported, \
                     whatever {ENV_ROOTS} says"
                ),
            ));
        }
        if dirs.iter().any(|root| resolved.starts_with(root)) {
            return Ok(());
        }
        let list = dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        Err(Refusal::denied(
            "roots.outside",
            format!(
                "projectPath {shown} is outside the directories this server may import from \
                 ({ENV_ROOTS}={list}); ask the user to add it to {ENV_ROOTS}"
            ),
        ))
    }

    /// Checks a `repositoryUrl`; returns it parsed ([`GitUrl`], host canonical: lowercase,
    /// IDNA A-labels, no trailing dot), the very value the engine clones.
    pub fn check_repository_url(&self, raw: &str) -> Result<GitUrl, Refusal> {
        let url = GitUrl::parse(raw).map_err(|err| {
            let rule = err.kind.rule();
            match err.kind {
                GitUrlErrorKind::Empty => Refusal::invalid(rule, err.message),
                _ => Refusal::denied(rule, err.message),
            }
        })?;
        // Credentials are the CLI's to give: a caller here must not hand the clone a token,
        // and `github.com@evil.example` reads as github.com to a person.
        if url.credentials().is_some() {
            return Err(Refusal::denied(
                "git.userinfo",
                "repositoryUrl carries userinfo (user@ or credentials before the host); \
                 https URLs must not, and github.com@evil.example would reach evil.example",
            ));
        }
        let allowed = self.git_hosts.iter().any(|host| host == url.host());
        if !allowed {
            return Err(Refusal::denied(
                "git.host",
                format!(
                    "repositoryUrl host {:?} is not in {ENV_GIT_HOSTS} ({}); ask the user to add \
                     it there",
                    url.host(),
                    if self.git_hosts.is_empty() {
                        "empty".to_owned()
                    } else {
                        self.git_hosts.join(",")
                    }
                ),
            ));
        }
        Ok(url)
    }

    /// Refuses `filtered`/`nat` unless the host set the matching flag. Never downgrades.
    pub fn check_network(&self, network: &str) -> Result<(), Refusal> {
        let (allowed, var, what) = match network {
            "filtered" => (
                self.allow_filtered,
                ENV_ALLOW_FILTERED,
                "HTTPS to the npm registry and the task's git host",
            ),
            "nat" => (
                self.allow_nat,
                ENV_ALLOW_NAT,
                "unrestricted Internet access",
            ),
            _ => return Ok(()),
        };
        if allowed {
            return Ok(());
        }
        Err(Refusal::denied(
            if network == "nat" {
                "network.nat"
            } else {
                "network.filtered"
            },
            format!(
                "network \"{network}\" ({what}) is refused: the host did not set {var}=1 when \
                 starting the MCP server. Use network \"none\", or ask the user to set {var}=1"
            ),
        ))
    }

    /// Refuses an `image` that cannot name an image (`invalid_argument`), before any rule.
    pub fn check_image_shape(raw: &str) -> Result<(), Refusal> {
        image_ref_shape(raw).map_err(|why| {
            Refusal::invalid(
                "image.shape",
                format!(
                    "image {raw:?} is not an image name or reference: {why}; give a name such \
                     as debian or host (dynocap image ls on the host lists them)"
                ),
            )
        })
    }

    /// Checks an `image` the caller named, given the images on this host when the call comes
    /// (`dynocap image ls`; `host` is always there). Returns the name the engine resolves.
    /// Unset `DYNOCAP_MCP_IMAGES` offers exactly the images on the host; set, an image must
    /// match one of its entries. A registry reference that is allowed but not on the host is
    /// the caller's to pull (within `DYNOCAP_REGISTRIES`).
    pub fn check_image(&self, raw: &str, on_host: &HostImages) -> Result<String, Refusal> {
        Self::check_image_shape(raw)?;
        let present = raw == HOST_IMAGE || on_host.names.iter().any(|name| name == raw);
        let shown_on_host = || {
            // Each name once: a name may have several builds (a tag pulled again after it moved).
            let mut names = vec![HOST_IMAGE.to_owned()];
            for name in &on_host.names {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
            names.join(", ")
        };
        let Some(entries) = &self.images else {
            if present {
                return Ok(raw.to_owned());
            }
            return Err(Refusal::denied(
                "image.not-on-host",
                format!(
                    "image {raw:?} is refused: {ENV_IMAGES} is not set, so this server offers \
                     only the images already on this host ({}). Use one of them, or ask the \
                     user to build the image on the host (dynocap image build) or to set \
                     {ENV_IMAGES} and restart the MCP server",
                    shown_on_host()
                ),
            ));
        };
        let matched = entries.iter().find(|entry| match entry {
            ImageEntry::Name(name) => name == raw,
            // Built here from a recipe the host's user ran. The host image is made from the
            // host itself; a pulled or imported image is someone else's build, which the
            // host allows by name or registry prefix.
            ImageEntry::Built => on_host.built.iter().any(|name| name == raw),
            ImageEntry::Prefix(prefix) => raw.starts_with(prefix.as_str()),
        });
        let Some(_) = matched else {
            return Err(Refusal::denied(
                "image.not-allowed",
                if entries.is_empty() {
                    format!(
                        "image {raw:?} is refused: {ENV_IMAGES} is empty, so the caller may not \
                         choose an image. Leave image out to get the server's default, or ask \
                         the user to add {raw} to {ENV_IMAGES} and restart the MCP server"
                    )
                } else {
                    // A pulled or imported image that `@built` might seem to cover: say why not.
                    let not_built = if entries.contains(&ImageEntry::Built) && present {
                        format!(
                            " ({BUILT_ENTRY} admits only images built on this host with \
                             dynocap image build; {raw} was pulled or imported, or is the host)"
                        )
                    } else {
                        String::new()
                    };
                    format!(
                        "image {raw:?} is refused: it is not among the images this server \
                         offers ({ENV_IMAGES}={}){not_built}. Use one of those, or ask the \
                         user to add it to {ENV_IMAGES} and restart the MCP server",
                        join(entries)
                    )
                },
            ));
        };
        Ok(raw.to_owned())
    }

    /// Parses an `allowHosts` list: each entry a host pattern or a named registry, as in
    /// `DYNOCAP_EGRESS_ALLOW`; only a `filtered` sandbox takes any. Returns the patterns
    /// each entry stands for, in order (malformed input: `invalid_argument`).
    pub fn parse_allow_hosts(
        &self,
        network: &str,
        hosts: &[String],
    ) -> Result<Vec<(String, Vec<HostPattern>)>, Refusal> {
        if hosts.is_empty() {
            return Ok(Vec::new());
        }
        if network != "filtered" {
            return Err(Refusal::invalid(
                "allow-hosts.network",
                format!(
                    "allowHosts only applies to network \"filtered\", not \"{network}\"; \
                     pass network \"filtered\" or leave allowHosts out"
                ),
            ));
        }
        if hosts.len() > ALLOW_HOSTS_MAX {
            return Err(Refusal::invalid(
                "allow-hosts.count",
                format!(
                    "allowHosts has {} entries; give at most {ALLOW_HOSTS_MAX}",
                    hosts.len()
                ),
            ));
        }
        hosts
            .iter()
            .map(|entry| {
                HostPattern::parse_entry(entry)
                    .map(|patterns| (entry.trim().to_owned(), patterns))
                    .map_err(|err| {
                        Refusal::invalid("allow-hosts.entry", format!("allowHosts: {err}"))
                    })
            })
            .collect()
    }

    /// Checks parsed `allowHosts` entries against `DYNOCAP_MCP_EGRESS_ALLOW`: every host an
    /// entry stands for must be covered by the host's list (a wildcard there covers the names
    /// and wildcards below it). Returns the hosts to add, canonical and without repeats.
    pub fn check_allow_hosts(
        &self,
        entries: &[(String, Vec<HostPattern>)],
    ) -> Result<Vec<String>, Refusal> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        if self.egress_allow.is_empty() {
            return Err(Refusal::denied(
                "allow-hosts.none",
                format!(
                    "allowHosts is refused: the host did not set {ENV_EGRESS_ALLOW} when \
                     starting the MCP server, so the caller may add no hosts. Leave allowHosts \
                     out, or ask the user to add the hosts to {ENV_EGRESS_ALLOW}"
                ),
            ));
        }
        let mut added: Vec<String> = Vec::new();
        for (entry, patterns) in entries {
            for pattern in patterns {
                let covered = self
                    .egress_allow
                    .iter()
                    .flat_map(|(_, allowed)| allowed)
                    .any(|allowed| covers(allowed, pattern));
                if !covered {
                    let which = if entry == &pattern.to_string() {
                        String::new()
                    } else {
                        format!(" (its host {pattern})")
                    };
                    return Err(Refusal::denied(
                        "allow-hosts.outside",
                        format!(
                            "allowHosts entry {entry:?}{which} is refused: it is not within \
                             {ENV_EGRESS_ALLOW} ({}). Leave it out, or ask the user to add it \
                             to {ENV_EGRESS_ALLOW}",
                            self.egress_allow_shown()
                        ),
                    ));
                }
                let text = pattern.to_string();
                if !added.contains(&text) {
                    added.push(text);
                }
            }
        }
        Ok(added)
    }

    /// Whether a caller may open port forwards (`publish`, `dynocap_port`): listeners on the
    /// host's loopback, which any local process can then reach the sandbox through.
    pub fn check_publish(&self) -> Result<(), Refusal> {
        if self.allow_publish {
            return Ok(());
        }
        Err(Refusal::denied(
            "publish.flag",
            format!(
                "port forwards are refused: the host did not set {ENV_ALLOW_PUBLISH}=1 when \
                 starting the MCP server. Reach the server from inside the sandbox (dynocap_exec \
                 with curl), or ask the user to set {ENV_ALLOW_PUBLISH}=1 or to run \
                 `dynocap port NAME GUESTPORT` themselves"
            ),
        ))
    }

    /// Checks an `sshKeyPath`: allowed by the host flag, a regular file (not a symlink) that
    /// parses as an SSH private key. Its content is never echoed.
    pub fn check_ssh_key(&self, raw: &str) -> Result<PathBuf, Refusal> {
        if !self.allow_ssh_key {
            return Err(Refusal::denied(
                "ssh-key.flag",
                format!(
                    "sshKeyPath is refused: the host did not set {ENV_ALLOW_SSH_KEY}=1 when \
                     starting the MCP server. Use an https repositoryUrl, or ask the user to set \
                     {ENV_ALLOW_SSH_KEY}=1"
                ),
            ));
        }
        if raw.is_empty() || raw.contains('\0') || !raw.starts_with('/') {
            return Err(Refusal::invalid(
                "ssh-key.absolute",
                format!("sshKeyPath {raw:?} must be an absolute host path"),
            ));
        }
        let path = PathBuf::from(raw);
        let not_key = |detail: &str| {
            Refusal::denied(
                "ssh-key.format",
                format!(
                    "sshKeyPath {raw} is refused: {detail}. It must be a regular file holding an \
                     OpenSSH or PEM (RSA, EC, DSA) private key; its content is not shown"
                ),
            )
        };
        let meta = std::fs::symlink_metadata(&path).map_err(|err| {
            Refusal::denied(
                "ssh-key.file",
                format!("sshKeyPath {raw} cannot be read: {}", io_reason(&err)),
            )
        })?;
        if meta.file_type().is_symlink() {
            return Err(not_key("it is a symlink; name the key file itself"));
        }
        if !meta.file_type().is_file() {
            return Err(not_key("it is not a regular file"));
        }
        if meta.len() > SSH_KEY_MAX_BYTES {
            return Err(not_key("it is larger than any SSH private key"));
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)
            .map_err(|err| {
                Refusal::denied(
                    "ssh-key.file",
                    format!("sshKeyPath {raw} cannot be read: {}", io_reason(&err)),
                )
            })?;
        // It was swapped between the lstat and the open: judge what was opened.
        match file.metadata() {
            Ok(meta) if meta.file_type().is_file() => {}
            _ => return Err(not_key("it is not a regular file")),
        }
        let mut bytes = Vec::new();
        file.by_ref()
            .take(SSH_KEY_MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|err| {
                Refusal::denied(
                    "ssh-key.file",
                    format!("sshKeyPath {raw} cannot be read: {}", io_reason(&err)),
                )
            })?;
        if bytes.len() as u64 > SSH_KEY_MAX_BYTES {
            return Err(not_key("it is larger than any SSH private key"));
        }
        if !is_ssh_private_key(&bytes) {
            return Err(not_key("it does not parse as an SSH private key"));
        }
        Ok(path)
    }
}

/// An I/O error's reason without the OS's "(os error N)" noise.
fn io_reason(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => err.to_string(),
    }
}

/// Entries joined with commas, for messages and the log.
fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `allowed` (a host-list pattern) covers every name `wanted` matches: an exact name
/// covers itself; `*.s` covers the names below `s` and wildcards `*.t` with `t` equal to or
/// below `s`.
fn covers(allowed: &HostPattern, wanted: &HostPattern) -> bool {
    let shown = wanted.to_string();
    match shown.strip_prefix("*.") {
        Some(suffix) if wanted.is_wildcard() => {
            allowed.is_wildcard() && (allowed == wanted || allowed.matches(suffix))
        }
        _ => allowed.matches(&shown),
    }
}

/// Why `raw` cannot name an image, or `Ok`: names and registry references
/// (`registry.example/team/tool:1`, `...@sha256:...`) are ASCII letters, digits and
/// `._-/:@`, with no empty, `.` or `..` path segment, so that a prefix match is a match of
/// whole segments below the prefix.
fn image_ref_shape(raw: &str) -> Result<(), &'static str> {
    if raw.is_empty() {
        return Err("it is empty");
    }
    if raw.len() > IMAGE_REF_MAX {
        return Err("it is longer than 255 characters");
    }
    if !raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b))
    {
        return Err("only letters, digits and . _ - / : @ are allowed");
    }
    if raw.starts_with(['-', '.', ':', '@']) {
        return Err("it must start with a letter or digit");
    }
    if raw
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return Err("a path segment is empty, . or ..");
    }
    Ok(())
}

fn build_images(value: &str, warn: &mut dyn FnMut(String)) -> Vec<ImageEntry> {
    let mut entries = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = if entry.eq_ignore_ascii_case(BUILT_ENTRY) {
            Ok(ImageEntry::Built)
        } else if entry.starts_with('@') {
            Err("the only @ entry is @built (every image built on this host with dynocap image build)")
        } else if let Some(registry) = entry.strip_suffix('/') {
            image_ref_shape(registry).map(|()| ImageEntry::Prefix(entry.to_owned()))
        } else {
            image_ref_shape(entry).map(|()| ImageEntry::Name(entry.to_owned()))
        };
        match parsed {
            Ok(parsed) => {
                // A name with a `/` is a registry reference, which has a tag or digest: one
                // without matches no image, and was most likely meant as a prefix.
                if let ImageEntry::Name(name) = &parsed {
                    if name.contains('/') && !dynocap_engine::image::store::is_reference(name) {
                        warn(format!(
                            "{ENV_IMAGES}: {name:?} names no image (a registry reference has a \
                             :tag or @sha256:digest, and an image name on this host has no /), \
                             so it admits nothing; for every image under it, write the prefix \
                             {name}/"
                        ));
                    }
                }
                if !entries.contains(&parsed) {
                    entries.push(parsed);
                }
            }
            Err(why) => warn(format!(
                "{ENV_IMAGES}: ignoring {entry:?}: {why}; write image names (debian, host), \
                 @built or registry prefixes ending in / (registry.example/team/)"
            )),
        }
    }
    entries
}

fn build_egress_allow(
    value: Option<&str>,
    warn: &mut dyn FnMut(String),
) -> Vec<(String, Vec<HostPattern>)> {
    let mut entries: Vec<(String, Vec<HostPattern>)> = Vec::new();
    for entry in value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        // The engine's own parser of allowlist entries: `@pypi` stands here for the very
        // hosts it adds to a sandbox's allowlist.
        match HostPattern::parse_entry(entry) {
            Ok(patterns) => {
                if !entries.iter().any(|(known, _)| known == entry) {
                    entries.push((entry.to_owned(), patterns));
                }
            }
            Err(why) => warn(format!("{ENV_EGRESS_ALLOW}: ignoring {entry:?}: {why}")),
        }
    }
    entries
}

fn build_roots(inputs: &PolicyInputs, homes: &Homes, warn: &mut dyn FnMut(String)) -> Roots {
    // Set but empty means no roots (refuse every projectPath), like an empty git host list.
    let Some(value) = inputs.roots.as_deref() else {
        let Some(cwd) = &inputs.cwd else {
            return Roots::None {
                reason: "the server's working directory is unknown, so it has no default root"
                    .to_owned(),
            };
        };
        let resolved = std::fs::canonicalize(cwd).unwrap_or_else(|_| normalize_lexically(cwd));
        if let Some(why) = homes.refused_reason(&resolved, true) {
            return Roots::None {
                reason: format!(
                    "the MCP server was started from {}, which {why}, so it has no default root",
                    resolved.display()
                ),
            };
        }
        return Roots::Dirs(vec![resolved]);
    };
    let mut dirs = Vec::new();
    for entry in value.split(':').map(str::trim).filter(|e| !e.is_empty()) {
        let path = Path::new(entry);
        if !path.is_absolute() {
            warn(format!(
                "{ENV_ROOTS}: ignoring {entry:?}: roots must be absolute paths"
            ));
            continue;
        }
        let resolved = match std::fs::canonicalize(path) {
            Ok(resolved) => resolved,
            Err(err) => {
                warn(format!(
                    "{ENV_ROOTS}: ignoring {entry}: {}",
                    io_reason(&err)
                ));
                continue;
            }
        };
        if !resolved.is_dir() {
            warn(format!("{ENV_ROOTS}: ignoring {entry}: not a directory"));
            continue;
        }
        if let Some(why) = homes.refused_reason(&resolved, true) {
            warn(format!(
                "{ENV_ROOTS}: ignoring {entry}: it {why}, which is never a root"
            ));
            continue;
        }
        if !dirs.contains(&resolved) {
            dirs.push(resolved);
        }
    }
    if dirs.is_empty() {
        return Roots::None {
            reason: format!(
                "{ENV_ROOTS} names no usable directory{}",
                if value.trim().is_empty() {
                    " (it is empty)"
                } else {
                    " (the server's log says why each entry was ignored)"
                }
            ),
        };
    }
    Roots::Dirs(dirs)
}

fn build_git_hosts(value: Option<&str>, warn: &mut dyn FnMut(String)) -> Vec<String> {
    let value = value.unwrap_or(DEFAULT_GIT_HOSTS);
    let mut hosts = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        // The proxy's own normaliser: an entry is spelled as a GitUrl's host is, so the
        // comparison cannot disagree with what the clone opens.
        match dynocap_netproxy::normalize_host(entry) {
            Ok(host) => {
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
            Err(why) => warn(format!("{ENV_GIT_HOSTS}: ignoring {entry:?}: {why}")),
        }
    }
    hosts
}

/// Every home directory the policy refuses, resolved.
#[derive(Debug, Clone)]
struct Homes {
    /// The server user's: as given and as resolved.
    own: Vec<PathBuf>,
    /// Everyone else's (resolved), whether a person's.
    others: Vec<(PathBuf, bool)>,
}

impl Homes {
    /// `own` as already resolved; `accounts` are resolved here. An account whose home is `/`
    /// (the filesystem root is refused anyway; as a home it would refuse everything) or does
    /// not exist as a directory (`/nonexistent`, `/var/empty` where absent: nothing there to
    /// protect, and a home created later is a new account the restarted server will read) is
    /// left out.
    fn new(own: Vec<PathBuf>, accounts: &[Account]) -> Self {
        let mut others: Vec<(PathBuf, bool)> = Vec::new();
        for account in accounts {
            let Ok(home) = std::fs::canonicalize(&account.home) else {
                continue;
            };
            if home.parent().is_none() || !home.is_dir() || own.contains(&home) {
                continue;
            }
            match others.iter_mut().find(|(known, _)| *known == home) {
                // Shared by a person and a system account: a person's.
                Some(known) => known.1 |= account.person,
                None => others.push((home, account.person)),
            }
        }
        Self { own, others }
    }

    /// Why `path` (absolute, resolved) is refused, or `None`. `as_root`: judging a root
    /// rather than a project, where being an ancestor of another user's home is fine (the
    /// projects in it are judged one by one; `/home` stays a usable root).
    fn refused_reason(&self, path: &Path, as_root: bool) -> Option<String> {
        if let Some(why) = refused_reason(path, &self.own) {
            return Some(why);
        }
        let others: Vec<PathBuf> = self.others.iter().map(|(home, _)| home.clone()).collect();
        if let Some(why) = refused_reason(path, &others) {
            let ancestor = others
                .iter()
                .any(|home| home != path && home.starts_with(path));
            if !(as_root && ancestor) {
                return Some(why);
            }
        }
        self.others
            .iter()
            .find(|(home, person)| *person && path.starts_with(home))
            .map(|(home, _)| {
                format!(
                    "lies in {}, the home directory of another user",
                    home.display()
                )
            })
    }
}

/// Why `path` (absolute, resolved) is always refused, or `None`: it is a home directory,
/// an ancestor of one, or lies in a dot directory directly inside one.
pub fn refused_reason(path: &Path, homes: &[PathBuf]) -> Option<String> {
    // The ancestor of every home, even when no home directory is known.
    if path.parent().is_none() {
        return Some("is the filesystem root".to_owned());
    }
    for home in homes {
        if path == home {
            return Some(format!("is the home directory {}", home.display()));
        }
        if home.starts_with(path) {
            return Some(format!(
                "is an ancestor of the home directory {}",
                home.display()
            ));
        }
        if let Ok(rest) = path.strip_prefix(home) {
            if let Some(Component::Normal(first)) = rest.components().next() {
                if first.as_bytes().starts_with(b".") {
                    return Some(format!(
                        "lies in the dot directory {}",
                        home.join(first).display()
                    ));
                }
            }
        }
    }
    None
}

/// `.` and `..` resolved on the spelling alone (for paths that do not exist).
pub fn normalize_lexically(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
        }
    }
    out
}

/// Whether `bytes` is an OpenSSH or PEM private key (with or without a passphrase: a
/// protected key is refused later, with its own message).
pub fn is_ssh_private_key(bytes: &[u8]) -> bool {
    dynocap_engine::ssh_key::classify(bytes) != dynocap_engine::ssh_key::KeyKind::NotAKey
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
