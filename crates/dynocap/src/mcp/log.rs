//! The MCP server's log. Stdout belongs to the protocol, so every line goes to stderr (MCP
//! clients keep a server's stderr in their logs) and, when asked (`--log-file PATH`, or
//! `DYNOCAP_MCP_LOG=1` for `$DYNOCAP_HOME/logs/mcp.log`), is appended to a file too. Lines are
//! `tracing` events, formatted and filtered as `crate::logging` says (`DYNOCAP_LOG`,
//! `DYNOCAP_LOG_FORMAT`); the SDK's own diagnostics land in the same place.

use std::fmt::Display;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::logging;

/// Target of the server's own events.
const TARGET: &str = "dynocap::mcp";

/// A cheap, cloneable handle on the log.
#[derive(Clone, Default)]
pub struct Log {
    /// The file the lines are appended to as well, once one is open.
    file: Arc<Mutex<Option<(File, PathBuf)>>>,
}

impl Log {
    /// Logs to stderr only (until [`Log::open_file`]).
    pub fn stderr() -> Self {
        Self::default()
    }

    /// Appends every later line to `path` too (created mode 0600 if missing).
    pub fn open_file(&self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        *self.file.lock().unwrap_or_else(PoisonError::into_inner) = Some((file, path.to_owned()));
        Ok(())
    }

    pub fn file_path(&self) -> Option<PathBuf> {
        self.file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(_, path)| path.clone())
    }

    pub fn info(&self, message: impl Display) {
        tracing::info!(target: TARGET, "{message}");
    }

    pub fn warn(&self, message: impl Display) {
        tracing::warn!(target: TARGET, "{message}");
    }

    /// Makes this log the process's `tracing` subscriber: before anything is logged, or the
    /// line is lost.
    pub fn install_tracing(&self, settings: &logging::Settings) {
        let log = self.clone();
        logging::init(settings, move || LineWriter { log: log.clone() });
    }

    fn write_raw(&self, bytes: &[u8]) {
        let _ = std::io::stderr().lock().write_all(bytes);
        if let Some((file, _)) = self
            .file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            let _ = file.write_all(bytes);
        }
    }
}

/// Where the subscriber writes an event: its formatted line comes in one write.
struct LineWriter {
    log: Log,
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.log.write_raw(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
