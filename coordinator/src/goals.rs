//! Goal expressions (`--fail-if 'llm.ttft-p95 > 800'`): parsing, the metric catalogue and
//! evaluation against the numbers of a finished report.
//!
//! A goal is a *failure condition*: the goal fails when its condition holds. Goals only ever
//! look at the merged report (never at one worker's share), so every goal sees the same numbers
//! the user reads in the report. They read it through [`GoalValues`], which the report's
//! sections answer (`Report::with_goals`): goals know the names and the rules, the report
//! where each number is.

use std::fmt;

use common::metrics::{Metric, Stats, Unit};

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
    /// `llm.output-throughput-steady`: output tokens per second over the steady window (load
    /// at its target → last request sent).
    OutputThroughputSteady,
    /// `llm.request-throughput-steady`: succeeded requests per second over the steady window.
    RequestThroughputSteady,
    /// `llm.streams-ended-early`: number of streams that ended without their terminal marker.
    StreamsEndedEarly,
    /// `llm.errors`: number of failed requests (every kind).
    Errors,
    /// `llm.error-rate`: failed / (succeeded + failed + ended early), in percent.
    ErrorRate,
    /// `llm.estimated-share`: percent of streams whose output tokens were estimated.
    EstimatedShare,
    /// `llm.cached-input-share`: percent of input tokens served from the prompt cache.
    CachedInputShare,
    /// `requests.total`.
    RequestsTotal,
    /// `requests.failed` (same count as `llm.errors`, named after the report key).
    RequestsFailed,
    /// `llm.goodput`: good requests (succeeded within every `--slo`) per second over the
    /// measured window; needs `--slo`.
    Goodput,
    /// `llm.good-share`: good requests ÷ requests that got an outcome, in percent; needs
    /// `--slo`.
    GoodShare,
}

/// A statistic goals can name. `std` and `count` are reported but are not goal statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    /// Mean.
    Avg,
    /// Smallest sample.
    Min,
    /// Largest sample.
    Max,
    /// Median.
    P50,
    /// 90th percentile.
    P90,
    /// 95th percentile.
    P95,
    /// 99th percentile.
    P99,
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// `>`
    #[serde(rename = ">")]
    Gt,
    /// `>=`
    #[serde(rename = ">=")]
    Ge,
    /// `<`
    #[serde(rename = "<")]
    Lt,
    /// `<=`
    #[serde(rename = "<=")]
    Le,
    /// `==` (exact float equality: mostly useful for counters)
    #[serde(rename = "==")]
    Eq,
    /// `!=`
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

/// Where goals read their numbers: one side of a comparison, the run or its baseline. The
/// report's sections answer it.
pub trait GoalValues {
    /// The value of `quantity`; `None` when there is nothing to measure (no samples, no
    /// measured window, no answered request) or when this side does not know it (a baseline
    /// saved without its request counters).
    fn value(&self, quantity: Quantity) -> Option<f64>;

    /// Why `quantity` has no value when the reason is not "no samples" (a goodput goal in a
    /// run without `--slo`); `None` for the general note.
    fn missing_note(&self, quantity: Quantity) -> Option<String> {
        let _ = quantity;
        None
    }
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
            .chain(&Metric::CONNECTION)
            .chain(&Metric::FAILURE)
            .flat_map(|&metric| {
                Stat::ALL
                    .iter()
                    .map(move |&stat| Quantity::Stat { metric, stat })
            })
            .collect();
        all.extend([
            Quantity::OutputThroughput,
            Quantity::RequestThroughput,
            Quantity::OutputThroughputSteady,
            Quantity::RequestThroughputSteady,
            Quantity::StreamsEndedEarly,
            Quantity::Errors,
            Quantity::ErrorRate,
            Quantity::EstimatedShare,
            Quantity::CachedInputShare,
            Quantity::RequestsTotal,
            Quantity::RequestsFailed,
            Quantity::Goodput,
            Quantity::GoodShare,
        ]);
        all
    }

    /// True for the quantities only `--slo` gives a value (`llm.goodput`, `llm.good-share`):
    /// a run refuses such a goal without SLOs before it sends any load.
    pub fn needs_slos(self) -> bool {
        matches!(self, Quantity::Goodput | Quantity::GoodShare)
    }

    /// The display unit of the value (`ms`, `tokens/s`, `%`), empty for counts.
    pub fn unit(self) -> &'static str {
        match self {
            Quantity::Stat { metric, .. } => match metric.unit() {
                Unit::Milliseconds => "ms",
                Unit::Tokens => "tokens",
                Unit::TokensPerSecond => "tokens/s",
            },
            Quantity::OutputThroughput | Quantity::OutputThroughputSteady => "tokens/s",
            Quantity::RequestThroughput | Quantity::RequestThroughputSteady | Quantity::Goodput => {
                "requests/s"
            }
            Quantity::ErrorRate
            | Quantity::EstimatedShare
            | Quantity::CachedInputShare
            | Quantity::GoodShare => "%",
            Quantity::StreamsEndedEarly
            | Quantity::Errors
            | Quantity::RequestsTotal
            | Quantity::RequestsFailed => "",
        }
    }

    /// The goal-expression name (`llm.ttft-p95`).
    pub fn name(self) -> String {
        match self {
            Quantity::Stat { metric, stat } => {
                format!("llm.{}-{}", metric.goal_name(), stat.name())
            }
            Quantity::OutputThroughput => "llm.output-throughput".into(),
            Quantity::RequestThroughput => "llm.request-throughput".into(),
            Quantity::OutputThroughputSteady => "llm.output-throughput-steady".into(),
            Quantity::RequestThroughputSteady => "llm.request-throughput-steady".into(),
            Quantity::StreamsEndedEarly => "llm.streams-ended-early".into(),
            Quantity::Errors => "llm.errors".into(),
            Quantity::ErrorRate => "llm.error-rate".into(),
            Quantity::EstimatedShare => "llm.estimated-share".into(),
            Quantity::CachedInputShare => "llm.cached-input-share".into(),
            Quantity::RequestsTotal => "requests.total".into(),
            Quantity::RequestsFailed => "requests.failed".into(),
            Quantity::Goodput => "llm.goodput".into(),
            Quantity::GoodShare => "llm.good-share".into(),
        }
    }
}

impl Goal {
    /// True when the goal names a quantity only `--slo` gives a value (`llm.goodput`,
    /// `llm.good-share`, or their `.change`): without SLOs it can only fail, so a run refuses
    /// it up front (exit 2).
    pub fn needs_slos(&self) -> bool {
        self.metric.quantity.needs_slos()
    }
}

impl GoalMetric {
    /// The display unit of the value: the quantity's (`ms`), `%` for a `.change`.
    pub fn unit(self) -> &'static str {
        if self.change {
            "%"
        } else {
            self.quantity.unit()
        }
    }

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

/// Parse several expressions (`--fail-if` repeated, or the config file's `goals:`), stopping at
/// the first bad one.
pub fn parse_goals<S: AsRef<str>>(exprs: &[S]) -> Result<Vec<Goal>, GoalError> {
    exprs.iter().map(|e| parse_goal(e.as_ref())).collect()
}

/// Evaluate `goals` against the merged numbers of a run (`replayed`) and, for `.change`
/// goals, of its `baseline`.
///
/// A goal fails when its condition holds (`--fail-if`). A goal whose metric has **no value**
/// also fails, with `value: null` and a `note` saying why: a distribution with no samples, a
/// throughput with no measured window, an error rate with no answered request, or a `.change`
/// metric when the report has no baseline (or the baseline has no value, or it is 0 while the
/// replayed value is not, so the percent change is undefined). A CI gate must never pass
/// silently because the data it tests is missing.
pub fn evaluate(
    goals: &[Goal],
    replayed: &dyn GoalValues,
    baseline: Option<&dyn GoalValues>,
) -> Vec<GoalResult> {
    goals
        .iter()
        .map(|goal| evaluate_one(goal, replayed, baseline))
        .collect()
}

fn evaluate_one(
    goal: &Goal,
    replayed: &dyn GoalValues,
    baseline: Option<&dyn GoalValues>,
) -> GoalResult {
    let (value, note) = goal_value(goal.metric, replayed, baseline);
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

fn goal_value(
    metric: GoalMetric,
    replayed: &dyn GoalValues,
    baseline: Option<&dyn GoalValues>,
) -> (Option<f64>, Option<String>) {
    let quantity = metric.quantity;
    let replayed_values = replayed;
    let replayed = replayed.value(quantity);
    if replayed.is_none()
        && let Some(note) = replayed_values.missing_note(quantity)
    {
        return (None, Some(note));
    }
    if !metric.change {
        let note = replayed
            .is_none()
            .then(|| format!("no value: {} has no samples in this run", quantity.name()));
        return (replayed, note);
    }
    let Some(baseline) = baseline else {
        return (
            None,
            Some("no value: the report has no baseline to compare with".into()),
        );
    };
    let baseline_value = baseline.value(quantity);
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
        .chain(&Metric::CONNECTION)
        .chain(&Metric::FAILURE)
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
    let needs_slos: Vec<String> = Quantity::all()
        .into_iter()
        .filter(|q| q.needs_slos())
        .map(Quantity::name)
        .collect();
    lines.push(format!(
        "  ({} need --slo NAME:LIMIT: good requests are those within every SLO)",
        needs_slos.join(" and ")
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

#[cfg(test)]
mod tests {
    use common::measure::{FailureKind, OutcomeKind, RequestOutcome};
    use common::metrics::RunMetrics;

    use super::*;
    use common::slo::{Slo, Slos};

    use crate::report::{Baseline, Report, ReportInput, RequestTotals, RunInfo};

    fn goal(expr: &str) -> Goal {
        parse_goal(expr).unwrap_or_else(|e| panic!("{expr}: {e}"))
    }

    #[test]
    fn spacing_is_optional() {
        for expr in [
            "llm.ttft-p95>800",
            "llm.ttft-p95 > 800",
            "  llm.ttft-p95   >800  ",
            "llm.ttft-p95>  800",
        ] {
            let g = goal(expr);
            assert_eq!(g.metric.name(), "llm.ttft-p95");
            assert_eq!(g.op, Op::Gt);
            assert_eq!(g.threshold, 800.0);
            assert_eq!(g.expr, expr.trim());
        }
    }

    #[test]
    fn every_operator_parses() {
        for (text, op) in [
            (">", Op::Gt),
            (">=", Op::Ge),
            ("<", Op::Lt),
            ("<=", Op::Le),
            ("==", Op::Eq),
            ("!=", Op::Ne),
        ] {
            for expr in [format!("llm.errors{text}3"), format!("llm.errors {text} 3")] {
                let g = goal(&expr);
                assert_eq!(g.op, op, "{expr}");
                assert_eq!(g.op.symbol(), text);
                assert_eq!(g.threshold, 3.0);
            }
        }
    }

    #[test]
    fn parse_goals_stops_at_the_first_bad_expression() {
        let goals = parse_goals(&["llm.errors > 0", "llm.itl-p99>=40"]).expect("valid");
        assert_eq!(goals.len(), 2);
        assert_eq!(goals[1].metric.name(), "llm.itl-p99");
        let error = parse_goals(&["llm.errors > 0", "llm.bogus > 1"]).expect_err("bad");
        assert!(
            matches!(error, GoalError::UnknownMetric { ref metric, .. } if metric == "llm.bogus")
        );
    }

    #[test]
    fn numbers_may_be_negative_or_fractional() {
        assert_eq!(goal("llm.ttft-p95.change < -12.5").threshold, -12.5);
        assert_eq!(goal("llm.itl-avg>=-0.25").threshold, -0.25);
        assert_eq!(goal("llm.error-rate > 1e-1").threshold, 0.1);
    }

    #[test]
    fn operators_hold_as_written() {
        assert!(Op::Gt.holds(2.0, 1.0) && !Op::Gt.holds(1.0, 1.0));
        assert!(Op::Ge.holds(1.0, 1.0) && !Op::Ge.holds(0.5, 1.0));
        assert!(Op::Lt.holds(0.5, 1.0) && !Op::Lt.holds(1.0, 1.0));
        assert!(Op::Le.holds(1.0, 1.0) && !Op::Le.holds(1.5, 1.0));
        assert!(Op::Eq.holds(1.0, 1.0) && !Op::Eq.holds(1.5, 1.0));
        assert!(Op::Ne.holds(1.5, 1.0) && !Op::Ne.holds(1.0, 1.0));
    }

    #[test]
    fn every_contract_name_is_valid() {
        let names = valid_metric_names();
        assert_eq!(names.len(), 11 * 7 + 13);
        for family in [
            "ttft",
            "ttst",
            "itl",
            "latency",
            "tokens-per-second",
            "isl",
            "osl",
            "schedule-lag",
            "connect",
            "tls-handshake",
            "error-latency",
        ] {
            for stat in ["avg", "min", "max", "p50", "p90", "p95", "p99"] {
                let name = format!("llm.{family}-{stat}");
                assert!(names.contains(&name), "{name}");
                assert_eq!(goal(&format!("{name} > 1")).metric.name(), name);
                let change = goal(&format!("{name}.change > 1")).metric;
                assert!(change.change);
                assert_eq!(change.name(), format!("{name}.change"));
            }
        }
        for name in [
            "llm.output-throughput",
            "llm.request-throughput",
            "llm.output-throughput-steady",
            "llm.request-throughput-steady",
            "llm.streams-ended-early",
            "llm.errors",
            "llm.error-rate",
            "llm.estimated-share",
            "llm.cached-input-share",
            "requests.total",
            "requests.failed",
            "llm.goodput",
            "llm.good-share",
        ] {
            assert!(names.contains(&name.to_string()), "{name}");
            assert!(goal(&format!("{name}.change>0")).metric.change);
        }
    }

    #[test]
    fn unknown_metric_lists_every_valid_name() {
        let error = parse_goal("llm.ttft-p42 > 3").expect_err("unknown");
        assert!(
            matches!(error, GoalError::UnknownMetric { ref metric, .. } if metric == "llm.ttft-p42")
        );
        let message = error.to_string();
        for name in valid_metric_names() {
            assert!(message.contains(&name), "{name} missing from:\n{message}");
        }
        assert!(message.contains(".change"));
        assert!(
            message.contains("did you mean `llm.ttft-p50`")
                || message.contains("did you mean `llm.ttft-p95`")
                || message.contains("did you mean `llm.ttft-p99`"),
            "{message}"
        );

        let error = parse_goal("llm.tfft-p95.change > 3").expect_err("unknown");
        assert!(
            error
                .to_string()
                .contains("did you mean `llm.ttft-p95.change`"),
            "{error}"
        );
        let error = parse_goal("cpu.load > 3").expect_err("unknown");
        assert!(!error.to_string().contains("did you mean"), "{error}");
    }

    #[test]
    fn malformed_expressions_show_the_expected_form() {
        for expr in [
            "llm.ttft-p95",
            "llm.ttft-p95 >",
            "> 800",
            "llm.ttft-p95 = 800",
            "llm.ttft-p95 => 800",
            "llm.ttft-p95 > fast",
            "llm.ttft-p95 > inf",
            "llm.ttft-p95 > 800ms",
            "",
        ] {
            let error = parse_goal(expr).expect_err(expr);
            assert!(
                matches!(error, GoalError::Malformed { .. }),
                "{expr}: {error}"
            );
            assert!(
                error.to_string().contains("expected `METRIC OP NUMBER`"),
                "{expr}: {error}"
            );
        }
    }

    fn outcome(ttft_us: u64, sent_s: u64) -> RequestOutcome {
        RequestOutcome {
            kind: OutcomeKind::Succeeded,
            ttft_us: Some(ttft_us),
            ttst_us: Some(1_000),
            latency_us: Some(ttft_us + 9_000),
            content_frames: 10,
            usage_output_tokens: Some(10),
            input_tokens: Some(100),
            schedule_lag_us: None,
            sent_unix_us: Some(1_000_000_000 + sent_s * 1_000_000),
            transport_cause: None,
            resent: false,
            unstreamed: false,
            cached_input_tokens: None,
            coalesced: false,
        }
    }

    fn run() -> RunInfo {
        RunInfo {
            id: "r".into(),
            started_at: "2026-11-30T10:00:00.000Z".into(),
            duration_s: 1.0,
            target: "t".into(),
            load: serde_json::Value::Null,
            start_skew_ms: None,
            start_skew_bound_ms: None,
            workers: Vec::new(),
            insecure: false,
        }
    }

    /// 3 successes with TTFT 1, 2 and 2.04 ms (below 2048 µs, so stored exactly by the
    /// histograms) and one status failure; baseline TTFT 1 ms.
    fn report(with_baseline: bool) -> Report {
        report_with_slos(with_baseline, &Slos::default())
    }

    /// [`report`] with `slos`: the requests with TTFT of at most 2 ms are the good ones
    /// (what `ttft:2ms` makes of them; the workers count them, the report adds them up).
    fn report_with_slos(with_baseline: bool, slos: &Slos) -> Report {
        let mut m = RunMetrics::new();
        for (i, ttft) in [1_000, 2_000, 2_040].into_iter().enumerate() {
            let outcome = outcome(ttft, i as u64);
            m.record(&outcome);
            if slos.is_good(&outcome) == Some(true) {
                m.record_good(&outcome);
            }
        }
        m.record(&RequestOutcome::failed(FailureKind::Status));
        // Two plain-HTTP connections: 300 µs and 1.5 ms of setup, no TLS.
        m.record_connection(300, None);
        m.record_connection(1_500, None);
        let mut b = RunMetrics::new();
        b.record(&outcome(1_000, 0));
        Report::build(ReportInput {
            run: run(),
            metrics: &m,
            requests: RequestTotals {
                slice: common::metrics::SliceTotals {
                    lost: 1,
                    ..Default::default()
                },
                ..RequestTotals::default()
            },
            baseline: with_baseline.then(|| Baseline {
                source: "recorded".into(),
                metrics: &b,
            }),
            sweep: Vec::new(),
            warnings: Vec::new(),
            timeline: Vec::new(),
            slos,
        })
    }

    fn result(expr: &str, report: &Report) -> GoalResult {
        report.evaluate_goals(&[goal(expr)]).remove(0)
    }

    #[test]
    fn a_goal_fails_when_its_condition_holds() {
        let report = report(true);
        let max = result("llm.ttft-max > 2", &report);
        assert_eq!(max.value, Some(2.04));
        assert!(max.failed);
        assert_eq!(max.metric, "llm.ttft-max");
        assert_eq!(max.threshold, 2.0);
        let held = result("llm.ttft-min > 1.5", &report);
        assert_eq!(held.value, Some(1.0));
        assert!(!held.failed);
        assert!(held.note.is_none());

        assert_eq!(result("requests.total != 5", &report).value, Some(5.0));
        assert!(!result("requests.total != 5", &report).failed);
        assert!(result("requests.failed == 1", &report).failed);
        assert_eq!(result("llm.errors > 0", &report).value, Some(1.0));
        // 1 failed of 4 answered; the lost request was never answered.
        assert_eq!(result("llm.error-rate > 20", &report).value, Some(25.0));
        assert_eq!(result("llm.estimated-share > 0", &report).value, Some(0.0));
        assert_eq!(
            result("llm.streams-ended-early > 0", &report).value,
            Some(0.0)
        );
        // 3 requests in the window 0 s .. 2 s + 11.04 ms.
        let rps = result("llm.request-throughput < 10", &report);
        assert!((rps.value.expect("rps") - 3.0 / 2.01104).abs() < 1e-9);
        let tps = result("llm.output-throughput < 10", &report);
        assert!((tps.value.expect("tps") - 30.0 / 2.01104).abs() < 1e-9);
        // Connection setup is a goal of its own, per connection.
        let connect = result("llm.connect-max > 1", &report);
        assert_eq!(connect.value, Some(1.5));
        assert!(connect.failed);
        assert!(!result("llm.connect-min > 0.5", &report).failed);
        // No https connection: a TLS gate has nothing to pass on, so it fails.
        let tls = result("llm.tls-handshake-p95 > 100", &report);
        assert_eq!(tls.value, None);
        assert!(tls.failed);
    }

    #[test]
    fn change_goals_compare_with_the_baseline() {
        let report = report(true);
        // p50 TTFT 2 ms against 1 ms: +100 %.
        let change = result("llm.ttft-p50.change > 10", &report);
        assert_eq!(change.value, Some(100.0));
        assert!(change.failed);
        assert_eq!(change.metric, "llm.ttft-p50.change");
        let min = result("llm.ttft-min.change > 10", &report);
        assert_eq!(min.value, Some(0.0));
        assert!(!min.failed);
        // Counter changes use the baseline's counters: 3 requests + 1 lost vs 1.
        assert_eq!(
            result("requests.total.change > 0", &report).value,
            Some(400.0)
        );
        // The baseline had no errors: a change from 0 is undefined, so the goal fails.
        let errors = result("llm.errors.change > 1000", &report);
        assert_eq!(errors.value, None);
        assert!(errors.failed);
        assert!(errors.note.as_deref().is_some_and(|n| n.contains("is 0")));
    }

    #[test]
    fn missing_values_fail_with_a_note() {
        let report = report(false);
        let change = result("llm.ttft-p95.change > 10", &report);
        assert_eq!(change.value, None);
        assert!(change.failed, "a CI gate must not pass on missing data");
        assert!(
            change
                .note
                .as_deref()
                .is_some_and(|n| n.contains("no baseline"))
        );

        let lag = result("llm.schedule-lag-p99 > 5", &report);
        assert_eq!(lag.value, None);
        assert!(lag.failed);
        assert!(
            lag.note
                .as_deref()
                .is_some_and(|n| n.contains("no samples"))
        );

        let with_baseline = self::report(true);
        let lag_change = result("llm.schedule-lag-p99.change > 5", &with_baseline);
        assert_eq!(lag_change.value, None);
        assert!(lag_change.failed);

        let serialized = serde_json::to_value(&lag).expect("json");
        assert!(serialized["value"].is_null());
        assert_eq!(serialized["op"], ">");
        assert_eq!(serialized["failed"], true);
    }

    #[test]
    fn goodput_goals_read_the_goodput_section() {
        let slos = Slos(vec![Slo::parse("ttft:2ms").expect("slo")]);
        let report = report_with_slos(false, &slos);
        // TTFT 1 and 2 ms are within the limit, 2.04 ms is not: 2 good of 4 answered (the
        // lost request never got an outcome).
        let goodput = report.goodput.as_ref().expect("goodput with --slo");
        assert_eq!(goodput.good, 2);
        let share = result("llm.good-share < 60", &report);
        assert_eq!(share.value, Some(50.0));
        assert!(share.failed);
        assert_eq!(share.metric, "llm.good-share");
        // Over the window of llm.request-throughput: 0 s .. 2 s + 11.04 ms.
        let rate = result("llm.goodput < 0.5", &report);
        assert!((rate.value.expect("goodput") - 2.0 / 2.01104).abs() < 1e-9);
        assert!(!rate.failed);
        assert!(rate.note.is_none());
    }

    #[test]
    fn goodput_goals_without_slos_fail_saying_they_need_slo() {
        let report = report(true);
        assert!(report.goodput.is_none());
        for expr in [
            "llm.goodput < 1",
            "llm.good-share < 90",
            "llm.goodput.change < -10",
        ] {
            let goal = result(expr, &report);
            assert_eq!(goal.value, None, "{expr}");
            assert!(goal.failed, "{expr}: a gate must not pass on missing data");
            let note = goal.note.expect("a note");
            assert!(note.contains("needs --slo"), "{expr}: {note}");
        }
    }

    #[test]
    fn goodput_goals_are_known_to_need_slos() {
        for (expr, needs) in [
            ("llm.goodput < 1", true),
            ("llm.good-share < 90", true),
            ("llm.good-share.change < -5", true),
            ("llm.request-throughput < 1", false),
            ("llm.ttft-p95 > 800", false),
        ] {
            assert_eq!(goal(expr).needs_slos(), needs, "{expr}");
        }
        assert_eq!(goal("llm.goodput < 1").metric.unit(), "requests/s");
        assert_eq!(goal("llm.good-share < 1").metric.unit(), "%");
        assert_eq!(goal("llm.ttft-p95 > 1").metric.unit(), "ms");
        assert_eq!(goal("llm.ttft-p95.change > 1").metric.unit(), "%");
        // The usage error lists them, and says what they need.
        let message = parse_goal("llm.goodputt < 1")
            .expect_err("unknown")
            .to_string();
        assert!(message.contains("did you mean `llm.goodput`"), "{message}");
        assert!(
            message.contains("llm.goodput and llm.good-share need --slo"),
            "{message}"
        );
    }
}
