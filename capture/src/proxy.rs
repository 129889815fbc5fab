//! The recording reverse proxy: forwards each request to the upstream and streams the
//! response back read by read, stamping every read as it returns from the upstream (before it
//! is handed on) and, when the stream ends or is cut, handing one whole exchange to the
//! writer.
//!
//! Nothing is buffered on the response path: [`RecordingBody`] wraps the upstream body and
//! yields each frame as soon as it arrives, keeping a cheap reference-counted copy of the
//! bytes — up to `--max-recorded-bytes` per exchange; past the cap frames are passed on but
//! not kept, and the exchange is marked `truncated`, so a huge response costs bounded memory.
//! A silent upstream (no headers, or no read, for `--upstream-idle-timeout`) ends the
//! client's response and the exchange is recorded incomplete with the reason. Completeness
//! (the family's terminal marker) is worked out once the stream is over, off the per-frame
//! path. A client that hangs up after the terminal frame (SDKs stop reading at `[DONE]`,
//! before a gateway's held-open body ends) leaves a complete exchange; before it, a cut one,
//! with `cancelled_ms`: when the proxy noticed the client gone, on the frames' clock.
//! Requests go through [`UpstreamClient::send`] (`upstream`), which resends once a request
//! whose reused connection closed before any response byte and names the cause of a
//! failure, for the client's 502 and the recorded `error`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::formats::complete::CompletionTracker;
use common::recording::{Exchange, Frame, Request, Response, UpstreamNote};
use http::StatusCode;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame as BodyFrame, SizeHint};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde_json::{Map, json};

use common::recording::is_hop_by_hop_header;

pub use super::routes::Upstream;
use super::routes::{Route, Routes};
use super::upstream::{FailureCause, SendError, UpstreamClient, chain, humanize};
use super::writer::WriterHandle;

/// The largest request body the proxy accepts (LLM requests are far smaller).
pub const MAX_REQUEST_BODY: usize = 64 << 20;

/// State shared by every request of one proxy.
pub struct ProxyState {
    /// The `--upstream` routes.
    pub routes: Routes,
    pub client: UpstreamClient,
    pub writer: WriterHandle,
    /// Header whose value becomes the exchange's `session` (`--session-header`).
    pub session_header: Option<HeaderName>,
    /// Most response bytes kept per exchange (`--max-recorded-bytes`).
    pub max_recorded_bytes: usize,
    /// Longest silence of the upstream before the response is cut (`--upstream-idle-timeout`).
    pub upstream_idle_timeout: Duration,
    /// Zero of `at_ms`: the first request's arrival.
    pub first_arrival: std::sync::OnceLock<Instant>,
    /// Exchanges started and not yet handed to the writer.
    pub in_flight: AtomicU64,
    pub next_id: AtomicU64,
    /// Which exchanges are recorded (`--sample`).
    pub sampler: Sampler,
    /// The recorder's own figures.
    pub metrics: Arc<crate::metrics::RecordMetrics>,
}

/// `--sample P%`: a deterministic share of the traffic, by a hash of the session id (so
/// sessions stay whole) or, without one, of the exchange's number.
#[derive(Debug, Clone, Copy)]
pub struct Sampler {
    /// Kept when the hash, reduced to 0..1_000_000, is below this.
    per_million: u64,
}

impl Sampler {
    pub fn new(share: f64) -> Sampler {
        Sampler {
            per_million: (share.clamp(0.0, 1.0) * 1e6).round() as u64,
        }
    }

    /// Whether the exchange `id` (in session `session`, if any) is recorded.
    pub fn keeps(&self, session: Option<&str>, id: &str) -> bool {
        if self.per_million >= 1_000_000 {
            return true;
        }
        let hash = match session {
            Some(session) => fnv1a(session.as_bytes()),
            None => fnv1a(id.as_bytes()),
        };
        // FNV's low bits mix poorly: fold the high half in first.
        let mixed = (hash ^ (hash >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (mixed >> 11) % 1_000_000 < self.per_million
    }
}

/// FNV-1a, 64 bits: stable across builds and platforms (the sampling choice must be).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The response body handed to the client.
pub type ProxyBody = http_body_util::Either<RecordingBody, Full<Bytes>>;

/// Handle one request: forward, and stream the response back while recording it.
pub async fn handle(
    state: Arc<ProxyState>,
    request: http::Request<Incoming>,
) -> Result<http::Response<ProxyBody>, Infallible> {
    let arrival = Instant::now();
    if let Some(cause) = state.writer.failure() {
        // Nothing could be recorded: fail loudly (a load balancer takes this proxy out)
        // rather than serve traffic that silently goes unrecorded.
        return Ok(plain(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("llm-replay record: the recording cannot be written: {cause}\n"),
        ));
    }
    let (parts, body) = request.into_parts();
    let client_path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let Some((route, path_and_query)) = state.routes.lookup(request_host(&parts), &client_path)
    else {
        return Ok(no_route(&state, &parts, &client_path));
    };
    if is_metrics_scrape(&parts.method, &path_and_query) {
        return Ok(pass_through_scrape(&state, route, &parts, &path_and_query).await);
    }
    let zero = *state.first_arrival.get_or_init(|| arrival);
    let body = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            tracing::warn!(%error, path = %path_and_query, "cannot read the request body");
            return Ok(plain(
                StatusCode::BAD_REQUEST,
                "llm-replay record: cannot read the request body\n",
            ));
        }
    };
    let at_ms = (arrival.duration_since(zero).as_secs_f64() * 1e6).round() / 1000.0;
    let mut recorded = recorded_request(&state, &parts, &path_and_query, &body, at_ms);
    if state.routes.names_upstreams() {
        recorded.set_upstream(&UpstreamNote::new(
            &route.name,
            &route.upstream.display_with_path(),
        ));
    }
    state.metrics.seen.fetch_add(1, Ordering::Relaxed);
    let keep = state.sampler.keeps(
        recorded.session.as_deref(),
        recorded.id.as_deref().unwrap_or_default(),
    );
    if !keep {
        state.metrics.sampled_out.fetch_add(1, Ordering::Relaxed);
    }
    let upstream_request = match upstream_request(route, &parts, &path_and_query, body) {
        Ok(request) => request,
        Err(why) => return Ok(plain(StatusCode::BAD_REQUEST, &why)),
    };

    // From here the exchange is in flight: the guard records it even if the client hangs up
    // before the upstream answers (hyper then drops this future).
    let mut guard = InFlight::new(state.clone(), recorded, keep);
    let idle = state.upstream_idle_timeout;
    // t0 is taken just before the request is forwarded (before the resend, after one).
    let sent = state
        .client
        .send(upstream_request, tokio::time::Instant::now() + idle)
        .await;
    let t0 = sent.t0;
    match sent.result {
        Ok(response) => {
            state
                .metrics
                .status(&route.name, Some(response.status().as_u16()));
            state.metrics.upstream_ready(&route.name);
            let recorded = guard.take();
            Ok(recording_response(
                &state, route, recorded, response, t0, keep,
            ))
        }
        Err(error) => {
            state.metrics.status(&route.name, None);
            Ok(upstream_failed(
                &state,
                route,
                &mut guard,
                error,
                sent.resent,
            ))
        }
    }
}

/// The exchange as recorded so far: its id, session, arrival and request.
fn recorded_request(
    state: &ProxyState,
    parts: &http::request::Parts,
    path_and_query: &str,
    body: &Bytes,
    at_ms: f64,
) -> Exchange {
    let id = state.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    let mut recorded = Exchange {
        id: Some(format!("rec-{id}")),
        session: state
            .session_header
            .as_ref()
            .and_then(|h| parts.headers.get(h))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        at_ms: Some(at_ms),
        request: Request {
            method: parts.method.as_str().to_owned(),
            path: path_and_query.to_owned(),
            headers: header_map(&parts.headers, true),
            body: None,
            body_b64: None,
            unknown: Map::new(),
        },
        response: None,
        unknown: Map::new(),
    };
    if !body.is_empty() {
        recorded.request.set_body(body);
    }
    recorded
}

/// The request as forwarded upstream (HTTP/1.1, the client's headers less hop-by-hop ones),
/// or the text of the 400 that refuses it.
fn upstream_request(
    route: &Route,
    parts: &http::request::Parts,
    path_and_query: &str,
    body: Bytes,
) -> Result<http::Request<Full<Bytes>>, String> {
    let uri = route
        .upstream
        .uri_for(path_and_query)
        .map_err(|error| format!("llm-replay record: bad path: {error}\n"))?;
    let mut request = http::Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .version(http::Version::HTTP_11);
    if let Some(headers) = request.headers_mut() {
        forward_request_headers(&parts.headers, headers);
    }
    request
        .body(Full::new(body))
        .map_err(|error| format!("llm-replay record: {error}\n"))
}

/// The upstream gave no response: the exchange is recorded as abandoned with the cause, and
/// the client gets a 504 (no headers in time) or a 502 naming it.
fn upstream_failed(
    state: &ProxyState,
    route: &Route,
    guard: &mut InFlight,
    error: SendError,
    resent: bool,
) -> http::Response<ProxyBody> {
    let upstream = route.upstream.display();
    let idle = state.upstream_idle_timeout;
    match error {
        SendError::Timeout => {
            tracing::warn!(%upstream, timeout = ?idle, "no response headers from the upstream in time");
            guard.abandon(format!(
                "upstream: no response headers within {} from {upstream}",
                humanize(idle)
            ));
            plain(
                StatusCode::GATEWAY_TIMEOUT,
                &format!(
                    "llm-replay record: the upstream {upstream} sent no response headers within {}\n",
                    humanize(idle)
                ),
            )
        }
        SendError::Failed { cause, error } => {
            let resent_note = if resent {
                " (also when sent again on a new connection, after a reused one closed)"
            } else {
                ""
            };
            let error = chain(&error);
            tracing::warn!(%error, %upstream, resent, "upstream request failed");
            guard.abandon(format!(
                "upstream {upstream} {}{resent_note}: {error}",
                cause.phrase()
            ));
            // The named causes say it all; the others need the error's own words.
            let detail = if matches!(cause, FailureCause::Tls | FailureCause::Other) {
                format!(": {error}")
            } else {
                String::new()
            };
            plain(
                StatusCode::BAD_GATEWAY,
                &format!(
                    "llm-replay record: the upstream {upstream} {}{resent_note}{detail}\n",
                    cause.phrase()
                ),
            )
        }
    }
}

/// The upstream's response, streamed to the client through a `RecordingBody` that records
/// its frames as they pass.
fn recording_response(
    state: &Arc<ProxyState>,
    route: &Route,
    mut recorded: Exchange,
    response: http::Response<Incoming>,
    t0: Instant,
    keep: bool,
) -> http::Response<ProxyBody> {
    let idle = state.upstream_idle_timeout;
    let (parts, upstream_body) = response.into_parts();
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut recorded_headers = header_map(&parts.headers, false);
    drop_other_hosts(&mut recorded_headers, route.upstream.authority.as_str());
    recorded.response = Some(Response {
        status: parts.status.as_u16(),
        headers: recorded_headers,
        frames: Vec::new(),
        complete: false,
        unknown: Map::new(),
    });
    let recording = RecordingBody {
        inner: upstream_body,
        idle_timeout: idle,
        idle_timer: Box::pin(tokio::time::sleep(idle)),
        waiting_since: None,
        pending: Some(Pending {
            exchange: recorded,
            frames: Vec::new(),
            recorded_bytes: 0,
            seen_bytes: 0,
            truncated: false,
            t0,
            content_type,
            state: state.clone(),
            keep,
        }),
    };
    let mut response = http::Response::new(http_body_util::Either::Left(recording));
    *response.status_mut() = parts.status;
    *response.headers_mut() = forwardable(&parts.headers);
    response
}

/// The host a request was sent to: HTTP/2's `:authority` (the URI's), else the `Host`
/// header.
fn request_host(parts: &http::request::Parts) -> Option<&str> {
    parts
        .uri
        .authority()
        .map(http::uri::Authority::as_str)
        .or_else(|| {
            parts
                .headers
                .get(http::header::HOST)
                .and_then(|v| v.to_str().ok())
        })
}

/// No `--upstream` route takes the request (and there is no default): the proxy answers
/// `404` itself, as Envoy and nginx do for a request no route or `location` matches, naming
/// the routes; the request is counted (`no_route`), never forwarded nor recorded.
fn no_route(
    state: &ProxyState,
    parts: &http::request::Parts,
    client_path: &str,
) -> http::Response<ProxyBody> {
    state
        .metrics
        .refused(crate::metrics::RefusalReason::NoRoute);
    let host = request_host(parts).unwrap_or("(none)");
    // The query may hold credentials: only the path is named.
    let path = client_path.split('?').next().unwrap_or_default();
    tracing::debug!(%host, %path, "no upstream route for the request");
    plain(
        StatusCode::NOT_FOUND,
        &format!(
            "llm-replay record: no upstream route for host {host:?} and path {path:?}; \
             routes (--upstream): {}\n",
            state.routes.describe()
        ),
    )
}

/// Most bytes of a `/metrics` answer passed through (vLLM's is about 100 KiB).
const MAX_SCRAPE_BYTES: usize = 8 << 20;

/// A Prometheus scrape of the upstream through the proxy (`GET /metrics`: `llm-replay run`
/// scrapes its target's, a monitoring system may too) is not traffic to record: it is
/// forwarded, and neither recorded nor counted, nor does it start the recording's clock.
fn is_metrics_scrape(method: &http::Method, path_and_query: &str) -> bool {
    method == http::Method::GET && path_and_query.split('?').next() == Some("/metrics")
}

/// Forward a scrape to its route's upstream and hand back the answer, unrecorded.
async fn pass_through_scrape(
    state: &ProxyState,
    route: &Route,
    parts: &http::request::Parts,
    path_and_query: &str,
) -> http::Response<ProxyBody> {
    let Ok(uri) = route.upstream.uri_for(path_and_query) else {
        return plain(StatusCode::BAD_REQUEST, "llm-replay record: bad path\n");
    };
    let mut upstream_request = http::Request::builder()
        .method(http::Method::GET)
        .uri(uri)
        .version(http::Version::HTTP_11);
    if let Some(headers) = upstream_request.headers_mut() {
        forward_request_headers(&parts.headers, headers);
    }
    let Ok(upstream_request) = upstream_request.body(Full::new(Bytes::new())) else {
        return plain(StatusCode::BAD_REQUEST, "llm-replay record: bad request\n");
    };
    let idle = state.upstream_idle_timeout;
    let sent = state
        .client
        .send(upstream_request, tokio::time::Instant::now() + idle)
        .await;
    let Ok(response) = sent.result else {
        return plain(
            StatusCode::BAD_GATEWAY,
            "llm-replay record: the upstream did not answer the scrape\n",
        );
    };
    let (head, body) = response.into_parts();
    let collected =
        tokio::time::timeout(idle, Limited::new(body, MAX_SCRAPE_BYTES).collect()).await;
    let Ok(Ok(collected)) = collected else {
        return plain(
            StatusCode::BAD_GATEWAY,
            "llm-replay record: the upstream's /metrics answer could not be read whole\n",
        );
    };
    let mut out = http::Response::new(http_body_util::Either::Right(Full::new(
        collected.to_bytes(),
    )));
    *out.status_mut() = head.status;
    *out.headers_mut() = forwardable(&head.headers);
    out
}

fn plain(status: StatusCode, text: &str) -> http::Response<ProxyBody> {
    let mut response = http::Response::new(http_body_util::Either::Right(Full::new(
        Bytes::copy_from_slice(text.as_bytes()),
    )));
    *response.status_mut() = status;
    response
}

/// Headers as recorded (names lower-case, repeated values joined). Credentials are dropped by
/// the writer; `host` and hop-by-hop headers are not part of the exchange.
fn header_map(headers: &HeaderMap, request: bool) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let name = name.as_str();
        if is_hop_by_hop_header(name) || (request && (name == "host" || name == "content-length")) {
            continue;
        }
        let Ok(value) = value.to_str() else { continue };
        out.entry(name.to_owned())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    out
}

/// Drop the recorded response headers whose value holds a URL of a host other than the
/// upstream's: a gateway names its internal upstreams there (LiteLLM's
/// `x-litellm-model-api-base: http://vllm-3.internal:8000/v1`), and a recording is shared
/// further than the network it was made in. The client still gets them; only the recording
/// leaves them out.
fn drop_other_hosts(headers: &mut BTreeMap<String, String>, upstream: &str) {
    headers.retain(|name, value| {
        let keep = !names_other_host(value, upstream);
        if !keep {
            tracing::debug!(header = %name, "response header naming another host left out of the recording");
        }
        keep
    });
}

/// True when `value` holds a URL (`scheme://host…`) whose authority is not `upstream`'s
/// (compared without user info, case-insensitively).
fn names_other_host(value: &str, upstream: &str) -> bool {
    let mut rest = value;
    while let Some(at) = rest.find("://") {
        let after = &rest[at + 3..];
        let end = after
            .find(|c: char| {
                matches!(c, '/' | '?' | '#' | '"' | '\'' | ',' | ';' | '<' | '>')
                    || c.is_whitespace()
            })
            .unwrap_or(after.len());
        let authority = &after[..end];
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        if !host.is_empty() && !host.eq_ignore_ascii_case(upstream) {
            return true;
        }
        rest = &after[end..];
    }
    false
}

/// Client headers to forward: all but hop-by-hop and `host` (set from the upstream URL), with
/// `accept-encoding: identity` so each read is what the server wrote (a compressed stream
/// batches frames and hides their timing) — except for SigV4-signed requests, whose signed
/// headers must reach the server untouched.
fn forward_request_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let signed = from.contains_key("x-amz-date")
        || from
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("AWS4-"));
    for (name, value) in from {
        let n = name.as_str();
        if is_hop_by_hop_header(n) || n == "host" || n == "content-length" {
            continue;
        }
        if n == "accept-encoding" && !signed {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
    if !signed {
        to.insert(
            http::header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
}

/// Upstream response headers to send to the client (hop-by-hop removed).
fn forwardable(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !is_hop_by_hop_header(name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// An exchange forwarded and waiting for the upstream's response headers.
struct InFlight {
    state: Arc<ProxyState>,
    exchange: Option<Exchange>,
    /// Recorded (false: left out by `--sample`).
    keep: bool,
}

impl InFlight {
    fn new(state: Arc<ProxyState>, exchange: Exchange, keep: bool) -> InFlight {
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight {
            state,
            exchange: Some(exchange),
            keep,
        }
    }

    /// The response started: the exchange moves on (to a [`Pending`], which owns the count).
    fn take(&mut self) -> Exchange {
        self.exchange
            .take()
            .expect("taken once, right after the response arrived")
    }

    /// Record the exchange without a response, with `error`.
    fn abandon(&mut self, error: String) {
        if let Some(mut exchange) = self.exchange.take() {
            exchange.unknown.insert("error".into(), json!(error));
            if self.keep {
                self.state.writer.submit(exchange);
            }
            self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.abandon("client disconnected before the response".to_owned());
    }
}

/// What is needed to finish recording one exchange.
struct Pending {
    exchange: Exchange,
    /// The frames kept: at most `max_recorded_bytes` in all.
    frames: Vec<(f64, Bytes)>,
    recorded_bytes: usize,
    /// Every body byte passed to the client.
    seen_bytes: u64,
    /// A frame did not fit under the cap: it and every later one were not kept.
    truncated: bool,
    t0: Instant,
    content_type: Option<String>,
    state: Arc<ProxyState>,
    /// Recorded (false: left out by `--sample`).
    keep: bool,
}

impl Pending {
    /// Keep a copy of a frame if it fits under the cap (whole frames only, and none after the
    /// first that does not fit, so what is kept is a prefix of the stream).
    fn keep(&mut self, t_ms: f64, data: &Bytes) {
        self.seen_bytes += data.len() as u64;
        if self.truncated || !self.keep {
            return;
        }
        if self.recorded_bytes + data.len() > self.state.max_recorded_bytes {
            self.truncated = true;
            // Let go of the spare capacity now rather than at the end of the stream.
            self.frames.shrink_to_fit();
            return;
        }
        self.recorded_bytes += data.len();
        self.frames.push((t_ms, data.clone()));
    }

    /// The stream is over, and how: the upstream body reached its end, the upstream cut it
    /// (a transport error or silence: incomplete whatever it holds), or the client hung up
    /// first.
    fn finish(mut self, end: StreamEnd) {
        if !self.keep {
            self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let path = self.exchange.request.path.clone();
        let mut tracker = CompletionTracker::new(&path, self.content_type.as_deref());
        for (_, bytes) in &self.frames {
            tracker.feed(bytes);
        }
        let whole = tracker.finish() && !self.truncated;
        // When a cut stream's client left (a user pressing stop), on the frames' clock: the
        // replay cancels the exchange at that point (`Exchange::client_cancelled_ms`).
        let cancelled_ms = match &end {
            StreamEnd::ClientLeft { at_ms } if !whole => Some(*at_ms),
            _ => None,
        };
        let (complete, note) = match end {
            StreamEnd::Ended => (whole, None),
            StreamEnd::Cut(note) => (false, Some(note)),
            // A client stops reading at the terminal frame (`[DONE]`, `message_stop`, ...)
            // and may close before the body's own end, which a gateway can hold back for
            // seconds: the answer arrived whole. Before the terminal frame, it is cut.
            StreamEnd::ClientLeft { .. } if whole => (
                true,
                Some("client disconnected after the terminal frame".to_owned()),
            ),
            StreamEnd::ClientLeft { .. } => (false, Some("client disconnected".to_owned())),
        };
        if let Some(response) = self.exchange.response.as_mut() {
            // Consumed as converted, so the reads and their copies are not all held at once.
            response.frames = std::mem::take(&mut self.frames)
                .into_iter()
                // Microsecond resolution is what the histograms keep.
                .map(|(t, bytes)| Frame::from_bytes(Some((t * 1000.0).round() / 1000.0), &bytes))
                .collect();
            response.complete = complete;
            if let Some(note) = note {
                response.unknown.insert("ended".into(), json!(note));
            }
            if let Some(at_ms) = cancelled_ms {
                response.unknown.insert(
                    "cancelled_ms".into(),
                    json!((at_ms * 1000.0).round() / 1000.0),
                );
            }
            if self.truncated {
                // Format v1 keeps unknown fields: readers that do not know these still read
                // the exchange (as incomplete).
                response.unknown.insert("truncated".into(), json!(true));
                response
                    .unknown
                    .insert("body_bytes".into(), json!(self.seen_bytes));
                response
                    .unknown
                    .insert("recorded_bytes".into(), json!(self.recorded_bytes));
            }
        }
        self.state.writer.submit(self.exchange);
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a recorded stream ended.
enum StreamEnd {
    /// The upstream body reached its end.
    Ended,
    /// The upstream cut it (transport error, silence), with the reason.
    Cut(String),
    /// The client hung up before the upstream body's end; hyper dropped the body `at_ms`
    /// after t0 (it notices a client closing mid-response at once: its HTTP/1 dispatcher
    /// keeps reading the socket while the body waits, and a read of 0 mid-message ends the
    /// connection).
    ClientLeft { at_ms: f64 },
}

/// The upstream body, passed through frame by frame, recorded as it goes.
pub struct RecordingBody {
    inner: Incoming,
    idle_timeout: Duration,
    /// Fires at or before the end of the current wait's allowance; re-armed lazily (only
    /// when it fires early), so a fast stream does not touch the timer on every frame.
    idle_timer: Pin<Box<tokio::time::Sleep>>,
    /// When the current wait for the upstream began (`None` right after a frame). Only time
    /// spent waiting on the upstream counts, never time the client takes to read.
    waiting_since: Option<tokio::time::Instant>,
    pending: Option<Pending>,
}

/// Why the proxy cut a response to the client.
#[derive(Debug, thiserror::Error)]
pub enum ProxyBodyError {
    #[error(transparent)]
    Upstream(#[from] hyper::Error),
    #[error("the upstream sent nothing for {0}")]
    UpstreamIdle(String),
}

impl Body for RecordingBody {
    type Data = Bytes;
    type Error = ProxyBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, ProxyBodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                self.waiting_since = None;
                if let (Some(data), Some(pending)) = (frame.data_ref(), self.pending.as_mut()) {
                    // Stamp when the read returns, before it is handed on.
                    let t_ms = pending.t0.elapsed().as_nanos() as f64 / 1e6;
                    pending.keep(t_ms, data);
                }
            }
            Poll::Ready(Some(Err(error))) => {
                if let Some(pending) = self.pending.take() {
                    pending.finish(StreamEnd::Cut(format!("upstream error: {error}")));
                }
            }
            Poll::Ready(None) => {
                if let Some(pending) = self.pending.take() {
                    pending.finish(StreamEnd::Ended);
                }
            }
            Poll::Pending => return self.poll_idle(cx),
        }
        polled.map(|frame| frame.map(|result| result.map_err(ProxyBodyError::Upstream)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl RecordingBody {
    /// The upstream has nothing yet: wait, unless it has been silent for the idle timeout, in
    /// which case the exchange is recorded incomplete and the client's response is cut.
    fn poll_idle(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, ProxyBodyError>>> {
        let now = tokio::time::Instant::now();
        let deadline = *self.waiting_since.get_or_insert(now) + self.idle_timeout;
        loop {
            if self.idle_timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if tokio::time::Instant::now() < deadline {
                // It fired for an earlier wait: arm it for this one.
                self.idle_timer.as_mut().reset(deadline);
                continue;
            }
            let silence = humanize(self.idle_timeout);
            tracing::warn!(timeout = %silence, "the upstream went silent; response cut");
            if let Some(pending) = self.pending.take() {
                pending.finish(StreamEnd::Cut(format!(
                    "upstream idle: nothing for {silence}; response cut"
                )));
            }
            return Poll::Ready(Some(Err(ProxyBodyError::UpstreamIdle(silence))));
        }
    }
}

impl Drop for RecordingBody {
    fn drop(&mut self) {
        // The client went away (or the connection broke) before the stream ended.
        if let Some(pending) = self.pending.take() {
            if self.inner.is_end_stream() {
                // Nothing left to read (an empty body is never polled).
                pending.finish(StreamEnd::Ended);
            } else {
                // Stamped first, on the frames' clock, before any work of recording it.
                let at_ms = pending.t0.elapsed().as_nanos() as f64 / 1e6;
                pending.finish(StreamEnd::ClientLeft { at_ms });
            }
        }
    }
}

#[cfg(test)]
mod header_tests {
    use super::names_other_host;

    #[test]
    fn a_url_of_another_host_is_found_the_upstream_own_is_not() {
        let upstream = "gateway:4000";
        for other in [
            "http://vllm-3.internal:8000/v1",
            "https://user:pw@10.0.0.7/x",
            "<https://elsewhere>; rel=next",
            "see https://gateway:4000/a and http://db:5432",
        ] {
            assert!(names_other_host(other, upstream), "{other}");
        }
        for same in [
            "req-42",
            "https://GATEWAY:4000/v1/models",
            "text/event-stream",
            "max-age=0",
        ] {
            assert!(!names_other_host(same, upstream), "{same}");
        }
    }
}
