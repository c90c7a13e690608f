//! `network.jsonl`: one JSON line per decision, appended to a file, bounded in size so a
//! guest that opens connections in a loop cannot fill the host's disk.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

use crate::decision::{Decision, DecisionSink};

/// Default bound on the bytes [`JsonlSink`] writes.
pub const DEFAULT_JSONL_CAP: u64 = 16 * 1024 * 1024;

/// Appends decisions as JSON lines until `cap` bytes, then writes one final line saying it
/// stopped and counts what it dropped.
pub struct JsonlSink {
    state: Mutex<State>,
    cap: u64,
}

struct State {
    file: File,
    written: u64,
    stopped: bool,
    dropped: u64,
    error: Option<String>,
}

/// The last line of a log that reached its cap.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Truncated<'a> {
    time: String,
    truncated: bool,
    reason: &'a str,
}

impl JsonlSink {
    /// Creates (or appends to) `path` with the default cap.
    pub fn create(path: &Path) -> io::Result<JsonlSink> {
        JsonlSink::with_cap(path, DEFAULT_JSONL_CAP)
    }

    /// Creates (or appends to) `path`, writing at most `cap` bytes of decisions.
    pub fn with_cap(path: &Path, cap: u64) -> io::Result<JsonlSink> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let written = file.metadata()?.len();
        Ok(JsonlSink {
            state: Mutex::new(State {
                file,
                written,
                stopped: false,
                dropped: 0,
                error: None,
            }),
            cap,
        })
    }

    /// Whether the cap was reached (later decisions are not written).
    pub fn stopped(&self) -> bool {
        self.lock().stopped
    }

    /// Decisions not written because of the cap or a write error.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// The first write error, if any (the sink stops writing after one).
    pub fn error(&self) -> Option<String> {
        self.lock().error.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic mid-write leaves at worst a partial line; the state itself stays valid.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DecisionSink for JsonlSink {
    fn record(&self, decision: &Decision) {
        let mut state = self.lock();
        if state.stopped {
            state.dropped += 1;
            return;
        }
        let mut line = match serde_json::to_vec(decision) {
            Ok(line) => line,
            Err(err) => {
                state.error.get_or_insert_with(|| err.to_string());
                state.dropped += 1;
                return;
            }
        };
        line.push(b'\n');
        let len = line.len() as u64;
        let over_cap = state.written + len > self.cap;
        if over_cap {
            state.stopped = true;
            state.dropped += 1;
            let marker = Truncated {
                time: decision.time.clone(),
                truncated: true,
                reason: "network.jsonl reached its size cap; later decisions are not logged \
                         (the summary still counts them)",
            };
            line = serde_json::to_vec(&marker).expect("a struct of strings serialises");
            line.push(b'\n');
        }
        // A blocking append of one short line: page-cache speed, not worth a thread hop.
        if let Err(err) = state.file.write_all(&line) {
            state.error.get_or_insert_with(|| err.to_string());
            state.stopped = true;
            if !over_cap {
                state.dropped += 1;
            }
            return;
        }
        state.written += line.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(host: &str, allowed: bool) -> Decision {
        Decision {
            time: "2026-01-02T03:04:05.006Z".to_owned(),
            allowed,
            host: host.to_owned(),
            port: 443,
            addr: allowed.then(|| "127.0.0.1:443".to_owned()),
            bytes_up: 10,
            bytes_down: 20,
            reason: if allowed {
                "allowed by a.example"
            } else {
                "not allowed"
            }
            .to_owned(),
            protocol: allowed.then_some(crate::Protocol::Tls),
            duration_ms: 1,
            fix: None,
        }
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn one_camel_case_line_per_decision() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("network.jsonl");
        let sink = JsonlSink::create(&path).unwrap();
        sink.record(&decision("a.example", true));
        sink.record(&decision("b.example", false));
        let lines = lines(&path);
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            serde_json::json!({
                "time": "2026-01-02T03:04:05.006Z", "allowed": true, "host": "a.example",
                "port": 443, "addr": "127.0.0.1:443", "bytesUp": 10, "bytesDown": 20,
                "reason": "allowed by a.example", "protocol": "tls", "durationMs": 1
            })
        );
        assert_eq!(lines[1]["allowed"], false);
        assert_eq!(lines[1]["addr"], serde_json::Value::Null);
        assert!(!sink.stopped());
    }

    #[test]
    fn stops_at_the_cap_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("network.jsonl");
        let one_line = serde_json::to_vec(&decision("a.example", true))
            .unwrap()
            .len() as u64
            + 1;
        let sink = JsonlSink::with_cap(&path, one_line * 2 + 10).unwrap();
        for _ in 0..5 {
            sink.record(&decision("a.example", true));
        }
        let lines = lines(&path);
        assert_eq!(lines.len(), 3, "two decisions and the marker");
        assert_eq!(lines[2]["truncated"], true);
        assert!(sink.stopped());
        assert_eq!(sink.dropped(), 3);
        assert_eq!(sink.error(), None);
    }
}
