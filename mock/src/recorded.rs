//! Recording-replay mode: the recorded responses held in memory, and request matching.
//!
//! A request is matched by its `x-llm-replay-exchange: N` header (N = 0-based index in file
//! order) when present, else by exact (method, path, body); unmatched requests and exchanges
//! without a response get the synthetic answer.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::MockError;
use bytes::Bytes;
use common::recording::RecordingReader;
use common::recording::is_hop_by_hop_header;
use http::{HeaderName, HeaderValue, StatusCode};

/// Response headers never replayed: hop-by-hop headers and the length (the mock frames the
/// body itself).
fn is_dropped_header(name: &str) -> bool {
    is_hop_by_hop_header(name) || name.eq_ignore_ascii_case("content-length")
}

/// All recorded responses of one recording, compactly (one `Bytes` per frame).
#[derive(Debug, Default)]
pub struct Recorded {
    exchanges: Vec<Option<RecordedResponse>>,
    by_request: HashMap<RequestKey, usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RequestKey {
    method: String,
    path: String,
    body: Bytes,
}

/// One recorded response.
#[derive(Debug)]
pub(crate) struct RecordedResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// Each frame with its recorded offset from the request's arrival, if recorded.
    pub(crate) frames: Vec<(Option<Duration>, Bytes)>,
    /// Where its content tokens are, for `/metrics` (counted once, at load).
    pub(crate) tokens: crate::metrics::RecordedTokens,
}

/// How a request found (or did not find) its recorded exchange.
#[derive(Debug)]
pub(crate) enum Lookup<'a> {
    /// A recorded response to serve.
    Response(&'a RecordedResponse),
    /// No match, or the exchange has no response: answer synthetically.
    Synthetic,
    /// The exchange header names no exchange of the recording.
    BadIndex(String),
}

impl Recorded {
    /// Load every exchange of the recording at `path` (format v1, `.jsonl` or `.jsonl.gz`).
    pub fn load(path: &Path) -> Result<Recorded, MockError> {
        let reader = RecordingReader::open(path).map_err(|source| MockError::OpenRecording {
            path: path.to_owned(),
            source,
        })?;
        let mut recorded = Recorded::default();
        for item in reader {
            let (line, exchange) = item?;
            let index = recorded.exchanges.len();
            let key = RequestKey {
                method: exchange.request.method.clone(),
                path: exchange.request.path.clone(),
                body: Bytes::from(exchange.request.body_bytes().into_owned()),
            };
            // The first exchange with a given request wins, as in file order.
            recorded.by_request.entry(key).or_insert(index);
            let tokens = crate::metrics::recorded_frame_tokens(&exchange);
            let response = match exchange.response {
                None => None,
                Some(response) => {
                    let status = StatusCode::from_u16(response.status).map_err(|source| {
                        MockError::RecordedStatus {
                            path: path.to_owned(),
                            line,
                            status: response.status,
                            source,
                        }
                    })?;
                    let mut headers = Vec::with_capacity(response.headers.len());
                    for (name, value) in &response.headers {
                        if is_dropped_header(name) {
                            continue;
                        }
                        let (Ok(name), Ok(value)) = (
                            HeaderName::from_bytes(name.as_bytes()),
                            HeaderValue::from_str(value),
                        ) else {
                            tracing::warn!(
                                file = %path.display(), line, header = %name,
                                "skipping a recorded header that is not valid HTTP"
                            );
                            continue;
                        };
                        headers.push((name, value));
                    }
                    let frames = response
                        .frames
                        .iter()
                        .map(|f| {
                            let offset = f.t_ms.map(|t| Duration::from_secs_f64(t / 1000.0));
                            (offset, Bytes::from(f.bytes().into_owned()))
                        })
                        .collect();
                    Some(RecordedResponse {
                        status,
                        headers,
                        frames,
                        tokens,
                    })
                }
            };
            recorded.exchanges.push(response);
        }
        Ok(recorded)
    }

    /// Number of exchanges in the recording.
    pub fn len(&self) -> usize {
        self.exchanges.len()
    }

    /// True when the recording has no exchange.
    pub fn is_empty(&self) -> bool {
        self.exchanges.is_empty()
    }

    pub(crate) fn lookup(
        &self,
        exchange_header: Option<&str>,
        method: &str,
        path: &str,
        body: &Bytes,
    ) -> Lookup<'_> {
        let index = match exchange_header {
            Some(text) => match text.trim().parse::<usize>() {
                Ok(i) if i < self.exchanges.len() => i,
                _ => {
                    return Lookup::BadIndex(format!(
                        "x-llm-replay-exchange: {text:?} is not an exchange index of the recording (0..{})",
                        self.exchanges.len()
                    ));
                }
            },
            None => {
                let key = RequestKey {
                    method: method.to_owned(),
                    path: path.to_owned(),
                    body: body.clone(),
                };
                match self.by_request.get(&key) {
                    Some(&i) => i,
                    None => return Lookup::Synthetic,
                }
            }
        };
        match self.exchanges.get(index) {
            Some(Some(response)) => Lookup::Response(response),
            _ => Lookup::Synthetic,
        }
    }
}
