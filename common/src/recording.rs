//! Recording format v1: one exchange per JSON line, `.jsonl` or `.jsonl.gz`.
//!
//! The reader streams: it holds one line at a time, never the whole file. Every error names
//! the file, the line and the field (`rec.jsonl:812: request.body: invalid type: ...`).
//! Unknown fields are kept (and written back) but otherwise ignored.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};

/// Request headers never written to a recording nor sent from one (credentials).
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "proxy-authorization",
    "x-amz-security-token",
    "x-amz-date",
];

/// Headers about one connection rather than the exchange (RFC 9110 §7.6.1): never forwarded,
/// stored in a recording, or replayed from one.
pub const HOP_BY_HOP_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// True when `name` (any case) is a hop-by-hop header.
pub fn is_hop_by_hop_header(name: &str) -> bool {
    HOP_BY_HOP_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
}

/// True when `name` (any case) is a credential header by the built-in list.
pub fn is_credential_header(name: &str) -> bool {
    CREDENTIAL_HEADERS
        .iter()
        .any(|c| c.eq_ignore_ascii_case(name))
}

/// One recorded request and (optionally) its response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Exchanges of one session replay in order, on one worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Arrival offset from the recording's start, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<f64>,
    pub request: Request,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<Response>,
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// The recorded request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    #[serde(default = "default_method")]
    pub method: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The body as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body as base64, for non-UTF-8 bodies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_b64: Option<String>,
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

fn default_method() -> String {
    "POST".to_owned()
}

/// The recorded response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub status: u16,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub frames: Vec<Frame>,
    /// The stream reached its family's terminal marker.
    #[serde(default)]
    pub complete: bool,
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// The bytes of one network read and their arrival offset from the moment the request was
/// sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
}

impl Frame {
    /// A frame from raw bytes: text when UTF-8, base64 otherwise.
    pub fn from_bytes(t_ms: Option<f64>, bytes: &[u8]) -> Frame {
        match std::str::from_utf8(bytes) {
            Ok(text) => Frame {
                t_ms,
                data: Some(text.to_owned()),
                data_b64: None,
            },
            Err(_) => Frame {
                t_ms,
                data: None,
                data_b64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            },
        }
    }

    /// The frame's bytes (validated at read time, so decoding cannot fail here).
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        match (&self.data, &self.data_b64) {
            (Some(text), _) => Cow::Borrowed(text.as_bytes()),
            (None, Some(b64)) => Cow::Owned(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap_or_default(),
            ),
            (None, None) => Cow::Borrowed(&[]),
        }
    }
}

impl Request {
    /// The body bytes (validated at read time).
    pub fn body_bytes(&self) -> Cow<'_, [u8]> {
        match (&self.body, &self.body_b64) {
            (Some(text), _) => Cow::Borrowed(text.as_bytes()),
            (None, Some(b64)) => Cow::Owned(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap_or_default(),
            ),
            (None, None) => Cow::Borrowed(&[]),
        }
    }

    /// Set the body from bytes: text when UTF-8, base64 otherwise.
    pub fn set_body(&mut self, bytes: &[u8]) {
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                self.body = Some(text.to_owned());
                self.body_b64 = None;
            }
            Err(_) => {
                self.body = None;
                self.body_b64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
            }
        }
    }

    /// The header `name` (any case), if recorded.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Response {
    /// The header `name` (any case), if recorded.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// True when every frame has a recorded offset (and there is at least one frame).
    pub fn has_timing(&self) -> bool {
        !self.frames.is_empty() && self.frames.iter().all(|f| f.t_ms.is_some())
    }
}

/// A problem reading a recording. Displays as `file:line: field: what`.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("{}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {source}", path.display())]
    Io {
        path: PathBuf,
        line: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {field}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        line: u64,
        /// Dotted path of the offending field (`request.body`), or `(line)` for the line.
        field: String,
        message: String,
    },
    /// The last line has no newline and does not parse: a writer was killed mid-line.
    #[error("{}:{line}: torn last line (the writer stopped mid-line); it was not read", path.display())]
    TornLastLine { path: PathBuf, line: u64 },
}

impl RecordingError {
    /// The 1-based line number the error is about, if any.
    pub fn line(&self) -> Option<u64> {
        match self {
            RecordingError::Open { .. } => None,
            RecordingError::Io { line, .. }
            | RecordingError::Invalid { line, .. }
            | RecordingError::TornLastLine { line, .. } => Some(*line),
        }
    }
}

/// Streams the exchanges of a recording, one line at a time.
pub struct RecordingReader {
    path: PathBuf,
    input: Box<dyn BufRead + Send>,
    line_no: u64,
    buf: String,
    done: bool,
}

impl RecordingReader {
    /// Open `path`; `.gz` files are decompressed on the fly.
    pub fn open(path: impl AsRef<Path>) -> Result<RecordingReader, RecordingError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| RecordingError::Open {
            path: path.clone(),
            source,
        })?;
        let input: Box<dyn BufRead + Send> = if is_gzip_path(&path) {
            Box::new(BufReader::with_capacity(
                256 * 1024,
                flate2::read::MultiGzDecoder::new(file),
            ))
        } else {
            Box::new(BufReader::with_capacity(256 * 1024, file))
        };
        Ok(RecordingReader::from_reader(path, input))
    }

    /// Read from any buffered reader; `path` is used in messages only.
    pub fn from_reader(path: PathBuf, input: Box<dyn BufRead + Send>) -> RecordingReader {
        RecordingReader {
            path,
            input,
            line_no: 0,
            buf: String::new(),
            done: false,
        }
    }

    /// The file this reader reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn invalid(&self, field: impl Into<String>, message: impl Into<String>) -> RecordingError {
        RecordingError::Invalid {
            path: self.path.clone(),
            line: self.line_no,
            field: field.into(),
            message: message.into(),
        }
    }

    fn parse_line(&self, line: &str) -> Result<Exchange, RecordingError> {
        let mut de = serde_json::Deserializer::from_str(line);
        let exchange: Exchange = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." || field.is_empty() {
                "(line)".to_owned()
            } else {
                field
            };
            self.invalid(field, e.into_inner().to_string())
        })?;
        de.end()
            .map_err(|e| self.invalid("(line)", format!("trailing characters: {e}")))?;
        self.validate(&exchange)?;
        Ok(exchange)
    }

    fn validate(&self, exchange: &Exchange) -> Result<(), RecordingError> {
        let request = &exchange.request;
        if !request.path.starts_with('/') {
            return Err(self.invalid(
                "request.path",
                format!("expected a path starting with '/', got {:?}", request.path),
            ));
        }
        if request.method.is_empty() || !request.method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(self.invalid(
                "request.method",
                format!(
                    "expected an upper-case HTTP method, got {:?}",
                    request.method
                ),
            ));
        }
        if request.body.is_some() && request.body_b64.is_some() {
            return Err(self.invalid("request.body_b64", "give either body or body_b64, not both"));
        }
        if let Some(b64) = &request.body_b64
            && base64::engine::general_purpose::STANDARD
                .decode(b64)
                .is_err()
        {
            return Err(self.invalid("request.body_b64", "expected standard base64"));
        }
        if let Some(at) = exchange.at_ms
            && !(at.is_finite() && at >= 0.0)
        {
            return Err(self.invalid("at_ms", format!("expected a non-negative number, got {at}")));
        }
        if let Some(response) = &exchange.response {
            for (i, frame) in response.frames.iter().enumerate() {
                let field = |name: &str| format!("response.frames[{i}].{name}");
                if frame.data.is_some() && frame.data_b64.is_some() {
                    return Err(
                        self.invalid(field("data_b64"), "give either data or data_b64, not both")
                    );
                }
                if let Some(b64) = &frame.data_b64
                    && base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .is_err()
                {
                    return Err(self.invalid(field("data_b64"), "expected standard base64"));
                }
                if let Some(t) = frame.t_ms
                    && !(t.is_finite() && t >= 0.0)
                {
                    return Err(self.invalid(
                        field("t_ms"),
                        format!("expected a non-negative number, got {t}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The next exchange with its 1-based line number; `None` at the end.
    pub fn next_exchange(&mut self) -> Option<Result<(u64, Exchange), RecordingError>> {
        loop {
            if self.done {
                return None;
            }
            self.buf.clear();
            self.line_no += 1;
            let read = self.input.read_line(&mut self.buf);
            match read {
                Ok(0) => {
                    self.done = true;
                    return None;
                }
                Ok(_) => {}
                Err(source) => {
                    self.done = true;
                    return Some(Err(RecordingError::Io {
                        path: self.path.clone(),
                        line: self.line_no,
                        source,
                    }));
                }
            }
            let has_newline = self.buf.ends_with('\n');
            let line = self.buf.trim();
            if line.is_empty() {
                continue;
            }
            return Some(match self.parse_line(line) {
                Ok(exchange) => Ok((self.line_no, exchange)),
                Err(_) if !has_newline => {
                    self.done = true;
                    Err(RecordingError::TornLastLine {
                        path: self.path.clone(),
                        line: self.line_no,
                    })
                }
                Err(e) => Err(e),
            });
        }
    }
}

impl Iterator for RecordingReader {
    type Item = Result<(u64, Exchange), RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_exchange()
    }
}

fn is_gzip_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"))
}

/// Writes exchanges, one whole line per call.
pub struct RecordingWriter {
    out: Box<dyn Write + Send>,
}

impl RecordingWriter {
    /// Create (truncate) `path`; `.gz` paths are gzip-compressed.
    pub fn create(path: impl AsRef<Path>) -> std::io::Result<RecordingWriter> {
        let path = path.as_ref();
        let file = File::create(path)?;
        let out: Box<dyn Write + Send> = if is_gzip_path(path) {
            Box::new(flate2::write::GzEncoder::new(
                BufWriter::new(file),
                flate2::Compression::default(),
            ))
        } else {
            Box::new(BufWriter::new(file))
        };
        Ok(RecordingWriter { out })
    }

    /// Write to any writer.
    pub fn from_writer(out: Box<dyn Write + Send>) -> RecordingWriter {
        RecordingWriter { out }
    }

    /// Append one exchange as one line. Credential headers are dropped.
    pub fn write(&mut self, exchange: &Exchange) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&without_credentials(exchange))?;
        line.push(b'\n');
        self.out.write_all(&line)
    }

    /// Flush buffered lines.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Flush and finish (writes the gzip trailer).
    pub fn finish(mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn without_credentials(exchange: &Exchange) -> Cow<'_, Exchange> {
    if exchange
        .request
        .headers
        .keys()
        .any(|k| is_credential_header(k))
    {
        let mut clean = exchange.clone();
        clean
            .request
            .headers
            .retain(|k, _| !is_credential_header(k));
        Cow::Owned(clean)
    } else {
        Cow::Borrowed(exchange)
    }
}

/// Read a whole small input into memory (used for tests and tiny files only).
pub fn read_all(path: impl AsRef<Path>) -> Result<Vec<Exchange>, RecordingError> {
    let mut out = Vec::new();
    for item in RecordingReader::open(path)? {
        out.push(item?.1);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(text: &str) -> RecordingReader {
        RecordingReader::from_reader(
            PathBuf::from("rec.jsonl"),
            Box::new(std::io::Cursor::new(text.as_bytes().to_vec())),
        )
    }

    #[test]
    fn reads_example_line_and_keeps_unknown_fields() {
        let line = r#"{"id":"7f3a","session":"conv-12","at_ms":1834.2,"x":1,"request":{"method":"POST","path":"/v1/chat/completions","headers":{"content-type":"application/json"},"body":"{}"},"response":{"status":200,"headers":{"content-type":"text/event-stream"},"frames":[{"t_ms":301.52,"data":"data: {}\n\n"},{"t_ms":322.1,"data_b64":"AAAA"}],"complete":true}}"#;
        let mut r = reader(&format!("{line}\n"));
        let (n, ex) = r.next().expect("one line").expect("valid");
        assert_eq!(n, 1);
        assert_eq!(ex.session.as_deref(), Some("conv-12"));
        assert_eq!(ex.unknown.get("x"), Some(&serde_json::json!(1)));
        let resp = ex.response.as_ref().expect("response");
        assert_eq!(resp.frames[1].bytes().as_ref(), &[0, 0, 0]);
        assert!(resp.has_timing());
        let again = serde_json::to_string(&ex).expect("serializes");
        let back: Exchange = serde_json::from_str(&again).expect("round trip");
        assert_eq!(back, ex);
        assert!(r.next().is_none());
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let good = r#"{"request":{"path":"/v1/completions","body":"{}"}}"#;
        let bad = r#"{"request":{"path":"/v1/completions","body":3}}"#;
        let mut r = reader(&format!("{good}\n\n{bad}\n"));
        assert!(r.next().expect("line 1").is_ok());
        let err = r.next().expect("line 3").expect_err("bad body");
        let msg = err.to_string();
        assert!(msg.starts_with("rec.jsonl:3: request.body: "), "{msg}");
        assert!(msg.contains("expected a string"), "{msg}");
    }

    #[test]
    fn torn_last_line_is_reported_not_fatal() {
        let good = r#"{"request":{"path":"/v1/completions"}}"#;
        let mut r = reader(&format!("{good}\n{{\"request\":{{\"pa"));
        assert!(r.next().expect("line 1").is_ok());
        let err = r.next().expect("line 2").expect_err("torn");
        assert!(matches!(err, RecordingError::TornLastLine { line: 2, .. }));
        assert!(r.next().is_none());
    }

    #[test]
    fn writer_drops_credentials_and_gzip_round_trips() {
        let dir = std::env::temp_dir().join(format!("llm-replay-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("r.jsonl.gz");
        let mut ex: Exchange = serde_json::from_str(
            r#"{"request":{"path":"/v1/messages","headers":{"X-Api-Key":"sk-secret","content-type":"application/json"}}}"#,
        )
        .expect("valid");
        ex.at_ms = Some(5.0);
        let mut w = RecordingWriter::create(&path).expect("create");
        w.write(&ex).expect("write");
        w.finish().expect("finish");
        let back = read_all(&path).expect("read back");
        assert_eq!(back.len(), 1);
        assert!(back[0].request.header("x-api-key").is_none());
        assert_eq!(
            back[0].request.header("content-type"),
            Some("application/json")
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
