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
    let mut t = Terminal {
        out: String::new(),
        color,
    };
    // One renderer per section, in the order they print; each writes nothing when its
    // section is empty.
    let sections: [fn(&mut Terminal, &Report); 15] = [
        run_header,
        workers_table,
        llm_metrics,
        requests_lines,
        error_table,
        throughput_lines,
        goodput_lines,
        transient_lines,
        faithful_lines,
        server_section,
        baseline_table,
        sweep_table,
        capacity_section,
        goal_table,
        warning_lines,
    ];
    for section in sections {
        section(&mut t, report);
    }
    t.out
}

/// The text being written and whether it is colored.
struct Terminal {
    out: String,
    color: bool,
}

impl Terminal {
    /// A section's title (bold in color).
    fn title(&mut self, text: &str) {
        if self.color {
            let _ = writeln!(self.out, "{ANSI_BOLD}{text}{ANSI_RESET}");
        } else {
            let _ = writeln!(self.out, "{text}");
        }
    }

    /// A blank line, then the section's title.
    fn section(&mut self, text: &str) {
        self.out.push('\n');
        self.title(text);
    }

    /// An indented line.
    fn line(&mut self, text: impl std::fmt::Display) {
        let _ = writeln!(self.out, "  {text}");
    }

    fn table(&mut self, table: &TextTable) {
        let rendered = table.render(self.color);
        self.out.push_str(&rendered);
    }
}

fn run_header(t: &mut Terminal, report: &Report) {
    t.title(&format!("llm-replay run {}", report.run.id));
    t.line(format_args!("started   {}", report.run.started_at));
    t.line(format_args!("duration  {:.2} s", report.run.duration_s));
    t.line(format_args!("target    {}", report.run.target));
    t.line(format_args!("load      {}", format::load(report)));
    if let Some(skew) = report.run.start_skew_text() {
        t.line(format_args!("skew      {skew}"));
    }
}

fn workers_table(t: &mut Terminal, report: &Report) {
    if report.run.workers.is_empty() {
        return;
    }
    t.out.push('\n');
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
    t.table(&workers);
}

fn llm_metrics(t: &mut Terminal, report: &Report) {
    t.section("LLM metrics");
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
    t.table(&metrics);
}

fn requests_lines(t: &mut Terminal, report: &Report) {
    t.section("Requests");
    let r = &report.requests;
    t.line(format_args!(
        "total            {}",
        format::total_line(report)
    ));
    t.line(format_args!(
        "failed by kind   {}",
        format::failed_by_kind(report)
    ));
    t.line(format_args!(
        "status codes     {}",
        format::status_codes(report)
    ));
    t.line(format_args!(
        "output tokens    {}",
        format::token_sources(report)
    ));
    if r.warmup > 0 {
        t.line(format_args!(
            "warm-up          {} requests excluded",
            r.warmup
        ));
    }
    if r.resent > 0 {
        t.line(format_args!(
            "resent           {} (a reused connection closed before any response byte; sent once more on a fresh one)",
            r.resent
        ));
    }
    if let Some(line) = format::connections_line(report) {
        t.line(format_args!("protocols        {line}"));
    }
    if let Some(line) = format::coalesced_line(report) {
        t.line(format_args!("coalesced        {line}"));
    }
}

fn error_table(t: &mut Terminal, report: &Report) {
    let errors = super::errors::error_rows(report);
    if errors.is_empty() {
        return;
    }
    t.section("Errors (what the server said)");
    let mut table = TextTable::new(&["failure", "count", "message"], &[0, 2]);
    for row in errors {
        table.row(vec![row.what, row.count.to_string(), row.message], None);
    }
    t.table(&table);
}

fn throughput_lines(t: &mut Terminal, report: &Report) {
    t.section("Throughput");
    t.line(format_args!(
        "output tokens/s   {}  (whole run)",
        format::rate(report.llm.output_tokens_per_second)
    ));
    t.line(format_args!(
        "requests/s        {}  (whole run)",
        format::rate(report.llm.requests_per_second)
    ));
    t.line(format_args!(
        "measured window   {}",
        report.llm.measured_window_s.map_or_else(
            || format::NO_VALUE.to_string(),
            |s| format!(
                "{s:.2} s (whole run: first request sent → last outcome of any kind, failures included)"
            )
        )
    ));
    for (label, value) in windows::steady_rows(report) {
        t.line(format_args!("{label}   {value}"));
    }
}

fn goodput_lines(t: &mut Terminal, report: &Report) {
    let goodput = format::report_goodput_rows(report);
    if goodput.is_empty() {
        return;
    }
    t.section("Goodput (requests that succeeded within every SLO)");
    let width = goodput
        .iter()
        .map(|(label, _)| label.chars().count())
        .max()
        .unwrap_or(0);
    for (label, value) in goodput {
        t.line(format_args!("{label:<width$}  {value}"));
    }
}

fn transient_lines(t: &mut Terminal, report: &Report) {
    let transients = super::transients::transient_lines(report);
    if transients.is_empty() {
        return;
    }
    t.section("Over time (stretches far worse than the rest of the run)");
    for line in transients {
        t.line(line);
    }
    t.line(format_args!("({})", super::transients::HOW_JUDGED));
}

fn faithful_lines(t: &mut Terminal, report: &Report) {
    let faithful = windows::faithful_lines(report);
    if faithful.is_empty() {
        return;
    }
    t.section("Faithful replay");
    for line in faithful {
        t.line(line);
    }
}

fn server_section(t: &mut Terminal, report: &Report) {
    if let Some(view) = server_side::server_view(report) {
        t.section("Server (what its /metrics said during the run)");
        let tables = server_tables(&view, t.color);
        t.out.push_str(&tables);
    }
}

fn baseline_table(t: &mut Terminal, report: &Report) {
    let Some(baseline) = &report.baseline else {
        return;
    };
    t.section(&format!("Baseline comparison ({})", baseline.source));
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
    t.table(&table);
    t.line(HIGHLIGHT_NOTE);
    if format::any_coalesced(report) {
        t.line(format::COALESCED_NOTE);
    }
}

fn sweep_table(t: &mut Terminal, report: &Report) {
    if report.sweep.is_empty() {
        return;
    }
    t.section("Concurrency sweep");
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
    t.table(&table);
}

fn capacity_section(t: &mut Terminal, report: &Report) {
    if let Some(capacity) = &report.capacity {
        capacity_block(&mut t.out, capacity, t.color);
    }
}

fn goal_table(t: &mut Terminal, report: &Report) {
    if report.goals.is_empty() {
        return;
    }
    t.section("Goals (a goal fails when its condition holds)");
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
    t.table(&table);
    let failed = report.goals.iter().filter(|g| g.failed).count();
    t.line(format_args!(
        "{} goals, {} failed",
        report.goals.len(),
        failed
    ));
}

fn warning_lines(t: &mut Terminal, report: &Report) {
    if report.warnings.is_empty() {
        return;
    }
    t.section("Warnings");
    for warning in &report.warnings {
        t.line(format_args!("- {warning}"));
    }
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
            format::dimension_label(capacity.dimension),
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
    let dimension = capacity.dimension.name();
    let mut header: Vec<&str> = vec!["#", dimension, "result", "judged on"];
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
