//! Host names: one canonical spelling for every name the proxy compares (allowlist entries,
//! CONNECT hosts, TLS SNI, resolve overrides), and allowlist patterns over it.
//!
//! Canonical means UTS 46 (IDNA) mapped to ASCII, lowercase, one trailing dot dropped. Two
//! spellings of one name therefore compare equal ("Bücher.example." == "xn--bcher-kva.example"),
//! and a spelling that a resolver might read as an IPv4 address is not a name at all.
//!
//! An allowlist entry may also name a package registry (`@pypi`): [`HostPattern::REGISTRIES`]
//! is the one table of the hosts each ecosystem's own client reaches, and
//! [`HostPattern::parse_entry`] the one parser of entries, which every allowlist uses.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde::{Serialize, Serializer};

/// Longest DNS name in presentation form, without the trailing dot.
const MAX_NAME_LEN: usize = 253;
/// Longest DNS label.
const MAX_LABEL_LEN: usize = 63;

/// Why a string is not a host name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("{0:?} is an IP address; only host names are allowed")]
    IpAddress(String),
    #[error(
        "{0:?} looks like an IPv4 address in a non-standard spelling; only host names are allowed"
    )]
    NumericName(String),
    #[error("{0:?} is not a valid host name: {1}")]
    Invalid(String, &'static str),
}

/// Canonical spelling of a host name, or why it is not one. IP literals (v4 dotted, v6 with or
/// without brackets) are refused as [`HostError::IpAddress`].
pub fn normalize_host(raw: &str) -> Result<String, HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    let unbracketed = raw
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(raw);
    if unbracketed.parse::<Ipv6Addr>().is_ok() {
        return Err(HostError::IpAddress(raw.to_owned()));
    }
    let trimmed = raw.strip_suffix('.').unwrap_or(raw);
    if trimmed.parse::<Ipv4Addr>().is_ok() {
        return Err(HostError::IpAddress(raw.to_owned()));
    }
    if trimmed.is_empty() {
        return Err(HostError::Invalid(raw.to_owned(), "it has no labels"));
    }
    if trimmed.contains('%') {
        return Err(HostError::Invalid(
            raw.to_owned(),
            "'%' (percent-encoding or a zone id) is not allowed",
        ));
    }
    // URL's deny list refuses the characters that would make the name mean something else
    // in a URL or a request line (':', '/', '@', '[', ...), so they can never reach a resolver.
    let ascii = idna::domain_to_ascii_cow(trimmed.as_bytes(), idna::AsciiDenyList::URL)
        .map_err(|_| HostError::Invalid(raw.to_owned(), "IDNA (UTS 46) mapping failed"))?;
    if ascii.len() > MAX_NAME_LEN {
        return Err(HostError::Invalid(
            raw.to_owned(),
            "longer than 253 characters",
        ));
    }
    for label in ascii.split('.') {
        if label.is_empty() {
            return Err(HostError::Invalid(raw.to_owned(), "it has an empty label"));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(HostError::Invalid(
                raw.to_owned(),
                "a label is longer than 63 characters",
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(HostError::Invalid(
                raw.to_owned(),
                "a label starts or ends with '-'",
            ));
        }
        let ok = label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(HostError::Invalid(
                raw.to_owned(),
                "only letters, digits, '-' and '_' are allowed in labels",
            ));
        }
    }
    // inet_aton (and so getaddrinfo) reads "2130706433", "0x7f.1" and "127.1" as IPv4
    // addresses; a name whose last label is numeric would bypass the raw-IP refusal.
    if ascii
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x"))
    {
        return Err(HostError::NumericName(raw.to_owned()));
    }
    Ok(ascii.into_owned())
}

/// Why an allowlist entry was refused. Each message names the entry and says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("allowlist entry {entry:?}: {problem}; write a host name such as example.com or *.example.com")]
    Entry { entry: String, problem: String },
    /// `@name` where no registry has that name.
    #[error(
        "allowlist entry {entry:?}: there is no registry named {entry}; the named registries \
         are {}",
        registry_names()
    )]
    UnknownRegistry { entry: String },
    /// `@name:port`: a named registry's hosts are reached on 443, as every allowlist host.
    #[error(
        "allowlist entry {entry:?}: a named registry takes no port; write @{name}, which \
         stands for its hosts on port 443"
    )]
    RegistryWithPort { entry: String, name: String },
    /// `@name` given where one host is expected (a clone's host), not a list.
    #[error(
        "allowlist entry {entry:?} names a registry of several hosts; give one host name here, \
         such as example.com"
    )]
    RegistryNotAHost { entry: String },
}

/// `@npm, @pypi, ...`: the names an unknown one is told about.
fn registry_names() -> String {
    HostPattern::REGISTRIES
        .iter()
        .map(|(name, _)| format!("@{name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pattern_error(entry: &str, problem: impl Into<String>) -> PatternError {
    PatternError::Entry {
        entry: entry.to_owned(),
        problem: problem.into(),
    }
}

/// One allowlist host: an exact name, or `*.suffix`, which matches names below `suffix` but
/// not `suffix` itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPattern {
    /// The canonical name, or for a wildcard the canonical suffix after `*.`.
    name: String,
    wildcard: bool,
}

impl HostPattern {
    /// The named registries an allowlist entry `@name` stands for, and the hosts each
    /// ecosystem's own client reaches over HTTPS to resolve and download packages:
    /// - `npm`: the registry's metadata and tarballs, as npm and pnpm reach it and as yarn
    ///   does by default (registry.yarnpkg.com, the same registry under yarn's name);
    /// - `pypi`: the simple index and JSON API (pypi.org), the files (files.pythonhosted.org);
    /// - `crates`: the sparse index, the downloads it points at (static.crates.io) and the
    ///   API whose download URLs redirect there (crates.io);
    /// - `go`: the module proxy, the checksum database `go` checks every module against, and
    ///   the Cloud Storage host the proxy answers many `.zip` downloads with a `302` to
    ///   (storage.googleapis.com: without it `go mod download` fails on the redirect);
    /// - `debian`: the archive and security updates (deb.debian.org also serves
    ///   debian-security) for apt with `https://` sources;
    /// - `rubygems`: the gem downloads (rubygems.org) and bundler's compact index;
    /// - `maven`: Maven Central, by the name Maven uses and by the older one Gradle and
    ///   sbt use.
    pub const REGISTRIES: &'static [(&'static str, &'static [&'static str])] = &[
        ("npm", &["registry.npmjs.org", "registry.yarnpkg.com"]),
        ("pypi", &["pypi.org", "files.pythonhosted.org"]),
        (
            "crates",
            &["index.crates.io", "static.crates.io", "crates.io"],
        ),
        (
            "go",
            &[
                "proxy.golang.org",
                "sum.golang.org",
                "storage.googleapis.com",
            ],
        ),
        ("debian", &["deb.debian.org", "security.debian.org"]),
        ("rubygems", &["rubygems.org", "index.rubygems.org"]),
        ("maven", &["repo.maven.apache.org", "repo1.maven.org"]),
    ];

    /// Hosts of a named registry that serve much besides it: Google Cloud Storage serves
    /// every public bucket, not only the Go module proxy's zips. A refusal of one of them
    /// suggests allowing that host alone (see [`HostPattern::registry_of`]), since the one
    /// who was refused may want a bucket, not Go modules.
    pub const SHARED_HOSTS: &'static [&'static str] = &["storage.googleapis.com"];

    /// The named registry `host` (canonical) belongs to, for a refusal to suggest instead
    /// of the host, so that the registry's other hosts come with it: `None` for a host no
    /// registry names and for one in [`HostPattern::SHARED_HOSTS`].
    pub fn registry_of(host: &str) -> Option<(&'static str, &'static [&'static str])> {
        if HostPattern::SHARED_HOSTS.contains(&host) {
            return None;
        }
        HostPattern::REGISTRIES
            .iter()
            .find(|(_, hosts)| hosts.contains(&host))
            .copied()
    }

    /// Parses one allowlist entry: a host pattern (see [`HostPattern::parse`]) or a named
    /// registry (`@pypi`, case-insensitive), which stands for its hosts in
    /// [`HostPattern::REGISTRIES`]. An unknown `@name` is refused with the known names.
    pub fn parse_entry(entry: &str) -> Result<Vec<HostPattern>, PatternError> {
        let Some(name) = entry.trim().strip_prefix('@') else {
            return HostPattern::parse(entry).map(|pattern| vec![pattern]);
        };
        let known = |name: &str| {
            HostPattern::REGISTRIES
                .iter()
                .find(|(known, _)| known.eq_ignore_ascii_case(name))
        };
        if let Some((name, _)) = name.split_once(':').and_then(|(base, _)| known(base)) {
            return Err(PatternError::RegistryWithPort {
                entry: entry.trim().to_owned(),
                name: (*name).to_owned(),
            });
        }
        let hosts =
            known(name)
                .map(|(_, hosts)| *hosts)
                .ok_or_else(|| PatternError::UnknownRegistry {
                    entry: entry.trim().to_owned(),
                })?;
        hosts.iter().map(|host| HostPattern::parse(host)).collect()
    }

    /// Parses an allowlist entry naming one host: `example.com`, `Bücher.example.`,
    /// `*.example.com`. A named registry (`@pypi`) is refused here: it stands for several
    /// hosts, which [`HostPattern::parse_entry`] gives.
    pub fn parse(entry: &str) -> Result<HostPattern, PatternError> {
        let entry_trimmed = entry.trim();
        if entry_trimmed.is_empty() {
            return Err(pattern_error(entry, "the entry is empty"));
        }
        if entry_trimmed.starts_with('@') {
            return Err(PatternError::RegistryNotAHost {
                entry: entry_trimmed.to_owned(),
            });
        }
        if entry_trimmed.contains("://") || entry_trimmed.contains('/') {
            return Err(pattern_error(
                entry,
                "give the host only, without a scheme or a path",
            ));
        }
        let (wildcard, rest) = match entry_trimmed.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, entry_trimmed),
        };
        if rest.contains('*') {
            return Err(pattern_error(
                entry,
                "'*' is allowed only as the whole first label, as in *.example.com",
            ));
        }
        let name = normalize_host(rest).map_err(|err| match err {
            HostError::IpAddress(_) | HostError::NumericName(_) => {
                pattern_error(entry, "IP addresses cannot be allowlisted")
            }
            HostError::Invalid(_, why) if rest.contains(':') && !rest.starts_with('[') => {
                pattern_error(entry, format!("remove the port ({why})"))
            }
            other => pattern_error(entry, other.to_string()),
        })?;
        if wildcard && !name.contains('.') {
            return Err(pattern_error(
                entry,
                "a wildcard needs at least two labels after '*.' (it would cover a whole top-level domain)",
            ));
        }
        Ok(HostPattern { name, wildcard })
    }

    /// Whether `host` (already canonical, see [`normalize_host`]) matches.
    pub fn matches(&self, host: &str) -> bool {
        if !self.wildcard {
            return host == self.name;
        }
        host.strip_suffix(self.name.as_str())
            .and_then(|prefix| prefix.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty())
    }

    /// Whether this is a `*.` pattern.
    pub fn is_wildcard(&self) -> bool {
        self.wildcard
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            write!(f, "*.{}", self.name)
        } else {
            f.write_str(&self.name)
        }
    }
}

impl std::str::FromStr for HostPattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostPattern::parse(s)
    }
}

impl Serialize for HostPattern {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_canonical() {
        assert_eq!(normalize_host("Example.COM."), Ok("example.com".to_owned()));
        assert_eq!(
            normalize_host("bücher.example"),
            Ok("xn--bcher-kva.example".to_owned())
        );
        assert_eq!(
            normalize_host("BÜCHER.example."),
            Ok("xn--bcher-kva.example".to_owned())
        );
        assert_eq!(
            normalize_host("xn--bcher-kva.example"),
            Ok("xn--bcher-kva.example".to_owned())
        );
        assert_eq!(
            normalize_host("_dmarc.example.com"),
            Ok("_dmarc.example.com".to_owned())
        );
    }

    #[test]
    fn ip_literals_and_numeric_names_are_not_names() {
        for ip in [
            "127.0.0.1",
            "10.0.0.1.",
            "::1",
            "[::1]",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(
                matches!(normalize_host(ip), Err(HostError::IpAddress(_))),
                "{ip}"
            );
        }
        for n in ["2130706433", "127.1", "0x7f.1", "example.0x7f"] {
            assert!(
                matches!(normalize_host(n), Err(HostError::NumericName(_))),
                "{n}"
            );
        }
    }

    #[test]
    fn one_spelling_per_name_whatever_the_writer_chose() {
        for spelling in [
            "GitHub.COM",
            "github.com.",
            "GITHUB.COM.",
            "ｇｉｔｈｕｂ.com",
            "github\u{3002}com",
        ] {
            assert_eq!(
                normalize_host(spelling).as_deref(),
                Ok("github.com"),
                "{spelling:?}"
            );
        }
        for refused in [
            "github.com..",
            "[fe80::1%25eth0]",
            "fe80::1%eth0",
            "[::ffff:7f00:1]",
            "127.0.0.1.",
            "github.com\u{0}",
            "git hub.com",
        ] {
            assert!(normalize_host(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn malformed_names_are_refused() {
        for bad in [
            "",
            ".",
            "a..b",
            ".example.com",
            "-a.example",
            "a-.example",
            "exa mple.com",
            "example.com:443",
            "user@example.com",
            "a/b",
            "a%2eb",
            &"a".repeat(64),
            &format!("{}.com", "a.".repeat(130)),
        ] {
            assert!(normalize_host(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn exact_patterns_match_the_name_only() {
        let p = HostPattern::parse("Registry.NPMJS.org.").unwrap();
        assert_eq!(p.to_string(), "registry.npmjs.org");
        assert!(p.matches("registry.npmjs.org"));
        assert!(!p.matches("www.registry.npmjs.org"));
        assert!(!p.matches("npmjs.org"));
        assert!(!p.is_wildcard());
    }

    #[test]
    fn idna_patterns_match_either_spelling() {
        let unicode = HostPattern::parse("bücher.example").unwrap();
        let ascii = HostPattern::parse("xn--bcher-kva.example").unwrap();
        assert_eq!(unicode, ascii);
        assert!(unicode.matches(&normalize_host("BÜCHER.example").unwrap()));
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        let p = HostPattern::parse("*.Example.com").unwrap();
        assert!(p.is_wildcard());
        assert_eq!(p.to_string(), "*.example.com");
        assert!(p.matches("a.example.com"));
        assert!(p.matches("a.b.example.com"));
        assert!(!p.matches("example.com"));
        assert!(!p.matches("badexample.com"));
        assert!(!p.matches("example.com.evil.org"));
        assert!(!p.matches(".example.com"));
    }

    #[test]
    fn bad_patterns_name_the_entry_and_the_fix() {
        let cases = [
            ("", "empty"),
            ("*", "'*' is allowed only"),
            ("*.com", "at least two labels"),
            ("foo.*.com", "'*' is allowed only"),
            ("*example.com", "'*' is allowed only"),
            ("https://example.com", "without a scheme"),
            ("example.com/path", "without a scheme"),
            ("example.com:443", "remove the port"),
            ("10.0.0.1", "IP addresses cannot be allowlisted"),
            ("[2001:db8::1]", "IP addresses cannot be allowlisted"),
            ("exa mple.com", "not a valid host name"),
        ];
        for (entry, fragment) in cases {
            let message = HostPattern::parse(entry).unwrap_err().to_string();
            assert!(message.contains(fragment), "{entry:?}: {message}");
            assert!(message.contains(&format!("{entry:?}")), "{message}");
            assert!(message.contains("such as example.com"), "{message}");
        }
    }

    #[test]
    fn named_registries_stand_for_their_hosts() {
        let hosts = |entry: &str| -> Vec<String> {
            HostPattern::parse_entry(entry)
                .unwrap()
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(hosts("@pypi"), ["pypi.org", "files.pythonhosted.org"]);
        assert_eq!(hosts(" @PyPI "), ["pypi.org", "files.pythonhosted.org"]);
        assert_eq!(
            hosts("@npm"),
            ["registry.npmjs.org", "registry.yarnpkg.com"]
        );
        assert_eq!(
            hosts("@crates"),
            ["index.crates.io", "static.crates.io", "crates.io"]
        );
        assert_eq!(
            hosts("@go"),
            [
                "proxy.golang.org",
                "sum.golang.org",
                "storage.googleapis.com"
            ]
        );
        assert_eq!(hosts("@debian"), ["deb.debian.org", "security.debian.org"]);
        assert_eq!(hosts("@rubygems"), ["rubygems.org", "index.rubygems.org"]);
        assert_eq!(
            hosts("@maven"),
            ["repo.maven.apache.org", "repo1.maven.org"]
        );
        assert_eq!(
            HostPattern::registry_of("files.pythonhosted.org").map(|(name, _)| name),
            Some("pypi")
        );
        assert_eq!(HostPattern::registry_of("storage.googleapis.com"), None);
        assert_eq!(HostPattern::registry_of("example.com"), None);
        for shared in HostPattern::SHARED_HOSTS {
            assert!(
                HostPattern::REGISTRIES
                    .iter()
                    .any(|(_, hosts)| hosts.contains(shared)),
                "{shared} is in no registry"
            );
        }
        // A port is refused naming the entry to write; an unknown name with one is unknown.
        for entry in ["@pypi:443", "@PyPI:8443"] {
            let err = HostPattern::parse_entry(entry).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "allowlist entry {entry:?}: a named registry takes no port; write @pypi, \
                     which stands for its hosts on port 443"
                )
            );
        }
        assert!(matches!(
            HostPattern::parse_entry("@foo:443"),
            Err(PatternError::UnknownRegistry { .. })
        ));
        // A plain entry is one pattern, as parse gives it.
        assert_eq!(hosts("*.Example.com"), ["*.example.com"]);
        // Every table entry is a canonical host name: parsed as written.
        for (name, table) in HostPattern::REGISTRIES {
            assert_eq!(&hosts(&format!("@{name}")), table, "@{name}");
            assert!(name.bytes().all(|b| b.is_ascii_lowercase()), "{name}");
        }
    }

    /// The README and docs/network.md give each registry's hosts: the table here, row by row.
    #[test]
    fn the_docs_list_each_registrys_hosts_as_the_table_has_them() {
        let docs = [
            ("README.md", include_str!("../../../README.md")),
            ("docs/network.md", include_str!("../../../docs/network.md")),
        ];
        for (file, text) in docs {
            for (name, hosts) in HostPattern::REGISTRIES {
                let cells: Vec<String> = hosts.iter().map(|h| format!("`{h}`")).collect();
                let row = format!("| `@{name}` | {} |", cells.join(", "));
                assert!(
                    text.lines().any(|line| line.starts_with(&row)),
                    "{file} has no row {row:?}"
                );
            }
        }
    }

    #[test]
    fn unknown_registries_are_refused_with_the_known_names() {
        for entry in ["@foo", "@", "@pypi.org", "@ npm"] {
            let message = HostPattern::parse_entry(entry).unwrap_err().to_string();
            assert_eq!(
                message,
                format!(
                    "allowlist entry {entry:?}: there is no registry named {entry}; the named \
                     registries are @npm, @pypi, @crates, @go, @debian, @rubygems, @maven"
                )
            );
        }
        // Where one host is expected, a registry is not one.
        let message = HostPattern::parse("@pypi").unwrap_err().to_string();
        assert_eq!(
            message,
            "allowlist entry \"@pypi\" names a registry of several hosts; give one host name \
             here, such as example.com"
        );
        assert!(HostPattern::parse_entry("exa mple.com").is_err());
    }

    #[test]
    fn patterns_serialise_as_strings() {
        let p: HostPattern = "*.github.com".parse().unwrap();
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"*.github.com\"");
    }
}
