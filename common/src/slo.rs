//! Per-request service-level objectives (`--slo NAME:LIMIT`) and the test that makes a
//! request *good*: it succeeded and met every objective. Each worker judges its own
//! requests with [`Slos::is_good`] as they complete and counts them in
//! [`Counters::good`](crate::metrics::Counters::good), so the run's good count is exact
//! across workers (added, never estimated from merged histograms).

use std::fmt;
use std::time::Duration;

use crate::measure::{OutcomeKind, RequestOutcome};

/// What an objective limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SloKind {
    /// Time to first token ≤ limit.
    Ttft,
    /// Time to second token ≤ limit.
    Ttst,
    /// The request's inter-token latency, (latency − TTFT) / (output − 1), ≤ limit.
    Itl,
    /// Request latency (to the last content frame) ≤ limit.
    Latency,
    /// Output tokens per second per user, 1 / ITL, ≥ limit.
    TokensPerSecond,
}

impl SloKind {
    /// Every kind, in the order the help lists them.
    pub const ALL: [SloKind; 5] = [
        SloKind::Ttft,
        SloKind::Ttst,
        SloKind::Itl,
        SloKind::Latency,
        SloKind::TokensPerSecond,
    ];

    /// The name `--slo` takes.
    pub fn name(self) -> &'static str {
        match self {
            SloKind::Ttft => "ttft",
            SloKind::Ttst => "ttst",
            SloKind::Itl => "itl",
            SloKind::Latency => "latency",
            SloKind::TokensPerSecond => "tokens-per-second",
        }
    }

    fn from_name(name: &str) -> Option<SloKind> {
        SloKind::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

/// One objective: a time limit (µs) for the time kinds, a floor (tokens/s) for
/// [`SloKind::TokensPerSecond`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    pub kind: SloKind,
    /// Microseconds for the time kinds; tokens per second for `tokens-per-second`.
    pub limit: f64,
}

impl Slo {
    /// Parse `NAME:LIMIT`: `ttft:500ms`, `itl:40ms`, `latency:10s`, `tokens-per-second:20`.
    /// A time limit is a duration (a bare number is seconds, as every time flag); it must be
    /// above zero.
    pub fn parse(text: &str) -> Result<Slo, String> {
        let names = SloKind::ALL.map(SloKind::name).join(", ");
        let Some((name, limit)) = text.split_once(':') else {
            return Err(format!(
                "--slo {text:?}: expected NAME:LIMIT, e.g. ttft:500ms or tokens-per-second:20 (NAME one of {names})"
            ));
        };
        let (name, limit) = (name.trim(), limit.trim());
        let kind = SloKind::from_name(name)
            .ok_or_else(|| format!("--slo {text:?}: unknown name {name:?} (one of {names})"))?;
        let limit = match kind {
            SloKind::TokensPerSecond => {
                let value: f64 = limit.parse().map_err(|_| {
                    format!("--slo {text:?}: {limit:?} is not a number of tokens per second")
                })?;
                if !(value.is_finite() && value > 0.0) {
                    return Err(format!(
                        "--slo {text:?}: the floor must be a positive number of tokens per second"
                    ));
                }
                value
            }
            _ => {
                let duration = crate::duration::parse_duration(limit)
                    .map_err(|error| format!("--slo {text:?}: {error}"))?;
                if duration.is_zero() {
                    return Err(format!(
                        "--slo {text:?}: a zero limit can never be met; give a duration above zero"
                    ));
                }
                duration.as_secs_f64() * 1e6
            }
        };
        Ok(Slo { kind, limit })
    }

    /// The request's value for this objective, in the limit's unit; `None` when the request
    /// has none (a non-streamed answer has no TTFT; a one-token answer has no ITL).
    pub fn value(&self, outcome: &RequestOutcome) -> Option<f64> {
        let itl_us = || {
            let osl = outcome.output_tokens();
            match (outcome.ttft_us, outcome.latency_us) {
                (Some(ttft), Some(latency)) if osl >= 2 => {
                    Some(latency.saturating_sub(ttft) as f64 / (osl - 1) as f64)
                }
                _ => None,
            }
        };
        match self.kind {
            SloKind::Ttft => outcome.ttft_us.map(|v| v as f64),
            SloKind::Ttst => outcome.ttst_us.map(|v| v as f64),
            SloKind::Latency => outcome.latency_us.map(|v| v as f64),
            SloKind::Itl => itl_us(),
            SloKind::TokensPerSecond => itl_us().filter(|itl| *itl > 0.0).map(|itl| 1e6 / itl),
        }
    }

    /// Whether the request meets this objective (a missing value does not).
    pub fn met_by(&self, outcome: &RequestOutcome) -> bool {
        match (self.kind, self.value(outcome)) {
            (_, None) => false,
            (SloKind::TokensPerSecond, Some(rate)) => rate >= self.limit,
            (_, Some(value)) => value <= self.limit,
        }
    }
}

impl fmt::Display for Slo {
    /// `ttft:500ms`, `tokens-per-second:20`: the form `--slo` reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            SloKind::TokensPerSecond => write!(f, "{}:{}", self.kind.name(), self.limit),
            _ => {
                let ms = self.limit / 1000.0;
                if ms >= 1.0 && (ms - ms.round()).abs() < 1e-9 {
                    write!(f, "{}:{}ms", self.kind.name(), ms.round())
                } else {
                    write!(f, "{}:{}us", self.kind.name(), self.limit)
                }
            }
        }
    }
}

/// The run's objectives (empty: no SLOs, no goodput).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Slos(pub Vec<Slo>);

impl Slos {
    /// No objective set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A good request succeeded and meets every objective; `None` without objectives.
    pub fn is_good(&self, outcome: &RequestOutcome) -> Option<bool> {
        if self.0.is_empty() {
            return None;
        }
        Some(outcome.kind == OutcomeKind::Succeeded && self.0.iter().all(|slo| slo.met_by(outcome)))
    }

    /// The objectives as `--slo` reads them, in order.
    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(Slo::to_string).collect()
    }
}

/// A time limit in the unit [`Slo::limit`] holds.
pub fn limit_us(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::FailureKind;

    fn streamed(ttft_ms: u64, latency_ms: u64, tokens: u64) -> RequestOutcome {
        let mut outcome = RequestOutcome::failed(FailureKind::Empty);
        outcome.kind = OutcomeKind::Succeeded;
        outcome.ttft_us = Some(ttft_ms * 1000);
        outcome.ttst_us = Some((ttft_ms + 5) * 1000);
        outcome.latency_us = Some(latency_ms * 1000);
        outcome.content_frames = tokens;
        outcome.usage_output_tokens = Some(tokens);
        outcome
    }

    #[test]
    fn parses_each_name_and_prints_it_back() {
        for (text, kind, limit) in [
            ("ttft:500ms", SloKind::Ttft, 500_000.0),
            ("ttst:1s", SloKind::Ttst, 1_000_000.0),
            ("itl:40ms", SloKind::Itl, 40_000.0),
            ("latency:10", SloKind::Latency, 10_000_000.0),
            ("tokens-per-second:20", SloKind::TokensPerSecond, 20.0),
        ] {
            let slo = Slo::parse(text).expect(text);
            assert_eq!((slo.kind, slo.limit), (kind, limit), "{text}");
            assert_eq!(Slo::parse(&slo.to_string()).expect("round trip"), slo);
        }
    }

    #[test]
    fn refuses_what_it_cannot_honour_and_says_why() {
        for (text, says) in [
            ("ttft", "expected NAME:LIMIT"),
            ("tpot:5ms", "unknown name \"tpot\""),
            ("ttft:0ms", "zero limit"),
            ("ttft:fast", "invalid duration"),
            ("tokens-per-second:-3", "positive"),
            ("tokens-per-second:x", "not a number"),
        ] {
            let error = Slo::parse(text).expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn a_good_request_succeeded_and_met_every_objective() {
        let slos = Slos(vec![
            Slo::parse("ttft:100ms").expect("slo"),
            Slo::parse("tokens-per-second:50").expect("slo"),
        ]);
        // 11 tokens in 10 ms + 10 × 10 ms: ITL 10 ms, 100 tokens/s.
        let fast = streamed(10, 110, 11);
        assert_eq!(slos.is_good(&fast), Some(true));
        // TTFT exactly at the limit is within it.
        assert_eq!(slos.is_good(&streamed(100, 200, 11)), Some(true));
        assert_eq!(slos.is_good(&streamed(101, 201, 11)), Some(false));
        // ITL 25 ms: 40 tokens/s, under the floor.
        assert_eq!(slos.is_good(&streamed(10, 260, 11)), Some(false));
        // One token has no ITL: it cannot show it meets a rate floor.
        assert_eq!(slos.is_good(&streamed(10, 10, 1)), Some(false));
        let mut ended = fast;
        ended.kind = OutcomeKind::EndedEarly;
        assert_eq!(slos.is_good(&ended), Some(false));
        let mut unstreamed = fast;
        unstreamed.ttft_us = None;
        assert_eq!(slos.is_good(&unstreamed), Some(false));
        assert_eq!(Slos::default().is_good(&streamed(1, 2, 2)), None);
    }
}
