//! Conversions between protocol messages and `common`'s domain types, at the boundary.

use common::metrics::{Counters, MetricsDecodeError, RunMetrics, TransportCounters, Window};

use crate::v1;

/// Worker-side totals that are not per-request metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SliceTotals {
    pub issued: u64,
    pub not_started: u64,
    pub lost: u64,
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
    };
    let window = (report.window_end_unix_us > 0).then_some(Window {
        start_unix_us: report.window_start_unix_us,
        end_unix_us: report.window_end_unix_us,
    });
    let metrics = RunMetrics::decode(&report.histograms, counters, window)?;
    let totals = SliceTotals {
        issued: c.issued,
        not_started: c.not_started,
        lost: c.lost,
    };
    let codes = report
        .status_codes
        .iter()
        .filter_map(|(code, n)| u16::try_from(*code).ok().map(|code| (code, *n)))
        .collect();
    Ok((metrics, totals, codes))
}
