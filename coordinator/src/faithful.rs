//! Faithful replay, the coordinator's side: what the slice feeders attach to each exchange
//! (the recorded output length and think time; which sessions are kept is `sessions`'), the
//! steady-state window cut from the workers' timelines, and what fills the report's
//! `faithful` section.
//!
//! Everything here is computed where the recording is read (the scan and the slice feeders)
//! or from the workers' reports: workers only apply what arrives with each exchange.

use common::formats::pin::PinMode;
use common::measure::{OutputLengthSource, recorded_output_length_with};
use common::recording::Exchange;
use common::timeline::CompletionTimeline;
use common::tokenizer::Tokenizer;

use crate::report::{FaithfulSection, Report, SampleSection};
use crate::scan::RecordingScan;
// Read where the recording is read (the scan, the feeders); named here too, where the
// feeders take what they attach to each exchange.
pub use crate::sessions::{SessionSample, ThinkTimes};

/// The output length `--pin-output-length` asks for, without a tokenizer
/// ([`recorded_pin`]).
#[cfg(test)]
pub fn recorded_output_tokens(exchange: &Exchange) -> Option<u64> {
    recorded_pin(exchange, None).map(|(tokens, _)| tokens)
}

/// The output length `--pin-output-length` asks for: the one the recording shows for
/// `exchange` ([`common::measure::recorded_output_length`], the same as `recording stats` and
/// `export`), counted by `tokenizer` where the recorded answer has no usage. `in_frames`
/// (the second value) is true when the length is a content-frame count (no usage and no
/// tokenizer): the replay then compares it with its own content frames
/// ([`common::metrics::RunMetrics::record_pinned`]).
pub fn recorded_pin(exchange: &Exchange, tokenizer: Option<&Tokenizer>) -> Option<(u64, bool)> {
    recorded_output_length_with(exchange, tokenizer)
        .map(|length| (length.tokens, length.source == OutputLengthSource::Frames))
}

/// What the slice feeders attach to each exchange.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SliceFaithful {
    /// Send each exchange's recorded output length (`--pin-output-length`).
    pub pin: bool,
    /// Send each turn's recorded think time (`--session-mode closed`).
    pub think: bool,
    /// Replay only these sessions (`--sample-sessions`).
    pub sample: Option<SessionSample>,
}

/// The faithful-replay options of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaithfulOptions {
    pub pin: Option<PinMode>,
    pub closed_sessions: bool,
    pub sample: Option<SessionSample>,
}

impl FaithfulOptions {
    /// What the feeders attach to each exchange.
    pub fn slice(&self) -> SliceFaithful {
        SliceFaithful {
            pin: self.pin.is_some(),
            think: self.closed_sessions,
            sample: self.sample,
        }
    }
}

/// The steady-state window of a run, in the coordinator's clock, and what completed in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SteadyWindow {
    /// The last worker reached its target (Unix µs).
    pub start_unix_us: f64,
    /// The last request of the run was sent (Unix µs).
    pub end_unix_us: f64,
    /// Succeeded requests completed in the window (buckets cut by an end count in part).
    pub requests: f64,
    /// Their output tokens.
    pub output_tokens: f64,
}

impl SteadyWindow {
    /// Length in seconds.
    pub fn seconds(&self) -> f64 {
        (self.end_unix_us - self.start_unix_us) / 1e6
    }
}

/// Cut the steady window from every worker's timeline; `offset_ns` is each worker's clock
/// minus the coordinator's. `None` when a worker never reached its target or nobody sent a
/// request after the load reached it.
pub fn steady_window(workers: &[(CompletionTimeline, i64)]) -> Option<SteadyWindow> {
    let to_coordinator = |unix_us: u64, offset_ns: i64| unix_us as f64 - offset_ns as f64 / 1000.0;
    let mut start = f64::NEG_INFINITY;
    let mut end = f64::NEG_INFINITY;
    for (timeline, offset) in workers {
        start = start.max(to_coordinator(timeline.target_reached_unix_us?, *offset));
        if let Some(last) = timeline.last_issued_unix_us {
            end = end.max(to_coordinator(last, *offset));
        }
    }
    if workers.is_empty() || end <= start {
        return None;
    }
    let (mut requests, mut output_tokens) = (0.0, 0.0);
    for (timeline, offset) in workers {
        let shift = *offset as f64 / 1000.0;
        let (n, tokens) = timeline.count_between(start + shift, end + shift);
        requests += n;
        output_tokens += tokens;
    }
    Some(SteadyWindow {
        start_unix_us: start,
        end_unix_us: end,
        requests,
        output_tokens,
    })
}

/// What the run's faithful-replay section is built from.
pub struct FaithfulInput<'a> {
    pub options: &'a FaithfulOptions,
    /// `--speed` of a recorded schedule; `None` when the run did not follow the schedule.
    pub recorded_speed: Option<f64>,
    /// Think times and span of the replayed (sampled) recording.
    pub scan: &'a RecordingScan,
    /// `(exchanges, sessions)` of the whole recording, when sampled.
    pub unsampled: Option<(u64, u64)>,
    pub steady: Option<SteadyWindow>,
}

/// Fill in the steady-window keys of `report.llm`, its `faithful` section when an option
/// was used, and a warning when pinned requests did not get their length.
pub fn apply_to_report(report: &mut Report, input: FaithfulInput<'_>) {
    if let Some(steady) = input.steady {
        let seconds = steady.seconds();
        report.llm.steady_window_s = Some(seconds);
        report.llm.output_tokens_per_second_steady = Some(steady.output_tokens / seconds);
        report.llm.requests_per_second_steady = Some(steady.requests / seconds);
    }
    let options = input.options;
    if options.pin.is_none() && !options.closed_sessions && options.sample.is_none() {
        return;
    }
    let scan = input.scan;
    let recorded_span_s = input
        .recorded_speed
        .and_then(|speed| Some(scan.span_ms? / speed / 1000.0));
    let replayed_span_s = report.llm.measured_window_s;
    let stretch_pct = match (recorded_span_s, replayed_span_s) {
        (Some(recorded), Some(replayed)) if recorded > 0.0 => {
            Some((replayed / recorded - 1.0) * 100.0)
        }
        _ => None,
    };
    let pin_unit = pin_unit(report.requests.pinned, report.requests.pinned_frames);
    report.faithful = Some(FaithfulSection {
        pin_output_length: options.pin.map(|mode| mode.name().to_owned()),
        pin_unit: pin_unit.map(str::to_owned),
        session_mode: if options.closed_sessions {
            "closed"
        } else {
            "open"
        }
        .to_owned(),
        think_time_ms: scan.think_time_ms,
        recorded_span_s,
        replayed_span_s,
        stretch_pct,
        sample: options.sample.map(|sample| {
            let (of_exchanges, of_sessions) =
                input.unsampled.unwrap_or((scan.exchanges, scan.sessions));
            SampleSection {
                fraction: sample.fraction,
                seed: sample.seed,
                sessions: scan.sessions,
                of_sessions,
                exchanges: scan.exchanges,
                of_exchanges,
            }
        }),
    });
    let r = &report.requests;
    if options.pin.is_some() && r.pinned_frames > 0 {
        report.warnings.push(format!(
            "{} of {} pinned output lengths are content-frame counts, not tokens (the recording has no usage report for them; pass --tokenizer FILE to count them as the canonical tokenization of the text, which can differ from what the model emitted): they were compared with the replayed content frames",
            r.pinned_frames, r.pinned
        ));
    }
    let r = &report.requests;
    if options.pin.is_some() && r.pinned > r.pinned_matched {
        report.warnings.push(format!(
            "{} of {} pinned requests did not get their recorded output length: the server may ignore the max-tokens field{}",
            r.pinned - r.pinned_matched,
            r.pinned,
            if options.pin == Some(PinMode::Max) {
                ", or the model stopped early (--pin-output-length=strict asks vLLM, llama.cpp and TGI to ignore end-of-sequence)"
            } else {
                ""
            }
        ));
    }
}

/// What the pinned lengths count: `tokens`, `frames` (recorded content frames, no usage and
/// no tokenizer) or `mixed`; `None` when nothing was pinned.
fn pin_unit(pinned: u64, pinned_frames: u64) -> Option<&'static str> {
    match (pinned, pinned_frames) {
        (0, _) => None,
        (_, 0) => Some("tokens"),
        (all, frames) if frames >= all => Some("frames"),
        _ => Some("mixed"),
    }
}

#[cfg(test)]
mod tests {
    use common::measure::OutcomeKind;

    use super::*;

    #[test]
    fn an_imported_exchange_without_a_response_pins_its_recorded_usage() {
        let line = r#"{"at_ms":0,"request":{"method":"POST","path":"/v1/chat/completions","body":"{}"},"source":{"format":"otel-genai","output_tokens":37}}"#;
        let exchange: Exchange = serde_json::from_str(line).expect("a recording line");
        assert_eq!(recorded_output_tokens(&exchange), Some(37));
        let without: Exchange = serde_json::from_str(
            r#"{"at_ms":0,"request":{"method":"POST","path":"/v1/chat/completions","body":"{}"}}"#,
        )
        .expect("a recording line");
        assert_eq!(recorded_output_tokens(&without), None);
    }

    #[test]
    fn every_renderer_labels_both_windows_and_the_faithful_settings() {
        use crate::report::{
            Report, ReportInput, RequestTotals, RunInfo, render_html, render_markdown,
            render_terminal,
        };
        let mut metrics = common::metrics::RunMetrics::new();
        let mut outcome =
            common::measure::RequestOutcome::failed(common::measure::FailureKind::Empty);
        outcome.kind = OutcomeKind::Succeeded;
        outcome.latency_us = Some(1_000_000);
        outcome.sent_unix_us = Some(1_000_000);
        outcome.content_frames = 7;
        metrics.record(&outcome);
        metrics.record_pinned(&outcome, 7, false);
        let mut report = Report::build(ReportInput {
            run: RunInfo {
                id: "r".into(),
                started_at: "2026-01-01T00:00:00.000Z".into(),
                duration_s: 1.0,
                target: "t".into(),
                load: Default::default(),
                start_skew_ms: None,
                start_skew_bound_ms: None,
                workers: Vec::new(),
                insecure: false,
            },
            metrics: &metrics,
            requests: RequestTotals::default(),
            baseline: None,
            sweep: Vec::new(),
            warnings: Vec::new(),
            timeline: Vec::new(),
            slos: &common::slo::Slos::default(),
        });
        let scan = RecordingScan {
            sessions: 3,
            exchanges: 9,
            span_ms: Some(500.0),
            ..RecordingScan::default()
        };
        apply_to_report(
            &mut report,
            FaithfulInput {
                options: &FaithfulOptions {
                    pin: Some(PinMode::Max),
                    closed_sessions: true,
                    sample: Some(SessionSample {
                        fraction: 0.25,
                        seed: 7,
                    }),
                },
                recorded_speed: Some(1.0),
                scan: &scan,
                unsampled: Some((40, 12)),
                steady: Some(SteadyWindow {
                    start_unix_us: 0.0,
                    end_unix_us: 2_000_000.0,
                    requests: 10.0,
                    output_tokens: 800.0,
                }),
            },
        );
        assert_eq!(report.llm.output_tokens_per_second_steady, Some(400.0));
        assert_eq!(report.llm.requests_per_second_steady, Some(5.0));
        assert_eq!(report.llm.steady_window_s, Some(2.0));
        assert_eq!(report.llm.osl_match_share_pct, Some(100.0));
        let stretch = report.faithful.as_ref().and_then(|f| f.stretch_pct);
        assert_eq!(stretch, Some(100.0), "1 s replayed for 0.5 s recorded");
        for text in [
            render_terminal(&report, false),
            render_markdown(&report),
            render_html(&report),
        ] {
            for needle in [
                "whole run",
                "Output throughput, steady window (tokens/s)",
                "Request throughput, steady window (requests/s)",
                "Steady window",
                "Pinned output length (max): 1 of 1",
                "Sessions closed",
                "Sampled sessions: fraction 0.25 (seed 7): 3 of 12 sessions, 9 of 40 exchanges",
            ] {
                assert!(text.contains(needle), "{needle} missing from:\n{text}");
            }
        }
        let json: serde_json::Value = serde_json::from_str(&report.to_json_pretty()).expect("json");
        assert_eq!(json["llm"]["output_tokens_per_second_steady"], 400.0);
        assert_eq!(json["faithful"]["sample"]["of_sessions"], 12);
        let read = Report::from_json(&report.to_json_pretty()).expect("reads back");
        assert_eq!(read, report);
    }

    #[test]
    fn the_steady_window_runs_from_the_last_target_to_the_last_send() {
        let mut a = CompletionTimeline::default();
        let mut b = CompletionTimeline::default();
        for i in 0..100u64 {
            a.record(1_000_000_000 + i * 10_000, 10);
            // b's clock is 5 ms ahead of the coordinator's.
            b.record(1_000_005_000 + i * 10_000, 10);
        }
        a.target_reached_unix_us = Some(1_000_100_000);
        a.last_issued_unix_us = Some(1_000_600_000);
        b.target_reached_unix_us = Some(1_000_205_000);
        b.last_issued_unix_us = Some(1_000_805_000);
        let window = steady_window(&[(a.clone(), 0), (b.clone(), 5_000_000)]).expect("window");
        assert_eq!(window.start_unix_us, 1_000_200_000.0);
        assert_eq!(window.end_unix_us, 1_000_800_000.0);
        // 0.6 s, one completion every 10 ms on each worker.
        assert!((window.requests - 120.0).abs() < 1.0, "{window:?}");
        assert!((window.output_tokens - 1200.0).abs() < 10.0, "{window:?}");
        b.target_reached_unix_us = None;
        assert_eq!(steady_window(&[(a, 0), (b, 0)]), None);
    }

    fn test_tokenizer() -> Tokenizer {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer.json");
        Tokenizer::from_file(&path).expect("the test tokenizer loads")
    }

    #[test]
    fn a_pin_without_usage_is_in_frames_unless_a_tokenizer_counts_it() {
        let frame = |t: f64, data: &str| serde_json::json!({"t_ms": t, "data": data});
        let exchange: Exchange = serde_json::from_value(serde_json::json!({
            "request": {"path": "/v1/chat/completions", "body": "{\"stream\":true}"},
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                "frames": [
                    frame(1.0, "data: {\"choices\":[{\"delta\":{\"content\":\"Hello,\"}}]}\n\n"),
                    frame(2.0, "data: {\"choices\":[{\"delta\":{\"content\":\" world!\"}}]}\n\n"),
                    frame(3.0, "data: [DONE]\n\n")]}
        }))
        .expect("exchange");
        assert_eq!(recorded_pin(&exchange, None), Some((2, true)));
        // "Hello, world!": 4 tokens (Python `tokenizers`, see `common::tokenizer`'s tests).
        assert_eq!(
            recorded_pin(&exchange, Some(&test_tokenizer())),
            Some((4, false))
        );
        assert_eq!(recorded_output_tokens(&exchange), Some(2));
    }

    #[test]
    fn pins_in_frames_fill_the_pin_unit_and_warn() {
        assert_eq!(pin_unit(0, 0), None);
        assert_eq!(pin_unit(3, 0), Some("tokens"));
        assert_eq!(pin_unit(3, 3), Some("frames"));
        assert_eq!(pin_unit(3, 1), Some("mixed"));
        // One pin in frames, one in tokens.
        let mut metrics = common::metrics::RunMetrics::new();
        let mut outcome =
            common::measure::RequestOutcome::failed(common::measure::FailureKind::Empty);
        outcome.kind = OutcomeKind::Succeeded;
        outcome.latency_us = Some(1_000);
        outcome.content_frames = 5;
        metrics.record(&outcome);
        metrics.record_pinned(&outcome, 5, true);
        metrics.record(&outcome);
        metrics.record_pinned(&outcome, 9, false);
        let mut report = crate::report::Report::build(crate::report::ReportInput {
            run: crate::report::RunInfo {
                id: "r".into(),
                started_at: "2026-01-01T00:00:00.000Z".into(),
                duration_s: 1.0,
                target: "t".into(),
                load: Default::default(),
                start_skew_ms: None,
                start_skew_bound_ms: None,
                workers: Vec::new(),
                insecure: false,
            },
            metrics: &metrics,
            requests: crate::report::RequestTotals::default(),
            baseline: None,
            sweep: Vec::new(),
            warnings: Vec::new(),
            timeline: Vec::new(),
            slos: &common::slo::Slos::default(),
        });
        apply_to_report(
            &mut report,
            FaithfulInput {
                options: &FaithfulOptions {
                    pin: Some(PinMode::Max),
                    closed_sessions: false,
                    sample: None,
                },
                recorded_speed: None,
                scan: &RecordingScan::default(),
                unsampled: None,
                steady: None,
            },
        );
        let faithful = report.faithful.as_ref().expect("a faithful section");
        assert_eq!(faithful.pin_unit.as_deref(), Some("mixed"));
        let warning = report
            .warnings
            .iter()
            .find(|w| w.contains("content-frame counts"))
            .expect("a frames warning");
        assert!(warning.contains("1 of 2"), "{warning}");
        assert!(warning.contains("--tokenizer FILE"), "{warning}");
    }
}
