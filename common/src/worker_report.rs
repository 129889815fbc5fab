//! A worker's cumulative report as both ends see it: what the worker's link sends and what
//! the coordinator keeps of each one it receives, with the checks a received report must
//! pass. `proto::convert` turns it into its message and back.

use crate::metrics::{Counters, RunMetrics, SliceTotals, SparseMetrics};
use crate::timeline::CompletionTimeline;

/// A worker's cumulative report: what the worker's link sends (`report_to_proto`, with the
/// worker's dense [`RunMetrics`]) and what the coordinator decodes once when it arrives
/// ([`ReceivedReport`], from `report_from_proto`).
#[derive(Debug, Clone, Default)]
pub struct WorkerReport<M = RunMetrics> {
    pub seq: u64,
    /// The worker's last report: its slice is done.
    pub is_final: bool,
    pub metrics: M,
    pub totals: SliceTotals,
    /// Status codes of failed requests: code → count.
    pub status_codes: std::collections::BTreeMap<u16, u64>,
    /// TLS failures by problem (`unknown issuer` → count).
    pub tls_problems: std::collections::BTreeMap<String, u64>,
    pub cpu_seconds: f64,
    pub peak_rss_bytes: u64,
    pub cores: u32,
    /// Completions over time and the steady window's edges, in the worker's clock.
    pub timeline: CompletionTimeline,
    /// The same metrics over the steady window alone (requests sent once the worker's load
    /// reached its target, the closed loop's first wave left out), when the assignment asked
    /// for them (`RequestOptions::steady_metrics`).
    pub steady: Option<M>,
    /// Exchanges handed over from a lost worker that this worker sent, and when: the
    /// coordinator marks the interval in the run's timeline and names it.
    pub hand_over: Option<HandOverSpan>,
}

/// Exchanges handed over from a lost worker that one worker sent (worker clock, Unix µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HandOverSpan {
    /// Hand-overs that arrived late and were delayed to keep their recorded spacing.
    pub hand_overs: u64,
    /// Handed-over exchanges sent.
    pub exchanges: u64,
    pub first_sent_unix_us: u64,
    pub last_sent_unix_us: u64,
    /// The delay the last one was sent with (µs).
    pub delay_us: u64,
}

/// A report as the coordinator keeps it: its histograms sparse (the non-zero buckets only),
/// since it receives one from every worker every report interval and needs few of them dense.
pub type ReceivedReport = WorkerReport<SparseMetrics>;

impl ReceivedReport {
    /// Requests this report answers for (measured or warm-up), out of those issued.
    pub fn answered(&self) -> u64 {
        self.metrics.counters.completed() + self.metrics.counters.warmup
    }

    /// Every exchange this report accounts for (answered, never started, lost in flight), or
    /// `None` when the counters overflow (a hostile or broken worker).
    pub fn accounted(&self) -> Option<u64> {
        self.totals.accounted(&self.metrics.counters)
    }
}

/// Requests one worker may say it issued in one run: far beyond any real run (a million
/// requests a second for a day is under 2^37), small enough that no sum of workers'
/// counters bounded by it wraps a u64.
pub const MAX_ISSUED_PER_WORKER: u64 = 1 << 40;

/// Output (or input) tokens one request may carry: far beyond any model's context.
pub const MAX_TOKENS_PER_REQUEST: u64 = 1 << 22;

impl ReceivedReport {
    /// Every counter of the report checked against what the worker could have measured:
    /// no sum wraps, no part exceeds its whole, no count exceeds the requests issued, and
    /// token totals stay within [`MAX_TOKENS_PER_REQUEST`] per request, good requests are
    /// succeeded ones and their tokens part of the output tokens. The steady metrics, when
    /// present, pass the same checks of parts against wholes and count none of them past the
    /// main ones (they are a subset of the same requests). A report that fails comes from a
    /// broken or hostile peer. `sent`: the exchanges handed to this worker when its slice does
    /// not loop (what it can have issued at most).
    pub fn check_counters(&self, sent: Option<u64>) -> Result<(), String> {
        let c = &self.metrics.counters;
        let t = &self.totals;
        let accounted = self.accounted().ok_or("its counters overflow")?;
        let issued = t.issued;
        if issued > MAX_ISSUED_PER_WORKER {
            return Err(format!("{issued} requests issued"));
        }
        if let Some(sent) = sent
            && issued > sent
        {
            return Err(format!(
                "{issued} requests issued of {sent} exchanges sent to it"
            ));
        }
        let answered = accounted
            .checked_sub(t.not_started)
            .and_then(|a| a.checked_sub(t.lost))
            .ok_or("its counters overflow")?;
        if answered > issued {
            return Err(format!("{answered} answered of {issued} issued"));
        }
        let parts = [
            ("usage_reported", c.usage_reported),
            ("estimated", c.estimated),
            ("tokenized", c.tokenized),
            ("server_stated", c.server_stated),
            ("input_server", c.input_server),
            ("input_usage", c.input_usage),
            ("input_tokenized", c.input_tokenized),
            ("input_estimated", c.input_estimated),
            ("unstreamed", c.unstreamed),
            ("cache_reported", c.cache_reported),
            ("resent", c.resent),
            ("pinned", c.pinned),
            ("sent_out_of_order", t.sent_out_of_order),
            ("coalesce_checked", c.coalesce_checked),
            ("requests_by_protocol", c.requests_by_protocol.total()),
        ];
        for (name, value) in parts {
            if value > issued {
                return Err(format!("{name} {value} of {issued} issued"));
            }
        }
        check_parts(c)?;
        let statuses = self
            .status_codes
            .values()
            .copied()
            .try_fold(0u64, u64::checked_add)
            .ok_or("its status counts overflow")?;
        if statuses > issued {
            return Err(format!("{statuses} status codes of {issued} issued"));
        }
        let problems = self
            .tls_problems
            .values()
            .copied()
            .try_fold(0u64, u64::checked_add)
            .ok_or("its TLS problem counts overflow")?;
        if problems
            > issued
                .saturating_add(c.transport.tls)
                .saturating_add(MAX_ISSUED_PER_WORKER)
        {
            return Err(format!("{problems} TLS problems"));
        }
        let token_limit = |requests: u64| requests.saturating_mul(MAX_TOKENS_PER_REQUEST);
        if c.output_tokens > token_limit(answered) {
            return Err(format!(
                "{} output tokens over {answered} answered requests",
                c.output_tokens
            ));
        }
        if c.cache_reported_input_tokens > token_limit(c.cache_reported) {
            return Err(format!(
                "{} input tokens over {} requests that reported a cache",
                c.cache_reported_input_tokens, c.cache_reported
            ));
        }
        if let Some(steady) = &self.steady {
            check_steady(&steady.counters, c)
                .map_err(|error| format!("steady metrics: {error}"))?;
        }
        Ok(())
    }
}

/// The checks of a report's counters that need nothing but them: no part exceeds its whole.
fn check_parts(c: &Counters) -> Result<(), String> {
    if c.coalesced > c.coalesce_checked {
        return Err(format!(
            "coalesced {} of {} checked",
            c.coalesced, c.coalesce_checked
        ));
    }
    if c.pinned_matched > c.pinned {
        return Err(format!(
            "pinned_matched {} of {} pinned",
            c.pinned_matched, c.pinned
        ));
    }
    if c.pinned_frames > c.pinned {
        return Err(format!(
            "pinned_frames {} of {} pinned",
            c.pinned_frames, c.pinned
        ));
    }
    if c.good > c.succeeded {
        return Err(format!("good {} of {} succeeded", c.good, c.succeeded));
    }
    if c.good_output_tokens > c.output_tokens {
        return Err(format!(
            "good_output_tokens {} of {} output tokens",
            c.good_output_tokens, c.output_tokens
        ));
    }
    let tr = &c.transport;
    let causes = [
        tr.refused,
        tr.reset,
        tr.closed_before_response,
        tr.tls,
        tr.dns,
        tr.other,
        tr.closed_after_head,
        tr.http2_only,
    ]
    .into_iter()
    .try_fold(0u64, u64::checked_add)
    .ok_or("its transport counters overflow")?;
    if causes > c.failed_transport {
        return Err(format!(
            "{causes} transport failures by cause of {} failed_transport",
            c.failed_transport
        ));
    }
    if c.cached_input_tokens > c.cache_reported_input_tokens {
        return Err(format!(
            "{} cached input tokens of {} input tokens",
            c.cached_input_tokens, c.cache_reported_input_tokens
        ));
    }
    Ok(())
}

/// The steady window's counters: consistent in themselves, and none past the main ones
/// (the steady requests are some of the worker's measured requests).
fn check_steady(steady: &Counters, main: &Counters) -> Result<(), String> {
    check_parts(steady)?;
    for ((name, part), (_, whole)) in named_counts(steady).into_iter().zip(named_counts(main)) {
        if part > whole {
            return Err(format!("{name} {part} of {whole} in the whole report"));
        }
    }
    Ok(())
}

/// Every count of `c` by name, in a fixed order.
fn named_counts(c: &Counters) -> Vec<(&'static str, u64)> {
    let mut counts = vec![
        ("succeeded", c.succeeded),
        ("ended_early", c.ended_early),
        ("failed_status", c.failed_status),
        ("failed_error_frame", c.failed_error_frame),
        ("failed_transport", c.failed_transport),
        ("failed_timeout", c.failed_timeout),
        ("failed_empty", c.failed_empty),
        ("usage_reported", c.usage_reported),
        ("estimated", c.estimated),
        ("server_stated", c.server_stated),
        ("input_server", c.input_server),
        ("output_tokens", c.output_tokens),
        ("warmup", c.warmup),
        ("unstreamed", c.unstreamed),
        ("cache_reported", c.cache_reported),
        ("cached_input_tokens", c.cached_input_tokens),
        ("cache_reported_input_tokens", c.cache_reported_input_tokens),
        ("resent", c.resent),
        ("pinned", c.pinned),
        ("pinned_matched", c.pinned_matched),
        ("coalesce_checked", c.coalesce_checked),
        ("coalesced", c.coalesced),
        ("good", c.good),
        ("good_output_tokens", c.good_output_tokens),
    ];
    counts.extend(c.transport.by_name());
    counts.extend([
        ("connections_http1", c.connections.http1),
        ("connections_http1_tls12", c.connections.http1_tls12),
        ("connections_http1_tls13", c.connections.http1_tls13),
        ("connections_http1_tls", c.connections.http1_tls),
        ("connections_h2_tls12", c.connections.h2_tls12),
        ("connections_h2_tls13", c.connections.h2_tls13),
        ("connections_h2_tls", c.connections.h2_tls),
        ("connections_h2c", c.connections.h2c),
        ("requests_http1", c.requests_by_protocol.http1),
        ("requests_h2", c.requests_by_protocol.h2),
        ("requests_h2c", c.requests_by_protocol.h2c),
    ]);
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A consistent report: 10 issued, 8 succeeded (80 output tokens), 2 failed, 5 good.
    fn report() -> ReceivedReport {
        let mut report = ReceivedReport::default();
        report.totals.issued = 10;
        let c = &mut report.metrics.counters;
        c.succeeded = 8;
        c.failed_status = 2;
        c.output_tokens = 80;
        c.estimated = 8;
        c.good = 5;
        c.good_output_tokens = 50;
        report
    }

    /// Steady counters within the report's: 4 succeeded (40 tokens), 1 failed, 3 good.
    fn steady() -> SparseMetrics {
        let mut steady = SparseMetrics::default();
        let c = &mut steady.counters;
        c.succeeded = 4;
        c.failed_status = 1;
        c.output_tokens = 40;
        c.estimated = 4;
        c.good = 3;
        c.good_output_tokens = 30;
        steady
    }

    #[test]
    fn a_consistent_report_passes_with_or_without_steady_metrics() {
        let mut report = report();
        assert_eq!(report.check_counters(Some(10)), Ok(()));
        report.steady = Some(steady());
        assert_eq!(report.check_counters(Some(10)), Ok(()));
        // The whole report as its own steady window is within it too.
        report.steady = Some(report.metrics.clone());
        assert_eq!(report.check_counters(None), Ok(()));
    }

    #[test]
    fn good_requests_are_succeeded_ones_and_their_tokens_output_tokens() {
        let mut report = report();
        report.metrics.counters.good = 9;
        assert_eq!(
            report.check_counters(None),
            Err("good 9 of 8 succeeded".to_owned())
        );
        let mut report = self::report();
        report.metrics.counters.good_output_tokens = 81;
        assert_eq!(
            report.check_counters(None),
            Err("good_output_tokens 81 of 80 output tokens".to_owned())
        );
    }

    #[test]
    fn steady_metrics_count_no_more_than_the_report_and_hold_together() {
        let refused = |change: fn(&mut Counters)| {
            let mut report = report();
            let mut steady = steady();
            change(&mut steady.counters);
            report.steady = Some(steady);
            report.check_counters(None).expect_err("refused")
        };
        assert_eq!(
            refused(|c| c.succeeded = 9),
            "steady metrics: succeeded 9 of 8 in the whole report"
        );
        assert_eq!(
            refused(|c| c.failed_status = 3),
            "steady metrics: failed_status 3 of 2 in the whole report"
        );
        assert_eq!(
            refused(|c| {
                c.succeeded = 8;
                c.good = 6;
            }),
            "steady metrics: good 6 of 5 in the whole report"
        );
        // Within the report's good count, but more good than its own succeeded.
        assert_eq!(
            refused(|c| c.good = 5),
            "steady metrics: good 5 of 4 succeeded"
        );
        assert_eq!(
            refused(|c| c.good_output_tokens = 45),
            "steady metrics: good_output_tokens 45 of 40 output tokens"
        );
        assert_eq!(
            refused(|c| {
                c.failed_transport = 0;
                c.transport.reset = 1;
            }),
            "steady metrics: 1 transport failures by cause of 0 failed_transport"
        );
    }
}
