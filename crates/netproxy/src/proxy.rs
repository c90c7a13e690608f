//! The proxy: one HTTP proxy conversation per client stream, from the request head to the end
//! of the relay, and exactly one [`Decision`] for it.

use std::fmt::Write as _;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::{timeout, Instant};

use crate::decision::{Decision, DecisionSink};
use crate::host::{normalize_host, HostError};
use crate::http::{self, HeadError, Request};
use crate::policy::{Policy, Protocol, Rule};
use crate::relay::{relay, Counts, RelayError};
use crate::resolve::ResolveOverrides;
use crate::sniff;
use crate::splice::relay_sockets;
use crate::tls::{fatal_alert, Alert};
use crate::upstream;
use crate::watch::TlsWatch;

/// Bounds of one conversation. The defaults suit real clients; tests shorten the timeouts.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request head (request line and headers).
    pub max_head: usize,
    /// Time to send the whole request head.
    pub head_timeout: Duration,
    /// Time to resolve and connect upstream.
    pub connect_timeout: Duration,
    /// Time, after the 200, to send the whole ClientHello or SSH version line; nothing is
    /// resolved or connected before they are in and judged.
    pub first_bytes_timeout: Duration,
    /// Largest ClientHello, all its records together.
    pub max_client_hello: usize,
    /// Relay buffer per direction; large buffers keep bulk downloads near loopback speed.
    pub relay_buffer: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_head: 8 * 1024,
            head_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            first_bytes_timeout: Duration::from_secs(30),
            max_client_hello: 64 * 1024,
            relay_buffer: 256 * 1024,
        }
    }
}

/// What the person running the sandbox can set to allow `host` (a canonical name the
/// allowlist does not name): one clause, told to the client and kept in the decision.
pub type AllowHint = fn(host: &str) -> String;

/// The egress proxy of one sandbox. Share it (`Arc`) between the tasks serving connections.
pub struct Proxy {
    policy: RwLock<Arc<Policy>>,
    overrides: ResolveOverrides,
    sink: Arc<dyn DecisionSink>,
    limits: Limits,
    allow_hint: Option<AllowHint>,
}

/// Longest client-supplied host kept in a decision when it is not a valid name.
const MAX_LOGGED_HOST: usize = 255;

/// What the conversation learnt, for its decision.
#[derive(Default)]
struct Facts {
    host: String,
    port: u16,
    addr: Option<std::net::SocketAddr>,
    protocol: Option<Protocol>,
    policy: Option<Arc<Policy>>,
}

/// A refused conversation. `status` is the HTTP answer, or `None` to close without one
/// (the client stopped talking, or the 200 was already sent); then `alert`, if any, tells a
/// TLS client why its handshake ends.
struct Refusal {
    status: Option<u16>,
    alert: Option<Alert>,
    reason: String,
    /// What would allow it, for a host the allowlist does not name (see [`AllowHint`]).
    fix: Option<String>,
    /// Bytes relayed before a refusal that came during the relay.
    counts: Counts,
}

impl Refusal {
    fn http(status: u16, reason: impl Into<String>) -> Refusal {
        Refusal {
            status: Some(status),
            alert: None,
            reason: reason.into(),
            fix: None,
            counts: Counts::default(),
        }
    }

    fn close(reason: impl Into<String>) -> Refusal {
        Refusal {
            status: None,
            alert: None,
            reason: reason.into(),
            fix: None,
            counts: Counts::default(),
        }
    }

    fn with_alert(mut self, alert: Option<Alert>) -> Refusal {
        self.alert = alert;
        self
    }
}

/// An allowed conversation, its upstream connected and its first bytes judged: what the
/// relay starts from.
struct Connected {
    allowed: Allowed,
    upstream: tokio::net::TcpStream,
    /// The client's bytes the proxy read and released, to go upstream first.
    first: Vec<u8>,
    watch: Option<TlsWatch>,
}

/// Why a conversation was allowed, for its decision.
struct Allowed {
    rule: Rule,
    overridden: bool,
}

impl Allowed {
    /// The conversation once its relay ended.
    fn relayed(self, counts: Counts, error: Option<RelayError>) -> Result<Relayed, Refusal> {
        let error = match error {
            // A later ClientHello refused mid-relay: the tunnel is refused after all, with
            // what had passed until then.
            Some(RelayError::Refused(err)) => {
                return Err(Refusal {
                    status: None,
                    alert: err.alert(),
                    reason: err.to_string(),
                    fix: None,
                    counts,
                })
            }
            Some(RelayError::Io(err)) => Some(err),
            None => None,
        };
        Ok(Relayed {
            rule: self.rule,
            overridden: self.overridden,
            counts,
            error,
        })
    }
}

/// When a conversation started, for its decision.
struct Started {
    /// RFC 3339, in UTC.
    time: String,
    instant: Instant,
}

impl Started {
    fn now() -> Started {
        Started {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            instant: Instant::now(),
        }
    }
}

/// An allowed conversation that ran its relay.
struct Relayed {
    rule: Rule,
    overridden: bool,
    counts: Counts,
    error: Option<std::io::Error>,
}

impl Proxy {
    /// A proxy enforcing `policy`, with `overrides` in place of DNS where they apply, recording
    /// every decision in `sink`.
    pub fn new(policy: Policy, overrides: ResolveOverrides, sink: Arc<dyn DecisionSink>) -> Proxy {
        Proxy {
            policy: RwLock::new(Arc::new(policy)),
            overrides,
            sink,
            limits: Limits::default(),
            allow_hint: None,
        }
    }

    /// Tells clients refused for a host the allowlist does not name what would allow it, in
    /// the refusal's status line and body and in the decision.
    pub fn with_allow_hint(mut self, hint: AllowHint) -> Proxy {
        self.allow_hint = Some(hint);
        self
    }

    /// Replaces the default [`Limits`].
    pub fn with_limits(mut self, limits: Limits) -> Proxy {
        self.limits = limits;
        self
    }

    /// Swaps the policy (clone phase to task phase). Conversations already past their
    /// policy check keep the policy they were checked against.
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
    }

    /// The policy new conversations are checked against.
    pub fn policy(&self) -> Arc<Policy> {
        // Only whole `Arc`s are ever stored, so a poisoned lock still holds a valid policy.
        self.policy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Serves one client connection: one HTTP proxy conversation. Records its decision in the
    /// sink and returns it.
    pub async fn serve<S>(&self, mut client: S) -> Decision
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let started = Started::now();
        let mut facts = Facts::default();
        let outcome = match self.converse(&mut client, &mut facts).await {
            Ok(c) => {
                let buffer = self.limits.relay_buffer;
                let (counts, error) =
                    relay(&mut client, c.upstream, &c.first, buffer, c.watch).await;
                c.allowed.relayed(counts, error)
            }
            Err(refusal) => Err(refusal),
        };
        self.decide(&mut client, started, facts, outcome).await
    }

    /// As [`Proxy::serve`], for a client that is a TCP socket of its own: once nothing reads
    /// the tunnel's bytes any more (see `splice.rs`), they move between the two sockets in the
    /// kernel. Refusals, counts and decisions are those of [`Proxy::serve`].
    pub async fn serve_socket(&self, mut client: tokio::net::TcpStream) -> Decision {
        let started = Started::now();
        let mut facts = Facts::default();
        let outcome = match self.converse(&mut client, &mut facts).await {
            Ok(c) => {
                let buffer = self.limits.relay_buffer;
                let (counts, error) =
                    relay_sockets(&client, &c.upstream, &c.first, buffer, c.watch).await;
                c.allowed.relayed(counts, error)
            }
            Err(refusal) => Err(refusal),
        };
        self.decide(&mut client, started, facts, outcome).await
    }

    /// Records the conversation's one decision, then tells a refused client why.
    async fn decide<S>(
        &self,
        client: &mut S,
        started: Started,
        facts: Facts,
        outcome: Result<Relayed, Refusal>,
    ) -> Decision
    where
        S: AsyncWrite + Unpin + Send,
    {
        let Started { time, instant } = started;
        let (allowed, reason, fix, counts, answer) = match outcome {
            Ok(relayed) => {
                let mut reason = format!("allowed by {}", relayed.rule);
                if relayed.overridden {
                    reason.push_str(" (address from a resolve override)");
                }
                if let Some(err) = relayed.error {
                    let _ = write!(reason, "; the tunnel ended with an error: {err}");
                }
                (true, reason, None, relayed.counts, None)
            }
            Err(refusal) => {
                let answer = match (refusal.status, refusal.alert) {
                    (Some(status), _) => {
                        let body = refusal_body(
                            status,
                            &refusal.reason,
                            refusal.fix.as_deref(),
                            facts.policy.as_deref(),
                        );
                        Some(http::refusal_response(
                            status,
                            &refusal.reason,
                            refusal.fix.as_deref(),
                            &body,
                        ))
                    }
                    (None, Some(alert)) => Some(fatal_alert(alert).to_vec()),
                    (None, None) => None,
                };
                (false, refusal.reason, refusal.fix, refusal.counts, answer)
            }
        };
        let decision = Decision {
            time,
            allowed,
            host: facts.host,
            port: facts.port,
            addr: facts.addr.map(|a| a.to_string()),
            bytes_up: counts.up,
            bytes_down: counts.down,
            reason,
            protocol: facts.protocol,
            duration_ms: u64::try_from(instant.elapsed().as_millis()).unwrap_or(u64::MAX),
            fix,
        };
        // Recorded before the client hears of the refusal: a command that ends on that
        // answer finds it in its exec result (see `refusals.rs`).
        self.sink.record(&decision);
        if let Some(answer) = answer {
            // The client may already be gone; the decision is recorded either way.
            let _ = client.write_all(&answer).await;
            let _ = client.shutdown().await;
        }
        decision
    }

    async fn converse<S>(&self, client: &mut S, facts: &mut Facts) -> Result<Connected, Refusal>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let limits = &self.limits;
        let mut buf = Vec::with_capacity(1024);
        let head_end = match timeout(
            limits.head_timeout,
            http::read_head(client, &mut buf, limits.max_head),
        )
        .await
        {
            Ok(Ok(end)) => end,
            Ok(Err(err @ HeadError::TooLarge(_))) => {
                return Err(Refusal::http(431, err.to_string()))
            }
            Ok(Err(err @ HeadError::NotHttp)) => return Err(Refusal::http(400, err.to_string())),
            Ok(Err(err)) => return Err(Refusal::close(err.to_string())),
            Err(_) => {
                return Err(Refusal::close(format!(
                    "no complete request head within {} s",
                    limits.head_timeout.as_secs()
                )))
            }
        };
        let policy = self.policy();
        facts.policy = Some(policy.clone());
        let request = http::parse_request(&buf[..head_end])
            .map_err(|err| Refusal::http(400, err.to_string()))?;
        let (raw_host, port) = match request {
            Request::Connect { host, port } => (host, port),
            Request::Other { method, host, port } => {
                facts.host = bounded(&host);
                facts.port = port;
                return Err(Refusal::http(
                    403,
                    format!("plain HTTP ({method}) is refused in a filtered sandbox"),
                ));
            }
        };
        facts.host = bounded(&raw_host);
        facts.port = port;
        let host = match normalize_host(&raw_host) {
            Ok(host) => host,
            Err(HostError::IpAddress(_) | HostError::NumericName(_)) => {
                return Err(Refusal::http(
                    403,
                    format!("{} is a raw IP address; connect by host name", facts.host),
                ))
            }
            Err(err) => return Err(Refusal::http(400, err.to_string())),
        };
        facts.host.clone_from(&host);
        let Some(rule) = policy.rule_for(&host, port).cloned() else {
            let ports = policy.ports_for(&host);
            if ports.is_empty() {
                let mut refusal =
                    Refusal::http(403, format!("{host} is not on this sandbox's allowlist"));
                refusal.fix = self.allow_hint.map(|hint| hint(&host));
                return Err(refusal);
            }
            let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            return Err(Refusal::http(
                403,
                format!(
                    "port {port} is not allowed for {host} (allowed: {})",
                    ports.join(", ")
                ),
            ));
        };
        facts.protocol = Some(rule.protocol);
        client
            .write_all(http::CONNECTED)
            .await
            .map_err(|err| Refusal::close(format!("the client went away before the 200: {err}")))?;

        // Bytes after the head are the start of the tunnel (a client that did not wait).
        let mut first = buf.split_off(head_end);
        let watch = self
            .judge_first_bytes(client, &mut first, &host, rule.protocol)
            .await?;

        // Only now, with the first bytes judged, is the name resolved and the upstream
        // reached: a tunnel that never sends them, or sends refused ones, costs no lookup and
        // no connection.
        let upstream = upstream::connect(&host, port, &self.overrides, limits.connect_timeout)
            .await
            .map_err(|err| {
                facts.addr = err.addr(port);
                let alert = (rule.protocol == Protocol::Tls).then(|| err.alert());
                Refusal::close(err.to_string()).with_alert(alert)
            })?;
        facts.addr = Some(upstream.addr);
        Ok(Connected {
            allowed: Allowed {
                rule,
                overridden: upstream.overridden,
            },
            upstream: upstream.stream,
            first,
            watch,
        })
    }

    /// Reads and judges the tunnel's first bytes, within [`Limits::first_bytes_timeout`] and
    /// [`Limits::max_client_hello`]: for TLS the whole ClientHello and whatever came with it,
    /// for SSH the version line. A TLS tunnel gets the watch over the rest of its handshake.
    async fn judge_first_bytes<S>(
        &self,
        client: &mut S,
        first: &mut Vec<u8>,
        host: &str,
        protocol: Protocol,
    ) -> Result<Option<TlsWatch>, Refusal>
    where
        S: AsyncRead + Unpin,
    {
        let limits = &self.limits;
        let too_slow = |what: &str| {
            Refusal::close(format!(
                "the client sent no {what} within {} s of the 200",
                limits.first_bytes_timeout.as_secs()
            ))
        };
        match protocol {
            Protocol::Tls => {
                let consumed = timeout(
                    limits.first_bytes_timeout,
                    sniff::client_hello(client, first, host, limits.max_client_hello),
                )
                .await
                .map_err(|_| too_slow("complete TLS ClientHello"))?
                .map_err(|err| Refusal::close(err.to_string()).with_alert(err.alert()))?;
                // A client that did not wait may have sent more records, a second ClientHello
                // among them: they are judged before anything is forwarded.
                let watch = TlsWatch::new(host, limits.max_client_hello);
                let released = watch
                    .client_bytes(&first[consumed..])
                    .map_err(|err| Refusal::close(err.to_string()).with_alert(err.alert()))?;
                // What the watch holds (an unfinished later message) stays with it.
                first.truncate(consumed);
                first.extend_from_slice(&released);
                Ok(Some(watch))
            }
            Protocol::Ssh => {
                timeout(limits.first_bytes_timeout, sniff::ssh_banner(client, first))
                    .await
                    .map_err(|_| too_slow("SSH version line"))?
                    .map_err(|err| Refusal::close(err.to_string()))?;
                Ok(None)
            }
        }
    }
}

/// The refusal's text body: the reason, what would allow it when something would, and for
/// policy refusals what is allowed instead.
fn refusal_body(status: u16, reason: &str, fix: Option<&str>, policy: Option<&Policy>) -> String {
    let reason = match fix {
        Some(fix) => format!("{reason}; {fix}"),
        None => reason.to_owned(),
    };
    match (status, policy) {
        (400 | 403 | 431, Some(policy)) if policy.is_empty() => format!(
            "dynocap: {reason}; this sandbox allows no network connections (its allowlist is empty)\n"
        ),
        (400 | 403 | 431, Some(policy)) => format!(
            "dynocap: {reason}; only HTTPS (CONNECT to port 443) to allowlisted hosts is allowed: {policy}\n"
        ),
        _ => format!("dynocap: {reason}\n"),
    }
}

/// A client-supplied string cut to [`MAX_LOGGED_HOST`] characters.
fn bounded(text: &str) -> String {
    text.chars().take(MAX_LOGGED_HOST).collect()
}
