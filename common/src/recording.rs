//! Recording format v1: one exchange per JSON line, `.jsonl` or `.jsonl.gz`.
//!
//! The reader streams: it holds one line at a time, never the whole file, and no line longer
//! than [`MAX_LINE_BYTES`] (a longer one is skipped with a warning and counted,
//! [`RecordingReader::skipped_lines`]); writers keep every line under half that
//! ([`MAX_WRITTEN_LINE_BYTES`], [`write_line_within`]). Every error names the file, the line and the field
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

/// Longest recording line read (64 MiB), newline included: a longer one is skipped without
/// being held (a warning names its file and line, and [`RecordingReader::skipped_lines`]
/// counts it), so a small compressed file cannot make the reader hold gigabytes and one
/// huge exchange does not make a whole recording unreadable.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Longest line written by [`RecordingWriter`] and the recording proxy (32 MiB), newline
/// included: half of [`MAX_LINE_BYTES`], so whatever they write stays readable. A longer
/// exchange is stored cut and marked ([`write_line_within`]).
pub const MAX_WRITTEN_LINE_BYTES: usize = MAX_LINE_BYTES / 2;

/// How many line numbers of skipped over-long lines a reader keeps (it counts them all).
pub const SKIPPED_LINE_NUMBERS_KEPT: usize = 16;

/// Largest arrival or frame offset accepted, in milliseconds (one year).
pub const MAX_OFFSET_MS: f64 = 365.0 * 24.0 * 3600.0 * 1000.0;

/// Request headers never written to a recording nor sent from one (credentials), by exact
/// name (any case). Most are also caught by the word rule of [`is_credential_header`]; the
/// list names them anyway (it is the documented list) and holds the one the rule cannot
/// see: `x-amz-date`, part of a SigV4 signature.
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
    "x-llm-key",
    "x-access-key",
    "x-portkey-virtual-key",
];

/// Words that mark a header name or a query parameter name as a credential. A name is
/// split into words at `-`, `_`, `.` and spaces (after percent-decoding, for a query
/// parameter); any word equal to one of these makes it a credential (`x-llm-key`,
/// `x-client-secret`, `private_token`, `X-Amz-Credential`), and so does a last word that
/// ends with one of [`CREDENTIAL_WORD_ENDINGS`] (`apiKey`, `accessToken`, `clientSecret`
/// once lower-cased). Whole words, not substrings: `x-ratelimit-remaining-tokens` (a token
/// *count*) and `x-portkey-provider` are not credentials.
pub const CREDENTIAL_HEADER_PARTS: &[&str] = &[
    "key",
    "keys",
    "apikey",
    "secret",
    "secrets",
    "token",
    "auth",
    "authn",
    "authz",
    "authorization",
    "authentication",
    "authenticate",
    "password",
    "passwd",
    "pwd",
    "credential",
    "credentials",
    "signature",
    "sig",
    "cookie",
    "cookies",
    "jwt",
    "bearer",
];

/// Endings of a name's last word that mark it as a credential, for names written without
/// separators (`apikey`, `subscriptionkey`, `accesstoken`, `clientsecret`).
pub const CREDENTIAL_WORD_ENDINGS: &[&str] = &[
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "credentials",
    "signature",
];

/// Header names the word rule would catch that carry no secret and are kept (compared
/// lower-case, with `_` read as `-`; any prefix before them too, `x-idempotency-key`).
///
/// `idempotency-key` is kept: it is a random id the client picks so that a retried POST is
/// not executed twice (IETF draft "The Idempotency-Key HTTP Header Field"); it grants
/// nothing to whoever reads it, and some APIs require it on every POST, so a replay without
/// it would be refused. A replay sends the recorded key again: a server that deduplicates
/// on it may answer a repeated exchange from its cache (override it with `--header`).
/// Others that look similar but are not secrets — `anthropic-version`, `x-stainless-*`,
/// `openai-organization`, `openai-project`, `x-request-id` — have no credential word and
/// need no entry.
pub const HARMLESS_CREDENTIAL_LOOKALIKE_HEADERS: &[&str] = &["idempotency-key"];

/// Query parameters that carry credentials, by exact name (compared percent-decoded,
/// lower-case, with `_` read as `-`): `?key=` for Gemini, `?api-key=` for Azure OpenAI,
/// `?subscription-key=` for Azure API Management, OAuth's `access_token`, `client_secret`
/// and `code`, GitLab's `private_token`, signed-URL parameters. Names with a credential
/// word ([`CREDENTIAL_HEADER_PARTS`]) are caught as well. Dropped from recorded paths and
/// replayed paths; their values are shown as `REDACTED` in URLs.
pub const CREDENTIAL_QUERY_PARAMS: &[&str] = &[
    "key",
    "api-key",
    "apikey",
    "subscription-key",
    "access-token",
    "private-token",
    "client-secret",
    "token",
    "jwt",
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

/// Query parameters the word rule would catch that are pagination cursors, not credentials
/// (same comparison as [`CREDENTIAL_QUERY_PARAMS`]): kept, so list calls replay as recorded.
pub const HARMLESS_CREDENTIAL_LOOKALIKE_QUERY_PARAMS: &[&str] = &[
    "page-token",
    "pagetoken",
    "next-token",
    "nexttoken",
    "continuation-token",
];

/// `name` lower-cased with `_` read as `-` (`access_token` and `Access-Token` compare equal).
fn normalized_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '_' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// True when a normalized name has a credential word (see [`CREDENTIAL_HEADER_PARTS`]).
fn has_credential_word(normalized: &str) -> bool {
    let mut words = normalized
        .split(|c: char| c == '-' || c == '.' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .peekable();
    while let Some(word) = words.next() {
        if CREDENTIAL_HEADER_PARTS.contains(&word) {
            return true;
        }
        if words.peek().is_none()
            && CREDENTIAL_WORD_ENDINGS
                .iter()
                .any(|ending| word.ends_with(ending))
        {
            return true;
        }
    }
    false
}

/// `text` percent-decoded as a server decodes a query parameter name (`%XX` and `+` for a
/// space), repeated while it changes (at most 3 times) so that a name encoded twice for a
/// gateway that decodes once more is still recognised. Invalid escapes stay as written.
fn percent_decoded(text: &str) -> Cow<'_, str> {
    let mut current = Cow::Borrowed(text);
    for _ in 0..3 {
        if !current.contains(['%', '+']) {
            break;
        }
        let bytes = current.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            match bytes[i] {
                b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(high), Some(low)) => {
                        out.push((high * 16 + low) as u8);
                        i += 3;
                    }
                    _ => {
                        out.push(b'%');
                        i += 1;
                    }
                },
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                byte => {
                    out.push(byte);
                    i += 1;
                }
            }
        }
        let decoded = String::from_utf8_lossy(&out).into_owned();
        if decoded == current {
            break;
        }
        current = Cow::Owned(decoded);
    }
    current
}

/// True when the query parameter `name` carries a credential: compared percent-decoded (a
/// server reads `api%2Dkey` as `api-key`), in any case and with `_` read as `-`, against
/// [`CREDENTIAL_QUERY_PARAMS`] and the word rule of [`CREDENTIAL_HEADER_PARTS`], except the
/// cursors of [`HARMLESS_CREDENTIAL_LOOKALIKE_QUERY_PARAMS`].
pub fn is_credential_query_param(name: &str) -> bool {
    let name = normalized_name(&percent_decoded(name));
    if CREDENTIAL_QUERY_PARAMS.contains(&name.as_str()) {
        return true;
    }
    if HARMLESS_CREDENTIAL_LOOKALIKE_QUERY_PARAMS.contains(&name.as_str()) {
        return false;
    }
    has_credential_word(&name)
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
    // `;` separates parameters too for some servers: a credential after one is dropped.
    let pairs = || {
        query
            .split(QUERY_SEPARATORS)
            .filter(|pair| !pair.is_empty())
    };
    let kept: Vec<&str> = pairs()
        .filter(|pair| !is_credential_query_param(pair.split('=').next().unwrap_or_default()))
        .collect();
    if kept.len() == pairs().count() {
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
    let (tail, fragment) = match tail.split_once('#') {
        Some((before, fragment)) => (before, Some(fragment)),
        None => (tail, None),
    };
    let mut tail = match tail.split_once('?') {
        None => tail.to_owned(),
        Some((path, query)) => format!("{path}?{}", redact_query(query)),
    };
    // A fragment is never sent, but OAuth's implicit flow puts `access_token=` there.
    if let Some(fragment) = fragment {
        tail.push('#');
        tail.push_str(&redact_query(fragment));
    }
    match scheme {
        Some(scheme) => format!("{scheme}://{authority}{tail}"),
        None => format!("{authority}{tail}"),
    }
}

/// What separates query parameters: `&`, and `;` for the servers that read it so.
const QUERY_SEPARATORS: [char; 2] = ['&', ';'];

/// `name=value&...` with the values of credential parameters replaced by `REDACTED`.
fn redact_query(query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    for piece in query.split_inclusive(QUERY_SEPARATORS) {
        let pair = piece.strip_suffix(QUERY_SEPARATORS).unwrap_or(piece);
        match pair.split_once('=') {
            Some((name, _)) if is_credential_query_param(name) => {
                out.push_str(name);
                out.push_str("=REDACTED");
            }
            _ => out.push_str(pair),
        }
        out.push_str(&piece[pair.len()..]);
    }
    out
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

/// True when `name` (any case) is a credential header: in [`CREDENTIAL_HEADERS`], or with a
/// credential word ([`CREDENTIAL_HEADER_PARTS`]: `x-llm-key`, `x-access-key`,
/// `x-portkey-virtual-key`, `x-session-token`), unless it is one of
/// [`HARMLESS_CREDENTIAL_LOOKALIKE_HEADERS`]. The recording proxy, the importers (through
/// [`RecordingWriter`]) and the replaying worker all ask this one function.
pub fn is_credential_header(name: &str) -> bool {
    let name = normalized_name(name);
    if CREDENTIAL_HEADERS.contains(&name.as_str()) {
        return true;
    }
    let harmless = HARMLESS_CREDENTIAL_LOOKALIKE_HEADERS.iter().any(|h| {
        name.strip_suffix(h)
            .is_some_and(|before| before.is_empty() || before.ends_with('-'))
    });
    !harmless && has_credential_word(&name)
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

/// The key of an exchange's [`SourceNote`] among its fields.
pub const SOURCE_NOTE_KEY: &str = "source";

/// The note `llm-replay import` leaves on each exchange it writes (its `source` field): the
/// format and the place in the source it came from and, for a trace that measured the request
/// itself, what it measured. The importers write it ([`Exchange::set_source_note`]); the
/// baseline (`measure::noted_outcome`), the recorded output length
/// (`measure::recorded_output_length`) and `recording stats` read it
/// ([`Exchange::source_note`]).
///
/// Format v1 does not change: the note is one of the exchange's unknown fields, a JSON object
/// with these keys, and it reads as leniently as any unknown field: a key of an unexpected
/// type is kept among the [`details`](SourceNote::details), never an error.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SourceNote {
    /// The import format (`otel-genai`, `mooncake`, `azure-trace`, `burstgpt`, `har`,
    /// `proxymock`, `openai-batch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// The source's line the exchange came from (1-based).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// The HAR entry it came from (0-based).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<u64>,
    /// Output tokens the source counted (a span's usage, a trace's generated tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Input tokens the source counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Time to first token the source measured, ms from the start of the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// Duration of the call the source measured, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// What else the importer noted, as written (span and trace ids and name, a trace's model
    /// or log type, Mooncake's requested lengths): shown, never measured.
    #[serde(flatten)]
    pub details: serde_json::Map<String, serde_json::Value>,
}

impl SourceNote {
    /// A note of the import format `format`.
    pub fn new(format: &str) -> SourceNote {
        SourceNote {
            format: Some(format.to_owned()),
            ..SourceNote::default()
        }
    }

    /// The note a JSON value holds; `None` when it is not an object. Each known key of the
    /// wrong type stays in `details` as written.
    pub fn from_json(value: &serde_json::Value) -> Option<SourceNote> {
        use serde_json::Value;
        let object = value.as_object()?;
        let mut note = SourceNote::default();
        for (key, value) in object {
            let kept = match key.as_str() {
                "format" => value.as_str().map(|v| note.format = Some(v.to_owned())),
                "line" => value.as_u64().map(|v| note.line = Some(v)),
                "entry" => value.as_u64().map(|v| note.entry = Some(v)),
                "output_tokens" => value.as_u64().map(|v| note.output_tokens = Some(v)),
                "input_tokens" => value.as_u64().map(|v| note.input_tokens = Some(v)),
                "ttft_ms" => value.as_f64().map(|v| note.ttft_ms = Some(v)),
                "duration_ms" => value.as_f64().map(|v| note.duration_ms = Some(v)),
                _ => None,
            };
            if kept.is_none() {
                note.details.insert(key.clone(), Value::clone(value));
            }
        }
        Some(note)
    }

    /// The note as the JSON object written on disk.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a source note is strings, numbers and JSON values")
    }
}

impl<'de> Deserialize<'de> for SourceNote {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<SourceNote, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        SourceNote::from_json(&value)
            .ok_or_else(|| serde::de::Error::custom("source: expected a JSON object"))
    }
}

/// The key of an exchange's [`UpstreamNote`] among its fields.
pub const UPSTREAM_NOTE_KEY: &str = "upstream";

/// Which upstream served an exchange, as `llm-replay record` with several `--upstream` routes
/// notes it (its `upstream` field): `{"name":"openai","url":"https://api.openai.com/v1"}`.
/// `name` is the route's (a path prefix without its slash, a host name, or `default`), `url`
/// the upstream's base URL without user info. Recordings without the field (older ones, or
/// a proxy with one upstream) read as before.
///
/// Format v1 does not change: like the [`SourceNote`], the note is one of the exchange's
/// unknown fields and reads leniently: a plain string is the name, anything else without a
/// string `name` is no note, never an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpstreamNote {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl UpstreamNote {
    /// The note of route `name` to the upstream at `url`.
    pub fn new(name: &str, url: &str) -> UpstreamNote {
        UpstreamNote {
            name: name.to_owned(),
            url: Some(url.to_owned()),
        }
    }

    /// The note a JSON value holds: an object with a string `name` (and `url`), or a string.
    pub fn from_json(value: &serde_json::Value) -> Option<UpstreamNote> {
        if let Some(name) = value.as_str() {
            return Some(UpstreamNote {
                name: name.to_owned(),
                url: None,
            });
        }
        let object = value.as_object()?;
        Some(UpstreamNote {
            name: object.get("name")?.as_str()?.to_owned(),
            url: object
                .get("url")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
        })
    }
}

impl Exchange {
    /// Which upstream served the exchange, when the recorder noted it (`upstream`).
    pub fn upstream_note(&self) -> Option<UpstreamNote> {
        UpstreamNote::from_json(self.unknown.get(UPSTREAM_NOTE_KEY)?)
    }

    /// Note which upstream served the exchange (replacing any note).
    pub fn set_upstream(&mut self, note: &UpstreamNote) {
        let value = serde_json::to_value(note).expect("an upstream note is two strings");
        self.unknown.insert(UPSTREAM_NOTE_KEY.to_owned(), value);
    }
}

impl Exchange {
    /// The import's [`SourceNote`], when the exchange has one (a `source` object).
    pub fn source_note(&self) -> Option<SourceNote> {
        SourceNote::from_json(self.unknown.get(SOURCE_NOTE_KEY)?)
    }

    /// Set the import's [`SourceNote`] (replacing any).
    pub fn set_source_note(&mut self, note: &SourceNote) {
        self.unknown
            .insert(SOURCE_NOTE_KEY.to_owned(), note.to_json());
    }

    /// When the recorded client hung up mid-stream (a user pressing stop), in ms from the
    /// moment the request was sent (the clock of the frames' `t_ms`): `Some` only for an
    /// incomplete response whose `ended` is `"client disconnected"`, as `llm-replay record`
    /// writes it. The time is the response's `cancelled_ms` (the proxy noticed the client
    /// gone), or, in recordings made before that field, the last frame's `t_ms` (the client
    /// left after it, so this is early by at most one inter-frame gap); `None` when neither is
    /// known. A `cancelled_ms` that is not a finite offset in `0..=MAX_OFFSET_MS` is ignored
    /// like a missing one (unknown fields are never an error). A client that left after the
    /// terminal frame (`"client disconnected after the terminal frame"`, complete) did not
    /// cancel anything.
    pub fn client_cancelled_ms(&self) -> Option<f64> {
        let response = self.response.as_ref()?;
        let ended = response.unknown.get("ended").and_then(|v| v.as_str());
        if response.complete || ended != Some("client disconnected") {
            return None;
        }
        let recorded = response
            .unknown
            .get("cancelled_ms")
            .and_then(serde_json::Value::as_f64)
            .filter(|ms| ms.is_finite() && (0.0..=MAX_OFFSET_MS).contains(ms));
        recorded.or_else(|| response.frames.last()?.t_ms)
    }
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

/// A gap the recorder marked: exchanges it proxied but could not record (a `{"gap": ...}`
/// line, format v1; see README "Recording format v1").
#[derive(Debug, Clone, PartialEq)]
pub struct GapNote {
    /// The file and line of the marker.
    pub path: PathBuf,
    pub line: u64,
    /// Why (`disk_full`, `write_error`, `writer_behind`, `unserializable`).
    pub reason: String,
    /// How many exchanges were not recorded.
    pub exchanges: u64,
    /// The first and last unrecorded exchange's arrival (`at_ms`), when known.
    pub from_ms: Option<f64>,
    pub to_ms: Option<f64>,
    /// The same as UTC wall-clock times (`YYYY-MM-DDTHH:MM:SS.mmmZ`), when known.
    pub from: Option<String>,
    pub to: Option<String>,
}

/// The key of the first line of a file `llm-replay record` wrote when sampling or rotating
/// (`{"recording": {"sample": 0.5, ...}}`): what share of the traffic it holds.
pub const HEADER_KEY: &str = "recording";
/// The key of a gap marker line (`{"gap": {...}}`).
pub const GAP_KEY: &str = "gap";

/// The files of a recording at `path`: the file itself, or a directory's `*.jsonl` and
/// `*.jsonl.gz` files in name order (the recorder names rotated files by time).
pub fn recording_files(path: &Path) -> Result<Vec<PathBuf>, RecordingError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let open_error = |source| RecordingError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(open_error)? {
        let entry = entry.map_err(open_error)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let recording = name.ends_with(".jsonl") || name.ends_with(".jsonl.gz");
        if recording && !name.starts_with('.') && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(open_error(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "a directory without recording files (*.jsonl, *.jsonl.gz)",
        )));
    }
    Ok(files)
}

fn open_input(path: &Path) -> Result<Box<dyn BufRead + Send>, RecordingError> {
    let file = File::open(path).map_err(|source| RecordingError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(if is_gzip_path(path) {
        Box::new(BufReader::with_capacity(
            256 * 1024,
            flate2::read::MultiGzDecoder::new(file),
        ))
    } else {
        Box::new(BufReader::with_capacity(256 * 1024, file))
    })
}

/// Streams the exchanges of a recording, one line at a time. A recording may be several
/// files (a directory of rotated files, or a list): they are read one after another as ONE
/// recording, in name order; messages name the file and line they are about. Recorder
/// metadata lines (a file header, a gap marker) are noted, never returned as exchanges.
pub struct RecordingReader {
    path: PathBuf,
    input: Box<dyn BufRead + Send>,
    /// Files still to read after this one.
    rest: std::collections::VecDeque<PathBuf>,
    /// Gap markers met so far.
    gaps: Vec<GapNote>,
    /// The smallest share of traffic a file's header said it holds.
    sample_share: Option<f64>,
    line_no: u64,
    buf: Vec<u8>,
    done: bool,
    torn_last_line: Option<u64>,
    /// Lines longer than this are skipped ([`MAX_LINE_BYTES`] unless changed).
    max_line_bytes: usize,
    /// Over-long lines skipped so far, and the numbers of the first few.
    skipped_lines: u64,
    skipped_line_numbers: Vec<u64>,
}

impl RecordingReader {
    /// Open `path`; `.gz` files are decompressed on the fly. A directory is read as one
    /// recording: its `*.jsonl` and `*.jsonl.gz` files in name order ([`recording_files`]).
    pub fn open(path: impl AsRef<Path>) -> Result<RecordingReader, RecordingError> {
        let files = recording_files(path.as_ref())?;
        RecordingReader::open_many(&files)
    }

    /// Read `paths` one after another as one recording (each may be a directory).
    pub fn open_many(paths: &[PathBuf]) -> Result<RecordingReader, RecordingError> {
        let mut files = std::collections::VecDeque::new();
        for path in paths {
            files.extend(recording_files(path)?);
        }
        let Some(first) = files.pop_front() else {
            return Err(RecordingError::Open {
                path: PathBuf::from("(no recording given)"),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no file to read"),
            });
        };
        let mut reader = RecordingReader::from_reader(first.clone(), open_input(&first)?);
        reader.rest = files;
        Ok(reader)
    }

    /// Move on to the next file, if there is one.
    fn next_file(&mut self) -> Result<bool, RecordingError> {
        let Some(next) = self.rest.pop_front() else {
            return Ok(false);
        };
        self.input = open_input(&next)?;
        self.path = next;
        self.line_no = 0;
        self.done = false;
        Ok(true)
    }

    /// The gap markers read so far: exchanges the recorder proxied but did not record.
    pub fn gaps(&self) -> &[GapNote] {
        &self.gaps
    }

    /// The share of traffic the recording holds (`0.5` for `--sample 50%`), when a file's
    /// header said so (the smallest when files differ); `None`: all of it.
    pub fn sample_share(&self) -> Option<f64> {
        self.sample_share
    }

    /// A recorder's metadata line (a file header or a gap marker): noted, never an exchange.
    /// False for any other line.
    fn metadata_line(&mut self, line: &str) -> bool {
        let header = line.starts_with("{\"recording\":");
        let gap = line.starts_with("{\"gap\":");
        if !header && !gap {
            return false;
        }
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            return false;
        };
        if header {
            if let Some(share) = value[HEADER_KEY]["sample"].as_f64()
                && share > 0.0
                && share <= 1.0
            {
                self.sample_share = Some(self.sample_share.map_or(share, |s| s.min(share)));
            }
            return true;
        }
        let g = &value[GAP_KEY];
        let note = GapNote {
            path: self.path.clone(),
            line: self.line_no,
            reason: g["reason"].as_str().unwrap_or("unknown").to_owned(),
            exchanges: g["exchanges"].as_u64().unwrap_or(0),
            from_ms: g["from_ms"].as_f64(),
            to_ms: g["to_ms"].as_f64(),
            from: g["from"].as_str().map(str::to_owned),
            to: g["to"].as_str().map(str::to_owned),
        };
        tracing::warn!(
            "{}:{}: {} exchanges were not recorded ({}) from {} to {}",
            self.path.display(),
            self.line_no,
            note.exchanges,
            note.reason,
            note.from.as_deref().unwrap_or("?"),
            note.to.as_deref().unwrap_or("?")
        );
        self.gaps.push(note);
        true
    }

    /// Read from any buffered reader; `path` is used in messages only.
    pub fn from_reader(path: PathBuf, input: Box<dyn BufRead + Send>) -> RecordingReader {
        RecordingReader {
            path,
            input,
            rest: std::collections::VecDeque::new(),
            gaps: Vec::new(),
            sample_share: None,
            line_no: 0,
            buf: Vec::new(),
            done: false,
            torn_last_line: None,
            max_line_bytes: MAX_LINE_BYTES,
            skipped_lines: 0,
            skipped_line_numbers: Vec::new(),
        }
    }

    /// Skip lines longer than `max_line_bytes` (newline included) instead of
    /// [`MAX_LINE_BYTES`]; for tests, which need no 64 MiB line to check the policy.
    pub fn with_max_line_bytes(mut self, max_line_bytes: usize) -> RecordingReader {
        self.max_line_bytes = max_line_bytes;
        self
    }

    /// How many lines were skipped so far for being longer than [`MAX_LINE_BYTES`]. They
    /// are never an error (each is logged as a warning naming the file and line when it is
    /// skipped); every command that reads a recording must report this count, since an
    /// exchange skipped this way is not replayed, counted or exported.
    pub fn skipped_lines(&self) -> u64 {
        self.skipped_lines
    }

    /// The line numbers of the first [`SKIPPED_LINE_NUMBERS_KEPT`] lines skipped for their
    /// length ([`Self::skipped_lines`] counts them all).
    pub fn skipped_line_numbers(&self) -> &[u64] {
        &self.skipped_line_numbers
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
            if self.done && !self.next_file()? {
                return Ok(None);
            }
            self.buf.clear();
            self.line_no += 1;
            let read = (&mut self.input)
                .take(self.max_line_bytes as u64 + 1)
                .read_until(b'\n', &mut self.buf);
            match read {
                Ok(0) => {
                    // This file ended: the next one (if any) goes on.
                    self.done = true;
                    continue;
                }
                Ok(_) => {}
                Err(source)
                    if source.kind() == std::io::ErrorKind::UnexpectedEof
                        && is_gzip_path(&self.path) =>
                {
                    // A gzip file cut short (its writer was killed): what came whole was
                    // read; the rest is a torn end, as a torn last line.
                    self.done = true;
                    self.torn_last_line = Some(self.line_no);
                    continue;
                }
                Err(source) => {
                    self.done = true;
                    return Err(RecordingError::Io {
                        path: self.path.clone(),
                        line: self.line_no,
                        source,
                    });
                }
            }
            if self.buf.len() > self.max_line_bytes {
                let line_ended = self.buf.ends_with(b"\n") || self.skip_rest_of_line()?;
                self.skip_over_long_line();
                if !line_ended {
                    self.done = true;
                }
                continue;
            }
            let has_newline = self.buf.ends_with(b"\n");
            let line = match std::str::from_utf8(&self.buf) {
                Ok(line) => line,
                Err(_) if !has_newline => {
                    self.done = true;
                    self.torn_last_line = Some(self.line_no);
                    continue;
                }
                Err(e) => return Err(self.invalid("(line)", format!("not UTF-8: {e}"))),
            };
            let trimmed = line.trim();
            if trimmed.is_empty() {
                continue;
            }
            let start = trimmed.as_ptr() as usize - line.as_ptr() as usize;
            let end = start + trimmed.len();
            if trimmed.starts_with("{\"recording\":") || trimmed.starts_with("{\"gap\":") {
                let owned = trimmed.to_owned();
                if self.metadata_line(&owned) {
                    continue;
                }
            }
            return Ok(Some((start, end, has_newline)));
        }
    }

    /// Read and drop the rest of the current line without holding it; false when the input
    /// ended first.
    fn skip_rest_of_line(&mut self) -> Result<bool, RecordingError> {
        loop {
            let available = match self.input.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    self.done = true;
                    return Err(RecordingError::Io {
                        path: self.path.clone(),
                        line: self.line_no,
                        source,
                    });
                }
            };
            if available.is_empty() {
                return Ok(false);
            }
            match memchr::memchr(b'\n', available) {
                Some(end) => {
                    self.input.consume(end + 1);
                    return Ok(true);
                }
                None => {
                    let n = available.len();
                    self.input.consume(n);
                }
            }
        }
    }

    /// Count and report the over-long line just read, and let go of its buffer.
    fn skip_over_long_line(&mut self) {
        // `file:line:` first, as every message about a recording line.
        tracing::warn!(
            limit = self.max_line_bytes,
            "{}:{}: line over {} bytes skipped (not replayed, counted or exported)",
            self.path.display(),
            self.line_no,
            self.max_line_bytes
        );
        self.skipped_lines += 1;
        if self.skipped_line_numbers.len() < SKIPPED_LINE_NUMBERS_KEPT {
            self.skipped_line_numbers.push(self.line_no);
        }
        // The buffer grew to the limit: do not keep that much for the rest of the file.
        self.buf = Vec::new();
    }

    /// The next exchange with its 1-based line number; `None` at the end.
    pub fn next_exchange(&mut self) -> Option<Result<(u64, Exchange), RecordingError>> {
        loop {
            let (start, end, has_newline) = match self.read_line() {
                Ok(Some(found)) => found,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            let line = std::str::from_utf8(&self.buf[start..end]).expect("checked by read_line");
            return match self.parse_line(line) {
                Ok(exchange) => Some(Ok((self.line_no, exchange))),
                Err(_) if !has_newline => {
                    // A torn last line: skipped; the next file (if any) goes on.
                    self.done = true;
                    self.torn_last_line = Some(self.line_no);
                    continue;
                }
                Err(e) => Some(Err(e)),
            };
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
        let (start, end) = loop {
            let (start, end, has_newline) = match self.read_line() {
                Ok(Some(found)) => found,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            // A torn last line (no newline, not JSON) is skipped; the next file goes on.
            if !has_newline
                && std::str::from_utf8(&self.buf[start..end]).map_or(true, |text| {
                    serde_json::from_str::<serde::de::IgnoredAny>(text).is_err()
                })
            {
                self.done = true;
                self.torn_last_line = Some(self.line_no);
                continue;
            }
            break (start, end);
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
            rest: std::collections::VecDeque::new(),
            gaps: Vec::new(),
            sample_share: None,
            line_no: self.line,
            buf: Vec::new(),
            done: true,
            torn_last_line: None,
            max_line_bytes: MAX_LINE_BYTES,
            skipped_lines: 0,
            skipped_line_numbers: Vec::new(),
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

    /// Append one exchange as one line. Credential headers and query parameters are
    /// dropped; an exchange too large for one line of [`MAX_WRITTEN_LINE_BYTES`] is stored
    /// cut and marked ([`write_line_within`]).
    pub fn write(&mut self, exchange: &Exchange) -> std::io::Result<()> {
        let clean = without_credentials(exchange);
        let mut line = Vec::new();
        let too_long = match measured_line_len(&clean, MAX_WRITTEN_LINE_BYTES) {
            Some(len) => len > MAX_WRITTEN_LINE_BYTES,
            None => {
                serialize_line(&clean, &mut line)?;
                line.len() > MAX_WRITTEN_LINE_BYTES
            }
        };
        if too_long {
            // Rare: only then is the exchange copied, to be cut.
            write_line_within(&mut clean.into_owned(), &mut line, MAX_WRITTEN_LINE_BYTES)?;
        } else if line.is_empty() {
            serialize_line(&clean, &mut line)?;
        }
        self.out.writer().write_all(&line)
    }

    /// Append a file header saying the share of the traffic the recording holds (as
    /// `record --sample` writes it), so a reader still knows the rate to replay at. A reader
    /// takes the smallest share it meets, so a later, smaller one may follow.
    pub fn write_sample_header(&mut self, writer: &str, share: f64) -> std::io::Result<()> {
        let header = serde_json::json!({ HEADER_KEY: {
            "format": 1,
            "writer": writer,
            "sample": share,
        }});
        self.write_metadata(&header)
    }

    /// Append a gap marker carrying `gap`'s reason, count and times, at this point of the
    /// recording: exchanges that were proxied and never recorded stay counted in a copy.
    pub fn write_gap(&mut self, gap: &GapNote) -> std::io::Result<()> {
        let mut fields = serde_json::Map::new();
        fields.insert("exchanges".into(), gap.exchanges.into());
        fields.insert("reason".into(), gap.reason.as_str().into());
        let times = [
            ("from_ms", gap.from_ms.map(serde_json::Value::from)),
            ("to_ms", gap.to_ms.map(serde_json::Value::from)),
            ("from", gap.from.as_deref().map(serde_json::Value::from)),
            ("to", gap.to.as_deref().map(serde_json::Value::from)),
        ];
        for (key, value) in times {
            if let Some(value) = value {
                fields.insert(key.into(), value);
            }
        }
        self.write_metadata(&serde_json::json!({ GAP_KEY: fields }))
    }

    fn write_metadata(&mut self, value: &serde_json::Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
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

/// What [`write_line_within`] cut from an exchange to keep its line under the limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineCut {
    /// The request body was cut: `(bytes it had, bytes kept)`.
    pub request_body: Option<(usize, usize)>,
    /// Response frames left out (those kept are a prefix of the stream).
    pub frames_dropped: usize,
    /// Still too long after that (huge headers, path or notes): only the exchange's id,
    /// session, arrival, method, path, status and short notes were kept.
    pub stripped: bool,
}

impl LineCut {
    /// True when nothing was cut.
    pub fn is_empty(&self) -> bool {
        *self == LineCut::default()
    }
}

/// Room kept for the markers a cut adds (`truncated`, `body_bytes`, `recorded_bytes`).
const MARKER_ROOM: usize = 256;

/// Longest note, id, session or path kept by the last resort of [`write_line_within`].
const STRIPPED_FIELD_BYTES: usize = 2048;

/// Serialize `exchange` as one JSON line, newline included, into `line` (cleared first),
/// no longer than `limit` bytes (guaranteed for any `limit` of 64 KiB or more; readers
/// skip lines over [`MAX_LINE_BYTES`]). JSON escaping can make a line six times the
/// bytes it holds (a control byte is `\u0001`), so an exchange whose line would be longer
/// is cut, and marked so no reader mistakes what is kept for the whole:
///
/// 1. the request body and the response frames share the room left by the rest of the
///    line, each getting at least half of it when it needs that much;
/// 2. a request body over its share keeps a prefix (text stays text, cut at a character;
///    `body_b64` stays base64) and the request gets `"truncated": true`, `"body_bytes"`
///    (the whole body's size) and `"recorded_bytes"` (the bytes kept);
/// 3. frames over their share keep a prefix of whole frames, and the response gets
///    `"truncated": true`, `"complete": false`, `"recorded_bytes"` and `"body_bytes"`
///    (kept when already there: a proxy's count of every byte the client got) — the same
///    marks as `record --max-recorded-bytes`;
/// 4. if the line is still too long (headers, path or notes of that size), only the
///    exchange's id, session, arrival, method, path, status and short notes are kept, with
///    `"truncated": true` on the exchange as well.
///
/// Format v1 readers keep unknown fields, so a cut exchange is read, replayed (with the
/// body kept) and counted as an incomplete one. A warning is logged for every cut.
pub fn write_line_within(
    exchange: &mut Exchange,
    line: &mut Vec<u8>,
    limit: usize,
) -> serde_json::Result<LineCut> {
    let mut cut = LineCut::default();
    let line_len = match measured_line_len(exchange, limit) {
        Some(len) => {
            line.clear();
            len
        }
        None => {
            serialize_line(exchange, line)?;
            line.len()
        }
    };
    if line_len <= limit {
        if line.is_empty() {
            serialize_line(exchange, line)?;
        }
        return Ok(cut);
    }
    let body_len = request_body_json_len(&exchange.request);
    let frame_lens: Vec<usize> = exchange
        .response
        .as_ref()
        .map(|r| r.frames.iter().map(json_len).collect())
        .unwrap_or_default();
    let frames_len = frame_lens.iter().sum::<usize>() + frame_lens.len().saturating_sub(1);
    let fixed = line_len.saturating_sub(body_len + frames_len);
    let room = limit.saturating_sub(fixed + MARKER_ROOM);
    let body_room = body_len.min((room / 2).max(room.saturating_sub(frames_len)));
    if body_len > body_room {
        cut.request_body = Some(cut_request_body(&mut exchange.request, body_room));
    }
    let frames_room = room.saturating_sub(request_body_json_len(&exchange.request));
    if frames_len > frames_room
        && let Some(response) = exchange.response.as_mut()
    {
        cut.frames_dropped = cut_frames(response, &frame_lens, frames_room);
    }
    serialize_line(exchange, line)?;
    if line.len() > limit {
        strip_to_identity(exchange);
        cut.stripped = true;
        serialize_line(exchange, line)?;
    }
    tracing::warn!(
        id = exchange.id.as_deref().unwrap_or("-"),
        limit,
        written = line.len(),
        ?cut,
        "exchange too large for one recording line: stored cut and marked truncated"
    );
    Ok(cut)
}

/// The length of `exchange`'s line, newline included, measured without building it when its
/// bodies could make it longer than `limit`; `None` when they surely cannot (then building
/// it is the cheaper way to know). A huge exchange thus never costs its whole escaped line
/// in memory (64 MiB of control bytes are 384 MB of JSON).
fn measured_line_len(exchange: &Exchange, limit: usize) -> Option<usize> {
    let text_len = |text: &Option<String>| text.as_ref().map_or(0, String::len);
    let payload = text_len(&exchange.request.body)
        + text_len(&exchange.request.body_b64)
        + exchange.response.as_ref().map_or(0, |r| {
            r.frames
                .iter()
                .map(|f| text_len(&f.data) + text_len(&f.data_b64))
                .sum()
        });
    // Six bytes of JSON at most per byte held.
    (payload.saturating_mul(6) >= limit / 2).then(|| json_len(exchange) + 1)
}

fn serialize_line(exchange: &Exchange, line: &mut Vec<u8>) -> serde_json::Result<()> {
    line.clear();
    serde_json::to_writer(&mut *line, exchange)?;
    line.push(b'\n');
    Ok(())
}

/// Counts the bytes written to it.
struct ByteCount(usize);

impl Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The length of `value` as JSON, without building the text.
fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut count = ByteCount(0);
    // Writing to a counter cannot fail; a value that cannot serialize counts what it wrote.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The length of the request body's JSON string (quotes included), 0 without a body.
fn request_body_json_len(request: &Request) -> usize {
    match (&request.body, &request.body_b64) {
        (Some(text), _) => json_len(text.as_str()),
        (None, Some(b64)) => json_len(b64.as_str()),
        (None, None) => 0,
    }
}

/// Bytes `c` takes in a JSON string as serde_json writes it.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// The end of the longest prefix of `text` (at a character) whose JSON string, quotes
/// included, fits in `room` bytes.
fn json_prefix_end(text: &str, room: usize) -> usize {
    let mut used = 2;
    for (i, c) in text.char_indices() {
        used += escaped_len(c);
        if used > room {
            return i;
        }
    }
    text.len()
}

/// Keep the longest prefix of the request body whose JSON string fits in `room` bytes and
/// mark the request; returns `(bytes it had, bytes kept)`.
fn cut_request_body(request: &mut Request, room: usize) -> (usize, usize) {
    let (whole, kept) = if let Some(text) = request.body.as_mut() {
        let whole = text.len();
        let end = json_prefix_end(text, room);
        text.truncate(end);
        (whole, end)
    } else if let Some(b64) = request.body_b64.as_ref() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default();
        let kept = (room.saturating_sub(2) / 4 * 3).min(bytes.len());
        request.body_b64 = Some(base64::engine::general_purpose::STANDARD.encode(&bytes[..kept]));
        (bytes.len(), kept)
    } else {
        (0, 0)
    };
    mark_cut(&mut request.unknown, whole as u64, kept as u64, true);
    (whole, kept)
}

/// Keep the longest prefix of whole frames whose JSON fits in `room` bytes (with the commas
/// between them) and mark the response; returns how many frames were left out.
fn cut_frames(response: &mut Response, frame_lens: &[usize], room: usize) -> usize {
    let mut used = 0usize;
    let mut keep = 0usize;
    for (i, len) in frame_lens.iter().enumerate() {
        let with_comma = len + usize::from(i > 0);
        if used + with_comma > room {
            break;
        }
        used += with_comma;
        keep = i + 1;
    }
    let whole: usize = response.frames.iter().map(|f| f.bytes().len()).sum();
    let dropped = response.frames.len() - keep;
    response.frames.truncate(keep);
    let kept: usize = response.frames.iter().map(|f| f.bytes().len()).sum();
    response.complete = false;
    mark_cut(&mut response.unknown, whole as u64, kept as u64, false);
    dropped
}

/// Mark a cut body: `truncated`, `recorded_bytes`, and `body_bytes` (replaced only when
/// `replace_whole`: a proxy's `body_bytes` counts every byte the client got, more than the
/// frames it kept).
fn mark_cut(
    fields: &mut serde_json::Map<String, serde_json::Value>,
    whole: u64,
    kept: u64,
    replace_whole: bool,
) {
    fields.insert("truncated".into(), serde_json::Value::Bool(true));
    if replace_whole || !fields.contains_key("body_bytes") {
        fields.insert("body_bytes".into(), whole.into());
    }
    fields.insert("recorded_bytes".into(), kept.into());
}

/// The last resort of [`write_line_within`]: keep the exchange's identity only.
fn strip_to_identity(exchange: &mut Exchange) {
    let short = |value: &serde_json::Value| json_len(value) <= STRIPPED_FIELD_BYTES;
    if exchange
        .id
        .as_deref()
        .is_some_and(|id| json_len(id) > STRIPPED_FIELD_BYTES)
    {
        exchange.id = None;
    }
    if exchange
        .session
        .as_deref()
        .is_some_and(|s| json_len(s) > STRIPPED_FIELD_BYTES)
    {
        exchange.session = None;
    }
    exchange.unknown.retain(|_, v| short(v));
    exchange
        .unknown
        .insert("truncated".into(), serde_json::Value::Bool(true));
    let request = &mut exchange.request;
    let whole = request
        .unknown
        .get("body_bytes")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(request.body_bytes().len() as u64);
    // A prefix of a path still starts with `/`.
    let end = json_prefix_end(&request.path, STRIPPED_FIELD_BYTES);
    request.path.truncate(end);
    if request.method.len() > STRIPPED_FIELD_BYTES {
        request.method = default_method();
    }
    request.headers.clear();
    request.body = None;
    request.body_b64 = None;
    request.unknown.retain(|_, v| short(v));
    mark_cut(&mut request.unknown, whole, 0, true);
    if let Some(response) = exchange.response.as_mut() {
        let whole = response
            .unknown
            .get("body_bytes")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| response.frames.iter().map(|f| f.bytes().len() as u64).sum());
        response.headers.clear();
        response.frames.clear();
        response.complete = false;
        response.unknown.retain(|_, v| short(v));
        mark_cut(&mut response.unknown, whole, 0, true);
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
    fn the_upstream_note_is_read_when_present_and_absent_in_old_lines() {
        let old = r#"{"request":{"path":"/v1/chat/completions"}}"#;
        let noted = r#"{"upstream":{"name":"openai","url":"http://10.0.0.5:8000/v1"},"request":{"path":"/v1/chat/completions"}}"#;
        let short = r#"{"upstream":"anthropic","request":{"path":"/v1/messages"}}"#;
        let odd = r#"{"upstream":{"url":7},"request":{"path":"/v1/messages"}}"#;
        let mut r = reader(&format!("{old}\n{noted}\n{short}\n{odd}\n"));
        let notes: Vec<Option<UpstreamNote>> = r
            .by_ref()
            .map(|item| item.expect("every line reads").1.upstream_note())
            .collect();
        assert_eq!(
            notes,
            [
                None,
                Some(UpstreamNote::new("openai", "http://10.0.0.5:8000/v1")),
                Some(UpstreamNote {
                    name: "anthropic".into(),
                    url: None
                }),
                None,
            ]
        );
        // Written as an object, and read back the same.
        let mut exchange: Exchange = serde_json::from_str(old).expect("valid");
        exchange.set_upstream(&UpstreamNote::new("openai", "https://api.openai.com"));
        let line = serde_json::to_string(&exchange).expect("serializes");
        assert!(
            line.contains(r#""upstream":{"name":"openai","url":"https://api.openai.com"}"#),
            "{line}"
        );
        let back: Exchange = serde_json::from_str(&line).expect("reads");
        assert_eq!(
            back.upstream_note(),
            Some(UpstreamNote::new("openai", "https://api.openai.com"))
        );
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
            // Issue 18: recorded and replayed verbatim before the word rule.
            "x-llm-key",
            "X-Access-Key",
            "x-portkey-virtual-key",
            "x-portkey-api-key",
            "x_api_key",
            "X-Client-Secret",
            "private-token",
            "x-csrf-token",
            "x-amz-security-token",
            "x-amz-date",
            "cookie",
            "proxy-authorization",
            "x-apikey",
            "XApiKey",
            "x-accesstoken",
            "x-goog-credential",
            "x-signature",
            "x-jwt",
            "x-db-password",
            "helicone-auth",
            "www-authenticate",
            "set-cookie",
        ] {
            assert!(is_credential_header(name), "{name} must be a credential");
        }
        for name in [
            "content-type",
            "anthropic-version",
            "anthropic-beta",
            "openai-organization",
            "openai-project",
            "openai-beta",
            "x-amz-content-sha256",
            "x-request-id",
            "x-stainless-lang",
            "x-stainless-retry-count",
            "x-stainless-package-version",
            "Idempotency-Key",
            "x-idempotency-key",
            "x-ratelimit-remaining-tokens",
            "x-portkey-provider",
            "x-goog-api-client",
            "keep-alive",
            "user-agent",
            "traceparent",
            "x-session-id",
        ] {
            assert!(!is_credential_header(name), "{name} is not a credential");
        }
        for name in [
            "key",
            "api-key",
            "api_key",
            "API-KEY",
            "apiKey",
            "subscription-key",
            "Subscription-Key",
            "subscriptionKey",
            "client_secret",
            "client-secret",
            "access-token",
            "access_token",
            "accessToken",
            "private_token",
            "jwt",
            "id_token",
            "refresh_token",
            "password",
            "sig",
            "X-Amz-Signature",
            "X-Amz-Credential",
            "x-goog-signature",
            "code",
            // Percent-encoded names are what the server decodes them to.
            "api%2Dkey",
            "api%2dkey",
            "subscription%2Dkey",
            "%6Bey",
            "access%5Ftoken",
            "api%252Dkey",
            "api+key",
        ] {
            assert!(
                is_credential_query_param(name),
                "{name} must be a credential"
            );
        }
        for name in [
            "api-version",
            "alt",
            "beta",
            "stream",
            "limit",
            "after",
            "model",
            "max_tokens",
            "pageToken",
            "page_token",
            "next_token",
            "%zz",
            "%",
        ] {
            assert!(
                !is_credential_query_param(name),
                "{name} is not a credential"
            );
        }
        assert_eq!(
            strip_credential_query("/v1beta/models/g:streamGenerateContent?alt=sse&key=AIza123"),
            "/v1beta/models/g:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            strip_credential_query("/openai/deployments/d/chat/completions?api-key=s3cret"),
            "/openai/deployments/d/chat/completions"
        );
        assert_eq!(
            strip_credential_query(
                "/v1/chat/completions?subscription-key=S1&api-version=1&api%2Dkey=S2;access_token=S3&client_secret=S4&jwt=S5&private_token=S6&access-token=S7"
            ),
            "/v1/chat/completions?api-version=1"
        );
        assert!(matches!(
            strip_credential_query("/v1/chat/completions?api-version=1"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            redact_url("https://user:pa55@gpu:8443/base?api-key=s3cret&x=1"),
            "https://***@gpu:8443/base?api-key=REDACTED&x=1"
        );
        assert_eq!(
            redact_url(
                "http://127.0.0.1:9/v1?subscription-key=S1&api%2Dkey=S2;client_secret=S3&v=2#access_token=S4&state=x"
            ),
            "http://127.0.0.1:9/v1?subscription-key=REDACTED&api%2Dkey=REDACTED;client_secret=REDACTED&v=2#access_token=REDACTED&state=x"
        );
        assert_eq!(redact_url("http://127.0.0.1:8000"), "http://127.0.0.1:8000");
        assert_eq!(redact_url("http://h/p?a&b=1#frag"), "http://h/p?a&b=1#frag");
    }

    #[test]
    fn the_writer_drops_the_new_credential_names() {
        let exchange: Exchange = serde_json::from_str(
            r#"{"request":{"path":"/v1/chat/completions?subscription-key=S1&api%2Dkey=S2&access_token=S3&v=1","headers":{"x-llm-key":"S4","X-Access-Key":"S5","x-portkey-virtual-key":"S6","idempotency-key":"k-1","anthropic-version":"2023-06-01"}}}"#,
        )
        .expect("valid");
        let clean = without_credentials(&exchange);
        let text = serde_json::to_string(&*clean).expect("json");
        for secret in ["S1", "S2", "S3", "S4", "S5", "S6"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(clean.request.path, "/v1/chat/completions?v=1");
        assert_eq!(clean.request.header("idempotency-key"), Some("k-1"));
        assert_eq!(
            clean.request.header("anthropic-version"),
            Some("2023-06-01")
        );
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
        // One line longer than the real cap, read as a stream: skipped, not held.
        let good = r#"{"request":{"path":"/v1/completions"}}"#;
        let big = format!(
            "{{\"request\":{{\"path\":\"/{}\"}}}}\n{good}\n",
            "a".repeat(MAX_LINE_BYTES)
        );
        let mut r = reader(&big);
        let (line, _) = r.next().expect("line 2").expect("the line after is read");
        assert_eq!(line, 2);
        assert!(r.next().is_none());
        assert_eq!(r.skipped_lines(), 1);
        assert_eq!(r.skipped_line_numbers(), &[1]);
    }

    #[test]
    fn over_long_lines_are_skipped_counted_and_named_and_other_errors_stay_errors() {
        let good = r#"{"request":{"path":"/v1/completions"}}"#;
        let long = format!(r#"{{"request":{{"path":"/{}"}}}}"#, "a".repeat(200));
        let cap = |text: &str| reader(text).with_max_line_bytes(100);
        // Over-long lines anywhere, the rest read with their own line numbers, by every way
        // of reading.
        let text = format!("{long}\n{good}\n\n{long}\n{good}\n{long}");
        let mut r = cap(&text);
        let lines: Vec<u64> = r.by_ref().map(|item| item.expect("valid").0).collect();
        assert_eq!(lines, [2, 5]);
        assert_eq!(r.skipped_lines(), 3);
        assert_eq!(r.skipped_line_numbers(), &[1, 4, 6]);
        assert_eq!(
            r.torn_last_line(),
            None,
            "an over-long last line is counted once"
        );
        let mut r = cap(&text);
        let mut raw_lines = Vec::new();
        while let Some(raw) = r.next_raw() {
            raw_lines.push(raw.expect("an object").line());
        }
        assert_eq!(raw_lines, [2, 5]);
        assert_eq!(r.skipped_lines(), 3);
        // A line of exactly the cap (newline included) is read.
        let exact = format!("{}{}\n", good, " ".repeat(100 - good.len() - 1));
        let mut r = cap(&exact);
        assert!(r.next().expect("line 1").is_ok());
        assert_eq!(r.skipped_lines(), 0);
        // A bad line after a skipped one is still an error naming file, line and field.
        let bad = r#"{"request":{"path":"/v1/completions","body":3}}"#;
        let mut r = cap(&format!("{long}\n{bad}\n{good}\n"));
        let msg = r.next().expect("line 2").expect_err("bad body").to_string();
        assert!(msg.starts_with("rec.jsonl:2: request.body: "), "{msg}");
        assert!(r.next().expect("line 3").is_ok());
        assert_eq!(r.skipped_lines(), 1);
        // Only the first few line numbers are kept; all are counted.
        let many = format!("{long}\n").repeat(SKIPPED_LINE_NUMBERS_KEPT + 5);
        let mut r = cap(&many);
        assert!(r.next().is_none());
        assert_eq!(r.skipped_lines(), SKIPPED_LINE_NUMBERS_KEPT as u64 + 5);
        assert_eq!(r.skipped_line_numbers().len(), SKIPPED_LINE_NUMBERS_KEPT);
    }

    /// An exchange whose request body is `body` and whose response has `frames`.
    fn big_exchange(body: &[u8], frames: &[&[u8]]) -> Exchange {
        let mut exchange: Exchange = serde_json::from_str(
            r#"{"id":"rec-1","at_ms":1.5,"request":{"path":"/v1/chat/completions","headers":{"content-type":"application/json"}},"response":{"status":200,"complete":true}}"#,
        )
        .expect("valid");
        exchange.request.set_body(body);
        let response = exchange.response.as_mut().expect("response");
        response.frames = frames
            .iter()
            .enumerate()
            .map(|(i, f)| Frame::from_bytes(Some(i as f64), f))
            .collect();
        exchange
    }

    /// Read `line` back with the reader (at the real cap) as the only line of a file.
    fn read_back(line: &[u8]) -> Exchange {
        let text = std::str::from_utf8(line).expect("utf-8");
        let mut r = reader(text);
        let (_, exchange) = r.next().expect("one line").expect("valid");
        assert!(r.next().is_none());
        exchange
    }

    #[test]
    fn a_line_that_would_be_too_long_is_cut_marked_and_stays_readable() {
        const LIMIT: usize = 100_000;
        let mut line = Vec::new();
        // Small: written whole, untouched.
        let mut small = big_exchange(b"{\"a\":1}", &[b"data: x\n\n"]);
        let before = small.clone();
        let cut = write_line_within(&mut small, &mut line, LIMIT).expect("json");
        assert!(cut.is_empty());
        assert_eq!(small, before);
        assert_eq!(read_back(&line), before);

        // 60 KB of control bytes is 360 KB of JSON (`\u0001`): the body is cut to fit.
        let body = vec![1u8; 60_000];
        let mut exchange = big_exchange(&body, &[b"data: x\n\n"]);
        let cut = write_line_within(&mut exchange, &mut line, LIMIT).expect("json");
        assert!(line.len() <= LIMIT, "{} bytes", line.len());
        assert!(
            line.len() > LIMIT * 9 / 10,
            "{} bytes: most of the room used",
            line.len()
        );
        let (whole, kept) = cut.request_body.expect("the body was cut");
        assert_eq!(whole, 60_000);
        assert!(kept > 15_000 && kept < 16_700, "kept {kept}");
        assert_eq!(cut.frames_dropped, 0);
        let back = read_back(&line);
        assert_eq!(back.request.body_bytes().as_ref(), &body[..kept]);
        assert_eq!(back.request.unknown["truncated"], serde_json::json!(true));
        assert_eq!(
            back.request.unknown["body_bytes"],
            serde_json::json!(60_000)
        );
        assert_eq!(
            back.request.unknown["recorded_bytes"],
            serde_json::json!(kept)
        );
        let response = back.response.expect("response kept");
        assert!(response.complete, "the response was not cut");
        assert_eq!(response.frames.len(), 1);

        // A binary body stays base64.
        let mut binary = vec![0xffu8; 200_000];
        binary[0] = 0;
        let mut exchange = big_exchange(&binary, &[]);
        let cut = write_line_within(&mut exchange, &mut line, LIMIT).expect("json");
        assert!(line.len() <= LIMIT);
        let (_, kept) = cut.request_body.expect("cut");
        let back = read_back(&line);
        assert!(back.request.body.is_none());
        assert_eq!(back.request.body_bytes().as_ref(), &binary[..kept]);

        // Huge frames: a prefix of whole frames is kept, the response marked incomplete.
        let frame = vec![2u8; 10_000];
        let frames: Vec<&[u8]> = (0..20).map(|_| frame.as_slice()).collect();
        let mut exchange = big_exchange(b"{}", &frames);
        let cut = write_line_within(&mut exchange, &mut line, LIMIT).expect("json");
        assert!(line.len() <= LIMIT);
        assert_eq!(cut.request_body, None, "a small body is not cut");
        assert!(cut.frames_dropped > 0 && cut.frames_dropped < 20, "{cut:?}");
        let back = read_back(&line);
        let response = back.response.expect("response");
        assert!(!response.complete);
        assert_eq!(response.frames.len(), 20 - cut.frames_dropped);
        assert_eq!(response.unknown["truncated"], serde_json::json!(true));
        assert_eq!(response.unknown["body_bytes"], serde_json::json!(200_000));
        assert_eq!(
            response.unknown["recorded_bytes"],
            serde_json::json!(response.frames.len() * 10_000)
        );

        // Both too big: each gets about half the room.
        let mut exchange = big_exchange(&body, &frames);
        let cut = write_line_within(&mut exchange, &mut line, LIMIT).expect("json");
        assert!(line.len() <= LIMIT);
        assert!(
            cut.request_body.is_some() && cut.frames_dropped > 0,
            "{cut:?}"
        );
        assert!(!read_back(&line).response.expect("response").complete);

        // Headers that alone are too long: only the identity is kept.
        let mut exchange = big_exchange(b"{}", &[b"data: x\n\n"]);
        exchange
            .request
            .headers
            .insert("x-huge".into(), "\u{1}".repeat(50_000));
        let cut = write_line_within(&mut exchange, &mut line, LIMIT).expect("json");
        assert!(cut.stripped);
        assert!(line.len() <= 4096, "{} bytes", line.len());
        let back = read_back(&line);
        assert_eq!(back.id.as_deref(), Some("rec-1"));
        assert_eq!(back.at_ms, Some(1.5));
        assert_eq!(back.request.path, "/v1/chat/completions");
        assert_eq!(back.unknown["truncated"], serde_json::json!(true));
        assert!(back.request.headers.is_empty());
        assert_eq!(back.response.expect("status kept").status, 200);
    }

    #[test]
    fn the_writer_keeps_a_12_mib_body_of_control_bytes_readable() {
        // Once 75.5 MB of JSON, over the reader's cap: the proxy's case, through the
        // importers' writer.
        let body = vec![1u8; 12 << 20];
        let exchange = big_exchange(&body, &[b"data: [DONE]\n\n"]);
        #[derive(Clone, Default)]
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("not poisoned").extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let shared = Shared::default();
        let mut writer = RecordingWriter::from_writer(Box::new(shared.clone()));
        writer.write(&exchange).expect("write");
        writer.finish().expect("finish");
        let out = std::mem::take(&mut *shared.0.lock().expect("not poisoned"));
        assert!(out.len() <= MAX_WRITTEN_LINE_BYTES, "{} bytes", out.len());
        let back = read_back(&out);
        assert_eq!(back.request.unknown["truncated"], serde_json::json!(true));
        assert_eq!(
            back.request.unknown["body_bytes"],
            serde_json::json!(12 << 20)
        );
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

    #[test]
    fn a_source_note_is_written_as_before_and_reads_leniently() {
        let mut note = SourceNote::new("azure-trace");
        note.line = Some(7);
        note.output_tokens = Some(11);
        note.details
            .insert("trace_id".into(), serde_json::json!("abc"));
        let mut ex: Exchange =
            serde_json::from_str(r#"{"request":{"path":"/v1/chat/completions"}}"#).expect("line");
        ex.set_source_note(&note);
        // The same JSON the importers wrote by hand before the note had a type.
        assert_eq!(
            serde_json::to_string(&ex).expect("json"),
            r#"{"request":{"method":"POST","path":"/v1/chat/completions"},"source":{"format":"azure-trace","line":7,"output_tokens":11,"trace_id":"abc"}}"#
        );
        assert_eq!(ex.source_note(), Some(note));
        // A key of an unexpected type is kept as written, never an error; not an object: no note.
        let odd: Exchange = serde_json::from_str(
            r#"{"request":{"path":"/x"},"source":{"format":"har","output_tokens":"many","ttft_ms":12}}"#,
        )
        .expect("unknown fields never fail a line");
        let read = odd.source_note().expect("an object");
        assert_eq!(read.format.as_deref(), Some("har"));
        assert_eq!(read.output_tokens, None);
        assert_eq!(read.ttft_ms, Some(12.0));
        assert_eq!(read.details["output_tokens"], serde_json::json!("many"));
        assert_eq!(read.to_json()["output_tokens"], serde_json::json!("many"));
        let text: Exchange =
            serde_json::from_str(r#"{"request":{"path":"/x"},"source":"notes"}"#).expect("line");
        assert_eq!(text.source_note(), None);
    }

    #[test]
    fn client_cancelled_ms_reads_the_recorded_hang_up() {
        let exchange = |response: &str| -> Exchange {
            serde_json::from_str(&format!(
                r#"{{"request":{{"path":"/v1/chat/completions"}},"response":{response}}}"#
            ))
            .expect("line")
        };
        let frames = r#"[{"t_ms":100.5,"data":"a"},{"t_ms":130.25,"data":"b"}]"#;
        // `record` with the instant the proxy noticed: that instant.
        let cancelled = exchange(&format!(
            r#"{{"status":200,"frames":{frames},"complete":false,"ended":"client disconnected","cancelled_ms":141.125}}"#
        ));
        assert_eq!(cancelled.client_cancelled_ms(), Some(141.125));
        // An older recording, without it: the last frame the client got.
        let older = exchange(&format!(
            r#"{{"status":200,"frames":{frames},"complete":false,"ended":"client disconnected"}}"#
        ));
        assert_eq!(older.client_cancelled_ms(), Some(130.25));
        // A nonsensical `cancelled_ms` is ignored like a missing one.
        for bad in ["-3", "\"soon\"", "1e300"] {
            let odd = exchange(&format!(
                r#"{{"status":200,"frames":{frames},"complete":false,"ended":"client disconnected","cancelled_ms":{bad}}}"#
            ));
            assert_eq!(odd.client_cancelled_ms(), Some(130.25), "{bad}");
        }
        // Older, and gone before any frame (or frames without timing): not known.
        let early = exchange(
            r#"{"status":200,"frames":[],"complete":false,"ended":"client disconnected"}"#,
        );
        assert_eq!(early.client_cancelled_ms(), None);
        // Not a cancel: the client left after the terminal frame, the upstream cut the
        // stream, the stream ended whole, or there is no response at all.
        for not_cancelled in [
            format!(
                r#"{{"status":200,"frames":{frames},"complete":true,"ended":"client disconnected after the terminal frame","cancelled_ms":150.0}}"#
            ),
            format!(
                r#"{{"status":200,"frames":{frames},"complete":false,"ended":"upstream error: reset","cancelled_ms":150.0}}"#
            ),
            format!(r#"{{"status":200,"frames":{frames},"complete":false}}"#),
            format!(
                r#"{{"status":200,"frames":{frames},"complete":true,"ended":"client disconnected"}}"#
            ),
        ] {
            assert_eq!(
                exchange(&not_cancelled).client_cancelled_ms(),
                None,
                "{not_cancelled}"
            );
        }
        let unanswered: Exchange = serde_json::from_str(
            r#"{"request":{"path":"/x"},"error":"client disconnected before the response"}"#,
        )
        .expect("line");
        assert_eq!(unanswered.client_cancelled_ms(), None);
    }
}
