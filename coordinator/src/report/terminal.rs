//! The terminal rendering of a report: plain aligned tables that read the same with or without
//! color (highlighted rows carry a textual marker; color only adds emphasis).

use std::fmt::Write as _;

use common::metrics::Metric;

use super::format::{
    self, ANSI_BOLD, ANSI_GREEN, ANSI_RED, ANSI_RESET, HIGHLIGHT_NOTE, STAT_COLUMNS, TextTable,
};
use super::server_side::{self, DIFFERENCE_NOTE, QUEUE_MAX_HEADER, ServerView};
use super::windows;
use super::{CapacitySection, Report};

/// Render `report` for a terminal; `color` adds ANSI colors (red for highlighted comparisons
/// and failed goals, green for passed goals, bold titles).
pub fn render_terminal(report: &Report, color: bool) -> String {
    let mut out = String::new();
    let title = |out: &mut String, text: &str| {
        if color {
            let _ = writeln!(out, "{ANSI_BOLD}{text}{ANSI_RESET}");
        } else {
            let _ = writeln!(out, "{text}");
        }
    };

    title(&mut out, &format!("llm-replay run {}", report.run.id));
    let _ = writeln!(out, "  started   {}", report.run.started_at);
    let _ = writeln!(out, "  duration  {:.2} s", report.run.duration_s);
    let _ = writeln!(out, "  target    {}", report.run.target);
    let _ = writeln!(out, "  load      {}", format::load(report));
    if let Some(skew) = report.run.start_skew_text() {
        let _ = writeln!(out, "  skew      {skew}");
    }
    if !report.run.workers.is_empty() {
        out.push('\n');
        let mut workers = TextTable::new(
            &[
                "worker",
                "host",
                "assigned",
                "completed",
                "lost",
                "clock offset ms",
            ],
            &[0, 1],
        );
        for w in &report.run.workers {
            let lost = if w.disconnected {
                format!("{} (disconnected)", w.lost)
            } else {
                w.lost.to_string()
            };
            workers.row(
                vec![
                    w.id.clone(),
                    w.host.clone(),
                    w.assigned.to_string(),
                    w.completed.to_string(),
                    lost,
                    match (w.clock_offset_ms, w.clock_uncertainty_ms) {
                        (Some(o), Some(u)) => format!("{o:.2} ± {u:.2}"),
                        (Some(o), None) => format!("{o:.2}"),
                        (None, _) => format::NO_VALUE.to_string(),
                    },
                ],
                w.disconnected.then_some(ANSI_RED),
            );
        }
        out.push_str(&workers.render(color));
    }

    out.push('\n');
    title(&mut out, "LLM metrics");
    let mut header = vec!["metric"];
    header.extend(STAT_COLUMNS);
    let mut metrics = TextTable::new(&header, &[0]);
    for metric in Metric::ALL {
        let mut cells = vec![metric.label().to_string()];
        cells.extend(format::stat_cells(
            metric,
            report.llm.stats(metric).as_ref(),
        ));
        metrics.row(cells, None);
    }
    // Per connection, not per request: shown when connections were timed; time to failure
    // when something failed (apart from every success distribution).
    for metric in Metric::CONNECTION.into_iter().chain(Metric::FAILURE) {
        if let Some(stats) = report.llm.stats(metric) {
            let mut cells = vec![metric.label().to_string()];
            cells.extend(format::stat_cells(metric, Some(&stats)));
            metrics.row(cells, None);
        }
    }
    out.push_str(&metrics.render(color));

    out.push('\n');
    title(&mut out, "Requests");
    let r = &report.requests;
    let _ = writeln!(out, "  total            {}", format::total_line(report));
    let _ = writeln!(out, "  failed by kind   {}", format::failed_by_kind(report));
    let _ = writeln!(out, "  status codes     {}", format::status_codes(report));
    let _ = writeln!(out, "  output tokens    {}", format::token_sources(report));
    if r.warmup > 0 {
        let _ = writeln!(out, "  warm-up          {} requests excluded", r.warmup);
    }
    if r.resent > 0 {
        let _ = writeln!(
            out,
            "  resent           {} (a reused connection closed before any response byte; sent once more on a fresh one)",
            r.resent
        );
    }
    if let Some(line) = format::connections_line(report) {
        let _ = writeln!(out, "  connections      {line}");
    }
    if let Some(line) = format::coalesced_line(report) {
        let _ = writeln!(out, "  coalesced        {line}");
    }
    let errors = super::errors::error_rows(report);
    if !errors.is_empty() {
        out.push('\n');
        title(&mut out, "Errors (what the server said)");
        let mut table = TextTable::new(&["failure", "count", "message"], &[0, 2]);
        for row in errors {
            table.row(vec![row.what, row.count.to_string(), row.message], None);
        }
        out.push_str(&table.render(color));
    }

    out.push('\n');
    title(&mut out, "Throughput");
    let _ = writeln!(
        out,
        "  output tokens/s   {}  (whole run)",
        format::rate(report.llm.output_tokens_per_second)
    );
    let _ = writeln!(
        out,
        "  requests/s        {}  (whole run)",
        format::rate(report.llm.requests_per_second)
    );
    let _ = writeln!(
        out,
        "  measured window   {}",
        report.llm.measured_window_s.map_or_else(
            || format::NO_VALUE.to_string(),
            |s| format!(
                "{s:.2} s (whole run: first request sent → last outcome of any kind, failures included)"
            )
        )
    );
    for (label, value) in windows::steady_rows(report) {
        let _ = writeln!(out, "  {label}   {value}");
    }
    let goodput = format::report_goodput_rows(report);
    if !goodput.is_empty() {
        out.push('\n');
        title(
            &mut out,
            "Goodput (requests that succeeded within every SLO)",
        );
        let width = goodput
            .iter()
            .map(|(label, _)| label.chars().count())
            .max()
            .unwrap_or(0);
        for (label, value) in goodput {
            let _ = writeln!(out, "  {label:<width$}  {value}");
        }
    }
    let transients = super::transients::transient_lines(report);
    if !transients.is_empty() {
        out.push('\n');
        title(
            &mut out,
            "Over time (stretches far worse than the rest of the run)",
        );
        for line in transients {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(out, "  ({})", super::transients::HOW_JUDGED);
    }
    let faithful = windows::faithful_lines(report);
    if !faithful.is_empty() {
        out.push('\n');
        title(&mut out, "Faithful replay");
        for line in faithful {
            let _ = writeln!(out, "  {line}");
        }
    }

    if let Some(view) = server_side::server_view(report) {
        out.push('\n');
        title(&mut out, "Server (what its /metrics said during the run)");
        out.push_str(&server_tables(&view, color));
    }

    if let Some(baseline) = &report.baseline {
        out.push('\n');
        title(
            &mut out,
            &format!("Baseline comparison ({})", baseline.source),
        );
        let mut table = TextTable::new(
            &["metric", "stat", "baseline", "replayed", "change", ""],
            &[0, 1, 5],
        );
        for row in format::comparison_rows(report) {
            let highlight = row.highlight();
            table.row(
                vec![
                    row.label.clone(),
                    row.stat.clone(),
                    row.baseline.clone(),
                    row.replayed.clone(),
                    row.change.clone(),
                    row.marker().to_string(),
                ],
                highlight.then_some(ANSI_RED),
            );
        }
        out.push_str(&table.render(color));
        let _ = writeln!(out, "  {HIGHLIGHT_NOTE}");
        if format::any_coalesced(report) {
            let _ = writeln!(out, "  {}", format::COALESCED_NOTE);
        }
    }

    if !report.sweep.is_empty() {
        out.push('\n');
        title(&mut out, "Concurrency sweep");
        let with_goodput = report.sweep.iter().any(|level| level.goodput.is_some());
        let mut header = vec![
            "concurrency",
            "requests",
            "failed",
            "ttft p50 ms",
            "ttft p95 ms",
            "itl p50 ms",
            "latency p95 ms",
            "output tok/s",
            "req/s",
        ];
        if with_goodput {
            header.push("goodput req/s");
        }
        let with_server = report.sweep.iter().any(|level| level.server.is_some());
        if with_server {
            header.push(QUEUE_MAX_HEADER);
        }
        let mut table = TextTable::new(&header, &[]);
        for level in &report.sweep {
            let stat = |metric: Metric, pick: fn(&common::metrics::Stats) -> f64| {
                level.llm.stats(metric).map_or_else(
                    || format::NO_VALUE.to_string(),
                    |s| format!("{:.2}", pick(&s)),
                )
            };
            let mut cells = vec![
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
            if with_goodput {
                cells.push(format::goodput_cell(level.goodput.as_ref()));
            }
            if with_server {
                cells.push(server_side::queue_max_cell(level.server.as_ref()));
            }
            table.row(cells, None);
        }
        out.push_str(&table.render(color));
    }

    if let Some(capacity) = &report.capacity {
        capacity_block(&mut out, capacity, color);
    }

    if !report.goals.is_empty() {
        out.push('\n');
        title(&mut out, "Goals (a goal fails when its condition holds)");
        let mut table = TextTable::new(
            &["result", "goal", "value", "threshold", "note"],
            &[0, 1, 4],
        );
        for goal in &report.goals {
            let (status, code) = if goal.failed {
                ("FAIL", ANSI_RED)
            } else {
                ("PASS", ANSI_GREEN)
            };
            table.row(
                vec![
                    status.to_string(),
                    goal.expr.clone(),
                    format::goal_number(goal.value),
                    format::goal_number(Some(goal.threshold)),
                    goal.note.clone().unwrap_or_default(),
                ],
                Some(code),
            );
        }
        out.push_str(&table.render(color));
        let failed = report.goals.iter().filter(|g| g.failed).count();
        let _ = writeln!(out, "  {} goals, {} failed", report.goals.len(), failed);
    }

    if !report.warnings.is_empty() {
        out.push('\n');
        title(&mut out, "Warnings");
        for warning in &report.warnings {
            let _ = writeln!(out, "  - {warning}");
        }
    }
    out
}

/// The capacity search: its header (range, precision, the whole search's time), the probes,
/// their notes, how it stopped and the answer.
fn capacity_block(out: &mut String, capacity: &CapacitySection, color: bool) {
    out.push('\n');
    let title = |out: &mut String, text: &str| {
        if color {
            let _ = writeln!(out, "{ANSI_BOLD}{text}{ANSI_RESET}");
        } else {
            let _ = writeln!(out, "{text}");
        }
    };
    title(
        out,
        &format!(
            "Capacity search ({}, range {}–{}, precision {} %; {}): probes in the order they ran",
            format::dimension_label(&capacity.dimension),
            format::load_value(capacity.low),
            format::load_value(capacity.high),
            format::load_value(capacity.precision_pct),
            format::search_time(capacity)
        ),
    );
    out.push_str(&capacity_table(capacity).render(color));
    for line in format::probe_notes(capacity) {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "  search: {}", capacity.stopped);
    if let Some(line) = format::limit_line(capacity) {
        let _ = writeln!(out, "  {line}");
    }
    let answer = format::capacity_answer(capacity);
    let code = if capacity.max.is_some() {
        ANSI_GREEN
    } else {
        ANSI_RED
    };
    if color {
        let _ = writeln!(out, "{ANSI_BOLD}{code}{answer}{ANSI_RESET}");
    } else {
        let _ = writeln!(out, "{answer}");
    }
}

/// The probes of a capacity search, one row each in the order they ran: the load, its
/// result (and which run at that load), what the goals were judged on, each goal's value
/// (one column per goal), the goodput with `--slo`, and the goals that failed.
fn capacity_table(capacity: &CapacitySection) -> TextTable {
    // Every probe is judged on the same goals; the columns follow the first probe's.
    let goal_columns: Vec<String> = capacity.probes.first().map_or_else(Vec::new, |p| {
        p.goals.iter().map(|g| g.metric.clone()).collect()
    });
    let with_goodput = capacity.probes.iter().any(|p| p.goodput.is_some());
    let dimension = capacity.dimension.clone();
    let mut header: Vec<&str> = vec!["#", &dimension, "result", "judged on"];
    header.extend(goal_columns.iter().map(String::as_str));
    if with_goodput {
        header.push("goodput req/s");
    }
    let with_server = capacity.probes.iter().any(|p| p.server.is_some());
    let queue_header = server_side::sampled_queue_max_header(capacity.sample_interval_s);
    if with_server {
        header.push(&queue_header);
    }
    header.push("failed goals");
    let failed_column = header.len() - 1;
    let mut table = TextTable::new(&header, &[2, 3, failed_column]);
    for (i, probe) in capacity.probes.iter().enumerate() {
        let mut cells = vec![
            (i + 1).to_string(),
            format::load_value(probe.value),
            format::probe_result(probe),
            probe.judged_on.clone(),
        ];
        cells.extend((0..goal_columns.len()).map(|column| {
            probe.goals.get(column).map_or_else(
                || format::NO_VALUE.to_string(),
                |g| format::goal_number(g.value),
            )
        }));
        if with_goodput {
            cells.push(format::goodput_cell(probe.goodput.as_ref()));
        }
        if with_server {
            cells.push(server_side::server_queue_cell(probe));
        }
        cells.push(probe.failed_goals.join("; "));
        table.row(cells, (!probe.passed).then_some(ANSI_RED));
    }
    table
}

/// The server section: the endpoints, then the families of known servers (the server's
/// TTFT and latency beside the client's), then what was left out.
fn server_tables(view: &ServerView, color: bool) -> String {
    {
        let mut out = String::new();
        if !view.endpoints.is_empty() {
            let mut endpoints = TextTable::new(&["endpoint", "scrapes", "errors", "note"], &[0, 3]);
            for e in &view.endpoints {
                endpoints.row(
                    vec![
                        e.url.clone(),
                        e.scrapes.to_string(),
                        e.errors.to_string(),
                        e.note.clone(),
                    ],
                    // An endpoint that never answered (dropped, or every scrape failed).
                    (e.scrapes <= e.errors).then_some(ANSI_RED),
                );
            }
            out.push_str(&endpoints.render(color));
        }
        if let Some(note) = &view.none_answered {
            let _ = writeln!(out, "  {note}");
        }
        if !view.rows.is_empty() {
            out.push('\n');
            let mut rows = TextTable::new(
                &["measure", "family", "server", "client", "difference"],
                &[0, 1],
            );
            for row in &view.rows {
                rows.row(
                    vec![
                        row.what.clone(),
                        row.family.clone(),
                        row.server.clone(),
                        row.client.clone(),
                        row.difference.clone(),
                    ],
                    None,
                );
            }
            out.push_str(&rows.render(color));
            if view.rows.iter().any(|r| !r.difference.is_empty()) {
                let _ = writeln!(out, "  difference = client − server: {DIFFERENCE_NOTE}");
                let _ = writeln!(
                    out,
                    "  (the server's percentiles are interpolated within its histogram's buckets, e.g. vLLM's 100–250 ms: a difference smaller than its bucket is not a measurement)"
                );
            }
        } else if view.none_answered.is_none() {
            let _ = writeln!(
                out,
                "  no family of a known server (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM/Triton, Dynamo)"
            );
        }
        if let Some(text) = server_side::other_families_text(view) {
            let _ = writeln!(out, "  {text}");
        }
        out
    }
}
