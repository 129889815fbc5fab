//! Goal expressions (`--fail-if 'llm.ttft-p95 > 800'`): parsing, the metric catalogue and
//! evaluation against the numbers of a finished report.
//!
//! A goal is a *failure condition*: the goal fails when its condition holds. Goals only ever
//! look at the merged report (never at one worker's share), so every goal sees the same numbers
//! the user reads in the report. They read it through [`GoalValues`], which the report's
//! sections answer (`Report::with_goals`): goals know the names and the rules, the report
//! where each number is.
//!
//! Besides the client's numbers (`llm.*`, `requests.*`), a goal can name one statistic of a
//! metric family the server exposed at `/metrics`: `server.NAME.STAT`, NAME as the report
//! keys it (`vllm:num_requests_waiting`, or `family{label="value"}` for a family kept per
//! label) and STAT one of the keys of its type (gauge `avg min max last`, counter `delta
//! rate`, histogram `count sum p50 p90 p99`), in the family's own unit except times: a
//! histogram of seconds reads in ms, as every time a goal reads does. Which names exist is
//! only known once the server answered: [`unknown_server_metrics`] tells the run which ones
//! it never exposed.

use std::fmt;

use common::metrics::{Metric, Stats, Unit};

use crate::server_metrics::{ServerMetric, ServerSection, in_seconds};

/// Suffix that turns a metric into its percent change against the baseline.
pub const CHANGE_SUFFIX: &str = ".change";

/// Prefix of the goals on the server's own metrics (`server.NAME.STAT`).
pub const SERVER_PREFIX: &str = "server.";

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoalMetric {
    /// The measured quantity.
    pub quantity: Quantity,
    /// True for `METRIC.change`: `(replayed − baseline) / baseline · 100`.
    pub change: bool,
}

/// The quantities goals can test. Not `Copy`: a server metric carries its family's name.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// `server.NAME.STAT`: one statistic of a metric family the server exposed at
    /// `/metrics` (`server.vllm:num_requests_waiting.max`), in the metric's own unit, except
    /// a histogram of seconds: in ms.
    Server(ServerQuantity),
}

/// A statistic of one of the server's metric families (`server.NAME.STAT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerQuantity {
    /// The Prometheus family name, as exposed (`vllm:num_requests_waiting`).
    pub name: String,
    /// Which statistic of it.
    pub stat: ServerStat,
}

/// The statistics of a server metric family: the keys of its entry in the report's
/// `server.metrics` (each exists for one type of family only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerStat {
    /// A gauge's mean over the run's scrapes.
    Avg,
    /// A gauge's smallest value.
    Min,
    /// A gauge's largest value.
    Max,
    /// A gauge's value at the last scrape.
    Last,
    /// A counter's increase over the run.
    Delta,
    /// A counter's increase per second over the run.
    Rate,
    /// A histogram's observations during the run.
    Count,
    /// The sum of those observations.
    Sum,
    /// A histogram's median, from the run's bucket deltas.
    P50,
    /// A histogram's 90th percentile.
    P90,
    /// A histogram's 99th percentile.
    P99,
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
    fn value(&self, quantity: &Quantity) -> Option<f64>;

    /// Why `quantity` has no value when the reason is not "no samples" (a goodput goal in a
    /// run without `--slo`, a server metric nobody exposed); `None` for the general note.
    fn missing_note(&self, quantity: &Quantity) -> Option<String> {
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

impl ServerStat {
    /// Every server statistic, gauges' first, then counters', then histograms'.
    pub const ALL: [ServerStat; 11] = [
        ServerStat::Avg,
        ServerStat::Min,
        ServerStat::Max,
        ServerStat::Last,
        ServerStat::Delta,
        ServerStat::Rate,
        ServerStat::Count,
        ServerStat::Sum,
        ServerStat::P50,
        ServerStat::P90,
        ServerStat::P99,
    ];

    /// The name used in goal expressions and as the key in `server.metrics.NAME`.
    pub fn name(self) -> &'static str {
        match self {
            ServerStat::Avg => "avg",
            ServerStat::Min => "min",
            ServerStat::Max => "max",
            ServerStat::Last => "last",
            ServerStat::Delta => "delta",
            ServerStat::Rate => "rate",
            ServerStat::Count => "count",
            ServerStat::Sum => "sum",
            ServerStat::P50 => "p50",
            ServerStat::P90 => "p90",
            ServerStat::P99 => "p99",
        }
    }

    /// The statistic named `name` (`max`), if any.
    pub fn from_name(name: &str) -> Option<ServerStat> {
        ServerStat::ALL.into_iter().find(|stat| stat.name() == name)
    }

    /// This statistic of `metric`; `None` when its type has no such statistic (a gauge has
    /// no `rate`).
    pub fn of(self, metric: &ServerMetric) -> Option<f64> {
        match (metric, self) {
            (ServerMetric::Gauge { avg, .. }, ServerStat::Avg) => Some(*avg),
            (ServerMetric::Gauge { min, .. }, ServerStat::Min) => Some(*min),
            (ServerMetric::Gauge { max, .. }, ServerStat::Max) => Some(*max),
            (ServerMetric::Gauge { last, .. }, ServerStat::Last) => Some(*last),
            (ServerMetric::Counter { delta, .. }, ServerStat::Delta) => Some(*delta),
            (ServerMetric::Counter { rate, .. }, ServerStat::Rate) => Some(*rate),
            (ServerMetric::Histogram { count, .. }, ServerStat::Count) => Some(*count),
            (ServerMetric::Histogram { sum, .. }, ServerStat::Sum) => Some(*sum),
            (ServerMetric::Histogram { p50, .. }, ServerStat::P50) => Some(*p50),
            (ServerMetric::Histogram { p90, .. }, ServerStat::P90) => Some(*p90),
            (ServerMetric::Histogram { p99, .. }, ServerStat::P99) => Some(*p99),
            _ => None,
        }
    }
}

/// The type of a server metric family as the report names it (`gauge`) and the statistics
/// that type has.
pub fn server_type_stats(metric: &ServerMetric) -> (&'static str, &'static [ServerStat]) {
    match metric {
        ServerMetric::Gauge { .. } => ("gauge", &ServerStat::ALL[0..4]),
        ServerMetric::Counter { .. } => ("counter", &ServerStat::ALL[4..6]),
        ServerMetric::Histogram { .. } => ("histogram", &ServerStat::ALL[6..11]),
    }
}

/// The expressions of the `server.NAME.STAT` goals whose family the server did not expose,
/// though at least one endpoint answered (a scrape that did not fail): most likely a typo or
/// another server's name, which the run reports as a usage error (exit 2) rather than a
/// failed goal. Empty when there is no server section or when no endpoint answered with
/// series of one server (then nothing can be told about the names: the goals just fail with
/// a note).
pub fn unknown_server_metrics(goals: &[Goal], server: Option<&ServerSection>) -> Vec<String> {
    let Some(server) = server else {
        return Vec::new();
    };
    // A mixed endpoint's families are left out of the section: they tell nothing either.
    if !server
        .endpoints
        .iter()
        .any(|e| e.scrapes > e.errors && e.mixed.is_none())
    {
        return Vec::new();
    }
    goals
        .iter()
        .filter(|goal| match &goal.metric.quantity {
            Quantity::Server(q) => !server.metrics.contains_key(&q.name),
            _ => false,
        })
        .map(|goal| goal.expr.clone())
        .collect()
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
    pub fn needs_slos(&self) -> bool {
        matches!(self, Quantity::Goodput | Quantity::GoodShare)
    }

    /// The display unit of the value (`ms`, `tokens/s`, `%`), empty for counts. A server
    /// metric keeps its own unit, except a histogram of seconds (`in_seconds`), whose `sum`
    /// and quantiles are in ms; `/s` for a counter's rate, none otherwise.
    pub fn unit(&self) -> &'static str {
        match self {
            Quantity::Server(q) => match q.stat {
                ServerStat::Rate => "/s",
                ServerStat::Sum | ServerStat::P50 | ServerStat::P90 | ServerStat::P99
                    if in_seconds(&q.name) =>
                {
                    "ms"
                }
                _ => "",
            },
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

    /// The goal-expression name (`llm.ttft-p95`, `server.vllm:num_requests_waiting.max`).
    pub fn name(&self) -> String {
        match self {
            Quantity::Server(q) => format!("{SERVER_PREFIX}{}.{}", q.name, q.stat.name()),
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
    pub fn unit(&self) -> &'static str {
        if self.change {
            "%"
        } else {
            self.quantity.unit()
        }
    }

    /// The canonical name (`llm.ttft-p95`, `llm.ttft-p95.change`).
    pub fn name(&self) -> String {
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
#[cfg(test)]
pub fn valid_metric_names() -> Vec<String> {
    Quantity::all().iter().map(Quantity::name).collect()
}

/// Parse `METRIC OP NUMBER` (spaces optional, the number may be negative or fractional).
pub fn parse_goal(expr: &str) -> Result<Goal, GoalError> {
    let trimmed = expr.trim();
    let malformed = |reason: &str| GoalError::Malformed {
        expr: trimmed.to_string(),
        reason: reason.to_string(),
    };
    let op_start = operator_start(trimmed).ok_or_else(|| malformed("no comparison operator"))?;
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

/// Where the comparison operator starts: the first `<`, `>`, `=` or `!` outside a label
/// set, so a server family split by a label (`server.nv_trt_llm_request_metrics{
/// request_type="waiting"}.max > 4`) keeps its `=` in the name.
fn operator_start(text: &str) -> Option<usize> {
    let mut in_labels = false;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_quotes {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_quotes = false,
                _ => {}
            }
            continue;
        }
        match c {
            '{' => in_labels = true,
            '}' => in_labels = false,
            '"' if in_labels => in_quotes = true,
            '<' | '>' | '=' | '!' if !in_labels => return Some(i),
            _ => {}
        }
    }
    None
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
    let (value, note) = goal_value(&goal.metric, replayed, baseline);
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
    metric: &GoalMetric,
    replayed: &dyn GoalValues,
    baseline: Option<&dyn GoalValues>,
) -> (Option<f64>, Option<String>) {
    let quantity = &metric.quantity;
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
    if baseline_value.is_none()
        && let Some(note) = baseline.missing_note(quantity)
    {
        return (None, Some(note));
    }
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
    if let Some(rest) = base.strip_prefix(SERVER_PREFIX) {
        return parse_server_quantity(rest, change).map(|quantity| GoalMetric { quantity, change });
    }
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

/// `NAME.STAT` of a `server.NAME.STAT` goal (`.change` already taken off). Prometheus names
/// never hold a dot (vLLM's hold colons), so the statistic is what follows the last one.
fn parse_server_quantity(text: &str, change: bool) -> Result<Quantity, String> {
    let stats: Vec<&str> = ServerStat::ALL.iter().map(|s| s.name()).collect();
    let Some((name, stat_text)) = text.rsplit_once('.') else {
        return Err(format!(
            " (a server metric is `server.NAME.STAT` with STAT one of {})",
            stats.join(" ")
        ));
    };
    // A family split by a label is keyed `family{label="value"}` in the report.
    let (family, labels) = match name.find('{') {
        Some(brace) => (&name[..brace], Some(&name[brace..])),
        None => (name, None),
    };
    let valid_name = !family.is_empty()
        && !family.starts_with(|c: char| c.is_ascii_digit())
        && family
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && labels.is_none_or(|labels| labels.len() > 2 && labels.ends_with('}'));
    if !valid_name {
        return Err(format!(
            " (`{name}` is not a Prometheus metric name: letters, digits, `_` and `:`, not \
             starting with a digit)"
        ));
    }
    match ServerStat::from_name(stat_text) {
        Some(stat) => Ok(Quantity::Server(ServerQuantity {
            name: name.to_string(),
            stat,
        })),
        None => {
            let closest = ServerStat::ALL
                .into_iter()
                .min_by_key(|s| edit_distance(s.name(), stat_text))
                .filter(|s| edit_distance(s.name(), stat_text) <= 2);
            let suffix = if change { CHANGE_SUFFIX } else { "" };
            Err(match closest {
                Some(stat) => format!(
                    " (did you mean `{SERVER_PREFIX}{name}.{}{suffix}`? STAT is one of {})",
                    stat.name(),
                    stats.join(" ")
                ),
                None => format!(
                    " (STAT of `server.NAME.STAT` is one of {})",
                    stats.join(" ")
                ),
            })
        }
    }
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
        .iter()
        .filter(|q| !matches!(q, Quantity::Stat { .. }))
        .map(Quantity::name)
        .collect();
    lines.push(format!("  {}", scalars.join(" ")));
    lines.push(format!(
        "  and each of them with the suffix `{CHANGE_SUFFIX}` (percent change against the baseline, \
         e.g. llm.ttft-p95{CHANGE_SUFFIX})"
    ));
    let needs_slos: Vec<String> = Quantity::all()
        .iter()
        .filter(|q| q.needs_slos())
        .map(Quantity::name)
        .collect();
    lines.push(format!(
        "  ({} need --slo NAME:LIMIT: good requests are those within every SLO)",
        needs_slos.join(" and ")
    ));
    lines.push(format!(
        "  {SERVER_PREFIX}NAME.STAT: a metric family the server exposes at /metrics, in its own \
         unit except times, in ms (e.g. {SERVER_PREFIX}vllm:num_requests_waiting.max, \
         {SERVER_PREFIX}vllm:time_to_first_token_seconds.p90 > 500), STAT one of avg min max \
         last (gauges), delta rate (counters), count sum p50 p90 p99 (histograms)"
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
            server_output_tokens: None,
            tokenized_output_tokens: None,
            input_source: None,
            input_tokens: Some(100),
            schedule_lag_us: None,
            sent_unix_us: Some(1_000_000_000 + sent_s * 1_000_000),
            transport_cause: None,
            resent: false,
            unstreamed: false,
            cached_input_tokens: None,
            coalesced: false,
            protocol: None,
        }
    }

    fn run() -> RunInfo {
        RunInfo {
            id: "r".into(),
            started_at: "2026-11-30T10:00:00.000Z".into(),
            duration_s: 1.0,
            target: "t".into(),
            load: Default::default(),
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

    fn server_section(answered: bool) -> ServerSection {
        use crate::server_metrics::ServerEndpoint;
        let mut metrics = std::collections::BTreeMap::new();
        metrics.insert(
            "vllm:num_requests_waiting".to_string(),
            ServerMetric::Gauge {
                avg: 2.5,
                min: 0.0,
                max: 12.0,
                last: 1.0,
            },
        );
        metrics.insert(
            "vllm:generation_tokens_total".to_string(),
            ServerMetric::Counter {
                delta: 900.0,
                rate: 90.0,
            },
        );
        metrics.insert(
            "vllm:time_to_first_token_seconds".to_string(),
            ServerMetric::Histogram {
                count: 30.0,
                sum: 3_300.0,
                p50: 100.0,
                p90: 200.0,
                p99: 250.0,
                unit: Some(crate::server_metrics::ServerUnit::Ms),
                buckets: None,
            },
        );
        metrics.insert(
            "vllm:e2e_request_latency_seconds".to_string(),
            ServerMetric::Histogram {
                count: 0.0,
                sum: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                unit: Some(crate::server_metrics::ServerUnit::Ms),
                buckets: None,
            },
        );
        // As a report saved before times were converted holds it: in seconds.
        metrics.insert(
            "tgi_request_duration".to_string(),
            ServerMetric::Histogram {
                count: 10.0,
                sum: 4.0,
                p50: 0.4,
                p90: 0.5,
                p99: 0.6,
                unit: None,
                buckets: None,
            },
        );
        metrics.insert(
            "nv_trt_llm_request_metrics{request_type=\"waiting\"}".to_string(),
            ServerMetric::Gauge {
                avg: 1.0,
                min: 1.0,
                max: 3.0,
                last: 1.0,
            },
        );
        ServerSection {
            endpoints: vec![
                ServerEndpoint {
                    url: "http://127.0.0.1:8000/metrics".into(),
                    scrapes: if answered { 10 } else { 0 },
                    errors: 0,
                    note: None,
                    mixed: None,
                },
                ServerEndpoint {
                    url: "http://gpu:9400/metrics".into(),
                    scrapes: 0,
                    errors: 0,
                    note: Some("connection refused".into()),
                    mixed: None,
                },
            ],
            metrics: if answered {
                metrics
            } else {
                Default::default()
            },
            timeline: Vec::new(),
        }
    }

    fn server_report(server: Option<ServerSection>) -> Report {
        let mut report = report(true);
        report.server = server;
        report
    }

    #[test]
    fn server_goals_parse_names_with_colons_and_labels() {
        let g = goal("server.vllm:num_requests_waiting.max > 10");
        assert_eq!(
            g.metric.quantity,
            Quantity::Server(ServerQuantity {
                name: "vllm:num_requests_waiting".into(),
                stat: ServerStat::Max,
            })
        );
        assert_eq!(g.metric.name(), "server.vllm:num_requests_waiting.max");
        assert_eq!(g.threshold, 10.0);
        assert!(!g.needs_slos());
        let change = goal("server.vllm:time_to_first_token_seconds.p99.change>5");
        assert!(change.metric.change);
        assert_eq!(
            change.metric.name(),
            "server.vllm:time_to_first_token_seconds.p99.change"
        );
        assert_eq!(change.metric.unit(), "%");
        assert_eq!(goal("server.tgi_queue_size.avg >= 1").op, Op::Ge);
        // A family split by a label keeps its `=` in the name.
        let labelled = goal("server.nv_trt_llm_request_metrics{request_type=\"waiting\"}.max > 4");
        assert_eq!(labelled.op, Op::Gt);
        assert_eq!(labelled.threshold, 4.0);
        assert_eq!(
            labelled.metric.name(),
            "server.nv_trt_llm_request_metrics{request_type=\"waiting\"}.max"
        );
        for stat in ServerStat::ALL {
            let expr = format!("server.x_total.{} < 1", stat.name());
            assert_eq!(
                goal(&expr).metric.quantity.name(),
                format!("server.x_total.{}", stat.name())
            );
        }
        assert_eq!(
            goal("server.vllm:time_to_first_token_seconds.p99 > 1")
                .metric
                .unit(),
            "ms"
        );
        assert_eq!(
            goal("server.vllm:time_to_first_token_seconds.count > 1")
                .metric
                .unit(),
            ""
        );
        assert_eq!(
            goal("server.vllm:generation_tokens_total.rate < 1")
                .metric
                .unit(),
            "/s"
        );
        assert_eq!(
            goal("server.vllm:num_requests_waiting.max > 1")
                .metric
                .unit(),
            ""
        );
    }

    #[test]
    fn bad_server_goals_are_usage_errors_that_say_why() {
        let error = parse_goal("server.vllm:num_requests_waiting.maxx > 1").expect_err("stat");
        let message = error.to_string();
        assert!(
            message.contains("did you mean `server.vllm:num_requests_waiting.max`"),
            "{message}"
        );
        for expr in [
            "server.vllm:num_requests_waiting > 1",
            "server..max > 1",
            "server.9lives.max > 1",
            "server.a b.max > 1",
        ] {
            let error = parse_goal(expr).expect_err(expr);
            assert!(
                matches!(error, GoalError::UnknownMetric { .. }),
                "{expr}: {error}"
            );
        }
        // The listing of valid names says how to name a server metric.
        let message = parse_goal("llm.bogus > 1")
            .expect_err("unknown")
            .to_string();
        assert!(message.contains("server.NAME.STAT"), "{message}");
        assert!(message.contains("avg min max last"), "{message}");
    }

    #[test]
    fn server_goals_read_the_server_section() {
        let report = server_report(Some(server_section(true)));
        let queue = result("server.vllm:num_requests_waiting.max > 10", &report);
        assert_eq!(queue.value, Some(12.0));
        assert!(queue.failed);
        assert_eq!(queue.metric, "server.vllm:num_requests_waiting.max");
        let rate = result("server.vllm:generation_tokens_total.rate < 50", &report);
        assert_eq!(rate.value, Some(90.0));
        assert!(!rate.failed);
        // Times are in ms: a threshold written in the family's seconds fails.
        let ttft = result("server.vllm:time_to_first_token_seconds.p99 > 0.3", &report);
        assert_eq!(ttft.value, Some(250.0));
        assert!(ttft.failed);
        let ttft = result("server.vllm:time_to_first_token_seconds.p99 > 300", &report);
        assert!(!ttft.failed);
        // A saved report's family of seconds still in seconds reads in ms too.
        let saved = result("server.tgi_request_duration.p90 > 1", &report);
        assert_eq!(saved.value, Some(500.0));
        assert!(saved.failed);
        let labelled = result(
            "server.nv_trt_llm_request_metrics{request_type=\"waiting\"}.max > 4",
            &report,
        );
        assert_eq!(labelled.value, Some(3.0));
        assert!(!labelled.failed);
    }

    #[test]
    fn server_goals_without_a_value_fail_saying_why() {
        let note = |expr: &str, report: &Report| {
            let goal = result(expr, report);
            assert_eq!(goal.value, None, "{expr}");
            assert!(goal.failed, "{expr}: a gate must not pass on missing data");
            goal.note.expect("a note")
        };
        let report = server_report(Some(server_section(true)));
        // A statistic the family's type lacks: the note names the type's statistics.
        let wrong = note("server.vllm:num_requests_waiting.rate > 1", &report);
        assert!(wrong.contains("is a gauge"), "{wrong}");
        assert!(wrong.contains("avg min max last"), "{wrong}");
        let wrong = note("server.vllm:generation_tokens_total.max > 1", &report);
        assert!(
            wrong.contains("counter") && wrong.contains("delta rate"),
            "{wrong}"
        );
        // A family the server did not expose, while an endpoint answered.
        let absent = note("server.vllm:num_requests_waitin.max > 1", &report);
        assert!(
            absent.contains(
                "vllm:num_requests_waitin was not exposed by http://127.0.0.1:8000/metrics"
            ),
            "{absent}"
        );
        // A histogram without observations has no percentiles.
        let empty = note("server.vllm:e2e_request_latency_seconds.p99 > 1", &report);
        assert!(empty.contains("no observations"), "{empty}");
        assert_eq!(
            result("server.vllm:e2e_request_latency_seconds.count > 1", &report).value,
            Some(0.0)
        );
        // The baseline has no server side: no change.
        let change = note("server.vllm:num_requests_waiting.max.change > 1", &report);
        assert!(
            change.contains("the baseline has no server side"),
            "{change}"
        );
        // No section at all.
        let none = note(
            "server.vllm:num_requests_waiting.max > 1",
            &server_report(None),
        );
        assert!(none.contains("no server metrics were scraped"), "{none}");
        // Endpoints, none of which answered.
        let silent = note(
            "server.vllm:num_requests_waiting.max > 1",
            &server_report(Some(server_section(false))),
        );
        assert!(
            silent.contains("no server metrics were scraped"),
            "{silent}"
        );
        assert!(
            silent.contains("http://gpu:9400/metrics: connection refused"),
            "{silent}"
        );
    }

    #[test]
    fn unknown_server_metrics_are_those_an_answering_server_lacks() {
        let goals = parse_goals(&[
            "server.vllm:num_requests_waiting.max > 10",
            "server.vllm:num_requests_waitin.max > 10",
            "server.sglang:num_queue_reqs.max.change > 10",
            "llm.ttft-p95 > 800",
        ])
        .expect("valid");
        let section = server_section(true);
        assert_eq!(
            unknown_server_metrics(&goals, Some(&section)),
            vec![
                "server.vllm:num_requests_waitin.max > 10".to_string(),
                "server.sglang:num_queue_reqs.max.change > 10".to_string(),
            ]
        );
        // Nothing can be told when no endpoint answered, or nothing was scraped.
        assert!(unknown_server_metrics(&goals, Some(&server_section(false))).is_empty());
        assert!(unknown_server_metrics(&goals, None).is_empty());
    }
}
