//! [`GitUrl`]: a `repositoryUrl`, parsed once where it enters (the CLI's `--repo`, the MCP
//! server's policy) and handed on as a value, so what the policy judged is what the clone
//! fetches. There is no second reading of the string: the record stores the canonical
//! spelling and reading a record parses it again with this same parser.
//!
//! Three shapes are accepted: `https://HOST[:443]/path`, `ssh://[user@]HOST[:22]/path` and
//! scp-like `user@HOST:path`. Everything else is refused, and so is every trick that could
//! make git reach another host than the one judged, read the URL as an option, or run a
//! command: other transports (`file://`, `ext::`, `fd::`), local paths, whitespace and
//! control characters, backslashes, a user part that hides the real host
//! (`github.com@evil.example`), ports other than the one the egress proxy opens for the
//! transport, and any host that is not a plain DNS name in the one canonical spelling of
//! [`dynocap_netproxy::normalize_host`] (IP literals and numeric names included).
//!
//! The credentials of an https URL (`https://user:token@host/…`) are kept apart from the
//! moment of parsing: [`GitUrl`]'s `Display`, `Debug` and serialised form never show them,
//! and they leave the value only through [`GitUrl::credentials`].

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The port the egress proxy opens for an https clone.
pub const HTTPS_PORT: u16 = 443;
/// The port the egress proxy opens for an ssh clone.
pub const SSH_PORT: u16 = 22;

/// How git reaches the repository, and how the URL spelled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `https://HOST[:443]/path`.
    Https,
    /// `ssh://[user@]HOST[:22]/path`.
    Ssh,
    /// `user@HOST:path`, git's scp-like ssh syntax.
    Scp,
}

/// The `user[:password]` of an https repository URL: kept in memory only, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials(String);

impl Credentials {
    /// Credentials as the URL wrote them (percent-encoding and all), for the one reader
    /// that hands them on (the pipe to the supervisor, the clone request).
    pub(crate) fn new(userinfo: String) -> Self {
        Self(userinfo)
    }

    /// The userinfo as the URL wrote it (percent-encoding and all).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

/// A git URL that passed every shape check, with its host in canonical spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitUrl {
    transport: Transport,
    /// An ssh login name (`git` of `git@host`); never a secret, never a password.
    user: Option<String>,
    /// An https URL's userinfo; held apart, never displayed.
    credentials: Option<Credentials>,
    /// Canonical: IDNA A-labels, lowercase, no trailing dot.
    host: String,
    /// As written, when written; always the transport's own port.
    port: Option<u16>,
    /// Everything after the host (and port): `/owner/repo.git`, or `owner/repo.git` for scp.
    path: String,
}

/// Which rule a refused URL broke; [`GitUrlErrorKind::rule`] names it in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitUrlErrorKind {
    /// Nothing was given.
    Empty,
    /// Whitespace, control characters or non-ASCII in the URL.
    Characters,
    /// A leading `-`, which git would read as an option.
    Option,
    /// A transport other than https and ssh (`http://`, `file://`, `ext::`, ...).
    Transport,
    /// A local path.
    Local,
    /// Not one of the three accepted shapes (no path, a malformed port, a backslash, ...).
    Shape,
    /// A user part that is not a plain login name (ssh) or a well-formed userinfo (https).
    Userinfo,
    /// A host that is not a plain DNS name.
    Host,
    /// A well-formed port other than the one the egress proxy opens for the transport.
    Port,
}

impl GitUrlErrorKind {
    /// The rule's name in the MCP server's log (`[rule git.host]`).
    pub fn rule(self) -> &'static str {
        match self {
            Self::Empty => "git.empty",
            Self::Characters => "git.characters",
            Self::Option => "git.option",
            Self::Transport => "git.transport",
            Self::Local => "git.local",
            Self::Shape => "git.shape",
            Self::Userinfo => "git.userinfo",
            Self::Host => "git.host",
            Self::Port => "git.port",
        }
    }
}

/// Why a string is not a [`GitUrl`]. The message never repeats the URL's credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct GitUrlError {
    pub kind: GitUrlErrorKind,
    pub message: String,
}

fn refuse(kind: GitUrlErrorKind, message: impl Into<String>) -> GitUrlError {
    GitUrlError {
        kind,
        message: message.into(),
    }
}

impl From<GitUrlError> for crate::Error {
    fn from(err: GitUrlError) -> Self {
        crate::Error::invalid(err.message)
    }
}

impl GitUrl {
    /// Parses `https://HOST[:443]/path`, `ssh://[user@]HOST[:22]/path` or `user@HOST:path`;
    /// see the module documentation for what is refused and why.
    pub fn parse(raw: &str) -> Result<Self, GitUrlError> {
        use GitUrlErrorKind as K;
        if raw.is_empty() {
            return Err(refuse(
                K::Empty,
                "repositoryUrl is empty; give an https:// or ssh:// git URL",
            ));
        }
        if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(refuse(
                K::Characters,
                "repositoryUrl contains whitespace or control characters, which are refused",
            ));
        }
        if raw.starts_with('-') {
            return Err(refuse(
                K::Option,
                "repositoryUrl starts with '-', which git would read as an option; refused",
            ));
        }
        if raw.contains('\\') {
            return Err(refuse(
                K::Shape,
                "repositoryUrl contains a backslash, which is refused",
            ));
        }
        // Schemes are case-insensitive; the canonical spelling git is handed is lowercase
        // (git looks a transport up by the scheme's exact spelling).
        let (transport, rest) = if let Some(rest) = strip_scheme(raw, "https://") {
            (Transport::Https, rest)
        } else if let Some(rest) = strip_scheme(raw, "ssh://") {
            (Transport::Ssh, rest)
        } else if let Some(index) = raw.find("://") {
            let scheme = &raw[..index];
            return Err(refuse(
                K::Transport,
                format!(
                    "repositoryUrl transport {scheme:?} is refused; only https://HOST/..., \
                     ssh://[user@]HOST/... and user@HOST:path are allowed"
                ),
            ));
        } else if raw.contains("::") {
            return Err(refuse(
                K::Transport,
                "repositoryUrl uses git's <transport>::<address> syntax (such as ext::), which \
                 is refused; only https://, ssh:// and user@HOST:path are allowed",
            ));
        } else {
            return parse_scp(raw);
        };
        // The authority ends where a URL parser would end it: git, curl and ssh must all see
        // the host this parser sees (`https://github.com#@evil.example/` names no path).
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let shown = strip_userinfo(raw);
        if !path.starts_with('/') || path.len() < 2 {
            return Err(refuse(
                K::Shape,
                format!("repositoryUrl {shown} names no repository path after the host"),
            ));
        }
        if path.starts_with("//") {
            return Err(refuse(
                K::Shape,
                format!("repositoryUrl {shown} has an empty path segment after the host"),
            ));
        }
        let (userinfo, host_port) = match authority.rsplit_once('@') {
            None => (None, authority),
            Some((userinfo, host_port)) => (Some(userinfo), host_port),
        };
        let (user, credentials) = match (transport, userinfo) {
            (_, None) => (None, None),
            (Transport::Https, Some(userinfo)) => {
                check_credentials(userinfo)?;
                (None, Some(Credentials(userinfo.to_owned())))
            }
            (_, Some(userinfo)) => {
                if userinfo.contains(':') {
                    return Err(refuse(
                        K::Userinfo,
                        format!(
                            "repositoryUrl {shown} carries a password, which ssh is never \
                             given; use --ssh-key (sshKeyPath)"
                        ),
                    ));
                }
                check_user(userinfo)?;
                (Some(userinfo.to_owned()), None)
            }
        };
        check_path_characters(path)?;
        let (host, port) = split_port(host_port)?;
        let wanted = match transport {
            Transport::Https => HTTPS_PORT,
            Transport::Ssh | Transport::Scp => SSH_PORT,
        };
        if port.is_some_and(|port| port != wanted) {
            return Err(refuse(
                K::Port,
                format!(
                    "repositoryUrl {shown}: port {} is not fetched through the egress proxy \
                     (only {wanted} for {})",
                    port.unwrap_or_default(),
                    if wanted == SSH_PORT { "ssh" } else { "https" }
                ),
            ));
        }
        Ok(Self {
            transport,
            user,
            credentials,
            host: canonical_host(host)?,
            port,
            path: path.to_owned(),
        })
    }

    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Whether git fetches over ssh (`ssh://` or scp-like).
    pub fn is_ssh(&self) -> bool {
        self.transport != Transport::Https
    }

    /// The host, canonical ([`dynocap_netproxy::normalize_host`]): what the policy compares
    /// and the egress proxy opens.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The ssh login name (`git` of `git@github.com:team/app`), if the URL names one.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The path on the host, as written (`/team/app.git`, or `team/app.git` scp-like).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The port as written (always the transport's own), if written.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// An https URL's credentials, if it carried any.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// The same URL without its credentials: what is recorded and shown.
    pub fn without_credentials(&self) -> Self {
        Self {
            credentials: None,
            ..self.clone()
        }
    }
}

/// The canonical spelling, without credentials: what git is handed and what is recorded.
impl fmt::Display for GitUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        let user = self
            .user
            .as_deref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        match self.transport {
            Transport::Https => write!(f, "https://{}{port}{}", self.host, self.path),
            Transport::Ssh => write!(f, "ssh://{user}{}{port}{}", self.host, self.path),
            Transport::Scp => write!(f, "{user}{}:{}", self.host, self.path),
        }
    }
}

impl std::str::FromStr for GitUrl {
    type Err = GitUrlError;
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        Self::parse(raw)
    }
}

/// Serialised as its canonical spelling, without credentials.
impl Serialize for GitUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Read back through [`GitUrl::parse`]: a record is judged by the same rules as a request.
impl<'de> Deserialize<'de> for GitUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        GitUrl::parse(&raw).map_err(serde::de::Error::custom)
    }
}

pub use dynocap_proto::redact::strip_userinfo;

/// `raw` after `scheme` (lowercase, with `://`), compared without regard to case.
fn strip_scheme<'a>(raw: &'a str, scheme: &str) -> Option<&'a str> {
    let head = raw.get(..scheme.len())?;
    head.eq_ignore_ascii_case(scheme)
        .then(|| &raw[scheme.len()..])
}

fn parse_scp(raw: &str) -> Result<GitUrl, GitUrlError> {
    use GitUrlErrorKind as K;
    if raw.starts_with('/') || raw.starts_with('.') || raw.starts_with('~') {
        return Err(refuse(
            K::Local,
            "repositoryUrl is a local path, which is refused; use projectPath for local \
             projects",
        ));
    }
    let Some((left, path)) = raw.split_once(':') else {
        return Err(refuse(
            K::Local,
            format!(
                "repositoryUrl {raw:?} is not a URL git would fetch from the network (a local \
                 path?); use https://HOST/..., ssh://[user@]HOST/... or user@HOST:path"
            ),
        ));
    };
    if left.contains('/') {
        return Err(refuse(
            K::Local,
            "repositoryUrl is a local path (a '/' before the ':'), which is refused",
        ));
    }
    // Without a user, git reads `HOST:path` as scp-like but a caller may well mean a
    // local file named so; a user makes the intent plain.
    let Some((user, host)) = left.split_once('@') else {
        return Err(refuse(
            K::Shape,
            format!(
                "repositoryUrl {raw:?} is HOST:path without a user; use user@HOST:path \
                 (e.g. git@github.com:owner/repo.git) or https://"
            ),
        ));
    };
    check_user(user)?;
    if path.is_empty() || path.starts_with('-') || path.starts_with('/') && path.len() < 2 {
        return Err(refuse(
            K::Shape,
            format!("repositoryUrl {raw:?} names no usable repository path after the ':'"),
        ));
    }
    check_path_characters(path)?;
    Ok(GitUrl {
        transport: Transport::Scp,
        user: Some(user.to_owned()),
        credentials: None,
        host: canonical_host(host)?,
        port: None,
        path: path.to_owned(),
    })
}

fn canonical_host(host: &str) -> Result<String, GitUrlError> {
    dynocap_netproxy::normalize_host(host).map_err(|why| {
        refuse(
            GitUrlErrorKind::Host,
            format!("repositoryUrl host is refused: {why}"),
        )
    })
}

/// The repository path is passed to git and the remote verbatim: printable ASCII only.
fn check_path_characters(path: &str) -> Result<(), GitUrlError> {
    if path.bytes().all(|b| b.is_ascii_graphic()) {
        return Ok(());
    }
    Err(refuse(
        GitUrlErrorKind::Characters,
        "repositoryUrl path contains characters other than printable ASCII, which are refused",
    ))
}

/// An ssh login name: a plain user name, which ssh cannot read as an option.
fn check_user(user: &str) -> Result<(), GitUrlError> {
    let ok = !user.is_empty()
        && !user.starts_with('-')
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        return Ok(());
    }
    Err(refuse(
        GitUrlErrorKind::Userinfo,
        "repositoryUrl user part is refused: only a plain user name (letters, digits, '.', \
         '_', '-'; no password, no second '@') may precede the host, as in git@HOST",
    ))
}

/// An https URL's userinfo: one `@` only (a second one is how `user@github.com@evil.example`
/// hides the host a reader sees first), and not empty.
fn check_credentials(userinfo: &str) -> Result<(), GitUrlError> {
    if userinfo.is_empty() {
        return Err(refuse(
            GitUrlErrorKind::Userinfo,
            "repositoryUrl has an empty user part ('@' right after https://); remove the '@'",
        ));
    }
    if userinfo.contains('@') {
        return Err(refuse(
            GitUrlErrorKind::Userinfo,
            "repositoryUrl credentials contain a second '@'; percent-encode an '@' in a user \
             name or token as %40",
        ));
    }
    Ok(())
}

fn split_port(host_port: &str) -> Result<(&str, Option<u16>), GitUrlError> {
    let bad_port = || {
        refuse(
            GitUrlErrorKind::Shape,
            "repositoryUrl port must be a number from 1 to 65535, written without a sign or \
             leading zeros",
        )
    };
    let (host, port) = if host_port.starts_with('[') {
        match host_port.find(']') {
            Some(close) => {
                let (host, after) = host_port.split_at(close + 1);
                match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None if after.is_empty() => (host, None),
                    None => return Err(bad_port()),
                }
            }
            None => {
                return Err(refuse(
                    GitUrlErrorKind::Host,
                    "repositoryUrl host has an unclosed '['",
                ))
            }
        }
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    let port = match port {
        None => None,
        // Digits only, no leading zero: one spelling per port, so `:0443` cannot pass as 443
        // here and mean something else to another reader.
        Some(p)
            if !p.is_empty()
                && p.len() <= 5
                && !p.starts_with('0')
                && p.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some(p.parse::<u16>().map_err(|_| bad_port())?)
        }
        Some(_) => return Err(bad_port()),
    };
    Ok((host, port))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use GitUrlErrorKind as K;

    fn kind(raw: &str) -> GitUrlErrorKind {
        match GitUrl::parse(raw) {
            Ok(url) => panic!("{raw:?} was accepted as {url}"),
            Err(err) => err.kind,
        }
    }

    #[test]
    fn accepted_shapes_in_their_canonical_spelling() {
        for (raw, canonical) in [
            ("https://github.com/o/r.git", "https://github.com/o/r.git"),
            ("HTTPS://GitHub.COM/o/r", "https://github.com/o/r"),
            ("Ssh://git@GitHub.com/o/r", "ssh://git@github.com/o/r"),
            ("https://github.com./o/r", "https://github.com/o/r"),
            (
                "https://BÜCHER.example/o/r",
                "https://xn--bcher-kva.example/o/r",
            ),
            (
                "https://gitlab.com:443/g/s/r.git",
                "https://gitlab.com:443/g/s/r.git",
            ),
            ("ssh://github.com:22/o/r.git", "ssh://github.com:22/o/r.git"),
            ("git@github.com:o/r.git", "git@github.com:o/r.git"),
            ("git@GitHub.com.:/srv/r.git", "git@github.com:/srv/r.git"),
            (
                "https://host.example/o/r.git?x#y",
                "https://host.example/o/r.git?x#y",
            ),
            ("https://host.example/o%20r", "https://host.example/o%20r"),
        ] {
            let url = GitUrl::parse(raw).unwrap();
            assert_eq!(url.to_string(), canonical, "{raw}");
            // The canonical spelling reads back as itself.
            assert_eq!(GitUrl::parse(canonical).unwrap(), url, "{raw}");
        }
    }

    #[test]
    fn transports_and_hosts() {
        let https = GitUrl::parse("https://tok@Git.Example.com/o/r.git").unwrap();
        assert_eq!(
            (https.host(), https.is_ssh(), https.transport()),
            ("git.example.com", false, Transport::Https)
        );
        let ssh = GitUrl::parse("ssh://git@h.example:22/o/r").unwrap();
        assert_eq!((ssh.host(), ssh.is_ssh()), ("h.example", true));
        let scp = GitUrl::parse("git@h.example:o/r.git").unwrap();
        assert_eq!((scp.transport(), scp.is_ssh()), (Transport::Scp, true));
    }

    #[test]
    fn https_credentials_are_held_apart_and_never_shown() {
        let url = GitUrl::parse("https://me:ghp_t0k@Host.example/o/r.git?x#y").unwrap();
        assert_eq!(url.credentials().unwrap().expose(), "me:ghp_t0k");
        assert_eq!(url.to_string(), "https://host.example/o/r.git?x#y");
        assert!(!format!("{url:?}").contains("ghp_t0k"));
        assert_eq!(
            serde_json::to_string(&url).unwrap(),
            "\"https://host.example/o/r.git?x#y\""
        );
        assert_eq!(url.without_credentials().credentials(), None);
        let token_only = GitUrl::parse("https://ghp_t0k@host.example/r").unwrap();
        assert_eq!(token_only.credentials().unwrap().expose(), "ghp_t0k");
        // An '@' in the path is not userinfo.
        let at_in_path = GitUrl::parse("https://host.example/a@b").unwrap();
        assert_eq!(at_in_path.credentials(), None);
        assert_eq!(at_in_path.host(), "host.example");
        // Percent-encoded credentials are kept as written.
        let encoded = GitUrl::parse("https://me:t%40k@host.example/r").unwrap();
        assert_eq!(encoded.credentials().unwrap().expose(), "me:t%40k");
    }

    #[test]
    fn a_user_part_cannot_hide_the_host() {
        for raw in [
            "https://github.com@evil.example@github.com/o/r",
            "https://a@b@host.example/r",
            "https://@host.example/r",
            "ssh://a@b@github.com/o/r",
            "ssh://-oProxyCommand=x@github.com/o/r",
            "ssh://git:hunter2@host.example/r",
        ] {
            assert_eq!(kind(raw), K::Userinfo, "{raw}");
        }
        // The password is not repeated.
        let err = GitUrl::parse("ssh://git:hunter2@host.example/r").unwrap_err();
        assert!(!err.message.contains("hunter2"), "{err}");
        // What a reader sees first is userinfo, and the host is the one after the '@'.
        let url = GitUrl::parse("https://github.com@evil.example/o/r").unwrap();
        assert_eq!(url.host(), "evil.example");
    }

    #[test]
    fn only_the_proxys_port_for_the_transport() {
        for raw in [
            "https://h.example:8443/r",
            "ssh://h.example:2222/r",
            "https://h.example:22/r",
        ] {
            assert_eq!(kind(raw), K::Port, "{raw}");
        }
        for raw in [
            "https://h.example:0/r",
            "https://h.example:0443/r",
            "https://h.example:+443/r",
            "https://h.example:-443/r",
            "https://h.example:99999/r",
            "https://h.example:x/r",
            "https://h.example:/r",
            "https://h.example:443:443/r",
        ] {
            assert_eq!(kind(raw), K::Shape, "{raw}");
        }
    }

    #[test]
    fn hosts_that_are_not_plain_names() {
        for raw in [
            "https://127.0.0.1/o/r",
            "https://[::1]/o/r",
            "https://[::1]:443/o/r",
            "https://[::ffff:127.0.0.1]/o/r",
            "https://2130706433/o/r",
            "https://0x7f.1/o/r",
            "https://github%2ecom/o/r",
            "https://githu%62.com/o/r",
            "https://[fe80::1%25eth0]/o/r",
            "https://a..b/o/r",
            "https://-a.example/o/r",
            "https://a-.example/o/r",
            "https://host.example../o/r",
            "https://[::1/o/r",
            "git@127.0.0.1:o/r",
            "git@exa_mple%2e.com:o/r",
        ] {
            assert_eq!(kind(raw), K::Host, "{raw}");
        }
    }

    #[test]
    fn transports_paths_and_characters() {
        for (raw, expected) in [
            ("", K::Empty),
            ("http://github.com/o/r", K::Transport),
            ("git://github.com/o/r", K::Transport),
            ("file:///etc/passwd", K::Transport),
            ("ssh+git://github.com/o/r", K::Transport),
            ("ext::sh", K::Transport),
            ("fd::3", K::Transport),
            ("ext::sh -c touch% /tmp/x", K::Characters),
            ("/srv/repo.git", K::Local),
            ("./repo", K::Local),
            ("~/repo", K::Local),
            ("repo", K::Local),
            ("a/b:c", K::Local),
            ("-uhttps://github.com/o/r", K::Option),
            ("--upload-pack=touch /tmp/x", K::Characters),
            ("https://github.com", K::Shape),
            ("https://github.com/", K::Shape),
            ("https://github.com//o/r", K::Shape),
            ("https://github.com#@evil.example/o/r", K::Shape),
            ("https://github.com?@evil.example/o/r", K::Shape),
            ("https://github.com\\@evil.example/o/r", K::Shape),
            ("github.com:o/r", K::Shape),
            ("git@github.com:-oProxyCommand=x", K::Shape),
            ("git@github.com:", K::Shape),
            ("git:pw@github.com:o/r", K::Shape),
            ("https://github.com/o/r\n", K::Characters),
            ("https://github.com/o r", K::Characters),
            ("https://github.com/o/r\t", K::Characters),
            ("https://github.com/o/r\u{0}", K::Characters),
            ("https://github.com/o/r\u{7f}", K::Characters),
            ("https://github.com/o/r\u{200b}", K::Characters),
            ("https://github.com/o/\u{e9}", K::Characters),
        ] {
            assert_eq!(kind(raw), expected, "{raw:?}");
        }
    }

    #[test]
    fn a_refusal_never_repeats_credentials() {
        for raw in [
            "https://me:s3cret@github.com",
            "https://me:s3cret@github.com:8443/o/r",
            "https://me:s3cret@github.com//o/r",
        ] {
            let err = GitUrl::parse(raw).unwrap_err();
            assert!(!err.message.contains("s3cret"), "{raw}: {err}");
        }
    }

    #[test]
    fn records_read_back_through_the_same_parser() {
        let url: GitUrl = serde_json::from_str("\"git@github.com:o/r.git\"").unwrap();
        assert_eq!(url.host(), "github.com");
        assert!(serde_json::from_str::<GitUrl>("\"ext::sh\"").is_err());
        assert!(serde_json::from_str::<GitUrl>("\"https://127.0.0.1/o/r\"").is_err());
    }
}
