//! The egress policy: which host and port pairs a sandbox may reach, and what protocol the
//! proxy checks on each. A policy only ever allows; everything not allowed is refused.

use std::fmt;

use serde::Serialize;

use crate::host::{HostPattern, PatternError};

/// What a rule admits on its port; the proxy checks the client's first bytes against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TLS with an SNI equal to the CONNECT host (HTTPS, git over HTTPS).
    Tls,
    /// An SSH-2.0 version exchange (git over SSH).
    Ssh,
}

impl Protocol {
    /// The port a rule of this protocol uses unless it says otherwise.
    pub fn default_port(self) -> u16 {
        match self {
            Protocol::Tls => 443,
            Protocol::Ssh => 22,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tls => "tls",
            Protocol::Ssh => "ssh",
        })
    }
}

/// One allowed destination.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub host: HostPattern,
    pub port: u16,
    pub protocol: Protocol,
}

impl Rule {
    /// HTTPS to `host` on 443.
    pub fn https(host: HostPattern) -> Rule {
        Rule {
            host,
            port: 443,
            protocol: Protocol::Tls,
        }
    }

    /// SSH to `host` on 22.
    pub fn ssh(host: HostPattern) -> Rule {
        Rule {
            host,
            port: 22,
            protocol: Protocol::Ssh,
        }
    }
}

impl fmt::Display for Rule {
    /// `host` for HTTPS on 443 (the common case, as users write it), else `host:port (ssh)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.protocol == Protocol::Tls && self.port == 443 {
            write!(f, "{}", self.host)
        } else {
            write!(f, "{}:{} ({})", self.host, self.port, self.protocol)
        }
    }
}

/// The rules of one sandbox phase. Serialises as the list of rules.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Policy {
    rules: Vec<Rule>,
}

impl Policy {
    /// Allows nothing.
    pub fn deny_all() -> Policy {
        Policy::default()
    }

    /// HTTPS on 443 to each entry (`example.com`, `*.example.com`, or a named registry such
    /// as `@pypi`: see [`HostPattern::parse_entry`]).
    pub fn https_hosts<S: AsRef<str>>(entries: &[S]) -> Result<Policy, PatternError> {
        let mut policy = Policy::deny_all();
        for entry in entries {
            for pattern in HostPattern::parse_entry(entry.as_ref())? {
                policy.push(Rule::https(pattern));
            }
        }
        Ok(policy)
    }

    /// Adds a rule; a rule equal to one already present is not added twice.
    pub fn push(&mut self, rule: Rule) {
        if !self.rules.contains(&rule) {
            self.rules.push(rule);
        }
    }

    /// The protocol to check for `host:port`, if a rule allows it. `host` is canonical (see
    /// [`crate::normalize_host`]).
    pub fn allows(&self, host: &str, port: u16) -> Option<Protocol> {
        self.rule_for(host, port).map(|rule| rule.protocol)
    }

    /// The first rule that allows `host:port` (canonical host).
    pub fn rule_for(&self, host: &str, port: u16) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|rule| rule.port == port && rule.host.matches(host))
    }

    /// The ports some rule allows for `host`, for refusals that say which port would work.
    pub fn ports_for(&self, host: &str) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .rules
            .iter()
            .filter(|rule| rule.host.matches(host))
            .map(|rule| rule.port)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

impl fmt::Display for Policy {
    /// `registry.npmjs.org, github.com, github.com:22 (ssh)`, or `nothing` for deny-all.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rules.is_empty() {
            return f.write_str("nothing");
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{rule}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(s: &str) -> HostPattern {
        HostPattern::parse(s).unwrap()
    }

    #[test]
    fn deny_all_allows_nothing() {
        let policy = Policy::deny_all();
        assert_eq!(policy.allows("example.com", 443), None);
        assert_eq!(policy.to_string(), "nothing");
        assert!(policy.is_empty());
    }

    #[test]
    fn rules_match_host_and_port() {
        let mut policy = Policy::https_hosts(&["registry.npmjs.org", "*.github.com"]).unwrap();
        policy.push(Rule::ssh(pattern("github.com")));
        policy.push(Rule::ssh(pattern("github.com")));
        assert_eq!(policy.rules().len(), 3, "duplicates are not added");
        assert_eq!(
            policy.allows("registry.npmjs.org", 443),
            Some(Protocol::Tls)
        );
        assert_eq!(policy.allows("registry.npmjs.org", 80), None);
        assert_eq!(
            policy.allows("codeload.github.com", 443),
            Some(Protocol::Tls)
        );
        assert_eq!(policy.allows("github.com", 443), None);
        assert_eq!(policy.allows("github.com", 22), Some(Protocol::Ssh));
        assert_eq!(policy.allows("evil.com", 443), None);
        assert_eq!(policy.ports_for("github.com"), vec![22]);
        assert_eq!(policy.ports_for("evil.com"), Vec::<u16>::new());
        assert_eq!(
            policy.to_string(),
            "registry.npmjs.org, *.github.com, github.com:22 (ssh)"
        );
    }

    #[test]
    fn https_hosts_reports_the_bad_entry() {
        let err = Policy::https_hosts(&["ok.example", "*.com"]).unwrap_err();
        assert!(err.to_string().contains("\"*.com\""), "{err}");
    }

    #[test]
    fn https_hosts_expands_named_registries() {
        let policy = Policy::https_hosts(&["@pypi", "pypi.org"]).unwrap();
        assert_eq!(policy.to_string(), "pypi.org, files.pythonhosted.org");
        assert_eq!(
            policy.allows("files.pythonhosted.org", 443),
            Some(Protocol::Tls)
        );
        let err = Policy::https_hosts(&["@foo"]).unwrap_err();
        assert!(
            err.to_string().contains("the named registries are @npm"),
            "{err}"
        );
    }

    #[test]
    fn policy_serialises_as_a_rule_list() {
        let mut policy = Policy::https_hosts(&["a.example"]).unwrap();
        policy.push(Rule::ssh(pattern("git.example")));
        assert_eq!(
            serde_json::to_string(&policy).unwrap(),
            r#"[{"host":"a.example","port":443,"protocol":"tls"},{"host":"git.example","port":22,"protocol":"ssh"}]"#
        );
    }
}
