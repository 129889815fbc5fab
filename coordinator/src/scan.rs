//! The pre-scan of a recording: validates every line (so bad input fails before any load is
//! sent), counts exchanges and sessions, and measures the baseline from the recorded frames
//! with the same [`common::measure`] code the workers use; an imported exchange without frames
//! whose source measured it (an OpenTelemetry span's first-token time, duration and usage)
//! enters the baseline with those numbers ([`common::measure::noted_outcome`]). With the run's
//! `--tokenizer`, recorded answers without usage are counted by it, as the replay counts its
//! own.

use std::collections::BTreeMap;
use std::path::Path;

use common::measure::{noted_outcome, recorded_family, recorded_outcome};
use common::metrics::{RunMetrics, Stats};
use common::recording::{RecordingError, RecordingReader};
use common::tokenizer::Tokenizer;

use crate::sessions::{SessionSample, ThinkTimes};

/// What the coordinator knows about a recording before replaying it.
#[derive(Debug, Clone, Default)]
pub struct RecordingScan {
    pub exchanges: u64,
    /// Exchanges with an arrival offset.
    pub with_arrival: u64,
    /// Largest arrival offset (ms).
    pub max_at_ms: f64,
    /// Distinct sessions.
    pub sessions: u64,
    /// Exchanges whose response frames all have timing (they make the baseline).
    pub with_frame_timing: u64,
    /// Exchanges without frame timing whose import noted what the source measured (TTFT,
    /// duration, output tokens): they make the baseline too.
    pub with_source_timing: u64,
    /// The recording's own metrics, measured from its frames; `None` without frame timing.
    pub baseline: Option<RunMetrics>,
    /// Families seen, by name.
    pub families: BTreeMap<&'static str, u64>,
    /// A torn last line that was skipped (reported, not fatal).
    pub torn_last_line: Option<u64>,
    /// Lines over the reader's length cap, skipped (reported, not fatal), and the first few
    /// of their line numbers.
    pub skipped_long_lines: u64,
    pub skipped_long_line_numbers: Vec<u64>,
    /// The share of the traffic the recording holds, when its recorder sampled
    /// (`record --sample`: each file's header says).
    pub sample_share: Option<f64>,
    /// Gaps the recorder marked (exchanges proxied but not recorded) and how many exchanges
    /// they left out.
    pub gaps: u64,
    pub not_recorded: u64,
    /// Recorded think times between a session's turns (ms), when any.
    pub think_time_ms: Option<Stats>,
    /// First `at_ms` to the end of the last exchange's last frame (ms), when timed.
    pub span_ms: Option<f64>,
}

/// Scan `path`. Any invalid line is an error naming file, line and field.
#[cfg(test)]
pub fn scan(path: &Path) -> Result<RecordingScan, RecordingError> {
    scan_sampled(path, None)
}

/// [`scan`], counting and measuring only the exchanges `sample` keeps (every line is still
/// validated), without a tokenizer ([`scan_with`]).
#[cfg(test)]
pub fn scan_sampled(
    path: &Path,
    sample: Option<&SessionSample>,
) -> Result<RecordingScan, RecordingError> {
    scan_with(path, sample, None)
}

/// The scan of a run: only the exchanges `sample` keeps are counted and measured (every line
/// is still validated), and the baseline counts the tokens of recorded answers and prompts
/// without usage with `tokenizer` (`--tokenizer`) when there is one.
pub fn scan_with(
    path: &Path,
    sample: Option<&SessionSample>,
    tokenizer: Option<&Tokenizer>,
) -> Result<RecordingScan, RecordingError> {
    let mut out = RecordingScan::default();
    let mut baseline = RunMetrics::new();
    let mut sessions = std::collections::HashSet::new();
    let mut think = ThinkTimes::default();
    let mut think_hist = hdrhistogram::Histogram::<u64>::new(common::metrics::SIGNIFICANT_DIGITS)
        .expect("3 significant digits is valid");
    let (mut first_at, mut last_end) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut reader = RecordingReader::open(path)?;
    for (index, item) in reader.by_ref().enumerate() {
        let (_, exchange) = item?;
        if sample.is_some_and(|s| !s.keeps(exchange.session.as_deref(), index as u64)) {
            continue;
        }
        if let Some(ms) = think.next(&exchange) {
            // Stored in µs, as every time histogram.
            let _ = think_hist.record((ms * 1000.0).round() as u64);
        }
        if let Some(at) = exchange.at_ms {
            first_at = first_at.min(at);
            let last_t = exchange
                .response
                .as_ref()
                .and_then(|r| r.frames.last())
                .and_then(|f| f.t_ms)
                .unwrap_or(0.0);
            last_end = last_end.max(at + last_t);
        }
        out.exchanges += 1;
        if let Some(at) = exchange.at_ms {
            out.with_arrival += 1;
            out.max_at_ms = out.max_at_ms.max(at);
        }
        if let Some(session) = &exchange.session
            && !sessions.contains(session.as_str())
        {
            sessions.insert(session.clone());
        }
        if let Some(family) = recorded_family(&exchange) {
            *out.families.entry(family.name()).or_default() += 1;
        }
        if let Some(outcome) = recorded_outcome(&exchange, tokenizer) {
            out.with_frame_timing += 1;
            baseline.record(&outcome);
        } else if let Some(outcome) = noted_outcome(&exchange) {
            out.with_source_timing += 1;
            baseline.record(&outcome);
        }
    }
    out.torn_last_line = reader.torn_last_line();
    out.sample_share = reader.sample_share();
    out.gaps = reader.gaps().len() as u64;
    out.not_recorded = reader.gaps().iter().map(|g| g.exchanges).sum();
    out.skipped_long_lines = reader.skipped_lines();
    out.skipped_long_line_numbers = reader.skipped_line_numbers().to_vec();
    out.think_time_ms = common::metrics::stats_of(&think_hist, 1000.0);
    out.span_ms = (last_end > first_at).then_some(last_end - first_at);
    out.sessions = sessions.len() as u64;
    if out.with_frame_timing + out.with_source_timing > 0 {
        out.baseline = Some(baseline);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_counts_streams_without_usage_with_the_runs_tokenizer() {
        let dir = std::env::temp_dir().join(format!("llm-replay-scan-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("r.jsonl");
        let frame = |t: f64, data: &str| serde_json::json!({"t_ms": t, "data": data});
        let line = serde_json::json!({"at_ms": 0.0,
            "request": {"path": "/v1/chat/completions", "body": serde_json::json!({"stream": true,
                "messages": [{"role": "user", "content": "Hello, world!"}]}).to_string()},
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                "frames": [
                    frame(10.0, "data: {\"choices\":[{\"delta\":{\"content\":\"Hello,\"}}]}\n\n"),
                    frame(20.0, "data: {\"choices\":[{\"delta\":{\"content\":\" world!\"}}]}\n\n"),
                    frame(30.0, "data: [DONE]\n\n")],
                "complete": true}});
        std::fs::write(&path, format!("{line}\n")).expect("write");
        let tokenizer = Tokenizer::from_file(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer.json"),
        )
        .expect("the test tokenizer loads");

        let counted = scan_with(&path, None, Some(&tokenizer)).expect("scan");
        let baseline = counted.baseline.expect("a baseline");
        assert_eq!(baseline.counters.tokenized, 1);
        assert_eq!(baseline.counters.input_tokenized, 1);
        // "Hello, world!": 4 tokens (Python `tokenizers`), in 2 frames.
        assert_eq!(baseline.counters.output_tokens, 4);

        let framed = scan(&path).expect("scan").baseline.expect("a baseline");
        assert_eq!(framed.counters.tokenized, 0);
        assert_eq!(framed.counters.output_tokens, 2);
        std::fs::remove_dir_all(&dir).ok();
    }
}
