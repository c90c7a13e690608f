//! Refusals per command: the connections refused while one command of the sandbox ran, so that
//! its result can say which host was refused and why, instead of the bare `403` a client
//! such as pip shows.
//!
//! The proxy does not know which guest process opened a tunnel (every one arrives over the
//! same agent channel), so a refusal is given to every command running when it is recorded:
//! two commands running at once may both list it. The proxy records a refusal before it
//! answers the client (see `proxy.rs`), so a command that ends on that answer has it.

use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, DecisionSink};

/// Distinct host, port and reason triples one command's [`RefusalList`] lists.
pub const MAX_COMMAND_REFUSALS: usize = 16;
/// Longest reason kept in a [`NetworkRefusal`]: a malformed request's reason quotes what the
/// guest sent.
const MAX_REASON_CHARS: usize = 300;
/// Longest host kept: the proxy already bounds it (a valid name is at most 253); this bound
/// holds for whatever feeds the list.
const MAX_HOST_CHARS: usize = 255;

/// Connections refused to one host and port for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRefusal {
    /// The host as the proxy recorded it: canonical when it parsed as a name, else as sent
    /// (bounded); empty when the request named none. Guest data: show it escaped.
    pub host: String,
    pub port: u16,
    /// Why, as the proxy told the client.
    pub reason: String,
    /// How many connections were refused this way.
    pub count: u64,
    /// What the person running the sandbox can change to allow it; present only when the
    /// host was refused for not being on the allowlist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The refusals of one command: distinct ones in the order they first happened, bounded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusalList {
    pub refusals: Vec<NetworkRefusal>,
    /// Refused connections whose host, port and reason came after the first
    /// [`MAX_COMMAND_REFUSALS`] distinct ones.
    pub omitted: u64,
}

impl RefusalList {
    /// Counts one refused decision in; allowed ones are not refusals.
    pub fn add(&mut self, d: &Decision) {
        if d.allowed {
            return;
        }
        let host = bounded(&d.host, MAX_HOST_CHARS);
        let reason = bounded(&d.reason, MAX_REASON_CHARS);
        if let Some(entry) = self
            .refusals
            .iter_mut()
            .find(|r| r.host == host && r.port == d.port && r.reason == reason)
        {
            entry.count += 1;
        } else if self.refusals.len() < MAX_COMMAND_REFUSALS {
            self.refusals.push(NetworkRefusal {
                host,
                port: d.port,
                reason,
                count: 1,
                fix: d.fix.clone(),
            });
        } else {
            self.omitted += 1;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.refusals.is_empty() && self.omitted == 0
    }
}

/// A sink that gives every refusal to each command running when it is recorded. Recording
/// takes one short lock and touches only the open lists (each bounded): it never waits on
/// anything but another recording or a command opening or closing its window.
#[derive(Debug, Default)]
pub struct CommandRefusals {
    open: Mutex<Windows>,
}

#[derive(Debug, Default)]
struct Windows {
    next_id: u64,
    lists: Vec<(u64, RefusalList)>,
}

impl CommandRefusals {
    pub fn new() -> CommandRefusals {
        CommandRefusals::default()
    }

    /// Starts collecting for one command, until the window is closed (or dropped).
    pub fn open(self: &Arc<Self>) -> RefusalWindow {
        let mut windows = self.lock();
        let id = windows.next_id;
        windows.next_id += 1;
        windows.lists.push((id, RefusalList::default()));
        RefusalWindow {
            sink: Arc::clone(self),
            id,
        }
    }

    /// Windows open now.
    pub fn open_windows(&self) -> usize {
        self.lock().lists.len()
    }

    fn take(&self, id: u64) -> RefusalList {
        let mut windows = self.lock();
        match windows.lists.iter().position(|(open, _)| *open == id) {
            Some(index) => windows.lists.swap_remove(index).1,
            None => RefusalList::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        // Each list is updated by one call that cannot panic halfway in a way that matters:
        // a poisoned lock still holds usable lists.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DecisionSink for CommandRefusals {
    fn record(&self, decision: &Decision) {
        if decision.allowed {
            return;
        }
        for (_, list) in &mut self.lock().lists {
            list.add(decision);
        }
    }
}

/// One command's window on the refusals: what was refused from its opening to its closing.
#[derive(Debug)]
pub struct RefusalWindow {
    sink: Arc<CommandRefusals>,
    id: u64,
}

impl RefusalWindow {
    /// Stops collecting and returns what was refused meanwhile.
    pub fn close(self) -> RefusalList {
        // `Drop` runs after this and finds the list gone.
        self.sink.take(self.id)
    }
}

impl Drop for RefusalWindow {
    fn drop(&mut self) {
        // A command whose result is never built (cancelled, failed) leaves no list behind.
        let _ = self.sink.take(self.id);
    }
}

/// The first `max` characters of `text`.
fn bounded(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(host: &str, port: u16, reason: &str) -> Decision {
        Decision {
            time: String::new(),
            allowed: false,
            host: host.to_owned(),
            port,
            addr: None,
            bytes_up: 0,
            bytes_down: 0,
            reason: reason.to_owned(),
            protocol: None,
            duration_ms: 0,
            fix: Some(format!("allow {host}")),
        }
    }

    #[test]
    fn dedups_by_host_port_and_reason_in_first_seen_order() {
        let mut list = RefusalList::default();
        list.add(&refused("a.example", 443, "not allowlisted"));
        list.add(&refused("a.example", 443, "not allowlisted"));
        list.add(&refused("a.example", 80, "not allowlisted"));
        list.add(&refused("a.example", 443, "bad hello"));
        list.add(&refused("b.example", 443, "not allowlisted"));
        list.add(&refused("a.example", 443, "not allowlisted"));
        let mut allowed = refused("a.example", 443, "allowed by a.example");
        allowed.allowed = true;
        list.add(&allowed);
        let seen: Vec<(&str, u16, &str, u64)> = list
            .refusals
            .iter()
            .map(|r| (r.host.as_str(), r.port, r.reason.as_str(), r.count))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("a.example", 443, "not allowlisted", 3),
                ("a.example", 80, "not allowlisted", 1),
                ("a.example", 443, "bad hello", 1),
                ("b.example", 443, "not allowlisted", 1),
            ]
        );
        assert_eq!(list.refusals[0].fix.as_deref(), Some("allow a.example"));
        assert_eq!(list.omitted, 0);
        let json = serde_json::to_value(&list).unwrap();
        assert_eq!(json["refusals"][0]["count"], 3);
        assert_eq!(json["refusals"][0]["fix"], "allow a.example");
    }

    #[test]
    fn bounded_in_entries_and_in_text() {
        let mut list = RefusalList::default();
        for i in 0..MAX_COMMAND_REFUSALS + 3 {
            list.add(&refused(&format!("h{i}.example"), 443, "no"));
        }
        // Known ones still count once the list is full; new ones are only counted.
        list.add(&refused("h0.example", 443, "no"));
        list.add(&refused("h99.example", 443, "no"));
        assert_eq!(list.refusals.len(), MAX_COMMAND_REFUSALS);
        assert_eq!(list.refusals[0].count, 2);
        assert_eq!(list.omitted, 4);

        let mut list = RefusalList::default();
        list.add(&refused(&"h".repeat(5000), 443, &"r".repeat(9000)));
        assert_eq!(list.refusals[0].host.len(), MAX_HOST_CHARS);
        assert_eq!(list.refusals[0].reason.len(), MAX_REASON_CHARS);
        // A second one equal once bounded is the same refusal.
        list.add(&refused(&"h".repeat(6000), 443, &"r".repeat(9001)));
        assert_eq!(list.refusals.len(), 1);
        assert_eq!(list.refusals[0].count, 2);
    }

    #[test]
    fn windows_see_what_was_refused_while_they_were_open() {
        let sink = Arc::new(CommandRefusals::new());
        sink.record(&refused("before.example", 443, "no"));
        let first = sink.open();
        sink.record(&refused("both.example", 443, "no"));
        let second = sink.open();
        sink.record(&refused("both.example", 443, "no"));
        let mut allowed = refused("ok.example", 443, "allowed");
        allowed.allowed = true;
        sink.record(&allowed);
        let first = first.close();
        sink.record(&refused("second.example", 443, "no"));
        let second = second.close();
        sink.record(&refused("after.example", 443, "no"));

        let hosts = |list: &RefusalList| -> Vec<(String, u64)> {
            list.refusals
                .iter()
                .map(|r| (r.host.clone(), r.count))
                .collect()
        };
        assert_eq!(hosts(&first), vec![("both.example".to_owned(), 2)]);
        assert_eq!(
            hosts(&second),
            vec![
                ("both.example".to_owned(), 1),
                ("second.example".to_owned(), 1)
            ]
        );
        assert_eq!(sink.open_windows(), 0);
        drop(sink.open());
        assert_eq!(sink.open_windows(), 0, "a dropped window leaves nothing");
    }
}
