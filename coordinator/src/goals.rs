//! Goal expressions (`--fail-if 'llm.ttft-p95 > 800'`): parsing, the metric catalogue and
//! evaluation against a finished [`Report`].
//!
//! A goal is a *failure condition*: the goal fails when its condition holds. Goals only ever
//! look at the merged report (never at one worker's share), so every goal sees the same numbers
//! the user reads in the report.

use std::fmt;

use common::metrics::{Metric, Stats};

use crate::report::{LlmSection, Report, RequestsSection};

/// Suffix that turns a metric into its percent change against the baseline.
pub const CHANGE_SUFFIX: &str = ".change";

/// One parsed goal expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// The expression as the user wrote it (trimmed), shown in reports.
    pub expr: String,
    /// What is measured.
    pub metric: GoalMetric,
    /// The comparison; the goal fails when `value OP threshold` holds.
    pub op: Op,
    /// The number on the right-hand side, in the metric's display unit (ms, tokens, %, /s).
    pub threshold: f64,
}

/// A metric a goal can name: a quantity, optionally as its percent change against the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoalMetric {
    /// The measured quantity.
    pub quantity: Quantity,
    /// True for `METRIC.change`: `(replayed − baseline) / baseline · 100`.
    pub change: bool,
}

/// The quantities goals can test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// One statistic of a distribution (`llm.ttft-p95`).
    Stat { metric: Metric, stat: Stat },
    /// `llm.output-throughput`: output tokens per second over the measured window.
    OutputThroughput,
    /// `llm.request-throughput`: succeeded requests per second over the measured window.
    RequestThroughput,
    /// `llm.streams-ended-early`: number of streams that ended without their terminal marker.
    StreamsEndedEarly,
    /// `llm.errors`: number of failed requests (every kind).
    Errors,
    /// `llm.error-rate`: failed / (succeeded + failed + ended early), in percent.
    ErrorRate,
    /// `llm.estimated-share`: percent of streams whose output tokens were estimated.
    EstimatedShare,
    /// `requests.total`.
    RequestsTotal,
    /// `requests.failed` (same count as `llm.errors`, named after the report key).
    RequestsFailed,
}

/// A statistic goals can name. `std` and `count` are reported but are not goal statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    Avg,
    Min,
    Max,
    P50,
    P90,
    P95,
    P99,
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = "==")]
    Eq,
    #[serde(rename = "!=")]
    Ne,
}

/// The outcome of one goal, as stored in the report's `goals` array.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GoalResult {
    /// The expression as written.
    pub expr: String,
    /// The canonical metric name (`llm.ttft-p95`, `llm.ttft-p95.change`).
    pub metric: String,
    /// The operator.
    pub op: Op,
    /// The measured value; `null` when there was none (no samples, or no baseline).
    pub value: Option<f64>,
    /// The threshold.
    pub threshold: f64,
    /// True when the failure condition held, or when there was no value to test.
    pub failed: bool,
    /// Why a goal without a value failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A goal expression that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GoalError {
    /// The expression is not `METRIC OP NUMBER`.
    #[error(
        "bad goal `{expr}`: {reason}; expected `METRIC OP NUMBER` with OP one of > >= < <= == != \
         (for example `llm.ttft-p95 > 800`)"
    )]
    Malformed { expr: String, reason: String },
    /// The metric name is not one of [`valid_metric_names`].
    #[error(
        "bad goal `{expr}`: unknown metric `{metric}`{suggestion}; valid metrics are:\n{valid}"
    )]
    UnknownMetric {
        expr: String,
        metric: String,
        /// ` (did you mean `...`?)` or empty.
        suggestion: String,
        /// Every valid name, grouped one family per line.
        valid: String,
    },
}

impl Stat {
    /// Every goal statistic, in report order.
    pub const ALL: [Stat; 7] = [
        Stat::Avg,
        Stat::Min,
        Stat::Max,
        Stat::P50,
        Stat::P90,
        Stat::P95,
        Stat::P99,
    ];

    /// The name used in goal expressions and in `baseline.changes` keys.
    pub fn name(self) -> &'static str {
        match self {
            Stat::Avg => "avg",
            Stat::Min => "min",
            Stat::Max => "max",
            Stat::P50 => "p50",
            Stat::P90 => "p90",
            Stat::P95 => "p95",
            Stat::P99 => "p99",
        }
    }

    /// This statistic of `stats`.
    pub fn of(self, stats: &Stats) -> f64 {
        match self {
            Stat::Avg => stats.avg,
            Stat::Min => stats.min,
            Stat::Max => stats.max,
            Stat::P50 => stats.p50,
            Stat::P90 => stats.p90,
            Stat::P95 => stats.p95,
            Stat::P99 => stats.p99,
        }
    }
}

impl Op {
    /// The operator's symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "==",
            Op::Ne => "!=",
        }
    }

    /// True when `value OP threshold` holds.
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Op::Gt => value > threshold,
            Op::Ge => value >= threshold,
            Op::Lt => value < threshold,
            Op::Le => value <= threshold,
            Op::Eq => value == threshold,
            Op::Ne => value != threshold,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

impl Quantity {
    /// Every quantity, in catalogue order.
    pub fn all() -> Vec<Quantity> {
        let mut all: Vec<Quantity> = Metric::ALL
            .iter()
            .flat_map(|&metric| {
                Stat::ALL
                    .iter()
                    .map(move |&stat| Quantity::Stat { metric, stat })
            })
            .collect();
        all.extend([
            Quantity::OutputThroughput,
            Quantity::RequestThroughput,
            Quantity::StreamsEndedEarly,
            Quantity::Errors,
            Quantity::ErrorRate,
            Quantity::EstimatedShare,
            Quantity::RequestsTotal,
            Quantity::RequestsFailed,
        ]);
        all
    }

    /// The goal-expression name (`llm.ttft-p95`).
    pub fn name(self) -> String {
        match self {
            Quantity::Stat { metric, stat } => {
                format!("llm.{}-{}", metric.goal_name(), stat.name())
            }
            Quantity::OutputThroughput => "llm.output-throughput".into(),
            Quantity::RequestThroughput => "llm.request-throughput".into(),
            Quantity::StreamsEndedEarly => "llm.streams-ended-early".into(),
            Quantity::Errors => "llm.errors".into(),
            Quantity::ErrorRate => "llm.error-rate".into(),
            Quantity::EstimatedShare => "llm.estimated-share".into(),
            Quantity::RequestsTotal => "requests.total".into(),
            Quantity::RequestsFailed => "requests.failed".into(),
        }
    }

    /// This quantity's value in a report's sections; `None` when there is nothing to measure
    /// (no samples, no measured window, no answered request).
    pub fn value(self, llm: &LlmSection, requests: &RequestsSection) -> Option<f64> {
        match self {
            Quantity::Stat { metric, stat } => llm.stats(metric).map(|s| stat.of(&s)),
            Quantity::OutputThroughput => llm.output_tokens_per_second,
            Quantity::RequestThroughput => llm.requests_per_second,
            Quantity::StreamsEndedEarly => Some(requests.ended_early as f64),
            Quantity::Errors | Quantity::RequestsFailed => Some(requests.failed as f64),
            Quantity::ErrorRate => requests.error_rate_pct(),
            Quantity::EstimatedShare => llm.estimated_token_share_pct,
            Quantity::RequestsTotal => Some(requests.total as f64),
        }
    }
}

impl GoalMetric {
    /// The canonical name (`llm.ttft-p95`, `llm.ttft-p95.change`).
    pub fn name(self) -> String {
        let base = self.quantity.name();
        if self.change {
            base + CHANGE_SUFFIX
        } else {
            base
        }
    }
}

impl fmt::Display for GoalMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Every valid goal metric name without the `.change` suffix, in catalogue order. Each of them
/// is also valid with [`CHANGE_SUFFIX`].
pub fn valid_metric_names() -> Vec<String> {
    Quantity::all().into_iter().map(Quantity::name).collect()
}

/// Parse `METRIC OP NUMBER` (spaces optional, the number may be negative or fractional).
pub fn parse_goal(expr: &str) -> Result<Goal, GoalError> {
    let trimmed = expr.trim();
    let malformed = |reason: &str| GoalError::Malformed {
        expr: trimmed.to_string(),
        reason: reason.to_string(),
    };
    let op_start = trimmed
        .find(['<', '>', '=', '!'])
        .ok_or_else(|| malformed("no comparison operator"))?;
    let rest = &trimmed[op_start..];
    // Two-character operators first, so `>=` is never read as `>` followed by `=5`.
    let (op, op_len) = match rest.get(..2) {
        Some(">=") => (Op::Ge, 2),
        Some("<=") => (Op::Le, 2),
        Some("==") => (Op::Eq, 2),
        Some("!=") => (Op::Ne, 2),
        _ => match rest.as_bytes().first() {
            Some(b'>') => (Op::Gt, 1),
            Some(b'<') => (Op::Lt, 1),
            _ => return Err(malformed("unknown operator (use == for equality)")),
        },
    };
    let metric_text = trimmed[..op_start].trim();
    if metric_text.is_empty() {
        return Err(malformed("no metric before the operator"));
    }
    let number_text = rest[op_len..].trim();
    if number_text.is_empty() {
        return Err(malformed("no number after the operator"));
    }
    let threshold: f64 = number_text
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite())
        .ok_or_else(|| malformed(&format!("`{number_text}` is not a number")))?;
    let metric = parse_metric(metric_text).map_err(|suggestion| GoalError::UnknownMetric {
        expr: trimmed.to_string(),
        metric: metric_text.to_string(),
        suggestion,
        valid: valid_names_listing(),
    })?;
    Ok(Goal {
        expr: trimmed.to_string(),
        metric,
        op,
        threshold,
    })
}

/// Evaluate `goals` against the merged numbers of `report`.
///
/// A goal fails when its condition holds (`--fail-if`). A goal whose metric has **no value**
/// also fails, with `value: null` and a `note` saying why: a distribution with no samples, a
/// throughput with no measured window, an error rate with no answered request, or a `.change`
/// metric when the report has no baseline (or the baseline has no value, or it is 0 while the
/// replayed value is not, so the percent change is undefined). A CI gate must never pass
/// silently because the data it tests is missing.
pub fn evaluate(goals: &[Goal], report: &Report) -> Vec<GoalResult> {
    goals
        .iter()
        .map(|goal| evaluate_one(goal, report))
        .collect()
}

fn evaluate_one(goal: &Goal, report: &Report) -> GoalResult {
    let (value, note) = goal_value(goal.metric, report);
    let failed = match value {
        Some(v) => goal.op.holds(v, goal.threshold),
        None => true,
    };
    GoalResult {
        expr: goal.expr.clone(),
        metric: goal.metric.name(),
        op: goal.op,
        value,
        threshold: goal.threshold,
        failed,
        note: if value.is_none() { note } else { None },
    }
}

fn goal_value(metric: GoalMetric, report: &Report) -> (Option<f64>, Option<String>) {
    let quantity = metric.quantity;
    let replayed = quantity.value(&report.llm, &report.requests);
    if !metric.change {
        let note = replayed
            .is_none()
            .then(|| format!("no value: {} has no samples in this run", quantity.name()));
        return (replayed, note);
    }
    let Some(baseline) = &report.baseline else {
        return (
            None,
            Some("no value: the report has no baseline to compare with".into()),
        );
    };
    let baseline_value = match &baseline.requests {
        Some(requests) => quantity.value(&baseline.llm, requests),
        // Old reports carry only the baseline's `llm`: counters are then unknown.
        None => match quantity {
            Quantity::Stat { .. }
            | Quantity::OutputThroughput
            | Quantity::RequestThroughput
            | Quantity::EstimatedShare => {
                quantity.value(&baseline.llm, &RequestsSection::default())
            }
            _ => None,
        },
    };
    let (Some(b), Some(r)) = (baseline_value, replayed) else {
        let side = if baseline_value.is_none() {
            "the baseline"
        } else {
            "this run"
        };
        return (
            None,
            Some(format!(
                "no value: {side} has no value for {}",
                quantity.name()
            )),
        );
    };
    match change_pct(b, r) {
        Some(pct) => (Some(pct), None),
        None => (
            None,
            Some(format!(
                "no value: the baseline {} is 0, so the percent change is undefined",
                quantity.name()
            )),
        ),
    }
}

/// Percent change from `baseline` to `replayed`: `(replayed − baseline) / baseline · 100`.
/// `None` when the baseline is 0 and the replayed value is not (the change is unbounded).
pub fn change_pct(baseline: f64, replayed: f64) -> Option<f64> {
    if baseline == 0.0 {
        return (replayed == 0.0).then_some(0.0);
    }
    Some((replayed - baseline) / baseline * 100.0)
}

/// Parse a metric name; on failure return a ` (did you mean ...)` suggestion (maybe empty).
fn parse_metric(text: &str) -> Result<GoalMetric, String> {
    let (base, change) = match text.strip_suffix(CHANGE_SUFFIX) {
        Some(base) => (base, true),
        None => (text, false),
    };
    if let Some(quantity) = Quantity::all().into_iter().find(|q| q.name() == base) {
        return Ok(GoalMetric { quantity, change });
    }
    let closest = Quantity::all()
        .into_iter()
        .map(|q| q.name())
        .min_by_key(|name| edit_distance(name, base));
    Err(match closest {
        Some(name) if edit_distance(&name, base) <= 3 => {
            let suffix = if change { CHANGE_SUFFIX } else { "" };
            format!(" (did you mean `{name}{suffix}`?)")
        }
        _ => String::new(),
    })
}

/// Every valid name grouped one family per line, for the unknown-metric message.
fn valid_names_listing() -> String {
    let mut lines: Vec<String> = Metric::ALL
        .iter()
        .map(|&metric| {
            let names: Vec<String> = Stat::ALL
                .iter()
                .map(|&stat| Quantity::Stat { metric, stat }.name())
                .collect();
            format!("  {}", names.join(" "))
        })
        .collect();
    let scalars: Vec<String> = Quantity::all()
        .into_iter()
        .filter(|q| !matches!(q, Quantity::Stat { .. }))
        .map(Quantity::name)
        .collect();
    lines.push(format!("  {}", scalars.join(" ")));
    lines.push(format!(
        "  and each of them with the suffix `{CHANGE_SUFFIX}` (percent change against the baseline, \
         e.g. llm.ttft-p95{CHANGE_SUFFIX})"
    ));
    lines.join("\n")
}

/// Levenshtein distance over characters, for "did you mean" suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}
