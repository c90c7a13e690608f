//! Reaching the upstream: resolve once (or take the operator's override), keep only public
//! addresses, and connect to one of exactly those. The proxy calls this only for a tunnel
//! whose first bytes it has judged allowed. Nothing is resolved again after the check,
//! so a DNS answer that changes between check and connect cannot redirect the connection.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};

use crate::addr::{classify, AddrClass};
use crate::resolve::{ResolveOverrides, RESOLVE_ENV};
use crate::tls::Alert;

/// An open upstream connection.
pub(crate) struct Upstream {
    pub stream: TcpStream,
    pub addr: SocketAddr,
    /// Whether the address came from a resolve override (not class-checked).
    pub overridden: bool,
}

/// Why no upstream connection was made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    #[error("{host} could not be resolved: {err}")]
    Resolve { host: String, err: io::Error },
    #[error("{host} did not resolve within {secs} s")]
    ResolveTimeout { host: String, secs: u64 },
    #[error("{host} has no addresses")]
    NoAddresses { host: String },
    /// What the person running DynoCap can do is said too: name the address (a mirror they
    /// trust) in the resolve override, which is not class-checked.
    #[error("{host} resolves to {class} ({ip}){more}; only public addresses are reachable, unless the person running DynoCap names the address of a mirror they trust in {RESOLVE_ENV} ({host}:{port}:{addr})", addr = override_addr(ip))]
    NotPublic {
        host: String,
        port: u16,
        class: AddrClass,
        ip: std::net::IpAddr,
        more: String,
    },
    #[error("could not connect to {host} at {addr}: {err}")]
    Connect {
        host: String,
        addr: SocketAddr,
        err: io::Error,
    },
    #[error("could not connect to {host} within {secs} s (tried {addr})")]
    ConnectTimeout {
        host: String,
        addr: SocketAddr,
        secs: u64,
    },
}

/// `ip` as a resolve override spells it: an IPv6 address in brackets.
fn override_addr(ip: &std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

impl UpstreamError {
    /// The TLS alert a TLS client gets: the connection comes after its ClientHello, so the
    /// 200 is long sent and an HTTP status cannot say it any more.
    pub(crate) fn alert(&self) -> Alert {
        match self {
            UpstreamError::NotPublic { .. } => Alert::AccessDenied,
            _ => Alert::InternalError,
        }
    }

    /// The address the refusal concerns, for the decision log.
    pub(crate) fn addr(&self, port: u16) -> Option<SocketAddr> {
        match self {
            UpstreamError::NotPublic { ip, .. } => Some(SocketAddr::new(*ip, port)),
            UpstreamError::Connect { addr, .. } | UpstreamError::ConnectTimeout { addr, .. } => {
                Some(*addr)
            }
            _ => None,
        }
    }
}

/// Connects to `host:port` (canonical host) within `limit`, resolution included.
pub(crate) async fn connect(
    host: &str,
    port: u16,
    overrides: &ResolveOverrides,
    limit: Duration,
) -> Result<Upstream, UpstreamError> {
    let deadline = Instant::now() + limit;
    let secs = limit.as_secs();
    let (candidates, overridden) = match overrides.lookup(host, port) {
        Some(addrs) => (addrs.to_vec(), true),
        None => (resolve_public(host, port, limit).await?, false),
    };
    let mut last_err = None;
    for addr in candidates {
        match timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                // Small writes (TLS handshakes, git's pkt-lines) must not wait for Nagle.
                stream
                    .set_nodelay(true)
                    .map_err(|err| UpstreamError::Connect {
                        host: host.to_owned(),
                        addr,
                        err,
                    })?;
                return Ok(Upstream {
                    stream,
                    addr,
                    overridden,
                });
            }
            Ok(Err(err)) => {
                last_err = Some(UpstreamError::Connect {
                    host: host.to_owned(),
                    addr,
                    err,
                })
            }
            Err(_) => {
                return Err(UpstreamError::ConnectTimeout {
                    host: host.to_owned(),
                    addr,
                    secs,
                })
            }
        }
    }
    Err(last_err.unwrap_or_else(|| UpstreamError::NoAddresses {
        host: host.to_owned(),
    }))
}

/// Resolves `host` and keeps the public addresses, or says which class the first of the
/// others is.
async fn resolve_public(
    host: &str,
    port: u16,
    limit: Duration,
) -> Result<Vec<SocketAddr>, UpstreamError> {
    let resolved: Vec<SocketAddr> =
        match timeout(limit, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(addrs)) => addrs.collect(),
            Ok(Err(err)) => {
                return Err(UpstreamError::Resolve {
                    host: host.to_owned(),
                    err,
                })
            }
            Err(_) => {
                return Err(UpstreamError::ResolveTimeout {
                    host: host.to_owned(),
                    secs: limit.as_secs(),
                })
            }
        };
    let (public, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = resolved
        .into_iter()
        .partition(|addr| classify(addr.ip()).is_public());
    if !public.is_empty() {
        return Ok(public);
    }
    let Some(first) = refused.first() else {
        return Err(UpstreamError::NoAddresses {
            host: host.to_owned(),
        });
    };
    let more = match refused.len() - 1 {
        0 => String::new(),
        n => format!(
            " and {n} more non-public address{}",
            if n == 1 { "" } else { "es" }
        ),
    };
    Err(UpstreamError::NotPublic {
        host: host.to_owned(),
        port,
        class: classify(first.ip()),
        ip: first.ip(),
        more,
    })
}
