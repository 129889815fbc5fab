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

/// What `--find-max` varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    /// Closed-loop concurrency (in-flight requests across every worker).
    Concurrency,
    /// Open-loop arrival rate, requests per second across every worker.
    Rate,
    /// The recording's own schedule, compressed ×S.
    Speed,
}

impl Dimension {
    /// The name `--find-max` takes and the report shows.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Concurrency => "concurrency",
            Dimension::Rate => "rate",
            Dimension::Speed => "speed",
        }
    }

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
}

impl FindMax {
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
        let margin = NEAR_LIMIT_FRACTION * goal.threshold.abs();
        (value - goal.threshold).abs() <= margin
    })
}

/// The search's next step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Replay at this load.
    Probe(f64),
    /// The search is over: read [`Search::answer`].
    Done,
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

/// The search's state: what was decided, and the load under test.
#[derive(Debug, Clone)]
pub struct Search {
    find_max: FindMax,
    best_pass: Option<f64>,
    lowest_fail: Option<f64>,
    ramping: bool,
    /// The load under test and its runs so far (passed?).
    current: f64,
    runs: Vec<bool>,
    /// The first run at the current load was near a goal's limit.
    near: bool,
    probes: usize,
    stopped: Option<String>,
}

impl Search {
    /// A search over `find_max`'s range, starting at LOW.
    pub fn new(find_max: FindMax) -> Search {
        Search {
            find_max,
            best_pass: None,
            lowest_fail: None,
            ramping: true,
            current: find_max.low,
            runs: Vec::new(),
            near: false,
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

    /// Which run of its load the next probe is (1-based).
    pub fn attempt(&self) -> u32 {
        self.runs.len() as u32 + 1
    }

    /// Take one probe's result at the current load. Returns the load's decision once its
    /// runs decide it (`None` while a confirmation is still to run).
    pub fn record(&mut self, passed: bool, near_limit: bool) -> Option<bool> {
        self.probes += 1;
        if self.runs.is_empty() {
            self.near = near_limit;
        }
        self.runs.push(passed);
        let decision = self.decision();
        match decision {
            Some(passed) => {
                self.runs.clear();
                self.near = false;
                self.decide(passed);
            }
            None if self.probes >= MAX_PROBES => {
                self.stopped = Some(format!("stopped after {MAX_PROBES} probes"));
            }
            None => {}
        }
        decision
    }

    /// The current load's decision from its runs: one run far from every limit decides;
    /// near a limit, two agreeing runs of up to three do.
    fn decision(&self) -> Option<bool> {
        let passes = self.runs.iter().filter(|p| **p).count();
        let fails = self.runs.len() - passes;
        if !self.near {
            return self.runs.first().copied();
        }
        let needed = MAX_RUNS_PER_LOAD / 2 + 1;
        if passes >= needed {
            Some(true)
        } else if fails >= needed {
            Some(false)
        } else {
            None
        }
    }

    fn decide(&mut self, passed: bool) {
        let FindMax {
            dimension,
            low,
            high,
            precision_pct,
        } = self.find_max;
        let value = self.current;
        if passed {
            self.best_pass = Some(self.best_pass.map_or(value, |b| b.max(value)));
        } else {
            self.lowest_fail = Some(self.lowest_fail.map_or(value, |f| f.min(value)));
            self.ramping = false;
        }
        let next = match (self.best_pass, self.lowest_fail) {
            (None, Some(_)) => {
                self.stopped = Some(format!(
                    "even the lowest load, {}, fails a goal",
                    dimension.show(low)
                ));
                return;
            }
            (Some(best), None) => {
                if best >= high {
                    self.stopped = Some(format!(
                        "the top of the range, {}, holds every goal",
                        dimension.show(high)
                    ));
                    return;
                }
                let doubled = if dimension.integer() {
                    (best * 2.0).max(best + 1.0)
                } else {
                    best * 2.0
                };
                doubled.min(high)
            }
            (Some(best), Some(fail)) => {
                let close = (fail - best) / best * 100.0 <= precision_pct
                    || (dimension.integer() && fail - best <= 1.0);
                if close {
                    self.stopped = Some(format!(
                        "the highest passing and the lowest failing load are within {}%",
                        trim_number(precision_pct)
                    ));
                    return;
                }
                let middle = (best + fail) / 2.0;
                if dimension.integer() {
                    middle.floor()
                } else {
                    middle
                }
            }
            (None, None) => unreachable!("a decision was just recorded"),
        };
        if self.probes >= MAX_PROBES {
            self.stopped = Some(format!("stopped after {MAX_PROBES} probes"));
            return;
        }
        self.current = next;
    }

    /// The answer so far (final once [`Search::next`] is [`Step::Done`]).
    pub fn answer(&self) -> Answer {
        Answer {
            max: self.best_pass,
            min_failing: self.lowest_fail,
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
        }
    }

    /// Run a search against a deterministic knee: loads ≤ `knee` pass. Returns the probes.
    fn against_knee(find_max: FindMax, knee: f64) -> (Answer, Vec<f64>) {
        let mut search = Search::new(find_max);
        let mut probes = Vec::new();
        while let Step::Probe(value) = search.next() {
            probes.push(value);
            search.record(value <= knee, false);
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
        assert_eq!(
            probes,
            [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 24.0, 20.0, 18.0, 17.0]
        );
        let (_, probes) = against_knee(concurrency(1.0, 4096.0), 4.0);
        assert_eq!(probes, [1.0, 2.0, 4.0, 8.0, 6.0, 5.0]);
    }

    #[test]
    fn a_real_knee_is_bracketed_within_the_precision() {
        let find_max = FindMax {
            dimension: Dimension::Speed,
            low: 0.1,
            high: 1000.0,
            precision_pct: 5.0,
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
        assert_eq!(probes, [4.0]);
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
        assert_eq!(search.record(true, true), None);
        assert_eq!(search.attempt(), 2);
        assert_eq!(search.next(), Step::Probe(1.0));
        assert_eq!(search.record(false, false), None);
        assert_eq!(search.record(true, false), Some(true));
        assert_eq!(search.next(), Step::Probe(2.0));
        // 2 fails near the limit, and again: decided failing after two runs.
        assert_eq!(search.record(false, true), None);
        assert_eq!(search.record(false, true), Some(false));
        assert_eq!(search.next(), Step::Done);
        assert_eq!(search.answer().max, Some(1.0));
        // Far from every limit, one run decides.
        let mut search = Search::new(concurrency(1.0, 8.0));
        assert_eq!(search.record(true, false), Some(true));
        assert_eq!(search.next(), Step::Probe(2.0));
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
    }
}
