//! Conversions between protocol messages and `common`'s domain types, at the boundary: the
//! assignment (`assignment_to_proto`, `assignment_from_proto`, which checks every field a
//! worker receives), reports, timelines and per-request records.

use std::time::Duration;

use common::assignment::{
    Assignment, CancelOptions, Faithful, RequestOptions, TargetTransport, TokenizerFiles,
};
use common::formats::pin::PinMode;
use common::load::{Arrival, LoadModel, Schedule};
use common::measure::{CancelCause, FailureKind, OutcomeKind, RequestOutcome, TokenSource};
use common::metrics::{
    ConnectionCounts, Counters, ErrorSample, ErrorSummary, HistogramEncoding, MetricsDecodeError,
    RecordMeta, RequestProtocols, RequestRecord, RunMetrics, SliceTotals, SparseMetrics,
    TransportCounters, Window,
};
use common::slo::{Slo, Slos};

use common::timeline::{CompletionTimeline, TimelineError};
use common::worker_report::{ReceivedReport, WorkerReport};

use crate::v1;

/// Build a report message from a worker's domain report (the worker's side of the link).
pub fn report_to_proto(report: &WorkerReport) -> v1::Report {
    report_to_proto_as(report, HistogramEncoding::Deflate)
}

/// [`report_to_proto`] with the histograms in `encoding` (what the assignment asked for).
pub fn report_to_proto_as(report: &WorkerReport, encoding: HistogramEncoding) -> v1::Report {
    // The main metrics travel in the report's own fields, the steady ones (when asked for)
    // in a `Metrics` message: one encoder for both.
    let v1::Metrics {
        histograms,
        counters,
        window_start_unix_us,
        window_end_unix_us,
        connection_histograms,
        failure_histograms,
        errors,
    } = metrics_to_proto(&report.metrics, &report.totals, encoding);
    let mut message = v1::Report {
        seq: report.seq,
        r#final: report.is_final,
        histograms,
        connection_histograms,
        failure_histograms,
        errors,
        counters,
        window_start_unix_us,
        window_end_unix_us,
        status_codes: report
            .status_codes
            .iter()
            .map(|(code, n)| (u32::from(*code), *n))
            .collect(),
        cpu_seconds: report.cpu_seconds,
        peak_rss_bytes: report.peak_rss_bytes,
        cores: report.cores,
        tls_problems: report
            .tls_problems
            .iter()
            .map(|(problem, n)| (problem.clone(), *n))
            .collect(),
        steady: report
            .steady
            .as_ref()
            .map(|steady| metrics_to_proto(steady, &SliceTotals::default(), encoding)),
        hand_over: report.hand_over.map(|span| v1::HandOver {
            hand_overs: span.hand_overs,
            exchanges: span.exchanges,
            first_sent_unix_us: span.first_sent_unix_us,
            last_sent_unix_us: span.last_sent_unix_us,
            delay_us: span.delay_us,
        }),
        ..Default::default()
    };
    timeline_to_report(&report.timeline, &mut message);
    if !report.is_final && report.seq % TIMELINE_EVERY_REPORTS != 1 {
        // The buckets are cumulative and the coordinator needs them only at the end (a lost
        // worker's from its last report that has them): most reports leave them out, which
        // spares the coordinator decoding thousands of buckets per report. Its edges (load
        // reached, last sent) always travel.
        message.timeline_completions = Vec::new();
        message.timeline_output_tokens = Vec::new();
    }
    message
}

/// One set of metrics in the protocol's form, its histograms in `encoding`; `totals` fill
/// the counters' slice totals (the main metrics'; unset for the steady ones).
fn metrics_to_proto(
    metrics: &RunMetrics,
    totals: &SliceTotals,
    encoding: HistogramEncoding,
) -> v1::Metrics {
    let (histograms, connection_histograms) = metrics.encode_all(encoding);
    v1::Metrics {
        histograms,
        counters: Some(counters_to_proto(&metrics.counters, totals)),
        window_start_unix_us: metrics.window.map(|w| w.start_unix_us).unwrap_or(0),
        window_end_unix_us: metrics.window.map(|w| w.end_unix_us).unwrap_or(0),
        connection_histograms,
        failure_histograms: metrics.encode_failure(encoding),
        errors: metrics
            .errors
            .samples()
            .into_iter()
            .map(|s| v1::ErrorSample {
                kind: s.kind.name().to_owned(),
                status: s.status.map(u32::from),
                message: s.message.clone(),
                count: s.count,
            })
            .collect(),
    }
}

/// The counters message: a worker's counters and its slice totals.
fn counters_to_proto(c: &Counters, totals: &SliceTotals) -> v1::Counters {
    v1::Counters {
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
        transport_closed_after_head: c.transport.closed_after_head,
        transport_http2_only: c.transport.http2_only,
        coalesce_checked: c.coalesce_checked,
        coalesced: c.coalesced,
        connections_http1: c.connections.http1,
        connections_http1_tls12: c.connections.http1_tls12,
        connections_http1_tls13: c.connections.http1_tls13,
        connections_http1_tls: c.connections.http1_tls,
        connections_h2_tls12: c.connections.h2_tls12,
        connections_h2_tls13: c.connections.h2_tls13,
        connections_h2_tls: c.connections.h2_tls,
        connections_h2c: c.connections.h2c,
        requests_http1: c.requests_by_protocol.http1,
        requests_h2: c.requests_by_protocol.h2,
        requests_h2c: c.requests_by_protocol.h2c,
        resent: c.resent,
        unstreamed: c.unstreamed,
        cache_reported: c.cache_reported,
        cached_input_tokens: c.cached_input_tokens,
        cache_reported_input_tokens: c.cache_reported_input_tokens,
        sent_out_of_order: totals.sent_out_of_order,
        pinned: c.pinned,
        pinned_matched: c.pinned_matched,
        good: c.good,
        good_output_tokens: c.good_output_tokens,
        tokenized: c.tokenized,
        server_stated: c.server_stated,
        input_server: c.input_server,
        input_usage: c.input_usage,
        input_tokenized: c.input_tokenized,
        input_estimated: c.input_estimated,
        cancelled_as_recorded: c.cancelled_as_recorded,
        cancelled_by_rate: c.cancelled_by_rate,
        pinned_frames: c.pinned_frames,
    }
}

/// A counters message as the worker's counters and its slice totals.
fn counters_from_proto(c: &v1::Counters) -> (Counters, SliceTotals) {
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
            closed_after_head: c.transport_closed_after_head,
            http2_only: c.transport_http2_only,
        },
        coalesce_checked: c.coalesce_checked,
        coalesced: c.coalesced,
        connections: ConnectionCounts {
            http1: c.connections_http1,
            http1_tls12: c.connections_http1_tls12,
            http1_tls13: c.connections_http1_tls13,
            http1_tls: c.connections_http1_tls,
            h2_tls12: c.connections_h2_tls12,
            h2_tls13: c.connections_h2_tls13,
            h2_tls: c.connections_h2_tls,
            h2c: c.connections_h2c,
        },
        requests_by_protocol: RequestProtocols {
            http1: c.requests_http1,
            h2: c.requests_h2,
            h2c: c.requests_h2c,
        },
        resent: c.resent,
        unstreamed: c.unstreamed,
        cache_reported: c.cache_reported,
        cached_input_tokens: c.cached_input_tokens,
        cache_reported_input_tokens: c.cache_reported_input_tokens,
        pinned: c.pinned,
        pinned_matched: c.pinned_matched,
        good: c.good,
        good_output_tokens: c.good_output_tokens,
        tokenized: c.tokenized,
        server_stated: c.server_stated,
        input_server: c.input_server,
        input_usage: c.input_usage,
        input_tokenized: c.input_tokenized,
        input_estimated: c.input_estimated,
        cancelled_as_recorded: c.cancelled_as_recorded,
        cancelled_by_rate: c.cancelled_by_rate,
        pinned_frames: c.pinned_frames,
    };
    let totals = SliceTotals {
        issued: c.issued,
        not_started: c.not_started,
        lost: c.lost,
        sent_out_of_order: c.sent_out_of_order,
    };
    (counters, totals)
}

/// Every this many reports (the first, the 11th, ...), and in the final one, a report
/// carries the worker's whole timeline; the others carry only its edges, and the coordinator
/// keeps the buckets it has (a cumulative timeline never loses buckets, so empty buckets after
/// non-empty ones mean "left out").
pub const TIMELINE_EVERY_REPORTS: u64 = 10;

/// Why a report from a worker cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReportDecodeError {
    #[error(transparent)]
    Metrics(#[from] MetricsDecodeError),
    #[error("timeline: {0}")]
    Timeline(#[from] TimelineError),
    #[error("errors: {0}")]
    Errors(String),
    /// The steady window's metrics (`Report.steady`) do not decode.
    #[error("steady metrics: {0}")]
    Steady(#[source] Box<ReportDecodeError>),
}

/// Decode a report message into the coordinator's domain form.
pub fn report_from_proto(report: &v1::Report) -> Result<ReceivedReport, ReportDecodeError> {
    let (mut metrics, totals, status_codes) = metrics_from_report(report)?;
    metrics.decode_failure(&report.failure_histograms)?;
    metrics.errors = errors_from_report(report).map_err(ReportDecodeError::Errors)?;
    let timeline = timeline_from_report(report)?;
    let steady = report
        .steady
        .as_ref()
        .map(steady_from_proto)
        .transpose()
        .map_err(|error| ReportDecodeError::Steady(Box::new(error)))?;
    Ok(ReceivedReport {
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
        steady,
        hand_over: report
            .hand_over
            .as_ref()
            .map(|span| common::worker_report::HandOverSpan {
                hand_overs: span.hand_overs,
                exchanges: span.exchanges,
                first_sent_unix_us: span.first_sent_unix_us,
                last_sent_unix_us: span.last_sent_unix_us.max(span.first_sent_unix_us),
                delay_us: span.delay_us,
            }),
    })
}

/// The steady window's metrics of a report, decoded and checked as the main ones are (its
/// slice totals, unset on the wire, are ignored).
fn steady_from_proto(steady: &v1::Metrics) -> Result<SparseMetrics, ReportDecodeError> {
    let (counters, _) = counters_from_proto(&steady.counters.unwrap_or_default());
    let window = (steady.window_end_unix_us > 0).then_some(Window {
        start_unix_us: steady.window_start_unix_us,
        end_unix_us: steady.window_end_unix_us,
    });
    let mut metrics = SparseMetrics::decode_with_connections(
        &steady.histograms,
        &steady.connection_histograms,
        counters,
        window,
    )?;
    metrics.decode_failure(&steady.failure_histograms)?;
    metrics.errors = errors_from_proto(&steady.errors).map_err(ReportDecodeError::Errors)?;
    Ok(metrics)
}

/// Decode a report message into metrics (sparse histograms), slice totals and status codes.
pub fn metrics_from_report(
    report: &v1::Report,
) -> Result<
    (
        SparseMetrics,
        SliceTotals,
        std::collections::BTreeMap<u16, u64>,
    ),
    MetricsDecodeError,
> {
    let (counters, totals) = counters_from_proto(&report.counters.unwrap_or_default());
    let window = (report.window_end_unix_us > 0).then_some(Window {
        start_unix_us: report.window_start_unix_us,
        end_unix_us: report.window_end_unix_us,
    });
    let metrics = SparseMetrics::decode_with_connections(
        &report.histograms,
        &report.connection_histograms,
        counters,
        window,
    )?;
    let codes = report
        .status_codes
        .iter()
        .filter_map(|(code, n)| u16::try_from(*code).ok().map(|code| (code, *n)))
        .collect();
    Ok((metrics, totals, codes))
}

/// The error summary of a report, checked: known kinds, statuses that fit HTTP's, at most
/// `MAX_ERROR_SAMPLES` entries, each message cleaned again (a peer's text reaches a user).
pub fn errors_from_report(report: &v1::Report) -> Result<ErrorSummary, String> {
    errors_from_proto(&report.errors)
}

/// [`errors_from_report`] of a list of samples (a report's, or its steady metrics').
fn errors_from_proto(errors: &[v1::ErrorSample]) -> Result<ErrorSummary, String> {
    if errors.len() > common::metrics::MAX_ERROR_SAMPLES {
        return Err(format!("{} error samples", errors.len()));
    }
    let samples = errors
        .iter()
        .map(|s| {
            let kind = FailureKind::from_name(&s.kind)
                .ok_or_else(|| format!("unknown failure kind {:?}", s.kind))?;
            let status = s
                .status
                .map(|code| u16::try_from(code).map_err(|_| format!("status {code}")))
                .transpose()?;
            Ok(ErrorSample {
                kind,
                status,
                message: s.message.clone(),
                count: s.count,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    ErrorSummary::from_samples(samples)
}

/// Put a worker's timeline (steady-state window) into its report.
pub fn timeline_to_report(timeline: &CompletionTimeline, report: &mut v1::Report) {
    report.timeline_origin_unix_us = timeline.origin_unix_us;
    report.timeline_bucket_us = timeline.bucket_us;
    report.timeline_completions = timeline.completions.clone();
    report.timeline_output_tokens = timeline.output_tokens.clone();
    report.target_reached_unix_us = timeline.target_reached_unix_us.unwrap_or(0);
    report.last_issued_unix_us = timeline.last_issued_unix_us.unwrap_or(0);
}

/// A worker's timeline from its report, checked (lengths, width) before use.
pub fn timeline_from_report(report: &v1::Report) -> Result<CompletionTimeline, TimelineError> {
    let timeline = CompletionTimeline {
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
        message: record.message,
        good: record.good,
        output_source: o.output_source().name().to_owned(),
        input_source: o
            .input_source
            .map(|source| source.name().to_owned())
            .unwrap_or_default(),
    }
}

/// A token source's name as [`TokenSource::name`] writes it.
fn token_source(name: &str) -> Option<TokenSource> {
    [
        TokenSource::Usage,
        TokenSource::Server,
        TokenSource::Tokenizer,
        TokenSource::Frames,
        TokenSource::Estimate,
    ]
    .into_iter()
    .find(|source| source.name() == name)
}

/// A per-request record from the wire; an unknown outcome name is `None`.
pub fn record_from_proto(record: &v1::RequestRecord) -> Option<RequestRecord> {
    let kind = match record.outcome.as_str() {
        "succeeded" => OutcomeKind::Succeeded,
        "ended_early" => OutcomeKind::EndedEarly,
        "cancelled_as_recorded" => OutcomeKind::Cancelled(CancelCause::AsRecorded),
        "cancelled_by_rate" => OutcomeKind::Cancelled(CancelCause::ByRate),
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
    if !record.usage_reported {
        match token_source(&record.output_source) {
            Some(TokenSource::Tokenizer) => {
                outcome.tokenized_output_tokens = Some(record.output_tokens)
            }
            Some(TokenSource::Server) => outcome.server_output_tokens = Some(record.output_tokens),
            _ => {}
        }
    }
    outcome.input_tokens = record.input_tokens;
    outcome.input_source = record
        .input_tokens
        .and_then(|_| token_source(&record.input_source));
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
        // Cleaned again where it arrives: a peer's text is shown to people.
        message: record
            .message
            .as_deref()
            .map(common::metrics::clean_message)
            .filter(|m| !m.is_empty()),
        good: record.good,
    })
}

/// Why an assignment from the wire cannot be used; each names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AssignmentError {
    #[error("assignment without a load model")]
    MissingLoad,
    #[error("assignment without {field}")]
    Missing { field: &'static str },
    #[error("assignment {field} = {seconds}: expected a positive number of seconds")]
    Seconds { field: &'static str, seconds: f64 },
    #[error("assignment pin_output_length = {name:?}: expected \"max\" or \"strict\"")]
    PinMode { name: String },
    /// One of the assignment's `slos` is not an objective the worker can judge.
    #[error("assignment slos = {text:?}: {reason}")]
    Slo { text: String, reason: String },
    /// A tokenizer file's bytes do not inflate to a JSON document.
    #[error("assignment {field} ({name:?}): {source}")]
    Tokenizer {
        field: &'static str,
        name: String,
        #[source]
        source: common::assignment::TokenizerBytesError,
    },
    /// `cancel_rate` is not a percentage.
    #[error("assignment cancel_rate = {rate}: expected a percentage from 0 to 100")]
    CancelRate { rate: f64 },
    /// A `load.schedule` or `load.arrival` this worker does not know (an unset one is the
    /// default, as an older coordinator meant it).
    #[error("assignment {field} = {name:?}: expected {expected}")]
    UnknownName {
        field: &'static str,
        name: String,
        expected: &'static str,
    },
}

impl AssignmentError {
    /// The field of `v1::Assignment` at fault.
    pub fn field(&self) -> &'static str {
        match self {
            AssignmentError::MissingLoad => "load",
            AssignmentError::Missing { field } | AssignmentError::Seconds { field, .. } => field,
            AssignmentError::PinMode { .. } => "pin_output_length",
            AssignmentError::Slo { .. } => "slos",
            AssignmentError::Tokenizer { field, .. } => field,
            AssignmentError::CancelRate { .. } => "cancel_rate",
            AssignmentError::UnknownName { field, .. } => field,
        }
    }
}

/// The longest duration a peer may ask for: ten years.
const MAX_WIRE_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// A duration from the wire: positive, finite and at most ten years, or an error naming the
/// field (never a panic).
fn wire_seconds(field: &'static str, seconds: f64) -> Result<Duration, AssignmentError> {
    if seconds.is_finite() && seconds > 0.0 && seconds <= MAX_WIRE_SECONDS {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(AssignmentError::Seconds { field, seconds })
    }
}

/// The protocol's form of a worker's assignment (the coordinator's side of the link).
pub fn assignment_to_proto(assignment: &Assignment) -> v1::Assignment {
    let load = &assignment.load;
    v1::Assignment {
        run_id: assignment.run_id.clone(),
        target: assignment.target.clone(),
        load: Some(v1::LoadModel {
            schedule: load.schedule.name().to_owned(),
            speed: load.schedule.speed(),
            // 0 is "unset" on the wire.
            concurrency: load
                .concurrency
                .map(|c| u32::try_from(c).unwrap_or(u32::MAX))
                .unwrap_or(0),
            rate: load.rate.unwrap_or(0.0),
            arrival: load.arrival.name().to_owned(),
            duration_s: load.duration.map(|d| d.as_secs_f64()),
            warmup: load.warmup,
            seed: load.seed,
        }),
        headers: assignment
            .headers
            .iter()
            .map(|(name, value)| v1::Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        sets: assignment
            .sets
            .iter()
            .map(|(field, value)| v1::SetField {
                field: field.clone(),
                value: value.clone(),
            })
            .collect(),
        exchange_count: if assignment.open_ended { 0 } else { 1 },
        timeout_s: Some(assignment.options.timeout.as_secs_f64()),
        tag_requests: assignment.tag_requests,
        worker_index: assignment.worker_index,
        target_ca_pem: assignment.transport.ca_pem.clone(),
        insecure: assignment.transport.insecure,
        h2c: assignment.transport.h2c,
        aws_sigv4_region: assignment
            .transport
            .aws_sigv4_region
            .clone()
            .unwrap_or_default(),
        requests_out: assignment.options.requests_out,
        reorder_window: u32::try_from(assignment.options.reorder_window).unwrap_or(u32::MAX),
        slice_key: assignment.slice_key.clone(),
        pin_output_length: assignment
            .options
            .faithful
            .pin
            .map(|mode| mode.name().to_owned())
            .unwrap_or_default(),
        closed_sessions: assignment.options.faithful.closed_sessions,
        report_interval_s: assignment.report_interval.map(|d| d.as_secs_f64()),
        plain_histograms: assignment.histograms == HistogramEncoding::Plain,
        heartbeat_timeout_s: assignment.heartbeat_timeout.map(|d| d.as_secs_f64()),
        slos: assignment.options.slos.names(),
        steady_metrics: assignment.options.steady_metrics,
        tokenizer_json: assignment
            .options
            .tokenizer
            .as_ref()
            .map(|t| t.deflated().0.to_vec())
            .unwrap_or_default(),
        tokenizer_config_json: assignment
            .options
            .tokenizer
            .as_ref()
            .and_then(|t| t.deflated().1)
            .map(<[u8]>::to_vec),
        tokenizer_name: assignment
            .options
            .tokenizer
            .as_ref()
            .map(|t| t.name.clone())
            .unwrap_or_default(),
        cancel_rate: assignment.options.cancel.rate_pct,
        cancel_seed: assignment.options.cancel.seed,
        request_usage: assignment.options.request_usage,
        cancel_after_s: (assignment.options.cancel.after > Duration::ZERO)
            .then_some(assignment.options.cancel.after.as_secs_f64()),
    }
}

/// The tokenizer files of an assignment from the wire: inflated, bounded, checked as JSON.
fn tokenizer_from_proto(
    assignment: &v1::Assignment,
) -> Result<Option<TokenizerFiles>, AssignmentError> {
    if assignment.tokenizer_json.is_empty() {
        return Ok(None);
    }
    let name = assignment.tokenizer_name.clone();
    let inflate = |field: &'static str, bytes: &[u8]| {
        TokenizerFiles::inflate_json(bytes).map_err(|source| AssignmentError::Tokenizer {
            field,
            name: name.clone(),
            source,
        })
    };
    let tokenizer_json = inflate("tokenizer_json", &assignment.tokenizer_json)?;
    let config_json = match &assignment.tokenizer_config_json {
        None => None,
        Some(bytes) => Some(inflate("tokenizer_config_json", bytes)?),
    };
    Ok(Some(TokenizerFiles::new(name, tokenizer_json, config_json)))
}

/// `--cancel-rate` and `--cancel-after` from the wire.
fn cancel_from_proto(assignment: &v1::Assignment) -> Result<CancelOptions, AssignmentError> {
    let rate = assignment.cancel_rate;
    if !(0.0..=100.0).contains(&rate) {
        return Err(AssignmentError::CancelRate { rate });
    }
    let after = match assignment.cancel_after_s {
        None => Duration::ZERO,
        Some(0.0) => Duration::ZERO,
        Some(s) => wire_seconds("cancel_after_s", s)?,
    };
    Ok(CancelOptions {
        rate_pct: rate,
        after,
        seed: assignment.cancel_seed,
    })
}

/// A worker's assignment from the wire, every field checked: a load model must be there,
/// durations must be positive, finite and at most ten years, the pin mode one the worker
/// knows. Unset numbers (0 on the wire) are `None` or the default.
pub fn assignment_from_proto(assignment: &v1::Assignment) -> Result<Assignment, AssignmentError> {
    let load = assignment
        .load
        .as_ref()
        .ok_or(AssignmentError::MissingLoad)?;
    let load = LoadModel {
        schedule: match load.schedule.as_str() {
            "recorded" => Schedule::Recorded {
                speed: if load.speed > 0.0 { load.speed } else { 1.0 },
            },
            "asap" | "" => Schedule::Asap,
            name => {
                return Err(AssignmentError::UnknownName {
                    field: "load.schedule",
                    name: name.to_owned(),
                    expected: "\"recorded\" or \"asap\"",
                });
            }
        },
        concurrency: (load.concurrency > 0).then_some(load.concurrency as usize),
        rate: (load.rate > 0.0).then_some(load.rate),
        arrival: match load.arrival.as_str() {
            "poisson" => Arrival::Poisson,
            "constant" | "" => Arrival::Constant,
            name => {
                return Err(AssignmentError::UnknownName {
                    field: "load.arrival",
                    name: name.to_owned(),
                    expected: "\"constant\" or \"poisson\"",
                });
            }
        },
        duration: match load.duration_s {
            None => None,
            Some(s) => Some(wire_seconds("load.duration_s", s)?),
        },
        warmup: load.warmup,
        seed: load.seed,
    };
    let timeout = wire_seconds(
        "timeout_s",
        assignment
            .timeout_s
            .ok_or(AssignmentError::Missing { field: "timeout_s" })?,
    )?;
    let pin = match assignment.pin_output_length.as_str() {
        "" => None,
        name => Some(
            PinMode::from_name(name).ok_or_else(|| AssignmentError::PinMode {
                name: name.to_owned(),
            })?,
        ),
    };
    let slos = assignment
        .slos
        .iter()
        .map(|text| {
            Slo::parse(text).map_err(|reason| AssignmentError::Slo {
                text: text.clone(),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Assignment {
        run_id: assignment.run_id.clone(),
        target: assignment.target.clone(),
        load,
        headers: assignment
            .headers
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
        sets: assignment
            .sets
            .iter()
            .map(|s| (s.field.clone(), s.value.clone()))
            .collect(),
        open_ended: assignment.exchange_count == 0,
        options: RequestOptions {
            timeout,
            requests_out: assignment.requests_out,
            reorder_window: match assignment.reorder_window {
                0 => common::replay::DEFAULT_REORDER_WINDOW,
                n => n as usize,
            },
            faithful: Faithful {
                pin,
                closed_sessions: assignment.closed_sessions,
            },
            slos: Slos(slos),
            steady_metrics: assignment.steady_metrics,
            tokenizer: tokenizer_from_proto(assignment)?,
            cancel: cancel_from_proto(assignment)?,
            request_usage: assignment.request_usage,
        },
        tag_requests: assignment.tag_requests,
        worker_index: assignment.worker_index,
        transport: TargetTransport {
            ca_pem: assignment.target_ca_pem.clone(),
            insecure: assignment.insecure,
            h2c: assignment.h2c,
            aws_sigv4_region: (!assignment.aws_sigv4_region.is_empty())
                .then(|| assignment.aws_sigv4_region.clone()),
        },
        slice_key: assignment.slice_key.clone(),
        report_interval: match assignment.report_interval_s {
            None => None,
            Some(s) if s > MAX_REPORT_INTERVAL_S => {
                return Err(AssignmentError::Seconds {
                    field: "report_interval_s",
                    seconds: s,
                });
            }
            Some(s) => Some(wire_seconds("report_interval_s", s)?),
        },
        histograms: if assignment.plain_histograms {
            HistogramEncoding::Plain
        } else {
            HistogramEncoding::Deflate
        },
        heartbeat_timeout: match assignment.heartbeat_timeout_s {
            None => None,
            Some(s) if s > MAX_HEARTBEAT_TIMEOUT_S => {
                return Err(AssignmentError::Seconds {
                    field: "heartbeat_timeout_s",
                    seconds: s,
                });
            }
            Some(s) => Some(wire_seconds("heartbeat_timeout_s", s)?),
        },
    })
}

/// The longest report interval a coordinator may ask for: a worker heard from less often
/// than this is not supervised.
const MAX_REPORT_INTERVAL_S: f64 = 60.0;

/// The longest heartbeat timeout a coordinator may give its workers: a day, as
/// `--heartbeat-timeout` allows on either side.
const MAX_HEARTBEAT_TIMEOUT_S: f64 = 86_400.0;

#[cfg(test)]
mod tests {
    use super::*;
    use common::metrics::{Metric, RunMetrics};

    fn assignment() -> Assignment {
        Assignment {
            run_id: "run-1".into(),
            target: "https://example.test/base".into(),
            load: LoadModel {
                schedule: Schedule::Recorded { speed: 2.5 },
                concurrency: Some(8),
                rate: None,
                arrival: Arrival::Poisson,
                duration: Some(Duration::from_millis(1500)),
                warmup: 3,
                seed: 42,
            },
            headers: vec![("authorization".into(), "Bearer ${TOKEN}".into())],
            sets: vec![("temperature".into(), "0".into())],
            open_ended: false,
            options: RequestOptions {
                timeout: Duration::from_secs(30),
                requests_out: true,
                reorder_window: 17,
                faithful: Faithful {
                    pin: Some(PinMode::Strict),
                    closed_sessions: true,
                },
                slos: Slos(
                    [
                        "ttft:500ms",
                        "itl:40ms",
                        "latency:1500us",
                        "tokens-per-second:20.5",
                    ]
                    .map(|text| Slo::parse(text).expect("a valid slo"))
                    .to_vec(),
                ),
                steady_metrics: true,
                tokenizer: Some(TokenizerFiles::new(
                    "tokenizer.json".into(),
                    br#"{"model":{"type":"WordLevel"}}"#.to_vec(),
                    Some(br#"{"chat_template":"x"}"#.to_vec()),
                )),
                cancel: CancelOptions {
                    rate_pct: 12.5,
                    after: Duration::from_millis(250),
                    seed: 99,
                },
                request_usage: true,
            },
            tag_requests: true,
            worker_index: 2,
            transport: TargetTransport {
                ca_pem: vec!["-----BEGIN CERTIFICATE-----".into()],
                insecure: false,
                h2c: true,
                aws_sigv4_region: Some("us-east-1".into()),
            },
            slice_key: "key".into(),
            report_interval: Some(Duration::from_millis(1500)),
            histograms: HistogramEncoding::Plain,
            heartbeat_timeout: Some(Duration::from_secs(7)),
        }
    }

    #[test]
    fn an_assignment_survives_the_wire() {
        let domain = assignment();
        let back = assignment_from_proto(&assignment_to_proto(&domain)).expect("valid");
        assert_eq!(back, domain);
        // An older coordinator does not set the field: its workers keep compressing.
        let mut older = assignment_to_proto(&domain);
        older.plain_histograms = false;
        assert_eq!(
            assignment_from_proto(&older).expect("valid").histograms,
            HistogramEncoding::Deflate
        );

        let asap = Assignment {
            load: LoadModel {
                schedule: Schedule::Asap,
                concurrency: None,
                rate: Some(3.5),
                arrival: Arrival::Constant,
                duration: None,
                ..domain.load.clone()
            },
            open_ended: true,
            transport: TargetTransport::default(),
            options: RequestOptions {
                faithful: Faithful::default(),
                // Without objectives or steady metrics (the fields unset on the wire).
                slos: Slos::default(),
                steady_metrics: false,
                // No tokenizer, no cancellations: the fields unset on the wire.
                tokenizer: None,
                cancel: CancelOptions::default(),
                ..domain.options.clone()
            },
            report_interval: None,
            // An older coordinator: the worker keeps its own heartbeat timeout.
            heartbeat_timeout: None,
            ..domain
        };
        assert_eq!(
            assignment_from_proto(&assignment_to_proto(&asap)).expect("valid"),
            asap
        );
    }

    #[test]
    fn a_large_tokenizer_travels_compressed_and_whole() {
        // A 20 MB tokenizer.json-like document (real ones are 2-11 MB).
        let mut json = String::from("{\"model\":{\"vocab\":{");
        let mut i = 0u64;
        while json.len() < 20 << 20 {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&format!("\"tok{i:x}\u{0120}ab\":{i}"));
            i += 1;
        }
        json.push_str("}}}");
        let mut domain = assignment();
        domain.options.tokenizer = Some(TokenizerFiles::new(
            "big.json".into(),
            json.into_bytes(),
            None,
        ));
        let wire = assignment_to_proto(&domain);
        let encoded = prost::Message::encoded_len(&wire);
        assert!(encoded < 16 << 20, "deflated to {encoded} bytes");
        assert_eq!(assignment_from_proto(&wire).expect("valid"), domain);
    }

    #[test]
    fn an_unknown_schedule_or_arrival_is_an_error_not_a_default() {
        let mut wire = assignment_to_proto(&assignment());
        wire.load.as_mut().expect("load").schedule = "fastest".into();
        let error = assignment_from_proto(&wire).expect_err("an unknown schedule");
        assert_eq!(error.field(), "load.schedule");
        let mut wire = assignment_to_proto(&assignment());
        wire.load.as_mut().expect("load").arrival = "bursty".into();
        let error = assignment_from_proto(&wire).expect_err("an unknown arrival");
        assert_eq!(error.field(), "load.arrival");
        // Unset names are the defaults, as an older coordinator meant them.
        let mut wire = assignment_to_proto(&assignment());
        let load = wire.load.as_mut().expect("load");
        load.schedule.clear();
        load.arrival.clear();
        let domain = assignment_from_proto(&wire).expect("valid");
        assert_eq!(domain.load.schedule, Schedule::Asap);
        assert_eq!(domain.load.arrival, Arrival::Constant);
    }

    #[test]
    fn unset_numbers_on_the_wire_are_defaults() {
        let mut wire = assignment_to_proto(&assignment());
        let load = wire.load.as_mut().expect("load");
        load.speed = 0.0;
        load.concurrency = 0;
        load.rate = 0.0;
        wire.reorder_window = 0;
        wire.aws_sigv4_region.clear();
        let domain = assignment_from_proto(&wire).expect("valid");
        assert_eq!(domain.load.schedule, Schedule::Recorded { speed: 1.0 });
        assert_eq!(domain.load.concurrency, None);
        assert_eq!(domain.load.rate, None);
        assert_eq!(
            domain.options.reorder_window,
            common::replay::DEFAULT_REORDER_WINDOW
        );
        assert_eq!(domain.transport.aws_sigv4_region, None);
    }

    #[test]
    fn a_bad_assignment_names_its_field() {
        let valid = assignment_to_proto(&assignment());

        let mut wire = valid.clone();
        wire.load = None;
        let error = assignment_from_proto(&wire).expect_err("no load");
        assert_eq!(error, AssignmentError::MissingLoad);
        assert_eq!(error.to_string(), "assignment without a load model");

        let mut wire = valid.clone();
        wire.timeout_s = None;
        let error = assignment_from_proto(&wire).expect_err("no timeout");
        assert_eq!(error.field(), "timeout_s");
        assert_eq!(error.to_string(), "assignment without timeout_s");

        for seconds in [0.0, -1.0, f64::NAN, f64::INFINITY, 11.0 * 365.0 * 86_400.0] {
            let mut wire = valid.clone();
            wire.timeout_s = Some(seconds);
            let error = assignment_from_proto(&wire).expect_err("bad timeout");
            assert_eq!(error.field(), "timeout_s", "{seconds}");
            assert!(
                error
                    .to_string()
                    .ends_with("expected a positive number of seconds"),
                "{error}"
            );

            let mut wire = valid.clone();
            wire.load.as_mut().expect("load").duration_s = Some(seconds);
            let error = assignment_from_proto(&wire).expect_err("bad duration");
            assert_eq!(error.field(), "load.duration_s", "{seconds}");
        }

        for seconds in [0.0, -1.0, f64::NAN, 61.0] {
            let mut wire = valid.clone();
            wire.report_interval_s = Some(seconds);
            let error = assignment_from_proto(&wire).expect_err("a bad report interval");
            assert_eq!(error.field(), "report_interval_s", "{seconds}");
        }

        for seconds in [0.0, -1.0, f64::NAN, 86_401.0] {
            let mut wire = valid.clone();
            wire.heartbeat_timeout_s = Some(seconds);
            let error = assignment_from_proto(&wire).expect_err("a bad heartbeat timeout");
            assert_eq!(error.field(), "heartbeat_timeout_s", "{seconds}");
        }

        let mut wire = valid.clone();
        wire.slos.push("tpot:5ms".into());
        let error = assignment_from_proto(&wire).expect_err("an unknown objective");
        assert_eq!(error.field(), "slos");
        assert!(
            error
                .to_string()
                .starts_with("assignment slos = \"tpot:5ms\": "),
            "{error}"
        );
        assert!(error.to_string().contains("unknown name"), "{error}");

        let mut wire = valid.clone();
        wire.tokenizer_json = b"not deflate at all".to_vec();
        let error = assignment_from_proto(&wire).expect_err("a bad tokenizer payload");
        assert_eq!(error.field(), "tokenizer_json");
        assert!(
            error
                .to_string()
                .starts_with("assignment tokenizer_json (\"tokenizer.json\"): "),
            "{error}"
        );

        let mut wire = valid.clone();
        wire.tokenizer_json = TokenizerFiles::deflate(b"{\"model\": [");
        let error = assignment_from_proto(&wire).expect_err("a tokenizer that is not JSON");
        assert_eq!(error.field(), "tokenizer_json");
        assert!(error.to_string().contains("not JSON"), "{error}");

        let mut wire = valid.clone();
        wire.tokenizer_config_json = Some(b"\x00\x01garbage".to_vec());
        let error = assignment_from_proto(&wire).expect_err("a bad tokenizer config");
        assert_eq!(error.field(), "tokenizer_config_json");

        for rate in [-1.0, 100.5, f64::NAN] {
            let mut wire = valid.clone();
            wire.cancel_rate = rate;
            let error = assignment_from_proto(&wire).expect_err("a bad cancel rate");
            assert_eq!(error.field(), "cancel_rate", "{rate}");
        }
        for seconds in [-1.0, f64::NAN, f64::INFINITY] {
            let mut wire = valid.clone();
            wire.cancel_after_s = Some(seconds);
            let error = assignment_from_proto(&wire).expect_err("a bad cancel delay");
            assert_eq!(error.field(), "cancel_after_s", "{seconds}");
        }

        let mut wire = valid;
        wire.pin_output_length = "loose".into();
        let error = assignment_from_proto(&wire).expect_err("unknown pin mode");
        assert_eq!(error.field(), "pin_output_length");
        assert_eq!(
            error.to_string(),
            "assignment pin_output_length = \"loose\": expected \"max\" or \"strict\""
        );
    }

    #[test]
    fn most_reports_leave_the_timeline_buckets_out_and_keep_its_edges() {
        let mut timeline = CompletionTimeline::default();
        timeline.record(1_000_000, 10);
        timeline.last_issued_unix_us = Some(999_000);
        let report = |seq, is_final| WorkerReport {
            seq,
            is_final,
            timeline: timeline.clone(),
            ..WorkerReport::default()
        };
        for (seq, is_final, buckets) in
            [(1, false, 1), (2, false, 0), (11, false, 1), (12, true, 1)]
        {
            let back = report_from_proto(&report_to_proto(&report(seq, is_final))).expect("valid");
            assert_eq!(back.timeline.completions.len(), buckets, "report {seq}");
            assert_eq!(back.timeline.last_issued_unix_us, Some(999_000));
        }
    }

    #[test]
    fn a_report_survives_the_wire() {
        let mut metrics = RunMetrics::default();
        for (i, metric) in Metric::every().enumerate() {
            for value in [0, 1, 999, 2_049, 1_000_000 + i as u64, 7 << 40] {
                metrics.record_value(metric, value);
            }
        }
        metrics.record_error(FailureKind::Status, Some(503), Some("upstream died"));
        metrics.record_error(FailureKind::Transport, None, None);
        metrics.counters.succeeded = 5;
        metrics.counters.failed_transport = 1;
        metrics.counters.transport.refused = 1;
        // Streams delivered in one piece, connections by protocol (issue 19 items 9, 10).
        metrics.counters.coalesce_checked = 4;
        metrics.counters.coalesced = 3;
        metrics.counters.connections.http1_tls12 = 2;
        metrics.counters.connections.h2_tls13 = 1;
        metrics.counters.connections.h2c = 3;
        // Goodput (issue 21).
        metrics.counters.good = 4;
        metrics.counters.good_output_tokens = 40;
        // The steady window's metrics: a part of the main ones, with their own errors.
        let mut steady = RunMetrics::default();
        for value in [5, 1_500, 90_000] {
            steady.record_value(Metric::Ttft, value);
            steady.record_value(Metric::ErrorLatency, value * 2);
        }
        steady.record_error(FailureKind::Status, Some(503), Some("upstream died"));
        steady.counters.succeeded = 3;
        steady.counters.good = 2;
        steady.counters.good_output_tokens = 20;
        steady.counters.output_tokens = 30;
        steady.window = Some(Window {
            start_unix_us: 1_000,
            end_unix_us: 9_000,
        });
        let report = WorkerReport {
            seq: 7,
            is_final: true,
            metrics,
            totals: SliceTotals {
                issued: 6,
                not_started: 2,
                lost: 0,
                sent_out_of_order: 1,
            },
            status_codes: [(503, 2)].into_iter().collect(),
            tls_problems: [("unknown issuer".to_owned(), 1)].into_iter().collect(),
            cpu_seconds: 1.5,
            peak_rss_bytes: 1 << 20,
            cores: 4,
            timeline: CompletionTimeline::default(),
            steady: Some(steady),
            hand_over: Some(common::worker_report::HandOverSpan {
                hand_overs: 1,
                exchanges: 40,
                first_sent_unix_us: 5_000,
                last_sent_unix_us: 8_000,
                delay_us: 2_000_000,
            }),
        };
        // Both encodings: V2+DEFLATE (older coordinators) and plain V2 (this one asks).
        let deflated = report_to_proto(&report);
        let plain = report_to_proto_as(&report, HistogramEncoding::Plain);
        assert_ne!(deflated.histograms, plain.histograms);
        for wire in [deflated, plain] {
            let back = report_from_proto(&wire).expect("decodes");
            assert_eq!(back.seq, 7);
            assert!(back.is_final);
            assert_eq!(back.hand_over, report.hand_over);
            assert_eq!(back.metrics.counters, report.metrics.counters);
            // Every bucket of every histogram, connections too, lands where it was.
            let sent = SparseMetrics::from(&report.metrics);
            for metric in Metric::every() {
                assert_eq!(back.metrics.histogram(metric).len(), 6, "{metric:?}");
                assert_eq!(
                    back.metrics.histogram(metric),
                    sent.histogram(metric),
                    "{metric:?}"
                );
                assert_eq!(back.metrics.stats(metric), report.metrics.stats(metric));
            }
            assert_eq!(back.metrics.errors, report.metrics.errors);
            // The steady metrics travel as the main ones do, every bucket in place.
            let sent_steady = report.steady.as_ref().expect("steady metrics sent");
            let got_steady = back.steady.as_ref().expect("steady metrics decoded");
            assert_eq!(got_steady.counters, sent_steady.counters);
            assert_eq!(got_steady.window, sent_steady.window);
            assert_eq!(got_steady.errors, sent_steady.errors);
            let sparse_steady = SparseMetrics::from(sent_steady);
            for metric in Metric::every() {
                assert_eq!(
                    got_steady.histogram(metric),
                    sparse_steady.histogram(metric),
                    "steady {metric:?}"
                );
            }
            // The dense decoder (baselines, `report`) reads both as well.
            let dense = RunMetrics::decode_with_connections(
                &wire.histograms,
                &wire.connection_histograms,
                report.metrics.counters,
                None,
            )
            .expect("dense decode");
            for metric in Metric::ALL.iter().chain(&Metric::CONNECTION) {
                assert_eq!(dense.histogram(*metric), report.metrics.histogram(*metric));
            }
        }
        let back = report_from_proto(&report_to_proto(&report)).expect("decodes");
        assert_eq!(back.totals, report.totals);
        assert_eq!(back.status_codes, report.status_codes);
        assert_eq!(back.tls_problems, report.tls_problems);
        assert_eq!(
            (back.cpu_seconds, back.peak_rss_bytes, back.cores),
            (1.5, 1 << 20, 4)
        );
    }

    /// A report without failure histograms or errors (an older worker) decodes with none; a
    /// report whose errors name an unknown kind, or hold too many, is refused; a message from
    /// the wire is cleaned again.
    #[test]
    fn error_samples_are_checked_where_they_arrive() {
        let mut wire = report_to_proto(&WorkerReport::default());
        wire.failure_histograms.clear();
        let back = report_from_proto(&wire).expect("an older worker's report");
        assert!(back.metrics.errors.is_empty());
        assert_eq!(back.metrics.histogram(Metric::ErrorLatency).len(), 0);

        let sample = |kind: &str, message: &str| v1::ErrorSample {
            kind: kind.into(),
            status: Some(400),
            message: Some(message.into()),
            count: 1,
        };
        wire.errors = vec![sample("status", "bad\x1b[31m key sk-abcdefghijklmnopqrst")];
        let back = report_from_proto(&wire).expect("valid");
        let samples = back.metrics.errors.samples();
        assert_eq!(
            samples[0].message.as_deref(),
            Some("bad [31m key [redacted]")
        );
        wire.errors = vec![sample("nonsense", "x")];
        assert!(report_from_proto(&wire).is_err());
        wire.errors = (0..300).map(|i| sample("status", &i.to_string())).collect();
        assert!(report_from_proto(&wire).is_err());
    }

    /// A report without steady metrics (a worker not asked for them, or an older one)
    /// decodes with none; steady metrics that do not decode refuse the report, naming them.
    #[test]
    fn steady_metrics_are_optional_and_checked() {
        let wire = report_to_proto(&WorkerReport::default());
        assert!(wire.steady.is_none());
        assert!(
            report_from_proto(&wire)
                .expect("no steady metrics")
                .steady
                .is_none()
        );

        let with_steady = WorkerReport {
            steady: Some(RunMetrics::default()),
            ..WorkerReport::default()
        };
        let mut wire = report_to_proto(&with_steady);
        let steady = wire.steady.as_mut().expect("steady metrics sent");
        assert_eq!(steady.counters.expect("counters").issued, 0);
        steady.histograms.pop();
        let error = report_from_proto(&wire).expect_err("a histogram short");
        assert!(matches!(error, ReportDecodeError::Steady(_)), "{error}");
        assert!(error.to_string().starts_with("steady metrics: "), "{error}");

        let mut wire = report_to_proto(&with_steady);
        wire.steady.as_mut().expect("steady").errors = vec![v1::ErrorSample {
            kind: "nonsense".into(),
            status: None,
            message: None,
            count: 1,
        }];
        assert!(matches!(
            report_from_proto(&wire),
            Err(ReportDecodeError::Steady(_))
        ));
    }

    /// A request record keeps its verdict against the objectives, and its absence.
    #[test]
    fn a_request_record_keeps_whether_it_was_good() {
        let mut outcome = RequestOutcome::failed(FailureKind::Empty);
        outcome.kind = OutcomeKind::Succeeded;
        outcome.ttft_us = Some(1_000);
        outcome.latency_us = Some(5_000);
        outcome.content_frames = 3;
        outcome.sent_unix_us = Some(77);
        for good in [Some(true), Some(false), None] {
            let record = RequestRecord {
                meta: RecordMeta {
                    index: 4,
                    id: Some("ex-4".into()),
                    session: None,
                },
                outcome,
                status: Some(200),
                message: None,
                good,
            };
            let wire = record_to_proto(record.clone());
            assert_eq!(wire.good, good);
            let back = record_from_proto(&wire).expect("a known outcome");
            assert_eq!(back.good, good);
            assert_eq!(back.meta, record.meta);
            assert_eq!(back.outcome.ttft_us, Some(1_000));
        }
    }

    /// A request record keeps its token sources and a cancelled outcome (a record the
    /// coordinator cannot name would be dropped from `--requests-out`).
    #[test]
    fn a_request_record_keeps_its_token_sources_and_cancellations() {
        let mut outcome = RequestOutcome::failed(FailureKind::Empty);
        outcome.kind = OutcomeKind::Succeeded;
        outcome.content_frames = 61;
        outcome.tokenized_output_tokens = Some(66);
        outcome.input_tokens = Some(120);
        outcome.input_source = Some(TokenSource::Tokenizer);
        let record = |outcome| RequestRecord {
            meta: RecordMeta {
                index: 1,
                id: None,
                session: None,
            },
            outcome,
            status: Some(200),
            message: None,
            good: None,
        };
        let back = record_from_proto(&record_to_proto(record(outcome))).expect("known");
        assert_eq!(back.outcome.output_tokens(), 66);
        assert_eq!(back.outcome.output_source(), TokenSource::Tokenizer);
        assert_eq!(back.outcome.input_source, Some(TokenSource::Tokenizer));
        for cause in [CancelCause::AsRecorded, CancelCause::ByRate] {
            let mut cancelled = RequestOutcome::failed(FailureKind::Empty);
            cancelled.kind = OutcomeKind::Cancelled(cause);
            cancelled.ttft_us = Some(9);
            let back = record_from_proto(&record_to_proto(record(cancelled))).expect("known");
            assert_eq!(back.outcome.kind, OutcomeKind::Cancelled(cause));
            assert_eq!(back.outcome.ttft_us, Some(9));
        }
    }
}
