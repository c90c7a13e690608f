//! Decisions: the record of one client connection (allowed and relayed, or refused and why),
//! and the sinks that receive them.

use std::sync::Arc;

use serde::Serialize;

use crate::policy::Protocol;

/// One connection's outcome. Serialised (camelCase) as one line of `network.jsonl`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// When the connection began, RFC 3339 UTC with milliseconds.
    pub time: String,
    pub allowed: bool,
    /// The host the client asked for: canonical when it parsed as a name, else as sent
    /// (bounded); empty when the request did not name one.
    pub host: String,
    /// The port the client asked for; 0 when the request did not name one.
    pub port: u16,
    /// The upstream address connected to (or refused by class), as `ip:port`.
    pub addr: Option<String>,
    /// Bytes sent upstream on the client's behalf (ClientHello included).
    pub bytes_up: u64,
    /// Bytes received from upstream.
    pub bytes_down: u64,
    /// Why: the rule that allowed it, or the refusal as the client was told.
    pub reason: String,
    /// The protocol of the rule that matched, when one did.
    pub protocol: Option<Protocol>,
    /// From accepting the connection to recording the decision.
    pub duration_ms: u64,
    /// For a host refused because the allowlist does not name it: what the person running the
    /// sandbox can set to allow it (the proxy's [`AllowHint`](crate::AllowHint)). Not logged:
    /// `network.jsonl` keeps its fields; exec results show it.
    #[serde(skip)]
    pub fix: Option<String>,
}

/// Receives every decision. Called once per connection, when it ends, from the task serving
/// it: implementations must be quick (no network, bounded local I/O).
pub trait DecisionSink: Send + Sync {
    fn record(&self, decision: &Decision);
}

impl<T: DecisionSink + ?Sized> DecisionSink for Arc<T> {
    fn record(&self, decision: &Decision) {
        (**self).record(decision);
    }
}

/// Both sinks, in order: `(JsonlSink, Arc<SummarySink>)` logs and aggregates.
impl<A: DecisionSink, B: DecisionSink> DecisionSink for (A, B) {
    fn record(&self, decision: &Decision) {
        self.0.record(decision);
        self.1.record(decision);
    }
}

/// Discards decisions (a proxy whose log is not wanted).
#[derive(Clone, Copy, Debug, Default)]
pub struct NullSink;

impl DecisionSink for NullSink {
    fn record(&self, _decision: &Decision) {}
}
