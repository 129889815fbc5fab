//! `llm-replay recording stats FILE [--json]`: what a recording holds, before replaying it —
//! exchanges, span, arrival rate and burstiness, ISL/OSL distributions, families, models,
//! sessions, and the share of exchanges with frame timing. With `--tokenizer FILE`, ISL and OSL
//! of exchanges without usage are counted by the tokenizer, and the token sources' shares say
//! so.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use common::formats::{Family, request};
use common::measure::{
    OutcomeKind, TokenSource, measure_recorded_with, noted_outcome, recorded_family,
    recorded_input_tokens, recorded_output_length_with,
};
use common::metrics::{Stats, stats_of};
use common::recording::{RecordingError, RecordingReader};
use common::tokenizer::{Tokenizer, TokenizerError};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::Value;

/// `llm-replay recording ...`.
#[derive(Debug, Clone, clap::Args)]
pub struct RecordingArgs {
    #[command(subcommand)]
    pub command: RecordingCommand,
}

/// Subcommands of `llm-replay recording`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RecordingCommand {
    /// Summarise a recording: exchanges, arrival rate, burstiness, ISL/OSL, families, models.
    Stats(StatsArgs),
    /// Copy the exchanges one upstream served (`record` with several `--upstream` routes)
    /// into a recording of their own.
    Filter(crate::filter::FilterArgs),
}

/// `llm-replay recording stats` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct StatsArgs {
    /// Recording (.jsonl or .jsonl.gz).
    pub file: PathBuf,
    /// Print the statistics as JSON.
    #[arg(long)]
    pub json: bool,
    /// A Hugging Face tokenizer.json: count ISL and OSL with it where the recording has no
    /// usage report (a tokenizer_config.json beside it supplies the chat template).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
}

/// A problem computing a recording's statistics.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error("--tokenizer {0}")]
    Tokenizer(#[from] TokenizerError),
}

/// `recording stats` as its arguments ask: with the `--tokenizer` file loaded when given.
/// Every error is bad input (a usage error for the CLI).
pub fn stats_for_args(args: &StatsArgs) -> Result<RecordingStats, StatsError> {
    let tokenizer = args
        .tokenizer
        .as_deref()
        .map(Tokenizer::from_file)
        .transpose()?;
    Ok(recording_stats_with(&args.file, tokenizer.as_ref())?)
}

/// The statistics of one recording (the `--json` output).
#[derive(Debug, Clone, Serialize, Default)]
pub struct RecordingStats {
    pub file: String,
    pub exchanges: u64,
    /// Exchanges with an arrival offset (`at_ms`).
    pub with_arrival: u64,
    /// Last arrival − first arrival, seconds.
    pub duration_s: f64,
    /// Arrivals per second over the span (`(n − 1) / duration`).
    pub arrival_rate_per_s: f64,
    /// Coefficient of variation of the gaps between arrivals (1 = Poisson, > 1 bursty).
    pub burstiness_cv: f64,
    /// Most arrivals within any one second.
    pub peak_arrivals_per_s: u64,
    pub sessions: u64,
    pub with_response: u64,
    pub complete_responses: u64,
    /// Exchanges whose every response frame has an arrival offset.
    pub with_frame_timing: u64,
    pub frame_timing_share_pct: f64,
    /// Exchanges without frame timing whose import noted what their source measured (an
    /// OpenTelemetry span's first-token time, duration and output tokens): they are in the
    /// TTFT below and in a replay's baseline.
    pub with_source_timing: u64,
    /// The `--tokenizer` used ([`Tokenizer::describe`]), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Input tokens: server usage, else the import's note, else the `--tokenizer`'s count of
    /// the prompt, else a synthesised prompt's count, else characters / 4.
    pub isl_tokens: Option<Stats>,
    /// Where ISL values came from: `usage`, `source` (the import's note), `tokenizer`,
    /// `synth`, `estimate`.
    pub isl_sources: BTreeMap<&'static str, u64>,
    /// Output tokens: the recorded output length (`common::measure::recorded_output_length`:
    /// server usage, else the `--tokenizer`'s count of a complete answer's text, else its
    /// content frames, else what the import's source counted), else the request's max tokens;
    /// none for a failed exchange.
    pub osl_tokens: Option<Stats>,
    /// Where OSL values came from: `usage`, `tokenizer`, `frames`, `source`, `max_tokens`.
    pub osl_sources: BTreeMap<&'static str, u64>,
    /// Exchanges whose recorded client hung up mid-answer (`cancelled_as_recorded`).
    pub cancelled_as_recorded: u64,
    /// Recorded time to first token (exchanges with frame or source timing), ms.
    pub ttft_ms: Option<Stats>,
    pub families: BTreeMap<String, u64>,
    pub models: BTreeMap<String, u64>,
    /// Exchanges by the upstream that served them (`record` with several `--upstream`
    /// routes notes the route's name); absent when no exchange names one.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub upstreams: BTreeMap<String, u64>,
    pub statuses: BTreeMap<String, u64>,
    /// Line of a torn last line that was skipped, if any.
    pub torn_last_line: Option<u64>,
    /// The share of the traffic the recording holds, when its recorder sampled
    /// (`record --sample`).
    pub sample_share: Option<f64>,
    /// Gaps the recorder marked and the exchanges they left out (proxied, not recorded).
    pub gaps: u64,
    pub not_recorded: u64,
    /// Lines skipped for being longer than the reader's cap
    /// ([`common::recording::MAX_LINE_BYTES`]): not counted anywhere else here.
    pub skipped_long_lines: u64,
    /// The numbers of the first of those lines (at most
    /// [`common::recording::SKIPPED_LINE_NUMBERS_KEPT`]).
    pub skipped_long_line_numbers: Vec<u64>,
    /// Exchanges whose request body was stored cut (`request.truncated`: too large for one
    /// recording line); a replay sends the part that was kept.
    pub truncated_requests: u64,
    /// How far the lines are from `at_ms` order (a recording proxy writes exchanges as they
    /// complete, so long streams come after shorter ones that started later).
    pub order: ArrivalOrder,
}

/// How out of `at_ms` order a recording's lines are.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq)]
pub struct ArrivalOrder {
    /// Exchanges whose `at_ms` is earlier than that of a line before them.
    pub out_of_order: u64,
    /// Largest such gap: the latest earlier `at_ms` minus this one, ms.
    pub max_behind_ms: f64,
    /// Smallest `--reorder-window` (exchanges read ahead) that replays every exchange in
    /// `at_ms` order: the farthest any line sits after the first line scheduled later.
    pub window_needed: u64,
}

impl ArrivalOrder {
    /// Measure the order of `arrivals`, in file order.
    pub fn of(arrivals: &[f64]) -> ArrivalOrder {
        let mut order = ArrivalOrder::default();
        // Where the running maximum rose: (line index, new maximum), increasing in both, so
        // the first earlier line with a later `at_ms` is found by binary search.
        let mut rises: Vec<(usize, f64)> = Vec::new();
        for (i, &at) in arrivals.iter().enumerate() {
            match rises.last() {
                Some(&(_, max)) if at < max => {
                    order.out_of_order += 1;
                    order.max_behind_ms = order.max_behind_ms.max(max - at);
                    let first_later = rises.partition_point(|&(_, m)| m <= at);
                    let distance = (i - rises[first_later].0) as u64;
                    order.window_needed = order.window_needed.max(distance + 1);
                }
                Some(&(_, max)) if at == max => {}
                _ => rises.push((i, at)),
            }
        }
        order
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static bounds are valid")
}

/// Read `path` once and compute its statistics. A torn last line is reported in the result;
/// any other bad line is an error naming file, line and field.
pub fn recording_stats(path: &Path) -> Result<RecordingStats, RecordingError> {
    recording_stats_with(path, None)
}

/// [`recording_stats`], counting the tokens of exchanges without usage with `tokenizer`.
pub fn recording_stats_with(
    path: &Path,
    tokenizer: Option<&Tokenizer>,
) -> Result<RecordingStats, RecordingError> {
    let mut out = RecordingStats {
        file: path.display().to_string(),
        tokenizer: tokenizer.map(Tokenizer::describe),
        ..RecordingStats::default()
    };
    let mut arrivals: Vec<f64> = Vec::new();
    let mut sessions: HashSet<String> = HashSet::new();
    let mut isl = new_histogram();
    let mut osl = new_histogram();
    let mut ttft = new_histogram();
    let mut reader = RecordingReader::open(path)?;
    for item in reader.by_ref() {
        let (_, exchange) = item?;
        out.exchanges += 1;
        if exchange.request.unknown.get("truncated") == Some(&Value::Bool(true)) {
            out.truncated_requests += 1;
        }
        if let Some(at) = exchange.at_ms {
            arrivals.push(at);
        }
        if let Some(session) = &exchange.session {
            sessions.insert(session.clone());
        }
        let body: Option<Value> = serde_json::from_slice(&exchange.request.body_bytes()).ok();
        let model = request::model_of(&exchange.request.path, body.as_ref())
            .unwrap_or_else(|| "(none)".to_owned());
        *out.models.entry(model).or_default() += 1;
        if let Some(note) = exchange.upstream_note() {
            *out.upstreams.entry(note.name).or_default() += 1;
        }
        let family = recorded_family(&exchange);
        *out.families
            .entry(family.map_or("other", Family::name).to_owned())
            .or_default() += 1;

        // Measured once, as the baseline measures it (`None` without a response).
        let measured = measure_recorded_with(&exchange, tokenizer);
        if measured.is_some_and(|o| matches!(o.kind, OutcomeKind::Cancelled(_))) {
            out.cancelled_as_recorded += 1;
        }
        if let Some(response) = &exchange.response {
            out.with_response += 1;
            if response.complete {
                out.complete_responses += 1;
            }
            *out.statuses.entry(response.status.to_string()).or_default() += 1;
            if response.has_timing() {
                out.with_frame_timing += 1;
                if let Some(t) = measured.and_then(|o| o.ttft_us) {
                    let _ = ttft.record(t.max(1));
                }
            }
        }
        let answered = exchange
            .response
            .as_ref()
            .is_some_and(|r| (200..300).contains(&r.status));
        let usage_in = measured.filter(|_| answered).and_then(|o| o.input_tokens);
        if let Some(noted) = noted_outcome(&exchange) {
            out.with_source_timing += 1;
            if let Some(t) = noted.ttft_us {
                let _ = ttft.record(t.max(1));
            }
        }
        let noted_input = exchange.source_note().and_then(|note| note.input_tokens);
        let synth_in = exchange
            .unknown
            .get("synth")
            .and_then(|s| s.get("input_tokens"))
            .and_then(Value::as_u64);
        let (isl_value, isl_source) = match (usage_in.or(noted_input), synth_in) {
            (Some(n), _) if usage_in.is_some() => (Some(n), "usage"),
            (Some(n), _) => (Some(n), "source"),
            (None, synth) => match recorded_input_tokens(&exchange, tokenizer) {
                (Some(n), TokenSource::Tokenizer) => (Some(n), "tokenizer"),
                _ if synth.is_some() => (synth, "synth"),
                (estimate, _) => (estimate, "estimate"),
            },
        };
        if let Some(n) = isl_value {
            let _ = isl.record(n.max(1));
            *out.isl_sources.entry(isl_source).or_default() += 1;
        }
        // A failed exchange (a recorded 400, an error frame) generated nothing: it has no
        // output length, and its request's max_tokens says nothing about one.
        let failed = measured.is_some_and(|o| matches!(o.kind, OutcomeKind::Failed(_)));
        let osl_value = if failed {
            None
        } else if let Some(length) = recorded_output_length_with(&exchange, tokenizer) {
            Some((length.tokens, length.source.name()))
        } else {
            body.as_ref()
                .and_then(request::max_tokens)
                .map(|m| (m.value, "max_tokens"))
        };
        if let Some((n, source)) = osl_value {
            let _ = osl.record(n.max(1));
            *out.osl_sources.entry(source).or_default() += 1;
        }
    }
    out.torn_last_line = reader.torn_last_line();
    out.sample_share = reader.sample_share();
    out.gaps = reader.gaps().len() as u64;
    out.not_recorded = reader.gaps().iter().map(|g| g.exchanges).sum();
    out.skipped_long_lines = reader.skipped_lines();
    out.skipped_long_line_numbers = reader.skipped_line_numbers().to_vec();
    out.sessions = sessions.len() as u64;
    out.with_arrival = arrivals.len() as u64;
    if out.exchanges > 0 {
        out.frame_timing_share_pct = 100.0 * out.with_frame_timing as f64 / out.exchanges as f64;
    }
    out.order = ArrivalOrder::of(&arrivals);
    arrivals.sort_by(f64::total_cmp);
    if let (Some(first), Some(last)) = (arrivals.first(), arrivals.last()) {
        out.duration_s = (last - first) / 1000.0;
        if out.duration_s > 0.0 {
            out.arrival_rate_per_s = (arrivals.len() - 1) as f64 / out.duration_s;
        }
        let gaps: Vec<f64> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
        if !gaps.is_empty() {
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            if mean > 0.0 {
                out.burstiness_cv = var.sqrt() / mean;
            }
        }
        // Sliding one-second window over sorted arrivals.
        let mut start = 0;
        for (end, t) in arrivals.iter().enumerate() {
            while arrivals[start] <= t - 1000.0 {
                start += 1;
            }
            out.peak_arrivals_per_s = out.peak_arrivals_per_s.max((end - start + 1) as u64);
        }
    }
    out.isl_tokens = stats_of(&isl, 1.0);
    out.osl_tokens = stats_of(&osl, 1.0);
    out.ttft_ms = stats_of(&ttft, 1000.0);
    Ok(out)
}

fn render_stats_row(name: &str, stats: &Option<Stats>, unit: &str) -> String {
    match stats {
        Some(s) => format!(
            "  {name:<10} p50 {:>9.1}  p90 {:>9.1}  p99 {:>9.1}  avg {:>9.1}  min {:>7.1}  max {:>9.1}  {unit} (n={})\n",
            s.p50, s.p90, s.p99, s.avg, s.min, s.max, s.count
        ),
        None => format!("  {name:<10} (none)\n"),
    }
}

fn render_counts(map: &BTreeMap<String, u64>, limit: usize) -> String {
    if map.is_empty() {
        return "(none)".to_owned();
    }
    let mut items: Vec<(&String, &u64)> = map.iter().collect();
    items.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut parts: Vec<String> = items
        .iter()
        .take(limit)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if items.len() > limit {
        parts.push(format!("… {} more", items.len() - limit));
    }
    parts.join(", ")
}

/// The terminal rendering of [`RecordingStats`].
pub fn render_text(s: &RecordingStats) -> String {
    let mut out = String::new();
    out.push_str(&format!("recording  {}\n", s.file));
    out.push_str(&format!(
        "exchanges  {}  (sessions {}, with arrival times {}, with responses {}, complete {})\n",
        s.exchanges, s.sessions, s.with_arrival, s.with_response, s.complete_responses
    ));
    out.push_str(&format!(
        "duration   {:.3} s   arrival rate {:.3}/s   burstiness (CV of gaps) {:.2}   peak {}/s\n",
        s.duration_s, s.arrival_rate_per_s, s.burstiness_cv, s.peak_arrivals_per_s
    ));
    out.push_str(&format!(
        "frame timing  {} of {} exchanges ({:.1} %)",
        s.with_frame_timing, s.exchanges, s.frame_timing_share_pct
    ));
    if s.with_source_timing > 0 {
        out.push_str(&format!(
            "   timed by their source (spans): {}",
            s.with_source_timing
        ));
    }
    out.push('\n');
    out.push_str("distributions\n");
    out.push_str(&render_stats_row("ISL", &s.isl_tokens, "tokens"));
    out.push_str(&render_stats_row("OSL", &s.osl_tokens, "tokens"));
    out.push_str(&render_stats_row("TTFT", &s.ttft_ms, "ms"));
    let sources = |m: &BTreeMap<&'static str, u64>| {
        let total: u64 = m.values().sum();
        m.iter()
            .map(|(k, v)| format!("{k} {v} ({:.1} %)", 100.0 * *v as f64 / total.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push_str(&format!(
        "  ISL from {}; OSL from {}\n",
        sources(&s.isl_sources),
        sources(&s.osl_sources)
    ));
    if let Some(tokenizer) = &s.tokenizer {
        out.push_str(&format!("  tokenizer {tokenizer}\n"));
    }
    if s.cancelled_as_recorded > 0 {
        out.push_str(&format!(
            "  cancelled by their client (as recorded): {}\n",
            s.cancelled_as_recorded
        ));
    }
    out.push_str(&format!("families   {}\n", render_counts(&s.families, 8)));
    out.push_str(&format!("models     {}\n", render_counts(&s.models, 8)));
    if !s.upstreams.is_empty() {
        out.push_str(&format!("upstreams  {}\n", render_counts(&s.upstreams, 8)));
    }
    out.push_str(&format!("statuses   {}\n", render_counts(&s.statuses, 8)));
    if s.order.out_of_order > 0 {
        out.push_str(&format!(
            "order      {} exchanges out of at_ms order (at most {:.1} ms behind); the replay needs --reorder-window {} or more (default {})\n",
            s.order.out_of_order,
            s.order.max_behind_ms,
            s.order.window_needed,
            common::replay::DEFAULT_REORDER_WINDOW
        ));
    } else if s.with_arrival > 0 {
        out.push_str("order      every line in at_ms order\n");
    }
    if let Some(line) = s.torn_last_line {
        out.push_str(&format!("torn last line {line} (not counted)\n"));
    }
    if let Some(share) = s.sample_share {
        out.push_str(&format!(
            "sampled    the recording holds {} % of the traffic (record --sample)\n",
            (share * 100_000.0).round() / 1000.0
        ));
    }
    if s.gaps > 0 {
        out.push_str(&format!(
            "gaps       {} exchanges proxied but not recorded ({} gaps marked)\n",
            s.not_recorded, s.gaps
        ));
    }
    if s.skipped_long_lines > 0 {
        let lines: Vec<String> = s
            .skipped_long_line_numbers
            .iter()
            .map(u64::to_string)
            .collect();
        let more = if s.skipped_long_lines > s.skipped_long_line_numbers.len() as u64 {
            ", …"
        } else {
            ""
        };
        out.push_str(&format!(
            "skipped    {} line{} over {} bytes (not counted, not replayed): line {}{more}\n",
            s.skipped_long_lines,
            if s.skipped_long_lines == 1 { "" } else { "s" },
            common::recording::MAX_LINE_BYTES,
            lines.join(", ")
        ));
    }
    if s.truncated_requests > 0 {
        out.push_str(&format!(
            "truncated  {} request bodies stored cut (too large for one line); a replay sends what was kept\n",
            s.truncated_requests
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_order_measures_how_far_lines_sit_out_of_order() {
        assert_eq!(
            ArrivalOrder::of(&[0.0, 1.0, 1.0, 2.0]),
            ArrivalOrder::default()
        );
        // A proxy's file: the stream started at 0 ended last, after three later starts.
        let order = ArrivalOrder::of(&[100.0, 200.0, 300.0, 0.0, 400.0, 250.0]);
        assert_eq!(order.out_of_order, 2);
        assert!((order.max_behind_ms - 300.0).abs() < 1e-9);
        // Line 3 (at 0) must be read before line 0 (at 100) is sent: 4 lines ahead.
        assert_eq!(order.window_needed, 4);
    }

    #[test]
    fn arrivals_tokens_and_a_torn_last_line() {
        let dir = std::env::temp_dir().join(format!("llm-replay-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("r.jsonl");
        let mut text = String::new();
        for (i, at) in [0.0, 100.0, 200.0, 1300.0].iter().enumerate() {
            let body = serde_json::json!({"model": if i == 0 { "a" } else { "b" }, "max_tokens": 10 * (i + 1),
                "messages": [{"role": "user", "content": "x".repeat(40)}]});
            let line = serde_json::json!({"at_ms": at, "session": format!("s{}", i % 2),
                "request": {"path": "/v1/chat/completions", "body": body.to_string()}});
            text.push_str(&format!("{line}\n"));
        }
        text.push_str("{\"request\":{\"pa");
        std::fs::write(&path, text).expect("write");
        let s = recording_stats(&path).expect("stats");
        assert_eq!(s.exchanges, 4);
        assert_eq!(s.torn_last_line, Some(5));
        assert_eq!(s.sessions, 2);
        assert!((s.duration_s - 1.3).abs() < 1e-9);
        assert!((s.arrival_rate_per_s - 3.0 / 1.3).abs() < 1e-9);
        assert_eq!(s.peak_arrivals_per_s, 3);
        // Gaps 100, 100, 1100: mean 433.3, std 471.4.
        assert!(
            (s.burstiness_cv - 1.088).abs() < 0.001,
            "{}",
            s.burstiness_cv
        );
        let isl = s.isl_tokens.expect("isl");
        assert_eq!((isl.min, isl.max), (10.0, 10.0));
        let osl = s.osl_tokens.expect("osl");
        assert_eq!((osl.min, osl.max, osl.count), (10.0, 40.0, 4));
        assert_eq!(s.osl_sources.get("max_tokens"), Some(&4));
        assert_eq!(s.models.get("b"), Some(&3));
        assert_eq!(s.families.get("openai-chat"), Some(&4));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A recorded 400 has no output length: its request's max_tokens is not counted in OSL
    /// (it was, as 4096 tokens beside the real answers').
    #[test]
    fn a_failed_exchange_has_no_output_length() {
        let dir = std::env::temp_dir().join(format!("llm-replay-stats-400-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("r.jsonl");
        let body = serde_json::json!({"model": "nope", "max_tokens": 4096,
            "messages": [{"role": "user", "content": "hi"}]});
        let failed = serde_json::json!({"at_ms": 0.0,
            "request": {"path": "/v1/chat/completions", "body": body.to_string()},
            "response": {"status": 400, "headers": {"content-type": "application/json"},
                "frames": [{"t_ms": 5.0, "data": "{\"error\":{\"message\":\"Invalid model name\"}}"}],
                "complete": true}});
        let ok_body = serde_json::json!({"model": "m", "max_tokens": 7,
            "messages": [{"role": "user", "content": "hi"}]});
        let ok = serde_json::json!({"at_ms": 10.0,
            "request": {"path": "/v1/chat/completions", "body": ok_body.to_string()}});
        std::fs::write(&path, format!("{failed}\n{ok}\n")).expect("write");
        let s = recording_stats(&path).expect("stats");
        assert_eq!(s.exchanges, 2);
        let osl = s.osl_tokens.expect("osl");
        assert_eq!((osl.min, osl.max, osl.count), (7.0, 7.0, 1), "{osl:?}");
        assert_eq!(s.osl_sources.get("max_tokens"), Some(&1));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The OSL of `recording stats` is the recorded output length `--pin-output-length` asks
    /// for and `export` writes: what an imported span counted beats the request's max_tokens,
    /// and a complete stream without usage counts its content frames.
    #[test]
    fn the_output_length_is_the_recorded_one_before_max_tokens() {
        let dir = std::env::temp_dir().join(format!("llm-replay-stats-osl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("r.jsonl");
        let body = serde_json::json!({"model": "m", "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}]});
        let span = serde_json::json!({"at_ms": 0.0,
            "request": {"path": "/v1/chat/completions", "body": body.to_string()},
            "source": {"format": "otel-genai", "line": 1, "output_tokens": 37}});
        let frame = |t: f64, data: &str| serde_json::json!({"t_ms": t, "data": data});
        let stream = serde_json::json!({"at_ms": 5.0,
            "request": {"path": "/v1/chat/completions", "body": body.to_string()},
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                "frames": [
                    frame(1.0, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"),
                    frame(2.0, "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n"),
                    frame(3.0, "data: [DONE]\n\n")],
                "complete": true}});
        std::fs::write(&path, format!("{span}\n{stream}\n")).expect("write");
        let s = recording_stats(&path).expect("stats");
        let osl = s.osl_tokens.expect("osl");
        assert_eq!((osl.min, osl.max, osl.count), (2.0, 37.0, 2), "{osl:?}");
        assert_eq!(s.osl_sources.get("source"), Some(&1));
        assert_eq!(s.osl_sources.get("frames"), Some(&1));
        assert_eq!(s.osl_sources.get("max_tokens"), None);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_tokenizer_counts_isl_and_osl_without_usage_and_the_sources_say_so() {
        let dir = std::env::temp_dir().join(format!("llm-replay-stats-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("r.jsonl");
        let frame = |t: f64, data: &str| serde_json::json!({"t_ms": t, "data": data});
        let body = serde_json::json!({"stream": true,
            "messages": [{"role": "user", "content": "Hello, world!"}]})
        .to_string();
        let stream = serde_json::json!({"at_ms": 0.0,
            "request": {"path": "/v1/chat/completions", "body": body},
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                "frames": [
                    frame(10.0, "data: {\"choices\":[{\"delta\":{\"content\":\"Hello,\"}}]}\n\n"),
                    frame(20.0, "data: {\"choices\":[{\"delta\":{\"content\":\" world!\"}}]}\n\n"),
                    frame(30.0, "data: [DONE]\n\n")],
                "complete": true}});
        let cancelled = serde_json::json!({"at_ms": 5.0,
            "request": {"path": "/v1/chat/completions", "body": body},
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                "frames": [frame(10.0, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n")],
                "complete": false, "ended": "client disconnected"}});
        std::fs::write(&path, format!("{stream}\n{cancelled}\n")).expect("write");
        let tokenizer_path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer.json");
        let args = StatsArgs {
            file: path.clone(),
            json: true,
            tokenizer: Some(tokenizer_path),
        };
        let s = stats_for_args(&args).expect("stats");
        // "Hello, world!": 4 tokens (Python `tokenizers`), streamed in 2 frames.
        let osl = s.osl_tokens.as_ref().expect("osl");
        assert_eq!((osl.min, osl.max, osl.count), (4.0, 4.0, 1), "{osl:?}");
        assert_eq!(s.osl_sources.get("tokenizer"), Some(&1));
        assert_eq!(s.osl_sources.get("frames"), None);
        let isl = s.isl_tokens.as_ref().expect("isl");
        assert_eq!((isl.min, isl.max, isl.count), (4.0, 4.0, 2), "{isl:?}");
        assert_eq!(s.isl_sources.get("tokenizer"), Some(&2));
        assert_eq!(s.cancelled_as_recorded, 1);
        assert!(
            s.tokenizer
                .as_deref()
                .is_some_and(|t| t.contains("tokenizer.json"))
        );
        let text = render_text(&s);
        assert!(text.contains("OSL from tokenizer 1 (100.0 %)"), "{text}");
        assert!(
            text.contains("cancelled by their client (as recorded): 1"),
            "{text}"
        );
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["osl_sources"]["tokenizer"], 1);

        let without = recording_stats(&path).expect("stats");
        assert_eq!(without.osl_sources.get("frames"), Some(&1));
        assert_eq!(without.isl_sources.get("estimate"), Some(&2));

        let missing = StatsArgs {
            tokenizer: Some(dir.join("nope.json")),
            ..args
        };
        let error = stats_for_args(&missing)
            .expect_err("no such file")
            .to_string();
        assert!(
            error.contains("--tokenizer") && error.contains("nope.json"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
