//! What a sandbox is and where it is in its life: its kind, its lifecycle state, and the
//! identity of the process that supervises it.

use serde::{Deserialize, Serialize};

/// Lifecycle states, as docs/mcp.md names them (plus `starting` while a supervisor boots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Starting,
    Running,
    /// Its supervisor stopped serving it (its TTL ran out, or it is being finished or
    /// destroyed) and is ending it: saving a task's work, killing the guest. Set the moment
    /// the supervisor leaves its serving loop, before it closes its socket.
    Ending,
    Finished,
    Expired,
    Destroyed,
    Lost,
    /// A task whose guest ended before its work could be saved (a dead agent, a killed
    /// supervisor, a full disk). Its writable layer is kept; `task finish` recovers it.
    Unsaved,
    /// An unsaved task whose work a recovery supervisor is saving now.
    Recovering,
    /// A warm-pool sandbox booting (`DYNOCAP_WARM_POOL`): nameless, shown nowhere.
    Warming,
    /// A warm-pool sandbox booted and idle, waiting for a `run` to claim it.
    Pooled,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Ending => "ending",
            Self::Finished => "finished",
            Self::Expired => "expired",
            Self::Destroyed => "destroyed",
            Self::Lost => "lost",
            Self::Unsaved => "unsaved",
            Self::Recovering => "recovering",
            Self::Warming => "warming",
            Self::Pooled => "pooled",
        }
    }

    pub(crate) fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "starting" => Self::Starting,
            "running" => Self::Running,
            "ending" => Self::Ending,
            "finished" => Self::Finished,
            "expired" => Self::Expired,
            "destroyed" => Self::Destroyed,
            "lost" => Self::Lost,
            "unsaved" => Self::Unsaved,
            "recovering" => Self::Recovering,
            "warming" => Self::Warming,
            "pooled" => Self::Pooled,
            _ => return None,
        })
    }

    /// A supervisor is (supposed to be) running for the sandbox.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            Self::Starting
                | Self::Running
                | Self::Ending
                | Self::Recovering
                | Self::Warming
                | Self::Pooled
        )
    }

    /// A warm-pool sandbox nobody has claimed: never listed, never counted as the user's.
    pub fn is_pool(self) -> bool {
        matches!(self, Self::Warming | Self::Pooled)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Raw,
    Task,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::Task => "task",
        }
    }

    /// What every id of this kind starts with (`sbx-…`, `task-…`).
    pub fn id_prefix(self) -> &'static str {
        match self {
            Self::Raw => "sbx",
            Self::Task => "task",
        }
    }

    /// The kind an id names, from its prefix.
    pub fn of_id(id: &str) -> Option<Kind> {
        [Kind::Raw, Kind::Task].into_iter().find(|kind| {
            id.strip_prefix(kind.id_prefix())
                .is_some_and(|rest| rest.starts_with('-'))
        })
    }
}

/// A process identity that survives pid reuse: the pid plus its start time in clock ticks
/// since boot (field 22 of /proc/PID/stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessId {
    pub pid: i32,
    pub start_ticks: u64,
}

impl ProcessId {
    pub fn of(pid: i32) -> Option<Self> {
        Some(Self {
            pid,
            start_ticks: process_start_ticks(pid)?,
        })
    }

    /// The process's run state (`R`, `S`, `T` for stopped, …) while it is alive; `None` once
    /// it is gone (exited, a zombie, or its pid reused).
    pub fn run_state(&self) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        let (state, start) = parse_stat(&stat)?;
        (state != 'Z' && state != 'X' && start == self.start_ticks).then_some(state)
    }

    /// The same process is still running (not a zombie, not a reused pid).
    pub fn is_alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        let Some((state, start)) = parse_stat(&stat) else {
            return false;
        };
        state != 'Z' && state != 'X' && start == self.start_ticks
    }
}

fn process_start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, start)| start)
}

/// Returns (state, starttime) from a /proc/PID/stat line. The command name may contain
/// spaces and parentheses, so fields are counted from the last ')'.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    // starttime is field 22 overall; after "pid (comm)" the state is field 3.
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_stat_parses_odd_names() {
        let me = ProcessId::of(std::process::id() as i32).unwrap();
        assert!(me.is_alive());
        assert!(!ProcessId {
            start_ticks: me.start_ticks + 1,
            ..me
        }
        .is_alive());
        let stat = "42 (a) b (c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 20";
        assert_eq!(parse_stat(stat), Some(('S', 777)));
    }
}
