//! DynoCap's egress proxy: the host side of `filtered` networking.
//!
//! Inside a `filtered` guest, clients (curl, npm, git, pip) speak HTTP-proxy protocol to
//! `127.0.0.1:3128`; each such connection reaches the host as one byte stream, which the
//! supervisor hands to [`Proxy::serve`] (a tunnel over the agent channel), or as a TCP socket
//! of its own, which it hands to [`Proxy::serve_socket`] (a jail, whose supervisor listens in
//! the guest's network itself). The proxy decides and relays; it owns no sockets of its own
//! except the upstream connections it opens, so the jail supervisor and the VM backend embed
//! it alike.
//!
//! # One conversation
//!
//! 1. The request head is read (at most 8 KiB, within 30 s). Only `CONNECT host:port` is
//!    accepted; plain HTTP gets `403`, a malformed request `400`. Every refusal carries its
//!    reason in its status line, a text body and an `X-Dynocap-Refusal` header; a host the
//!    allowlist does not name also gets what would allow it ([`Proxy::with_allow_hint`]).
//! 2. The host is canonicalised ([`normalize_host`]: IDNA to ASCII, lowercase, no trailing
//!    dot). Raw IP addresses are refused, as is any `host:port` no [`Rule`] of the current
//!    [`Policy`] allows.
//! 3. The client gets `200 Connection established`, and nothing else happens until its first
//!    bytes are in and judged (within 30 s; a tunnel that never sends them costs no lookup and
//!    no connection). For a [`Protocol::Tls`] rule that is its whole ClientHello (at most
//!    64 KiB, across records and reads): every extension is walked; Encrypted ClientHello and
//!    ESNI (which would let the server route by a name the proxy cannot read) are refused;
//!    server_name must hold exactly one host_name, in ASCII, equal to the CONNECT host. For
//!    [`Protocol::Ssh`] its first line must start with `SSH-2.0-`. A refused tunnel is closed,
//!    a TLS client first getting a fatal alert (`access_denied`, `decode_error`); the decision
//!    says why.
//! 4. Only then is the host resolved, once, on the host, unless a [`ResolveOverrides`] entry
//!    names its address (then that address is used as is). Resolved addresses that are not
//!    [`AddrClass::Public`] are dropped; if none remain the tunnel is refused with the class
//!    ("resolves to a loopback address (127.0.0.1)", alert `access_denied`). The proxy
//!    connects only to a checked address, within 10 s, with `TCP_NODELAY` (a failure is
//!    alert `internal_error`).
//! 5. The buffered bytes go upstream and both directions are relayed with 256 KiB buffers,
//!    half-close respected, until both sides end. Until the server's real ServerHello has
//!    passed and the client has gone encrypted, a watch reads the records both ways: any
//!    later plaintext ClientHello (the answer to a HelloRetryRequest, or one sent unasked) is
//!    judged as the first was, before it is forwarded. After that nothing reads the bytes: a
//!    socket client's relay moves them with `splice(2)`, in the kernel.
//!
//! Each conversation ends in exactly one [`Decision`], given to the [`DecisionSink`]:
//! [`JsonlSink`] writes `network.jsonl` (bounded), [`SummarySink`] aggregates a [`Summary`]
//! for `summary.json` and the finish result, [`CommandRefusals`] gives each running command
//! the refusals recorded while it runs; a pair `(a, b)` of sinks feeds both.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use dynocap_netproxy::{JsonlSink, Policy, Proxy, ResolveOverrides, Rule, HostPattern, SummarySink};
//!
//! # async fn run(stream: tokio::net::TcpStream) -> Result<(), Box<dyn std::error::Error>> {
//! let mut policy = Policy::https_hosts(&["registry.npmjs.org", "github.com"])?;
//! policy.push(Rule::ssh(HostPattern::parse("github.com")?));
//! let summary = Arc::new(SummarySink::new());
//! let log = JsonlSink::create("results/network.jsonl".as_ref())?;
//! let proxy = Arc::new(Proxy::new(
//!     policy,
//!     ResolveOverrides::parse("mirror.example:443:127.0.0.1")?,
//!     Arc::new((log, summary.clone())),
//! ));
//! proxy.serve(stream).await; // one per tunnelled guest connection, each in its own task
//! let _for_summary_json = summary.snapshot();
//! # Ok(()) }
//! ```
//!
//! Modules: `addr` (address classes), `host` (canonical names, allowlist patterns), `policy`
//! (rules), `resolve` (overrides), `http` (request head and responses), `tls` (ClientHello
//! parser), `sniff` (first bytes in the tunnel and their judgement), `watch` (later
//! ClientHellos), `upstream` (resolve, check, connect), `relay` (counted, watched
//! bidirectional copy), `splice` (the same between two sockets, in the kernel once unwatched), `decision` (decisions and sinks), `jsonl` (the log file),
//! `summary` (aggregation), `refusals` (refusals per command), `proxy` (the conversation), `fuzzing` (the fuzz targets' bodies).

mod addr;
mod decision;
// The fuzz targets' bodies (crates/netproxy/fuzz), public so that crate can call them.
pub mod fuzzing;
mod host;
mod http;
mod jsonl;
mod policy;
mod proxy;
mod refusals;
mod relay;
mod resolve;
mod sniff;
pub mod splice;
mod summary;
mod tls;
mod upstream;
mod watch;

pub use addr::{classify, AddrClass};
pub use decision::{Decision, DecisionSink, NullSink};
pub use host::{normalize_host, HostError, HostPattern, PatternError};
pub use jsonl::{JsonlSink, DEFAULT_JSONL_CAP};
pub use policy::{Policy, Protocol, Rule};
pub use proxy::{AllowHint, Limits, Proxy};
pub use refusals::{
    CommandRefusals, NetworkRefusal, RefusalList, RefusalWindow, MAX_COMMAND_REFUSALS,
};
pub use resolve::{OverrideError, ResolveOverrides, RESOLVE_ENV};
pub use summary::{
    HostReached, RefusalEntry, RefusalSummary, Summary, SummarySink, MAX_SUMMARY_HOSTS,
    MAX_SUMMARY_REFUSALS,
};
pub use tls::{parse_client_hello, ClientHello, Hello, HelloError};

#[cfg(test)]
mod proxy_tests;
// The same conversations through `Proxy::serve_socket`, with TCP clients: the file is loaded
// twice on purpose, and picks its client by the module's name.
#[cfg(test)]
#[path = "proxy_tests.rs"]
#[allow(clippy::duplicate_mod)]
mod proxy_socket_tests;
