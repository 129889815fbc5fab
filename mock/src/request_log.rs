//! `--request-log`: one JSON line per request on arrival, and one more when its client
//! cancels it mid-response (`"event":"cancelled"`). Lines are written synchronously, one
//! `write` each, so they are whole and on disk at once (tests read the file while the server
//! runs). Request lines carry no `event` key, as they always have.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// The open request log.
pub(crate) struct RequestLog {
    file: Mutex<File>,
}

impl RequestLog {
    /// Open `path` for appending (created if missing).
    pub(crate) fn open(path: &Path) -> std::io::Result<RequestLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(RequestLog {
            file: Mutex::new(file),
        })
    }

    /// A request arrived.
    pub(crate) fn request(
        &self,
        unix_ms: u64,
        method: &str,
        path: &str,
        exchange: Option<&str>,
        version: http::Version,
    ) {
        self.write(&serde_json::json!({
            "unix_ms": unix_ms,
            "method": method,
            "path": path,
            "exchange": exchange,
            "version": format!("{version:?}"),
        }));
    }

    /// The client of a request left at `unix_ns` with `frames_sent` frames handed over,
    /// `after` the request head arrived.
    pub(crate) fn cancelled(
        &self,
        unix_ns: u64,
        exchange: Option<&str>,
        path: &str,
        frames_sent: u64,
        after: Duration,
    ) {
        self.write(&serde_json::json!({
            "unix_ms": unix_ns / 1_000_000,
            "event": "cancelled",
            "exchange": exchange,
            "path": path,
            "frames_sent": frames_sent,
            // Microsecond resolution.
            "after_ms": (after.as_secs_f64() * 1e6).round() / 1e3,
        }));
    }

    fn write(&self, line: &serde_json::Value) {
        let mut text = line.to_string();
        text.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(error) = file.write_all(text.as_bytes()) {
            tracing::warn!(%error, "writing the request log failed");
        }
    }
}
