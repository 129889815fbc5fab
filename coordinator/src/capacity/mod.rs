//! `--find-max`: the largest load at which every `--fail-if` goal holds.
//!
//! The search is a ramp, then a bisection. From LOW the load doubles until a probe fails a
//! goal (or HIGH holds); then the interval between the highest passing and the lowest
//! failing load is halved until the two are within `--find-max-precision` of each other (for
//! concurrency, also when they are neighbours). Each probe is a full replay with the run's
//! budget; `run` performs them and this module decides what to run next.
//!
//! Noise: a probe whose goal value lands within [`NEAR_LIMIT_FRACTION`] of a goal's
//! threshold is run again before it decides anything, and its load is decided by the
//! majority of up to three runs (two that agree decide). A probe far from every limit
//! decides at once. So a shared machine's hiccup near the knee cannot move the answer by
//! itself, and a clear result costs one run.
//!
//! The search assumes that a goal that fails at a load fails at every higher load (the
//! knee); it never probes above a failing load, so it cannot see a server that recovers
//! at higher load.

pub mod budget;
pub mod progress;
pub mod tiers;

use anyhow::bail;

use crate::goals::{GoalResult, Op};

/// A goal value within this fraction of its threshold is near the limit: its probe runs
/// again (majority of up to three decides).
pub const NEAR_LIMIT_FRACTION: f64 = 0.10;

/// Runs a load gets at most: the first, a confirmation, and a tie-break.
pub const MAX_RUNS_PER_LOAD: usize = 3;

/// The most probes a search runs, whatever the range and precision (a safety net: doubling
/// and halving reach any precision ≥ 0.1 % over the widest range well within it).
pub const MAX_PROBES: usize = 64;

/// The default `--find-max-precision`, percent.
pub const DEFAULT_PRECISION_PCT: f64 = 5.0;

pub use crate::report::Dimension;

impl Dimension {
    /// PRODUCT.md's default `--find-max-range`.
    pub fn default_range(self) -> (f64, f64) {
        match self {
            Dimension::Concurrency => (1.0, 4096.0),
            Dimension::Rate => (0.1, 100_000.0),
            Dimension::Speed => (0.1, 1000.0),
        }
    }

    /// Whether loads are whole numbers.
    pub fn integer(self) -> bool {
        self == Dimension::Concurrency
    }

    /// The load as a person reads it: `16`, `12.5 requests/s`, `×2.4`.
    pub fn show(self, value: f64) -> String {
        match self {
            Dimension::Concurrency => format!("{}", value.round()),
            Dimension::Rate => format!("{} requests/s", trim_number(value)),
            Dimension::Speed => format!("×{}", trim_number(value)),
        }
    }

    fn parse(text: &str) -> anyhow::Result<Dimension> {
        Ok(match text {
            "concurrency" => Dimension::Concurrency,
            "rate" => Dimension::Rate,
            "speed" => Dimension::Speed,
            other => bail!("--find-max {other:?}: expected concurrency, rate or speed"),
        })
    }
}

/// A number as the search's text shows it: up to four significant digits, no trailing
/// zeros.
pub fn show_number(value: f64) -> String {
    trim_number(value)
}

/// Up to four significant digits, no trailing zeros.
fn trim_number(value: f64) -> String {
    let text = if value >= 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    };
    let text = text.trim_end_matches('0').trim_end_matches('.');
    text.to_owned()
}

/// The validated `--find-max` options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FindMax {
    pub dimension: Dimension,
    /// `--find-max-range` LOW.
    pub low: f64,
    /// `--find-max-range` HIGH.
    pub high: f64,
    /// `--find-max-precision`, percent.
    pub precision_pct: f64,
    /// The first load probed: LOW, ×1 for a speed search whose range holds it, or the
    /// `--concurrency` given with `--find-max concurrency`. The search ramps up from it
    /// while loads hold, and halves down toward LOW when it fails.
    pub start: f64,
}

impl FindMax {
    /// The default first load: ×1 for speed (today's traffic) when the range holds it, else
    /// LOW.
    pub fn default_start(dimension: Dimension, low: f64, high: f64) -> f64 {
        if dimension == Dimension::Speed && low <= 1.0 && 1.0 <= high {
            1.0
        } else {
            low
        }
    }

    /// Start at `start` (`--concurrency N` with `--find-max concurrency`), which must lie in
    /// the range.
    pub fn starting_at(mut self, start: f64) -> anyhow::Result<FindMax> {
        if !(self.low..=self.high).contains(&start) {
            bail!(
                "--concurrency {start} with --find-max concurrency is the search's first load: it must lie in --find-max-range {}:{}",
                trim_number(self.low),
                trim_number(self.high)
            );
        }
        self.start = start;
        Ok(self)
    }

    /// A concurrency search over `workers` workers probes no load below one stream a
    /// worker: each worker runs at least one, so a probe at fewer would run at `workers` and
    /// be reported as less. LOW (and the start) rise to the worker count; the capacity
    /// section shows the range searched.
    pub fn fitted_to(mut self, workers: usize) -> FindMax {
        if self.dimension == Dimension::Concurrency {
            self.low = self.low.max(workers as f64).min(self.high);
            self.start = self.start.max(self.low);
        }
        self
    }

    /// Validate `--find-max`, `--find-max-range` and `--find-max-precision` (`None` when no
    /// search was asked for).
    pub fn from_options(
        dimension: Option<&str>,
        range: Option<&str>,
        precision: Option<&str>,
    ) -> anyhow::Result<Option<FindMax>> {
        let Some(dimension) = dimension else {
            if range.is_some() {
                bail!("--find-max-range needs --find-max concurrency|rate|speed");
            }
            if precision.is_some() {
                bail!("--find-max-precision needs --find-max concurrency|rate|speed");
            }
            return Ok(None);
        };
        let dimension = Dimension::parse(dimension)?;
        let (low, high) = match range {
            None => dimension.default_range(),
            Some(text) => parse_range(dimension, text)?,
        };
        let precision_pct = match precision {
            None => DEFAULT_PRECISION_PCT,
            Some(text) => {
                let number = text.trim().trim_end_matches('%').trim();
                let value: f64 = number.parse().map_err(|_| {
                    anyhow::anyhow!("--find-max-precision {text:?}: expected a percentage, e.g. 5%")
                })?;
                if !(value.is_finite() && (0.1..=100.0).contains(&value)) {
                    bail!("--find-max-precision {text:?}: must be between 0.1% and 100%");
                }
                value
            }
        };
        Ok(Some(FindMax {
            dimension,
            low,
            high,
            precision_pct,
            start: FindMax::default_start(dimension, low, high),
        }))
    }
}

fn parse_range(dimension: Dimension, text: &str) -> anyhow::Result<(f64, f64)> {
    let Some((low, high)) = text.split_once(':') else {
        bail!("--find-max-range {text:?}: expected LOW:HIGH, e.g. 1:256");
    };
    let number = |part: &str| -> anyhow::Result<f64> {
        let value: f64 = part.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "--find-max-range {text:?}: {:?} is not a number",
                part.trim()
            )
        })?;
        if !(value.is_finite() && value > 0.0) {
            bail!("--find-max-range {text:?}: loads must be above zero");
        }
        if dimension.integer() && value.fract() != 0.0 {
            bail!("--find-max-range {text:?}: a concurrency is a whole number");
        }
        Ok(value)
    };
    let (low, high) = (number(low)?, number(high)?);
    if low >= high {
        bail!("--find-max-range {text:?}: LOW must be below HIGH");
    }
    let (min, max) = dimension.default_range();
    if low < min || high > max {
        bail!(
            "--find-max-range {text:?}: {} loads go from {} to {}",
            dimension.name(),
            trim_number(min),
            trim_number(max)
        );
    }
    Ok((low, high))
}

/// Whether any goal's value at a probe is within [`NEAR_LIMIT_FRACTION`] of its
/// threshold (equality goals are never near: they hold or not).
pub fn near_limit(goals: &[GoalResult]) -> bool {
    goals.iter().any(|goal| {
        let Some(value) = goal.value else {
            return false;
        };
        if matches!(goal.op, Op::Eq | Op::Ne) {
            return false;
        }
        // A share at its bound (100 % good, 0 % errors) is as far from any limit as it can
        // be: no noise moves it past a threshold within the margin.
        if is_share(&goal.metric) && (value <= 0.0 || value >= 100.0) {
            return false;
        }
        let margin = NEAR_LIMIT_FRACTION * goal.threshold.abs();
        (value - goal.threshold).abs() <= margin
    })
}

/// Whether a goal's metric is a percentage of requests (0 to 100).
fn is_share(metric: &str) -> bool {
    !metric.ends_with(".change") && (metric.ends_with("-share") || metric.ends_with("error-rate"))
}

/// The search's next step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Replay at this load.
    Probe(f64),
    /// The search is over: read [`Search::answer`].
    Done,
}

/// One run's result, as the search weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunResult {
    /// Every goal held.
    pub passed: bool,
    /// A goal's value was within [`NEAR_LIMIT_FRACTION`] of its threshold.
    pub near_limit: bool,
    /// The workers flagged their own sending as stalled or saturated during the run: a
    /// failure then says nothing of the server.
    pub client_stall: bool,
}

/// What the search made of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The load's decision once its runs decided it (`None`: another run follows).
    pub decision: Option<bool>,
    /// Runs that counted toward the decision (a failure under a client stall does not).
    pub runs: u32,
}

/// Why the next probe repeats a load already run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// The first run was near a goal's limit: majority of up to three.
    NearLimit,
    /// The last run failed while the workers' own sending stalled.
    ClientStall,
    /// The answer rests on this load failing, decided by one run so far.
    ConfirmFailure,
}

impl Repeat {
    /// The reason as the report says it.
    pub fn text(self) -> &'static str {
        match self {
            Repeat::NearLimit => "near a goal's limit",
            Repeat::ClientStall => "the last run failed while the client stalled",
            Repeat::ConfirmFailure => "confirming the failure the answer rests on",
        }
    }
}

/// The answer of a finished (or stopped) search.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The largest load decided passing; `None` when even LOW failed.
    pub max: Option<f64>,
    /// The smallest load decided failing; `None` when HIGH held.
    pub min_failing: Option<f64>,
    /// How the search ended, in words.
    pub stopped: String,
}

/// A load the search decided failing, and whether a second run confirmed it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Failure {
    value: f64,
    confirmed: bool,
}

/// The search's state: what was decided, and the load under test.
#[derive(Debug, Clone)]
pub struct Search {
    find_max: FindMax,
    best_pass: Option<f64>,
    /// Every load decided failing (the lowest bounds the answer).
    failures: Vec<Failure>,
    /// The load under test and its runs so far (passed?).
    current: f64,
    runs: Vec<bool>,
    /// Every run at the current load, stalled ones included.
    tries: usize,
    /// The current load's runs are decided by majority (near a limit, or a confirmation).
    majority: bool,
    repeat: Option<Repeat>,
    probes: usize,
    stopped: Option<String>,
}

impl Search {
    /// A search over `find_max`'s range, starting at its start load.
    pub fn new(find_max: FindMax) -> Search {
        Search {
            find_max,
            best_pass: None,
            failures: Vec::new(),
            current: find_max.start,
            runs: Vec::new(),
            tries: 0,
            majority: false,
            repeat: None,
            probes: 0,
            stopped: None,
        }
    }

    /// What to run next.
    pub fn next(&self) -> Step {
        if self.stopped.is_some() {
            Step::Done
        } else {
            Step::Probe(self.current)
        }
    }

    /// Which run of its load the next probe is (1-based, stalled runs included).
    pub fn attempt(&self) -> u32 {
        self.tries as u32 + 1
    }

    /// Why the next probe repeats its load (`None`: a first run).
    pub fn repeat(&self) -> Option<Repeat> {
        self.repeat
    }

    /// The lowest load decided failing so far.
    fn lowest_fail(&self) -> Option<Failure> {
        self.failures
            .iter()
            .copied()
            .min_by(|a, b| a.value.total_cmp(&b.value))
    }

    /// Take one probe's result at the current load.
    pub fn record(&mut self, run: RunResult) -> Recorded {
        self.probes += 1;
        self.tries += 1;
        if run.client_stall && !run.passed && self.tries < MAX_RUNS_PER_LOAD {
            // The client, not the server, failed this run: it decides nothing.
            self.repeat = Some(Repeat::ClientStall);
            return self.undecided();
        }
        if self.runs.is_empty() && run.near_limit {
            self.majority = true;
        }
        self.runs.push(run.passed);
        let runs = self.runs.len() as u32;
        let decision = self.decision();
        match decision {
            Some(passed) => {
                let confirmed = runs > 1;
                self.runs.clear();
                self.tries = 0;
                self.majority = false;
                self.repeat = None;
                self.decide(passed, confirmed);
            }
            None => {
                self.repeat = Some(if self.repeat == Some(Repeat::ConfirmFailure) {
                    Repeat::ConfirmFailure
                } else {
                    Repeat::NearLimit
                });
                return self.undecided();
            }
        }
        Recorded { decision, runs }
    }

    /// A run that left its load undecided: stop at the probe cap, else run it again.
    fn undecided(&mut self) -> Recorded {
        if self.probes >= MAX_PROBES {
            self.stopped = Some(format!("stopped after {MAX_PROBES} probes"));
        }
        Recorded {
            decision: None,
            runs: self.runs.len() as u32,
        }
    }

    /// The current load's decision from its runs: one run far from every limit decides;
    /// near a limit, two agreeing runs of up to three do.
    fn decision(&self) -> Option<bool> {
        let passes = self.runs.iter().filter(|p| **p).count();
        let fails = self.runs.len() - passes;
        if !self.majority {
            return self.runs.first().copied();
        }
        let needed = MAX_RUNS_PER_LOAD / 2 + 1;
        if passes >= needed {
            Some(true)
        } else if fails >= needed || self.runs.len() >= MAX_RUNS_PER_LOAD {
            Some(passes > fails)
        } else {
            None
        }
    }

    fn decide(&mut self, passed: bool, confirmed: bool) {
        let value = self.current;
        // A load decided again (a confirmation) replaces its earlier decision.
        self.failures.retain(|f| f.value != value);
        if passed {
            self.best_pass = Some(self.best_pass.map_or(value, |b| b.max(value)));
            // A confirmation that passed overturns the failure: the loads above it that
            // failed still bound the search.
            self.failures.retain(|f| f.value > value);
        } else {
            self.failures.push(Failure { value, confirmed });
        }
        let next = match self.next_load() {
            Ok(next) => next,
            Err(stopped) => {
                // The answer rests on the lowest failure: one run alone never decides it.
                if let Some(fail) = self.lowest_fail().filter(|f| !f.confirmed) {
                    self.current = fail.value;
                    self.runs = vec![false];
                    self.tries = 1;
                    self.majority = true;
                    self.repeat = Some(Repeat::ConfirmFailure);
                    if self.probes >= MAX_PROBES {
                        self.stopped = Some(format!("stopped after {MAX_PROBES} probes"));
                    }
                    return;
                }
                self.stopped = Some(stopped);
                return;
            }
        };
        if self.probes >= MAX_PROBES {
            self.stopped = Some(format!("stopped after {MAX_PROBES} probes"));
            return;
        }
        self.current = next;
    }

    /// The next load to probe from what is decided, or why the search is over.
    fn next_load(&self) -> Result<f64, String> {
        let FindMax {
            dimension,
            low,
            high,
            precision_pct,
            ..
        } = self.find_max;
        let integer = dimension.integer();
        match (self.best_pass, self.lowest_fail().map(|f| f.value)) {
            (None, Some(fail)) if fail <= low => Err(format!(
                "even the lowest load, {}, fails a goal",
                dimension.show(low)
            )),
            // The start failed: halve toward LOW until a load holds.
            (None, Some(fail)) => {
                let half = if integer {
                    (fail / 2.0).floor()
                } else {
                    fail / 2.0
                };
                Ok(half.max(low))
            }
            (Some(best), None) if best >= high => Err(format!(
                "the top of the range, {}, holds every goal",
                dimension.show(high)
            )),
            (Some(best), None) => {
                let doubled = if integer {
                    (best * 2.0).max(best + 1.0)
                } else {
                    best * 2.0
                };
                Ok(doubled.min(high))
            }
            (Some(best), Some(fail)) => {
                if integer && fail - best <= 1.0 {
                    return Err(format!(
                        "neighbours: {} holds and {} fails",
                        dimension.show(best),
                        dimension.show(fail)
                    ));
                }
                if (fail - best) / best * 100.0 <= precision_pct {
                    return Err(format!(
                        "the highest passing and the lowest failing load are within {}%",
                        trim_number(precision_pct)
                    ));
                }
                let middle = (best + fail) / 2.0;
                Ok(if integer { middle.floor() } else { middle })
            }
            (None, None) => Err("no load was decided".to_owned()),
        }
    }

    /// The answer so far (final once [`Search::next`] is [`Step::Done`]): the bracket the
    /// decided loads establish, never a load that was not decided.
    pub fn answer(&self) -> Answer {
        Answer {
            max: self.best_pass,
            min_failing: self.lowest_fail().map(|f| f.value),
            stopped: self
                .stopped
                .clone()
                .unwrap_or_else(|| "stopped before the search ended".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn concurrency(low: f64, high: f64) -> FindMax {
        FindMax {
            dimension: Dimension::Concurrency,
            low,
            high,
            precision_pct: 5.0,
            start: low,
        }
    }

    /// A concurrency search over 3 workers starts at 3: each worker runs a stream at least.
    #[test]
    fn a_concurrency_search_starts_at_one_stream_a_worker() {
        let fitted = concurrency(1.0, 64.0).fitted_to(3);
        assert_eq!((fitted.low, fitted.start, fitted.high), (3.0, 3.0, 64.0));
        let above = concurrency(1.0, 64.0).starting_at(8.0).expect("in range");
        assert_eq!(above.fitted_to(3).start, 8.0);
        assert_eq!(concurrency(1.0, 64.0).fitted_to(1).low, 1.0);
        let mut rate = concurrency(1.0, 64.0);
        rate.dimension = Dimension::Rate;
        assert_eq!(rate.fitted_to(3).low, 1.0);
    }

    fn run(passed: bool, near_limit: bool) -> RunResult {
        RunResult {
            passed,
            near_limit,
            client_stall: false,
        }
    }

    /// Run a search against a deterministic knee: loads ≤ `knee` pass. Returns the probes.
    fn against_knee(find_max: FindMax, knee: f64) -> (Answer, Vec<f64>) {
        against(find_max, |value, _| value <= knee)
    }

    /// Run a search whose `n`-th probe (0-based) at `value` passes when `passes` says so.
    fn against(
        find_max: FindMax,
        mut passes: impl FnMut(f64, usize) -> bool,
    ) -> (Answer, Vec<f64>) {
        let mut search = Search::new(find_max);
        let mut probes = Vec::new();
        while let Step::Probe(value) = search.next() {
            let passed = passes(value, probes.len());
            probes.push(value);
            search.record(run(passed, false));
        }
        (search.answer(), probes)
    }

    #[test]
    fn finds_an_integer_knee_exactly_within_twelve_probes() {
        // Below 20, neighbours are more than 5 % apart: the answer is exact.
        for knee in [1.0, 4.0, 16.0, 17.0, 19.0] {
            let (answer, probes) = against_knee(concurrency(1.0, 4096.0), knee);
            assert_eq!(answer.max, Some(knee), "knee {knee}: probes {probes:?}");
            assert_eq!(answer.min_failing, Some(knee + 1.0), "knee {knee}");
            assert!(probes.len() <= 12, "knee {knee}: {probes:?}");
        }
        // Above, the bracket holds the knee and is within the precision.
        for knee in [20.0, 100.0, 1000.0, 4095.0] {
            let (answer, probes) = against_knee(concurrency(1.0, 4096.0), knee);
            let (max, fail) = (
                answer.max.expect("passes"),
                answer.min_failing.expect("fails"),
            );
            assert!(max <= knee && fail > knee, "knee {knee}: {max} {fail}");
            assert!((fail - max) / max <= 0.05, "knee {knee}: {max} {fail}");
            assert!(probes.len() <= 24, "knee {knee}: {probes:?}");
        }
        let (_, probes) = against_knee(concurrency(1.0, 4096.0), 16.0);
        // The failure the answer rests on is run twice.
        assert_eq!(
            probes,
            [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 24.0, 20.0, 18.0, 17.0, 17.0]
        );
        let (answer, probes) = against_knee(concurrency(1.0, 4096.0), 4.0);
        assert_eq!(probes, [1.0, 2.0, 4.0, 8.0, 6.0, 5.0, 5.0]);
        assert_eq!(answer.stopped, "neighbours: 4 holds and 5 fails");
    }

    #[test]
    fn a_real_knee_is_bracketed_within_the_precision() {
        let find_max = FindMax {
            dimension: Dimension::Speed,
            low: 0.1,
            high: 1000.0,
            precision_pct: 5.0,
            start: 1.0,
        };
        for knee in [0.1, 0.37, 1.0, 2.5, 77.0, 999.0] {
            let (answer, probes) = against_knee(find_max, knee);
            let (max, fail) = (
                answer.max.expect("passes"),
                answer.min_failing.expect("fails"),
            );
            assert!(max <= knee && fail > knee, "knee {knee}: {max} {fail}");
            assert!((fail - max) / max <= 0.05, "knee {knee}: {max} {fail}");
            assert!(probes.len() <= 24, "{probes:?}");
        }
    }

    #[test]
    fn the_ends_of_the_range() {
        let (answer, probes) = against_knee(concurrency(4.0, 64.0), 0.0);
        assert_eq!((answer.max, answer.min_failing), (None, Some(4.0)));
        assert_eq!(probes, [4.0, 4.0]);
        assert!(answer.stopped.contains("lowest load"), "{}", answer.stopped);
        let (answer, probes) = against_knee(concurrency(4.0, 50.0), 1e9);
        assert_eq!((answer.max, answer.min_failing), (Some(50.0), None));
        assert_eq!(probes, [4.0, 8.0, 16.0, 32.0, 50.0]);
        assert!(
            answer.stopped.contains("top of the range"),
            "{}",
            answer.stopped
        );
    }

    #[test]
    fn a_probe_near_a_limit_is_decided_by_the_majority() {
        let mut search = Search::new(concurrency(1.0, 8.0));
        // 1 passes near the limit; its confirmation fails; the third run passes: 2 of 3.
        assert_eq!(search.record(run(true, true)).decision, None);
        assert_eq!(search.attempt(), 2);
        assert_eq!(search.repeat(), Some(Repeat::NearLimit));
        assert_eq!(search.next(), Step::Probe(1.0));
        assert_eq!(search.record(run(false, false)).decision, None);
        let third = search.record(run(true, false));
        assert_eq!((third.decision, third.runs), (Some(true), 3));
        assert_eq!(search.next(), Step::Probe(2.0));
        // 2 fails near the limit, and again: decided failing after two runs, confirmed.
        assert_eq!(search.record(run(false, true)).decision, None);
        assert_eq!(search.record(run(false, true)).decision, Some(false));
        assert_eq!(search.next(), Step::Done);
        assert_eq!(search.answer().max, Some(1.0));
        // Far from every limit, one run decides.
        let mut search = Search::new(concurrency(1.0, 8.0));
        assert_eq!(search.record(run(true, false)).decision, Some(true));
        assert_eq!(search.next(), Step::Probe(2.0));
    }

    /// Issue 32: one stall far from the limit failed ×2 on a server that holds ×8.3. The
    /// answer rests on that failure, so it runs again before the search stops; two passes
    /// overturn it and the search climbs on to the real knee.
    #[test]
    fn a_lone_false_failure_is_overturned_by_its_confirmation() {
        let find_max = FindMax {
            dimension: Dimension::Speed,
            low: 0.1,
            high: 1000.0,
            precision_pct: 5.0,
            start: 1.0,
        };
        let (answer, probes) = against(find_max, |value, n| {
            // The second probe (×2) stalls; every other run sees the server as it is.
            n != 1 && value <= 8.3
        });
        assert_eq!(&probes[..3], [1.0, 2.0, 1.5]);
        let (max, fail) = (answer.max.expect("max"), answer.min_failing.expect("fail"));
        assert!(max <= 8.3 && fail > 8.3, "{max} {fail}: {probes:?}");
        assert!((fail - max) / max <= 0.05, "{max} {fail}");
        assert!(probes.len() <= 24, "{probes:?}");
    }

    /// A failure the workers flag as their own stall decides nothing: the load runs again.
    #[test]
    fn a_failure_under_a_client_stall_runs_again() {
        let mut search = Search::new(concurrency(1.0, 8.0));
        let stalled = search.record(RunResult {
            passed: false,
            near_limit: false,
            client_stall: true,
        });
        assert_eq!((stalled.decision, stalled.runs), (None, 0));
        assert_eq!(search.repeat(), Some(Repeat::ClientStall));
        assert_eq!((search.next(), search.attempt()), (Step::Probe(1.0), 2));
        let quiet = search.record(run(true, false));
        assert_eq!((quiet.decision, quiet.runs), (Some(true), 1));
        assert_eq!(search.next(), Step::Probe(2.0));
        // A load that stalls on every try is decided by its last run.
        let mut search = Search::new(concurrency(1.0, 8.0));
        let stall = RunResult {
            passed: false,
            near_limit: false,
            client_stall: true,
        };
        assert_eq!(search.record(stall).decision, None);
        assert_eq!(search.record(stall).decision, None);
        assert_eq!(search.record(stall).decision, Some(false));
    }

    /// A speed search starts at ×1 (today's traffic) and halves only when ×1 fails.
    #[test]
    fn speed_starts_at_today_and_goes_down_only_when_it_fails() {
        let find_max = FindMax::from_options(Some("speed"), None, None)
            .expect("valid")
            .expect("asked");
        assert_eq!(find_max.start, 1.0);
        let (answer, probes) = against_knee(find_max, 0.3);
        assert_eq!(&probes[..3], [1.0, 0.5, 0.25]);
        let (max, fail) = (answer.max.expect("max"), answer.min_failing.expect("fail"));
        assert!(max <= 0.3 && fail > 0.3 && (fail - max) / max <= 0.05);
        let (_, probes) = against_knee(find_max, 3.0);
        assert_eq!(&probes[..3], [1.0, 2.0, 4.0]);
        // --concurrency N with --find-max concurrency is the first load.
        let start = concurrency(1.0, 64.0).starting_at(8.0).expect("in range");
        let (answer, probes) = against_knee(start, 5.0);
        assert_eq!(probes, [8.0, 4.0, 6.0, 5.0, 6.0]);
        assert_eq!(answer.max, Some(5.0));
        assert!(concurrency(1.0, 64.0).starting_at(100.0).is_err());
    }

    #[test]
    fn options_are_checked() {
        let parsed = FindMax::from_options(Some("rate"), Some("0.5:200"), Some("2%"))
            .expect("valid")
            .expect("asked");
        assert_eq!(
            (parsed.low, parsed.high, parsed.precision_pct),
            (0.5, 200.0, 2.0)
        );
        let defaults = FindMax::from_options(Some("concurrency"), None, None)
            .expect("valid")
            .expect("asked");
        assert_eq!(
            (defaults.low, defaults.high, defaults.precision_pct),
            (1.0, 4096.0, 5.0)
        );
        for (dimension, range, precision, says) in [
            (None, Some("1:4"), None, "needs --find-max"),
            (
                Some("tokens"),
                None,
                None,
                "expected concurrency, rate or speed",
            ),
            (Some("concurrency"), Some("4"), None, "LOW:HIGH"),
            (Some("concurrency"), Some("8:4"), None, "below HIGH"),
            (Some("concurrency"), Some("1.5:4"), None, "whole number"),
            (Some("concurrency"), Some("0:4"), None, "above zero"),
            (Some("speed"), Some("1:5000"), None, "from 0.1 to 1000"),
            (Some("rate"), None, Some("0%"), "between 0.1% and 100%"),
            (Some("rate"), None, Some("five"), "percentage"),
        ] {
            let error = FindMax::from_options(dimension, range, precision)
                .expect_err(says)
                .to_string();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn near_means_within_a_tenth_of_the_threshold() {
        let goal = |value: f64, op: Op| GoalResult {
            expr: "llm.ttft-p95 > 60".into(),
            metric: "llm.ttft-p95".into(),
            op,
            value: Some(value),
            threshold: 60.0,
            failed: value > 60.0,
            note: None,
        };
        assert!(near_limit(&[goal(55.0, Op::Gt)]));
        assert!(near_limit(&[goal(65.9, Op::Gt)]));
        assert!(!near_limit(&[goal(53.0, Op::Gt)]));
        assert!(!near_limit(&[goal(135.0, Op::Gt)]));
        assert!(!near_limit(&[goal(60.0, Op::Eq)]));
        // A good share of 100 % against `good-share < 95` is as far as it can be.
        let share = |value: f64| GoalResult {
            expr: "llm.good-share < 95".into(),
            metric: "llm.good-share".into(),
            op: Op::Lt,
            value: Some(value),
            threshold: 95.0,
            failed: value < 95.0,
            note: None,
        };
        assert!(!near_limit(&[share(100.0)]));
        assert!(near_limit(&[share(99.0)]));
    }
}
