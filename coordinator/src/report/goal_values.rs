//! Where each quantity a goal can name is in the report: the report's sections answer
//! [`GoalValues`], so the goals module knows the names and the rules and never the report's
//! fields.

use crate::goals::{GoalValues, Quantity};

use super::{GoodputSection, LlmSection, RequestsSection};

/// One side of a report as goals read it: its `llm` section, when known its `requests`
/// counters (a baseline saved by an older version has only `llm`, and its counters are then
/// unknown, never zero), and its goodput when the run had `--slo`.
pub(super) struct SectionValues<'a> {
    pub(super) llm: &'a LlmSection,
    pub(super) requests: Option<&'a RequestsSection>,
    pub(super) goodput: Option<&'a GoodputSection>,
}

impl GoalValues for SectionValues<'_> {
    fn value(&self, quantity: Quantity) -> Option<f64> {
        let llm = self.llm;
        let requests = || self.requests;
        match quantity {
            Quantity::Stat { metric, stat } => llm.stats(metric).map(|s| stat.of(&s)),
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

    fn missing_note(&self, quantity: Quantity) -> Option<String> {
        (quantity.needs_slos() && self.goodput.is_none()).then(|| {
            format!(
                "no value: {} needs --slo (this run set no SLOs, so no request was judged good)",
                quantity.name()
            )
        })
    }
}
