//! The Markdown rendering of a report (`--report-md`), for pull-request comments and CI job
//! summaries: a verdict line, the headline table with the baseline, the goodput (`--slo`),
//! the capacity search's answer and probes (`--find-max`), a throughput sparkline, the
//! regressions, the goals, the sweep, the server's side (its `/metrics`) and the warnings,
//! always under [`MAX_LINES`] lines
//! and without links (long lists are cut with a count of what was left out; the JSON and HTML
//! reports hold everything).

use std::fmt::Write as _;

use common::metrics::Metric;

use super::Report;
use super::format;
use super::server_side::{self, DIFFERENCE_NOTE};

/// The rendering never reaches this many lines, whatever the report holds.
pub const MAX_LINES: usize = 60;

/// Caps that keep the comment under [`MAX_LINES`]: regressions, goals, sweep levels, warnings.
const MAX_REGRESSIONS: usize = 5;
const MAX_GOALS: usize = 8;
const MAX_LEVELS: usize = 8;
const MAX_WARNINGS: usize = 3;
/// Capacity probes shown (the JSON and HTML reports have them all).
const MAX_PROBES: usize = 10;
/// Width of the throughput sparkline, characters.
const SPARKLINE_WIDTH: usize = 40;

/// The headline rows: short label and the metric behind it.
const HEADLINE: [(&str, Metric); 5] = [
    ("TTFT (ms)", Metric::Ttft),
    ("TTST (ms)", Metric::Ttst),
    ("ITL (ms)", Metric::Itl),
    ("Request latency (ms)", Metric::Latency),
    ("Output tokens/s per user", Metric::TokensPerSecondPerUser),
];
use super::windows;

/// Render `report` as Markdown.
pub fn render_markdown(report: &Report) -> String {
    let mut out = String::new();
    verdict(&mut out, report);
    headline(&mut out, report);
    goodput(&mut out, report);
    capacity(&mut out, report);
    sparkline_line(&mut out, report);
    transients(&mut out, report);
    regressions(&mut out, report);
    errors(&mut out, report);
    faithful(&mut out, report);
    goals(&mut out, report);
    sweep(&mut out, report);
    server(&mut out, report);
    warnings(&mut out, report);
    fit(out)
}

/// The note that ends a rendering cut to fit [`MAX_LINES`].
const CUT_NOTE: &str = "*… cut to fit a comment; the JSON and HTML reports hold everything*";

/// `out`, or when every section at its cap still adds up to [`MAX_LINES`] lines or more, its
/// first lines and [`CUT_NOTE`]: the promise to stay under the limit holds whatever the
/// report holds.
fn fit(out: String) -> String {
    if out.lines().count() < MAX_LINES {
        return out;
    }
    let mut cut: String = out
        .lines()
        .take(MAX_LINES - 3)
        .flat_map(|line| [line, "\n"])
        .collect();
    // A blank line first, so the note never becomes a row of the table it follows.
    let _ = writeln!(cut, "\n{CUT_NOTE}");
    cut
}

/// Error-summary rows shown at most (the JSON has them all), on one line to keep the
/// comment under [`MAX_LINES`].
const MAX_ERROR_ROWS: usize = 3;

/// What the server said to the failed requests: the most frequent kinds, statuses and
/// messages.
fn errors(out: &mut String, report: &Report) {
    let rows = super::errors::error_rows(report);
    if rows.is_empty() {
        return;
    }
    let mut items: Vec<String> = rows
        .iter()
        .take(MAX_ERROR_ROWS)
        .map(|row| {
            format!(
                "{} ×{}: {}",
                plain(&row.what),
                row.count,
                plain(&row.message)
            )
        })
        .collect();
    if rows.len() > MAX_ERROR_ROWS {
        items.push(format!(
            "{} more in the JSON report",
            rows.len() - MAX_ERROR_ROWS
        ));
    }
    let _ = writeln!(
        out,
        "\n**Errors (what the server said):** {}",
        items.join(" · ")
    );
}

/// Pinned lengths, session mode and sampling: one line per setting used.
fn faithful(out: &mut String, report: &Report) {
    let lines = windows::faithful_lines(report);
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n**Faithful replay**");
    for line in &lines {
        let _ = writeln!(out, "- {}", plain(line));
    }
}

fn regression_count(report: &Report) -> usize {
    format::comparison_rows(report)
        .iter()
        .filter(|r| r.highlight())
        .count()
}

fn verdict(out: &mut String, report: &Report) {
    let failed = report.goals.iter().filter(|g| g.failed).count();
    let goals = match (report.goals.len(), failed) {
        (0, _) => None,
        (n, 0) => Some(format!("✅ all {n} goals held")),
        (n, f) => Some(format!("❌ {f} of {n} goals failed")),
    };
    let regressions = report
        .baseline
        .as_ref()
        .map(|_| match regression_count(report) {
            0 => "no regression against the baseline".to_string(),
            1 => "⚠️ 1 regression".to_string(),
            n => format!("⚠️ {n} regressions"),
        });
    let capacity = report.capacity.as_ref().map(|c| match c.max {
        Some(max) => format!(
            "max {} {}",
            plain(c.dimension.name()),
            format::load_value(max)
        ),
        None => format!("❌ even the lowest {} fails", plain(c.dimension.name())),
    });
    let parts: Vec<String> = capacity
        .into_iter()
        .chain(goals)
        .chain(regressions)
        .collect();
    let summary = if parts.is_empty() {
        "run finished".to_string()
    } else {
        parts.join(" · ")
    };
    let _ = writeln!(out, "## llm-replay: {summary}\n");
    let r = &report.requests;
    let mut line = format!(
        "Run `{}` · {:.1} s · target `{}` · {} requests: {} succeeded, {} failed, {} ended early",
        code(&report.run.id),
        report.run.duration_s,
        code(&report.run.target),
        r.total,
        r.succeeded,
        r.failed,
        r.ended_early
    );
    if r.cancelled_as_recorded > 0 {
        let _ = write!(line, ", {} cancelled as recorded", r.cancelled_as_recorded);
    }
    if r.cancelled_by_rate > 0 {
        let _ = write!(line, ", {} cancelled by --cancel-rate", r.cancelled_by_rate);
    }
    if r.lost + r.not_started > 0 {
        let _ = write!(line, ", {} lost, {} not started", r.lost, r.not_started);
    }
    if r.resent > 0 {
        let _ = write!(line, " ({} resent on a fresh connection)", r.resent);
    }
    let _ = write!(line, " · load: {}", plain(&format::load(report)));
    if let Some(connections) = format::connections_line(report) {
        let _ = write!(line, " · protocols {connections}");
    }
    if let Some(last) = report.sweep.last() {
        let _ = write!(
            line,
            " · sweep of {} levels (the table shows the last, concurrency {})",
            report.sweep.len(),
            last.concurrency
        );
    }
    if let Some(skew) = report.run.start_skew_text() {
        let _ = write!(line, " · start skew {skew}");
    }
    if let Some(baseline) = &report.baseline {
        let _ = write!(line, " · baseline: {}", plain(&baseline.source));
    }
    let _ = writeln!(out, "{line}");
}

fn headline(out: &mut String, report: &Report) {
    let has_baseline = report.baseline.is_some();
    if has_baseline {
        let _ = writeln!(
            out,
            "\n| | p50 | p95 | p99 | baseline p95 | change |\n|---|--:|--:|--:|--:|--:|"
        );
    } else {
        let _ = writeln!(out, "\n| | p50 | p95 | p99 |\n|---|--:|--:|--:|");
    }
    let changes = report.baseline.as_ref().map(|b| &b.changes);
    for (label, metric) in HEADLINE {
        let stats = report.llm.stats(metric);
        let cell = |pick: fn(&common::metrics::Stats) -> f64| {
            stats.map_or_else(
                || format::NO_VALUE.to_string(),
                |s| format::metric_value(metric, pick(&s), false),
            )
        };
        let mut row = format!(
            "| {label} | {} | {} | {} |",
            cell(|s| s.p50),
            cell(|s| s.p95),
            cell(|s| s.p99)
        );
        if let Some(changes) = changes {
            let change = changes.get(&super::change_key(metric, crate::goals::Stat::P95));
            let base = report
                .baseline
                .as_ref()
                .and_then(|b| b.llm.stats(metric))
                .map_or_else(
                    || format::NO_VALUE.to_string(),
                    |s| format::metric_value(metric, s.p95, false),
                );
            let _ = write!(row, " {base} | {} |", change_cell(change.copied()));
        }
        let _ = writeln!(out, "{row}");
    }
    // Connection setup, measured apart from TTFT: shown when connections were timed; time
    // to failure when something failed.
    for metric in Metric::CONNECTION.into_iter().chain(Metric::FAILURE) {
        let Some(stats) = report.llm.stats(metric) else {
            continue;
        };
        let cell = |v: f64| format::metric_value(metric, v, false);
        let tail = if has_baseline { " | |" } else { "" };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |{tail}",
            metric.label(),
            cell(stats.p50),
            cell(stats.p95),
            cell(stats.p99)
        );
    }
    let rates = [
        (
            format::OUTPUT_THROUGHPUT_LABEL,
            report.llm.output_tokens_per_second,
            "output_tokens_per_second",
            report
                .baseline
                .as_ref()
                .and_then(|b| b.llm.output_tokens_per_second),
        ),
        (
            format::REQUEST_THROUGHPUT_LABEL,
            report.llm.requests_per_second,
            "requests_per_second",
            report
                .baseline
                .as_ref()
                .and_then(|b| b.llm.requests_per_second),
        ),
    ];
    for (label, value, key, base) in rates {
        let mut row = format!("| {label} | {} | | |", format::rate(value));
        if let Some(changes) = changes {
            let _ = write!(
                row,
                " {} | {} |",
                format::rate(base),
                change_cell(changes.get(key).copied())
            );
        }
        let _ = writeln!(out, "{row}");
    }
    // The figures above are over the whole run; these over the steady window alone.
    for (label, value) in windows::steady_rows(report) {
        let extra = if changes.is_some() { " | |" } else { "" };
        let _ = writeln!(out, "| {label} | {value} | |{extra}");
    }
    let k = &report.requests.failed_by_kind;
    let kinds: Vec<String> = [
        ("status", k.status),
        ("error frame", k.error_frame),
        ("transport", k.transport),
        ("timeout", k.timeout),
        ("empty", k.empty),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(kind, n)| {
        if kind == "status" {
            format!("{kind} {n} [{}]", failed_status_codes(report))
        } else {
            format!("{kind} {n}")
        }
    })
    .collect();
    let rate = report
        .requests
        .error_rate_pct()
        .map_or_else(|| format::NO_VALUE.to_string(), |p| format!("{p:.1} %"));
    let errors = if kinds.is_empty() {
        format!("{} ({rate})", report.requests.failed)
    } else {
        format!("{} ({rate}: {})", report.requests.failed, kinds.join(", "))
    };
    let tail = if has_baseline { " | |" } else { "" };
    let _ = writeln!(out, "| Errors | {errors} | | |{tail}");
}

/// `500 ×20 · 429 ×5`: the codes of the requests that failed by status, most frequent
/// first.
fn failed_status_codes(report: &Report) -> String {
    let mut codes: Vec<(u16, u64)> = report
        .requests
        .status_codes
        .iter()
        .filter(|(code, _)| **code >= 300)
        .map(|(code, n)| (*code, *n))
        .collect();
    codes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    if codes.is_empty() {
        return format::NO_VALUE.to_string();
    }
    codes
        .iter()
        .map(|(code, n)| format!("{code} ×{n}"))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// `**+12.0 % ▲**` for a highlighted change, `+3.1 %` otherwise, `-` when not compared.
fn change_cell(change: Option<super::Change>) -> String {
    let text = change_cell_text(change);
    match change {
        Some(c) if c.coalesced => format!("{text} {} (coalesced)", format::COALESCED_MARKER),
        _ => text,
    }
}

fn change_cell_text(change: Option<super::Change>) -> String {
    match change {
        Some(c) if c.flagged() => format!("**{} ▲**", format::signed_pct(c.change_pct)),
        Some(c) if c.within_noise() => {
            format!("{} (within noise)", format::signed_pct(c.change_pct))
        }
        Some(c) => format::signed_pct(c.change_pct),
        None => format::NO_VALUE.to_string(),
    }
}

fn sparkline_line(out: &mut String, report: &Report) {
    let values: Vec<f64> = report
        .timeline
        .iter()
        .map(|p| p.output_tokens_per_s)
        .collect();
    if let Some(line) = sparkline(&values, SPARKLINE_WIDTH) {
        let span = report.timeline.last().map_or(0.0, |p| p.t_s);
        let max = values.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "\nOutput tokens/s over the run ({span:.0} s, peak {max:.0}): `{line}`"
        );
    }
}

/// Stretches of the timeline far worse than the rest of the run (see
/// [`super::transients`]).
fn transients(out: &mut String, report: &Report) {
    let lines = super::transients::transient_lines(report);
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n**Over time:** {}.", lines.join("; "));
}

/// A block-character sparkline of `values`, averaged down to at most `width` characters;
/// `None` for fewer than two values.
pub(super) fn sparkline(values: &[f64], width: usize) -> Option<String> {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if values.len() < 2 || width == 0 {
        return None;
    }
    let buckets = values.len().min(width);
    let averaged: Vec<f64> = (0..buckets)
        .map(|b| {
            let from = b * values.len() / buckets;
            let to = ((b + 1) * values.len() / buckets).max(from + 1);
            values[from..to].iter().sum::<f64>() / (to - from) as f64
        })
        .collect();
    let max = averaged.iter().copied().fold(0.0, f64::max);
    Some(
        averaged
            .iter()
            .map(|v| {
                let level = if max > 0.0 { v / max * 7.0 } else { 0.0 };
                BLOCKS[(level.round() as usize).min(7)]
            })
            .collect(),
    )
}

fn regressions(out: &mut String, report: &Report) {
    if report.baseline.is_none() {
        return;
    }
    let mut label = String::new();
    let mut items = Vec::new();
    for row in format::comparison_rows(report) {
        if !row.label.is_empty() {
            label = row.label.clone();
        }
        if row.highlight() {
            let stat = if row.stat.is_empty() {
                String::new()
            } else {
                format!(" {}", row.stat)
            };
            items.push(format!(
                "- **{}{stat}**: {} → {} ({})",
                plain(&label),
                row.baseline,
                row.replayed,
                row.change
            ));
        }
    }
    if items.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n### Regressions (10 % or more worse than the baseline)"
    );
    capped(out, &items, MAX_REGRESSIONS, |n| {
        format!("- {}", more_text(n, "regression", "regressions"))
    });
}

fn goals(out: &mut String, report: &Report) {
    if report.goals.is_empty() {
        return;
    }
    let failed = report.goals.iter().filter(|g| g.failed).count();
    let _ = writeln!(
        out,
        "\n### Goals ({failed} of {} failed)\n| | Fail if | Value | Threshold |\n|---|---|--:|--:|",
        report.goals.len()
    );
    // Failed goals first: they are the ones a reviewer must see when the list is cut.
    let mut ordered: Vec<_> = report.goals.iter().filter(|g| g.failed).collect();
    ordered.extend(report.goals.iter().filter(|g| !g.failed));
    let rows: Vec<String> = ordered
        .iter()
        .map(|goal| {
            format!(
                "| {} | `{}` | {} | {} |",
                if goal.failed { "❌" } else { "✅" },
                code(&goal.expr),
                format::goal_number(goal.value),
                format::goal_number(Some(goal.threshold))
            )
        })
        .collect();
    let cut_failed = ordered.iter().skip(MAX_GOALS).filter(|g| g.failed).count();
    capped(out, &rows, MAX_GOALS, |n| {
        format!(
            "| | {} | | |",
            more_text(
                n,
                &format!("goal ({cut_failed} failed)"),
                &format!("goals ({cut_failed} failed)")
            )
        )
    });
}

/// The goodput with `--slo`: one line.
fn goodput(out: &mut String, report: &Report) {
    let Some(goodput) = &report.goodput else {
        return;
    };
    let r = &report.requests;
    let _ = writeln!(
        out,
        "\n**Goodput** (within every SLO: {}): {} of {} requests with an outcome good ({}) · \
         {:.2} good requests/s · {:.2} good output tokens/s (whole run)",
        plain(&goodput.slos.join(" · ")),
        goodput.good,
        r.succeeded + r.failed + r.ended_early,
        format::pct(goodput.good_share_pct),
        goodput.requests_per_second,
        goodput.output_tokens_per_second
    );
}

/// The capacity search: its answer, then the probes in the order they ran.
fn capacity(out: &mut String, report: &Report) {
    let Some(capacity) = &report.capacity else {
        return;
    };
    let _ = writeln!(out, "\n### {}\n", plain(&format::capacity_answer(capacity)));
    let with_goodput = capacity.probes.iter().any(|p| p.goodput.is_some());
    let (goodput_head, goodput_rule) = if with_goodput {
        (" Goodput req/s |", "--:|")
    } else {
        ("", "")
    };
    let with_server = capacity.probes.iter().any(|p| p.server.is_some());
    let (server_head, server_rule) = if with_server {
        (
            format!(
                " {} |",
                plain(&format::capitalized(
                    &server_side::sampled_queue_max_header(capacity.sample_interval_s)
                ))
            ),
            "--:|",
        )
    } else {
        (String::new(), "")
    };
    let _ = writeln!(
        out,
        "| # | {} | Result | Judged on | Goal values |{goodput_head}{server_head} Failed goals |\n\
         |--:|--:|---|---|---|{goodput_rule}{server_rule}---|",
        plain(&format::capitalized(&format::dimension_label(
            capacity.dimension
        )))
    );
    let rows: Vec<String> = capacity
        .probes
        .iter()
        .enumerate()
        .map(|(i, probe)| {
            let goodput = if with_goodput {
                format!(" {} |", format::goodput_cell(probe.goodput.as_ref()))
            } else {
                String::new()
            };
            let queue = if with_server {
                format!(" {} |", server_side::server_queue_cell(probe))
            } else {
                String::new()
            };
            let failed = if probe.failed_goals.is_empty() {
                String::new()
            } else {
                format!("`{}`", code(&probe.failed_goals.join("; ")))
            };
            format!(
                "| {} | {} | {} {} | {} | {} |{goodput}{queue} {failed} |",
                i + 1,
                format::load_value(probe.value),
                if probe.incomplete.is_some() {
                    "⏸"
                } else if probe.passed {
                    "✅"
                } else {
                    "❌"
                },
                format::probe_result(probe),
                plain(&probe.judged_on),
                plain(&format::probe_values(probe)),
            )
        })
        .collect();
    let columns = 6 + usize::from(with_goodput) + usize::from(with_server);
    capped(out, &rows, MAX_PROBES, |n| {
        format!(
            "| | {} |{}",
            more_text(n, "probe", "probes"),
            " |".repeat(columns - 2)
        )
    });
    let _ = writeln!(
        out,
        "\nSearch: {} ({}).",
        plain(&capacity.stopped),
        plain(&format::search_time(capacity))
    );
    if let Some(line) = format::limit_line(capacity) {
        let _ = writeln!(out, "\n**{}**", plain(&format::capitalized(&line)));
    }
    for line in format::probe_notes(capacity) {
        let _ = writeln!(out, "- {}", plain(&line));
    }
}

fn sweep(out: &mut String, report: &Report) {
    if report.sweep.is_empty() {
        return;
    }
    let with_goodput = report.sweep.iter().any(|level| level.goodput.is_some());
    let (goodput_head, goodput_rule) = if with_goodput {
        (" Goodput req/s |", "--:|")
    } else {
        ("", "")
    };
    let with_server = report.sweep.iter().any(|level| level.server.is_some());
    let (server_head, server_rule) = if with_server {
        (" Server queue max |", "--:|")
    } else {
        ("", "")
    };
    let _ = writeln!(
        out,
        "\n### Concurrency sweep\n| Concurrency | Output tokens/s | TTFT p95 (ms) | ITL p95 (ms) | Requests/s | Failed |{goodput_head}{server_head}\n|--:|--:|--:|--:|--:|--:|{goodput_rule}{server_rule}"
    );
    let rows: Vec<String> = report
        .sweep
        .iter()
        .map(|level| {
            let p95 = |metric: Metric| {
                level
                    .llm
                    .stats(metric)
                    .map_or_else(|| format::NO_VALUE.to_string(), |s| format!("{:.2}", s.p95))
            };
            let goodput = if with_goodput {
                format!(" {} |", format::goodput_cell(level.goodput.as_ref()))
            } else {
                String::new()
            };
            let queue = if with_server {
                format!(" {} |", server_side::queue_max_cell(level.server.as_ref()))
            } else {
                String::new()
            };
            format!(
                "| {} | {} | {} | {} | {} | {} |{goodput}{queue}",
                level.concurrency,
                format::rate(level.llm.output_tokens_per_second),
                p95(Metric::Ttft),
                p95(Metric::Itl),
                format::rate(level.llm.requests_per_second),
                level.requests.failed
            )
        })
        .collect();
    let tail = " |".repeat(usize::from(with_goodput) + usize::from(with_server));
    capped(out, &rows, MAX_LEVELS, |n| {
        format!("| | {} | | | | |{tail}", more_text(n, "level", "levels"))
    });
}

/// The server's side in a few lines: its endpoints on one line, the gauges and counters of
/// known servers on another, its TTFT and latency beside the client's in a small table.
fn server(out: &mut String, report: &Report) {
    let Some(view) = server_side::server_view(report) else {
        return;
    };
    let endpoints: Vec<String> = view
        .endpoints
        .iter()
        .map(|e| {
            let mut text = format!("`{}` {} scrapes", code(&e.url), e.scrapes);
            match e.errors {
                0 => {}
                1 => text.push_str(", 1 error"),
                n => {
                    let _ = write!(text, ", {n} errors");
                }
            }
            if !e.note.is_empty() {
                let _ = write!(text, ": {}", plain(&e.note));
            }
            text
        })
        .collect();
    let _ = writeln!(
        out,
        "\n**Server** (its `/metrics`: {})",
        if endpoints.is_empty() {
            "no endpoint".to_string()
        } else {
            endpoints.join(" · ")
        }
    );
    if let Some(note) = &view.none_answered {
        let _ = writeln!(out, "\n{}", plain(note));
    }
    let (timing, others): (Vec<_>, Vec<_>) =
        view.rows.iter().partition(|row| !row.client.is_empty());
    let mut items: Vec<String> = others
        .iter()
        .map(|row| format!("{} {}", plain(&row.what), plain(&row.server)))
        .collect();
    items.extend(server_side::other_families_text(&view).map(|t| plain(&t)));
    if !items.is_empty() {
        let _ = writeln!(out, "\n{}", items.join("; "));
    }
    if timing.is_empty() {
        return;
    }
    // One line per timing family: its p50, p90 and p99 in each cell.
    let _ = writeln!(
        out,
        "\n| p50 / p90 / p99 (ms) | Server | Client | Difference ({DIFFERENCE_NOTE}) |\n|---|--:|--:|--:|"
    );
    let mut groups: Vec<Vec<&server_side::ServerRow>> = Vec::new();
    for row in timing {
        match groups.last_mut() {
            Some(group)
                if group.first().is_some_and(|first| {
                    first.measure == row.measure && first.family == row.family
                }) =>
            {
                group.push(row);
            }
            _ => groups.push(vec![row]),
        }
    }
    for group in groups {
        let cells = |pick: fn(&server_side::ServerRow) -> &str| {
            group
                .iter()
                .map(|row| pick(row))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let _ = writeln!(
            out,
            "| {} (server: `{}`) | {} | {} | {} |",
            plain(group[0].measure),
            code(&group[0].family),
            cells(|r| &r.server),
            cells(|r| &r.client),
            cells(|r| &r.difference)
        );
    }
}

fn warnings(out: &mut String, report: &Report) {
    if report.warnings.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n### Warnings");
    let items: Vec<String> = report
        .warnings
        .iter()
        .map(|w| format!("- {}", plain(w)))
        .collect();
    capped(out, &items, MAX_WARNINGS, |n| {
        format!("- {}", more_text(n, "warning", "warnings"))
    });
}

/// The first `max` lines of `items`, then one more line (a list item or a table row, from
/// `more(left out)`) saying how many the JSON and HTML reports have besides.
fn capped(out: &mut String, items: &[String], max: usize, more: impl Fn(usize) -> String) {
    for item in items.iter().take(max) {
        let _ = writeln!(out, "{item}");
    }
    if items.len() > max {
        let _ = writeln!(out, "{}", more(items.len() - max));
    }
}

/// `… and 3 more regressions in the JSON and HTML reports` (singular for one).
fn more_text(n: usize, singular: &str, plural: &str) -> String {
    format!(
        "*… and {n} more {} in the JSON and HTML reports*",
        if n == 1 { singular } else { plural }
    )
}

/// Text from a recording, a peer, a server or a saved report made safe on one Markdown line,
/// outside code (it goes into pull-request comments): no raw HTML (`<`, `>`, `&` as
/// entities; quotes need none outside a tag, and stay readable), no links or images (`[`,
/// `]` escaped; a word holding `://` or starting `www.` goes into a code span, which GitHub
/// never autolinks, and which copies as the URL itself), no emphasis or code spans (`*`,
/// `_`, `` ` ``, `~`, `\` escaped), table cells kept whole (`|` escaped, line breaks
/// flattened) and no control characters.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars() {
        if c.is_whitespace() {
            plain_word(&word, &mut out);
            word.clear();
            // Line breaks would end a table row; other blanks (tabs, Unicode spaces) read
            // the same as a space.
            out.push(' ');
        } else {
            word.push(c);
        }
    }
    plain_word(&word, &mut out);
    out
}

/// One whitespace-free word of [`plain`]: a URL as a code span, anything else escaped.
fn plain_word(word: &str, out: &mut String) {
    let lower = word.to_ascii_lowercase();
    if lower.contains("://") || lower.starts_with("www.") {
        out.push('`');
        out.push_str(&code(word));
        out.push('`');
        return;
    }
    for c in word.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '|' | '[' | ']' | '*' | '_' | '`' | '~' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if common::text::is_unsafe_on_terminal(c) => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
}

/// Text made safe inside an inline code span on one line: HTML and links are inert there
/// (GitHub neither renders nor links inside code), so only what could end the span (a
/// backtick), break the line or the table cell (`|`), or act on a terminal is replaced.
fn code(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '`' => "'".to_string(),
            '|' => "\\|".to_string(),
            '\n' | '\r' => " ".to_string(),
            c if common::text::is_unsafe_on_terminal(c) => "\u{fffd}".to_string(),
            c => c.to_string(),
        })
        .collect()
}
