//! Turns the engine's progress reports (one counter per step: import, clone, boot) into MCP
//! progress values, which must increase with every notification: each new step continues
//! from where the previous one ended, and a report that would not advance is dropped unless
//! its message changed. SDK-free.

use dynocap_engine::task_spec::Progress;

/// One MCP progress notification's values.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: String,
}

/// Keeps the progress of one request monotonic across the engine's steps.
#[derive(Debug, Default)]
pub struct Meter {
    /// Where the current step's counter starts on the combined scale.
    base: f64,
    /// The current step: its last `done` and `total`, and its message's first word.
    last_done: Option<u64>,
    last_total: Option<u64>,
    last_sent: Option<f64>,
    last_message: String,
}

impl Meter {
    pub fn new() -> Self {
        Self::default()
    }

    /// The notification for `report`, or `None` when it would say nothing new.
    #[allow(clippy::cast_precision_loss)]
    pub fn tick(&mut self, report: &Progress) -> Option<Tick> {
        let new_step = match (self.last_done, self.last_total) {
            (None, _) => false,
            (Some(done), total) => report.done < done || report.total != total,
        };
        if new_step {
            let finished = self
                .last_total
                .or(self.last_done)
                .unwrap_or(0)
                .max(self.last_done.unwrap_or(0));
            self.base += finished as f64;
        }
        self.last_done = Some(report.done);
        self.last_total = report.total;
        let mut progress = self.base + report.done as f64;
        if let Some(last) = self.last_sent {
            if progress <= last {
                if report.message == self.last_message {
                    return None;
                }
                // A new message without a new count still has to advance.
                progress = last + 0.001;
            }
        }
        self.last_sent = Some(progress);
        self.last_message.clone_from(&report.message);
        Some(Tick {
            progress,
            total: report.total.map(|t| (self.base + t as f64).max(progress)),
            message: report.message.clone(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p(message: &str, done: u64, total: Option<u64>) -> Progress {
        Progress {
            message: message.to_owned(),
            done,
            total,
        }
    }

    #[test]
    fn strictly_increasing_across_steps() {
        let mut meter = Meter::new();
        let reports = [
            p("importing", 0, Some(10)),
            p("importing", 5, Some(10)),
            p("importing", 5, Some(10)),
            p("importing", 10, Some(10)),
            p("booting", 0, None),
            p("booting", 1, None),
            p("ready", 1, None),
        ];
        let ticks: Vec<Tick> = reports.iter().filter_map(|r| meter.tick(r)).collect();
        assert_eq!(ticks.len(), 6, "{ticks:?}");
        for pair in ticks.windows(2) {
            assert!(pair[1].progress > pair[0].progress, "{ticks:?}");
        }
        assert_eq!(ticks[0].total, Some(10.0));
        assert_eq!(ticks[3].message, "booting");
        assert!(ticks[3].progress > 10.0);
    }
}
