//! Transients: a stretch of the run's timeline far worse than the rest of it, named in the
//! terminal and Markdown reports ("TTFT p95 up to 415 ms in 0.0–2.0 s; 129 ms in a typical
//! interval"), so a spike the whole-run percentiles average away is not left to the JSON.
//!
//! How it is judged, per sweep level (each level is its own load), for TTFT p95 and ITL p95
//! of the requests that finished in each interval:
//! - the *typical* value is the median of the intervals' values (at least
//!   [`MIN_INTERVALS`] intervals with finished requests are needed);
//! - an interval is *far worse* when its value is at least [`RATIO`] × the typical one and
//!   at least the metric's floor above it (20 ms for TTFT, 5 ms for ITL: a 1 ms → 3 ms ITL
//!   wobble is not news);
//! - neighbouring far-worse intervals form one stretch; a stretch is named when it holds at
//!   least [`MIN_REQUESTS`] finished requests (one slow request is the tail, not a
//!   transient) and covers at most a third of the level's intervals (a level that is bad
//!   for most of its length is simply slow, and the percentiles already say so).
//!
//! Failures are judged the same way by count: when at least [`MIN_FAILURES`] requests
//! failed and the shortest stretch holding 80 % of them covers at most a third of the
//! level's intervals, that stretch is named.

use super::{Report, TimelinePoint};

/// An interval's value must be at least this many times the typical interval's.
pub(super) const RATIO: f64 = 2.0;
/// Intervals with finished requests needed before any is compared with the others.
pub(super) const MIN_INTERVALS: usize = 5;
/// Finished requests a stretch needs before it is named.
pub(super) const MIN_REQUESTS: u64 = 3;
/// Failures needed before their concentration in time is looked at.
pub(super) const MIN_FAILURES: u64 = 5;
/// Share of the failures the named stretch must hold.
const FAILURE_SHARE: f64 = 0.8;
/// The longest stretch named, as a share of the level's intervals.
const MAX_SHARE: f64 = 1.0 / 3.0;
/// Stretches named per metric and level (the worst first).
const MAX_PER_METRIC: usize = 2;

/// One line saying how transients are judged, printed under them.
pub(super) const HOW_JUDGED: &str = "named when an interval's p95 is at least 2× the median interval's and 20 ms (TTFT) or 5 ms (ITL) above it, over at most a third of the run, with at least 3 requests; failures when 80 % of at least 5 fall in at most a third of the run";

/// A metric of a timeline interval that can spike.
struct Series {
    label: &'static str,
    floor_ms: f64,
    value: fn(&TimelinePoint) -> Option<f64>,
}

const SERIES: [Series; 2] = [
    Series {
        label: "TTFT p95",
        floor_ms: 20.0,
        value: |p| p.ttft_p95_ms,
    },
    Series {
        label: "ITL p95",
        floor_ms: 5.0,
        value: |p| p.itl_p95_ms,
    },
];

/// The lines naming every transient of `report`'s timeline (empty when there is none).
pub(super) fn transient_lines(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    let sweeping = report.timeline.iter().any(|p| p.concurrency.is_some());
    for level in levels(&report.timeline) {
        let prefix = match (sweeping, level.first().and_then(|p| p.concurrency)) {
            (true, Some(c)) => format!("at concurrency {c}: "),
            _ => String::new(),
        };
        for series in &SERIES {
            for line in spikes(level, series) {
                lines.push(format!("{prefix}{line}"));
            }
        }
        if let Some(line) = failure_burst(level) {
            lines.push(format!("{prefix}{line}"));
        }
    }
    lines
}

/// The timeline cut into runs of points of one sweep level.
fn levels(timeline: &[TimelinePoint]) -> Vec<&[TimelinePoint]> {
    let mut out = Vec::new();
    let mut from = 0;
    for i in 1..=timeline.len() {
        if i == timeline.len() || timeline[i].concurrency != timeline[from].concurrency {
            if i > from {
                out.push(&timeline[from..i]);
            }
            from = i;
        }
    }
    out
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// `0.0–2.0 s` for the points `from..=to` of a level.
fn span(level: &[TimelinePoint], from: usize, to: usize) -> String {
    let start = (level[from].t_s - level[from].dt_s).max(0.0);
    format!("{start:.1}–{:.1} s", level[to].t_s)
}

/// The stretches of `level` where `series` is far worse than its typical interval.
fn spikes(level: &[TimelinePoint], series: &Series) -> Vec<String> {
    let with_data: Vec<(usize, f64)> = level
        .iter()
        .enumerate()
        .filter(|(_, p)| p.succeeded > 0)
        .filter_map(|(i, p)| (series.value)(p).map(|v| (i, v)))
        .collect();
    if with_data.len() < MIN_INTERVALS {
        return Vec::new();
    }
    let Some(typical) = median(with_data.iter().map(|(_, v)| *v).collect()) else {
        return Vec::new();
    };
    let far_worse = |v: f64| v >= RATIO * typical && v - typical >= series.floor_ms;
    let longest = ((with_data.len() as f64) * MAX_SHARE).floor() as usize;
    // Stretches of consecutive far-worse intervals (intervals where nothing finished do not
    // break a stretch: a stall is part of it).
    let mut stretches: Vec<(usize, usize, f64, u64, usize)> = Vec::new();
    let mut current: Option<(usize, usize, f64, u64, usize)> = None;
    for &(i, v) in &with_data {
        if far_worse(v) {
            let requests = level[i].succeeded;
            current = Some(match current {
                Some((from, _, peak, n, count)) => (from, i, peak.max(v), n + requests, count + 1),
                None => (i, i, v, requests, 1),
            });
        } else if let Some(stretch) = current.take() {
            stretches.push(stretch);
        }
    }
    stretches.extend(current);
    stretches.retain(|&(_, _, _, requests, count)| {
        requests >= MIN_REQUESTS && count >= 1 && count <= longest
    });
    stretches.sort_by(|a, b| b.2.total_cmp(&a.2));
    stretches
        .into_iter()
        .take(MAX_PER_METRIC)
        .map(|(from, to, peak, requests, _)| {
            format!(
                "{} up to {peak:.0} ms in {} ({requests} requests); {typical:.0} ms in a typical interval",
                series.label,
                span(level, from, to)
            )
        })
        .collect()
}

/// The shortest stretch of `level` holding most of its failures, when that is short.
fn failure_burst(level: &[TimelinePoint]) -> Option<String> {
    let total: u64 = level.iter().map(|p| p.errors).sum();
    if total < MIN_FAILURES || level.len() < MIN_INTERVALS {
        return None;
    }
    let needed = (total as f64 * FAILURE_SHARE).ceil() as u64;
    let longest = ((level.len() as f64) * MAX_SHARE).floor() as usize;
    let mut best: Option<(usize, usize, u64)> = None;
    for from in 0..level.len() {
        let mut sum = 0;
        for (to, point) in level.iter().enumerate().skip(from).take(longest) {
            sum += point.errors;
            if sum >= needed {
                if best.is_none_or(|(f, t, _)| to - from < t - f) {
                    best = Some((from, to, sum));
                }
                break;
            }
        }
    }
    let (from, to, held) = best?;
    Some(format!(
        "failures: {held} of {total} in {}",
        span(level, from, to)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t_s: f64, ttft: f64, itl: f64, succeeded: u64, errors: u64) -> TimelinePoint {
        TimelinePoint {
            t_s,
            dt_s: 1.0,
            ttft_p95_ms: Some(ttft),
            itl_p95_ms: Some(itl),
            succeeded,
            errors,
            ..TimelinePoint::default()
        }
    }

    fn report(timeline: Vec<TimelinePoint>) -> Report {
        let mut report = crate::report::tests::sample_report();
        report.timeline = timeline;
        report
    }

    #[test]
    fn a_slow_start_is_named_with_the_typical_interval() {
        let mut timeline = vec![
            point(1.0, 415.0, 10.0, 20, 0),
            point(2.0, 380.0, 10.0, 20, 0),
        ];
        timeline.extend((3..=10).map(|t| point(f64::from(t), 129.0, 10.0, 20, 0)));
        let lines = transient_lines(&report(timeline));
        assert_eq!(
            lines,
            vec!["TTFT p95 up to 415 ms in 0.0–2.0 s (40 requests); 129 ms in a typical interval"]
        );
    }

    #[test]
    fn noise_a_lone_slow_request_and_a_slow_run_are_not_transients() {
        // 1.9× is under the ratio.
        let mut timeline = vec![point(1.0, 190.0, 10.0, 20, 0)];
        timeline.extend((2..=10).map(|t| point(f64::from(t), 100.0, 10.0, 20, 0)));
        assert!(transient_lines(&report(timeline)).is_empty());
        // One slow request is the tail.
        let mut timeline = vec![point(1.0, 900.0, 10.0, 1, 0)];
        timeline.extend((2..=10).map(|t| point(f64::from(t), 100.0, 10.0, 20, 0)));
        assert!(transient_lines(&report(timeline)).is_empty());
        // ITL 1 → 3 ms is under the 5 ms floor.
        let mut timeline = vec![point(1.0, 100.0, 3.0, 20, 0)];
        timeline.extend((2..=10).map(|t| point(f64::from(t), 100.0, 1.0, 20, 0)));
        assert!(transient_lines(&report(timeline)).is_empty());
        // Too few intervals to tell a typical one.
        let timeline = vec![
            point(1.0, 900.0, 10.0, 20, 0),
            point(2.0, 100.0, 10.0, 20, 0),
            point(3.0, 100.0, 10.0, 20, 0),
            point(4.0, 100.0, 10.0, 20, 0),
        ];
        assert!(transient_lines(&report(timeline)).is_empty());
    }

    #[test]
    fn a_failure_burst_is_named_and_a_dead_upstream_is_not_a_burst() {
        let mut timeline: Vec<TimelinePoint> = (1..=10)
            .map(|t| point(f64::from(t), 100.0, 10.0, 20, 0))
            .collect();
        timeline[3].errors = 30;
        timeline[4].errors = 8;
        timeline[8].errors = 2;
        assert_eq!(
            transient_lines(&report(timeline.clone())),
            vec!["failures: 38 of 40 in 3.0–5.0 s"]
        );
        // Failing from 3 s to the end: most of the run, not a transient.
        for p in &mut timeline[2..] {
            p.errors = 10;
        }
        assert!(transient_lines(&report(timeline)).is_empty());
    }

    #[test]
    fn each_sweep_level_is_judged_on_its_own() {
        let mut timeline: Vec<TimelinePoint> = (1..=6)
            .map(|t| TimelinePoint {
                concurrency: Some(1),
                ..point(f64::from(t), 50.0, 10.0, 10, 0)
            })
            .collect();
        // The second level is slower throughout: not a transient of the first.
        timeline.extend((7..=12).map(|t| TimelinePoint {
            concurrency: Some(8),
            ..point(f64::from(t), 400.0, 10.0, 10, 0)
        }));
        assert!(transient_lines(&report(timeline.clone())).is_empty());
        timeline[7].ttft_p95_ms = Some(2000.0);
        assert_eq!(
            transient_lines(&report(timeline)),
            vec![
                "at concurrency 8: TTFT p95 up to 2000 ms in 7.0–8.0 s (10 requests); 400 ms in a typical interval"
            ]
        );
    }
}
