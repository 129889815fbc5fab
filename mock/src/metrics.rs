//! `GET /metrics`: the mock's own state in the Prometheus text exposition format (0.0.4), under
//! vLLM's metric names, so a test can compare what a client measured with what the server
//! did, exactly — these are counts and clock readings of the mock itself, not estimates.
//!
//! Every number is kept per model name (the request's `model`, else the Bedrock path's, else
//! `mock-model`; at most [`MAX_MODEL_NAMES`] names, later ones folded into `other`), as vLLM
//! labels its series `model_name`. The hot path is atomics: a stream takes its model's
//! [`ModelSeries`] once, on arrival (one short lock over a list of at most 17 names), then
//! each handed frame is one `fetch_add`; the two histograms are observed once per request
//! under their own short mutex (never held across an await), so a scrape reads each one
//! whole: its `+Inf` bucket always equals its count.
//!
//! When things count:
//! - *waiting*: from the moment a request finds every `--max-streams` slot taken until it gets
//!   one (or its client leaves); never without a cap.
//! - *running*: from the moment a request holds a slot (at once without a cap) until its last
//!   frame is handed to hyper, or its body is dropped (a cut, a client gone, shutdown).
//! - *generation tokens*: as each frame is handed to hyper to write, that frame's content
//!   tokens (synthetic: one per token frame; a whole body: all of them; recorded: the frame's
//!   share of the recorded usage, see [`recorded_frame_tokens`]).
//! - *TTFT*: arrival (the head reached the service, before reading the body or queueing) →
//!   hand-over of the first frame carrying a token. *Prompt tokens* count at the same moment
//!   (vLLM counts them when prefill is done), or at the end of a stream that had no token.
//! - *success* and *e2e latency*: when the last frame of a stream that ends normally (no
//!   injected cut, no error frame, a 2xx status) is handed over: arrival → that instant.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::formats::{self, Event, Family, StreamParser};
use common::recording::Exchange;

/// Distinct `model_name` label values kept; later models share the series `other`.
pub(crate) const MAX_MODEL_NAMES: usize = 16;

/// The model name of requests that name none (the mock's own `/v1/models` id).
pub(crate) const DEFAULT_MODEL: &str = "mock-model";

/// The content type of the exposition format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// vLLM's bucket bounds of `vllm:time_to_first_token_seconds`.
const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's bucket bounds of `vllm:e2e_request_latency_seconds`.
const E2E_BOUNDS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Why a stream finished, as vLLM labels `request_success_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FinishedReason {
    Stop,
    Length,
}

/// The server's metrics: one [`ModelSeries`] per model name seen.
pub(crate) struct Metrics {
    /// `--max-streams`, for the KV-cache stand-in.
    max_streams: Option<usize>,
    series: Mutex<Vec<Arc<ModelSeries>>>,
}

/// Every series of one `model_name`.
pub(crate) struct ModelSeries {
    name: String,
    running: AtomicU64,
    waiting: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    success_stop: AtomicU64,
    success_length: AtomicU64,
    ttft: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
}

/// A histogram's per-bucket (not cumulative) counts, its sum and count.
struct Histogram {
    bounds: &'static [f64],
    /// One more than `bounds`: the last is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        let bucket = self
            .bounds
            .iter()
            .position(|&le| seconds <= le)
            .unwrap_or(self.bounds.len());
        self.counts[bucket] += 1;
        self.sum += seconds;
        self.count += 1;
    }
}

impl Metrics {
    pub(crate) fn new(max_streams: Option<usize>) -> Metrics {
        Metrics {
            max_streams,
            // The default model is there from the start, so a scrape before any request
            // already shows the gauges (as vLLM's do for its one model).
            series: Mutex::new(vec![Arc::new(ModelSeries::new(DEFAULT_MODEL))]),
        }
    }

    /// The series of `model` (created on first sight; past [`MAX_MODEL_NAMES`], `other`).
    pub(crate) fn series(&self, model: &str) -> Arc<ModelSeries> {
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = series.iter().find(|s| s.name == model) {
            return Arc::clone(found);
        }
        let name = if series.len() < MAX_MODEL_NAMES {
            model
        } else {
            "other"
        };
        if let Some(found) = series.iter().find(|s| s.name == name) {
            return Arc::clone(found);
        }
        let created = Arc::new(ModelSeries::new(name));
        series.push(Arc::clone(&created));
        created
    }

    /// The exposition text of every family.
    pub(crate) fn render(&self) -> String {
        let series: Vec<Arc<ModelSeries>> = self
            .series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut out = String::with_capacity(4096 + series.len() * 4096);
        let labels: Vec<String> = series
            .iter()
            .map(|s| format!("model_name=\"{}\"", escape_label(&s.name)))
            .collect();
        let gauge =
            |out: &mut String, name: &str, help: &str, value: &dyn Fn(&ModelSeries) -> f64| {
                family_head(out, name, help, "gauge");
                for (s, l) in series.iter().zip(&labels) {
                    let _ = writeln!(out, "{name}{{{l}}} {}", number(value(s)));
                }
            };
        let counter =
            |out: &mut String, name: &str, help: &str, value: &dyn Fn(&ModelSeries) -> u64| {
                family_head(out, name, help, "counter");
                for (s, l) in series.iter().zip(&labels) {
                    let _ = writeln!(out, "{name}{{{l}}} {}", value(s));
                }
            };
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            &|s| s.running.load(Ordering::SeqCst) as f64,
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            &|s| s.waiting.load(Ordering::SeqCst) as f64,
        );
        // The mock has no KV cache: this is the share of `--max-streams` slots in use
        // (running ÷ max-streams), and 0 without a cap.
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage. (llm-replay mock: --max-streams slot occupancy.)",
            &|s| match self.max_streams {
                Some(max) if max > 0 => s.running.load(Ordering::SeqCst) as f64 / max as f64,
                _ => 0.0,
            },
        );
        counter(
            &mut out,
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine. (llm-replay mock: never preempts.)",
            &|_| 0,
        );
        counter(
            &mut out,
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            &|s| s.prompt_tokens.load(Ordering::SeqCst),
        );
        counter(
            &mut out,
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            &|s| s.generation_tokens.load(Ordering::SeqCst),
        );
        family_head(
            &mut out,
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            "counter",
        );
        for (s, l) in series.iter().zip(&labels) {
            for (reason, value) in [("length", &s.success_length), ("stop", &s.success_stop)] {
                let _ = writeln!(
                    out,
                    "vllm:request_success_total{{finished_reason=\"{reason}\",{l}}} {}",
                    value.load(Ordering::SeqCst)
                );
            }
        }
        let histogram = |out: &mut String,
                         name: &str,
                         help: &str,
                         of: &dyn Fn(&ModelSeries) -> &Mutex<Histogram>| {
            family_head(out, name, help, "histogram");
            for (s, l) in series.iter().zip(&labels) {
                let (bounds, counts, sum, count) = {
                    let h = of(s).lock().unwrap_or_else(|p| p.into_inner());
                    (h.bounds, h.counts.clone(), h.sum, h.count)
                };
                let mut cumulative = 0;
                for (i, n) in counts.iter().enumerate() {
                    cumulative += n;
                    let le = bounds
                        .get(i)
                        .map_or_else(|| "+Inf".to_owned(), |b| number(*b));
                    let _ = writeln!(out, "{name}_bucket{{le=\"{le}\",{l}}} {cumulative}");
                }
                let _ = writeln!(out, "{name}_sum{{{l}}} {}", number(sum));
                let _ = writeln!(out, "{name}_count{{{l}}} {count}");
            }
        };
        histogram(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds. (llm-replay mock: request head arrival to the hand-over of the first token's frame.)",
            &|s| &s.ttft,
        );
        histogram(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds. (llm-replay mock: request head arrival to the hand-over of the last frame.)",
            &|s| &s.e2e,
        );
        out
    }
}

impl ModelSeries {
    fn new(name: &str) -> ModelSeries {
        ModelSeries {
            name: name.to_owned(),
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            success_stop: AtomicU64::new(0),
            success_length: AtomicU64::new(0),
            ttft: Mutex::new(Histogram::new(TTFT_BOUNDS)),
            e2e: Mutex::new(Histogram::new(E2E_BOUNDS)),
        }
    }

    /// Count a request waiting for a slot until the guard drops.
    pub(crate) fn wait(self: &Arc<Self>) -> WaitingGuard {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        WaitingGuard(Arc::clone(self))
    }
}

/// Counts one waiting request while it lives.
pub(crate) struct WaitingGuard(Arc<ModelSeries>);

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a synthetic stream's tokens fall on its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// One token per frame.
    OnePerFrame,
    /// Every `n`-th token frame carries two tokens.
    PairEvery(u64),
}

impl Grouping {
    /// Tokens carried by token frame `k` (0-based, token frames only) of a stream of
    /// `tokens`; 0 past its last.
    pub(crate) fn tokens_of(self, k: u64, tokens: u64) -> u64 {
        let (before, wanted) = match self {
            Grouping::OnePerFrame => (k, 1),
            Grouping::PairEvery(n) => (k + k / n, 1 + u64::from((k + 1).is_multiple_of(n))),
        };
        tokens.saturating_sub(before).min(wanted)
    }
}

/// Which frames of a response carry how many content tokens.
#[derive(Debug, Clone)]
pub(crate) enum FrameTokens {
    /// Frames `start..start + count` carry one token each (a synthetic stream).
    OnePerFrame { start: usize, count: usize },
    /// Frame `index` carries `tokens` (a whole body).
    One { index: usize, tokens: u64 },
    /// Frames from `start` on carry `tokens` as `grouping` puts them (a synthetic stream
    /// with `--tokenizer`).
    Grouped {
        start: usize,
        tokens: u64,
        grouping: Grouping,
    },
    /// Per frame, as counted in a recorded response.
    Listed(Arc<[u64]>),
}

impl FrameTokens {
    pub(crate) fn of(&self, index: usize) -> u64 {
        match self {
            FrameTokens::OnePerFrame { start, count } => {
                u64::from(index >= *start && index - start < *count)
            }
            FrameTokens::One { index: at, tokens } => {
                if index == *at {
                    *tokens
                } else {
                    0
                }
            }
            FrameTokens::Grouped {
                start,
                tokens,
                grouping,
            } => match index.checked_sub(*start) {
                Some(k) => grouping.tokens_of(k as u64, *tokens),
                None => 0,
            },
            FrameTokens::Listed(list) => list.get(index).copied().unwrap_or(0),
        }
    }
}

/// What one response's metrics need; played by its body as frames are handed over.
pub(crate) struct StreamMetrics {
    series: Arc<ModelSeries>,
    arrival: Instant,
    tokens: FrameTokens,
    prompt_tokens: u64,
    finished: FinishedReason,
    /// Counts as a success (and an e2e latency) if it ends normally.
    success: bool,
    first_token_seen: bool,
    /// Still counted in `running`.
    running: bool,
}

impl StreamMetrics {
    /// The request now holds a slot (or there is no cap): count it running.
    pub(crate) fn start(
        series: Arc<ModelSeries>,
        arrival: Instant,
        prompt_tokens: u64,
        tokens: FrameTokens,
        finished: FinishedReason,
        success: bool,
    ) -> StreamMetrics {
        series.running.fetch_add(1, Ordering::SeqCst);
        StreamMetrics {
            series,
            arrival,
            tokens,
            prompt_tokens,
            finished,
            success,
            first_token_seen: false,
            running: true,
        }
    }

    /// Frame `index` was handed to hyper at `now`; `last` when the body ends with it.
    pub(crate) fn frame_handed(&mut self, index: usize, now: Instant, last: bool) {
        let tokens = self.tokens.of(index);
        if tokens > 0 {
            self.series
                .generation_tokens
                .fetch_add(tokens, Ordering::SeqCst);
            if !self.first_token_seen {
                self.first_token_seen = true;
                self.series
                    .prompt_tokens
                    .fetch_add(self.prompt_tokens, Ordering::SeqCst);
                let ttft = now.saturating_duration_since(self.arrival).as_secs_f64();
                self.series
                    .ttft
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .observe(ttft);
            }
        }
        if last {
            self.ended(now);
        }
    }

    /// The body ended normally at `now` (its last frame handed, or it had none).
    pub(crate) fn ended(&mut self, now: Instant) {
        if !self.running {
            return;
        }
        self.stop_running();
        if !self.first_token_seen {
            self.first_token_seen = true;
            self.series
                .prompt_tokens
                .fetch_add(self.prompt_tokens, Ordering::SeqCst);
        }
        if self.success {
            let counter = match self.finished {
                FinishedReason::Stop => &self.series.success_stop,
                FinishedReason::Length => &self.series.success_length,
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let e2e = now.saturating_duration_since(self.arrival).as_secs_f64();
            self.series
                .e2e
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .observe(e2e);
        }
    }

    fn stop_running(&mut self) {
        if self.running {
            self.running = false;
            self.series.running.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for StreamMetrics {
    /// A body dropped before its end (a cut, the client gone, shutdown) stops running.
    fn drop(&mut self) {
        self.stop_running();
    }
}

/// How each family says a stream stopped at its length limit (compact JSON, as servers send
/// it).
const LENGTH_MARKERS: &[&[u8]] = &[
    br#""finish_reason":"length""#,
    br#""done_reason":"length""#,
    br#""stop_reason":"max_tokens""#,
    br#""stopReason":"max_tokens""#,
];

/// How a recorded response's content tokens fall on its frames, and what it reports.
#[derive(Debug, Clone)]
pub(crate) struct RecordedTokens {
    /// Tokens per recorded frame.
    pub(crate) per_frame: Arc<[u64]>,
    /// The recorded usage's input tokens, if it reported them.
    pub(crate) prompt_tokens: Option<u64>,
    /// The recorded answer stopped at its length limit (as far as it says).
    pub(crate) finished: FinishedReason,
}

/// Where a recorded response's tokens are: each frame's content frames (parsed by the
/// family's own parser, frame by frame, as a client reads them), scaled to the recorded usage's
/// output tokens when it has them (cumulatively, so the shares add up exactly; a usage report
/// with no content frame puts them all on the last frame), else one token per content frame.
/// A response that is one body carries all its tokens on its last frame.
pub(crate) fn recorded_frame_tokens(exchange: &Exchange) -> RecordedTokens {
    let Some(response) = &exchange.response else {
        return RecordedTokens {
            per_frame: Arc::from(Vec::new()),
            prompt_tokens: None,
            finished: FinishedReason::Stop,
        };
    };
    let n = response.frames.len();
    let measured = common::measure::measure_recorded(exchange);
    let prompt_tokens = measured.and_then(|m| m.input_tokens);
    let path = exchange.request.path.as_str();
    let content_type = response.header("content-type");
    let first = response.frames.first().map(|f| f.bytes());
    let first: &[u8] = first.as_deref().unwrap_or_default();
    let body = exchange.request.body_bytes();
    let streamed = formats::response_is_streamed(path, content_type, &body, first);
    let mut finished = FinishedReason::Stop;
    let mut per_frame = vec![0u64; n];
    if !streamed || n == 0 {
        if let (Some(last), Some(m)) = (per_frame.last_mut(), measured) {
            *last = m.output_tokens();
        }
    } else {
        let family = formats::detect(path, content_type, first).unwrap_or(Family::OpenAiChat);
        let mut parser = StreamParser::new(family);
        let mut content = vec![0u64; n];
        let mut usage_output = None;
        for (i, frame) in response.frames.iter().enumerate() {
            let bytes = frame.bytes();
            let fed = parser.feed(&bytes, &mut |event| match event {
                Event::Content { .. } => content[i] += 1,
                Event::Usage(usage) if usage.output_tokens.is_some() => {
                    usage_output = usage.output_tokens;
                }
                _ => {}
            });
            if fed.is_err() {
                break;
            }
            if LENGTH_MARKERS
                .iter()
                .any(|m| bytes.windows(m.len()).any(|w| w == *m))
            {
                finished = FinishedReason::Length;
            }
        }
        let frames_total: u64 = content.iter().sum();
        match usage_output {
            Some(total) if frames_total == 0 => {
                if let Some(last) = per_frame.last_mut() {
                    *last = total;
                }
            }
            Some(total) => {
                let mut seen = 0u64;
                let mut given = 0u64;
                for (i, c) in content.iter().enumerate() {
                    seen += c;
                    let due =
                        (u128::from(total) * u128::from(seen) / u128::from(frames_total)) as u64;
                    per_frame[i] = due - given;
                    given = due;
                }
            }
            None => per_frame = content,
        }
    }
    RecordedTokens {
        per_frame: Arc::from(per_frame),
        prompt_tokens,
        finished,
    }
}

fn family_head(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A sample value or bucket bound as vLLM's Python client writes it (`1.0`, `0.001`).
fn number(value: f64) -> String {
    if value.is_finite() && value == value.trunc() && value.abs() < 1e15 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

/// A label value escaped for the exposition format (`\\`, `\"`, `\n`).
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The exact text of one stream's metrics: two tokens, the first 30 ms after arrival,
    /// the last at 600 ms, under a cap of 2 slots.
    #[test]
    fn renders_vllm_names_and_python_client_numbers() {
        let metrics = Metrics::new(Some(2));
        let series = metrics.series("m");
        let arrival = Instant::now();
        let mut stream = StreamMetrics::start(
            Arc::clone(&series),
            arrival,
            7,
            FrameTokens::OnePerFrame { start: 1, count: 2 },
            FinishedReason::Length,
            true,
        );
        let text = metrics.render();
        assert!(
            text.contains("vllm:num_requests_running{model_name=\"m\"} 1.0\n"),
            "{text}"
        );
        assert!(
            text.contains("vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n"),
            "{text}"
        );
        stream.frame_handed(0, arrival, false);
        stream.frame_handed(1, arrival + Duration::from_millis(30), false);
        stream.frame_handed(2, arrival + Duration::from_millis(40), false);
        stream.frame_handed(3, arrival + Duration::from_millis(600), true);
        drop(stream);
        let text = metrics.render();
        for line in [
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            "vllm:prompt_tokens_total{model_name=\"m\"} 7",
            "vllm:generation_tokens_total{model_name=\"m\"} 2",
            "vllm:generation_tokens_total{model_name=\"mock-model\"} 0",
            "vllm:num_requests_running{model_name=\"m\"} 0.0",
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"m\"} 1",
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\"} 0",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            "vllm:time_to_first_token_seconds_bucket{le=\"0.02\",model_name=\"m\"} 0",
            "vllm:time_to_first_token_seconds_bucket{le=\"0.04\",model_name=\"m\"} 1",
            "vllm:time_to_first_token_seconds_bucket{le=\"2560.0\",model_name=\"m\"} 1",
            "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 1",
            "vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.03",
            "vllm:time_to_first_token_seconds_count{model_name=\"m\"} 1",
            "vllm:e2e_request_latency_seconds_bucket{le=\"0.5\",model_name=\"m\"} 0",
            "vllm:e2e_request_latency_seconds_bucket{le=\"0.8\",model_name=\"m\"} 1",
            "vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 0.6",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn a_dropped_stream_stops_running_without_success() {
        let metrics = Metrics::new(None);
        let series = metrics.series("m");
        let arrival = Instant::now();
        let mut stream = StreamMetrics::start(
            Arc::clone(&series),
            arrival,
            3,
            FrameTokens::OnePerFrame { start: 0, count: 4 },
            FinishedReason::Stop,
            true,
        );
        stream.frame_handed(0, arrival + Duration::from_millis(5), false);
        assert_eq!(series.running.load(Ordering::SeqCst), 1);
        drop(stream);
        assert_eq!(series.running.load(Ordering::SeqCst), 0);
        assert_eq!(series.generation_tokens.load(Ordering::SeqCst), 1);
        assert_eq!(series.success_stop.load(Ordering::SeqCst), 0);
        assert_eq!(series.e2e.lock().expect("histogram").count, 0);
        assert_eq!(series.ttft.lock().expect("histogram").count, 1);
    }
}
