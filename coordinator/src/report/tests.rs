//! Tests of the report model, the baseline comparison and the renderers. Rendered reports are
//! checked against golden files in `snapshots/`; `UPDATE_SNAPSHOTS=1 cargo test` rewrites them
//! (review the diff before committing).

use std::collections::BTreeMap;
use std::path::Path;

use common::measure::{FailureKind, OutcomeKind, RequestOutcome};
use common::metrics::{Metric, RunMetrics};
use serde_json::Value;

use super::*;
use crate::goals::{Goal, parse_goal};

/// No `--slo`: no goodput.
static NO_SLOS: Slos = Slos(Vec::new());

/// 2026-11-30T10:00:00Z in microseconds since the Unix epoch.
const T0_US: u64 = 1_796_032_800_000_000;

fn succeeded(
    i: u64,
    ttft_ms: u64,
    decode_ms_per_token: u64,
    osl: u64,
    usage: bool,
) -> RequestOutcome {
    let ttft_us = ttft_ms * 1_000;
    RequestOutcome {
        kind: OutcomeKind::Succeeded,
        ttft_us: Some(ttft_us),
        ttst_us: Some(decode_ms_per_token * 1_000),
        latency_us: Some(ttft_us + (osl - 1) * decode_ms_per_token * 1_000),
        content_frames: osl,
        usage_output_tokens: usage.then_some(osl),
        server_output_tokens: None,
        tokenized_output_tokens: None,
        input_source: None,
        input_tokens: Some(500 + 10 * i),
        schedule_lag_us: Some(100 * i),
        sent_unix_us: Some(T0_US + i * 500_000),
        transport_cause: None,
        resent: false,
        unstreamed: false,
        cached_input_tokens: None,
        coalesced: false,
        protocol: None,
    }
}

/// The replayed run: 8 succeeded (6 with usage), 1 ended early, 2 failed, 2 warm-up.
fn replayed_metrics() -> RunMetrics {
    let mut m = RunMetrics::new();
    for i in 0..8 {
        m.record(&succeeded(i, 120 + 10 * i, 25, 41, i < 6));
    }
    m.record(&RequestOutcome {
        kind: OutcomeKind::EndedEarly,
        ttft_us: Some(300_000),
        ttst_us: None,
        latency_us: Some(300_000),
        content_frames: 1,
        usage_output_tokens: None,
        server_output_tokens: None,
        tokenized_output_tokens: None,
        input_source: None,
        input_tokens: None,
        schedule_lag_us: Some(50),
        sent_unix_us: Some(T0_US + 100_000),
        transport_cause: None,
        resent: false,
        unstreamed: false,
        cached_input_tokens: None,
        coalesced: false,
        protocol: None,
    });
    // Failures: their times to failure and what the server said.
    let mut rate_limited = RequestOutcome::failed(FailureKind::Status);
    rate_limited.latency_us = Some(12_000);
    m.record(&rate_limited);
    m.record_error(
        FailureKind::Status,
        Some(429),
        Some("Rate limit reached for requests"),
    );
    let mut overloaded = RequestOutcome::failed(FailureKind::ErrorFrame);
    overloaded.latency_us = Some(350_000);
    m.record(&overloaded);
    m.record_error(FailureKind::ErrorFrame, Some(200), Some("Overloaded"));
    m.counters.warmup = 2;
    m
}

/// The recording measured as a baseline: faster first tokens, slower decode.
fn baseline_metrics() -> RunMetrics {
    let mut m = RunMetrics::new();
    for i in 0..8 {
        let mut outcome = succeeded(i, 100 + 10 * i, 22, 41, true);
        outcome.schedule_lag_us = None;
        m.record(&outcome);
    }
    m
}

fn run_info() -> RunInfo {
    RunInfo {
        id: "5f0c2a9e-run".to_string(),
        started_at: rfc3339_utc(T0_US),
        duration_s: 4.5,
        target: "http://127.0.0.1:8080".to_string(),
        load: LoadSection {
            schedule: ScheduleKind::Recorded,
            speed: 1.0,
            ..LoadSection::default()
        },
        start_skew_ms: None,
        start_skew_bound_ms: None,
        workers: vec![
            WorkerInfo {
                id: "w1".to_string(),
                host: "gpu-a".to_string(),
                assigned: 7,
                completed: 6,
                lost: 1,
                clock_offset_ms: Some(0.42),
                disconnected: true,
                quit: None,
                version: None,
                peak_rss_mb: None,
                cpu_seconds: None,
                clock_uncertainty_ms: None,
                schedule_lag_p99_ms: None,
                cpu_pct: None,
            },
            WorkerInfo {
                id: "w2".to_string(),
                host: "gpu-b".to_string(),
                assigned: 7,
                completed: 5,
                lost: 0,
                clock_offset_ms: None,
                disconnected: false,
                quit: None,
                version: Some("0.1.0".to_string()),
                peak_rss_mb: Some(48.5),
                cpu_seconds: Some(4.1),
                clock_uncertainty_ms: Some(0.05),
                schedule_lag_p99_ms: Some(14.2),
                cpu_pct: Some(91.0),
            },
        ],
        insecure: false,
    }
}

fn totals() -> RequestTotals {
    RequestTotals {
        slice: common::metrics::SliceTotals {
            lost: 1,
            not_started: 2,
            ..Default::default()
        },
        status_codes: BTreeMap::from([(200, 10), (429, 1)]),
        tls_problems: BTreeMap::new(),
        not_started_because: None,
    }
}

fn goals() -> Vec<Goal> {
    [
        "llm.ttft-p95 > 150",
        "llm.ttft-p95.change>10",
        "llm.error-rate >= 50",
        "requests.total == 14",
        "llm.schedule-lag-max < 0",
    ]
    .iter()
    .map(|expr| parse_goal(expr).expect("valid goal"))
    .collect()
}

/// Six one-second intervals over two sweep levels: throughput ramps up, TTFT rises, one
/// interval has an error and one has no finished request.
fn sample_timeline() -> Vec<TimelinePoint> {
    [
        (1.0, 1, Some(92.0), 20.0, 0, 1),
        (2.0, 1, Some(95.0), 22.0, 0, 1),
        (3.0, 1, None, 0.0, 0, 1),
        (4.5, 4, Some(230.0), 60.0, 1, 4),
        (5.5, 4, Some(250.0), 66.0, 0, 4),
        (6.5, 4, Some(245.0), 64.0, 0, 3),
    ]
    .into_iter()
    .map(
        |(t_s, concurrency, ttft, tokens, errors, in_flight)| TimelinePoint {
            t_s,
            dt_s: 1.0,
            concurrency: Some(concurrency),
            ttft_p50_ms: ttft,
            ttft_p95_ms: ttft.map(|t| t * 1.2),
            itl_p50_ms: ttft.map(|_| 20.0),
            itl_p95_ms: ttft.map(|_| 24.0),
            output_tokens_per_s: tokens,
            requests_per_s: tokens / 11.0,
            succeeded: (tokens / 11.0) as u64,
            output_tokens: tokens as u64,
            errors,
            in_flight,
            hand_over: false,
        },
    )
    .collect()
}

/// The report every rendering test uses.
pub(super) fn sample_report() -> Report {
    let replayed = replayed_metrics();
    let baseline = baseline_metrics();
    // Three levels: throughput grows, then first tokens slow down (the knee).
    let level = |concurrency: u64, ttft_ms: u64, requests: u64| {
        let mut m = RunMetrics::new();
        for i in 0..requests {
            let mut outcome = succeeded(i, ttft_ms + i, 20, 11, true);
            outcome.sent_unix_us = Some(T0_US + i * 500_000 / concurrency);
            m.record(&outcome);
        }
        m
    };
    Report::build(ReportInput {
        run: run_info(),
        metrics: &replayed,
        requests: totals(),
        baseline: Some(Baseline {
            source: "recorded".to_string(),
            metrics: &baseline,
        }),
        sweep: [(1, 90, 2), (2, 95, 4), (4, 240, 5)]
            .into_iter()
            .map(|(concurrency, ttft_ms, requests)| SweepLevel {
                concurrency,
                metrics: level(u64::from(concurrency), ttft_ms, requests),
                requests: RequestTotals::default(),
            })
            .collect(),
        warnings: vec!["target answered 429 once".to_string()],
        timeline: sample_timeline(),
        slos: &NO_SLOS,
    })
    .with_goals(&goals())
}

fn assert_snapshot(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/report/snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("snapshot dir")).expect("create dir");
        std::fs::write(&path, actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read snapshot {}: {e}; run with UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(e, a)| e != a)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "snapshot {name} differs at line {}:\n expected: {:?}\n   actual: {:?}\n\
             full output:\n{actual}\n(UPDATE_SNAPSHOTS=1 rewrites it)",
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

fn get<'v>(value: &'v Value, path: &str) -> &'v Value {
    let mut current = value;
    for part in path.split('/') {
        current = match current {
            Value::Array(items) => {
                let index: usize = part.parse().expect("array index");
                items
                    .get(index)
                    .unwrap_or_else(|| panic!("missing index {part} in {path}"))
            }
            Value::Object(map) => map
                .get(part)
                .unwrap_or_else(|| panic!("missing key {part} of {path}")),
            other => panic!("{path}: {part} under a scalar {other}"),
        };
    }
    current
}

#[test]
fn json_has_every_contract_key() {
    let report = sample_report();
    let json: Value = serde_json::from_str(&report.to_json_pretty()).expect("valid JSON");
    assert_eq!(get(&json, "schema"), "llm-replay.report/v1");
    for key in [
        "id",
        "started_at",
        "duration_s",
        "target",
        "load",
        "workers",
    ] {
        get(&json, &format!("run/{key}"));
    }
    for key in ["id", "host", "assigned", "completed", "lost"] {
        get(&json, &format!("run/workers/0/{key}"));
        get(&json, &format!("run/workers/1/{key}"));
    }
    for key in [
        "total",
        "succeeded",
        "failed",
        "ended_early",
        "lost",
        "not_started",
        "usage_reported",
        "estimated",
    ] {
        assert!(get(&json, &format!("requests/{key}")).is_u64(), "{key}");
    }
    let stat_keys = [
        "avg", "min", "max", "std", "p50", "p90", "p95", "p99", "count",
    ];
    for section in ["llm", "baseline/llm", "sweep/0/llm"] {
        for metric in [
            "ttft_ms",
            "ttst_ms",
            "itl_ms",
            "latency_ms",
            "tokens_per_second_per_user",
            "isl_tokens",
            "osl_tokens",
        ] {
            for stat in stat_keys {
                assert!(
                    get(&json, &format!("{section}/{metric}/{stat}")).is_number(),
                    "{section}/{metric}/{stat}"
                );
            }
        }
        get(&json, &format!("{section}/schedule_lag_ms"));
        for key in [
            "output_tokens_per_second",
            "requests_per_second",
            "estimated_token_share_pct",
        ] {
            get(&json, &format!("{section}/{key}"));
        }
    }
    for stat in stat_keys {
        assert!(get(&json, &format!("llm/schedule_lag_ms/{stat}")).is_number());
    }
    assert_eq!(get(&json, "baseline/source"), "recorded");
    let change = get(&json, "baseline/changes/ttft_ms.p95");
    for key in ["baseline", "replayed", "change_pct", "worse", "highlight"] {
        get(change, key);
    }
    for key in ["expr", "metric", "value", "threshold", "failed"] {
        get(&json, &format!("goals/0/{key}"));
    }
    for key in ["concurrency", "llm", "requests"] {
        get(&json, &format!("sweep/0/{key}"));
    }
    assert!(get(&json, "warnings").is_array());
}

#[test]
fn total_is_the_sum_of_its_parts() {
    let report = sample_report();
    let r = &report.requests;
    assert_eq!(
        r.total,
        r.succeeded + r.failed + r.ended_early + r.lost + r.not_started
    );
    assert_eq!(
        (
            r.total,
            r.succeeded,
            r.failed,
            r.ended_early,
            r.lost,
            r.not_started
        ),
        (14, 8, 2, 1, 1, 2)
    );
    assert_eq!(
        (r.failed_by_kind.status, r.failed_by_kind.error_frame),
        (1, 1)
    );
    assert_eq!((r.usage_reported, r.estimated, r.warmup), (6, 3, 2));
    let sweep = &report.sweep[0].requests;
    assert_eq!(sweep.total, 2);
}

#[test]
fn metric_without_samples_serializes_as_null() {
    let empty = RunMetrics::new();
    let report = Report::build(ReportInput {
        run: run_info(),
        metrics: &empty,
        requests: RequestTotals::default(),
        baseline: None,
        sweep: Vec::new(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &NO_SLOS,
    });
    let json: Value = serde_json::from_str(&report.to_json_pretty()).expect("valid JSON");
    for key in [
        "ttft_ms",
        "itl_ms",
        "schedule_lag_ms",
        "output_tokens_per_second",
        "requests_per_second",
        "estimated_token_share_pct",
    ] {
        assert!(get(&json, &format!("llm/{key}")).is_null(), "{key}");
    }
    assert!(get(&json, "baseline").is_null());
    assert!(json.get("sweep").is_none(), "sweep only when sweeping");
}

#[test]
fn stats_come_from_the_merged_histograms() {
    let report = sample_report();
    let ttft = report.llm.ttft_ms.expect("ttft samples");
    // 8 successes (120..190 ms) plus the ended-early stream (300 ms) count toward TTFT.
    assert_eq!(ttft.count, 9);
    assert!((ttft.min - 120.0).abs() < 0.1, "{}", ttft.min);
    assert!((ttft.max - 300.0).abs() < 0.5, "{}", ttft.max);
    let itl = report.llm.itl_ms.expect("itl samples");
    assert_eq!(itl.count, 8);
    assert!((itl.p50 - 25.0).abs() < 0.05, "{}", itl.p50);
    let share = report.llm.estimated_token_share_pct.expect("share");
    assert!((share - 100.0 / 3.0).abs() < 1e-9);
    // Window: first send at T0, last content at T0 + 3.5 s + 190 ms + 1 s.
    let window = report.llm.measured_window_s.expect("window");
    assert!((window - 4.69).abs() < 1e-9, "{window}");
    let tps = report.llm.output_tokens_per_second.expect("throughput");
    assert!((tps - 8.0 * 41.0 / 4.69).abs() < 1e-9, "{tps}");
}

#[test]
fn change_of_highlights_ten_percent_worse_only() {
    let ten_worse = change_of(100.0, 110.0, true);
    assert!(ten_worse.worse && ten_worse.highlight);
    assert_eq!(ten_worse.change_pct, Some(10.0));

    let almost = change_of(100.0, 109.9, true);
    assert!(almost.worse && !almost.highlight);

    let better = change_of(100.0, 80.0, true);
    assert!(!better.worse && !better.highlight);
    assert_eq!(better.change_pct, Some(-20.0));

    // Token rates: lower is worse.
    let slower_rate = change_of(100.0, 90.0, false);
    assert!(slower_rate.worse && slower_rate.highlight);
    let faster_rate = change_of(100.0, 120.0, false);
    assert!(!faster_rate.worse && !faster_rate.highlight);

    let from_zero = change_of(0.0, 5.0, true);
    assert_eq!(from_zero.change_pct, None);
    assert!(from_zero.highlight);
    assert_eq!(change_of(0.0, 0.0, true).change_pct, Some(0.0));
}

/// Metrics whose every TTFT is `ttft_us` and whose every per-user rate is `rate_milli`.
fn single_valued(ttft_us: u64, rate_milli: u64, isl: u64) -> RunMetrics {
    let mut m = RunMetrics::new();
    m.record_value(Metric::Ttft, ttft_us);
    m.record_value(Metric::TokensPerSecondPerUser, rate_milli);
    m.record_value(Metric::Isl, isl);
    m
}

fn changes_between(baseline: &RunMetrics, replayed: &RunMetrics) -> BTreeMap<String, Change> {
    compute_changes(
        &LlmSection::from_metrics(baseline),
        &LlmSection::from_metrics(replayed),
    )
}

#[test]
fn changes_follow_the_highlight_rule_on_every_stat() {
    // Values below 2048 are stored exactly by a 3-digit HDR histogram.
    let baseline = single_valued(1_000, 1_000, 100);
    let ten_worse = changes_between(&baseline, &single_valued(1_100, 900, 50));
    for stat in Stat::ALL {
        let ttft = ten_worse[&change_key(Metric::Ttft, stat)];
        assert!(ttft.highlight, "ttft {stat:?}: {ttft:?}");
        let rate = ten_worse[&change_key(Metric::TokensPerSecondPerUser, stat)];
        assert!(rate.highlight, "rate {stat:?}: {rate:?}");
        // Token counts have no worse direction.
        let isl = ten_worse[&change_key(Metric::Isl, stat)];
        assert!(!isl.worse && !isl.highlight);
        assert_eq!(isl.change_pct, Some(-50.0));
    }

    let almost = changes_between(&baseline, &single_valued(1_099, 901, 100));
    let ttft = almost["ttft_ms.p95"];
    assert!(ttft.worse && !ttft.highlight, "{ttft:?}");
    let rate = almost["tokens_per_second_per_user.p50"];
    assert!(rate.worse && !rate.highlight, "{rate:?}");

    let better = changes_between(&baseline, &single_valued(800, 1_200, 100));
    let ttft = better["ttft_ms.p99"];
    assert!(
        (ttft.change_pct.expect("defined") + 20.0).abs() < 1e-9,
        "{ttft:?}"
    );
    assert!(!ttft.worse && !ttft.highlight);
    assert!(!better["tokens_per_second_per_user.avg"].worse);

    // A metric only one side has is not compared.
    assert!(!better.contains_key("itl_ms.p50"));
    assert!(!better.contains_key("output_tokens_per_second"));
}

#[test]
fn sample_report_highlights_slower_first_tokens() {
    let report = sample_report();
    let changes = &report.baseline.as_ref().expect("baseline").changes;
    // Eight recorded exchanges against eleven replayed: +23 % on TTFT p50 is within noise.
    let ttft = changes["ttft_ms.p50"];
    assert!(
        ttft.worse && ttft.highlight && !ttft.flagged() && ttft.within_noise(),
        "{ttft:?}"
    );
    let itl = changes["itl_ms.p50"];
    assert!(itl.worse && itl.highlight, "25 ms vs 22 ms: {itl:?}");
    let rate = changes["tokens_per_second_per_user.p50"];
    assert!(rate.worse && rate.highlight, "{rate:?}");
    assert!(changes.contains_key("output_tokens_per_second"));
    assert!(!changes.keys().any(|k| k.starts_with("schedule_lag_ms")));
}

#[test]
fn terminal_rendering_matches_golden() {
    assert_snapshot("terminal.txt", &render_terminal(&sample_report(), false));
}

#[test]
fn terminal_color_marks_highlighted_rows_and_goals() {
    let plain = render_terminal(&sample_report(), false);
    assert!(!plain.contains('\x1b'), "no ANSI without color");
    let colored = render_terminal(&sample_report(), true);
    let highlighted = colored
        .lines()
        .find(|l| l.contains("Inter-token latency") && l.contains("p50") && l.contains("▲ worse"))
        .expect("highlighted ITL row");
    assert!(highlighted.contains("\x1b[31m") && highlighted.ends_with("\x1b[0m"));
    let failed_goal = colored
        .lines()
        .find(|l| l.contains("FAIL") && l.contains("llm.ttft-p95 > 150"))
        .expect("failed goal row");
    assert!(failed_goal.contains("\x1b[31m"));
    let passed_goal = colored
        .lines()
        .find(|l| l.contains("PASS"))
        .expect("passed goal row");
    assert!(passed_goal.contains("\x1b[32m"));
    // Stripping the escape codes gives back the plain rendering.
    let stripped = colored
        .replace("\x1b[31m", "")
        .replace("\x1b[32m", "")
        .replace("\x1b[1m", "")
        .replace("\x1b[0m", "");
    assert_eq!(stripped, plain);
}

#[test]
fn markdown_rendering_matches_golden() {
    assert_snapshot("report.md", &render_markdown(&sample_report()));
}

#[test]
fn junit_rendering_matches_golden() {
    let junit = render_junit(&sample_report());
    assert_snapshot("junit.xml", &junit);
    let failed_goals = sample_report().goals.iter().filter(|g| g.failed).count();
    assert!(failed_goals > 0);
    assert_eq!(
        junit.matches("<failure type=\"goal\"").count(),
        failed_goals
    );
    assert!(junit.contains(&format!("tests=\"{}\"", 1 + sample_report().goals.len())));
}

#[test]
fn junit_run_case_fails_when_nothing_succeeded() {
    let mut m = RunMetrics::new();
    m.record(&RequestOutcome::failed(FailureKind::Transport));
    let report = Report::build(ReportInput {
        run: run_info(),
        metrics: &m,
        requests: RequestTotals::default(),
        baseline: None,
        sweep: Vec::new(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &NO_SLOS,
    });
    let junit = render_junit(&report);
    assert!(junit.contains("<failure type=\"run\""), "{junit}");
    assert!(junit.contains("tests=\"1\" failures=\"1\""), "{junit}");
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("no request succeeded"))
    );

    let ok = render_junit(&sample_report());
    assert!(!ok.contains("<failure type=\"run\""));
}

#[test]
fn html_rendering_matches_golden() {
    assert_snapshot("report.html", &render_html(&sample_report()));
}

#[test]
fn html_is_self_contained_and_escaped() {
    let mut report = sample_report();
    report.run.target = "http://h/<script>alert(1)</script>".to_string();
    let html = render_html(&report);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<style>") && !html.contains("<script"));
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(
        !html.contains("src=") && !html.contains("<link"),
        "no external resources"
    );
    let worse_rows = html.matches("<tr class=\"worse\">").count();
    let highlighted = format::comparison_rows(&report)
        .iter()
        .filter(|r| r.highlight())
        .count();
    assert!(highlighted > 0);
    assert_eq!(worse_rows, highlighted);
    assert_eq!(
        html.matches("<tr class=\"fail\"><td>FAIL").count(),
        report.goals.iter().filter(|g| g.failed).count()
    );
    assert!(html.trim_end().ends_with("</html>"));
}

#[test]
fn html_has_every_plot_with_the_baseline_and_the_regressions() {
    let mut report = sample_report();
    report.baseline.as_mut().expect("baseline").source = "old <run>.json".to_string();
    let html = render_html(&report);
    for id in [
        "plot-ttft-cdf",
        "plot-itl-cdf",
        "plot-ttft-time",
        "plot-itl-time",
        "plot-throughput-time",
        "plot-requests-time",
        "plot-inflight-time",
        "plot-errors-time",
        "plot-knee-ttft",
        "plot-knee-itl",
    ] {
        let start = html
            .find(&format!("<figure class=\"plot\" id=\"{id}\">"))
            .unwrap_or_else(|| panic!("no {id}"));
        let figure = &html[start..start + html[start..].find("</figure>").expect("closed")];
        assert!(figure.contains("<svg viewBox="), "{id}");
        assert!(!figure.contains("no data"), "{id} has data");
        assert!(
            figure.contains("class=\"axis-label\""),
            "{id} has labelled axes"
        );
    }
    // The baseline is overlaid on both CDFs, dashed, its name escaped.
    assert_eq!(html.matches("class=\"line s9 dashed\" points=").count(), 2);
    assert!(html.contains("baseline (old &lt;run&gt;.json)") && !html.contains("<run>"));
    // Units on the axes.
    for label in [
        "Time to first token (ms)",
        "TTFT p95 (ms)",
        "output throughput (tokens/s)",
        "time since the load started (s)",
        "requests at or below (%)",
    ] {
        assert!(html.contains(label), "{label}");
    }
    // Three knee points per plot, labelled with their concurrency; sweep bands on the series.
    let knee = &html[html.find("id=\"plot-knee-ttft\"").expect("knee")..];
    let knee = &knee[..knee.find("</figure>").expect("closed")];
    assert_eq!(knee.matches("<circle").count(), 3);
    assert!(knee.contains(">c=4</text>"));
    assert!(html.contains("class=\"band-label\"") && html.contains(">c=1</text>"));
    // Regressions: one list item per highlighted comparison.
    let highlighted = format::comparison_rows(&report)
        .iter()
        .filter(|r| r.highlight())
        .count();
    let callout = &html[html.find("id=\"regressions\"").expect("regressions")..];
    let callout = &callout[..callout.find("</div>").expect("closed")];
    assert!(callout.contains(&format!("{highlighted} regressions")));
    assert_eq!(callout.matches("<li>").count(), highlighted);
    assert!(html.contains("<div class=\"card worse\"><div class=\"label\">TTFT p95"));
    // The saturated worker is marked; light, dark and print styles exist.
    assert!(html.contains("<tr class=\"warn\"><td>w2</td>"));
    assert!(html.contains("@media (prefers-color-scheme:dark)") && html.contains("@media print"));
    assert!(!html.contains("<script") && !html.contains("href=") && !html.contains("src="));
}

#[test]
fn a_report_without_cdf_or_timeline_still_plots_its_percentiles() {
    let mut report = sample_report();
    report.llm.cdf = None;
    report.timeline.clear();
    let html = render_html(&report);
    let cdf = &html[html.find("id=\"plot-ttft-cdf\"").expect("cdf")..];
    assert!(!cdf[..cdf.find("</figure>").expect("closed")].contains("no data"));
    assert!(
        !html.contains("id=\"plot-ttft-time\""),
        "no series, no time plots"
    );
}

#[test]
fn cdf_follows_the_histogram() {
    let report = sample_report();
    let cdf = report.llm.cdf.as_ref().expect("cdf");
    let ttft = report.llm.ttft_ms.expect("ttft");
    assert_eq!(cdf.ttft_ms.len(), 103);
    assert_eq!(cdf.ttft_ms[0], [ttft.min, 0.0]);
    assert_eq!(cdf.ttft_ms[50], [ttft.p50, 50.0]);
    assert_eq!(cdf.ttft_ms[102], [ttft.max, 100.0]);
    assert!(
        cdf.ttft_ms.windows(2).all(|w| w[0][0] <= w[1][0]),
        "monotonic"
    );
    let baseline = report.baseline.as_ref().expect("baseline");
    assert!(baseline.llm.cdf.is_some());
    assert!(
        report.sweep.iter().all(|l| l.llm.cdf.is_none()),
        "kept lean"
    );
}

/// Lines of Markdown outside inline code spans.
fn outside_code(markdown: &str) -> String {
    markdown
        .lines()
        .map(|line| line.split('`').step_by(2).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn markdown_fits_a_pull_request_comment() {
    let report = sample_report();
    let md = render_markdown(&report);
    let lines = md.lines().count();
    assert!(lines < 60, "{lines} lines:\n{md}");
    assert!(
        md.starts_with("## llm-replay: ❌ 3 of 5 goals failed · ⚠️ "),
        "{md}"
    );
    // The headline table with the baseline, a highlighted TTFT change.
    let ttft = md
        .lines()
        .find(|l| l.starts_with("| TTFT (ms) |"))
        .expect("TTFT row");
    assert!(ttft.contains(" ▲**"), "{ttft}");
    assert!(md.contains("| Output throughput, whole run (tokens/s) |"));
    assert!(
        md.contains("| Errors | 2 (18.2 %: status 1 [429 ×1], error frame 1) |"),
        "{md}"
    );
    // Regressions, goals (failed first), the sweep, a sparkline.
    let highlighted = format::comparison_rows(&report)
        .iter()
        .filter(|r| r.highlight())
        .count();
    assert!(md.contains("### Regressions"));
    let listed = md.lines().filter(|l| l.starts_with("- **")).count();
    assert_eq!(listed, highlighted.min(5));
    let goals: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| ❌") || l.starts_with("| ✅"))
        .collect();
    assert_eq!(goals.len(), 5);
    assert!(goals[0].starts_with("| ❌") && goals[4].starts_with("| ✅"));
    assert!(md.contains("### Concurrency sweep") && md.contains("| 4 |"));
    assert!(
        md.contains("Output tokens/s over the run (6 s, peak 66): `"),
        "{md}"
    );
    // No links: no Markdown links, no bare URLs outside code spans.
    let text = outside_code(&md);
    assert!(
        !md.contains("](") && !text.contains("://") && !text.contains("<http"),
        "{md}"
    );
}

#[test]
fn markdown_stays_short_when_every_list_overflows() {
    let mut report = sample_report();
    let goals: Vec<Goal> = (0..30)
        .map(|i| parse_goal(&format!("llm.ttft-p95 > {}", i * 10)).expect("goal"))
        .collect();
    report = report.with_goals(&goals);
    let level = report.sweep[0].clone();
    report.sweep = (1..=20)
        .map(|c| SweepSection {
            concurrency: c,
            ..level.clone()
        })
        .collect();
    report.warnings = (0..12)
        .map(|i| format!("warning {i}: see http://example.invalid/{i} | and a\nsecond line"))
        .collect();
    report.timeline = (0..50).flat_map(|_| sample_timeline()).collect();
    let md = render_markdown(&report);
    let lines = md.lines().count();
    assert!(lines < 60, "{lines} lines:\n{md}");
    assert!(md.contains("more goals (22 failed)"), "{md}");
    assert!(md.contains("more levels") && md.contains("more warnings"));
    assert!(!outside_code(&md).contains("://"), "{md}");
    // Failed goals come first, so the cut drops passing ones.
    let failed = report.goals.iter().filter(|g| g.failed).count();
    assert!(failed >= 8);
    assert!(md.lines().filter(|l| l.starts_with("| ❌")).count() == 8);
}

#[test]
fn sparkline_scales_to_its_peak() {
    assert_eq!(
        super::markdown::sparkline(&[0.0, 50.0, 100.0], 40).as_deref(),
        Some("▁▅█")
    );
    assert_eq!(super::markdown::sparkline(&[1.0], 40), None);
    let long: Vec<f64> = (0..400).map(f64::from).collect();
    let line = super::markdown::sparkline(&long, 40).expect("line");
    assert_eq!(line.chars().count(), 40);
    assert!(line.starts_with('▁') && line.ends_with('█'));
}

#[test]
fn saved_report_reads_back() {
    let report = sample_report();
    let read = Report::from_json(&report.to_json_pretty()).expect("reads back");
    // JSON numbers read back to within a rounding step of what was written.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    assert_eq!(read.timeline.len(), report.timeline.len());
    for (a, b) in read.timeline.iter().zip(&report.timeline) {
        assert!(close(a.t_s, b.t_s) && close(a.requests_per_s, b.requests_per_s));
        assert_eq!(
            (a.concurrency, a.succeeded, a.errors),
            (b.concurrency, b.succeeded, b.errors)
        );
    }
    let (read_cdf, cdf) = (
        read.llm.cdf.as_ref().expect("cdf read back"),
        report.llm.cdf.as_ref().expect("cdf"),
    );
    assert_eq!(read_cdf.ttft_ms.len(), cdf.ttft_ms.len());
    assert!(
        read_cdf
            .ttft_ms
            .iter()
            .zip(&cdf.ttft_ms)
            .all(|(a, b)| close(a[0], b[0]) && a[1] == b[1])
    );
    assert_eq!(read.goals, report.goals);
    assert_eq!(read.requests, report.requests);
    assert_eq!(read.run, report.run);
    assert_eq!(
        render_terminal(&read, false),
        render_terminal(&report, false)
    );
    assert_eq!(render_markdown(&read), render_markdown(&report));
}

#[test]
fn reading_a_bad_report_names_the_field() {
    let mut json: Value = serde_json::from_str(&sample_report().to_json_pretty()).expect("json");
    json["llm"]["ttft_ms"]["p95"] = Value::String("fast".into());
    let error = Report::from_json(&json.to_string()).expect_err("bad field");
    assert!(error.to_string().starts_with("llm.ttft_ms.p95:"), "{error}");

    json["llm"]["ttft_ms"]["p95"] = Value::from(1.0);
    json["schema"] = Value::String("aiperf/1.4".into());
    let error = Report::from_json(&json.to_string()).expect_err("bad schema");
    assert!(matches!(error, ReportReadError::Schema { .. }), "{error}");
}

#[test]
fn compare_reports_uses_the_other_report_as_baseline() {
    let replayed = replayed_metrics();
    let no_baseline = Report::build(ReportInput {
        run: run_info(),
        metrics: &replayed,
        requests: totals(),
        baseline: None,
        sweep: Vec::new(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &NO_SLOS,
    })
    .with_goals(&[parse_goal("llm.ttft-p50.change > 5").expect("goal")]);
    assert_eq!(no_baseline.goals[0].value, None);
    assert!(no_baseline.goals[0].failed);

    let older_metrics = baseline_metrics();
    let older = Report::build(ReportInput {
        run: run_info(),
        metrics: &older_metrics,
        requests: RequestTotals::default(),
        baseline: None,
        sweep: Vec::new(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &NO_SLOS,
    });
    let compared = compare_reports(&no_baseline, &older, "yesterday.json");
    let baseline = compared.baseline.as_ref().expect("baseline");
    assert_eq!(baseline.source, "yesterday.json");
    assert_eq!(baseline.llm, older.llm);
    let ttft = baseline.changes["ttft_ms.p50"];
    let expected_pct = (no_baseline.llm.ttft_ms.expect("ttft").p50
        - older.llm.ttft_ms.expect("ttft").p50)
        / older.llm.ttft_ms.expect("ttft").p50
        * 100.0;
    assert_eq!(ttft.change_pct, Some(expected_pct));
    // The `.change` goal now has a value and is re-evaluated.
    assert_eq!(compared.goals[0].value, Some(expected_pct));
    assert_eq!(compared.goals[0].failed, expected_pct > 5.0);
    assert!(compared.goals[0].note.is_none());
    // The current run's own numbers are untouched.
    assert_eq!(compared.llm, no_baseline.llm);
}

#[test]
fn rfc3339_formats_known_instants() {
    assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339_utc(T0_US), "2026-11-30T10:00:00.000Z");
    assert_eq!(rfc3339_utc(951_782_400_123_456), "2000-02-29T00:00:00.123Z");
    assert_eq!(
        rfc3339_utc(4_107_542_399_999_000),
        "2100-02-28T23:59:59.999Z"
    );
}

#[test]
fn transport_failures_show_their_causes_and_resends_their_count() {
    use common::measure::{TlsProblem, TransportCause};
    let mut m = RunMetrics::new();
    m.record(&RequestOutcome {
        resent: true,
        ..succeeded(0, 100, 10, 5, true)
    });
    for cause in [
        TransportCause::Refused,
        TransportCause::Tls(TlsProblem::UnknownIssuer),
        TransportCause::Tls(TlsProblem::UnknownIssuer),
    ] {
        m.record(&RequestOutcome::transport_failure(cause));
    }
    // A transport failure without a cause counts as `other`, so the causes sum to the total.
    m.record(&RequestOutcome::failed(FailureKind::Transport));
    let report = Report::build(ReportInput {
        run: RunInfo {
            insecure: true,
            ..run_info()
        },
        metrics: &m,
        requests: RequestTotals {
            tls_problems: BTreeMap::from([("unknown issuer".to_string(), 2)]),
            ..RequestTotals::default()
        },
        baseline: None,
        sweep: Vec::new(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &NO_SLOS,
    });
    let json: Value = serde_json::from_str(&report.to_json_pretty()).expect("json");
    assert_eq!(get(&json, "requests/resent"), 1);
    assert_eq!(get(&json, "requests/succeeded"), 1);
    assert_eq!(get(&json, "requests/failed_by_kind/transport"), 4);
    assert_eq!(
        get(&json, "requests/failed_by_kind/transport_causes/refused"),
        1
    );
    assert_eq!(
        get(&json, "requests/failed_by_kind/transport_causes/tls"),
        2
    );
    assert_eq!(
        get(&json, "requests/failed_by_kind/transport_causes/other"),
        1
    );
    assert_eq!(
        get(&json, "requests/failed_by_kind/transport_causes/reset"),
        0
    );
    assert_eq!(
        get(&json, "requests/failed_by_kind/tls_problems")["unknown issuer"],
        2
    );
    assert_eq!(get(&json, "run/insecure"), true);
    let text = render_terminal(&report, false);
    assert!(
        text.contains("transport 4 (refused 1 · tls 2: unknown issuer ×2 · other 1)"),
        "{text}"
    );
    assert!(text.contains("resent           1"), "{text}");
    let md = render_markdown(&report);
    assert!(md.contains("1 resent on a fresh connection"), "{md}");
    assert!(md.contains("transport 4"), "{md}");
    // Read back: the new keys survive a round trip.
    let back = Report::from_json(&report.to_json_pretty()).expect("reads back");
    assert_eq!(back.requests, report.requests);
    assert!(back.run.insecure);
}

/// Metrics whose TTFT, ITL and latency (µs) are `values`, each plus `shift_us`.
fn spread(values: impl IntoIterator<Item = u64>, scale_pct: u64) -> RunMetrics {
    let mut m = RunMetrics::new();
    for v in values {
        let v = v * scale_pct / 100;
        m.record_value(Metric::Ttft, v);
        m.record_value(Metric::Itl, v / 10);
        m.record_value(Metric::Latency, v * 4);
    }
    m
}

/// 25 values from 20 ms to 260 ms in a fixed shuffled order (a wide, noisy distribution).
fn noisy(n: u64, seed: u64) -> Vec<u64> {
    (0..n)
        .map(|i| 20_000 + ((i * 7_919 + seed * 104_729) % n) * 240_000 / n)
        .collect()
}

fn changes_from_metrics(baseline: &RunMetrics, replayed: &RunMetrics) -> BTreeMap<String, Change> {
    compute_changes_with(
        &LlmSection::from_metrics(baseline),
        &LlmSection::from_metrics(replayed),
        Samples::Metrics(baseline),
        Samples::Metrics(replayed),
    )
}

#[test]
fn same_distribution_is_never_significant() {
    let baseline = spread(noisy(200, 1), 100);
    let replayed = spread(noisy(200, 2), 100);
    let changes = changes_from_metrics(&baseline, &replayed);
    for metric in [Metric::Ttft, Metric::Itl, Metric::Latency] {
        for stat in Stat::ALL {
            let change = changes[&change_key(metric, stat)];
            let (low, high) = (
                change.ci_low_pct.expect("low"),
                change.ci_high_pct.expect("high"),
            );
            assert!(low <= 0.0 && 0.0 <= high, "{metric:?} {stat:?}: {change:?}");
            assert_eq!(change.significant, Some(false), "{metric:?} {stat:?}");
            assert!(!change.flagged());
        }
    }
}

#[test]
fn doubled_distribution_is_significant_and_its_interval_holds_plus_100() {
    let baseline = spread(noisy(25, 1), 100);
    let replayed = spread(noisy(25, 3), 200);
    let changes = changes_from_metrics(&baseline, &replayed);
    for stat in [Stat::Avg, Stat::P50, Stat::P90, Stat::P95] {
        let change = changes[&change_key(Metric::Ttft, stat)];
        let (low, high) = (
            change.ci_low_pct.expect("low"),
            change.ci_high_pct.expect("high"),
        );
        assert_eq!(change.significant, Some(true), "{stat:?}: {change:?}");
        assert!(change.highlight, "{stat:?}");
        assert!(low < 100.0 && 100.0 < high, "{stat:?}: [{low}, {high}]");
    }
}

#[test]
fn a_large_change_within_noise_is_not_highlighted() {
    // 25 samples spread over 20–260 ms: a p95 12 % higher is within the bootstrap's noise.
    let baseline = spread(noisy(25, 1), 100);
    let replayed = spread(noisy(25, 1), 112);
    let change = changes_from_metrics(&baseline, &replayed)[&change_key(Metric::Ttft, Stat::P95)];
    assert!(
        change.worse && change.change_pct.expect("pct") >= 10.0,
        "{change:?}"
    );
    assert_eq!(change.significant, Some(false), "{change:?}");
    assert!(
        change.highlight && !change.flagged() && change.within_noise(),
        "{change:?}"
    );
}

#[test]
fn intervals_are_deterministic_and_unknown_without_distributions() {
    let baseline = spread(noisy(300, 1), 100);
    let replayed = spread(noisy(300, 4), 130);
    let first = changes_from_metrics(&baseline, &replayed);
    assert_eq!(first, changes_from_metrics(&baseline, &replayed));
    // A saved report: intervals from the cdf for TTFT/ITL/latency, close to the histogram's.
    let saved = compute_changes(
        &LlmSection::from_metrics(&baseline),
        &LlmSection::from_metrics(&replayed),
    );
    let key = change_key(Metric::Ttft, Stat::P50);
    let (from_hist, from_cdf) = (first[&key], saved[&key]);
    assert_eq!(from_cdf.significant, Some(true));
    assert!((from_hist.ci_low_pct.expect("l") - from_cdf.ci_low_pct.expect("l")).abs() < 5.0);
    // Without a cdf only summary statistics exist: the interval is unknown, not invented.
    let without_cdf = LlmSection {
        cdf: None,
        ..LlmSection::from_metrics(&baseline)
    };
    let unknown = compute_changes(&without_cdf, &LlmSection::from_metrics(&replayed));
    let change = unknown[&key];
    assert_eq!(
        (change.ci_low_pct, change.ci_high_pct, change.significant),
        (None, None, None)
    );
    assert!(
        change.highlight,
        "an unknown interval keeps the 10 % rule: {change:?}"
    );
}

#[test]
fn distribution_quantiles_match_the_histogram() {
    let metrics = spread(noisy(1_000, 5), 100);
    let histogram = metrics.histogram(Metric::Ttft);
    let distribution =
        significance::Distribution::from_histogram(histogram, Metric::Ttft).expect("samples");
    assert_eq!(distribution.count(), 1_000);
    let stats = metrics.stats(Metric::Ttft).expect("stats");
    for stat in [Stat::Max, Stat::P50, Stat::P90, Stat::P95, Stat::P99] {
        assert_eq!(
            significance::statistic(&distribution, stat),
            stat.of(&stats),
            "{stat:?}"
        );
    }
    // HDR reports the minimum at the low end of its bucket, the quantiles at the high end.
    for stat in [Stat::Min, Stat::Avg] {
        let (ours, hdr) = (
            significance::statistic(&distribution, stat),
            stat.of(&stats),
        );
        assert!((ours - hdr).abs() / hdr < 1e-3, "{stat:?}: {ours} vs {hdr}");
    }
}

/// Issue 19 item 2: the start skew is shown with its bound (clock uncertainty) wherever the
/// run is described, each worker's offset with its uncertainty, and the JSON has the key.
#[test]
fn start_skew_is_shown_with_its_bound_in_every_rendering() {
    let mut report = sample_report();
    report.run.start_skew_ms = Some(0.004);
    report.run.start_skew_bound_ms = Some(45.53);
    report.run.workers[0].clock_uncertainty_ms = Some(22.76);
    let terminal = render_terminal(&report, false);
    assert!(
        terminal.contains("  skew      0.00 ms (bound 45.53 ms from clock uncertainty)\n"),
        "{terminal}"
    );
    assert!(terminal.contains("0.42 ± 22.76"), "{terminal}");
    let markdown = render_markdown(&report);
    assert!(
        markdown.contains(" · start skew 0.00 ms (bound 45.53 ms from clock uncertainty)"),
        "{markdown}"
    );
    let html = render_html(&report);
    assert!(
        html.contains(
            "<tr><th>Start skew</th><td>0.00 ms (bound 45.53 ms from clock uncertainty)</td></tr>"
        ),
        "start skew row missing"
    );
    assert!(
        html.contains("0.42 ± 22.76"),
        "worker offset ± uncertainty missing"
    );
    let json: Value = serde_json::to_value(&report).expect("serializes");
    assert_eq!(json["run"]["start_skew_bound_ms"], 45.53);
    // Without a measured skew nothing is shown (the golden renderings have none).
    report.run.start_skew_ms = None;
    assert!(!render_terminal(&report, false).contains("  skew "));
}

/// Streams delivered in one piece (a buffering proxy): counted in `transport`, warned with
/// the likely cause, and the ITL, TTST and token-rate changes against the baseline marked
/// (issue 19 item 9); connections by protocol listed (item 10).
#[test]
fn coalesced_streams_are_warned_and_mark_the_itl_changes() {
    use common::metrics::{HttpProtocol, TlsVersion};
    let mut m = RunMetrics::new();
    for i in 0..8 {
        m.record(&RequestOutcome {
            coalesced: i < 6,
            protocol: Some(HttpProtocol::Http1),
            ..succeeded(i, 580, 0, 41, true)
        });
    }
    m.count_connection(HttpProtocol::Http1, TlsVersion::Tls13);
    let baseline = baseline_metrics();
    let report = Report::build(ReportInput {
        run: run_info(),
        metrics: &m,
        requests: RequestTotals::default(),
        baseline: Some(Baseline {
            source: "recorded".to_string(),
            metrics: &baseline,
        }),
        sweep: Vec::new(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &NO_SLOS,
    });
    let transport = report.transport.as_ref().expect("transport section");
    assert_eq!(
        (transport.streams_checked, transport.coalesced_streams),
        (8, 6)
    );
    assert_eq!(transport.coalesced_share_pct, Some(75.0));
    assert_eq!(
        transport.connections,
        vec![ConnectionEntry {
            protocol: "http/1.1".to_string(),
            tls: "TLSv1.3".to_string(),
            count: 1
        }]
    );
    assert!(
        report.warnings.iter().any(
            |w| w.contains("6 of 8 streams (75.0 %) arrived in one piece")
                && w.contains("proxy_buffering off")
        ),
        "{:?}",
        report.warnings
    );
    let changes = &report.baseline.as_ref().expect("baseline").changes;
    assert!(changes["itl_ms.p95"].coalesced);
    assert!(changes["ttst_ms.p50"].coalesced);
    // Issue 33, item 2: a buffered stream's TTFT waited for the first block: marked too;
    // what coalescing cannot distort (the request latency) is not.
    assert!(changes["ttft_ms.p95"].coalesced);
    assert!(!changes["latency_ms.p95"].coalesced);
    let terminal = render_terminal(&report, false);
    assert!(
        terminal.contains("protocols        http/1.1 TLSv1.3: 8 requests on 1 connection"),
        "{terminal}"
    );
    assert!(terminal.contains("‡ coalesced"), "{terminal}");
    // Saved and compared again (`llm-replay report A --baseline B`): still marked.
    let again = compare_reports(&report, &report, "itself");
    assert!(again.baseline.expect("baseline").changes["itl_ms.p50"].coalesced);
}

/// `ttft:200ms` and `itl:30ms` judge each request of `outcomes` the way a worker does, and
/// the good ones are counted.
fn judged(outcomes: &[RequestOutcome], slos: &Slos) -> RunMetrics {
    let mut m = RunMetrics::new();
    for outcome in outcomes {
        m.record(outcome);
        if slos.is_good(outcome) == Some(true) {
            m.record_good(outcome);
        }
    }
    m
}

fn slos() -> Slos {
    Slos(vec![
        common::slo::Slo::parse("ttft:200ms").expect("slo"),
        common::slo::Slo::parse("itl:30ms").expect("slo"),
    ])
}

#[test]
fn goodput_counts_the_good_requests_exactly() {
    let slos = slos();
    // TTFT 120..190 ms with ITL 25 ms: good; TTFT 250 ms: too slow; ITL 40 ms: too slow;
    // an ended-early stream and a failure are never good.
    let mut outcomes: Vec<RequestOutcome> = (0..8)
        .map(|i| succeeded(i, 120 + 10 * i, 25, 41, true))
        .collect();
    outcomes.push(succeeded(8, 250, 25, 41, true));
    outcomes.push(succeeded(9, 100, 40, 41, true));
    outcomes.push(RequestOutcome {
        kind: OutcomeKind::EndedEarly,
        ..succeeded(10, 100, 25, 41, true)
    });
    outcomes.push(RequestOutcome::failed(FailureKind::Status));
    let m = judged(&outcomes, &slos);
    let goodput = GoodputSection::from_metrics(&slos, &m).expect("SLOs set");
    assert_eq!(goodput.slos, ["ttft:200ms", "itl:30ms"]);
    assert_eq!(goodput.good, 8);
    // 8 good of 12 with an outcome.
    assert_eq!(goodput.good_share_pct, Some(100.0 * 8.0 / 12.0));
    // Over the window llm.requests_per_second uses.
    let seconds = m.window_seconds();
    assert!(seconds > 0.0);
    assert!((goodput.requests_per_second - 8.0 / seconds).abs() < 1e-9);
    assert!((goodput.output_tokens_per_second - 8.0 * 41.0 / seconds).abs() < 1e-9);
    let llm = LlmSection::from_metrics(&m);
    assert!(goodput.requests_per_second <= llm.requests_per_second.expect("rps"));

    assert_eq!(GoodputSection::from_metrics(&NO_SLOS, &m), None);
    // Nothing answered: no share, and no rate over a window that never opened.
    let empty = GoodputSection::from_metrics(&slos, &RunMetrics::new()).expect("SLOs set");
    assert_eq!(
        (empty.good, empty.good_share_pct, empty.requests_per_second),
        (0, None, 0.0)
    );

    // The report and each sweep level carry their own.
    let level = judged(&outcomes[..4], &slos);
    let report = Report::build(ReportInput {
        run: run_info(),
        metrics: &m,
        requests: RequestTotals::default(),
        baseline: None,
        sweep: vec![SweepLevel {
            concurrency: 2,
            metrics: level,
            requests: RequestTotals::default(),
        }],
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &slos,
    });
    assert_eq!(report.goodput.as_ref(), Some(&goodput));
    assert_eq!(report.sweep[0].goodput.as_ref().map(|g| g.good), Some(4));
    let json: Value = serde_json::from_str(&report.to_json_pretty()).expect("json");
    for key in [
        "slos",
        "good",
        "good_share_pct",
        "requests_per_second",
        "output_tokens_per_second",
    ] {
        get(&json, &format!("goodput/{key}"));
        get(&json, &format!("sweep/0/goodput/{key}"));
    }
    // Without SLOs the keys are absent, not null.
    let plain: Value = serde_json::from_str(&sample_report().to_json_pretty()).expect("json");
    assert!(plain.get("goodput").is_none() && plain.get("capacity").is_none());
    assert!(plain["sweep"][0].get("goodput").is_none());
}

#[test]
fn sweep_tables_gain_a_goodput_column_with_slos() {
    let slos = slos();
    let outcomes: Vec<RequestOutcome> = (0..6)
        .map(|i| succeeded(i, 120 + 40 * i, 25, 41, true))
        .collect();
    let m = judged(&outcomes, &slos);
    let report = Report::build(ReportInput {
        run: run_info(),
        metrics: &m,
        requests: RequestTotals::default(),
        baseline: None,
        sweep: [2u32, 3, 6]
            .into_iter()
            .map(|n| SweepLevel {
                concurrency: n,
                metrics: judged(&outcomes[..n as usize], &slos),
                requests: RequestTotals::default(),
            })
            .collect(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &slos,
    });
    let terminal = render_terminal(&report, false);
    assert!(terminal.contains("goodput req/s"), "{terminal}");
    assert!(terminal.contains("Goodput (requests that succeeded within every SLO)"));
    assert!(terminal.contains("ttft:200ms · itl:30ms"), "{terminal}");
    // TTFT 120, 160, 200 ms are within 200 ms: 3 of 6.
    assert!(
        terminal.contains("3 of 6 with an outcome (50.0 %)"),
        "{terminal}"
    );
    let md = render_markdown(&report);
    assert!(
        md.contains("| Requests/s | Failed | Goodput req/s |"),
        "{md}"
    );
    assert!(
        md.contains("**Goodput** (within every SLO: ttft:200ms · itl:30ms): 3 of 6"),
        "{md}"
    );
    let html = render_html(&report);
    assert!(html.contains("<th>Goodput (requests/s)</th>"), "{html}");
    assert!(html.contains("id=\"goodput\"") && html.contains("id=\"goodput-card\""));
    // Without SLOs, no column.
    let plain = render_terminal(&sample_report(), false);
    assert!(!plain.contains("goodput"), "{plain}");
}

/// The goals of the capacity fixture.
fn capacity_goals() -> Vec<Goal> {
    [
        "llm.ttft-p95 > 60",
        "llm.error-rate > 1",
        "llm.good-share < 90",
    ]
    .iter()
    .map(|expr| parse_goal(expr).expect("valid goal"))
    .collect()
}

/// One probe of the capacity fixture: its numbers, and the goals judged on them through
/// [`evaluate_goals_on`] (as the search judges them).
fn probe(value: f64, attempt: u32, ttft_p95: f64, failed: u64, good: u64) -> ProbeSection {
    let total = 100;
    let ttft = Stats {
        avg: ttft_p95 * 0.7,
        min: ttft_p95 * 0.4,
        max: ttft_p95 * 1.3,
        std: ttft_p95 * 0.1,
        p50: ttft_p95 * 0.65,
        p90: ttft_p95 * 0.9,
        p95: ttft_p95,
        p99: ttft_p95 * 1.1,
        count: total - failed,
    };
    let llm = LlmSection {
        ttft_ms: Some(ttft),
        requests_per_second: Some(value * 0.5),
        output_tokens_per_second: Some(value * 20.0),
        measured_window_s: Some(30.0),
        ..LlmSection::default()
    };
    let requests = RequestsSection {
        total,
        succeeded: total - failed,
        failed,
        ..RequestsSection::default()
    };
    let goodput = GoodputSection {
        slos: vec!["ttft:80ms".to_string()],
        good,
        good_share_pct: Some(good as f64),
        requests_per_second: good as f64 / 30.0,
        output_tokens_per_second: good as f64 * 40.0 / 30.0,
    };
    let goals = evaluate_goals_on(
        &capacity_goals(),
        &llm,
        &requests,
        Some(&goodput),
        None,
        None,
    );
    ProbeSection {
        value,
        passed: goals.iter().all(|g| !g.failed),
        failed_goals: goals
            .iter()
            .filter(|g| g.failed)
            .map(|g| g.expr.clone())
            .collect(),
        goals,
        judged_on: "steady window".to_string(),
        llm,
        requests,
        goodput: Some(goodput),
        server: None,
        duration_s: 31.5,
        attempt,
        decided: None,
        runs: None,
        repeat: None,
        incomplete: None,
        client_stall: false,
        notes: Vec::new(),
        few_requests: None,
    }
}

/// A concurrency search over 1–4096 at 5 %: geometric bisection, 16 near the TTFT limit
/// run twice, 17 failing: the answer is 16.
fn capacity_section() -> CapacitySection {
    let mut probes = vec![
        probe(1.0, 1, 21.0, 0, 100),
        probe(4096.0, 1, 2400.0, 38, 4),
        probe(64.0, 1, 310.0, 0, 41),
        probe(8.0, 1, 33.5, 0, 99),
        probe(23.0, 1, 95.0, 0, 80),
        probe(14.0, 1, 51.0, 0, 97),
        probe(18.0, 1, 66.0, 0, 91),
        probe(16.0, 1, 59.2, 0, 95),
        probe(16.0, 2, 58.7, 0, 96),
        probe(17.0, 1, 61.4, 0, 93),
    ];
    probes[7].decided = Some(true);
    probes[8].decided = Some(true);
    CapacitySection {
        dimension: Dimension::Concurrency,
        max: Some(16.0),
        min_failing: Some(17.0),
        precision_pct: 5.0,
        low: 1.0,
        high: 4096.0,
        stopped: "no concurrency between the highest passing and the lowest failing".to_string(),
        probes,
        start: Some(1.0),
        duration_s: Some(301.0),
        sample_interval_s: Some(1.0),
        limit_tier: None,
    }
}

/// The report of a `--find-max concurrency` run with `--slo`: the numbers of the run at the
/// answer, its goodput, and the search.
fn capacity_report() -> Report {
    let slos = Slos(vec![common::slo::Slo::parse("ttft:150ms").expect("slo")]);
    let outcomes: Vec<RequestOutcome> = (0..8)
        .map(|i| succeeded(i, 120 + 10 * i, 25, 41, true))
        .collect();
    let m = judged(&outcomes, &slos);
    let mut report = Report::build(ReportInput {
        run: run_info(),
        metrics: &m,
        requests: RequestTotals::default(),
        baseline: None,
        sweep: Vec::new(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &slos,
    })
    .with_goals(&[parse_goal("llm.good-share < 50").expect("goal")]);
    report.capacity = Some(capacity_section());
    report
}

#[test]
fn capacity_terminal_rendering_matches_golden() {
    assert_snapshot(
        "capacity_terminal.txt",
        &render_terminal(&capacity_report(), false),
    );
}

#[test]
fn capacity_markdown_rendering_matches_golden() {
    assert_snapshot("capacity_report.md", &render_markdown(&capacity_report()));
}

#[test]
fn capacity_html_rendering_matches_golden() {
    assert_snapshot("capacity_report.html", &render_html(&capacity_report()));
}

#[test]
fn probes_are_judged_like_the_report() {
    let capacity = capacity_section();
    let passed: Vec<f64> = capacity
        .probes
        .iter()
        .filter(|p| p.passed)
        .map(|p| p.value)
        .collect();
    assert_eq!(passed, [1.0, 8.0, 14.0, 16.0, 16.0]);
    let at_4096 = &capacity.probes[1];
    assert_eq!(
        at_4096.failed_goals,
        [
            "llm.ttft-p95 > 60",
            "llm.error-rate > 1",
            "llm.good-share < 90"
        ]
    );
    assert_eq!(at_4096.goals[2].value, Some(4.0));
    // Without a goodput section the good-share goal fails and says why.
    let no_goodput = evaluate_goals_on(
        &capacity_goals(),
        &at_4096.llm,
        &at_4096.requests,
        None,
        None,
        None,
    );
    assert!(no_goodput[2].failed);
    assert!(
        no_goodput[2]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("needs --slo"))
    );
}

#[test]
fn the_terminal_lists_probes_in_order_then_the_answer() {
    let text = render_terminal(&capacity_report(), false);
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| {
            !l.starts_with("Capacity search (concurrency, range 1–4096, precision 5 %;")
        })
        .collect();
    // The header, then one row per probe: its index and its load, in the order they ran.
    let rows: Vec<(String, String)> = lines[2..]
        .iter()
        .take_while(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            let mut cells = l.split_whitespace();
            let index = cells.next().expect("index").to_string();
            (index, cells.next().expect("load").to_string())
        })
        .collect();
    let expected: Vec<(String, String)> = capacity_section()
        .probes
        .iter()
        .enumerate()
        .map(|(i, p)| ((i + 1).to_string(), format::load_value(p.value)))
        .collect();
    assert_eq!(rows, expected, "{text}");
    assert!(
        lines[1].contains("judged on") && lines[1].contains("llm.ttft-p95"),
        "{text}"
    );
    assert!(text.contains("passed (run 2)"), "{text}");
    assert!(text.contains("FAILED"));
    // Then how the search stopped and the answer.
    let after = &lines[2 + rows.len()..];
    assert!(after[0].starts_with("  search: "), "{text}");
    assert!(
        after[1].starts_with(
            "Capacity (concurrency): 16 holds every goal; 17 fails (llm.ttft-p95 > 60)"
        ),
        "{text}"
    );
}

#[test]
fn the_capacity_answer_reads_each_outcome() {
    let mut capacity = capacity_section();
    let answer = format::capacity_answer(&capacity);
    assert_eq!(
        answer,
        "Capacity (concurrency): 16 holds every goal; 17 fails (llm.ttft-p95 > 60) — \
         neighbours: nothing lies between"
    );
    capacity.max = Some(40.0);
    capacity.min_failing = Some(42.0);
    capacity.probes.push(probe(42.0, 1, 75.0, 0, 95));
    assert_eq!(
        format::capacity_answer(&capacity),
        "Capacity (concurrency): 40 holds every goal; 42 fails (llm.ttft-p95 > 60) — within 5 %"
    );
    capacity.max = None;
    capacity.min_failing = Some(1.0);
    capacity.probes.insert(0, probe(1.0, 1, 2400.0, 38, 4));
    // The failing run at 1, not the passing one.
    assert_eq!(
        format::capacity_answer(&capacity),
        "Capacity (concurrency): even the lowest load (1) fails: llm.ttft-p95 > 60; \
         llm.error-rate > 1; llm.good-share < 90"
    );
    // Stopped (Ctrl-C) after the start, 8, failed and before a lower load was decided: no
    // claim about the range's bottom.
    capacity.min_failing = Some(8.0);
    capacity.stopped = "interrupted during the probe at 4".to_string();
    capacity.probes.push(probe(8.0, 1, 2400.0, 0, 4));
    let mut interrupted = probe(4.0, 1, 20.0, 0, 100);
    interrupted.incomplete = Some("interrupted".to_string());
    interrupted.passed = false;
    assert_eq!(format::probe_result(&interrupted), "interrupted");
    let answer = format::capacity_answer(&capacity);
    assert!(
        answer.starts_with("Capacity (concurrency): 8 fails (llm.ttft-p95 > 60")
            && answer.contains("; no lower load was decided before the search stopped")
            && !answer.contains("lowest")
            && !answer.contains("held"),
        "{answer}"
    );
    capacity.dimension = Dimension::Rate;
    capacity.max = Some(100_000.0);
    capacity.min_failing = None;
    capacity.low = 0.1;
    capacity.high = 100_000.0;
    assert_eq!(
        format::capacity_answer(&capacity),
        "Capacity (rate (requests/s)): 100000 holds every goal — the top of the range \
         (0.1–100000) held, so the capacity is at least that"
    );
    capacity.dimension = Dimension::Speed;
    capacity.max = Some(2.5);
    capacity.min_failing = Some(3.75);
    assert!(
        format::capacity_answer(&capacity)
            .starts_with("Capacity (speed (× the recorded schedule)): 2.5 holds every goal; 3.75 fails — 50 % apart"),
        "{}",
        format::capacity_answer(&capacity)
    );
    assert_eq!(format::load_value(0.125), "0.125");
    assert_eq!(format::load_value(12.5), "12.5");
    assert_eq!(format::load_value(0.0001), "0.0001");
}

#[test]
fn html_capacity_section_draws_the_knee_of_every_goal() {
    let mut report = capacity_report();
    let capacity = report.capacity.as_mut().expect("capacity");
    capacity.probes[0].judged_on = "<script>alert(1)</script>".to_string();
    let html = render_html(&report);
    assert!(!html.contains("<script>"), "escaped");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    let section = &html[html.find("<h2>Capacity</h2>").expect("section")..];
    let section = &section[..section.find("</table>").expect("probe table")];
    assert!(section.contains("id=\"capacity-answer\""));
    for (index, goal) in capacity_goals().iter().enumerate() {
        let start = section
            .find(&format!("id=\"plot-capacity-{index}\""))
            .unwrap_or_else(|| panic!("chart of {}", goal.expr));
        let chart = &section[start..start + section[start..].find("</figure>").expect("end")];
        // 5 passing probes as discs and 5 failing ones as crosses, plus one of each in the
        // legend; the limit and the answer as labelled lines.
        assert_eq!(
            chart.matches("<circle class=\"marker f2\"").count(),
            6,
            "{chart}"
        );
        assert_eq!(
            chart.matches("<path class=\"marker line s4\"").count(),
            6,
            "{chart}"
        );
        assert!(
            chart.contains(&format!(
                "limit: fails if {} {}",
                goal.op.symbol().replace('<', "&lt;").replace('>', "&gt;"),
                goal.threshold
            )),
            "{chart}"
        );
        assert!(chart.contains(">max 16</text>"), "{chart}");
        // 1 to 4096: a log axis of whole decades.
        assert!(
            chart.contains("log scale") && chart.contains(">10000</text>"),
            "{chart}"
        );
    }
    // Every probe is a row, in order.
    assert_eq!(section.matches("<tr class=\"pass\">").count(), 5);
    assert_eq!(section.matches("<tr class=\"fail\">").count(), 5);
    // Self-contained: nothing fetched.
    assert!(!html.contains("src=") && !html.contains("href=") && !html.contains("@import"));
}

#[test]
fn markdown_with_a_long_capacity_search_stays_short() {
    let mut report = capacity_report();
    let goals: Vec<Goal> = (0..30)
        .map(|i| parse_goal(&format!("llm.ttft-p95 > {}", i * 10)).expect("goal"))
        .collect();
    report = report.with_goals(&goals);
    let capacity = report.capacity.as_mut().expect("capacity");
    let probes = capacity.probes.clone();
    capacity.probes = (0..6).flat_map(|_| probes.clone()).collect();
    report.warnings = (0..12).map(|i| format!("warning {i}")).collect();
    report.timeline = (0..50).flat_map(|_| sample_timeline()).collect();
    report.sweep = sample_report().sweep;
    let md = render_markdown(&report);
    let lines = md.lines().count();
    assert!(lines < super::markdown::MAX_LINES, "{lines} lines:\n{md}");
    assert!(
        md.starts_with("## llm-replay: max concurrency 16 · ❌"),
        "{md}"
    );
    assert!(md.contains("more probes"), "{md}");
    assert!(
        md.contains("### Capacity (concurrency): 16 holds every goal"),
        "{md}"
    );
    // Every section at its cap still adds up to too much: the end is cut, and says so.
    assert!(
        md.trim_end()
            .ends_with("*… cut to fit a comment; the JSON and HTML reports hold everything*"),
        "{md}"
    );
    let shorter = render_markdown(&capacity_report());
    assert!(!shorter.contains("cut to fit"), "{shorter}");
}

#[test]
fn junit_and_terminal_carry_goodput_and_the_capacity_answer() {
    let report = capacity_report();
    let junit = render_junit(&report);
    assert!(
        junit.contains("goodput 0.85 requests/s (50.0 % good within ttft:150ms)"),
        "{junit}"
    );
    assert!(
        junit.contains(
            "Capacity (concurrency): 16 holds every goal; 17 fails (llm.ttft-p95 &gt; 60)"
        ),
        "{junit}"
    );
    let colored = render_terminal(&report, true);
    // A failing probe's row is red; the answer is bold and green when a load held.
    assert!(
        colored.contains(&format!("{}10 ", format::ANSI_RED)),
        "{colored}"
    );
    assert!(colored.contains(&format!(
        "{}{}Capacity (concurrency): 16",
        format::ANSI_BOLD,
        format::ANSI_GREEN
    )));
}

/// Equal goodput sections, rates to within a JSON rounding step.
fn same_goodput(a: Option<&GoodputSection>, b: Option<&GoodputSection>) -> bool {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    match (a, b) {
        (Some(a), Some(b)) => {
            (&a.slos, a.good, a.good_share_pct) == (&b.slos, b.good, b.good_share_pct)
                && close(a.requests_per_second, b.requests_per_second)
                && close(a.output_tokens_per_second, b.output_tokens_per_second)
        }
        (a, b) => a.is_none() && b.is_none(),
    }
}

#[test]
fn goodput_and_capacity_survive_a_json_round_trip() {
    let report = capacity_report();
    let read = Report::from_json(&report.to_json_pretty()).expect("reads back");
    assert!(report.goodput.is_some());
    assert!(same_goodput(read.goodput.as_ref(), report.goodput.as_ref()));
    let (read_capacity, capacity) = (
        read.capacity.as_ref().expect("capacity"),
        report.capacity.as_ref().expect("capacity"),
    );
    assert_eq!(read_capacity.probes.len(), capacity.probes.len());
    assert_eq!(
        (
            read_capacity.max,
            read_capacity.min_failing,
            &read_capacity.dimension
        ),
        (capacity.max, capacity.min_failing, &capacity.dimension)
    );
    for (a, b) in read_capacity.probes.iter().zip(&capacity.probes) {
        assert_eq!(
            (a.value, a.passed, a.attempt, a.decided),
            (b.value, b.passed, b.attempt, b.decided)
        );
        assert_eq!((&a.failed_goals, &a.goals), (&b.failed_goals, &b.goals));
        assert!(same_goodput(a.goodput.as_ref(), b.goodput.as_ref()));
        assert_eq!(a.requests, b.requests);
    }
    assert_eq!(
        render_terminal(&read, false),
        render_terminal(&report, false)
    );
    assert_eq!(render_markdown(&read), render_markdown(&report));
    let json: Value = serde_json::from_str(&report.to_json_pretty()).expect("json");
    for key in ["dimension", "max", "min_failing", "precision_pct", "probes"] {
        get(&json, &format!("capacity/{key}"));
    }
    for key in [
        "value",
        "passed",
        "failed_goals",
        "llm",
        "requests",
        "goodput",
    ] {
        get(&json, &format!("capacity/probes/0/{key}"));
    }
    // `max` is null, not absent, when even the lowest load failed.
    let mut none = report.clone();
    none.capacity.as_mut().expect("capacity").max = None;
    let json: Value = serde_json::from_str(&none.to_json_pretty()).expect("json");
    assert!(get(&json, "capacity/max").is_null());
}

#[test]
fn a_report_saved_before_goodput_and_capacity_still_reads() {
    let mut json: Value = serde_json::from_str(&capacity_report().to_json_pretty()).expect("json");
    let object = json.as_object_mut().expect("object");
    assert!(object.remove("goodput").is_some() && object.remove("capacity").is_some());
    let read = Report::from_json(&json.to_string()).expect("an older report reads");
    assert_eq!((read.goodput, read.capacity), (None, None));
    // A sweep level saved without goodput too.
    let mut json: Value = serde_json::from_str(&sample_report().to_json_pretty()).expect("json");
    json["sweep"][0]
        .as_object_mut()
        .expect("level")
        .remove("goodput");
    let read = Report::from_json(&json.to_string()).expect("reads");
    assert!(read.sweep.iter().all(|level| level.goodput.is_none()));
    render_html(&read);
}

/// What a vLLM server's `/metrics` said over the sample run: two endpoints (the target,
/// and a GPU exporter that refused), the known families (a TTFT histogram in seconds among
/// them), two families of no known server, and the known gauges and rates over time.
fn sample_server() -> ServerSection {
    use crate::server_metrics::{ServerEndpoint, ServerMetric, ServerPoint};
    let gauge = |avg: f64, min: f64, max: f64, last: f64| ServerMetric::Gauge {
        avg,
        min,
        max,
        last,
    };
    let counter = |delta: f64, rate: f64| ServerMetric::Counter { delta, rate };
    let metrics = BTreeMap::from([
        (
            "vllm:num_requests_waiting".to_string(),
            gauge(2.4, 0.0, 7.0, 0.0),
        ),
        (
            "vllm:num_requests_running".to_string(),
            gauge(3.1, 1.0, 4.0, 1.0),
        ),
        (
            "vllm:gpu_cache_usage_perc".to_string(),
            gauge(0.42, 0.05, 0.715, 0.1),
        ),
        ("vllm:num_preemptions_total".to_string(), counter(3.0, 0.67)),
        (
            "vllm:prompt_tokens_total".to_string(),
            counter(5_560.0, 1_235.56),
        ),
        (
            "vllm:generation_tokens_total".to_string(),
            counter(369.0, 82.0),
        ),
        (
            "vllm:time_to_first_token_seconds".to_string(),
            ServerMetric::Histogram {
                count: 9.0,
                sum: 1_080.0,
                p50: 110.0,
                p90: 180.0,
                p99: 240.0,
                unit: Some(crate::server_metrics::ServerUnit::Ms),
                buckets: None,
            },
        ),
        (
            "vllm:e2e_request_latency_seconds".to_string(),
            // In seconds, as a report saved before times were converted holds it.
            ServerMetric::Histogram {
                count: 9.0,
                sum: 9.9,
                p50: 1.1,
                p90: 1.15,
                p99: 1.18,
                unit: None,
                buckets: None,
            },
        ),
        ("process_cpu_seconds_total".to_string(), counter(12.5, 2.78)),
        (
            "python_gc_objects_collected".to_string(),
            gauge(10.0, 10.0, 10.0, 10.0),
        ),
    ]);
    let timeline = [
        (0.5, 0.0, 1.0, 0.05, None),
        (1.5, 2.0, 4.0, 0.30, Some(60.0)),
        (2.5, 7.0, 4.0, 0.715, Some(95.0)),
        (3.5, 3.0, 2.0, 0.40, Some(88.0)),
        (4.5, 0.0, 1.0, 0.10, Some(70.0)),
    ]
    .into_iter()
    .map(|(t_s, waiting, running, kv, tokens)| {
        let mut values = BTreeMap::from([
            ("vllm:num_requests_waiting".to_string(), waiting),
            ("vllm:num_requests_running".to_string(), running),
            ("vllm:gpu_cache_usage_perc".to_string(), kv),
        ]);
        if let Some(tokens) = tokens {
            values.insert("vllm:generation_tokens_total".to_string(), tokens);
        }
        ServerPoint { t_s, values }
    })
    .collect();
    ServerSection {
        endpoints: vec![
            ServerEndpoint {
                url: "http://127.0.0.1:8080/metrics".to_string(),
                scrapes: 6,
                errors: 0,
                note: None,
                mixed: None,
            },
            ServerEndpoint {
                url: "http://gpu-a:9400/metrics".to_string(),
                scrapes: 0,
                errors: 1,
                note: Some("unreachable: connection refused".to_string()),
                mixed: None,
            },
        ],
        metrics,
        timeline,
    }
}

/// The sample report with the server's side, on the run and on each sweep level.
fn server_report() -> Report {
    let mut report = sample_report();
    report.server = Some(sample_server());
    for (level, queue_max) in report.sweep.iter_mut().zip([0.0, 2.0, 7.0]) {
        let mut server = sample_server();
        server.timeline.clear();
        server.metrics.insert(
            "vllm:num_requests_waiting".to_string(),
            crate::server_metrics::ServerMetric::Gauge {
                avg: queue_max / 2.0,
                min: 0.0,
                max: queue_max,
                last: 0.0,
            },
        );
        level.server = Some(server);
    }
    report.goals.extend(
        report.evaluate_goals(&[
            parse_goal("server.vllm:num_requests_waiting.max > 5").expect("goal")
        ]),
    );
    report
}

#[test]
fn server_terminal_rendering_matches_golden() {
    assert_snapshot(
        "server_terminal.txt",
        &render_terminal(&server_report(), false),
    );
}

#[test]
fn server_markdown_rendering_matches_golden() {
    let markdown = render_markdown(&server_report());
    assert!(markdown.lines().count() < markdown::MAX_LINES);
    assert!(!markdown.contains("cut to fit"), "{markdown}");
    assert_snapshot("server_report.md", &markdown);
}

#[test]
fn server_html_rendering_matches_golden() {
    assert_snapshot("server_report.html", &render_html(&server_report()));
}

#[test]
fn the_server_ttft_is_shown_beside_the_clients() {
    let report = server_report();
    let client_p50 = report.llm.ttft_ms.expect("ttft").p50;
    let terminal = render_terminal(&report, false);
    // 0.11 s is 110 ms; the client's p50 beside it, and the difference.
    let line = terminal
        .lines()
        .find(|l| l.contains("TTFT p50 (ms)"))
        .unwrap_or_else(|| panic!("no TTFT row:\n{terminal}"));
    assert!(line.contains("vllm:time_to_first_token_seconds"), "{line}");
    assert!(line.contains("110.00"), "{line}");
    assert!(line.contains(&format!("{client_p50:.2}")), "{line}");
    assert!(
        line.contains(&format!("{:+.2}", client_p50 - 110.0)),
        "{line}"
    );
    assert!(terminal.contains("network, ingress and client"));
    assert!(terminal.contains("request latency p99 (ms)"));
    // The known roles in order, KV-cache usage in percent.
    let order = [
        "queue depth",
        "running requests",
        "KV-cache usage",
        "preemptions",
        "prompt tokens/s",
        "generation tokens/s",
        "TTFT p50",
        "request latency p50",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|what| {
            terminal
                .find(what)
                .unwrap_or_else(|| panic!("{what}:\n{terminal}"))
        })
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{terminal}");
    assert!(terminal.contains("avg 42.0 % · max 71.5 %"), "{terminal}");
    // Unknown families are counted, not listed.
    assert!(terminal.contains("2 more families"), "{terminal}");
    assert!(!terminal.contains("process_cpu_seconds_total"));
    let markdown = render_markdown(&report);
    assert!(markdown.contains("2 more families"), "{markdown}");
    assert!(!markdown.contains("process\\_cpu"), "{markdown}");
    // The HTML report holds them all.
    let html = render_html(&report);
    assert!(html.contains("process_cpu_seconds_total"));
}

#[test]
fn html_plots_the_server_over_the_run() {
    let report = server_report();
    let html = render_html(&report);
    for id in [
        "plot-server-queue",
        "plot-server-running",
        "plot-server-kv",
        "plot-server-tokens",
    ] {
        assert!(html.contains(&format!("id=\"{id}\"")), "{id}");
    }
    // Only the plots with data.
    let mut no_tokens = report.clone();
    let server = no_tokens.server.as_mut().expect("server");
    for point in &mut server.timeline {
        point.values.remove("vllm:generation_tokens_total");
    }
    let html = render_html(&no_tokens);
    assert!(html.contains("id=\"plot-server-queue\""));
    assert!(!html.contains("id=\"plot-server-tokens\""));
    // No server section: no server plots, no section.
    let html = render_html(&sample_report());
    assert!(!html.contains("plot-server") && !html.contains("<h2>Server</h2>"));
}

#[test]
fn server_text_is_escaped_everywhere() {
    let mut report = server_report();
    let server = report.server.as_mut().expect("server");
    server.endpoints[1].url = "http://x/<script>alert(1)</script>".to_string();
    server.endpoints[1].note = Some("bad \u{1b}[2J <b>note</b> | `x`".to_string());
    server.metrics.insert(
        "vllm:num_requests_running".to_string(),
        crate::server_metrics::ServerMetric::Gauge {
            avg: 1.0,
            min: 1.0,
            max: 1.0,
            last: 1.0,
        },
    );
    let html = render_html(&report);
    assert!(!html.contains("<script") && !html.contains("<b>note"));
    assert!(html.contains("&lt;script&gt;"));
    let terminal = render_terminal(&report, false);
    assert!(!terminal.contains('\u{1b}'), "{terminal}");
    let markdown = render_markdown(&report);
    assert!(
        !markdown.contains("<b>") && !markdown.contains('\u{1b}'),
        "{markdown}"
    );
}

#[test]
fn an_unanswered_server_is_a_note() {
    let mut report = sample_report();
    report.server = Some(ServerSection {
        endpoints: vec![crate::server_metrics::ServerEndpoint {
            url: "http://127.0.0.1:8080/metrics".to_string(),
            scrapes: 0,
            errors: 0,
            note: Some("no Prometheus metrics (HTTP 404)".to_string()),
            mixed: None,
        }],
        ..ServerSection::default()
    });
    for text in [
        render_terminal(&report, false),
        render_markdown(&report),
        render_html(&report),
    ] {
        assert!(text.contains("no endpoint answered"), "{text}");
        assert!(text.contains("HTTP 404"), "{text}");
    }
}

#[test]
fn sweep_and_capacity_tables_gain_the_server_queue_max() {
    let report = server_report();
    let terminal = render_terminal(&report, false);
    assert!(terminal.contains("server queue max"), "{terminal}");
    assert!(render_markdown(&report).contains("Server queue max"));
    assert!(render_html(&report).contains("<th>Server queue max</th>"));
    // Without server sections, no column.
    assert!(!render_terminal(&sample_report(), false).contains("server queue max"));

    let mut capacity = capacity_report();
    let section = capacity.capacity.as_mut().expect("capacity");
    for (i, probe) in section.probes.iter_mut().enumerate() {
        let mut server = sample_server();
        server.metrics.insert(
            "vllm:num_requests_waiting".to_string(),
            crate::server_metrics::ServerMetric::Gauge {
                avg: 1.0,
                min: 0.0,
                max: 100.0 + i as f64,
                last: 0.0,
            },
        );
        probe.server = Some(server);
    }
    // The capacity table's queue is a sampled gauge: the header says so, with the
    // interval (issue 32: a true peak of 11 showed as 9 between two scrapes).
    let terminal = render_terminal(&capacity, false);
    assert!(
        terminal.contains("server queue max (sampled every 1 s)") && terminal.contains("101"),
        "{terminal}"
    );
    let markdown = render_markdown(&capacity);
    assert!(
        markdown.contains("Server queue max (sampled every 1 s)"),
        "{markdown}"
    );
    let html = render_html(&capacity);
    assert!(
        html.contains("<th>Server queue max (sampled every 1 s)</th>") && html.contains(">101<")
    );
}

#[test]
fn the_server_section_survives_a_json_round_trip() {
    let report = server_report();
    let text = report.to_json_pretty();
    let json: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        get(&json, "server/metrics/vllm:num_requests_waiting/type"),
        "gauge"
    );
    assert_eq!(
        get(&json, "server/metrics/vllm:num_requests_waiting/max"),
        7.0
    );
    assert_eq!(
        get(
            &json,
            "server/metrics/vllm:time_to_first_token_seconds/type"
        ),
        "histogram"
    );
    assert_eq!(get(&json, "server/endpoints/0/scrapes"), 6);
    assert_eq!(
        get(
            &json,
            "sweep/2/server/metrics/vllm:num_requests_waiting/max"
        ),
        7.0
    );
    let read = Report::from_json(&text).expect("reads back");
    assert_eq!(read.server, report.server);
    assert!(read.server.is_some());
    for (read, level) in read.sweep.iter().zip(&report.sweep) {
        assert_eq!(read.server, level.server);
    }
    // Absent when there is none, and a report saved before it existed still reads.
    let plain: Value = serde_json::from_str(&sample_report().to_json_pretty()).expect("json");
    assert!(plain.get("server").is_none());
    assert!(plain["sweep"][0].get("server").is_none());
    let read = Report::from_json(&plain.to_string()).expect("reads");
    assert!(read.server.is_none() && read.sweep.iter().all(|l| l.server.is_none()));
}

#[test]
fn server_goals_are_judged_on_the_report_and_its_probes() {
    let report = server_report();
    let goal = report.goals.last().expect("server goal");
    assert_eq!(goal.value, Some(7.0));
    assert!(goal.failed);
    let probe = evaluate_goals_on(
        &[parse_goal("server.vllm:num_requests_waiting.max > 5").expect("goal")],
        &report.llm,
        &report.requests,
        None,
        report.sweep[1].server.as_ref(),
        None,
    );
    assert_eq!(probe[0].value, Some(2.0));
    assert!(!probe[0].failed);
    assert_eq!(
        crate::goals::unknown_server_metrics(
            &[parse_goal("server.vllm:num_request_waiting.max > 5").expect("goal")],
            report.server.as_ref()
        ),
        vec!["server.vllm:num_request_waiting.max > 5".to_string()]
    );
}

/// Cancelled requests (as recorded, by rate) are counted apart from failures and ended-early
/// streams, within the total; their TTFT counts when they had one, nothing else does.
#[test]
fn cancellations_are_counted_apart_and_within_the_total() {
    use common::measure::CancelCause;
    let mut m = RunMetrics::new();
    m.record(&succeeded(0, 100, 10, 5, true));
    let mut after_first_token = RequestOutcome::failed(FailureKind::Empty);
    after_first_token.kind = OutcomeKind::Cancelled(CancelCause::AsRecorded);
    after_first_token.ttft_us = Some(90_000);
    after_first_token.content_frames = 3;
    after_first_token.sent_unix_us = Some(T0_US);
    m.record(&after_first_token);
    let mut before = RequestOutcome::failed(FailureKind::Empty);
    before.kind = OutcomeKind::Cancelled(CancelCause::ByRate);
    m.record(&before);
    let requests = RequestsSection::new(&m.counters, &RequestTotals::default());
    assert_eq!(
        (
            requests.total,
            requests.succeeded,
            requests.failed,
            requests.ended_early,
            requests.cancelled_as_recorded,
            requests.cancelled_by_rate
        ),
        (3, 1, 0, 0, 1, 1)
    );
    let llm = LlmSection::from_metrics(&m);
    assert_eq!(llm.ttft_ms.expect("TTFT").count, 2);
    assert_eq!(llm.latency_ms.expect("latency").count, 1);
    assert_eq!(llm.osl_tokens.expect("OSL").count, 1);
    assert_eq!(requests.error_rate_pct(), Some(0.0));
    let json = serde_json::to_value(&requests).expect("json");
    assert_eq!(json["cancelled_as_recorded"], 1);
    assert_eq!(json["cancelled_by_rate"], 1);
}

/// Token sources: tokenizer counts are not estimates, and each source has its share.
#[test]
fn token_sources_have_counts_and_shares() {
    use common::measure::TokenSource;
    let mut m = RunMetrics::new();
    m.record(&succeeded(0, 100, 10, 5, true));
    let mut tokenized = succeeded(1, 100, 10, 5, false);
    tokenized.tokenized_output_tokens = Some(6);
    tokenized.input_source = Some(TokenSource::Tokenizer);
    m.record(&tokenized);
    let mut frames = succeeded(2, 100, 10, 5, false);
    frames.input_source = Some(TokenSource::Estimate);
    m.record(&frames);
    m.record(&succeeded(3, 100, 10, 5, false));
    let requests = RequestsSection::new(&m.counters, &RequestTotals::default());
    let output = &requests.token_source.output;
    assert_eq!((output.usage, output.tokenizer, output.frames), (1, 1, 2));
    assert_eq!(output.frames_pct, Some(50.0));
    let input = &requests.token_source.input;
    assert_eq!((input.usage, input.tokenizer, input.estimate), (0, 1, 1));
    assert_eq!(input.tokenizer_pct, Some(50.0));
    assert_eq!(
        (
            requests.usage_reported,
            requests.tokenized,
            requests.estimated
        ),
        (1, 1, 2)
    );
    // Tokenized streams are not estimated: 2 of 4 are.
    assert_eq!(
        LlmSection::from_metrics(&m).estimated_token_share_pct,
        Some(50.0)
    );
    assert_eq!(m.counters.output_tokens, 5 + 6 + 5 + 5);
}

/// A run meant to be cold (`--set cache_prompt=false`, `--set cache_salt=…`) that reports
/// cached input is warned; a run that did not ask, or saw no cached input, is not.
#[test]
fn a_cold_run_with_cached_input_is_warned() {
    let sets = |field: &str, value: &str| vec![(field.to_owned(), value.to_owned())];
    assert_eq!(
        cold_cache_request(&sets("cache_prompt", "false")).as_deref(),
        Some("cache_prompt=false")
    );
    assert_eq!(
        cold_cache_request(&sets("cache_salt", "run-1")).as_deref(),
        Some("cache_salt")
    );
    assert_eq!(cold_cache_request(&sets("cache_prompt", "true")), None);
    assert_eq!(cold_cache_request(&sets("model", "m")), None);
    let mut report = sample_report();
    report.llm.cached_input_share_pct = Some(22.5);
    let before = report.warnings.len();
    warn_cached_when_cold(&mut report, None);
    assert_eq!(report.warnings.len(), before);
    warn_cached_when_cold(&mut report, Some("cache_prompt=false"));
    let warning = report.warnings.last().expect("a warning");
    assert!(
        warning.contains("22.5 %") && warning.contains("cache_prompt=false"),
        "{warning}"
    );
    let mut cold = sample_report();
    cold.llm.cached_input_share_pct = Some(0.0);
    let before = cold.warnings.len();
    warn_cached_when_cold(&mut cold, Some("cache_prompt=false"));
    assert_eq!(cold.warnings.len(), before);
}

/// Issue 33, item 8: HTTP/2 carries many requests on one connection, so the protocol line
/// counts requests per protocol and connections apart (nginx carried 40 requests on 1
/// connection where the line used to show the connections alone).
#[test]
fn requests_are_counted_per_protocol_apart_from_connections() {
    use common::metrics::{HttpProtocol, TlsVersion};
    let mut m = RunMetrics::new();
    for i in 0..44 {
        let protocol = if i < 40 {
            HttpProtocol::H2
        } else {
            HttpProtocol::Http1
        };
        m.record(&RequestOutcome {
            protocol: Some(protocol),
            ..succeeded(i, 100, 5, 10, true)
        });
    }
    // A failure before any response head counts no protocol.
    m.record(&RequestOutcome::transport_failure(
        common::measure::TransportCause::Refused,
    ));
    m.count_connection(HttpProtocol::H2, TlsVersion::Tls13);
    for _ in 0..4 {
        m.count_connection(HttpProtocol::Http1, TlsVersion::None);
    }
    let report = Report::build(ReportInput {
        run: run_info(),
        metrics: &m,
        requests: RequestTotals::default(),
        baseline: None,
        sweep: Vec::new(),
        warnings: Vec::new(),
        timeline: Vec::new(),
        slos: &NO_SLOS,
    });
    let transport = report.transport.as_ref().expect("transport section");
    assert_eq!(
        transport.requests,
        vec![
            ProtocolRequests {
                protocol: "http/1.1".to_string(),
                count: 4
            },
            ProtocolRequests {
                protocol: "h2".to_string(),
                count: 40
            },
        ]
    );
    assert_eq!(
        super::format::connections_line(&report).as_deref(),
        Some("http/1.1: 4 requests on 4 connections · h2 TLSv1.3: 40 requests on 1 connection")
    );
    // Saved and read back, the counts survive.
    let json = serde_json::to_string(&report).expect("serialize");
    let back: Report = serde_json::from_str(&json).expect("parse");
    assert_eq!(back.transport, report.transport);
}
