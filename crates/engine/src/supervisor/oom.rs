//! A sandbox's count of OOM kills, read before and after each command to tell the command
//! that the memory limit killed part of it (a shell reports that only as exit status 137).
//! The count lives where the backend says ([`OomCounter`]): a host cgroup file for the jail,
//! the guest kernel's own `/proc/vmstat` (asked of the agent) for a VM.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dynocap_proto::{Request, Response};

use crate::backend::OomCounter;
use crate::supervisor::agent_conn::AgentConn;
use crate::supervisor::exec::ExecResult;

/// A busy guest answers a counter read in milliseconds; past this the count is skipped (the
/// command's result goes out unannotated) rather than holding the result back.
const AGENT_ANSWER: Duration = Duration::from_secs(10);

pub struct OomWatch {
    counter: OomCounter,
    /// The memory limit, which a warm-pool claim may change.
    memory_mb: AtomicU64,
}

impl OomWatch {
    pub fn new(counter: OomCounter, memory_mb: u64) -> Self {
        Self {
            counter,
            memory_mb: AtomicU64::new(memory_mb),
        }
    }

    pub fn set_memory_mb(&self, memory_mb: u64) {
        self.memory_mb.store(memory_mb, Ordering::Relaxed);
    }

    /// The count now; `None` where it cannot be known (then nothing is annotated).
    pub async fn kills(&self, conn: &AgentConn) -> Option<u64> {
        match &self.counter {
            OomCounter::HostFile(path) => parse(&std::fs::read_to_string(path).ok()?),
            OomCounter::GuestKernel => tokio::time::timeout(AGENT_ANSWER, ask_agent(conn))
                .await
                .ok()
                .flatten(),
            OomCounter::None => None,
        }
    }

    /// What a command's stderr gets when the memory limit killed part of it.
    pub fn note(&self) -> String {
        format!(
            "\ndynocap: the sandbox's memory limit ({} MB) killed a process of this command (out of memory); start the sandbox with more memory (memoryMB) if it needs more.\n",
            self.memory_mb.load(Ordering::Relaxed)
        )
    }

    /// Marks `result` OOM-killed when the count grew since `before`.
    pub async fn annotate(
        &self,
        conn: &AgentConn,
        result: ExecResult,
        before: Option<u64>,
    ) -> ExecResult {
        let Some(before) = before else {
            return result;
        };
        match self.kills(conn).await {
            Some(after) if after > before => self.mark(result),
            _ => result,
        }
    }

    fn mark(&self, mut result: ExecResult) -> ExecResult {
        result.oom_killed = true;
        if result.exit_code == Some(137) || result.signal.is_none() && result.exit_code.is_none() {
            result.signal = Some("SIGKILL".to_owned());
        }
        let note = self.note();
        for text in [&mut result.stderr, &mut result.transcript]
            .into_iter()
            .flatten()
        {
            text.push_str(&note);
        }
        result
    }
}

/// The guest kernel's count, from the agent. An agent that predates the request answers with
/// an error: no count, as for a kernel without one.
async fn ask_agent(conn: &AgentConn) -> Option<u64> {
    let stream = conn.open(&Request::OomKills).await.ok()?;
    match crate::supervisor::workspace::finish_stream(stream, "reading the guest's OOM kills")
        .await
        .ok()?
    {
        Response::OomKills { count } => count,
        _ => None,
    }
}

/// The `oom_kill N` line of a cgroup's `memory.events` or `memory.oom_control`.
fn parse(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cgroup_v1_and_v2_files() {
        assert_eq!(parse("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n"), Some(2));
        assert_eq!(
            parse("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"),
            Some(7)
        );
        assert_eq!(parse("oom_kill_disable 0\n"), None);
    }

    fn result(exit_code: Option<i32>, signal: Option<&str>) -> ExecResult {
        ExecResult {
            exit_code,
            signal: signal.map(str::to_owned),
            timed_out: false,
            duration_ms: 1,
            stdout: None,
            stderr: Some("Killed\n".into()),
            transcript: None,
            truncated: false,
            oom_killed: false,
            disk_error: None,
            network_refusals: Vec::new(),
            network_refusals_omitted: 0,
        }
    }

    #[test]
    fn a_kill_is_named_and_explained() {
        let watch = OomWatch::new(OomCounter::None, 256);
        let marked = watch.mark(result(Some(137), None));
        assert!(marked.oom_killed);
        assert_eq!(marked.signal.as_deref(), Some("SIGKILL"));
        let stderr = marked.stderr.expect("stderr");
        assert!(stderr.starts_with("Killed\n"), "{stderr}");
        assert!(stderr.contains("memory limit (256 MB)"), "{stderr}");
        // A command that survived the kill of one of its children keeps its own status.
        let survived = watch.mark(result(Some(1), None));
        assert!(survived.oom_killed);
        assert_eq!(survived.signal, None);
    }
}
