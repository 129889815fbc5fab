//! Number formatting and the row model shared by every renderer, so the terminal, Markdown and
//! HTML reports always show the same digits.

use common::metrics::{Metric, Stats, Unit};

use super::{
    COMPARED_METRICS, CapacitySection, Change, Dimension, GoodputSection, ProbeSection, Report,
    ScheduleKind, change_key,
};
use crate::goals::Stat;

/// The statistic columns of the metrics table, in order.
pub(super) const STAT_COLUMNS: [&str; 9] = [
    "avg", "min", "max", "p50", "p90", "p95", "p99", "std", "count",
];

/// Shown where there is no value.
pub(super) const NO_VALUE: &str = "-";

/// The marker of a highlighted (≥ 10 % worse) comparison, shown with or without color.
pub(super) const WORSE_MARKER: &str = "▲ worse";

/// Label of the output-token throughput (distinct from the per-user token rate).
pub(super) const OUTPUT_THROUGHPUT_LABEL: &str = "Output throughput, whole run (tokens/s)";
/// Label of the request throughput.
pub(super) const REQUEST_THROUGHPUT_LABEL: &str = "Request throughput, whole run (requests/s)";

/// The legend under the comparison table.
pub(super) const HIGHLIGHT_NOTE: &str = "▲ worse: at least 10 % worse than the baseline \
     (slower times, lower token rates) and significant (the 95 % bootstrap interval in brackets \
     excludes 0); within noise: as large, but the interval includes 0";

/// The marker of a change as large as a highlighted one whose interval includes 0.
pub(super) const NOISE_MARKER: &str = "within noise";

/// Statistics shown per metric in the baseline comparison.
pub(super) const COMPARED_STATS: [Stat; 3] = [Stat::P50, Stat::P95, Stat::P99];

/// One value of `metric` in display units: ms with 2 decimals, token counts as integers
/// (averages and std with 1 decimal), token rates with 1 decimal.
pub(super) fn metric_value(metric: Metric, value: f64, fractional: bool) -> String {
    match metric.unit() {
        Unit::Milliseconds => format!("{value:.2}"),
        Unit::Tokens if fractional => format!("{value:.1}"),
        Unit::Tokens => format!("{value:.0}"),
        Unit::TokensPerSecond => format!("{value:.1}"),
    }
}

/// The nine statistic cells of one metric row (`-` everywhere when it had no samples).
pub(super) fn stat_cells(metric: Metric, stats: Option<&Stats>) -> Vec<String> {
    let Some(s) = stats else {
        let mut cells = vec![NO_VALUE.to_string(); STAT_COLUMNS.len() - 1];
        cells.push("0".to_string());
        return cells;
    };
    vec![
        metric_value(metric, s.avg, true),
        metric_value(metric, s.min, false),
        metric_value(metric, s.max, false),
        metric_value(metric, s.p50, false),
        metric_value(metric, s.p90, false),
        metric_value(metric, s.p95, false),
        metric_value(metric, s.p99, false),
        metric_value(metric, s.std, true),
        s.count.to_string(),
    ]
}

/// A rate (per second) with 2 decimals, or `-`.
pub(super) fn rate(value: Option<f64>) -> String {
    value.map_or_else(|| NO_VALUE.to_string(), |v| format!("{v:.2}"))
}

/// A percentage with 1 decimal and a sign (`+12.0 %`), or `-`.
pub(super) fn signed_pct(value: Option<f64>) -> String {
    value.map_or_else(|| NO_VALUE.to_string(), |v| format!("{v:+.1} %"))
}

/// `+12.0 % [+3.1, +20.5]`: the change and its 95 % interval when known.
pub(super) fn change_text(change: &Change) -> String {
    let text = match (change.ci_low_pct, change.ci_high_pct) {
        (Some(low), Some(high)) => {
            format!("{} [{low:+.1}, {high:+.1}]", signed_pct(change.change_pct))
        }
        _ => signed_pct(change.change_pct),
    };
    if change.coalesced {
        format!("{text} {COALESCED_MARKER}")
    } else {
        text
    }
}

/// The mark of a change that coalesced streams distort ([`Change::coalesced`]).
pub(super) const COALESCED_MARKER: &str = "‡";

/// The legend of [`COALESCED_MARKER`], shown under the comparison when a row has it.
pub(super) const COALESCED_NOTE: &str = "‡ coalesced: many streams arrived in one piece \
     or in a few blocks (a buffering proxy or gateway?), so this TTFT, ITL, TTST or \
     token-rate change measures the delivery, not the model; see the warnings";

/// True when a comparison row carries [`COALESCED_MARKER`].
pub(super) fn any_coalesced(report: &Report) -> bool {
    report
        .baseline
        .as_ref()
        .is_some_and(|b| b.changes.values().any(|c| c.coalesced))
}

/// `h2 TLSv1.3: 40 requests on 1 connection · http/1.1: 4 requests on 4 connections`: the
/// measured requests and the connections by protocol (and TLS version), when counted.
pub(super) fn connections_line(report: &Report) -> Option<String> {
    let transport = report.transport.as_ref()?;
    let mut protocols: Vec<&str> = Vec::new();
    for name in transport
        .connections
        .iter()
        .map(|c| c.protocol.as_str())
        .chain(transport.requests.iter().map(|r| r.protocol.as_str()))
    {
        if !protocols.contains(&name) {
            protocols.push(name);
        }
    }
    if protocols.is_empty() {
        return None;
    }
    let parts: Vec<String> = protocols
        .into_iter()
        .map(|protocol| protocol_part(transport, protocol))
        .collect();
    Some(parts.join(" · "))
}

/// `h2 TLSv1.3: 40 requests on 1 connection` (requests counted apart from connections:
/// HTTP/2 carries many requests on one). Older reports have no request counts: then the
/// connections alone.
fn protocol_part(transport: &super::TransportSection, protocol: &str) -> String {
    let of_protocol: Vec<_> = transport
        .connections
        .iter()
        .filter(|c| c.protocol == protocol)
        .collect();
    let tls: Vec<&str> = of_protocol
        .iter()
        .filter(|c| c.tls != "none")
        .map(|c| c.tls.as_str())
        .collect();
    let label = if tls.is_empty() {
        protocol.to_string()
    } else {
        format!("{protocol} {}", tls.join("/"))
    };
    let connections: u64 = of_protocol.iter().map(|c| c.count).sum();
    let plural = |n: u64, one: &str, many: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let connections = plural(connections, "connection", "connections");
    match transport.requests.iter().find(|r| r.protocol == protocol) {
        Some(requests) => format!(
            "{label}: {} on {connections}",
            plural(requests.count, "request", "requests")
        ),
        None if transport.requests.is_empty() => format!("{label}: {connections}"),
        None => format!("{label}: 0 requests on {connections}"),
    }
}

/// `20 of 20 streams (100.0 %) arrived in one piece`, when any did.
pub(super) fn coalesced_line(report: &Report) -> Option<String> {
    let transport = report.transport.as_ref()?;
    if transport.coalesced_streams == 0 {
        return None;
    }
    Some(format!(
        "{} of {} streams ({:.1} %) arrived in one piece or in blocks (a buffering proxy?)",
        transport.coalesced_streams,
        transport.streams_checked,
        transport.coalesced_share_pct.unwrap_or(0.0)
    ))
}

/// A goal value or threshold: integers without decimals, other numbers with 2.
pub(super) fn goal_number(value: Option<f64>) -> String {
    match value {
        None => "null".to_string(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// `(label, value)` rows of a goodput section, the same in every rendering: the SLOs, the
/// good requests of those that got an outcome (`answered`) with their share, and the two
/// rates.
pub(super) fn goodput_rows(goodput: &GoodputSection, answered: u64) -> Vec<(&'static str, String)> {
    vec![
        ("SLOs", goodput.slos.join(" · ")),
        (
            "Good requests",
            format!(
                "{} of {answered} with an outcome ({})",
                goodput.good,
                pct(goodput.good_share_pct)
            ),
        ),
        (GOODPUT_LABEL, format!("{:.2}", goodput.requests_per_second)),
        (
            GOOD_TOKENS_LABEL,
            format!("{:.2}", goodput.output_tokens_per_second),
        ),
    ]
}

/// Label of the goodput rate.
pub(super) const GOODPUT_LABEL: &str = "Goodput, whole run (good requests/s)";
/// Label of the good requests' output-token rate.
pub(super) const GOOD_TOKENS_LABEL: &str = "Good output tokens/s, whole run";

/// The goodput rows of `report`, empty without `--slo`.
pub(super) fn report_goodput_rows(report: &Report) -> Vec<(&'static str, String)> {
    let r = &report.requests;
    report.goodput.as_ref().map_or_else(Vec::new, |g| {
        goodput_rows(g, r.succeeded + r.failed + r.ended_early)
    })
}

/// A percentage with 1 decimal (`54.5 %`), or `-`.
pub(super) fn pct(value: Option<f64>) -> String {
    value.map_or_else(|| NO_VALUE.to_string(), |v| format!("{v:.1} %"))
}

/// A goodput rate cell (`1.33`), `-` without SLOs.
pub(super) fn goodput_cell(goodput: Option<&GoodputSection>) -> String {
    goodput.map_or_else(
        || NO_VALUE.to_string(),
        |g| format!("{:.2}", g.requests_per_second),
    )
}

/// A load of the capacity search: whole numbers without decimals (`16`), others with up
/// to three (`0.125`, `12.5`).
pub(super) fn load_value(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        return format!("{value:.0}");
    }
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() || text == "-0" || text == "0" {
        // Below the third decimal: keep what makes it non-zero.
        return format!("{value}");
    }
    text.to_string()
}

/// `concurrency`, `rate (requests/s)`, `speed (× the recorded schedule)`: the dimension of
/// the capacity search with its unit.
pub(super) fn dimension_label(dimension: Dimension) -> String {
    match dimension {
        Dimension::Concurrency => "concurrency".to_string(),
        Dimension::Rate => "rate (requests/s)".to_string(),
        Dimension::Speed => "speed (× the recorded schedule)".to_string(),
    }
}

/// `text` with its first letter in upper case (a table header).
pub(super) fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// `passed`, `FAILED`, `passed (run 2)`, `FAILED, client stalled (run 1)`, `interrupted`,
/// with `· decided by 2 runs` on the run that decided its load: a probe's own result.
pub(super) fn probe_result(probe: &ProbeSection) -> String {
    if let Some(incomplete) = &probe.incomplete {
        return incomplete.clone();
    }
    let mut result = if probe.passed { "passed" } else { "FAILED" }.to_string();
    if probe.client_stall && !probe.passed {
        result.push_str(", client stalled");
    }
    if probe.attempt > 1 {
        result.push_str(&format!(" (run {})", probe.attempt));
    }
    match probe.runs {
        Some(runs) if runs > 1 || probe.attempt > 1 => {
            let plural = if runs == 1 { "" } else { "s" };
            result.push_str(&format!(" · decided by {runs} run{plural}"));
        }
        _ => {}
    }
    if let Some(few) = &probe.few_requests {
        result.push_str(&format!(" · on {} of {} requests", few.judged, few.needed));
    }
    result
}

/// `11 probes in 42.3 s, from 1`: the whole search's size and time (every probe, not the
/// answer's alone).
pub(super) fn search_time(capacity: &CapacitySection) -> String {
    let n = capacity.probes.len();
    let probes = if n == 1 { "probe" } else { "probes" };
    let time = capacity
        .duration_s
        .unwrap_or_else(|| capacity.probes.iter().map(|p| p.duration_s).sum());
    let from = capacity
        .start
        .map_or_else(String::new, |start| format!(", from {}", load_value(start)));
    format!("{n} {probes} in {time:.1} s{from}")
}

/// `probe 3 (×2): offered ...`: each probe's notes and repeat reason, one line each.
pub(super) fn probe_notes(capacity: &CapacitySection) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, probe) in capacity.probes.iter().enumerate() {
        let head = format!("probe {} ({})", i + 1, load_value(probe.value));
        if let Some(why) = &probe.repeat {
            lines.push(format!("{head}: run again, {why}"));
        }
        if probe.client_stall && !probe.passed {
            lines.push(format!(
                "{head}: the workers flagged their own sending as stalled: this failure decides nothing"
            ));
        }
        if let Some(few) = &probe.few_requests {
            lines.push(format!(
                "{head}: the verdict on {} rests on {} requests; its percentile needs {} (two beyond it)",
                few.goal, few.judged, few.needed
            ));
        }
        lines.extend(probe.notes.iter().map(|note| format!("{head}: {note}")));
    }
    lines
}

/// `limit: the gateway is the limit: ...`, when the search named the tier that set it.
pub(super) fn limit_line(capacity: &CapacitySection) -> Option<String> {
    capacity
        .limit_tier
        .as_ref()
        .map(|limit| format!("limit: {}", limit.text))
}

/// `1 s`, `250 ms`: a sampling interval as a header says it.
pub(super) fn duration_text(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{} s", load_value(seconds))
    } else {
        format!("{} ms", load_value(seconds * 1000.0))
    }
}

/// True when two loads of the search are the same load (a load is probed again as it was).
fn same_load(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// The goals that failed at `value` (the last failing probe at that load), in order.
fn failed_goals_at(capacity: &CapacitySection, value: f64) -> Vec<String> {
    capacity
        .probes
        .iter()
        .rev()
        .find(|p| !p.passed && p.incomplete.is_none() && same_load(p.value, value))
        .map_or_else(Vec::new, |p| p.failed_goals.clone())
}

/// ` (llm.ttft-p95 > 60; llm.error-rate > 1)`, or empty when none is known.
fn failed_goals_text(goals: &[String]) -> String {
    if goals.is_empty() {
        String::new()
    } else {
        format!(" ({})", goals.join("; "))
    }
}

/// The answer of the capacity search in one line, the same in every rendering:
/// `Capacity (concurrency): 16 holds every goal; 17 fails (llm.ttft-p95 > 60) — within 5 %`,
/// `... even the lowest load (1) fails: ...`, or that the range's top held.
pub(super) fn capacity_answer(capacity: &CapacitySection) -> String {
    let head = format!("Capacity ({})", dimension_label(capacity.dimension));
    match (capacity.max, capacity.min_failing) {
        (Some(max), Some(min_failing)) => {
            let gap_pct = if max > 0.0 {
                (min_failing - max) / max * 100.0
            } else {
                f64::INFINITY
            };
            let closeness =
                if capacity.dimension == Dimension::Concurrency && min_failing - max <= 1.0 {
                    // Whole users: nothing lies between, whatever the precision asked.
                    "neighbours: nothing lies between".to_string()
                } else if gap_pct <= capacity.precision_pct + 1e-9 {
                    format!("within {} %", load_value(capacity.precision_pct))
                } else {
                    format!(
                        "{gap_pct:.0} % apart, wider than the {} % asked (the search stopped: {})",
                        load_value(capacity.precision_pct),
                        capacity.stopped
                    )
                };
            format!(
                "{head}: {} holds every goal; {} fails{} — {closeness}",
                load_value(max),
                load_value(min_failing),
                failed_goals_text(&failed_goals_at(capacity, min_failing))
            )
        }
        // Cut short after the first load failed, before any lower one was decided.
        (None, Some(lowest)) if lowest > capacity.low * (1.0 + 1e-9) => format!(
            "{head}: {} fails{}; no lower load was decided before the search stopped ({}), so \
             the capacity is below {} (the range went down to {})",
            load_value(lowest),
            failed_goals_text(&failed_goals_at(capacity, lowest)),
            capacity.stopped,
            load_value(lowest),
            load_value(capacity.low)
        ),
        (None, Some(lowest)) => {
            let goals = failed_goals_at(capacity, lowest);
            let why = if goals.is_empty() {
                String::new()
            } else {
                format!(": {}", goals.join("; "))
            };
            format!(
                "{head}: even the lowest load ({}) fails{why}",
                load_value(lowest)
            )
        }
        (Some(max), None) if max >= capacity.high => format!(
            "{head}: {} holds every goal — the top of the range ({}–{}) held, so the capacity \
             is at least that",
            load_value(max),
            load_value(capacity.low),
            load_value(capacity.high)
        ),
        // Cut short (interrupted, a probe that could not run) before any load failed: only
        // what was probed is claimed.
        (Some(max), None) => format!(
            "{head}: {} holds every goal; no higher load was probed before the search stopped \
             ({}), so the capacity is at least {} (the range went up to {})",
            load_value(max),
            capacity.stopped,
            load_value(max),
            load_value(capacity.high)
        ),
        (None, None) => format!("{head}: no probe finished, so there is no answer"),
    }
}

/// `llm.ttft-p95 58.20 · llm.error-rate 0`: each goal's value at a probe.
pub(super) fn probe_values(probe: &ProbeSection) -> String {
    probe
        .goals
        .iter()
        .map(|g| format!("{} {}", g.metric, goal_number(g.value)))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// One row of the baseline comparison.
pub(super) struct ComparisonRow {
    /// The metric label, on the first row of each metric only.
    pub label: String,
    /// `p95`, or empty for run-level rates.
    pub stat: String,
    pub baseline: String,
    pub replayed: String,
    pub change: String,
    /// The recorded comparison, when both sides had a value.
    pub compared: Option<Change>,
}

impl ComparisonRow {
    /// True when the row is highlighted (≥ 10 % worse).
    pub fn highlight(&self) -> bool {
        self.compared.is_some_and(|c| c.flagged())
    }

    /// The textual marker column.
    pub fn marker(&self) -> &'static str {
        if self.highlight() {
            WORSE_MARKER
        } else if self.compared.is_some_and(|c| c.within_noise()) {
            NOISE_MARKER
        } else {
            ""
        }
    }
}

/// The baseline comparison rows of `report` (empty without a baseline): p50/p95/p99 of each
/// timing metric and the per-user token rate, then the two throughputs.
pub(super) fn comparison_rows(report: &Report) -> Vec<ComparisonRow> {
    let Some(baseline) = &report.baseline else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    // ISL and OSL are in `changes` but have no better direction; the table keeps to the
    // numbers that can get worse.
    for metric in COMPARED_METRICS
        .into_iter()
        .filter(|m| !matches!(m.unit(), Unit::Tokens))
    {
        let base = baseline.llm.stats(metric);
        let replayed = report.llm.stats(metric);
        if base.is_none() && replayed.is_none() {
            continue;
        }
        for (i, stat) in COMPARED_STATS.into_iter().enumerate() {
            let compared = baseline.changes.get(&change_key(metric, stat)).copied();
            rows.push(ComparisonRow {
                label: if i == 0 {
                    metric.label().to_string()
                } else {
                    String::new()
                },
                stat: stat.name().to_string(),
                baseline: base.map_or_else(
                    || NO_VALUE.to_string(),
                    |s| metric_value(metric, stat.of(&s), false),
                ),
                replayed: replayed.map_or_else(
                    || NO_VALUE.to_string(),
                    |s| metric_value(metric, stat.of(&s), false),
                ),
                change: compared.map_or_else(|| NO_VALUE.to_string(), |c| change_text(&c)),
                compared,
            });
        }
    }
    let rates = [
        (
            OUTPUT_THROUGHPUT_LABEL,
            "output_tokens_per_second",
            baseline.llm.output_tokens_per_second,
            report.llm.output_tokens_per_second,
        ),
        (
            REQUEST_THROUGHPUT_LABEL,
            "requests_per_second",
            baseline.llm.requests_per_second,
            report.llm.requests_per_second,
        ),
    ];
    for (label, key, base, replayed) in rates {
        let compared = baseline.changes.get(key).copied();
        rows.push(ComparisonRow {
            label: label.to_string(),
            stat: String::new(),
            baseline: rate(base),
            replayed: rate(replayed),
            change: compared.map_or_else(|| NO_VALUE.to_string(), |c| signed_pct(c.change_pct)),
            compared,
        });
    }
    rows
}

/// `status 1 · error frame 0 · ...` for the failure kinds.
pub(super) fn failed_by_kind(report: &Report) -> String {
    let k = &report.requests.failed_by_kind;
    format!(
        "status {} · error frame {} · transport {}{} · timeout {} · empty {}",
        k.status,
        k.error_frame,
        k.transport,
        transport_causes(k),
        k.timeout,
        k.empty
    )
}

/// ` (refused 3 · tls 2: unknown issuer ×2)` for the transport failures, empty when none.
fn transport_causes(k: &super::FailedByKind) -> String {
    let parts: Vec<String> = k
        .transport_causes
        .by_name()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| {
            let name = name.replace('_', " ");
            if name == "tls" && !k.tls_problems.is_empty() {
                let problems: Vec<String> = k
                    .tls_problems
                    .iter()
                    .map(|(problem, n)| format!("{problem} ×{n}"))
                    .collect();
                format!("tls {n}: {}", problems.join(", "))
            } else {
                format!("{name} {n}")
            }
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(" · "))
    }
}

/// `200 ×8 · 429 ×1`, or `-` when none were recorded.
pub(super) fn status_codes(report: &Report) -> String {
    if report.requests.status_codes.is_empty() {
        return NO_VALUE.to_string();
    }
    report
        .requests
        .status_codes
        .iter()
        .map(|(code, n)| format!("{code} ×{n}"))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// `usage-reported 6 · estimated 2 (25.0 % estimated) · input estimated 8 (from characters)`;
/// with a server-stated count or `--tokenizer`, every source of both counts.
pub(super) fn token_sources(report: &Report) -> String {
    let share = report
        .llm
        .estimated_token_share_pct
        .map_or_else(|| NO_VALUE.to_string(), |p| format!("{p:.1} %"));
    // Usage reports without cached-token counts (vLLM without
    // --enable-prompt-tokens-details): the share is unknown, not 0.
    let cached = match report.llm.cached_input_share_pct {
        Some(p) => format!(" · prompt cache {p:.1} % of input"),
        None if report.requests.usage_reported > 0 => " · prompt cache unknown".to_owned(),
        None => String::new(),
    };
    let unstreamed = match report.requests.unstreamed {
        0 => String::new(),
        n => format!(" · unstreamed {n}"),
    };
    let sources = &report.requests.token_source;
    let requested = if sources.usage_requested {
        " · usage asked of OpenAI-compatible streams that did not ask (--request-usage)"
    } else {
        ""
    };
    let i = &sources.input;
    if sources.tokenizer.is_none()
        && report.requests.tokenized == 0
        && report.requests.server_stated == 0
        && i.server == 0
    {
        // Input counts estimated from the prompt's characters are as much a guess as output
        // counts from frames: named beside them.
        let input = match i.estimate {
            0 => String::new(),
            n => format!(" · input estimated {n} (characters / 4)"),
        };
        return format!(
            "usage-reported {} · estimated {} ({share} estimated){input}{cached}{unstreamed}{requested}",
            report.requests.usage_reported, report.requests.estimated
        );
    }
    // A server-stated count (llama.cpp's `timings`) and a tokenizer's are not estimates.
    format!(
        "usage-reported {} · server-stated {} · tokenizer {} · frames {} ({share} estimated) · input: usage {} · server-stated {} · tokenizer {} · estimated {}{cached}{unstreamed}{requested}",
        report.requests.usage_reported,
        report.requests.server_stated,
        report.requests.tokenized,
        report.requests.estimated,
        i.usage,
        i.server,
        i.tokenizer,
        i.estimate
    )
}

/// The total identity spelled out.
pub(super) fn total_line(report: &Report) -> String {
    let r = &report.requests;
    let mut cancelled = String::new();
    if r.cancelled_as_recorded > 0 {
        cancelled.push_str(&format!(
            " + cancelled as recorded {}",
            r.cancelled_as_recorded
        ));
    }
    if r.cancelled_by_rate > 0 {
        cancelled.push_str(&format!(" + cancelled by rate {}", r.cancelled_by_rate));
    }
    format!(
        "{} = succeeded {} + failed {} + ended early {}{cancelled} + lost {} + not started {}",
        r.total, r.succeeded, r.failed, r.ended_early, r.lost, r.not_started
    )
}

/// The load in words, from the report's `run.load` (so a saved report reads the same):
/// `closed loop, concurrency 8, as fast as possible, 1 worker`; `recorded schedule ×2,
/// at most 16 in flight, 3 workers`; `open loop, 5 requests/s (poisson), 100 requests`.
pub(super) fn load(report: &Report) -> String {
    let load = &report.run.load;
    let cap = load.concurrency;
    let mut parts = Vec::new();
    if load.schedule == ScheduleKind::Recorded {
        parts.push(if load.speed != 1.0 {
            format!("recorded schedule ×{}", load_value(load.speed))
        } else {
            "recorded schedule".to_owned()
        });
        parts.extend(cap.map(|n| format!("at most {n} in flight")));
    } else if let Some(rate) = load.rate {
        parts.push(match load.arrival {
            Some(arrival) => format!(
                "open loop, {} requests/s ({})",
                load_value(rate),
                arrival.name()
            ),
            None => format!("open loop, {} requests/s", load_value(rate)),
        });
        parts.extend(cap.map(|n| format!("at most {n} in flight")));
    } else {
        match cap {
            Some(n) => parts.push(format!("closed loop, concurrency {n}")),
            None => parts.push("no concurrency cap".to_owned()),
        }
        parts.push("as fast as possible".to_owned());
    }
    parts.extend(load.requests.map(|n| format!("{n} requests")));
    parts.extend(load.duration_s.map(|s| format!("for {} s", load_value(s))));
    if load.warmup > 0 {
        parts.push(format!("{} warm-up requests", load.warmup));
    }
    match load.workers {
        0 => {}
        1 => parts.push("1 worker".to_owned()),
        n => parts.push(format!("{n} workers")),
    }
    parts.join(", ")
}

/// A plain-text table: left-aligned first column, right-aligned others, optional per-row ANSI
/// color applied after padding so escape codes never disturb the alignment.
pub(super) struct TextTable {
    header: Vec<String>,
    rows: Vec<(Vec<String>, Option<&'static str>)>,
    /// Columns (by index) that are left-aligned; the others are right-aligned.
    left: Vec<usize>,
}

/// ANSI color of a failing or highlighted row.
pub(super) const ANSI_RED: &str = "\x1b[31m";
/// ANSI color of a passing goal.
pub(super) const ANSI_GREEN: &str = "\x1b[32m";
/// ANSI bold, for section titles.
pub(super) const ANSI_BOLD: &str = "\x1b[1m";
/// ANSI reset.
pub(super) const ANSI_RESET: &str = "\x1b[0m";

impl TextTable {
    pub fn new(header: &[&str], left: &[usize]) -> TextTable {
        TextTable {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            left: left.to_vec(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>, color: Option<&'static str>) {
        self.rows.push((cells, color));
    }

    /// The table, every line indented by two spaces and right-trimmed.
    pub fn render(&self, color: bool) -> String {
        let columns = self.header.len();
        let mut widths = vec![0; columns];
        for cells in std::iter::once(&self.header).chain(self.rows.iter().map(|(c, _)| c)) {
            for (i, cell) in cells.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .take(columns)
                .map(|(i, cell)| {
                    let pad = widths[i].saturating_sub(cell.chars().count());
                    if self.left.contains(&i) {
                        format!("{cell}{}", " ".repeat(pad))
                    } else {
                        format!("{}{cell}", " ".repeat(pad))
                    }
                })
                .collect();
            padded.join("  ").trim_end().to_string()
        };
        let mut out = String::new();
        out.push_str("  ");
        out.push_str(&line(&self.header));
        out.push('\n');
        for (cells, row_color) in &self.rows {
            let text = line(cells);
            out.push_str("  ");
            match row_color {
                Some(code) if color => {
                    out.push_str(code);
                    out.push_str(&text);
                    out.push_str(ANSI_RESET);
                }
                _ => out.push_str(&text),
            }
            out.push('\n');
        }
        out
    }
}
