//! The run's time series: TTFT, ITL, throughput, in-flight requests and errors per interval,
//! built from the workers' cumulative interval reports.
//!
//! Workers send cumulative HDR histograms and counters every report interval. The supervisor
//! hands each report it accepts (decoded once, by the gRPC service, into sparse histograms) to
//! [`RunTimeline::add_report`] as it arrives; the timeline subtracts the worker's previous
//! cumulative TTFT and ITL histograms from the new ones, bucket by bucket (exact), and adds the
//! differences into the open interval's dense histograms, and [`RunTimeline::tick`] closes intervals: no tick walks every worker's
//! histograms. An interval closes once it spans [`INTERVAL`] (wider on long runs, see
//! [`MAX_POINTS`]), so every measured request lands in exactly one interval: the sums over the
//! series equal the run's totals. A sample is stamped when the coordinator takes it, so a
//! request may land up to one report interval after it finished.

use std::time::{Duration, SystemTime};

use common::metrics::{Counters, Metric, SparseHistogram, Stats, stats_of};
use common::worker_report::ReceivedReport;
use hdrhistogram::Histogram;

use crate::report::TimelinePoint;

/// The width of one interval of the series.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Past this many points the interval width doubles (for the points still to come), so a
/// day-long run keeps a series of a few thousand points.
pub const MAX_POINTS: usize = 900;

/// What the run has measured so far, merged over the workers: what the progress line shows.
#[derive(Debug, Clone, Default)]
pub struct LiveTotals {
    /// Requests answered (succeeded, failed, ended early), warm-up excluded.
    pub answered: u64,
    /// Failed requests of every kind.
    pub failed: u64,
    /// Requests sent and not yet answered.
    pub in_flight: u64,
    /// TTFT over the whole run so far (ms).
    pub ttft: Option<Stats>,
}

/// The time series of one replay: see the module documentation.
pub struct RunTimeline {
    started_at: SystemTime,
    workers: Vec<Option<WorkerCumulative>>,
    /// The open interval.
    open: Interval,
    /// The last closed interval and its start, kept so that a short last interval can be
    /// merged into it at the end instead of showing a rate over a sliver of time.
    last_closed: Option<(Interval, f64)>,
    /// End of the last closed interval, seconds since the start.
    closed_until_s: f64,
    width_s: f64,
    points: Vec<TimelinePoint>,
    /// TTFT of the whole run so far, for [`LiveTotals`].
    ttft_total: Histogram<u64>,
}

/// What the series keeps of a worker's last report: only what it subtracts next time.
struct WorkerCumulative {
    seq: u64,
    ttft: SparseHistogram,
    itl: SparseHistogram,
    counters: Counters,
    /// Sent and not yet answered, at that report.
    in_flight: u64,
}

/// The differences accumulated into the interval that is still open.
struct Interval {
    ttft: Histogram<u64>,
    itl: Histogram<u64>,
    counters: Counters,
}

impl Interval {
    fn new() -> Interval {
        Interval {
            ttft: empty_histogram(),
            itl: empty_histogram(),
            counters: Counters::default(),
        }
    }

    /// Add `other`'s requests to this interval's.
    fn add(&mut self, other: &Interval) {
        // Auto-resizing histograms of one precision always add.
        let _ = self.ttft.add(&other.ttft);
        let _ = self.itl.add(&other.itl);
        add_difference(&mut self.counters, &other.counters, &Counters::default());
    }
}

fn empty_histogram() -> Histogram<u64> {
    Histogram::new(common::metrics::SIGNIFICANT_DIGITS).expect("3 significant digits is valid")
}

impl RunTimeline {
    /// A series whose time zero is `started_at` (the instant every worker starts its load).
    pub fn new(started_at: SystemTime, workers: usize) -> RunTimeline {
        RunTimeline {
            started_at,
            workers: (0..workers).map(|_| None).collect(),
            open: Interval::new(),
            last_closed: None,
            closed_until_s: 0.0,
            width_s: INTERVAL.as_secs_f64(),
            points: Vec::new(),
            ttft_total: empty_histogram(),
        }
    }

    /// Add worker `index`'s new report (one it has not taken yet) to the open interval.
    pub fn add_report(&mut self, index: usize, report: &ReceivedReport) {
        self.take(index, report);
    }

    /// Close the open interval when it is due; returns the merged totals so far for the
    /// progress line.
    pub fn tick(&mut self) -> LiveTotals {
        self.sample_at(SystemTime::now(), std::iter::empty())
    }

    /// The series' intervals are at least `report_interval` wide: narrower ones would
    /// alternate between holding a report of every worker and holding none.
    pub fn with_report_interval(mut self, report_interval: Duration) -> RunTimeline {
        self.width_s = self.width_s.max(report_interval.as_secs_f64());
        self
    }

    /// The series, after a last sample of the workers' final reports.
    pub fn finish<'a>(
        self,
        latest: impl IntoIterator<Item = Option<&'a ReceivedReport>>,
    ) -> Vec<TimelinePoint> {
        self.finish_at(SystemTime::now(), latest)
    }

    fn finish_at<'a>(
        mut self,
        at: SystemTime,
        latest: impl IntoIterator<Item = Option<&'a ReceivedReport>>,
    ) -> Vec<TimelinePoint> {
        self.sample_at(at, latest);
        let t = self.seconds_at(at).max(self.closed_until_s);
        let sliver = t - self.closed_until_s < self.width_s / 2.0;
        match self.last_closed.take() {
            // The final reports often come just after a tick: a sliver's rates would be
            // noise, so it joins the interval before it (histograms add exactly).
            Some((mut previous, start)) if sliver => {
                previous.add(&self.open);
                self.points.pop();
                self.closed_until_s = start;
                self.open = previous;
                self.close(t);
            }
            _ if sliver && self.open.counters.completed() == 0 => {}
            _ => self.close(t),
        }
        self.points
    }

    fn seconds_at(&self, at: SystemTime) -> f64 {
        at.duration_since(self.started_at)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }

    fn sample_at<'a>(
        &mut self,
        at: SystemTime,
        latest: impl IntoIterator<Item = Option<&'a ReceivedReport>>,
    ) -> LiveTotals {
        for (index, report) in latest.into_iter().enumerate() {
            if let Some(report) = report {
                self.take(index, report);
            }
        }
        let t = self.seconds_at(at);
        // Ticks come a little late; an interval that is nearly full closes at this tick
        // rather than one tick later.
        if t - self.closed_until_s >= self.width_s * 0.9 {
            self.close(t);
        }
        self.totals()
    }

    /// Add a worker's report, if newer than the last one taken, as differences.
    fn take(&mut self, index: usize, report: &ReceivedReport) {
        if index >= self.workers.len() {
            self.workers.resize_with(index + 1, || None);
        }
        if self.workers[index]
            .as_ref()
            .is_some_and(|w| w.seq >= report.seq)
        {
            return;
        }
        let metrics = &report.metrics;
        let totals = report.totals;
        let c = &metrics.counters;
        let in_flight = totals.issued.saturating_sub(c.completed() + c.warmup);
        let previous = self.workers[index].take();
        let empty = SparseHistogram::default();
        let next = WorkerCumulative {
            seq: report.seq,
            ttft: metrics.histogram(Metric::Ttft).clone(),
            itl: metrics.histogram(Metric::Itl).clone(),
            counters: metrics.counters,
            in_flight,
        };
        for (metric, into) in [
            (Metric::Ttft, &mut self.open.ttft),
            (Metric::Itl, &mut self.open.itl),
        ] {
            let before = match (&previous, metric) {
                (Some(p), Metric::Ttft) => &p.ttft,
                (Some(p), _) => &p.itl,
                (None, _) => &empty,
            };
            // Cumulative histograms only grow; a worker whose numbers went back (it cannot
            // happen with a valid worker) contributes nothing of this metric to this interval.
            if let Some(delta) = metrics.histogram(metric).minus(before) {
                delta.add_into(into);
                if metric == Metric::Ttft {
                    delta.add_into(&mut self.ttft_total);
                }
            }
        }
        let before_counters = previous.as_ref().map(|p| p.counters).unwrap_or_default();
        add_difference(&mut self.open.counters, &next.counters, &before_counters);
        self.workers[index] = Some(next);
    }

    /// Close the open interval at `t` seconds.
    fn close(&mut self, t: f64) {
        let open = std::mem::replace(&mut self.open, Interval::new());
        let start = self.closed_until_s;
        let dt = t - start;
        let per_second = |n: u64| if dt > 0.0 { n as f64 / dt } else { 0.0 };
        let quantile = |h: &Histogram<u64>, q: f64| {
            (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1_000.0)
        };
        self.points.push(TimelinePoint {
            t_s: t,
            dt_s: dt,
            concurrency: None,
            ttft_p50_ms: quantile(&open.ttft, 0.50),
            ttft_p95_ms: quantile(&open.ttft, 0.95),
            itl_p50_ms: quantile(&open.itl, 0.50),
            itl_p95_ms: quantile(&open.itl, 0.95),
            output_tokens_per_s: per_second(open.counters.output_tokens),
            requests_per_s: per_second(open.counters.succeeded),
            succeeded: open.counters.succeeded,
            output_tokens: open.counters.output_tokens,
            errors: open.counters.failed(),
            in_flight: self.workers.iter().flatten().map(|w| w.in_flight).sum(),
            hand_over: false,
        });
        self.last_closed = Some((open, start));
        self.closed_until_s = t;
        if self.points.len().is_multiple_of(MAX_POINTS) {
            self.width_s *= 2.0;
        }
    }

    fn totals(&self) -> LiveTotals {
        let mut totals = LiveTotals {
            ttft: stats_of(&self.ttft_total, 1_000.0),
            ..LiveTotals::default()
        };
        for worker in self.workers.iter().flatten() {
            totals.answered += worker.counters.completed();
            totals.failed += worker.counters.failed();
            totals.in_flight += worker.in_flight;
        }
        totals
    }
}

/// `into += after − before` for the counters the series shows.
fn add_difference(into: &mut Counters, after: &Counters, before: &Counters) {
    let d = |a: u64, b: u64| a.saturating_sub(b);
    into.succeeded += d(after.succeeded, before.succeeded);
    into.ended_early += d(after.ended_early, before.ended_early);
    into.failed_status += d(after.failed_status, before.failed_status);
    into.failed_error_frame += d(after.failed_error_frame, before.failed_error_frame);
    into.failed_transport += d(after.failed_transport, before.failed_transport);
    into.failed_timeout += d(after.failed_timeout, before.failed_timeout);
    into.failed_empty += d(after.failed_empty, before.failed_empty);
    into.output_tokens += d(after.output_tokens, before.output_tokens);
}

/// One series for a whole command: the levels of a sweep one after another on one time axis
/// (seconds since the first level started), each point tagged with its level's concurrency.
pub fn join_levels<'a>(
    levels: impl IntoIterator<Item = (Option<u32>, SystemTime, &'a [TimelinePoint])>,
) -> Vec<TimelinePoint> {
    let mut out = Vec::new();
    let mut first: Option<SystemTime> = None;
    for (concurrency, started_at, points) in levels {
        let zero = *first.get_or_insert(started_at);
        let offset = started_at
            .duration_since(zero)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        out.extend(points.iter().map(|p| TimelinePoint {
            t_s: p.t_s + offset,
            concurrency,
            ..p.clone()
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::measure::{OutcomeKind, RequestOutcome};
    use common::metrics::{RunMetrics, SparseMetrics};

    fn outcome(ttft_ms: u64, osl: u64) -> RequestOutcome {
        RequestOutcome {
            kind: OutcomeKind::Succeeded,
            ttft_us: Some(ttft_ms * 1_000),
            ttst_us: Some(10_000),
            latency_us: Some(ttft_ms * 1_000 + (osl - 1) * 10_000),
            content_frames: osl,
            usage_output_tokens: Some(osl),
            server_output_tokens: None,
            tokenized_output_tokens: None,
            input_source: None,
            input_tokens: Some(10),
            schedule_lag_us: None,
            sent_unix_us: Some(1_000_000),
            transport_cause: None,
            resent: false,
            unstreamed: false,
            cached_input_tokens: None,
            coalesced: false,
            protocol: None,
        }
    }

    /// The report a worker sends: cumulative metrics, `issued` requests sent so far.
    fn report(seq: u64, metrics: &RunMetrics, issued: u64) -> ReceivedReport {
        ReceivedReport {
            seq,
            metrics: SparseMetrics::from(metrics),
            totals: common::metrics::SliceTotals {
                issued,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Two workers reporting cumulative numbers at different moments: each interval holds the
    /// requests finished since the previous one, exactly, and the series sums to the totals.
    #[test]
    fn intervals_hold_the_differences_of_cumulative_reports() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut timeline = RunTimeline::new(t0, 2);

        // Worker 0: two fast requests in the first second; worker 1: one slow one.
        let mut w0 = RunMetrics::new();
        w0.record(&outcome(10, 11));
        w0.record(&outcome(12, 11));
        let mut w1 = RunMetrics::new();
        w1.record(&outcome(500, 21));
        let r0 = report(1, &w0, 3);
        let r1 = report(1, &w1, 1);
        timeline.sample_at(at(0.5), [Some(&r0), None]);
        let live = timeline.sample_at(at(1.0), [Some(&r0), Some(&r1)]);
        assert_eq!(live.answered, 3);
        assert_eq!(live.in_flight, 1, "worker 0 sent 3 and heard back from 2");

        // Second interval: worker 0 adds a slow request and a failure; worker 1 is silent,
        // and its old report seen again adds nothing.
        w0.record(&outcome(900, 11));
        w0.record(&RequestOutcome::failed(
            common::measure::FailureKind::Status,
        ));
        let r0b = report(2, &w0, 4);
        timeline.sample_at(at(1.5), [Some(&r0b), Some(&r1)]);
        let points = timeline.finish_at(at(1.6), [Some(&r0b), Some(&r1)]);

        assert_eq!(points.len(), 2, "{points:#?}");
        let (first, second) = (&points[0], &points[1]);
        assert_eq!((first.t_s, first.dt_s), (1.0, 1.0));
        assert_eq!(first.succeeded, 3);
        assert_eq!(first.output_tokens, 43);
        assert!((first.output_tokens_per_s - 43.0).abs() < 1e-9);
        assert_eq!(first.errors, 0);
        assert_eq!(first.in_flight, 1);
        let p50 = first.ttft_p50_ms.expect("TTFT in the first interval");
        assert!((p50 - 12.0).abs() < 0.1, "{p50}");
        let p95 = first.ttft_p95_ms.expect("TTFT p95");
        assert!((p95 - 500.0).abs() < 1.0, "{p95}");

        assert_eq!(second.succeeded, 1);
        assert_eq!(second.errors, 1);
        assert_eq!(second.in_flight, 0);
        let only = second.ttft_p50_ms.expect("TTFT in the second interval");
        assert!((only - 900.0).abs() < 1.0, "only the new request: {only}");
        assert!((second.t_s - 1.6).abs() < 1e-9 && (second.dt_s - 0.6).abs() < 1e-9);

        let succeeded: u64 = points.iter().map(|p| p.succeeded).sum();
        assert_eq!(succeeded, w0.counters.succeeded + w1.counters.succeeded);
    }

    /// Final reports that come just after a tick join the last interval rather than making a
    /// sliver whose rate would be noise.
    #[test]
    fn a_sliver_at_the_end_joins_the_interval_before_it() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut timeline = RunTimeline::new(t0, 1);
        let mut w = RunMetrics::new();
        w.record(&outcome(10, 11));
        let first = report(1, &w, 1);
        // A tick a little late still closes the first interval (0.95 s of 1 s).
        timeline.sample_at(at(0.95), [Some(&first)]);
        for _ in 0..3 {
            w.record(&outcome(30, 11));
        }
        let second = report(2, &w, 3);
        timeline.sample_at(at(1.9), [Some(&second)]);
        w.record(&outcome(50, 11));
        let last = report(3, &w, 4);
        let points = timeline.finish_at(at(1.92), [Some(&last)]);
        assert_eq!(points.len(), 2, "{points:#?}");
        assert!((points[0].t_s - 0.95).abs() < 1e-9);
        let merged = &points[1];
        assert!((merged.t_s - 1.92).abs() < 1e-9 && (merged.dt_s - 0.97).abs() < 1e-9);
        assert_eq!(merged.succeeded, 4);
        assert!((merged.requests_per_s - 4.0 / 0.97).abs() < 1e-9);
        let max = merged.ttft_p95_ms.expect("TTFT");
        assert!(
            (max - 50.0).abs() < 0.1,
            "the sliver's request is in it: {max}"
        );
    }

    /// A worker whose cumulative numbers went back (a valid worker never does) adds nothing
    /// of them to the interval; its next report counts from the one that went back.
    #[test]
    fn a_worker_whose_numbers_went_back_adds_nothing() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut timeline = RunTimeline::new(t0, 1);
        let mut w = RunMetrics::new();
        w.record(&outcome(10, 11));
        w.record(&outcome(12, 11));
        timeline.sample_at(at(1.0), [Some(&report(1, &w, 2))]);
        let mut back = RunMetrics::new();
        back.record(&outcome(900, 11));
        timeline.sample_at(at(2.0), [Some(&report(2, &back, 2))]);
        back.record(&outcome(40, 11));
        let points = timeline.finish_at(at(3.0), [Some(&report(3, &back, 3))]);
        assert_eq!(points.len(), 3, "{points:#?}");
        assert_eq!(points[0].succeeded, 2);
        assert_eq!((points[1].succeeded, points[1].ttft_p95_ms), (0, None));
        assert_eq!(points[2].succeeded, 1);
        let p95 = points[2].ttft_p95_ms.expect("the new request");
        assert!((p95 - 40.0).abs() < 0.1, "{p95}");
    }

    #[test]
    fn sweep_levels_share_one_time_axis() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(50);
        let point = |t_s: f64| TimelinePoint {
            t_s,
            dt_s: 1.0,
            ..TimelinePoint::default()
        };
        let first = [point(1.0), point(2.0)];
        let second = [point(1.0)];
        let joined = join_levels([
            (Some(1), t0, &first[..]),
            (Some(4), t0 + Duration::from_secs(3), &second[..]),
        ]);
        let times: Vec<(f64, Option<u32>)> =
            joined.iter().map(|p| (p.t_s, p.concurrency)).collect();
        assert_eq!(times, [(1.0, Some(1)), (2.0, Some(1)), (4.0, Some(4))]);
    }
}
