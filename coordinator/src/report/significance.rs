//! Is a baseline change more than noise? A bootstrap confidence interval of the percent
//! change of one statistic, computed from the two distributions.
//!
//! Method: a percentile bootstrap with [`REPLICATES`] replicates and a fixed seed, so a report
//! renders the same interval every time. Each side is a [`Distribution`] (the HDR histogram's
//! recorded values with their counts, or a saved report's `cdf` with its count). Resampling
//! never expands values:
//! - an order statistic (min, max, p50 … p99, rank `k` of `n`) of a resample of `n` values is
//!   the empirical quantile function at `U(k)`, the `k`-th smallest of `n` uniforms, which is
//!   `Beta(k, n − k + 1)`: one Beta draw and one binary search on the cumulative counts;
//! - the mean of a resample is the mean of `n` draws from the cumulative counts when `n` is at
//!   most [`DIRECT_MEAN_LIMIT`], else normal with the distribution's standard error.
//!
//! The interval is the 2.5 and 97.5 percentiles of `100 · (r* − b*) / b*`; it is
//! `significant` when it excludes 0.

use common::metrics::Metric;

use crate::goals::Stat;

/// Bootstrap replicates per change.
pub const REPLICATES: usize = 1_000;

/// Resamples of at most this many values compute their mean from real draws.
pub const DIRECT_MEAN_LIMIT: u64 = 200;

/// The seed of every bootstrap, so reports are deterministic.
const SEED: u64 = 0x6c6c_6d2d_7265_706c;

/// The confidence interval of a percent change, in percent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// 2.5th percentile of the bootstrap percent changes.
    pub low_pct: f64,
    /// 97.5th percentile of the bootstrap percent changes.
    pub high_pct: f64,
}

impl Interval {
    /// True when the interval excludes 0.
    pub fn significant(&self) -> bool {
        self.low_pct > 0.0 || self.high_pct < 0.0
    }
}

/// One side's sample as distinct values (display units, ascending) with cumulative counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    values: Vec<f64>,
    /// `cumulative[i]` = number of samples ≤ `values[i]`; strictly increasing.
    cumulative: Vec<u64>,
    /// Mean and standard deviation, computed once: every replicate of a mean needs them.
    mean: f64,
    std: f64,
}

impl Distribution {
    /// `(value, count)` pairs in any order; zero counts are dropped. `None` when empty.
    pub fn from_counts(pairs: impl IntoIterator<Item = (f64, u64)>) -> Option<Distribution> {
        let mut pairs: Vec<(f64, u64)> = pairs
            .into_iter()
            .filter(|&(value, count)| count > 0 && value.is_finite())
            .collect();
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut values = Vec::with_capacity(pairs.len());
        let mut cumulative = Vec::with_capacity(pairs.len());
        let mut total = 0u64;
        for (value, count) in pairs {
            total += count;
            values.push(value);
            cumulative.push(total);
        }
        if total == 0 {
            return None;
        }
        let mut distribution = Distribution {
            values,
            cumulative,
            mean: 0.0,
            std: 0.0,
        };
        (distribution.mean, distribution.std) = distribution.mean_and_std();
        Some(distribution)
    }

    /// The recorded values of `metric`'s HDR histogram with their counts, in display units.
    pub fn from_histogram(
        histogram: &hdrhistogram::Histogram<u64>,
        metric: Metric,
    ) -> Option<Self> {
        let scale = metric.unit().scale();
        Distribution::from_counts(histogram.iter_recorded().map(|v| {
            (
                histogram.highest_equivalent(v.value_iterated_to()) as f64 / scale,
                v.count_at_value(),
            )
        }))
    }

    /// A saved report's `cdf` (`[value, percent]` pairs) of `count` samples: each point stands
    /// for the samples between the previous percent and its own. An approximation at the
    /// resolution of the cdf; `None` when there is nothing to resample.
    pub fn from_cdf(cdf: &[[f64; 2]], count: u64) -> Option<Distribution> {
        if cdf.is_empty() || count == 0 {
            return None;
        }
        let mut previous_rank = 0u64;
        let mut pairs = Vec::with_capacity(cdf.len());
        for &[value, pct] in cdf {
            let rank = ((pct / 100.0 * count as f64).ceil() as u64).clamp(1, count);
            if rank > previous_rank {
                pairs.push((value, rank - previous_rank));
                previous_rank = rank;
            }
        }
        if previous_rank < count {
            let last = cdf[cdf.len() - 1][0];
            pairs.push((last, count - previous_rank));
        }
        Distribution::from_counts(pairs)
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    /// The value of rank `rank` (1-based, clamped to `1..=count`).
    fn at_rank(&self, rank: u64) -> f64 {
        let rank = rank.clamp(1, self.count());
        let index = self.cumulative.partition_point(|&c| c < rank);
        self.values[index.min(self.values.len() - 1)]
    }

    /// The empirical quantile function at `u` in `[0, 1]`.
    fn quantile(&self, u: f64) -> f64 {
        self.at_rank((u * self.count() as f64).ceil() as u64)
    }

    fn mean_and_std(&self) -> (f64, f64) {
        let n = self.count() as f64;
        let mut previous = 0u64;
        let (mut sum, mut sum_sq) = (0.0, 0.0);
        for (&value, &cum) in self.values.iter().zip(&self.cumulative) {
            let count = (cum - previous) as f64;
            previous = cum;
            sum += value * count;
            sum_sq += value * value * count;
        }
        let mean = sum / n;
        (mean, (sum_sq / n - mean * mean).max(0.0).sqrt())
    }

    /// The rank (1-based) of `stat` among `count` samples, as HDR's `value_at_quantile`
    /// picks it; `None` for the mean.
    fn rank_of(&self, stat: Stat) -> Option<u64> {
        let n = self.count();
        let quantile = match stat {
            Stat::Avg => return None,
            Stat::Min => return Some(1),
            Stat::Max => return Some(n),
            Stat::P50 => 0.50,
            Stat::P90 => 0.90,
            Stat::P95 => 0.95,
            Stat::P99 => 0.99,
        };
        Some(((quantile * n as f64).ceil() as u64).clamp(1, n))
    }

    /// `stat` of the distribution itself.
    fn statistic(&self, stat: Stat) -> f64 {
        match self.rank_of(stat) {
            Some(rank) => self.at_rank(rank),
            None => self.mean,
        }
    }

    /// `stat` of one bootstrap resample.
    fn resampled(&self, stat: Stat, rng: &mut SplitMix) -> f64 {
        let n = self.count();
        match self.rank_of(stat) {
            Some(rank) => {
                let u = rng.beta(rank as f64, (n - rank + 1) as f64);
                self.quantile(u)
            }
            None if n <= DIRECT_MEAN_LIMIT => {
                let sum: f64 = (0..n).map(|_| self.quantile(rng.uniform())).sum();
                sum / n as f64
            }
            None => self.mean + self.std / (n as f64).sqrt() * rng.normal(),
        }
    }
}

/// The bootstrap interval of the percent change of `stat` from `baseline` to `replayed`.
/// `None` when the baseline's statistic is 0 in some replicates' place (no percent change).
pub fn change_interval(
    baseline: &Distribution,
    replayed: &Distribution,
    stat: Stat,
) -> Option<Interval> {
    let mut rng = SplitMix(SEED);
    let mut changes = Vec::with_capacity(REPLICATES);
    for _ in 0..REPLICATES {
        let b = baseline.resampled(stat, &mut rng);
        let r = replayed.resampled(stat, &mut rng);
        if b == 0.0 {
            if r == 0.0 {
                changes.push(0.0);
                continue;
            }
            return None;
        }
        changes.push((r - b) / b * 100.0);
    }
    changes.sort_by(f64::total_cmp);
    let pick =
        |q: f64| changes[((q * (REPLICATES - 1) as f64).round() as usize).min(REPLICATES - 1)];
    Some(Interval {
        low_pct: pick(0.025),
        high_pct: pick(0.975),
    })
}

/// A point estimate of `stat` of `distribution` (for tests and the cdf approximation check).
pub fn statistic(distribution: &Distribution, stat: Stat) -> f64 {
    distribution.statistic(stat)
}

/// SplitMix64 with the samplers the bootstrap needs; no crate, so the sequence (and every
/// report's intervals) never changes with a dependency update.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1)`.
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Gamma(shape, 1) by Marsaglia–Tsang (shape ≥ 1 here: Beta parameters are ranks).
    fn gamma(&mut self, shape: f64) -> f64 {
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// Beta(a, b) as X / (X + Y) with X ~ Gamma(a), Y ~ Gamma(b).
    fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        x / (x + y)
    }
}
