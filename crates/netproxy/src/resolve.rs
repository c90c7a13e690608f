//! Resolve overrides: the operator's explicit "this name is at that address", in curl's
//! `--resolve` syntax, for mirrors and tests. An override replaces DNS for its host and port,
//! and its addresses skip the address-class check: naming an address is the permission.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::host::normalize_host;

/// The environment variable whose value, read by the binary at its edge, is parsed with
/// [`ResolveOverrides::parse`] (this crate reads no environment).
pub const RESOLVE_ENV: &str = "DYNOCAP_RESOLVE";

const SYNTAX: &str = "the syntax is host:port:address[,address...][,host:port:address...], \
                      e.g. registry.example:443:127.0.0.1 or mirror.example:443:[::1]";

/// Why an override list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resolve override {entry:?}: {problem}; {SYNTAX}")]
pub struct OverrideError {
    pub entry: String,
    pub problem: String,
}

fn override_error(entry: &str, problem: impl Into<String>) -> OverrideError {
    OverrideError {
        entry: entry.to_owned(),
        problem: problem.into(),
    }
}

/// Host and port pairs mapped to the socket addresses to connect to instead of resolving.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolveOverrides {
    map: HashMap<(String, u16), Vec<SocketAddr>>,
}

impl ResolveOverrides {
    /// No overrides: every name is resolved by DNS.
    pub fn none() -> ResolveOverrides {
        ResolveOverrides::default()
    }

    /// Parses `host:port:addr[,addr...][,host:port:addr...]`. An item that is an address
    /// alone adds it to the entry before it, as curl does; IPv6 addresses go in brackets.
    pub fn parse(spec: &str) -> Result<ResolveOverrides, OverrideError> {
        let mut overrides = ResolveOverrides::none();
        let mut last: Option<(String, u16)> = None;
        for item in spec.split(',').map(str::trim) {
            if item.is_empty() {
                continue;
            }
            if let Some(ip) = parse_addr(item) {
                let Some(key) = &last else {
                    return Err(override_error(
                        item,
                        "an address without a host:port before it",
                    ));
                };
                let port = key.1;
                overrides.push(key.clone(), SocketAddr::new(ip, port));
                continue;
            }
            let (host, port, addr) = split_entry(item)?;
            let key = (host, port);
            overrides.push(key.clone(), SocketAddr::new(addr, port));
            last = Some(key);
        }
        Ok(overrides)
    }

    /// Maps `host:port` to `target`, whose port may differ from `port`. This is for
    /// embedders and tests (a test server cannot bind 443); the text syntax cannot express it.
    pub fn insert(
        &mut self,
        host: &str,
        port: u16,
        target: SocketAddr,
    ) -> Result<(), OverrideError> {
        let host = normalize_host(host).map_err(|err| override_error(host, err.to_string()))?;
        self.push((host, port), target);
        Ok(())
    }

    /// The addresses for `host:port` (canonical host), if overridden.
    pub fn lookup(&self, host: &str, port: u16) -> Option<&[SocketAddr]> {
        self.map.get(&(host.to_owned(), port)).map(Vec::as_slice)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn push(&mut self, key: (String, u16), addr: SocketAddr) {
        let addrs = self.map.entry(key).or_default();
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
}

/// `1.2.3.4` or `[v6]`.
fn parse_addr(text: &str) -> Option<IpAddr> {
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    text.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn split_entry(item: &str) -> Result<(String, u16, IpAddr), OverrideError> {
    let mut parts = item.splitn(3, ':');
    let (Some(host), Some(port), Some(addr)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(override_error(item, "expected three ':'-separated fields"));
    };
    if host == "*" || host.starts_with('+') || host.starts_with('-') {
        return Err(override_error(
            item,
            "curl's wildcard ('*'), '+' and '-' forms are not supported; name the host",
        ));
    }
    let host = normalize_host(host).map_err(|err| override_error(item, err.to_string()))?;
    let port = match port.parse::<u16>() {
        Ok(0) | Err(_) => {
            return Err(override_error(
                item,
                format!("{port:?} is not a port (1-65535)"),
            ))
        }
        Ok(port) => port,
    };
    let ip = parse_addr(addr).ok_or_else(|| {
        let hint = if addr.parse::<Ipv6Addr>().is_ok() {
            "put IPv6 addresses in brackets"
        } else {
            "the address is not an IPv4 address or a bracketed IPv6 address"
        };
        override_error(item, format!("{addr:?}: {hint}"))
    })?;
    Ok((host, port, ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sock(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn curl_syntax() {
        let o = ResolveOverrides::parse(
            "Registry.Example.:443:127.0.0.1, mirror.example:443:[::1],127.0.0.2,git.example:22:127.0.0.3",
        )
        .unwrap();
        assert_eq!(
            o.lookup("registry.example", 443),
            Some(&[sock("127.0.0.1:443")][..])
        );
        assert_eq!(
            o.lookup("mirror.example", 443),
            Some(&[sock("[::1]:443"), sock("127.0.0.2:443")][..])
        );
        assert_eq!(
            o.lookup("git.example", 22),
            Some(&[sock("127.0.0.3:22")][..])
        );
        assert_eq!(o.lookup("git.example", 443), None);
        assert_eq!(o.lookup("other.example", 443), None);
    }

    #[test]
    fn idna_hosts_are_canonical() {
        let o = ResolveOverrides::parse("bücher.example:443:127.0.0.1").unwrap();
        assert!(o.lookup("xn--bcher-kva.example", 443).is_some());
    }

    #[test]
    fn empty_means_none() {
        assert!(ResolveOverrides::parse("").unwrap().is_empty());
        assert!(ResolveOverrides::parse(" , ").unwrap().is_empty());
    }

    #[test]
    fn bad_entries_are_refused_with_the_syntax() {
        let cases = [
            ("example.com:443", "three"),
            ("example.com:0:127.0.0.1", "not a port"),
            ("example.com:https:127.0.0.1", "not a port"),
            ("example.com:443:::1", "brackets"),
            ("example.com:443:localhost", "not an IPv4"),
            ("127.0.0.1:443:127.0.0.1", "IP address"),
            ("*:443:127.0.0.1", "wildcard"),
            ("+example.com:443:127.0.0.1", "wildcard"),
            ("127.0.0.1", "without a host:port"),
        ];
        for (spec, fragment) in cases {
            let message = ResolveOverrides::parse(spec).unwrap_err().to_string();
            assert!(message.contains(fragment), "{spec}: {message}");
            assert!(
                message.contains("the syntax is host:port:address"),
                "{message}"
            );
        }
    }

    #[test]
    fn insert_may_redirect_the_port() {
        let mut o = ResolveOverrides::none();
        o.insert("Test.Example", 443, sock("127.0.0.1:40443"))
            .unwrap();
        assert_eq!(
            o.lookup("test.example", 443),
            Some(&[sock("127.0.0.1:40443")][..])
        );
        assert!(o.insert("127.0.0.1", 443, sock("127.0.0.1:1")).is_err());
    }
}
