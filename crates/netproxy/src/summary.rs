//! The aggregate of a sandbox's decisions, for `summary.json` and the finish result: which
//! hosts were reached (connections, bytes) and what was refused. Bounded, like the log.

use std::sync::{Mutex, PoisonError};

use serde::Serialize;

use crate::decision::{Decision, DecisionSink};

/// Distinct host and port pairs listed in [`Summary::hosts_reached`].
pub const MAX_SUMMARY_HOSTS: usize = 256;
/// Distinct host and reason pairs listed in [`RefusalSummary::first`].
pub const MAX_SUMMARY_REFUSALS: usize = 32;

/// What a sandbox's network did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Allowed connections, in the order each host and port was first reached.
    pub hosts_reached: Vec<HostReached>,
    /// Allowed connections to host and port pairs beyond [`MAX_SUMMARY_HOSTS`].
    pub hosts_omitted: u64,
    pub refusals: RefusalSummary,
}

/// Allowed connections to one host and port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostReached {
    pub host: String,
    pub port: u16,
    pub connections: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// Refused connections.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusalSummary {
    /// All refusals.
    pub count: u64,
    /// The first distinct host and reason pairs, each with how often it happened.
    pub first: Vec<RefusalEntry>,
    /// Refusals whose host and reason pair came after the first [`MAX_SUMMARY_REFUSALS`].
    pub omitted: u64,
}

/// One distinct refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusalEntry {
    pub host: String,
    pub port: u16,
    pub reason: String,
    pub count: u64,
}

impl Summary {
    /// Counts one decision in.
    pub fn add(&mut self, d: &Decision) {
        if d.allowed {
            self.add_reached(d);
        } else {
            self.add_refusal(d);
        }
    }

    fn add_reached(&mut self, d: &Decision) {
        let index = match self
            .hosts_reached
            .iter()
            .position(|h| h.host == d.host && h.port == d.port)
        {
            Some(index) => index,
            None if self.hosts_reached.len() < MAX_SUMMARY_HOSTS => {
                self.hosts_reached.push(HostReached {
                    host: d.host.clone(),
                    port: d.port,
                    connections: 0,
                    bytes_up: 0,
                    bytes_down: 0,
                });
                self.hosts_reached.len() - 1
            }
            None => {
                self.hosts_omitted += 1;
                return;
            }
        };
        let entry = &mut self.hosts_reached[index];
        entry.connections += 1;
        entry.bytes_up += d.bytes_up;
        entry.bytes_down += d.bytes_down;
    }

    fn add_refusal(&mut self, d: &Decision) {
        let refusals = &mut self.refusals;
        refusals.count += 1;
        if let Some(entry) = refusals
            .first
            .iter_mut()
            .find(|r| r.host == d.host && r.reason == d.reason)
        {
            entry.count += 1;
        } else if refusals.first.len() < MAX_SUMMARY_REFUSALS {
            refusals.first.push(RefusalEntry {
                host: d.host.clone(),
                port: d.port,
                reason: d.reason.clone(),
                count: 1,
            });
        } else {
            refusals.omitted += 1;
        }
    }
}

/// A sink that aggregates into a [`Summary`]; share it (`Arc`) between the proxy and whoever
/// writes the summary.
#[derive(Debug, Default)]
pub struct SummarySink {
    summary: Mutex<Summary>,
}

impl SummarySink {
    pub fn new() -> SummarySink {
        SummarySink::default()
    }

    /// The summary so far.
    pub fn snapshot(&self) -> Summary {
        self.summary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl DecisionSink for SummarySink {
    fn record(&self, decision: &Decision) {
        // Counters only: a poisoned lock holds a consistent (if incomplete) summary.
        self.summary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(decision);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(host: &str, allowed: bool, reason: &str, up: u64, down: u64) -> Decision {
        Decision {
            time: String::new(),
            allowed,
            host: host.to_owned(),
            port: 443,
            addr: None,
            bytes_up: up,
            bytes_down: down,
            reason: reason.to_owned(),
            protocol: None,
            duration_ms: 0,
            fix: None,
        }
    }

    #[test]
    fn aggregates_hosts_and_refusals() {
        let sink = SummarySink::new();
        sink.record(&decision("a.example", true, "ok", 10, 100));
        sink.record(&decision("b.example", true, "ok", 1, 2));
        sink.record(&decision("a.example", true, "ok", 5, 50));
        sink.record(&decision("evil.example", false, "not allowlisted", 0, 0));
        sink.record(&decision("evil.example", false, "not allowlisted", 0, 0));
        sink.record(&decision("evil.example", false, "port 80", 0, 0));
        let s = sink.snapshot();
        assert_eq!(
            s.hosts_reached,
            vec![
                HostReached {
                    host: "a.example".to_owned(),
                    port: 443,
                    connections: 2,
                    bytes_up: 15,
                    bytes_down: 150
                },
                HostReached {
                    host: "b.example".to_owned(),
                    port: 443,
                    connections: 1,
                    bytes_up: 1,
                    bytes_down: 2
                },
            ]
        );
        assert_eq!(s.refusals.count, 3);
        assert_eq!(s.refusals.first.len(), 2);
        assert_eq!(s.refusals.first[0].count, 2);
        assert_eq!(s.refusals.first[1].reason, "port 80");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["hostsReached"][0]["bytesDown"], 150);
        assert_eq!(json["refusals"]["first"][0]["host"], "evil.example");
    }

    #[test]
    fn bounded() {
        let mut s = Summary::default();
        for i in 0..(MAX_SUMMARY_REFUSALS + 5) {
            s.add(&decision(&format!("h{i}.example"), false, "no", 0, 0));
        }
        for i in 0..(MAX_SUMMARY_HOSTS + 3) {
            s.add(&decision(&format!("h{i}.example"), true, "ok", 0, 0));
        }
        assert_eq!(s.refusals.first.len(), MAX_SUMMARY_REFUSALS);
        assert_eq!(s.refusals.omitted, 5);
        assert_eq!(s.refusals.count, (MAX_SUMMARY_REFUSALS + 5) as u64);
        assert_eq!(s.hosts_reached.len(), MAX_SUMMARY_HOSTS);
        assert_eq!(s.hosts_omitted, 3);
    }
}
