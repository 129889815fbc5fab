//! The run report: its JSON model (`llm-replay.report/v1`), how it is built from merged
//! [`RunMetrics`], the baseline comparison, and its renderers (terminal, Markdown, HTML, JUnit).
//!
//! Only the coordinator renders reports; every renderer returns a `String` and the CLI decides
//! where it goes. The JSON model is also read back (`llm-replay report FILE`), so every type
//! here is `Serialize + Deserialize` and every extra key beyond the contract is optional on read.

use std::collections::BTreeMap;

use common::metrics::{Counters, HttpProtocol, Metric, RunMetrics, Stats, TransportCounters, Unit};
use common::slo::Slos;
use serde::{Deserialize, Serialize};

use crate::goals::{self, Goal, GoalResult, GoalValues, Stat};
use crate::server_metrics::ServerSection;

mod errors;
mod escape;
mod format;
mod goal_values;
mod html;
mod junit;
mod markdown;
mod server_side;
pub mod significance;
mod svg;
mod terminal;
mod transients;
mod windows;

pub use html::render_html;
pub use junit::render_junit;
pub use markdown::render_markdown;
pub use terminal::render_terminal;

/// The value of the report's `schema` key.
pub const REPORT_SCHEMA: &str = "llm-replay.report/v1";

/// A change at least this large (in percent) in the wrong direction is highlighted.
pub const HIGHLIGHT_THRESHOLD_PCT: f64 = 10.0;

/// Tolerance of the highlight rule against floating-point rounding (far below any shown digit).
const HIGHLIGHT_EPSILON_PCT: f64 = 1e-9;

/// The metrics compared against the baseline, in report order. Schedule lag is left out: a
/// recording has no schedule to lag behind.
pub const COMPARED_METRICS: [Metric; 7] = [
    Metric::Ttft,
    Metric::Ttst,
    Metric::Itl,
    Metric::Latency,
    Metric::TokensPerSecondPerUser,
    Metric::Isl,
    Metric::Osl,
];

/// The whole run report, as written by `--report-json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`REPORT_SCHEMA`].
    pub schema: String,
    /// What ran, where, and how.
    pub run: RunInfo,
    /// Request counters; `total` = succeeded + failed + ended_early + lost + not_started.
    pub requests: RequestsSection,
    /// The merged distributions and throughputs.
    pub llm: LlmSection,
    /// The baseline and the changes against it; `null` with `--baseline none`.
    pub baseline: Option<BaselineSection>,
    /// Goal outcomes, in the order the goals were given.
    #[serde(default)]
    pub goals: Vec<GoalResult>,
    /// One entry per concurrency level with `--sweep-concurrency`; absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweep: Vec<SweepSection>,
    /// Things the user should know to read the numbers right.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// How faithfully the recording's users were replayed: pinned lengths, session mode and
    /// think times, sampling (filled in by the `faithful` module).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faithful: Option<FaithfulSection>,
    /// The run over time, one point per interval (about a second); every level of a sweep
    /// on one time axis. Empty in reports saved before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelinePoint>,
    /// What carried the run: connections by protocol and TLS version, and the streams that
    /// arrived in one piece. Absent in reports saved before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportSection>,
    /// Requests that succeeded within every `--slo`; absent without SLOs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<GoodputSection>,
    /// `--find-max`: every probe of the capacity search and its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacitySection>,
    /// What the server's own `/metrics` said during the run (queue depth, KV cache, its
    /// TTFT...); absent with `--no-server-metrics`, without a target, and in reports saved
    /// before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerSection>,
}

/// The `goodput` section: requests that succeeded within every `--slo`. `good` is the exact
/// sum of the workers' counts (each judged its own requests as they completed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoodputSection {
    /// The objectives, as `--slo` reads them (`ttft:500ms`).
    pub slos: Vec<String>,
    /// Requests that succeeded and met every objective.
    pub good: u64,
    /// `good` ÷ requests that got an outcome (succeeded + failed + ended early) × 100;
    /// `null` when none did.
    pub good_share_pct: Option<f64>,
    /// Good requests per second over the measured window.
    pub requests_per_second: f64,
    /// Output tokens of good requests per second over the measured window.
    pub output_tokens_per_second: f64,
}

impl GoodputSection {
    /// The goodput of merged metrics under `slos`; `None` without SLOs. The share is of the
    /// requests that got an outcome (succeeded + failed + ended early), the rates over the
    /// measured window (the one `llm.requests_per_second` uses; 0 when nothing was measured).
    pub fn from_metrics(slos: &Slos, metrics: &RunMetrics) -> Option<GoodputSection> {
        if slos.is_empty() {
            return None;
        }
        let counters = &metrics.counters;
        let answered = counters.completed();
        let seconds = metrics.window_seconds();
        let per_second = |count: u64| {
            if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            }
        };
        Some(GoodputSection {
            slos: slos.names(),
            good: counters.good,
            good_share_pct: (answered > 0).then(|| 100.0 * counters.good as f64 / answered as f64),
            requests_per_second: per_second(counters.good),
            output_tokens_per_second: per_second(counters.good_output_tokens),
        })
    }
}

/// What `--find-max` varies: `capacity.dimension` in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dimension {
    /// Closed-loop concurrency (in-flight requests across every worker).
    Concurrency,
    /// Open-loop arrival rate, requests per second across every worker.
    Rate,
    /// The recording's own schedule, compressed ×S.
    Speed,
}

impl Dimension {
    /// The name `--find-max` takes and the report shows.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Concurrency => "concurrency",
            Dimension::Rate => "rate",
            Dimension::Speed => "speed",
        }
    }
}

/// The `capacity` section: the probes of `--find-max` in the order they ran, and the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacitySection {
    /// `concurrency`, `rate` (requests/s) or `speed` (× the recorded schedule).
    pub dimension: Dimension,
    /// The largest load at which every goal held; `null` when even the lowest failed.
    pub max: Option<f64>,
    /// The smallest load at which a goal failed; `null` when the range's top held.
    pub min_failing: Option<f64>,
    /// `--find-max-precision`, percent.
    pub precision_pct: f64,
    /// `--find-max-range` LOW.
    pub low: f64,
    /// `--find-max-range` HIGH.
    pub high: f64,
    /// How the search stopped, in words (precision reached, the range's top held, ...).
    pub stopped: String,
    /// Every probe, in the order it ran (a confirmation is a probe of its own).
    pub probes: Vec<ProbeSection>,
    /// The first load probed (LOW, ×1 for speed, or `--concurrency` for a concurrency
    /// search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<f64>,
    /// Seconds the whole search took, every probe and the pauses between them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// The server's metrics were scraped every this many seconds: gauges (queue depth,
    /// running requests) are samples, and a peak between two scrapes is not seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_interval_s: Option<f64>,
    /// Which tier's queue moved at the knee (a gateway's, or the model server's), when the
    /// probes on both sides were scraped: `server_metrics::gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_tier: Option<LimitTier>,
}

/// The tier that set a search's limit, and the figures that say so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitTier {
    /// `gateway`, `model server`, or `gateway and model server`.
    pub tier: String,
    /// The finding in words, with each tier's figures below and above the knee.
    pub text: String,
}

/// One probe of the capacity search: a full replay at one load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeSection {
    /// The load: concurrency, requests/s or speed.
    pub value: f64,
    /// Whether every goal held at this load (for a repeated load, this run's own result;
    /// `decided` says what the search concluded).
    pub passed: bool,
    /// The goals that failed (their expressions).
    pub failed_goals: Vec<String>,
    /// Every goal with its value at this probe, as the report's `goals`.
    pub goals: Vec<GoalResult>,
    /// `steady window` (requests sent once the load reached its target, the closed loop's
    /// first wave left out) or `whole run`: what the goals were judged on.
    pub judged_on: String,
    /// The probe's numbers, over what the goals were judged on.
    pub llm: LlmSection,
    /// The probe's request counters, over what the goals were judged on.
    pub requests: RequestsSection,
    /// The probe's goodput, with `--slo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<GoodputSection>,
    /// The server's metrics over this probe, when they were scraped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerSection>,
    /// Seconds the probe ran.
    pub duration_s: f64,
    /// A value near a goal's limit is run again: the 1-based index of this run at its load.
    pub attempt: u32,
    /// What the search concluded for this load once its runs were in (majority of up to 3
    /// runs when the first was near a limit); `null` while undecided.
    pub decided: Option<bool>,
    /// On the run that decided its load: how many runs the decision counted (a failure
    /// under a client stall counts for nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
    /// Why this run repeats a load already run (near a goal's limit, a client stall,
    /// confirming the failure the answer rests on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<String>,
    /// The probe did not complete (`interrupted`, a worker lost, nothing measured): it is
    /// neither passed nor failed, and decides nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// The workers flagged their own sending as stalled or saturated during this run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_stall: bool,
    /// What else the verdict rests on: a cap that bounded the offered load, a stall, a
    /// percentile judged on few requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The verdict rests on fewer requests than its goal's percentile needs (two beyond
    /// it: `capacity::budget`); absent when it had enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub few_requests: Option<FewRequests>,
}

/// A probe judged on fewer requests than its goal's percentile needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FewRequests {
    /// The goal whose percentile sets the need (`llm.ttft-p95 > 60`).
    pub goal: String,
    /// Samples of the goal's distribution the verdict was judged on.
    pub judged: u64,
    /// Samples the percentile needs.
    pub needed: u64,
}

/// The `transport` section: how the workers reached the target. A buffering proxy and the
/// protocol decide the numbers (nginx buffers SSE for HTTP/1.1 clients and not for HTTP/2
/// ones under the same configuration), so the report says which it was.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TransportSection {
    /// Connections the workers opened to the target, by protocol (`http/1.1`, `h2` by ALPN,
    /// `h2c`) and TLS version (`TLSv1.2`, `TLSv1.3`, `none`).
    #[serde(default)]
    pub connections: Vec<ConnectionEntry>,
    /// Measured requests that got a response head, by the protocol that carried them
    /// (`http/1.1`, `h2`, `h2c`): HTTP/2 carries many requests on one connection, so these
    /// are counted apart from `connections`.
    #[serde(default)]
    pub requests: Vec<ProtocolRequests>,
    /// Succeeded streams long enough to judge (at least 4 content frames).
    #[serde(default)]
    pub streams_checked: u64,
    /// Those whose content arrived all at once (within one read, or 1 ms): held and
    /// delivered in one piece by something on the path, typically a buffering proxy.
    #[serde(default)]
    pub coalesced_streams: u64,
    /// `coalesced_streams` of `streams_checked`, percent; `null` when none was checked.
    #[serde(default)]
    pub coalesced_share_pct: Option<f64>,
}

/// One line of `transport.connections`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionEntry {
    /// `http/1.1`, `h2` (HTTP/2 by ALPN over TLS) or `h2c` (cleartext, prior knowledge).
    pub protocol: String,
    /// `TLSv1.2`, `TLSv1.3`, `TLS` (version not seen) or `none` (cleartext).
    pub tls: String,
    /// Connections opened (pre-opened ones included).
    pub count: u64,
}

/// One line of `transport.requests`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolRequests {
    /// `http/1.1`, `h2` or `h2c`.
    pub protocol: String,
    /// Measured requests answered over it.
    pub count: u64,
}

/// A coalesced share (percent of checked streams) at or above this on either side marks
/// the baseline changes of TTFT, ITL, TTST and the per-user token rate (`Change::coalesced`)
/// and warns: those numbers then measure the proxy's delivery, not the model.
pub const COALESCED_WARN_SHARE_PCT: f64 = 10.0;

impl TransportSection {
    /// The section of merged counters; `None` when nothing was counted (a baseline, an
    /// older worker).
    pub fn from_counters(counters: &Counters) -> Option<TransportSection> {
        let connections: Vec<ConnectionEntry> = counters
            .connections
            .entries()
            .into_iter()
            .map(|(protocol, tls, count)| ConnectionEntry {
                protocol: protocol.name().to_string(),
                tls: tls.name().to_string(),
                count,
            })
            .collect();
        let requests: Vec<ProtocolRequests> =
            [HttpProtocol::Http1, HttpProtocol::H2, HttpProtocol::H2c]
                .into_iter()
                .filter_map(|protocol| {
                    let count = counters.requests_by_protocol.of(protocol);
                    (count > 0).then(|| ProtocolRequests {
                        protocol: protocol.name().to_string(),
                        count,
                    })
                })
                .collect();
        if connections.is_empty() && requests.is_empty() && counters.coalesce_checked == 0 {
            return None;
        }
        Some(TransportSection {
            connections,
            requests,
            streams_checked: counters.coalesce_checked,
            coalesced_streams: counters.coalesced,
            coalesced_share_pct: coalesced_share_pct(counters.coalesced, counters.coalesce_checked),
        })
    }
}

fn coalesced_share_pct(coalesced: u64, checked: u64) -> Option<f64> {
    (checked > 0).then(|| 100.0 * coalesced as f64 / checked as f64)
}

/// Mark the changes of the metrics coalescing distorts (TTFT: the first token waits for the
/// first buffer; ITL, TTST, per-user token rate) when either side's coalesced share reaches
/// [`COALESCED_WARN_SHARE_PCT`].
fn mark_coalesced(changes: &mut BTreeMap<String, Change>, shares: [Option<f64>; 2]) {
    if !shares
        .iter()
        .flatten()
        .any(|share| *share >= COALESCED_WARN_SHARE_PCT)
    {
        return;
    }
    let distorted = [
        Metric::Ttft,
        Metric::Itl,
        Metric::Ttst,
        Metric::TokensPerSecondPerUser,
    ]
    .map(|metric| format!("{}.", metric.json_key()));
    for (key, change) in changes.iter_mut() {
        if distorted.iter().any(|prefix| key.starts_with(prefix)) {
            change.coalesced = true;
        }
    }
}

/// One interval of the run's time series (`timeline`). Percentiles are of the requests that
/// finished in this interval alone; `null` when none did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// End of the interval, seconds since the load started (the first level's start when
    /// sweeping).
    pub t_s: f64,
    /// Length of the interval, seconds.
    pub dt_s: f64,
    /// The sweep level this interval belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// TTFT p50 of the interval, ms.
    pub ttft_p50_ms: Option<f64>,
    /// TTFT p95 of the interval, ms.
    pub ttft_p95_ms: Option<f64>,
    /// ITL p50 of the interval, ms.
    pub itl_p50_ms: Option<f64>,
    /// ITL p95 of the interval, ms.
    pub itl_p95_ms: Option<f64>,
    /// Output tokens of the requests that succeeded in the interval, per second.
    pub output_tokens_per_s: f64,
    /// Requests that succeeded in the interval, per second.
    pub requests_per_s: f64,
    /// Requests that succeeded in the interval.
    pub succeeded: u64,
    /// Their output tokens.
    pub output_tokens: u64,
    /// Requests that failed in the interval.
    pub errors: u64,
    /// Requests sent and not yet answered at the end of the interval.
    pub in_flight: u64,
    /// A worker sent exchanges handed over from a lost worker in this interval: its numbers
    /// carry the lost worker's load too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hand_over: bool,
}

/// `run.load`: the load a run (or one level of it) was sent at, as configured. Every key is
/// written; on read, a missing one takes its default (an empty object reads as an
/// unconfigured load).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadSection {
    /// `recorded` (the recording's own arrival offsets) or `asap`.
    pub schedule: ScheduleKind,
    /// The recorded schedule's time scale (2 = twice as fast); 1 on `asap`.
    pub speed: f64,
    /// The closed loop's concurrency, or the cap on requests in flight of a schedule or a
    /// rate; `null` without one.
    pub concurrency: Option<usize>,
    /// The open loop's requests per second, across all workers.
    pub rate: Option<f64>,
    /// The open loop's inter-arrival distribution (with `rate` only).
    pub arrival: Option<ArrivalKind>,
    /// `--requests`: the run stops after this many exchanges.
    pub requests: Option<u64>,
    /// `--duration`, seconds.
    pub duration_s: Option<f64>,
    /// Leading requests measured as warm-up.
    pub warmup: u64,
    /// Workers that were given a share of the load (0 when not recorded).
    pub workers: usize,
}

/// `run.load.schedule`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    /// At the recorded arrival offsets, scaled by `speed`.
    Recorded,
    /// As soon as the concurrency or the rate allows.
    #[default]
    Asap,
}

/// `run.load.arrival`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrivalKind {
    Constant,
    Poisson,
}

impl ArrivalKind {
    /// The distribution's name, as in the report and the flags.
    pub fn name(self) -> &'static str {
        match self {
            ArrivalKind::Constant => "constant",
            ArrivalKind::Poisson => "poisson",
        }
    }
}

/// The `run` section. Filled in by the coordinator; also the builder's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Run id (a UUID).
    pub id: String,
    /// Start time, RFC 3339 UTC (see [`rfc3339_utc`]).
    pub started_at: String,
    /// Wall-clock length of the run, seconds.
    pub duration_s: f64,
    /// The target URL, or `embedded mock` when none was given.
    pub target: String,
    /// The load model the run was sent at.
    pub load: LoadSection,
    /// Largest difference between the workers' actual start instants (ms), each taken in the
    /// coordinator's clock through its estimated offset: blind to the offsets' own error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_skew_ms: Option<f64>,
    /// The most the workers' true start instants can differ (ms), given each offset's
    /// uncertainty (`coordinator::supervisor::start_skew_bound_ms`); 0 with one worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_skew_bound_ms: Option<f64>,
    /// The workers that took part.
    pub workers: Vec<WorkerInfo>,
    /// True when the target's TLS certificate was not verified (`--insecure`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
}

impl RunInfo {
    /// The start skew as every rendering shows it: what the workers' clocks say, and the most
    /// it can truly be given their uncertainty (`0.01 ms (bound 45.20 ms)`); `None` when the
    /// run did not measure it.
    pub fn start_skew_text(&self) -> Option<String> {
        let skew = self.start_skew_ms?;
        Some(match self.start_skew_bound_ms {
            Some(bound) => format!("{skew:.2} ms (bound {bound:.2} ms from clock uncertainty)"),
            None => format!("{skew:.2} ms"),
        })
    }
}

/// One worker of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Worker id as it registered.
    pub id: String,
    /// Host name (or address) it reported.
    pub host: String,
    /// Requests assigned to it.
    pub assigned: u64,
    /// Requests it reported back with an outcome.
    pub completed: u64,
    /// Requests lost with it (assigned, never reported, not reassigned).
    pub lost: u64,
    /// Its clock's offset from the coordinator's, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<f64>,
    /// True when the connection to it was lost during the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disconnected: bool,
    /// Why it stopped on its own before its work was done (a lost worker that said why: its
    /// link stalled one way, its slice failed its checks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quit: Option<String>,
    /// Its llm-replay version, when it reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Peak resident memory of the worker process (MB), when it reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<f64>,
    /// CPU time the worker process used (seconds), when it reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Half the best clock-sync round trip: the offset is known to ± this (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_uncertainty_ms: Option<f64>,
    /// This worker's own schedule-lag p99 (ms): high means the client could not keep up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_lag_p99_ms: Option<f64>,
    /// CPU use of the worker process, percent of its cores over the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<f64>,
}

/// What the coordinator knows about requests that [`RunMetrics`] cannot: requests that never
/// produced an outcome, and the HTTP status codes seen.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestTotals {
    /// The run's slice totals as the workers counted them and the supervisor added them up:
    /// requests lost with a worker (no outcome ever came back), never sent (the run stopped
    /// first: duration, interrupt, fatal error), issued, sent out of order.
    pub slice: common::metrics::SliceTotals,
    /// HTTP status code → number of responses with it (measured requests only).
    pub status_codes: BTreeMap<u16, u64>,
    /// TLS failures by problem (`unknown issuer` → count).
    pub tls_problems: BTreeMap<String, u64>,
    /// Why requests were never started, when the run knows (a lost worker under `fail`, an
    /// interrupt); `None`: the run stopped first (its duration, or nothing left to send).
    pub not_started_because: Option<String>,
}

/// The `requests` section.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RequestsSection {
    /// succeeded + failed + ended_early + cancelled_as_recorded + cancelled_by_rate + lost +
    /// not_started.
    pub total: u64,
    /// Streams that reached their terminal marker with content and no error.
    pub succeeded: u64,
    /// Failed requests of every kind (see `failed_by_kind`).
    pub failed: u64,
    /// Streams that ended without their terminal marker and without an error.
    pub ended_early: u64,
    /// Requests lost with a worker (no outcome ever came back).
    pub lost: u64,
    /// Requests never sent because the run stopped first.
    pub not_started: u64,
    /// Streams whose output tokens came from the server's usage report.
    pub usage_reported: u64,
    /// Streams whose output tokens were estimated (one per content frame).
    pub estimated: u64,
    /// Streams without usage whose output tokens the tokenizer counted (`--tokenizer`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokenized: u64,
    /// Streams without usage whose output tokens the server stated elsewhere in the stream
    /// (llama.cpp's `timings`): the server's own count.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub server_stated: u64,
    /// Requests cancelled at the point the recording shows the production client abandoning
    /// them (apart from failures and ended-early streams): TTFT counts when the first token
    /// came before the cancel; no latency, ITL or token rate.
    #[serde(default)]
    pub cancelled_as_recorded: u64,
    /// Requests cancelled by `--cancel-rate` (a what-if run), counted like those above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cancelled_by_rate: u64,
    /// Where token counts came from, with each share.
    #[serde(default)]
    pub token_source: TokenSourceSection,
    /// `failed` split by kind.
    #[serde(default)]
    pub failed_by_kind: FailedByKind,
    /// HTTP status code → count.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub status_codes: BTreeMap<u16, u64>,
    /// Warm-up requests, left out of every other number.
    #[serde(default)]
    pub warmup: u64,
    /// Requests sent once more on a fresh connection because their reused connection closed
    /// before any response byte (each still counts once above).
    #[serde(default)]
    pub resent: u64,
    /// Succeeded requests answered with one body rather than a stream: they count in
    /// latency, ISL, OSL and throughput, and have no TTFT, TTST or ITL.
    #[serde(default)]
    pub unstreamed: u64,
    /// Succeeded requests that asked for their recorded output length
    /// (`--pin-output-length`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pinned: u64,
    /// Those that got exactly that length.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pinned_matched: u64,
    /// Of `pinned`, those whose pin was a recorded content-frame count (the recording had no
    /// usage and the run no `--tokenizer`): compared with the replayed content frames.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pinned_frames: u64,
    /// What the failed requests were told: by kind and status, a few distinct messages each
    /// (the server's, cleaned: one line, credentials redacted, at most 300 characters), most
    /// frequent first. Empty when nothing failed.
    #[serde(default)]
    pub errors: Vec<ErrorEntry>,
}

/// `requests.token_source`: where the output and input token counts of succeeded and
/// ended-early requests came from.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TokenSourceSection {
    /// The `--tokenizer` file, when the run had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Output tokens: `usage`, `server` (a count the server stated elsewhere in the stream,
    /// llama.cpp's `timings`), `tokenizer`, `frames` (one per content frame).
    pub output: OutputSources,
    /// Input tokens: `usage`, `server`, `tokenizer`, `estimate` (the prompt's characters / 4).
    pub input: InputSources,
    /// `--request-usage`: the replay added `stream_options.include_usage: true` to the
    /// OpenAI-compatible chat and completions streams that did not ask for usage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub usage_requested: bool,
}

/// Output token counts by source, and each one's percent of them all (absent with none).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OutputSources {
    pub usage: u64,
    #[serde(default)]
    pub server: u64,
    pub tokenizer: u64,
    pub frames: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames_pct: Option<f64>,
}

/// Input token counts by source, and each one's percent of them all (absent with none).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct InputSources {
    pub usage: u64,
    #[serde(default)]
    pub server: u64,
    pub tokenizer: u64,
    pub estimate: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_pct: Option<f64>,
}

/// `counts` as percents of their sum (`None` each when the sum is zero).
fn shares<const N: usize>(counts: [u64; N]) -> [Option<f64>; N] {
    let total: u64 = counts.iter().sum();
    counts.map(|n| (total > 0).then(|| 100.0 * n as f64 / total as f64))
}

impl OutputSources {
    /// Counts by source, in the order usage, server, tokenizer, frames.
    pub fn new([usage, server, tokenizer, frames]: [u64; 4]) -> OutputSources {
        let [usage_pct, server_pct, tokenizer_pct, frames_pct] =
            shares([usage, server, tokenizer, frames]);
        OutputSources {
            usage,
            server,
            tokenizer,
            frames,
            usage_pct,
            server_pct,
            tokenizer_pct,
            frames_pct,
        }
    }
}

impl InputSources {
    /// Counts by source, in the order usage, server, tokenizer, estimate.
    pub fn new([usage, server, tokenizer, estimate]: [u64; 4]) -> InputSources {
        let [usage_pct, server_pct, tokenizer_pct, estimate_pct] =
            shares([usage, server, tokenizer, estimate]);
        InputSources {
            usage,
            server,
            tokenizer,
            estimate,
            usage_pct,
            server_pct,
            tokenizer_pct,
            estimate_pct,
        }
    }
}

/// One line of `requests.errors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEntry {
    /// The failure kind: `status`, `error_frame`, `transport`, `timeout`, `empty`.
    pub kind: String,
    /// The HTTP status, when a response came.
    pub status: Option<u16>,
    /// The server's message; `null` when there was none (or past the few kept per kind and
    /// status).
    pub message: Option<String>,
    /// Failures with this kind, status and message.
    pub count: u64,
}

impl ErrorEntry {
    /// The entries of an error summary, most frequent first.
    pub fn from_summary(summary: &common::metrics::ErrorSummary) -> Vec<ErrorEntry> {
        summary
            .samples()
            .into_iter()
            .map(|s| ErrorEntry {
                kind: s.kind.name().to_owned(),
                status: s.status,
                message: s.message.clone(),
                count: s.count,
            })
            .collect()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Failures by kind.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FailedByKind {
    /// Non-2xx status.
    pub status: u64,
    /// An error frame in the stream.
    pub error_frame: u64,
    /// Connection or framing failure before any content.
    pub transport: u64,
    /// `--timeout` exceeded.
    pub timeout: u64,
    /// Complete response without content.
    pub empty: u64,
    /// `transport` by cause: refused, reset, closed_before_response, tls, dns, other,
    /// closed_after_head, http2_only.
    #[serde(default)]
    pub transport_causes: TransportCounters,
    /// `transport_causes.tls` by problem (`unknown issuer` → count).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tls_problems: BTreeMap<String, u64>,
}

/// The `llm` section: one summary per distribution (`null` when it has no samples) and the
/// run-level rates.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LlmSection {
    /// Time to first token, ms (succeeded and ended-early streams).
    pub ttft_ms: Option<Stats>,
    /// Time to second token, ms.
    pub ttst_ms: Option<Stats>,
    /// Inter-token latency, ms.
    pub itl_ms: Option<Stats>,
    /// Request latency (to the last content frame), ms.
    pub latency_ms: Option<Stats>,
    /// Output tokens per second per user (1 / ITL).
    pub tokens_per_second_per_user: Option<Stats>,
    /// Input sequence length, tokens.
    pub isl_tokens: Option<Stats>,
    /// Output sequence length, tokens.
    pub osl_tokens: Option<Stats>,
    /// Actual − intended send time, ms (scheduled and rate modes only).
    pub schedule_lag_ms: Option<Stats>,
    /// Setup of each connection the workers opened to the target (name resolution and TCP
    /// connect, as k6's `http_req_connecting`), ms; measured apart from TTFT. `null` when
    /// none was timed (a baseline, an older worker).
    #[serde(default)]
    pub connect_ms: Option<Stats>,
    /// TLS handshake of each https connection (k6's `http_req_tls_handshaking`), ms; `null`
    /// on cleartext targets.
    #[serde(default)]
    pub tls_handshake_ms: Option<Stats>,
    /// Time to failure of each failed request (sent → the failure was known), ms; apart
    /// from every success distribution. `null` when nothing failed.
    #[serde(default)]
    pub error_latency_ms: Option<Stats>,
    /// Output tokens of succeeded requests per second of the measured window (the whole run:
    /// first request sent → last outcome of any kind, failures included); `null` when nothing
    /// was measured.
    pub output_tokens_per_second: Option<f64>,
    /// Succeeded requests per second of the measured window; `null` when nothing was measured.
    pub requests_per_second: Option<f64>,
    /// Percent of streams whose output tokens were estimated; `null` when there were none.
    pub estimated_token_share_pct: Option<f64>,
    /// Percent of input tokens the server served from its prompt cache, over the requests
    /// whose usage reported cached tokens; `null` when none did.
    #[serde(default)]
    pub cached_input_share_pct: Option<f64>,
    /// Output tokens of succeeded requests.
    #[serde(default)]
    pub output_tokens: u64,
    /// The measured window (first request sent → last outcome of any kind: success,
    /// failure, timeout, early end), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_window_s: Option<f64>,
    /// Output tokens per second over the steady window (load at its target → last request
    /// sent); `null` when the load never reached its target.
    #[serde(default)]
    pub output_tokens_per_second_steady: Option<f64>,
    /// Succeeded requests per second over the steady window.
    #[serde(default)]
    pub requests_per_second_steady: Option<f64>,
    /// The steady window, seconds.
    #[serde(default)]
    pub steady_window_s: Option<f64>,
    /// Percent of pinned requests whose output length equals the recorded one
    /// (`--pin-output-length`); absent without pinning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osl_match_share_pct: Option<f64>,
    /// The distributions the HTML report plots; absent in sweep levels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdf: Option<CdfSection>,
}

/// Cumulative distributions as `[value, percent]` pairs: the value at each percent from 0
/// (the minimum) to 100 (the maximum) in steps of one, plus 99.5 and 99.9. An empty list
/// when the metric had no samples.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CdfSection {
    /// Time to first token, ms.
    #[serde(default)]
    pub ttft_ms: Vec<[f64; 2]>,
    /// Inter-token latency, ms.
    #[serde(default)]
    pub itl_ms: Vec<[f64; 2]>,
    /// Request latency, ms.
    #[serde(default)]
    pub latency_ms: Vec<[f64; 2]>,
    /// Connection setup of each new connection, ms (apart from TTFT); absent when no
    /// connection was timed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connect_ms: Vec<[f64; 2]>,
}

/// The `baseline` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineSection {
    /// Where the baseline came from: `recorded` or a report file name.
    pub source: String,
    /// The baseline's numbers, same shape as the run's.
    pub llm: LlmSection,
    /// The baseline's request counters, when known (used by `.change` goals on counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<RequestsSection>,
    /// `"ttft_ms.p95"` → change, for every statistic both sides have.
    pub changes: BTreeMap<String, Change>,
}

/// One baseline-vs-replayed comparison.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// The baseline's value.
    pub baseline: f64,
    /// This run's value.
    pub replayed: f64,
    /// `(replayed − baseline) / baseline · 100`; `null` when the baseline is 0 and the
    /// replayed value is not.
    pub change_pct: Option<f64>,
    /// Slower for times, lower for token rates; always false for token counts (ISL, OSL),
    /// which have no better direction.
    pub worse: bool,
    /// `worse` and at least [`HIGHLIGHT_THRESHOLD_PCT`] percent away (the contract's rule).
    /// The renderers' ▲ also needs the change not to be within noise: [`Change::flagged`].
    pub highlight: bool,
    /// Low end of the 95 % bootstrap interval of `change_pct`; `null` when only summary
    /// statistics exist on one side (throughputs, saved reports without a `cdf`).
    #[serde(default)]
    pub ci_low_pct: Option<f64>,
    /// High end of that interval.
    #[serde(default)]
    pub ci_high_pct: Option<f64>,
    /// The interval excludes 0; `null` when the interval is unknown.
    #[serde(default)]
    pub significant: Option<bool>,
    /// A distorted comparison: many streams of the run or of the baseline arrived in one
    /// piece (a buffering proxy), so this ITL, TTST or token-rate change comes from the
    /// coalescing, not from the model. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coalesced: bool,
}

/// One level of a concurrency sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSection {
    /// The closed-loop concurrency of this level.
    pub concurrency: u32,
    /// This level's numbers.
    pub llm: LlmSection,
    /// This level's counters.
    pub requests: RequestsSection,
    /// This level's goodput, with `--slo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<GoodputSection>,
    /// The server's metrics over this level, when they were scraped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerSection>,
}

/// The report's `faithful` section: how faithfully the recording's users were replayed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FaithfulSection {
    /// `max` or `strict` with `--pin-output-length`; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_output_length: Option<String>,
    /// What the pinned lengths count: `tokens` (usage, the tokenizer or an import's count),
    /// `frames` (content frames of a recording without usage, run without `--tokenizer`:
    /// compared with replayed content frames, not tokens) or `mixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_unit: Option<String>,
    /// `open` (turns at their recorded offsets) or `closed` (previous turn's replayed end +
    /// recorded think time).
    pub session_mode: String,
    /// Recorded think times between turns (ms), when the recording has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think_time_ms: Option<Stats>,
    /// The recording's span: first `at_ms` to the last frame of the last exchange, at
    /// `--speed` (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_span_s: Option<f64>,
    /// The replay's measured window (first request sent → last content frame), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_span_s: Option<f64>,
    /// How far the replay stretched the recording's span: `(replayed / recorded − 1) · 100`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stretch_pct: Option<f64>,
    /// `--sample-sessions`: what was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleSection>,
}

/// What `--sample-sessions` kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleSection {
    pub fraction: f64,
    pub seed: u64,
    /// Sessions kept, of all sessions in the recording.
    pub sessions: u64,
    pub of_sessions: u64,
    /// Exchanges kept (with and without a session), of all exchanges.
    pub exchanges: u64,
    pub of_exchanges: u64,
}

/// Everything [`Report::build`] needs.
pub struct ReportInput<'a> {
    /// The `run` section, as is.
    pub run: RunInfo,
    /// The merged metrics of every worker (of the whole run when sweeping).
    pub metrics: &'a RunMetrics,
    /// Lost / not-started requests and status codes of the whole run.
    pub requests: RequestTotals,
    /// `None` with `--baseline none` (or a recording without responses).
    pub baseline: Option<Baseline<'a>>,
    /// Empty unless sweeping.
    pub sweep: Vec<SweepLevel>,
    /// Warnings collected during the run; the builder adds its own after them.
    pub warnings: Vec<String>,
    /// The run's time series (built by the `timeline` module's `RunTimeline`).
    pub timeline: Vec<TimelinePoint>,
    /// `--slo`: the report (and each sweep level) gets a goodput section when not empty.
    pub slos: &'a Slos,
}

/// The baseline as metrics: the recording measured by the same meter, or a previous run.
pub struct Baseline<'a> {
    /// `recorded` or the report file it came from.
    pub source: String,
    /// The baseline measured by the same meter as the replay.
    pub metrics: &'a RunMetrics,
}

/// One level of a concurrency sweep, as measured.
pub struct SweepLevel {
    /// The closed-loop concurrency of this level.
    pub concurrency: u32,
    /// The merged metrics of this level.
    pub metrics: RunMetrics,
    /// Lost / not-started requests and status codes of this level.
    pub requests: RequestTotals,
}

/// Reading a saved report failed.
#[derive(Debug, thiserror::Error)]
pub enum ReportReadError {
    /// Not JSON, or a field has the wrong type.
    #[error("{path}: {source}")]
    Json {
        /// JSON path of the offending field (`llm.ttft_ms.p95`), `.` for the whole document.
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// A JSON document of another schema.
    #[error("schema: expected \"{REPORT_SCHEMA}\", found \"{found}\"")]
    Schema { found: String },
}

/// Which direction is better for a compared quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    LowerIsBetter,
    HigherIsBetter,
    Neither,
}

impl Report {
    /// Build the report from merged metrics. Goals are attached afterwards with
    /// [`Report::with_goals`] (or `report.goals = report.evaluate_goals(..)`), because they
    /// read the finished report.
    pub fn build(input: ReportInput<'_>) -> Report {
        let llm = LlmSection::from_metrics(input.metrics);
        let requests = RequestsSection::new(&input.metrics.counters, &input.requests)
            .with_errors(&input.metrics.errors);
        let mut warnings = input.warnings;
        let transport = TransportSection::from_counters(&input.metrics.counters);
        let baseline = input.baseline.map(|baseline| {
            let baseline_llm = LlmSection::from_metrics(baseline.metrics);
            if baseline_llm.ttft_ms.is_none() {
                warnings.push(format!(
                    "the baseline ({}) has no frame timing; only replayed values are shown",
                    baseline.source
                ));
            }
            let mut changes = compute_changes_with(
                &baseline_llm,
                &llm,
                Samples::Metrics(baseline.metrics),
                Samples::Metrics(input.metrics),
            );
            let counted = |c: &Counters| coalesced_share_pct(c.coalesced, c.coalesce_checked);
            mark_coalesced(
                &mut changes,
                [
                    counted(&input.metrics.counters),
                    counted(&baseline.metrics.counters),
                ],
            );
            BaselineSection {
                source: baseline.source,
                changes,
                llm: baseline_llm,
                requests: Some(RequestsSection::new(
                    &baseline.metrics.counters,
                    &RequestTotals::default(),
                )),
            }
        });
        warnings.extend(derived_warnings(
            &requests,
            input.requests.not_started_because.as_deref(),
        ));
        warnings.extend(transport_warnings(&requests, transport.as_ref()));
        let sweep = input
            .sweep
            .iter()
            .map(|level| SweepSection {
                concurrency: level.concurrency,
                llm: LlmSection {
                    cdf: None,
                    ..LlmSection::from_metrics(&level.metrics)
                },
                requests: RequestsSection::new(&level.metrics.counters, &level.requests)
                    .with_errors(&level.metrics.errors),
                goodput: GoodputSection::from_metrics(input.slos, &level.metrics),
                server: None,
            })
            .collect();
        Report {
            schema: REPORT_SCHEMA.to_string(),
            run: input.run,
            requests,
            llm,
            baseline,
            goals: Vec::new(),
            sweep,
            warnings,
            timeline: input.timeline,
            faithful: None,
            transport,
            goodput: GoodputSection::from_metrics(input.slos, input.metrics),
            capacity: None,
            server: None,
        }
    }

    /// Evaluate `goals` on this report and attach the results.
    pub fn with_goals(mut self, goals: &[Goal]) -> Report {
        self.goals = self.evaluate_goals(goals);
        if goals.is_empty()
            && let Some(warning) = failures_without_goals(&self.requests)
            && !self.warnings.contains(&warning)
        {
            self.warnings.push(warning);
        }
        self
    }

    /// The outcome of each of `goals` on this report's merged numbers (`.change` goals
    /// against its baseline; `server.NAME.STAT` goals on its `server` section, so set it
    /// before evaluating).
    pub fn evaluate_goals(&self, goals: &[Goal]) -> Vec<GoalResult> {
        evaluate_goals_on(
            goals,
            &self.llm,
            &self.requests,
            self.goodput.as_ref(),
            self.server.as_ref(),
            self.baseline.as_ref(),
        )
    }

    /// True when any goal failed (exit code 1).
    pub fn any_goal_failed(&self) -> bool {
        self.goals.iter().any(|g| g.failed)
    }

    /// The report as pretty-printed JSON (`--report-json`).
    pub fn to_json_pretty(&self) -> String {
        // Only strings, numbers, maps and `serde_json::Value` inside: serializing cannot fail
        // (non-finite floats become `null`).
        serde_json::to_string_pretty(self).expect("a report always serializes to JSON")
    }

    /// Read a saved report, naming the field that is wrong when it does not parse.
    pub fn from_json(text: &str) -> Result<Report, ReportReadError> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let report: Report = serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let path = error.path().to_string();
            ReportReadError::Json {
                path,
                source: error.into_inner(),
            }
        })?;
        if report.schema != REPORT_SCHEMA {
            return Err(ReportReadError::Schema {
                found: report.schema,
            });
        }
        Ok(report)
    }
}

/// The outcome of each of `goals` on one set of numbers: a report's, a sweep level's or a
/// capacity probe's (`llm`, `requests`, `goodput` with `--slo` and `server` when the server's
/// metrics were scraped; the goals that need a missing one fail with a note), `.change` goals
/// against `baseline` when there is one.
pub fn evaluate_goals_on(
    goals: &[Goal],
    llm: &LlmSection,
    requests: &RequestsSection,
    goodput: Option<&GoodputSection>,
    server: Option<&ServerSection>,
    baseline: Option<&BaselineSection>,
) -> Vec<GoalResult> {
    let replayed = goal_values::SectionValues {
        llm,
        requests: Some(requests),
        goodput,
        server,
        baseline: false,
    };
    // A baseline (the recording, or a saved report's numbers) has no goodput: SLOs judge
    // this run's requests only; nor a server side.
    let baseline = baseline.map(|baseline| goal_values::SectionValues {
        llm: &baseline.llm,
        requests: baseline.requests.as_ref(),
        goodput: None,
        server: None,
        baseline: true,
    });
    goals::evaluate(
        goals,
        &replayed,
        baseline.as_ref().map(|b| b as &dyn GoalValues),
    )
}

/// Re-render `current` against `baseline` (`llm-replay report FILE --baseline FILE2`): the
/// baseline's `llm` and `requests` become `current`'s baseline under the name `source`, the
/// changes are recomputed, and goals are re-evaluated from their expressions so `.change` goals
/// test the new baseline.
pub fn compare_reports(current: &Report, baseline: &Report, source: &str) -> Report {
    let mut report = current.clone();
    let mut changes = compute_changes(&baseline.llm, &current.llm);
    let share = |r: &Report| r.transport.as_ref().and_then(|t| t.coalesced_share_pct);
    mark_coalesced(&mut changes, [share(current), share(baseline)]);
    report.baseline = Some(BaselineSection {
        source: source.to_string(),
        changes,
        llm: baseline.llm.clone(),
        requests: Some(baseline.requests.clone()),
    });
    let parsed: Result<Vec<Goal>, _> = current
        .goals
        .iter()
        .map(|g| goals::parse_goal(&g.expr))
        .collect();
    match parsed {
        Ok(parsed) => report.goals = report.evaluate_goals(&parsed),
        Err(error) => report.warnings.push(format!(
            "goals kept as saved, not re-evaluated against {source}: {error}"
        )),
    }
    report
}

/// The `--set` fields that ask a server not to reuse its prompt cache: llama.cpp's
/// `cache_prompt: false`, vLLM's `cache_salt` (a fresh salt keeps the run's prefixes apart
/// from every earlier run's). A run that sets one is meant to be cold. `sets` as given:
/// `(FIELD, VALUE)` with VALUE JSON when it parses, else a string (as the worker reads it).
pub fn cold_cache_request(sets: &[(String, String)]) -> Option<String> {
    sets.iter().find_map(|(field, text)| {
        let value =
            serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.clone()));
        match (field.as_str(), value) {
            ("cache_prompt", serde_json::Value::Bool(false)) => {
                Some("cache_prompt=false".to_owned())
            }
            ("cache_salt", value) if !value.is_null() => Some("cache_salt".to_owned()),
            _ => None,
        }
    })
}

/// Warn when a replay meant to be cold (`cold`: the `--set` field that asked for it,
/// [`cold_cache_request`]) reports input served from the server's prompt cache: the server
/// ignored the request (llama.cpp ignores `cache_prompt` on `/v1/messages`), and TTFT is
/// lower than a cold server would give.
pub fn warn_cached_when_cold(report: &mut Report, cold: Option<&str>) {
    let Some(asked) = cold else {
        return;
    };
    let Some(share) = report
        .llm
        .cached_input_share_pct
        .filter(|share| *share > 0.0)
    else {
        return;
    };
    report.warnings.push(format!(
        "the replay asked for a cold prompt cache (--set {asked}) but the server reported {share:.1} % of input tokens served from its cache: it ignored the request (llama.cpp ignores cache_prompt on /v1/messages); TTFT is lower than a cold server's. Per-family cache controls: docs/faithful-replay.md"
    ));
}

impl RequestsSection {
    /// Counters from merged metrics plus what only the coordinator knows.
    pub fn new(counters: &Counters, totals: &RequestTotals) -> RequestsSection {
        let failed = counters.failed();
        RequestsSection {
            total: counters.succeeded
                + failed
                + counters.ended_early
                + counters.cancelled_as_recorded
                + counters.cancelled_by_rate
                + totals.slice.lost
                + totals.slice.not_started,
            succeeded: counters.succeeded,
            failed,
            ended_early: counters.ended_early,
            lost: totals.slice.lost,
            not_started: totals.slice.not_started,
            usage_reported: counters.usage_reported,
            estimated: counters.estimated,
            tokenized: counters.tokenized,
            server_stated: counters.server_stated,
            cancelled_as_recorded: counters.cancelled_as_recorded,
            cancelled_by_rate: counters.cancelled_by_rate,
            token_source: TokenSourceSection {
                tokenizer: None,
                output: OutputSources::new([
                    counters.usage_reported,
                    counters.server_stated,
                    counters.tokenized,
                    counters.estimated,
                ]),
                input: InputSources::new([
                    counters.input_usage,
                    counters.input_server,
                    counters.input_tokenized,
                    counters.input_estimated,
                ]),
                usage_requested: false,
            },
            failed_by_kind: FailedByKind {
                status: counters.failed_status,
                error_frame: counters.failed_error_frame,
                transport: counters.failed_transport,
                timeout: counters.failed_timeout,
                empty: counters.failed_empty,
                transport_causes: counters.transport,
                tls_problems: totals.tls_problems.clone(),
            },
            status_codes: totals.status_codes.clone(),
            warmup: counters.warmup,
            resent: counters.resent,
            unstreamed: counters.unstreamed,
            pinned: counters.pinned,
            pinned_matched: counters.pinned_matched,
            pinned_frames: counters.pinned_frames,
            errors: Vec::new(),
        }
    }

    /// These counters with the error summary of the same metrics (`errors`).
    pub fn with_errors(mut self, errors: &common::metrics::ErrorSummary) -> RequestsSection {
        self.errors = ErrorEntry::from_summary(errors);
        self
    }

    /// `100 · failed / (succeeded + failed + ended_early)`: the share of answered requests that
    /// failed. `None` when nothing was answered.
    pub fn error_rate_pct(&self) -> Option<f64> {
        let answered = self.succeeded + self.failed + self.ended_early;
        (answered > 0).then(|| 100.0 * self.failed as f64 / answered as f64)
    }
}

impl LlmSection {
    /// Summaries of merged metrics.
    pub fn from_metrics(metrics: &RunMetrics) -> LlmSection {
        let measured = metrics.window.is_some();
        let c = &metrics.counters;
        let token_sources = c.usage_reported + c.server_stated + c.tokenized + c.estimated;
        LlmSection {
            ttft_ms: metrics.stats(Metric::Ttft),
            ttst_ms: metrics.stats(Metric::Ttst),
            itl_ms: metrics.stats(Metric::Itl),
            latency_ms: metrics.stats(Metric::Latency),
            tokens_per_second_per_user: metrics.stats(Metric::TokensPerSecondPerUser),
            isl_tokens: metrics.stats(Metric::Isl),
            osl_tokens: metrics.stats(Metric::Osl),
            schedule_lag_ms: metrics.stats(Metric::ScheduleLag),
            connect_ms: metrics.stats(Metric::Connect),
            tls_handshake_ms: metrics.stats(Metric::TlsHandshake),
            error_latency_ms: metrics.stats(Metric::ErrorLatency),
            output_tokens_per_second: measured.then(|| metrics.output_tokens_per_second()),
            requests_per_second: measured.then(|| metrics.requests_per_second()),
            estimated_token_share_pct: (token_sources > 0)
                .then(|| metrics.estimated_token_share_pct()),
            cached_input_share_pct: metrics.cached_input_share_pct(),
            output_tokens: metrics.counters.output_tokens,
            measured_window_s: measured.then(|| metrics.window_seconds()),
            cdf: Some(CdfSection {
                ttft_ms: cdf_of(metrics, Metric::Ttft),
                itl_ms: cdf_of(metrics, Metric::Itl),
                latency_ms: cdf_of(metrics, Metric::Latency),
                connect_ms: cdf_of(metrics, Metric::Connect),
            }),
            // Set from the workers' timelines by the `faithful` module: metrics alone do not
            // know when the load reached its target.
            output_tokens_per_second_steady: None,
            requests_per_second_steady: None,
            steady_window_s: None,
            osl_match_share_pct: metrics.osl_match_share_pct(),
        }
    }

    /// The summary of `metric`, `None` when it had no samples.
    pub fn stats(&self, metric: Metric) -> Option<Stats> {
        match metric {
            Metric::Ttft => self.ttft_ms,
            Metric::Ttst => self.ttst_ms,
            Metric::Itl => self.itl_ms,
            Metric::Latency => self.latency_ms,
            Metric::TokensPerSecondPerUser => self.tokens_per_second_per_user,
            Metric::Isl => self.isl_tokens,
            Metric::Osl => self.osl_tokens,
            Metric::ScheduleLag => self.schedule_lag_ms,
            Metric::Connect => self.connect_ms,
            Metric::TlsHandshake => self.tls_handshake_ms,
            Metric::ErrorLatency => self.error_latency_ms,
        }
    }
}

impl Change {
    /// Compare `replayed` with `baseline` for a quantity whose better direction is `direction`.
    fn new(baseline: f64, replayed: f64, direction: Direction) -> Change {
        let change_pct = goals::change_pct(baseline, replayed);
        let worse = match direction {
            Direction::LowerIsBetter => replayed > baseline,
            Direction::HigherIsBetter => replayed < baseline,
            Direction::Neither => false,
        };
        // An undefined change (baseline 0) in the wrong direction is as bad as it gets. The
        // epsilon keeps rounding in the division from turning an exact 10 % (0.9 / 1.0 gives
        // -9.999999999999998) into "not highlighted".
        let large = change_pct
            .is_none_or(|pct| pct.abs() >= HIGHLIGHT_THRESHOLD_PCT - HIGHLIGHT_EPSILON_PCT);
        Change {
            baseline,
            replayed,
            change_pct,
            worse,
            highlight: worse && large,
            ci_low_pct: None,
            ci_high_pct: None,
            significant: None,
            coalesced: false,
        }
    }

    /// Attach a confidence interval (a change known to be within noise is not flagged).
    fn with_interval(mut self, interval: Option<significance::Interval>) -> Change {
        if let Some(interval) = interval {
            let significant = interval.significant();
            self.ci_low_pct = Some(interval.low_pct);
            self.ci_high_pct = Some(interval.high_pct);
            self.significant = Some(significant);
        }
        self
    }

    /// A regression the renderers mark ▲: `highlight` (≥ 10 % worse) and not within noise
    /// (significant, or no interval known: throughputs, saved reports without a `cdf`).
    pub fn flagged(&self) -> bool {
        self.highlight && self.significant != Some(false)
    }

    /// At least [`HIGHLIGHT_THRESHOLD_PCT`] percent in the wrong direction, but the interval
    /// includes 0: shown as "within noise" rather than ▲.
    pub fn within_noise(&self) -> bool {
        let large = self
            .change_pct
            .is_none_or(|pct| pct.abs() >= HIGHLIGHT_THRESHOLD_PCT - HIGHLIGHT_EPSILON_PCT);
        self.worse && large && self.significant == Some(false)
    }
}

/// Where the samples of one side of a comparison come from.
#[derive(Clone, Copy)]
pub enum Samples<'a> {
    /// Merged HDR histograms: every recorded value with its count.
    Metrics(&'a RunMetrics),
    /// A saved report: only the `cdf` (TTFT, ITL, latency) with each metric's count.
    Section(&'a LlmSection),
}

impl Samples<'_> {
    /// The distribution of `metric`, `None` when these samples do not hold it.
    pub fn distribution(&self, metric: Metric) -> Option<significance::Distribution> {
        match self {
            Samples::Metrics(metrics) => {
                significance::Distribution::from_histogram(metrics.histogram(metric), metric)
            }
            Samples::Section(section) => {
                let cdf = section.cdf.as_ref()?;
                let points = match metric {
                    Metric::Ttft => &cdf.ttft_ms,
                    Metric::Itl => &cdf.itl_ms,
                    Metric::Latency => &cdf.latency_ms,
                    Metric::Connect => &cdf.connect_ms,
                    _ => return None,
                };
                significance::Distribution::from_cdf(points, section.stats(metric)?.count)
            }
        }
    }
}

/// Public for tests and for callers that compare single numbers: a change of a time
/// (`lower_is_better`) or a rate.
pub fn change_of(baseline: f64, replayed: f64, lower_is_better: bool) -> Change {
    let direction = if lower_is_better {
        Direction::LowerIsBetter
    } else {
        Direction::HigherIsBetter
    };
    Change::new(baseline, replayed, direction)
}

/// Every comparable statistic both sides have, keyed `"<json key>.<stat>"`, plus the two
/// throughputs keyed by their JSON key.
/// Intervals come from each section's `cdf` where it has one (see [`compute_changes_with`]).
pub fn compute_changes(baseline: &LlmSection, replayed: &LlmSection) -> BTreeMap<String, Change> {
    compute_changes_with(
        baseline,
        replayed,
        Samples::Section(baseline),
        Samples::Section(replayed),
    )
}

/// [`compute_changes`] with each change's confidence interval computed from the two sides'
/// samples (see [`significance`]); `null` intervals where a side has no distribution.
pub fn compute_changes_with(
    baseline: &LlmSection,
    replayed: &LlmSection,
    baseline_samples: Samples<'_>,
    replayed_samples: Samples<'_>,
) -> BTreeMap<String, Change> {
    let mut changes = BTreeMap::new();
    for metric in COMPARED_METRICS {
        let (Some(b), Some(r)) = (baseline.stats(metric), replayed.stats(metric)) else {
            continue;
        };
        let direction = metric_direction(metric);
        let distributions = baseline_samples
            .distribution(metric)
            .zip(replayed_samples.distribution(metric));
        for stat in Stat::ALL {
            let interval = distributions
                .as_ref()
                .and_then(|(b, r)| significance::change_interval(b, r, stat));
            changes.insert(
                change_key(metric, stat),
                Change::new(stat.of(&b), stat.of(&r), direction).with_interval(interval),
            );
        }
    }
    let rates = [
        (
            "output_tokens_per_second",
            baseline.output_tokens_per_second,
            replayed.output_tokens_per_second,
        ),
        (
            "requests_per_second",
            baseline.requests_per_second,
            replayed.requests_per_second,
        ),
    ];
    for (key, b, r) in rates {
        if let (Some(b), Some(r)) = (b, r) {
            changes.insert(
                key.to_string(),
                Change::new(b, r, Direction::HigherIsBetter),
            );
        }
    }
    changes
}

/// The `baseline.changes` key of one statistic (`ttft_ms.p95`).
pub fn change_key(metric: Metric, stat: Stat) -> String {
    format!("{}.{}", metric.json_key(), stat.name())
}

fn metric_direction(metric: Metric) -> Direction {
    match metric.unit() {
        Unit::Milliseconds => Direction::LowerIsBetter,
        Unit::TokensPerSecond => Direction::HigherIsBetter,
        Unit::Tokens => Direction::Neither,
    }
}

/// The share of failed requests above which a run without goals warns: nothing else would
/// tell a CI job that its exit 0 hides them.
pub const FAILED_SHARE_WARNING_PCT: f64 = 5.0;

/// A run without goals whose failed share (`llm.error-rate`) is above
/// [`FAILED_SHARE_WARNING_PCT`] exits 0: say so, with the goal that would catch it. `None` when
/// nothing succeeded (that has its own warning) or the share is within the bound.
fn failures_without_goals(requests: &RequestsSection) -> Option<String> {
    let share = requests.error_rate_pct()?;
    (requests.succeeded > 0 && share > FAILED_SHARE_WARNING_PCT).then(|| {
        format!(
            "{share:.1} % of requests failed ({} of {} that got an outcome) and no goal was set, \
             so the run passes: add --fail-if 'llm.error-rate > {FAILED_SHARE_WARNING_PCT}' to \
             fail it",
            requests.failed,
            requests.succeeded + requests.failed + requests.ended_early
        )
    })
}

fn derived_warnings(requests: &RequestsSection, not_started_because: Option<&str>) -> Vec<String> {
    let mut warnings = Vec::new();
    if requests.total > 0 && requests.succeeded == 0 {
        warnings.push(match requests.ended_early {
            // Streams cut mid-body keep their TTFT (PRODUCT.md): not every distribution is
            // empty.
            0 => "no request succeeded: every distribution is empty".to_string(),
            n => format!(
                "no request succeeded: only the time to first token of the {n} streams that ended early is measured; latency, ITL and token rates are empty"
            ),
        });
    }
    if requests.estimated > 0 {
        let streams = requests.usage_reported
            + requests.server_stated
            + requests.tokenized
            + requests.estimated;
        warnings.push(format!(
            "{} of {} streams ({:.1} %) reported no usage; their output tokens were estimated as one per content frame (--request-usage asks OpenAI-compatible servers for their own counts; --tokenizer FILE counts the canonical tokenization of the text, which can differ from what the model emitted)",
            requests.estimated,
            streams,
            100.0 * requests.estimated as f64 / streams as f64
        ));
    }
    if requests.lost > 0 {
        warnings.push(format!(
            "requests lost with a worker: {} (left out of every distribution)",
            requests.lost
        ));
    }
    if requests.not_started > 0 {
        warnings.push(match not_started_because {
            Some(because) => format!(
                "requests never started: {} ({because})",
                requests.not_started
            ),
            None => format!(
                "requests never started: {} (the run stopped first)",
                requests.not_started
            ),
        });
    }
    warnings
}

/// What the transport says about reading the numbers: streams delivered in one piece (a
/// buffering proxy), a target that speaks only cleartext HTTP/2, streams cut after their
/// head.
fn transport_warnings(
    requests: &RequestsSection,
    transport: Option<&TransportSection>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(t) = transport
        && let Some(share) = t.coalesced_share_pct
        && t.coalesced_streams > 0
        && share >= COALESCED_WARN_SHARE_PCT
    {
        warnings.push(format!(
            "{} of {} streams ({share:.1} %) arrived in one piece or in a few blocks (their content frames within microseconds of each other, in bursts separated by long gaps): \
             their TTFT waited for the first block (up to their whole latency) and their ITL and tokens/s per user measure a read loop, not the model. \
             Likely cause: a buffering reverse proxy or gateway between the workers and the server \
             (nginx: `proxy_buffering off;` for the streaming location, or the server sending `X-Accel-Buffering: no`; \
             nginx buffers SSE for HTTP/1.1 clients but not for HTTP/2 ones)",
            t.coalesced_streams, t.streams_checked
        ));
    }
    let causes = &requests.failed_by_kind.transport_causes;
    if causes.http2_only > 0 {
        warnings.push(format!(
            "{} requests were answered with HTTP/2 frames: the target speaks only cleartext HTTP/2 (h2c); run with --target-h2c",
            causes.http2_only
        ));
    }
    if causes.closed_after_head > 0 {
        warnings.push(format!(
            "{} requests got a response head and then lost their connection or stream before any content (closed after head): \
             typically a gateway's read timeout shorter than the TTFT (nginx `proxy_read_timeout`) or an upstream that died",
            causes.closed_after_head
        ));
    }
    warnings
}

/// The percents at which [`CdfSection`] samples a distribution.
fn cdf_percents() -> impl Iterator<Item = f64> {
    (0..=99).map(f64::from).chain([99.5, 99.9, 100.0])
}

/// `[value, percent]` pairs of `metric` in display units (empty without samples).
fn cdf_of(metrics: &RunMetrics, metric: Metric) -> Vec<[f64; 2]> {
    let histogram = metrics.histogram(metric);
    if histogram.is_empty() {
        return Vec::new();
    }
    let scale = metric.unit().scale();
    cdf_percents()
        .map(|pct| {
            let value = if pct == 0.0 {
                histogram.min()
            } else {
                histogram.value_at_quantile(pct / 100.0)
            };
            [value as f64 / scale, pct]
        })
        .collect()
}

/// RFC 3339 UTC timestamp with milliseconds (`2026-11-30T11:05:40.123Z`) of a Unix time in
/// microseconds, for [`RunInfo::started_at`].
pub fn rfc3339_utc(unix_us: u64) -> String {
    let total_ms = unix_us / 1_000;
    let date_time = common::civil::utc_date_time(total_ms / 1_000);
    format!("{date_time}.{:03}Z", total_ms % 1_000)
}

#[cfg(test)]
mod tests;
