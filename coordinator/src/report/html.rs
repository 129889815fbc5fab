//! The HTML rendering of a report (`--report-html`): one self-contained file with inline CSS
//! and no script, so it opens from a CI artifact store or an e-mail as it is.

use std::fmt::Write as _;

use common::metrics::Metric;

use super::Report;
use super::format::{self, HIGHLIGHT_NOTE, STAT_COLUMNS};
use super::windows;

const STYLE: &str = "\
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#1f2328}\
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2rem}\
table{border-collapse:collapse;margin:.5rem 0}\
th,td{border:1px solid #d0d7de;padding:.25rem .6rem}\
th{background:#f6f8fa;text-align:left}\
td.n{text-align:right;font-variant-numeric:tabular-nums}\
tr.worse td{background:#ffebe9;color:#a40e26;font-weight:600}\
tr.fail td{background:#ffebe9;color:#a40e26}tr.pass td{background:#dafbe1;color:#116329}\
code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace}\
.note{color:#59636e;font-size:.9rem}";

/// Render `report` as a standalone HTML page.
pub fn render_html(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>llm-replay run {id}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>llm-replay run <code>{id}</code></h1>\n",
        id = esc(&report.run.id)
    );
    let _ = writeln!(out, "<table>");
    for (name, value) in [
        ("Started", esc(&report.run.started_at)),
        ("Duration", format!("{:.2} s", report.run.duration_s)),
        ("Target", esc(&report.run.target)),
        (
            "Load",
            format!("<code>{}</code>", esc(&format::load(report))),
        ),
        ("Workers", report.run.workers.len().to_string()),
    ] {
        let _ = writeln!(out, "<tr><th>{name}</th><td>{value}</td></tr>");
    }
    let _ = writeln!(out, "</table>");

    if !report.run.workers.is_empty() {
        let _ = writeln!(
            out,
            "<table>\n<tr><th>Worker</th><th>Host</th><th>Assigned</th><th>Completed</th>\
             <th>Lost</th><th>Clock offset (ms)</th></tr>"
        );
        for w in &report.run.workers {
            let class = if w.disconnected {
                " class=\"fail\""
            } else {
                ""
            };
            let lost = if w.disconnected {
                format!("{} (disconnected)", w.lost)
            } else {
                w.lost.to_string()
            };
            let _ = writeln!(
                out,
                "<tr{class}><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&w.id),
                esc(&w.host),
                w.assigned,
                w.completed,
                lost,
                w.clock_offset_ms
                    .map_or_else(|| format::NO_VALUE.to_string(), |o| format!("{o:.2}"))
            );
        }
        let _ = writeln!(out, "</table>");
    }

    let _ = writeln!(out, "<h2>LLM metrics</h2>\n<table>\n<tr><th>Metric</th>");
    for column in STAT_COLUMNS {
        let _ = write!(out, "<th>{column}</th>");
    }
    let _ = writeln!(out, "</tr>");
    for metric in Metric::ALL {
        let _ = write!(out, "<tr><td>{}</td>", esc(metric.label()));
        for value in format::stat_cells(metric, report.llm.stats(metric).as_ref()) {
            let _ = write!(out, "<td class=\"n\">{value}</td>");
        }
        let _ = writeln!(out, "</tr>");
    }
    let _ = writeln!(out, "</table>");

    let r = &report.requests;
    let _ = writeln!(
        out,
        "<h2>Requests</h2>\n<table>\n<tr><th>Total</th><th>Succeeded</th><th>Failed</th>\
         <th>Ended early</th><th>Lost</th><th>Not started</th></tr>\n<tr><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td></tr>\n</table>",
        r.total, r.succeeded, r.failed, r.ended_early, r.lost, r.not_started
    );
    let _ = writeln!(out, "<ul>");
    let _ = writeln!(
        out,
        "<li>Failed by kind: {}</li>",
        esc(&format::failed_by_kind(report))
    );
    let _ = writeln!(
        out,
        "<li>Status codes: {}</li>",
        esc(&format::status_codes(report))
    );
    let _ = writeln!(
        out,
        "<li>Output tokens: {}</li>",
        esc(&format::token_sources(report))
    );
    if r.warmup > 0 {
        let _ = writeln!(out, "<li>Warm-up: {} requests excluded</li>", r.warmup);
    }
    let _ = writeln!(out, "</ul>");

    let _ = writeln!(out, "<h2>Throughput</h2>\n<table>");
    for (name, value) in [
        (
            format::OUTPUT_THROUGHPUT_LABEL,
            format::rate(report.llm.output_tokens_per_second),
        ),
        (
            format::REQUEST_THROUGHPUT_LABEL,
            format::rate(report.llm.requests_per_second),
        ),
        (
            "Measured window",
            report
                .llm
                .measured_window_s
                .map_or_else(|| format::NO_VALUE.to_string(), |s| format!("{s:.2} s")),
        ),
    ] {
        let _ = writeln!(out, "<tr><th>{name}</th><td class=\"n\">{value}</td></tr>");
    }
    for (name, value) in windows::steady_rows(report) {
        let _ = writeln!(
            out,
            "<tr><th>{name}</th><td class=\"n\">{}</td></tr>",
            esc(&value)
        );
    }
    let _ = writeln!(out, "</table>");
    let faithful = windows::faithful_lines(report);
    if !faithful.is_empty() {
        let _ = writeln!(out, "<h2>Faithful replay</h2>\n<ul>");
        for line in faithful {
            let _ = writeln!(out, "<li>{}</li>", esc(&line));
        }
        let _ = writeln!(out, "</ul>");
    }

    if let Some(baseline) = &report.baseline {
        let _ = writeln!(
            out,
            "<h2>Baseline comparison ({})</h2>\n<table>\n<tr><th>Metric</th><th>Stat</th>\
             <th>Baseline</th><th>Replayed</th><th>Change</th><th></th></tr>",
            esc(&baseline.source)
        );
        for row in format::comparison_rows(report) {
            let class = if row.highlight() {
                " class=\"worse\""
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "<tr{class}><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&row.label),
                esc(&row.stat),
                row.baseline,
                row.replayed,
                row.change,
                row.marker()
            );
        }
        let _ = writeln!(
            out,
            "</table>\n<p class=\"note\">{}</p>",
            esc(HIGHLIGHT_NOTE)
        );
    }

    if !report.sweep.is_empty() {
        let _ = writeln!(
            out,
            "<h2>Concurrency sweep</h2>\n<table>\n<tr><th>Concurrency</th><th>Requests</th>\
             <th>Failed</th><th>TTFT p50 (ms)</th><th>TTFT p95 (ms)</th><th>ITL p50 (ms)</th>\
             <th>Latency p95 (ms)</th><th>Output tokens/s</th><th>Requests/s</th></tr>"
        );
        for level in &report.sweep {
            let stat = |metric: Metric, pick: fn(&common::metrics::Stats) -> f64| {
                level.llm.stats(metric).map_or_else(
                    || format::NO_VALUE.to_string(),
                    |s| format!("{:.2}", pick(&s)),
                )
            };
            let cells = [
                level.concurrency.to_string(),
                level.requests.total.to_string(),
                level.requests.failed.to_string(),
                stat(Metric::Ttft, |s| s.p50),
                stat(Metric::Ttft, |s| s.p95),
                stat(Metric::Itl, |s| s.p50),
                stat(Metric::Latency, |s| s.p95),
                format::rate(level.llm.output_tokens_per_second),
                format::rate(level.llm.requests_per_second),
            ];
            let _ = write!(out, "<tr>");
            for value in cells {
                let _ = write!(out, "<td class=\"n\">{value}</td>");
            }
            let _ = writeln!(out, "</tr>");
        }
        let _ = writeln!(out, "</table>");
    }

    if !report.goals.is_empty() {
        let failed = report.goals.iter().filter(|g| g.failed).count();
        let _ = writeln!(
            out,
            "<h2>Goals ({failed} of {} failed)</h2>\n<table>\n<tr><th>Result</th><th>Fail if</th>\
             <th>Value</th><th>Threshold</th><th>Note</th></tr>",
            report.goals.len()
        );
        for goal in &report.goals {
            let (class, status) = if goal.failed {
                ("fail", "FAIL")
            } else {
                ("pass", "PASS")
            };
            let _ = writeln!(
                out,
                "<tr class=\"{class}\"><td>{status}</td><td><code>{}</code></td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&goal.expr),
                format::goal_number(goal.value),
                format::goal_number(Some(goal.threshold)),
                esc(goal.note.as_deref().unwrap_or(""))
            );
        }
        let _ = writeln!(out, "</table>");
    }

    if !report.warnings.is_empty() {
        let _ = writeln!(out, "<h2>Warnings</h2>\n<ul>");
        for warning in &report.warnings {
            let _ = writeln!(out, "<li>{}</li>", esc(warning));
        }
        let _ = writeln!(out, "</ul>");
    }
    let _ = writeln!(out, "</body>\n</html>");
    out
}

/// HTML-escape text for element content and attribute values.
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
