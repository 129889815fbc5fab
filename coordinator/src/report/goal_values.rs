//! Where each quantity a goal can name is in the report: the report's sections answer
//! [`GoalValues`], so the goals module knows the names and the rules and never the report's
//! fields.

use crate::goals::{GoalValues, Quantity, ServerQuantity, ServerStat, server_type_stats};
use crate::server_metrics::{ServerMetric, ServerSection};

use super::{GoodputSection, LlmSection, RequestsSection};

/// One side of a report as goals read it: its `llm` section, when known its `requests`
/// counters (a baseline saved by an older version has only `llm`, and its counters are then
/// unknown, never zero), its goodput when the run had `--slo`, and what the server's
/// `/metrics` said when it was scraped.
pub(super) struct SectionValues<'a> {
    pub(super) llm: &'a LlmSection,
    pub(super) requests: Option<&'a RequestsSection>,
    pub(super) goodput: Option<&'a GoodputSection>,
    pub(super) server: Option<&'a ServerSection>,
    /// True for the baseline's side: a recording (or a saved report's numbers) has no
    /// server side, which its notes say.
    pub(super) baseline: bool,
}

impl GoalValues for SectionValues<'_> {
    fn value(&self, quantity: &Quantity) -> Option<f64> {
        let llm = self.llm;
        let requests = || self.requests;
        match quantity {
            Quantity::Server(q) => {
                // Every time a goal reads is in ms (a report saved before the conversion
                // holds a family of seconds in seconds).
                let metric = self.server?.metrics.get(&q.name)?.in_ms(&q.name);
                // A histogram without observations has no percentiles (the section says
                // 0): a gate must not pass on them.
                let unobserved = matches!(metric, ServerMetric::Histogram { count, .. } if count <= 0.0)
                    && matches!(q.stat, ServerStat::P50 | ServerStat::P90 | ServerStat::P99);
                q.stat.of(&metric).filter(|v| v.is_finite() && !unobserved)
            }
            Quantity::Stat { metric, stat } => llm.stats(*metric).map(|s| stat.of(&s)),
            Quantity::OutputThroughput => llm.output_tokens_per_second,
            Quantity::RequestThroughput => llm.requests_per_second,
            Quantity::OutputThroughputSteady => llm.output_tokens_per_second_steady,
            Quantity::RequestThroughputSteady => llm.requests_per_second_steady,
            Quantity::EstimatedShare => llm.estimated_token_share_pct,
            Quantity::CachedInputShare => llm.cached_input_share_pct,
            Quantity::StreamsEndedEarly => requests().map(|r| r.ended_early as f64),
            Quantity::Errors | Quantity::RequestsFailed => requests().map(|r| r.failed as f64),
            Quantity::ErrorRate => requests().and_then(RequestsSection::error_rate_pct),
            Quantity::RequestsTotal => requests().map(|r| r.total as f64),
            // Over the same window as `llm.request-throughput`: none measured, no rate (a
            // gate must not pass on a 0 that measured nothing).
            Quantity::Goodput => self
                .goodput
                .filter(|_| llm.measured_window_s.is_some())
                .map(|g| g.requests_per_second),
            Quantity::GoodShare => self.goodput.and_then(|g| g.good_share_pct),
        }
    }

    fn missing_note(&self, quantity: &Quantity) -> Option<String> {
        if let Quantity::Server(q) = quantity {
            return Some(self.server_note(q));
        }
        (quantity.needs_slos() && self.goodput.is_none()).then(|| {
            format!(
                "no value: {} needs --slo (this run set no SLOs, so no request was judged good)",
                quantity.name()
            )
        })
    }
}

impl SectionValues<'_> {
    /// Why the server metric `q` has no value on this side.
    fn server_note(&self, q: &ServerQuantity) -> String {
        if self.baseline {
            return format!(
                "no value: the baseline has no server side (a recording, or a saved report's \
                 numbers, carries no server metrics), so {} has no change",
                q.name
            );
        }
        let Some(server) = self.server else {
            return "no value: no server metrics were scraped (--no-server-metrics, or no \
                    target to scrape)"
                .to_string();
        };
        let answered: Vec<&str> = server
            .endpoints
            .iter()
            .filter(|e| e.scrapes > e.errors)
            .map(|e| e.url.as_str())
            .collect();
        if answered.is_empty() {
            let endpoints: Vec<String> = server
                .endpoints
                .iter()
                .map(|e| match &e.note {
                    Some(note) => format!("{}: {note}", e.url),
                    None => e.url.clone(),
                })
                .collect();
            return if endpoints.is_empty() {
                "no value: no server metrics were scraped (no endpoint to scrape)".to_string()
            } else {
                format!(
                    "no value: no server metrics were scraped (no endpoint answered: {})",
                    endpoints.join("; ")
                )
            };
        }
        let mixed: Vec<String> = server
            .endpoints
            .iter()
            .filter_map(|e| e.mixed.as_ref().map(|m| format!("{}: {m}", e.url)))
            .collect();
        match server.metrics.get(&q.name) {
            None if !mixed.is_empty() => {
                format!("no value: {} is not stated ({})", q.name, mixed.join("; "))
            }
            None => format!(
                "no value: {} was not exposed by {}",
                q.name,
                answered.join(", ")
            ),
            Some(metric) if q.stat.of(metric).is_some() => format!(
                "no value: {} had no {} during the run (no observations)",
                q.name,
                q.stat.name()
            ),
            Some(metric) => {
                let (kind, stats) = server_type_stats(metric);
                let stats: Vec<&str> = stats.iter().map(|s| s.name()).collect();
                format!(
                    "no value: {} is a {kind}, which has no {}; its statistics are {}",
                    q.name,
                    q.stat.name(),
                    stats.join(" ")
                )
            }
        }
    }
}
