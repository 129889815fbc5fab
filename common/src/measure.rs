//! Per-request measurement: turns timed network reads of one response into a
//! [`RequestOutcome`].
//!
//! The worker feeds live reads (stamped when the read returned, before parsing) and the
//! coordinator feeds recorded frames (stamped with their recorded offsets) through the same
//! [`StreamMeter`], so the baseline and the replay are measured by one piece of code.
//! [`measure_recorded`] is the one place that measures a recorded exchange (streamed or
//! not) for the baseline, `recording stats` and `export`; [`measure_unstreamed`] measures a
//! one-body answer for the replay and the recording alike.

use crate::formats::{self, Ending, Event, Family, StreamParser, Usage};
use crate::recording::Exchange;
use crate::tokenizer::Tokenizer;

/// Why a request failed. Failures enter no distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Non-2xx HTTP status.
    Status,
    /// An error frame in the stream (even if a terminal marker followed).
    ErrorFrame,
    /// Connection refused/reset, broken framing, or a body the parser rejected.
    Transport,
    /// The request exceeded `--timeout`.
    Timeout,
    /// A complete response with no generated content.
    Empty,
}

impl FailureKind {
    /// Stable name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Status => "status",
            FailureKind::ErrorFrame => "error_frame",
            FailureKind::Transport => "transport",
            FailureKind::Timeout => "timeout",
            FailureKind::Empty => "empty",
        }
    }
}

/// Why a transport failure happened, as far as the client can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportCause {
    /// Nothing listened on the target's port.
    Refused,
    /// The peer reset the connection (or the write hit a broken pipe).
    Reset,
    /// The connection closed before a whole response head arrived.
    ClosedBeforeResponse,
    /// The response head came (a `200`), then the connection or the stream ended (closed,
    /// reset) before any content: a gateway's read timeout shorter than the TTFT (nginx
    /// `proxy_read_timeout`), an upstream that died. The same over HTTP/1.1 and HTTP/2.
    ClosedAfterHead,
    /// An HTTP/1.1 request was answered with HTTP/2 frames (a SETTINGS or GOAWAY frame):
    /// the target speaks only cleartext HTTP/2 and needs `--target-h2c`.
    Http2Only,
    /// The TLS handshake failed; the problem says why.
    Tls(TlsProblem),
    /// The target's host name did not resolve.
    Dns,
    /// Anything else: broken framing, a body the parser rejected, an unclassified I/O error.
    Other,
}

/// Why a TLS handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsProblem {
    /// The certificate chain does not lead to a trusted root (a private CA without
    /// `--target-ca`, or a self-signed certificate).
    UnknownIssuer,
    /// The certificate is not valid for the target's host name.
    NameMismatch,
    /// The certificate has expired.
    Expired,
    /// The certificate is not valid yet.
    NotYetValid,
    /// The certificate was revoked.
    Revoked,
    /// The certificate's signature does not verify.
    BadSignature,
    /// The peer sent a TLS alert or broke the handshake protocol.
    Handshake,
    /// Any other certificate or TLS error.
    Other,
}

impl TransportCause {
    /// Every cause's report name, in report order (`Tls` of any problem is `tls`).
    pub const NAMES: [&'static str; 8] = [
        "refused",
        "reset",
        "closed_before_response",
        "tls",
        "dns",
        "other",
        "closed_after_head",
        "http2_only",
    ];

    /// Stable name used in reports and logs.
    pub fn name(self) -> &'static str {
        match self {
            TransportCause::Refused => "refused",
            TransportCause::Reset => "reset",
            TransportCause::ClosedBeforeResponse => "closed_before_response",
            TransportCause::Tls(_) => "tls",
            TransportCause::Dns => "dns",
            TransportCause::Other => "other",
            TransportCause::ClosedAfterHead => "closed_after_head",
            TransportCause::Http2Only => "http2_only",
        }
    }
}

impl TlsProblem {
    /// A short human description (`unknown issuer`), used as a report key.
    pub fn description(self) -> &'static str {
        match self {
            TlsProblem::UnknownIssuer => "unknown issuer",
            TlsProblem::NameMismatch => "name mismatch",
            TlsProblem::Expired => "expired",
            TlsProblem::NotYetValid => "not yet valid",
            TlsProblem::Revoked => "revoked",
            TlsProblem::BadSignature => "bad signature",
            TlsProblem::Handshake => "handshake failed",
            TlsProblem::Other => "certificate rejected",
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// The stream reached its family's terminal marker with content and no error frame.
    Succeeded,
    /// The stream ended (cleanly or not) without the terminal marker and without an error frame.
    EndedEarly,
    /// The request failed.
    Failed(FailureKind),
    /// The client cancelled the request on purpose (closed its connection or stream) before
    /// the answer ended: neither a failure nor an ended-early stream. Its TTFT counts when the
    /// first token came before the cancel; it has no latency, ITL or token rate.
    Cancelled(CancelCause),
}

/// Why the replay cancelled a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelCause {
    /// The recording shows the production client abandoning this exchange
    /// (`requests.cancelled_as_recorded`): cancelled at the recorded point.
    AsRecorded,
    /// Drawn by `--cancel-rate` (`requests.cancelled_by_rate`): a what-if run.
    ByRate,
}

/// Where a request's token count came from (`token_source` of `--requests-out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// The server's usage report.
    Usage,
    /// A count the server stated elsewhere in the stream (llama.cpp's final `timings`):
    /// the server's own count, believed after a usage report and before the tokenizer.
    Server,
    /// `--tokenizer FILE`: the streamed text (output) or the prompt (input) tokenized.
    Tokenizer,
    /// Output: one token per content frame (no usage, no tokenizer).
    Frames,
    /// Input: the prompt's characters divided by four (no usage, no tokenizer).
    Estimate,
}

impl TokenSource {
    /// `usage`, `server`, `tokenizer`, `frames`, `estimate`.
    pub fn name(self) -> &'static str {
        match self {
            TokenSource::Usage => "usage",
            TokenSource::Server => "server",
            TokenSource::Tokenizer => "tokenizer",
            TokenSource::Frames => "frames",
            TokenSource::Estimate => "estimate",
        }
    }
}

/// The measurement of one request. Times are microseconds from `t0`, the instant just before
/// the request was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestOutcome {
    pub kind: OutcomeKind,
    pub ttft_us: Option<u64>,
    pub ttst_us: Option<u64>,
    /// Last content frame − t0.
    pub latency_us: Option<u64>,
    /// Number of frames that carried generated content.
    pub content_frames: u64,
    /// Output tokens from the server's (last) usage report, when there was one.
    pub usage_output_tokens: Option<u64>,
    /// Output tokens the server stated outside a usage report (llama.cpp's `timings`),
    /// when the stream had no usage report.
    pub server_output_tokens: Option<u64>,
    /// Output tokens counted by tokenizing the streamed text (`--tokenizer`), when the
    /// stream had no usage report.
    pub tokenized_output_tokens: Option<u64>,
    /// Input tokens, from usage when reported (or counted / estimated by the caller:
    /// [`RequestOutcome::input_source`] says which).
    pub input_tokens: Option<u64>,
    /// Where `input_tokens` came from (`None` with no input count).
    pub input_source: Option<TokenSource>,
    /// Actual send time − intended send time, for scheduled and rate modes.
    pub schedule_lag_us: Option<u64>,
    /// Wall-clock send time, microseconds since the Unix epoch (for throughput windows).
    pub sent_unix_us: Option<u64>,
    /// Why a transport failure happened (`None` for other outcomes; a transport failure
    /// without one counts as `other`).
    pub transport_cause: Option<TransportCause>,
    /// The request failed on a reused connection before any response byte and was sent once
    /// more on a fresh one; this outcome is the second attempt's.
    pub resent: bool,
    /// The answer was one body, not a stream: it has a latency but no TTFT, TTST or ITL.
    pub unstreamed: bool,
    /// Input tokens the server reported serving from its prompt cache.
    pub cached_input_tokens: Option<u64>,
    /// A stream of at least [`COALESCED_MIN_FRAMES`] content frames whose content arrived
    /// all at once or in a few bursts: within [`COALESCED_SPAN_US`], or
    /// [`COALESCED_FRAMES_PER_READ`] or more content frames per burst on average, a burst
    /// being the content reads that arrived within [`COALESCED_BURST_GAP_US`] of each other
    /// (whatever the HTTP framing: one 16 KiB TLS record of chunked SSE is many chunks, read
    /// one by one within microseconds). Something on the path (a buffering proxy or gateway)
    /// held the stream and delivered it in blocks: its TTFT is late and its ITL is the speed
    /// of a read loop, not of the model.
    pub coalesced: bool,
    /// The protocol of the response head that answered (`None` when no head arrived).
    pub protocol: Option<HttpProtocol>,
}

/// The fewest content frames a stream needs before it can be judged coalesced: shorter
/// answers arrive in one read from any server.
pub const COALESCED_MIN_FRAMES: u64 = 4;
/// A stream whose first and last content frames are at most this far apart (µs) arrived in
/// one piece: no model streams four tokens within a millisecond to a client over a network.
pub const COALESCED_SPAN_US: u64 = 1_000;
/// A stream whose bursts carried this many content frames each on average was coalesced on
/// the way, however long the stream took (a buffered stream comes in a block per buffer).
pub const COALESCED_FRAMES_PER_READ: u64 = 8;
/// Content reads at most this far apart (µs) arrived together: the pieces of one buffer
/// flushed at once. A model streaming a token every millisecond (faster than any served
/// model to one user) still gives reads a millisecond apart.
pub const COALESCED_BURST_GAP_US: u64 = 250;

impl RequestOutcome {
    /// A failure with no timing.
    pub fn failed(kind: FailureKind) -> Self {
        RequestOutcome {
            kind: OutcomeKind::Failed(kind),
            ttft_us: None,
            ttst_us: None,
            latency_us: None,
            content_frames: 0,
            usage_output_tokens: None,
            server_output_tokens: None,
            tokenized_output_tokens: None,
            input_tokens: None,
            input_source: None,
            schedule_lag_us: None,
            sent_unix_us: None,
            unstreamed: false,
            cached_input_tokens: None,
            transport_cause: None,
            resent: false,
            coalesced: false,
            protocol: None,
        }
    }

    /// A transport failure with its cause.
    pub fn transport_failure(cause: TransportCause) -> Self {
        RequestOutcome {
            transport_cause: Some(cause),
            ..RequestOutcome::failed(FailureKind::Transport)
        }
    }

    /// Output tokens: the usage report's count when there was one, else the count the
    /// server stated elsewhere in the stream, else the tokenizer's count of the streamed
    /// text (`--tokenizer`), else the content frames.
    pub fn output_tokens(&self) -> u64 {
        self.usage_output_tokens
            .or(self.server_output_tokens)
            .or(self.tokenized_output_tokens)
            .unwrap_or(self.content_frames)
    }

    /// The server's own output count (its usage report, else a count it stated elsewhere in
    /// the stream), when it gave one: nothing is left for a tokenizer to count.
    pub fn server_stated_output(&self) -> Option<u64> {
        self.usage_output_tokens.or(self.server_output_tokens)
    }

    /// Where [`RequestOutcome::output_tokens`] came from.
    pub fn output_source(&self) -> TokenSource {
        if self.usage_output_tokens.is_some() {
            TokenSource::Usage
        } else if self.server_output_tokens.is_some() {
            TokenSource::Server
        } else if self.tokenized_output_tokens.is_some() {
            TokenSource::Tokenizer
        } else {
            TokenSource::Frames
        }
    }
}

/// Measures one response, read by read.
pub struct StreamMeter {
    parser: StreamParser,
    state: MeterState,
}

#[derive(Default)]
struct MeterState {
    first_content_us: Option<u64>,
    second_content_us: Option<u64>,
    last_content_us: Option<u64>,
    content_frames: u64,
    usage: Usage,
    usage_seen: bool,
    /// What the server stated outside a usage report ([`Event::ServerCount`]), last wins.
    server_count: Usage,
    terminal: bool,
    error_frame: bool,
    /// The first error frame's message, cleaned (`error_text::clean_message`).
    error_message: Option<String>,
    now_us: u64,
    /// Bursts of reads that delivered content (reads within [`COALESCED_BURST_GAP_US`] of
    /// the previous content read are one burst), the last content read's instant, and the
    /// content frames counted when the current read began (to tell whether it delivered
    /// any).
    content_bursts: u64,
    last_content_read_us: Option<u64>,
    frames_before_read: u64,
    /// The generated text of every kind, concatenated, when asked for
    /// ([`StreamMeter::keep_text`]): what `--tokenizer` counts after the stream ends.
    text: Option<String>,
}

impl MeterState {
    fn on_event(&mut self, event: Event<'_>) {
        match event {
            Event::Content { text, .. } => {
                if let Some(kept) = self.text.as_mut() {
                    kept.push_str(&text);
                }
                self.content_frames += 1;
                match (self.first_content_us, self.second_content_us) {
                    (None, _) => self.first_content_us = Some(self.now_us),
                    (Some(_), None) => self.second_content_us = Some(self.now_us),
                    _ => {}
                }
                self.last_content_us = Some(self.now_us);
            }
            Event::Usage(usage) => {
                // Cumulative reports: the last one wins, field by field.
                if usage.output_tokens.is_some() {
                    self.usage.output_tokens = usage.output_tokens;
                }
                if usage.input_tokens.is_some() {
                    self.usage.input_tokens = usage.input_tokens;
                }
                if usage.cached_input_tokens.is_some() {
                    self.usage.cached_input_tokens = usage.cached_input_tokens;
                }
                self.usage_seen = true;
            }
            Event::ServerCount(count) => self.server_count = count,
            Event::Terminal => self.terminal = true,
            Event::Error { message } => {
                self.error_frame = true;
                if self.error_message.is_none() {
                    let cleaned = crate::error_text::clean_message(&message);
                    self.error_message = (!cleaned.is_empty()).then_some(cleaned);
                }
            }
        }
    }
}

impl StreamMeter {
    /// A meter for a response of `family`.
    pub fn new(family: Family) -> Self {
        StreamMeter {
            parser: StreamParser::new(family),
            state: MeterState::default(),
        }
    }

    /// One network read that returned `t_us` microseconds after t0.
    ///
    /// Returns `Err` when the framing is broken beyond recovery; the caller then ends the
    /// stream with [`StreamMeter::finish_broken`].
    pub fn on_read(&mut self, t_us: u64, bytes: &[u8]) -> Result<(), crate::formats::FrameError> {
        self.state.now_us = t_us;
        self.state.frames_before_read = self.state.content_frames;
        let state = &mut self.state;
        let fed = self.parser.feed(bytes, &mut |event| state.on_event(event));
        if self.state.content_frames > self.state.frames_before_read {
            let state = &mut self.state;
            if state
                .last_content_read_us
                .is_none_or(|last| t_us.saturating_sub(last) > COALESCED_BURST_GAP_US)
            {
                state.content_bursts += 1;
            }
            state.last_content_read_us = Some(t_us);
        }
        fed
    }

    /// Keep the generated text (every kind: text, reasoning, tool-call fragments) so it can
    /// be tokenized once the stream has ended ([`StreamMeter::take_text`]). Appending is the
    /// only cost on the read path; nothing is tokenized there.
    pub fn keep_text(&mut self) {
        self.state.text.get_or_insert_with(String::new);
    }

    /// The generated text kept so far (empty unless [`StreamMeter::keep_text`] was called).
    pub fn take_text(&mut self) -> String {
        self.state.text.take().unwrap_or_default()
    }

    /// Number of content frames seen so far.
    pub fn content_frames(&self) -> u64 {
        self.state.content_frames
    }

    /// True once the terminal marker arrived.
    pub fn is_terminal(&self) -> bool {
        self.state.terminal
    }

    /// [`StreamMeter::finish`], with the first error frame's message (cleaned), if any.
    pub fn finish_with_message(
        mut self,
        t_us: u64,
        transport_error: bool,
    ) -> (RequestOutcome, Option<String>) {
        let outcome = self.end(t_us, transport_error);
        (outcome, self.state.error_message.take())
    }

    /// The first error frame's message so far (cleaned), if any.
    pub fn error_message(&self) -> Option<&str> {
        self.state.error_message.as_deref()
    }

    /// The stream ended at `t_us` (EOF or a transport error when `transport_error`).
    pub fn finish(mut self, t_us: u64, transport_error: bool) -> RequestOutcome {
        self.end(t_us, transport_error)
    }

    /// [`StreamMeter::finish`], with the generated text kept ([`StreamMeter::keep_text`]),
    /// including what the parser's end of stream delivered.
    pub fn finish_with_text(
        mut self,
        t_us: u64,
        transport_error: bool,
    ) -> (RequestOutcome, String) {
        let outcome = self.end(t_us, transport_error);
        (outcome, self.take_text())
    }

    fn end(&mut self, t_us: u64, transport_error: bool) -> RequestOutcome {
        self.state.now_us = t_us;
        let state = &mut self.state;
        let ending = self.parser.finish(&mut |event| state.on_event(event));
        let state = &self.state;
        let kind = if state.error_frame {
            OutcomeKind::Failed(FailureKind::ErrorFrame)
        } else if state.terminal && !transport_error {
            if state.content_frames == 0 {
                OutcomeKind::Failed(FailureKind::Empty)
            } else {
                OutcomeKind::Succeeded
            }
        } else if state.terminal && state.content_frames > 0 {
            // The terminal marker arrived; a transport hiccup after it loses nothing.
            OutcomeKind::Succeeded
        } else if state.content_frames == 0 && (transport_error || ending != Ending::Clean) {
            OutcomeKind::Failed(FailureKind::Transport)
        } else {
            OutcomeKind::EndedEarly
        };
        self.outcome(kind)
    }

    /// The framing broke (bad checksum, oversize frame): a transport failure if nothing was
    /// generated yet, else an ended-early stream.
    pub fn finish_broken(self) -> RequestOutcome {
        let kind = if self.state.error_frame {
            OutcomeKind::Failed(FailureKind::ErrorFrame)
        } else if self.state.content_frames == 0 {
            OutcomeKind::Failed(FailureKind::Transport)
        } else {
            OutcomeKind::EndedEarly
        };
        self.outcome(kind)
    }

    fn outcome(&self, kind: OutcomeKind) -> RequestOutcome {
        let state = &self.state;
        let ttft = state.first_content_us;
        let (input_tokens, input_source) =
            match (state.usage.input_tokens, state.server_count.input_tokens) {
                (Some(n), _) => (Some(n), Some(TokenSource::Usage)),
                (None, Some(n)) => (Some(n), Some(TokenSource::Server)),
                (None, None) => (None, None),
            };
        RequestOutcome {
            kind,
            ttft_us: ttft,
            ttst_us: match (ttft, state.second_content_us) {
                (Some(first), Some(second)) => Some(second.saturating_sub(first)),
                _ => None,
            },
            latency_us: state.last_content_us,
            content_frames: state.content_frames,
            usage_output_tokens: state
                .usage
                .output_tokens
                .filter(|n| *n > 0 || state.terminal),
            server_output_tokens: state
                .server_count
                .output_tokens
                .filter(|n| *n > 0 || state.terminal),
            tokenized_output_tokens: None,
            input_tokens,
            input_source,
            schedule_lag_us: None,
            sent_unix_us: None,
            transport_cause: None,
            resent: false,
            unstreamed: false,
            cached_input_tokens: state
                .usage
                .cached_input_tokens
                .or(state.server_count.cached_input_tokens),
            coalesced: state.coalesced(),
            protocol: None,
        }
    }
}

impl MeterState {
    /// The stream's content arrived all at once (see [`RequestOutcome::coalesced`]).
    fn coalesced(&self) -> bool {
        let frames = self.content_frames;
        if frames < COALESCED_MIN_FRAMES {
            return false;
        }
        let span = match (self.first_content_us, self.last_content_us) {
            (Some(first), Some(last)) => last.saturating_sub(first),
            _ => return false,
        };
        span <= COALESCED_SPAN_US
            || frames >= COALESCED_FRAMES_PER_READ.saturating_mul(self.content_bursts.max(1))
    }
}

/// Measure a one-body (non-streamed) answer that was complete `t_us` after t0: it succeeds
/// with a latency and its usage, and has no TTFT, TTST or ITL (as in AIPerf). `family` is
/// `None` when nothing identified one; the body is then judged by whether it is JSON at all.
pub fn measure_unstreamed(family: Option<Family>, body: &[u8], t_us: u64) -> RequestOutcome {
    let mut outcome = RequestOutcome::failed(FailureKind::Empty);
    outcome.unstreamed = true;
    let read = match family {
        Some(family) => match formats::unstreamed(family, body) {
            Ok(read) => Some(read),
            Err(_) => {
                outcome.kind = OutcomeKind::Failed(FailureKind::Transport);
                return outcome;
            }
        },
        None if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() => None,
        None if body.trim_ascii().is_empty() => return outcome,
        None => {
            outcome.kind = OutcomeKind::Failed(FailureKind::Transport);
            return outcome;
        }
    };
    if let Some(read) = &read {
        if read.error.is_some() {
            outcome.kind = OutcomeKind::Failed(FailureKind::ErrorFrame);
            return outcome;
        }
        if !read.has_content {
            return outcome;
        }
    }
    outcome.kind = OutcomeKind::Succeeded;
    outcome.latency_us = Some(t_us);
    outcome.content_frames = 1;
    if let Some(usage) = read.and_then(|r| r.usage) {
        outcome.usage_output_tokens = usage.output_tokens;
        outcome.input_tokens = usage.input_tokens;
        outcome.input_source = usage.input_tokens.map(|_| TokenSource::Usage);
        outcome.cached_input_tokens = usage.cached_input_tokens;
    }
    outcome
}

/// Measure what a recording shows for `exchange`: its response's frames at their recorded
/// offsets (0 where a frame has none), streamed or one body by the same rule the replay uses
/// ([`formats::response_is_streamed`]). `input_tokens` is the usage report's only (callers
/// that need an ISL without one use [`estimate_input_tokens`], as the replay does). `None`
/// when the exchange has no response. `sent_unix_us` is the arrival offset, so throughput
/// windows of a recording are measured on its own time line. Without a tokenizer: see
/// [`measure_recorded_with`].
pub fn measure_recorded(exchange: &Exchange) -> Option<RequestOutcome> {
    measure_recorded_with(exchange, None)
}

/// [`measure_recorded`], with `--tokenizer`: a recorded answer without a usage report gets
/// `tokenized_output_tokens`, the tokenizer's count of its generated text (every content
/// kind, concatenated).
///
/// An exchange whose client hung up mid-answer ([`recorded_client_cancelled`]) measures as
/// [`OutcomeKind::Cancelled`]`(`[`CancelCause::AsRecorded`]`)`: its TTFT when the first
/// content frame came, no latency; a recorded failure (a status, an error frame) stays one.
pub fn measure_recorded_with(
    exchange: &Exchange,
    tokenizer: Option<&Tokenizer>,
) -> Option<RequestOutcome> {
    let response = exchange.response.as_ref()?;
    let request_body = exchange.request.body_bytes();
    let mut outcome = if !(200..300).contains(&response.status) {
        RequestOutcome::failed(FailureKind::Status)
    } else {
        let path = exchange.request.path.as_str();
        let content_type = response.header("content-type");
        let first = response.frames.first().map(|f| f.bytes());
        let first: &[u8] = first.as_deref().unwrap_or_default();
        let family = formats::detect(path, content_type, first);
        let t_us = |t_ms: Option<f64>| (t_ms.unwrap_or(0.0).max(0.0) * 1000.0).round() as u64;
        if formats::response_is_streamed(path, content_type, &request_body, first) {
            // Frames are borrowed where they are text; only base64 frames are decoded.
            let frames = response.frames.iter().map(|f| (t_us(f.t_ms), f.bytes()));
            measure_frames_with(family.unwrap_or(Family::OpenAiChat), frames, tokenizer)
        } else {
            let body: Vec<u8> = response
                .frames
                .iter()
                .flat_map(|f| f.bytes().into_owned())
                .collect();
            let done = response.frames.last().map_or(0, |f| t_us(f.t_ms));
            let mut outcome = measure_unstreamed(family, &body, done);
            if let Some(tokenizer) = tokenizer
                && outcome.kind == OutcomeKind::Succeeded
                && outcome.usage_output_tokens.is_none()
                && let Some(text) = crate::tokenizer::response_body_text(&body)
            {
                outcome.tokenized_output_tokens = Some(tokenizer.count_text(&text));
            }
            outcome
        }
    };
    if recorded_client_cancelled(exchange)
        && matches!(
            outcome.kind,
            OutcomeKind::EndedEarly | OutcomeKind::Failed(FailureKind::Transport)
        )
    {
        // The production client left on purpose: neither a failure nor a cut stream. Only
        // the TTFT (when the first token came before it left) is a measurement.
        outcome.kind = OutcomeKind::Cancelled(CancelCause::AsRecorded);
        outcome.ttst_us = None;
        outcome.latency_us = None;
        outcome.transport_cause = None;
    }
    if matches!(
        outcome.kind,
        OutcomeKind::Succeeded | OutcomeKind::EndedEarly | OutcomeKind::Cancelled(_)
    ) {
        outcome.sent_unix_us = exchange.at_ms.map(|ms| (ms.max(0.0) * 1000.0) as u64);
    }
    Some(outcome)
}

/// The recording shows the client hanging up before the answer ended: an incomplete
/// response whose `ended` is `"client disconnected"`, as `llm-replay record` writes it (a
/// client that left after the terminal frame wrote a complete response: it cancelled
/// nothing).
pub fn recorded_client_cancelled(exchange: &Exchange) -> bool {
    exchange.response.as_ref().is_some_and(|response| {
        !response.complete
            && response.unknown.get("ended").and_then(|v| v.as_str()) == Some("client disconnected")
    })
}

/// The family of a recorded exchange: from its path, its response's content type and first
/// bytes ([`formats::detect`], as the replay recognises a live response).
pub fn recorded_family(exchange: &Exchange) -> Option<Family> {
    let response = exchange.response.as_ref();
    let content_type = response.and_then(|r| r.header("content-type"));
    let first = response.and_then(|r| r.frames.first()).map(|f| f.bytes());
    formats::detect(
        &exchange.request.path,
        content_type,
        first.as_deref().unwrap_or_default(),
    )
}

/// The outcome the recording itself shows for `exchange`, when its frames have timing: what
/// [`measure_recorded_with`] measures, with the input tokens, when the recorded usage has
/// none, counted by `tokenizer` (`--tokenizer`: the prompt through the chat template,
/// [`Tokenizer::count_prompt`]) or else estimated from the request body
/// ([`estimate_input_tokens`], the replay's own estimate). The baseline, `recording stats`
/// and `export` all take their numbers from here.
pub fn recorded_outcome(
    exchange: &Exchange,
    tokenizer: Option<&Tokenizer>,
) -> Option<RequestOutcome> {
    if !exchange.response.as_ref()?.has_timing() {
        return None;
    }
    let mut outcome = measure_recorded_with(exchange, tokenizer)?;
    if outcome.input_tokens.is_none() {
        let (tokens, source) = recorded_input_tokens(exchange, tokenizer);
        outcome.input_tokens = tokens;
        outcome.input_source = tokens.map(|_| source);
    }
    Some(outcome)
}

/// The input tokens of a recorded request without usage: the tokenizer's count of its prompt
/// ([`TokenSource::Tokenizer`]) when there is a tokenizer and it finds the prompt, else the
/// characters / 4 estimate ([`TokenSource::Estimate`]).
pub fn recorded_input_tokens(
    exchange: &Exchange,
    tokenizer: Option<&Tokenizer>,
) -> (Option<u64>, TokenSource) {
    let body = exchange.request.body_bytes();
    if let Some(tokens) = tokenizer.and_then(|t| t.count_prompt(&exchange.request.path, &body)) {
        return (Some(tokens), TokenSource::Tokenizer);
    }
    (estimate_input_tokens(&body), TokenSource::Estimate)
}

/// The outcome an import's `source` note shows for `exchange`, when the exchange has no frame
/// timing but its source measured the request itself: an OpenTelemetry GenAI span
/// (`llm-replay import otel-genai`) notes `ttft_ms` (first-token event − span start),
/// `duration_ms` (span end − start) and `output_tokens` (`gen_ai.usage.output_tokens`).
///
/// These map onto the replay's own definitions: the span starts as the client makes the call
/// (t0), so TTFT is `ttft_ms`, request latency is `duration_ms`, and ITL and the per-user
/// token rate follow from them and the output tokens as for a replayed stream. TTST needs a
/// second frame and is absent. All three notes are needed (a span without usage would give
/// an output length of zero); the input tokens are the span's `input_tokens`, else the
/// replay's estimate from the request body. `None` for an exchange with frame timing (the
/// frames are measured instead, [`recorded_outcome`]) or without the three notes.
pub fn noted_outcome(exchange: &Exchange) -> Option<RequestOutcome> {
    if exchange.response.as_ref().is_some_and(|r| r.has_timing()) {
        return None;
    }
    let source = exchange.source_note()?;
    let ms = |value: Option<f64>| value.filter(|v| v.is_finite() && *v >= 0.0);
    let (ttft, duration) = (ms(source.ttft_ms)?, ms(source.duration_ms)?);
    let output_tokens = source.output_tokens?;
    if ttft > duration || output_tokens == 0 {
        return None;
    }
    let us = |ms: f64| (ms * 1000.0).round() as u64;
    let input_source = Some(if source.input_tokens.is_some() {
        TokenSource::Usage
    } else {
        TokenSource::Estimate
    });
    let input_tokens = source
        .input_tokens
        .or_else(|| estimate_input_tokens(&exchange.request.body_bytes()));
    Some(RequestOutcome {
        kind: OutcomeKind::Succeeded,
        ttft_us: Some(us(ttft)),
        ttst_us: None,
        latency_us: Some(us(duration)),
        content_frames: 0,
        usage_output_tokens: Some(output_tokens),
        server_output_tokens: None,
        tokenized_output_tokens: None,
        input_tokens,
        input_source: input_tokens.and(input_source),
        schedule_lag_us: None,
        sent_unix_us: exchange.at_ms.map(|ms| (ms.max(0.0) * 1000.0) as u64),
        transport_cause: None,
        resent: false,
        unstreamed: false,
        cached_input_tokens: None,
        coalesced: false,
        protocol: None,
    })
}

/// An exchange's output length as its recording shows it ([`recorded_output_length`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedOutputLength {
    /// Output tokens.
    pub tokens: u64,
    /// Where they were read.
    pub source: OutputLengthSource,
}

/// Where a recorded output length was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputLengthSource {
    /// The recorded response's usage report.
    Usage,
    /// The recorded response's generated text, counted by `--tokenizer` (it reported no
    /// usage).
    Tokenizer,
    /// The recorded response's content frames, one token each (it reported no usage and no
    /// tokenizer was given).
    Frames,
    /// The import's [`SourceNote`](crate::recording::SourceNote): the source counted them
    /// and no response was recorded (an OpenTelemetry span, an Azure or BurstGPT trace).
    SourceNote,
}

impl OutputLengthSource {
    /// The name `recording stats` shows (`usage`, `tokenizer`, `frames`, `source`).
    pub fn name(self) -> &'static str {
        match self {
            OutputLengthSource::Usage => "usage",
            OutputLengthSource::Tokenizer => "tokenizer",
            OutputLengthSource::Frames => "frames",
            OutputLengthSource::SourceNote => "source",
        }
    }
}

/// [`recorded_output_length_with`] without a tokenizer: a recorded answer without usage is
/// as long as its content frames.
pub fn recorded_output_length(exchange: &Exchange) -> Option<RecordedOutputLength> {
    recorded_output_length_with(exchange, None)
}

/// How many tokens the recorded answer of `exchange` generated: the one definition of a
/// recorded output length, which `--pin-output-length` asks for, `export` writes as
/// `output_length` and `recording stats` counts as OSL.
///
/// From the recorded response as [`measure_recorded_with`] measures it: its usage report when
/// it has one (a stream cut after it still generated that many), else the tokenizer's count
/// of a complete answer's text (`--tokenizer`), else one token per content frame of a
/// complete answer (a cut stream's frames or text are a lower bound, not its length).
/// Without a response, the import's source note when the source counted them. `None` for a
/// failed answer (a recorded error generated nothing worth asking for), a cut or cancelled
/// one without usage, or no output at all; callers that need a number anyway fall back on
/// what the request asked for (`max_tokens`), and say so.
pub fn recorded_output_length_with(
    exchange: &Exchange,
    tokenizer: Option<&Tokenizer>,
) -> Option<RecordedOutputLength> {
    let length =
        |tokens: u64, source| (tokens > 0).then_some(RecordedOutputLength { tokens, source });
    let Some(outcome) = measure_recorded_with(exchange, tokenizer) else {
        let tokens = exchange.source_note()?.output_tokens?;
        return length(tokens, OutputLengthSource::SourceNote);
    };
    // The server's own count (usage, or llama.cpp's `timings`) is what it generated.
    match (outcome.kind, outcome.server_stated_output()) {
        (
            OutcomeKind::Succeeded | OutcomeKind::EndedEarly | OutcomeKind::Cancelled(_),
            Some(tokens),
        ) => length(tokens, OutputLengthSource::Usage),
        (OutcomeKind::Succeeded, None) => match outcome.tokenized_output_tokens {
            Some(tokens) => length(tokens, OutputLengthSource::Tokenizer),
            None => length(outcome.content_frames, OutputLengthSource::Frames),
        },
        _ => None,
    }
}

/// Measure a whole recorded response: frames with their offsets in microseconds.
pub fn measure_frames<B: AsRef<[u8]>>(
    family: Family,
    frames: impl IntoIterator<Item = (u64, B)>,
) -> RequestOutcome {
    measure_frames_with(family, frames, None)
}

/// [`measure_frames`]; with a tokenizer, a stream without a usage report gets its generated
/// text counted (`tokenized_output_tokens`).
pub fn measure_frames_with<B: AsRef<[u8]>>(
    family: Family,
    frames: impl IntoIterator<Item = (u64, B)>,
    tokenizer: Option<&Tokenizer>,
) -> RequestOutcome {
    let mut meter = StreamMeter::new(family);
    if tokenizer.is_some() {
        meter.keep_text();
    }
    let mut last_t = 0;
    let mut broken = false;
    for (t_us, bytes) in frames {
        last_t = t_us;
        if meter.on_read(t_us, bytes.as_ref()).is_err() {
            broken = true;
            break;
        }
    }
    let (mut outcome, text) = if broken {
        let text = meter.take_text();
        (meter.finish_broken(), text)
    } else {
        meter.finish_with_text(last_t, false)
    };
    if let Some(tokenizer) = tokenizer
        && outcome.server_stated_output().is_none()
        && outcome.content_frames > 0
    {
        outcome.tokenized_output_tokens = Some(tokenizer.count_text(&text));
    }
    outcome
}

/// Estimate the input tokens of a request body when the server reports none: the characters
/// of its prompt text divided by four ([`formats::request::estimated_input_tokens`]).
/// `None` when the body is not JSON or holds no prompt text.
pub fn estimate_input_tokens(body: &[u8]) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let tokens = formats::request::estimated_input_tokens(&value);
    (tokens > 0).then_some(tokens)
}

/// The protocol a connection to the target spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpProtocol {
    /// HTTP/1.1 (cleartext, or over TLS by ALPN or without ALPN).
    Http1,
    /// HTTP/2 negotiated by ALPN over TLS.
    H2,
    /// Cleartext HTTP/2 with prior knowledge (`--target-h2c`).
    H2c,
}

impl HttpProtocol {
    /// Report name: `http/1.1`, `h2`, `h2c`.
    pub fn name(self) -> &'static str {
        match self {
            HttpProtocol::Http1 => "http/1.1",
            HttpProtocol::H2 => "h2",
            HttpProtocol::H2c => "h2c",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Metric, RunMetrics};

    fn exchange(line: &str) -> Exchange {
        serde_json::from_str(line).expect("a recording line")
    }

    const SPAN: &str = r#"{"at_ms":250,"request":{"method":"POST","path":"/v1/chat/completions","body":"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"},"source":{"format":"otel-genai","ttft_ms":125.0,"duration_ms":1115.0,"output_tokens":100,"input_tokens":42}}"#;

    #[test]
    fn a_span_with_first_token_duration_and_usage_is_measured_like_a_stream() {
        let outcome = noted_outcome(&exchange(SPAN)).expect("a noted outcome");
        assert_eq!(outcome.kind, OutcomeKind::Succeeded);
        assert_eq!(outcome.ttft_us, Some(125_000));
        assert_eq!(outcome.latency_us, Some(1_115_000));
        assert_eq!(outcome.ttst_us, None);
        assert_eq!(outcome.output_tokens(), 100);
        assert_eq!(outcome.input_tokens, Some(42));
        assert_eq!(outcome.sent_unix_us, Some(250_000));
        // ITL = (latency − TTFT) / (output tokens − 1) = 990 / 99 = 10 ms, as for a replay.
        let mut metrics = RunMetrics::new();
        metrics.record(&outcome);
        let itl = metrics.stats(Metric::Itl).expect("ITL");
        assert!((itl.p50 - 10.0).abs() < 0.01, "{itl:?}");
        assert_eq!(metrics.counters.succeeded, 1);
        assert_eq!(metrics.counters.usage_reported, 1);
    }

    fn token(i: usize) -> String {
        format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n")
    }

    /// Issue 33, item 1: a stream a buffering ingress flushes every 16 KiB arrives as a few
    /// blocks, each read chunk by chunk (one read per transfer-encoding chunk) within
    /// microseconds: coalesced, whatever the number of reads. A server streaming a token
    /// every millisecond, read a token at a time, with a client that fell behind now and
    /// then (a few tokens in one read): not coalesced.
    #[test]
    fn blocks_read_chunk_by_chunk_are_coalesced_and_a_fast_paced_stream_is_not() {
        // 200 tokens in three blocks (at 1.0 s, 1.9 s and 2.1 s), each token its own read
        // 3 µs after the previous one.
        let mut meter = StreamMeter::new(Family::OpenAiChat);
        for (block, start_us) in [
            (0..90, 1_000_000u64),
            (90..180, 1_900_000),
            (180..200, 2_100_000),
        ] {
            for (k, i) in block.enumerate() {
                meter
                    .on_read(start_us + 3 * k as u64, token(i).as_bytes())
                    .expect("frame");
            }
        }
        meter.on_read(2_100_100, b"data: [DONE]\n\n").expect("done");
        assert!(meter.finish(2_100_100, false).coalesced);
        // 200 tokens 1 ms apart; every 20th read carries 4 tokens (the client was late).
        let mut meter = StreamMeter::new(Family::OpenAiChat);
        let mut i = 0;
        let mut t = 20_000u64;
        while i < 200 {
            let n = if i % 20 == 0 { 4 } else { 1 };
            let part: String = (i..(i + n).min(200)).map(token).collect();
            meter.on_read(t, part.as_bytes()).expect("frames");
            i += n;
            t += 1_000 * n as u64;
        }
        meter.on_read(t, b"data: [DONE]\n\n").expect("done");
        assert!(!meter.finish(t, false).coalesced);
    }

    #[test]
    fn a_stream_delivered_in_one_read_is_coalesced_and_a_paced_one_is_not() {
        // Twenty tokens and [DONE] in one read, 581 ms after t0: a buffering proxy.
        let mut whole: String = (0..20).map(token).collect();
        whole.push_str("data: [DONE]\n\n");
        let mut meter = StreamMeter::new(Family::OpenAiChat);
        meter.on_read(581_000, whole.as_bytes()).expect("frames");
        let outcome = meter.finish(581_000, false);
        assert_eq!(outcome.kind, OutcomeKind::Succeeded);
        assert!(outcome.coalesced);
        // The same tokens 10 ms apart, one read each: streamed.
        let mut meter = StreamMeter::new(Family::OpenAiChat);
        for i in 0..20 {
            meter
                .on_read(100_000 + 10_000 * i as u64, token(i).as_bytes())
                .expect("frame");
        }
        meter.on_read(300_000, b"data: [DONE]\n\n").expect("done");
        assert!(!meter.finish(300_000, false).coalesced);
        // A large buffered body read in a few reads, 5 ms apart: still one piece.
        let mut meter = StreamMeter::new(Family::OpenAiChat);
        for read in 0..3 {
            let part: String = (read * 20..read * 20 + 20).map(token).collect();
            meter
                .on_read(500_000 + 5_000 * read as u64, part.as_bytes())
                .expect("frames");
        }
        assert!(meter.finish(520_000, false).coalesced);
        // Three tokens in one read: too short to judge.
        let mut meter = StreamMeter::new(Family::OpenAiChat);
        let short: String = (0..3).map(token).collect();
        meter.on_read(50_000, short.as_bytes()).expect("frames");
        assert!(!meter.finish(50_000, false).coalesced);
    }

    #[test]
    fn coalesced_streams_and_connections_are_counted_and_merge() {
        use crate::metrics::{HttpProtocol, TlsVersion};
        let mut whole: String = (0..6).map(token).collect();
        whole.push_str("data: [DONE]\n\n");
        let mut meter = StreamMeter::new(Family::OpenAiChat);
        meter.on_read(9_000, whole.as_bytes()).expect("frames");
        let coalesced = meter.finish(9_000, false);
        let mut a = RunMetrics::new();
        a.record(&coalesced);
        a.record(&RequestOutcome {
            coalesced: false,
            ..coalesced
        });
        a.count_connection(HttpProtocol::H2, TlsVersion::Tls13);
        a.count_connection(HttpProtocol::Http1, TlsVersion::None);
        let mut b = RunMetrics::new();
        b.count_connection(HttpProtocol::H2, TlsVersion::Tls13);
        // HTTP/2 without TLS is h2c whichever name the caller used.
        b.count_connection(HttpProtocol::H2, TlsVersion::None);
        a.merge(&b);
        assert_eq!((a.counters.coalesce_checked, a.counters.coalesced), (2, 1));
        assert_eq!(
            a.counters.connections.entries(),
            vec![
                (HttpProtocol::Http1, TlsVersion::None, 1),
                (HttpProtocol::H2, TlsVersion::Tls13, 2),
                (HttpProtocol::H2c, TlsVersion::None, 1),
            ]
        );
        assert_eq!(a.counters.connections.total(), 4);
    }

    #[test]
    fn a_span_missing_a_note_or_an_exchange_with_frames_has_no_noted_outcome() {
        for missing in ["ttft_ms", "duration_ms", "output_tokens"] {
            let mut line: serde_json::Value = serde_json::from_str(SPAN).expect("JSON");
            line["source"]
                .as_object_mut()
                .expect("source")
                .remove(missing);
            assert!(
                noted_outcome(&exchange(&line.to_string())).is_none(),
                "without {missing}"
            );
        }
        let mut later: serde_json::Value = serde_json::from_str(SPAN).expect("JSON");
        later["source"]["ttft_ms"] = serde_json::json!(2000.0);
        assert!(
            noted_outcome(&exchange(&later.to_string())).is_none(),
            "a first token after the span's end"
        );
        let mut framed: serde_json::Value = serde_json::from_str(SPAN).expect("JSON");
        framed["response"] = serde_json::json!({"status": 200, "frames": [{"t_ms": 5.0, "data": "data: [DONE]\n\n"}]});
        assert!(
            noted_outcome(&exchange(&framed.to_string())).is_none(),
            "frames are measured instead"
        );
    }

    #[test]
    fn the_recorded_output_length_is_usage_else_frames_of_a_whole_answer_else_the_source_note() {
        let chat = |status: u16, frames: &[String]| -> Exchange {
            let frames: Vec<serde_json::Value> = frames
                .iter()
                .enumerate()
                .map(|(i, data)| serde_json::json!({"t_ms": 10.0 * i as f64, "data": data}))
                .collect();
            serde_json::from_value(serde_json::json!({
                "request": {"path": "/v1/chat/completions", "body": "{\"stream\":true}"},
                "response": {"status": status, "headers": {"content-type": "text/event-stream"},
                             "frames": frames}
            }))
            .expect("exchange")
        };
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":42}}\n\n"
                .to_owned();
        let done = "data: [DONE]\n\n".to_owned();
        let length = |ex: &Exchange| recorded_output_length(ex).map(|l| (l.tokens, l.source));
        let tokens: Vec<String> = (0..5).map(token).collect();

        let whole = [tokens.clone(), vec![usage.clone(), done.clone()]].concat();
        assert_eq!(
            length(&chat(200, &whole)),
            Some((42, OutputLengthSource::Usage))
        );
        let without_usage = [tokens.clone(), vec![done.clone()]].concat();
        assert_eq!(
            length(&chat(200, &without_usage)),
            Some((5, OutputLengthSource::Frames)),
            "one token per content frame"
        );
        let cut_after_usage = [tokens.clone(), vec![usage.clone()]].concat();
        assert_eq!(
            length(&chat(200, &cut_after_usage)),
            Some((42, OutputLengthSource::Usage)),
            "a stream cut after its usage report generated that many"
        );
        assert_eq!(
            length(&chat(200, &tokens)),
            None,
            "a cut stream's frames are no length"
        );
        assert_eq!(length(&chat(400, &whole)), None, "a failed answer");
        let error = [
            tokens.clone(),
            vec![
                "data: {\"error\":{\"message\":\"boom\"}}\n\n".to_owned(),
                usage,
                done,
            ],
        ]
        .concat();
        assert_eq!(length(&chat(200, &error)), None, "an error frame");

        let span = exchange(SPAN);
        assert_eq!(
            length(&span),
            Some((100, OutputLengthSource::SourceNote)),
            "no response: the source counted them"
        );
        let mut uncounted: serde_json::Value = serde_json::from_str(SPAN).expect("JSON");
        uncounted["source"]["output_tokens"] = serde_json::json!(0);
        assert_eq!(length(&exchange(&uncounted.to_string())), None);
        uncounted["source"] = serde_json::json!({"format": "openai-batch", "line": 3});
        assert_eq!(length(&exchange(&uncounted.to_string())), None);
    }

    fn test_tokenizer() -> Tokenizer {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer.json");
        Tokenizer::from_file(&path).expect("the test tokenizer loads")
    }

    fn recorded_chat(frames: &[&str], response_extra: serde_json::Value) -> Exchange {
        let frames: Vec<serde_json::Value> = frames
            .iter()
            .enumerate()
            .map(|(i, data)| serde_json::json!({"t_ms": 100.0 + 10.0 * i as f64, "data": data}))
            .collect();
        let mut response = serde_json::json!({"status": 200,
            "headers": {"content-type": "text/event-stream"}, "frames": frames});
        if let (Some(response), Some(extra)) =
            (response.as_object_mut(), response_extra.as_object())
        {
            for (key, value) in extra {
                response.insert(key.clone(), value.clone());
            }
        }
        serde_json::from_value(serde_json::json!({
            "at_ms": 5.0,
            "request": {"path": "/v1/chat/completions", "body": serde_json::json!({"stream": true,
                "messages": [{"role": "user", "content": "Hello, world!"}]}).to_string()},
            "response": response
        }))
        .expect("exchange")
    }

    const HELLO: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hello,\"}}]}\n\n";
    const WORLD: &str = "data: {\"choices\":[{\"delta\":{\"content\":\" world!\"}}]}\n\n";

    #[test]
    fn a_recorded_stream_without_usage_is_counted_by_the_tokenizer() {
        let tokenizer = test_tokenizer();
        let exchange = recorded_chat(
            &[HELLO, WORLD, "data: [DONE]\n\n"],
            serde_json::json!({"complete": true}),
        );
        // "Hello, world!" is 4 tokens (Python `tokenizers`, see `tokenizer::tests`) in 2 frames.
        let outcome = recorded_outcome(&exchange, Some(&tokenizer)).expect("timed");
        assert_eq!(outcome.kind, OutcomeKind::Succeeded);
        assert_eq!(outcome.content_frames, 2);
        assert_eq!(outcome.tokenized_output_tokens, Some(4));
        assert_eq!(
            (outcome.output_tokens(), outcome.output_source()),
            (4, TokenSource::Tokenizer)
        );
        assert_eq!(
            outcome.input_tokens,
            Some(4),
            "the prompt, without a template"
        );
        assert_eq!(outcome.input_source, Some(TokenSource::Tokenizer));
        let length = recorded_output_length_with(&exchange, Some(&tokenizer)).expect("a length");
        assert_eq!(
            (length.tokens, length.source),
            (4, OutputLengthSource::Tokenizer)
        );
        assert_eq!(OutputLengthSource::Tokenizer.name(), "tokenizer");

        // Without a tokenizer: frames and the estimate, as before.
        let outcome = recorded_outcome(&exchange, None).expect("timed");
        assert_eq!(
            (outcome.output_tokens(), outcome.output_source()),
            (2, TokenSource::Frames)
        );
        assert_eq!(outcome.input_source, Some(TokenSource::Estimate));
        let length = recorded_output_length(&exchange).expect("a length");
        assert_eq!(
            (length.tokens, length.source),
            (2, OutputLengthSource::Frames)
        );

        // Usage wins over the tokenizer.
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":7}}\n\n";
        let with_usage = recorded_chat(
            &[HELLO, WORLD, usage, "data: [DONE]\n\n"],
            serde_json::json!({}),
        );
        let outcome = recorded_outcome(&with_usage, Some(&tokenizer)).expect("timed");
        assert_eq!(outcome.tokenized_output_tokens, None);
        assert_eq!(
            (outcome.output_tokens(), outcome.output_source()),
            (7, TokenSource::Usage)
        );
        assert_eq!(
            (outcome.input_tokens, outcome.input_source),
            (Some(9), Some(TokenSource::Usage))
        );

        // A one-body answer without usage: its message text.
        let body = serde_json::json!({"choices": [{"message": {"role": "assistant", "content": "Hello, world!"}}]});
        let unstreamed: Exchange = serde_json::from_value(serde_json::json!({
            "request": {"path": "/v1/chat/completions", "body": "{\"messages\":[]}"},
            "response": {"status": 200, "headers": {"content-type": "application/json"},
                "frames": [{"t_ms": 50.0, "data": body.to_string()}]}
        }))
        .expect("exchange");
        let outcome = measure_recorded_with(&unstreamed, Some(&tokenizer)).expect("measured");
        assert_eq!(
            (outcome.output_tokens(), outcome.output_source()),
            (4, TokenSource::Tokenizer)
        );
    }

    #[test]
    fn a_recorded_client_disconnect_is_a_cancel_as_recorded() {
        let left = serde_json::json!({"complete": false, "ended": "client disconnected"});
        let exchange = recorded_chat(&[HELLO, WORLD], left.clone());
        let outcome = recorded_outcome(&exchange, None).expect("timed");
        assert_eq!(
            outcome.kind,
            OutcomeKind::Cancelled(CancelCause::AsRecorded)
        );
        assert_eq!(outcome.ttft_us, Some(100_000));
        assert_eq!((outcome.ttst_us, outcome.latency_us), (None, None));
        assert_eq!(
            recorded_output_length(&exchange),
            None,
            "no length without usage"
        );
        let mut metrics = RunMetrics::new();
        metrics.record(&outcome);
        assert_eq!(metrics.counters.cancelled_as_recorded, 1);
        assert_eq!(metrics.counters.ended_early, 0);
        assert!(metrics.stats(Metric::Ttft).is_some());

        // Before any content: still a cancel, without a TTFT.
        let early = recorded_chat(&[], left.clone());
        let outcome = measure_recorded(&early).expect("measured");
        assert_eq!(
            outcome.kind,
            OutcomeKind::Cancelled(CancelCause::AsRecorded)
        );
        assert_eq!(outcome.ttft_us, None);

        // A cut stream without the note stays ended early; a recorded error stays a failure;
        // a client that left after the terminal frame cancelled nothing.
        let cut = recorded_chat(&[HELLO, WORLD], serde_json::json!({"complete": false}));
        assert_eq!(
            measure_recorded(&cut).map(|o| o.kind),
            Some(OutcomeKind::EndedEarly)
        );
        let error = "data: {\"error\":{\"message\":\"boom\"}}\n\n";
        let failed = recorded_chat(&[HELLO, error], left);
        assert_eq!(
            measure_recorded(&failed).map(|o| o.kind),
            Some(OutcomeKind::Failed(FailureKind::ErrorFrame))
        );
        let after = recorded_chat(
            &[HELLO, WORLD, "data: [DONE]\n\n"],
            serde_json::json!({"complete": true, "ended": "client disconnected after the terminal frame"}),
        );
        assert_eq!(
            measure_recorded(&after).map(|o| o.kind),
            Some(OutcomeKind::Succeeded)
        );
    }
}
