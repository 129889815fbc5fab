//! Conversions between protocol messages and `common`'s domain types, at the boundary.

use common::measure::{FailureKind, OutcomeKind, RequestOutcome};
use common::metrics::{
    Counters, MetricsDecodeError, RecordMeta, RequestRecord, RunMetrics, TransportCounters, Window,
};

use common::timeline::{Timeline, TimelineError};

use crate::v1;

/// Worker-side totals that are not per-request metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SliceTotals {
    pub issued: u64,
    pub not_started: u64,
    pub lost: u64,
    /// Exchanges sent late because they arrived outside the reorder window.
    pub sent_out_of_order: u64,
}

/// Build a report message from a metrics snapshot.
pub fn report_from_metrics(
    seq: u64,
    is_final: bool,
    metrics: &RunMetrics,
    totals: SliceTotals,
    status_codes: &std::collections::BTreeMap<u16, u64>,
    cpu_seconds: f64,
) -> v1::Report {
    let c = &metrics.counters;
    v1::Report {
        seq,
        r#final: is_final,
        histograms: metrics.encode_histograms(),
        connection_histograms: metrics.encode_connection_histograms(),
        counters: Some(v1::Counters {
            succeeded: c.succeeded,
            ended_early: c.ended_early,
            failed_status: c.failed_status,
            failed_error_frame: c.failed_error_frame,
            failed_transport: c.failed_transport,
            failed_timeout: c.failed_timeout,
            failed_empty: c.failed_empty,
            usage_reported: c.usage_reported,
            estimated: c.estimated,
            output_tokens: c.output_tokens,
            warmup: c.warmup,
            not_started: totals.not_started,
            lost: totals.lost,
            issued: totals.issued,
            transport_refused: c.transport.refused,
            transport_reset: c.transport.reset,
            transport_closed_before_response: c.transport.closed_before_response,
            transport_tls: c.transport.tls,
            transport_dns: c.transport.dns,
            transport_other: c.transport.other,
            resent: c.resent,
            unstreamed: c.unstreamed,
            cache_reported: c.cache_reported,
            cached_input_tokens: c.cached_input_tokens,
            cache_reported_input_tokens: c.cache_reported_input_tokens,
            sent_out_of_order: totals.sent_out_of_order,
            pinned: c.pinned,
            pinned_matched: c.pinned_matched,
        }),
        window_start_unix_us: metrics.window.map(|w| w.start_unix_us).unwrap_or(0),
        window_end_unix_us: metrics.window.map(|w| w.end_unix_us).unwrap_or(0),
        status_codes: status_codes
            .iter()
            .map(|(code, n)| (u32::from(*code), *n))
            .collect(),
        cpu_seconds,
        peak_rss_bytes: peak_rss_bytes(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        tls_problems: Default::default(),
        ..Default::default()
    }
}

/// Peak resident set size of this process (Linux `VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}

/// A worker's cumulative report, decoded once when it arrives: everything the coordinator
/// reads from a `v1::Report`.
#[derive(Debug, Clone, Default)]
pub struct WorkerReport {
    pub seq: u64,
    /// The worker's last report: its slice is done.
    pub is_final: bool,
    pub metrics: RunMetrics,
    pub totals: SliceTotals,
    /// Status codes of failed requests: code → count.
    pub status_codes: std::collections::BTreeMap<u16, u64>,
    /// TLS failures by problem (`unknown issuer` → count).
    pub tls_problems: std::collections::BTreeMap<String, u64>,
    pub cpu_seconds: f64,
    pub peak_rss_bytes: u64,
    pub cores: u32,
    /// Completions over time and the steady window's edges, in the worker's clock.
    pub timeline: Timeline,
}

/// Why a report from a worker cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReportDecodeError {
    #[error(transparent)]
    Metrics(#[from] MetricsDecodeError),
    #[error("timeline: {0}")]
    Timeline(#[from] TimelineError),
}

impl WorkerReport {
    /// Requests this report answers for (measured or warm-up), out of those issued.
    pub fn answered(&self) -> u64 {
        self.metrics.counters.completed() + self.metrics.counters.warmup
    }

    /// Every exchange this report accounts for (answered, never started, lost in flight), or
    /// `None` when the counters overflow (a hostile or broken worker).
    pub fn accounted(&self) -> Option<u64> {
        let c = &self.metrics.counters;
        [
            c.succeeded,
            c.ended_early,
            c.failed_status,
            c.failed_error_frame,
            c.failed_transport,
            c.failed_timeout,
            c.failed_empty,
            c.warmup,
            self.totals.not_started,
            self.totals.lost,
        ]
        .into_iter()
        .try_fold(0u64, u64::checked_add)
    }
}

/// Decode a report message into the coordinator's domain form.
pub fn report_from_proto(report: &v1::Report) -> Result<WorkerReport, ReportDecodeError> {
    let (metrics, totals, status_codes) = metrics_from_report(report)?;
    let timeline = timeline_from_report(report)?;
    Ok(WorkerReport {
        seq: report.seq,
        is_final: report.r#final,
        metrics,
        totals,
        status_codes,
        tls_problems: report
            .tls_problems
            .iter()
            .map(|(problem, n)| (problem.clone(), *n))
            .collect(),
        cpu_seconds: report.cpu_seconds,
        peak_rss_bytes: report.peak_rss_bytes,
        cores: report.cores,
        timeline,
    })
}

/// Decode a report message into metrics, slice totals and status codes.
pub fn metrics_from_report(
    report: &v1::Report,
) -> Result<
    (
        RunMetrics,
        SliceTotals,
        std::collections::BTreeMap<u16, u64>,
    ),
    MetricsDecodeError,
> {
    let c = report.counters.unwrap_or_default();
    let counters = Counters {
        succeeded: c.succeeded,
        ended_early: c.ended_early,
        failed_status: c.failed_status,
        failed_error_frame: c.failed_error_frame,
        failed_transport: c.failed_transport,
        failed_timeout: c.failed_timeout,
        failed_empty: c.failed_empty,
        usage_reported: c.usage_reported,
        estimated: c.estimated,
        output_tokens: c.output_tokens,
        warmup: c.warmup,
        transport: TransportCounters {
            refused: c.transport_refused,
            reset: c.transport_reset,
            closed_before_response: c.transport_closed_before_response,
            tls: c.transport_tls,
            dns: c.transport_dns,
            other: c.transport_other,
        },
        resent: c.resent,
        unstreamed: c.unstreamed,
        cache_reported: c.cache_reported,
        cached_input_tokens: c.cached_input_tokens,
        cache_reported_input_tokens: c.cache_reported_input_tokens,
        pinned: c.pinned,
        pinned_matched: c.pinned_matched,
    };
    let window = (report.window_end_unix_us > 0).then_some(Window {
        start_unix_us: report.window_start_unix_us,
        end_unix_us: report.window_end_unix_us,
    });
    let metrics = RunMetrics::decode_with_connections(
        &report.histograms,
        &report.connection_histograms,
        counters,
        window,
    )?;
    let totals = SliceTotals {
        issued: c.issued,
        not_started: c.not_started,
        lost: c.lost,
        sent_out_of_order: c.sent_out_of_order,
    };
    let codes = report
        .status_codes
        .iter()
        .filter_map(|(code, n)| u16::try_from(*code).ok().map(|code| (code, *n)))
        .collect();
    Ok((metrics, totals, codes))
}

/// Put a worker's timeline (steady-state window) into its report.
pub fn timeline_to_report(timeline: &Timeline, report: &mut v1::Report) {
    report.timeline_origin_unix_us = timeline.origin_unix_us;
    report.timeline_bucket_us = timeline.bucket_us;
    report.timeline_completions = timeline.completions.clone();
    report.timeline_output_tokens = timeline.output_tokens.clone();
    report.target_reached_unix_us = timeline.target_reached_unix_us.unwrap_or(0);
    report.last_issued_unix_us = timeline.last_issued_unix_us.unwrap_or(0);
}

/// A worker's timeline from its report, checked (lengths, width) before use.
pub fn timeline_from_report(report: &v1::Report) -> Result<Timeline, TimelineError> {
    let timeline = Timeline {
        origin_unix_us: report.timeline_origin_unix_us,
        bucket_us: report.timeline_bucket_us,
        completions: report.timeline_completions.clone(),
        output_tokens: report.timeline_output_tokens.clone(),
        target_reached_unix_us: (report.target_reached_unix_us > 0)
            .then_some(report.target_reached_unix_us),
        last_issued_unix_us: (report.last_issued_unix_us > 0).then_some(report.last_issued_unix_us),
    };
    timeline.validate()?;
    Ok(timeline)
}

/// A per-request record for the wire.
pub fn record_to_proto(record: RequestRecord) -> v1::RequestRecord {
    let o = &record.outcome;
    v1::RequestRecord {
        index: record.meta.index,
        exchange_id: record.meta.id.clone().unwrap_or_default(),
        session: record.meta.session.clone(),
        sent_unix_us: o.sent_unix_us.unwrap_or(0),
        schedule_lag_us: o.schedule_lag_us,
        outcome: record.outcome_name().to_owned(),
        status: record.status.map(u32::from),
        ttft_us: o.ttft_us,
        ttst_us: o.ttst_us,
        latency_us: o.latency_us,
        input_tokens: o.input_tokens,
        output_tokens: o.output_tokens(),
        usage_reported: o.usage_output_tokens.is_some(),
        cached_input_tokens: o.cached_input_tokens,
        unstreamed: o.unstreamed,
    }
}

/// A per-request record from the wire; an unknown outcome name is `None`.
pub fn record_from_proto(record: &v1::RequestRecord) -> Option<RequestRecord> {
    let kind = match record.outcome.as_str() {
        "succeeded" => OutcomeKind::Succeeded,
        "ended_early" => OutcomeKind::EndedEarly,
        "status" => OutcomeKind::Failed(FailureKind::Status),
        "error_frame" => OutcomeKind::Failed(FailureKind::ErrorFrame),
        "transport" => OutcomeKind::Failed(FailureKind::Transport),
        "timeout" => OutcomeKind::Failed(FailureKind::Timeout),
        "empty" => OutcomeKind::Failed(FailureKind::Empty),
        _ => return None,
    };
    let mut outcome = RequestOutcome::failed(FailureKind::Empty);
    outcome.kind = kind;
    outcome.ttft_us = record.ttft_us;
    outcome.ttst_us = record.ttst_us;
    outcome.latency_us = record.latency_us;
    outcome.content_frames = record.output_tokens;
    outcome.usage_output_tokens = record.usage_reported.then_some(record.output_tokens);
    outcome.input_tokens = record.input_tokens;
    outcome.schedule_lag_us = record.schedule_lag_us;
    outcome.sent_unix_us = (record.sent_unix_us > 0).then_some(record.sent_unix_us);
    outcome.unstreamed = record.unstreamed;
    outcome.cached_input_tokens = record.cached_input_tokens;
    Some(RequestRecord {
        meta: RecordMeta {
            index: record.index,
            id: (!record.exchange_id.is_empty()).then(|| record.exchange_id.clone()),
            session: record.session.clone(),
        },
        outcome,
        status: record.status.and_then(|s| u16::try_from(s).ok()),
    })
}
