//! Recording format v1: one exchange per JSON line, `.jsonl` or `.jsonl.gz`.
//!
//! The reader streams: it holds one line at a time, never the whole file, and no line longer
//! than [`MAX_LINE_BYTES`]. Every error names the file, the line and the field
//! (`rec.jsonl:812: request.body: invalid type: ...`). Offsets (`at_ms`, `t_ms`) are checked
//! to be finite, non-negative and under [`MAX_OFFSET_MS`], so no later arithmetic on them can
//! overflow. A torn last line (a writer killed mid-line) is skipped and reported by
//! [`RecordingReader::torn_last_line`], the same way for every command. Unknown fields are
//! kept (and written back) but otherwise ignored.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};

/// Longest recording line read (64 MiB): a longer one is an error naming its line, so a
/// small compressed file cannot make the reader hold gigabytes.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Largest arrival or frame offset accepted, in milliseconds (one year).
pub const MAX_OFFSET_MS: f64 = 365.0 * 24.0 * 3600.0 * 1000.0;

/// Request headers never written to a recording nor sent from one (credentials).
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "proxy-authorization",
    "x-amz-security-token",
    "x-amz-date",
    "x-goog-api-key",
    "ocp-apim-subscription-key",
    "x-auth-token",
];

/// Parts of a header name that mark it as a credential whatever the rest is
/// (`x-vendor-api-key`, `x-session-token`, `x-client-secret`): nothing that looks like a
/// credential is recorded or replayed.
pub const CREDENTIAL_HEADER_PARTS: &[&str] = &[
    "api-key",
    "api_key",
    "apikey",
    "auth",
    "token",
    "secret",
    "password",
    "passwd",
    "subscription-key",
    "signature",
    "cookie",
];

/// Query parameters that carry credentials (`?key=` for Gemini, `?api-key=` for Azure,
/// signed-URL parameters); dropped from recorded paths, replayed paths and shown URLs.
pub const CREDENTIAL_QUERY_PARAMS: &[&str] = &[
    "key",
    "api-key",
    "api_key",
    "apikey",
    "access_token",
    "token",
    "auth",
    "password",
    "secret",
    "sig",
    "signature",
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "code",
];

/// True when the query parameter `name` (any case) carries a credential.
pub fn is_credential_query_param(name: &str) -> bool {
    CREDENTIAL_QUERY_PARAMS
        .iter()
        .any(|c| c.eq_ignore_ascii_case(name))
}

/// `path` (with an optional `?query`) without its credential query parameters.
pub fn strip_credential_query(path: &str) -> Cow<'_, str> {
    let Some((base, query)) = path.split_once('?') else {
        return Cow::Borrowed(path);
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| !is_credential_query_param(pair.split('=').next().unwrap_or_default()))
        .collect();
    if kept.len() == query.split('&').filter(|p| !p.is_empty()).count() {
        return Cow::Borrowed(path);
    }
    let mut out = base.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    Cow::Owned(out)
}

/// A URL fit to show: user and password replaced by `***`, credential query values by
/// `REDACTED`. Everything else is kept, so the target stays recognisable in a report.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        None => tail.to_owned(),
        Some((path, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if is_credential_query_param(name) => {
                        format!("{name}=REDACTED")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            let mut out = format!("{path}?{}", query.join("&"));
            if let Some(fragment) = fragment {
                out.push('#');
                out.push_str(fragment);
            }
            out
        }
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{authority}{tail}"),
        None => format!("{authority}{tail}"),
    }
}

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

/// True when `name` (any case) is a credential header: in the built-in list, or containing
/// one of [`CREDENTIAL_HEADER_PARTS`].
pub fn is_credential_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    CREDENTIAL_HEADERS.iter().any(|c| *c == lower)
        || CREDENTIAL_HEADER_PARTS
            .iter()
            .any(|part| lower.contains(part))
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
}

impl RecordingError {
    /// The 1-based line number the error is about, if any.
    pub fn line(&self) -> Option<u64> {
        match self {
            RecordingError::Open { .. } => None,
            RecordingError::Io { line, .. } | RecordingError::Invalid { line, .. } => Some(*line),
        }
    }
}

/// Streams the exchanges of a recording, one line at a time.
pub struct RecordingReader {
    path: PathBuf,
    input: Box<dyn BufRead + Send>,
    line_no: u64,
    buf: Vec<u8>,
    done: bool,
    torn_last_line: Option<u64>,
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
            buf: Vec::new(),
            done: false,
            torn_last_line: None,
        }
    }

    /// The line number of a torn last line (no newline, does not parse: the writer stopped
    /// mid-line), once the reader reached it. It is skipped, never an error: every command
    /// reports it as a warning.
    pub fn torn_last_line(&self) -> Option<u64> {
        self.torn_last_line
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
            && !offset_ok(at)
        {
            return Err(self.invalid(
                "at_ms",
                format!("expected a non-negative number of milliseconds under one year, got {at}"),
            ));
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
                    && !offset_ok(t)
                {
                    return Err(self.invalid(
                        field("t_ms"),
                        format!(
                            "expected a non-negative number of milliseconds under one year, got {t}"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Read the next non-empty line into `buf`: `Ok(Some((start, end, has_newline)))` with the
    /// trimmed line at `buf[start..end]`, `Ok(None)` at the end (or at a torn last line that
    /// is not UTF-8). Shared by every way of reading, so the line limit and the torn-last-line
    /// policy are the same for all.
    fn read_line(&mut self) -> Result<Option<(usize, usize, bool)>, RecordingError> {
        loop {
            if self.done {
                return Ok(None);
            }
            self.buf.clear();
            self.line_no += 1;
            let read = (&mut self.input)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut self.buf);
            match read {
                Ok(0) => {
                    self.done = true;
                    return Ok(None);
                }
                Ok(_) => {}
                Err(source) => {
                    self.done = true;
                    return Err(RecordingError::Io {
                        path: self.path.clone(),
                        line: self.line_no,
                        source,
                    });
                }
            }
            if self.buf.len() > MAX_LINE_BYTES {
                self.done = true;
                return Err(self.invalid("(line)", format!("line over {MAX_LINE_BYTES} bytes")));
            }
            let has_newline = self.buf.ends_with(b"\n");
            let line = match std::str::from_utf8(&self.buf) {
                Ok(line) => line,
                Err(_) if !has_newline => {
                    self.done = true;
                    self.torn_last_line = Some(self.line_no);
                    return Ok(None);
                }
                Err(e) => return Err(self.invalid("(line)", format!("not UTF-8: {e}"))),
            };
            let trimmed = line.trim();
            if trimmed.is_empty() {
                continue;
            }
            let start = trimmed.as_ptr() as usize - line.as_ptr() as usize;
            return Ok(Some((start, start + trimmed.len(), has_newline)));
        }
    }

    /// The next exchange with its 1-based line number; `None` at the end.
    pub fn next_exchange(&mut self) -> Option<Result<(u64, Exchange), RecordingError>> {
        let (start, end, has_newline) = match self.read_line() {
            Ok(Some(found)) => found,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let line = std::str::from_utf8(&self.buf[start..end]).expect("checked by read_line");
        match self.parse_line(line) {
            Ok(exchange) => Some(Ok((self.line_no, exchange))),
            Err(_) if !has_newline => {
                self.done = true;
                self.torn_last_line = Some(self.line_no);
                None
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// The next line split into its top-level fields, values left unparsed
    /// ([`RawExchange`]), with its 1-based line number; `None` at the end. For readers that
    /// need a few fields of every line (which worker replays it) and the rest of only some
    /// lines: nothing is decoded until asked for. The line's values are not validated here
    /// (the scan that precedes a replay validates every line with [`Self::next_exchange`]);
    /// a line that is not a JSON object is an error naming it, a torn last line is skipped
    /// as everywhere else.
    pub fn next_raw(&mut self) -> Option<Result<RawExchange<'_>, RecordingError>> {
        let (start, end, has_newline) = match self.read_line() {
            Ok(Some(found)) => found,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let line_no = self.line_no;
        // Disjoint fields: the line stays borrowed from `buf` while `done` and
        // `torn_last_line` change.
        let text = std::str::from_utf8(&self.buf[start..end]).expect("checked by read_line");
        match RawFields::parse(text) {
            Ok(fields) => Some(Ok(RawExchange {
                path: &self.path,
                line: line_no,
                fields: fields.0,
            })),
            Err(_) if !has_newline => {
                self.done = true;
                self.torn_last_line = Some(line_no);
                None
            }
            Err(e) => Some(Err(self.invalid("(line)", e.to_string()))),
        }
    }
}

/// One top-level field of a recording line: its name and its value's JSON text.
type RawField<'a> = (Cow<'a, str>, &'a serde_json::value::RawValue);

/// A line's top-level fields in file order (a JSON object read as a sequence of pairs).
struct RawFields<'a>(Vec<RawField<'a>>);

impl<'a> RawFields<'a> {
    fn parse(line: &'a str) -> Result<RawFields<'a>, serde_json::Error> {
        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = Vec<RawField<'de>>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut pairs = Vec::with_capacity(8);
                while let Some(pair) =
                    map.next_entry::<Cow<'de, str>, &'de serde_json::value::RawValue>()?
                {
                    pairs.push(pair);
                }
                Ok(pairs)
            }
        }
        let mut de = serde_json::Deserializer::from_str(line);
        let pairs = serde::Deserializer::deserialize_map(&mut de, Pairs)?;
        de.end()?;
        Ok(RawFields(pairs))
    }
}

/// One recording line split into its top-level fields, each value kept as the JSON text it
/// was written as ([`RecordingReader::next_raw`]). A few fields are decoded on request;
/// [`RawExchange::to_json_without_response`] writes the line back without its response
/// and with the fields a later pass over the recording changes, without decoding the rest.
pub struct RawExchange<'a> {
    path: &'a Path,
    line: u64,
    fields: Vec<RawField<'a>>,
}

impl<'a> RawExchange<'a> {
    /// The 1-based line number.
    pub fn line(&self) -> u64 {
        self.line
    }

    fn raw(&self, name: &str) -> Option<&'a serde_json::value::RawValue> {
        self.fields
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| *value)
    }

    fn field<T: Deserialize<'a>>(&self, name: &str) -> Result<Option<T>, RecordingError> {
        match self.raw(name) {
            None => Ok(None),
            Some(raw) => {
                serde_json::from_str::<Option<T>>(raw.get()).map_err(|e| RecordingError::Invalid {
                    path: self.path.to_path_buf(),
                    line: self.line,
                    field: name.to_owned(),
                    message: e.to_string(),
                })
            }
        }
    }

    /// A reader at this line, for its messages and checks.
    fn reader(&self) -> RecordingReader {
        RecordingReader {
            path: self.path.to_path_buf(),
            input: Box::new(std::io::empty()),
            line_no: self.line,
            buf: Vec::new(),
            done: true,
            torn_last_line: None,
        }
    }

    /// The `session` field.
    pub fn session(&self) -> Result<Option<Cow<'a, str>>, RecordingError> {
        self.field::<Cow<'a, str>>("session")
    }

    /// The `at_ms` field.
    pub fn at_ms(&self) -> Result<Option<f64>, RecordingError> {
        self.field::<f64>("at_ms")
    }

    /// Decode the whole line (for the lines a reader needs whole), validated as
    /// [`RecordingReader::next_exchange`] would.
    pub fn parse(&self) -> Result<Exchange, RecordingError> {
        let mut text = String::from("{");
        for (i, (key, value)) in self.fields.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            push_json_string(&mut text, key);
            text.push(':');
            text.push_str(value.get());
        }
        text.push('}');
        self.reader().parse_line(&text)
    }

    /// [`Self::to_json_without_response`], checked as [`RecordingReader::next_exchange`]
    /// checks a line (types, path, method, base64, offsets): an exchange that would not
    /// replay is an error naming this file, line and field here, not a puzzle on a worker.
    /// The response is neither decoded nor checked.
    pub fn checked_json_without_response(
        &self,
        session: Option<&str>,
        at_ms: Option<f64>,
    ) -> Result<Vec<u8>, RecordingError> {
        let json = self.to_json_without_response(session, at_ms);
        let text = std::str::from_utf8(&json).expect("built from UTF-8 text");
        self.reader().parse_line(text)?;
        Ok(json)
    }

    /// The line as JSON without its `response`, with `session` and `at_ms` replaced when
    /// given (a later pass renames sessions and shifts arrivals). Every other field is
    /// copied as written.
    pub fn to_json_without_response(&self, session: Option<&str>, at_ms: Option<f64>) -> Vec<u8> {
        let mut out = String::with_capacity(
            self.fields
                .iter()
                .map(|(key, value)| key.len() + value.get().len() + 4)
                .sum::<usize>()
                + 2,
        );
        out.push('{');
        let mut first = true;
        let mut field = |out: &mut String, key: &str, value: &str| {
            if !first {
                out.push(',');
            }
            first = false;
            push_json_string(out, key);
            out.push(':');
            out.push_str(value);
        };
        for (key, value) in &self.fields {
            match key.as_ref() {
                "response" => {}
                "session" if session.is_some() => {}
                "at_ms" if at_ms.is_some() => {}
                name => field(&mut out, name, value.get()),
            }
        }
        if let Some(session) = session {
            let mut quoted = String::new();
            push_json_string(&mut quoted, session);
            field(&mut out, "session", &quoted);
        }
        if let Some(at) = at_ms {
            let number = serde_json::Number::from_f64(at)
                .map(|n| n.to_string())
                .unwrap_or_else(|| "null".to_owned());
            field(&mut out, "at_ms", &number);
        }
        out.push('}');
        out.into_bytes()
    }
}

/// Append `text` as a JSON string literal.
fn push_json_string(out: &mut String, text: &str) {
    out.push_str(&serde_json::to_string(text).expect("a string always serializes"));
}

impl Iterator for RecordingReader {
    type Item = Result<(u64, Exchange), RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_exchange()
    }
}

fn offset_ok(ms: f64) -> bool {
    ms.is_finite() && (0.0..=MAX_OFFSET_MS).contains(&ms)
}

fn is_gzip_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"))
}

/// Writes exchanges, one whole line per call.
pub struct RecordingWriter {
    out: Sink,
    /// Written to a temporary file renamed over this path by [`RecordingWriter::finish`].
    replace: Option<(PathBuf, PathBuf)>,
}

/// Where the lines go; gzip is finished explicitly so a failed trailer is an error.
enum Sink {
    Plain(Box<dyn Write + Send>),
    Gzip(flate2::write::GzEncoder<Box<dyn Write + Send>>),
}

impl Sink {
    fn for_path(path: &Path, file: File) -> Sink {
        let buffered: Box<dyn Write + Send> = Box::new(BufWriter::new(file));
        if is_gzip_path(path) {
            Sink::Gzip(flate2::write::GzEncoder::new(
                buffered,
                flate2::Compression::default(),
            ))
        } else {
            Sink::Plain(buffered)
        }
    }

    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Sink::Plain(out) => out,
            Sink::Gzip(out) => out,
        }
    }
}

/// True when `a` and `b` name the same existing file (through links or `..` alike).
pub fn is_same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The temporary sibling `path` is written to before it is renamed into place.
pub fn temporary_sibling(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".partial-{}", std::process::id()));
    path.with_file_name(name)
}

impl RecordingWriter {
    /// Create (truncate) `path` and append to it line by line (a recorder killed at any
    /// moment leaves every whole line readable); `.gz` paths are gzip-compressed.
    pub fn create(path: impl AsRef<Path>) -> std::io::Result<RecordingWriter> {
        let path = path.as_ref();
        let file = File::create(path)?;
        Ok(RecordingWriter {
            out: Sink::for_path(path, file),
            replace: None,
        })
    }

    /// Write a temporary sibling of `path` and rename it over `path` on
    /// [`RecordingWriter::finish`]: `path` is never seen half-written, and an input that is
    /// also the output is still readable while the output is written.
    pub fn create_replacing(path: impl AsRef<Path>) -> std::io::Result<RecordingWriter> {
        let path = path.as_ref();
        let temporary = temporary_sibling(path);
        let file = File::create(&temporary)?;
        Ok(RecordingWriter {
            out: Sink::for_path(path, file),
            replace: Some((temporary, path.to_path_buf())),
        })
    }

    /// Write to any writer.
    pub fn from_writer(out: Box<dyn Write + Send>) -> RecordingWriter {
        RecordingWriter {
            out: Sink::Plain(out),
            replace: None,
        }
    }

    /// Write gzip-compressed to any writer.
    pub fn from_writer_gzip(out: Box<dyn Write + Send>) -> RecordingWriter {
        RecordingWriter {
            out: Sink::Gzip(flate2::write::GzEncoder::new(
                out,
                flate2::Compression::default(),
            )),
            replace: None,
        }
    }

    /// Append one exchange as one line. Credential headers are dropped.
    pub fn write(&mut self, exchange: &Exchange) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&without_credentials(exchange))?;
        line.push(b'\n');
        self.out.writer().write_all(&line)
    }

    /// Flush buffered lines.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.writer().flush()
    }

    /// Flush and finish: writes the gzip trailer (an error is returned, not lost in a
    /// `Drop`), and renames a replacing writer's temporary file into place.
    pub fn finish(mut self) -> std::io::Result<()> {
        let replace = self.replace.take();
        let out = std::mem::replace(&mut self.out, Sink::Plain(Box::new(std::io::sink())));
        let mut inner = match out {
            Sink::Plain(out) => out,
            Sink::Gzip(encoder) => encoder.finish()?,
        };
        inner.flush()?;
        drop(inner);
        if let Some((temporary, path)) = replace {
            std::fs::rename(&temporary, &path)?;
        }
        Ok(())
    }
}

impl Drop for RecordingWriter {
    fn drop(&mut self) {
        // Not finished (an error on the way): the temporary file is not the output.
        if let Some((temporary, _)) = self.replace.take() {
            let _ = std::fs::remove_file(temporary);
        }
    }
}

fn without_credentials(exchange: &Exchange) -> Cow<'_, Exchange> {
    let path = strip_credential_query(&exchange.request.path);
    if matches!(path, Cow::Owned(_))
        || exchange
            .request
            .headers
            .keys()
            .any(|k| is_credential_header(k))
    {
        let mut clean = exchange.clone();
        clean.request.path = path.into_owned();
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
    fn raw_lines_give_the_same_exchange_and_drop_the_response_verbatim() {
        let line = r#"{"id":"7f3a","session":"conv-\"12\"","at_ms":1834.25,"x":{"y":[1,2]},"request":{"method":"POST","path":"/v1/chat/completions","body":"{\"a\":1}"},"response":{"status":200,"frames":[{"t_ms":301.5,"data":"data: {}\n\n"}]}}"#;
        let whole = reader(&format!("{line}\n"))
            .next()
            .expect("line")
            .expect("valid")
            .1;
        let mut r = reader(&format!("\n{line}\n"));
        let raw = r.next_raw().expect("one line").expect("an object");
        assert_eq!(raw.line(), 2);
        assert_eq!(
            raw.session().expect("a string").as_deref(),
            Some("conv-\"12\"")
        );
        assert_eq!(raw.at_ms().expect("a number"), Some(1834.25));
        assert_eq!(raw.parse().expect("valid"), whole);
        let mut expected = whole.clone();
        expected.response = None;
        let kept: Exchange =
            serde_json::from_slice(&raw.to_json_without_response(None, None)).expect("json");
        assert_eq!(kept, expected);
        let moved: Exchange = serde_json::from_slice(
            &raw.to_json_without_response(Some("conv-\"12\"#pass1"), Some(2834.25)),
        )
        .expect("json");
        expected.session = Some("conv-\"12\"#pass1".to_owned());
        expected.at_ms = Some(2834.25);
        assert_eq!(moved, expected);
        assert!(r.next_raw().is_none());
    }

    #[test]
    fn raw_lines_skip_a_torn_last_line_and_name_a_bad_one() {
        let good = r#"{"request":{"path":"/v1/completions"}}"#;
        let mut r = reader(&format!("{good}\n{{\"request\":{{\"pa"));
        assert!(r.next_raw().expect("line 1").is_ok());
        assert!(r.next_raw().is_none(), "the torn line is skipped");
        assert_eq!(r.torn_last_line(), Some(2));
        let mut r = reader(&format!("[1]\n{good}\n"));
        let err = r.next_raw().expect("line 1").err().expect("not an object");
        assert!(
            err.to_string().starts_with("rec.jsonl:1: (line): "),
            "{err}"
        );
        let mut r = reader("{\"session\":3,\"request\":{\"path\":\"/\"}}\n");
        let raw = r.next_raw().expect("line 1").expect("an object");
        let err = raw.session().expect_err("not a string").to_string();
        assert!(err.starts_with("rec.jsonl:1: session: "), "{err}");
        let mut r = reader(&format!("{good}\n{{\"request\": 42}}\n"));
        assert!(
            r.next_raw()
                .expect("line 1")
                .expect("an object")
                .checked_json_without_response(None, None)
                .is_ok()
        );
        let raw = r.next_raw().expect("line 2").expect("an object");
        let err = raw
            .checked_json_without_response(None, None)
            .expect_err("no request")
            .to_string();
        assert!(err.starts_with("rec.jsonl:2: request: "), "{err}");
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
        assert!(r.next().is_none(), "the torn line is skipped");
        assert_eq!(r.torn_last_line(), Some(2));
    }

    /// Accepts `room` bytes, then fails every write: a disk that fills up.
    struct FullAfter {
        room: usize,
    }

    impl Write for FullAfter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.room == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    "disk full",
                ));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_gzip_trailer_that_cannot_be_written_is_an_error() {
        let exchange: Exchange =
            serde_json::from_str(r#"{"request":{"path":"/v1/completions"}}"#).expect("valid");
        // How many bytes a flush writes before the trailer.
        let mut probe = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut line = serde_json::to_vec(&exchange).expect("json");
        line.push(b'\n');
        probe.write_all(&line).expect("write");
        probe.flush().expect("flush");
        let before_trailer = probe.get_ref().len();

        let mut writer = RecordingWriter::from_writer_gzip(Box::new(FullAfter {
            room: before_trailer,
        }));
        writer.write(&exchange).expect("buffered");
        writer.flush().expect("the body fits");
        assert!(
            writer.finish().is_err(),
            "the lost trailer must be reported"
        );
    }

    #[test]
    fn a_replacing_writer_leaves_the_old_file_until_it_finishes() {
        let dir = std::env::temp_dir().join(format!("llm-replay-replace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("r.jsonl");
        std::fs::write(&path, "old\n").expect("write");
        let exchange: Exchange =
            serde_json::from_str(r#"{"request":{"path":"/v1/completions"}}"#).expect("valid");
        let mut writer = RecordingWriter::create_replacing(&path).expect("create");
        writer.write(&exchange).expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "old\n");
        drop(writer);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "old\n");
        assert!(
            !temporary_sibling(&path).exists(),
            "an unfinished output is removed"
        );
        let mut writer = RecordingWriter::create_replacing(&path).expect("create");
        writer.write(&exchange).expect("write");
        writer.finish().expect("finish");
        assert!(
            std::fs::read_to_string(&path)
                .expect("read")
                .contains("/v1/completions")
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn credentials_in_headers_queries_and_urls() {
        for name in [
            "Authorization",
            "x-goog-api-key",
            "Ocp-Apim-Subscription-Key",
            "x-auth-token",
            "x-vendor-api-key",
            "X-Session-Token",
        ] {
            assert!(is_credential_header(name), "{name}");
        }
        for name in [
            "content-type",
            "anthropic-version",
            "openai-organization",
            "x-amz-content-sha256",
        ] {
            assert!(!is_credential_header(name), "{name}");
        }
        assert_eq!(
            strip_credential_query("/v1beta/models/g:streamGenerateContent?alt=sse&key=AIza123"),
            "/v1beta/models/g:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            strip_credential_query("/openai/deployments/d/chat/completions?api-key=s3cret"),
            "/openai/deployments/d/chat/completions"
        );
        assert!(matches!(
            strip_credential_query("/v1/chat/completions?api-version=1"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            redact_url("https://user:pa55@gpu:8443/base?api-key=s3cret&x=1"),
            "https://***@gpu:8443/base?api-key=REDACTED&x=1"
        );
        assert_eq!(redact_url("http://127.0.0.1:8000"), "http://127.0.0.1:8000");
    }

    #[test]
    fn huge_offsets_and_lines_are_errors_naming_the_line() {
        let mut r = reader("{\"at_ms\":1e300,\"request\":{\"path\":\"/v1/completions\"}}\n");
        let msg = r
            .next()
            .expect("line 1")
            .expect_err("huge at_ms")
            .to_string();
        assert!(msg.starts_with("rec.jsonl:1: at_ms: "), "{msg}");
        let line = r#"{"request":{"path":"/v1/completions"},"response":{"status":200,"frames":[{"t_ms":1e20,"data":"x"}]}}"#;
        let msg = reader(&format!("{line}\n"))
            .next()
            .expect("line 1")
            .expect_err("huge t_ms")
            .to_string();
        assert!(
            msg.starts_with("rec.jsonl:1: response.frames[0].t_ms: "),
            "{msg}"
        );
        // One line longer than the cap, read as a stream: an error, not a huge allocation.
        let big = format!(
            "{{\"request\":{{\"path\":\"/{}\"}}}}\n",
            "a".repeat(MAX_LINE_BYTES)
        );
        let mut r = reader(&big);
        let msg = r.next().expect("line 1").expect_err("too long").to_string();
        assert_eq!(
            msg,
            format!("rec.jsonl:1: (line): line over {MAX_LINE_BYTES} bytes")
        );
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
