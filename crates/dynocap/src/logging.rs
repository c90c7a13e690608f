//! How the long-lived processes log (a sandbox's supervisor, the MCP server): through
//! `tracing`, at the level `DYNOCAP_LOG` names (`error`, `warn`, `info`, `debug`, `trace`;
//! `info` by default), as text for people or, with `DYNOCAP_LOG_FORMAT=json`, one JSON object
//! per line for machines. Other crates' diagnostics (the MCP SDK's) are kept to warnings
//! unless `debug` or `trace` asks for everything.
//!
//! A value that is not one of these does not stop the process (a typo must not keep a
//! sandbox from starting): the default is used and the first lines of the log say which
//! values are valid.

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The most verbose level written.
const LEVEL_ENV: &str = "DYNOCAP_LOG";
/// `json` for one JSON object per line; `text` (the default) for people.
const FORMAT_ENV: &str = "DYNOCAP_LOG_FORMAT";

const LEVELS: &str = "error, warn, info, debug or trace";

/// The log's settings, and what was wrong with the variables they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub level: LevelFilter,
    pub json: bool,
    /// One message per variable whose value was not understood.
    pub problems: Vec<String>,
}

impl Settings {
    /// The settings `DYNOCAP_LOG` and `DYNOCAP_LOG_FORMAT` give (unset when blank; read in
    /// `config`).
    pub fn parse(level: Option<&str>, format: Option<&str>) -> Self {
        let mut problems = Vec::new();
        let level = match level.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("info") => LevelFilter::INFO,
            Some("error") => LevelFilter::ERROR,
            Some("warn" | "warning") => LevelFilter::WARN,
            Some("debug") => LevelFilter::DEBUG,
            Some("trace") => LevelFilter::TRACE,
            Some(_) => {
                problems.push(format!(
                    "{LEVEL_ENV}={} is not a log level; use {LEVELS} (logging at info)",
                    level.unwrap_or_default()
                ));
                LevelFilter::INFO
            }
        };
        let json = match format.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(_) => {
                problems.push(format!(
                    "{FORMAT_ENV}={} is not a log format; use json or text (logging as text)",
                    format.unwrap_or_default()
                ));
                false
            }
        };
        Self {
            level,
            json,
            problems,
        }
    }

    /// Our own events at `level`; other crates' at warnings unless `debug` or `trace`.
    fn filter(&self) -> Targets {
        let others = if self.level >= LevelFilter::DEBUG {
            self.level
        } else {
            self.level.min(LevelFilter::WARN)
        };
        // A prefix: `dynocap`, `dynocap_engine`, `dynocap_backend_jail`.
        Targets::new()
            .with_target("dynocap", self.level)
            .with_default(others)
    }
}

/// Installs the process-wide subscriber writing to `writer`, then logs the settings'
/// problems. A second call (a subscriber is already installed) changes nothing.
pub fn init<W>(settings: &Settings, writer: W)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(writer);
    let layer = if settings.json {
        layer
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(settings.filter())
            .boxed()
    } else {
        layer.with_filter(settings.filter()).boxed()
    };
    if tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .is_ok()
    {
        for problem in &settings.problems {
            tracing::warn!("{problem}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_formats_are_read_and_defaulted() {
        let default = Settings::parse(None, None);
        assert_eq!((default.level, default.json), (LevelFilter::INFO, false));
        assert!(default.problems.is_empty());
        let chosen = Settings::parse(Some("DEBUG"), Some("json"));
        assert_eq!((chosen.level, chosen.json), (LevelFilter::DEBUG, true));
        assert_eq!(
            Settings::parse(Some("error"), Some("text")).level,
            LevelFilter::ERROR
        );
    }

    #[test]
    fn a_bad_value_falls_back_and_names_the_valid_ones() {
        let bad = Settings::parse(Some("verbose"), Some("xml"));
        assert_eq!((bad.level, bad.json), (LevelFilter::INFO, false));
        assert_eq!(bad.problems.len(), 2, "{:?}", bad.problems);
        assert!(bad.problems[0].contains("DYNOCAP_LOG=verbose"));
        assert!(bad.problems[0].contains("error, warn, info, debug or trace"));
        assert!(bad.problems[1].contains("DYNOCAP_LOG_FORMAT=xml"));
        assert!(bad.problems[1].contains("json or text"));
    }

    #[test]
    fn other_crates_stay_at_warnings_below_debug() {
        use tracing::Level;
        let info = Settings::parse(Some("info"), None).filter();
        assert!(info.would_enable("dynocap_engine::supervisor", &Level::INFO));
        assert!(!info.would_enable("dynocap_engine::supervisor", &Level::DEBUG));
        assert!(!info.would_enable("rmcp::service", &Level::INFO));
        assert!(info.would_enable("rmcp::service", &Level::WARN));
        let debug = Settings::parse(Some("debug"), None).filter();
        assert!(debug.would_enable("rmcp::service", &Level::DEBUG));
        assert!(!debug.would_enable("rmcp::service", &Level::TRACE));
        let error = Settings::parse(Some("error"), None).filter();
        assert!(!error.would_enable("rmcp::service", &Level::WARN));
    }
}
