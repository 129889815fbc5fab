//! How many requests a probe needs before its goals' percentiles mean anything, and how
//! long a probe runs to get them (issue 32, item 3).
//!
//! The rule: a goal on the pX of a distribution needs at least [`TAIL_REQUESTS`] requests
//! beyond its percentile, ⌈2 / (1 − X/100)⌉ requests in all (p50: 4, p90: 20, p95: 40, p99:
//! 200), so that no single request — one machine stall, one slow answer — is the
//! percentile. The most demanding percentile goal sets the probe's need.
//!
//! The budget (`--duration`, or the whole recording) is each probe's minimum: a probe that
//! would get fewer requests than it needs runs longer, up to [`MAX_EXTENSION`] × its budget.
//! A `--requests N` budget is the user's own count and is never changed. Where the rate of
//! requests at a load is known before the probe (a rate probe; a speed probe, from the
//! recording's own rate; a concurrency probe, from the probe below it), the probe is sized
//! up front; otherwise a probe that came up short runs once more, sized from what it
//! measured, and the short run decides nothing. Whatever the probe got, the report says when
//! a verdict rests on fewer requests than its goal needs.

use std::time::Duration;

use common::metrics::Metric;

use super::Dimension;
use crate::goals::{Goal, Quantity, Stat};

/// Requests beyond a goal's percentile that a verdict needs: with two, one request alone
/// cannot be the percentile.
pub const TAIL_REQUESTS: f64 = 2.0;

/// A probe runs at most this many times its budget to reach the requests it needs.
pub const MAX_EXTENSION: f64 = 10.0;

/// A probe sized from an estimated rate asks for this much more than the estimate says (the
/// steady window leaves the first requests out; a rate estimate is never exact).
const MARGIN: f64 = 1.25;

/// What a search's goals need of each probe: the distribution of the most demanding
/// percentile goal, and its requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    /// The goal's metric as the report names it (`llm.ttft-p95`).
    pub goal: String,
    /// The distribution whose samples count.
    pub metric: Metric,
    /// Requests the percentile needs.
    pub requests: u64,
}

/// Requests a percentile needs: at least [`TAIL_REQUESTS`] beyond it (p95: 40, p99: 200,
/// p90: 20, p50: 4).
pub fn requests_for_percentile(percentile: f64) -> u64 {
    // In percent, and shaved by a part in 10⁹ before rounding up: 1 − 0.9 is not 0.1 in
    // binary, and p90 would need 21.
    let exact = TAIL_REQUESTS * 100.0 / (100.0 - percentile);
    (exact * (1.0 - 1e-9)).ceil() as u64
}

/// The need of the most demanding percentile goal (`None`: no goal reads a percentile of
/// a distribution the probe measures).
pub fn need_of(goals: &[Goal]) -> Option<Need> {
    goals
        .iter()
        .filter_map(|goal| {
            let Quantity::Stat { metric, stat } = goal.metric.quantity else {
                return None;
            };
            let percentile = match stat {
                Stat::P50 => 50.0,
                Stat::P90 => 90.0,
                Stat::P95 => 95.0,
                Stat::P99 => 99.0,
                Stat::Avg | Stat::Min | Stat::Max => return None,
            };
            Some(Need {
                goal: goal.expr.clone(),
                metric,
                requests: requests_for_percentile(percentile),
            })
        })
        .max_by_key(|need| need.requests)
}

/// What bounds each probe of the search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ProbeBudget {
    /// `--requests N`: the user's count, never changed.
    Requests(u64),
    /// `--duration D`: at least D, longer when the goals need more requests.
    Duration(Duration),
    /// The whole recording once: looped when it holds fewer exchanges than the goals need.
    Recording { exchanges: u64 },
}

/// How one probe is sized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ProbeSize {
    /// The budget as given.
    AsGiven,
    /// Run this long (a `--duration` budget extended).
    Duration(Duration),
    /// Send this many exchanges (the recording looped).
    Requests(u64),
}

impl ProbeBudget {
    /// How to size a probe expected to judge `rate` requests a second (`None`: unknown)
    /// so that it gets `need` requests.
    pub fn size(self, need: u64, rate: Option<f64>) -> ProbeSize {
        match self {
            ProbeBudget::Requests(_) => ProbeSize::AsGiven,
            ProbeBudget::Recording { exchanges } => {
                if exchanges >= need {
                    ProbeSize::AsGiven
                } else {
                    let most = (exchanges as f64 * MAX_EXTENSION) as u64;
                    ProbeSize::Requests(need.min(most.max(exchanges)))
                }
            }
            ProbeBudget::Duration(budget) => {
                let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) else {
                    return ProbeSize::AsGiven;
                };
                let wanted = need as f64 * MARGIN / rate;
                if wanted <= budget.as_secs_f64() {
                    return ProbeSize::AsGiven;
                }
                let most = budget.as_secs_f64() * MAX_EXTENSION;
                ProbeSize::Duration(Duration::from_secs_f64(wanted.min(most)))
            }
        }
    }

    /// After a probe of `ran` that judged `judged` requests (fewer than `need`): how long
    /// a second run takes to get them, or `None` when the budget cannot grow (a `--requests`
    /// count, a recording already looped, a probe already at its ceiling).
    pub fn rerun(self, need: u64, judged: u64, ran: Duration) -> Option<ProbeSize> {
        let ProbeBudget::Duration(budget) = self else {
            return None;
        };
        let most = budget.as_secs_f64() * MAX_EXTENSION;
        if ran.as_secs_f64() >= most * 0.95 {
            return None;
        }
        // Nothing judged: the rate is unknown, so the ceiling it is.
        let rate = judged as f64 / ran.as_secs_f64().max(1e-3);
        match self.size(need, Some(rate).filter(|r| *r > 0.0)) {
            ProbeSize::AsGiven if judged == 0 => {
                Some(ProbeSize::Duration(Duration::from_secs_f64(most)))
            }
            ProbeSize::AsGiven => None,
            size => Some(size),
        }
    }
}

/// Sizes each probe of a search from what the probes before it measured.
#[derive(Debug, Clone)]
pub struct Sizer {
    budget: ProbeBudget,
    need: Option<Need>,
    dimension: Dimension,
    /// The recording's own arrivals per second at ×1.
    recording_rate: Option<f64>,
    /// The last probe that judged anything: its load and judged requests per second.
    last: Option<(f64, f64)>,
}

impl Sizer {
    pub fn new(
        budget: ProbeBudget,
        need: Option<Need>,
        dimension: Dimension,
        recording_rate: Option<f64>,
    ) -> Sizer {
        Sizer {
            budget,
            need,
            dimension,
            recording_rate,
            last: None,
        }
    }

    /// What the goals need of each probe (`None`: no percentile goal).
    pub fn need(&self) -> Option<&Need> {
        self.need.as_ref()
    }

    /// Judged requests per second expected at `value`: the rate itself, the recording's
    /// rate × the speed, or (concurrency) the last probe's rate scaled by the load.
    fn rate_at(&self, value: f64) -> Option<f64> {
        match self.dimension {
            Dimension::Rate => Some(value),
            Dimension::Speed => self.recording_rate.map(|rate| rate * value),
            Dimension::Concurrency => self.last.map(|(load, rate)| rate * value / load),
        }
    }

    /// How to size the first run at `value`.
    pub fn size(&self, value: f64) -> ProbeSize {
        match &self.need {
            Some(need) => self.budget.size(need.requests, self.rate_at(value)),
            None => ProbeSize::AsGiven,
        }
    }

    /// A probe at `value` judged `judged` requests in `ran`.
    pub fn measured(&mut self, value: f64, judged: u64, ran: Duration) {
        if judged > 0 && ran > Duration::ZERO && value > 0.0 {
            self.last = Some((value, judged as f64 / ran.as_secs_f64()));
        }
    }

    /// How to run again a probe that judged only `judged` requests in `ran` (`None`: the
    /// budget cannot grow).
    pub fn rerun(&self, judged: u64, ran: Duration) -> Option<ProbeSize> {
        let need = self.need.as_ref()?;
        self.budget.rerun(need.requests, judged, ran)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goals::parse_goals;

    #[test]
    fn a_percentile_needs_two_requests_beyond_it() {
        assert_eq!(requests_for_percentile(95.0), 40);
        assert_eq!(requests_for_percentile(99.0), 200);
        assert_eq!(requests_for_percentile(90.0), 20);
        assert_eq!(requests_for_percentile(50.0), 4);
        let goals = parse_goals(&[
            "llm.ttft-p95 > 60".to_owned(),
            "llm.latency-p99 > 900".to_owned(),
            "llm.ttft-max > 5000".to_owned(),
        ])
        .expect("goals");
        let need = need_of(&goals).expect("a percentile goal");
        assert_eq!((need.metric, need.requests), (Metric::Latency, 200));
        let goals = parse_goals(&["llm.error-rate > 1".to_owned()]).expect("goals");
        assert_eq!(need_of(&goals), None);
    }

    #[test]
    fn a_duration_grows_to_the_need_within_its_ceiling() {
        let budget = ProbeBudget::Duration(Duration::from_secs(2));
        // 12/s for 2 s is 24 requests: 40 × 1.25 / 12 = 4.17 s.
        assert_eq!(
            budget.size(40, Some(12.0)),
            ProbeSize::Duration(Duration::from_secs_f64(40.0 * 1.25 / 12.0))
        );
        assert_eq!(budget.size(40, Some(100.0)), ProbeSize::AsGiven);
        assert_eq!(budget.size(40, None), ProbeSize::AsGiven);
        // 0.5/s would take 100 s: at most 10 × 2 s.
        assert_eq!(
            budget.size(40, Some(0.5)),
            ProbeSize::Duration(Duration::from_secs(20))
        );
        // A short run is sized again from what it measured.
        assert_eq!(
            budget.rerun(40, 8, Duration::from_secs(2)),
            Some(ProbeSize::Duration(Duration::from_secs_f64(12.5)))
        );
        assert_eq!(budget.rerun(40, 8, Duration::from_secs(20)), None);
        assert_eq!(
            budget.rerun(40, 0, Duration::from_secs(2)),
            Some(ProbeSize::Duration(Duration::from_secs(20)))
        );
    }

    #[test]
    fn counts_are_the_users_and_a_short_recording_loops() {
        assert_eq!(
            ProbeBudget::Requests(6).size(40, Some(1.0)),
            ProbeSize::AsGiven
        );
        assert_eq!(
            ProbeBudget::Requests(6).rerun(40, 6, Duration::from_secs(1)),
            None
        );
        let recording = ProbeBudget::Recording { exchanges: 25 };
        assert_eq!(recording.size(40, None), ProbeSize::Requests(40));
        assert_eq!(recording.size(20, None), ProbeSize::AsGiven);
        let tiny = ProbeBudget::Recording { exchanges: 3 };
        assert_eq!(tiny.size(200, None), ProbeSize::Requests(30));
    }
}
