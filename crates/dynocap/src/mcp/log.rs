//! The MCP server's log. Stdout belongs to the protocol, so every line goes to stderr (MCP
//! clients keep a server's stderr in their logs) and, when asked (`--log-file PATH`, or
//! `DYNOCAP_MCP_LOG=1` for `$DYNOCAP_HOME/logs/mcp.log`), is appended to a file too. The
//! SDK's own diagnostics (`tracing`, warnings and up) are routed to the same place.

use std::fmt::Display;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A cheap, cloneable handle on the log.
#[derive(Clone, Default)]
pub struct Log {
    file: Option<Arc<Mutex<File>>>,
    path: Option<PathBuf>,
}

impl Log {
    /// Logs to stderr only.
    pub fn stderr() -> Self {
        Self::default()
    }

    /// Logs to stderr and appends to `path` (created mode 0600 if missing).
    pub fn with_file(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Self {
            file: Some(Arc::new(Mutex::new(file))),
            path: Some(path.to_path_buf()),
        })
    }

    pub fn file_path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn info(&self, message: impl Display) {
        self.line("info", message);
    }

    pub fn warn(&self, message: impl Display) {
        self.line("warn", message);
    }

    fn line(&self, level: &str, message: impl Display) {
        let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let text = format!("{stamp} dynocap mcp {level}: {message}\n");
        self.write_raw(text.as_bytes());
    }

    fn write_raw(&self, bytes: &[u8]) {
        let _ = std::io::stderr().lock().write_all(bytes);
        if let Some(file) = &self.file {
            if let Ok(mut file) = file.lock() {
                let _ = file.write_all(bytes);
            }
        }
    }

    /// Routes `tracing` events (the MCP SDK's diagnostics) at WARN and above to this log.
    pub fn install_tracing(&self) {
        let log = self.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .with_target(true)
            .with_writer(move || TracingWriter { log: log.clone() })
            .try_init();
    }
}

/// One `tracing` event's bytes, forwarded to the log.
struct TracingWriter {
    log: Log,
}

impl Write for TracingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.log.write_raw(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
