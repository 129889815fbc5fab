//! The steady-window throughput rows and the faithful-replay lines, shared by the terminal,
//! Markdown and HTML renderers (each calls these from one place, so the three say the same).

use super::Report;
use super::format;

/// Label of the output-token throughput over the steady window.
pub(super) const STEADY_OUTPUT_LABEL: &str = "Output throughput, steady window (tokens/s)";
/// Label of the request throughput over the steady window.
pub(super) const STEADY_REQUEST_LABEL: &str = "Request throughput, steady window (requests/s)";

/// `(label, value)` rows of the steady window, empty when the run has none.
pub(super) fn steady_rows(report: &Report) -> Vec<(&'static str, String)> {
    let llm = &report.llm;
    let Some(window) = llm.steady_window_s else {
        return Vec::new();
    };
    vec![
        (
            STEADY_OUTPUT_LABEL,
            format::rate(llm.output_tokens_per_second_steady),
        ),
        (
            STEADY_REQUEST_LABEL,
            format::rate(llm.requests_per_second_steady),
        ),
        (
            "Steady window",
            format!("{window:.2} s (load at its target → last request sent)"),
        ),
    ]
}

/// One line per faithful-replay setting that was used, empty when none was.
pub(super) fn faithful_lines(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    let r = &report.requests;
    if let Some(faithful) = &report.faithful {
        if let Some(mode) = &faithful.pin_output_length {
            let share = report
                .llm
                .osl_match_share_pct
                .map_or_else(|| format::NO_VALUE.to_string(), |p| format!("{p:.1} %"));
            lines.push(format!(
                "Pinned output length ({mode}): {} of {} pinned requests got the recorded length (OSL match {share})",
                r.pinned_matched, r.pinned
            ));
        }
        if faithful.session_mode == "closed" || faithful.think_time_ms.is_some() {
            let think = faithful.think_time_ms.map_or_else(
                || "none recorded".to_string(),
                |s| {
                    format!(
                        "p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms over {} turns",
                        s.p50, s.p95, s.max, s.count
                    )
                },
            );
            lines.push(format!(
                "Sessions {}: recorded think time {think}",
                faithful.session_mode
            ));
        }
        if let (Some(recorded), Some(replayed), Some(stretch)) = (
            faithful.recorded_span_s,
            faithful.replayed_span_s,
            faithful.stretch_pct,
        ) {
            lines.push(format!(
                "Span: replayed {replayed:.2} s for a recorded {recorded:.2} s ({stretch:+.1} %)"
            ));
        }
        if let Some(sample) = &faithful.sample {
            lines.push(format!(
                "Sampled sessions: fraction {} (seed {}): {} of {} sessions, {} of {} exchanges",
                sample.fraction,
                sample.seed,
                sample.sessions,
                sample.of_sessions,
                sample.exchanges,
                sample.of_exchanges
            ));
        }
    }
    lines
}
