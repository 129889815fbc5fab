//! Completions over time, for the steady-state window: succeeded requests and their output
//! tokens counted by completion instant in fixed-width buckets, plus the two instants that
//! bound the steady window on one worker (load at its target, last request sent).
//!
//! The steady window is only known once every worker has finished (it starts when the last
//! worker reached its target and ends when the last request of the run went out), so each
//! worker keeps counts fine enough to cut at any instant later: buckets start 10 ms wide and
//! double (pairs merged) whenever the run outgrows [`MAX_BUCKETS`], so a report stays small
//! and the cut error stays below one bucket in 4,096 of the run.

/// Initial bucket width, microseconds.
pub const INITIAL_BUCKET_US: u64 = 10_000;

/// Most buckets kept; past it, the width doubles.
pub const MAX_BUCKETS: usize = 8192;

/// Widest bucket accepted from a peer (one day).
pub const MAX_BUCKET_US: u64 = 86_400_000_000;

/// One worker's completions over time (wall clock, Unix microseconds of its own clock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompletionTimeline {
    /// Start of the first bucket; meaningless while there are no buckets.
    pub origin_unix_us: u64,
    /// Width of every bucket.
    pub bucket_us: u64,
    /// Succeeded requests completed in each bucket.
    pub completions: Vec<u64>,
    /// Their output tokens, same buckets.
    pub output_tokens: Vec<u64>,
    /// When the worker's load reached its target (Unix µs), when it did.
    pub target_reached_unix_us: Option<u64>,
    /// When the worker sent its last request so far (Unix µs).
    pub last_issued_unix_us: Option<u64>,
}

/// A timeline from a peer that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimelineError {
    #[error("timeline: {completions} completion buckets but {tokens} token buckets")]
    Lengths { completions: usize, tokens: usize },
    #[error("timeline: {0} buckets, more than the limit of {MAX_BUCKETS}")]
    TooLong(usize),
    #[error("timeline: bucket width {0} µs is out of range")]
    Width(u64),
}

impl CompletionTimeline {
    /// Count one succeeded request that completed at `end_unix_us` with `output_tokens`.
    pub fn record(&mut self, end_unix_us: u64, output_tokens: u64) {
        if self.completions.is_empty() {
            if self.bucket_us == 0 {
                self.bucket_us = INITIAL_BUCKET_US;
            }
            self.origin_unix_us = end_unix_us - end_unix_us % self.bucket_us;
            self.completions.push(0);
            self.output_tokens.push(0);
        }
        // An earlier completion than any so far (tasks finish in any order): grow to the front.
        while end_unix_us < self.origin_unix_us {
            let missing = (self.origin_unix_us - end_unix_us).div_ceil(self.bucket_us) as usize;
            if self.completions.len() + missing > MAX_BUCKETS {
                self.coarsen();
                continue;
            }
            self.origin_unix_us -= missing as u64 * self.bucket_us;
            self.completions
                .splice(0..0, std::iter::repeat_n(0, missing));
            self.output_tokens
                .splice(0..0, std::iter::repeat_n(0, missing));
        }
        let mut index = ((end_unix_us - self.origin_unix_us) / self.bucket_us) as usize;
        while index >= MAX_BUCKETS {
            self.coarsen();
            index = ((end_unix_us - self.origin_unix_us) / self.bucket_us) as usize;
        }
        if index >= self.completions.len() {
            self.completions.resize(index + 1, 0);
            self.output_tokens.resize(index + 1, 0);
        }
        self.completions[index] += 1;
        self.output_tokens[index] += output_tokens;
    }

    /// Merge pairs of buckets: twice the width, half the buckets. The origin moves down to a
    /// multiple of the new width so that timelines of equal width stay aligned.
    fn coarsen(&mut self) {
        let width = self.bucket_us * 2;
        let shift = usize::from(!self.origin_unix_us.is_multiple_of(width));
        self.origin_unix_us -= self.origin_unix_us % width;
        let merge = |values: &[u64]| -> Vec<u64> {
            let mut out = vec![0; (values.len() + shift).div_ceil(2)];
            for (i, v) in values.iter().enumerate() {
                out[(i + shift) / 2] += v;
            }
            out
        };
        self.completions = merge(&self.completions);
        self.output_tokens = merge(&self.output_tokens);
        self.bucket_us = width;
    }

    /// Check a timeline that came from a peer.
    pub fn validate(&self) -> Result<(), TimelineError> {
        if self.completions.len() != self.output_tokens.len() {
            return Err(TimelineError::Lengths {
                completions: self.completions.len(),
                tokens: self.output_tokens.len(),
            });
        }
        if self.completions.len() > MAX_BUCKETS {
            return Err(TimelineError::TooLong(self.completions.len()));
        }
        if !self.completions.is_empty() && !(1..=MAX_BUCKET_US).contains(&self.bucket_us) {
            return Err(TimelineError::Width(self.bucket_us));
        }
        Ok(())
    }

    /// `(succeeded requests, output tokens)` completed between `from_unix_us` and
    /// `to_unix_us` (this timeline's clock), counting a bucket cut by either end in
    /// proportion to the part inside (completions spread evenly within a bucket).
    pub fn count_between(&self, from_unix_us: f64, to_unix_us: f64) -> (f64, f64) {
        let (mut requests, mut tokens) = (0.0, 0.0);
        if self.bucket_us == 0 || to_unix_us <= from_unix_us {
            return (0.0, 0.0);
        }
        let width = self.bucket_us as f64;
        for (i, (n, t)) in self.completions.iter().zip(&self.output_tokens).enumerate() {
            let start = self.origin_unix_us as f64 + i as f64 * width;
            let overlap = (start + width).min(to_unix_us) - start.max(from_unix_us);
            if overlap > 0.0 {
                let share = overlap / width;
                requests += *n as f64 * share;
                tokens += *t as f64 * share;
            }
        }
        (requests, tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_buckets_whatever_the_order() {
        let mut t = CompletionTimeline::default();
        t.record(1_000_055_000, 10);
        t.record(1_000_005_000, 3);
        t.record(1_000_015_000, 4);
        assert_eq!(t.bucket_us, INITIAL_BUCKET_US);
        assert_eq!(t.origin_unix_us, 1_000_000_000);
        assert_eq!(t.completions, vec![1, 1, 0, 0, 0, 1]);
        assert_eq!(t.output_tokens, vec![3, 4, 0, 0, 0, 10]);
        let (n, tokens) = t.count_between(1_000_000_000.0, 1_000_020_000.0);
        assert_eq!((n, tokens), (2.0, 7.0));
        // Half of the last bucket.
        let (n, _) = t.count_between(1_000_050_000.0, 1_000_055_000.0);
        assert!((n - 0.5).abs() < 1e-9, "{n}");
    }

    #[test]
    fn a_long_run_coarsens_and_keeps_every_count() {
        let mut t = CompletionTimeline::default();
        let mut total = 0;
        for i in 0..200_000u64 {
            t.record(5_000_000 + i * 997, i % 7);
            total += i % 7;
        }
        assert!(t.completions.len() <= MAX_BUCKETS);
        assert!(t.bucket_us > INITIAL_BUCKET_US);
        assert_eq!(t.completions.iter().sum::<u64>(), 200_000);
        assert_eq!(t.output_tokens.iter().sum::<u64>(), total);
        assert_eq!(t.origin_unix_us % t.bucket_us, 0);
        t.validate().expect("valid");
        let (n, _) = t.count_between(0.0, f64::MAX);
        assert_eq!(n, 200_000.0);
    }
}
