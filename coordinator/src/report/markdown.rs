//! The Markdown rendering of a report (`--report-md`), for CI job summaries and pull-request
//! comments: GitHub-flavoured tables, highlighted comparisons in bold with the `▲ worse` marker.

use std::fmt::Write as _;

use common::metrics::Metric;

use super::Report;
use super::format::{self, HIGHLIGHT_NOTE, STAT_COLUMNS};
use super::windows;

/// Render `report` as Markdown.
pub fn render_markdown(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# llm-replay run `{}`\n", cell(&report.run.id));
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| Started | {} |", cell(&report.run.started_at));
    let _ = writeln!(out, "| Duration | {:.2} s |", report.run.duration_s);
    let _ = writeln!(out, "| Target | {} |", cell(&report.run.target));
    let _ = writeln!(out, "| Load | `{}` |", cell(&format::load(report)));
    let _ = writeln!(out, "| Workers | {} |", report.run.workers.len());

    if !report.run.workers.is_empty() {
        let _ = writeln!(
            out,
            "\n| Worker | Host | Assigned | Completed | Lost | Clock offset (ms) |\n|---|---|--:|--:|--:|--:|"
        );
        for w in &report.run.workers {
            let lost = if w.disconnected {
                format!("{} (disconnected)", w.lost)
            } else {
                w.lost.to_string()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                cell(&w.id),
                cell(&w.host),
                w.assigned,
                w.completed,
                lost,
                w.clock_offset_ms
                    .map_or_else(|| format::NO_VALUE.to_string(), |o| format!("{o:.2}"))
            );
        }
    }

    let _ = writeln!(out, "\n## LLM metrics\n");
    let _ = writeln!(
        out,
        "| Metric | {} |\n|---|{}",
        STAT_COLUMNS.join(" | "),
        "--:|".repeat(STAT_COLUMNS.len())
    );
    for metric in Metric::ALL {
        let cells = format::stat_cells(metric, report.llm.stats(metric).as_ref());
        let _ = writeln!(out, "| {} | {} |", metric.label(), cells.join(" | "));
    }

    let r = &report.requests;
    let _ = writeln!(out, "\n## Requests\n");
    let _ = writeln!(
        out,
        "| Total | Succeeded | Failed | Ended early | Lost | Not started |\n|--:|--:|--:|--:|--:|--:|"
    );
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {} |\n",
        r.total, r.succeeded, r.failed, r.ended_early, r.lost, r.not_started
    );
    let _ = writeln!(out, "- Failed by kind: {}", format::failed_by_kind(report));
    if report.requests.resent > 0 {
        let _ = writeln!(
            out,
            "- Resent on a fresh connection: {}",
            report.requests.resent
        );
    }
    let _ = writeln!(out, "- Status codes: {}", format::status_codes(report));
    let _ = writeln!(out, "- Output tokens: {}", format::token_sources(report));
    if r.warmup > 0 {
        let _ = writeln!(out, "- Warm-up: {} requests excluded", r.warmup);
    }

    let _ = writeln!(out, "\n## Throughput\n");
    let _ = writeln!(out, "| | |\n|---|--:|");
    let _ = writeln!(
        out,
        "| {} | {} |",
        format::OUTPUT_THROUGHPUT_LABEL,
        format::rate(report.llm.output_tokens_per_second)
    );
    let _ = writeln!(
        out,
        "| {} | {} |",
        format::REQUEST_THROUGHPUT_LABEL,
        format::rate(report.llm.requests_per_second)
    );
    let _ = writeln!(
        out,
        "| Measured window | {} |",
        report
            .llm
            .measured_window_s
            .map_or_else(|| format::NO_VALUE.to_string(), |s| format!("{s:.2} s"))
    );
    for (label, value) in windows::steady_rows(report) {
        let _ = writeln!(out, "| {label} | {value} |");
    }
    let faithful = windows::faithful_lines(report);
    if !faithful.is_empty() {
        let _ = writeln!(out, "\n## Faithful replay\n");
        for line in faithful {
            let _ = writeln!(out, "- {line}");
        }
    }

    if let Some(baseline) = &report.baseline {
        let _ = writeln!(
            out,
            "\n## Baseline comparison ({})\n",
            cell(&baseline.source)
        );
        let _ = writeln!(
            out,
            "| Metric | Stat | Baseline | Replayed | Change | |\n|---|---|--:|--:|--:|---|"
        );
        for row in format::comparison_rows(report) {
            let strong = |text: &str| {
                if row.highlight() && !text.is_empty() {
                    format!("**{text}**")
                } else {
                    text.to_string()
                }
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                cell(&row.label),
                row.stat,
                row.baseline,
                strong(&row.replayed),
                strong(&row.change),
                strong(row.marker())
            );
        }
        let _ = writeln!(out, "\n{HIGHLIGHT_NOTE}");
    }

    if !report.sweep.is_empty() {
        let _ = writeln!(out, "\n## Concurrency sweep\n");
        let _ = writeln!(
            out,
            "| Concurrency | Requests | Failed | TTFT p50 (ms) | TTFT p95 (ms) | ITL p50 (ms) | Latency p95 (ms) | Output tokens/s | Requests/s |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        for level in &report.sweep {
            let stat = |metric: Metric, pick: fn(&common::metrics::Stats) -> f64| {
                level.llm.stats(metric).map_or_else(
                    || format::NO_VALUE.to_string(),
                    |s| format!("{:.2}", pick(&s)),
                )
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                level.concurrency,
                level.requests.total,
                level.requests.failed,
                stat(Metric::Ttft, |s| s.p50),
                stat(Metric::Ttft, |s| s.p95),
                stat(Metric::Itl, |s| s.p50),
                stat(Metric::Latency, |s| s.p95),
                format::rate(level.llm.output_tokens_per_second),
                format::rate(level.llm.requests_per_second)
            );
        }
    }

    if !report.goals.is_empty() {
        let failed = report.goals.iter().filter(|g| g.failed).count();
        let _ = writeln!(
            out,
            "\n## Goals ({} of {} failed)\n",
            failed,
            report.goals.len()
        );
        let _ = writeln!(
            out,
            "| Result | Fail if | Value | Threshold | Note |\n|---|---|--:|--:|---|"
        );
        for goal in &report.goals {
            let status = if goal.failed { "❌ FAIL" } else { "✅ PASS" };
            let _ = writeln!(
                out,
                "| {} | `{}` | {} | {} | {} |",
                status,
                cell(&goal.expr),
                format::goal_number(goal.value),
                format::goal_number(Some(goal.threshold)),
                cell(goal.note.as_deref().unwrap_or(""))
            );
        }
    }

    if !report.warnings.is_empty() {
        let _ = writeln!(out, "\n## Warnings\n");
        for warning in &report.warnings {
            let _ = writeln!(out, "- {}", cell(warning));
        }
    }
    out
}

/// Text made safe inside a table cell: pipes escaped, line breaks flattened.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}
