//! The HTML rendering of a report (`--report-html`): one self-contained file with inline CSS
//! and inline SVG charts and no script, so it opens from a CI artifact store or an e-mail as
//! it is, follows the reader's light or dark scheme, and prints on white.
//!
//! Order: headline numbers (goodput among them with `--slo`), the capacity search (its
//! answer, each goal's knee against the load, the probes), regressions against the
//! baseline, goals, warnings, the TTFT and ITL distributions (baseline overlaid), the run
//! over time, the server's side (its `/metrics`: the known families beside the client's
//! numbers, plotted over the run), the concurrency sweep's knee plots, then the full tables
//! (metrics, requests, throughput, goodput, comparison, workers).

use std::fmt::Write as _;

use common::metrics::{Metric, Stats};

use super::escape::esc;
use super::format::{self, HIGHLIGHT_NOTE, STAT_COLUMNS};
use super::server_side::{self, DIFFERENCE_NOTE, QUEUE_MAX_HEADER};
use super::svg::{BASELINE_COLOR, Band, Chart, Marker, Rule, RuleAt, Series, SeriesKind};
use super::{CapacitySection, Change, Report, TimelinePoint};
use crate::server_metrics::Role;

/// Colours of the light scheme (also used when printing).
const LIGHT: &str = "--bg:#ffffff;--fg:#1f2328;--muted:#59636e;--border:#d0d7de;--head:#f6f8fa;\
--grid:#e4e7eb;--bad-bg:#ffebe9;--bad-fg:#a40e26;--good-bg:#dafbe1;--good-fg:#116329;\
--warn-bg:#fff8c5;--band:rgba(9,105,218,.07);--c0:#0969da;--c1:#bc4c00;--c2:#1a7f37;\
--c3:#8250df;--c4:#cf222e;--c9:#6e7781";

/// Colours of the dark scheme.
const DARK: &str = "--bg:#0d1117;--fg:#e6edf3;--muted:#9198a1;--border:#3d444d;--head:#151b23;\
--grid:#262c36;--bad-bg:#3c1618;--bad-fg:#ff9492;--good-bg:#0f2d1a;--good-fg:#6fdd8b;\
--warn-bg:#3a2e05;--band:rgba(88,166,255,.10);--c0:#58a6ff;--c1:#f0883e;--c2:#3fb950;\
--c3:#bc8cff;--c4:#ff7b72;--c9:#9198a1";
use super::windows;

const STYLE: &str = "\
*{box-sizing:border-box}\
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1280px;\
padding:0 1rem;color:var(--fg);background:var(--bg);line-height:1.4}\
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid var(--border);padding-bottom:.2rem}\
table{border-collapse:collapse;margin:.5rem 0}\
th,td{border:1px solid var(--border);padding:.25rem .6rem}\
th{background:var(--head);text-align:left}\
td.n{text-align:right;font-variant-numeric:tabular-nums}\
tr.worse td{background:var(--bad-bg);color:var(--bad-fg);font-weight:600}\
tr.fail td{background:var(--bad-bg);color:var(--bad-fg)}tr.pass td{background:var(--good-bg);color:var(--good-fg)}\
tr.warn td{background:var(--warn-bg)}\
code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace}\
.note{color:var(--muted);font-size:.9rem}\
.cards{display:flex;flex-wrap:wrap;gap:.6rem;margin:1rem 0}\
.card{border:1px solid var(--border);border-radius:6px;padding:.5rem .8rem;min-width:10rem}\
.card .label{color:var(--muted);font-size:.85rem}.card .value{font-size:1.35rem;font-variant-numeric:tabular-nums}\
.card .change{font-size:.85rem;color:var(--muted)}\
.card.worse{border-color:var(--bad-fg);background:var(--bad-bg)}.card.worse .change{color:var(--bad-fg);font-weight:600}\
.callout{border-left:4px solid var(--border);padding:.4rem .8rem;margin:1rem 0;background:var(--head)}\
.callout.bad{border-color:var(--bad-fg);background:var(--bad-bg)}.callout.good{border-color:var(--good-fg);background:var(--good-bg)}\
.callout ul{margin:.3rem 0}\
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:1rem}\
figure.plot{margin:0;border:1px solid var(--border);border-radius:6px;padding:.3rem}\
figure.plot svg{display:block;width:100%;height:auto}\
figcaption{font-size:.85rem;color:var(--muted);text-align:center}\
svg text{fill:var(--fg);font-size:11px;font-family:inherit}\
svg .tick,svg .band-label{fill:var(--muted)}svg .axis-label{font-size:12px}svg .legend{font-size:11.5px}\
svg .grid{stroke:var(--grid);stroke-width:1}svg .frame{fill:none;stroke:var(--border)}\
svg .band{fill:var(--band)}svg .empty{fill:var(--muted);font-size:14px}\
svg .rule{stroke-width:1.5}svg .rule-label{font-size:11.5px;font-weight:600}\
svg .line{fill:none;stroke-width:2;stroke-linejoin:round;stroke-linecap:round}svg .dashed{stroke-dasharray:6 4}\
.s0{stroke:var(--c0)}.s1{stroke:var(--c1)}.s2{stroke:var(--c2)}.s3{stroke:var(--c3)}.s4{stroke:var(--c4)}.s9{stroke:var(--c9)}\
.f0{fill:var(--c0)}.f1{fill:var(--c1)}.f2{fill:var(--c2)}.f3{fill:var(--c3)}.f4{fill:var(--c4)}.f9{fill:var(--c9)}\
.bar{display:inline-block;width:5rem;height:.6rem;background:var(--grid);margin-left:.4rem;vertical-align:middle}\
.bar>span{display:block;height:100%;background:var(--c0)}tr.warn .bar>span{background:var(--c4)}\
@media print{body{margin:0;max-width:none;font-size:10pt}\
.plots{grid-template-columns:1fr 1fr}figure,table,.card,.callout{break-inside:avoid}h2{break-after:avoid}}";

/// Render `report` as a standalone HTML page.
pub fn render_html(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n\
         <meta name=\"color-scheme\" content=\"light dark\">\n\
         <title>llm-replay run {id}</title>\n<style>:root{{{LIGHT}}}\
         @media (prefers-color-scheme:dark){{:root{{{DARK}}}}}\
         @media print{{:root{{{LIGHT}}}}}{STYLE}</style>\n</head>\n<body>\n\
         <h1>llm-replay run <code>{id}</code></h1>\n",
        id = esc(&report.run.id)
    );
    run_table(&mut out, report);
    headline(&mut out, report);
    capacity(&mut out, report);
    regressions(&mut out, report);
    goals(&mut out, report);
    warnings(&mut out, report);
    distributions(&mut out, report);
    over_time(&mut out, report);
    server(&mut out, report);
    sweep(&mut out, report);
    metrics_tables(&mut out, report);
    comparison(&mut out, report);
    workers(&mut out, report);
    let _ = writeln!(out, "</body>\n</html>");
    out
}

fn run_table(out: &mut String, report: &Report) {
    let _ = writeln!(out, "<table>");
    let mut rows = vec![
        ("Started", esc(&report.run.started_at)),
        ("Duration", format!("{:.2} s", report.run.duration_s)),
        ("Target", esc(&report.run.target)),
        ("Load", esc(&format::load(report))),
        ("Workers", report.run.workers.len().to_string()),
    ];
    if let Some(skew) = report.run.start_skew_text() {
        rows.push(("Start skew", esc(&skew)));
    }
    if let Some(baseline) = &report.baseline {
        rows.push(("Baseline", esc(&baseline.source)));
    }
    for (name, value) in rows {
        let _ = writeln!(out, "<tr><th>{name}</th><td>{value}</td></tr>");
    }
    let _ = writeln!(out, "</table>");
}

/// The numbers people look at first, each with its change against the baseline.
fn headline(out: &mut String, report: &Report) {
    let changes = report.baseline.as_ref().map(|b| &b.changes);
    let change = |key: &str| changes.and_then(|c| c.get(key)).copied();
    let p95 = |metric: Metric| report.llm.stats(metric).map(|s| s.p95);
    let ms =
        |v: Option<f64>| v.map_or_else(|| format::NO_VALUE.to_string(), |v| format!("{v:.2} ms"));
    let cards: Vec<(&str, String, Option<Change>)> = vec![
        ("TTFT p95", ms(p95(Metric::Ttft)), change("ttft_ms.p95")),
        ("ITL p95", ms(p95(Metric::Itl)), change("itl_ms.p95")),
        (
            "Request latency p95",
            ms(p95(Metric::Latency)),
            change("latency_ms.p95"),
        ),
        (
            "Output throughput",
            format!(
                "{} tokens/s",
                format::rate(report.llm.output_tokens_per_second)
            ),
            change("output_tokens_per_second"),
        ),
        (
            "Request throughput",
            format!(
                "{} requests/s",
                format::rate(report.llm.requests_per_second)
            ),
            change("requests_per_second"),
        ),
        (
            "Errors",
            format!(
                "{} ({})",
                report.requests.failed,
                report
                    .requests
                    .error_rate_pct()
                    .map_or_else(|| format::NO_VALUE.to_string(), |p| format!("{p:.1} %"))
            ),
            None,
        ),
    ];
    let _ = writeln!(out, "<div class=\"cards\" id=\"headline\">");
    for (label, value, change) in cards {
        let worse = change.is_some_and(|c| c.flagged());
        let change_text = match change {
            Some(c) => format!(
                "<div class=\"change\">{} vs baseline{}</div>",
                format::signed_pct(c.change_pct),
                if worse {
                    " ▲ worse"
                } else if c.within_noise() {
                    " (within noise)"
                } else {
                    ""
                }
            ),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "<div class=\"card{}\"><div class=\"label\">{label}</div><div class=\"value\">{value}</div>{change_text}</div>",
            if worse { " worse" } else { "" }
        );
    }
    if let Some(goodput) = &report.goodput {
        let _ = writeln!(
            out,
            "<div class=\"card\" id=\"goodput-card\"><div class=\"label\">Goodput</div>\
             <div class=\"value\">{:.2} requests/s</div><div class=\"change\">{} good, within every SLO</div></div>",
            goodput.requests_per_second,
            format::pct(goodput.good_share_pct)
        );
    }
    if !report.goals.is_empty() {
        let failed = report.goals.iter().filter(|g| g.failed).count();
        let _ = writeln!(
            out,
            "<div class=\"card{}\"><div class=\"label\">Goals</div><div class=\"value\">{} of {} held</div></div>",
            if failed > 0 { " worse" } else { "" },
            report.goals.len() - failed,
            report.goals.len()
        );
    }
    let _ = writeln!(out, "</div>");
}

/// Every comparison at least 10 % worse than the baseline, in one list at the top.
fn regressions(out: &mut String, report: &Report) {
    let Some(baseline) = &report.baseline else {
        return;
    };
    let mut current_label = String::new();
    let mut items = Vec::new();
    for row in format::comparison_rows(report) {
        if !row.label.is_empty() {
            current_label = row.label.clone();
        }
        if row.highlight() {
            let stat = if row.stat.is_empty() {
                String::new()
            } else {
                format!(" {}", row.stat)
            };
            items.push(format!(
                "<li><strong>{}{stat}</strong>: {} → {} ({})</li>",
                esc(&current_label),
                row.baseline,
                row.replayed,
                row.change
            ));
        }
    }
    if items.is_empty() {
        let _ = writeln!(
            out,
            "<div class=\"callout good\" id=\"regressions\">No regression of 10 % or more against the baseline ({}).</div>",
            esc(&baseline.source)
        );
    } else {
        let _ = writeln!(
            out,
            "<div class=\"callout bad\" id=\"regressions\"><strong>{} regression{} of 10 % or more against the baseline ({})</strong>\n<ul>\n{}\n</ul></div>",
            items.len(),
            if items.len() == 1 { "" } else { "s" },
            esc(&baseline.source),
            items.join("\n")
        );
    }
}

fn goals(out: &mut String, report: &Report) {
    if report.goals.is_empty() {
        return;
    }
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

fn warnings(out: &mut String, report: &Report) {
    if report.warnings.is_empty() {
        return;
    }
    let _ = writeln!(out, "<h2>Warnings</h2>\n<ul>");
    for warning in &report.warnings {
        let _ = writeln!(out, "<li>{}</li>", esc(warning));
    }
    let _ = writeln!(out, "</ul>");
}

/// `[value, percent]` pairs of `metric` in `llm`: the saved CDF, or for a report without one
/// the percentiles its summary has.
fn cdf_points(llm: &super::LlmSection, metric: Metric) -> Vec<(f64, f64)> {
    let saved = llm.cdf.as_ref().and_then(|cdf| match metric {
        Metric::Ttft => Some(&cdf.ttft_ms),
        Metric::Itl => Some(&cdf.itl_ms),
        Metric::Latency => Some(&cdf.latency_ms),
        Metric::Connect => Some(&cdf.connect_ms),
        _ => None,
    });
    match saved {
        Some(points) if !points.is_empty() => points.iter().map(|&[v, p]| (v, p)).collect(),
        _ => llm.stats(metric).map_or_else(Vec::new, |s: Stats| {
            vec![
                (s.min, 0.0),
                (s.p50, 50.0),
                (s.p90, 90.0),
                (s.p95, 95.0),
                (s.p99, 99.0),
                (s.max, 100.0),
            ]
        }),
    }
}

/// The value at 99.9 % (or the largest) of a CDF: where its chart's x axis stops.
fn tail(points: &[(f64, f64)]) -> Option<f64> {
    points
        .iter()
        .find(|(_, p)| *p >= 99.9)
        .or(points.last())
        .map(|(v, _)| *v)
}

fn cdf_chart(report: &Report, metric: Metric, id: &'static str, what: &str) -> Chart {
    let run = cdf_points(&report.llm, metric);
    let mut series = vec![Series::line("this run", 0, vec![run.clone()])];
    let mut x_max = tail(&run);
    if let Some(baseline) = &report.baseline {
        let base = cdf_points(&baseline.llm, metric);
        if !base.is_empty() {
            x_max = match (x_max, tail(&base)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            series.push(Series {
                name: format!("baseline ({})", baseline.source),
                color: BASELINE_COLOR,
                dashed: true,
                kind: SeriesKind::Line,
                segments: vec![base],
            });
        }
    }
    Chart {
        id: id.to_string(),
        title: format!("{what}: cumulative distribution (x axis to p99.9)"),
        x_label: format!("{what} (ms)"),
        y_label: "requests at or below (%)".into(),
        series,
        bands: Vec::new(),
        y_range: Some((0.0, 100.0)),
        x_max: x_max.map(|v| v * 1.02),
        height: 300.0,
        x_log: false,
        rules: Vec::new(),
    }
}

fn distributions(out: &mut String, report: &Report) {
    let _ = writeln!(
        out,
        "<h2>Distributions</h2>\n<div class=\"plots\" id=\"distributions\">"
    );
    out.push_str(&cdf_chart(report, Metric::Ttft, "plot-ttft-cdf", "Time to first token").render());
    out.push_str(&cdf_chart(report, Metric::Itl, "plot-itl-cdf", "Inter-token latency").render());
    // Connection setup is timed apart from TTFT (per connection, not per request): plotted
    // when the run opened any.
    if report.llm.connect_ms.is_some() {
        out.push_str(
            &cdf_chart(
                report,
                Metric::Connect,
                "plot-connect-cdf",
                "Connection setup",
            )
            .render(),
        );
    }
    let _ = writeln!(out, "</div>");
}

/// Connected runs of `value(point)` over time: a run breaks at a sweep level's edge and
/// where the value is missing.
fn time_segments(
    points: &[TimelinePoint],
    value: impl Fn(&TimelinePoint) -> Option<f64>,
) -> Vec<Vec<(f64, f64)>> {
    let mut segments: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut level = None;
    let mut open = false;
    for point in points {
        let same_level = level == Some(point.concurrency);
        level = Some(point.concurrency);
        match value(point) {
            Some(v) if v.is_finite() => {
                if !(open && same_level) {
                    segments.push(Vec::new());
                }
                if let Some(segment) = segments.last_mut() {
                    segment.push((point.t_s, v));
                }
                open = true;
            }
            _ => open = false,
        }
    }
    segments
}

/// One shaded band per sweep level, labelled with its concurrency.
fn level_bands(points: &[TimelinePoint]) -> Vec<Band> {
    let mut bands: Vec<Band> = Vec::new();
    let mut current = None;
    for point in points {
        let Some(concurrency) = point.concurrency else {
            continue;
        };
        if current == Some(concurrency)
            && let Some(band) = bands.last_mut()
        {
            band.to = point.t_s;
            continue;
        }
        current = Some(concurrency);
        bands.push(Band {
            from: point.t_s - point.dt_s,
            to: point.t_s,
            label: format!("c={concurrency}"),
        });
    }
    bands
}

fn time_chart(
    points: &[TimelinePoint],
    id: &'static str,
    title: &str,
    y_label: &str,
    series: Vec<Series>,
) -> Chart {
    Chart {
        id: id.to_string(),
        title: title.into(),
        x_label: "time since the load started (s)".into(),
        y_label: y_label.into(),
        series,
        bands: level_bands(points),
        y_range: None,
        x_max: None,
        height: 230.0,
        x_log: false,
        rules: Vec::new(),
    }
}

fn over_time(out: &mut String, report: &Report) {
    let points = &report.timeline;
    if points.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "<h2>Over the run</h2>\n<p class=\"note\">One point per interval of about a second; \
         percentiles are of the requests that finished in that interval.</p>\n\
         <div class=\"plots\" id=\"timeline\">"
    );
    let line = |name: &str, color, value: fn(&TimelinePoint) -> Option<f64>| {
        Series::line(name, color, time_segments(points, value))
    };
    let charts = [
        time_chart(
            points,
            "plot-ttft-time",
            "Time to first token over the run",
            "TTFT (ms)",
            vec![
                line("p50", 0, |p| p.ttft_p50_ms),
                line("p95", 1, |p| p.ttft_p95_ms),
            ],
        ),
        time_chart(
            points,
            "plot-itl-time",
            "Inter-token latency over the run",
            "ITL (ms)",
            vec![
                line("p50", 0, |p| p.itl_p50_ms),
                line("p95", 1, |p| p.itl_p95_ms),
            ],
        ),
        time_chart(
            points,
            "plot-throughput-time",
            "Output throughput over the run",
            "output tokens/s",
            vec![line("output tokens/s", 2, |p| Some(p.output_tokens_per_s))],
        ),
        time_chart(
            points,
            "plot-requests-time",
            "Request throughput over the run",
            "requests/s",
            vec![line("succeeded requests/s", 3, |p| Some(p.requests_per_s))],
        ),
        time_chart(
            points,
            "plot-inflight-time",
            "Requests in flight over the run",
            "requests in flight",
            vec![line("in flight", 0, |p| Some(p.in_flight as f64))],
        ),
        time_chart(
            points,
            "plot-errors-time",
            "Errors over the run",
            "failed requests per interval",
            vec![Series {
                name: "failed requests".into(),
                color: 4,
                dashed: false,
                kind: SeriesKind::Bars(points.iter().map(|p| p.dt_s).collect()),
                segments: vec![points.iter().map(|p| (p.t_s, p.errors as f64)).collect()],
            }],
        ),
    ];
    for chart in charts {
        out.push_str(&chart.render());
    }
    let _ = writeln!(out, "</div>");
}

/// The server's side: its endpoints, the families of known servers (its TTFT and latency
/// beside the client's), their plots over the run, and every other family it exposed.
fn server(out: &mut String, report: &Report) {
    let (Some(section), Some(view)) = (&report.server, server_side::server_view(report)) else {
        return;
    };
    let _ = writeln!(
        out,
        "<h2>Server</h2>\n<p class=\"note\">What the server's own <code>/metrics</code> said \
         during the run: series summed over their labels (and over the endpoints), gauges over \
         the scrapes, counters and histograms by their increase over the run.</p>"
    );
    if !view.endpoints.is_empty() {
        let _ = writeln!(
            out,
            "<table id=\"server-endpoints\">\n<tr><th>Endpoint</th><th>Scrapes</th>\
             <th>Errors</th><th>Note</th></tr>"
        );
        for e in &view.endpoints {
            // An endpoint that never answered (dropped, or every scrape failed).
            let class = if e.scrapes <= e.errors {
                " class=\"fail\""
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "<tr{class}><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&e.url),
                e.scrapes,
                e.errors,
                esc(&e.note)
            );
        }
        let _ = writeln!(out, "</table>");
    }
    if let Some(note) = &view.none_answered {
        let _ = writeln!(
            out,
            "<div class=\"callout bad\" id=\"server-none\">{}</div>",
            esc(note)
        );
    }
    if !view.rows.is_empty() {
        let _ = writeln!(
            out,
            "<table id=\"server\">\n<tr><th>Measure</th><th>Family</th><th>Server</th>\
             <th>Client</th><th>Difference (client − server: {DIFFERENCE_NOTE})</th></tr>"
        );
        for row in &view.rows {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td><code>{}</code></td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&row.what),
                esc(&row.family),
                esc(&row.server),
                esc(&row.client),
                esc(&row.difference)
            );
        }
        let _ = writeln!(out, "</table>");
    }
    let charts: Vec<Chart> = [
        (
            Role::QueueDepth,
            "plot-server-queue",
            "Server queue depth over the run",
            "requests waiting",
        ),
        (
            Role::Running,
            "plot-server-running",
            "Requests running on the server over the run",
            "requests running",
        ),
        (
            Role::KvCacheUsage,
            "plot-server-kv",
            "Server KV-cache usage over the run",
            "KV-cache usage (%)",
        ),
        (
            Role::GenerationTokens,
            "plot-server-tokens",
            "Tokens the server generated per second over the run",
            "generated tokens/s",
        ),
    ]
    .into_iter()
    .filter_map(|(role, id, title, y_label)| {
        let series: Vec<Series> = server_side::role_series(section, role)
            .into_iter()
            .enumerate()
            .map(|(i, (name, segments))| Series::line(name, i % 5, segments))
            .collect();
        (!series.is_empty()).then(|| time_chart(&report.timeline, id, title, y_label, series))
    })
    .collect();
    if !charts.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"note\">One point per scrape, on the run's time axis (seconds since the \
             load started, as above); counters as their rate since the previous scrape.</p>\n\
             <div class=\"plots\" id=\"server-plots\">"
        );
        for chart in charts {
            out.push_str(&chart.render());
        }
        let _ = writeln!(out, "</div>");
    }
    let others = server_side::other_families(section);
    if !others.is_empty() {
        let _ = writeln!(
            out,
            "<details id=\"server-other\"><summary>{} more famil{} (of no known server)</summary>\n\
             <table>\n<tr><th>Family</th><th>Type</th><th>Over the run</th></tr>",
            others.len(),
            if others.len() == 1 { "y" } else { "ies" }
        );
        for (name, metric) in others {
            let (kind, _) = crate::goals::server_type_stats(metric);
            let _ = writeln!(
                out,
                "<tr><td><code>{}</code></td><td>{kind}</td><td>{}</td></tr>",
                esc(name),
                esc(&server_side::summary(name, metric))
            );
        }
        let _ = writeln!(out, "</table>\n</details>");
    }
}

fn knee_chart(report: &Report, metric: Metric, id: &'static str, what: &str) -> Chart {
    let mut points = Vec::new();
    let mut labels = Vec::new();
    for level in &report.sweep {
        if let (Some(throughput), Some(stats)) =
            (level.llm.output_tokens_per_second, level.llm.stats(metric))
        {
            points.push((throughput, stats.p95));
            labels.push(format!("c={}", level.concurrency));
        }
    }
    Chart {
        id: id.to_string(),
        title: format!("Output throughput vs {what} p95, per concurrency level"),
        x_label: "output throughput (tokens/s)".into(),
        y_label: format!("{what} p95 (ms)"),
        series: vec![Series {
            name: format!("{what} p95 by concurrency"),
            color: if metric == Metric::Ttft { 0 } else { 2 },
            dashed: false,
            kind: SeriesKind::Labelled(labels),
            segments: vec![points],
        }],
        bands: Vec::new(),
        y_range: None,
        x_max: None,
        height: 300.0,
        x_log: false,
        rules: Vec::new(),
    }
}

fn sweep(out: &mut String, report: &Report) {
    if report.sweep.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "<h2>Concurrency sweep</h2>\n<p class=\"note\">The knee: where more concurrency stops \
         buying throughput and starts costing latency.</p>\n<div class=\"plots\" id=\"sweep\">"
    );
    out.push_str(&knee_chart(report, Metric::Ttft, "plot-knee-ttft", "TTFT").render());
    out.push_str(&knee_chart(report, Metric::Itl, "plot-knee-itl", "ITL").render());
    let with_goodput = report.sweep.iter().any(|level| level.goodput.is_some());
    let with_server = report.sweep.iter().any(|level| level.server.is_some());
    let _ = writeln!(
        out,
        "</div>\n<table>\n<tr><th>Concurrency</th><th>Requests</th>\
         <th>Failed</th><th>TTFT p50 (ms)</th><th>TTFT p95 (ms)</th><th>ITL p50 (ms)</th>\
         <th>ITL p95 (ms)</th><th>Latency p95 (ms)</th><th>Output tokens/s</th><th>Requests/s</th>{}{}</tr>",
        if with_goodput {
            "<th>Goodput (requests/s)</th>"
        } else {
            ""
        },
        if with_server {
            format!("<th>{}</th>", format::capitalized(QUEUE_MAX_HEADER))
        } else {
            String::new()
        }
    );
    for level in &report.sweep {
        let stat = |metric: Metric, pick: fn(&Stats) -> f64| {
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
            stat(Metric::Itl, |s| s.p95),
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
        let _ = write!(out, "<tr>");
        for value in cells {
            let _ = write!(out, "<td class=\"n\">{value}</td>");
        }
        let _ = writeln!(out, "</tr>");
    }
    let _ = writeln!(out, "</table>");
}

/// The capacity search: its answer, one knee chart per goal, and the probes in the order
/// they ran.
fn capacity(out: &mut String, report: &Report) {
    let Some(capacity) = &report.capacity else {
        return;
    };
    let class = if capacity.max.is_some() {
        "good"
    } else {
        "bad"
    };
    let _ = writeln!(
        out,
        "<h2>Capacity</h2>\n<div class=\"callout {class}\" id=\"capacity-answer\"><strong>{}</strong>\
         <br><span class=\"note\">Search: {} · range {}–{} · precision {} % · {} probes</span></div>",
        esc(&format::capacity_answer(capacity)),
        esc(&capacity.stopped),
        format::load_value(capacity.low),
        format::load_value(capacity.high),
        format::load_value(capacity.precision_pct),
        capacity.probes.len()
    );
    if let Some(line) = format::limit_line(capacity) {
        let _ = writeln!(
            out,
            "<p id=\"capacity-limit\"><strong>{}</strong></p>",
            esc(&format::capitalized(&line))
        );
    }
    let charts = capacity_charts(capacity);
    if !charts.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"note\">The knee: each goal's value at every probe against the load; \
             discs held every goal, crosses failed one; the dashed line across is the goal's \
             limit, the one up the plot the largest load that held.</p>\n\
             <div class=\"plots\" id=\"capacity\">"
        );
        for chart in charts {
            out.push_str(&chart.render());
        }
        let _ = writeln!(out, "</div>");
    }
    let goal_columns: Vec<&str> = capacity.probes.first().map_or_else(Vec::new, |p| {
        p.goals.iter().map(|g| g.metric.as_str()).collect()
    });
    let with_goodput = capacity.probes.iter().any(|p| p.goodput.is_some());
    let _ = write!(
        out,
        "<table id=\"probes\">\n<tr><th>#</th><th>{}</th><th>Result</th><th>Judged on</th>",
        esc(&format::capitalized(&format::dimension_label(
            capacity.dimension
        )))
    );
    for metric in &goal_columns {
        let _ = write!(out, "<th><code>{}</code></th>", esc(metric));
    }
    if with_goodput {
        let _ = write!(out, "<th>Goodput (requests/s)</th>");
    }
    let with_server = capacity.probes.iter().any(|p| p.server.is_some());
    if with_server {
        let header = server_side::sampled_queue_max_header(capacity.sample_interval_s);
        let _ = write!(out, "<th>{}</th>", esc(&format::capitalized(&header)));
    }
    let _ = writeln!(
        out,
        "<th>Requests</th><th>Failed</th><th>Duration (s)</th><th>Failed goals</th></tr>"
    );
    for (i, probe) in capacity.probes.iter().enumerate() {
        let class = if probe.passed { "pass" } else { "fail" };
        let _ = write!(
            out,
            "<tr class=\"{class}\"><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td>",
            i + 1,
            format::load_value(probe.value),
            esc(&format::probe_result(probe)),
            esc(&probe.judged_on)
        );
        for column in 0..goal_columns.len() {
            let value = probe.goals.get(column).and_then(|g| g.value);
            let _ = write!(out, "<td class=\"n\">{}</td>", format::goal_number(value));
        }
        if with_goodput {
            let _ = write!(
                out,
                "<td class=\"n\">{}</td>",
                format::goodput_cell(probe.goodput.as_ref())
            );
        }
        if with_server {
            let _ = write!(
                out,
                "<td class=\"n\">{}</td>",
                server_side::server_queue_cell(probe)
            );
        }
        let failed: Vec<String> = probe
            .failed_goals
            .iter()
            .map(|g| format!("<code>{}</code>", esc(g)))
            .collect();
        let _ = writeln!(
            out,
            "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td>{}</td></tr>",
            probe.requests.total,
            probe.requests.failed,
            probe.duration_s,
            failed.join("<br>")
        );
    }
    let _ = writeln!(out, "</table>");
}

/// The load axis is logarithmic once the probed loads span this ratio (high ÷ low) or more.
const LOG_AXIS_RATIO: f64 = 20.0;

/// One knee chart per goal of the capacity search: the goal's value at each probe (y)
/// against the load (x, logarithmic when the loads span [`LOG_AXIS_RATIO`] or more), probes
/// that held every goal as discs and failing ones as crosses, a line through the loads in
/// order (the mean where a load ran more than once), the goal's limit as a dashed line
/// across and the answer (`max`) as a dashed line up the plot.
fn capacity_charts(capacity: &CapacitySection) -> Vec<Chart> {
    let Some(first) = capacity.probes.first() else {
        return Vec::new();
    };
    let loads = capacity.probes.iter().map(|p| p.value).filter(|v| *v > 0.0);
    let (low, high) = loads.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let x_log = low.is_finite() && high / low >= LOG_AXIS_RATIO;
    let dimension = format::dimension_label(capacity.dimension);
    first
        .goals
        .iter()
        .enumerate()
        .map(|(index, goal)| {
            let value_at = |probe: &super::ProbeSection| {
                probe
                    .goals
                    .get(index)
                    .and_then(|g| g.value)
                    .filter(|v| v.is_finite())
                    .map(|v| (probe.value, v))
            };
            let passed: Vec<(f64, f64)> = capacity
                .probes
                .iter()
                .filter(|p| p.passed)
                .filter_map(value_at)
                .collect();
            let failed: Vec<(f64, f64)> = capacity
                .probes
                .iter()
                .filter(|p| !p.passed && p.incomplete.is_none())
                .filter_map(value_at)
                .collect();
            let cap = knee_y_cap(goal.threshold, &passed, &failed);
            // Values far past the limit (TTFT at a load ten times too high) would squash
            // the knee into the floor: they are drawn at the top edge, labelled.
            let clamp = |points: &[(f64, f64)]| -> (Vec<(f64, f64)>, Vec<String>) {
                points
                    .iter()
                    .map(|&(x, y)| match cap {
                        Some(cap) if y > cap => {
                            ((x, cap), format!("↑ {}", format::goal_number(Some(y))))
                        }
                        _ => ((x, y), String::new()),
                    })
                    .unzip()
            };
            let (passed, passed_labels) = clamp(&passed);
            let (failed, failed_labels) = clamp(&failed);
            // The curve: one point per load, in load order.
            let mut by_load: Vec<(f64, f64, u32)> = Vec::new();
            for (x, y) in capacity.probes.iter().filter_map(value_at) {
                match by_load.iter_mut().find(|(load, _, _)| *load == x) {
                    Some((_, sum, n)) => {
                        *sum += y;
                        *n += 1;
                    }
                    None => by_load.push((x, y, 1)),
                }
            }
            by_load.sort_by(|a, b| a.0.total_cmp(&b.0));
            let curve = knee_curve(
                by_load.iter().map(|&(x, sum, n)| (x, sum / f64::from(n))),
                cap,
            );
            let unit = crate::goals::parse_goal(&goal.expr)
                .map(|g| g.metric.unit())
                .unwrap_or("");
            let y_label = if unit.is_empty() {
                goal.metric.clone()
            } else {
                format!("{} ({unit})", goal.metric)
            };
            let mut rules = vec![Rule {
                at: RuleAt::Horizontal(goal.threshold),
                label: format!(
                    "limit: fails if {} {}",
                    goal.op,
                    format::goal_number(Some(goal.threshold))
                ),
                color: 4,
            }];
            if let Some(max) = capacity.max {
                rules.push(Rule {
                    at: RuleAt::Vertical(max),
                    label: format!("max {}", format::load_value(max)),
                    color: 2,
                });
            }
            Chart {
                id: format!("plot-capacity-{index}"),
                title: format!("{}: the knee against {dimension}", goal.expr),
                x_label: if x_log {
                    format!("{dimension}, log scale")
                } else {
                    dimension.clone()
                },
                y_label,
                series: vec![
                    Series::line(goal.metric.clone(), 0, curve),
                    Series {
                        name: "held every goal".into(),
                        color: 2,
                        dashed: false,
                        kind: SeriesKind::Markers(Marker::Circle, passed_labels),
                        segments: vec![passed],
                    },
                    Series {
                        name: "a goal failed".into(),
                        color: 4,
                        dashed: false,
                        kind: SeriesKind::Markers(Marker::Cross, failed_labels),
                        segments: vec![failed],
                    },
                ],
                bands: Vec::new(),
                y_range: None,
                x_max: None,
                height: 300.0,
                x_log,
                rules,
            }
        })
        .collect()
}

/// The line through a knee chart's loads, in load order: a value above `cap` ends the
/// line at the top edge (it climbs off the scale) and the next in range starts it again
/// there, so no stretch is drawn along the edge as if the values stayed at the cap.
fn knee_curve(points: impl Iterator<Item = (f64, f64)>, cap: Option<f64>) -> Vec<Vec<(f64, f64)>> {
    let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (x, y) in points {
        let off_scale = cap.filter(|cap| y > *cap);
        let point = (x, off_scale.unwrap_or(y));
        if let Some(segment) = segments.last_mut() {
            segment.push(point);
        }
        if off_scale.is_some() {
            segments.push(vec![point]);
        }
    }
    // A segment of one point, or between two points off the scale, draws nothing true.
    segments.retain(|segment| {
        segment.len() > 1 && segment.iter().any(|&(_, y)| cap.is_none_or(|cap| y < cap))
    });
    segments
}

/// The top of a knee chart's y axis when some values are far above the rest: three times
/// the limit, or a quarter above the highest passing value or the lowest failing one,
/// whichever is highest; `None` when every value fits under it (nothing to cut).
fn knee_y_cap(threshold: f64, passed: &[(f64, f64)], failed: &[(f64, f64)]) -> Option<f64> {
    let highest_passing = passed.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let lowest_failing = failed
        .iter()
        .map(|p| p.1)
        .filter(|y| *y > threshold)
        .fold(f64::INFINITY, f64::min);
    let cap = [
        3.0 * threshold.abs(),
        1.25 * highest_passing,
        if lowest_failing.is_finite() {
            1.25 * lowest_failing
        } else {
            f64::NEG_INFINITY
        },
    ]
    .into_iter()
    .fold(f64::NEG_INFINITY, f64::max);
    let highest = passed
        .iter()
        .chain(failed)
        .map(|p| p.1)
        .fold(f64::NEG_INFINITY, f64::max);
    (cap > 0.0 && cap.is_finite() && highest > cap).then_some(cap)
}

fn metrics_tables(out: &mut String, report: &Report) {
    let _ = writeln!(out, "<h2>LLM metrics</h2>\n<table>\n<tr><th>Metric</th>");
    for column in STAT_COLUMNS {
        let _ = write!(out, "<th>{column}</th>");
    }
    let _ = writeln!(out, "</tr>");
    // The connection metrics are per connection and shown only when connections were timed;
    // time to failure only when something failed.
    let connection = Metric::CONNECTION
        .into_iter()
        .chain(Metric::FAILURE)
        .filter(|&metric| report.llm.stats(metric).is_some());
    for metric in Metric::ALL.into_iter().chain(connection) {
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
         <th>Ended early</th><th>Cancelled</th><th>Lost</th><th>Not started</th></tr>\n\
         <tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td></tr>\n</table>",
        r.total,
        r.succeeded,
        r.failed,
        r.ended_early,
        r.cancelled_as_recorded + r.cancelled_by_rate,
        r.lost,
        r.not_started
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
    if let Some(line) = format::connections_line(report) {
        let _ = writeln!(out, "<li>Protocols: {}</li>", esc(&line));
    }
    if let Some(line) = format::coalesced_line(report) {
        let _ = writeln!(out, "<li>Coalesced: {}</li>", esc(&line));
    }
    let _ = writeln!(out, "</ul>");
    let errors = super::errors::error_rows(report);
    if !errors.is_empty() {
        let _ = writeln!(
            out,
            "<h3>Errors (what the server said)</h3>\n<table>\n<tr><th>Failure</th><th>Count</th><th>Message</th></tr>"
        );
        for row in errors {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&row.what),
                row.count,
                esc(&row.message)
            );
        }
        let _ = writeln!(out, "</table>");
    }

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
            "Measured window (first request sent → last outcome of any kind)",
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
    let goodput = format::report_goodput_rows(report);
    if !goodput.is_empty() {
        let _ = writeln!(
            out,
            "<h2>Goodput</h2>\n<p class=\"note\">Requests that succeeded within every SLO \
             (each worker judged its own as they completed).</p>\n<table id=\"goodput\">"
        );
        for (name, value) in goodput {
            let _ = writeln!(
                out,
                "<tr><th>{name}</th><td class=\"n\">{}</td></tr>",
                esc(&value)
            );
        }
        let _ = writeln!(out, "</table>");
    }
    let faithful = windows::faithful_lines(report);
    if !faithful.is_empty() {
        let _ = writeln!(out, "<h2>Faithful replay</h2>\n<ul>");
        for line in faithful {
            let _ = writeln!(out, "<li>{}</li>", esc(&line));
        }
        let _ = writeln!(out, "</ul>");
    }
}

fn comparison(out: &mut String, report: &Report) {
    let Some(baseline) = &report.baseline else {
        return;
    };
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
    if format::any_coalesced(report) {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(format::COALESCED_NOTE));
    }
}

/// Schedule lag p99 above this (ms) or CPU above [`SATURATED_CPU_PCT`] marks a worker that
/// could not keep up (the same rule as the run's warning).
const SATURATED_LAG_MS: f64 = 10.0;
const SATURATED_CPU_PCT: f64 = 90.0;

/// A value with a small bar, `fraction` of full width.
fn bar_cell(text: String, fraction: f64) -> String {
    format!(
        "<td class=\"n\">{text}<span class=\"bar\"><span style=\"width:{:.0}%\"></span></span></td>",
        (fraction.clamp(0.0, 1.0) * 100.0)
    )
}

fn workers(out: &mut String, report: &Report) {
    if report.run.workers.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "<h2>Workers</h2>\n<p class=\"note\">A worker whose schedule lag p99 is above \
         {SATURATED_LAG_MS} ms or whose CPU is above {SATURATED_CPU_PCT} % could not keep up: \
         its numbers are the client's, not the server's.</p>\n\
         <table id=\"workers\">\n<tr><th>Worker</th><th>Host</th><th>Assigned</th><th>Completed</th>\
         <th>Lost</th><th>Clock offset (ms)</th><th>Schedule lag p99 (ms)</th><th>CPU (%)</th>\
         <th>Peak memory (MB)</th></tr>"
    );
    // Lag bars share a scale: the largest lag, and never less than the saturation mark.
    let lag_scale = report
        .run
        .workers
        .iter()
        .filter_map(|w| w.schedule_lag_p99_ms)
        .fold(SATURATED_LAG_MS, f64::max);
    for w in &report.run.workers {
        let saturated = w.schedule_lag_p99_ms.is_some_and(|l| l > SATURATED_LAG_MS)
            || w.cpu_pct.is_some_and(|c| c > SATURATED_CPU_PCT);
        let class = if w.disconnected {
            " class=\"fail\""
        } else if saturated {
            " class=\"warn\""
        } else {
            ""
        };
        let lost = if w.disconnected {
            format!("{} (disconnected)", w.lost)
        } else {
            w.lost.to_string()
        };
        let optional = |v: Option<f64>, decimals: usize| {
            v.map_or_else(
                || format::NO_VALUE.to_string(),
                |v| format!("{v:.decimals$}"),
            )
        };
        let lag = match w.schedule_lag_p99_ms {
            Some(lag) => bar_cell(format!("{lag:.2}"), lag / lag_scale),
            None => format!("<td class=\"n\">{}</td>", format::NO_VALUE),
        };
        let cpu = match w.cpu_pct {
            Some(cpu) => bar_cell(format!("{cpu:.1}"), cpu / 100.0),
            None => format!("<td class=\"n\">{}</td>", format::NO_VALUE),
        };
        let _ = writeln!(
            out,
            "<tr{class}><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td>{lag}{cpu}<td class=\"n\">{}</td></tr>",
            esc(&w.id),
            esc(&w.host),
            w.assigned,
            w.completed,
            lost,
            match (w.clock_offset_ms, w.clock_uncertainty_ms) {
                (Some(o), Some(u)) => format!("{o:.2} ± {u:.2}"),
                _ => optional(w.clock_offset_ms, 2),
            },
            optional(w.peak_rss_mb, 1),
        );
    }
    let _ = writeln!(out, "</table>");
}
