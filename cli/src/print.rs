//! Every line the CLI shows goes through here, for two reasons:
//!
//! - a closed stdout (`llm-replay recording stats --json rec.jsonl | head -c 10`) must not
//!   panic the way `println!` does on `EPIPE`: the reader has gone, so the rest is dropped
//!   quietly and the command ends with the exit code it had; any other write error is the
//!   caller's to report;
//! - text that came from a recording, a peer or a server (model names, worker ids, file
//!   names, TLS problems, error messages) is shown with its control characters escaped
//!   (`common::text`), so it cannot rewrite the terminal.
//!
//! The report's terminal rendering adds its own colors, so it is rendered from a copy of the
//! report whose every string has been escaped ([`terminal_report`]).

use std::io::Write;

use common::text::{escape_controls, escape_controls_keep_lines};
use coordinator::report::{Report, render_terminal};

/// Write `text` to stdout as it is. A broken pipe is not an error (the reader has gone);
/// any other failure is returned.
pub fn stdout_raw(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let written = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Write `text` to stdout with every control character but line feeds and tabs escaped.
pub fn stdout_text(text: &str) -> std::io::Result<()> {
    stdout_raw(&escape_controls_keep_lines(text))
}

/// Write `text` and a line feed to stderr with its control characters escaped. A stderr that
/// cannot be written is ignored: there is nowhere left to say so.
pub fn stderr_line(text: &str) {
    let mut line = escape_controls_keep_lines(text).into_owned();
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The terminal rendering of `report`, every string of the report shown with its control
/// characters escaped; `color` adds the renderer's own ANSI colors.
pub fn terminal_report(report: &Report, color: bool) -> String {
    // The escaping is done on the report's JSON value: every string field, present and
    // future, and every map key, whatever its origin (a saved report is read from a file).
    let escaped = serde_json::to_value(report)
        .map(escape_value)
        .and_then(serde_json::from_value::<Report>);
    match escaped {
        Ok(escaped) => render_terminal(&escaped, color),
        // A report that does not survive the round trip (a non-finite number) is shown
        // without color, escaped whole.
        Err(_) => escape_controls_keep_lines(&render_terminal(report, false)).into_owned(),
    }
}

fn escape_value(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(text) => Value::String(escape_controls(&text).into_owned()),
        Value::Array(items) => Value::Array(items.into_iter().map(escape_value).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (escape_controls(&key).into_owned(), escape_value(value)))
                .collect(),
        ),
        other => other,
    }
}

/// `text` (JSON) with DEL, the C1 controls and the bidirectional overrides written as `\u`
/// escapes, which `serde_json` leaves raw (it escapes C0 only). The JSON value is unchanged:
/// these characters can only occur inside strings.
pub fn json_for_terminal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        // Pretty JSON's own line feeds are the only control characters outside strings.
        if common::text::is_unsafe_on_terminal(c) && c != '\n' {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// stderr for `tracing`: log lines quote peers and servers (`%error`), so they are escaped
/// like every other line (the subscriber is built without ANSI colors for this reason).
pub struct EscapedStderr;

impl Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The subscriber formats a whole event and writes it at once.
        let text = String::from_utf8_lossy(buf);
        let _ = std::io::stderr()
            .lock()
            .write_all(escape_controls_keep_lines(&text).as_bytes());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}
