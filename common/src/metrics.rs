//! Mergeable run metrics: one HDR histogram per distribution plus counters.
//!
//! Every distribution is an HDR histogram with 3 significant digits. Times are stored in
//! microseconds, token counts as counts and per-user token rates in milli-tokens per second, so
//! that merging the metrics of many workers is exact: merging histograms from any split of a
//! sample set gives the histogram of the whole set.

use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer, V2Serializer};

use crate::measure::{
    CancelCause, FailureKind, OutcomeKind, RequestOutcome, TokenSource, TransportCause,
};

mod errors;
mod sparse;

// The message of a failure is `error_text`'s; re-exported where the summary of them is.
pub use crate::error_text::{
    MAX_ERROR_BODY_KEPT, MAX_MESSAGE_CHARS, clean_message, error_message, redact_secrets,
};
pub use errors::{ErrorSample, ErrorSummary, MAX_ERROR_SAMPLES, MAX_MESSAGES_PER_GROUP};
pub use sparse::{SparseHistogram, SparseMetrics};

/// Significant digits kept by every histogram.
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// One distribution of the run report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Time to first token (first content frame − request sent).
    Ttft,
    /// Time to second token (second content frame − first).
    Ttst,
    /// Inter-token latency: (latency − TTFT) / (output tokens − 1).
    Itl,
    /// Request latency: last content frame − request sent.
    Latency,
    /// Output tokens per second per user: 1 / ITL.
    TokensPerSecondPerUser,
    /// Input sequence length (tokens).
    Isl,
    /// Output sequence length (tokens).
    Osl,
    /// Schedule lag: actual send time − intended send time.
    ScheduleLag,
    /// Connection setup of each new connection to the target: name resolution and TCP
    /// connect (k6's `http_req_connecting`), before any TLS.
    Connect,
    /// TLS handshake of each new https connection (k6's `http_req_tls_handshaking`).
    TlsHandshake,
    /// Time to failure of each failed request (request sent → failure known: the error
    /// status's head, the error frame, the cut, the timeout). Never mixed into the success
    /// distributions.
    ErrorLatency,
}

/// How a metric's stored integer maps to its display unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Stored in microseconds, displayed in milliseconds.
    Milliseconds,
    /// Stored and displayed as a count of tokens.
    Tokens,
    /// Stored in milli-tokens per second, displayed in tokens per second.
    TokensPerSecond,
}

impl Unit {
    /// Divide a stored value by this to get the display value.
    pub fn scale(self) -> f64 {
        match self {
            Unit::Milliseconds => 1_000.0,
            Unit::Tokens => 1.0,
            Unit::TokensPerSecond => 1_000.0,
        }
    }
}

impl Metric {
    /// Every per-request metric, in report order: the wire order of a report's histograms
    /// and the set goals name. The connection metrics are apart ([`Metric::CONNECTION`]).
    pub const ALL: [Metric; 8] = [
        Metric::Ttft,
        Metric::Ttst,
        Metric::Itl,
        Metric::Latency,
        Metric::TokensPerSecondPerUser,
        Metric::Isl,
        Metric::Osl,
        Metric::ScheduleLag,
    ];

    /// The per-connection metrics, in their wire order: one sample per connection opened,
    /// not per request, so they stay out of [`Metric::ALL`].
    pub const CONNECTION: [Metric; 2] = [Metric::Connect, Metric::TlsHandshake];

    /// The per-failure metrics, in their wire order: one sample per failed request. They
    /// travel apart too, so a report of an older worker (without them) still decodes.
    pub const FAILURE: [Metric; 1] = [Metric::ErrorLatency];

    /// The report-JSON key (`ttft_ms`, ...).
    pub fn json_key(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft_ms",
            Metric::Ttst => "ttst_ms",
            Metric::Itl => "itl_ms",
            Metric::Latency => "latency_ms",
            Metric::TokensPerSecondPerUser => "tokens_per_second_per_user",
            Metric::Isl => "isl_tokens",
            Metric::Osl => "osl_tokens",
            Metric::ScheduleLag => "schedule_lag_ms",
            Metric::Connect => "connect_ms",
            Metric::TlsHandshake => "tls_handshake_ms",
            Metric::ErrorLatency => "error_latency_ms",
        }
    }

    /// The goal-expression name (`llm.ttft-p95` uses `ttft`).
    pub fn goal_name(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Ttst => "ttst",
            Metric::Itl => "itl",
            Metric::Latency => "latency",
            Metric::TokensPerSecondPerUser => "tokens-per-second",
            Metric::Isl => "isl",
            Metric::Osl => "osl",
            Metric::ScheduleLag => "schedule-lag",
            Metric::Connect => "connect",
            Metric::TlsHandshake => "tls-handshake",
            Metric::ErrorLatency => "error-latency",
        }
    }

    /// A human label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Metric::Ttft => "Time to first token (ms)",
            Metric::Ttst => "Time to second token (ms)",
            Metric::Itl => "Inter-token latency (ms)",
            Metric::Latency => "Request latency (ms)",
            Metric::TokensPerSecondPerUser => "Output tokens/s per user",
            Metric::Isl => "Input sequence length (tokens)",
            Metric::Osl => "Output sequence length (tokens)",
            Metric::ScheduleLag => "Schedule lag (ms)",
            Metric::Connect => "Connection setup (ms)",
            Metric::TlsHandshake => "TLS handshake (ms)",
            Metric::ErrorLatency => "Time to failure (ms)",
        }
    }

    /// The unit of stored values.
    pub fn unit(self) -> Unit {
        match self {
            Metric::Ttft
            | Metric::Ttst
            | Metric::Itl
            | Metric::Latency
            | Metric::ScheduleLag
            | Metric::Connect
            | Metric::TlsHandshake
            | Metric::ErrorLatency => Unit::Milliseconds,
            Metric::Isl | Metric::Osl => Unit::Tokens,
            Metric::TokensPerSecondPerUser => Unit::TokensPerSecond,
        }
    }

    /// True when a larger value is better (token rates); false for latencies.
    pub fn larger_is_better(self) -> bool {
        matches!(self, Metric::TokensPerSecondPerUser)
    }

    /// Every metric: [`Metric::ALL`], [`Metric::CONNECTION`], then [`Metric::FAILURE`] (the
    /// order of [`RunMetrics`]'s histograms).
    pub fn every() -> impl Iterator<Item = Metric> {
        Metric::ALL
            .into_iter()
            .chain(Metric::CONNECTION)
            .chain(Metric::FAILURE)
    }

    /// Position in [`RunMetrics`]'s histograms (see [`Metric::every`]).
    fn index(self) -> usize {
        Metric::every()
            .position(|m| m == self)
            .expect("every metric is in ALL, CONNECTION or FAILURE")
    }
}

/// Summary statistics of one distribution, in display units.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    pub avg: f64,
    pub min: f64,
    pub max: f64,
    pub std: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub count: u64,
}

/// Request counters. `failed` is split by kind; every issued request lands in exactly one of
/// succeeded, failed (one kind) or ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    pub succeeded: u64,
    pub ended_early: u64,
    pub failed_status: u64,
    pub failed_error_frame: u64,
    pub failed_transport: u64,
    pub failed_timeout: u64,
    pub failed_empty: u64,
    /// Succeeded or ended-early streams whose output tokens came from the server's usage.
    pub usage_reported: u64,
    /// Succeeded or ended-early streams whose output tokens were estimated from frames.
    pub estimated: u64,
    /// Succeeded or ended-early streams without usage whose output tokens were counted by
    /// tokenizing their text (`--tokenizer`).
    #[serde(default)]
    pub tokenized: u64,
    /// Succeeded or ended-early streams without usage whose output tokens the server stated
    /// elsewhere in the stream (llama.cpp's `timings`).
    #[serde(default)]
    pub server_stated: u64,
    /// Succeeded or ended-early requests whose input tokens the server stated that way.
    #[serde(default)]
    pub input_server: u64,
    /// Succeeded or ended-early requests by where their input tokens came from: the usage
    /// report, the tokenizer (`--tokenizer`), the characters/4 estimate.
    #[serde(default)]
    pub input_usage: u64,
    #[serde(default)]
    pub input_tokenized: u64,
    #[serde(default)]
    pub input_estimated: u64,
    /// Requests the replay cancelled at the point the recording shows the production client
    /// abandoning them (apart from failures and ended-early streams).
    #[serde(default)]
    pub cancelled_as_recorded: u64,
    /// Requests cancelled by `--cancel-rate` (a what-if run).
    #[serde(default)]
    pub cancelled_by_rate: u64,
    /// Output tokens of succeeded requests (for output-token throughput).
    pub output_tokens: u64,
    /// Requests measured during warm-up and left out of every number.
    pub warmup: u64,
    /// Succeeded requests answered with one body rather than a stream (no TTFT, TTST, ITL).
    pub unstreamed: u64,
    /// Succeeded or ended-early requests whose usage reported cached input tokens.
    pub cache_reported: u64,
    /// Cached input tokens over those requests.
    pub cached_input_tokens: u64,
    /// Input tokens over those same requests (the denominator of the cached share).
    pub cache_reported_input_tokens: u64,
    /// `failed_transport` by cause (they sum to it; see [`TransportCause`]).
    #[serde(default)]
    pub transport: TransportCounters,
    /// Requests sent a second time on a fresh connection after their reused connection
    /// closed before any response byte (counted once, by the second attempt's outcome).
    #[serde(default)]
    pub resent: u64,
    /// Succeeded requests that asked for a pinned output length (`--pin-output-length`).
    #[serde(default)]
    pub pinned: u64,
    /// Those whose output tokens equal the pinned length.
    #[serde(default)]
    pub pinned_matched: u64,
    /// Of `pinned`, those whose pin was a recorded frame count (no usage, no tokenizer):
    /// compared with the replayed content frames, in the same unit.
    #[serde(default)]
    pub pinned_frames: u64,
    /// Succeeded streams long enough to tell whether they were delivered in one piece
    /// (at least [`COALESCED_MIN_FRAMES`](crate::measure::COALESCED_MIN_FRAMES) content frames).
    #[serde(default)]
    pub coalesce_checked: u64,
    /// Those whose content arrived all at once ([`RequestOutcome::coalesced`]): a buffering
    /// proxy or gateway on the path.
    #[serde(default)]
    pub coalesced: u64,
    /// Connections opened to the target, by protocol and TLS version.
    #[serde(default)]
    pub connections: ConnectionCounts,
    /// Measured requests that got a response head, by the protocol that carried them
    /// (HTTP/2 multiplexes many requests on one connection, so these differ from
    /// [`Counters::connections`]).
    #[serde(default)]
    pub requests_by_protocol: RequestProtocols,
    /// Succeeded requests that met every `--slo` (0 without SLOs): counted by the worker
    /// as each request completes ([`crate::slo::Slos::is_good`]), so the sum is exact.
    #[serde(default)]
    pub good: u64,
    /// Output tokens of those good requests (for goodput in tokens per second).
    #[serde(default)]
    pub good_output_tokens: u64,
}

pub use crate::measure::HttpProtocol;

/// The TLS version of a connection to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    /// Cleartext.
    None,
    Tls12,
    Tls13,
    /// TLS, version not known (a connection whose handshake the client did not see).
    Unknown,
}

impl TlsVersion {
    /// Report name: `none`, `TLSv1.2`, `TLSv1.3`, `TLS`.
    pub fn name(self) -> &'static str {
        match self {
            TlsVersion::None => "none",
            TlsVersion::Tls12 => "TLSv1.2",
            TlsVersion::Tls13 => "TLSv1.3",
            TlsVersion::Unknown => "TLS",
        }
    }
}

/// Connections opened to the target by (protocol, TLS version): every combination a client
/// can open, so the counts add exactly across workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ConnectionCounts {
    pub http1: u64,
    pub http1_tls12: u64,
    pub http1_tls13: u64,
    pub http1_tls: u64,
    pub h2_tls12: u64,
    pub h2_tls13: u64,
    pub h2_tls: u64,
    pub h2c: u64,
}

impl ConnectionCounts {
    /// Count one connection. HTTP/2 without TLS is `h2c`; `h2` over TLS and HTTP/1.1
    /// keep their TLS version.
    pub fn count(&mut self, protocol: HttpProtocol, tls: TlsVersion) {
        *self.slot(protocol, tls) += 1;
    }

    fn slot(&mut self, protocol: HttpProtocol, tls: TlsVersion) -> &mut u64 {
        match (protocol, tls) {
            (HttpProtocol::Http1, TlsVersion::None) => &mut self.http1,
            (HttpProtocol::Http1, TlsVersion::Tls12) => &mut self.http1_tls12,
            (HttpProtocol::Http1, TlsVersion::Tls13) => &mut self.http1_tls13,
            (HttpProtocol::Http1, TlsVersion::Unknown) => &mut self.http1_tls,
            (HttpProtocol::H2 | HttpProtocol::H2c, TlsVersion::None) => &mut self.h2c,
            (_, TlsVersion::Tls12) => &mut self.h2_tls12,
            (_, TlsVersion::Tls13) => &mut self.h2_tls13,
            (_, TlsVersion::Unknown) => &mut self.h2_tls,
        }
    }

    /// `(protocol, TLS version, count)` of every combination seen, in a fixed order.
    pub fn entries(&self) -> Vec<(HttpProtocol, TlsVersion, u64)> {
        use HttpProtocol::{H2, H2c, Http1};
        use TlsVersion::{None, Tls12, Tls13, Unknown};
        [
            (Http1, None, self.http1),
            (Http1, Tls12, self.http1_tls12),
            (Http1, Tls13, self.http1_tls13),
            (Http1, Unknown, self.http1_tls),
            (H2, Tls12, self.h2_tls12),
            (H2, Tls13, self.h2_tls13),
            (H2, Unknown, self.h2_tls),
            (H2c, None, self.h2c),
        ]
        .into_iter()
        .filter(|(_, _, n)| *n > 0)
        .collect()
    }

    /// Every connection counted.
    pub fn total(&self) -> u64 {
        self.entries()
            .iter()
            .fold(0u64, |sum, (_, _, n)| sum.saturating_add(*n))
    }

    fn add(&mut self, other: &ConnectionCounts) {
        for (protocol, tls, n) in other.entries() {
            let slot = self.slot(protocol, tls);
            *slot = slot.saturating_add(n);
        }
    }
}

/// Measured requests by the protocol of the response that answered them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RequestProtocols {
    pub http1: u64,
    pub h2: u64,
    pub h2c: u64,
}

impl RequestProtocols {
    /// Count one request answered over `protocol`.
    pub fn count(&mut self, protocol: HttpProtocol) {
        let slot = self.slot(protocol);
        *slot = slot.saturating_add(1);
    }

    fn slot(&mut self, protocol: HttpProtocol) -> &mut u64 {
        match protocol {
            HttpProtocol::Http1 => &mut self.http1,
            HttpProtocol::H2 => &mut self.h2,
            HttpProtocol::H2c => &mut self.h2c,
        }
    }

    /// The requests answered over `protocol`.
    pub fn of(&self, protocol: HttpProtocol) -> u64 {
        match protocol {
            HttpProtocol::Http1 => self.http1,
            HttpProtocol::H2 => self.h2,
            HttpProtocol::H2c => self.h2c,
        }
    }

    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.http1.saturating_add(self.h2).saturating_add(self.h2c)
    }

    fn add(&mut self, other: &RequestProtocols) {
        self.http1 = self.http1.saturating_add(other.http1);
        self.h2 = self.h2.saturating_add(other.h2);
        self.h2c = self.h2c.saturating_add(other.h2c);
    }
}

/// What happened to a slice's exchanges beyond the per-request outcomes (which `Counters`
/// holds): the worker's engine counts them, its reports carry them, the coordinator adds
/// them up per run and the report shows them, in this one type all the way.
///
/// The identity every slice holds: each exchange handed to a worker is answered (an outcome
/// in `Counters`, measured or warm-up), never started, or lost in flight —
/// [`SliceTotals::accounted`] is their sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SliceTotals {
    /// Requests sent (warm-up included).
    pub issued: u64,
    /// Exchanges received but never sent (duration reached, abort).
    pub not_started: u64,
    /// Requests in flight when the run was aborted: their outcome is unknown.
    pub lost: u64,
    /// Exchanges sent late because they arrived outside the reorder window.
    pub sent_out_of_order: u64,
}

impl SliceTotals {
    /// `self + other`, or `None` when a sum would wrap (a broken or hostile peer's counts).
    pub fn checked_add(&self, other: &SliceTotals) -> Option<SliceTotals> {
        Some(SliceTotals {
            issued: self.issued.checked_add(other.issued)?,
            not_started: self.not_started.checked_add(other.not_started)?,
            lost: self.lost.checked_add(other.lost)?,
            sent_out_of_order: self
                .sent_out_of_order
                .checked_add(other.sent_out_of_order)?,
        })
    }

    /// Add `other` in, saturating: the coordinator's sum over checked reports, each bounded
    /// far below `u64::MAX / workers`, so it never saturates in practice.
    pub fn add(&mut self, other: &SliceTotals) {
        self.issued = self.issued.saturating_add(other.issued);
        self.not_started = self.not_started.saturating_add(other.not_started);
        self.lost = self.lost.saturating_add(other.lost);
        self.sent_out_of_order = self
            .sent_out_of_order
            .saturating_add(other.sent_out_of_order);
    }

    /// Every exchange these totals and the slice's `counters` account for: answered
    /// (measured or warm-up), never started, lost in flight; `None` when the sum wraps.
    pub fn accounted(&self, counters: &Counters) -> Option<u64> {
        [
            counters.succeeded,
            counters.ended_early,
            counters.failed_status,
            counters.failed_error_frame,
            counters.failed_transport,
            counters.failed_timeout,
            counters.failed_empty,
            counters.cancelled_as_recorded,
            counters.cancelled_by_rate,
            counters.warmup,
            self.not_started,
            self.lost,
        ]
        .into_iter()
        .try_fold(0u64, u64::checked_add)
    }
}

/// Transport failures by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TransportCounters {
    pub refused: u64,
    pub reset: u64,
    pub closed_before_response: u64,
    pub tls: u64,
    pub dns: u64,
    pub other: u64,
    /// A `200` head came, then the connection or stream ended before any content.
    #[serde(default)]
    pub closed_after_head: u64,
    /// An HTTP/1.1 request was answered with HTTP/2 frames (`--target-h2c` is needed).
    #[serde(default)]
    pub http2_only: u64,
}

impl TransportCounters {
    /// Count one failure of `cause`.
    pub fn count(&mut self, cause: TransportCause) {
        match cause {
            TransportCause::Refused => self.refused += 1,
            TransportCause::Reset => self.reset += 1,
            TransportCause::ClosedBeforeResponse => self.closed_before_response += 1,
            TransportCause::Tls(_) => self.tls += 1,
            TransportCause::Dns => self.dns += 1,
            TransportCause::Other => self.other += 1,
            TransportCause::ClosedAfterHead => self.closed_after_head += 1,
            TransportCause::Http2Only => self.http2_only += 1,
        }
    }

    /// `(name, count)` for every cause, in [`TransportCause::NAMES`] order.
    pub fn by_name(&self) -> [(&'static str, u64); 8] {
        let n = TransportCause::NAMES;
        [
            (n[0], self.refused),
            (n[1], self.reset),
            (n[2], self.closed_before_response),
            (n[3], self.tls),
            (n[4], self.dns),
            (n[5], self.other),
            (n[6], self.closed_after_head),
            (n[7], self.http2_only),
        ]
    }

    /// Failures where no connection could be made at all (refused, DNS).
    pub fn no_connection(&self) -> u64 {
        self.refused + self.dns
    }

    fn add(&mut self, other: &TransportCounters) {
        self.refused = self.refused.saturating_add(other.refused);
        self.reset = self.reset.saturating_add(other.reset);
        self.closed_before_response = self
            .closed_before_response
            .saturating_add(other.closed_before_response);
        self.tls = self.tls.saturating_add(other.tls);
        self.dns = self.dns.saturating_add(other.dns);
        self.other = self.other.saturating_add(other.other);
        self.closed_after_head = self
            .closed_after_head
            .saturating_add(other.closed_after_head);
        self.http2_only = self.http2_only.saturating_add(other.http2_only);
    }
}

impl Counters {
    /// All failures, whatever their kind.
    pub fn failed(&self) -> u64 {
        self.failed_status
            + self.failed_error_frame
            + self.failed_transport
            + self.failed_timeout
            + self.failed_empty
    }

    /// Requests that got an outcome of any kind (succeeded + failed + ended early +
    /// cancelled).
    pub fn completed(&self) -> u64 {
        self.succeeded
            + self.failed()
            + self.ended_early
            + self.cancelled_as_recorded
            + self.cancelled_by_rate
    }

    fn add(&mut self, other: &Counters) {
        self.succeeded = self.succeeded.saturating_add(other.succeeded);
        self.ended_early = self.ended_early.saturating_add(other.ended_early);
        self.failed_status = self.failed_status.saturating_add(other.failed_status);
        self.failed_error_frame = self
            .failed_error_frame
            .saturating_add(other.failed_error_frame);
        self.failed_transport = self.failed_transport.saturating_add(other.failed_transport);
        self.failed_timeout = self.failed_timeout.saturating_add(other.failed_timeout);
        self.failed_empty = self.failed_empty.saturating_add(other.failed_empty);
        self.usage_reported = self.usage_reported.saturating_add(other.usage_reported);
        self.estimated = self.estimated.saturating_add(other.estimated);
        self.tokenized = self.tokenized.saturating_add(other.tokenized);
        self.server_stated = self.server_stated.saturating_add(other.server_stated);
        self.input_server = self.input_server.saturating_add(other.input_server);
        self.input_usage = self.input_usage.saturating_add(other.input_usage);
        self.input_tokenized = self.input_tokenized.saturating_add(other.input_tokenized);
        self.input_estimated = self.input_estimated.saturating_add(other.input_estimated);
        self.cancelled_as_recorded = self
            .cancelled_as_recorded
            .saturating_add(other.cancelled_as_recorded);
        self.cancelled_by_rate = self
            .cancelled_by_rate
            .saturating_add(other.cancelled_by_rate);
        self.pinned_frames = self.pinned_frames.saturating_add(other.pinned_frames);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.warmup = self.warmup.saturating_add(other.warmup);
        self.transport.add(&other.transport);
        self.resent = self.resent.saturating_add(other.resent);
        self.pinned = self.pinned.saturating_add(other.pinned);
        self.pinned_matched = self.pinned_matched.saturating_add(other.pinned_matched);
        self.unstreamed = self.unstreamed.saturating_add(other.unstreamed);
        self.cache_reported = self.cache_reported.saturating_add(other.cache_reported);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(other.cached_input_tokens);
        self.cache_reported_input_tokens = self
            .cache_reported_input_tokens
            .saturating_add(other.cache_reported_input_tokens);
        self.coalesce_checked = self.coalesce_checked.saturating_add(other.coalesce_checked);
        self.coalesced = self.coalesced.saturating_add(other.coalesced);
        self.connections.add(&other.connections);
        self.requests_by_protocol.add(&other.requests_by_protocol);
        self.good = self.good.saturating_add(other.good);
        self.good_output_tokens = self
            .good_output_tokens
            .saturating_add(other.good_output_tokens);
    }
}

/// Which exchange a measured request replayed, for its per-request record.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordMeta {
    /// Index of the exchange in the recording.
    pub index: u64,
    /// The exchange's recorded `id`, when it has one.
    pub id: Option<String>,
    pub session: Option<String>,
}

/// One measured request, as `--requests-out` writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub meta: RecordMeta,
    pub outcome: RequestOutcome,
    /// HTTP status of the response, when one came.
    pub status: Option<u16>,
    /// What the server said of a failed request (its error message, cleaned: one line,
    /// credential-shaped strings redacted, bounded; see `metrics::errors`).
    pub message: Option<String>,
    /// Whether it met every `--slo` (`None` without SLOs).
    pub good: Option<bool>,
}

impl RequestRecord {
    /// The outcome's stable name: `succeeded`, `ended_early`, or the failure kind.
    pub fn outcome_name(&self) -> &'static str {
        match self.outcome.kind {
            OutcomeKind::Succeeded => "succeeded",
            OutcomeKind::EndedEarly => "ended_early",
            OutcomeKind::Cancelled(CancelCause::AsRecorded) => "cancelled_as_recorded",
            OutcomeKind::Cancelled(CancelCause::ByRate) => "cancelled_by_rate",
            OutcomeKind::Failed(kind) => kind.name(),
        }
    }

    /// ITL of this request in µs, by the run's definition: (latency − TTFT) / (output − 1).
    pub fn itl_us(&self) -> Option<f64> {
        let o = &self.outcome;
        if o.kind != OutcomeKind::Succeeded {
            return None;
        }
        let osl = o.output_tokens();
        match (o.ttft_us, o.latency_us) {
            (Some(ttft), Some(latency)) if osl >= 2 => {
                Some(latency.saturating_sub(ttft) as f64 / (osl - 1) as f64)
            }
            _ => None,
        }
    }
}

/// The measured window (wall clock, microseconds since the Unix epoch): first request sent to
/// the last outcome of any kind (a success's last content frame, a failure, a timeout, an
/// early end), over measured (non-warm-up) requests: the whole run, failures included, so a
/// run whose target failed after a few seconds is not rated over those seconds alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start_unix_us: u64,
    pub end_unix_us: u64,
}

/// Error decoding serialized metrics.
#[derive(Debug, thiserror::Error)]
pub enum MetricsDecodeError {
    #[error("histogram for {metric} is corrupt")]
    Histogram {
        metric: &'static str,
        #[source]
        source: hdrhistogram::serialization::DeserializeError,
    },
    #[error("expected {expected} histograms, got {got}")]
    HistogramCount { expected: usize, got: usize },
    #[error("histogram for {metric} is invalid: {reason}")]
    Invalid {
        metric: &'static str,
        reason: &'static str,
    },
}

/// Largest encoded (compressed) histogram accepted from a peer.
pub const MAX_ENCODED_HISTOGRAM_BYTES: usize = 1 << 20;

/// Largest decoded V2 histogram accepted: a header and at most this many bytes of counts.
/// With 3 significant digits and values up to 2^53 a histogram has at most ~90,000 buckets,
/// each at most 9 bytes in V2's LEB128 counts.
pub const MAX_DECODED_HISTOGRAM_BYTES: usize = 40 + 90_000 * 9;

/// Highest trackable value accepted from a peer (2^53 µs is 285 years).
const MAX_HIGHEST_TRACKABLE: u64 = 1 << 53;

thread_local! {
    /// One zlib inflater per thread, reset for each histogram: a fresh one allocates and
    /// zeroes tens of kilobytes, which was most of the cost of decoding a worker's report on a
    /// coordinator with many workers.
    static INFLATER: std::cell::RefCell<flate2::Decompress> =
        std::cell::RefCell::new(flate2::Decompress::new(true));
}

/// Inflate one zlib stream, at most [`MAX_DECODED_HISTOGRAM_BYTES`] (never what the data
/// claims), with `inflater` reset first.
fn inflate_capped(
    inflater: &mut flate2::Decompress,
    input: &[u8],
) -> Result<Vec<u8>, &'static str> {
    inflater.reset(true);
    let mut out = Vec::with_capacity((input.len() * 8).clamp(256, MAX_DECODED_HISTOGRAM_BYTES + 1));
    loop {
        let consumed = inflater.total_in() as usize;
        let rest = input.get(consumed..).unwrap_or_default();
        let produced = out.len();
        let status = inflater
            .decompress_vec(rest, &mut out, flate2::FlushDecompress::Finish)
            .map_err(|_| "not valid DEFLATE data")?;
        if out.len() > MAX_DECODED_HISTOGRAM_BYTES {
            return Err("inflates past the size limit");
        }
        match status {
            flate2::Status::StreamEnd => return Ok(out),
            _ if out.len() == out.capacity() => {
                // Out of room: grow, never past the cap (plus one byte to see it exceeded).
                let room = out
                    .capacity()
                    .min(MAX_DECODED_HISTOGRAM_BYTES + 1 - out.len());
                out.reserve_exact(room.max(1));
            }
            _ if inflater.total_in() as usize == consumed && out.len() == produced => {
                return Err("not valid DEFLATE data");
            }
            _ => {}
        }
    }
}

/// Check one histogram from a peer, plain V2 or V2+DEFLATE, before the decoder trusts its
/// lengths: the compressed length, the inflated size (inflated with a cap, never by what
/// the header claims), the inner payload length, the precision and the value range. Returns
/// the plain V2 encoding (borrowed when it came plain).
fn validated_v2<'b>(
    bytes: &'b [u8],
    metric: &'static str,
) -> Result<std::borrow::Cow<'b, [u8]>, MetricsDecodeError> {
    const V2_COOKIE: u32 = 0x1c84_9303 | 0x10;
    const V2_COMPRESSED_COOKIE: u32 = 0x1c84_9304 | 0x10;
    let invalid = |reason| MetricsDecodeError::Invalid { metric, reason };
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let u64_at = |b: &[u8], at: usize| -> Option<u64> {
        Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    let inner = match u32_at(bytes, 0) {
        // Plain V2 (`HistogramEncoding::Plain`): no inflating, the same checks after.
        Some(V2_COOKIE) if bytes.len() <= MAX_DECODED_HISTOGRAM_BYTES => {
            std::borrow::Cow::Borrowed(bytes)
        }
        Some(V2_COOKIE) => return Err(invalid("over the size limit")),
        Some(V2_COMPRESSED_COOKIE) => {
            if bytes.len() > MAX_ENCODED_HISTOGRAM_BYTES {
                return Err(invalid("over the size limit"));
            }
            let compressed_len = u32_at(bytes, 4).ok_or(invalid("truncated header"))? as usize;
            if compressed_len != bytes.len() - 8 {
                return Err(invalid("compressed length does not match the bytes sent"));
            }
            std::borrow::Cow::Owned(
                INFLATER
                    .with(|inflater| inflate_capped(&mut inflater.borrow_mut(), &bytes[8..]))
                    .map_err(invalid)?,
            )
        }
        _ => return Err(invalid("not a V2 or V2+DEFLATE histogram")),
    };
    if u32_at(&inner, 0) != Some(V2_COOKIE) {
        return Err(invalid("inner cookie is not V2"));
    }
    let payload_len = u32_at(&inner, 4).ok_or(invalid("truncated header"))? as usize;
    if inner.len() < 40 || payload_len != inner.len() - 40 {
        return Err(invalid("payload length does not match the data"));
    }
    if u32_at(&inner, 12) != Some(u32::from(SIGNIFICANT_DIGITS)) {
        return Err(invalid("unexpected precision"));
    }
    let lowest = u64_at(&inner, 16).ok_or(invalid("truncated header"))?;
    let highest = u64_at(&inner, 24).ok_or(invalid("truncated header"))?;
    // `highest < 2 * lowest` without the overflow of a huge `lowest`.
    if lowest < 1 || highest / 2 < lowest || highest > MAX_HIGHEST_TRACKABLE {
        return Err(invalid("value range out of bounds"));
    }
    Ok(inner)
}

/// How histograms travel from a worker to the coordinator. Both are HDR V2 (the cookie
/// tells them apart, and every decoder here takes both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HistogramEncoding {
    /// V2+DEFLATE: smallest on the wire; what a coordinator that does not say otherwise
    /// gets (older ones only read this).
    #[default]
    Deflate,
    /// Plain V2 (its counts are already run-length and varint coded): no compressor on the
    /// worker, no inflater on the coordinator, whose CPU with many workers this was most of.
    Plain,
}

/// The metrics of a run (or of one worker's share of it): mergeable.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    histograms: Vec<Histogram<u64>>,
    pub counters: Counters,
    pub window: Option<Window>,
    /// What the failed requests were told, by kind, status and message (bounded).
    pub errors: ErrorSummary,
}

impl Default for RunMetrics {
    fn default() -> Self {
        RunMetrics::new()
    }
}

impl RunMetrics {
    /// Empty metrics.
    pub fn new() -> Self {
        let histograms = Metric::every()
            .map(|_| Histogram::new(SIGNIFICANT_DIGITS).expect("3 significant digits is valid"))
            .collect();
        RunMetrics {
            histograms,
            counters: Counters::default(),
            window: None,
            errors: ErrorSummary::default(),
        }
    }

    /// The histogram of `metric`.
    pub fn histogram(&self, metric: Metric) -> &Histogram<u64> {
        &self.histograms[metric.index()]
    }

    /// Record one raw value (in stored units) into `metric`.
    pub fn record_value(&mut self, metric: Metric, value: u64) {
        // Auto-resizing histograms cannot fail to record.
        let _ = self.histograms[metric.index()].record(value);
    }

    /// Record one new connection to the target: its setup (resolution and TCP connect) and,
    /// on https, its TLS handshake, in microseconds.
    pub fn record_connection(&mut self, connect_us: u64, tls_handshake_us: Option<u64>) {
        self.record_value(Metric::Connect, connect_us);
        if let Some(tls) = tls_handshake_us {
            self.record_value(Metric::TlsHandshake, tls);
        }
    }

    /// Count one new connection to the target by its protocol and TLS version.
    pub fn count_connection(&mut self, protocol: HttpProtocol, tls: TlsVersion) {
        self.counters.connections.count(protocol, tls);
    }

    /// Record the outcome of one measured request, following the rules of the metric
    /// definitions: failures enter no success distribution (their `latency_us`, the time to
    /// failure, goes to [`Metric::ErrorLatency`] only); ended-early streams count toward TTFT
    /// only; output tokens come from usage when reported, else from the content-frame count.
    /// Every outcome widens the measured window to its end.
    pub fn record(&mut self, outcome: &RequestOutcome) {
        if let Some(lag) = outcome.schedule_lag_us {
            self.record_value(Metric::ScheduleLag, lag);
        }
        if let Some(start) = outcome.sent_unix_us {
            self.extend_window(Window {
                start_unix_us: start,
                end_unix_us: start.saturating_add(outcome.latency_us.unwrap_or(0)),
            });
        }
        if outcome.resent {
            self.counters.resent += 1;
        }
        if let Some(protocol) = outcome.protocol {
            self.counters.requests_by_protocol.count(protocol);
        }
        match outcome.kind {
            OutcomeKind::Failed(kind) => {
                match kind {
                    FailureKind::Status => self.counters.failed_status += 1,
                    FailureKind::ErrorFrame => self.counters.failed_error_frame += 1,
                    FailureKind::Transport => {
                        self.counters.failed_transport += 1;
                        self.counters
                            .transport
                            .count(outcome.transport_cause.unwrap_or(TransportCause::Other));
                    }
                    FailureKind::Timeout => self.counters.failed_timeout += 1,
                    FailureKind::Empty => self.counters.failed_empty += 1,
                }
                if let Some(time_to_failure) = outcome.latency_us {
                    self.record_value(Metric::ErrorLatency, time_to_failure);
                }
                return;
            }
            OutcomeKind::EndedEarly => {
                self.counters.ended_early += 1;
                if let Some(ttft) = outcome.ttft_us {
                    self.record_value(Metric::Ttft, ttft);
                }
                self.count_token_source(outcome);
                return;
            }
            OutcomeKind::Cancelled(cause) => {
                // Cancelled on purpose: TTFT when the first token came before the cancel,
                // nothing else (no latency, ITL, token rate, OSL or token source).
                match cause {
                    CancelCause::AsRecorded => self.counters.cancelled_as_recorded += 1,
                    CancelCause::ByRate => self.counters.cancelled_by_rate += 1,
                }
                if let Some(ttft) = outcome.ttft_us {
                    self.record_value(Metric::Ttft, ttft);
                }
                return;
            }
            OutcomeKind::Succeeded => {}
        }
        self.counters.succeeded += 1;
        if outcome.unstreamed {
            self.counters.unstreamed += 1;
        } else if outcome.content_frames >= crate::measure::COALESCED_MIN_FRAMES {
            self.counters.coalesce_checked += 1;
            if outcome.coalesced {
                self.counters.coalesced += 1;
            }
        }
        self.count_token_source(outcome);
        if let Some(ttft) = outcome.ttft_us {
            self.record_value(Metric::Ttft, ttft);
        }
        if let Some(ttst) = outcome.ttst_us {
            self.record_value(Metric::Ttst, ttst);
        }
        if let Some(latency) = outcome.latency_us {
            self.record_value(Metric::Latency, latency);
        }
        let osl = outcome.output_tokens();
        self.record_value(Metric::Osl, osl);
        self.counters.output_tokens += osl;
        if let Some(isl) = outcome.input_tokens {
            self.record_value(Metric::Isl, isl);
        }
        if let (Some(ttft), Some(latency)) = (outcome.ttft_us, outcome.latency_us)
            && osl >= 2
        {
            let decode_us = latency.saturating_sub(ttft) as f64;
            let itl_us = decode_us / (osl - 1) as f64;
            self.record_value(Metric::Itl, itl_us.round() as u64);
            if itl_us > 0.0 {
                let milli_tokens_per_s = 1e9 / itl_us;
                self.record_value(
                    Metric::TokensPerSecondPerUser,
                    milli_tokens_per_s.round() as u64,
                );
            }
        }
    }

    /// Count one failure of `kind` (HTTP `status` when one came) in the error summary, with
    /// the message it carried (already cleaned: [`error_message`], [`clean_message`]).
    pub fn record_error(&mut self, kind: FailureKind, status: Option<u16>, message: Option<&str>) {
        self.errors.add(kind, status, message, 1);
    }

    /// Count a succeeded request that asked for `pinned` output tokens, and whether it got
    /// exactly that many (so a server that ignores the limit shows). `in_frames`: the pin is
    /// a recorded content-frame count (no usage, no tokenizer), so it is compared with the
    /// replayed content frames — the same unit — not with a token count.
    pub fn record_pinned(&mut self, outcome: &RequestOutcome, pinned: u64, in_frames: bool) {
        if outcome.kind != OutcomeKind::Succeeded {
            return;
        }
        self.counters.pinned += 1;
        let replayed = if in_frames {
            self.counters.pinned_frames += 1;
            outcome.content_frames
        } else {
            outcome.output_tokens()
        };
        if replayed == pinned {
            self.counters.pinned_matched += 1;
        }
    }

    /// Count a measured request the run's SLOs judged good ([`crate::slo::Slos::is_good`]).
    pub fn record_good(&mut self, outcome: &RequestOutcome) {
        self.counters.good += 1;
        self.counters.good_output_tokens += outcome.output_tokens();
    }

    /// Percent of pinned requests whose output length matched the pin; `None` without any.
    pub fn osl_match_share_pct(&self) -> Option<f64> {
        let c = &self.counters;
        (c.pinned > 0).then(|| 100.0 * c.pinned_matched as f64 / c.pinned as f64)
    }

    fn count_token_source(&mut self, outcome: &RequestOutcome) {
        match outcome.output_source() {
            TokenSource::Usage => self.counters.usage_reported += 1,
            TokenSource::Server => self.counters.server_stated += 1,
            TokenSource::Tokenizer => self.counters.tokenized += 1,
            TokenSource::Frames | TokenSource::Estimate => self.counters.estimated += 1,
        }
        match outcome.input_source {
            Some(TokenSource::Usage) => self.counters.input_usage += 1,
            Some(TokenSource::Server) => self.counters.input_server += 1,
            Some(TokenSource::Tokenizer) => self.counters.input_tokenized += 1,
            Some(TokenSource::Estimate | TokenSource::Frames) => self.counters.input_estimated += 1,
            None => {}
        }
        if let Some(cached) = outcome.cached_input_tokens {
            self.counters.cache_reported += 1;
            self.counters.cached_input_tokens += cached;
            self.counters.cache_reported_input_tokens +=
                outcome.input_tokens.unwrap_or(0).max(cached);
        }
    }

    fn extend_window(&mut self, window: Window) {
        self.window = Some(match self.window {
            None => window,
            Some(current) => Window {
                start_unix_us: current.start_unix_us.min(window.start_unix_us),
                end_unix_us: current.end_unix_us.max(window.end_unix_us),
            },
        });
    }

    /// Merge `other` into `self`: histograms add exactly, counters add, windows widen.
    pub fn merge(&mut self, other: &RunMetrics) {
        for (mine, theirs) in self.histograms.iter_mut().zip(&other.histograms) {
            mine.add(theirs)
                .expect("auto-resizing histograms of equal precision always add");
        }
        self.counters.add(&other.counters);
        if let Some(window) = other.window {
            self.extend_window(window);
        }
        self.errors.merge(&other.errors);
    }

    /// Summary statistics of `metric` in display units; `None` when it has no samples.
    pub fn stats(&self, metric: Metric) -> Option<Stats> {
        stats_of(self.histogram(metric), metric.unit().scale())
    }

    /// Length of the measured window (first request sent → last outcome of any kind) in
    /// seconds (0 when nothing was measured).
    pub fn window_seconds(&self) -> f64 {
        self.window
            .map(|w| w.end_unix_us.saturating_sub(w.start_unix_us) as f64 / 1e6)
            .unwrap_or(0.0)
    }

    /// Output tokens per second over the measured window.
    pub fn output_tokens_per_second(&self) -> f64 {
        let seconds = self.window_seconds();
        if seconds > 0.0 {
            self.counters.output_tokens as f64 / seconds
        } else {
            0.0
        }
    }

    /// Succeeded requests per second over the measured window.
    pub fn requests_per_second(&self) -> f64 {
        let seconds = self.window_seconds();
        if seconds > 0.0 {
            self.counters.succeeded as f64 / seconds
        } else {
            0.0
        }
    }

    /// Percent of streams whose output tokens were estimated rather than usage-reported.
    pub fn estimated_token_share_pct(&self) -> f64 {
        let total = self.counters.usage_reported
            + self.counters.server_stated
            + self.counters.tokenized
            + self.counters.estimated;
        if total == 0 {
            0.0
        } else {
            100.0 * self.counters.estimated as f64 / total as f64
        }
    }

    /// Percent of input tokens served from the prompt cache, over the requests whose usage
    /// reported it; `None` when no request did.
    pub fn cached_input_share_pct(&self) -> Option<f64> {
        let c = &self.counters;
        (c.cache_reported > 0 && c.cache_reported_input_tokens > 0)
            .then(|| 100.0 * c.cached_input_tokens as f64 / c.cache_reported_input_tokens as f64)
    }

    /// Serialize the per-request histograms as HDR V2+DEFLATE, in [`Metric::ALL`] order.
    pub fn encode_histograms(&self) -> Vec<Vec<u8>> {
        self.encode(&Metric::ALL, HistogramEncoding::Deflate)
    }

    /// Serialize the connection histograms as HDR V2+DEFLATE, in [`Metric::CONNECTION`]
    /// order.
    pub fn encode_connection_histograms(&self) -> Vec<Vec<u8>> {
        self.encode(&Metric::CONNECTION, HistogramEncoding::Deflate)
    }

    /// [`RunMetrics::encode_histograms`] and [`RunMetrics::encode_connection_histograms`]
    /// in `encoding`.
    pub fn encode_all(&self, encoding: HistogramEncoding) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        (
            self.encode(&Metric::ALL, encoding),
            self.encode(&Metric::CONNECTION, encoding),
        )
    }

    /// Serialize the failure histograms ([`Metric::FAILURE`] order) in `encoding`.
    pub fn encode_failure(&self, encoding: HistogramEncoding) -> Vec<Vec<u8>> {
        self.encode(&Metric::FAILURE, encoding)
    }

    /// Replace the failure histograms with [`RunMetrics::encode_failure`] output; `encoded`
    /// may be empty (a peer that does not send them: no samples).
    pub fn decode_failure(&mut self, encoded: &[Vec<u8>]) -> Result<(), MetricsDecodeError> {
        for (metric, histogram) in decode_group(&Metric::FAILURE, encoded)? {
            self.histograms[metric.index()] = histogram;
        }
        Ok(())
    }

    fn encode(&self, metrics: &[Metric], encoding: HistogramEncoding) -> Vec<Vec<u8>> {
        let mut deflate = V2DeflateSerializer::new();
        let mut plain = V2Serializer::new();
        metrics
            .iter()
            .map(|m| {
                let h = self.histogram(*m);
                let mut out = Vec::new();
                let written = match encoding {
                    HistogramEncoding::Deflate => deflate.serialize(h, &mut out).ok(),
                    HistogramEncoding::Plain => plain.serialize(h, &mut out).ok(),
                };
                written.expect("serializing into a Vec cannot fail");
                out
            })
            .collect()
    }

    /// Rebuild metrics from [`RunMetrics::encode_histograms`] output plus counters and window
    /// (no connection histograms: see [`RunMetrics::decode_with_connections`]).
    pub fn decode(
        encoded: &[Vec<u8>],
        counters: Counters,
        window: Option<Window>,
    ) -> Result<RunMetrics, MetricsDecodeError> {
        RunMetrics::decode_with_connections(encoded, &[], counters, window)
    }

    /// [`RunMetrics::decode`], plus [`RunMetrics::encode_connection_histograms`] output;
    /// `connections` may be empty (a peer that does not send them: no connection samples).
    pub fn decode_with_connections(
        encoded: &[Vec<u8>],
        connections: &[Vec<u8>],
        counters: Counters,
        window: Option<Window>,
    ) -> Result<RunMetrics, MetricsDecodeError> {
        if !connections.is_empty() && connections.len() != Metric::CONNECTION.len() {
            return Err(MetricsDecodeError::HistogramCount {
                expected: Metric::CONNECTION.len(),
                got: connections.len(),
            });
        }
        if encoded.len() != Metric::ALL.len() {
            return Err(MetricsDecodeError::HistogramCount {
                expected: Metric::ALL.len(),
                got: encoded.len(),
            });
        }
        let mut deserializer = Deserializer::new();
        let mut histograms = Vec::with_capacity(encoded.len());
        for (bytes, metric) in encoded.iter().zip(Metric::ALL) {
            let inner = validated_v2(bytes, metric.json_key())?;
            let mut h: Histogram<u64> =
                deserializer
                    .deserialize(&mut &inner[..])
                    .map_err(|source| MetricsDecodeError::Histogram {
                        metric: metric.json_key(),
                        source,
                    })?;
            h.auto(true);
            histograms.push(h);
        }
        for (i, metric) in Metric::CONNECTION.into_iter().enumerate() {
            let mut h: Histogram<u64> = match connections.get(i) {
                Some(bytes) => {
                    let inner = validated_v2(bytes, metric.json_key())?;
                    deserializer
                        .deserialize(&mut &inner[..])
                        .map_err(|source| MetricsDecodeError::Histogram {
                            metric: metric.json_key(),
                            source,
                        })?
                }
                None => Histogram::new(SIGNIFICANT_DIGITS).expect("3 significant digits is valid"),
            };
            h.auto(true);
            histograms.push(h);
        }
        for _ in Metric::FAILURE {
            histograms
                .push(Histogram::new(SIGNIFICANT_DIGITS).expect("3 significant digits is valid"));
        }
        Ok(RunMetrics {
            histograms,
            counters,
            window,
            errors: ErrorSummary::default(),
        })
    }
}

/// Decode the histograms of `group` from a peer: all of them or none (an older peer).
fn decode_group(
    group: &[Metric],
    encoded: &[Vec<u8>],
) -> Result<Vec<(Metric, Histogram<u64>)>, MetricsDecodeError> {
    if encoded.is_empty() {
        return Ok(Vec::new());
    }
    if encoded.len() != group.len() {
        return Err(MetricsDecodeError::HistogramCount {
            expected: group.len(),
            got: encoded.len(),
        });
    }
    let mut deserializer = Deserializer::new();
    group
        .iter()
        .zip(encoded)
        .map(|(metric, bytes)| {
            let inner = validated_v2(bytes, metric.json_key())?;
            let mut h: Histogram<u64> =
                deserializer
                    .deserialize(&mut &inner[..])
                    .map_err(|source| MetricsDecodeError::Histogram {
                        metric: metric.json_key(),
                        source,
                    })?;
            h.auto(true);
            Ok((*metric, h))
        })
        .collect()
}

/// Summary statistics of a histogram, each value divided by `scale`.
pub fn stats_of(h: &Histogram<u64>, scale: f64) -> Option<Stats> {
    if h.is_empty() {
        return None;
    }
    Some(Stats {
        avg: h.mean() / scale,
        min: h.min() as f64 / scale,
        max: h.max() as f64 / scale,
        std: h.stdev() / scale,
        p50: h.value_at_quantile(0.50) as f64 / scale,
        p90: h.value_at_quantile(0.90) as f64 / scale,
        p95: h.value_at_quantile(0.95) as f64 / scale,
        p99: h.value_at_quantile(0.99) as f64 / scale,
        count: h.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*), so the property test needs no crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    /// Property: for any sample set and any split of it into parts, merging the parts'
    /// metrics equals the metrics of the whole set — every histogram bucket, every counter,
    /// the window — and survives the V2+DEFLATE wire encoding.
    #[test]
    fn merging_any_split_equals_the_whole() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..200 {
            let samples = 1 + (rng.next() % 400) as usize;
            let parts = 1 + (rng.next() % 8) as usize;
            let mut whole = RunMetrics::new();
            let mut split: Vec<RunMetrics> = (0..parts).map(|_| RunMetrics::new()).collect();
            for _ in 0..samples {
                // Values spanning µs to minutes, to exercise many HDR buckets.
                let magnitude = rng.next() % 9;
                let value = 1 + rng.next() % 10u64.pow(magnitude as u32 + 1);
                let kind = match rng.next() % 10 {
                    0 => OutcomeKind::Failed(FailureKind::Status),
                    1 => OutcomeKind::EndedEarly,
                    _ => OutcomeKind::Succeeded,
                };
                let outcome = RequestOutcome {
                    kind,
                    ttft_us: Some(value),
                    ttst_us: Some(value / 3),
                    latency_us: Some(value * 4),
                    content_frames: 1 + rng.next() % 300,
                    usage_output_tokens: rng.next().is_multiple_of(2).then(|| 1 + rng.next() % 500),
                    server_output_tokens: None,
                    tokenized_output_tokens: None,
                    input_source: None,
                    input_tokens: Some(rng.next() % 5000),
                    schedule_lag_us: Some(rng.next() % 20_000),
                    sent_unix_us: Some(1_700_000_000_000_000 + rng.next() % 10_000_000),
                    transport_cause: None,
                    resent: false,
                    unstreamed: rng.next().is_multiple_of(5),
                    cached_input_tokens: rng.next().is_multiple_of(3).then(|| rng.next() % 100),
                    coalesced: false,
                    protocol: None,
                };
                whole.record(&outcome);
                split[(rng.next() % parts as u64) as usize].record(&outcome);
            }
            let mut merged = RunMetrics::new();
            for part in &split {
                // Through the wire encoding, as workers send them.
                let mut decoded =
                    RunMetrics::decode(&part.encode_histograms(), part.counters, part.window)
                        .expect("decodes");
                decoded
                    .decode_failure(&part.encode_failure(HistogramEncoding::Deflate))
                    .expect("decodes");
                merged.merge(&decoded);
            }
            assert_eq!(merged.counters, whole.counters, "case {case}");
            assert_eq!(merged.window, whole.window, "case {case}");
            for metric in Metric::ALL.into_iter().chain(Metric::FAILURE) {
                let (a, b) = (merged.histogram(metric), whole.histogram(metric));
                assert_eq!(a.len(), b.len(), "case {case} {metric:?}");
                let buckets_a: Vec<(u64, u64)> = a
                    .iter_recorded()
                    .map(|v| (v.value_iterated_to(), v.count_at_value()))
                    .collect();
                let buckets_b: Vec<(u64, u64)> = b
                    .iter_recorded()
                    .map(|v| (v.value_iterated_to(), v.count_at_value()))
                    .collect();
                assert_eq!(buckets_a, buckets_b, "case {case} {metric:?}");
                assert_eq!(
                    merged.stats(metric),
                    whole.stats(metric),
                    "case {case} {metric:?}"
                );
            }
        }
    }

    /// A ~60-byte V2+DEFLATE histogram whose inner header claims a 2 GB payload: refused
    /// before anything is allocated for it.
    #[test]
    fn a_histogram_claiming_a_huge_payload_is_refused() {
        use std::io::Write;
        let mut inner = Vec::new();
        inner.extend_from_slice(&(0x1c84_9303u32 | 0x10).to_be_bytes());
        inner.extend_from_slice(&0x7fff_fff0u32.to_be_bytes()); // payload_len: 2 GB
        inner.extend_from_slice(&0u32.to_be_bytes());
        inner.extend_from_slice(&3u32.to_be_bytes());
        inner.extend_from_slice(&1u64.to_be_bytes());
        inner.extend_from_slice(&(1u64 << 40).to_be_bytes());
        inner.extend_from_slice(&1f64.to_bits().to_be_bytes());
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        zlib.write_all(&inner).expect("compress");
        let compressed = zlib.finish().expect("compress");
        let mut bomb = Vec::new();
        bomb.extend_from_slice(&(0x1c84_9304u32 | 0x10).to_be_bytes());
        bomb.extend_from_slice(&(compressed.len() as u32).to_be_bytes());
        bomb.extend_from_slice(&compressed);
        assert!(bomb.len() < 100, "{}", bomb.len());
        let good = RunMetrics::new().encode_histograms();
        let mut encoded = good.clone();
        encoded[0] = bomb;
        let error = RunMetrics::decode(&encoded, Counters::default(), None).expect_err("refused");
        assert!(error.to_string().contains("payload length"), "{error}");
        // Valid ones still decode, and a truncated one is refused.
        RunMetrics::decode(&good, Counters::default(), None).expect("valid");
        let mut cut = good.clone();
        let keep = cut[2].len() - 3;
        cut[2].truncate(keep);
        assert!(RunMetrics::decode(&cut, Counters::default(), None).is_err());
        // The same claim in plain V2 (no DEFLATE) is refused the same way, and so is a
        // plain one cut short or past the size cap.
        let (mut plain, _) = RunMetrics::new().encode_all(HistogramEncoding::Plain);
        plain[0] = inner;
        let error = RunMetrics::decode(&plain, Counters::default(), None).expect_err("refused");
        assert!(error.to_string().contains("payload length"), "{error}");
        let (mut plain, _) = RunMetrics::new().encode_all(HistogramEncoding::Plain);
        RunMetrics::decode(&plain, Counters::default(), None).expect("valid");
        let keep = plain[2].len() - 1;
        plain[2].truncate(keep);
        assert!(RunMetrics::decode(&plain, Counters::default(), None).is_err());
        let (mut plain, _) = RunMetrics::new().encode_all(HistogramEncoding::Plain);
        plain[1].resize(MAX_DECODED_HISTOGRAM_BYTES + 1, 0);
        let error = RunMetrics::decode(&plain, Counters::default(), None).expect_err("refused");
        assert!(error.to_string().contains("size limit"), "{error}");
    }

    #[test]
    fn failures_enter_no_distribution_and_ended_early_only_ttft() {
        let mut m = RunMetrics::new();
        let mut failed = RequestOutcome::failed(FailureKind::Transport);
        failed.ttft_us = Some(5);
        m.record(&failed);
        let mut early = RequestOutcome::failed(FailureKind::Status);
        early.kind = OutcomeKind::EndedEarly;
        early.ttft_us = Some(7_000);
        early.latency_us = Some(9_000);
        early.content_frames = 3;
        m.record(&early);
        assert_eq!(m.histogram(Metric::Ttft).len(), 1);
        assert_eq!(m.histogram(Metric::Latency).len(), 0);
        assert_eq!(m.histogram(Metric::Itl).len(), 0);
        assert_eq!(m.counters.failed(), 1);
        assert_eq!(m.counters.ended_early, 1);
    }

    /// The whole-run window runs from the first request sent to the last outcome of any
    /// kind: 20 requests that succeed in the first 2 s and 80 that fail until 80 s rate the
    /// run's tokens over 80 s, not 2 s. Failures' times to failure are their own distribution
    /// and leave the success distributions as they were.
    #[test]
    fn the_window_runs_to_the_last_outcome_and_failures_are_timed_apart() {
        let start = 1_700_000_000_000_000u64;
        let success = |i: u64| RequestOutcome {
            kind: OutcomeKind::Succeeded,
            ttft_us: Some(100_000),
            ttst_us: Some(10_000),
            latency_us: Some(1_000_000),
            content_frames: 50,
            usage_output_tokens: Some(50),
            server_output_tokens: None,
            tokenized_output_tokens: None,
            input_source: None,
            input_tokens: Some(10),
            schedule_lag_us: None,
            sent_unix_us: Some(start + i * 50_000),
            transport_cause: None,
            resent: false,
            unstreamed: false,
            cached_input_tokens: None,
            coalesced: false,
            protocol: None,
        };
        let mut only_successes = RunMetrics::new();
        let mut m = RunMetrics::new();
        for i in 0..20 {
            only_successes.record(&success(i));
            m.record(&success(i));
        }
        for i in 0..80u64 {
            let mut failed = RequestOutcome::failed(FailureKind::Status);
            failed.sent_unix_us = Some(start + 2_000_000 + i * 980_000);
            failed.latency_us = Some(1_000_000);
            m.record(&failed);
            m.record_error(FailureKind::Status, Some(500), Some("upstream died"));
        }
        // Last failure: sent at 2 + 79 × 0.98 s, failed 1 s later.
        assert!(
            (m.window_seconds() - 80.42).abs() < 1e-9,
            "{}",
            m.window_seconds()
        );
        assert!((m.output_tokens_per_second() - 1000.0 / 80.42).abs() < 1e-9);
        assert!((only_successes.window_seconds() - 1.95).abs() < 1e-9);
        let ttf = m.stats(Metric::ErrorLatency).expect("times to failure");
        assert_eq!(ttf.count, 80);
        assert!((ttf.p50 - 1000.0).abs() < 1.0, "{ttf:?}");
        for metric in Metric::ALL {
            assert_eq!(m.stats(metric), only_successes.stats(metric), "{metric:?}");
        }
        let errors = m.errors.samples();
        assert_eq!(errors.len(), 1);
        assert_eq!(
            (
                errors[0].status,
                errors[0].message.as_deref(),
                errors[0].count
            ),
            (Some(500), Some("upstream died"), 80)
        );
    }

    #[test]
    fn itl_and_rate_follow_the_definition() {
        let mut m = RunMetrics::new();
        let outcome = RequestOutcome {
            kind: OutcomeKind::Succeeded,
            ttft_us: Some(200_000),
            ttst_us: Some(10_000),
            latency_us: Some(1_190_000),
            content_frames: 100,
            usage_output_tokens: Some(100),
            server_output_tokens: None,
            tokenized_output_tokens: None,
            input_source: None,
            input_tokens: Some(10),
            schedule_lag_us: None,
            sent_unix_us: Some(1_000_000),
            transport_cause: None,
            resent: false,
            unstreamed: false,
            cached_input_tokens: None,
            coalesced: false,
            protocol: None,
        };
        m.record(&outcome);
        let itl = m.stats(Metric::Itl).expect("itl");
        assert!((itl.p50 - 10.0).abs() < 0.01, "{itl:?}");
        let tps = m.stats(Metric::TokensPerSecondPerUser).expect("tps");
        assert!((tps.p50 - 100.0).abs() < 0.1, "{tps:?}");
        assert_eq!(m.counters.output_tokens, 100);
        assert!((m.window_seconds() - 1.19).abs() < 1e-9);
    }
}
