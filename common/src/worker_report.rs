//! A worker's cumulative report as both ends see it: what the worker's link sends and what
//! the coordinator keeps of each one it receives, with the checks a received report must
//! pass. `proto::convert` turns it into its message and back.

use crate::metrics::{RunMetrics, SliceTotals, SparseMetrics};
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
    /// token totals stay within [`MAX_TOKENS_PER_REQUEST`] per request. A report that fails
    /// comes from a broken or hostile peer. `sent`: the exchanges handed to this worker when
    /// its slice does not loop (what it can have issued at most).
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
            ("unstreamed", c.unstreamed),
            ("cache_reported", c.cache_reported),
            ("resent", c.resent),
            ("pinned", c.pinned),
            ("sent_out_of_order", t.sent_out_of_order),
            ("coalesce_checked", c.coalesce_checked),
        ];
        for (name, value) in parts {
            if value > issued {
                return Err(format!("{name} {value} of {issued} issued"));
            }
        }
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
        if c.cached_input_tokens > c.cache_reported_input_tokens {
            return Err(format!(
                "{} cached input tokens of {} input tokens",
                c.cached_input_tokens, c.cache_reported_input_tokens
            ));
        }
        Ok(())
    }
}
